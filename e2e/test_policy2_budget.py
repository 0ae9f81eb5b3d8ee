"""Issue 18 acceptance (part): one DisruptionBudget shared by several NodeWrights, on the real control plane.

- The API server refuses a status write carrying an older resourceVersion (409): the precondition the
  slots rely on holds for the DisruptionBudget's status subresource.
- 40 nodes, two NodeWrights (each on its own half of the fleet) both rolling out a package with a
  reboot, one pool of 8 nodes under a DisruptionBudget of 1, and a DeploymentPolicy whose pool
  compartment alone would let each NodeWright disrupt 2 pool nodes at once. A person cordons one node
  of the pool first: that node counts as disrupted, so nothing else of the pool starts until it is
  uncordoned (the plugin says why, naming the budget). Then both rollouts finish; the invariant
  monitor (I10) records no breach and never saw two pool nodes disrupted at once, while the nodes
  outside the pool went several at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import NW_PATH, create_nodewright, delete_nodewright, package, wait_statuses
from e2e.test_plugin import create_policy, why
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, ApiError, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

BUDGETS = "/apis/nodewright.io/v1alpha1/disruptionbudgets"
POLICIES = "/apis/nodewright.io/v1alpha1/deploymentpolicies"
OWNER = "e2e.nodewright.io/owner"
POOL = "e2e.nodewright.io/pool"


@contextlib.asynccontextmanager
async def disruption_budget(kube: KubeClient, name: str, selector: JSON, count: int) -> AsyncIterator[JSON]:
    created = await kube.create(
        BUDGETS,
        {
            "apiVersion": "nodewright.io/v1alpha1",
            "kind": "DisruptionBudget",
            "metadata": {"name": name},
            "spec": {"nodeSelector": selector, "budget": {"count": count}},
        },
    )
    try:
        yield created
    finally:
        await kube.delete(f"{BUDGETS}/{name}")


async def test_budget_status_writes_need_the_current_resource_version(
    cluster: ControlPlane, crds: None, kube: KubeClient, unique: str
) -> None:
    async with disruption_budget(kube, f"rv-{unique}", {"matchLabels": {POOL: unique}}, 1) as created:
        rv = created["metadata"]["resourceVersion"]
        first = await kube.merge_patch(
            f"{BUDGETS}/rv-{unique}/status",
            {"metadata": {"resourceVersion": rv}, "status": {"slots": {"n1": {"a": "2026-01-01T00:00:00Z"}}}},
        )
        assert first["status"]["slots"] == {"n1": {"a": "2026-01-01T00:00:00Z"}}
        with pytest.raises(ApiError) as refused:
            await kube.merge_patch(
                f"{BUDGETS}/rv-{unique}/status",
                {
                    "metadata": {"resourceVersion": rv},
                    "status": {"slots": {"n2": {"b": "2026-01-01T00:00:00Z"}}},
                },
            )
        assert refused.value.status == 409, refused.value
        stored = await kube.get(f"{BUDGETS}/rv-{unique}")
        assert stored["status"]["slots"] == {"n1": {"a": "2026-01-01T00:00:00Z"}}, "the stale write was lost"


def _reboot_nodewright(name: str, owner: str, policy: str) -> JSON:
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": name},
        "spec": {
            "nodeSelectors": {"matchLabels": {OWNER: owner}},
            "deploymentPolicy": policy,
            "packages": {"kernel": package(interrupt={"type": "reboot"})},
        },
    }


async def _max_in_progress_outside(kube: KubeClient, unique: str, seen: list[int]) -> None:
    """Sample how many nodes outside the pool are in progress at once (the control: they go in parallel)."""
    while True:
        listed = await kube.list_all(
            "/api/v1/nodes", params={"labelSelector": f"{OWNER} in (a-{unique},b-{unique}),!{POOL}"}
        )
        busy = sum(
            1
            for node in listed["items"]
            for key, value in (node["metadata"].get("labels") or {}).items()
            if key.startswith("nodewright.io/status.") and value == "in_progress"
        )
        seen.append(busy)
        await asyncio.sleep(0.5)


async def test_two_nodewrights_sharing_a_budget_of_one_never_disrupt_two_pool_nodes(
    cluster: ControlPlane, operator: Any, kube: KubeClient, unique: str, invariants: InvariantMonitor
) -> None:
    budget_name, policy_name = f"pool-{unique}", f"shared-{unique}"
    nw_a, nw_b = f"sha-{unique}", f"shb-{unique}"
    pool_selector = {"matchLabels": {POOL: unique}}
    await create_policy(
        kube,
        policy_name,
        {"budget": {"count": 4}, "strategy": {"fixed": {"initialBatch": 4}}},
        compartments=[
            {
                "name": "pool",
                "selector": pool_selector,
                "budget": {"count": 2},
                "strategy": {"fixed": {"initialBatch": 2}},
            }
        ],
    )
    fleets = [
        (f"bpa-{unique}", 4, {OWNER: f"a-{unique}", POOL: unique}),
        (f"bpb-{unique}", 4, {OWNER: f"b-{unique}", POOL: unique}),
        (f"bxa-{unique}", 16, {OWNER: f"a-{unique}"}),
        (f"bxb-{unique}", 16, {OWNER: f"b-{unique}"}),
    ]
    outside: list[int] = []
    sampler: asyncio.Task[None] | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            names: dict[str, list[str]] = {}
            for prefix, count, labels in fleets:
                names[prefix] = await stack.enter_async_context(
                    operator_fixture.fleet_of(cluster, prefix, count, labels_extra=labels)
                )
            await stack.enter_async_context(disruption_budget(kube, budget_name, pool_selector, 1))
            # A person cordons a node of the pool: it is out of service, so it fills the budget.
            cordoned = names[f"bpb-{unique}"][0]
            await kube.merge_patch(f"/api/v1/nodes/{cordoned}", {"spec": {"unschedulable": True}})
            await invariants.sync()
            await create_nodewright(kube, _reboot_nodewright(nw_a, f"a-{unique}", policy_name))
            await create_nodewright(kube, _reboot_nodewright(nw_b, f"b-{unique}", policy_name))
            sampler = asyncio.create_task(_max_in_progress_outside(kube, unique, outside))

            # The pool nodes of NodeWright A wait for the budget, and say who holds it.
            waiting = names[f"bpa-{unique}"][0]

            async def budget_reason() -> JSON | None:
                answer = await why(cluster, waiting, nw_a)
                return answer if answer["reason"] == "DisruptionBudget" else None

            answer = await fleet.wait_for(
                budget_reason, within=60, interval=1.0, what="why: DisruptionBudget"
            )
            assert budget_name in answer["summary"] and cordoned in answer["summary"], answer
            await asyncio.sleep(10)
            pool_nodes = names[f"bpa-{unique}"] + names[f"bpb-{unique}"]
            started = [
                n
                for n in pool_nodes
                if n != cordoned
                and any(
                    k.startswith("nodewright.io/status.") and v != "waiting"
                    for k, v in (
                        (await kube.get(f"/api/v1/nodes/{n}"))["metadata"].get("labels") or {}
                    ).items()
                )
            ]
            assert not started, f"pool nodes started while a cordoned node filled the budget: {started}"
            status = (await kube.get(f"{BUDGETS}/{budget_name}")).get("status") or {}
            assert status.get("ceiling") == 1 and status.get("disrupted", 0) >= 1, status

            # Uncordoned, the pool frees up: both rollouts go through it one node at a time.
            invariants.expect_uncordon(cordoned)
            await kube.merge_patch(f"/api/v1/nodes/{cordoned}", {"spec": {"unschedulable": None}})
            holders_seen: set[str] = set()

            async def all_complete() -> bool:
                obj = await kube.get(f"{BUDGETS}/{budget_name}")
                holders_seen.update(((obj.get("status") or {}).get("holders") or {}).keys())
                nodes = await kube.list_all(
                    "/api/v1/nodes", params={"labelSelector": f"{OWNER} in (a-{unique},b-{unique})"}
                )
                done = 0
                for node in nodes["items"]:
                    labels = node["metadata"].get("labels") or {}
                    owner = labels[OWNER]
                    nw = nw_a if owner == f"a-{unique}" else nw_b
                    done += labels.get(f"nodewright.io/status.{nw}") == "complete"
                return done == 40

            await fleet.wait_for(all_complete, within=900, interval=1.0, what="both rollouts complete")
            for prefix, nw in ((f"bpa-{unique}", nw_a), (f"bxb-{unique}", nw_b)):
                await wait_statuses(kube, prefix, nw, "complete", within=30)
            assert holders_seen >= {nw_a, nw_b}, (
                f"the budget's status never showed both holders: {holders_seen}"
            )
            await invariants.sync()
            assert invariants.max_disrupted(budget_name) == 1, invariants.max_disrupted(budget_name)
            assert not invariants.breaches_of("I10")
            assert max(outside, default=0) >= 3, (
                f"outside the pool nodes should go in parallel: {max(outside)}"
            )
            final = (await kube.get(f"{BUDGETS}/{budget_name}")).get("status") or {}

            async def released() -> bool:
                status = (await kube.get(f"{BUDGETS}/{budget_name}")).get("status") or {}
                return not status.get("slots") and not status.get("waiting")

            await fleet.wait_for(released, within=60, what=f"slots of {budget_name} released ({final})")
            for nw in (nw_a, nw_b):
                await delete_nodewright(kube, nw, within=120)
    finally:
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        for nw in (nw_a, nw_b):
            with contextlib.suppress(ApiError):
                await kube.delete(f"{NW_PATH}/{nw}")
        with contextlib.suppress(ApiError):
            await kube.delete(f"{POLICIES}/{policy_name}")
