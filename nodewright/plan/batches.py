"""Batch strategies: how big the next batch is, and what a settled batch means for the rollout.

Formulas (reference §3.5). `progress%` is taken from the checkpoint written when the previous batch was
evaluated: `floor((completedNodes + failedNodes) * 100 / total)`, where `total` is the compartment's node
count and the two counters are the nodes complete / erroring at that moment.

| strategy    | first   | after a success      | failed, progress < safety | failed, progress >= safety |
|-------------|---------|----------------------|---------------------------|----------------------------|
| fixed       | initial | initial              | initial                   | initial                    |
| linear      | initial | last + delta         | max(1, last - delta)      | last + delta               |
| exponential | initial | min(last * g, total) | max(1, floor(last / g))   | min(last * g, total)       |
| none        | ceiling | ceiling              | ceiling                   | ceiling                    |

The result is clamped to the number of nodes that can be picked (`min(size, remaining)`, at least 1) and
then, by the rollout planner, to the free part of the compartment's ceiling — the ceiling is a hard cap
here, unlike the reference where a strategy may exceed it.

Evaluation (reference §3.6, with the erroring-node fix): a batch is evaluated once, when every node
admitted to it has *settled* (complete, erroring, or released because it became blocked before it was
disrupted). `successPct = floor(succeeded * 100 / (succeeded + failed))`; the batch failed when it is
below `batchThreshold`. A failure bumps `consecutiveFailures`; when `failureThreshold` is set, progress
is below `safetyLimit` and `consecutiveFailures >= failureThreshold`, the compartment halts
(`shouldStop`). A success clears `consecutiveFailures`. `currentBatch` always advances, so a batch
number is never reused within a rollout. A batch whose nodes were all released (none succeeded or
failed) advances `currentBatch` and leaves every other counter as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodewright.api.models import BatchState
from nodewright.plan.policy import StrategyKind, StrategyParams


def progress_percent(state: BatchState, *, total: int) -> int:
    """Progress recorded at the last evaluation, as the strategies see it (0 for an empty compartment)."""
    if total <= 0:
        return 0
    return min(100, (state.completed_nodes + state.failed_nodes) * 100 // total)


def strategy_batch_size(
    strategy: StrategyParams | None, state: BatchState, *, total: int, ceiling: int, cap: int | None = None
) -> int:
    """The raw size the strategy asks for next, before clamping (table in the module docstring).

    `cap` bounds exponential growth instead of `total` (a topology compartment counts batches in
    domains, progress in nodes)."""
    if strategy is None or strategy.kind is StrategyKind.NONE:
        return ceiling
    last = state.last_batch_size
    if last <= 0 or strategy.kind is StrategyKind.FIXED:
        return strategy.initial_batch
    shrink = state.last_batch_failed and progress_percent(state, total=total) < strategy.safety_limit
    if strategy.kind is StrategyKind.LINEAR:
        return max(1, last - strategy.delta) if shrink else last + strategy.delta
    if shrink:
        return max(1, last // strategy.growth_factor)
    return min(last * strategy.growth_factor, max(total if cap is None else cap, 1))


def next_batch_size(
    strategy: StrategyParams | None,
    state: BatchState,
    *,
    total: int,
    remaining: int,
    ceiling: int,
    free: int,
    cap: int | None = None,
) -> int:
    """Nodes to admit for the next batch: the strategy's size, clamped to what is left, capped by budget.

    `remaining` is the number of nodes that could be picked now, `free` the unused part of the ceiling.
    Returns 0 when nothing can start (nothing left, or no free slot).
    """
    if remaining <= 0 or free <= 0:
        return 0
    raw = strategy_batch_size(strategy, state, total=total, ceiling=ceiling, cap=cap)
    return min(max(1, min(raw, remaining)), free)


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """The result of evaluating a settled batch."""

    state: BatchState
    evaluated: bool
    failed: bool
    halted_now: bool


def evaluate_batch(
    strategy: StrategyParams | None,
    state: BatchState,
    *,
    succeeded: int,
    failed: int,
    complete_in_compartment: int,
    erroring_in_compartment: int,
    total: int,
) -> BatchOutcome:
    """Fold one settled batch into the checkpoint (rules in the module docstring)."""
    size = succeeded + failed
    if size == 0:
        return BatchOutcome(
            state=state.model_copy(update={"current_batch": state.current_batch + 1}),
            evaluated=False,
            failed=False,
            halted_now=False,
        )
    threshold = 100 if strategy is None else strategy.batch_threshold
    batch_failed = succeeded * 100 // size < threshold
    checkpoint = state.model_copy(
        update={"completed_nodes": complete_in_compartment, "failed_nodes": erroring_in_compartment}
    )
    consecutive = state.consecutive_failures + 1 if batch_failed else 0
    halt = (
        batch_failed
        and strategy is not None
        and strategy.failure_threshold is not None
        and progress_percent(checkpoint, total=total) < strategy.safety_limit
        and consecutive >= strategy.failure_threshold
    )
    new_state = checkpoint.model_copy(
        update={
            "current_batch": state.current_batch + 1,
            "consecutive_failures": consecutive,
            "should_stop": state.should_stop or halt,
            "last_batch_size": size,
            "last_batch_failed": batch_failed,
        }
    )
    return BatchOutcome(state=new_state, evaluated=True, failed=batch_failed, halted_now=halt)


def fresh_state(*, current_batch: int = 1) -> BatchState:
    """Counters cleared; `current_batch` is kept by resets within a rollout (see docs/rollout.md)."""
    return BatchState(current_batch=current_batch)


def is_fresh(state: BatchState) -> bool:
    """True when a reset would change nothing but the batch number."""
    return state == fresh_state(current_batch=state.current_batch)


def batches_left(
    strategy: StrategyParams | None, state: BatchState, *, total: int, ceiling: int, remaining: int
) -> int:
    """How many more batches `remaining` nodes take if every batch succeeds and each gets the whole
    ceiling: the compartment's length on the rollout's critical path (`plan.rollout`, "Critical path").

    Sizes follow the strategy table from `state`; once they stop changing (fixed, `none`, or growth
    capped by the ceiling) the rest is one division, so the projection costs at most a step per size
    change, never one per node."""
    count = 0
    previous = -1
    while remaining > 0:
        size = next_batch_size(
            strategy, state, total=total, remaining=remaining, ceiling=ceiling, free=ceiling
        )
        if size <= 0:
            return count  # no ceiling: nothing can ever start here
        if size == previous or size >= remaining:
            return count + -(-remaining // size)
        remaining -= size
        count += 1
        previous = size
        state = state.model_copy(update={"last_batch_size": size, "last_batch_failed": False})
    return count
