"""The node plan reports the stage transitions it decided (`plan.transitions`), as values: the node
controller turns them into metrics and spans without reading the state twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nodewright.api.nodestate import NodeState, PackageEntry, PackageStage, PackageState
from nodewright.plan.stages import PodOutcome, PodSummary, StageProgress
from nodewright.plan.transitions import Retried, StageEnded, stage_transitions

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(minutes=5)


def _entry(stage: PackageStage, state: PackageState, **kw: object) -> PackageEntry:
    return PackageEntry("tool", "1.0.0", stage, state, started="2026-01-01T00:00:00Z", attempts=1, **kw)  # type: ignore[arg-type]


def _pod(progress: tuple[StageProgress, ...]) -> PodSummary:
    return PodSummary(
        "p", "tool", "1.0.0", PackageStage.APPLY, 1, "h", T0, PodOutcome.SUCCEEDED, progress=progress
    )


def test_a_pod_that_ran_apply_and_config_ends_both_stages_timed_by_its_containers() -> None:
    old = NodeState(packages=(_entry(PackageStage.APPLY, PackageState.IN_PROGRESS),))
    new = NodeState(packages=(_entry(PackageStage.CONFIG, PackageState.COMPLETE),))
    t1, t2 = T0 + timedelta(seconds=30), T0 + timedelta(seconds=50)
    pod = _pod(
        (StageProgress(PackageStage.APPLY, True, T0, t1), StageProgress(PackageStage.CONFIG, True, t1, t2))
    )
    assert stage_transitions(old, new, [pod], now=NOW) == (
        StageEnded("tool", "1.0.0", "apply", T0, t1),
        StageEnded("tool", "1.0.0", "config", t1, t2),
    )


def test_a_failed_attempt_that_is_retried_says_so_and_carries_the_error() -> None:
    old = NodeState(packages=(_entry(PackageStage.APPLY, PackageState.IN_PROGRESS),))
    failed = _entry(
        PackageStage.APPLY, PackageState.IN_PROGRESS, retry_at="2026-01-01T00:06:00Z", error="boom"
    )
    moved = stage_transitions(old, NodeState(packages=(failed,)), [], now=NOW)
    assert moved == (Retried("tool", "1.0.0"), StageEnded("tool", "1.0.0", "apply", T0, NOW, "boom"))
    ended = moved[1]
    assert isinstance(ended, StageEnded) and ended.seconds == 300


def test_nothing_moved_nothing_reported() -> None:
    state = NodeState(packages=(_entry(PackageStage.APPLY, PackageState.IN_PROGRESS),))
    assert stage_transitions(state, state, [], now=NOW) == ()
