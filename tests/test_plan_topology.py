"""Whole topology domains (`plan.topology`): a compartment with a `topologyKey` counts racks, not nodes.

Worked examples and Hypothesis properties on the pure planner, driven by the controller stand-in of
`tests.test_plan_rollout` (write admissions, let active nodes finish, plan again): never more domains
disrupted than the budget, a domain admitted whole (one batch, one pass), never an admission into a
domain we still work in, and a plan that does not depend on the order of its input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodewright.api.models import Compartment as PolicyCompartment
from nodewright.api.models import (
    DeploymentPolicy,
    LabelSelector,
    NodeWright,
    PolicyBudget,
    Status,
    Strategy,
)
from nodewright.api.reasons import CORDONED_BY_SOMEONE_ELSE as CORDONED
from nodewright.api.reasons import NOT_READY, Unavailable, WaitReason
from nodewright.cli.plugin import explain
from nodewright.cli.plugin.cluster import ClusterState
from nodewright.plan import budgets, topology
from nodewright.plan.preview import preview_rollout, render_table
from nodewright.plan.rollout import Phase, RolloutNode, RolloutPlan, phase_of, plan_rollout
from tests.test_plan_rollout import FP, NOW, Sim, exp, fixed, lin, nodewright, policy

RACK = "example.com/rack"
GPU = {"gpu": "h100"}


def racks(*sizes: int, unlabelled: int = 0) -> list[RolloutNode]:
    """Racks r0, r1, ... of the given sizes (nodes named r<rack>-n<i>), then nodes without a rack."""
    nodes = [
        RolloutNode(
            name=f"r{r}-n{i}",
            labels={**GPU, RACK: f"r{r}"},
            creation_timestamp=f"2024-01-01T00:00:{(r * 7 + i) % 60:02d}Z",
            status=Status.WAITING,
            needs_work=True,
        )
        for r, size in enumerate(sizes)
        for i in range(size)
    ]
    nodes += [
        RolloutNode(f"loose-{i}", dict(GPU), "2024-01-01T00:01:00Z", Status.WAITING, needs_work=True)
        for i in range(unlabelled)
    ]
    return nodes


def rack_policy(
    budget: PolicyBudget, strategy: Strategy | None = None, *, key: str | None = RACK
) -> DeploymentPolicy:
    comp = PolicyCompartment(
        name="gpu",
        selector=LabelSelector(match_labels=GPU),
        budget=budget,
        strategy=strategy,
        topology_key=key,
    )
    return policy(fixed(1), PolicyBudget(count=1), compartments=[comp])


def sim_of(nodes: Sequence[RolloutNode], pol: DeploymentPolicy, **kw: object) -> Sim:
    return Sim(nodewright(deployment_policy="pol"), pol, {n.name: n for n in nodes}, **kw)  # type: ignore[arg-type]


def rack_of(node: str) -> str:
    return node.split("-")[0]


def test_budget_of_one_domain_rolls_rack_by_rack() -> None:
    sim = sim_of(racks(4, 3, 4), rack_policy(PolicyBudget(count=1)))
    sim.run()
    batches = sim.batches("gpu")
    assert [sorted({rack_of(n) for n in b}) for b in batches] == [["r0"], ["r1"], ["r2"]]
    assert [len(b) for b in batches] == [4, 3, 4]
    status = sim.statuses["gpu"]
    assert status.ceiling == 1 and status.completed == 11


def test_strategy_grows_in_domains() -> None:
    sim = sim_of(racks(*[2] * 8), rack_policy(PolicyBudget(count=8), exp(1, 2)))
    sim.run()
    assert [len({rack_of(n) for n in b}) for b in sim.batches("gpu")] == [1, 2, 4, 1]
    lin_sim = sim_of(racks(*[3] * 6), rack_policy(PolicyBudget(count=8), lin(1, 1)))
    lin_sim.run()
    assert [len({rack_of(n) for n in b}) for b in lin_sim.batches("gpu")] == [1, 2, 3]


def test_percent_budget_counts_domains_and_a_node_without_the_label_is_a_domain() -> None:
    nodes = racks(5, 5, 5, unlabelled=1)
    first = plan_rollout(
        nodewright(deployment_policy="pol"),
        policy=rack_policy(PolicyBudget(percent=50), fixed(3)),
        nodes=nodes,
        compartment_statuses={},
        fingerprint=FP,
        now=NOW,
    )
    # 4 domains (3 racks and loose-0): 50% = 2 domains, i.e. 10 nodes, not 8.
    assert first.compartments["gpu"].status.ceiling == 2
    assert {rack_of(a.node) for a in first.admissions} == {"r0", "r1"}
    assert len(first.admissions) == 10
    assert first.domains["loose-0"] == "<loose-0>" and first.domains["r2-n0"] == "r2"
    assert "2 of 2 domains (example.com/rack) in use: r0, r1" in first.compartments["gpu"].message
    # The strategy wants 3 domains, the budget has room for 2: the third waits for a free domain.
    assert {w.reason for w in first.waiting if w.node.startswith("r2")} == {WaitReason.BUDGET_FULL}
    assert next(w for w in first.waiting if w.node == "loose-0").reason is WaitReason.NOT_YET_IN_BATCH


def test_a_domain_is_admitted_in_one_pass_whatever_the_admission_limit() -> None:
    sim = sim_of(racks(5, 5, 5), rack_policy(PolicyBudget(count=2), fixed(2)), admission_limit=2)
    first = sim.plan()
    sim.apply(first)
    # The limit is rounded up to a whole rack; the second rack of the batch follows in the next pass.
    assert sorted(a.node for a in first.admissions) == [f"r0-n{i}" for i in range(5)]
    assert first.deferred == 5
    second = sim.plan()
    assert sorted(a.node for a in second.admissions) == [f"r1-n{i}" for i in range(5)]
    assert {a.admission.batch for a in (*first.admissions, *second.admissions)} == {1}


def test_unavailable_node_makes_its_domain_disrupted() -> None:
    nodes = racks(3, 3)
    nodes[4] = replace(nodes[4], unavailable=NOT_READY)  # r1-n1
    result = plan_rollout(
        nodewright(deployment_policy="pol"),
        policy=rack_policy(PolicyBudget(count=1)),
        nodes=nodes,
        compartment_statuses={},
        fingerprint=FP,
        now=NOW,
    )
    assert result.admissions == ()
    assert "1 of 1 by nodes unavailable for other reasons" in result.compartments["gpu"].message
    two = plan_rollout(
        nodewright(deployment_policy="pol"),
        policy=rack_policy(PolicyBudget(count=2)),
        nodes=nodes,
        compartment_statuses={},
        fingerprint=FP,
        now=NOW,
    )
    # r1 is disrupted already (its NotReady node), so one more domain fits; r1's two Ready nodes may go.
    assert {rack_of(a.node) for a in two.admissions} == {"r0"}


def test_a_node_joining_a_domain_in_progress_waits_for_the_next_batch() -> None:
    sim = sim_of(racks(2, 2), rack_policy(PolicyBudget(count=2), fixed(1)))
    first = sim.plan()
    sim.apply(first)
    assert {rack_of(a.node) for a in first.admissions} == {"r0"}
    joined = RolloutNode("r0-late", {**GPU, RACK: "r0"}, "2024-01-01T00:05:00Z", Status.WAITING, True)
    sim.nodes[joined.name] = joined
    again = sim.plan()
    # Batch 1 is still open: nothing new; the late node is not slipped into its busy rack.
    assert again.admissions == ()
    assert next(w for w in again.waiting if w.node == "r0-late").reason is WaitReason.NOT_YET_IN_BATCH


def test_shared_budget_smaller_than_a_rack_holds_the_rack_and_the_next_one_goes() -> None:
    nodes = racks(3, 2)
    pool = budgets.SharedBudget("gpu-pool", ceiling=2, members=frozenset(n.name for n in nodes))
    result = plan_rollout(
        nodewright(deployment_policy="pol"),
        policy=rack_policy(PolicyBudget(count=1)),
        nodes=nodes,
        compartment_statuses={},
        fingerprint=FP,
        now=NOW,
        shared_budgets=[pool],
    )
    assert sorted(a.node for a in result.admissions) == ["r1-n0", "r1-n1"]
    held = {w.node: w.reason for w in result.waiting if w.node.startswith("r0")}
    assert held == dict.fromkeys(["r0-n0", "r0-n1", "r0-n2"], WaitReason.DISRUPTION_BUDGET)
    assert result.budget_refusals == ("gpu-pool",)


def test_without_topology_key_nothing_changes() -> None:
    sim = sim_of(racks(4, 4), rack_policy(PolicyBudget(count=1), key=None))
    sim.run()
    assert [len(b) for b in sim.batches("gpu")] == [1] * 8
    assert sim.plans[0].domains == {}


# ----------------------------------------------------------------------------------------------------
# Properties


@st.composite
def topologies(draw: st.DrawFn) -> tuple[list[RolloutNode], DeploymentPolicy, set[str], int | None, bool]:
    """Racks with some nodes done, some still running older work (CARRYOVER, settling after the first
    plan) and some unavailable (NotReady or cordoned by someone else, back after a few plans)."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=6))
    nodes = racks(*sizes, unlabelled=draw(st.integers(0, 2)))
    names = [n.name for n in nodes]
    done = draw(st.sets(st.sampled_from(names), max_size=len(nodes) // 3))
    carry = draw(st.sets(st.sampled_from(names), max_size=3)) - done
    kinds: list[Unavailable] = [NOT_READY, CORDONED]
    down = draw(st.dictionaries(st.sampled_from(names), st.sampled_from(kinds), max_size=3))
    nodes = [
        replace(n, needs_work=False, status=Status.COMPLETE)
        if n.name in done
        else replace(n, status=Status.IN_PROGRESS)
        if n.name in carry
        else n
        for n in nodes
    ]
    nodes = [replace(n, unavailable=down.get(n.name)) for n in nodes]
    kind = draw(st.sampled_from(["fixed", "linear", "exponential", "none"]))
    initial = draw(st.integers(1, 4))
    strategy = {"fixed": fixed(initial), "linear": lin(initial), "exponential": exp(initial), "none": None}[
        kind
    ]
    budget = draw(
        st.builds(PolicyBudget, count=st.integers(1, 4))
        | st.builds(PolicyBudget, percent=st.integers(1, 100))
    )
    fails = draw(st.sets(st.sampled_from([n.name for n in nodes]), max_size=len(nodes) // 2))
    limit = draw(st.none() | st.integers(1, 6))
    return nodes, rack_policy(budget, strategy), fails, limit, draw(st.booleans())


def _disrupted_domains(plan: RolloutPlan, nodes: dict[str, RolloutNode], holding: set[str]) -> set[str]:
    busy = [nodes[n] for n in {*plan.active, *holding}] + [
        n for n in nodes.values() if n.unavailable is not None
    ]
    return topology.domains_of(RACK, busy)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topologies())
def test_topology_properties(
    scenario: tuple[list[RolloutNode], DeploymentPolicy, set[str], int | None, bool],
) -> None:
    nodes, pol, fails, limit, fast = scenario
    sim = sim_of(nodes, pol, fails=lambda name, _b: name in fails, admission_limit=limit)
    for step in range(600):
        if step == 1:  # older work settles: those nodes become candidates
            sim.nodes.update(
                {
                    k: replace(n, status=Status.WAITING)
                    for k, n in sim.nodes.items()
                    if n.status is Status.IN_PROGRESS and n.admission is None
                }
            )
        if step == 3:  # unavailable nodes come back
            sim.nodes.update({k: replace(n, unavailable=None) for k, n in sim.nodes.items()})
        holding = {
            n.name
            for n in sim.nodes.values()
            if phase_of(n, fingerprint=FP) in (Phase.ACTIVE, Phase.CARRYOVER)
        }
        result = sim.plan()
        ceiling = result.compartments["gpu"].status.ceiling
        admitted = [sim.nodes[a.node] for a in result.admissions if a.admission.compartment == "gpu"]
        # Never more domains disrupted than the budget when something starts (nodes going NotReady
        # on their own can push it above; then nothing starts).
        if admitted:
            assert len(_disrupted_domains(result, sim.nodes, holding)) <= ceiling
        new_domains = topology.domains_of(RACK, admitted)
        # Never an admission into a domain we still work in (a domain is never partly started).
        assert not new_domains & topology.domains_of(RACK, [sim.nodes[n] for n in holding])
        # A domain is admitted whole: every node of it that may start, in one plan and one batch.
        for domain in new_domains:
            startable = {
                n.name
                for n in sim.nodes.values()
                if topology.domain_of(RACK, n.name, n.labels) == domain
                and phase_of(n, fingerprint=FP) in (Phase.PENDING, Phase.RELEASED)
                and (n.unavailable is None or n.unavailable == CORDONED)
            }
            assert startable == {
                n.name for n in admitted if topology.domain_of(RACK, n.name, n.labels) == domain
            }
        assert len({a.admission.batch for a in result.admissions}) <= 1
        # Deterministic: the input order does not matter.
        shuffled = plan_rollout(
            sim.nw,
            policy=sim.pol,
            nodes=list(reversed(sim.nodes.values())),
            compartment_statuses=sim.statuses,
            fingerprint=FP,
            now=NOW,
            admission_limit=limit,
        )
        assert shuffled == result
        sim.apply(result)
        if step >= 3 and not result.admissions and not result.active:
            break
        if fast or result.deferred == 0:
            sim.finish(result)
    else:
        pytest.fail("rollout did not terminate")
    # Every node with work was admitted (no failureThreshold here, so nothing halts).
    assert all(
        n.admission is not None for n in sim.nodes.values() if n.needs_work or n.status is Status.ERRORING
    )


# ----------------------------------------------------------------------------------------------------
# What `plan` and `why` show


def test_plan_preview_shows_batches_in_domains() -> None:
    preview = preview_rollout(
        nodewright(deployment_policy="pol"),
        policy=rack_policy(PolicyBudget(count=1)),
        nodes=racks(2, 3),
        fingerprint=FP,
        now=NOW,
    )
    gpu = next(c for c in preview.compartments if c.name == "gpu")
    assert [b.domains for b in gpu.batches] == [("r0",), ("r1",)]
    assert gpu.budget == "count 1 of example.com/rack domains"
    assert gpu.batches_text == "1,1 domains (2,3 nodes)"
    table = render_table(preview)
    assert "1,1 domains (2,3 nodes)" in table
    doc = preview.to_json()
    gpu_doc = next(c for c in doc["compartments"] if c["name"] == "gpu")
    assert gpu_doc["topologyKey"] == RACK and gpu_doc["batches"][1]["domains"] == ["r1"]


def test_why_names_the_domain_and_its_nodes() -> None:
    def node(name: str, rack: str, i: int) -> dict[str, object]:
        return {
            "metadata": {
                "name": name,
                "resourceVersion": str(100 + i),
                "creationTimestamp": f"2026-01-01T00:00:{i:02d}Z",
                "labels": {**GPU, RACK: rack},
                "annotations": {},
            },
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }

    nodes = [node("a1", "r0", 1), node("a2", "r0", 2), node("b1", "r1", 3)]
    nw = {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": "nw", "uid": "uid-nw", "generation": 1},
        "spec": {
            "nodeSelectors": {"matchLabels": GPU},
            "packages": {"tool": {"version": "1.0.0", "image": "ghcr.io/example/tool"}},
            "deploymentPolicy": "pol",
        },
    }
    pol = rack_policy(PolicyBudget(count=1))
    st_ = ClusterState(
        nodes=nodes,
        nodewright_objects=[nw],
        nodewrights={"nw": NodeWright.model_validate(nw)},
        invalid={},
        policies={"pol": pol},
        policy_objects={"pol": pol.to_json_dict()},
        now=datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
    )
    analysis = explain.analyse(st_, "nw")
    admitted = explain.explain(analysis, "a1")
    assert admitted.domain == "r0"
    assert "topology domain r0: admitted, cordoned and drained as one with a2" in admitted.details
    waiting = explain.explain(analysis, "b1")
    assert waiting.to_json()["domain"] == "r1"
    assert "topology domain r1: admitted, cordoned and drained as one (its only node)" in waiting.details
