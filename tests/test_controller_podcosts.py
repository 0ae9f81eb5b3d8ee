"""The count-only pod cache of idle nodes first (`controller.podcosts`): what it keeps, and when a
rollout may use it (started on first need; the first batch waits for the first list, not forever)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from nodewright.api import constants
from nodewright.controller import podcosts
from nodewright.controller.podcosts import CostsPending, CostsReady, CostsUnavailable, PodCosts, _reduce
from nodewright.kube.client import KubeClient
from nodewright.kube.clock import FakeClock
from nodewright.plan.disruption import DisruptionCost, cost_of_facts


def pod(name: str, node: str, *, phase: str = "Running", **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": name, "labels": {"job": "training"}, **meta},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": phase},
    }


def cache(clock: FakeClock | None = None) -> PodCosts:
    return PodCosts(cast(KubeClient, None), clock=clock or FakeClock())


def test_it_keeps_the_facts_by_node_and_follows_updates_and_deletes() -> None:
    costs = cache()
    ours = pod("pkg", "n1", labels={constants.POD_OWNER_LABEL: constants.POD_OWNER_VALUE})
    costs.replace([_reduce(p) for p in (pod("a", "n1"), pod("b", "n1"), pod("c", "n2"), ours)], "1")
    assert costs.pods == 3, "the operator's own pods cost nothing and are not kept"
    assert cost_of_facts(costs.facts("n1"), protect=None) == DisruptionCost(0, 2)
    costs.delete(_reduce(pod("a", "n1")))
    costs.upsert(_reduce(pod("c", "n2", deletionTimestamp="2025-01-01T00:00:00Z")))
    assert cost_of_facts(costs.facts("n1"), protect=None) == DisruptionCost(0, 1)
    assert cost_of_facts(costs.facts("n2"), protect=None) == DisruptionCost(0, 0)
    costs.delete(_reduce(pod("b", "n1")))
    assert list(costs.facts("n1")) == [] and costs.pods == 1


def test_equal_facts_are_one_object() -> None:
    costs = cache()
    costs.replace([_reduce(pod(f"p{i}", f"n{i}")) for i in range(3)], "1")
    assert len({id(f) for n in ("n0", "n1", "n2") for f in costs.facts(n)}) == 1


async def test_the_first_need_starts_it_and_the_rollout_waits_for_the_first_list() -> None:
    clock = FakeClock()
    costs = cache(clock)
    started = asyncio.Event()

    async def listing() -> None:
        started.set()
        await asyncio.Event().wait()  # the list never comes

    costs.reflector.run = listing  # type: ignore[method-assign]
    assert isinstance(costs.view(), CostsPending)
    await started.wait()
    clock.advance(podcosts.SYNC_GRACE + 1)
    assert isinstance(costs.view(), CostsUnavailable), "past the grace the rollout orders without costs"
    costs.replace([_reduce(pod("a", "n1"))], "1")
    ready = costs.view()
    assert isinstance(ready, CostsReady)
    assert cost_of_facts(ready.pods("n1"), protect=None) == DisruptionCost(0, 1)
    await costs.stop()
