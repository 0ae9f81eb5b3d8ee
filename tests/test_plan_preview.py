"""Plan preview: prediction equals the planner's behaviour; JSON and table output; ideal makespan."""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from nodewright.api.admission import Admission
from nodewright.api.models import (
    BatchState,
    CompartmentStatus,
    DeploymentPolicy,
    DeploymentPolicySpec,
    ExponentialStrategy,
    LinearStrategy,
    NodeWright,
    NodeWrightSpec,
    ObjectMeta,
    PolicyBudget,
    PolicyDefault,
    Status,
    Strategy,
)
from nodewright.api.reasons import IGNORE_LABEL
from nodewright.plan.preview import (
    SnapshotCheck,
    batch_sequences,
    check_snapshot,
    ideal_makespan,
    preview_rollout,
    render_table,
    simulate_rollout,
    unwritten_admissions,
)
from nodewright.plan.rollout import RolloutNode

NOW = "2025-01-01T00:00:00Z"


def nw(**spec: object) -> NodeWright:
    return NodeWright(metadata=ObjectMeta(name="kernel"), spec=NodeWrightSpec.model_validate(spec))


def pol(strategy: Strategy, budget: PolicyBudget) -> DeploymentPolicy:
    return DeploymentPolicy(
        metadata=ObjectMeta(name="p"),
        spec=DeploymentPolicySpec(default=PolicyDefault(budget=budget, strategy=strategy)),
    )


def nodes(n: int) -> list[RolloutNode]:
    return [
        RolloutNode(f"n{i:02d}", {}, f"2024-01-01T00:00:{i:02d}Z", Status.WAITING, True) for i in range(n)
    ]


def test_preview_e1_and_outputs() -> None:
    exp = Strategy(exponential=ExponentialStrategy(initial_batch=1))
    fleet = nodes(10)
    fleet[9] = replace(fleet[9], blocked=IGNORE_LABEL)
    preview = preview_rollout(
        nw(deployment_policy="p"),
        policy=pol(exp, PolicyBudget(percent=100)),
        nodes=fleet,
        fingerprint="f",
        now=NOW,
    )
    [comp] = preview.compartments
    assert comp.sizes == (1, 2, 4, 2)
    assert comp.batches[0].nodes == ("n00",)
    data = preview.to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["compartments"][0]["batchSizes"] == [1, 2, 4, 2]
    blockers = {b.reason: b for b in preview.blockers}
    assert blockers[f"Blocked({IGNORE_LABEL.describe()})"].examples == ("n09",)
    table = render_table(preview)
    assert "__default__" in table and "1,2,4,2" in table and f"Blocked({IGNORE_LABEL.describe()})" in table


def test_preview_policy_not_found() -> None:
    preview = preview_rollout(
        nw(deployment_policy="gone"), policy=None, nodes=nodes(3), fingerprint="f", now=NOW
    )
    assert preview.policy_not_found and preview.compartments == ()
    assert "not found" in render_table(preview)


def test_ideal_makespan() -> None:
    seqs = {"a": [["x"], ["y", "z"]], "b": [["w"]]}
    durations: dict[str, float | list[float]] = {"x": 10.0, "y": 5.0, "z": [3.0, 4.0], "w": 12.0}
    assert ideal_makespan(seqs, durations) == 17.0
    assert ideal_makespan({}, {}) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 5), st.integers(1, 3), st.integers(1, 10))
def test_prediction_equals_stepwise_planner(count: int, initial: int, delta: int, budget: int) -> None:
    strategy = Strategy(linear=LinearStrategy(initial_batch=initial, delta=delta))
    policy = pol(strategy, PolicyBudget(count=budget))
    preview = preview_rollout(
        nw(deployment_policy="p"), policy=policy, nodes=nodes(count), fingerprint="f", now=NOW
    )
    sim = simulate_rollout(
        nw(deployment_policy="p"), policy=policy, nodes=nodes(count), fingerprint="f", now=NOW
    )
    observed = [[a.node for a in p.admissions] for p in sim.plans if p.admissions]
    assert batch_sequences(preview)["__default__"] == observed
    assert sum(len(b) for b in observed) == count
    assert all(len(b) <= budget for b in observed)
    assert all(n.status is Status.COMPLETE for n in sim.nodes)


# ----------------------------------------------------------------------------------------------------
# One moment of a rollout (issue 29 item 4)


def _open(batch: int, planned: int, admitted: int) -> dict[str, CompartmentStatus]:
    state = BatchState(current_batch=batch, planned_size=planned, admitted_size=admitted)
    return {"zone": CompartmentStatus(batch_state=state)}


def _adm(batch: int, order: int, fingerprint: str = "f") -> Admission:
    return Admission("zone", batch, order, fingerprint, NOW)


def test_a_status_that_changed_around_the_node_list_is_no_moment() -> None:
    assert check_snapshot(_open(1, 2, 2), _open(2, 3, 3), [], fingerprint="f") is SnapshotCheck.STATUS_MOVED
    # Counters the planner does not read (in progress, completed) may change: same moment for it.
    moved = {"zone": _open(1, 2, 2)["zone"].model_copy(update={"in_progress": 1})}
    both = [_adm(1, 0), _adm(1, 1)]
    assert check_snapshot(_open(1, 2, 2), moved, both, fingerprint="f") is SnapshotCheck.CONSISTENT


def test_admissions_the_batch_state_counts_must_be_on_the_nodes() -> None:
    one = [_adm(2, 5)]
    assert unwritten_admissions(_open(2, 3, 3), one, fingerprint="f") == {"zone": 2}
    assert check_snapshot(_open(2, 3, 3), _open(2, 3, 3), one, fingerprint="f") is (
        SnapshotCheck.ADMISSIONS_UNWRITTEN
    )
    # Only the open batch's admissions of this rollout count; consumed ones still do (settled members).
    others = [_adm(1, 0), _adm(2, 1, fingerprint="old"), replace(_adm(2, 6), consumed=True), _adm(2, 7)]
    assert unwritten_admissions(_open(2, 3, 3), [*one, *others], fingerprint="f") == {}
    # A batch that settled (plannedSize 0) or a status without a rollout fingerprint asks nothing.
    assert unwritten_admissions(_open(3, 0, 0), [], fingerprint="f") == {}
    assert check_snapshot(_open(2, 3, 3), _open(2, 3, 3), [], fingerprint=None) is SnapshotCheck.CONSISTENT
    assert check_snapshot(None, None, [], fingerprint=None) is SnapshotCheck.CONSISTENT
