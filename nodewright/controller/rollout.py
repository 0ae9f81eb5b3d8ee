"""The rollout controller: which nodes of a NodeWright may start work, and the NodeWright's status.

One reconcile per NodeWright key. It reads only caches, asks the pure planner (`plan.rollout`) which
nodes to admit, and writes:

- admissions on nodes (annotation `nodewright.io/batch.<nw>`, this controller is its only writer), and
  their removal when the planner releases a node or the NodeWright is gone;
- the NodeWright status (aggregates only: counts, compartments with batch state, conditions), with a
  merge patch that carries just the difference, so an unchanged status costs no write;
- the runtime-required taints (see `controller.taints`);
- Events for transitions (status changes, halted compartments, batches started);
- the finalizer: added on first sight, released once deletion has converged on every node.

Node-level work (stages, cordon, drain) is the node controller's; a status-label change on a node
enqueues this controller again, so batches settle as soon as their last node finishes.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

import structlog

from nodewright.api import constants
from nodewright.api.admission import admission_annotation, encode_admission
from nodewright.api.models import (
    Condition,
    NodeWright,
    Status,
)
from nodewright.api.nodeobject import node_annotations, node_condition, node_labels, node_status, node_timing
from nodewright.api.nodestate import NodeState, PackageState
from nodewright.api.reasons import (
    HELD_AT_GATE,
    Activity,
    DrainSkipped,
    NodeConditionReason,
    Predecessor,
    condition_reason,
    drain_held,
)
from nodewright.controller import taints
from nodewright.controller.budgets import SharedBudgets, merge_patch
from nodewright.controller.configmaps import PackageConfigMaps
from nodewright.controller.gates import GateEvaluator, GateResults, SecretReader
from nodewright.controller.notify import RolloutNotifications
from nodewright.controller.podcosts import PENDING_RETRY, CostsPending, CostsReady, CostsView, PodCosts
from nodewright.controller.revisions import RevisionKeeper
from nodewright.controller.runtime import Runtime
from nodewright.kube.resources import JSON, NODEWRIGHTS, Conflict, NotFound
from nodewright.kube.workqueue import Result
from nodewright.observability import events
from nodewright.observability.metrics import (
    HELD_BY_DRAIN,
    HELD_BY_PROTECTED_PODS,
    CompartmentSnapshot,
    NodeWrightSnapshot,
    count_package_nodes,
    strategy_label,
)
from nodewright.plan import disruption, sequencing
from nodewright.plan import gates as gate_plan
from nodewright.plan.configdiff import config_digest
from nodewright.plan.node import is_disabled, is_paused
from nodewright.plan.podspec import package_configmap_name as podspec_configmap_name
from nodewright.plan.revisions import UndoHint, spec_hash, undo_hint
from nodewright.plan.rollout import (
    APPROVE_ANNOTATION,
    Phase,
    RolloutNode,
    RolloutPlan,
    format_approvals,
    parse_approvals,
    phase_of,
)
from nodewright.plan.rollout_input import (
    NodeContext,
    NodeEntry,
    NodePods,
    RolloutInput,
    RolloutOptions,
    derive_node,
    rollout_input,
)
from nodewright.plan.stages import ts
from nodewright.plan.status import (
    RUNTIME_TAINT_HELD,
    NodeReport,
    PackageReport,
    StatusSummary,
    aggregate_status,
    report_for,
    runtime_taint_condition,
)

log = structlog.get_logger("nodewright.rollout")

RESYNC_ACTIVE = 60.0
"""Safety-net resync while nodes are in flight; progress itself is event-driven."""
BUDGET_RETRY = 1.0
"""Seconds before a pass whose DisruptionBudget writes kept conflicting is tried again."""
ADMISSION_WRITE_DEADLINE = 60.0
"""Seconds one admission write may take, the client's retries included; past it the pass fails and is
retried (`RolloutReconciler._write_admissions`)."""
FILL_REQUEUE = 0.05
"""Seconds before the pass that admits the rest of a batch the last pass left (`--admissions-per-pass`):
at once: its admissions are in the write-through node view already, and other keys' work interleaves."""


@dataclass(frozen=True, slots=True)
class _NodeView:
    """A selected node as the later phases of a pass read it.

    The decoded state annotation is not kept (at fleet scale it was most of the memo's memory): what
    later phases need of it is in the entry's `NodeReport` (packages, for status and metrics) and in
    `oldest_started`, the earliest start of a package stage in progress on the node (metrics).
    """

    node: Mapping[str, Any]
    status: Status | None
    condition: NodeConditionReason | None = None  # the code of the node condition of this NodeWright
    oldest_started: datetime | None = None
    evictions_refused: bool = False  # the node controller's timing annotation says so (`api.timing`)
    held_at_gate: NodeConditionReason | None = field(init=False)
    """The gate reason of an admitted node in progress (protected pods, drain), else None."""
    drain_held: bool = field(init=False)
    """Admitted, and its drain cannot progress: an eviction refused, or the drain timeout passed."""

    def __post_init__(self) -> None:
        # Once per node object, not on every pass (metrics and status read both for every node).
        held = (
            self.condition if self.status is Status.IN_PROGRESS and self.condition in HELD_AT_GATE else None
        )
        object.__setattr__(self, "held_at_gate", held)
        blocked = held is not None and drain_held(self.condition, evictions_refused=self.evictions_refused)
        object.__setattr__(self, "drain_held", blocked)


@dataclass(frozen=True, slots=True)
class _NodeEntry:
    """What one pass derived from one node object; reused while the node's resourceVersion is the same.

    `entry` is the planner input's part (`plan.rollout_input.derive_node`); `view` and `report` are
    None for a node the NodeWright does not select. `resource_version` is the node object's, or empty
    for an entry no later pass may reuse (`NodeEntry.reusable`), which no node's version equals.
    """

    resource_version: str
    entry: NodeEntry
    view: _NodeView | None = None
    report: NodeReport | None = None


@dataclass(slots=True)
class _SharedReports:
    """Equal package reports of different nodes as one object.

    A fleet sits in few distinct package states (most nodes complete at the spec versions, the rest at a
    handful of stages), but each node's reports are decoded from its own annotation: without sharing,
    every node would keep its own copies of the same names, versions and digests.
    """

    packages: dict[PackageReport, PackageReport] = field(default_factory=dict)
    tuples: dict[tuple[PackageReport, ...], tuple[PackageReport, ...]] = field(default_factory=dict)

    def share(self, reports: Iterable[PackageReport]) -> tuple[PackageReport, ...]:
        shared = tuple(self.packages.setdefault(r, r) for r in reports)
        return self.tuples.setdefault(shared, shared)

    def adopt(self, reports: tuple[PackageReport, ...]) -> None:
        """Share from now on the reports an entry already holds (so later equal ones are that object)."""
        for report in reports:
            self.packages.setdefault(report, report)
        self.tuples.setdefault(reports, reports)

    def __len__(self) -> int:
        return len(self.packages) + len(self.tuples)


@dataclass(slots=True)
class _Memo:
    """Per-node results of the previous pass, valid for one `NodeContext.key` (`context`)."""

    context: tuple[Any, ...] = ()
    entries: dict[str, _NodeEntry] = field(default_factory=dict)
    shared: _SharedReports = field(default_factory=_SharedReports)

    def prune_shared(self) -> None:
        """Keep the shared reports bounded by what the entries use: states nodes have left behind go
        (without this a long rollout would keep every state any node ever passed through)."""
        if len(self.shared) <= 2 * len(self.entries) + 64:
            return
        self.shared = _SharedReports()
        for entry in self.entries.values():
            if entry.report is not None:
                self.shared.adopt(entry.report.packages)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """What one rollout pass plans from (see `RolloutReconciler._snapshot`): the planner's input and,
    per selected node, what the status and metrics read."""

    inp: RolloutInput
    nodes: list[JSON]
    matched: list[JSON]
    views: list[_NodeView]
    reports: list[NodeReport]

    @property
    def nodewright(self) -> NodeWright:
        return self.inp.nodewright  # the effective spec (deletion turns into uninstalls)

    @property
    def now(self) -> datetime:
        return self.inp.now

    @property
    def fingerprint(self) -> str:
        return self.inp.fingerprint

    @property
    def rollout_nodes(self) -> Sequence[RolloutNode]:
        return self.inp.nodes


def _oldest_started(state: NodeState | None) -> datetime | None:
    """The earliest start of a package stage in progress on the node (None: nothing in progress)."""
    oldest: datetime | None = None
    for entry in state.packages if state is not None else ():
        if entry.state is PackageState.IN_PROGRESS and entry.started:
            started = datetime.fromisoformat(entry.started.replace("Z", "+00:00"))
            oldest = started if oldest is None or started < oldest else oldest
    return oldest


class RolloutReconciler:
    def __init__(
        self,
        rt: Runtime,
        budgets: SharedBudgets | None = None,
        notifications: RolloutNotifications | None = None,
        pod_costs: PodCosts | None = None,
    ) -> None:
        self.rt = rt
        # Disruption costs for `nodeOrder: idleFirst` (controller.podcosts); None: never counted.
        self.pod_costs = pod_costs
        self.budgets = budgets  # shared DisruptionBudgets (controller.budgets); None: none are watched
        self.notifications = notifications  # webhook sinks (controller.notify); None: nothing is sent
        self._halted: dict[str, frozenset[str]] = {}
        self._last_status: dict[str, str] = {}
        self._compute: dict[str, float] = {}
        self._memo: dict[str, _Memo] = {}
        # NodeWright -> compartment -> admitted nodes still working on the current spec: the open batch.
        self._open: dict[str, dict[str, set[str]]] = {}
        self._deletion_warned: dict[str, str] = {}  # NodeWright -> reason of the DeletionBlocked Event sent
        self._fingerprint: dict[str, str] = {}  # NodeWright -> spec fingerprint of the last pass
        self._pruned: dict[str, str] = {}  # NodeWright -> fingerprint whose old package ConfigMaps are gone
        # Every NodeWright's completion per node, for ordering and the runtime-required taint: a node's
        # state is decoded again only when its annotation text changed (`sequencing.CompletionMemo`).
        self._completion = sequencing.CompletionMemo()
        self.configmaps = PackageConfigMaps(rt.client, namespace=rt.options.namespace)
        self.revisions = RevisionKeeper(rt.client, namespace=rt.options.namespace)
        # Health gates between batches: the latest results per NodeWright (`controller.gates`).
        self.gate_results = GateResults()
        self.gate_evaluator = GateEvaluator(SecretReader(rt.client, rt.options.namespace), rt.node)

    def settles_batch(self, name: str, node: str, labels: Mapping[str, str]) -> bool:
        """Whether this node update ends the last in-flight node of its batch (as of the last pass).

        Node events delay the rollout pass to coalesce bursts (see `Operator._rollout_soon`), but the
        event that settles a batch is the one the next batch waits for: it gets a pass at once.
        """
        compartments = self._open.get(name)
        if not compartments:
            return False
        working = (Status.IN_PROGRESS.value, Status.WAITING.value, Status.DRIFTED.value)
        if labels.get(constants.status_label(name)) in working:
            return False
        for members in compartments.values():
            if node in members:
                members.discard(node)
                return not members
        return False

    def compute_seconds(self, name: str) -> float:
        """Event-loop time the last pass of `name` spent computing (its awaits not counted)."""
        return self._compute.get(name, 0.0)

    # -- entry ------------------------------------------------------------------------------------

    async def reconcile(self, name: str) -> Result | None:
        rt = self.rt
        started = time.monotonic()
        obj, model, error = rt.nodewright(name)
        if obj is None:
            self._forget(name)
            return None
        if model is None:
            await self._report_invalid(obj, error or "invalid spec")
            if (obj.get("metadata") or {}).get("deletionTimestamp"):
                return await self._finish_invalid_deletion(obj)
            return None
        deleting = bool(model.metadata.deletion_timestamp)
        if not deleting and constants.FINALIZER not in (model.metadata.finalizers or []):
            await self._add_finalizer(obj)
        history = () if deleting else await self.revisions.observe(obj)
        undo = undo_hint(name, history, current_hash=spec_hash(obj.get("spec") or {}))
        costs = None if deleting else self._costs(model)  # a deletion admits nothing: no order to wait for
        if isinstance(costs, CostsPending):
            return Result(requeue_after=PENDING_RETRY)  # idleFirst: never take a batch before the counts
        snap = self._snapshot(name, model, costs.pods if isinstance(costs, CostsReady) else None)
        plan = await self._secure(snap)
        if plan is not None and plan.gate_checks:
            # Health gates are due: evaluate them (each with a deadline) and plan with their results.
            await self.gate_results.evaluate_due(self.gate_evaluator, name, plan.gate_checks, now=snap.now)
            snap = replace(
                snap, inp=snap.inp.with_gate_results(self.gate_results.merged(name, snap.inp.gate_results))
            )
            plan = await self._secure(snap)
        if plan is None:
            return Result(requeue_after=BUDGET_RETRY)  # budget writers kept conflicting: nothing written
        compute = time.monotonic() - started
        # Taints first: a new node must be tainted before its admission marks it as touched.
        taint_report = await taints.reconcile_runtime_taints(
            rt, snap.nodewright, snap.matched, all_names=snap.inp.all_nodewrights, completion=self._completion
        )
        started = time.monotonic()
        summary, status = self._status(snap, model, plan, taint_report, undo)
        self._compute[name] = compute + time.monotonic() - started
        # The status (batch state) is written before the admissions it opens: a reader then never sees
        # admissions newer than the batch state that counts them (`nodewright plan` reads until both show
        # one moment: `plan.preview.check_snapshot`), and a crash between the two writes only delays the
        # opened batch (re-planning opens it again, with the same nodes).
        await self._write_status(obj, status)
        await self._apply_admissions(name, plan, snap.inp.dead)
        if self.budgets is not None:
            self.budgets.admitted(name)
        await self._after_writes(obj, model, snap, plan, summary.status.status, undo)
        if deleting:
            return await self._finish_deletion(obj, model, snap.nodes)
        return Result(requeue_after=self._requeue(snap, plan))

    async def _after_writes(
        self,
        obj: JSON,
        model: NodeWright,
        snap: _Snapshot,
        plan: RolloutPlan,
        status: Status | None,
        undo: UndoHint | None = None,
    ) -> None:
        """What follows the status and admission writes: annotations consumed, Events, notifications
        (a halt's names `undo`, the revision to go back to), ConfigMaps pruned, metrics, and the batches
        that are open now."""
        name = model.metadata.name
        if (snap.inp.reset_requested and plan.reset_applied) or snap.inp.reset_compartments:
            await self._clear_reset_annotation(name)
        if plan.approvals_applied:
            await self._clear_approvals(obj, plan)
        self._fingerprint[name] = snap.fingerprint
        await self._emit_transitions(model, plan, status, snap.inp.malformed, snap.rollout_nodes)
        if self.notifications is not None:
            self.notifications.after_pass(
                model,
                plan,
                status,
                snap.rollout_nodes,
                fingerprint=snap.fingerprint,
                now=snap.now,
                conditions={
                    str(v.node["metadata"]["name"]): m
                    for v in snap.views
                    if (m := _condition_text(v.node, name)) is not None
                },
                drain_blocked=_drain_blocked(snap.views),
                rollout_key=snap.inp.epoch.key,
                undo=undo,
            )
        await self._prune_configmaps(model, status, snap.fingerprint)
        self._update_metrics(name, snap, plan, status)
        self._open[name] = _open_batches(snap.rollout_nodes, snap.fingerprint, plan)

    def _forget(self, name: str) -> None:
        self.rt.metrics.domain.remove_nodewright(name)
        self.revisions.forget(name)
        self.gate_results.forget(name)
        if self.notifications is not None:
            self.notifications.forget(name)
        for memory in (
            self._halted,
            self._last_status,
            self._compute,
            self._memo,
            self._open,
            self._fingerprint,
            self._pruned,
        ):
            memory.pop(name, None)

    def _costs(self, model: NodeWright) -> CostsView | None:
        """The pod counts, when the NodeWright's policy orders a compartment `idleFirst`."""
        wanted = model.spec.deployment_policy
        if self.pod_costs is None or not wanted or not disruption.opted_in(self.rt.policy(wanted)):
            return None
        return self.pod_costs.view()

    def _snapshot(self, name: str, model: NodeWright, node_pods: NodePods | None = None) -> _Snapshot:
        """The NodeWright's nodes as the planner sees them, from the caches (`plan.rollout_input`)."""
        rt = self.rt
        nodes = rt.node_view.newest(rt.nodes.objects())
        names = (str(o["metadata"]["name"]) for o in rt.nodewrights.objects())
        nodewrights = {other: rt.nodewright(other)[1] for other in names}
        nodewrights[name] = model
        wanted = model.spec.deployment_policy
        policy = rt.policy(wanted) if wanted else None
        inp = rollout_input(
            model,
            nodes=nodes,
            nodewrights=nodewrights,
            policies={wanted: policy} if wanted and policy is not None else {},
            now=rt.clock(),
            options=RolloutOptions(
                admission_limit=rt.options.admissions_per_pass,
                runtime_taint_key=rt.options.runtime_required_taint_key,
            ),
            entries=lambda ctx, objects: self._entries(name, ctx, objects),
            completion=self._completion,
            node_pods=node_pods,
        )
        memo = self._memo[name].entries
        self._enqueue_strays(name, nodes, inp.entries)
        selected = [memo[e.name] for e in inp.entries if e.rollout is not None]
        return _Snapshot(
            inp=inp.with_gate_results(self.gate_results.merged(name, inp.gate_results)),
            nodes=nodes,
            matched=[n for n, e in zip(nodes, inp.entries, strict=True) if e.matched],
            views=[e.view for e in selected if e.view is not None],
            reports=[e.report for e in selected if e.report is not None],
        )

    async def _secure(self, snap: _Snapshot) -> RolloutPlan | None:
        """The plan, with the slots of shared DisruptionBudgets recorded before anything else is written
        (None: other writers kept changing the budgets; `controller.budgets`)."""
        if self.budgets is None:
            return snap.inp.plan()
        secured = await self.budgets.plan(
            snap.inp.name,
            nodes=snap.nodes,
            rollout_nodes=snap.rollout_nodes,
            fingerprint=snap.fingerprint,
            now=snap.now,
            replan=lambda shared: snap.inp.with_budgets(shared).plan(),
        )
        return None if secured is None else secured.plan

    def _status(
        self,
        snap: _Snapshot,
        model: NodeWright,
        plan: RolloutPlan,
        taint_report: taints.TaintReport,
        undo: UndoHint | None = None,
    ) -> tuple[StatusSummary, dict[str, Any]]:
        """The NodeWright status to write: aggregates, compartments, conditions (a Halted one names
        `undo`, the revision to go back to)."""
        extra = [
            self._taint_condition(model, taint_report, snap.now),
            self._predecessor_condition(model, plan, snap),
        ]
        if model.metadata.deletion_timestamp:
            extra.append(self._deletion_condition(model, snap.now))
        summary = aggregate_status(
            snap.nodewright,
            nodes=snap.reports,
            plan=plan,
            now=ts(snap.now),
            paused=snap.inp.paused,
            disabled=snap.inp.disabled,
            waiting_for_sequencing=snap.inp.sequencing_blocker,
            malformed_nodes=snap.inp.malformed,
            extra_conditions=extra,
            undo=undo,
        )
        status = summary.to_json_dict()
        status["waitingReasons"] = waiting_counts(plan, snap.views)
        status["nodesMatched"] = len(snap.matched)
        status["rolloutFingerprint"] = snap.fingerprint
        status["rolloutFirstOrder"] = snap.inp.epoch.first_order
        status["nextOrder"] = plan.next_order
        self._add_compartment_details(status, plan)
        return summary, status

    def _requeue(self, snap: _Snapshot, plan: RolloutPlan | None = None) -> float:
        if plan is not None and plan.deferred:
            return FILL_REQUEUE  # the rest of an open batch is admitted by the next pass
        in_flight = any(v.status in (Status.IN_PROGRESS, Status.ERRORING) for v in snap.views)
        requeue = RESYNC_ACTIVE if in_flight else self.rt.options.resync_seconds
        wake_at = plan.wake_at if plan is not None else None
        if wake_at is not None:  # a soak ends or a maintenance window opens or closes
            requeue = min(requeue, max(1.0, (wake_at - snap.now).total_seconds() + 0.5))
        for node in snap.rollout_nodes:
            if isinstance(node.blocked, DrainSkipped):  # retried once the drain timeout passed again
                retry = (node.blocked.retry_at - snap.now).total_seconds()
                requeue = min(requeue, max(1.0, retry + 0.5))
        return requeue

    # -- inputs -----------------------------------------------------------------------------------

    def _entries(self, name: str, ctx: NodeContext, nodes: Sequence[Mapping[str, Any]]) -> list[NodeEntry]:
        """One entry per node, derived again only for nodes that changed since the last pass.

        A pass used to re-derive every node (selector match, state annotation decode, taints, reports):
        O(fleet) of CPU for every batch step while a few nodes had changed. Everything in an entry is
        a function of the node object and the context (`NodeContext.key`), so the node's
        resourceVersion and that key index the cache; the rollout planner itself still sees every node.
        """
        context = ctx.key()
        memo = self._memo.setdefault(name, _Memo())
        if memo.context != context:
            memo.entries, memo.shared = {}, _SharedReports()
        previous = memo.entries
        fresh: dict[str, _NodeEntry] = {}
        out: list[NodeEntry] = []
        for node in nodes:
            meta = node["metadata"]
            node_name: str = meta["name"]  # cached nodes are trimmed: both are strings
            rv: str = meta.get("resourceVersion") or ""
            entry = previous.get(node_name)
            if entry is None or entry.resource_version != rv or not rv:
                entry = self._entry(ctx, node, rv, memo.shared)
            fresh[node_name] = entry
            out.append(entry.entry)
        memo.context, memo.entries = context, fresh
        memo.prune_shared()
        return out

    def _entry(
        self, ctx: NodeContext, node: Mapping[str, Any], rv: str, shared: _SharedReports
    ) -> _NodeEntry:
        derived = derive_node(ctx, node)
        entry = derived.entry
        rv = rv if entry.reusable else ""
        if entry.admission_error is not None:
            log.warning("ignoring malformed admission", node=entry.name, error=entry.admission_error)
        rnode = entry.rollout
        if rnode is None:
            return _NodeEntry(rv, entry)
        found = node_condition(node, ctx.name)
        view = _NodeView(
            node=node,
            # A node whose state does not decode counts blocked (StateMalformed), whatever its label.
            status=Status.BLOCKED if entry.state_error is not None else node_status(node, ctx.name),
            condition=condition_reason(found.reason) if found is not None else None,
            oldest_started=_oldest_started(derived.state),
            evictions_refused=node_timing(node, ctx.name).drain_blocked,
        )
        return _NodeEntry(rv, entry, view, self._report(derived.state, rnode, shared))

    def _report(self, state: NodeState | None, node: RolloutNode, shared: _SharedReports) -> NodeReport:
        packages = shared.share(
            PackageReport(
                name=e.name,
                version=e.version,
                stage=e.stage.value,
                state=e.state.value,
                config=config_digest(e.config_map) if e.config else "",
                drifted=bool(e.drifted),
            )
            for e in (state.packages if state is not None else ())
        )
        return report_for(node.name, node.status, needs_work=node.needs_work, packages=packages)

    def _predecessor_condition(self, model: NodeWright, plan: RolloutPlan, snap: _Snapshot) -> Condition:
        """`WaitingForNodeWright`: nodes (or the whole NodeWright, `sequencing: all`) wait for an earlier
        NodeWright; reason `PredecessorPaused` when that one is paused, since then it never finishes by
        itself (the waiting nodes show only `waiting` otherwise)."""
        counts: Counter[str] = Counter(
            w.detail.name for w in plan.waiting if isinstance(w.detail, Predecessor)
        )
        everywhere = snap.inp.sequencing_blocker
        if everywhere:
            counts[everywhere] = max(counts[everywhere], len(snap.rollout_nodes))
        paused = sorted(n for n in counts if snap.inp.inactive.get(n) is Activity.PAUSED)
        parts = []
        for other, n in sorted(counts.items()):
            why = ", which is paused: resume it to let this rollout go on" if other in paused else ""
            parts.append(f"{n} node(s) wait for NodeWright {other!r} (earlier by priority/sequencing){why}")
        previous = {c.type: c for c in (model.status.conditions or [])} if model.status else {}
        status: Literal["True", "False"] = "True" if counts else "False"
        old = previous.get(WAITING_FOR_NODEWRIGHT)
        return Condition(
            type=WAITING_FOR_NODEWRIGHT,
            status=status,
            reason="PredecessorPaused" if paused else "PredecessorIncomplete" if counts else "NotWaiting",
            message="; ".join(parts)[:1024],
            last_transition_time=old.last_transition_time if old and old.status == status else ts(snap.now),
            observed_generation=model.metadata.generation,
        )

    def _taint_condition(self, model: NodeWright, report: taints.TaintReport, now: datetime) -> Condition:
        held = runtime_taint_condition(report.held_while_inactive, generation=model.metadata.generation)
        previous = {c.type: c for c in (model.status.conditions or [])} if model.status else {}
        old = previous.get(RUNTIME_TAINT_HELD)
        since = old.last_transition_time if old and old.status == held.status else ts(now)
        return held.model_copy(update={"last_transition_time": since})

    # -- writes -----------------------------------------------------------------------------------

    async def _annotate_node(self, node: str, key: str, value: str | None) -> bool:
        """Set (or with None remove) one annotation of ours; False when the node is gone (its delete
        event brings the next pass, which no longer counts it)."""
        try:
            written = await self.rt.client.patch_node_metadata(node, annotations={key: value})
        except NotFound:
            log.info("node gone before its admission was written", node=node, annotation=key)
            return False
        self.rt.node_view.record(written)
        return True

    async def _release_finalizer(self, name: str, meta: JSON, why: str) -> None:
        finalizers = [f for f in meta.get("finalizers") or [] if f != constants.FINALIZER]
        if len(finalizers) == len(meta.get("finalizers") or []):
            return
        try:
            await self.rt.client.patch(
                NODEWRIGHTS,
                name,
                {"metadata": {"finalizers": finalizers or None, "resourceVersion": meta["resourceVersion"]}},
            )
        except NotFound:
            return  # released by an earlier pass whose watch event has not arrived: the object is gone
        log.info(why, nodewright=name)

    async def _apply_admissions(self, name: str, plan: RolloutPlan, dead: Sequence[str]) -> None:
        """Writes the plan's admissions, after its releases and the removal of `dead` admissions (of
        another rollout, `plan.rollout_epoch.dead_admissions`).

        Up to `--admission-writers` writes are in flight at once, started in the plan's order (critical
        path first, `plan.rollout`); each written node is enqueued at once, releases on the node queue,
        admissions on its start lane (pod starts paced behind reactions, `Operator`), so a batch's nodes
        are in flight while the rest of it is still being written."""
        rt = self.rt
        key = admission_annotation(name)
        # Releases first: a node released and picked again in one plan must end up admitted.
        releases = [(node, None) for node in sorted({*plan.releases, *dead})]
        await self._write_admissions(key, releases, lambda node: rt.enqueue_node(name, node))
        admissions = [(a.node, encode_admission(a.admission)) for a in plan.admissions]
        await self._write_admissions(key, admissions, lambda node: rt.start_node(name, node))
        started: dict[tuple[str, int], list[str]] = {}
        for admitted in plan.admissions:
            started.setdefault((admitted.admission.compartment, admitted.admission.batch), []).append(
                admitted.node
            )
        for (compartment, batch), nodes in sorted(started.items()):
            cplan = plan.compartments.get(compartment)
            if cplan is not None and cplan.opened:  # one Event per batch, not one per pass that fills it
                planned = cplan.status.batch_state.planned_size if cplan.status.batch_state else len(nodes)
                await self._event(name, events.batch_started(compartment, batch, nodes, planned=planned))
        if plan.admissions:
            log.info(
                "admitted nodes",
                nodewright=name,
                nodes=len(plan.admissions),
                batches=sorted({f"{c}#{b}" for c, b in started}),
                deferred=plan.deferred,
            )

    async def _write_admissions(
        self, key: str, writes: Sequence[tuple[str, str | None]], written: Callable[[str], None]
    ) -> None:
        """Sets (None: removes) `key` on each node, `admission_writers` at a time, in the given order;
        `written(node)` follows each write that landed. A gone node is skipped (`_annotate_node`). The
        first other failure stops new writes; those in flight finish and count, then it is raised and the
        pass retried. As with a crash after the status write, the admissions not written are lost to the
        batch, which settles smaller (`plan.rollout`, "Long batches")."""
        pending = iter(writes)
        failures: list[Exception] = []

        async def writer() -> None:
            for node, value in pending:
                if failures:
                    return
                try:
                    async with asyncio.timeout(ADMISSION_WRITE_DEADLINE):
                        landed = await self._annotate_node(node, key, value)
                except Exception as exc:  # raised below, once the writes in flight are done
                    failures.append(exc)
                    return
                if landed:
                    written(node)

        count = min(len(writes), self.rt.options.admission_writers)
        async with asyncio.TaskGroup() as group:
            for _ in range(count):
                group.create_task(writer())
        if failures:
            raise failures[0]

    async def _prune_configmaps(self, model: NodeWright, status: Status | None, fingerprint: str) -> None:
        """Once a rollout is complete, the per-version package ConfigMaps of versions no longer in the
        spec are deleted (no pod can mount them any more: every node finished, and new pods only mount
        the spec version's). Once per spec; a failure is logged and retried on the next completion."""
        name = model.metadata.name
        if (
            status is not Status.COMPLETE
            or self._pruned.get(name) == fingerprint
            or model.metadata.deletion_timestamp
        ):
            return
        keep = {
            podspec_configmap_name(name, pkg_name, pkg.version)
            for pkg_name, pkg in model.spec.packages.items()
        }
        if await self.configmaps.prune(model, keep=keep):
            self._pruned[name] = fingerprint

    async def _clear_approvals(self, obj: JSON, plan: RolloutPlan) -> None:
        """Drop the approvals this plan recorded in the batch state (`approvedBatch`) from the annotation.

        The patch carries the resourceVersion the plan was made from: an approval added meanwhile makes
        it fail (409) and survives for the next pass instead of being lost.
        """
        meta = obj["metadata"]
        left = parse_approvals((meta.get("annotations") or {}).get(APPROVE_ANNOTATION))
        for compartment in plan.approvals_applied:
            left.pop(compartment, None)
        patch = {
            "metadata": {
                "annotations": {APPROVE_ANNOTATION: format_approvals(left) or None},
                "resourceVersion": meta["resourceVersion"],
            }
        }
        try:
            written = await self.rt.client.patch(NODEWRIGHTS, meta["name"], patch)
        except Conflict:
            self.rt.enqueue_rollout(meta["name"])
            return
        self.rt.nodewright_view.record(written)

    async def _clear_reset_annotation(self, name: str) -> None:
        written = await self.rt.client.patch(
            NODEWRIGHTS, name, {"metadata": {"annotations": {constants.ANNOTATION_RESET_BATCH: None}}}
        )
        self.rt.nodewright_view.record(written)

    async def _add_finalizer(self, obj: JSON) -> None:
        meta = obj["metadata"]
        finalizers = [*(meta.get("finalizers") or []), constants.FINALIZER]
        written = await self.rt.client.patch(
            NODEWRIGHTS,
            meta["name"],
            {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}},
        )
        self.rt.nodewright_view.record(written)

    async def _write_status(self, obj: JSON, status: dict[str, Any]) -> None:
        previous = obj.get("status") or {}
        patch = merge_patch(previous, status)
        if patch is None:
            return
        try:
            written = await self.rt.client.patch_status(
                NODEWRIGHTS, obj["metadata"]["name"], {"status": patch}
            )
        except NotFound:
            return  # deleted meanwhile (its finalizer was released): the watch brings the deletion
        self.rt.nodewright_view.record(written)

    async def _report_invalid(self, obj: JSON, error: str) -> None:
        """A spec the models reject (webhook bypassed, older CRD): say so, touch no node."""
        now = ts(self.rt.clock())
        generation = obj["metadata"].get("generation")
        message = f"spec is invalid, nodes are left untouched until it is fixed: {error}"[:2000]
        conditions = [
            {
                "type": "Stalled",
                "status": "True",
                "reason": "InvalidSpec",
                "message": message,
                "lastTransitionTime": now,
                "observedGeneration": generation,
            },
            {
                "type": "Ready",
                "status": "False",
                "reason": "InvalidSpec",
                "message": message,
                "lastTransitionTime": now,
                "observedGeneration": generation,
            },
        ]
        old = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}
        if all(
            old.get(c["type"], {}).get("message") == c["message"] and old[c["type"]].get("status") == "True"
            for c in conditions[:1]
        ):
            return
        written = await self.rt.client.patch_status(
            NODEWRIGHTS,
            obj["metadata"]["name"],
            {"status": {"status": Status.BLOCKED.value, "conditions": conditions}},
        )
        self.rt.nodewright_view.record(written)
        await self.rt.events.record(
            kind=constants.KIND_NODEWRIGHT,
            name=obj["metadata"]["name"],
            uid=obj["metadata"].get("uid"),
            reason=events.EventReason.INVALID_SPEC.value,
            message=message,
            event_type=events.EventType.WARNING.value,
        )

    def _add_compartment_details(self, status: dict[str, Any], plan: RolloutPlan) -> None:
        compartments = status.get("compartmentStatuses") or {}
        for name, cplan in plan.compartments.items():
            entry = compartments.get(name)
            if entry is None:
                continue
            entry["usedByOthers"] = cplan.used_by_others
            entry["halted"] = cplan.halt is not None
            entry["message"] = cplan.message[:1024]

    async def _event(self, name: str, spec: events.EventSpec) -> None:
        obj = self.rt.nodewrights.get(name) or {}
        await self.rt.events.record(
            kind=constants.KIND_NODEWRIGHT,
            name=name,
            uid=(obj.get("metadata") or {}).get("uid"),
            reason=spec.reason.value,
            message=spec.message,
            event_type=spec.type.value,
        )

    async def _emit_transitions(
        self,
        model: NodeWright,
        plan: RolloutPlan,
        status: Status | None,
        malformed: Sequence[str],
        nodes: Sequence[RolloutNode] = (),
    ) -> None:
        name = model.metadata.name
        halted_now = frozenset(h.compartment for h in plan.halts)
        for cname, cplan in sorted(plan.compartments.items()):
            outcome = cplan.batch_evaluated
            if outcome is not None and outcome.evaluated:
                number = outcome.state.current_batch - 1
                succeeded, failed = _batch_counts(nodes, self._fingerprint.get(name, ""), cname, number)
                await self._event(
                    name,
                    events.batch_finished(
                        cname, number, succeeded=succeeded, failed=failed, failed_batch=outcome.failed
                    ),
                )
        was_halted = self._halted.get(name, frozenset())
        for halt in plan.halts:
            if halt.compartment not in was_halted:
                await self._event(name, events.EventSpec(events.EventReason.COMPARTMENT_HALTED, halt.message))
        for resumed in sorted(was_halted - halted_now):
            await self._event(name, events.compartment_resumed(resumed))
        holds = {cname: cplan.health_gate for cname, cplan in plan.compartments.items()}
        for held in self.gate_results.new_holds(name, holds):
            await self._event(name, events.health_gate_holding(held))
        self._halted[name] = halted_now
        persisted = model.status.status if model.status is not None else None
        old = self._last_status.get(name) or (persisted.value if persisted is not None else None)
        new = status.value if status is not None else None
        if new is not None and old != new:
            await self._event(name, events.status_changed(old or "unknown", new))
            if new == Status.PAUSED.value:
                await self._event(name, events.rollout_paused())
            elif new == Status.DISABLED.value:
                await self._event(name, events.rollout_disabled())
            if new == Status.COMPLETE.value:
                total = sum(c.status.matched for c in plan.compartments.values())
                await self._event(name, events.rollout_complete(total))
            self._last_status[name] = new
        if plan.policy_not_found is not None and model.spec.deployment_policy:
            await self._event(name, events.policy_not_found(model.spec.deployment_policy))
        if plan.policy_invalid is not None:
            await self._event(name, events.policy_invalid(plan.policy_invalid.message))
        if malformed:
            await self._event(name, events.state_malformed(malformed))

    def _update_metrics(self, name: str, snap: _Snapshot, plan: RolloutPlan, status: Status | None) -> None:
        views, policy_name = snap.views, snap.inp.policy_name
        # The status for the current spec, as the NodeWright status counts it (the label lags a spec
        # change: see `status_for_spec`).
        by_status = {
            status.value: count for status, count in Counter(n.status for n in snap.rollout_nodes).items()
        }
        started = [view.oldest_started for view in views if view.oldest_started is not None]
        oldest = min(started, default=None)
        entries = [(p.name, p.version, p.stage, p.state) for report in snap.reports for p in report.packages]
        compartments = [
            CompartmentSnapshot(
                name=cname,
                policy=policy_name,
                strategy=strategy_label(cplan.strategy),
                matched=cplan.status.matched,
                ceiling=cplan.status.ceiling,
                in_progress=cplan.status.in_progress,
                completed=cplan.status.completed,
                progress_percent=cplan.status.progress_percent,
                current_batch=cplan.status.batch_state.current_batch if cplan.status.batch_state else 0,
                consecutive_failures=(
                    cplan.status.batch_state.consecutive_failures if cplan.status.batch_state else 0
                ),
                halted=cplan.halt is not None,
                window_active=cplan.status.window_active is not False,
                gates=gate_plan.holding(cplan.health_gate, cplan.status.health_gates),
            )
            for cname, cplan in plan.compartments.items()
        ]
        drain_blocked = sum(1 for view in views if view.held_at_gate is not None)
        self.rt.metrics.domain.update_nodewright(
            name,
            NodeWrightSnapshot(
                status=(status or Status.UNKNOWN).value,
                matched=len(views),
                nodes_by_status=by_status,
                package_nodes=count_package_nodes(entries),
                packages=frozenset(snap.nodewright.spec.packages),
                package_versions={n: p.version for n, p in snap.nodewright.spec.packages.items()},
                compartments=compartments,
                drain_blocked=drain_blocked,
                waiting_by_reason=waiting_counts(plan, views),
                oldest_stage_started_at=oldest,
            ),
        )

    # -- housekeeping -----------------------------------------------------------------------------

    def _enqueue_strays(self, name: str, nodes: Sequence[JSON], entries: Sequence[NodeEntry]) -> None:
        """Nodes that no longer match but still carry our keys: the node controller cleans them up."""
        state_key = constants.state_annotation(name)
        label_key = constants.status_label(name)
        for node, entry in zip(nodes, entries, strict=True):
            if entry.matched:
                continue
            if label_key in node_labels(node) or state_key in node_annotations(node):
                self.rt.enqueue_node(name, str(node["metadata"]["name"]))

    async def _finish_invalid_deletion(self, obj: JSON) -> Result | None:
        """Deleting a NodeWright whose spec the models refuse (stored before a stricter rule, or with the
        webhook bypassed): nothing can be planned from it, so no uninstall runs. The node controller
        releases each node once no pod of it runs there (every key removed, a cordon it holds undone);
        then the finalizer goes, so the deletion never hangs."""
        rt = self.rt
        name = str(obj["metadata"]["name"])
        label, state = constants.status_label(name), constants.state_annotation(name)
        admission = admission_annotation(name)
        held = [
            n
            for n in rt.nodes.objects()
            if label in node_labels(n) or {state, admission} & set(node_annotations(n))
        ]
        pods = [p for p in rt.pods.objects() if node_labels(p).get(constants.POD_LABEL_NODEWRIGHT) == name]
        if held or pods:
            for node in held:
                rt.enqueue_node(name, str(node["metadata"]["name"]))
            return Result(requeue_after=10.0)
        meta = (rt.nodewright(name)[0] or obj)["metadata"]
        await self._release_finalizer(name, meta, "finalizer released (invalid spec: no uninstall ran)")
        return None

    def _deletion_condition(self, model: NodeWright, now: datetime) -> Condition:
        """`DeletionBlocked`: a paused or disabled NodeWright does no work, so its deletion (uninstalls,
        then releasing every node) waits until it is resumed or enabled."""
        blocker = _deletion_blocker(model)
        previous = {c.type: c for c in (model.status.conditions or [])} if model.status else {}
        status: Literal["True", "False"] = "True" if blocker else "False"
        old = previous.get(DELETION_BLOCKED)
        return Condition(
            type=DELETION_BLOCKED,
            status=status,
            reason=blocker[0] if blocker else "Deleting",
            message=blocker[1] if blocker else "uninstalling and releasing nodes",
            last_transition_time=old.last_transition_time if old and old.status == status else ts(now),
            observed_generation=model.metadata.generation,
        )

    async def _finish_deletion(self, obj: JSON, model: NodeWright, nodes: Sequence[JSON]) -> Result | None:
        """Release the finalizer once no node carries this NodeWright's status or admission."""
        rt = self.rt
        name = model.metadata.name
        blocker = _deletion_blocker(model)
        if blocker is not None:
            if self._deletion_warned.get(name) != blocker[0]:
                self._deletion_warned[name] = blocker[0]
                await self._event(name, events.EventSpec(events.EventReason.DELETION_BLOCKED, blocker[1]))
            return Result(requeue_after=RESYNC_ACTIVE)
        self._deletion_warned.pop(name, None)
        label_key = constants.status_label(name)
        adm_key = admission_annotation(name)
        # The newest copies: this very pass may have admitted nodes (written after the snapshot), and an
        # admission left behind would outlive the NodeWright.
        nodes = [rt.node(str(n["metadata"]["name"])) or n for n in nodes]
        pending = [str(n["metadata"]["name"]) for n in nodes if label_key in node_labels(n)]
        for node_name in pending:
            rt.enqueue_node(name, node_name)
        pods = [p for p in rt.pods.objects() if node_labels(p).get(constants.POD_LABEL_NODEWRIGHT) == name]
        if pending or pods:
            log.info("deletion in progress", nodewright=name, nodes=len(pending), pods=len(pods))
            return Result(requeue_after=10.0)
        for node in nodes:
            if adm_key in node_annotations(node):
                await self._annotate_node(str(node["metadata"]["name"]), adm_key, None)
        # The newest copy: this pass may have written the status, which changed the resourceVersion.
        meta = (rt.nodewright(name)[0] or obj)["metadata"]
        await self._release_finalizer(name, meta, "finalizer released")
        return None


DELETION_BLOCKED = "DeletionBlocked"
WAITING_FOR_NODEWRIGHT = "WaitingForNodeWright"


def waiting_counts(plan: RolloutPlan, views: Sequence[_NodeView]) -> dict[str, int]:
    """Nodes waiting, by reason: the planner's (not admitted: NotYetInBatch, BudgetFull, ...) and the
    admitted nodes held at their node gate -- by protected pods (`ProtectedPods`) or by a drain that
    cannot progress (`DrainBlocked`: an eviction refused, or the drain timeout passed), by the code of
    their node condition and the timing annotation (`api.reasons.drain_held`)."""
    counts: Counter[str] = Counter(plan.waiting_counts)
    for view in views:
        if view.held_at_gate is NodeConditionReason.WAITING_FOR_PROTECTED_PODS:
            counts[HELD_BY_PROTECTED_PODS] += 1
        elif view.drain_held:
            counts[HELD_BY_DRAIN] += 1
    return dict(sorted(counts.items()))


def _drain_blocked(views: Sequence[_NodeView]) -> list[str]:
    """Admitted nodes whose drain cannot progress: an eviction refused, or the drain timeout passed."""
    return [str(v.node["metadata"]["name"]) for v in views if v.drain_held]


def _batch_counts(
    nodes: Sequence[RolloutNode], fingerprint: str, compartment: str, batch: int
) -> tuple[int, int]:
    """(succeeded, failed) members of a settled batch."""
    succeeded = failed = 0
    for node in nodes:
        adm = node.admission
        if (
            adm is None
            or adm.fingerprint != fingerprint
            or adm.compartment != compartment
            or adm.batch != batch
        ):
            continue
        phase = phase_of(node, fingerprint=fingerprint)
        succeeded += phase is Phase.SUCCEEDED
        failed += phase is Phase.FAILED
    return succeeded, failed


def _deletion_blocker(model: NodeWright) -> tuple[str, str] | None:
    """(reason, message) when the deletion of this NodeWright cannot proceed, else None."""
    if is_disabled(model):
        return (
            "Disabled",
            "the NodeWright is disabled, so it runs no uninstall and releases no node: deletion waits."
            f" Enable it (remove annotation {constants.ANNOTATION_DISABLE}) to let the deletion finish",
        )
    if is_paused(model):
        return (
            "Paused",
            "the NodeWright is paused, so it runs no uninstall and releases no node: deletion waits."
            f" Resume it (remove annotation {constants.ANNOTATION_PAUSE}) to let the deletion finish",
        )
    return None


def _open_batches(
    nodes: Sequence[RolloutNode], fingerprint: str, plan: RolloutPlan | None = None
) -> dict[str, set[str]]:
    """Per compartment, the nodes admitted for this spec that have not settled yet (not complete,
    erroring or blocked), including those `plan` admits or releases now: when the last of them
    settles, the next batch may start."""
    out: dict[str, set[str]] = {}
    for node in nodes:
        adm = node.admission
        if adm is None or adm.fingerprint != fingerprint or not node.needs_work:
            continue
        if node.status in (Status.IN_PROGRESS, Status.WAITING, Status.DRIFTED):
            out.setdefault(adm.compartment, set()).add(node.name)
    if plan is not None:
        released = set(plan.releases)
        for members in out.values():
            members -= released
        for admitted in plan.admissions:
            out.setdefault(admitted.admission.compartment, set()).add(admitted.node)
    return out


def _condition_text(node: Mapping[str, Any], nodewright: str) -> str | None:
    """The node condition of this NodeWright for people (`<reason>: <message>`), for notifications."""
    found = node_condition(node, nodewright)
    if found is None:
        return None
    return f"{found.reason}: {found.message}" if found.message else found.reason or None
