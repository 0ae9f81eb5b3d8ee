"""Rollout planner: worked examples E1-E7 of the reference, the fixes, and Hypothesis properties.

The simulation used here applies each plan the way the controller does (write admissions, clear
releases, persist compartment statuses), then lets every active node finish complete or erroring per a
failure pattern, and plans again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nodewright.api import constants
from nodewright.api.admission import Admission
from nodewright.api.models import (
    Budget,
    CompartmentStatus,
    DeploymentPolicy,
    DeploymentPolicySpec,
    ExponentialStrategy,
    FixedStrategy,
    LabelSelector,
    LinearStrategy,
    NodeWright,
    NodeWrightSpec,
    ObjectMeta,
    PolicyBudget,
    PolicyDefault,
    Status,
    Strategy,
)
from nodewright.api.models import Compartment as PolicyCompartment
from nodewright.api.nodeobject import Taint
from nodewright.api.reasons import (
    CORDONED_BY_SOMEONE_ELSE,
    IGNORE_LABEL,
    NOT_READY,
    Predecessor,
    UntoleratedTaints,
    WaitReason,
)
from nodewright.plan.policy import Compartments, NodeRef, resolve_compartments
from nodewright.plan.rollout import (
    Phase,
    RolloutNode,
    RolloutPlan,
    phase_of,
    pick_key,
    plan_rollout,
    spec_fingerprint,
)

DEFAULT = constants.DEFAULT_COMPARTMENT
NOW = "2025-01-01T00:00:00Z"
FP = "fp-1"


def nodewright(**spec: object) -> NodeWright:
    return NodeWright(
        metadata=ObjectMeta(name="kernel", generation=3), spec=NodeWrightSpec.model_validate(spec)
    )


def policy(
    strategy: Strategy,
    budget: PolicyBudget,
    *,
    compartments: Sequence[PolicyCompartment] = (),
    reset: bool = True,
) -> DeploymentPolicy:
    return DeploymentPolicy(
        metadata=ObjectMeta(name="pol"),
        spec=DeploymentPolicySpec(
            default=PolicyDefault(budget=budget, strategy=strategy),
            compartments=list(compartments) or None,
            reset_batch_state_on_completion=reset,
        ),
    )


def fleet(count: int, *, labels: Callable[[int], dict[str, str]] | None = None) -> list[RolloutNode]:
    return [
        RolloutNode(
            name=f"node-{i:03d}",
            labels=labels(i) if labels else {},
            creation_timestamp=f"2024-01-01T00:{i // 60:02d}:{i % 60:02d}Z",
            status=Status.WAITING,
            needs_work=True,
        )
        for i in range(count)
    ]


def exp(initial: int = 1, growth: int = 2, **kw: int) -> Strategy:
    return Strategy(exponential=ExponentialStrategy(initial_batch=initial, growth_factor=growth, **kw))


def lin(initial: int = 1, delta: int = 1, **kw: int) -> Strategy:
    return Strategy(linear=LinearStrategy(initial_batch=initial, delta=delta, **kw))


def fixed(initial: int = 1, **kw: int) -> Strategy:
    return Strategy(fixed=FixedStrategy(initial_batch=initial, **kw))


@dataclass
class Sim:
    """A controller stand-in: applies plans, finishes active nodes, records every plan."""

    nw: NodeWright
    pol: DeploymentPolicy | None
    nodes: dict[str, RolloutNode]
    fails: Callable[[str, int], bool] = lambda _name, _batch: False
    statuses: dict[str, CompartmentStatus] = field(default_factory=dict)
    plans: list[RolloutPlan] = field(default_factory=list)
    fingerprint: str = FP
    reset: bool = False
    paused: bool = False
    admission_limit: int | None = None

    def plan(self) -> RolloutPlan:
        result = plan_rollout(
            self.nw,
            policy=self.pol,
            nodes=list(self.nodes.values()),
            compartment_statuses=self.statuses,
            fingerprint=self.fingerprint,
            now=NOW,
            reset_requested=self.reset,
            paused=self.paused,
            admission_limit=self.admission_limit,
        )
        self.plans.append(result)
        return result

    def apply(self, result: RolloutPlan) -> None:
        for name in result.releases:
            self.nodes[name] = replace(self.nodes[name], admission=None)
        for adm in result.admissions:
            self.nodes[adm.node] = replace(self.nodes[adm.node], admission=adm.admission)
        self.statuses = dict(result.compartment_statuses)

    def finish(self, result: RolloutPlan) -> None:
        """Every active node settles; like the node controller, it consumes its admission doing so."""
        for name in result.active:
            node = self.nodes[name]
            assert node.admission is not None
            used = replace(node.admission, consumed=True)
            if self.fails(name, node.admission.batch):
                self.nodes[name] = replace(node, status=Status.ERRORING, admission=used)
            else:
                self.nodes[name] = replace(node, status=Status.COMPLETE, needs_work=False, admission=used)

    def run(self, max_steps: int = 500) -> list[RolloutPlan]:
        for _ in range(max_steps):
            result = self.plan()
            self.apply(result)
            if not result.admissions and not result.active:
                return self.plans
            self.finish(result)
        raise AssertionError("rollout did not terminate")

    def batches(self, compartment: str = DEFAULT) -> list[list[str]]:
        out: list[list[str]] = []
        for p in self.plans:
            names = [a.node for a in p.admissions if a.admission.compartment == compartment]
            if names:
                out.append(names)
        return out

    def sizes(self, compartment: str = DEFAULT) -> list[int]:
        return [len(b) for b in self.batches(compartment)]


# ----------------------------------------------------------------------------------------------------
# Worked examples (reference §3.7)


def test_e1_exponential_all_succeed_and_reset_on_completion() -> None:
    sim = Sim(nodewright(deployment_policy="pol"), policy(exp(1), PolicyBudget(percent=100)), {})
    sim.nodes = {n.name: n for n in fleet(10)}
    sim.run()
    assert sim.sizes() == [1, 2, 4, 3]
    state = sim.statuses[DEFAULT].batch_state
    assert state is not None
    # Deliberate difference: counters are reset on completion, but the batch number is kept (5) so
    # that the batch numbers recorded on nodes stay unambiguous within this rollout.
    assert (state.current_batch, state.last_batch_size, state.completed_nodes) == (5, 0, 0)


def test_e1_without_reset_keeps_counters() -> None:
    sim = Sim(nodewright(deployment_policy="pol"), policy(exp(1), PolicyBudget(percent=100), reset=False), {})
    sim.nodes = {n.name: n for n in fleet(10)}
    sim.run()
    state = sim.statuses[DEFAULT].batch_state
    assert state is not None
    assert (state.current_batch, state.last_batch_size, state.completed_nodes) == (5, 3, 10)


def test_e2_linear_within_ceiling() -> None:
    sim = Sim(nodewright(deployment_policy="pol"), policy(lin(1, 1), PolicyBudget(count=4)), {})
    sim.nodes = {n.name: n for n in fleet(8)}
    sim.run()
    assert sim.sizes() == [1, 2, 3, 2]


def test_e3_fixed_and_legacy_count_are_identical() -> None:
    a = Sim(nodewright(deployment_policy="pol"), policy(fixed(3), PolicyBudget(count=3)), {})
    a.nodes = {n.name: n for n in fleet(10)}
    a.run()
    b = Sim(nodewright(interruption_budget=Budget(count=3)), None, {n.name: n for n in fleet(10)})
    b.run()
    assert a.sizes() == b.sizes() == [3, 3, 3, 1]
    assert a.batches() == b.batches()


def test_e4_legacy_percent_and_no_budget() -> None:
    a = Sim(nodewright(interruption_budget=Budget(percent=25)), None, {n.name: n for n in fleet(10)})
    a.run()
    assert a.sizes() == [2, 2, 2, 2, 2]
    b = Sim(nodewright(), None, {n.name: n for n in fleet(10)})
    b.run()
    assert b.sizes() == [10]


def test_e5_shrink_then_stop() -> None:
    # B1 (4 nodes): 1 fails -> 75% ok. B2 (8): 3 fail -> failed. B3 (floor(8/2)=4): 2 fail -> halt.
    failing = {"node-003", "node-009", "node-010", "node-011", "node-014", "node-015"}
    strategy = exp(4, 2, batch_threshold=75, failure_threshold=2, safety_limit=50)
    sim = Sim(
        nodewright(deployment_policy="pol"),
        policy(strategy, PolicyBudget(percent=100)),
        {n.name: n for n in fleet(40)},
        fails=lambda name, _b: name in failing,
    )
    sim.run()
    assert sim.sizes() == [4, 8, 4]
    final = sim.plans[-1]
    [halt] = final.halts
    assert halt.compartment == DEFAULT
    assert set(halt.failing_nodes) == failing
    state = sim.statuses[DEFAULT].batch_state
    assert state is not None and state.should_stop and state.consecutive_failures == 2
    # Progress at the halt: (10 complete + 6 erroring) / 40 = 40% < 50.
    assert (state.completed_nodes, state.failed_nodes) == (10, 6)
    untouched = [n for n in sim.nodes.values() if n.admission is None]
    assert len(untouched) == 40 - 16
    assert {w.reason for w in final.waiting} == {WaitReason.COMPARTMENT_HALTED}


def test_e5_erroring_node_does_not_stall_without_threshold() -> None:
    # The reference keeps an erroring node sticky; here it settles its batch and the rollout moves on.
    sim = Sim(
        nodewright(deployment_policy="pol"),
        policy(fixed(2), PolicyBudget(count=2)),
        {n.name: n for n in fleet(6)},
        fails=lambda name, _b: name == "node-000",
    )
    sim.run()
    assert sim.sizes() == [2, 2, 2]
    assert sim.nodes["node-000"].status is Status.ERRORING
    assert sum(n.status is Status.COMPLETE for n in sim.nodes.values()) == 5


def test_e6_ceiling_is_a_hard_cap() -> None:
    # Reference: 1, 2, 4, 8, 5 (ceiling ignored). Here every batch is capped at the ceiling of 2.
    sim = Sim(nodewright(deployment_policy="pol"), policy(exp(1), PolicyBudget(count=2)), {})
    sim.nodes = {n.name: n for n in fleet(20)}
    sim.run()
    assert sim.sizes() == [1] + [2] * 9 + [1]
    assert all(p.compartments[DEFAULT].status.in_progress <= 2 for p in sim.plans)


def test_e7_overlap_prefers_fixed_then_smaller_ceiling_then_name() -> None:
    def comp(name: str, labels: dict[str, str], strategy: Strategy, count: int) -> PolicyCompartment:
        return PolicyCompartment(
            name=name,
            selector=LabelSelector(match_labels=labels),
            budget=PolicyBudget(count=count),
            strategy=strategy,
        )

    nodes = fleet(1, labels=lambda _i: {"region": "us-west", "env": "production"})
    refs = [NodeRef(n.name, n.labels) for n in nodes]
    three = [
        comp("us-west", {"region": "us-west"}, exp(), 2),
        comp("production", {"env": "production"}, exp(), 2),
        comp("prod-us-west", {"region": "us-west", "env": "production"}, fixed(), 1),
    ]
    pol = policy(exp(), PolicyBudget(count=1), compartments=three)
    resolved = resolve_compartments(nodewright(deployment_policy="pol"), policy=pol, nodes=refs)
    assert isinstance(resolved, Compartments)
    assert resolved.assignment == {"node-000": "prod-us-west"}
    all_exp = [three[0], three[1], comp("prod-us-west", {"env": "production"}, exp(), 1)]
    pol2 = policy(exp(), PolicyBudget(count=1), compartments=all_exp)
    resolved2 = resolve_compartments(nodewright(deployment_policy="pol"), policy=pol2, nodes=refs)
    assert isinstance(resolved2, Compartments)
    assert resolved2.assignment == {"node-000": "prod-us-west"}
    same = [three[0], three[1]]
    pol3 = policy(exp(), PolicyBudget(count=1), compartments=same)
    resolved3 = resolve_compartments(nodewright(deployment_policy="pol"), policy=pol3, nodes=refs)
    assert isinstance(resolved3, Compartments)
    assert resolved3.assignment == {"node-000": "production"}


# ----------------------------------------------------------------------------------------------------
# Budget, unavailable nodes, version changes, order, pause, reset


def test_unavailable_nodes_count_against_the_ceiling() -> None:
    nodes = fleet(6)
    nodes[5] = replace(nodes[5], unavailable=NOT_READY)
    nodes[4] = replace(nodes[4], unavailable=CORDONED_BY_SOMEONE_ELSE, needs_work=False)
    sim = Sim(nodewright(deployment_policy="pol"), policy(fixed(3), PolicyBudget(count=3)), {})
    sim.nodes = {n.name: n for n in nodes}
    first = sim.plan()
    assert [a.node for a in first.admissions] == ["node-000"]
    comp = first.compartments[DEFAULT]
    assert comp.used_by_others == 2
    assert "2 of 3 slots used by nodes unavailable for other reasons" in comp.message
    reasons = {w.node: w.reason for w in first.waiting}
    assert reasons["node-005"] is WaitReason.NODE_UNAVAILABLE
    assert reasons["node-001"] is WaitReason.BUDGET_FULL
    assert reasons["node-002"] is WaitReason.BUDGET_FULL
    assert reasons["node-003"] is WaitReason.NOT_YET_IN_BATCH


def test_replanning_with_admissions_applied_is_idempotent() -> None:
    sim = Sim(nodewright(deployment_policy="pol"), policy(exp(2), PolicyBudget(count=5)), {})
    sim.nodes = {n.name: n for n in fleet(10)}
    first = sim.plan()
    sim.apply(first)
    again = sim.plan()
    assert again.admissions == ()
    assert again.compartment_statuses == first.compartment_statuses
    assert again.active == first.active
    assert sim.plan() == again


def test_version_change_needs_fresh_admission_and_in_flight_work_holds_slots() -> None:
    sim = Sim(nodewright(deployment_policy="pol"), policy(fixed(2), PolicyBudget(count=2)), {})
    sim.nodes = {n.name: n for n in fleet(4)}
    sim.run()
    assert all(n.status is Status.COMPLETE for n in sim.nodes.values())
    # New spec: every node needs work again; node-003 is still finishing work of the old spec.
    sim.nodes = {name: replace(n, needs_work=True, status=Status.WAITING) for name, n in sim.nodes.items()}
    sim.nodes["node-003"] = replace(sim.nodes["node-003"], status=Status.IN_PROGRESS)
    sim.fingerprint = "fp-2"
    result = sim.plan()
    assert phase_of(sim.nodes["node-003"], fingerprint="fp-2") is Phase.CARRYOVER
    assert [a.node for a in result.admissions] == ["node-000"]  # one slot left by the carry-over
    assert result.admissions[0].admission.batch == 1  # version change reset (flag on)
    assert result.admissions[0].admission.order == 0  # a new rollout numbers from 0


def test_order_numbers_are_unique_stable_and_continue_across_compartments() -> None:
    comps = [
        PolicyCompartment(
            name="a", selector=LabelSelector(match_labels={"tier": "a"}), budget=PolicyBudget(count=2)
        )
    ]
    pol = policy(fixed(1), PolicyBudget(count=1), compartments=comps)
    nodes = fleet(6, labels=lambda i: {"tier": "a" if i % 2 else "b"})
    sim = Sim(nodewright(deployment_policy="pol"), pol, {n.name: n for n in nodes})
    first = sim.plan()
    # Compartments in name order ("__default__" < "a"); the no-strategy compartment takes its ceiling.
    assert [(a.node, a.admission.order) for a in first.admissions] == [
        ("node-000", 0),
        ("node-001", 1),
        ("node-003", 2),
    ]
    sim.apply(first)
    sim.finish(first)
    sim.run()
    orders = [a.admission.order for p in sim.plans for a in p.admissions]
    assert sorted(orders) == list(range(6))


def test_pick_order_is_zone_then_creation_then_name() -> None:
    nodes = [
        RolloutNode("b", {"topology.kubernetes.io/zone": "z1"}, "2024-01-02T00:00:00Z", Status.WAITING, True),
        RolloutNode("a", {"topology.kubernetes.io/zone": "z1"}, "2024-01-02T00:00:00Z", Status.WAITING, True),
        RolloutNode("c", {"topology.kubernetes.io/zone": "z0"}, "2024-01-03T00:00:00Z", Status.WAITING, True),
        RolloutNode(
            "d", {"topology.kubernetes.io/zone": "z1"}, "2024-01-01T00:00:00+00:00", Status.WAITING, True
        ),
    ]
    assert [n.name for n in sorted(nodes, key=pick_key)] == ["c", "d", "a", "b"]


def test_paused_and_disabled_admit_nothing() -> None:
    sim = Sim(nodewright(), None, {n.name: n for n in fleet(3)}, paused=True)
    result = sim.plan()
    assert result.admissions == ()
    assert {w.reason for w in result.waiting} == {WaitReason.PAUSED}
    disabled = plan_rollout(
        nodewright(),
        policy=None,
        nodes=fleet(3),
        compartment_statuses={},
        fingerprint=FP,
        now=NOW,
        disabled=True,
    )
    assert disabled.admissions == ()
    assert {w.reason for w in disabled.waiting} == {WaitReason.DISABLED}


def test_policy_not_found_selects_nothing_and_keeps_batch_state() -> None:
    kept = {"gpu": CompartmentStatus(matched=3, ceiling=1)}
    result = plan_rollout(
        nodewright(deployment_policy="gone"),
        policy=None,
        nodes=fleet(3),
        compartment_statuses=kept,
        fingerprint=FP,
        now=NOW,
    )
    assert result.policy_not_found is not None
    assert result.admissions == ()
    assert result.compartment_statuses == kept
    assert {w.reason for w in result.waiting} == {WaitReason.POLICY_NOT_FOUND}


def test_blocked_and_priority_nodes_are_skipped_with_reasons() -> None:
    nodes = fleet(4)
    nodes[0] = replace(nodes[0], blocked=UntoleratedTaints((Taint("gpu", "NoSchedule", "bad"),)))
    nodes[1] = replace(nodes[1], waiting_for_priority="drivers")
    result = plan_rollout(
        nodewright(interruption_budget=Budget(count=1)),
        policy=None,
        nodes=nodes,
        compartment_statuses={},
        fingerprint=FP,
        now=NOW,
    )
    assert [a.node for a in result.admissions] == ["node-002"]
    by_node = {w.node: w for w in result.waiting}
    assert by_node["node-000"].reason is WaitReason.BLOCKED
    assert by_node["node-001"].reason is WaitReason.WAITING_FOR_PRIORITY
    assert by_node["node-001"].detail == Predecessor("drivers")


def test_admitted_node_that_becomes_blocked_is_released_and_settles_its_batch() -> None:
    sim = Sim(nodewright(deployment_policy="pol"), policy(fixed(2), PolicyBudget(count=2)), {})
    sim.nodes = {n.name: n for n in fleet(4)}
    first = sim.plan()
    sim.apply(first)
    sim.nodes["node-000"] = replace(sim.nodes["node-000"], status=Status.BLOCKED, blocked=IGNORE_LABEL)
    sim.nodes["node-001"] = replace(sim.nodes["node-001"], status=Status.COMPLETE, needs_work=False)
    second = sim.plan()
    assert second.releases == ("node-000",)
    assert [a.node for a in second.admissions] == ["node-002", "node-003"]
    state = second.compartments[DEFAULT].status.batch_state
    assert state is not None and state.last_batch_size == 1 and not state.last_batch_failed


def test_halt_needs_reset_and_reset_resumes() -> None:
    strategy = fixed(1, failure_threshold=1, batch_threshold=100, safety_limit=100)
    sim = Sim(
        nodewright(deployment_policy="pol"),
        policy(strategy, PolicyBudget(count=1)),
        {n.name: n for n in fleet(3)},
        fails=lambda name, _b: name == "node-000",
    )
    sim.run()
    assert sim.plans[-1].halts
    assert sim.sizes() == [1]
    sim.reset = True
    resumed = sim.plan()
    assert resumed.reset_applied and not resumed.halts
    assert [a.node for a in resumed.admissions] == ["node-001"]


def test_spec_fingerprint_tracks_packages_and_what_their_pods_run() -> None:
    a = nodewright(packages={"kmod": {"version": "1.0.0", "image": "img"}})
    b = nodewright(packages={"kmod": {"version": "1.0.1", "image": "img"}})
    c = nodewright(packages={"kmod": {"version": "1.0.0", "image": "img"}}, priority=5)
    tolerating = nodewright(
        packages={"kmod": {"version": "1.0.0", "image": "img"}},
        additional_tolerations=[{"key": "gpu", "operator": "Exists"}],
    )
    assert spec_fingerprint(a) != spec_fingerprint(b)
    assert spec_fingerprint(a) == spec_fingerprint(c)  # ordering between NodeWrights: no pod changes
    assert spec_fingerprint(a) != spec_fingerprint(tolerating)  # copied into every package pod


def test_old_admission_does_not_count_as_admitted() -> None:
    node = replace(fleet(1)[0], admission=Admission(DEFAULT, 1, 0, "old", NOW))
    assert phase_of(node, fingerprint="new") is Phase.PENDING
    assert phase_of(node, fingerprint="old") is Phase.ACTIVE


# ----------------------------------------------------------------------------------------------------
# Properties


def _oracle_size(kind: str, p: Mapping[str, int | None], state: object, total: int, ceiling: int) -> int:
    """Independent restatement of the §3.5 table (raw size, before clamping)."""
    last: int = state.last_batch_size  # type: ignore[attr-defined]
    failed: bool = state.last_batch_failed  # type: ignore[attr-defined]
    processed = state.completed_nodes + state.failed_nodes  # type: ignore[attr-defined]
    progress = min(100, processed * 100 // total) if total else 0
    initial = int(p["initial"] or 1)
    if kind == "none":
        return ceiling
    if last == 0 or kind == "fixed":
        return initial
    shrink = failed and progress < int(p["safety"] or 50)
    if kind == "linear":
        delta = int(p["step"] or 1)
        return max(1, last - delta) if shrink else last + delta
    growth = int(p["step"] or 2)
    return max(1, last // growth) if shrink else min(last * growth, total)


@st.composite
def scenarios(
    draw: st.DrawFn,
) -> tuple[NodeWright, DeploymentPolicy | None, list[RolloutNode], dict[str, object]]:
    count = draw(st.integers(0, 30))
    zones = draw(st.lists(st.sampled_from(["z0", "z1", "z2"]), min_size=count, max_size=count))
    tiers = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=count, max_size=count))
    nodes = fleet(count, labels=lambda i: {"topology.kubernetes.io/zone": zones[i], "tier": tiers[i]})
    done = draw(st.sets(st.integers(0, max(0, count - 1)), max_size=count // 3))
    nodes = [
        replace(n, needs_work=False, status=Status.COMPLETE) if i in done else n for i, n in enumerate(nodes)
    ]
    kind = draw(st.sampled_from(["fixed", "linear", "exponential", "none"]))
    params: dict[str, int | None] = {
        "initial": draw(st.integers(1, 6)),
        "step": draw(st.integers(1, 3)) if kind != "exponential" else draw(st.integers(2, 3)),
        "threshold": draw(st.integers(1, 100)),
        "failure": draw(st.none() | st.integers(1, 3)),
        "safety": draw(st.integers(1, 100)),
    }
    budget = draw(
        st.builds(PolicyBudget, count=st.integers(1, 8))
        | st.builds(PolicyBudget, percent=st.integers(1, 100))
    )
    fails = draw(st.sets(st.integers(0, max(0, count - 1)), max_size=count))
    legacy = draw(st.booleans()) and kind == "fixed"
    info: dict[str, object] = {"fails": {f"node-{i:03d}" for i in fails}}
    if legacy:
        legacy_budget = draw(
            st.builds(Budget, count=st.integers(0, 8)) | st.builds(Budget, percent=st.integers(0, 100))
        )
        if legacy_budget.count is not None:
            initial = max(1, min(count, max(1, legacy_budget.count)))
        else:
            initial = max(1, count * (legacy_budget.percent or 0) // 100)
        legacy_params = {"initial": initial, "step": 1, "failure": None, "threshold": 100, "safety": 50}
        info["rules"] = {DEFAULT: ("fixed", legacy_params)}
        return nodewright(interruption_budget=legacy_budget), None, nodes, info
    common = {
        "initial_batch": int(params["initial"] or 1),
        "batch_threshold": int(params["threshold"] or 100),
        "failure_threshold": params["failure"],
        "safety_limit": int(params["safety"] or 50),
    }
    step = int(params["step"] or 1)
    strategy: Strategy | None = None
    if kind == "fixed":
        strategy = Strategy(fixed=FixedStrategy.model_validate(common))
    elif kind == "linear":
        strategy = Strategy(linear=LinearStrategy.model_validate({**common, "delta": step}))
    elif kind == "exponential":
        strategy = Strategy(exponential=ExponentialStrategy.model_validate({**common, "growth_factor": step}))
    # One compartment per tier "a" with the drawn strategy (None = no strategy); the rest use a default
    # with the same strategy when it has one.
    comp = PolicyCompartment(
        name="tier-a", selector=LabelSelector(match_labels={"tier": "a"}), budget=budget, strategy=strategy
    )
    default_params = {**params, "failure": None, "threshold": 100, "safety": 50}
    pol = policy(strategy or fixed(int(params["initial"] or 1)), budget, compartments=[comp])
    info["rules"] = {
        "tier-a": (kind, params),
        DEFAULT: (kind, params) if strategy is not None else ("fixed", default_params),
    }
    return nodewright(deployment_policy="pol"), pol, nodes, info


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_planner_properties(
    scenario: tuple[NodeWright, DeploymentPolicy | None, list[RolloutNode], dict[str, object]],
) -> None:
    nw, pol, nodes, info = scenario
    fails: set[str] = info["fails"]  # type: ignore[assignment]
    rules: dict[str, tuple[str, dict[str, int | None]]] = info["rules"]  # type: ignore[assignment]
    sim = Sim(nw, pol, {n.name: n for n in nodes}, fails=lambda name, _b: name in fails)
    orders: dict[str, int] = {}
    consecutive: dict[str, int] = {}
    for _step in range(400):
        before = dict(sim.statuses)
        result = sim.plan()
        # Idempotence: applying the admissions and planning again admits nobody.
        sim.apply(result)
        again = plan_rollout(
            nw,
            policy=pol,
            nodes=list(sim.nodes.values()),
            compartment_statuses=sim.statuses,
            fingerprint=FP,
            now=NOW,
        )
        assert again.admissions == ()
        assert again.compartment_statuses == result.compartment_statuses
        for name, comp in result.compartments.items():
            status = comp.status
            # I1: nodes in progress never exceed the ceiling.
            assert status.in_progress <= status.ceiling, (name, status)
            admitted = [a for a in result.admissions if a.admission.compartment == name]
            state = status.batch_state
            assert state is not None
            kind, params = rules[name]
            if admitted:
                # Batch sizes follow the formulas, clamped to what is pickable, capped by the ceiling.
                pickable = len(admitted) + sum(w.compartment == name for w in result.waiting)
                free = status.ceiling - (status.in_progress - len(admitted))
                raw = _oracle_size(kind, params, state, status.matched, status.ceiling)
                assert len(admitted) == min(max(1, min(raw, pickable)), free)
                assert {a.admission.batch for a in admitted} == {state.current_batch}
            # Halts exactly when the thresholds say.
            evaluated = comp.batch_evaluated
            prev_state = before.get(name)
            if evaluated is not None and evaluated.evaluated:
                prev = consecutive.get(name, 0)
                consecutive[name] = prev + 1 if evaluated.failed else 0
                failure = params["failure"]
                progress = (state.completed_nodes + state.failed_nodes) * 100 // max(1, status.matched)
                expect_halt = (
                    evaluated.failed
                    and kind != "none"
                    and failure is not None
                    and progress < int(params["safety"] or 50)
                    and consecutive[name] >= failure
                )
                was_stopped = bool(
                    prev_state and prev_state.batch_state and prev_state.batch_state.should_stop
                )
                assert evaluated.halted_now == expect_halt
                if expect_halt:
                    event("compartment halted")
                if evaluated.failed:
                    event("batch failed")
                assert state.should_stop == (was_stopped or expect_halt) or _completed_reset(state)
            if state.should_stop:
                assert not admitted and comp.halt is not None
        for adm in result.admissions:
            assert adm.node not in orders
            orders[adm.node] = adm.admission.order
        for node in sim.nodes.values():
            if node.admission is not None:
                assert orders[node.name] == node.admission.order  # stable
        if not result.admissions and not result.active:
            break
        sim.finish(result)
    else:
        raise AssertionError("did not terminate")
    assert sorted(orders.values()) == list(range(len(orders)))
    halted = {h.compartment for h in sim.plans[-1].halts}
    resolved = resolve_compartments(nw, policy=pol, nodes=[NodeRef(n.name, n.labels) for n in nodes])
    assert isinstance(resolved, Compartments)
    for node in sim.nodes.values():
        compartment = resolved.assignment[node.name]
        ok = node.status in (Status.COMPLETE, Status.ERRORING)
        untouched = compartment in halted and node.admission is None and node.needs_work
        assert ok or untouched, node


def _completed_reset(state: object) -> bool:
    return not state.should_stop and state.last_batch_size == 0  # type: ignore[attr-defined]


def test_preview_predicts_the_controller_sequence() -> None:
    from nodewright.plan.preview import batch_sequences, preview_rollout

    pol = policy(exp(1, 3), PolicyBudget(count=5))
    nodes = fleet(23, labels=lambda i: {"topology.kubernetes.io/zone": f"z{i % 3}"})
    sim = Sim(nodewright(deployment_policy="pol"), pol, {n.name: n for n in nodes})
    sim.run()
    predicted = preview_rollout(
        nodewright(deployment_policy="pol"), policy=pol, nodes=nodes, fingerprint=FP, now=NOW
    )
    assert batch_sequences(predicted)[DEFAULT] == sim.batches()
    assert sim.sizes() == [1, 3, 5, 5, 5, 4]


# ----------------------------------------------------------------------------------------------------
# Bounded plans (admission_limit): a batch is admitted over several plans and ends as it would in one.


def _membership(plans: Sequence[RolloutPlan]) -> dict[tuple[str, int], set[str]]:
    out: dict[tuple[str, int], set[str]] = {}
    for p in plans:
        for a in p.admissions:
            out.setdefault((a.admission.compartment, a.admission.batch), set()).add(a.node)
    return out


def _run_bounded(sim: Sim, *, fast: bool) -> None:
    """Plan, write, and let the active nodes finish: after every plan (`fast`: pods quicker than a pass)
    or only once no admission is deferred (pods slower than the passes that fill their batch)."""
    limit = sim.admission_limit
    assert limit is not None
    for _ in range(3000):
        result = sim.plan()
        sim.apply(result)
        for name, comp in result.compartments.items():
            assert comp.status.in_progress <= comp.status.ceiling, (name, comp.status)
            assert sum(a.admission.compartment == name for a in result.admissions) <= limit
        if not result.admissions and not result.active:
            return
        if fast or result.deferred == 0:
            sim.finish(result)
    raise AssertionError("rollout did not terminate")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(1, 4), st.booleans())
def test_bounded_plans_build_the_same_batches(
    scenario: tuple[NodeWright, DeploymentPolicy | None, list[RolloutNode], dict[str, object]],
    limit: int,
    fast: bool,
) -> None:
    nw, pol, nodes, info = scenario
    fails: set[str] = info["fails"]  # type: ignore[assignment]
    whole = Sim(nw, pol, {n.name: n for n in nodes}, fails=lambda name, _b: name in fails)
    whole.run(max_steps=1000)
    bounded = Sim(
        nw, pol, {n.name: n for n in nodes}, fails=lambda name, _b: name in fails, admission_limit=limit
    )
    _run_bounded(bounded, fast=fast)
    if any(len(members) > limit for members in _membership(whole.plans).values()):
        event("a batch was admitted over several plans")
    assert _membership(bounded.plans) == _membership(whole.plans)
    assert bounded.statuses == whole.statuses
    assert {n.name: n.status for n in bounded.nodes.values()} == {
        n.name: n.status for n in whole.nodes.values()
    }


def test_bounded_plan_defers_the_rest_of_the_batch_and_says_so() -> None:
    sim = Sim(
        nodewright(deployment_policy="pol"), policy(fixed(5), PolicyBudget(count=5)), {}, admission_limit=2
    )
    sim.nodes = {n.name: n for n in fleet(8)}
    first = sim.plan()
    sim.apply(first)
    assert [a.node for a in first.admissions] == ["node-000", "node-001"]
    assert first.deferred == 3 and first.compartments[DEFAULT].opened
    deferred = [w for w in first.waiting if w.node in {"node-002", "node-003", "node-004"}]
    assert {w.reason for w in deferred} == {WaitReason.NOT_YET_IN_BATCH}
    assert all("taken into batch 1" in w.message for w in deferred)
    state = sim.statuses[DEFAULT].batch_state
    assert state is not None and (state.planned_size, state.admitted_size) == (5, 2)
    # The admitted nodes finish before the rest is admitted: the batch is filled, not evaluated.
    sim.finish(first)
    second = sim.plan()
    sim.apply(second)
    assert [a.node for a in second.admissions] == ["node-002", "node-003"]
    assert {a.admission.batch for a in second.admissions} == {1}
    assert second.compartments[DEFAULT].batch_evaluated is None and not second.compartments[DEFAULT].opened
    third = sim.plan()
    sim.apply(third)
    assert [a.node for a in third.admissions] == ["node-004"] and third.deferred == 0
    assert sim.plan().admissions == ()  # the batch is whole: nothing more until it settles


def test_pause_stops_filling_and_the_short_batch_settles() -> None:
    sim = Sim(
        nodewright(deployment_policy="pol"), policy(fixed(4), PolicyBudget(count=4)), {}, admission_limit=1
    )
    sim.nodes = {n.name: n for n in fleet(6)}
    first = sim.plan()
    sim.apply(first)
    sim.finish(first)
    sim.paused = True
    paused = sim.plan()
    sim.apply(paused)
    assert paused.admissions == ()
    outcome = paused.compartments[DEFAULT].batch_evaluated
    assert outcome is not None and outcome.evaluated and outcome.state.last_batch_size == 1
    state = sim.statuses[DEFAULT].batch_state
    assert state is not None and (state.current_batch, state.planned_size, state.admitted_size) == (2, 0, 0)
    sim.paused = False
    resumed = sim.plan()
    assert [a.admission.batch for a in resumed.admissions] == [2] and resumed.deferred == 3


def test_admission_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="admission_limit"):
        plan_rollout(
            nodewright(),
            policy=None,
            nodes=fleet(1),
            compartment_statuses={},
            fingerprint=FP,
            now=NOW,
            admission_limit=0,
        )
