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
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import urllib.request

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
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
from e2e.test_packages_real import publish_version, root_of, shell_package
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
