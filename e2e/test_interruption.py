"""Issue 6 scenarios: cordon, protected pods, PDB-respecting drain and reboots on the real control plane.

Workloads come from `nodewright.sim.fleet.create_workloads` (pods bound by nodeName, an unreconciled
StatefulSet owner so the disruption controller computes `maxUnavailable`, optional PDB); reboots are
performed by the simulator's rebooter (node NotReady, then a new bootID).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from typing import Any

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    OperatorProcess,
    PodCreations,
    condition_of,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    nodes_of,
    nodewright_manifest,
    package,
    status_of,
    wait_statuses,
)
from e2e.workloads import shrink_with_evictions
from nodewright.api.nodestate import decode
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

PROTECT = {"matchLabels": {fleet.PROTECTED_LABEL: "true"}}


def _time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_reboot_with_pdb_and_protected_job(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"rb-{unique}", f"rb-{unique}"
    async with fleet_of(cluster, prefix, 6) as names:
        boot_before = {
            n["metadata"]["name"]: n["status"]["nodeInfo"]["bootID"] for n in await nodes_of(kube, prefix)
        }
        training = await fleet.create_workloads(
            cluster.kubeconfig, nodes=names[:4], job=f"train-{unique}", max_unavailable=1
        )
        protected = await fleet.create_workloads(
            cluster.kubeconfig, nodes=names[4:], job=f"prot-{unique}", protected=True, run_for="10s"
        )
        shrinker = asyncio.create_task(shrink_with_evictions(kube, training))
        try:
            async with PodCreations(kube, nw) as watch:
                pkg = package(interrupt={"type": "reboot"})
                await create_nodewright(
                    kube,
                    nodewright_manifest(
                        nw, fleet_prefix=prefix, packages={"driver": pkg}, podNonInterruptLabels=PROTECT
                    ),
                )
                nodes = await wait_statuses(kube, prefix, nw, "complete", within=180)
            for node in nodes:
                name = node["metadata"]["name"]
                assert node["status"]["nodeInfo"]["bootID"] != boot_before[name], f"{name} did not reboot"
                assert not node["spec"].get("unschedulable"), f"{name} left cordoned"
            # Protected nodes: no package pod before the protected pods finished.
            finished = {}
            for pod_name in protected.pods:
                pod = await kube.get(f"/api/v1/namespaces/{protected.namespace}/pods/{pod_name}")
                term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
                finished[pod["spec"]["nodeName"]] = _time(term["finishedAt"])
            for pod_name, node_name, _, _, _ in watch.created:
                if node_name in finished:
                    assert _time(watch.created_at[pod_name]) >= finished[node_name], (pod_name, finished)
            # The training pods were evicted (one PDB slot at a time: the invariant monitor checks it).
            listed = await kube.list_all(
                f"/api/v1/namespaces/{training.namespace}/pods",
                params={"labelSelector": f"{fleet.WORKLOAD_JOB_LABEL}={training.name}"},
            )
            assert listed["items"] == []
            await delete_nodewright(kube, nw)
        finally:
            shrinker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await shrinker
            for job in (training, protected):
                invariants.allow_workload_deletion(job)
                await fleet.delete_workloads(cluster.kubeconfig, job)


class NodeHistory:
    """Every version of some nodes seen through a watch: (status label, unschedulable, bootID) per event.

    Transient states (a node blocked for a second before the rollout takes it again) are seen even if a
    poll would miss them."""

    def __init__(self, kube: KubeClient, nw: str, names: list[str]) -> None:
        self.kube, self.nw, self.names = kube, nw, set(names)
        # (status label, unschedulable, bootID, runtime-required taint present, auto-tainted annotation)
        self.seen: dict[str, list[tuple[str | None, bool, str, bool, bool]]] = {n: [] for n in names}
        self.conditions: dict[str, list[JSON]] = {n: [] for n in names}
        self.order: list[tuple[str, tuple[str | None, bool, str, bool, bool]]] = []  # one watch: RV order
        self._task: asyncio.Task[None] | None = None

    def _record(self, node: JSON) -> None:
        name = node["metadata"]["name"]
        if name not in self.names:
            return
        entry = (
            status_of(node, self.nw),
            bool(node["spec"].get("unschedulable")),
            node["status"]["nodeInfo"]["bootID"],
            any(t.get("key") == RUNTIME_TAINT["key"] for t in node["spec"].get("taints") or []),
            "nodewright.io/auto-tainted" in (node["metadata"].get("annotations") or {}),
        )
        if not self.seen[name] or self.seen[name][-1] != entry:
            self.seen[name].append(entry)
            self.order.append((name, entry))
        cond = condition_of(node, self.nw)
        if cond is not None and (not self.conditions[name] or self.conditions[name][-1] != cond):
            self.conditions[name].append(cond)

    async def __aenter__(self) -> NodeHistory:
        listed = await self.kube.list_all("/api/v1/nodes")
        for node in listed["items"]:
            self._record(node)
        self._task = asyncio.create_task(self._run(str(listed["resourceVersion"])))
        return self

    async def _run(self, rv: str) -> None:
        while True:
            async for event in self.kube.watch("/api/v1/nodes", resource_version=rv):
                obj = event["object"]
                if event["type"] == "ERROR":
                    listed = await self.kube.list_all("/api/v1/nodes")
                    rv = str(listed["resourceVersion"])
                    break
                rv = obj.get("metadata", {}).get("resourceVersion", rv)
                if event["type"] in ("ADDED", "MODIFIED"):
                    self._record(obj)

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task

    def boots(self, node: str) -> int:
        """Distinct bootIDs seen minus one: the number of reboots observed."""
        return len(dict.fromkeys(s[2] for s in self.seen[node])) - 1


async def test_admin_cordoned_node_is_processed_and_keeps_its_cordon(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """A node an admin cordoned before the NodeWright existed is out of service anyway: it is admitted,
    drained and rebooted without the operator taking ownership of the cordon, completes, and stays
    cordoned (no I5 breach: the operator never uncordons it)."""
    prefix, nw = f"adm-{unique}", f"adm-{unique}"
    async with fleet_of(cluster, prefix, 2) as names:
        admin = names[0]
        await kube.merge_patch(f"/api/v1/nodes/{admin}", {"spec": {"unschedulable": True}})
        job = await fleet.create_workloads(cluster.kubeconfig, nodes=names, job=f"adm-{unique}")
        try:
            async with NodeHistory(kube, nw, names) as history:
                pkg = package(interrupt={"type": "reboot"})
                await create_nodewright(
                    kube, nodewright_manifest(nw, fleet_prefix=prefix, packages={"drv": pkg})
                )
                nodes = await wait_statuses(kube, prefix, nw, "complete", within=120)
            by_name = {n["metadata"]["name"]: n for n in nodes}
            assert history.boots(admin) == 1 and history.boots(names[1]) == 1, history.seen
            assert by_name[admin]["spec"].get("unschedulable") is True, "admin cordon removed"
            assert not by_name[names[1]]["spec"].get("unschedulable"), "our cordon left behind"
            admin_state = decode(by_name[admin]["metadata"]["annotations"][f"nodewright.io/state.{nw}"])
            assert not admin_state.cordoned
            # Drained: the workload pods are gone from both nodes.
            listed = await kube.list_all(
                f"/api/v1/namespaces/{job.namespace}/pods",
                params={"labelSelector": f"{fleet.WORKLOAD_JOB_LABEL}={job.name}"},
            )
            assert listed["items"] == []
            await asyncio.sleep(1)  # a late uncordon would show up within the monitor's window
            node = await kube.get(f"/api/v1/nodes/{admin}")
            assert node["spec"].get("unschedulable") is True
            await delete_nodewright(kube, nw)
            await invariants.sync()
            assert not invariants.breaches_of("I5"), invariants.report()
            assert not invariants.breaches_of("I3"), invariants.report()
        finally:
            invariants.allow_workload_deletion(job)
            await fleet.delete_workloads(cluster.kubeconfig, job)


def _drain_manifest(nw: str, prefix: str, policy: str, **spec: Any) -> JSON:
    pkg = package(interrupt={"type": "service", "services": ["containerd"]})
    return nodewright_manifest(
        nw, fleet_prefix=prefix, packages={"svc": pkg}, drain={"timeout": "5s", "policy": policy}, **spec
    )


async def _pdb_blocked_job(cluster: ControlPlane, node: str, name: str) -> fleet.TrainingJob:
    """One pod on `node` with a PDB minAvailable = its pod count: no eviction is ever allowed."""
    return await fleet.create_workloads(cluster.kubeconfig, nodes=[node], job=name, min_available=1)


async def _relax(kube: KubeClient, job: fleet.TrainingJob) -> None:
    await kube.merge_patch(
        f"/apis/policy/v1/namespaces/{job.namespace}/poddisruptionbudgets/{job.pdb}",
        {"spec": {"minAvailable": 0}},
    )


async def test_drain_timeout_wait_reports_and_keeps_trying_force_deletes(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """Two NodeWrights side by side, each on one node whose pod a PDB never lets go (timeout 5s).
    wait: stays cordoned and in progress, the condition names the PDB and the pod, evictions go on
    (relaxing the PDB lets the node complete by itself). force: the pod is deleted after the timeout."""
    wprefix, fprefix = f"dw-{unique}", f"df-{unique}"
    async with fleet_of(cluster, wprefix, 1) as wnodes, fleet_of(cluster, fprefix, 1) as fnodes:
        wjob = await _pdb_blocked_job(cluster, wnodes[0], f"dw-{unique}")
        fjob = await _pdb_blocked_job(cluster, fnodes[0], f"df-{unique}")
        try:
            await create_nodewright(kube, _drain_manifest(wprefix, wprefix, "wait"))
            await create_nodewright(kube, _drain_manifest(fprefix, fprefix, "force"))
            # force: the pod is deleted despite its PDB, then the node completes and is uncordoned.
            nodes = await wait_statuses(kube, fprefix, fprefix, "complete", within=90)
            assert not nodes[0]["spec"].get("unschedulable")
            gone = await kube.list_all(
                f"/api/v1/namespaces/{fjob.namespace}/pods",
                params={"labelSelector": f"{fleet.WORKLOAD_JOB_LABEL}={fjob.name}"},
            )
            assert gone["items"] == []

            # wait: past the timeout the node is still cordoned, in progress, and says why.
            async def reported() -> JSON | None:
                node = await kube.get(f"/api/v1/nodes/{wnodes[0]}")
                message = (condition_of(node, wprefix) or {}).get("message", "")
                return node if "timeout 5s exceeded (policy wait)" in message else None

            node = await fleet.wait_for(reported, within=60, what="wait policy reported")
            message = condition_of(node, wprefix)["message"]  # type: ignore[index]
            assert status_of(node, wprefix) == "in_progress" and node["spec"].get("unschedulable"), node
            assert f"disruption budget {wjob.pdb}" in message and wjob.pods[0] in message, message
            assert (condition_of(node, wprefix) or {}).get("reason") == "DrainTimeout"
            # It keeps trying: once the PDB allows it, the pending eviction goes through on its own.
            await _relax(kube, wjob)
            nodes = await wait_statuses(kube, wprefix, wprefix, "complete", within=60)
            assert not nodes[0]["spec"].get("unschedulable")
            await delete_nodewright(kube, wprefix)
            await delete_nodewright(kube, fprefix)
        finally:
            for job in (wjob, fjob):
                invariants.allow_workload_deletion(job)
                await fleet.delete_workloads(cluster.kubeconfig, job)


async def test_drain_timeout_skip_releases_the_node_and_comes_back_later(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """Budget 2 of 3 nodes; the first node's pod is held by a PDB. skip: after 5s the node is released
    (blocked DrainTimeout, uncordoned in the same write), so batch 1 settles and the third node is
    processed — under `wait` it would never start. After the PDB is relaxed the skipped node is picked
    again, drains and completes."""
    prefix, nw = f"ds-{unique}", f"ds-{unique}"
    async with fleet_of(cluster, prefix, 3) as names:
        stuck = names[0]  # first in pick order (zone-a), so it is in batch 1
        job = await _pdb_blocked_job(cluster, stuck, f"ds-{unique}")
        try:
            async with NodeHistory(kube, nw, names) as history:
                await create_nodewright(
                    kube, _drain_manifest(nw, prefix, "skip", interruptionBudget={"count": 2})
                )
                await wait_statuses(kube, prefix, nw, "complete", within=120, count=2)
                nodes = {n["metadata"]["name"]: n for n in await nodes_of(kube, prefix)}
                assert status_of(nodes[stuck], nw) != "complete"
                assert all(status_of(nodes[n], nw) == "complete" for n in names[1:])
                # Released at least once: blocked and schedulable in the same node version.
                released = [s for s in history.seen[stuck] if s[0] == "blocked"]
                assert released and all(not s[1] for s in released), history.seen
                timeouts = [c for c in history.conditions[stuck] if c.get("reason") == "DrainTimeout"]
                assert timeouts, history.conditions[stuck]
                assert f"disruption budget {job.pdb}" in timeouts[0]["message"], timeouts[0]

                # ... and taken again afterwards (cordoned anew by a later admission).
                async def retried() -> bool:
                    seen = history.seen[stuck]
                    first = next(i for i, s in enumerate(seen) if s[0] == "blocked")
                    return any(s[1] for s in seen[first:])

                await fleet.wait_for(retried, within=60, what="skipped node taken again")
                await _relax(kube, job)
                nodes_done = await wait_statuses(kube, prefix, nw, "complete", within=90)
            assert not any(n["spec"].get("unschedulable") for n in nodes_done)
            await delete_nodewright(kube, nw)
        finally:
            invariants.allow_workload_deletion(job)
            await fleet.delete_workloads(cluster.kubeconfig, job)


async def test_service_and_reboot_interrupts_merge_into_one_reboot(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"mrg-{unique}", f"mrg-{unique}"
    async with fleet_of(cluster, prefix, 2) as names, NodeHistory(kube, nw, names) as history:
        async with PodCreations(kube, nw) as watch:
            packages = {
                "drv": package(interrupt={"type": "reboot"}),
                "svc": package(interrupt={"type": "service", "services": ["containerd"]}),
            }
            await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages=packages))
            nodes = await wait_statuses(kube, prefix, nw, "complete", within=120)
        for name in names:
            assert history.boots(name) == 1, (name, history.seen[name])
            interrupts = [c for c in watch.created if c[1] == name and c[3] == "interrupt"]
            assert len(interrupts) == 1, interrupts
        for node in nodes:
            state = decode(node["metadata"]["annotations"][f"nodewright.io/state.{nw}"])
            assert {e.name: e.state.value for e in state.packages} == {"drv": "complete", "svc": "complete"}
        await delete_nodewright(kube, nw)


async def test_node_that_never_returns_from_reboot_is_erroring(
    cluster: ControlPlane,
    operator_factory: object,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    operator_factory("--reboot-timeout", "10")  # type: ignore[operator]
    prefix, nw = f"hang-{unique}", f"hang-{unique}"
    async with fleet_of(cluster, prefix, 1, annotations_extra={"sim.nodewright.io/reboot-hang": "true"}):
        pkg = package(interrupt={"type": "reboot"})
        await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages={"drv": pkg}))
        nodes = await wait_statuses(kube, prefix, nw, "erroring", within=90)
        message = (condition_of(nodes[0], nw) or {}).get("message", "")
        assert "did not return from reboot within 10s" in message, message
        assert nodes[0]["spec"].get("unschedulable"), "an erroring node stays cordoned"
        # The NodeWright is deleted with the node still down: nothing else can complete there.
        invariants.expect_uncordon(nodes[0]["metadata"]["name"])
        await delete_nodewright(kube, nw, within=60)


RUNTIME_TAINT = {"key": "nodewright.io/runtime-required", "value": "true", "effect": "NoSchedule"}


async def _taints(kube: KubeClient, name: str) -> list[JSON]:
    node = await kube.get(f"/api/v1/nodes/{name}")
    return list(node["spec"].get("taints") or [])


async def test_runtime_required_taints_removed_per_node(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"rt-{unique}", f"rt-{unique}"
    async with fleet_of(cluster, prefix, 2) as names:
        for name in names:
            await kube.merge_patch(f"/api/v1/nodes/{name}", {"spec": {"taints": [RUNTIME_TAINT]}})
        async with NodeHistory(kube, nw, names) as history:
            await create_nodewright(
                kube,
                nodewright_manifest(
                    nw,
                    fleet_prefix=prefix,
                    packages={"tool": package()},
                    runtimeRequired=True,
                    interruptionBudget={"count": 1},
                ),
            )
            await wait_statuses(kube, prefix, nw, "complete", within=90)
            await fleet.wait_for(
                lambda: _all_untainted(kube, names), within=30, what="runtime taints removed"
            )
            # Per node: with budget 1, when the first node is complete and untainted, the other one
            # still carries its taint.
            latest: dict[str, tuple[str | None, bool, str, bool, bool]] = {}
            for name, entry in history.order:
                latest[name] = entry
                if name in names and entry[0] == "complete" and not entry[3]:
                    other = next(n for n in names if n != name)
                    assert latest[other][3] and latest[other][0] != "complete", history.order
                    break
            else:
                raise AssertionError(f"no node seen complete and untainted: {history.order}")
        await delete_nodewright(kube, nw)


async def test_auto_taint_new_nodes_taints_a_new_node_until_it_completes(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"at-{unique}", f"at-{unique}"
    async with fleet_of(cluster, prefix, 1) as names:
        newcomer = f"{prefix}-{len(names):05d}"
        async with NodeHistory(kube, nw, [*names, newcomer]) as history:
            await create_nodewright(
                kube,
                nodewright_manifest(
                    nw,
                    fleet_prefix=prefix,
                    packages={"tool": package()},
                    runtimeRequired=True,
                    autoTaintNewNodes=True,
                ),
            )
            await wait_statuses(kube, prefix, nw, "complete", within=60)
            # A node created after the NodeWright exists is auto-tainted, completes and is released.
            await fleet.create_nodes(cluster.kubeconfig, count=1, name_prefix=prefix, start_index=len(names))
            nodes = await wait_statuses(kube, prefix, nw, "complete", within=60, count=2)
            await fleet.wait_for(
                lambda: _all_untainted(kube, [newcomer]), within=30, what="auto taint removed"
            )
        seen = history.seen[newcomer]
        assert any(s[3] and s[4] for s in seen), seen  # tainted and annotated at some point
        tainted_at = next(i for i, s in enumerate(seen) if s[3])
        assert all(s[0] != "complete" for s in seen[:tainted_at]), seen  # before it was processed
        node = await kube.get(f"/api/v1/nodes/{newcomer}")
        assert "nodewright.io/auto-tainted" not in (node["metadata"].get("annotations") or {})
        assert len(nodes) == 2
        await delete_nodewright(kube, nw)


async def _all_untainted(kube: KubeClient, names: list[str]) -> bool:
    for name in names:
        if any(t["key"] == RUNTIME_TAINT["key"] for t in await _taints(kube, name)):
            return False
    return True
