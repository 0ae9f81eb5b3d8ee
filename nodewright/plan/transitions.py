"""The stage transitions one node plan decided, as values: stage attempts that ended, failures retried.

`plan.node.plan_node` reports them (`NodePlan.transitions`) so that the node controller only turns them
into metrics and spans (`nodewright_stage_duration_seconds`, `nodewright_package_retries_total`, one span
per stage of the node's rollout trace) and never reads the state twice to find out what happened.

A stage attempt in flight before the plan (`in_progress` in the stored state) ended when the plan moved
its entry on (another stage, complete, removed) or failed it (`erroring`, or a retry scheduled: the
failure of this attempt). A pod that ran several stages (one pod per transition, and chained runs after
its own) reports each stage on its own, timed by its init containers as the kubelet reported them,
kept inside what the operator saw (a node's clock may be off); the stage it failed in carries the
error, and the runs chained after one that stopped did not start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from nodewright.api.nodestate import NodeState, PackageEntry, PackageState
from nodewright.api.timing import parse_ts_or_none
from nodewright.plan.stages import PodSummary, StageProgress


@dataclass(frozen=True, slots=True)
class StageEnded:
    """One stage attempt ended: done (`error` None) or failed."""

    package: str
    version: str
    stage: str
    started: datetime
    finished: datetime
    error: str | None = None

    @property
    def seconds(self) -> float:
        return max(0.0, (self.finished - self.started).total_seconds())


@dataclass(frozen=True, slots=True)
class Retried:
    """A failed attempt of the package is retried (a retry is scheduled)."""

    package: str
    version: str


Transition = StageEnded | Retried


def stage_transitions(
    old: NodeState, new: NodeState, pods: Sequence[PodSummary], *, now: datetime
) -> tuple[Transition, ...]:
    """What the plan that turned `old` into `new` did to the stage attempts in flight (module docstring)."""
    out: list[Transition] = []
    for entry in old.packages:
        if entry.state is PackageState.IN_PROGRESS:
            out.extend(_entry_transitions(entry, new.entry(entry.name, entry.version), new, pods, now))
    return tuple(out)


def _entry_transitions(
    entry: PackageEntry, after: PackageEntry | None, new: NodeState, pods: Sequence[PodSummary], now: datetime
) -> list[Transition]:
    started = parse_ts_or_none(entry.started) or now
    finished = after is None or after.stage != entry.stage or after.state is PackageState.COMPLETE
    failed = after is not None and (
        after.state is PackageState.ERRORING
        or (after.retry_at is not None and (entry.retry_at is None or after.stage != entry.stage))
    )
    out: list[Transition] = []
    if failed and after is not None and after.retry_at is not None:
        out.append(Retried(entry.name, entry.version))
    if not (finished or failed):
        return out
    error = (after.error or "failed") if failed and after is not None else None
    pod = _attempt_pod(pods, entry)
    if pod is None or not pod.progress:
        out.append(StageEnded(entry.name, entry.version, entry.stage.value, started, now, error))
        return out
    # One pod ran several stages: each gets its own transition, timed by its init containers; the stage
    # it failed in (if any) carries the error. Chained runs follow, as long as the runs before completed.
    stopped = _run_ended(out, entry, pod.progress, started, after, error, now)
    for run in pod.chain if not stopped else ():
        chained = new.entry(run.package, run.version)
        run_error = chained.error if chained is not None and chained.error else None
        as_entry = PackageEntry(run.package, run.version, run.stage, PackageState.IN_PROGRESS)
        if _run_ended(out, as_entry, run.progress, started, chained, run_error, now):
            break
    return out


def _run_ended(
    out: list[Transition],
    entry: PackageEntry,
    progress: Sequence[StageProgress],
    started: datetime,
    after: PackageEntry | None,
    error: str | None,
    now: datetime,
) -> bool:
    """Each stage of one run in a pod into `out`; True when the run stopped before its end."""
    for part in progress:
        end = min(part.finished or now, now)
        begin = min(part.started or started, end)
        if part.done:
            out.append(StageEnded(entry.name, entry.version, part.stage.value, begin, end))
            continue
        if error is not None and after is not None and after.stage is part.stage:
            out.append(StageEnded(entry.name, entry.version, part.stage.value, begin, end, error))
        return True
    return False


def _attempt_pod(pods: Sequence[PodSummary], entry: PackageEntry) -> PodSummary | None:
    """The pod of `entry`'s current attempt, if it was among the pods the plan read."""
    for pod in pods:
        if (
            pod.package == entry.name
            and pod.version == entry.version
            and pod.stage is entry.stage
            and pod.attempt == entry.attempts
        ):
            return pod
    return None
