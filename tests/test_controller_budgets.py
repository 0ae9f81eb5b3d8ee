"""Shared DisruptionBudgets in the controller (controller/budgets.py): two rollout passes of one operator
race for the last slot, through the real client against `FakeKube` (which refuses a patch carrying a
stale resourceVersion with 409, like the API server). Exactly one admits; the other re-reads the budget,
plans again and queues; the budget controller keeps the aggregates and sweeps a gone holder's slots.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest

from nodewright.api.admission import admission_annotation
from nodewright.controller.budgets import SharedBudgets
from nodewright.controller.rollout import RolloutReconciler
from nodewright.controller.runtime import Runtime
from nodewright.kube.client import KubeClient
from nodewright.kube.informer import Informer
from nodewright.kube.resources import DISRUPTIONBUDGETS, NODES, NODEWRIGHTS, PODS
from nodewright.kube.trim import trim_node
from tests.kubefake import FakeKube
from tests.test_controller_nodes import NS, make_runtime, nw_obj

NODES_C = ("api/v1", "", "nodes")
NW_C = ("apis/nodewright.io/v1alpha1", "", "nodewrights")
NDB_C = ("apis/nodewright.io/v1alpha1", "", "disruptionbudgets")


def _node(name: str, owner: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"{name}-uid", "labels": {"owner": owner, "pool": "gpu"}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"bootID": "b"}},
    }


def _nodewright(name: str) -> dict[str, Any]:
    obj = nw_obj(nodeSelectors={"matchLabels": {"owner": name}}, interruptionBudget={"count": 1})
    obj["metadata"].update(name=name, uid=f"{name}-uid")
    return obj


class _Env:
    def __init__(self, kube: FakeKube, rt: Runtime, budgets: SharedBudgets) -> None:
        self.kube, self.rt, self.budgets = kube, rt, budgets
        self.reconciler = RolloutReconciler(rt, budgets=budgets)

    def admitted(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for nw in ("alpha", "beta"):
            key = admission_annotation(nw)
            out[nw] = sorted(
                name
                for name, n in self.kube.objects.get(NODES_C, {}).items()
                if key in (n["metadata"].get("annotations") or {})
            )
        return out

    def budget(self) -> dict[str, Any]:
        return self.kube.get(NDB_C, "gpu") or {}


@pytest.fixture
async def env() -> AsyncIterator[_Env]:
    kube = await FakeKube().start()
    client = KubeClient(kube.config(), max_retries=0)
    nodes = Informer(client, NODES, transform=trim_node)
    nodewrights = Informer(client, NODEWRIGHTS)
    rt = make_runtime(client, nodes=nodes, nodewrights=nodewrights, pods=Informer(client, PODS, namespace=NS))
    budgets = SharedBudgets(rt, Informer(client, DISRUPTIONBUDGETS))
    for nw in ("alpha", "beta"):
        rt.nodewrights.upsert(kube.put(NW_C, _nodewright(nw)))
        for i in range(2):
            rt.nodes.upsert(trim_node(kube.put(NODES_C, _node(f"{nw}-{i}", nw))))
    budget = {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DisruptionBudget",
        "metadata": {"name": "gpu"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "gpu"}}, "budget": {"count": 1}},
    }
    budgets.informer.upsert(kube.put(NDB_C, budget))
    try:
        yield _Env(kube, rt, budgets)
    finally:
        await rt.events.close(grace=0.1)
        await client.close()
        await kube.stop()


async def test_two_passes_racing_for_the_last_slot_admit_one_node(env: _Env) -> None:
    # Both passes plan from the same cached version of the budget; the loser's slot write is refused.
    await asyncio.gather(env.reconciler.reconcile("alpha"), env.reconciler.reconcile("beta"))
    admitted = env.admitted()
    assert sum(len(v) for v in admitted.values()) == 1, admitted
    status = env.budget().get("status") or {}
    winner = next(nw for nw, nodes in admitted.items() if nodes)
    loser = "beta" if winner == "alpha" else "alpha"
    assert status["slots"] == {admitted[winner][0]: {winner: status["slots"][admitted[winner][0]][winner]}}
    assert list(status.get("waiting") or {}) == [loser], "the refused NodeWright queues for the next slot"
    assert status["holders"] == {winner: 1}

    # The budget controller's aggregates; a gone holder's slot is swept.
    env.budgets.view.record(env.budget())
    await env.budgets.reconcile("gpu")
    status = env.budget()["status"]
    assert (status["matched"], status["ceiling"], status["disrupted"]) == (4, 1, 1), status
    assert winner in status["message"]
    gone = env.kube.remove(NW_C, winner) or {}
    env.rt.nodewrights.delete(gone)
    await env.budgets.reconcile("gpu")
    assert not (env.budget()["status"].get("slots") or {}), "the slot of a NodeWright that is gone is swept"


async def test_a_stale_cache_is_refreshed_after_a_conflict(env: _Env) -> None:
    stale = copy.deepcopy(env.budget())
    # Someone else takes the slot after our cache was filled (a second operator, a hand-over).
    taken = copy.deepcopy(env.budget())
    taken["status"] = {"slots": {"beta-0": {"other": "2026-01-01T00:00:00Z"}}}
    env.kube.put(NDB_C, taken)
    env.budgets.informer.upsert(stale)
    assert not (stale.get("status") or {}).get("slots"), "the cache does not know the slot"
    await env.reconciler.reconcile("alpha")
    assert env.admitted() == {"alpha": [], "beta": []}, "the pass re-read the budget and found no slot"
    assert list((env.budget().get("status") or {}).get("waiting") or {}) == ["alpha"]


def test_pool_nodes_with_nothing_in_progress_share_one_empty_set() -> None:
    """The pool cache holds one PoolNode per node: at 10,000 nodes two fresh empty frozensets each
    would be 4 MiB of nothing."""
    from nodewright.api import constants
    from nodewright.plan.budgets import pool_node

    def node(name: str, **labels: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": labels}, "spec": {}, "status": {"conditions": []}}

    quiet = [pool_node(node(f"n{i}")) for i in range(3)]
    assert quiet[0].in_progress_for == frozenset() and quiet[0].cordoned_by == frozenset()
    assert len({id(n.in_progress_for) for n in quiet} | {id(n.cordoned_by) for n in quiet}) == 1
    busy = pool_node(node("b", **{f"{constants.STATUS_LABEL_PREFIX}nw": "in_progress"}))
    assert busy.in_progress_for == frozenset({"nw"})
