"""Batch-size formulas (reference §3.5) and batch evaluation (§3.6) with the halt rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nodewright.api.models import BatchState
from nodewright.plan.batches import (
    evaluate_batch,
    fresh_state,
    is_fresh,
    next_batch_size,
    progress_percent,
    strategy_batch_size,
)
from nodewright.plan.policy import StrategyKind, StrategyParams

EXP = StrategyParams(StrategyKind.EXPONENTIAL, initial_batch=4, growth_factor=2, safety_limit=50)
LIN = StrategyParams(StrategyKind.LINEAR, initial_batch=2, delta=3, safety_limit=50)
FIX = StrategyParams(StrategyKind.FIXED, initial_batch=3)


def st_(last: int, failed: bool = False, done: int = 0) -> BatchState:
    return BatchState(last_batch_size=last, last_batch_failed=failed, completed_nodes=done)


def test_first_batch_is_initial_and_none_is_ceiling() -> None:
    for strategy in (EXP, LIN, FIX):
        assert strategy_batch_size(strategy, BatchState(), total=40, ceiling=7) == strategy.initial_batch
    assert strategy_batch_size(None, st_(5), total=40, ceiling=7) == 7


def test_growth_after_success_and_cap_at_total() -> None:
    assert strategy_batch_size(EXP, st_(4), total=40, ceiling=40) == 8
    assert strategy_batch_size(EXP, st_(32), total=40, ceiling=40) == 40
    assert strategy_batch_size(LIN, st_(4), total=40, ceiling=40) == 7
    assert strategy_batch_size(FIX, st_(9, failed=True), total=40, ceiling=40) == 3


def test_shrink_only_below_safety_limit() -> None:
    assert strategy_batch_size(EXP, st_(8, True, done=10), total=40, ceiling=40) == 4  # 25% < 50
    assert strategy_batch_size(EXP, st_(8, True, done=20), total=40, ceiling=40) == 16  # 50% >= 50
    assert strategy_batch_size(LIN, st_(2, True), total=40, ceiling=40) == 1
    assert strategy_batch_size(EXP, st_(1, True), total=40, ceiling=40) == 1


def test_clamp_to_remaining_and_cap_by_free_slots() -> None:
    assert next_batch_size(EXP, st_(4), total=10, remaining=3, ceiling=10, free=10) == 3
    assert next_batch_size(EXP, st_(4), total=10, remaining=9, ceiling=5, free=2) == 2
    assert next_batch_size(EXP, st_(4), total=10, remaining=9, ceiling=5, free=0) == 0
    assert next_batch_size(EXP, st_(4), total=10, remaining=0, ceiling=5, free=5) == 0


def test_evaluation_success_failure_and_halt() -> None:
    strict = StrategyParams(
        StrategyKind.EXPONENTIAL, initial_batch=4, batch_threshold=75, failure_threshold=2, safety_limit=50
    )
    ok = evaluate_batch(
        strict,
        BatchState(),
        succeeded=3,
        failed=1,
        complete_in_compartment=3,
        erroring_in_compartment=1,
        total=40,
    )
    assert ok.evaluated and not ok.failed and not ok.halted_now
    assert ok.state.current_batch == 2 and ok.state.last_batch_size == 4
    bad = evaluate_batch(
        strict,
        ok.state,
        succeeded=5,
        failed=3,
        complete_in_compartment=8,
        erroring_in_compartment=4,
        total=40,
    )
    assert bad.failed and bad.state.consecutive_failures == 1 and not bad.state.should_stop
    stop = evaluate_batch(
        strict,
        bad.state,
        succeeded=2,
        failed=2,
        complete_in_compartment=10,
        erroring_in_compartment=6,
        total=40,
    )
    assert stop.halted_now and stop.state.should_stop and stop.state.consecutive_failures == 2
    assert progress_percent(stop.state, total=40) == 40


def test_no_halt_at_or_above_safety_limit_or_without_threshold() -> None:
    strict = StrategyParams(StrategyKind.FIXED, failure_threshold=1, safety_limit=50)
    late = evaluate_batch(
        strict,
        BatchState(),
        succeeded=0,
        failed=1,
        complete_in_compartment=5,
        erroring_in_compartment=1,
        total=10,
    )
    assert late.failed and not late.halted_now
    lax = StrategyParams(StrategyKind.FIXED)
    never = evaluate_batch(
        lax,
        BatchState(consecutive_failures=9),
        succeeded=0,
        failed=1,
        complete_in_compartment=0,
        erroring_in_compartment=1,
        total=10,
    )
    assert never.failed and not never.state.should_stop


def test_all_released_batch_only_advances_the_number() -> None:
    state = BatchState(current_batch=3, last_batch_size=2, consecutive_failures=1)
    out = evaluate_batch(
        FIX, state, succeeded=0, failed=0, complete_in_compartment=0, erroring_in_compartment=0, total=5
    )
    assert not out.evaluated
    assert out.state == state.model_copy(update={"current_batch": 4})


def test_fresh_state() -> None:
    assert is_fresh(fresh_state(current_batch=7))
    assert not is_fresh(BatchState(should_stop=True))


@given(
    st.sampled_from([StrategyKind.FIXED, StrategyKind.LINEAR, StrategyKind.EXPONENTIAL]),
    st.integers(1, 10),
    st.integers(0, 50),
    st.booleans(),
    st.integers(0, 60),
    st.integers(1, 60),
    st.integers(0, 60),
    st.integers(0, 60),
)
def test_next_size_bounds(
    kind: StrategyKind,
    initial: int,
    last: int,
    failed: bool,
    done: int,
    total: int,
    remaining: int,
    free: int,
) -> None:
    strategy = StrategyParams(kind, initial_batch=initial)
    size = next_batch_size(
        strategy, st_(last, failed, done), total=total, remaining=remaining, ceiling=free, free=free
    )
    if remaining == 0 or free <= 0:
        assert size == 0
    else:
        assert 1 <= size <= min(remaining, free)
