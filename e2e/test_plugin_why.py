"""`kubectl nodewright why` answers each reason on a scenario that produces it (issue 16).

Untouched waiting nodes carry no label or condition, so each answer below is computed by the plugin
with the operator's planner from the cluster as it is -- and compared with what the operator then
does or reports (its status conditions and waiting counts). Scenarios, each on its own fleet:

- budget full (a ceiling of 1 under a strategy that wants 3: the nodes the ceiling keeps out say
  BudgetFull while the batch is open, and name the node holding the slot);
- waiting for an earlier NodeWright that is paused (and the condition WaitingForNodeWright /
  PredecessorPaused on the later one);
- paused, disabled, policy missing;
- a taint not tolerated, NotReady, a state annotation that does not decode;
- a halted compartment (failureThreshold 1, a package that always fails).
"""

from __future__ import annotations

from typing import Any

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    OperatorProcess,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    get_nodewright,
    nodewright_manifest,
    package,
    wait_statuses,
)
from e2e.test_plugin import POLICIES, create_policy, plugin_json, why
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory


async def until_reason(cluster: ControlPlane, node: str, nw: str, reason: str, *, within: float = 60) -> JSON:
    async def probe() -> JSON | None:
        answer = await why(cluster, node, nw)
        return answer if answer["reason"] == reason else None

    result: JSON = await fleet.wait_for(probe, within=within, interval=0.5, what=f"{node}/{nw} {reason}")
    return result


def condition(obj: JSON | None, kind: str) -> JSON:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


async def test_budget_full_names_who_holds_the_slot(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix = nw = f"wb-{unique}"
    policy = f"{nw}-pol"
    await create_policy(kube, policy, {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 3}}})
    async with fleet_of(cluster, prefix, 4):
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw, fleet_prefix=prefix, packages={"tool": package(duration="15s")}, deploymentPolicy=policy
            ),
        )

        async def held() -> tuple[JSON, list[JSON]] | None:
            rows = (await plugin_json(cluster, "node", "list", nw))["nodes"]
            holder = [r for r in rows if r["reason"] == "InProgress"]
            full = [r for r in rows if r["reason"] == "BudgetFull"]
            return (holder[0], full) if holder and full else None

        holder, full = await fleet.wait_for(
            held, within=60, interval=0.5, what="BudgetFull while a batch runs"
        )
        # The strategy wants 3, the ceiling allows 1: the two it wants beyond the slot wait for the
        # budget (they used to read NotYetInBatch from the second pass on); the fourth for a batch.
        assert len(full) == 2, full
        answer = await why(cluster, full[0]["node"], nw)
        assert answer["reason"] == "BudgetFull" and "1 of 1 in use" in answer["summary"], answer
        assert any(holder["node"] in d for d in answer["details"]), answer

        # The operator counts them the same way (status and metric share the numbers).
        async def counted() -> JSON | None:
            obj = await get_nodewright(kube, nw)
            reasons = ((obj or {}).get("status") or {}).get("waitingReasons") or {}
            return reasons if reasons.get("BudgetFull") == 2 else None

        await fleet.wait_for(counted, within=30, what="operator status waitingReasons BudgetFull 2")
        await wait_statuses(kube, prefix, nw, "complete", within=180)
        await delete_nodewright(kube, nw, within=90)
        invariants.expect_cleanup(nw)
    await kube.delete(f"{POLICIES}/{policy}")


async def test_priority_paused_disabled_policy_taint_notready_malformed_halted(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    first, later = f"wp1-{unique}", f"wp2-{unique}"
    nopol, off = f"wn-{unique}", f"wd-{unique}"
    edge = f"we-{unique}"
    halt = f"wh-{unique}"
    halt_policy = f"{halt}-pol"
    await create_policy(
        kube,
        halt_policy,
        {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1}}},
    )
    async with (
        fleet_of(cluster, first, 2) as prio_nodes,
        fleet_of(cluster, nopol, 2) as nopol_nodes,
        fleet_of(cluster, edge, 4) as edge_nodes,
        fleet_of(cluster, halt, 3) as halt_nodes,
    ):
        created: list[str] = []

        async def make(name: str, fleet_prefix: str, pkg: JSON | None = None, **spec: Any) -> None:
            await create_nodewright(
                kube,
                nodewright_manifest(
                    name, fleet_prefix=fleet_prefix, packages={"tool": pkg or package(duration="2s")}, **spec
                ),
            )
            created.append(name)

        # An earlier NodeWright (priority 1), paused, on the same nodes as a later one (priority 2).
        await make(first, first, priority=1)
        await kube.merge_patch(
            f"/apis/nodewright.io/v1alpha1/nodewrights/{first}",
            {"metadata": {"annotations": {"nodewright.io/pause": "true"}}},
        )
        await make(later, first, priority=2)
        # A missing policy, and a disabled NodeWright behind it.
        await make(nopol, nopol, deploymentPolicy=f"missing-{unique}", priority=1)
        await make(off, nopol, priority=2)
        await kube.merge_patch(
            f"/apis/nodewright.io/v1alpha1/nodewrights/{off}",
            {"metadata": {"annotations": {"nodewright.io/disable": "true"}}},
        )
        # Node-level reasons: an untolerated taint, NotReady, an unreadable state.
        tainted, notready, malformed, _fine = edge_nodes
        await kube.merge_patch(
            f"/api/v1/nodes/{tainted}",
            {"spec": {"taints": [{"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"}]}},
        )
        await kube.strategic_patch(
            f"/api/v1/nodes/{notready}/status",
            {
                "status": {
                    "conditions": [
                        {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "e2e"}
                    ]
                }
            },
        )
        await kube.merge_patch(
            f"/api/v1/nodes/{malformed}",
            {"metadata": {"annotations": {f"nodewright.io/state.{edge}": "{not json"}}},
        )
        await make(edge, edge, pkg=package(duration="2s"), interruptionBudget={"count": 4})
        # A compartment that halts: every node fails, failureThreshold 1.
        failing = package(duration="1s", env={"NODEWRIGHT_SIM_FAIL": "always"}, maxAttempts=1)
        await make(halt, halt, pkg=failing, deploymentPolicy=halt_policy)

        answer = await until_reason(cluster, prio_nodes[0], first, "Paused")
        assert f"kubectl nodewright resume {first}" in answer["details"][0]
        answer = await until_reason(cluster, prio_nodes[0], later, "WaitingForPriority")
        assert answer["summary"] == f"waiting for NodeWright {first!r} (paused)", answer
        assert any("priority 1" in d and "resume it" in d for d in answer["details"]), answer

        async def predecessor_paused() -> JSON | None:
            cond = condition(await get_nodewright(kube, later), "WaitingForNodeWright")
            return cond if cond.get("reason") == "PredecessorPaused" else None

        cond = await fleet.wait_for(predecessor_paused, within=30, what="WaitingForNodeWright condition")
        assert cond["status"] == "True" and first in cond["message"] and "paused" in cond["message"], cond

        answer = await until_reason(cluster, nopol_nodes[0], nopol, "PolicyNotFound")
        assert f"missing-{unique}" in answer["summary"]
        answer = await until_reason(cluster, nopol_nodes[0], off, "Disabled")
        assert f"kubectl nodewright enable {off}" in answer["details"][0]

        answer = await until_reason(cluster, tainted, edge, "Blocked")
        assert "taint not tolerated: example.com/maintenance=x:NoSchedule" in answer["summary"], answer
        answer = await until_reason(cluster, notready, edge, "NodeUnavailable")
        assert answer["summary"] == "node unavailable: NotReady", answer
        answer = await until_reason(cluster, malformed, edge, "StateMalformed")
        assert "not valid JSON" in " ".join(answer["details"]), answer
        status = await plugin_json(cluster, "status", edge)
        assert status["nodes"].get("blocked", 0) >= 1

        async def halted_rows() -> list[JSON] | None:
            rows = (await plugin_json(cluster, "node", "list", halt))["nodes"]
            reasons = sorted(r["reason"] for r in rows)
            return rows if reasons == ["CompartmentHalted", "CompartmentHalted", "Erroring"] else None

        rows = await fleet.wait_for(halted_rows, within=90, interval=0.5, what="a halted compartment")
        assert sorted(r["node"] for r in rows) == sorted(halt_nodes)
        waiting = next(r["node"] for r in rows if r["reason"] == "CompartmentHalted")
        halted = await why(cluster, waiting, halt)
        assert "halted" in halted["summary"] and "policy reset" in halted["details"][-1], halted
        shown = await plugin_json(cluster, "status", halt)
        [h] = shown["halts"]
        assert h["compartment"] == "__default__" and h["failingCount"] == 1

        # Resume the paused one: the later NodeWright follows it on its nodes.
        await plugin_json(cluster, "resume", first)
        await wait_statuses(kube, first, later, "complete", within=120)
        # Clean up what the scenario broke, then the NodeWrights.
        await kube.merge_patch(f"/api/v1/nodes/{tainted}", {"spec": {"taints": None}})
        await kube.merge_patch(
            f"/api/v1/nodes/{malformed}", {"metadata": {"annotations": {f"nodewright.io/state.{edge}": None}}}
        )
        await plugin_json(cluster, "enable", off)
        for name in created:
            await delete_nodewright(kube, name, within=120)
            invariants.expect_cleanup(name)
    await kube.delete(f"{POLICIES}/{halt_policy}")
