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

Reboot interrupts complete when the node's bootID differs from the one recorded at interrupt start and
the node is Ready, independently of the interrupt pod (the reboot kills it); a node that does not come
back within `reboot_timeout` makes the entry `erroring`. Every interrupt attempt has its own identity on
the host (`interrupt_run`: the agent's flags are keyed by it), and a reboot pod that ended while the node
stays Ready with its old bootID for `reboot_grace` did not reboot it: a failed attempt (`await_reboot`).

Drift-check pods (`DriftInput`) are read and removed as soon as they end, whatever the node's state,
and their result counts only on the basis they were made against (`observe_checks`); no stage pod
starts while one exists on the node (`drift_check_running`), so one still there past its deadline is
deleted as a check error (`overran`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal

from nodewright.api import constants, semver
from nodewright.api.models import Interrupt, InterruptType, NodeWright, Package, Status
from nodewright.api.nodestate import (
    Admission,
    NodeState,
    PackageEntry,
    PackageStage,
    PackageState,
    truncate_error,
)
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

# ----------------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    effect: str
    value: str | None = None


@dataclass(frozen=True, slots=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True
    boot_id: str = ""
    kernel: str = ""  # status.nodeInfo.kernelVersion
    os_image: str = ""  # status.nodeInfo.osImage


@dataclass(frozen=True, slots=True)
class DrainFacts:
    """The drain selection of the node's workload pods, plus what the controller observed doing it."""

    selection: DrainSelection
    protected_since: datetime | None = None  # first time protected pods were seen (for interruptWait)
    draining_since: datetime | None = None  # first eviction issued for this interrupt (for drain.timeout)
    eviction_blocked: tuple[str, ...] = ()  # e.g. PDB refusals, for the message


@dataclass(frozen=True, slots=True)
class DrainSkip:
    """The node controller's memory of a drain that timed out under `drain.policy: skip`.

    The node was released (uncordoned if we cordoned it, the run not started) at `at`. It stays
    `blocked` (reason `DrainTimeout`) until the rollout admits it again with an admission newer than
    `at`; then the drain is tried afresh (new timer).
    """

    at: datetime
    message: str


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
    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Normal"


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
    reason: str
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


CONDITION_TEXT = 1000  # characters of a node condition message the planner composes
CHAIN_HEAD_STAGES = frozenset({PackageStage.APPLY, PackageStage.UPGRADE, PackageStage.CONFIG})
"""Stages whose pod may carry chained runs after its own (see `_Planner.chain_for`)."""

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


def _condition(nw: NodeWright, status: Status, reason: str, message: str) -> NodeCondition:
    return NodeCondition(
        type=constants.node_condition_type(nw.metadata.name),
        status="True" if status == Status.COMPLETE else "False",
        reason=reason,
        message=message,
    )


# ----------------------------------------------------------------------------------------------------
# The planner


@dataclass(frozen=True, slots=True)
class _PodFailure:
    """The failure of the pod `pod` as observed (`observe_pod`), on its way to the entry it fails."""

    pod: str
    reason: str
    cause: FailureCause


class _Planner:
    def __init__(self, inp: NodeInput) -> None:
        self.inp = inp
        self.nw = inp.nodewright
        self.node = inp.node
        self.now = inp.now
        self.opts = inp.options
        self.state = inp.state or NodeState()
        self.actions: list[Action] = []
        self.events: list[Event] = []
        self.deletes: dict[str, DeletePod] = {}
        self.creates: list[CreatePod] = []
        self.binds: list[BindPod] = []
        self.failed: list[AttemptFailed] = []  # attempts recorded as failed, from their pods
        self.requeues: list[RequeueAfter] = []
        self.waiting: list[str] = []  # why the node is not progressing (first is the headline)
        self.blocked: list[str] = []  # package-level blocks
        self.needs_drain = False
        self.cordon_requested = False
        self.node_gate_ok = False  # cordoned + no protected pods + drained, this plan
        self.skip: DrainSkip | None = inp.drain_skip  # drain.policy skip memory (see DrainSkip)
        self.skipped_now = False  # this plan released the node after a drain timeout
        self.drain_overdue = False  # drain.timeout passed and the policy keeps the node draining (wait)
        self.skip_blocked: str | None = None  # status message while released for a drain timeout
        self.drift_create: CreateDriftCheck | None = None
        self.drift_requeue: RequeueAfter | None = None
        self.drift_result: str | None = None
        self.drift_recheck = False  # a host change is to be checked: keep the recorded bootID
        self.check_expires: datetime | None = None  # when the running check pod is given up (if any)

    # -- small utilities ------------------------------------------------------------------------

    def policy(self, name: str) -> RetryPolicy:
        return RetryPolicy.for_package(_package(self.nw, name), self.opts.retry)

    def requeue(self, seconds: float, reason: str) -> None:
        self.requeues.append(RequeueAfter(max(1.0, float(seconds)), reason))

    def delete(self, pod: PodSummary, reason: str) -> None:
        self.deletes.setdefault(pod.name, DeletePod(pod.name, reason))

    def put(self, entry: PackageEntry) -> None:
        self.state = self.state.with_entry(entry)

    def node_order(self) -> int:
        return self.state.admission.order if self.state.admission else 0

    def stage_interrupt(self, entry: PackageEntry) -> Interrupt | None:
        return run_interrupt(_package(self.nw, entry.name), entry)

    def desired_hash(
        self,
        entry: PackageEntry,
        interrupt: Interrupt | None = None,
        chain: tuple[PackageEntry, ...] = (),
        run: str = "",
    ) -> str:
        pkg = _package(self.nw, entry.name)
        return podspec.spec_hash(
            self.nw,
            pkg,
            package_name=entry.name,
            version=entry.version,
            stage=entry.stage,
            interrupt=interrupt,
            options=self.opts.pod,
            repair=entry.repair and entry.stage not in INTERRUPT_STAGES,
            chain=self.chain_links(chain),
            run=run,
        )

    def interrupt_run(self, attempt: int) -> str:
        """The identity of this attempt of the node's interrupt on the host (`podspec.resource_id`):
        its start and the attempt. A pod of the same attempt made again (lost before it ran, or run
        again by the kubelet after the reboot) keeps it, so the agent's flag stops a second reboot;
        every other attempt, of this or of any later run (a repair, a retry under a fresh admission),
        has its own, so its interrupt really runs. None recorded (a state from an older operator): the
        generation's identity, as before."""
        at = self.state.interrupt_at
        return podspec.interrupt_run(at, attempt) if at else ""

    def chain_links(self, chain: tuple[PackageEntry, ...]) -> tuple[podspec.ChainLink, ...]:
        return tuple(podspec.ChainLink(e.name, _package(self.nw, e.name), e.version, e.stage) for e in chain)

    def chain_for(self, head: PackageEntry) -> tuple[PackageEntry, ...]:
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
            not self.opts.chain_packages
            or head.repair
            or head.stage not in CHAIN_HEAD_STAGES
            or self.stage_interrupt(head) is not None
        ):
            return ()
        candidates = {
            run.name: run
            for run in self._new_runs(report=False)
            if run.name != head.name
            and run.stage in (PackageStage.APPLY, PackageStage.UPGRADE)
            and not run.repair
            and self.stage_interrupt(run) is None
        }
        members = {head.name}
        chain: list[PackageEntry] = []
        while True:
            following = next(
                (
                    name
                    for name in sorted(candidates)
                    if name not in members
                    and (deps := set(self.nw.spec.packages[name].depends_on or {}))
                    and deps <= members
                ),
                None,
            )
            if following is None:
                return tuple(chain)
            chain.append(candidates[following])
            members.add(following)

    def in_spec(self, entry: PackageEntry) -> bool:
        pkg = self.nw.spec.packages.get(entry.name)
        if pkg is None:
            return False
        if entry.version == pkg.version:
            return True
        # An uninstall of a non-spec version (e.g. before a downgrade) is driven from the spec package.
        return entry.stage in UNINSTALL_STAGES and entry.state != PackageState.COMPLETE

    # -- phase 0: reboot re-apply -------------------------------------------------------------------

    def reapply_on_reboot(self) -> None:
        s = self.state
        if not (self.opts.reapply_on_reboot and s.generation is not None and s.boot_id and self.node.boot_id):
            return
        if s.boot_id == self.node.boot_id or not node_complete(self.nw, s):
            return
        # Immutable OS images lose host changes on reboot: start over, through the rollout planner
        # (admission cleared) so that a fleet-wide power event does not re-apply everywhere at once.
        self.state = NodeState(cordoned=s.cordoned)
        self.events.append(Event("Reboot", "node rebooted; re-applying every package (reapplyOnReboot)"))

    # -- phase 1: observe pods ----------------------------------------------------------------------

    def interrupt_group(self) -> tuple[PackageEntry | None, list[PackageEntry]]:
        # Entries of versions no longer in the spec are inert markers (D2): they never hold the node.
        mine = [e for e in self.state.packages if e.stage in INTERRUPT_STAGES and self.in_spec(e)]
        carrier = next((e for e in mine if e.state == PackageState.IN_PROGRESS), None)
        skipped = [e for e in mine if e.state == PackageState.SKIPPED]
        return carrier, skipped

    def merged_interrupt(self, carrier: PackageEntry, skipped: list[PackageEntry]) -> Interrupt | None:
        found = [
            i
            for e in [carrier, *skipped]
            if e.name in self.nw.spec.packages
            if (i := self.stage_interrupt(e)) is not None
        ]
        return merge_interrupts(found)

    def observe(self) -> None:
        pods_by_key: dict[tuple[str, str, PackageStage], list[PodSummary]] = {}
        for pod in self.inp.pods:
            pods_by_key.setdefault((pod.package, pod.version, pod.stage), []).append(pod)
        carrier, skipped = self.interrupt_group()
        expected: set[str] = set()
        for entry in list(self.state.packages):
            if entry.state != PackageState.IN_PROGRESS or not self.in_spec(entry):
                continue
            pods = pods_by_key.get((entry.name, entry.version, entry.stage), [])
            if entry.stage in INTERRUPT_STAGES:
                want = self.desired_hash(entry, self.merged_interrupt(entry, skipped))
            else:
                # A pod keeps the chain it was built with while its links are still in the spec (their
                # hash says whether what it runs changed): a NodeWright deletion or an uninstall asked
                # for meanwhile never cuts an install short.
                candidate = next((p for p in pods if p.attempt == entry.attempts and p.chain), None)
                kept = self.pod_chain(candidate) if candidate is not None else None
                want = self.desired_hash(entry, chain=self.chain_for(entry) if kept is None else kept)
            current = next(
                (p for p in pods if p.attempt == entry.attempts and p.spec_hash == entry.spec_hash), None
            )
            if current is not None:
                expected.add(current.name)
            if (
                entry.stage in INTERRUPT_STAGES
                and carrier is not None
                and self.reboot_check(entry, skipped, current)
            ):
                continue  # a reboot in flight keeps its pod until the reboot is confirmed
            if current is None:
                if entry.spec_hash and entry.spec_hash != want and entry.stage not in INTERRUPT_STAGES:
                    # The spec changed while no pod runs (lost, or waiting for a retry): start afresh.
                    self.put(self.respec(entry))
                continue  # lost pod or retry pending: handled by the start phase
            if current.spec_hash != want and entry.stage not in INTERRUPT_STAGES:
                # Image/env/resources/config changed: replace the pod with a fresh attempt series.
                self.delete(current, "pod spec changed")
                if current.chain:
                    self.finish_replaced(entry, current)
                else:
                    self.put(self.respec(entry))
                continue
            view = observe_pod(current, entry, now=self.now, policy=self.policy(entry.name))
            if view.observation == Observation.WAIT:
                if not current.bound and not current.terminating:
                    # Created but not placed (an operator restart, or a binding that failed): it has
                    # run nothing and is still the pod this stage wants.
                    self.binds.append(BindPod(current.name))
                if view.pull_error_since != entry.pull_error_since:
                    self.put(replace(entry, pull_error_since=view.pull_error_since))
                if view.recheck_after is not None:
                    self.requeue(view.recheck_after, f"deadline of {current.name}")
                continue
            self.delete(
                current, "attempt finished" if view.observation == Observation.SUCCEEDED else "attempt failed"
            )
            if view.observation == Observation.SUCCEEDED:
                if entry.stage in INTERRUPT_STAGES:
                    if self.is_reboot(entry, skipped):
                        # Exit 0 of a reboot pod only means "reboot issued"; completion is the new bootID.
                        self.requeue(self.opts.poll_interval, "waiting for the node to reboot")
                        continue
                    self.finish_interrupt(entry, skipped)
                else:
                    self.finish_pod(entry, current, failure=None)
                continue
            failure = _PodFailure(current.name, view.reason, view.cause or FailureCause.POD_FAILED)
            if entry.stage in INTERRUPT_STAGES:
                self.record_failure(entry, failure)
            else:
                self.finish_pod(entry, current, failure=failure)
        for pod in self.inp.pods:
            if pod.name not in expected:
                self.delete(pod, "no package stage expects this pod")

    def respec(self, entry: PackageEntry) -> PackageEntry:
        """The entry restarted after its stage's pod spec changed: a fresh attempt series; a config run
        also absorbs the newly changed keys (they decide the config interrupt)."""
        changed = entry.changed
        if entry.stage == PackageStage.CONFIG and changed:
            pkg = _package(self.nw, entry.name)
            changed = tuple(sorted({*changed, *diff(entry.config, config_hashes(pkg.config_map)).keys}))
        return replace(
            entry,
            state=PackageState.PENDING,
            attempts=0,
            spec_hash="",
            retry_at=None,
            pull_error_since=None,
            changed=changed,
            updated=ts(self.now),
        )

    def is_reboot(self, carrier: PackageEntry, skipped: list[PackageEntry]) -> bool:
        merged = self.merged_interrupt(carrier, skipped)
        return merged is not None and merged.type == InterruptType.REBOOT

    def reboot_check(
        self, carrier: PackageEntry, skipped: list[PackageEntry], pod: PodSummary | None
    ) -> bool:
        """Handle a reboot in flight; True when handled (completed or timed out)."""
        if not self.is_reboot(carrier, skipped) or self.state.interrupt_at is None:
            return False
        if self.state.boot_id and self.node.boot_id and self.node.boot_id != self.state.boot_id:
            if not self.node.ready:
                self.waiting.append("node rebooted, waiting for it to become Ready")
                self.requeue(self.opts.poll_interval, "node not Ready after reboot")
                return True
            if pod is not None:
                # A pod from before the reboot may be started again by the kubelet that came back (a
                # real one re-runs the init containers of a pod whose sandbox died), so its last status
                # says nothing: the run goes on to post-interrupt only once the pod is gone.
                if not pod.terminating:
                    self.delete(pod, "reboot completed")
                self.waiting.append("node rebooted, waiting for its interrupt pod to go")
                self.requeue(self.opts.poll_interval, "interrupt pod of a completed reboot not gone")
                return True
            self.events.append(
                Event("NodeRebooted", f"boot id changed; {carrier.name}:{carrier.version} rebooted")
            )
            self.finish_interrupt(carrier, skipped)
            return True
        started = parse_ts(self.state.interrupt_at)
        deadline = started + timedelta(seconds=self.opts.reboot_timeout)
        if self.now >= deadline:
            message = f"node did not return from reboot within {human_duration(self.opts.reboot_timeout)}"
            self.put(replace(carrier, state=PackageState.ERRORING, error=message, updated=ts(self.now)))
            self.state = replace(self.state, interrupt_at=None)
            self.fail_covered(carrier, message)
            self.events.append(
                Event("InterruptFailed", f"{carrier.name}:{carrier.version}: {message}", "Warning")
            )
            if pod is not None:
                self.delete(pod, "reboot timed out")
            return True
        if pod is not None and pod.terminating and carrier.retry_at is not None:
            return True  # its attempt is recorded as failed; the retry waits for the pod to go
        if pod is not None and _ended(pod) and self.node.ready and not pod.terminating:
            return self.await_reboot(carrier, pod, deadline)
        if not self.node.ready or (pod is not None and _ended(pod)):
            # The reboot is under way (or the pod died with it): wait for the new bootID.
            self.waiting.append("waiting for the node to reboot")
            self.requeue(
                min(seconds_until(deadline, self.now), self.opts.poll_interval * 6), "reboot deadline"
            )
            return True
        self.requeue(seconds_until(deadline, self.now), "reboot deadline")
        return False

    def await_reboot(self, carrier: PackageEntry, pod: PodSummary, deadline: datetime) -> bool:
        """The reboot pod ended and the node is still up with its old bootID: the reboot is on its way
        (`reboot` returns at once; the node goes down moments later) -- or it never happened: the agent
        skipped it (its flag for this identity said it had run) or `reboot` failed. Exit 0 says neither.
        A node going down turns NotReady within the node-monitor grace period, so a node still Ready
        with the same bootID `reboot_grace` after the pod ended was not rebooted: that is a failed
        attempt (retried with a new identity, so the agent runs `reboot` again), never a wait for the
        reboot timeout with the node cordoned. Always True (handled)."""
        ended = pod.finished or pod.created
        give_up = ended + timedelta(seconds=self.opts.reboot_grace)
        if self.now < give_up:
            self.waiting.append("waiting for the node to reboot")
            self.requeue(
                min(
                    seconds_until(give_up, self.now),
                    seconds_until(deadline, self.now),
                    self.opts.poll_interval * 6,
                ),
                "waiting for the node to go down",
            )
            return True
        how = "exited 0" if pod.outcome is PodOutcome.SUCCEEDED else f"failed ({pod.message or 'no reason'})"
        reason = (
            f"interrupt pod {pod.name} {how}, but the node did not reboot: still Ready with bootID"
            f" {self.node.boot_id or '?'} {human_duration(self.opts.reboot_grace)} later"
        )
        self.delete(pod, "the node did not reboot")
        self.record_failure(carrier, _PodFailure(pod.name, reason, FailureCause.NO_REBOOT))
        return True

    def finish_pod(self, entry: PackageEntry, pod: PodSummary, *, failure: _PodFailure | None) -> None:
        """A stage pod ended: advance the entry through every stage it completed, in order (one state
        write for all of them), then record the failure, if any, at the stage it failed in; then the
        same for each chained run the pod carried, in order, as long as the runs before it completed.

        The stages done are read from the pod's init container statuses, so a pod of another shape (one
        an older operator built with a single stage) advances exactly as far as it got. A failure in a
        later stage keeps the earlier ones done: the retry pod starts at the stage that failed, as its
        first attempt there.
        """
        current = self.advance_run(entry, pod.progress, completed_stages(pod))
        if current is not None and current.state is PackageState.COMPLETE and pod.chain:
            self.finish_chain(pod, failure=failure)
            return
        if failure is not None and current is not None:
            self.fail_run(entry, current, pod.progress, pod.stages, failure)

    def advance_run(
        self, entry: PackageEntry, progress: tuple[StageProgress, ...], done: tuple[PackageStage, ...]
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
                current = self.continued_in(progress, current)
            current = self.complete_stage(current, run_attempts=entry.attempts)
        return current

    def fail_run(
        self,
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
            current = self.continued_in(progress, current)
        self.record_failure(current, failure)

    def finish_chain(self, pod: PodSummary, *, failure: _PodFailure | None) -> None:
        """The chained runs of a pod whose own run completed: each one's entry starts (its first
        attempt ran in this pod) and advances as far as its containers got; the first that did not
        complete takes the failure, and the runs after it were never started (they start as new runs)."""
        succeeded = pod.outcome is PodOutcome.SUCCEEDED
        for run in pod.chain:
            fresh = self.chained_entry(run)
            if fresh is None:
                return  # its package left the spec: a marker of what ran is kept (`chained_entry`)
            started = self.continued_in(run.progress, fresh)
            done = run_completed_stages(run.progress, run.stages, succeeded=succeeded)
            current = self.advance_run(started, run.progress, done)
            if current is None or current.state is PackageState.COMPLETE:
                continue
            self.put(current)
            if failure is not None:
                self.fail_run(started, current, run.progress, run.stages, failure)
            return

    def chained_entry(self, run: ChainedRun) -> PackageEntry | None:
        """The entry of a chained run that the pod went on into: it ran on the host, so it is recorded
        whatever the spec says now (an entry present means "files of this version may be on the host";
        an uninstall requested meanwhile runs after it). None when its package left the spec: then only
        an inert marker at the run's stage is kept, as for any run of a package no longer in the spec."""
        pkg = self.nw.spec.packages.get(run.package)
        entry = PackageEntry(
            name=run.package,
            version=run.version,
            stage=run.stage,
            state=PackageState.PENDING,
            image=podspec.image_reference(pkg.image, run.version, pkg.container_sha) if pkg else "",
        )
        if pkg is None:
            self.put(self.continued_in(run.progress, entry))
            return None
        return entry

    def pod_chain(self, pod: PodSummary) -> tuple[PackageEntry, ...] | None:
        """The chain a running pod carries, as entries, if every link still names a package of the spec
        at that version (its hash then says whether what it runs changed); None otherwise."""
        links: list[PackageEntry] = []
        for run in pod.chain:
            pkg = self.nw.spec.packages.get(run.package)
            if pkg is None or pkg.version != run.version:
                return None
            links.append(PackageEntry(run.package, run.version, run.stage, PackageState.PENDING))
        return tuple(links)

    def finish_replaced(self, entry: PackageEntry, pod: PodSummary) -> None:
        """A chained pod replaced because what it runs changed: what it completed so far is recorded
        (the chained runs ran on the host), and the run it was in continues at that stage as a fresh
        attempt series (`respec`), in a pod of the new spec."""
        current = self.advance_run(entry, pod.progress, completed_stages(pod))
        if current is None:
            return
        if current.state is not PackageState.COMPLETE:
            self.put(self.respec(current))
            return
        for run in pod.chain:
            fresh = self.chained_entry(run)
            if fresh is None:
                return
            started = self.continued_in(run.progress, fresh)
            done = run_completed_stages(run.progress, run.stages, succeeded=False)
            reached = self.advance_run(started, run.progress, done)
            if reached is None or reached.state is PackageState.COMPLETE:
                continue
            # The kubelet runs init containers in order: the runs after this one have not started.
            self.put(self.respec(reached))
            return

    def continued_in(self, progress: tuple[StageProgress, ...], entry: PackageEntry) -> PackageEntry:
        """`entry` at a later stage of a pod: the pod went on into it, which was its first attempt there
        (started when the stage's first container did, if the kubelet said)."""
        part = next((p for p in progress if p.stage is entry.stage), None)
        began = part.started if part is not None and part.started is not None else self.now
        return replace(entry, state=PackageState.IN_PROGRESS, attempts=1, started=ts(began))

    def complete_stage(self, entry: PackageEntry, *, run_attempts: int = 0) -> PackageEntry | None:
        """Record `entry`'s current stage as succeeded; returns the entry after it (None: removed).

        `run_attempts`: the attempts of the stage the pod that ran this one started at (see
        `advance_run`), kept on the entry if this completes the package."""
        pkg = _package(self.nw, entry.name)
        new = advance(
            entry,
            pkg,
            now=self.now,
            applied_config=config_hashes(pkg.config_map),
            run_attempts=run_attempts,
        )
        if entry.stage == PackageStage.UPGRADE:
            # The upgrade replaced older versions on the host: their entries go (newer ones stay, D2).
            mine = _version_key(entry.version)
            for old in self.state.entries_for(entry.name):
                if old.version != entry.version and _version_key(old.version) < mine:
                    self.state = self.state.without(old.name, old.version)
        if entry.stage in (PackageStage.APPLY, PackageStage.UPGRADE):
            # Runs of other versions that never completed were superseded when the spec version changed
            # mid-run (their pods were removed); this version now owns the package on the host.
            for old in self.state.entries_for(entry.name):
                if old.version != entry.version and old.state != PackageState.COMPLETE:
                    self.state = self.state.without(old.name, old.version)
        if new is None:
            self.state = self.state.without(entry.name, entry.version)
            self.events.append(Event("PackageUninstalled", f"{entry.name}:{entry.version} uninstalled"))
            return None
        if new.state == PackageState.COMPLETE and (new.drifted or new.repair):
            if new.drifted:
                self.events.append(Event("DriftRepaired", f"{entry.name}:{entry.version} re-applied"))
            new = replace(new, drifted="", repair=False)
        self.put(new)
        if new.state == PackageState.COMPLETE:
            self.events.append(Event("PackageComplete", f"{entry.name}:{entry.version} complete"))
        return new

    def finish_interrupt(self, carrier: PackageEntry, skipped: list[PackageEntry]) -> None:
        for e in [carrier, *skipped]:
            if e.name in self.nw.spec.packages:
                self.complete_stage(replace(e, state=PackageState.IN_PROGRESS))
        self.state = replace(self.state, interrupt_at=None)
        self.events.append(
            Event(
                "InterruptComplete",
                f"interrupt of {', '.join(sorted(e.name for e in [carrier, *skipped]))} complete",
            )
        )

    def record_failure(self, entry: PackageEntry, failure: _PodFailure) -> None:
        result = fail_attempt(entry, reason=failure.reason, now=self.now, policy=self.policy(entry.name))
        self.put(result.entry)
        self.failed.append(
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
            self.events.append(
                Event("PackageFailed", f"{entry.name}:{entry.version}: {result.entry.error}", "Warning")
            )
            if entry.stage in INTERRUPT_STAGES:
                self.state = replace(self.state, interrupt_at=None)
                self.fail_covered(entry, result.entry.error)
        else:
            self.events.append(
                Event("PackageRetry", f"{entry.name}:{entry.version}: {result.entry.error}", "Warning")
            )

    # -- phase 2: decide runs -------------------------------------------------------------------------

    def retry_erroring_under_fresh_admission(self) -> None:
        """An erroring package is retried only under an admission other than the one it gave up under.

        Giving up settles the node (once nothing else runs) and consumes its admission (see `finish`),
        and every erroring entry records the admission it gave up under (`failed_under`). So the
        controller hands the planner an admission only when the rollout picked the node again — a later
        spec (fingerprint) or a targeted retry — and then every erroring entry that gave up under another
        admission (or under none) starts a fresh series of attempts; an entry that gave up under this
        very admission does not. Without an admission nothing restarts, whatever changed in the spec:
        retries go through batches and budgets like any other start of work (invariants I1, I2).
        """
        admission = self.state.admission
        if admission is None:
            return
        current = admission_key(admission)
        for entry in list(self.state.packages):
            if entry.state != PackageState.ERRORING or not self.in_spec(entry):
                continue
            if entry.failed_under == current:
                continue
            self.put(
                replace(
                    entry,
                    state=PackageState.PENDING,
                    attempts=0,
                    spec_hash="",
                    error="",
                    retry_at=None,
                    pull_error_since=None,
                    failed_under="",
                    updated=ts(self.now),
                )
            )
            retrying = f"{entry.name}:{entry.version} {entry.stage.value}: retrying (admitted again)"
            self.events.append(Event("PackageRetry", retrying))

    def stamp_failures(self) -> None:
        """Every entry that became erroring in this plan records the admission it gave up under."""
        old = self.inp.state or NodeState()
        under = admission_key(old.admission) if old.admission is not None else ""
        for entry in list(self.state.packages):
            if entry.state != PackageState.ERRORING or entry.failed_under == under:
                continue
            before = old.entry(entry.name, entry.version)
            if before is None or before.state != PackageState.ERRORING:
                self.put(replace(entry, failed_under=under))

    def fail_covered(self, carrier: PackageEntry, message: str) -> None:
        """The packages whose interrupt the failed carrier's pod was to perform fail with it."""
        for other in self.state.packages:
            if other.key != carrier.key and other.state == PackageState.SKIPPED and self.in_spec(other):
                self.put(
                    replace(
                        other,
                        state=PackageState.ERRORING,
                        error=truncate_error(f"interrupt carried by {carrier.name} failed: {message}"),
                        updated=ts(self.now),
                    )
                )

    def cancel_uninstalls(self) -> None:
        for name, pkg in sorted(self.nw.spec.packages.items()):
            if _uninstall_requested(pkg):
                continue
            for entry in self.state.entries_for(name):
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
                    self.put(replace(entry, stage=last, state=PackageState.COMPLETE, updated=ts(self.now)))
                else:
                    # The uninstall pod may have removed files already: reinstall from apply, once that
                    # pod is gone (it is stopped now; `create` waits for it).
                    for pod in self.inp.pods:
                        if pod.package == name and pod.stage in UNINSTALL_STAGES:
                            self.delete(pod, "uninstall cancelled")
                    self.put(
                        replace(
                            entry,
                            stage=PackageStage.APPLY,
                            state=PackageState.PENDING,
                            attempts=0,
                            spec_hash="",
                            error="",
                            retry_at=None,
                            updated=ts(self.now),
                        )
                    )
                self.events.append(
                    Event("UninstallCancelled", f"uninstall of {name}:{entry.version} cancelled")
                )

    def new_runs(self) -> list[PackageEntry]:
        """Entries for work that would START now (not yet in state): fresh install, upgrade, config
        change, uninstall. Materialised only if the start gates allow it."""
        return self._new_runs(report=True)

    def _new_runs(self, *, report: bool) -> list[PackageEntry]:
        """`new_runs`; with `report`, the runs it cannot start are said in `blocked` (once per plan:
        `chain_for` asks without)."""
        runs: list[PackageEntry] = []
        for name, pkg in sorted(self.nw.spec.packages.items()):
            entries = self.state.entries_for(name)
            if any(
                e.state in ACTIVE_STATES or e.state == PackageState.ERRORING
                for e in entries
                if self.in_spec(e)
            ):
                continue  # a run is already in flight (or failed) for this package
            if _uninstall_requested(pkg):
                target = _uninstall_target(self.state, name, pkg)
                if target is not None and target.state == PackageState.COMPLETE:
                    runs.append(
                        replace(
                            target,
                            stage=PackageStage.UNINSTALL,
                            state=PackageState.PENDING,
                            attempts=0,
                            started=None,
                            changed=(),
                            error="",
                        )
                    )
                continue
            current = self.state.entry(name, pkg.version)
            desired_cfg = config_hashes(pkg.config_map)
            if current is not None:
                if current.state == PackageState.COMPLETE:
                    change = diff(current.config, desired_cfg)
                    if change:
                        runs.append(
                            replace(
                                current,
                                stage=PackageStage.CONFIG,
                                state=PackageState.PENDING,
                                attempts=0,
                                started=None,
                                changed=change.keys,
                                error="",
                            )
                        )
                    elif current.drifted and drift.reapplies(self.nw, name):
                        # Repair: the whole install again (apply, config, the interrupt if any), with
                        # the agent running steps its flags say already succeeded.
                        runs.append(
                            replace(
                                current,
                                stage=PackageStage.APPLY,
                                state=PackageState.PENDING,
                                attempts=0,
                                started=None,
                                changed=(),
                                error="",
                                repair=True,
                            )
                        )
                continue
            spec_v = _version_key(pkg.version)
            lower = [e for e in entries if _version_key(e.version) < spec_v]
            higher = [e for e in entries if _version_key(e.version) > spec_v]
            if higher and pkg.uninstall is not None and pkg.uninstall.enabled:
                top = max(higher, key=lambda e: _version_key(e.version))
                if not report:
                    continue
                self.blocked.append(
                    f"{name}: downgrade {top.version} -> {pkg.version} requires uninstalling"
                    f" {top.version} first (set uninstall.apply: true)"
                )
                continue
            upgrade = (
                bool(lower)
                and max(lower, key=lambda e: _version_key(e.version)).state == PackageState.COMPLETE
            )
            runs.append(
                PackageEntry(
                    name=name,
                    version=pkg.version,
                    stage=PackageStage.UPGRADE if upgrade and not higher else PackageStage.APPLY,
                    state=PackageState.PENDING,
                )
            )
        return runs

    # -- phase 3: start pods --------------------------------------------------------------------------

    def node_block_reason(self) -> str | None:
        if self.node.labels.get(constants.LABEL_IGNORE) == "true":
            return f"node carries {constants.LABEL_IGNORE}=true"
        bad = untolerated_taints(
            self.nw, self.node, runtime_taint_key=self.opts.pod.runtime_required_taint_key
        )
        if bad:
            text = ", ".join(f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}" for t in bad)
            return f"taint(s) not tolerated: {text}"
        return None

    def pod_running(self) -> bool:
        """A pod of this NodeWright stays on the node (not being removed), or is being removed but may
        still be running its work (terminating)."""
        for pod in self.inp.pods:
            leaving = pod.terminating or pod.name in self.deletes
            if not leaving or _may_run(pod, deleting=True):
                return True
        return False

    def drift_check_running(self) -> str | None:
        """A drift-check pod of this NodeWright on the node: no stage pod starts while one exists there
        (and no check starts next to a stage pod, see `drift_checks`). Whatever its phase: running,
        Pending, looking finished while the kubelet starts it again after a reboot, or ended and
        already read -- until it is gone, as a stage pod waits for its predecessor (`blocking_pod`).
        Waiting for the deletion of an ended check costs a moment; a check running next to a stage
        pod would read a host being changed."""
        pods = self.inp.drift.pods if self.inp.drift is not None else ()
        return pods[0].name if pods else None

    def blocking_pod(self, package: str, *, name: str) -> PodSummary | None:
        """Another pod of `package` whose work may still run on the node: no second pod of a package
        is created until it is gone (an uninstall and a reinstall, or two attempts, never overlap)."""
        for pod in self.inp.pods:
            if (
                package in pod.packages()
                and pod.name != name
                and _may_run(pod, deleting=pod.name in self.deletes)
            ):
                return pod
        return None

    def node_gate(self, *, for_interrupt: bool) -> bool:
        """Cordon -> protected pods -> drain. True when the node is ready for interrupt-bearing work."""
        if self.node_gate_ok:
            return True
        if self.skipped_now:
            return False
        if not self.node.unschedulable:
            if not self.cordon_requested:
                self.cordon_requested = True
                self.actions.append(Cordon())
                self.state = replace(self.state, cordoned=True)
                self.events.append(Event("Cordon", "cordoning node before interrupt-bearing work"))
            self.waiting.append("cordoning the node")
            self.requeue(self.opts.poll_interval, "waiting for the cordon to be observed")
            return False
        facts = self.inp.drain
        if facts is None:
            self.needs_drain = True
            self.waiting.append(
                "checking workload pods before " + ("the interrupt" if for_interrupt else "draining")
            )
            return False
        sel = facts.selection
        if sel.protected:
            wait_cfg = getattr(self.nw.spec, "interrupt_wait", None)
            timeout_text = getattr(wait_cfg, "timeout", None)
            expired = False
            if timeout_text and facts.protected_since is not None:
                limit = podspec.parse_duration_seconds(timeout_text)
                expired = self.now >= facts.protected_since + timedelta(seconds=limit)
            if not expired or getattr(wait_cfg, "action", "fail") == "fail":
                if expired:
                    self.fail_active(
                        f"protected pods still running after {timeout_text}: {', '.join(sel.protected[:5])}"
                    )
                    return False
                self.actions.append(WaitForProtectedPods(sel.protected))
                self.waiting.append(f"waiting for protected pods: {', '.join(sel.protected[:5])}")
                self.requeue(self.opts.poll_interval, "protected pods")
                return False
        if not sel.drained:
            drain_cfg = getattr(self.nw.spec, "drain", None)
            policy = str(getattr(drain_cfg, "policy", "wait"))
            timeout_text = getattr(drain_cfg, "timeout", None)
            expired = bool(
                timeout_text
                and facts.draining_since is not None
                and self.now
                >= facts.draining_since + timedelta(seconds=podspec.parse_duration_seconds(timeout_text))
            )
            blocked = (
                f" (eviction blocked: {'; '.join(facts.eviction_blocked[:3])})"
                if facts.eviction_blocked
                else ""
            )
            left = len(sel.evict) + len(sel.terminating)
            if (
                expired
                and policy == "skip"
                and not for_interrupt
                and self.skip_drain(
                    f"drain timed out after {timeout_text} (policy skip): {left} pod(s) left"
                    f" ({', '.join((*sel.evict, *sel.terminating)[:5])}){blocked};"
                    " released, retried when the rollout admits the node again"
                )
            ):
                return False
            force = expired and policy == "force"
            if sel.evict:
                self.actions.append(Drain(sel.evict, force=force))
            late = f"drain timeout {timeout_text} exceeded (policy {policy}); " if expired else ""
            self.drain_overdue = self.drain_overdue or (expired and policy != "force")
            pods = (*sel.evict, *sel.terminating)
            named = ", ".join(pods[:5]) + (f" and {len(pods) - 5} more" if len(pods) > 5 else "")
            self.waiting.append(f"draining: {late}{left} pod(s) left ({named}){blocked}")
            self.requeue(self.opts.poll_interval, "drain")
            return False
        self.node_gate_ok = True
        return True

    def run_heads(self) -> list[PackageEntry]:
        """Interrupt-bearing runs recorded as started (to own the cordon) whose first pod never ran."""
        return [
            e
            for e in self.state.packages
            if self.in_spec(e)
            and e.state == PackageState.PENDING
            and e.attempts == 0
            and e.started is None
            and not e.error
            and (
                e.stage in (PackageStage.APPLY, PackageStage.UPGRADE, PackageStage.UNINSTALL)
                or (e.stage == PackageStage.CONFIG and bool(e.changed))
            )
            and self.stage_interrupt(e) is not None
        ]

    def skip_drain(self, message: str) -> bool:
        """drain.policy skip after the timeout: give the node back (uncordon if we cordoned it, runs not
        started are undone) and report it `blocked`, so the rollout releases it and moves on. Only
        possible while nothing of the interrupt-bearing runs has executed on the node; otherwise False
        (the caller keeps draining, like `wait`: a node is never left half-done)."""
        heads = self.run_heads()
        busy = [
            e
            for e in self.state.packages
            if self.in_spec(e) and e.state in ACTIVE_STATES and e not in heads and self.stage_interrupt(e)
        ]
        if busy or not heads:
            return False
        for e in heads:
            pkg = _package(self.nw, e.name)
            if e.stage in (PackageStage.APPLY, PackageStage.UPGRADE):
                self.state = self.state.without(e.name, e.version)  # never ran: as if never started
            elif e.stage == PackageStage.CONFIG:
                self.put(replace(e, state=PackageState.COMPLETE, changed=(), updated=ts(self.now)))
            else:  # uninstall not started: still installed as it was
                last = PackageStage.POST_INTERRUPT if pkg.interrupt else PackageStage.CONFIG
                self.put(replace(e, stage=last, state=PackageState.COMPLETE, updated=ts(self.now)))
        if self.state.cordoned:
            self.actions.append(Uncordon())
            self.state = replace(self.state, cordoned=False)
        self.skip = DrainSkip(at=self.now, message=message)
        self.skipped_now = True
        self.skip_blocked = message
        self.events.append(Event("DrainTimeout", message, "Warning"))
        return True

    def drain_skip_holds(self) -> bool:
        """A drain was skipped and the rollout has not admitted the node again since: stay released."""
        if self.skipped_now:
            return True
        if self.skip is None:
            return False
        admission = self.state.admission
        if admission is not None and parse_ts(admission.at) > self.skip.at:
            self.skip = None  # admitted again: try afresh (the controller starts a new drain timer)
            return False
        self.skip_blocked = self.skip.message
        return True

    def fail_active(self, message: str) -> None:
        for entry in self.state.packages:
            if entry.state in (PackageState.PENDING, PackageState.IN_PROGRESS) and self.in_spec(entry):
                self.put(replace(entry, state=PackageState.ERRORING, error=message, updated=ts(self.now)))
        self.events.append(Event("InterruptWaitTimeout", message, "Warning"))

    def create(
        self,
        entry: PackageEntry,
        *,
        attempt: int,
        interrupt: Interrupt | None = None,
        covers: tuple[str, ...] = (),
        new_run: bool = False,
    ) -> PackageEntry:
        pkg = _package(self.nw, entry.name)
        chain = () if entry.stage in INTERRUPT_STAGES else self.chain_for(entry)
        run = self.interrupt_run(attempt) if entry.stage in INTERRUPT_STAGES else ""
        s_hash = self.desired_hash(entry, interrupt, chain, run)
        name = podspec.pod_name(
            self.nw.metadata.name, entry.name, entry.version, entry.stage, self.node.name, attempt, s_hash
        )
        blocker = next(
            (pod for e in (entry, *chain) if (pod := self.blocking_pod(e.name, name=name)) is not None), None
        )
        checking = self.drift_check_running()
        if blocker is not None or checking is not None:
            running = blocker.name if blocker is not None else checking
            self.waiting.append(f"{entry.name}: waiting for pod {running} to finish")
            self.requeue(self.opts.poll_interval, f"pod {running} still running")
            return entry
        image = (
            ""
            if entry.stage in INTERRUPT_STAGES
            else podspec.image_reference(pkg.image, entry.version, pkg.container_sha)
        )
        self.creates.append(
            CreatePod(
                package=entry.name,
                version=entry.version,
                stage=entry.stage,
                attempt=attempt,
                name=name,
                spec_hash=s_hash,
                node_order=self.node_order(),
                interrupt=interrupt,
                covers=covers,
                repair=entry.repair and entry.stage not in INTERRUPT_STAGES,
                chain=tuple((e.name, e.version, e.stage) for e in chain),
                run=run,
            )
        )
        new = start_attempt(entry, attempt=attempt, spec_hash=s_hash, image=image, now=self.now)
        self.put(new)
        # The Event names every stage the pod runs ("apply, config"): one pod per transition, and the
        # chained runs after it.
        stages = ", ".join(s.value for s in pod_stages(entry.stage))
        for e in chain:
            stages += f"; then {e.name}:{e.version} " + ", ".join(s.value for s in pod_stages(e.stage))
        if new_run:
            self.events.append(Event("PackageStarted", f"{entry.name}:{entry.version} {stages}"))
        elif attempt != entry.attempts:
            self.events.append(
                Event("StageStarted", f"{entry.name}:{entry.version} {stages} attempt {attempt}")
            )
        return new

    def startable(self, entry: PackageEntry) -> int | None:
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
            and p.name not in self.deletes
            for p in self.inp.pods
        ):
            return None  # its pod is alive
        if entry.retry_at is not None:
            at = parse_ts(entry.retry_at)
            if self.now < at:
                self.requeue(seconds_until(at, self.now), f"retry of {entry.name}")
                return None
            return entry.attempts + 1
        if entry.spec_hash and any(
            p.name in self.deletes and p.package == entry.name and p.stage == entry.stage
            for p in self.inp.pods
        ):
            return None  # just finished (e.g. reboot issued); do not recreate in the same plan
        return max(entry.attempts, 1)  # the pod was lost (e.g. garbage-collected across a reboot): recreate

    def start(self) -> None:
        paused, block = is_paused(self.nw), self.node_block_reason()
        if paused:
            self.waiting.append("NodeWright is paused")
            return
        if block:
            return
        if not self.node.ready:
            self.waiting.append("node is not Ready")
            return
        carrier, skipped = self.interrupt_group()
        if carrier is not None:
            self.continue_interrupt(carrier, skipped)
            return  # nothing else runs during an interrupt
        in_flight = [e for e in self.state.packages if self.in_spec(e) and e.state in ACTIVE_STATES]
        pending_interrupts = [
            e for e in in_flight if e.stage in INTERRUPT_STAGES and e.state == PackageState.PENDING
        ]
        # Continue started runs (pre-interrupt and post-interrupt stages).
        for entry in sorted(in_flight, key=lambda e: e.key):
            if entry.stage in INTERRUPT_STAGES:
                continue
            attempt = self.startable(entry)
            if attempt is None:
                continue
            gated = entry.stage in PRE_INTERRUPT_STAGES and self.stage_interrupt(entry) is not None
            if gated and not self.node_gate(for_interrupt=False):
                continue
            self.create(entry, attempt=attempt)
        if pending_interrupts:
            self.start_interrupt(in_flight, pending_interrupts)
            return
        self.start_new_runs(in_flight)

    def continue_interrupt(self, carrier: PackageEntry, skipped: list[PackageEntry]) -> None:
        """The node's interrupt is in flight: its pod again when it was lost (the same attempt, the same
        identity) or after a failed attempt (a new attempt: a new identity and reboot deadline)."""
        attempt = self.startable(carrier) if self.in_spec(carrier) else None
        if attempt is None or not self.node_gate(for_interrupt=True):
            return
        merged = self.merged_interrupt(carrier, skipped)
        if merged is None:
            return
        if attempt > carrier.attempts:
            # A retry is a new interrupt: a new identity on the host (the agent's flags for the last
            # attempt may say it ran) and its own reboot deadline.
            self.state = replace(self.state, boot_id=self.node.boot_id or None, interrupt_at=ts(self.now))
        self.create(carrier, attempt=attempt, interrupt=merged, covers=tuple(e.name for e in skipped))

    def start_interrupt(self, in_flight: list[PackageEntry], pending: list[PackageEntry]) -> None:
        """Start the merged interrupt once nothing else that could join it, or be killed by it, runs."""
        # A package that became startable while these waited (its dependency's failed stage was retried
        # meanwhile) would otherwise apply after the reboot and need one of its own: start it first, and
        # the interrupt waits for it like for any other holdout.
        self.start_new_runs(in_flight)
        holdouts = [
            e
            for e in self.state.packages
            if self.in_spec(e) and e.state in ACTIVE_STATES and e.stage not in INTERRUPT_STAGES
        ]
        if holdouts or self.creates or self.pod_running():
            names = sorted({e.name for e in holdouts})
            self.waiting.append("interrupt waits for " + (", ".join(names) if names else "running pods"))
            return
        checking = self.drift_check_running()
        if checking is not None:
            # Before anything is recorded: the merge below is decided when the pod is created.
            self.waiting.append(f"interrupt waits for drift check {checking} to finish")
            self.requeue(self.opts.poll_interval, f"pod {checking} still running")
            return
        if not self.node_gate(for_interrupt=True):
            return
        candidates = {e.name: i for e in pending if (i := self.stage_interrupt(e)) is not None}
        group = merge_for_node(candidates)
        if group is None:
            return
        for e in pending:
            if e.name != group.carrier:
                self.put(replace(e, state=PackageState.SKIPPED, updated=ts(self.now)))
        carrier_entry = next(e for e in pending if e.name == group.carrier)
        self.state = replace(self.state, boot_id=self.node.boot_id or None, interrupt_at=ts(self.now))
        self.create(carrier_entry, attempt=1, interrupt=group.interrupt, covers=group.skipped)
        self.events.append(
            Event("Interrupt", f"{group.interrupt.type.value} for {', '.join(sorted(candidates))}")
        )

    def start_new_runs(self, in_flight: list[PackageEntry]) -> None:
        runs = self.new_runs()
        if not runs:
            return
        if self.drain_skip_holds():
            return
        if self.state.admission is None:
            self.waiting.append("waiting for the rollout to admit this node")
            return
        if self.inp.sequencing_blocker:
            self.waiting.append(f"waiting for {self.inp.sequencing_blocker}")
            return
        graph = Graph.build({n: (p.depends_on or {}).keys() for n, p in self.nw.spec.packages.items()})
        cycle = graph.find_cycle()
        if cycle:
            self.blocked.append("dependency cycle: " + " -> ".join(cycle))
            return
        complete = frozenset(
            n
            for n, p in self.nw.spec.packages.items()
            if not _uninstall_requested(p) and package_complete(self.state, n, p)
        )
        flying = bool(in_flight)
        started = 0
        for r in runs:
            if self.nw.spec.serial and (flying or started):
                break  # serial: one package active on the node at a time
            if r.stage in (PackageStage.APPLY, PackageStage.UPGRADE) and not graph.ready(r.name, complete):
                # A real frontier: only this package's own dependencies matter.
                deps = [d for d in graph.deps[r.name] if d not in complete]
                missing = [d for d in deps if d not in self.nw.spec.packages]
                gone = [
                    d
                    for d in deps
                    if d in self.nw.spec.packages and _uninstall_requested(self.nw.spec.packages[d])
                ]
                if missing:
                    self.blocked.append(f"{r.name}: depends on unknown package(s) {', '.join(missing)}")
                elif gone:
                    self.blocked.append(
                        f"{r.name}: dependency {', '.join(gone)} is being uninstalled (DependencyUninstalled)"
                    )
                continue
            if self.stage_interrupt(r) is not None and not self.node_gate(for_interrupt=False):
                # Record the run as started: the cordon is owned by work in flight, which then continues
                # without needing admission again.
                if self.cordon_requested or self.node.unschedulable:
                    self.put(replace(r, updated=ts(self.now)))
                    started += 1
                continue
            self.create(r, attempt=1, new_run=True)
            started += 1

    # -- phase 4: completion and status ---------------------------------------------------------------

    def finish(self) -> NodePlan:
        self.stamp_failures()
        gen = self.nw.metadata.generation
        old = self.inp.state or NodeState()
        # A generation bump that does not touch this node is not a new completion (no event).
        was_complete = old.generation is not None and node_complete(self.nw, old) and not old.cordoned
        complete = node_complete(self.nw, self.state)
        if complete:
            self.drift_checks(was_complete=node_complete(self.nw, old))
            complete = node_complete(self.nw, self.state)  # a check may have found drift to repair
        if complete:
            if self.state.cordoned:
                self.actions.append(Uncordon())
            self.state = replace(
                self.state,
                cordoned=False,
                generation=gen,
                admission=None,
                interrupt_at=None,
                boot_id=self.state.boot_id
                if self.drift_recheck
                else (self.node.boot_id or self.state.boot_id),
            )
            if self.inp.drift is not None and self.state.kernel is None:
                self.state = replace(
                    self.state, kernel=self.node.kernel or None, os_image=self.node.os_image or None
                )
            if not was_complete:
                self.events.append(
                    Event("NodeComplete", f"{self.nw.metadata.name} complete on {self.node.name}")
                )
        elif self.state.cordoned and self.state.admission is None and self.idle():
            # The rollout withdrew the node (e.g. a batch reset) between two runs: nothing is in flight
            # and nothing may start, so the node goes back into service while it waits. It is cordoned
            # again when it is re-admitted.
            self.actions.append(Uncordon())
            self.state = replace(self.state, cordoned=False)
            self.events.append(
                Event("Uncordon", "no work in flight and not admitted: uncordoning while waiting")
            )
        if complete:
            self.skip = None
        status, reason, message = self.status(complete)
        # Settling (complete, or erroring with nothing else running) uses up the admission.
        consume = old.admission is not None and (complete or status in (Status.COMPLETE, Status.ERRORING))
        actions: list[Action] = [a for a in self.actions if isinstance(a, (Cordon, Uncordon))]
        actions += [a for a in self.actions if isinstance(a, (WaitForProtectedPods, Drain))]
        deletes: list[DeletePod] = sorted(self.deletes.values(), key=lambda d: d.name)
        actions += deletes
        actions += self.creates
        actions += self.binds
        if self.drift_create is not None:
            actions.append(self.drift_create)
        actions += self.events
        if self.requeues and not complete:
            soonest = min(self.requeues, key=lambda r: r.seconds)
            actions.append(soonest)
        elif complete and self.drift_requeue is not None:
            actions.append(self.drift_requeue)
        return NodePlan(
            state=self.state,
            status=status,
            condition=_condition(self.nw, status, reason, message),
            actions=tuple(actions),
            needs_drain_facts=self.needs_drain,
            state_changed=self.state != (self.inp.state or NodeState()),
            drain_skip=self.skip,
            drain_skipped=self.skipped_now,
            consume_admission=consume,
            drift_result=self.drift_result,
            failed=tuple(self.failed),
        )

    def observe_checks(self) -> None:
        """Read every drift-check pod of this NodeWright on the node that has ended, and remove it --
        whatever the node's state. A check that ends while a run is due or in flight is read now, not
        once the run has completed: read then, it would judge a node it never saw (and start a second
        repair). Its result counts only while the node is still what it was made against
        (`drift.void_reason`: no run of a checked package since it started, the same boot); a void
        check is removed without a verdict (after a reboot nobody asked for, the node stays due:
        `drift_checks`). Check pods that have not ended are left alone until their deadline has
        passed (`overran`); stage pods wait until every check pod is gone (`drift_check_running`)."""
        facts = self.inp.drift
        if facts is None:
            return
        for pod in facts.pods:
            if pod.terminating:
                continue
            if _check_running(pod):
                ended = self.overran(pod)
                if ended is None:
                    continue
                pod = ended
            void = drift.void_reason(pod.basis, self.nw, self.state, boot_id=self.node.boot_id)
            if void is None:
                self.read_drift_check(pod, drift.check_plan(self.nw, self.state))
                continue
            self.deletes.setdefault(pod.name, DeletePod(pod.name, f"drift check void: {void.value}"))

    def overran(self, pod: DriftCheckPod) -> DriftCheckPod | None:
        """A running check pod past `drift.check_expires` (its deadline plus a grace the kubelet has to
        end it): the pod as ended with outcome DEADLINE, to be read as a check `error` and deleted (it
        holds back every stage pod of the node while it exists). None while it has time: the node is
        planned again when it runs out (`check_expires`)."""
        if pod.created is None:
            return None
        expires = drift.check_expires(self.nw, created=pod.created, deadline=pod.deadline)
        if self.now < expires:
            self.check_expires = min(expires, self.check_expires or expires)
            self.requeue(seconds_until(expires, self.now), f"deadline of drift check {pod.name}")
            return None
        limit = human_duration((expires - pod.created).total_seconds())
        message = f"the check pod was still there {limit} after it was created (deadline and grace); deleted"
        self.deletes[pod.name] = DeletePod(pod.name, f"drift check overran its deadline: {message}")
        return replace(pod, outcome=PodOutcome.DEADLINE, message=message)

    def drift_checks(self, *, was_complete: bool) -> None:
        """Drift detection on a node where this NodeWright is complete (rules in `plan.drift`).

        Ended check pods were read and removed (`observe_checks`). Once they are gone, if the node is
        due (its slot, or a host change no interrupt of ours explains: a reboot that voided a check
        keeps the node due, its bootID is not recorded) and nothing else of this NodeWright runs
        there, a check pod is created when a fleet-wide slot is free. No cordon, no drain, no
        interrupt: the checks are read-only.
        """
        facts = self.inp.drift
        if facts is None:
            return
        checked = drift.check_plan(self.nw, self.state)
        if any(_check_running(pod) for pod in facts.pods):
            self.requeue(self.opts.poll_interval, "drift check running")
            if self.check_expires is not None:  # a hung check ends no pod event: look again at its deadline
                self.drift_requeue = RequeueAfter(
                    max(1.0, seconds_until(self.check_expires, self.now)), "drift check deadline"
                )
            return
        old = self.inp.state or NodeState()
        recheck = None
        if was_complete:
            recheck = drift.recheck_reason(
                old, boot_id=self.node.boot_id, kernel=self.node.kernel, os_image=self.node.os_image
            )
        if self.drift_result is None and recheck is not None:
            self.drift_recheck = True  # keep the old bootID until a check has run
        if not checked or self.drift_result is not None or facts.pods or self.pod_running() or self.creates:
            self.drift_requeue = RequeueAfter(max(1.0, facts.seconds_to_next), "next drift check")
            return
        if facts.due or recheck is not None:
            if facts.may_start:
                self.drift_create = CreateDriftCheck(
                    slot=facts.slot,
                    packages=tuple(name for name, _, _ in checked),
                    reason=recheck or "scheduled",
                    basis=drift.check_basis(self.nw, self.state, boot_id=self.node.boot_id).encode(),
                )
                self.requeue(self.opts.poll_interval, "drift check started")
                return
            self.drift_requeue = RequeueAfter(drift.DUE_RETRY, "waiting for a free drift-check slot")
            return
        self.drift_requeue = RequeueAfter(max(1.0, facts.seconds_to_next), "next drift check")

    def read_drift_check(self, pod: DriftCheckPod, checked: list[tuple[str, Package, str]]) -> None:
        if pod.outcome in (PodOutcome.SUCCEEDED, PodOutcome.FAILED):
            outcome = drift.read_outcome(
                checked,
                succeeded=pod.outcome is PodOutcome.SUCCEEDED,
                failed_container=pod.failed_container,
                message=pod.message,
            )
        else:
            outcome = drift.CheckOutcome(
                drifted={}, clean=frozenset(), error=pod.message or pod.outcome.value
            )
        before = {e.name: e.drifted for e in drift.drifted_entries(self.state, self.nw)}
        self.state = drift.apply_outcome(self.state, outcome, self.nw)
        if self.state.interrupt_at is None:
            # The host as checked (a bootID recorded at an interrupt's start is that interrupt's).
            self.state = replace(
                self.state,
                boot_id=self.node.boot_id or self.state.boot_id,
                kernel=self.node.kernel or self.state.kernel,
                os_image=self.node.os_image or self.state.os_image,
            )
        self.deletes.setdefault(pod.name, DeletePod(pod.name, f"drift check finished ({outcome.result})"))
        self.drift_result = outcome.result
        for name, reason in outcome.drifted.items():
            if before.get(name) != reason[:500]:
                self.events.append(Event("Drifted", f"{name}: {reason}", "Warning"))
        for name in outcome.clean:
            if name in before:
                self.events.append(Event("DriftCleared", f"{name}: the check passes again"))
        if outcome.error:
            self.events.append(
                Event("DriftCheckFailed", f"drift check did not run: {outcome.error}", "Warning")
            )

    def finish_disabled(self) -> NodePlan:
        """Disabled: start nothing, let what runs finish (observed and recorded), then let go.

        Once no pod of this NodeWright can still be running on the node and no reboot is in flight, a
        cordon this NodeWright holds is released, so a disabled NodeWright never keeps nodes out of
        service (or other NodeWrights waiting on them). Its unfinished runs stay recorded in the state
        and continue, through the gates again (cordon, drain), when it is enabled.
        """
        self.stamp_failures()
        message = "NodeWright is disabled"
        if self.state.cordoned:
            if self.pod_running() or self.state.interrupt_at is not None:
                message += "; the cordon is released once its running pods and interrupt have finished"
            else:
                self.actions.append(Uncordon())
                self.state = replace(self.state, cordoned=False)
                self.events.append(Event("Uncordon", "NodeWright disabled: nothing running, uncordoning"))
        actions: list[Action] = [a for a in self.actions if isinstance(a, Uncordon)]
        deletes: list[DeletePod] = sorted(self.deletes.values(), key=lambda d: d.name)
        actions += deletes
        actions += self.events
        if self.requeues:
            actions.append(min(self.requeues, key=lambda r: r.seconds))
        elif self.state.cordoned:
            actions.append(RequeueAfter(self.opts.poll_interval, "waiting to release the cordon"))
        return NodePlan(
            state=self.state,
            status=Status.DISABLED,
            condition=_condition(self.nw, Status.DISABLED, "Disabled", message),
            actions=tuple(actions),
            state_changed=self.state != (self.inp.state or NodeState()),
            drain_skip=self.skip,
            failed=tuple(self.failed),
        )

    def idle(self) -> bool:
        """Nothing of this NodeWright runs or is due on the node (erroring entries keep the cordon)."""
        mine = [e for e in self.state.packages if self.in_spec(e)]
        busy = any(e.state in ACTIVE_STATES or e.state == PackageState.ERRORING for e in mine)
        return not busy and not self.creates and not self.pod_running()

    def status(self, complete: bool) -> tuple[Status, str, str]:
        drifted = drift.drifted_entries(self.state, self.nw)
        if complete and drifted:
            return Status.DRIFTED, "Drifted", drift.describe(drifted)[:CONDITION_TEXT]
        if complete:
            return Status.COMPLETE, "Complete", f"all {len(self.nw.spec.packages)} package(s) complete"
        errors = [e for e in self.state.packages if e.state == PackageState.ERRORING and self.in_spec(e)]
        active = [e for e in self.state.packages if e.state in ACTIVE_STATES and self.in_spec(e)]
        # An erroring package settles the node only once nothing else of this NodeWright can still run
        # there: until then the node is in progress and keeps its slot of the budget.
        progressing = (
            bool(self.creates)
            or self.pod_running()
            or any(e.state in (PackageState.PENDING, PackageState.IN_PROGRESS) for e in active)
        )
        block = self.node_block_reason()
        doing = ", ".join(f"{e.name}:{e.version} {e.stage.value} {e.state.value}" for e in active[:5])
        why = "; ".join(dict.fromkeys(self.waiting))
        if is_paused(self.nw):
            return (
                Status.PAUSED,
                "Paused",
                "NodeWright is paused" + (f"; in flight: {doing}" if doing else ""),
            )
        if block:
            return Status.BLOCKED, "Blocked", block
        failures = "; ".join(f"{e.name}:{e.version} {e.stage.value}: {e.error}" for e in errors[:3])
        if errors and not progressing:
            return Status.ERRORING, "Erroring", failures
        if errors:
            detail = "; ".join(filter(None, [doing, why]))
            return Status.IN_PROGRESS, "InProgress", f"failed: {failures}; still running: {detail or 'pods'}"
        if self.skip_blocked and not self.state.cordoned:
            return (
                Status.BLOCKED,
                "DrainTimeout",
                self.skip_blocked + (f"; in flight: {doing}" if doing else ""),
            )
        if active or self.creates or self.state.cordoned:
            reason = "InProgress"
            if any(isinstance(a, WaitForProtectedPods) for a in self.actions):
                reason = "WaitingForProtectedPods"
            elif "reboot" in why:
                reason = "Rebooting"
            elif self.drain_overdue:
                reason = "DrainTimeout"  # the timeout passed; policy wait keeps the node draining
            elif any(isinstance(a, Drain) for a in self.actions) or "draining" in why:
                reason = "Draining"
            return Status.IN_PROGRESS, reason, (doing or "starting") + (f"; {why}" if why else "")
        if self.blocked:
            return Status.BLOCKED, "Blocked", "; ".join(self.blocked)
        if drifted:
            # Admitted, the repair waits for something on the node (a drift-check pod to go): say what.
            next_step = (
                why if why and self.state.admission is not None else "waiting for the rollout to repair it"
            )
            text = f"{drift.describe(drifted)}; {next_step}"
            return Status.DRIFTED, "Drifted", text[:CONDITION_TEXT]
        return Status.WAITING, "Waiting", why or "waiting"


def plan_node(inp: NodeInput) -> NodePlan:
    """Decide the next step of `inp.nodewright` on `inp.node`. Pure and deterministic."""
    if inp.now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    p = _Planner(inp)
    if is_disabled(inp.nodewright):
        p.observe()
        return p.finish_disabled()
    p.reapply_on_reboot()
    p.observe()
    p.observe_checks()
    p.stamp_failures()  # before the retry: what just gave up did so under the current admission
    p.retry_erroring_under_fresh_admission()
    p.cancel_uninstalls()
    p.start()
    return p.finish()
