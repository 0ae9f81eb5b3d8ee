"""Kept logs and targeted recovery on nodes that really run their packages (issue 16).

Three nodes run the reference `shell` package for real (the simulated kubelet executes its pods
against a directory standing for each node's root, `<cluster>/roots/<node>/`). Its apply step fails
unless `/etc/e2e-ok` exists on the node. The policy allows one node at a time (ceiling 1) while the
strategy asks for two per batch, so a node waiting for the slot reads `BudgetFull`:

1. the first node admitted fails (its file is missing; one attempt); the others get the file;
2. after the failed pod is gone, `package logs` returns the failing step's output from the operator's
   log store;
3. while another node holds the slot, `node retry` of the failed one (after fixing its node) makes it
   wait `BudgetFull` -- a targeted retry never bypasses the budget -- and it completes once the slot is
   free (the invariant monitor checks the ceiling throughout);
4. `node reset` is refused while a pod of the NodeWright runs on the node; `package status`,
   `package rerun` (again through a batch), `node reset` of a settled node, and dry runs.
"""

from __future__ import annotations

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    OperatorProcess,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    nodes_of,
    nodewright_manifest,
    package_pods,
    status_of,
    wait_statuses,
)
from e2e.test_packages_real import publish_version, root_of
from e2e.test_plugin import POLICIES, create_policy, plugin, plugin_json, why
from nodewright.cli.plugin.cluster import pod_node
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

MARKER = "E2E-FAIL-MARKER"
APPLY = f"""#!/bin/sh
set -eu
ok="${{NODEWRIGHT_HOST_ROOT%/}}/etc/e2e-ok"
echo "checking $ok"
sleep 12
if [ ! -f "$ok" ]; then
  echo "{MARKER}: /etc/e2e-ok is missing on this node" >&2
  exit 3
fi
echo "found $ok"
"""
CHECK = '#!/bin/sh\ntest -f "${NODEWRIGHT_HOST_ROOT%/}/etc/e2e-ok"\n'


def mark_ok(cluster: ControlPlane, node: str) -> None:
    target = root_of(cluster, node) / "etc" / "e2e-ok"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("ok\n")


async def admitted(kube: KubeClient, prefix: str, nw: str) -> list[str]:
    return [
        n["metadata"]["name"]
        for n in await nodes_of(kube, prefix)
        if f"nodewright.io/batch.{nw}" in (n["metadata"].get("annotations") or {})
    ]


async def test_kept_logs_and_a_targeted_retry_that_waits_for_the_slot(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix = nw = f"lg-{unique}"
    policy = f"{nw}-pol"
    publish_version(cluster, "shell", "1.0.0")
    await create_policy(kube, policy, {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 2}}})
    async with fleet_of(cluster, prefix, 3, real_packages=3) as names:
        pkg = {
            "version": "1.0.0",
            "image": "ghcr.io/nodewright/shell",
            "configMap": {"apply.sh": APPLY, "apply_check.sh": CHECK},
            "maxAttempts": 1,
        }
        await create_nodewright(
            kube,
            nodewright_manifest(nw, fleet_prefix=prefix, packages={"shell": pkg}, deploymentPolicy=policy),
        )

        async def first_admitted() -> list[str] | None:
            found = await admitted(kube, prefix, nw)
            return found or None

        [failing] = await fleet.wait_for(first_admitted, within=60, what="the first admission")
        others = [n for n in names if n != failing]
        for other in others:
            mark_ok(cluster, other)

        # 1. It fails: erroring, settled, its pod deleted.
        await wait_statuses(kube, prefix, nw, "erroring", within=90, count=1)

        async def pod_gone() -> bool:
            pods = await package_pods(kube, nw)
            return not [p for p in pods if pod_node(p) == failing]

        await fleet.wait_for(pod_gone, within=60, what="the failed pod deleted")

        # 2. The failing step's output, from the operator's log store.
        logs = await plugin_json(cluster, "package", "logs", nw, "shell", "--node", failing)
        assert logs["source"] == "kept", logs
        [kept] = logs["entries"]
        assert kept["stage"] == "apply" and kept["outcome"] == "failed" and kept["exitCode"] != 0, kept
        assert f"{MARKER}: /etc/e2e-ok is missing on this node" in kept["log"], kept
        text = (await plugin(cluster, "package", "logs", nw, "shell", "--node", failing, "--previous")).stdout
        assert "the pod is gone" in text and MARKER in text
        await plugin(
            cluster, "package", "logs", nw, "shell", "--node", failing, "--stage", "config", expect=3
        )
        answer = await why(cluster, failing, nw)
        assert answer["reason"] == "Erroring" and MARKER in " ".join(answer["details"]), answer

        # 3. Another node takes the slot; the retried node waits for it.
        async def other_running() -> str | None:
            for obj in await nodes_of(kube, prefix):
                if obj["metadata"]["name"] in others and status_of(obj, nw) == "in_progress":
                    return str(obj["metadata"]["name"])
            return None

        await plugin(cluster, "node", "retry", failing, nw, expect=4)  # not confirmed without a terminal
        dry = await plugin_json(cluster, "node", "retry", failing, nw, "--dry-run=server", "-y")
        assert dry["changed"] and dry["dryRun"] == "server"
        node = await kube.get(f"/api/v1/nodes/{failing}")
        assert f"nodewright.io/batch.{nw}" in node["metadata"]["annotations"], "a dry run changes nothing"
        holder = await fleet.wait_for(other_running, within=60, interval=0.2, what="another node in progress")
        refused = await plugin(cluster, "node", "reset", holder, nw, "-y", expect=4)
        assert "still run" in refused.stderr, refused.stderr
        mark_ok(cluster, failing)
        done = await plugin_json(cluster, "node", "retry", failing, nw, "-y")
        assert done["changed"] and done["packages"] == ["shell"], done
        answer = await why(cluster, failing, nw)
        assert answer["reason"] == "BudgetFull", answer
        # The slot's holder is one of the others (`holder` may have finished meanwhile and handed it on).
        assert any(other in d for other in others for d in answer["details"]), answer
        await wait_statuses(kube, prefix, nw, "complete", within=180)

        # 4. package status; rerun through a batch; reset refused while a pod runs, then done.
        status = await plugin_json(cluster, "package", "status", nw)
        [row] = status["packages"]
        assert (
            row["package"] == "shell" and row["counts"] == {"config/complete": 3} and status["failing"] == []
        )
        rerun_node = others[0]
        rerun = await plugin_json(cluster, "package", "rerun", nw, "shell", "--nodes", rerun_node, "-y")
        assert rerun["nodes"] == [{**rerun["nodes"][0], "node": rerun_node, "result": "rerun"}], rerun

        async def rerun_pod() -> bool:
            pods = await package_pods(kube, nw)
            return any(pod_node(p) == rerun_node for p in pods)

        await fleet.wait_for(rerun_pod, within=90, interval=0.2, what="the rerun's pod")
        await wait_statuses(kube, prefix, nw, "complete", within=120)
        client_dry = await plugin_json(cluster, "node", "reset", failing, nw, "--dry-run=client")
        assert client_dry["dryRun"] == "client"
        node = await kube.get(f"/api/v1/nodes/{failing}")
        assert f"nodewright.io/state.{nw}" in node["metadata"]["annotations"], "dry run: unchanged"
        reset = await plugin_json(cluster, "node", "reset", failing, nw, "-y")
        assert reset["changed"] and not reset["uncordoned"]

        async def started_over() -> JSON | None:
            fresh = await kube.get(f"/api/v1/nodes/{failing}")
            return fresh if status_of(fresh, nw) != "complete" else None

        await fleet.wait_for(started_over, within=60, interval=0.2, what="the reset node starting over")
        await wait_statuses(kube, prefix, nw, "complete", within=120)
        await delete_nodewright(kube, nw, within=90)
        invariants.expect_cleanup(nw)
    await kube.delete(f"{POLICIES}/{policy}")
