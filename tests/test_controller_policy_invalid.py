"""A DeploymentPolicy stored with a blackout day that does not exist (issue 29 item 2), seen by the rollout
controller from its caches: written before the CRD refused such days, or while admission was bypassed.

The NodeWright using it gets the `PolicyInvalid` condition (and `Stalled`), a Warning Event naming the
policy, the field and what to write, status `blocked` and no admission -- one pass, no exception (the
work queue used to retry `ValueError('day is out of range for month')` for ever). Another NodeWright
with a valid policy keeps progressing. Real client and HTTP against `FakeKube`; stores filled by hand
(`tests/test_controller_rollout_passes.py`). The same on a real control plane, with the policy stored
under the old CRD: `e2e/test_policy_invalid.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from nodewright.api.reasons import PolicyInvalid, WaitReason
from nodewright.controller.rollout import RolloutReconciler
from nodewright.kube.client import KubeClient
from nodewright.kube.informer import Informer
from nodewright.kube.resources import NODES, NODEWRIGHTS, PODS
from nodewright.kube.trim import trim_node
from nodewright.plan.policy import resolve_compartments
from nodewright.plan.rollout import plan_rollout
from nodewright.plan.status import aggregate_status
from tests.kubefake import FakeKube
from tests.test_controller_nodes import NS, make_runtime, nw_obj
from tests.test_controller_rollout_passes import NODES_C, NW_C, _node

DP_C = ("apis/nodewright.io/v1alpha1", "", "deploymentpolicies")
FIELD = "spec.compartments[0].maintenance.blackouts[0].start"


def policy_obj(name: str, start: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DeploymentPolicy",
        "metadata": {"name": name, "uid": f"{name}-uid", "generation": 1},
        "spec": {
            "default": {"budget": {"count": 1}, "strategy": {"fixed": {}}},
            "compartments": [
                {
                    "name": "gpu",
                    "selector": {"matchLabels": {"pool": "a"}},
                    "budget": {"count": 1},
                    "maintenance": {"blackouts": [{"start": start, "end": "2026-03-02", "reason": "freeze"}]},
                }
            ],
        },
    }


def nodewright(name: str, policy: str, pool: str) -> dict[str, Any]:
    obj = nw_obj(nodeSelectors={"matchLabels": {"pool": pool}}, deploymentPolicy=policy)
    obj["metadata"].update(name=name, uid=f"{name}-uid")
    return obj


class Env:
    def __init__(self, kube: FakeKube, rt: Any) -> None:
        self.kube, self.rt = kube, rt
        self.reconciler = RolloutReconciler(rt)

    def put(self, collection: tuple[str, str, str], obj: dict[str, Any]) -> None:
        stored = self.kube.put(collection, obj)
        informer = {NODES_C: self.rt.nodes, NW_C: self.rt.nodewrights, DP_C: self.rt.policies}[collection]
        informer.upsert(trim_node(stored) if collection == NODES_C else stored)

    def status_patches(self, name: str) -> list[dict[str, Any]]:
        return [
            r.body["status"]
            for r in self.kube.requests
            if r.method == "PATCH" and r.path.endswith(f"/nodewrights/{name}/status")
        ]

    def admitted(self, name: str) -> list[str]:
        key = f"nodewright.io/batch.{name}"
        nodes = [self.kube.get(NODES_C, n) or {} for n in ("a0", "a1", "b0", "b1")]
        return [str(n["metadata"]["name"]) for n in nodes if key in (n["metadata"].get("annotations") or {})]

    async def events(self, reason: str) -> list[dict[str, Any]]:
        async with asyncio.timeout(5):
            await self.rt.events.flush()
        return [
            r.body
            for r in self.kube.requests
            if r.method == "POST" and r.path.endswith("/events") and r.body["reason"] == reason
        ]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    kube = await FakeKube().start()
    client = KubeClient(kube.config(), max_retries=0)
    nodes = Informer(client, NODES, transform=trim_node)
    rt = make_runtime(
        client,
        nodes=nodes,
        nodewrights=Informer(client, NODEWRIGHTS),
        pods=Informer(client, PODS, namespace=NS),
    )
    try:
        yield Env(kube, rt)
    finally:
        await rt.events.close(grace=0.1)
        await client.close()
        await kube.stop()


async def test_a_stored_impossible_day_blocks_its_users_with_a_condition_and_an_event(env: Env) -> None:
    env.put(DP_C, policy_obj("frozen", "2026-02-30"))
    env.put(DP_C, policy_obj("fine", "2026-02-28"))
    env.put(NW_C, nodewright("stuck", "frozen", "a"))
    env.put(NW_C, nodewright("moving", "fine", "b"))
    for i in range(2):
        env.put(NODES_C, _node(f"a{i}", "a"))
        env.put(NODES_C, _node(f"b{i}", "b"))

    await env.reconciler.reconcile("stuck")  # used to raise ValueError, retried for ever
    await env.reconciler.reconcile("moving")

    status = env.status_patches("stuck")[-1]
    assert status["status"] == "blocked"
    conditions = {c["type"]: c for c in status["conditions"]}
    invalid = conditions["PolicyInvalid"]
    assert invalid["status"] == "True" and invalid["reason"] == "DeploymentPolicyInvalid"
    for words in (
        "DeploymentPolicy 'frozen' is invalid",
        f"{FIELD}: '2026-02-30' does not exist: February 2026 has 28 days",
        "kubectl edit deploymentpolicy frozen",
    ):
        assert words in invalid["message"], invalid["message"]
    assert (
        conditions["Stalled"]["status"] == "True"
        and conditions["Stalled"]["reason"] == "DeploymentPolicyInvalid"
    )
    assert conditions["PolicyNotFound"]["status"] == "False"
    assert status["waitingReasons"] == {"PolicyInvalid": 2}
    assert env.admitted("stuck") == []
    [event] = await env.events("PolicyInvalid")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "stuck"
    assert "'frozen'" in event["message"] and FIELD in event["message"] and "kubectl edit" in event["message"]

    # The rest of the fleet keeps progressing.
    assert env.admitted("moving") == ["b0"]
    moving = {c["type"]: c for c in env.status_patches("moving")[-1]["conditions"]}
    assert moving["PolicyInvalid"]["status"] == "False"

    # Fixed: the next pass admits (a new resourceVersion is parsed again).
    env.put(DP_C, policy_obj("frozen", "2026-02-28"))
    await env.reconciler.reconcile("stuck")
    assert env.admitted("stuck") == ["a0"]
    fixed = {c["type"]: c for c in env.status_patches("stuck")[-1]["conditions"]}
    assert fixed["PolicyInvalid"]["status"] == "False" and fixed["Stalled"]["status"] == "False"


def test_the_planner_treats_an_invalid_policy_like_a_missing_one() -> None:
    from nodewright.api.models import NodeWright, Status
    from nodewright.plan.rollout import RolloutNode

    nw = NodeWright.model_validate(nodewright("stuck", "frozen", "a"))
    invalid = PolicyInvalid("frozen", (f"{FIELD}: '2026-02-30' does not exist",))
    assert resolve_compartments(nw, policy=invalid, nodes=[]) is invalid
    assert (
        type(resolve_compartments(nw, policy=PolicyInvalid("other", ()), nodes=[])).__name__
        == "PolicyNotFound"
    )
    plan = plan_rollout(
        nw,
        policy=invalid,
        nodes=[RolloutNode("a0", {"pool": "a"}, None, Status.WAITING, True)],
        compartment_statuses={},
        fingerprint="f",
        now="2026-01-01T00:00:00Z",
    )
    assert plan.policy_invalid is invalid and plan.policy_not_found is None and not plan.admissions
    assert [(w.node, w.reason, w.message) for w in plan.waiting] == [
        ("a0", WaitReason.POLICY_INVALID, invalid.message)
    ]
    summary = aggregate_status(nw, nodes=[], plan=plan, now="2026-01-01T00:00:00Z")
    assert summary.status.status is not None and summary.status.status.value == "blocked"
