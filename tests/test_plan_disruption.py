"""Idle nodes first (`plan.disruption`): a node's disruption cost by the drain's rule, and the opt-in
`nodeOrder: idleFirst` that admits the cheapest nodes (or topology domains) first.

Worked examples and Hypothesis properties on the pure order and on the planner driven by the
controller stand-in of `tests.test_plan_rollout`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nodewright.api import constants
from nodewright.api.models import Compartment as PolicyCompartment
from nodewright.api.models import (
    DeploymentPolicy,
    LabelSelector,
    NodeOrder,
    PolicyBudget,
    PolicyDefault,
    Status,
)
from nodewright.plan import disruption, drain, topology
from nodewright.plan.disruption import DisruptionCost, cost_of, idle_first
from nodewright.plan.drain import facts_of
from nodewright.plan.rollout import RolloutNode, pick_key
from nodewright.plan.rollout_input import rollout_input
from tests.test_plan_rollout import Sim, fixed, nodewright, policy

RACK = "example.com/rack"
GPU = {"gpu": "h100"}
PROTECT = LabelSelector(match_labels={"job": "training"})


def pod(
    name: str, *, phase: str = "Running", labels: Mapping[str, str] | None = None, **meta: Any
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": name, "labels": dict(labels or {}), **meta},
        "spec": {"nodeName": "n"},
        "status": {"phase": phase},
    }


# ----------------------------------------------------------------------------------------------------
# The cost


def test_cost_counts_what_a_drain_evicts_and_what_an_interrupt_waits_for() -> None:
    pods = [
        pod("train", labels={"job": "training"}),
        pod("web-1"),
        pod("web-2"),
        pod("ds", ownerReferences=[{"kind": "DaemonSet", "name": "dcgm"}]),
        pod("static", annotations={"kubernetes.io/config.mirror": "x"}),
        pod("ours", labels={constants.POD_OWNER_LABEL: constants.POD_OWNER_VALUE}),
        pod("done", phase="Succeeded"),
        pod("leaving", deletionTimestamp="2025-01-01T00:00:00Z"),
    ]
    # The protected training pod is also evicted by a drain (after the interrupt waited for it).
    assert cost_of(pods, protect=PROTECT) == DisruptionCost(protected=1, evictable=3)
    assert cost_of(pods, protect=None) == DisruptionCost(protected=0, evictable=3)


def test_a_node_of_daemonsets_static_and_own_pods_is_idle() -> None:
    pods = [
        pod("ds", ownerReferences=[{"kind": "DaemonSet", "name": "dcgm"}]),
        pod("static", annotations={"kubernetes.io/config.mirror": "x"}),
        pod("ours", labels={constants.POD_OWNER_LABEL: constants.POD_OWNER_VALUE}),
    ]
    cost = cost_of(pods, protect=PROTECT)
    assert cost.idle and cost.describe() == "idle"
    assert DisruptionCost(1, 2).describe() == "1 protected, 2 evictable pods"


def test_no_protected_pod_beats_any_number_of_evictable_ones() -> None:
    assert DisruptionCost(0, 100) < DisruptionCost(1, 0) < DisruptionCost(1, 1) < DisruptionCost(2, 0)


# ----------------------------------------------------------------------------------------------------
# The order (pure, generic)


def node(name: str, cost: DisruptionCost | None, *, rack: str | None = None, created: int = 0) -> RolloutNode:
    labels = {**GPU, **({RACK: rack} if rack else {})}
    stamp = f"2024-01-01T00:{created // 60:02d}:{created % 60:02d}Z"
    return RolloutNode(name, labels, stamp, Status.WAITING, needs_work=True, disruption=cost)


costs = st.one_of(st.none(), st.builds(DisruptionCost, st.integers(0, 2), st.integers(0, 3)))


@st.composite
def fleets(draw: st.DrawFn) -> list[RolloutNode]:
    size = draw(st.integers(0, 12))
    nodes = [
        node(
            f"n{i:02d}",
            draw(costs),
            rack=draw(st.sampled_from([None, "r0", "r1", "r2"])),
            created=draw(st.integers(0, 5)),
        )
        for i in range(size)
    ]
    return sorted(nodes, key=pick_key)


@given(fleets())
def test_idle_first_is_a_stable_permutation_cheapest_first(nodes: list[RolloutNode]) -> None:
    ordered = idle_first(nodes)
    assert sorted(n.name for n in ordered) == sorted(n.name for n in nodes)
    keys = [disruption.sort_key(n.disruption) for n in ordered]
    assert keys == sorted(keys)
    for i in range(len(ordered) - 1):
        if keys[i] == keys[i + 1]:
            assert nodes.index(ordered[i]) < nodes.index(ordered[i + 1]), "equal costs keep the pick order"
    seen_protected = False
    for n in ordered:
        if n.disruption is not None and n.disruption.protected:
            seen_protected = True
        if n.disruption is not None and n.disruption.protected == 0:
            assert not seen_protected, "a node with protected pods never precedes one without"


@given(fleets())
def test_idle_first_by_domain_keeps_domains_whole_and_orders_them_by_summed_cost(
    nodes: list[RolloutNode],
) -> None:
    ordered = idle_first(nodes, key=RACK)
    assert sorted(n.name for n in ordered) == sorted(n.name for n in nodes)
    units = topology.group(RACK, ordered)
    assert topology.flatten(units) == tuple(ordered), "a domain's nodes are contiguous"
    unit_keys = [disruption.sort_key(disruption.domain_cost(u)) for u in units]
    assert unit_keys == sorted(unit_keys)
    for unit in units:
        assert list(unit) == [n for n in nodes if n in unit], "nodes within a domain keep pick order"


@settings(max_examples=40, deadline=None)
@given(fleets(), st.randoms(use_true_random=False), st.booleans())
def test_the_plan_does_not_depend_on_the_input_order(nodes: list[RolloutNode], rnd: Any, racks: bool) -> None:
    pol = idle_policy(key=RACK if racks else None)
    shuffled = list(nodes)
    rnd.shuffle(shuffled)
    assert sim(shuffled, pol).plan().admissions == sim(nodes, pol).plan().admissions


def test_unknown_cost_goes_last() -> None:
    nodes = [node("a", None), node("b", DisruptionCost(1, 5)), node("c", DisruptionCost())]
    assert [n.name for n in idle_first(nodes)] == ["c", "b", "a"]


# ----------------------------------------------------------------------------------------------------
# The planner


def idle_policy(
    *, order: NodeOrder | None = NodeOrder.IDLE_FIRST, key: str | None = None, budget: int = 2
) -> DeploymentPolicy:
    comp = PolicyCompartment(
        name="gpu",
        selector=LabelSelector(match_labels=GPU),
        budget=PolicyBudget(count=budget),
        strategy=fixed(budget),
        topology_key=key,
        node_order=order,
    )
    return policy(fixed(1), PolicyBudget(count=1), compartments=[comp])


def sim(nodes: Sequence[RolloutNode], pol: DeploymentPolicy) -> Sim:
    return Sim(nodewright(deployment_policy="pol"), pol, {n.name: n for n in nodes})


def busy_fleet() -> list[RolloutNode]:
    return [
        node("a-busy", DisruptionCost(0, 4), created=0),
        node("b-protected", DisruptionCost(1, 0), created=1),
        node("c-idle", DisruptionCost(), created=2),
        node("d-light", DisruptionCost(0, 1), created=3),
        node("e-idle", DisruptionCost(), created=4),
    ]


def batches_of(s: Sim) -> list[list[str]]:
    return [sorted(a.node for a in p.admissions) for p in s.run() if p.admissions]


def test_idle_first_admits_idle_nodes_in_the_first_batch() -> None:
    assert batches_of(sim(busy_fleet(), idle_policy())) == [
        ["c-idle", "e-idle"],
        ["a-busy", "d-light"],
        ["b-protected"],
    ]


def test_without_the_option_the_pick_order_is_kept() -> None:
    assert batches_of(sim(busy_fleet(), idle_policy(order=None))) == [
        ["a-busy", "b-protected"],
        ["c-idle", "d-light"],
        ["e-idle"],
    ]


def test_the_default_compartment_may_opt_in() -> None:
    pol = policy(fixed(2), PolicyBudget(count=2))
    pol = pol.model_copy(
        update={
            "spec": pol.spec.model_copy(
                update={
                    "default": PolicyDefault(
                        budget=PolicyBudget(count=2), strategy=fixed(2), node_order=NodeOrder.IDLE_FIRST
                    )
                }
            )
        }
    )
    assert disruption.opted_in(pol) and not disruption.opted_in(policy(fixed(2), PolicyBudget(count=2)))
    assert batches_of(sim(busy_fleet(), pol))[0] == ["c-idle", "e-idle"]


def test_idle_first_takes_the_cheapest_rack_whole() -> None:
    nodes = [
        node("r0-a", DisruptionCost(0, 1), rack="r0"),
        node("r0-b", DisruptionCost(), rack="r0"),
        node("r1-a", DisruptionCost(), rack="r1"),
        node("r1-b", DisruptionCost(), rack="r1"),
        node("r2-a", DisruptionCost(1, 0), rack="r2"),
    ]
    assert batches_of(sim(nodes, idle_policy(key=RACK, budget=1))) == [
        ["r1-a", "r1-b"],
        ["r0-a", "r0-b"],
        ["r2-a"],
    ]


def test_idle_first_never_admits_a_node_waiting_for_an_earlier_nodewright() -> None:
    nodes = busy_fleet()
    nodes[2] = replace(nodes[2], waiting_for_priority="driver")  # c-idle waits for another NodeWright
    first = sim(nodes, idle_policy()).plan()
    assert sorted(a.node for a in first.admissions) == ["d-light", "e-idle"]


def unit_keys(nodes: Sequence[RolloutNode], key: str | None) -> dict[str, tuple[int, DisruptionCost]]:
    """node -> the sort key of its unit (itself, or its domain's summed cost)."""
    if key is None:
        return {n.name: disruption.sort_key(n.disruption) for n in nodes}
    units = topology.group(key, nodes)
    return {n.name: disruption.sort_key(disruption.domain_cost(u)) for u in units for n in u}


@settings(max_examples=60, deadline=None)
@given(fleets(), st.integers(1, 3), st.booleans())
def test_each_batch_takes_the_cheapest_candidates(nodes: list[RolloutNode], budget: int, racks: bool) -> None:
    """Every admission of a plan costs no more than any eligible node (domain) it left waiting."""
    key = RACK if racks else None
    s = sim(nodes, idle_policy(key=key, budget=budget))
    for _ in range(40):
        pending = {n.name for n in s.nodes.values() if n.admission is None and n.needs_work}
        result = s.plan()
        s.apply(result)
        taken = {a.node for a in result.admissions}
        left = pending - taken
        if taken and left:
            keys = unit_keys(list(s.nodes.values()), key)
            assert max(keys[n] for n in taken) <= min(keys[n] for n in left)
        if not result.admissions and not result.active:
            break
        s.finish(result)
    assert all(not n.needs_work for n in s.nodes.values()), "every node is updated in the end"


# ----------------------------------------------------------------------------------------------------
# The input: one constructor carries the costs


def test_rollout_input_carries_each_nodes_cost_by_the_nodewrights_protect_selector() -> None:
    nw = nodewright(deployment_policy="pol", podNonInterruptLabels={"matchLabels": {"job": "training"}})
    objects = [
        {
            "metadata": {"name": name, "labels": dict(GPU)},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        for name in ("n1", "n2")
    ]
    pods = {"n1": [pod("train", labels={"job": "training"}), pod("web")], "n2": []}
    inp = rollout_input(
        nw,
        nodes=objects,
        nodewrights={"kernel": nw},
        policies={"pol": idle_policy()},
        now=datetime(2025, 1, 1, tzinfo=UTC),
        node_pods=lambda name: map(facts_of, pods[name]),
    )
    assert {n.name: n.disruption for n in inp.nodes} == {"n1": DisruptionCost(1, 2), "n2": DisruptionCost()}
    plain = rollout_input(
        nw, nodes=objects, nodewrights={"kernel": nw}, policies={}, now=datetime(2025, 1, 1, tzinfo=UTC)
    )
    assert all(n.disruption is None for n in plain.nodes)


# ----------------------------------------------------------------------------------------------------
# One rule: the cost is what the drain selects


@st.composite
def api_pods(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(0, 8))):
        meta: dict[str, Any] = {}
        if draw(st.booleans()):
            meta["ownerReferences"] = [{"kind": draw(st.sampled_from(["DaemonSet", "ReplicaSet", "Job"]))}]
        if draw(st.integers(0, 4)) == 0:
            meta["annotations"] = {"kubernetes.io/config.mirror": "x"}
        if draw(st.integers(0, 4)) == 0:
            meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        labels = draw(
            st.dictionaries(
                st.sampled_from(["job", "team", constants.POD_OWNER_LABEL]),
                st.sampled_from(["training", "a", constants.POD_OWNER_VALUE]),
            )
        )
        p = pod(
            f"p{i}",
            phase=draw(st.sampled_from(["Running", "Pending", "Succeeded", "Failed"])),
            labels=labels,
            **meta,
        )
        if draw(st.integers(0, 4)) == 0:
            p["spec"]["tolerations"] = [{"operator": "Exists"}]
        out.append(p)
    return out


@given(api_pods(), st.sampled_from([None, PROTECT, LabelSelector()]))
def test_the_cost_is_the_drains_own_selection(
    pods: list[dict[str, Any]], protect: LabelSelector | None
) -> None:
    selection = drain.select(pods, protect=protect)
    assert cost_of(pods, protect=protect) == DisruptionCost(len(selection.protected), len(selection.evict))
    assert [f for f in map(facts_of, pods) if f.counts] or cost_of(pods, protect=protect).idle


def test_a_policy_manifest_opts_in_with_idle_first() -> None:
    doc = {
        "metadata": {"name": "pol"},
        "spec": {
            "default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}},
            "compartments": [
                {
                    "name": "gpu",
                    "selector": {"matchLabels": GPU},
                    "budget": {"count": 2},
                    "nodeOrder": "idleFirst",
                }
            ],
        },
    }
    parsed = DeploymentPolicy.model_validate(doc)
    assert parsed.spec.compartments is not None
    assert parsed.spec.compartments[0].node_order is NodeOrder.IDLE_FIRST
    assert disruption.opted_in(parsed)


def test_plan_shows_each_batchs_cost_and_wide_each_nodes() -> None:
    from nodewright.cli import plan_cmd

    nw = nodewright(deployment_policy="pol", packages={"sysctl": {"version": "1.0.0", "image": "x/sysctl"}})
    objects = [
        {
            "metadata": {
                "name": f"n{i}",
                "labels": dict(GPU),
                "creationTimestamp": f"2024-01-01T00:00:0{i}Z",
            },
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        for i in range(3)
    ]
    facts = {"n0": [facts_of(pod("web"))], "n1": [], "n2": []}
    report = plan_cmd.build_report(
        nw, policy=idle_policy(budget=2), nodes=objects, node_pods=lambda n: facts[n]
    )
    [gpu] = [c for c in report.preview.compartments if c.name == "gpu"]
    assert gpu.batches[0].nodes == ("n1", "n2")
    text = plan_cmd.render(report, wide=True)
    assert "gpu  1: idle; 2: 0 protected, 1 evictable pods" in text, text
    assert "n0 [0 protected, 1 evictable pods]" in text, text
    assert report.to_json()["disruptionCosts"]["n0"] == {"protected": 0, "evictable": 1}
