"""The node plan: what one NodeWright should do next on one node. Pure; the controller actuates it.

The controller calls `plan_node` from its reconcile of a (NodeWright, node) key with a snapshot of
everything relevant (the NodeWright, trimmed node facts, the decoded state annotation, this
NodeWright's package pods on the node, optionally the workload pods' drain selection, `now`) and gets
back a `NodePlan`:

- `state`: the new `nodewright.io/state.<nw>` content. The controller writes it (together with the
  status label) in ONE patch, only if it changed, and BEFORE executing the actions: every action is
  then safe to repeat after a crash (pod names are deterministic, so a repeated CreatePod meets
  AlreadyExists; Cordon/Uncordon/Drain are idempotent).
- `status`, `condition`: the node's status for this NodeWright and its node condition.
- `actions`: ordered, typed decisions (Cordon, Uncordon, WaitForProtectedPods, Drain, DeletePod,
  CreatePod, Event, RequeueAfter).
- `failed`: the attempts it recorded as failed, from their pods (`AttemptFailed`: which pod, stage and
  attempt, why, and the error written): the controller keeps the ones no container's exit explains
  (image pull errors, stage timeouts) as the stage's kept log.
- `needs_drain_facts`: the plan wants to start interrupt-bearing work but was given no drain facts; the
  controller lists the node's pods (field selector spec.nodeName), runs `drain.select`, and plans again.
  Pod listings are thus only made for nodes about to be interrupted.

Safety rules (anchor §2.9 plus our fixes, §11.3):
- Packages whose run has no interrupt never cordon or drain.
- Before any pre-interrupt stage pod (apply/upgrade/config/uninstall) of a run with an interrupt, the
  node is cordoned (recorded in `state.cordoned` only when WE made it unschedulable), protected pods
  (podNonInterruptLabels) are waited for, and the node is drained: evicted pods must be gone.
- A node already unschedulable when the cordon is due (an admin cordoned it) is worked on without
  taking ownership: `state.cordoned` stays false and it is never uncordoned by us.
- `drain.timeout` expired: `wait` keeps evicting and says so; `force` deletes the remaining pods;
  `skip` releases the node while its interrupt-bearing runs have not executed anything (runs undone,
  uncordoned if ours, status `blocked`/`DrainTimeout`, memory in `DrainSkip` until a newer admission).
- Right before the interrupt pod, protected pods and drain are checked again.
- The interrupt pod never runs alongside other stage pods of this NodeWright on the node, and no
  stage pod starts while an interrupt is in progress.
- The node is uncordoned only when it completed the whole NodeWright, and only if we cordoned it
  (exception: the rollout withdrew its admission and nothing is in flight or erroring: it waits in
  service instead of cordoned).
- Admission by the rollout planner (`state.admission`) is required to START new work; work already
  started (a run with a pending/in-progress stage) continues without it, so a node never stays
  half-done. Admission is cleared when the node completes, ending its part in the rollout.
- Paused: nothing new is created (running pods are still observed and recorded). Disabled: the node is
  left completely alone. Ignored or not tolerated: nothing is created, status `blocked`.

Chained runs (`PlanOptions.chain_packages`, `--chain-packages`): a pod may carry, after its own
package's stages, the new installs/upgrades without interrupt of packages that depend only on what runs
in that pod (`chain_for`); when it ends, each chained run gets its entry and advances as its containers
say (`finish_chain`). docs/stages.md, "Chained runs".

How it is built. `plan_node` is the one entry: the read-only input (`_Ctx`) and the plan under
construction (`_Draft`: the node's state, the actions, and what holds the node up) go through the phases
of `_PHASES` in order -- reboot re-apply, observe the stage pods, read drift checks, stamp failures,
retry erroring packages under a fresh admission, cancel uninstalls, start (node gate: cordon, protected
pods, drain; then pods) -- and `_finish` turns the draft into the `NodePlan` (completion, drift checks,
the status from the draft's typed holds, the actions in execution order). The plan also reports the
stage transitions it decided (`plan.transitions`): the node controller turns those into metrics and
spans without reading the state twice.

Reboot interrupts complete when the node's bootID differs from the one recorded at interrupt start and
the node is Ready, independently of the interrupt pod (the reboot kills it); a node that does not come
back within `reboot_timeout` makes the entry `erroring`. Every interrupt attempt has its own identity on
the host (`interrupt_run`: the agent's flags are keyed by it), and a reboot pod that ended while the node
stays Ready with its old bootID for `reboot_grace` did not reboot it: a failed attempt (`await_reboot`).

Drift-check pods (`DriftInput`) are read and removed as soon as they end, whatever the node's state,
and their result counts only on the basis they were made against (`_observe_checks`); no stage pod
starts while one exists on the node (`drift_check_running`), so one still there past its deadline is
deleted as a check error (`_overran`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import Enum
from typing import Literal

from nodewright.api import constants, semver
from nodewright.api.events import EventReason, event_type
from nodewright.api.models import Interrupt, InterruptType, NodeWright, Package, Status
from nodewright.api.nodeobject import NodeFacts, Taint
from nodewright.api.nodestate import (
    Admission,
    NodeState,
    PackageEntry,
    PackageStage,
    PackageState,
    truncate_error,
)
from nodewright.api.reasons import NodeConditionReason
from nodewright.api.reasons import NodeConditionReason as R
from nodewright.api.timing import DrainSkip
from nodewright.plan import drift, podspec
from nodewright.plan.configdiff import config_hashes, diff
from nodewright.plan.dag import Graph
from nodewright.plan.drain import DrainSelection
from nodewright.plan.interrupts import merge_for_node, merge_interrupts
from nodewright.plan.stages import (
    ACTIVE_STATES,
    INTERRUPT_STAGES,
    PRE_INTERRUPT_STAGES,
    UNINSTALL_STAGES,
    ChainedRun,
    FailureCause,
    Observation,
    PodOutcome,
    PodSummary,
    RetryPolicy,
    StageProgress,
    advance,
    completed_stages,
    fail_attempt,
    human_duration,
    observe_pod,
    parse_ts,
    pod_stages,
    run_completed_stages,
    run_interrupt,
    seconds_until,
    start_attempt,
    ts,
)
from nodewright.plan.transitions import Transition, stage_transitions

# ----------------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True, slots=True)
class DrainFacts:
    """The drain selection of the node's workload pods, plus what the controller observed doing it."""

    selection: DrainSelection
    protected_since: datetime | None = None  # first time protected pods were seen (for interruptWait)
    draining_since: datetime | None = None  # first eviction issued for this interrupt (for drain.timeout)
    eviction_blocked: tuple[str, ...] = ()  # e.g. PDB refusals, for the message


@dataclass(frozen=True, slots=True)
class PlanOptions:
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    pod: podspec.PodOptions = field(default_factory=podspec.PodOptions)
    reboot_timeout: float = 1200.0
    # A reboot interrupt's pod that ended while the node stays Ready with its old bootID this long did
    # not reboot it (a node going down turns NotReady within the node-monitor grace period, ~40 s).
    reboot_grace: float = 300.0
    reapply_on_reboot: bool = False
    poll_interval: float = 5.0  # re-check cadence while waiting on something without an event
    chain_packages: bool = False  # follow a run with its dependents' runs in the same pod (`chain_for`)


@dataclass(frozen=True, slots=True)
class NodeInput:
    nodewright: NodeWright
    node: NodeFacts
    state: NodeState | None
    pods: tuple[PodSummary, ...]
    now: datetime
    drain: DrainFacts | None = None
    sequencing_blocker: str | None = None  # from sequencing.blocking(...).reason
    options: PlanOptions = field(default_factory=PlanOptions)
    drain_skip: DrainSkip | None = None  # persisted by the controller (see DrainSkip)
    drift: DriftInput | None = None  # driftDetection: this node's check pods and schedule


@dataclass(frozen=True, slots=True)
class DriftCheckPod:
    """A drift-check pod of this NodeWright on the node, as the controller read it."""

    name: str
    outcome: PodOutcome
    failed_container: str | None = None
    message: str = ""
    terminating: bool = False
    basis: str = ""  # its `nodewright.io/drift-basis` annotation (`drift.CheckBasis`)
    created: datetime | None = None  # its creationTimestamp
    deadline: float | None = None  # its `activeDeadlineSeconds` (None: built without one)


@dataclass(frozen=True, slots=True)
class DriftInput:
    """What the controller knows about drift checks of this node (see `plan.drift`).

    `slot` is the node's current check slot; `due` says the schedule wants a check in it (the
    controller's memory of checked slots); `may_start` that a fleet-wide check slot is free;
    `seconds_to_next` when the next slot begins.
    """

    pods: tuple[DriftCheckPod, ...] = ()
    slot: int = 0
    due: bool = False
    may_start: bool = False
    seconds_to_next: float = 60.0


# ----------------------------------------------------------------------------------------------------
# Outputs


@dataclass(frozen=True, slots=True)
class Cordon:
    pass


@dataclass(frozen=True, slots=True)
class Uncordon:
    pass


@dataclass(frozen=True, slots=True)
class WaitForProtectedPods:
    pods: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Drain:
    pods: tuple[str, ...]  # namespace/name to evict
    force: bool = False  # delete instead of evict (drain.policy force after the timeout)


@dataclass(frozen=True, slots=True)
class CreatePod:
    package: str
    version: str
    stage: PackageStage
    attempt: int
    name: str
    spec_hash: str
    node_order: int
    interrupt: Interrupt | None = None  # interrupt stages: the merged interrupt
    covers: tuple[str, ...] = ()  # interrupt stages: the other packages the interrupt completes
    repair: bool = False  # a run that re-applies after drift (the agent re-runs flagged steps)
    chain: tuple[tuple[str, str, PackageStage], ...] = ()  # (package, version, stage) run after its own
    run: str = ""  # interrupt stages: this attempt's identity on the host (`podspec.interrupt_run`)


@dataclass(frozen=True, slots=True)
class CreateDriftCheck:
    """Create the node's drift-check pod for check slot `slot` (read-only; no cordon, no drain), made
    against `basis` (`drift.check_basis`, encoded: the pod carries it)."""

    slot: int
    packages: tuple[str, ...]
    reason: str
    basis: str = ""


@dataclass(frozen=True, slots=True)
class BindPod:
    """Bind (and so seal and start) a created, unbound pod its stage expects (`controller.trust`)."""

    name: str


@dataclass(frozen=True, slots=True)
class DeletePod:
    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class RequeueAfter:
    seconds: float
    reason: str


@dataclass(frozen=True, slots=True)
class Event:
    """An Event about the node: the reason is a code of the one Event vocabulary (`api.events`), which
    also gives its type and whether the NodeWright gets it too."""

    reason: EventReason
    message: str

    @property
    def type(self) -> str:
        return event_type(self.reason).value


Action = (
    Cordon
    | Uncordon
    | WaitForProtectedPods
    | Drain
    | DeletePod
    | CreatePod
    | BindPod
    | CreateDriftCheck
    | Event
    | RequeueAfter
)


@dataclass(frozen=True, slots=True)
class AttemptFailed:
    """An attempt this plan recorded as failed, from its pod: where, why, and what was recorded.

    `stage` and `attempt` are those of the entry that took the failure (a pod running several stages
    fails in the one it was in: its first attempt there, if the pod went on into it). `message` is the
    entry's error as written to the node state: the attempt out of how many, or "giving up", and the
    reason. The controller keeps it as the stage's kept log when the pod did not fail by itself
    (`cause` PULL_ERROR or TIMEOUT: no container's exit says why, `controller.logstore`).
    """

    pod: str
    package: str
    version: str
    stage: PackageStage
    attempt: int
    cause: FailureCause
    message: str
    gave_up: bool


@dataclass(frozen=True, slots=True)
class NodeCondition:
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: NodeConditionReason  # the code consumers dispatch on (`api.reasons`); `message` is for people
    message: str


@dataclass(frozen=True, slots=True)
class NodePlan:
    state: NodeState
    status: Status
    condition: NodeCondition
    actions: tuple[Action, ...]
    needs_drain_facts: bool = False
    state_changed: bool = False
    drain_skip: DrainSkip | None = None  # the skip memory after this plan (None: none / cleared)
    drain_skipped: bool = False  # this plan skipped the drain (the controller resets its drain timer)
    consume_admission: bool = False  # the node settled under its admission: the controller marks it used
    drift_result: str | None = None  # a drift check finished in this plan: clean, drifted or error
    failed: tuple[AttemptFailed, ...] = ()  # attempts this plan recorded as failed, from their pods
    drain_blocked: bool = False  # draining, and an eviction was refused (the rollout counts the node held)
    transitions: tuple[Transition, ...] = ()  # stage attempts this plan ended or retried (`plan.transitions`)


CONDITION_TEXT = 1000  # characters of a node condition message the planner composes
CHAIN_HEAD_STAGES = frozenset({PackageStage.APPLY, PackageStage.UPGRADE, PackageStage.CONFIG})
"""Stages whose pod may carry chained runs after its own (see `_chain_for`)."""

# ----------------------------------------------------------------------------------------------------
# Helpers


def _flag(nw: NodeWright, key: str) -> bool:
    value = (nw.metadata.annotations or {}).get(key)
    return value is not None and value.lower() in ("true", "1", "yes")


def is_disabled(nw: NodeWright) -> bool:
    return _flag(nw, constants.ANNOTATION_DISABLE)


def is_paused(nw: NodeWright) -> bool:
    return _flag(nw, constants.ANNOTATION_PAUSE)


def untolerated_taints(nw: NodeWright, node: NodeFacts, *, runtime_taint_key: str) -> list[Taint]:
    """Taints (all effects count, anchor §2.11) not tolerated by this NodeWright's pods."""
    tolerations = list(nw.spec.additional_tolerations or [])

    def tolerated(taint: Taint) -> bool:
        if taint.key == "node.kubernetes.io/unschedulable" and taint.effect == "NoSchedule":
            return True
        if nw.spec.runtime_required and taint.key == runtime_taint_key:
            return True
        for t in tolerations:
            if t.effect and t.effect != taint.effect:
                continue
            if t.operator == "Exists":
                if not t.key or t.key == taint.key:
                    return True
            elif t.key == taint.key and (t.value or "") == (taint.value or ""):
                return True
        return False

    return [t for t in node.taints if not tolerated(t)]


def _package(nw: NodeWright, name: str) -> Package:
    return nw.spec.packages[name]


def _uninstall_requested(pkg: Package) -> bool:
    return bool(pkg.uninstall and pkg.uninstall.enabled and pkg.uninstall.apply)


def _uninstall_target(state: NodeState, name: str, pkg: Package) -> PackageEntry | None:
    """The entry an uninstall acts on: the spec version, else the highest installed version."""
    current = state.entry(name, pkg.version)
    if current is not None:
        return current
    others = state.entries_for(name)
    if not others:
        return None
    return max(others, key=lambda e: _version_key(e.version))


def _version_key(version: str) -> semver.Version:
    try:
        return semver.parse(version)
    except semver.InvalidVersion:
        return semver.Version(0, 0, 0, ("invalid",))


def package_complete(state: NodeState, name: str, pkg: Package, *, repair_drift: bool = False) -> bool:
    """The package is done on the node: installed and complete at the spec version with the spec
    config (and, when drift is repaired, not drifted), or (uninstall requested) no longer present."""
    if _uninstall_requested(pkg):
        return not state.entries_for(name)
    current = state.entry(name, pkg.version)
    return (
        current is not None
        and current.state == PackageState.COMPLETE
        and not diff(current.config, config_hashes(pkg.config_map))
        and not (repair_drift and current.drifted)
    )


def node_complete(nw: NodeWright, state: NodeState) -> bool:
    return all(
        package_complete(state, n, p, repair_drift=drift.reapplies(nw, n))
        for n, p in nw.spec.packages.items()
    )


def entry_in_spec(nw: NodeWright, entry: PackageEntry) -> bool:
    """A state entry belongs to the current spec: its package's version, or an uninstall of another
    version that the spec package drives (e.g. before a downgrade), and not a suspended run (one that a
    spec of another version cut short: it waits for an admission, see `_resume_under_fresh_admission`).
    Other entries are inert markers."""
    return not entry.suspended and _version_in_spec(nw, entry)


def _version_in_spec(nw: NodeWright, entry: PackageEntry) -> bool:
    pkg = nw.spec.packages.get(entry.name)
    if pkg is None:
        return False
    if entry.version == pkg.version:
        return True
    return entry.stage in UNINSTALL_STAGES and entry.state != PackageState.COMPLETE


@dataclass(frozen=True, slots=True)
class StateRuns:
    """What a node's state says about its runs, for reading its status label against the current spec
    (`plan.rollout.status_for_spec`): a run of the current spec in flight (pending, in progress or
    skipped: the node planner continues it without an admission, so that a node never stays
    half-done), one of another spec in flight (an inert marker, whose pod may still be working until the
    node planner has looked at the node again), a run of the current spec erroring."""

    current_in_flight: bool = False
    other_in_flight: bool = False
    current_erroring: bool = False


def state_runs(nw: NodeWright, state: NodeState | None) -> StateRuns:
    if state is None:
        return StateRuns()
    return StateRuns(
        current_in_flight=any(e.state in ACTIVE_STATES and entry_in_spec(nw, e) for e in state.packages),
        other_in_flight=any(e.state in ACTIVE_STATES and not entry_in_spec(nw, e) for e in state.packages),
        current_erroring=any(
            e.state == PackageState.ERRORING and entry_in_spec(nw, e) for e in state.packages
        ),
    )


def admission_key(admission: Admission) -> str:
    """Identifies one admission of a node: its batch, its (per-rollout unique) order number and time."""
    return f"{admission.batch}/{admission.order}/{admission.at}"


def _check_running(pod: DriftCheckPod) -> bool:
    """A drift-check pod that has not ended: running, or Pending (created, pulling its images, or
    started again by the kubelet after a reboot). One that ended, or stuck on an image pull error
    (it has no verdict to give; it is removed as an `error`), is read and removed."""
    return pod.outcome is PodOutcome.RUNNING


def _ended(pod: PodSummary) -> bool:
    return pod.outcome in (PodOutcome.SUCCEEDED, PodOutcome.FAILED, PodOutcome.DEADLINE)


def _may_run(pod: PodSummary, *, deleting: bool) -> bool:
    """The pod's containers may still run something on the host.

    A running pod may, also while it terminates (its grace period). A pod whose work ended (every init
    container exited, or the pod failed) is only waiting to be removed. A pod stuck pulling an image
    runs nothing yet, but could start as soon as the pull succeeds, until its deletion is requested.
    """
    if pod.outcome is PodOutcome.RUNNING:
        return True
    return pod.outcome is PodOutcome.PULL_ERROR and not (deleting or pod.terminating)


def _condition(nw: NodeWright, status: Status, reason: NodeConditionReason, message: str) -> NodeCondition:
    return NodeCondition(
        type=constants.node_condition_type(nw.metadata.name),
        status="True" if status == Status.COMPLETE else "False",
        reason=reason,
        message=message,
    )


# ----------------------------------------------------------------------------------------------------
# The planner


def _new_run(nw: NodeWright, state: NodeState, name: str, pkg: Package) -> PackageEntry | str | None:
    """The run of package `name` that would start now on a node in `state` (none in flight): an
    uninstall, a config change or drift repair of the installed spec version, an install or upgrade;
    a string when one is due but may not start (a downgrade that needs an uninstall first); None."""
    if _uninstall_requested(pkg):
        target = _uninstall_target(state, name, pkg)
        if target is None or target.state != PackageState.COMPLETE:
            return None
        return replace(
            target,
            stage=PackageStage.UNINSTALL,
            state=PackageState.PENDING,
            attempts=0,
            started=None,
            changed=(),
            error="",
        )
    current = state.entry(name, pkg.version)
    if current is not None:
        return _rerun(nw, name, pkg, current) if current.state == PackageState.COMPLETE else None
    return _install_run(state.entries_for(name), name, pkg)


def _rerun(nw: NodeWright, name: str, pkg: Package, current: PackageEntry) -> PackageEntry | None:
    """A complete spec version runs again for a config change, or (action reapply) to repair drift."""
    change = diff(current.config, config_hashes(pkg.config_map))
    fresh = replace(current, state=PackageState.PENDING, attempts=0, started=None, error="")
    if change:
        return replace(fresh, stage=PackageStage.CONFIG, changed=change.keys)
    if current.drifted and drift.reapplies(nw, name):
        # Repair: the whole install again (apply, config, the interrupt if any), with the agent running
        # steps its flags say already succeeded.
        return replace(fresh, stage=PackageStage.APPLY, changed=(), repair=True)
    return None


def _install_run(entries: Sequence[PackageEntry], name: str, pkg: Package) -> PackageEntry | str:
    """An install of the spec version: an upgrade over a lower complete version; a downgrade below an
    installed higher version needs that one uninstalled first when the package supports uninstall."""
    spec_v = _version_key(pkg.version)
    lower = [e for e in entries if _version_key(e.version) < spec_v]
    higher = [e for e in entries if _version_key(e.version) > spec_v]
    if higher and pkg.uninstall is not None and pkg.uninstall.enabled:
        top = max(higher, key=lambda e: _version_key(e.version))
        return (
            f"{name}: downgrade {top.version} -> {pkg.version} requires uninstalling"
            f" {top.version} first (set uninstall.apply: true)"
        )
    upgrade = bool(lower) and max(lower, key=lambda e: _version_key(e.version)).state == PackageState.COMPLETE
    stage = PackageStage.UPGRADE if upgrade and not higher else PackageStage.APPLY
    return PackageEntry(name=name, version=pkg.version, stage=stage, state=PackageState.PENDING)


class Hold(Enum):
    """What keeps a node from progressing, as the planner decided it (the node condition's reason is
    chosen from these codes; their words only make its message)."""

    REBOOT = "reboot"
    CORDON = "cordon"
    CHECK_PODS = "check-pods"
    PROTECTED_PODS = "protected-pods"
    DRAIN = "drain"
    POD_RUNNING = "pod-running"
    PAUSED = "paused"
    NOT_READY = "not-ready"
    INTERRUPT_WAITS = "interrupt-waits"
    NOT_ADMITTED = "not-admitted"
    SEQUENCING = "sequencing"


@dataclass(frozen=True, slots=True)
class _PodFailure:
    """The failure of the pod `pod` as observed (`observe_pod`), on its way to the entry it fails."""

    pod: str
    reason: str
    cause: FailureCause


@dataclass(frozen=True, slots=True)
class _Ctx:
    """The planner's input, read-only: the NodeWright, the node, its pods, the clock and the options."""

    inp: NodeInput

    @property
    def nw(self) -> NodeWright:
        return self.inp.nodewright

    @property
    def node(self) -> NodeFacts:
        return self.inp.node

    @property
    def now(self) -> datetime:
        return self.inp.now

    @property
    def opts(self) -> PlanOptions:
        return self.inp.options


@dataclass(slots=True)
class _Draft:
    """The plan as its phases build it, passed from one phase to the next (`plan_node`): the node's state
    and what the node controller is to do, then what the status is made of."""

    state: NodeState
    skip: DrainSkip | None  # drain.policy skip memory (see DrainSkip)
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    deletes: dict[str, DeletePod] = field(default_factory=dict)
    creates: list[CreatePod] = field(default_factory=list)
    binds: list[BindPod] = field(default_factory=list)
    failed: list[AttemptFailed] = field(default_factory=list)  # attempts recorded as failed, from their pods
    requeues: list[RequeueAfter] = field(default_factory=list)
    holds: list[tuple[Hold, str]] = field(default_factory=list)  # what holds the node up (first: headline)
    blocked: list[str] = field(default_factory=list)  # package-level blocks
    # The node gate this plan went through (cordon, protected pods, drain).
    needs_drain: bool = False
    cordon_requested: bool = False
    node_gate_ok: bool = False  # cordoned + no protected pods + drained, this plan
    skipped_now: bool = False  # this plan released the node after a drain timeout
    drain_overdue: bool = False  # drain.timeout passed and the policy keeps the node draining (wait)
    eviction_blocked: bool = False  # draining, and an eviction was refused (PodDisruptionBudget, error)
    skip_blocked: str | None = None  # status message while released for a drain timeout
    # Drift checks (`_drift_checks`).
    drift_create: CreateDriftCheck | None = None
    drift_requeue: RequeueAfter | None = None
    drift_result: str | None = None
    drift_recheck: bool = False  # a host change is to be checked: keep the recorded bootID
    check_expires: datetime | None = None  # when the running check pod is given up (if any)


# ----------------------------------------------------------------------------------------------------
# Small utilities


def _policy(c: _Ctx, name: str) -> RetryPolicy:
    return RetryPolicy.for_package(_package(c.nw, name), c.opts.retry)


def _hold(c: _Ctx, d: _Draft, kind: Hold, text: str) -> None:
    """What keeps the node from progressing: the code the status dispatches on, and its words."""
    d.holds.append((kind, text))


def _requeue(c: _Ctx, d: _Draft, seconds: float, reason: str) -> None:
    d.requeues.append(RequeueAfter(max(1.0, float(seconds)), reason))


def _delete(c: _Ctx, d: _Draft, pod: PodSummary, reason: str) -> None:
    d.deletes.setdefault(pod.name, DeletePod(pod.name, reason))


def _put(c: _Ctx, d: _Draft, entry: PackageEntry) -> None:
    d.state = d.state.with_entry(entry)


def _node_order(c: _Ctx, d: _Draft) -> int:
    return d.state.admission.order if d.state.admission else 0


def _stage_interrupt(c: _Ctx, entry: PackageEntry) -> Interrupt | None:
    return run_interrupt(_package(c.nw, entry.name), entry)


def _desired_hash(
    c: _Ctx,
    entry: PackageEntry,
    interrupt: Interrupt | None = None,
    chain: tuple[PackageEntry, ...] = (),
    run: str = "",
) -> str:
    pkg = _package(c.nw, entry.name)
    return podspec.spec_hash(
        c.nw,
        pkg,
        package_name=entry.name,
        version=entry.version,
        stage=entry.stage,
        interrupt=interrupt,
        options=c.opts.pod,
        repair=entry.repair and entry.stage not in INTERRUPT_STAGES,
        chain=_chain_links(c, chain),
        run=run,
    )


def _interrupt_run(c: _Ctx, d: _Draft, attempt: int) -> str:
    """The identity of this attempt of the node's interrupt on the host (`podspec.resource_id`):
    its start and the attempt. A pod of the same attempt made again (lost before it ran, or run
    again by the kubelet after the reboot) keeps it, so the agent's flag stops a second reboot;
    every other attempt, of this or of any later run (a repair, a retry under a fresh admission),
    has its own, so its interrupt really runs. None recorded (a state from an older operator): the
    generation's identity, as before."""
    at = d.state.interrupt_at
    return podspec.interrupt_run(at, attempt) if at else ""


def _chain_links(c: _Ctx, chain: tuple[PackageEntry, ...]) -> tuple[podspec.ChainLink, ...]:
    return tuple(podspec.ChainLink(e.name, _package(c.nw, e.name), e.version, e.stage) for e in chain)


def _chain_for(c: _Ctx, d: _Draft, head: PackageEntry) -> tuple[PackageEntry, ...]:
    """The runs that follow `head`'s stages in its pod (`--chain-packages`, `podspec.ChainLink`).

    New installs or upgrades without interrupt of packages that depend on `head` and on runs
    already chained only (at least one dependency each), in dependency order, ties by name. It is
    a function of the spec and of those packages' own entries -- which nothing changes while the
    head's pod runs -- so it is the same chain when the pod is created and whenever it is observed
    (a different chain means a different spec: the pod is replaced like any changed pod). A package
    that also depends on something outside the pod is not chained: whether that is complete can
    change while the pod runs.
    """
    if (
        not c.opts.chain_packages
        or head.repair
        or head.stage not in CHAIN_HEAD_STAGES
        or _stage_interrupt(c, head) is not None
    ):
        return ()
    candidates = {
        run.name: run
        for run in _new_runs(c, d, report=False)
        if run.name != head.name
        and run.stage in (PackageStage.APPLY, PackageStage.UPGRADE)
        and not run.repair
        and _stage_interrupt(c, run) is None
    }
    members = {head.name}
    chain: list[PackageEntry] = []
    while True:
        following = next(
            (
                name
                for name in sorted(candidates)
                if name not in members
                and (deps := set(c.nw.spec.packages[name].depends_on or {}))
                and deps <= members
            ),
            None,
        )
        if following is None:
            return tuple(chain)
        chain.append(candidates[following])
        members.add(following)


def _in_spec(c: _Ctx, entry: PackageEntry) -> bool:
    return entry_in_spec(c.nw, entry)


def _reapply_on_reboot(c: _Ctx, d: _Draft) -> _Draft:
    s = d.state
    if not (c.opts.reapply_on_reboot and s.generation is not None and s.boot_id and c.node.boot_id):
        return d
    if s.boot_id == c.node.boot_id or not node_complete(c.nw, s):
        return d
    # Immutable OS images lose host changes on reboot: start over, through the rollout planner
    # (admission cleared) so that a fleet-wide power event does not re-apply everywhere at once.
    d.state = NodeState(cordoned=s.cordoned)
    d.events.append(
        Event(EventReason.NODE_REBOOTED, "node rebooted; re-applying every package (reapplyOnReboot)")
    )
    return d


def _interrupt_group(c: _Ctx, d: _Draft) -> tuple[PackageEntry | None, list[PackageEntry]]:
    # Entries of versions no longer in the spec are inert markers (D2): they never hold the node.
    mine = [e for e in d.state.packages if e.stage in INTERRUPT_STAGES and _in_spec(c, e)]
    carrier = next((e for e in mine if e.state == PackageState.IN_PROGRESS), None)
    skipped = [e for e in mine if e.state == PackageState.SKIPPED]
    return carrier, skipped


def _merged_interrupt(c: _Ctx, carrier: PackageEntry, skipped: list[PackageEntry]) -> Interrupt | None:
    found = [
        i
        for e in [carrier, *skipped]
        if e.name in c.nw.spec.packages
        if (i := _stage_interrupt(c, e)) is not None
    ]
    return merge_interrupts(found)


def _observe(c: _Ctx, d: _Draft) -> _Draft:
    """Read every pod of a stage in flight: advance, fail or retry its entry; pods no stage expects
    are removed."""
    pods_by_key: dict[tuple[str, str, PackageStage], list[PodSummary]] = {}
    for pod in c.inp.pods:
        pods_by_key.setdefault((pod.package, pod.version, pod.stage), []).append(pod)
    carrier, skipped = _interrupt_group(c, d)
    expected: set[str] = set()
    for entry in list(d.state.packages):
        if entry.state != PackageState.IN_PROGRESS or not _in_spec(c, entry):
            continue
        pods = pods_by_key.get((entry.name, entry.version, entry.stage), [])
        current = next(
            (p for p in pods if p.attempt == entry.attempts and p.spec_hash == entry.spec_hash), None
        )
        if current is not None:
            expected.add(current.name)
        if (
            entry.stage in INTERRUPT_STAGES
            and carrier is not None
            and _reboot_check(c, d, entry, skipped, current)
        ):
            continue  # a reboot in flight keeps its pod until the reboot is confirmed
        _observe_entry(c, d, entry, current, _wanted_hash(c, d, entry, pods, skipped), skipped)
    for pod in c.inp.pods:
        if pod.name not in expected:
            _delete(c, d, pod, "no package stage expects this pod")
    return d


def _wanted_hash(
    c: _Ctx, d: _Draft, entry: PackageEntry, pods: list[PodSummary], skipped: list[PackageEntry]
) -> str:
    """The spec hash the entry's pod should have now."""
    if entry.stage in INTERRUPT_STAGES:
        return _desired_hash(c, entry, _merged_interrupt(c, entry, skipped))
    # A pod keeps the chain it was built with while its links are still in the spec (their hash
    # says whether what it runs changed): a NodeWright deletion or an uninstall asked for meanwhile
    # never cuts an install short.
    candidate = next((p for p in pods if p.attempt == entry.attempts and p.chain), None)
    kept = _pod_chain(c, candidate) if candidate is not None else None
    return _desired_hash(c, entry, chain=_chain_for(c, d, entry) if kept is None else kept)


def _observe_entry(
    c: _Ctx,
    d: _Draft,
    entry: PackageEntry,
    current: PodSummary | None,
    want: str,
    skipped: list[PackageEntry],
) -> None:
    """One stage in flight and its current pod (None: lost, or waiting for a retry)."""
    if current is None:
        if entry.spec_hash and entry.spec_hash != want and entry.stage not in INTERRUPT_STAGES:
            # The spec changed while no pod runs (lost, or waiting for a retry): start afresh.
            _put(c, d, _respec(c, entry))
        return  # lost pod or retry pending: handled by the start phase
    if current.spec_hash != want and entry.stage not in INTERRUPT_STAGES:
        # Image/env/resources/config changed: replace the pod with a fresh attempt series.
        _delete(c, d, current, "pod spec changed")
        if current.chain:
            _finish_replaced(c, d, entry, current)
        else:
            _put(c, d, _respec(c, entry))
        return
    view = observe_pod(current, entry, now=c.now, policy=_policy(c, entry.name))
    if view.observation == Observation.WAIT:
        if not current.bound and not current.terminating:
            # Created but not placed (an operator restart, or a binding that failed): it has run
            # nothing and is still the pod this stage wants.
            d.binds.append(BindPod(current.name))
        if view.pull_error_since != entry.pull_error_since:
            _put(c, d, replace(entry, pull_error_since=view.pull_error_since))
        if view.recheck_after is not None:
            _requeue(c, d, view.recheck_after, f"deadline of {current.name}")
        return
    succeeded = view.observation == Observation.SUCCEEDED
    _delete(c, d, current, "attempt finished" if succeeded else "attempt failed")
    if succeeded and entry.stage in INTERRUPT_STAGES:
        if _is_reboot(c, entry, skipped):
            # Exit 0 of a reboot pod only means "reboot issued"; completion is the new bootID.
            _requeue(c, d, c.opts.poll_interval, "waiting for the node to reboot")
        else:
            _finish_interrupt(c, d, entry, skipped)
    elif succeeded:
        _finish_pod(c, d, entry, current, failure=None)
    elif entry.stage in INTERRUPT_STAGES:
        _record_failure(
            c, d, entry, _PodFailure(current.name, view.reason, view.cause or FailureCause.POD_FAILED)
        )
    else:
        failure = _PodFailure(current.name, view.reason, view.cause or FailureCause.POD_FAILED)
        _finish_pod(c, d, entry, current, failure=failure)


def _respec(c: _Ctx, entry: PackageEntry) -> PackageEntry:
    """The entry restarted after its stage's pod spec changed: a fresh attempt series; a config run
    also absorbs the newly changed keys (they decide the config interrupt)."""
    changed = entry.changed
    if entry.stage == PackageStage.CONFIG and changed:
        pkg = _package(c.nw, entry.name)
        changed = tuple(sorted({*changed, *diff(entry.config, config_hashes(pkg.config_map)).keys}))
    return replace(
        entry,
        state=PackageState.PENDING,
        attempts=0,
        spec_hash="",
        retry_at=None,
        pull_error_since=None,
        changed=changed,
        updated=ts(c.now),
    )


def _is_reboot(c: _Ctx, carrier: PackageEntry, skipped: list[PackageEntry]) -> bool:
    merged = _merged_interrupt(c, carrier, skipped)
    return merged is not None and merged.type == InterruptType.REBOOT


def _reboot_check(
    c: _Ctx, d: _Draft, carrier: PackageEntry, skipped: list[PackageEntry], pod: PodSummary | None
) -> bool:
    """Handle a reboot in flight; True when handled (completed or timed out)."""
    if not _is_reboot(c, carrier, skipped) or d.state.interrupt_at is None:
        return False
    if d.state.boot_id and c.node.boot_id and c.node.boot_id != d.state.boot_id:
        if not c.node.ready:
            _hold(c, d, Hold.REBOOT, "node rebooted, waiting for it to become Ready")
            _requeue(c, d, c.opts.poll_interval, "node not Ready after reboot")
            return True
        if pod is not None:
            # A pod from before the reboot may be started again by the kubelet that came back (a real
            # one re-runs the init containers of a pod whose sandbox died), so its last status says
            # nothing: the run goes on to post-interrupt only once the pod is gone.
            if not pod.terminating:
                _delete(c, d, pod, "reboot completed")
            _hold(c, d, Hold.REBOOT, "node rebooted, waiting for its interrupt pod to go")
            _requeue(c, d, c.opts.poll_interval, "interrupt pod of a completed reboot not gone")
            return True
        d.events.append(
            Event(EventReason.NODE_REBOOTED, f"boot id changed; {carrier.name}:{carrier.version} rebooted")
        )
        _finish_interrupt(c, d, carrier, skipped)
        return True
    started = parse_ts(d.state.interrupt_at)
    deadline = started + timedelta(seconds=c.opts.reboot_timeout)
    if c.now >= deadline:
        message = f"node did not return from reboot within {human_duration(c.opts.reboot_timeout)}"
        _put(c, d, replace(carrier, state=PackageState.ERRORING, error=message, updated=ts(c.now)))
        d.state = replace(d.state, interrupt_at=None)
        _fail_covered(c, d, carrier, message)
        d.events.append(Event(EventReason.INTERRUPT_FAILED, f"{carrier.name}:{carrier.version}: {message}"))
        if pod is not None:
            _delete(c, d, pod, "reboot timed out")
        return True
    if pod is not None and pod.terminating and carrier.retry_at is not None:
        return True  # its attempt is recorded as failed; the retry waits for the pod to go
    if pod is not None and _ended(pod) and c.node.ready and not pod.terminating:
        return _await_reboot(c, d, carrier, pod, deadline)
    if not c.node.ready or (pod is not None and _ended(pod)):
        # The reboot is under way (or the pod died with it): wait for the new bootID.
        _hold(c, d, Hold.REBOOT, "waiting for the node to reboot")
        _requeue(c, d, min(seconds_until(deadline, c.now), c.opts.poll_interval * 6), "reboot deadline")
        return True
    _requeue(c, d, seconds_until(deadline, c.now), "reboot deadline")
    return False


def _await_reboot(c: _Ctx, d: _Draft, carrier: PackageEntry, pod: PodSummary, deadline: datetime) -> bool:
    """The reboot pod ended and the node is still up with its old bootID: the reboot is on its way
    (`reboot` returns at once; the node goes down moments later) -- or it never happened: the agent
    skipped it (its flag for this identity said it had run) or `reboot` failed. Exit 0 says neither.
    A node going down turns NotReady within the node-monitor grace period, so a node still Ready
    with the same bootID `reboot_grace` after the pod ended was not rebooted: that is a failed
    attempt (retried with a new identity, so the agent runs `reboot` again), never a wait for the
    reboot timeout with the node cordoned. Always True (handled)."""
    ended = pod.finished or pod.created
    give_up = ended + timedelta(seconds=c.opts.reboot_grace)
    if c.now < give_up:
        _hold(c, d, Hold.REBOOT, "waiting for the node to reboot")
        _requeue(
            c,
            d,
            min(
                seconds_until(give_up, c.now),
                seconds_until(deadline, c.now),
                c.opts.poll_interval * 6,
            ),
            "waiting for the node to go down",
        )
        return True
    how = "exited 0" if pod.outcome is PodOutcome.SUCCEEDED else f"failed ({pod.message or 'no reason'})"
    reason = (
        f"interrupt pod {pod.name} {how}, but the node did not reboot: still Ready with bootID"
        f" {c.node.boot_id or '?'} {human_duration(c.opts.reboot_grace)} later"
    )
    _delete(c, d, pod, "the node did not reboot")
    _record_failure(c, d, carrier, _PodFailure(pod.name, reason, FailureCause.NO_REBOOT))
    return True


def _finish_pod(
    c: _Ctx, d: _Draft, entry: PackageEntry, pod: PodSummary, *, failure: _PodFailure | None
) -> None:
    """A stage pod ended: advance the entry through every stage it completed, in order (one state
    write for all of them), then record the failure, if any, at the stage it failed in; then the
    same for each chained run the pod carried, in order, as long as the runs before it completed.

    The stages done are read from the pod's init container statuses, so a pod of another shape (one
    an older operator built with a single stage) advances exactly as far as it got. A failure in a
    later stage keeps the earlier ones done: the retry pod starts at the stage that failed, as its
    first attempt there.
    """
    current = _advance_run(c, d, entry, pod.progress, completed_stages(pod))
    if current is not None and current.state is PackageState.COMPLETE and pod.chain:
        _finish_chain(c, d, pod, failure=failure)
        return
    if failure is not None and current is not None:
        _fail_run(c, d, entry, current, pod.progress, pod.stages, failure)


def _advance_run(
    c: _Ctx,
    d: _Draft,
    entry: PackageEntry,
    progress: tuple[StageProgress, ...],
    done: tuple[PackageStage, ...],
) -> PackageEntry | None:
    """`entry` advanced through the stages `done` (in order, stopping at the first mismatch).

    The stages after the first count their own attempts from 1 (a failure there is that stage's
    first), but a run that completes in this pod keeps the attempts of the stage it entered the pod
    at: an install that failed twice in apply and then completed apply and config in its third pod
    is complete after 3 attempts, not after config's 1."""
    current: PackageEntry | None = entry
    for stage in done:
        if current is None or current.stage != stage or current.state is PackageState.COMPLETE:
            break
        if current is not entry:
            current = _continued_in(c, progress, current)
        current = _complete_stage(c, d, current, run_attempts=entry.attempts)
    return current


def _fail_run(
    c: _Ctx,
    d: _Draft,
    entry: PackageEntry,
    current: PackageEntry,
    progress: tuple[StageProgress, ...],
    stages: tuple[PackageStage, ...],
    failure: _PodFailure,
) -> None:
    """Record `failure` at the stage `current` of a run that started at `entry` stopped in."""
    if current.state not in (PackageState.PENDING, PackageState.IN_PROGRESS):
        return  # nothing left to fail (the pod's last stage completed before the pod was killed)
    if current.stage != entry.stage:
        if current.stage not in stages:
            return  # the pod ended after its own stages; the next one has not started
        current = _continued_in(c, progress, current)
    _record_failure(c, d, current, failure)


def _finish_chain(c: _Ctx, d: _Draft, pod: PodSummary, *, failure: _PodFailure | None) -> None:
    """The chained runs of a pod whose own run completed: each one's entry starts (its first
    attempt ran in this pod) and advances as far as its containers got; the first that did not
    complete takes the failure, and the runs after it were never started (they start as new runs)."""
    succeeded = pod.outcome is PodOutcome.SUCCEEDED
    for run in pod.chain:
        fresh = _chained_entry(c, d, run)
        if fresh is None:
            return  # its package left the spec: a marker of what ran is kept (`chained_entry`)
        started = _continued_in(c, run.progress, fresh)
        done = run_completed_stages(run.progress, run.stages, succeeded=succeeded)
        current = _advance_run(c, d, started, run.progress, done)
        if current is None or current.state is PackageState.COMPLETE:
            continue
        _put(c, d, current)
        if failure is not None:
            _fail_run(c, d, started, current, run.progress, run.stages, failure)
        return


def _chained_entry(c: _Ctx, d: _Draft, run: ChainedRun) -> PackageEntry | None:
    """The entry of a chained run that the pod went on into: it ran on the host, so it is recorded
    whatever the spec says now (an entry present means "files of this version may be on the host";
    an uninstall requested meanwhile runs after it). None when its package left the spec: then only
    an inert marker at the run's stage is kept, as for any run of a package no longer in the spec."""
    pkg = c.nw.spec.packages.get(run.package)
    entry = PackageEntry(
        name=run.package,
        version=run.version,
        stage=run.stage,
        state=PackageState.PENDING,
        image=podspec.image_reference(pkg.image, run.version, pkg.container_sha) if pkg else "",
    )
    if pkg is None:
        _put(c, d, _continued_in(c, run.progress, entry))
        return None
    return entry


def _pod_chain(c: _Ctx, pod: PodSummary) -> tuple[PackageEntry, ...] | None:
    """The chain a running pod carries, as entries, if every link still names a package of the spec
    at that version (its hash then says whether what it runs changed); None otherwise."""
    links: list[PackageEntry] = []
    for run in pod.chain:
        pkg = c.nw.spec.packages.get(run.package)
        if pkg is None or pkg.version != run.version:
            return None
        links.append(PackageEntry(run.package, run.version, run.stage, PackageState.PENDING))
    return tuple(links)


def _finish_replaced(c: _Ctx, d: _Draft, entry: PackageEntry, pod: PodSummary) -> None:
    """A chained pod replaced because what it runs changed: what it completed so far is recorded
    (the chained runs ran on the host), and the run it was in continues at that stage as a fresh
    attempt series (`respec`), in a pod of the new spec."""
    current = _advance_run(c, d, entry, pod.progress, completed_stages(pod))
    if current is None:
        return
    if current.state is not PackageState.COMPLETE:
        _put(c, d, _respec(c, current))
        return
    for run in pod.chain:
        fresh = _chained_entry(c, d, run)
        if fresh is None:
            return
        started = _continued_in(c, run.progress, fresh)
        done = run_completed_stages(run.progress, run.stages, succeeded=False)
        reached = _advance_run(c, d, started, run.progress, done)
        if reached is None or reached.state is PackageState.COMPLETE:
            continue
        # The kubelet runs init containers in order: the runs after this one have not started.
        _put(c, d, _respec(c, reached))
        return


def _continued_in(c: _Ctx, progress: tuple[StageProgress, ...], entry: PackageEntry) -> PackageEntry:
    """`entry` at a later stage of a pod: the pod went on into it, which was its first attempt there
    (started when the stage's first container did, if the kubelet said)."""
    part = next((p for p in progress if p.stage is entry.stage), None)
    began = part.started if part is not None and part.started is not None else c.now
    return replace(entry, state=PackageState.IN_PROGRESS, attempts=1, started=ts(began))


def _complete_stage(c: _Ctx, d: _Draft, entry: PackageEntry, *, run_attempts: int = 0) -> PackageEntry | None:
    """Record `entry`'s current stage as succeeded; returns the entry after it (None: removed).

    `run_attempts`: the attempts of the stage the pod that ran this one started at (see
    `advance_run`), kept on the entry if this completes the package."""
    pkg = _package(c.nw, entry.name)
    new = advance(
        entry,
        pkg,
        now=c.now,
        applied_config=config_hashes(pkg.config_map),
        run_attempts=run_attempts,
    )
    if entry.stage == PackageStage.UPGRADE:
        # The upgrade replaced older versions on the host: their entries go (newer ones stay, D2).
        mine = _version_key(entry.version)
        for old in d.state.entries_for(entry.name):
            if old.version != entry.version and _version_key(old.version) < mine:
                d.state = d.state.without(old.name, old.version)
    if entry.stage in (PackageStage.APPLY, PackageStage.UPGRADE):
        # Runs of other versions that never completed were superseded when the spec version changed
        # mid-run (their pods were removed); this version now owns the package on the host.
        for old in d.state.entries_for(entry.name):
            if old.version != entry.version and old.state != PackageState.COMPLETE:
                d.state = d.state.without(old.name, old.version)
    if new is None:
        d.state = d.state.without(entry.name, entry.version)
        d.events.append(Event(EventReason.PACKAGE_UNINSTALLED, f"{entry.name}:{entry.version} uninstalled"))
        return None
    if new.state == PackageState.COMPLETE and (new.drifted or new.repair):
        if new.drifted:
            d.events.append(Event(EventReason.DRIFT_REPAIRED, f"{entry.name}:{entry.version} re-applied"))
        new = replace(new, drifted="", repair=False)
    _put(c, d, new)
    if new.state == PackageState.COMPLETE:
        d.events.append(Event(EventReason.PACKAGE_COMPLETED, f"{entry.name}:{entry.version} complete"))
    return new


def _finish_interrupt(c: _Ctx, d: _Draft, carrier: PackageEntry, skipped: list[PackageEntry]) -> None:
    for e in [carrier, *skipped]:
        if e.name in c.nw.spec.packages:
            _complete_stage(c, d, replace(e, state=PackageState.IN_PROGRESS))
    d.state = replace(d.state, interrupt_at=None)
    d.events.append(
        Event(
            EventReason.INTERRUPT_COMPLETED,
            f"interrupt of {', '.join(sorted(e.name for e in [carrier, *skipped]))} complete",
        )
    )


def _record_failure(c: _Ctx, d: _Draft, entry: PackageEntry, failure: _PodFailure) -> None:
    result = fail_attempt(entry, reason=failure.reason, now=c.now, policy=_policy(c, entry.name))
    _put(c, d, result.entry)
    d.failed.append(
        AttemptFailed(
            pod=failure.pod,
            package=entry.name,
            version=entry.version,
            stage=entry.stage,
            attempt=max(entry.attempts, 1),
            cause=failure.cause,
            message=result.entry.error,
            gave_up=result.gave_up,
        )
    )
    if result.gave_up:
        d.events.append(
            Event(EventReason.PACKAGE_FAILED, f"{entry.name}:{entry.version}: {result.entry.error}")
        )
        if entry.stage in INTERRUPT_STAGES:
            d.state = replace(d.state, interrupt_at=None)
            _fail_covered(c, d, entry, result.entry.error)
    else:
        d.events.append(
            Event(EventReason.PACKAGE_FAILED, f"{entry.name}:{entry.version}: {result.entry.error}")
        )


def _retry_erroring_under_fresh_admission(c: _Ctx, d: _Draft) -> _Draft:
    """An erroring package is retried only under an admission other than the one it gave up under.

    Giving up settles the node (once nothing else runs) and consumes its admission (see `finish`),
    and every erroring entry records the admission it gave up under (`failed_under`). So the
    controller hands the planner an admission only when the rollout picked the node again — a later
    spec (fingerprint) or a targeted retry — and then every erroring entry that gave up under another
    admission (or under none) starts a fresh series of attempts; an entry that gave up under this
    very admission does not. Without an admission nothing restarts, whatever changed in the spec:
    retries go through batches and budgets like any other start of work (invariants I1, I2).
    """
    admission = d.state.admission
    if admission is None:
        return d
    current = admission_key(admission)
    for entry in list(d.state.packages):
        if entry.state != PackageState.ERRORING or not _in_spec(c, entry):
            continue
        if entry.failed_under == current:
            continue
        _put(
            c,
            d,
            replace(
                entry,
                state=PackageState.PENDING,
                attempts=0,
                spec_hash="",
                error="",
                retry_at=None,
                pull_error_since=None,
                failed_under="",
                updated=ts(c.now),
            ),
        )
        retrying = f"{entry.name}:{entry.version} {entry.stage.value}: retrying (admitted again)"
        d.events.append(Event(EventReason.PACKAGE_RETRIED, retrying))
    return d


def _suspend_cut_short_runs(c: _Ctx, d: _Draft) -> _Draft:
    """A run in flight of a version the spec no longer holds is suspended (A -> B: B cut A's run short,
    `_observe` removed its pod).

    Its entry stays in the state (the host may hold part of that version, and the run resumes from its
    stage), but it no longer continues by itself when the spec comes back to that version
    (A -> B -> A, an undo): the node controller continues a run of the current spec without admission
    only while it ran on, counted against the ceiling by every rollout since it started. Once cut
    short, the nodes winding down B's runs hold the slots of A's new rollout; resuming without an
    admission then puts the node past the ceiling. So it resumes only when that rollout admits the
    node again (`_resume_under_fresh_admission`), in batch order, within the budget.
    """
    for entry in list(d.state.packages):
        if entry.suspended or entry.state not in ACTIVE_STATES or _version_in_spec(c.nw, entry):
            continue
        _put(c, d, replace(entry, suspended=True, updated=ts(c.now)))
    return d


def _resume_under_fresh_admission(c: _Ctx, d: _Draft) -> _Draft:
    """A suspended run of a version the spec holds again resumes under an admission (where it was:
    its stage, its attempt, its interrupt), and waits for one without (`_suspend_cut_short_runs`)."""
    resumable = [e for e in d.state.packages if e.suspended and _version_in_spec(c.nw, e)]
    if not resumable:
        return d
    if d.state.admission is None:
        names = ", ".join(f"{e.name}:{e.version} {e.stage.value}" for e in resumable)
        _hold(c, d, Hold.NOT_ADMITTED, f"waiting for the rollout to admit this node (to resume {names})")
        return d
    for entry in resumable:
        _put(c, d, replace(entry, suspended=False, updated=ts(c.now)))
    return d


def _stamp_failures(c: _Ctx, d: _Draft) -> _Draft:
    """Every entry that became erroring in this plan records the admission it gave up under."""
    old = c.inp.state or NodeState()
    under = admission_key(old.admission) if old.admission is not None else ""
    for entry in list(d.state.packages):
        if entry.state != PackageState.ERRORING or entry.failed_under == under:
            continue
        before = old.entry(entry.name, entry.version)
        if before is None or before.state != PackageState.ERRORING:
            _put(c, d, replace(entry, failed_under=under))
    return d


def _fail_covered(c: _Ctx, d: _Draft, carrier: PackageEntry, message: str) -> None:
    """The packages whose interrupt the failed carrier's pod was to perform fail with it."""
    for other in d.state.packages:
        if other.key != carrier.key and other.state == PackageState.SKIPPED and _in_spec(c, other):
            _put(
                c,
                d,
                replace(
                    other,
                    state=PackageState.ERRORING,
                    error=truncate_error(f"interrupt carried by {carrier.name} failed: {message}"),
                    updated=ts(c.now),
                ),
            )


def _cancel_uninstalls(c: _Ctx, d: _Draft) -> _Draft:
    for name, pkg in sorted(c.nw.spec.packages.items()):
        if _uninstall_requested(pkg):
            continue
        for entry in d.state.entries_for(name):
            if entry.stage != PackageStage.UNINSTALL or entry.state == PackageState.COMPLETE:
                continue
            if (
                entry.state == PackageState.PENDING
                and entry.attempts == 0
                and entry.started is None
                and not entry.error
            ):
                # Nothing ran yet: the package is still installed as it was. (`started` survives a
                # pod replaced for a spec change, which resets `attempts`: that pod may have run.)
                last = PackageStage.POST_INTERRUPT if pkg.interrupt else PackageStage.CONFIG
                _put(c, d, replace(entry, stage=last, state=PackageState.COMPLETE, updated=ts(c.now)))
            else:
                # The uninstall pod may have removed files already: reinstall from apply, once that
                # pod is gone (it is stopped now; `create` waits for it).
                for pod in c.inp.pods:
                    if pod.package == name and pod.stage in UNINSTALL_STAGES:
                        _delete(c, d, pod, "uninstall cancelled")
                _put(
                    c,
                    d,
                    replace(
                        entry,
                        stage=PackageStage.APPLY,
                        state=PackageState.PENDING,
                        attempts=0,
                        spec_hash="",
                        error="",
                        retry_at=None,
                        updated=ts(c.now),
                    ),
                )
            d.events.append(
                Event(EventReason.UNINSTALL_CANCELLED, f"uninstall of {name}:{entry.version} cancelled")
            )
    return d


def _new_runs(c: _Ctx, d: _Draft, *, report: bool = True) -> list[PackageEntry]:
    """Entries for work that would START now (not yet in state): fresh install, upgrade, config
    change, uninstall; materialised only if the start gates allow it. With `report`, the runs it cannot
    start are said in `blocked` (once per plan: `_chain_for` asks without)."""
    runs: list[PackageEntry] = []
    for name, pkg in sorted(c.nw.spec.packages.items()):
        entries = d.state.entries_for(name)
        if any(
            e.state in ACTIVE_STATES or e.state == PackageState.ERRORING for e in entries if _in_spec(c, e)
        ):
            continue  # a run is already in flight (or failed) for this package
        run = _new_run(c.nw, d.state, name, pkg)
        if isinstance(run, PackageEntry):
            runs.append(run)
        elif run is not None and report:
            d.blocked.append(run)
    return runs


def _node_block_reason(c: _Ctx) -> str | None:
    if c.node.labels.get(constants.LABEL_IGNORE) == "true":
        return f"node carries {constants.LABEL_IGNORE}=true"
    bad = untolerated_taints(c.nw, c.node, runtime_taint_key=c.opts.pod.runtime_required_taint_key)
    if bad:
        text = ", ".join(f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}" for t in bad)
        return f"taint(s) not tolerated: {text}"
    return None


def _pod_running(c: _Ctx, d: _Draft) -> bool:
    """A pod of this NodeWright stays on the node (not being removed), or is being removed but may
    still be running its work (terminating)."""
    for pod in c.inp.pods:
        leaving = pod.terminating or pod.name in d.deletes
        if not leaving or _may_run(pod, deleting=True):
            return True
    return False


def _drift_check_running(c: _Ctx) -> str | None:
    """A drift-check pod of this NodeWright on the node: no stage pod starts while one exists there
    (and no check starts next to a stage pod, see `drift_checks`). Whatever its phase: running,
    Pending, looking finished while the kubelet starts it again after a reboot, or ended and
    already read -- until it is gone, as a stage pod waits for its predecessor (`blocking_pod`).
    Waiting for the deletion of an ended check costs a moment; a check running next to a stage
    pod would read a host being changed."""
    pods = c.inp.drift.pods if c.inp.drift is not None else ()
    return pods[0].name if pods else None


def _blocking_pod(c: _Ctx, d: _Draft, package: str, *, name: str) -> PodSummary | None:
    """Another pod of `package` whose work may still run on the node: no second pod of a package
    is created until it is gone (an uninstall and a reinstall, or two attempts, never overlap)."""
    for pod in c.inp.pods:
        if package in pod.packages() and pod.name != name and _may_run(pod, deleting=pod.name in d.deletes):
            return pod
    return None


def _node_gate(c: _Ctx, d: _Draft, *, for_interrupt: bool) -> bool:
    """Cordon -> protected pods -> drain. True when the node is ready for interrupt-bearing work."""
    if d.node_gate_ok:
        return True
    if d.skipped_now:
        return False
    if not c.node.unschedulable:
        _cordon(c, d)
        return False
    facts = c.inp.drain
    if facts is None:
        d.needs_drain = True
        # Before a drain the node is reported draining already (its pods are listed next).
        kind = Hold.CHECK_PODS if for_interrupt else Hold.DRAIN
        _hold(
            c, d, kind, "checking workload pods before " + ("the interrupt" if for_interrupt else "draining")
        )
        return False
    if facts.selection.protected and _protected_pods_hold(c, d, facts):
        return False
    if not facts.selection.drained:
        _drain(c, d, facts, for_interrupt=for_interrupt)
        return False
    d.node_gate_ok = True
    return True


def _cordon(c: _Ctx, d: _Draft) -> None:
    if not d.cordon_requested:
        d.cordon_requested = True
        d.actions.append(Cordon())
        d.state = replace(d.state, cordoned=True)
        d.events.append(Event(EventReason.NODE_CORDONED, "cordoning node before interrupt-bearing work"))
    _hold(c, d, Hold.CORDON, "cordoning the node")
    _requeue(c, d, c.opts.poll_interval, "waiting for the cordon to be observed")


def _protected_pods_hold(c: _Ctx, d: _Draft, facts: DrainFacts) -> bool:
    """Protected pods run: wait for them (True), or -- `interruptWait.timeout` passed -- fail the runs
    (`action: fail`, True) or go on (False)."""
    protected = facts.selection.protected
    wait_cfg = c.nw.spec.interrupt_wait
    timeout_text = wait_cfg.timeout if wait_cfg is not None else None
    expired = False
    if timeout_text and facts.protected_since is not None:
        limit = podspec.parse_duration_seconds(timeout_text)
        expired = c.now >= facts.protected_since + timedelta(seconds=limit)
    if expired and getattr(wait_cfg, "action", "fail") != "fail":
        return False
    if expired:
        _fail_active(c, d, f"protected pods still running after {timeout_text}: {', '.join(protected[:5])}")
        return True
    d.actions.append(WaitForProtectedPods(protected))
    _hold(c, d, Hold.PROTECTED_PODS, f"waiting for protected pods: {', '.join(protected[:5])}")
    _requeue(c, d, c.opts.poll_interval, "protected pods")
    return True


def _drain(c: _Ctx, d: _Draft, facts: DrainFacts, *, for_interrupt: bool) -> None:
    """Evict what is left (force it after the timeout under `force`), or -- `skip` after the timeout,
    nothing of the runs executed yet -- release the node."""
    sel = facts.selection
    drain_cfg = c.nw.spec.drain
    policy = str(getattr(drain_cfg, "policy", "wait"))
    timeout_text = getattr(drain_cfg, "timeout", None)
    expired = bool(
        timeout_text
        and facts.draining_since is not None
        and c.now >= facts.draining_since + timedelta(seconds=podspec.parse_duration_seconds(timeout_text))
    )
    blocked = (
        f" (eviction blocked: {'; '.join(facts.eviction_blocked[:3])})" if facts.eviction_blocked else ""
    )
    pods = (*sel.evict, *sel.terminating)
    left = len(pods)
    if (
        expired
        and policy == "skip"
        and not for_interrupt
        and _skip_drain(
            c,
            d,
            f"drain timed out after {timeout_text} (policy skip): {left} pod(s) left"
            f" ({', '.join(pods[:5])}){blocked}; released, retried when the rollout admits the node again",
        )
    ):
        return
    if sel.evict:
        d.actions.append(Drain(sel.evict, force=expired and policy == "force"))
    late = f"drain timeout {timeout_text} exceeded (policy {policy}); " if expired else ""
    d.drain_overdue = d.drain_overdue or (expired and policy != "force")
    d.eviction_blocked = d.eviction_blocked or bool(facts.eviction_blocked)
    named = ", ".join(pods[:5]) + (f" and {len(pods) - 5} more" if len(pods) > 5 else "")
    _hold(c, d, Hold.DRAIN, f"draining: {late}{left} pod(s) left ({named}){blocked}")
    _requeue(c, d, c.opts.poll_interval, "drain")


def _run_heads(c: _Ctx, d: _Draft) -> list[PackageEntry]:
    """Interrupt-bearing runs recorded as started (to own the cordon) whose first pod never ran."""
    return [
        e
        for e in d.state.packages
        if _in_spec(c, e)
        and e.state == PackageState.PENDING
        and e.attempts == 0
        and e.started is None
        and not e.error
        and (
            e.stage in (PackageStage.APPLY, PackageStage.UPGRADE, PackageStage.UNINSTALL)
            or (e.stage == PackageStage.CONFIG and bool(e.changed))
        )
        and _stage_interrupt(c, e) is not None
    ]


def _skip_drain(c: _Ctx, d: _Draft, message: str) -> bool:
    """drain.policy skip after the timeout: give the node back (uncordon if we cordoned it, runs not
    started are undone) and report it `blocked`, so the rollout releases it and moves on. Only
    possible while nothing of the interrupt-bearing runs has executed on the node; otherwise False
    (the caller keeps draining, like `wait`: a node is never left half-done)."""
    heads = _run_heads(c, d)
    busy = [
        e
        for e in d.state.packages
        if _in_spec(c, e) and e.state in ACTIVE_STATES and e not in heads and _stage_interrupt(c, e)
    ]
    if busy or not heads:
        return False
    for e in heads:
        pkg = _package(c.nw, e.name)
        if e.stage in (PackageStage.APPLY, PackageStage.UPGRADE):
            d.state = d.state.without(e.name, e.version)  # never ran: as if never started
        elif e.stage == PackageStage.CONFIG:
            _put(c, d, replace(e, state=PackageState.COMPLETE, changed=(), updated=ts(c.now)))
        else:  # uninstall not started: still installed as it was
            last = PackageStage.POST_INTERRUPT if pkg.interrupt else PackageStage.CONFIG
            _put(c, d, replace(e, stage=last, state=PackageState.COMPLETE, updated=ts(c.now)))
    if d.state.cordoned:
        d.actions.append(Uncordon())
        d.state = replace(d.state, cordoned=False)
    d.skip = DrainSkip(at=c.now, message=message)
    d.skipped_now = True
    d.skip_blocked = message
    d.events.append(Event(EventReason.NODE_DRAIN_TIMEOUT, message))
    return True


def _drain_skip_holds(c: _Ctx, d: _Draft) -> bool:
    """A drain was skipped and the rollout has not admitted the node again since: stay released."""
    if d.skipped_now:
        return True
    if d.skip is None:
        return False
    admission = d.state.admission
    if admission is not None and parse_ts(admission.at) > d.skip.at:
        d.skip = None  # admitted again: try afresh (the controller starts a new drain timer)
        return False
    d.skip_blocked = d.skip.message
    return True


def _fail_active(c: _Ctx, d: _Draft, message: str) -> None:
    for entry in d.state.packages:
        if entry.state in (PackageState.PENDING, PackageState.IN_PROGRESS) and _in_spec(c, entry):
            _put(c, d, replace(entry, state=PackageState.ERRORING, error=message, updated=ts(c.now)))
    d.events.append(Event(EventReason.PROTECTED_PODS_TIMEOUT, message))


def _create(
    c: _Ctx,
    d: _Draft,
    entry: PackageEntry,
    *,
    attempt: int,
    interrupt: Interrupt | None = None,
    covers: tuple[str, ...] = (),
    new_run: bool = False,
) -> PackageEntry:
    pkg = _package(c.nw, entry.name)
    chain = () if entry.stage in INTERRUPT_STAGES else _chain_for(c, d, entry)
    run = _interrupt_run(c, d, attempt) if entry.stage in INTERRUPT_STAGES else ""
    s_hash = _desired_hash(c, entry, interrupt, chain, run)
    name = podspec.pod_name(
        c.nw.metadata.name, entry.name, entry.version, entry.stage, c.node.name, attempt, s_hash
    )
    blocker = next(
        (pod for e in (entry, *chain) if (pod := _blocking_pod(c, d, e.name, name=name)) is not None), None
    )
    checking = _drift_check_running(c)
    if blocker is not None or checking is not None:
        running = blocker.name if blocker is not None else checking
        _hold(c, d, Hold.POD_RUNNING, f"{entry.name}: waiting for pod {running} to finish")
        _requeue(c, d, c.opts.poll_interval, f"pod {running} still running")
        return entry
    image = (
        ""
        if entry.stage in INTERRUPT_STAGES
        else podspec.image_reference(pkg.image, entry.version, pkg.container_sha)
    )
    d.creates.append(
        CreatePod(
            package=entry.name,
            version=entry.version,
            stage=entry.stage,
            attempt=attempt,
            name=name,
            spec_hash=s_hash,
            node_order=_node_order(c, d),
            interrupt=interrupt,
            covers=covers,
            repair=entry.repair and entry.stage not in INTERRUPT_STAGES,
            chain=tuple((e.name, e.version, e.stage) for e in chain),
            run=run,
        )
    )
    new = start_attempt(entry, attempt=attempt, spec_hash=s_hash, image=image, now=c.now)
    _put(c, d, new)
    if new_run or attempt != entry.attempts:
        d.events.append(_started_event(entry, chain, attempt=None if new_run else attempt))
    return new


def _started_event(entry: PackageEntry, chain: tuple[PackageEntry, ...], *, attempt: int | None) -> Event:
    """The Event names every stage the pod runs ("apply, config"): one pod per transition, and the
    chained runs after it; a retry's pod says which attempt it is."""
    stages = ", ".join(s.value for s in pod_stages(entry.stage))
    for e in chain:
        stages += f"; then {e.name}:{e.version} " + ", ".join(s.value for s in pod_stages(e.stage))
    suffix = f" attempt {attempt}" if attempt is not None else ""
    return Event(EventReason.PACKAGE_STARTED, f"{entry.name}:{entry.version} {stages}{suffix}")


def _startable(c: _Ctx, d: _Draft, entry: PackageEntry) -> int | None:
    """The attempt number to create for an in-spec entry, or None if it must not start now."""
    if entry.state == PackageState.PENDING:
        return max(entry.attempts, 0) + 1
    if entry.state != PackageState.IN_PROGRESS:
        return None
    if any(
        p.package == entry.name
        and p.version == entry.version
        and p.stage == entry.stage
        and p.attempt == entry.attempts
        and p.name not in d.deletes
        for p in c.inp.pods
    ):
        return None  # its pod is alive
    if entry.retry_at is not None:
        at = parse_ts(entry.retry_at)
        if c.now < at:
            _requeue(c, d, seconds_until(at, c.now), f"retry of {entry.name}")
            return None
        return entry.attempts + 1
    if entry.spec_hash and any(
        p.name in d.deletes and p.package == entry.name and p.stage == entry.stage for p in c.inp.pods
    ):
        return None  # just finished (e.g. reboot issued); do not recreate in the same plan
    return max(entry.attempts, 1)  # the pod was lost (e.g. garbage-collected across a reboot): recreate


def _start(c: _Ctx, d: _Draft) -> _Draft:
    paused, block = is_paused(c.nw), _node_block_reason(c)
    if paused:
        _hold(c, d, Hold.PAUSED, "NodeWright is paused")
        return d
    if block:
        return d
    if not c.node.ready:
        _hold(c, d, Hold.NOT_READY, "node is not Ready")
        return d
    carrier, skipped = _interrupt_group(c, d)
    if carrier is not None:
        _continue_interrupt(c, d, carrier, skipped)
        return d  # nothing else runs during an interrupt
    in_flight = [e for e in d.state.packages if _in_spec(c, e) and e.state in ACTIVE_STATES]
    pending_interrupts = [
        e for e in in_flight if e.stage in INTERRUPT_STAGES and e.state == PackageState.PENDING
    ]
    # Continue started runs (pre-interrupt and post-interrupt stages).
    for entry in sorted(in_flight, key=lambda e: e.key):
        if entry.stage in INTERRUPT_STAGES:
            continue
        attempt = _startable(c, d, entry)
        if attempt is None:
            continue
        gated = entry.stage in PRE_INTERRUPT_STAGES and _stage_interrupt(c, entry) is not None
        if gated and not _node_gate(c, d, for_interrupt=False):
            continue
        _create(c, d, entry, attempt=attempt)
    if pending_interrupts:
        _start_interrupt(c, d, in_flight, pending_interrupts)
        return d
    _start_new_runs(c, d, in_flight)
    return d


def _continue_interrupt(c: _Ctx, d: _Draft, carrier: PackageEntry, skipped: list[PackageEntry]) -> None:
    """The node's interrupt is in flight: its pod again when it was lost (the same attempt, the same
    identity) or after a failed attempt (a new attempt: a new identity and reboot deadline)."""
    attempt = _startable(c, d, carrier) if _in_spec(c, carrier) else None
    if attempt is None or not _node_gate(c, d, for_interrupt=True):
        return
    merged = _merged_interrupt(c, carrier, skipped)
    if merged is None:
        return
    if attempt > carrier.attempts:
        # A retry is a new interrupt: a new identity on the host (the agent's flags for the last
        # attempt may say it ran) and its own reboot deadline.
        d.state = replace(d.state, boot_id=c.node.boot_id or None, interrupt_at=ts(c.now))
    _create(c, d, carrier, attempt=attempt, interrupt=merged, covers=tuple(e.name for e in skipped))


def _start_interrupt(c: _Ctx, d: _Draft, in_flight: list[PackageEntry], pending: list[PackageEntry]) -> None:
    """Start the merged interrupt once nothing else that could join it, or be killed by it, runs."""
    # A package that became startable while these waited (its dependency's failed stage was retried
    # meanwhile) would otherwise apply after the reboot and need one of its own: start it first, and
    # the interrupt waits for it like for any other holdout.
    _start_new_runs(c, d, in_flight)
    holdouts = [
        e
        for e in d.state.packages
        if _in_spec(c, e) and e.state in ACTIVE_STATES and e.stage not in INTERRUPT_STAGES
    ]
    if holdouts or d.creates or _pod_running(c, d):
        names = sorted({e.name for e in holdouts})
        _hold(
            c,
            d,
            Hold.INTERRUPT_WAITS,
            "interrupt waits for " + (", ".join(names) if names else "running pods"),
        )
        return
    checking = _drift_check_running(c)
    if checking is not None:
        # Before anything is recorded: the merge below is decided when the pod is created.
        _hold(c, d, Hold.INTERRUPT_WAITS, f"interrupt waits for drift check {checking} to finish")
        _requeue(c, d, c.opts.poll_interval, f"pod {checking} still running")
        return
    if not _node_gate(c, d, for_interrupt=True):
        return
    candidates = {e.name: i for e in pending if (i := _stage_interrupt(c, e)) is not None}
    group = merge_for_node(candidates)
    if group is None:
        return
    for e in pending:
        if e.name != group.carrier:
            _put(c, d, replace(e, state=PackageState.SKIPPED, updated=ts(c.now)))
    carrier_entry = next(e for e in pending if e.name == group.carrier)
    d.state = replace(d.state, boot_id=c.node.boot_id or None, interrupt_at=ts(c.now))
    _create(c, d, carrier_entry, attempt=1, interrupt=group.interrupt, covers=group.skipped)
    d.events.append(
        Event(
            EventReason.INTERRUPT_STARTED,
            f"{group.interrupt.type.value} for {', '.join(sorted(candidates))}",
        )
    )


def _start_new_runs(c: _Ctx, d: _Draft, in_flight: list[PackageEntry]) -> None:
    runs = _new_runs(c, d)
    if not runs:
        return
    if _drain_skip_holds(c, d):
        return
    if d.state.admission is None:
        _hold(c, d, Hold.NOT_ADMITTED, "waiting for the rollout to admit this node")
        return
    if c.inp.sequencing_blocker:
        _hold(c, d, Hold.SEQUENCING, f"waiting for {c.inp.sequencing_blocker}")
        return
    graph = Graph.build({n: (p.depends_on or {}).keys() for n, p in c.nw.spec.packages.items()})
    cycle = graph.find_cycle()
    if cycle:
        d.blocked.append("dependency cycle: " + " -> ".join(cycle))
        return
    complete = frozenset(
        n
        for n, p in c.nw.spec.packages.items()
        if not _uninstall_requested(p) and package_complete(d.state, n, p)
    )
    flying = bool(in_flight)
    started = 0
    for r in runs:
        if c.nw.spec.serial and (flying or started):
            break  # serial: one package active on the node at a time
        if r.stage in (PackageStage.APPLY, PackageStage.UPGRADE) and not graph.ready(r.name, complete):
            # A real frontier: only this package's own dependencies matter.
            deps = [d for d in graph.deps[r.name] if d not in complete]
            missing = [d for d in deps if d not in c.nw.spec.packages]
            gone = [
                d for d in deps if d in c.nw.spec.packages and _uninstall_requested(c.nw.spec.packages[d])
            ]
            if missing:
                d.blocked.append(f"{r.name}: depends on unknown package(s) {', '.join(missing)}")
            elif gone:
                d.blocked.append(
                    f"{r.name}: dependency {', '.join(gone)} is being uninstalled (DependencyUninstalled)"
                )
            continue
        if _stage_interrupt(c, r) is not None and not _node_gate(c, d, for_interrupt=False):
            # Record the run as started: the cordon is owned by work in flight, which then continues
            # without needing admission again.
            if d.cordon_requested or c.node.unschedulable:
                _put(c, d, replace(r, updated=ts(c.now)))
                started += 1
            continue
        _create(c, d, r, attempt=1, new_run=True)
        started += 1


def _finish(c: _Ctx, d: _Draft) -> NodePlan:
    """Completion (drift checks first), the withdrawn node's uncordon, then the plan's value."""
    _stamp_failures(c, d)
    old = c.inp.state or NodeState()
    complete = node_complete(c.nw, d.state)
    if complete:
        _drift_checks(c, d, was_complete=node_complete(c.nw, old))
        complete = node_complete(c.nw, d.state)  # a check may have found drift to repair
    if complete:
        _complete(c, d, old)
    elif d.state.cordoned and d.state.admission is None and _idle(c, d):
        # The rollout withdrew the node (e.g. a batch reset) between two runs: nothing is in flight
        # and nothing may start, so the node goes back into service while it waits. It is cordoned
        # again when it is re-admitted.
        d.actions.append(Uncordon())
        d.state = replace(d.state, cordoned=False)
        d.events.append(
            Event(
                EventReason.NODE_UNCORDONED,
                "no work in flight and not admitted: uncordoning while waiting",
            )
        )
    if complete:
        d.skip = None
    status, reason, message = _status(c, d, complete)
    return NodePlan(
        state=d.state,
        status=status,
        condition=_condition(c.nw, status, reason, message),
        actions=_ordered_actions(c, d, complete),
        needs_drain_facts=d.needs_drain,
        state_changed=d.state != old,
        drain_skip=d.skip,
        drain_skipped=d.skipped_now,
        # Settling (complete, or erroring with nothing else running) uses up the admission.
        consume_admission=old.admission is not None
        and (complete or status in (Status.COMPLETE, Status.ERRORING)),
        drift_result=d.drift_result,
        failed=tuple(d.failed),
        drain_blocked=d.eviction_blocked and not complete,
    )


def _complete(c: _Ctx, d: _Draft, old: NodeState) -> None:
    """The NodeWright is complete on the node: uncordon if ours, record the generation, the boot and
    what the node runs; a new completion is an Event."""
    # A generation bump that does not touch this node is not a new completion (no event).
    was_complete = old.generation is not None and node_complete(c.nw, old) and not old.cordoned
    if d.state.cordoned:
        d.actions.append(Uncordon())
    d.state = replace(
        d.state,
        cordoned=False,
        generation=c.nw.metadata.generation,
        admission=None,
        interrupt_at=None,
        boot_id=d.state.boot_id if d.drift_recheck else (c.node.boot_id or d.state.boot_id),
    )
    if c.inp.drift is not None and d.state.kernel is None:
        d.state = replace(d.state, kernel=c.node.kernel or None, os_image=c.node.os_image or None)
    if not was_complete:
        d.events.append(Event(EventReason.NODE_COMPLETE, f"{c.nw.metadata.name} complete on {c.node.name}"))


def _ordered_actions(c: _Ctx, d: _Draft, complete: bool) -> tuple[Action, ...]:
    """Cordons, gate waits and drains, pod deletions, creations and bindings, the drift check, the
    Events, then the one requeue: the order the node controller executes them in."""
    actions: list[Action] = [a for a in d.actions if isinstance(a, (Cordon, Uncordon))]
    actions += [a for a in d.actions if isinstance(a, (WaitForProtectedPods, Drain))]
    deletes: list[DeletePod] = sorted(d.deletes.values(), key=lambda d: d.name)
    actions += deletes
    actions += d.creates
    actions += d.binds
    if d.drift_create is not None:
        actions.append(d.drift_create)
    actions += d.events
    if d.requeues and not complete:
        actions.append(min(d.requeues, key=lambda r: r.seconds))
    elif complete and d.drift_requeue is not None:
        actions.append(d.drift_requeue)
    return tuple(actions)


def _observe_checks(c: _Ctx, d: _Draft) -> _Draft:
    """Read every drift-check pod of this NodeWright on the node that has ended, and remove it --
    whatever the node's state. A check that ends while a run is due or in flight is read now, not
    once the run has completed: read then, it would judge a node it never saw (and start a second
    repair). Its result counts only while the node is still what it was made against
    (`drift.void_reason`: no run of a checked package since it started, the same boot); a void
    check is removed without a verdict (after a reboot nobody asked for, the node stays due:
    `drift_checks`). Check pods that have not ended are left alone until their deadline has
    passed (`_overran`); stage pods wait until every check pod is gone (`drift_check_running`)."""
    facts = c.inp.drift
    if facts is None:
        return d
    for pod in facts.pods:
        if pod.terminating:
            continue
        if _check_running(pod):
            ended = _overran(c, d, pod)
            if ended is None:
                continue
            pod = ended
        void = drift.void_reason(pod.basis, c.nw, d.state, boot_id=c.node.boot_id)
        if void is None:
            _read_drift_check(c, d, pod, drift.check_plan(c.nw, d.state))
            continue
        d.deletes.setdefault(pod.name, DeletePod(pod.name, f"drift check void: {void.value}"))
    return d


def _overran(c: _Ctx, d: _Draft, pod: DriftCheckPod) -> DriftCheckPod | None:
    """A running check pod past `drift.check_expires` (its deadline plus a grace the kubelet has to
    end it): the pod as ended with outcome DEADLINE, to be read as a check `error` and deleted (it
    holds back every stage pod of the node while it exists). None while it has time: the node is
    planned again when it runs out (`check_expires`)."""
    if pod.created is None:
        return None
    expires = drift.check_expires(c.nw, created=pod.created, deadline=pod.deadline)
    if c.now < expires:
        d.check_expires = min(expires, d.check_expires or expires)
        _requeue(c, d, seconds_until(expires, c.now), f"deadline of drift check {pod.name}")
        return None
    limit = human_duration((expires - pod.created).total_seconds())
    message = f"the check pod was still there {limit} after it was created (deadline and grace); deleted"
    d.deletes[pod.name] = DeletePod(pod.name, f"drift check overran its deadline: {message}")
    return replace(pod, outcome=PodOutcome.DEADLINE, message=message)


def _drift_checks(c: _Ctx, d: _Draft, *, was_complete: bool) -> None:
    """Drift detection on a node where this NodeWright is complete (rules in `plan.drift`).

    Ended check pods were read and removed (`observe_checks`). Once they are gone, if the node is
    due (its slot, or a host change no interrupt of ours explains: a reboot that voided a check
    keeps the node due, its bootID is not recorded) and nothing else of this NodeWright runs
    there, a check pod is created when a fleet-wide slot is free. No cordon, no drain, no
    interrupt: the checks are read-only.
    """
    facts = c.inp.drift
    if facts is None:
        return
    checked = drift.check_plan(c.nw, d.state)
    if any(_check_running(pod) for pod in facts.pods):
        _requeue(c, d, c.opts.poll_interval, "drift check running")
        if d.check_expires is not None:  # a hung check ends no pod event: look again at its deadline
            d.drift_requeue = RequeueAfter(
                max(1.0, seconds_until(d.check_expires, c.now)), "drift check deadline"
            )
        return
    old = c.inp.state or NodeState()
    recheck = None
    if was_complete:
        recheck = drift.recheck_reason(
            old, boot_id=c.node.boot_id, kernel=c.node.kernel, os_image=c.node.os_image
        )
    if d.drift_result is None and recheck is not None:
        d.drift_recheck = True  # keep the old bootID until a check has run
    if not checked or d.drift_result is not None or facts.pods or _pod_running(c, d) or d.creates:
        d.drift_requeue = RequeueAfter(max(1.0, facts.seconds_to_next), "next drift check")
        return
    if facts.due or recheck is not None:
        if facts.may_start:
            d.drift_create = CreateDriftCheck(
                slot=facts.slot,
                packages=tuple(name for name, _, _ in checked),
                reason=recheck or "scheduled",
                basis=drift.check_basis(c.nw, d.state, boot_id=c.node.boot_id).encode(),
            )
            _requeue(c, d, c.opts.poll_interval, "drift check started")
            return
        d.drift_requeue = RequeueAfter(drift.DUE_RETRY, "waiting for a free drift-check slot")
        return
    d.drift_requeue = RequeueAfter(max(1.0, facts.seconds_to_next), "next drift check")


def _read_drift_check(
    c: _Ctx, d: _Draft, pod: DriftCheckPod, checked: list[tuple[str, Package, str]]
) -> None:
    if pod.outcome in (PodOutcome.SUCCEEDED, PodOutcome.FAILED):
        outcome = drift.read_outcome(
            checked,
            succeeded=pod.outcome is PodOutcome.SUCCEEDED,
            failed_container=pod.failed_container,
            message=pod.message,
        )
    else:
        outcome = drift.CheckOutcome(drifted={}, clean=frozenset(), error=pod.message or pod.outcome.value)
    before = {e.name: e.drifted for e in drift.drifted_entries(d.state, c.nw)}
    d.state = drift.apply_outcome(d.state, outcome, c.nw)
    if d.state.interrupt_at is None:
        # The host as checked (a bootID recorded at an interrupt's start is that interrupt's).
        d.state = replace(
            d.state,
            boot_id=c.node.boot_id or d.state.boot_id,
            kernel=c.node.kernel or d.state.kernel,
            os_image=c.node.os_image or d.state.os_image,
        )
    d.deletes.setdefault(pod.name, DeletePod(pod.name, f"drift check finished ({outcome.result})"))
    d.drift_result = outcome.result
    for name, reason in outcome.drifted.items():
        if before.get(name) != reason[:500]:
            d.events.append(Event(EventReason.DRIFTED, f"{name}: {reason}"))
    for name in outcome.clean:
        if name in before:
            d.events.append(Event(EventReason.DRIFT_CLEARED, f"{name}: the check passes again"))
    if outcome.error:
        d.events.append(Event(EventReason.DRIFT_CHECK_FAILED, f"drift check did not run: {outcome.error}"))


def _finish_disabled(c: _Ctx, d: _Draft) -> NodePlan:
    """Disabled: start nothing, let what runs finish (observed and recorded), then let go.

    Once no pod of this NodeWright can still be running on the node and no reboot is in flight, a
    cordon this NodeWright holds is released, so a disabled NodeWright never keeps nodes out of
    service (or other NodeWrights waiting on them). Its unfinished runs stay recorded in the state
    and continue, through the gates again (cordon, drain), when it is enabled.
    """
    _stamp_failures(c, d)
    message = "NodeWright is disabled"
    if d.state.cordoned:
        if _pod_running(c, d) or d.state.interrupt_at is not None:
            message += "; the cordon is released once its running pods and interrupt have finished"
        else:
            d.actions.append(Uncordon())
            d.state = replace(d.state, cordoned=False)
            d.events.append(
                Event(EventReason.NODE_UNCORDONED, "NodeWright disabled: nothing running, uncordoning")
            )
    actions: list[Action] = [a for a in d.actions if isinstance(a, Uncordon)]
    deletes: list[DeletePod] = sorted(d.deletes.values(), key=lambda d: d.name)
    actions += deletes
    actions += d.events
    if d.requeues:
        actions.append(min(d.requeues, key=lambda r: r.seconds))
    elif d.state.cordoned:
        actions.append(RequeueAfter(c.opts.poll_interval, "waiting to release the cordon"))
    return NodePlan(
        state=d.state,
        status=Status.DISABLED,
        condition=_condition(c.nw, Status.DISABLED, R.DISABLED, message),
        actions=tuple(actions),
        state_changed=d.state != (c.inp.state or NodeState()),
        drain_skip=d.skip,
        failed=tuple(d.failed),
    )


def _idle(c: _Ctx, d: _Draft) -> bool:
    """Nothing of this NodeWright runs or is due on the node (erroring entries keep the cordon)."""
    mine = [e for e in d.state.packages if _in_spec(c, e)]
    busy = any(e.state in ACTIVE_STATES or e.state == PackageState.ERRORING for e in mine)
    return not busy and not d.creates and not _pod_running(c, d)


def _status(c: _Ctx, d: _Draft, complete: bool) -> tuple[Status, NodeConditionReason, str]:
    drifted = drift.drifted_entries(d.state, c.nw)
    if complete and drifted:
        return Status.DRIFTED, R.DRIFTED, drift.describe(drifted)[:CONDITION_TEXT]
    if complete:
        return Status.COMPLETE, R.COMPLETE, f"all {len(c.nw.spec.packages)} package(s) complete"
    errors = [e for e in d.state.packages if e.state == PackageState.ERRORING and _in_spec(c, e)]
    active = [e for e in d.state.packages if e.state in ACTIVE_STATES and _in_spec(c, e)]
    # An erroring package settles the node only once nothing else of this NodeWright can still run
    # there: until then the node is in progress and keeps its slot of the budget.
    progressing = (
        bool(d.creates)
        or _pod_running(c, d)
        or any(e.state in (PackageState.PENDING, PackageState.IN_PROGRESS) for e in active)
    )
    block = _node_block_reason(c)
    doing = ", ".join(f"{e.name}:{e.version} {e.stage.value} {e.state.value}" for e in active[:5])
    why = "; ".join(dict.fromkeys(text for _, text in d.holds))
    held = {kind for kind, _ in d.holds}
    if is_paused(c.nw):
        return (
            Status.PAUSED,
            R.PAUSED,
            "NodeWright is paused" + (f"; in flight: {doing}" if doing else ""),
        )
    if block:
        return Status.BLOCKED, R.BLOCKED, block
    failures = "; ".join(f"{e.name}:{e.version} {e.stage.value}: {e.error}" for e in errors[:3])
    if errors and not progressing:
        return Status.ERRORING, R.ERRORING, failures
    if errors:
        detail = "; ".join(filter(None, [doing, why]))
        return Status.IN_PROGRESS, R.IN_PROGRESS, f"failed: {failures}; still running: {detail or 'pods'}"
    if d.skip_blocked and not d.state.cordoned:
        return (
            Status.BLOCKED,
            R.DRAIN_TIMEOUT,
            d.skip_blocked + (f"; in flight: {doing}" if doing else ""),
        )
    if active or d.creates or d.state.cordoned:
        reason = R.IN_PROGRESS
        if any(isinstance(a, WaitForProtectedPods) for a in d.actions):
            reason = R.WAITING_FOR_PROTECTED_PODS
        elif Hold.REBOOT in held:
            reason = R.REBOOTING
        elif d.drain_overdue:
            reason = R.DRAIN_TIMEOUT  # the timeout passed; policy wait keeps the node draining
        elif any(isinstance(a, Drain) for a in d.actions) or Hold.DRAIN in held:
            reason = R.DRAINING
        return Status.IN_PROGRESS, reason, (doing or "starting") + (f"; {why}" if why else "")
    if d.blocked:
        return Status.BLOCKED, R.BLOCKED, "; ".join(d.blocked)
    if drifted:
        # Admitted, the repair waits for something on the node (a drift-check pod to go): say what.
        next_step = why if why and d.state.admission is not None else "waiting for the rollout to repair it"
        text = f"{drift.describe(drifted)}; {next_step}"
        return Status.DRIFTED, R.DRIFTED, text[:CONDITION_TEXT]
    return Status.WAITING, R.WAITING, why or "waiting"


_PHASES: tuple[Callable[[_Ctx, _Draft], _Draft], ...] = (
    _reapply_on_reboot,
    _observe,
    _suspend_cut_short_runs,  # after the observation that removed their pods
    _observe_checks,
    _stamp_failures,  # before the retry: what just gave up did so under the current admission
    _retry_erroring_under_fresh_admission,
    _resume_under_fresh_admission,
    _cancel_uninstalls,
    _start,
)
"""The phases of a plan, in order; each takes the draft the one before returned (`plan_node`)."""


def plan_node(inp: NodeInput) -> NodePlan:
    """Decide the next step of `inp.nodewright` on `inp.node`. Pure and deterministic."""
    if inp.now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    c, d = _Ctx(inp), _Draft(state=inp.state or NodeState(), skip=inp.drain_skip)
    if is_disabled(inp.nodewright):
        _suspend_cut_short_runs(c, _observe(c, d))
        return _with_transitions(inp, _finish_disabled(c, d))
    for phase in _PHASES:
        d = phase(c, d)
    return _with_transitions(inp, _finish(c, d))


def _with_transitions(inp: NodeInput, plan: NodePlan) -> NodePlan:
    """The plan with the stage transitions it decided (`plan.transitions`)."""
    moved = stage_transitions(inp.state or NodeState(), plan.state, inp.pods, now=inp.now)
    return replace(plan, transitions=moved) if moved else plan
