"""Health gates between batches (issue 34, item 2): the pure decision (`plan.gates.decide`), property
tested, and the rollout planner holding, opening and halting a compartment on the gates' results."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from nodewright.api import constants
from nodewright.api.admission import Admission
from nodewright.api.models import (
    CompartmentStatus,
    DeploymentPolicy,
    DeploymentPolicySpec,
    FixedStrategy,
    GateComparison,
    GateStatus,
    HealthGate,
    NodeConditionGate,
    NodeWright,
    NodeWrightSpec,
    ObjectMeta,
    PolicyBudget,
    PolicyDefault,
    PrometheusGate,
    SecretKeySelector,
    Status,
    Strategy,
)
from nodewright.api.reasons import GateHeld, GateOutcome, HaltReason, WaitReason
from nodewright.plan import gates
from nodewright.plan.gates import GateResult, GateSpec, Verdict, decide, render_query
from nodewright.plan.preview import preview_rollout, render_table, simulate_rollout
from nodewright.plan.rollout import RolloutNode, RolloutPlan, plan_rollout

DEFAULT = constants.DEFAULT_COMPARTMENT
FP = "fp-1"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
QUERY = 'sum(xid_errors{node=~"$NODES"})'


def prom_gate(name: str = "xid", timeout: str | None = "5m") -> HealthGate:
    return HealthGate(
        name=name,
        prometheus=PrometheusGate(
            url_secret_ref=SecretKeySelector(name="prom", key="url"),
            query=QUERY,
            comparison=GateComparison.LT,
            threshold="1",
        ),
        timeout=timeout,
    )


def condition_gate(name: str = "npd", timeout: str | None = None) -> HealthGate:
    return HealthGate(name=name, node_condition=NodeConditionGate(type="GpuXidError"), timeout=timeout)


# ----------------------------------------------------------------------------------------------------
# decide(): properties


def _result(gate: str, batch: int, outcome: GateOutcome, age: float, now: datetime) -> GateResult:
    return GateResult(gate, batch, outcome, "q", "1", "", now - timedelta(seconds=age))


gate_specs = st.lists(
    st.builds(
        lambda n, t: GateSpec.from_model(prom_gate(f"g{n}", f"{t}s")),
        st.integers(0, 5),
        st.integers(0, 900),
    ),
    min_size=1,
    max_size=4,
    unique_by=lambda g: g.name,
)


@settings(max_examples=300, deadline=None)
@given(
    specs=gate_specs,
    seen=st.lists(
        st.tuples(
            st.integers(0, 5),
            st.sampled_from(list(GateOutcome)),
            st.floats(0, 60, allow_nan=False),
            st.sampled_from([1, 2]),
        ),
        max_size=6,
    ),
    since_soak=st.floats(0, 1200, allow_nan=False),
)
def test_decide_opens_only_when_every_gate_passed_and_halts_only_after_a_timeout(
    specs: list[GateSpec], seen: list[tuple[int, GateOutcome, float, int]], since_soak: float
) -> None:
    now = T0 + timedelta(seconds=since_soak)
    results = {f"g{n}": _result(f"g{n}", batch, out, age, now) for n, out, age, batch in seen}
    decision = decide(DEFAULT, 2, specs, results, nodes=["a", "b"], soak_end=T0, now=now)
    current = {g.name: r for g in specs if (r := results.get(g.name)) is not None and r.batch == 2}
    passed = {n for n, r in current.items() if r.outcome is GateOutcome.PASSED}
    not_passing = [g for g in specs if g.name not in passed]
    timed_out = [
        g for g in not_passing if g.name in current and T0 + timedelta(seconds=g.timeout_seconds) <= now
    ]
    if not not_passing:
        assert decision.verdict is Verdict.OPEN
        return
    if timed_out:
        assert decision.verdict is Verdict.HALT
        assert decision.halt is not None and decision.halt.gate in {g.name for g in timed_out}
        return
    # Not every gate passed, none failed past its timeout: the next batch is held, never opened.
    assert decision.verdict is Verdict.HOLD
    assert isinstance(decision.held, GateHeld) and decision.held.gate == not_passing[0].name
    assert decision.wake_at is not None and decision.wake_at >= now
    stale = [
        g
        for g in not_passing
        if g.name not in current
        or current[g.name].evaluated_at + timedelta(seconds=gates.RECHECK_SECONDS) <= now
    ]
    assert decision.due == bool(stale)


def test_render_query_matches_exactly_the_batch_nodes() -> None:
    query = render_query('x{node=~"$NODES"}', ["gpu-1.rack-a", "gpu-0"])
    # Sorted, regex-escaped for RE2 and backslash-escaped for the PromQL string literal.
    assert query == 'x{node=~"gpu-0|gpu-1\\\\.rack-a"}'


def test_judge_samples_needs_a_sample_and_every_sample_passing() -> None:
    spec = GateSpec.from_model(prom_gate())
    assert gates.judge_samples(spec, 1, "q", [], at=T0).outcome is GateOutcome.UNKNOWN
    assert gates.judge_samples(spec, 1, "q", [("a", 0.0)], at=T0).outcome is GateOutcome.PASSED
    failed = gates.judge_samples(spec, 1, "q", [("{node=a}", 0.0), ("{node=b}", 3.0)], at=T0)
    assert failed.outcome is GateOutcome.FAILED and failed.value == "3" and "node=b" in failed.detail
    assert gates.judge_samples(spec, 1, "q", [("a", float("nan"))], at=T0).outcome is GateOutcome.FAILED


# ----------------------------------------------------------------------------------------------------
# The rollout planner with gates


def nodewright() -> NodeWright:
    return NodeWright(
        metadata=ObjectMeta(name="kernel", generation=1),
        spec=NodeWrightSpec.model_validate({"deploymentPolicy": "pol"}),
    )


def policy(*health: HealthGate, soak: str | None = None) -> DeploymentPolicy:
    return DeploymentPolicy(
        metadata=ObjectMeta(name="pol"),
        spec=DeploymentPolicySpec(
            default=PolicyDefault(
                budget=PolicyBudget(count=1),
                strategy=Strategy(fixed=FixedStrategy(initial_batch=1)),
                health_gates=list(health) or None,
                soak_time=soak,
            )
        ),
    )


def nodes(count: int = 3) -> list[RolloutNode]:
    return [
        RolloutNode(
            name=f"n{i}",
            labels={},
            creation_timestamp=f"2024-01-01T00:00:0{i}Z",
            status=Status.WAITING,
            needs_work=True,
        )
        for i in range(count)
    ]


def ts(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def plan(
    pol: DeploymentPolicy,
    fleet: list[RolloutNode],
    statuses: dict[str, CompartmentStatus],
    at: datetime,
    results: dict[str, dict[str, GateResult]] | None = None,
) -> RolloutPlan:
    return plan_rollout(
        nodewright(),
        policy=pol,
        nodes=fleet,
        compartment_statuses=statuses,
        fingerprint=FP,
        now=ts(at),
        gate_results=results,
    )


def first_batch_done(pol: DeploymentPolicy) -> tuple[list[RolloutNode], dict[str, CompartmentStatus]]:
    """Batch 1 (n0) admitted at T0 and succeeded: the fleet and statuses just before it settles."""
    fleet = nodes()
    first = plan(pol, fleet, {}, T0)
    assert [a.node for a in first.admissions] == ["n0"]
    done = RolloutNode(
        name="n0",
        labels={},
        creation_timestamp="2024-01-01T00:00:00Z",
        status=Status.COMPLETE,
        needs_work=False,
        admission=Admission(DEFAULT, 1, 0, FP, ts(T0), consumed=True),
    )
    return [done, *fleet[1:]], first.compartment_statuses


def test_a_due_gate_holds_the_next_batch_and_names_the_batch_nodes_to_evaluate() -> None:
    pol = policy(prom_gate())
    fleet, statuses = first_batch_done(pol)
    settled = plan(pol, fleet, statuses, T0 + timedelta(seconds=30))
    assert settled.admissions == ()
    (check,) = settled.gate_checks
    assert (check.compartment, check.batch, check.nodes) == (DEFAULT, 1, ("n0",))
    assert {w.reason for w in settled.waiting} == {WaitReason.HEALTH_GATE}


def test_a_passing_gate_opens_the_next_batch() -> None:
    pol = policy(prom_gate(), condition_gate())
    fleet, statuses = first_batch_done(pol)
    at = T0 + timedelta(seconds=30)
    settled = plan(pol, fleet, statuses, at)
    (check,) = settled.gate_checks
    passed = {g.name: GateResult(g.name, 1, GateOutcome.PASSED, "q", "0", "", at) for g in check.gates}
    opened = plan(pol, fleet, settled.compartment_statuses, at, {DEFAULT: passed})
    assert [a.node for a in opened.admissions] == ["n1"]
    assert opened.gate_checks == ()


def test_a_failing_gate_holds_then_halts_after_its_timeout_from_the_soak_end() -> None:
    pol = policy(prom_gate(timeout="5m"), soak="1m")
    fleet, statuses = first_batch_done(pol)
    settled = plan(pol, fleet, statuses, T0 + timedelta(seconds=10))  # batch 1 settles at T0+10s
    assert settled.gate_checks == ()  # soaking: gates are judged after the soak
    soak_end = T0 + timedelta(seconds=70)
    query = 'sum(xid_errors{node=~"n0"})'
    failing = {
        DEFAULT: {"xid": GateResult("xid", 1, GateOutcome.FAILED, query, "4", "4 is not < 1", soak_end)}
    }
    held = plan(pol, fleet, settled.compartment_statuses, soak_end + timedelta(seconds=5), failing)
    assert held.admissions == () and held.halts == ()
    assert held.compartments[DEFAULT].gate_check is None  # evaluated 5s ago: not due again yet
    detail = held.compartments[DEFAULT].health_gate
    assert detail is not None and detail.value == "4" and detail.halt_at == soak_end + timedelta(minutes=5)
    assert "health gate 'xid'" in held.compartments[DEFAULT].message  # the compartment's status message
    halted = plan(pol, fleet, held.compartment_statuses, soak_end + timedelta(minutes=5), failing)
    (halt,) = halted.halts
    assert halt.reason is HaltReason.HEALTH_GATE
    assert "'xid'" in halt.message and query in halt.message and "= 4" in halt.message
    assert halted.admissions == ()
    state = halted.compartment_statuses[DEFAULT].batch_state
    assert state is not None and state.should_stop and state.gate_halt is not None
    # The halt is persisted: a later passing result does not resume it (only a reset does).
    passing = {DEFAULT: {"xid": GateResult("xid", 1, GateOutcome.PASSED, query, "0", "", soak_end)}}
    later = plan(pol, fleet, halted.compartment_statuses, soak_end + timedelta(minutes=6), passing)
    assert later.admissions == () and [h.reason for h in later.halts] == [HaltReason.HEALTH_GATE]
    assert {w.reason for w in later.waiting} == {WaitReason.COMPARTMENT_HALTED}


def test_an_unknown_result_holds_like_a_failure() -> None:
    pol = policy(prom_gate())
    fleet, statuses = first_batch_done(pol)
    at = T0 + timedelta(seconds=30)
    settled = plan(pol, fleet, statuses, at)
    unknown = {DEFAULT: {"xid": GateResult("xid", 1, GateOutcome.UNKNOWN, "q", None, "no answer", at)}}
    held = plan(pol, fleet, settled.compartment_statuses, at, unknown)
    assert held.admissions == () and held.halts == ()
    assert "could not be evaluated (no answer)" in held.waiting[0].message


def test_the_preview_assumes_gates_pass() -> None:
    sim = simulate_rollout(
        nodewright(), policy=policy(prom_gate()), nodes=nodes(), fingerprint=FP, now=ts(T0)
    )
    assert all(not n.needs_work for n in sim.nodes)


def test_the_preview_says_per_gate_that_it_assumes_the_gate_passes_and_what_the_status_says() -> None:
    """`nodewright plan` cannot evaluate a gate ahead of time: it says so per gate, with the batches
    whose next one depends on it, and the last result the compartment status holds (a failing gate now
    is shown as such, not silently taken as passing)."""
    pol = policy(prom_gate(), condition_gate())
    fresh = preview_rollout(nodewright(), policy=pol, nodes=nodes(), fingerprint=FP, now=ts(T0))
    [compartment] = fresh.compartments
    assert [(g.gate, g.batches, g.last) for g in compartment.assumed_gates] == [
        ("xid", (1, 2), None),
        ("npd", (1, 2), None),
    ]
    assert compartment.assumed_gates[0].describe() == (
        "evaluated after the soak of batch 1 and 2; the preview assumes it passes"
    )
    table = render_table(fresh)
    assert "HEALTH GATE" in table and "xid" in table and "npd" in table
    doc = fresh.to_json()["compartments"][0]["assumedGates"]
    assert doc[0] == {"gate": "xid", "assumed": "Passed", "afterBatches": [1, 2]}

    # Batch 1 settled and the Prometheus gate fails now: the preview still assumes it will pass, and
    # shows what it saw.
    fleet, statuses = first_batch_done(pol)
    at = T0 + timedelta(seconds=30)
    settled = plan(pol, fleet, statuses, at)
    query = 'sum(xid_errors{node=~"n0"})'
    failing = {DEFAULT: {"xid": GateResult("xid", 1, GateOutcome.FAILED, query, "4", "4 is not < 1", at)}}
    held = plan(pol, fleet, settled.compartment_statuses, at, failing)
    later = preview_rollout(
        nodewright(),
        policy=pol,
        nodes=fleet,
        fingerprint=FP,
        now=ts(at),
        compartment_statuses=held.compartment_statuses,
    )
    xid = next(g for g in later.compartments[0].assumed_gates if g.gate == "xid")
    assert xid.batches[0] == 1 and xid.describe_last() == "Failed (4) after batch 1"
    assert "Failed (4) after batch 1" in render_table(later)
    assert later.to_json()["compartments"][0]["assumedGates"][0]["lastResult"]["outcome"] == "Failed"


def test_results_kept_in_the_status_are_read_back_so_why_sees_the_failing_value() -> None:
    pol = policy(prom_gate(timeout="1m"))
    fleet, statuses = first_batch_done(pol)
    at = T0 + timedelta(seconds=30)
    settled = plan(pol, fleet, statuses, at)
    query = 'sum(xid_errors{node=~"n0"})'
    failing = {DEFAULT: {"xid": GateResult("xid", 1, GateOutcome.FAILED, query, "4", "4 is not < 1", at)}}
    held = plan(pol, fleet, settled.compartment_statuses, at, failing)
    # What the next pass (or `kubectl nodewright why`) reads from the stored status: the same result.
    assert gates.from_statuses(held.compartment_statuses) == failing
    again = plan(pol, fleet, held.compartment_statuses, at, gates.from_statuses(held.compartment_statuses))
    assert [w.message for w in again.waiting] == [w.message for w in held.waiting]
    assert f"{query} = 4" in again.waiting[0].message
    # Once halted, the halted nodes' reason names the gate, the query and the value too.
    halted = plan(pol, fleet, again.compartment_statuses, at + timedelta(minutes=1), failing)
    assert {w.reason for w in halted.waiting} == {WaitReason.COMPARTMENT_HALTED}
    assert "health gate 'xid'" in halted.waiting[0].message and "= 4" in halted.waiting[0].message


def test_holding_names_every_gate_not_passing_while_the_compartment_is_held() -> None:
    at = ts(T0)

    def kept(gate: str, outcome: GateOutcome, batch: int = 1) -> GateStatus:
        return GateStatus(gate=gate, batch=batch, outcome=outcome, query="q", evaluated_at=at)

    results = [
        kept("xid", GateOutcome.FAILED),
        kept("npd", GateOutcome.PASSED),
        kept("nccl", GateOutcome.UNKNOWN),
    ]
    hold = GateHeld(DEFAULT, 1, "xid", "q", GateOutcome.FAILED, "4", "", T0)
    assert gates.holding(hold, results) == {"xid": True, "npd": False, "nccl": True}
    # Not held (the gates passed, or no batch settled yet): no gate holds; a gate not evaluated yet for
    # the held batch (its result is of an earlier one) holds.
    assert gates.holding(None, results) == {"xid": False, "npd": False, "nccl": False}
    first = GateHeld(DEFAULT, 2, "bw", "q", None, None, "", T0)
    assert gates.holding(first, [kept("npd", GateOutcome.PASSED)]) == {"npd": True, "bw": True}
