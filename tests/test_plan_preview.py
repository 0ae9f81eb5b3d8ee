"""Plan preview: prediction equals the planner's behaviour; JSON and table output; ideal makespan."""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from nodewright.api.models import (
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
from nodewright.plan.preview import (
    batch_sequences,
    ideal_makespan,
    preview_rollout,
    render_table,
    simulate_rollout,
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
    fleet[9] = replace(fleet[9], blocked_reason="ignore label")
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
    assert blockers["Blocked(ignore label)"].examples == ("n09",)
    table = render_table(preview)
    assert "__default__" in table and "1,2,4,2" in table and "Blocked(ignore label)" in table


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
