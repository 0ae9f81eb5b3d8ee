"""A spec that comes back (`plan.rollout_epoch`): the way back gets batches of its own.

The regression (all three tests below fail on the code before): after v1 -> v2 -> v1 (an undo, or the
edit reverted by hand), the nodes' admissions of the first v1 rollout counted as the current rollout's.
The way back evaluated batches of that past rollout again and went on with its numbering (batch 1, the
canary, and a `pauseAfterBatch` gate on it, were skipped), a compartment could stay halted so the nodes
v2 had reached never went back, and an admission of the first rollout that had not yet started its node
started it outside any batch, past the ceiling (I1). Now admissions of an earlier rollout of the same
spec count as none, and every node returns through batches from batch 1, within the ceiling (the fleet
checks I1 and I2 after every write)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

from nodewright.api.admission import Admission
from nodewright.api.models import (
    DeploymentPolicy,
    DeploymentPolicySpec,
    FixedStrategy,
    NodeWright,
    NodeWrightSpec,
    NodeWrightStatus,
    ObjectMeta,
    Package,
    PolicyBudget,
    PolicyDefault,
    Status,
    Strategy,
)
from nodewright.api.nodestate import NodeState, PackageEntry, PackageStage, PackageState
from nodewright.plan.node import CreatePod, StateRuns, state_runs
from nodewright.plan.rollout import RolloutNode, status_for_spec
from nodewright.plan.rollout_epoch import (
    RolloutEpoch,
    current_nodes,
    dead_admissions,
    epoch_for,
    order_hint,
    usable,
)
from tests.fleetsim import Fleet

ROUNDS = 300


def spec(version: str) -> NodeWright:
    pkg = Package(version=version, image="ghcr.io/x/tune", max_attempts=1)
    return NodeWright(
        metadata=ObjectMeta(name="nw", uid="u", generation=1),
        spec=NodeWrightSpec(packages={"tune": pkg}, deployment_policy="pol"),
    )


def canary_policy(*, size: int = 2) -> DeploymentPolicy:
    strategy = Strategy(fixed=FixedStrategy(initial_batch=size, failure_threshold=1, safety_limit=100))
    default = PolicyDefault.model_validate(
        {"budget": PolicyBudget(count=size).to_json_dict(), "strategy": strategy.to_json_dict()}
    )
    return DeploymentPolicy(metadata=ObjectMeta(name="pol"), spec=DeploymentPolicySpec(default=default))


def settle(fleet: Fleet) -> None:
    for _ in range(ROUNDS):
        fleet.round()
        if fleet.settled():
            return
    raise AssertionError(f"fleet did not settle: {fleet.status_counts()}")


def entries(fleet: Fleet, node: str) -> tuple[PackageEntry, ...]:
    state = fleet.nodes[node].state
    return state.packages if state is not None else ()


def versions(fleet: Fleet, node: str) -> dict[str, str]:
    state = fleet.nodes[node].state
    return {e.version: e.state.value for e in state.entries_for("tune")} if state is not None else {}


def test_back_to_v1_after_a_halted_upgrade_every_node_returns_through_batches() -> None:
    names = [f"node-{i:02d}" for i in range(6)]
    fleet = Fleet(spec("1.0.0"), canary_policy(), names)
    settle(fleet)
    assert fleet.status_counts() == {"complete": 6}
    # Pick order is zone z0 (even nodes) first: batch 1 is node-00, node-02; batch 2 node-04, node-01.
    fleet.fate = lambda node, pod: "fail" if pod.version == "2.0.0" and node == "node-04" else "succeed"
    fleet.nodewright = spec("2.0.0")
    settle(fleet)
    assert fleet.rollout_plan().halts, "v2's second batch failed: the compartment halts"
    upgraded = sorted(n for n in names if versions(fleet, n).get("2.0.0") == "complete")
    assert upgraded == ["node-00", "node-01", "node-02"]

    fleet.nodewright = spec("1.0.0")
    created_before = {n: len(fleet.nodes[n].created) for n in names}
    plans_before = len(fleet.plans)
    settle(fleet)

    assert not fleet.rollout_plan().halts
    assert fleet.status_counts() == {"complete": 6}
    for node in names:
        assert versions(fleet, node).get("1.0.0") == "complete", node
    back: list[CreatePod] = [p for n in upgraded for p in fleet.nodes[n].created[created_before[n] :]]
    assert {(p.package, p.version, p.stage.value) for p in back} == {("tune", "1.0.0", "apply")}
    way_back = [
        (plan.admissions[0].admission.batch, sorted(a.node for a in plan.admissions))
        for plan in fleet.plans[plans_before:]
        if plan.admissions
    ]
    # Batches of its own, from batch 1 (a pauseAfterBatch gate or a canary size applies again); the
    # earlier v1 rollout's batches 1-3 are not evaluated again.
    assert way_back == [(1, ["node-00", "node-02"]), (2, ["node-01"])]


def test_a_spec_that_comes_back_numbers_its_admissions_above_the_earlier_rollout() -> None:
    names = [f"node-{i:02d}" for i in range(6)]
    fleet = Fleet(spec("1.0.0"), canary_policy(), names)
    settle(fleet)
    first = max(a.order for n in names if (a := fleet.admission(n)) is not None)
    fleet.fate = lambda node, pod: "fail" if pod.version == "2.0.0" and node == "node-04" else "succeed"
    fleet.nodewright = spec("2.0.0")
    settle(fleet)  # halted after batch 2: node-03 and node-05 keep their v1 admissions
    fleet.nodewright = spec("1.0.0")
    fleet.round()
    assert fleet.rollout_fingerprint == fleet.fingerprint and fleet.first_order == first + 1
    # The nodes that kept v1 all along are done: only those v2 reached are admitted again.
    admitted = [a for n in names if (a := fleet.admission(n)) is not None and a.order >= fleet.first_order]
    assert admitted and all(a.batch == 1 for a in admitted)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Found by this test: a node whose run of v1 was in flight when v2 came resumed it when v1 came back,
# without admission (it now waits for one: the run was suspended), labelled `waiting` (or `erroring`,
# for v2's run) by then; a node still labelled in progress for v2's run is busy although v1 has nothing
# for it and must hold a slot of the way back.
@example(first=3, second=3, failing=set())
@example(first=3, second=5, failing={"node-01"})
@example(first=4, second=3, failing=set())
@given(
    first=st.integers(min_value=0, max_value=12),
    second=st.integers(min_value=0, max_value=12),
    failing=st.sets(st.sampled_from([f"node-{i:02d}" for i in range(5)]), max_size=2),
)
def test_going_back_at_any_moment_keeps_the_ceiling_and_converges(
    first: int, second: int, failing: set[str]
) -> None:
    """v1 rolls out for `first` rounds, v2 for `second` (some of its nodes failing, so it may halt),
    then v1 comes back (an undo) at whatever moment that is -- batches of either in flight, or v2
    halted: the ceiling holds after every write, and every node ends at v1."""
    names = [f"node-{i:02d}" for i in range(5)]
    fleet = Fleet(spec("1.0.0"), canary_policy(), names)
    fleet.fate = lambda node, pod: "fail" if node in failing and pod.version == "2.0.0" else "succeed"
    for version, count in (("1.0.0", first), ("2.0.0", second)):
        fleet.nodewright = spec(version)
        for _ in range(count):
            fleet.round()
    fleet.fate = lambda _node, _pod: "succeed"
    fleet.nodewright = spec("1.0.0")
    settle(fleet)
    note(f"statuses {fleet.status_counts()}")
    assert fleet.status_counts() == {"complete": 5}
    assert all(versions(fleet, n).get("1.0.0") == "complete" for n in names)


def test_a_second_comeback_mid_flight_keeps_the_ceiling() -> None:
    """v1 -> v2 -> v1 -> v2 with runs in flight at each flip. The first comeback cut v2's runs short
    (their pods removed, the entries suspended); at the second, nodes still winding down v1's runs hold
    the ceiling. The suspended v2 runs resume only once the rollout admits their nodes again: before,
    they resumed without admission, one more than the ceiling (I1)."""
    names = [f"node-{i:02d}" for i in range(5)]
    fleet = Fleet(spec("1.0.0"), canary_policy(), names)
    for version, count in (("1.0.0", 3), ("2.0.0", 2), ("1.0.0", 1)):
        fleet.nodewright = spec(version)
        for _ in range(count):
            fleet.round()
    cut_short = [n for n in names if any(e.suspended and e.version == "2.0.0" for e in entries(fleet, n))]
    assert cut_short == ["node-00", "node-02"], "the first comeback cut their v2 runs short"
    fleet.nodewright = spec("2.0.0")
    settle(fleet)
    assert fleet.status_counts() == {"complete": 5}
    assert all(versions(fleet, n) == {"2.0.0": "complete"} for n in names)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(flips=[("1.0.0", 3), ("2.0.0", 2), ("1.0.0", 1)], last="2.0.0", failing=set())
@given(
    flips=st.lists(
        st.tuples(st.sampled_from(["1.0.0", "2.0.0", "3.0.0"]), st.integers(min_value=0, max_value=4)),
        min_size=1,
        max_size=6,
    ),
    last=st.sampled_from(["1.0.0", "2.0.0", "3.0.0"]),
    failing=st.sets(st.sampled_from([f"node-{i:02d}" for i in range(5)]), max_size=2),
)
def test_any_sequence_of_spec_flips_keeps_the_ceiling_and_converges(
    flips: list[tuple[str, int]], last: str, failing: set[str]
) -> None:
    """The spec flips between three versions at arbitrary moments (each held for a few rounds, runs
    of every version in flight or cut short, some nodes failing), then stays: the ceiling holds after
    every write (I1, I2, checked by the fleet) and every node ends at the last version."""
    names = [f"node-{i:02d}" for i in range(5)]
    fleet = Fleet(spec("1.0.0"), canary_policy(), names)
    fleet.fate = lambda node, pod: "fail" if node in failing and pod.version != last else "succeed"
    for version, count in flips:
        fleet.nodewright = spec(version)
        for _ in range(count):
            fleet.round()
    fleet.fate = lambda _node, _pod: "succeed"
    fleet.nodewright = spec(last)
    settle(fleet)
    note(f"statuses {fleet.status_counts()}")
    assert fleet.status_counts() == {"complete": 5}
    assert all(versions(fleet, n).get(last) == "complete" for n in names)


# ----------------------------------------------------------------------------------------------------
# The pure rules


def node(name: str, admission: Admission | None, *, status: Status = Status.COMPLETE) -> RolloutNode:
    return RolloutNode(
        name=name, labels={}, creation_timestamp=None, status=status, needs_work=False, admission=admission
    )


def adm(fingerprint: str, order: int, *, consumed: bool = False) -> Admission:
    return Admission("__default__", 1, order, fingerprint, "2025-01-01T00:00:00Z", consumed)


def status(**kw: Any) -> NodeWrightStatus:
    return NodeWrightStatus.model_validate(kw)


def test_epoch_for_keeps_the_persisted_epoch_and_starts_a_new_one_above_the_nodes() -> None:
    nodes = [node("a", adm("f1", 4, consumed=True)), node("b", adm("f1", 7, consumed=True)), node("c", None)]
    same = epoch_for("f1", status=status(rolloutFingerprint="f1", rolloutFirstOrder=3), nodes=nodes)
    assert same == RolloutEpoch("f1", 3)
    back = epoch_for("f1", status=status(rolloutFingerprint="f2", rolloutFirstOrder=9), nodes=nodes)
    assert back == RolloutEpoch("f1", 8)
    fresh = epoch_for("f3", status=status(rolloutFingerprint="f1"), nodes=nodes)
    assert fresh == RolloutEpoch("f3", 0)
    # No fingerprint persisted (a status from before, or lost): the admissions count as they are.
    assert epoch_for("f1", status=None, nodes=nodes) == RolloutEpoch("f1", 0)


def test_current_nodes_leave_out_admissions_of_an_earlier_rollout_only() -> None:
    epoch = RolloutEpoch("f1", 5)
    nodes = [node("old", adm("f1", 4)), node("new", adm("f1", 5)), node("other", adm("f2", 1))]
    out = {n.name: n.admission for n in current_nodes(nodes, epoch)}
    assert out == {"old": None, "new": adm("f1", 5), "other": adm("f2", 1)}
    assert epoch.key == "f1.5" and RolloutEpoch("f1").key == "f1"


def test_dead_admissions_are_unconsumed_ones_of_another_rollout_on_nodes_not_working() -> None:
    epoch = RolloutEpoch("f1", 5)
    nodes = [
        node("stale", adm("f1", 4)),
        node("other", adm("f2", 2), status=Status.WAITING),
        node("working", adm("f2", 3), status=Status.IN_PROGRESS),
        node("consumed", adm("f2", 1, consumed=True)),
        node("current", adm("f1", 6)),
        node("none", None),
    ]
    assert dead_admissions(nodes, epoch) == ("other", "stale")


def test_order_hint_and_usable() -> None:
    epoch = RolloutEpoch("f1", 8)
    assert order_hint(epoch, status(rolloutFingerprint="f2", nextOrder=30)) == 8
    assert order_hint(epoch, status(rolloutFingerprint="f1", nextOrder=12)) == 12
    persisted = status(rolloutFingerprint="f1", rolloutFirstOrder=8)
    assert usable(adm("f1", 8), fingerprint="f1", status=persisted)
    assert not usable(adm("f1", 7), fingerprint="f1", status=persisted)
    assert not usable(adm("f1", 9, consumed=True), fingerprint="f1", status=persisted)
    assert not usable(adm("f2", 9), fingerprint="f1", status=persisted)
    # Before the rollout controller recorded the epoch, the fingerprint decides (dead ones are removed).
    assert usable(adm("f1", 7), fingerprint="f1", status=status(rolloutFingerprint="f2"))


def entry(version: str, state: PackageState) -> PackageEntry:
    return PackageEntry(name="tune", version=version, stage=PackageStage.APPLY, state=state)


def test_state_runs_tell_runs_of_the_current_spec_from_inert_ones() -> None:
    nw = spec("1.0.0")
    assert state_runs(nw, None) == StateRuns()
    resumed = NodeState(
        packages=(entry("1.0.0", PackageState.IN_PROGRESS), entry("2.0.0", PackageState.ERRORING))
    )
    assert state_runs(nw, resumed) == StateRuns(current_in_flight=True)
    winding = NodeState(
        packages=(entry("1.0.0", PackageState.COMPLETE), entry("2.0.0", PackageState.IN_PROGRESS))
    )
    assert state_runs(nw, winding) == StateRuns(other_in_flight=True)
    failed = NodeState(packages=(entry("1.0.0", PackageState.ERRORING),))
    assert state_runs(nw, failed) == StateRuns(current_erroring=True)


def test_a_node_that_goes_on_with_a_run_counts_in_progress_whatever_its_label() -> None:
    resumes = StateRuns(current_in_flight=True)
    for label in (None, Status.WAITING, Status.COMPLETE, Status.ERRORING):
        assert status_for_spec(label, needs_work=True, runs=resumes) is Status.IN_PROGRESS, label
    # Its own run of this spec failed: erroring is what it is (the batch counts the failure).
    both = StateRuns(current_in_flight=True, current_erroring=True)
    assert status_for_spec(Status.ERRORING, needs_work=True, runs=both) is Status.ERRORING
    assert status_for_spec(Status.BLOCKED, needs_work=True, runs=resumes) is Status.BLOCKED
    # Still labelled in progress for another spec's run: busy until the node controller looked again.
    winding = StateRuns(other_in_flight=True)
    assert status_for_spec(Status.IN_PROGRESS, needs_work=False, runs=winding) is Status.IN_PROGRESS
    assert status_for_spec(Status.IN_PROGRESS, needs_work=False) is Status.COMPLETE
    assert status_for_spec(Status.COMPLETE, needs_work=False, runs=winding) is Status.COMPLETE
    assert status_for_spec(Status.WAITING, needs_work=True) is Status.WAITING
