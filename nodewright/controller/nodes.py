"""The node controller: actuates the per-node plan of one NodeWright on one node (key `<nw>/<node>`).

Each reconcile reads the caches (NodeWright, the node through the read-your-writes overlay, this
NodeWright's package pods on the node), plans with `plan.node.plan_node`, and turns the plan into API
writes in a crash-safe order:

1. **One patch** carrying the new state annotation `nodewright.io/state.<nw>`, the status label
   `nodewright.io/status.<nw>`, the controller's timing annotation (see `controller.drainer`) and the
   node condition `nodewright.io/<nw>` — all or nothing, BEFORE any action. It is a strategic merge
   patch on `nodes/status`: conditions merge by `type` (the kubelet's are untouched) and the node
   status strategy keeps metadata changes, so a stage transition costs one write. (If an API server
   ever drops metadata there, the answer shows it and the controller switches to a metadata merge
   patch plus a condition patch for good.) When the plan cordons or uncordons, `spec.unschedulable`
   cannot go through `nodes/status`: then a metadata merge patch carries state, label and cordon
   together, and the condition follows. A crash after the state write re-plans from it and repeats
   the (idempotent) actions; a crash before it repeats everything. Nothing is written when nothing
   differs.
2. **Actions** in the plan's order: evictions (PDB refusals are reported in the next plan and retried
   after a few seconds), pod deletions, pod creations (ConfigMap first; every pod signed, then
   sealed; a pod name is deterministic, so `409 AlreadyExists` means "already done"), Events. Pods
   created or deleted are remembered until the pod watch reports them (`PodExpectations`), so a
   reconcile that runs before the watch catches up neither creates a pod twice nor deletes it twice.

Rules of trust and ownership:

- The admission annotation `nodewright.io/batch.<nw>` is written by the rollout controller only. It is
  read here and handed to the planner only when its fingerprint equals the current spec fingerprint; it
  is never persisted inside the state annotation.
- A package pod counts only if it carries our NodeWright label, is controller-owned by this
  NodeWright's uid, its HMAC signature verifies against its identity and what it runs, and its seal
  names its uid (`controller.trust`, `context.PodSigner`). Any other pod with our labels is reported
  (Warning Event on the node and the NodeWright, `nodewright_untrusted_pods_total`) and deleted: it
  never changes a node's state.
- A state annotation that does not decode is never overwritten: the node is left alone and a Warning
  Event names the problem (the rollout controller reports `NodeStateMalformed` from the same text). Once
  someone fixes or removes the annotation, the next reconcile continues from it.
- The node is uncordoned only when the stored state says this NodeWright cordoned it.

Edge cases:

- NodeWright being deleted: the plan uses `effective_nodewright` (uninstall of `uninstall.enabled`
  packages) restricted to what this node actually has to do — uninstalls, and runs already in flight;
  nothing new is installed or upgraded on the way out. When that is settled (no pods, nothing active),
  the node is cleaned: status label, condition and timing annotation removed, uncordoned if we cordoned
  it; the state annotation is kept if entries remain (files of those packages remain on the host, D2)
  and removed otherwise. The rollout controller releases the finalizer once no node carries the
  status label.
- Node no longer selected: nothing new starts and nothing is deleted; once no package pod of the
  NodeWright runs there, the node is uncordoned (if we cordoned it) and the status label, condition
  and timing annotation are removed. The state annotation is kept: it records what is on the host, and
  if the node is selected again the machine continues from it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

import aiohttp
import structlog

from nodewright.api import constants
from nodewright.api.admission import Admission, admission_annotation, encode_admission
from nodewright.api.models import NodeWright, Status
from nodewright.api.nodeobject import (
    node_admission,
    node_annotations,
    node_facts,
    node_labels,
    node_state,
)
from nodewright.api.nodestate import Admission as StateAdmission
from nodewright.api.nodestate import (
    MalformedNodeState,
    NodeState,
    PackageStage,
    PackageState,
    encode,
    truncate_error,
)
from nodewright.api.reasons import NodeConditionReason
from nodewright.api.timing import (
    Timing,
    TracedAdmission,
    parse_ts_or_none,
    read_timing,
    timing_annotation,
    update_timing,
)
from nodewright.controller.configmaps import PackageConfigMaps
from nodewright.controller.drainer import Drainer
from nodewright.controller.drift import DriftScheduler
from nodewright.controller.logstore import LogStore
from nodewright.controller.pods import (
    PodLogs,
    classify,
    failed_container,
    needs_log_tail,
    summarize_with_logs,
)
from nodewright.controller.runtime import Runtime, split_node_key
from nodewright.controller.trust import BindRefused, PodTrust, is_drift_check
from nodewright.kube.client import PatchType, metadata_applied
from nodewright.kube.resources import JSON, NODES, ApiError, Conflict, NotFound
from nodewright.kube.workqueue import Result
from nodewright.observability import events as catalogue
from nodewright.observability.tracing import (
    IDLE,
    NodeRollout,
    RolloutEnd,
    TraceStep,
    describe_end,
    gate_spans,
    trace_step,
)
from nodewright.plan import drain as drain_mod
from nodewright.plan import drift, podspec, rollout_epoch, sequencing
from nodewright.plan.node import (
    BindPod,
    Cordon,
    CreateDriftCheck,
    CreatePod,
    DeletePod,
    Drain,
    DrainFacts,
    DriftCheckPod,
    DriftInput,
    Event,
    NodeCondition,
    NodeInput,
    NodePlan,
    PlanOptions,
    RequeueAfter,
    Uncordon,
    entry_in_spec,
    is_paused,
    plan_node,
)
from nodewright.plan.rollout import spec_fingerprint
from nodewright.plan.rollout_input import effective_nodewright, matches_nodewright
from nodewright.plan.stages import (
    ACTIVE_STATES,
    INTERRUPT_STAGES,
    FailureCause,
    PodOutcome,
    PodSummary,
    completed_stages,
    failed_stage,
    run_completed_stages,
    ts,
)
from nodewright.plan.transitions import Retried

log = structlog.get_logger("nodewright.controller.nodes")

REFUSED_RETRY: Final = 1.0  # seconds; a refused pod create is recorded as a failed attempt next pass
DRAIN_POLL: Final = 2.0  # evictions accepted: look again soon, the pods are terminating
DRAIN_BLOCKED_POLL: Final = 7.0  # a PDB refused: its budget frees up when another pod is Ready again
SEQUENCING_FACTS_TTL: Final = 1.0  # seconds; the facts are O(nodes x NodeWrights) to build
MAX_PASSES: Final = 3  # plan again at once after our own cordon instead of waiting for a requeue
AGAIN_SOON: Final = 1.0  # seconds; after MAX_PASSES passes that each asked to plan again
CONDITION_MESSAGE_LIMIT: Final = 1024


@dataclass
class _SequencingCache:
    built_at: float = -1e9
    facts: tuple[sequencing.NodeWrightFacts, ...] = ()
    nodewrights: tuple[tuple[object, ...], ...] = ()  # what the facts read of each (`_ordering_inputs`)
    completion: sequencing.CompletionMemo = field(default_factory=sequencing.CompletionMemo)


@dataclass(frozen=True, slots=True)
class _PassContext:
    """What one pass read: the objects, the decoded state, and the planner's input built from them.

    `admission` is the node's admission annotation when it lets the node start work (current spec,
    not consumed), else None; `inp.state.admission` is the same admission in the planner's form.
    """

    model: NodeWright
    node: JSON
    stored: NodeState | None
    summaries: tuple[PodSummary, ...]
    pods: Mapping[str, JSON]  # the package pods summarised, by name
    admission: Admission | None
    deleting: bool
    timing: Timing
    now: datetime
    inp: NodeInput

    @property
    def cordoned_by_us(self) -> bool:
        return bool(self.stored and self.stored.cordoned)


@dataclass(frozen=True, slots=True)
class Done:
    """Nothing more to do for this key until an event brings it back."""


@dataclass(frozen=True, slots=True)
class Again:
    """Plan again at once (after our own cordon, or a write conflict: the node is read afresh)."""


@dataclass(frozen=True, slots=True)
class Later:
    """Look again after `seconds` (None: on the next event only)."""

    seconds: float | None = None


PassOutcome = Done | Again | Later
"""How one plan-and-actuate pass ended (the node controller's `Result`, as controller-runtime's)."""


@dataclass(frozen=True, slots=True)
class _NodeWrite:
    """One pass's write to its node: label and annotation changes (None deletes), the cordon, the
    condition, and the resourceVersion it must still have (when it carries the state)."""

    name: str
    labels: dict[str, str | None]
    annotations: dict[str, str | None]
    unschedulable: bool | None
    condition: JSON | None
    version: str | None


@dataclass(frozen=True, slots=True)
class _Step:
    """What a pass derives from its plan before writing: the cordon change, the rollout trace step and
    the timing annotation after the plan."""

    cordon: bool
    uncordon: bool
    trace: TraceStep
    timing: Timing


class NodeReconciler:
    """Reconciles `<nw>/<node>` keys; see the module docstring."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.drainer = Drainer(rt.client, allow_force=rt.options.allow_force_drain)
        self.configmaps = PackageConfigMaps(rt.client, namespace=rt.options.namespace)
        self.logs = PodLogs(rt.client)
        self.logstore = LogStore(
            rt.client, namespace=rt.options.namespace, keep_succeeded=rt.options.keep_succeeded_logs
        )
        opts = rt.options
        self.pod_options = podspec.PodOptions(
            namespace=opts.namespace,
            agent_image=opts.agent_image,
            pause_image=opts.pause_image,
            copy_dir_root=opts.copy_dir_root,
            log_root=opts.log_root,
            runtime_required_taint_key=opts.runtime_required_taint_key,
        )
        self.plan_options = PlanOptions(
            pod=self.pod_options,
            reboot_timeout=opts.reboot_timeout,
            reapply_on_reboot=opts.reapply_on_reboot,
            chain_packages=opts.chain_packages,
        )
        self._sequencing = _SequencingCache()
        self._warned: set[tuple[str, str]] = set()  # (key or pod uid, problem) already reported
        self.trust = PodTrust(rt)  # which package pods count; reports and deletes the others
        self.drift = DriftScheduler(limit=rt.options.drift_check_limit)  # drift checks: memory and cap
        # (node, pod name) -> the refusal of that pod's creation, as a failed attempt (`_create_refused`).
        self._refused: dict[tuple[str, str], PodSummary] = {}
        self._metadata_via_status = True  # see `_write`; off if the API server ignores it

    # ------------------------------------------------------------------------------------------------
    # Entry point

    async def reconcile(self, key: str) -> Result | None:
        nw_name, node_name = split_node_key(key)
        if not nw_name or not node_name:
            log.warning("malformed node key", key=key)
            return None
        for _ in range(MAX_PASSES):
            outcome = await self._pass(key, nw_name, node_name)
            if isinstance(outcome, Done):
                return None
            if isinstance(outcome, Later):
                return Result(requeue_after=outcome.seconds) if outcome.seconds is not None else None
        # Still more to do (e.g. repeated write conflicts): never drop the key.
        return Result(requeue_after=AGAIN_SOON)

    async def _pass(self, key: str, nw_name: str, node_name: str) -> PassOutcome:
        """One plan-and-actuate pass (module docstring)."""
        ctx = await self._read(key, nw_name, node_name)
        if not isinstance(ctx, _PassContext):
            if isinstance(ctx, Done):
                self.drainer.forget(key)
            return ctx
        plan, selection = await self._plan(key, ctx)
        step = self._step(key, ctx, plan, selection)
        if ctx.deleting and self._settled(plan, ctx.summaries, ctx.inp.drift, ctx.inp.nodewright):
            # Nothing left to do for a leaving NodeWright: release the node instead of writing status
            # (a status written now would hold the finalizer forever).
            await self._cleanup(
                ctx.node,
                nw_name,
                plan.state,
                cordoned=ctx.cordoned_by_us,
                forget_state=True,
                trace_end=(ctx.model, RolloutEnd.DELETED),
            )
            self.drainer.forget(key)
            return Done()
        previous_status = node_labels(ctx.node).get(constants.status_label(nw_name))
        try:
            node = await self._write(ctx, plan, step.cordon, step.uncordon, step.timing)
        except Conflict:
            # The node changed since it was read (someone wiped or edited our state, the rollout
            # admitted it, ...): never write a state planned from an older node. Read it afresh and
            # plan again from what it says now.
            await self._refresh_node(node_name)
            return Again()
        if node is None:
            self.drainer.forget(key)
            return Done()
        await self._after_write(ctx, plan, step, node, previous_status)
        requeue = await self._execute(key, ctx.model, ctx.inp.nodewright, node, plan, ctx.now)
        if ctx.inp.sequencing_blocker and ctx.admission is not None:
            # Admitted but held by an earlier NodeWright (admitted before that one appeared, or a
            # `sequencing: all` predecessor finishing on other nodes, whose events do not reach this
            # key): look again. Rare, since the rollout does not admit nodes waiting for priority.
            poll = self.plan_options.poll_interval
            requeue = poll if requeue is None else min(requeue, poll)
        # After our own cordon the overlay already shows the node unschedulable: go on right away.
        return Again() if step.cordon else Later(requeue)

    def _step(
        self, key: str, ctx: _PassContext, plan: NodePlan, selection: drain_mod.DrainSelection | None
    ) -> _Step:
        cordon = any(isinstance(a, Cordon) for a in plan.actions)
        uncordon = any(isinstance(a, Uncordon) for a in plan.actions) and ctx.cordoned_by_us
        trace = self._trace_step(ctx, plan)
        timing = self._next_timing(key, ctx, plan, selection, cordon=cordon, uncordon=uncordon, trace=trace)
        return _Step(cordon, uncordon, trace, timing)

    async def _after_write(
        self, ctx: _PassContext, plan: NodePlan, step: _Step, node: JSON, previous_status: str | None
    ) -> None:
        """What follows the state write: drift-check results counted, stopped attempts' logs kept, the
        plan's transitions as metrics and spans, and a node newly blocked said once."""
        nw_name = ctx.model.metadata.name
        if plan.drift_result is not None:
            self.rt.metrics.domain.count_drift_check(nodewright=nw_name, result=plan.drift_result)
        await self._keep_stopped(ctx, plan)
        self._observe(ctx, plan, step)
        if (
            plan.status is Status.BLOCKED
            and plan.condition.reason is NodeConditionReason.BLOCKED
            and previous_status != Status.BLOCKED.value
        ):
            # Skipped for a reason on the node (ignore label, untolerated taint, ...): say so once.
            blocked = catalogue.node_blocked(nw_name, plan.condition.message)
            await self.rt.events.record(
                kind="Node",
                name=ctx.inp.node.name,
                uid=node["metadata"].get("uid"),
                reason=blocked.reason.value,
                message=blocked.message,
                event_type=blocked.type.value,
                related=nw_name,
            )

    async def _report_malformed(
        self, key: str, model: NodeWright, node: JSON, exc: MalformedNodeState
    ) -> None:
        """A state annotation that does not decode is never overwritten, and the node is not complete.

        The node gets status label `blocked` and its condition reason `StateMalformed` (how to recover
        is in the message), in one write that leaves the annotation alone; the rollout controller
        counts it blocked. A Warning Event names the problem once per annotation text.
        """
        nw_name, node_name = model.metadata.name, str(node["metadata"]["name"])
        text = node_annotations(node).get(constants.state_annotation(nw_name), "")
        await self._warn_once(
            key,
            f"malformed:{text}",
            kind="Node",
            name=node_name,
            uid=node["metadata"].get("uid"),
            reason=catalogue.EventReason.STATE_MALFORMED.value,
            message=f"[{nw_name}] state annotation left untouched: {exc}",
        )
        condition = _condition_body(
            node,
            NodeCondition(
                type=constants.node_condition_type(nw_name),
                status="False",
                reason=NodeConditionReason.STATE_MALFORMED,
                message=(
                    f"annotation {constants.state_annotation(nw_name)} cannot be read ({exc}); nothing is"
                    " done on this node until it is fixed. Restore it, or delete it to start this node"
                    " over through the next batch (a cordon this NodeWright held is then no longer known"
                    " as its own: uncordon the node by hand)"
                ),
            ),
            self.rt.clock(),
        )
        status_key = constants.status_label(nw_name)
        labels = {} if node_labels(node).get(status_key) == Status.BLOCKED.value else {status_key: "blocked"}
        if not labels and condition is None:
            return
        try:
            updated = await self.rt.client.patch_node_status_metadata(
                node_name, labels=labels or None, conditions=[condition] if condition is not None else ()
            )
        except NotFound:
            return
        self.rt.node_view.record(updated)
        if labels:
            self.rt.enqueue_rollout(nw_name)

    async def _read(self, key: str, nw_name: str, node_name: str) -> _PassContext | PassOutcome:
        """Everything one pass plans from, from the caches; or how the pass ends without a plan."""
        rt = self.rt
        raw, model, error = rt.nodewright(nw_name)
        if raw is not None and model is None and (raw.get("metadata") or {}).get("deletionTimestamp"):
            return await self._release_for_invalid_deletion(key, nw_name, node_name)
        if raw is None or model is None:
            # Gone (finalizer released: nodes already cleaned) or invalid (the rollout controller reports
            # the validation error on the object): leave nodes alone.
            if error:
                log.debug("nodewright invalid, node left alone", nodewright=nw_name, error=error)
            return Done()
        node = rt.node(node_name)
        if node is None:
            return Done()
        try:
            stored = node_state(node, nw_name)
        except MalformedNodeState as exc:
            await self._report_malformed(key, model, node, exc)
            return Later()
        deleting = bool(model.metadata.deletion_timestamp)
        effective = effective_nodewright(model)
        trusted = self._package_pods(node_name, model)
        await self._flush_warnings()  # untrusted pods are reported and deleted on every path
        pods_raw = [p for p in trusted if not is_drift_check(p)]
        checks = [p for p in trusted if is_drift_check(p)]
        if not deleting and not matches_nodewright(model, node):
            return await self._unselected(key, model, node, stored, trusted)
        plan_nw = _deletion_spec(effective, stored or NodeState(), pods_raw) if deleting else effective
        summaries = [*await self._summaries(pods_raw, plan_nw, stored), *self._refused_pods(node_name)]
        admission = node_admission(node, nw_name)
        usable = self._usable_admission(admission, effective)
        now = rt.clock()
        timing = read_timing(node_annotations(node), nw_name)
        inp = NodeInput(
            nodewright=plan_nw,
            node=node_facts(node),
            state=replace(stored or NodeState(), admission=usable),
            pods=tuple(summaries),
            now=now,
            sequencing_blocker=self._sequencing_blocker(nw_name, node),
            options=self.plan_options,
            drain_skip=timing.drain_skip,
            drift=await self._drift_input(key, model, node_name, checks),
        )
        return _PassContext(
            model=model,
            node=node,
            stored=stored,
            summaries=tuple(summaries),
            pods={str((p.get("metadata") or {}).get("name")): p for p in pods_raw},
            admission=admission if usable is not None else None,
            deleting=deleting,
            timing=timing,
            now=now,
            inp=inp,
        )

    async def _plan(self, key: str, ctx: _PassContext) -> tuple[NodePlan, drain_mod.DrainSelection | None]:
        """The node plan; planned twice when it needs the node's workload pods (cordon/drain)."""
        plan = plan_node(ctx.inp)
        if not plan.needs_drain_facts:
            return plan, None
        workload = await self.drainer.node_pods(ctx.inp.node.name)
        selection = drain_mod.select(workload, protect=ctx.model.spec.pod_non_interrupt_labels)
        facts = DrainFacts(
            selection=selection,
            protected_since=ctx.timing.protected_since,
            draining_since=ctx.timing.draining_since,
            eviction_blocked=self.drainer.eviction_blocked(key),
        )
        return plan_node(replace(ctx.inp, drain=facts)), selection

    def _next_timing(
        self,
        key: str,
        ctx: _PassContext,
        plan: NodePlan,
        selection: drain_mod.DrainSelection | None,
        *,
        cordon: bool,
        uncordon: bool,
        trace: TraceStep,
    ) -> Timing:
        """The maintenance-window timing annotation after this plan (see `controller.drainer`), with
        the admission whose rollout trace is open (`trace.persisted`)."""
        timing = update_timing(
            ctx.timing,
            now=ctx.now,
            cordoning=cordon,
            uncordoning=uncordon,
            protected=None if selection is None else bool(selection.protected),
            evicting=any(isinstance(a, Drain) for a in plan.actions),
            drained=None if selection is None else selection.drained,
        ).with_drain_skip(plan.drain_skip)
        timing = replace(timing, trace=trace.persisted, drain_blocked=plan.drain_blocked)
        if plan.drain_skipped:
            # Released after a drain timeout (policy skip): the next admission starts a fresh drain timer.
            timing = replace(timing, draining_since=None)
            self.drainer.forget(key)
        if plan.status == Status.COMPLETE:
            timing = Timing()  # the maintenance window is over
        return timing

    async def _refresh_node(self, name: str) -> None:
        """Read the node from the API server (not the cache) into the read-your-writes overlay."""
        try:
            fresh = await self.rt.client.get(NODES, name)
        except NotFound:
            self.rt.node_view.forget(name)
            return
        self.rt.node_view.record(fresh)

    # ------------------------------------------------------------------------------------------------
    # Inputs

    def _package_pods(self, node_name: str, nw: NodeWright) -> list[JSON]:
        """Trusted package pods of this NodeWright on the node (signature, seal, owner uid); the others
        are queued by `PodTrust` to be reported and deleted (`_flush_warnings`)."""
        known = self.rt.pods.by_index("node", node_name)
        labelled = [
            pod
            for pod in [*known, *self.rt.pod_expectations.pending_on(node_name, known)]
            if ((pod.get("metadata") or {}).get("labels") or {}).get(constants.POD_LABEL_NODEWRIGHT)
            == nw.metadata.name
        ]
        return self.trust.trusted(nw, labelled)

    async def _flush_warnings(self) -> None:
        """Report and delete the untrusted pods the last scans found; write pending pod seals."""
        await self.trust.flush()

    async def _summaries(
        self, pods: Sequence[JSON], nw: NodeWright, state: NodeState | None
    ) -> list[PodSummary]:
        version_of: dict[tuple[str, str], str] = {}
        for name, pkg in nw.spec.packages.items():
            version_of[(name, podspec.label_value(pkg.version))] = pkg.version
        for entry in (state or NodeState()).packages:
            version_of.setdefault((entry.name, podspec.label_value(entry.version)), entry.version)
        out: list[PodSummary] = []
        for pod in pods:
            summary = await summarize_with_logs(pod, version_of=version_of, logs=self.logs)
            if summary is not None:
                out.append(summary)
                await self._keep_log(nw, pod, summary)
        await self._flush_warnings()
        return out

    async def _keep_log(self, nw: NodeWright, pod: JSON, summary: PodSummary) -> None:
        """A finished attempt's log tail goes to the log store before the pod is deleted.

        A failure is kept under the stage it failed in (a pod runs several stages), with the failing
        container's log; a success under the pod's first stage, with every stage container's log.
        """
        stage, package, version, attempt = summary.stage, summary.package, summary.version, summary.attempt
        if summary.outcome in (PodOutcome.FAILED, PodOutcome.DEADLINE):
            outcome, failed = "failed", failed_container(pod)
            if summary.progress:
                stage = failed_stage(summary)
            chained = _failed_chained_run(summary)
            if chained is not None:  # it failed in a chained run: its first attempt, under its own name
                package, version, stage, attempt = chained
        elif summary.outcome is PodOutcome.SUCCEEDED and summary.stage not in INTERRUPT_STAGES:
            outcome, failed = "succeeded", None
        else:
            return
        if not self.logstore.wants(outcome):
            return
        await self.logstore.record(
            nw,
            pod,
            package=package,
            version=version,
            stage=stage.value,
            attempt=attempt,
            outcome=outcome,
            container=failed[0] if failed else None,
            message=summary.message,
            now=self.rt.clock(),
        )

    async def _keep_stopped(self, ctx: _PassContext, plan: NodePlan) -> None:
        """Attempts the plan failed whose pods did not fail by themselves (image pull errors past their
        grace, stage timeouts) are kept as their stage's kept log, before the plan's actions delete the
        pods. A pod that failed by itself was kept when it was read (`_keep_log`)."""
        for failed in plan.failed:
            if failed.cause is FailureCause.POD_FAILED:
                continue
            pod = ctx.pods.get(failed.pod)
            if pod is not None:
                await self.logstore.record_stopped(ctx.inp.nodewright, pod, failed, now=ctx.now)

    def _trace_step(self, ctx: _PassContext, plan: NodePlan) -> TraceStep:
        """What this pass does to the node's rollout trace (`observability.tracing.trace_step`); nothing
        is persisted without tracing."""
        if not self.rt.tracer.enabled:
            return IDLE
        traced = ctx.timing.trace
        current = _traced(ctx.admission)
        settled: RolloutEnd | None = None
        if plan.consume_admission and current is not None:
            settled = RolloutEnd.COMPLETE if plan.status is Status.COMPLETE else RolloutEnd.FAILED
        # The spec fingerprint only matters to a trace whose admission is no longer the current one.
        abandoning = (
            traced is not None and not traced.ended and (current is None or current.key != traced.key)
        )
        return trace_step(
            traced,
            current,
            fingerprint=spec_fingerprint(effective_nodewright(ctx.model)) if abandoning else "",
            generation=ctx.model.metadata.generation,
            settled=settled,
            settled_reason=_failure(plan) if settled is RolloutEnd.FAILED else "",
            deleting=ctx.deleting,
        )

    @staticmethod
    def _usable_admission(admission: Admission | None, effective: NodeWright) -> StateAdmission | None:
        """The admission in the planner's form, when it lets the node start work: for the current spec
        fingerprint and not consumed (a node that settled under it needs a fresh one), and not from an
        earlier rollout of the same spec (`plan.rollout_epoch.usable`)."""
        fingerprint = spec_fingerprint(effective)
        if admission is None or not rollout_epoch.usable(
            admission, fingerprint=fingerprint, status=effective.status
        ):
            return None
        return StateAdmission(
            compartment=admission.compartment, batch=admission.batch, order=admission.order, at=admission.at
        )

    async def _drift_input(
        self, key: str, model: NodeWright, node_name: str, pods: Sequence[JSON]
    ) -> DriftInput | None:
        """What the planner needs for drift checks of this node (None: no driftDetection, or the
        NodeWright is paused or being deleted; a check pod already running is still read)."""
        interval = drift.node_interval(model)
        inactive = interval is None or bool(model.metadata.deletion_timestamp) or is_paused(model)
        if inactive and not pods:
            self.drift.forget(key)
            return None
        now = self.rt.clock().timestamp()
        interval = interval or drift.MIN_INTERVAL
        slot = drift.slot(now, nodewright=model.metadata.name, node=node_name, interval=interval)
        checks = []
        for pod in pods:
            outcome, message = classify(pod)
            failed = failed_container(pod)
            missing = needs_log_tail(pod)
            if missing is not None:
                tail = await self.logs.tail(pod, missing)
                message = f"{message}; log: {tail}" if tail else message
            meta = pod.get("metadata") or {}
            annotations = meta.get("annotations") or {}
            checks.append(
                DriftCheckPod(
                    name=str(meta.get("name")),
                    outcome=outcome,
                    failed_container=failed[0] if failed is not None else None,
                    message=message,
                    terminating=bool(meta.get("deletionTimestamp")),
                    basis=str(annotations.get(constants.POD_ANNOTATION_DRIFT_BASIS) or ""),
                    created=parse_ts_or_none(meta.get("creationTimestamp")),
                    deadline=_active_deadline(pod),
                )
            )
        return DriftInput(
            pods=tuple(checks),
            slot=slot,
            due=not inactive and self.drift.due(key, slot),
            may_start=not inactive and self.drift.may_start(self.rt.pods.objects()),
            seconds_to_next=drift.seconds_to_next_slot(
                now, nodewright=model.metadata.name, node=node_name, interval=interval
            ),
        )

    async def _create_drift_check(
        self, key: str, nw: NodeWright, node_name: str, action: CreateDriftCheck
    ) -> None:
        """The node's drift-check pod (signed like every package pod, not sealed: `controller.trust`)."""
        state = node_state(self.rt.node(node_name) or {"metadata": {}}, nw.metadata.name) or NodeState()
        checked = [c for c in drift.check_plan(nw, state) if c[0] in action.packages]
        if not checked:
            return
        for name, pkg, _ in checked:
            if pkg.config_map:
                await self.configmaps.ensure(nw, name, pkg)
        manifest = podspec.build_drift_check_pod(
            nw, checked, node=node_name, slot=action.slot, options=self.pod_options, basis=action.basis
        )
        self.rt.signer.sign(manifest)
        self.drift.checked(key, action.slot)
        # Logged before the request leaves, like package pods (`_send_create`): an audit trail.
        log.info("creating drift check pod", pod=manifest["metadata"]["name"], node=node_name, key=key)
        try:
            created = await self.rt.client.create_pod(self.rt.options.namespace, manifest)
        except Conflict as exc:
            if not exc.already_exists:
                raise
            return
        self.drift.started(str(manifest["metadata"]["name"]))
        await self.trust.adopt(created, manifest, nw=nw)
        log.info(
            "drift check started",
            pod=manifest["metadata"]["name"],
            node=node_name,
            packages=list(action.packages),
            reason=action.reason,
        )

    def _refused_pods(self, node_name: str) -> list[PodSummary]:
        """Pod creations the API server refused, as failed attempts (see `_create_refused`)."""
        return [summary for (node, _), summary in self._refused.items() if node == node_name]

    def _sequencing_blocker(self, nw_name: str, node: JSON) -> str | None:
        """The earlier NodeWright keeping this node waiting, if any.

        The facts are cached for a second (and rebuilt at once when a NodeWright's spec, pause, disable
        or deletion changed: an edit must not be read against the facts of the old spec), but this
        node's own completion is taken from the node as it is now, for each NodeWright's current spec
        (`sequencing.CompletionMemo`, the rule the facts use): the event that unblocks it (the earlier
        NodeWright completing here) is the very node update that brought us here, and a stale cache
        would swallow it."""
        facts = self._sequencing_facts()
        if nw_name not in {f.name for f in facts}:
            return None
        node_name = str(node["metadata"]["name"])
        fresh = []
        for f in facts:
            model = self.rt.nodewright(f.name)[1] if node_name in f.targets else None
            if model is not None:
                done = self._sequencing.completion.complete_on(model, node)
                f = replace(
                    f, complete_on=f.complete_on | {node_name} if done else f.complete_on - {node_name}
                )
            fresh.append(f)
        blocker = sequencing.blocking(fresh, target=nw_name, node=node_name)
        return blocker.reason if blocker else None

    def _sequencing_facts(self) -> tuple[sequencing.NodeWrightFacts, ...]:
        now = time.monotonic()
        cache = self._sequencing
        objects = self.rt.nodewrights.objects()
        read = tuple(_ordering_inputs(o) for o in objects)
        if now - cache.built_at < SEQUENCING_FACTS_TTL and read == cache.nodewrights:
            return cache.facts
        cache.nodewrights, cache.built_at = read, now
        if len(objects) < 2:
            cache.facts = ()  # a lone NodeWright waits for nobody
            return cache.facts
        parsed = (self.rt.models.nodewright(obj)[0] for obj in objects)
        models = [model for model in parsed if model is not None]
        facts = sequencing.facts_for(models, self.rt.nodes.objects(), memo=cache.completion)
        cache.facts = tuple(facts)
        return cache.facts

    # ------------------------------------------------------------------------------------------------
    # Writes

    async def _write(
        self, ctx: _PassContext, plan: NodePlan, cordon: bool, uncordon: bool, new_timing: Timing
    ) -> JSON | None:
        """State, status label, timing, cordon and the node condition, in as few requests as possible.

        Without a cordon change everything goes in one strategic merge patch on `nodes/status` (one
        write per transition instead of two); a cordon needs `spec`, which that subresource ignores, so
        then the metadata patch carries the cordon and the condition follows in its own patch. Either
        way the state is durable before any action. A write of the state (or of the admission it
        consumes) carries the resourceVersion of the node it was planned from: if the node changed
        since, the API server answers 409 `Conflict` (raised to the caller, which re-reads and plans
        again) instead of letting an older state overwrite a newer one. Returns the newest node, None
        if it is gone.
        """
        node, nw_name = ctx.node, ctx.model.metadata.name
        name = str(node["metadata"]["name"])
        labels, annotations = self._metadata_changes(ctx, plan, new_timing)
        unschedulable: bool | None = None
        if cordon and not node.get("spec", {}).get("unschedulable"):
            unschedulable = True
        elif uncordon:
            unschedulable = False
        condition = None if _untouched(ctx, plan) else _condition_body(node, plan.condition, ctx.now)
        if not labels and not annotations and unschedulable is None and condition is None:
            return node
        guarded = (
            constants.state_annotation(nw_name) in annotations or admission_annotation(nw_name) in annotations
        )
        version = str(node["metadata"].get("resourceVersion") or "") or None if guarded else None
        change = _NodeWrite(name, labels, annotations, unschedulable, condition, version)
        try:
            if unschedulable is None and self._metadata_via_status:
                updated = await self._write_via_status(change)
            else:
                updated = await self._write_separately(change)
        except NotFound:
            return None
        self.rt.node_view.record(updated)
        if constants.status_label(nw_name) in labels:
            self.rt.enqueue_rollout(nw_name)
        return self.rt.node(name) or updated

    async def _write_via_status(self, change: _NodeWrite) -> JSON:
        """One strategic merge patch on `nodes/status` with the metadata and the condition; if the API
        server drops the metadata there, the metadata again as its own patch, and that way from now on."""
        client = self.rt.client
        labels, annotations = change.labels, change.annotations
        updated = await client.patch_node_status_metadata(
            change.name,
            labels=labels or None,
            annotations=annotations or None,
            conditions=[change.condition] if change.condition is not None else (),
            resource_version=change.version,
        )
        if metadata_applied(updated, labels=labels, annotations=annotations):
            return updated
        log.warning(
            "the API server ignored metadata in a nodes/status patch;"
            " writing node metadata and conditions separately from now on",
            node=change.name,
        )
        self._metadata_via_status = False
        return await client.patch_node_metadata(
            change.name,
            labels=labels or None,
            annotations=annotations or None,
            resource_version=_resource_version(updated),
        )

    async def _write_separately(self, change: _NodeWrite) -> JSON:
        """The metadata (with the cordon) as a merge patch, then the condition as its own patch."""
        updated: JSON | None = None
        if change.labels or change.annotations or change.unschedulable is not None:
            updated = await self.rt.client.patch_node_metadata(
                change.name,
                labels=change.labels or None,
                annotations=change.annotations or None,
                unschedulable=change.unschedulable,
                resource_version=change.version,
            )
            self.rt.node_view.record(updated)
        if change.condition is not None:
            updated = await self.rt.client.patch_node_conditions(change.name, [change.condition])
        assert updated is not None, "a write with nothing to write is returned before"
        return updated

    @staticmethod
    def _metadata_changes(
        ctx: _PassContext, plan: NodePlan, new_timing: Timing
    ) -> tuple[dict[str, str | None], dict[str, str | None]]:
        """The label and annotation values this plan changes (None deletes a key)."""
        nw_name = ctx.model.metadata.name
        labels: dict[str, str | None] = {}
        annotations: dict[str, str | None] = {}
        status_key = constants.status_label(nw_name)
        if node_labels(ctx.node).get(status_key) != plan.status.value and not _untouched(ctx, plan):
            labels[status_key] = plan.status.value
        new_state = replace(plan.state, admission=None)
        old_state = replace(ctx.stored, admission=None) if ctx.stored is not None else NodeState()
        if new_state != old_state:
            annotations[constants.state_annotation(nw_name)] = encode(new_state)
        if new_timing != ctx.timing:
            annotations[timing_annotation(nw_name)] = new_timing.encode()
        if plan.consume_admission and ctx.admission is not None:
            # Settled under this admission: it starts nothing more (see `plan.rollout`), in the same write.
            annotations[admission_annotation(nw_name)] = encode_admission(
                replace(ctx.admission, consumed=True)
            )
        return labels, annotations

    # ------------------------------------------------------------------------------------------------
    # Actions

    async def _execute(
        self, key: str, model: NodeWright, plan_nw: NodeWright, node: JSON, plan: NodePlan, now: datetime
    ) -> float | None:
        rt = self.rt
        node_name = str(node["metadata"]["name"])
        node_uid = node["metadata"].get("uid")
        requeue: list[float] = []
        for action in plan.actions:
            if isinstance(action, Drain):
                requeue.append(await self._drain(key, model.metadata.name, node_name, node_uid, action))
            elif isinstance(action, DeletePod):
                await self._delete_pod(node_name, action)
            elif isinstance(action, BindPod):
                if not await self._bind_pod(node_name, action):
                    requeue.append(REFUSED_RETRY)
            elif isinstance(action, CreateDriftCheck):
                try:
                    await self._create_drift_check(key, plan_nw, node_name, action)
                except ApiError as exc:
                    if not _refusal(exc):
                        raise
                    # Not a node failure: the check could not run. Said once, tried at the next slot.
                    log.warning("drift check refused", node=node_name, key=key, error=str(exc))
                    rt.metrics.domain.count_drift_check(nodewright=model.metadata.name, result="error")
            elif isinstance(action, CreatePod):
                try:
                    await self._create_pod(plan_nw, node_name, action)
                except ApiError as exc:
                    if not _refusal(exc):
                        raise
                    self._create_refused(key, node_name, action, exc, now)
                    requeue.append(REFUSED_RETRY)
            elif isinstance(action, Event):
                await self._event(model, node_name, node_uid, action)
            elif isinstance(action, RequeueAfter):
                requeue.append(action.seconds)
        return min(requeue) if requeue else None

    async def _drain(self, key: str, nw_name: str, node_name: str, node_uid: Any, action: Drain) -> float:
        """Evict (or delete) the pods; Events for what went and what was refused; seconds to look again."""
        report = await self.drainer.evict(key, action.pods, force=action.force)
        if report.evicted:
            spec = catalogue.node_draining(nw_name, len(report.evicted))
            await self.rt.events.record(
                kind="Node",
                name=node_name,
                uid=node_uid,
                reason=spec.reason.value,
                message=spec.message,
                related=nw_name,
            )
        if not report.any_blocked:
            return DRAIN_POLL
        spec = catalogue.node_drain_blocked(nw_name, "; ".join(report.blocked[:3]))
        await self.rt.events.record(
            kind="Node",
            name=node_name,
            uid=node_uid,
            reason=spec.reason.value,
            message=spec.message,
            event_type="Warning",
            related=nw_name,
        )
        return DRAIN_BLOCKED_POLL

    async def _delete_pod(self, node_name: str, action: DeletePod) -> None:
        if self._refused.pop((node_name, action.name), None) is not None:
            return  # never created: the planner has recorded the refusal as a failed attempt
        cached = self.rt.pods.get(f"{self.rt.options.namespace}/{action.name}")
        if cached is not None and (cached.get("metadata") or {}).get("deletionTimestamp"):
            return  # already terminating
        uid = (cached or {}).get("metadata", {}).get("uid")
        if self.rt.pod_expectations.deletion_pending(uid):
            return  # our DELETE was accepted; the watch has not shown the pod terminating yet
        gone = await self.rt.client.delete_pod(self.rt.options.namespace, action.name, uid=uid)
        if gone and uid:
            self.rt.pod_expectations.deleted(uid)
        log.info("package pod deleted", pod=action.name, node=node_name, reason=action.reason, existed=gone)

    async def _bind_pod(self, node_name: str, action: BindPod) -> bool:
        """Bind a pod created earlier (by this process or one before it); False: not bound now."""
        cached = self.rt.pods.get(f"{self.rt.options.namespace}/{action.name}")
        if cached is None or (cached.get("spec") or {}).get("nodeName"):
            return True  # gone, or bound meanwhile: the watch brings the next state
        if self.rt.pod_expectations.sealed_here(str((cached.get("metadata") or {}).get("uid") or "")):
            # Bound by this process already; the cache still holds the create's (unbound) copy, and a
            # second binding would only be answered 409 "already assigned".
            return True
        try:
            bound = await self.trust.bind(cached)
        except BindRefused as exc:
            # Until the permission is granted the pod waits unbound (nothing runs) and its stage
            # timeout ends the attempt; said on every try, it is an operator misconfiguration.
            log.warning("package pod binding refused", pod=action.name, node=node_name, error=str(exc))
            return False
        if bound:
            log.info("package pod bound", pod=action.name, node=node_name, reason="created before, unbound")
        return bound

    async def _create_pod(self, nw: NodeWright, node_name: str, action: CreatePod) -> None:
        pkg = nw.spec.packages[action.package]
        if action.stage not in INTERRUPT_STAGES and pkg.config_map:
            await self.configmaps.ensure(nw, action.package, pkg)
        for name, _, _ in action.chain:
            if nw.spec.packages[name].config_map:
                await self.configmaps.ensure(nw, name, nw.spec.packages[name])
        manifest = podspec.build_pod(
            nw,
            pkg,
            package_name=action.package,
            version=action.version,
            stage=action.stage,
            node=node_name,
            attempt=action.attempt,
            node_order=action.node_order,
            options=self.pod_options,
            interrupt=action.interrupt,
            repair=action.repair,
            run=action.run,
            chain=[
                podspec.ChainLink(name, nw.spec.packages[name], version, stage)
                for name, version, stage in action.chain
            ],
        )
        if manifest["metadata"]["name"] != action.name:
            # The planner and the builder disagree on the pod's identity: creating it would make the
            # planner treat it as a stranger and delete it, forever. Fail loudly instead.
            raise RuntimeError(
                f"pod name mismatch for {action.package}:{action.version} {action.stage.value}: "
                f"plan {action.name}, built {manifest['metadata']['name']}"
            )
        self.rt.signer.sign(manifest)
        created = await self._send_create(nw, node_name, action, manifest)
        if created is None:
            return
        # Checked against the manifest (a mutated pod is deleted and fails like a refused create),
        # remembered by uid and sealed: see `controller.trust`.
        await self.trust.adopt(created, manifest, nw=nw)

    async def _send_create(
        self, nw: NodeWright, node_name: str, action: CreatePod, manifest: JSON
    ) -> JSON | None:
        """POST the package pod; the created pod, or None when it exists already.

        The log is an audit trail of the pods the operator made: "creating package pod" is written
        before the request leaves (an operator killed while it is in flight still leaves the record
        of a pod that may exist), and the outcome after it: "package pod created" with its uid,
        "package pod exists", or "package pod not created" with the error (raised on to the caller).
        """
        fields: dict[str, Any] = {
            "pod": action.name,
            "node": node_name,
            "nodewright": nw.metadata.name,
            "package": action.package,
            "version": action.version,
            "stage": action.stage.value,
            "attempt": action.attempt,
            "chain": [name for name, _, _ in action.chain] or None,
        }
        log.info("creating package pod", **fields)
        try:
            created = await self.rt.client.create_pod(self.rt.options.namespace, manifest)
        except Conflict as exc:
            if not exc.already_exists:
                log.warning("package pod not created", **fields, error=str(exc))
                raise
            # Created by an earlier attempt of this same plan step -- or squatted by someone else's pod,
            # which the pod scan deletes as untrusted; the planner then creates it again.
            log.info("package pod exists", **fields)
            return None
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("package pod not created", **fields, error=str(exc) or type(exc).__name__)
            raise
        log.info("package pod created", **fields, uid=(created.get("metadata") or {}).get("uid"))
        return created

    def _create_refused(
        self, key: str, node_name: str, action: CreatePod, exc: ApiError, now: datetime
    ) -> None:
        """The API server refused the pod (422 invalid, 403 forbidden, 400, 404 namespace, ...).

        Retrying the same request cannot succeed, and a pod that is never created would leave the node
        `in_progress` forever. The refusal is handed to the planner as a failed attempt of that pod (with
        the API server's message), so the stage fails through its attempts and backoff, and the node ends
        `erroring` with the message on its condition, in the NodeWright status and in an Event.
        """
        message = f"the API server refused the pod: {exc}"[:1000]
        log.warning("package pod refused", pod=action.name, node=node_name, key=key, error=str(exc))
        self._refused[(node_name, action.name)] = PodSummary(
            name=action.name,
            package=action.package,
            version=action.version,
            stage=action.stage,
            attempt=action.attempt,
            spec_hash=action.spec_hash,
            created=now,
            outcome=PodOutcome.FAILED,
            message=message,
        )

    async def _event(self, model: NodeWright, node_name: str, node_uid: Any, event: Event) -> None:
        nw_name = model.metadata.name
        # One vocabulary (`api.events`): the plan names the reason, the catalogue says its type and
        # whether the NodeWright gets it too (its rollout history).
        reason, event_type = event.reason.value, event.type
        message = f"[{nw_name}] {event.message}"
        await self.rt.events.record(
            kind="Node",
            name=node_name,
            uid=node_uid,
            reason=reason,
            message=message,
            event_type=event_type,
            related=nw_name,
        )
        if catalogue.info(event.reason).also_on_nodewright:
            await self.rt.events.record(
                kind=constants.KIND_NODEWRIGHT,
                name=nw_name,
                uid=model.metadata.uid,
                reason=reason,
                message=f"[{node_name}] {event.message}",
                event_type=event_type,
            )

    async def _warn_once(
        self, key: str, problem: str, *, kind: str, name: str, uid: Any, reason: str, message: str
    ) -> None:
        marker = (key, problem)
        if marker in self._warned:
            return
        self._warned.add(marker)
        log.warning(message, key=key)
        await self.rt.events.record(
            kind=kind,
            name=name,
            uid=uid,
            reason=reason,
            message=message,
            event_type="Warning",
            related=split_node_key(key)[0] if kind == "Node" else None,
        )

    # ------------------------------------------------------------------------------------------------
    # Metrics and traces

    def _observe(self, ctx: _PassContext, plan: NodePlan, step: _Step) -> None:
        """The plan's transitions as metrics and spans: the node gate's spans (from the timing annotation
        before and after), each stage attempt that ended and each retry the planner reports
        (`plan.transitions`), the maintenance window, and the root of every trace this pass ended."""
        rt, domain, nw_name = self.rt, self.rt.metrics.domain, ctx.model.metadata.name
        node_name, now = ctx.inp.node.name, ctx.now
        rollout = _rollout_ref(ctx.model, node_name, step.trace.spans_into)
        if rollout is not None:
            for span in gate_spans(
                ctx.timing,
                step.timing,
                now=now,
                cordoned=step.cordon,
                uncordoned=step.uncordon,
                drain_skipped=plan.drain_skipped,
            ):
                rt.tracer.stage_finished(
                    rollout,
                    stage=span.stage,
                    started_at=span.started_at,
                    finished_at=span.finished_at,
                    error=span.error,
                )
        for moved in plan.transitions:
            if isinstance(moved, Retried):
                domain.count_retry(nodewright=nw_name, package=moved.package, version=moved.version)
                continue
            domain.observe_stage_duration(
                nodewright=nw_name, package=moved.package, stage=moved.stage, seconds=moved.seconds
            )
            if rollout is not None:
                rt.tracer.stage_finished(
                    rollout,
                    stage=moved.stage,
                    started_at=moved.started,
                    finished_at=moved.finished,
                    package=moved.package,
                    version=moved.version,
                    error=moved.error,
                )
        if step.uncordon and ctx.timing.cordoned_at is not None:
            seconds = (now - ctx.timing.cordoned_at).total_seconds()
            domain.observe_maintenance(nodewright=nw_name, seconds=seconds)
        self._end_traces(ctx.model, node_name, step.trace, now)

    def _end_traces(self, model: NodeWright, node_name: str, trace: TraceStep, now: datetime) -> None:
        """The root of every trace this pass ended (after its stage spans): settled under its admission,
        or abandoned; once, since the write that records it went through."""
        for end in trace.ended:
            ref = _rollout_ref(model, node_name, end.admission)
            if ref is None:
                continue
            settled = end.outcome in (RolloutEnd.COMPLETE, RolloutEnd.FAILED)
            self.rt.tracer.node_rollout_finished(
                ref,
                finished_at=now,
                packages={n: p.version for n, p in model.spec.packages.items()} if settled else None,
                error=end.reason or None,
                outcome=end.outcome,
            )

    # ------------------------------------------------------------------------------------------------
    # Leaving nodes

    @staticmethod
    def _settled(
        plan: NodePlan, pods: Sequence[PodSummary], drift_input: DriftInput | None, spec: NodeWright
    ) -> bool:
        """Deletion: nothing of this NodeWright runs or is due on the node, and no drift-check pod is
        left there (the plan removes an ended one; released first, nothing would: the NodeWright's
        finalizer waits for its pods). A run of a version the deletion `spec` does not hold is an
        inert marker (its pod, if any, is among `pods`): it never ends, so it does not hold the node."""
        if pods or (drift_input is not None and drift_input.pods) or plan.status != Status.COMPLETE:
            return False
        if any(isinstance(a, (CreatePod, Drain)) for a in plan.actions):
            return False
        return not any(e.state in ACTIVE_STATES and entry_in_spec(spec, e) for e in plan.state.packages)

    async def _unselected(
        self, key: str, model: NodeWright, node: JSON, stored: NodeState | None, pods: Sequence[JSON]
    ) -> PassOutcome:
        for pod in pods:
            meta = pod.get("metadata") or {}
            ended = classify(pod)[0] is not PodOutcome.RUNNING
            if is_drift_check(pod) and ended and not meta.get("deletionTimestamp"):
                # A check of a node the NodeWright no longer selects: its result concerns nobody, and
                # nothing else would remove it.
                reason = "drift check of a node the NodeWright no longer selects"
                await self._delete_pod(
                    str(node["metadata"]["name"]), DeletePod(str(meta.get("name")), reason)
                )
        if pods:
            # Work of ours is still running there: let it end (the pod's events bring us back).
            return Later(self.plan_options.poll_interval)
        await self._cleanup(
            node,
            model.metadata.name,
            stored,
            cordoned=bool(stored and stored.cordoned),
            trace_end=(model, RolloutEnd.UNSELECTED),
        )
        self.drainer.forget(key)
        return Done()

    async def _release_for_invalid_deletion(self, key: str, nw_name: str, node_name: str) -> PassOutcome:
        """A NodeWright with an invalid spec is being deleted: nothing can be planned, so once none of
        its pods runs on the node, let go of the node entirely (see `RolloutReconciler`)."""
        node = self.rt.node(node_name)
        if node is None:
            return Done()
        running = [
            p
            for p in self.rt.pods.by_index("node", node_name)
            if node_labels(p).get(constants.POD_LABEL_NODEWRIGHT) == nw_name
        ]
        if running:
            return Later(self.plan_options.poll_interval)
        try:
            state = node_state(node, nw_name)
        except MalformedNodeState:
            state = None
        # (An unreadable state cannot say whether we cordoned the node: a cordon then stays.)
        await self._cleanup(node, nw_name, state, cordoned=bool(state and state.cordoned), forget_state=True)
        self.drainer.forget(key)
        return Done()

    async def _cleanup(
        self,
        node: JSON,
        nw_name: str,
        state: NodeState | None,
        *,
        cordoned: bool,
        forget_state: bool = False,
        trace_end: tuple[NodeWright, RolloutEnd] | None = None,
    ) -> None:
        """Remove our condition, status label and timing; uncordon if we cordoned.

        A rollout trace still open in the timing annotation gets its root (`trace_end`: how it ended)
        once that annotation is gone.

        A node that is only no longer selected keeps its package entries (files of those versions remain
        on the host, D2): if it is selected again the machine continues from them. A NodeWright being
        deleted (`forget_state`) takes every key of its own with it — state and admission included —
        so that no deleted NodeWright leaves anything on a node.

        The condition goes first: once the status label is gone the rollout controller may release the
        finalizer, and nothing of ours may be left behind by then.
        """
        name = str(node["metadata"]["name"])
        without = await self._remove_condition(node, nw_name)
        if without is None:
            return
        node = without
        labels, annotations = _release_changes(node, nw_name, state, forget_state=forget_state)
        unschedulable = False if cordoned else None
        if not (labels or annotations or unschedulable is not None):
            return
        # Writing a state (not deleting it) must not resurrect an older one: guard it like `_write`.
        guarded = annotations.get(constants.state_annotation(nw_name)) is not None
        try:
            updated = await self.rt.client.patch_node_metadata(
                name,
                labels=labels or None,
                annotations=annotations or None,
                unschedulable=unschedulable,
                resource_version=_resource_version(node) if guarded else None,
            )
        except NotFound:
            return
        except Conflict:
            await self._refresh_node(name)
            self.rt.enqueue_node(nw_name, name)
            return
        self.rt.node_view.record(updated)
        if labels:
            self.rt.enqueue_rollout(nw_name)
        log.info("node released by nodewright", node=name, nodewright=nw_name, uncordoned=cordoned)
        if trace_end is not None and timing_annotation(nw_name) in annotations:
            self._end_abandoned_trace(name, read_timing(node_annotations(node), nw_name), *trace_end)

    async def _remove_condition(self, node: JSON, nw_name: str) -> JSON | None:
        """The node without our condition (None: the node is gone). Strategic merge: conditions merge
        by `type`; `$patch: delete` removes that element and leaves the kubelet's alone."""
        name = str(node["metadata"]["name"])
        condition_type = constants.node_condition_type(nw_name)
        if _condition_of(node, condition_type) is None:
            return node
        try:
            updated = await self.rt.client.patch(
                NODES,
                name,
                {"status": {"conditions": [{"type": condition_type, "$patch": "delete"}]}},
                patch_type=PatchType.STRATEGIC,
                subresource="status",
            )
        except NotFound:
            return None
        self.rt.node_view.record(updated)
        return self.rt.node(name) or updated

    def _end_abandoned_trace(self, node: str, timing: Timing, model: NodeWright, outcome: RolloutEnd) -> None:
        traced = timing.trace
        ref = _rollout_ref(model, node, traced) if traced is not None and not traced.ended else None
        if ref is not None:
            self.rt.tracer.node_rollout_finished(
                ref,
                finished_at=self.rt.clock(),
                error=describe_end(outcome, generation=model.metadata.generation),
                outcome=outcome,
            )


# ----------------------------------------------------------------------------------------------------
# Pure helpers


def _failed_chained_run(summary: PodSummary) -> tuple[str, str, PackageStage, int] | None:
    """(package, version, stage, attempt) of the chained run a failed pod stopped in, if it got past its
    own run: the first chained run not complete, at its first stage not done (its attempt 1)."""
    if not summary.chain or len(completed_stages(summary)) < len(summary.stages):
        return None
    for run in summary.chain:
        done = run_completed_stages(run.progress, run.stages, succeeded=False)
        if len(done) < len(run.stages):
            return run.package, run.version, run.stages[len(done)], 1
    return None


def _release_changes(
    node: JSON, nw_name: str, state: NodeState | None, *, forget_state: bool
) -> tuple[dict[str, str | None], dict[str, str | None]]:
    """The label and annotation changes that let go of a node (`NodeReconciler._cleanup`)."""
    labels, annotations = node_labels(node), node_annotations(node)
    status_key, state_key = constants.status_label(nw_name), constants.state_annotation(nw_name)
    patch_labels: dict[str, str | None] = {status_key: None} if status_key in labels else {}
    patch_annotations: dict[str, str | None] = {}
    if timing_annotation(nw_name) in annotations:
        patch_annotations[timing_annotation(nw_name)] = None
    kept = replace(state, admission=None, cordoned=False, interrupt_at=None) if state else None
    if forget_state or kept is None or not kept.packages:
        if state_key in annotations and (forget_state or kept is not None):
            patch_annotations[state_key] = None
        if forget_state and admission_annotation(nw_name) in annotations:
            patch_annotations[admission_annotation(nw_name)] = None
    elif encode(kept) != annotations.get(state_key):
        patch_annotations[state_key] = encode(kept)
    return patch_labels, patch_annotations


def _resource_version(node: JSON) -> str | None:
    return str(node["metadata"].get("resourceVersion") or "") or None


def _refusal(exc: ApiError) -> bool:
    """A 4xx answer to a create that no retry of the same request can change."""
    status = getattr(exc, "status", None)
    return isinstance(status, int) and 400 <= status < 500 and status not in (408, 409, 429)


def _untouched(ctx: _PassContext, plan: NodePlan) -> bool:
    """A node this NodeWright has never touched and that only waits for its batch.

    It gets no label and no condition: "no label" reads as waiting (rollout status, metrics,
    `nodewright plan`), and labelling every node of a 10,000-node fleet the moment a NodeWright appears
    would be 10,000 writes queued in front of the first batch's (N / --qps seconds of delay).
    """
    current = node_labels(ctx.node).get(constants.status_label(ctx.model.metadata.name))
    return ctx.stored is None and current is None and plan.status is Status.WAITING


def _deletion_spec(effective: NodeWright, state: NodeState, pods: Sequence[JSON] = ()) -> NodeWright:
    """What a node must still do while its NodeWright is deleted: uninstalls and runs in flight only.

    Packages without uninstall support are left as they are on the host (files remain, D2); a package
    this node never installed is not installed on the way out. A run chained into a package pod of the
    node (`nodewright.io/chain`) is in flight although it has no entry yet: its package stays, so the
    pod runs to its end, the run is recorded, and its uninstall follows.
    """
    carried = {
        name
        for pod in pods
        for name, _, _ in podspec.parse_chain(
            ((pod.get("metadata") or {}).get("annotations") or {}).get(constants.POD_ANNOTATION_CHAIN)
        )
        or ()
    }
    keep = {}
    for name, pkg in effective.spec.packages.items():
        entries = state.entries_for(name)
        uninstall = bool(pkg.uninstall and pkg.uninstall.enabled and pkg.uninstall.apply)
        # Only a run of the spec's version is in flight: an entry of another version left in progress
        # when the spec moved on (A -> B -> A, an undo) is an inert marker that never ends.
        in_flight = name in carried or any(
            e.state in ACTIVE_STATES and entry_in_spec(effective, e) for e in entries
        )
        if (uninstall and entries) or in_flight:
            keep[name] = pkg
    spec = effective.spec.model_copy(update={"packages": keep})
    return effective.model_copy(update={"spec": spec})


def _condition_body(node: JSON, condition: NodeCondition, now: datetime) -> JSON | None:
    """The condition entry to write, or None when the node already says the same thing."""
    message = condition.message[:CONDITION_MESSAGE_LIMIT]
    current = _condition_of(node, condition.type)
    if (
        current is not None
        and current.get("status") == condition.status
        and current.get("reason") == condition.reason
        and current.get("message") == message
    ):
        return None
    transition = (
        current.get("lastTransitionTime")
        if current is not None and current.get("status") == condition.status
        else None
    ) or ts(now)
    return {
        "type": condition.type,
        "status": condition.status,
        "reason": condition.reason,
        "message": message,
        "lastTransitionTime": transition,
        "lastHeartbeatTime": ts(now),
    }


def _condition_of(node: JSON, condition_type: str) -> Mapping[str, Any] | None:
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == condition_type:
            return dict(cond)
    return None


def _ordering_inputs(nodewright: JSON) -> tuple[object, ...]:
    """What the ordering facts read of a NodeWright object: its spec (generation), pause, disable and
    deletion. Not its resourceVersion: every status write of the rollout changes that."""
    meta = nodewright.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return (
        meta.get("name"),
        meta.get("generation"),
        bool(meta.get("deletionTimestamp")),
        annotations.get(constants.ANNOTATION_PAUSE),
        annotations.get(constants.ANNOTATION_DISABLE),
    )


def _active_deadline(pod: JSON) -> float | None:
    """The pod's `activeDeadlineSeconds` (kept by `kube.trim.trim_pod`), None when it has none."""
    value = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    return float(value) if isinstance(value, int) and value > 0 else None


def _traced(admission: Admission | None) -> TracedAdmission | None:
    if admission is None:
        return None
    return TracedAdmission(
        compartment=admission.compartment,
        batch=admission.batch,
        order=admission.order,
        at=admission.at,
        fingerprint=admission.fingerprint,
    )


def _failure(plan: NodePlan) -> str:
    """Why a node settled erroring: each package that gave up, with its error."""
    gave_up = [
        f"{e.name} {e.version} ({e.stage.value}): {e.error or 'failed'}"
        for e in plan.state.packages
        if e.state is PackageState.ERRORING
    ]
    return truncate_error("; ".join(gave_up)) if gave_up else "a package gave up"


def _rollout_ref(model: NodeWright, node: str, admission: TracedAdmission | None) -> NodeRollout | None:
    if admission is None:
        return None
    picked = parse_ts_or_none(admission.at)
    if picked is None:
        return None
    return NodeRollout(
        nodewright=model.metadata.name,
        nodewright_uid=model.metadata.uid or "",
        node=node,
        picked_at=picked,
        batch=admission.batch,
        compartment=admission.compartment,
        fingerprint=admission.fingerprint,
    )
