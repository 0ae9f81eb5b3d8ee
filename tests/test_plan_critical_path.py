"""Critical path first: the compartment with the most batches left is planned, and written, first.

`plan.batches.batches_left` projects a compartment's remaining batches; `plan.rollout.critical_path_order`
orders the compartments by it, and `plan_rollout` lists admissions in that order (docs/rollout.md).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodewright.api.models import (
    BatchState,
    DeploymentPolicy,
    DeploymentPolicySpec,
    ExponentialStrategy,
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
from nodewright.plan.batches import batches_left, next_batch_size
from nodewright.plan.policy import Compartments, NodeRef, StrategyKind, StrategyParams, resolve_compartments
from nodewright.plan.rollout import Phase, RolloutNode, critical_path_order, plan_rollout

NOW = "2025-01-01T00:00:00Z"


def _naive_batches(
    strategy: StrategyParams | None, state: BatchState, total: int, ceiling: int, left: int
) -> int:
    """One batch at a time, every batch a success with the whole ceiling free: the definition."""
    count = 0
    while left > 0:
        size = next_batch_size(strategy, state, total=total, remaining=left, ceiling=ceiling, free=ceiling)
        if size <= 0:
            return count
        left -= size
        count += 1
        state = state.model_copy(update={"last_batch_size": size, "last_batch_failed": False})
    return count


strategies = st.none() | st.builds(
    StrategyParams,
    kind=st.sampled_from(
        [StrategyKind.FIXED, StrategyKind.LINEAR, StrategyKind.EXPONENTIAL, StrategyKind.NONE]
    ),
    initial_batch=st.integers(1, 20),
    delta=st.integers(1, 5),
    growth_factor=st.integers(2, 4),
)
states = st.builds(BatchState, last_batch_size=st.integers(0, 30), last_batch_failed=st.booleans())


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategies, states, st.integers(0, 400), st.integers(0, 60), st.integers(0, 400))
def test_batches_left_is_the_batch_by_batch_count(
    strategy: StrategyParams | None, state: BatchState, total: int, ceiling: int, remaining: int
) -> None:
    remaining = min(remaining, total)
    expected = _naive_batches(strategy, state, total, ceiling, remaining)
    assert batches_left(strategy, state, total=total, ceiling=ceiling, remaining=remaining) == expected


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategies, states, st.integers(1, 60), st.integers(0, 300), st.integers(0, 300))
def test_more_nodes_left_never_means_fewer_batches(
    strategy: StrategyParams | None, state: BatchState, ceiling: int, a: int, b: int
) -> None:
    low, high = sorted((a, b))
    left = [batches_left(strategy, state, total=300, ceiling=ceiling, remaining=r) for r in (low, high)]
    assert left[0] <= left[1]
    assert (left[0] == 0) == (low == 0)


def _policy(compartments: list[PolicyCompartment]) -> DeploymentPolicy:
    return DeploymentPolicy(
        metadata=ObjectMeta(name="pol"),
        spec=DeploymentPolicySpec(
            default=PolicyDefault(budget=PolicyBudget(count=1), strategy=Strategy(linear=LinearStrategy())),
            compartments=compartments,
        ),
    )


def _compartment(name: str, strategy: Strategy, ceiling: int) -> PolicyCompartment:
    return PolicyCompartment(
        name=name,
        selector=LabelSelector(match_labels={"tier": name}),
        budget=PolicyBudget(count=ceiling),
        strategy=strategy,
    )


def _nodes(tiers: list[str]) -> list[RolloutNode]:
    return [
        RolloutNode(
            name=f"node-{i:03d}",
            labels={"tier": tier},
            creation_timestamp=f"2024-01-01T00:{i // 60:02d}:{i % 60:02d}Z",
            status=Status.WAITING,
            needs_work=True,
        )
        for i, tier in enumerate(tiers)
    ]


NW = NodeWright(
    metadata=ObjectMeta(name="kernel", generation=1),
    spec=NodeWrightSpec.model_validate({"deploymentPolicy": "pol"}),
)


def test_the_linear_compartment_is_served_before_the_exponential_one() -> None:
    """`a` (exponential from 8, 40 nodes: 3 batches) sorts first by name, but `b` (linear from 1, 40 nodes:
    8 batches) is the critical path: its admissions come first, and take the first order numbers."""
    pol = _policy(
        [
            _compartment(
                "a", Strategy(exponential=ExponentialStrategy(initial_batch=8, growth_factor=2)), 20
            ),
            _compartment("b", Strategy(linear=LinearStrategy(initial_batch=1, delta=1)), 20),
        ]
    )
    plan = plan_rollout(
        NW,
        policy=pol,
        nodes=_nodes(["a"] * 40 + ["b"] * 40),
        compartment_statuses={},
        fingerprint="fp",
        now=NOW,
        admission_limit=4,
    )
    assert [a.admission.compartment for a in plan.admissions] == ["b"] + ["a"] * 4
    assert [a.admission.order for a in plan.admissions] == [0, 1, 2, 3, 4]
    assert list(plan.compartments) == sorted(plan.compartments)  # the status keeps its name order


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(["a", "b", "c"]), max_size=40),
    st.lists(st.sampled_from(list(Phase)), min_size=40, max_size=40),
    st.integers(1, 3),
    st.integers(1, 3),
)
def test_plans_list_admissions_compartment_by_compartment_critical_path_first(
    tiers: list[str], phases: list[Phase], initial: int, ceiling: int
) -> None:
    pol = _policy(
        [
            _compartment("a", Strategy(exponential=ExponentialStrategy(initial_batch=initial)), ceiling + 1),
            _compartment("b", Strategy(linear=LinearStrategy(initial_batch=initial)), ceiling),
            _compartment("c", Strategy(exponential=ExponentialStrategy(initial_batch=1)), ceiling),
        ]
    )
    nodes = _nodes(tiers)
    resolved = resolve_compartments(NW, policy=pol, nodes=[NodeRef(n.name, n.labels) for n in nodes])
    assert isinstance(resolved, Compartments)
    order = critical_path_order(resolved, {n.name: p for n, p in zip(nodes, phases, strict=False)}, {})
    assert sorted(order) == sorted(resolved.specs)
    plan = plan_rollout(NW, policy=pol, nodes=nodes, compartment_statuses={}, fingerprint="fp", now=NOW)
    served = [a.admission.compartment for a in plan.admissions]
    # Contiguous per compartment, in critical-path order of a fresh rollout (every node pending).
    fresh = critical_path_order(resolved, dict.fromkeys((n.name for n in nodes), Phase.PENDING), {})
    firsts = list(dict.fromkeys(served))
    assert firsts == [c for c in fresh if c in firsts]
    assert served == sorted(served, key=firsts.index)
    assert [a.admission.order for a in plan.admissions] == list(range(len(served)))
