"""Drift detection on the real control plane, with the reference `shell` package really run on 3 nodes.

Ten nodes, three of them opted in to the simulated kubelet (their package pods really run our agent
against a directory standing for the node's root; kwok plays the other seven). After the rollout, the
file the package manages is changed behind the operator's back on the three real nodes:

- report: they are labelled `drifted` within the interval plus its spread, the node condition names the
  package, the failing check and its output, the NodeWright status and the metrics agree, nothing is
  cordoned or evicted (the monitor watches), `nodewright consistency` shows the skew;
- reapply: the three are repaired through batches within the budget (ceiling 1, the monitor judges every
  start), the file is back, the fleet is uniform again;
- a reboot nobody asked for (a new bootID) makes a node due at once, however long the interval.

Then the reference `tuning` package (reboot interrupt) on two real nodes: a tuned sysctl changed by hand
is repaired twice in one generation, each repair with exactly one reboot, no stage pod next to a check
pod, and no check from before a repair judging the repaired node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import urllib.request

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    NAMESPACE,
    OperatorProcess,
    condition_of,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    get_nodewright,
    nodes_of,
    nodewright_manifest,
    package_pods,
    patch_nodewright,
    status_of,
    wait_statuses,
)
from e2e.test_packages_real import (
    _HEADER,
    _SAME,
    REBOOT_SECONDS_ANNOTATION,
    publish_version,
    root_of,
    shell_package,
    tuning_package,
)
from e2e.test_safety import events_of
from nodewright.api import constants
from nodewright.plan import podspec
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory


def drift_pods(pods: list[JSON]) -> list[JSON]:
    return [
        p
        for p in pods
        if p["metadata"]["labels"].get(constants.POD_LABEL_PURPOSE) == constants.POD_PURPOSE_DRIFT_CHECK
    ]


def metric(operator: OperatorProcess, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def consistency(cluster: ControlPlane, nw: str) -> JSON:
    import subprocess

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "nodewright",
            "consistency",
            nw,
            "--kubeconfig",
            str(cluster.kubeconfig),
            "-o",
            "json",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    doc: JSON = json.loads(out.stdout)
    return doc


async def test_drift_is_reported_then_repaired_through_batches(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix = nw = f"drift-{unique}"
    publish_version(cluster, "shell", "1.0.0")
    async with fleet_of(cluster, prefix, 10, real_packages=3) as names:
        real = sorted(names)[:3]
        manifest = nodewright_manifest(
            nw,
            fleet_prefix=prefix,
            packages={"shell": shell_package("1.0.0", "tuned")},
            interruptionBudget={"count": 1},
            driftDetection={"interval": "10s", "action": "report"},
        )
        await create_nodewright(kube, manifest)
        await wait_statuses(kube, prefix, nw, "complete", within=240)
        for node in real:
            assert (root_of(cluster, node) / "etc/nodewright-e2e/value").read_text() == "tuned"
        # Behind the operator's back: the managed file changes on the three real nodes.
        for node in real:
            (root_of(cluster, node) / "etc/nodewright-e2e/value").write_text("changed by hand")
        drifted = await wait_statuses(kube, prefix, nw, "drifted", within=60, count=3)
        assert sorted(n["metadata"]["name"] for n in drifted if status_of(n, nw) == "drifted") == real
        for obj in drifted:
            if status_of(obj, nw) != "drifted":
                continue
            cond = condition_of(obj, nw) or {}
            assert cond.get("reason") == "Drifted" and "shell" in cond.get("message", ""), cond
            # The check that caught it: apply-check, or config-check when the file changed between them.
            assert re.search(r"(apply|config)-check failed", cond["message"]), cond
            assert not obj["spec"].get("unschedulable"), "a check never cordons"

        async def reported() -> JSON | None:
            status = (await get_nodewright(kube, nw) or {}).get("status") or {}
            return status if status.get("driftedNodes") == 3 else None

        status = await fleet.wait_for(reported, within=30, what="the NodeWright counts 3 drifted nodes")
        conds = {c["type"]: c for c in status["conditions"]}
        assert conds["Drifted"]["status"] == "True" and status["status"] == "complete", status
        assert metric(operator, "nodewright_drifted_nodes", nodewright=nw) == 3
        assert metric(operator, "nodewright_drift_checks_total", nodewright=nw, result="drifted") >= 3
        assert metric(operator, "nodewright_drift_checks_total", nodewright=nw, result="clean") >= 7
        skew = consistency(cluster, nw)
        [shell] = skew["packages"]
        assert not skew["uniform"] and shell["skew"], skew
        assert {v["nodes"] for v in shell["values"]} == {7, 3}

        # Repair: through batches of one within the budget (the monitor judges every start).
        await patch_nodewright(kube, nw, {"spec": {"driftDetection": {"action": "reapply"}}})
        await wait_statuses(kube, prefix, nw, "complete", within=180)
        for node in real:
            assert (root_of(cluster, node) / "etc/nodewright-e2e/value").read_text() == "tuned"
        assert consistency(cluster, nw)["uniform"]

        # A long interval: only a host change makes a node due now.
        await patch_nodewright(kube, nw, {"spec": {"driftDetection": {"interval": "1h"}}})
        await asyncio.sleep(3)
        before = {p["metadata"]["name"] for p in drift_pods(await package_pods(kube, nw))}
        target = real[0]
        await kube.strategic_patch(
            f"/api/v1/nodes/{target}/status", {"status": {"nodeInfo": {"bootID": f"rebooted-{unique}"}}}
        )

        async def rechecked() -> bool:
            pods = drift_pods(await package_pods(kube, nw))
            return (
                any(podspec.pod_node(p) == target and p["metadata"]["name"] not in before for p in pods)
                or metric(operator, "nodewright_drift_checks_total", nodewright=nw) > checks_before
            )

        checks_before = metric(operator, "nodewright_drift_checks_total", nodewright=nw)
        await fleet.wait_for(rechecked, within=30, what="a check after the unexplained reboot")
        assert not any(n["spec"].get("unschedulable") for n in await nodes_of(kube, prefix))
        assert not re.search("drifted", json.dumps([status_of(n, nw) for n in await nodes_of(kube, prefix)]))
        await delete_nodewright(kube, nw, within=120)


class Timeline:
    """What happens on some nodes, as watches see it: the package pods of one NodeWright (creations,
    deletions, in the API server's order) and each node's bootIDs (one entry per boot)."""

    def __init__(self, kube: KubeClient, nw: str, nodes: list[str]) -> None:
        self.kube, self.nw, self.nodes = kube, nw, nodes
        self.events: list[tuple[str, str, str, str]] = []  # (ADDED | DELETED, pod, node, stage label)
        self.checks: dict[str, set[str]] = {n: set() for n in nodes}  # check pods that exist, per node
        self.overlaps: list[str] = []  # stage pods created while a check pod of their node existed
        self.boots: dict[str, list[str]] = {n: [] for n in nodes}
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Timeline:
        pods = await self.kube.list_all(f"/api/v1/namespaces/{NAMESPACE}/pods", params=self._selector())
        for pod in pods["items"]:  # there already: not events of this timeline, but they hold the node
            self._pod("MODIFIED", pod)
        self._tasks.append(asyncio.create_task(self._watch_pods(str(pods["resourceVersion"]))))
        for node in self.nodes:
            obj = await self.kube.get(f"/api/v1/nodes/{node}")
            self._boot(obj)
            self._tasks.append(
                asyncio.create_task(self._watch_node(node, obj["metadata"]["resourceVersion"]))
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _selector(self) -> dict[str, str]:
        return {"labelSelector": f"nodewright.io/nodewright={self.nw}"}

    def _pod(self, kind: str, pod: JSON) -> None:
        node, name = podspec.pod_node(pod), pod["metadata"]["name"]
        if node not in self.checks:
            return
        stage = pod["metadata"]["labels"].get(constants.POD_LABEL_STAGE, "")
        is_check = (
            pod["metadata"]["labels"].get(constants.POD_LABEL_PURPOSE) == constants.POD_PURPOSE_DRIFT_CHECK
        )
        if kind == "DELETED":
            self.checks[node].discard(name)
        elif is_check:
            self.checks[node].add(name)
        elif kind == "ADDED" and self.checks[node]:
            self.overlaps.append(f"{name} created next to {sorted(self.checks[node])}")
        if kind in ("ADDED", "DELETED"):
            self.events.append((kind, name, node, stage))

    def _boot(self, node: JSON) -> None:
        boot = str(((node.get("status") or {}).get("nodeInfo") or {}).get("bootID") or "")
        seen = self.boots[node["metadata"]["name"]]
        if boot and (not seen or seen[-1] != boot):
            seen.append(boot)

    async def _watch_pods(self, rv: str) -> None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        while True:
            async for event in self.kube.watch(path, resource_version=rv, params=self._selector()):
                if event["type"] == "ERROR":  # expired: relist (deletions in the gap are synthesised)
                    listed = await self.kube.list_all(path, params=self._selector())
                    names = {p["metadata"]["name"] for p in listed["items"]}
                    for node, checks in self.checks.items():
                        for gone in sorted(checks - names):
                            self.events.append(("DELETED", gone, node, constants.POD_STAGE_DRIFT_CHECK))
                            checks.discard(gone)
                    rv = str(listed["resourceVersion"])
                    break
                obj = event["object"]
                rv = obj["metadata"].get("resourceVersion", rv)
                self._pod(event["type"], obj)

    async def _watch_node(self, name: str, rv: str) -> None:
        params = {"fieldSelector": f"metadata.name={name}"}
        while True:
            async for event in self.kube.watch("/api/v1/nodes", resource_version=rv, params=params):
                if event["type"] == "ERROR":
                    obj = await self.kube.get(f"/api/v1/nodes/{name}")
                    self._boot(obj)
                    rv = obj["metadata"]["resourceVersion"]
                    break
                rv = event["object"]["metadata"].get("resourceVersion", rv)
                self._boot(event["object"])

    def created_since(self, mark: int, node: str) -> list[str]:
        """Stage labels of the package (not check) pods created on `node` after event `mark`."""
        return sorted(
            stage
            for kind, _, where, stage in self.events[mark:]
            if kind == "ADDED" and where == node and stage != constants.POD_STAGE_DRIFT_CHECK
        )

    def check_done_since(self, mark: int, node: str) -> bool:
        """A check pod created on `node` after event `mark` has been read and removed."""
        added = {
            pod
            for kind, pod, where, stage in self.events[mark:]
            if kind == "ADDED" and where == node and stage == constants.POD_STAGE_DRIFT_CHECK
        }
        return any(kind == "DELETED" and p in added for kind, p, _, _ in self.events[mark:])


async def test_drift_repair_of_a_reboot_package_reboots_once_per_repair(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """The scenario of the real-node lane, on the simulated kubelet: the reference `tuning` package
    (reboot interrupt) is complete, a tuned sysctl is changed by hand, the check reports it, and with
    `action: reapply` it is repaired -- twice, in the same NodeWright generation.

    Each repair is one apply pod, one interrupt pod, one post-interrupt pod and exactly one reboot
    (the node's bootID changes once): the repair's interrupt has its own identity on the host (with the
    generation's, the agent skipped the second reboot as "already ran" and the node waited for the
    reboot timeout, cordoned), and a check pod that was on the node when the repair became due is read
    before the repair starts -- no stage pod is created while a check pod exists on the node, and no
    check result from before a repair judges the repaired node (it started a second repair).
    """
    prefix = nw = f"driftboot-{unique}"
    fast_reboot = {REBOOT_SECONDS_ANNOTATION: "0.5"}
    async with fleet_of(cluster, prefix, 2, real_packages=2, annotations_extra=fast_reboot) as names:
        target, other = sorted(names)
        rmem = "proc/sys/net/core/rmem_max"
        manifest = nodewright_manifest(
            nw,
            fleet_prefix=prefix,
            packages={"tuning": tuning_package(maxAttempts=3)},
            driftDetection={"interval": "10s", "action": "report"},
        )
        await create_nodewright(kube, manifest)
        await wait_statuses(kube, prefix, nw, "complete", within=180)
        tuned = (root_of(cluster, target) / rmem).read_text()
        async with Timeline(kube, nw, [target, other]) as timeline:
            # Behind the operator's back: a tuned value of the running kernel changes on one node.
            (root_of(cluster, target) / rmem).write_text("4096\n")
            await wait_statuses(kube, prefix, nw, "drifted", within=60, count=1)

            # Repair 1: asked for as soon as the node's next check starts (the lane's timing: the check
            # still runs, or has just ended, when the repair becomes due).
            since = len(timeline.events)

            async def checking() -> bool:
                return any(
                    kind == "ADDED" and node == target and stage == constants.POD_STAGE_DRIFT_CHECK
                    for kind, _, node, stage in timeline.events[since:]
                )

            await fleet.wait_for(checking, within=30, what=f"a drift check on {target}")
            mark, boots = len(timeline.events), len(timeline.boots[target])
            await patch_nodewright(kube, nw, {"spec": {"driftDetection": {"action": "reapply"}}})
            await repaired(kube, timeline, prefix, nw, target, mark)
            assert len(timeline.boots[target]) == boots + 1, timeline.boots[target]
            assert (root_of(cluster, target) / rmem).read_text() == tuned

            # Repair 2, same generation: the value changes again, the check finds it, the rollout repairs.
            mark, boots = len(timeline.events), len(timeline.boots[target])
            (root_of(cluster, target) / rmem).write_text("8192\n")
            await repaired(kube, timeline, prefix, nw, target, mark)
            assert len(timeline.boots[target]) == boots + 1, timeline.boots[target]
            assert (root_of(cluster, target) / rmem).read_text() == tuned

            assert not timeline.overlaps, timeline.overlaps
            assert len(timeline.boots[other]) == 1 and not timeline.created_since(0, other), "untouched"
        await delete_nodewright(kube, nw, within=120)


async def repaired(kube: KubeClient, timeline: Timeline, prefix: str, nw: str, node: str, mark: int) -> None:
    """The repair that follows event `mark` ran on `node` (one apply, interrupt and post-interrupt pod),
    and a check made after it found the node clean and left it complete: no second repair."""

    async def started() -> bool:
        return "apply" in timeline.created_since(mark, node)

    await fleet.wait_for(started, within=60, what=f"the repair of {node} starting")
    await wait_statuses(kube, prefix, nw, "complete", within=180)
    done = len(timeline.events)

    async def checked_after() -> bool:
        return timeline.check_done_since(done, node)

    await fleet.wait_for(checked_after, within=60, what=f"a drift check of {node} after its repair")
    assert timeline.created_since(mark, node) == ["apply", "interrupt", "post-interrupt"], timeline.events[
        mark:
    ]
    nodes = {n["metadata"]["name"]: n for n in await nodes_of(kube, prefix)}
    assert status_of(nodes[node], nw) == "complete", condition_of(nodes[node], nw)


async def test_a_hung_drift_check_ends_at_its_deadline_and_holds_the_node_no_longer(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """A check step that never returns (here: the shell package's apply-check once a marker exists on
    the host). The check pod's deadline (`activeDeadlineSeconds`: the package's stageTimeout) ends it;
    the operator counts a check error, not drift, removes the pod, and a config change, which waits for
    check pods to be gone, runs. Without a deadline the hung check held the node forever."""
    prefix = nw = f"hang-{unique}"
    publish_version(cluster, "shell", "1.0.0")
    hanging_check = _HEADER + 'if [ -e "$d/hang" ]; then sleep 100000; fi\n' + _SAME

    def spec(value: str) -> JSON:
        package = shell_package("1.0.0", value, stageTimeout="15s")
        package["configMap"]["apply_check.sh"] = hanging_check
        return package

    async with fleet_of(cluster, prefix, 1, real_packages=1) as [node]:
        manifest = nodewright_manifest(
            nw,
            fleet_prefix=prefix,
            packages={"shell": spec("tuned")},
            driftDetection={"interval": "10s", "action": "report"},
        )
        await create_nodewright(kube, manifest)
        await wait_statuses(kube, prefix, nw, "complete", within=120)
        (root_of(cluster, node) / "etc/nodewright-e2e/hang").write_text("")
        errors = metric(operator, "nodewright_drift_checks_total", nodewright=nw, result="error")

        async def gave_up() -> bool:
            return metric(operator, "nodewright_drift_checks_total", nodewright=nw, result="error") > errors

        await fleet.wait_for(gave_up, within=90, what="a hung check counted as a check error")
        [failed, *_] = await events_of(kube, node, "DriftCheckFailed")
        assert "deadline" in failed["message"], failed
        [obj] = await nodes_of(kube, prefix)
        assert status_of(obj, nw) == "complete", "a check that could not run is no drift"
        # The config change waits for the (hung) check pods of the node to be gone, then runs.
        await patch_nodewright(kube, nw, {"spec": {"packages": {"shell": spec("tuned again")}}})
        generation = int(((await get_nodewright(kube, nw)) or {})["metadata"]["generation"])
        await wait_statuses(kube, prefix, nw, "complete", within=120, generation=generation)
        assert (root_of(cluster, node) / "etc/nodewright-e2e/value").read_text() == "tuned again"
        (root_of(cluster, node) / "etc/nodewright-e2e/hang").unlink()
        await delete_nodewright(kube, nw, within=120)
