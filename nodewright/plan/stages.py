"""The per-package stage machine on one node, and the failure/retry rules of one pod attempt.

Stages (anchor §2.2); the stages of one *transition* run in one pod, as sequential init containers
(each stage's work, then its check), up to the next interrupt:

    install:    [apply -> config] [-> interrupt -> [post-interrupt]]
    upgrade:    [upgrade -> config] [-> interrupt -> [post-interrupt]]   (spec version > installed)
    config:     [config] [-> interrupt -> [post-interrupt]]              (configMap changed)
    uninstall:  [uninstall] [-> uninstall-interrupt] -> entry removed   (uninstall.apply: true)

A bracket is one pod (`pod_stages`). The interrupt parts run when the run "has an interrupt" (anchor
§2.2): for a config run (the entry records the changed keys) only if a `configInterrupts` pattern
matches a changed/removed key; for an uninstall, when the package has an interrupt; otherwise when
`package.interrupt` is set. A package is complete only at its last stage, and the state machine never
skips a stage: a pod that ran several stages advances the entry through each of them in order, as its
init container statuses say (`completed_stages`), and a pod that failed in a later stage leaves the
earlier ones done: the retry starts at the stage that failed, never from the start of the pod.

A pod may also carry chained runs of other packages after its own (`ChainedRun`, `--chain-packages`):
each is read from its own containers, and its entry starts when the pod ends (docs/stages.md).

Entry states: `pending` (next stage known, pod not created yet), `in_progress` (pod created, or waiting
for its retry), `complete` (package done at this version), `erroring` (attempts exhausted), `skipped`
(interrupt merged into another package's interrupt pod, see interrupts.py). While a pod runs, the entry
stays at the pod's first stage: the node state is written when the pod finishes (or fails), not per
stage.

Failures (differences from the reference, anchor §2.14/§11.4): every attempt is a new pod
(`restartPolicy: Never`); a failed attempt is retried after `base * 2^(attempt-1)` seconds (capped) up to
`max_attempts` per stage, then the entry is `erroring` with the reason. A pod running longer than the
stage timeout times its stages is deleted and counts as a failed attempt of the stage it was in.
Image-pull errors count as a failed attempt once they have lasted `pull_error_grace` seconds (they are
often transient registry hiccups).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from nodewright.api.models import Interrupt, Package
from nodewright.api.nodestate import PackageEntry, PackageStage, PackageState, truncate_error
from nodewright.api.timing import parse_ts as parse_ts
from nodewright.api.timing import ts as ts
from nodewright.plan.configdiff import config_interrupt
from nodewright.plan.podspec import parse_duration_seconds, transition_stages

INTERRUPT_STAGES = frozenset({PackageStage.INTERRUPT, PackageStage.UNINSTALL_INTERRUPT})
UNINSTALL_STAGES = frozenset({PackageStage.UNINSTALL, PackageStage.UNINSTALL_INTERRUPT})
# Stages after which an interrupt may follow: the node must be cordoned and drained before their pod.
PRE_INTERRUPT_STAGES = frozenset(
    {PackageStage.APPLY, PackageStage.UPGRADE, PackageStage.CONFIG, PackageStage.UNINSTALL}
)
ACTIVE_STATES = frozenset({PackageState.PENDING, PackageState.IN_PROGRESS, PackageState.SKIPPED})


class PodOutcome(StrEnum):
    RUNNING = "running"  # created / init containers still running (includes Pending)
    SUCCEEDED = "succeeded"  # every init container exited 0
    FAILED = "failed"  # a container exited non-zero, or the pod failed
    PULL_ERROR = "pull_error"  # ErrImagePull, ImagePullBackOff, InvalidImageName, CreateContainerConfigError
    DEADLINE = "deadline"  # the kubelet killed it (activeDeadlineSeconds) or the controller saw it time out


@dataclass(frozen=True, slots=True)
class StageProgress:
    """One stage of a package pod, read from its init container statuses (`controller.pods`).

    `done`: the stage's work container and its check both exited 0. `started`/`finished`: the work
    container's start and the check's finish, when the kubelet reported them (for stage spans and
    durations; the planner decides from `done` only).
    """

    stage: PackageStage
    done: bool
    started: datetime | None = None
    finished: datetime | None = None


@dataclass(frozen=True, slots=True)
class ChainedRun:
    """A package run that follows the pod's own package in the same pod (`podspec.ChainLink`).

    `stage` is the run's first stage; `progress` what the pod's init containers say about each of the
    run's stages (empty: read as `pod_stages(stage)`, all done exactly when the pod succeeded).
    """

    package: str
    version: str
    stage: PackageStage
    progress: tuple[StageProgress, ...] = ()

    @property
    def stages(self) -> tuple[PackageStage, ...]:
        if self.progress:
            return tuple(p.stage for p in self.progress)
        return pod_stages(self.stage)


@dataclass(frozen=True, slots=True)
class PodSummary:
    """What the controller tells the planner about one package pod (from labels/annotations/status).

    `stage` is the pod's first stage (its `nodewright.io/stage` label); `progress` lists the stages the
    pod runs, in order, with what its init containers say about each. An empty `progress` (an interrupt
    pod, or a summary built without statuses) means the pod runs `pod_stages(stage)`, all done exactly
    when it succeeded.
    """

    name: str
    package: str
    version: str
    stage: PackageStage
    attempt: int
    spec_hash: str
    created: datetime
    outcome: PodOutcome
    message: str = ""  # reason + last log lines when known
    terminating: bool = False  # deletion requested (deletionTimestamp set), the pod is not gone yet
    bound: bool = True  # placed on its node; an unbound pod of ours has run nothing (controller.trust)
    progress: tuple[StageProgress, ...] = ()
    chain: tuple[ChainedRun, ...] = ()  # runs of other packages after this pod's own, in order
    finished: datetime | None = None  # when its last init container exited (the kubelet's clock)

    @property
    def stages(self) -> tuple[PackageStage, ...]:
        """The stages this pod runs for its own package, in order."""
        if self.progress:
            return tuple(p.stage for p in self.progress)
        return pod_stages(self.stage)

    @property
    def stage_count(self) -> int:
        """Every stage the pod runs, its chained runs' included (its time limit is per stage)."""
        return len(self.stages) + sum(len(run.stages) for run in self.chain)

    def packages(self) -> tuple[str, ...]:
        """The packages whose work this pod runs: its own, then the chained ones."""
        return (self.package, *(run.package for run in self.chain))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 3
    backoff_base: float = 10.0
    backoff_cap: float = 300.0
    stage_timeout: float = 1800.0
    pull_error_grace: float = 60.0

    @classmethod
    def for_package(cls, package: Package, defaults: RetryPolicy) -> RetryPolicy:
        # The Package model may carry maxAttempts / stageTimeout; older models do not.
        attempts = getattr(package, "max_attempts", None) or defaults.max_attempts
        timeout_text = getattr(package, "stage_timeout", None)
        timeout = parse_duration_seconds(timeout_text) if timeout_text else defaults.stage_timeout
        return replace(defaults, max_attempts=int(attempts), stage_timeout=timeout or defaults.stage_timeout)

    def backoff(self, attempt: int) -> float:
        return float(min(self.backoff_cap, self.backoff_base * 2 ** max(0, attempt - 1)))


# ----------------------------------------------------------------------------------------------------
# Time helpers: state timestamps are RFC3339 with second precision, UTC.


def ts_ceil(moment: datetime) -> str:
    """Round up to the next second so that a stored deadline is never earlier than computed."""
    whole = moment.replace(microsecond=0)
    return ts(whole if whole == moment else whole + timedelta(seconds=1))


def seconds_until(moment: datetime, now: datetime) -> float:
    return max(0.0, (moment - now).total_seconds())


# ----------------------------------------------------------------------------------------------------
# The machine


def run_interrupt(package: Package, entry: PackageEntry) -> Interrupt | None:
    """The interrupt the entry's current run ends with (anchor §2.2 "has interrupt")."""
    if entry.stage in UNINSTALL_STAGES:
        return package.interrupt
    if entry.changed:
        return config_interrupt(package, entry.changed)
    return package.interrupt


class Done(StrEnum):
    COMPLETE = "complete"  # the package is complete at this version
    REMOVE = "remove"  # uninstalled: the entry disappears (absent entry = not installed)


def pod_stages(stage: PackageStage) -> tuple[PackageStage, ...]:
    """The stages one package pod starting at `stage` runs: every stage up to the next interrupt.

    apply and upgrade are always followed by config (`next_stage`), so their pod runs config too; an
    interrupt needs its own pod (the node may reboot under it), and post-interrupt runs after it. The
    pod builder lays out its init containers from the same list (`podspec.transition_stages`).
    """
    return transition_stages(stage)


def completed_stages(pod: PodSummary) -> tuple[PackageStage, ...]:
    """The stages the pod finished successfully, in order: a prefix of `pod.stages`.

    Read from the init container statuses when the controller provided them; otherwise every stage of
    a succeeded pod and none of any other.
    """
    return run_completed_stages(pod.progress, pod.stages, succeeded=pod.outcome is PodOutcome.SUCCEEDED)


def run_completed_stages(
    progress: tuple[StageProgress, ...], stages: tuple[PackageStage, ...], *, succeeded: bool
) -> tuple[PackageStage, ...]:
    """The stages of one run in a pod (its own or a chained one) that finished, in order: a prefix."""
    if not progress:
        return stages if succeeded else ()
    done: list[PackageStage] = []
    for part in progress:
        if not part.done:
            break
        done.append(part.stage)
    return tuple(done)


def failed_stage(pod: PodSummary) -> PackageStage:
    """The stage a failed (or timed-out) pod was in: its first stage not completed."""
    done = completed_stages(pod)
    rest = [s for s in pod.stages if s not in done]
    return rest[0] if rest else pod.stages[-1]


def next_stage(stage: PackageStage, *, has_interrupt: bool) -> PackageStage | Done:
    if stage in (PackageStage.APPLY, PackageStage.UPGRADE):
        return PackageStage.CONFIG
    if stage == PackageStage.CONFIG:
        return PackageStage.INTERRUPT if has_interrupt else Done.COMPLETE
    if stage == PackageStage.INTERRUPT:
        return PackageStage.POST_INTERRUPT
    if stage == PackageStage.POST_INTERRUPT:
        return Done.COMPLETE
    if stage == PackageStage.UNINSTALL:
        return PackageStage.UNINSTALL_INTERRUPT if has_interrupt else Done.REMOVE
    return Done.REMOVE  # uninstall-interrupt


def advance(
    entry: PackageEntry,
    package: Package,
    *,
    now: datetime,
    applied_config: tuple[tuple[str, str], ...],
    run_attempts: int = 0,
) -> PackageEntry | None:
    """The entry after its current stage succeeded; None when the entry is to be removed.

    `applied_config` are the per-key hashes the succeeded pod mounted (recorded after `config`).
    `run_attempts` are the attempts of the stage the succeeded pod started at, when it went on into
    this one (an install pod runs apply and config): a complete entry keeps the larger count.
    """
    nxt = next_stage(entry.stage, has_interrupt=run_interrupt(package, entry) is not None)
    base = replace(
        entry,
        attempts=0,
        error="",
        retry_at=None,
        spec_hash="",
        pull_error_since=None,
        updated=ts(now),
    )
    if entry.stage == PackageStage.CONFIG:
        base = replace(base, config=applied_config)
    if nxt == Done.REMOVE:
        return None
    if nxt == Done.COMPLETE:
        # The attempts of the pod that completed the package stay on the complete entry: "complete
        # after 3 attempts" is worth seeing (node status, `kubectl nodewright node list`); the last
        # stage of an install pod is config, whose own count (1) would hide the apply retries before it.
        # The next run starts from 0 anyway.
        attempts = max(entry.attempts, run_attempts)
        return replace(base, state=PackageState.COMPLETE, changed=(), attempts=attempts)
    return replace(base, stage=nxt, state=PackageState.PENDING, started=None)


def start_attempt(
    entry: PackageEntry, *, attempt: int, spec_hash: str, image: str, now: datetime
) -> PackageEntry:
    return replace(
        entry,
        state=PackageState.IN_PROGRESS,
        attempts=attempt,
        spec_hash=spec_hash,
        image=image or entry.image,
        retry_at=None,
        pull_error_since=None,
        started=entry.started or ts(now),
        updated=ts(now),
    )


@dataclass(frozen=True, slots=True)
class Failure:
    entry: PackageEntry
    gave_up: bool


def fail_attempt(entry: PackageEntry, *, reason: str, now: datetime, policy: RetryPolicy) -> Failure:
    """Record a failed attempt: retry later, or give up (erroring) when attempts are exhausted."""
    attempts = max(entry.attempts, 1)
    if attempts >= policy.max_attempts:
        message = f"{entry.stage.value} failed {attempts} time(s), giving up: {reason}"
        return Failure(
            replace(
                entry,
                state=PackageState.ERRORING,
                error=truncate_error(message),
                retry_at=None,
                pull_error_since=None,
                updated=ts(now),
            ),
            gave_up=True,
        )
    retry = now + timedelta(seconds=policy.backoff(attempts))
    message = f"attempt {attempts}/{policy.max_attempts} of {entry.stage.value} failed: {reason}"
    return Failure(
        replace(
            entry,
            state=PackageState.IN_PROGRESS,
            error=truncate_error(message),
            retry_at=ts_ceil(retry),
            pull_error_since=None,
            updated=ts(now),
        ),
        gave_up=False,
    )


class Observation(StrEnum):
    WAIT = "wait"  # pod is running within its limits
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class FailureCause(StrEnum):
    """What failed an attempt: the pod itself, or the operator's limits on it."""

    POD_FAILED = "pod-failed"  # a container exited non-zero, or the pod failed: its status says why
    PULL_ERROR = "pull-error"  # its images could not be pulled for `pull_error_grace`: nothing ran
    TIMEOUT = "timeout"  # still running at the stage timeout: the operator deletes it
    NO_REBOOT = "no-reboot"  # a reboot interrupt's pod ended, but the node never went down


@dataclass(frozen=True, slots=True)
class AttemptView:
    observation: Observation
    reason: str = ""
    recheck_after: float | None = None  # seconds until a deadline/grace expires
    pull_error_since: str | None = None
    cause: FailureCause | None = None  # FAILED: what failed it


def observe_pod(pod: PodSummary, entry: PackageEntry, *, now: datetime, policy: RetryPolicy) -> AttemptView:
    """Classify the current attempt's pod: still waiting, succeeded, or failed (with the reason)."""
    if pod.outcome == PodOutcome.SUCCEEDED:
        return AttemptView(Observation.SUCCEEDED)
    if pod.outcome == PodOutcome.FAILED:
        return AttemptView(Observation.FAILED, pod.message or "pod failed", cause=FailureCause.POD_FAILED)
    if pod.outcome == PodOutcome.DEADLINE:
        return AttemptView(
            Observation.FAILED, pod.message or "pod exceeded its deadline", cause=FailureCause.POD_FAILED
        )
    # The stage timeout is per stage: a pod running apply and config gets twice as long (a chained pod,
    # the timeout of its own package for each stage of every run it carries).
    limit = policy.stage_timeout * pod.stage_count
    deadline = pod.created + timedelta(seconds=limit)
    if now >= deadline:
        what = "stage" if pod.stage_count == 1 else f"{pod.stage_count} stages"
        return AttemptView(
            Observation.FAILED,
            f"{what} did not finish within {_human(limit)}; pod deleted",
            cause=FailureCause.TIMEOUT,
        )
    recheck = seconds_until(deadline, now)
    if pod.outcome == PodOutcome.PULL_ERROR:
        since_text = entry.pull_error_since or ts(now)
        since = parse_ts(since_text)
        expires = since + timedelta(seconds=policy.pull_error_grace)
        if now >= expires:
            return AttemptView(
                Observation.FAILED,
                f"image pull failing for {_human(policy.pull_error_grace)}: {pod.message or 'pull error'}",
                cause=FailureCause.PULL_ERROR,
            )
        return AttemptView(
            Observation.WAIT,
            recheck_after=min(recheck, math.ceil(seconds_until(expires, now)) or 1.0),
            pull_error_since=since_text,
        )
    return AttemptView(Observation.WAIT, recheck_after=recheck)


def _human(seconds: float) -> str:
    s = int(seconds)
    if s % 3600 == 0 and s:
        return f"{s // 3600}h"
    if s % 60 == 0 and s:
        return f"{s // 60}m"
    return f"{s}s"


def human_duration(seconds: float) -> str:
    return _human(seconds)
