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
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

import structlog

from nodewright.api import constants
from nodewright.api.models import NodeWright, Status
from nodewright.api.nodestate import Admission as StateAdmission
from nodewright.api.nodestate import MalformedNodeState, NodeState, PackageEntry, PackageState, encode
from nodewright.controller.configmaps import PackageConfigMaps
from nodewright.controller.context import (
    Runtime,
    effective_nodewright,
    matches_nodewright,
    node_admission,
    node_annotations,
    node_labels,
    node_state,
    split_node_key,
)
from nodewright.controller.drainer import Drainer, Timing, read_timing, timing_annotation, update_timing
from nodewright.controller.pods import PodLogs, summarize_with_logs
from nodewright.controller.trust import PodTrust
from nodewright.kube.client import PatchType, metadata_applied
from nodewright.kube.resources import JSON, NODES, Conflict, NotFound
from nodewright.kube.trim import node_ready
from nodewright.kube.workqueue import Result
from nodewright.observability import events as catalogue
from nodewright.observability.tracing import NodeRollout
from nodewright.plan import drain as drain_mod
from nodewright.plan import podspec, sequencing
from nodewright.plan.node import (
    Cordon,
    CreatePod,
    DeletePod,
    Drain,
    DrainFacts,
    Event,
    NodeCondition,
    NodeFacts,
    NodeInput,
    NodePlan,
    PlanOptions,
    RequeueAfter,
    Taint,
    Uncordon,
    is_disabled,
    plan_node,
)
from nodewright.plan.rollout import spec_fingerprint
from nodewright.plan.stages import ACTIVE_STATES, INTERRUPT_STAGES, PodSummary, parse_ts, ts

log = structlog.get_logger("nodewright.controller.nodes")

DRAIN_POLL: Final = 2.0  # evictions accepted: look again soon, the pods are terminating
DRAIN_BLOCKED_POLL: Final = 7.0  # a PDB refused: its budget frees up when another pod is Ready again
SEQUENCING_FACTS_TTL: Final = 1.0  # seconds; the facts are O(nodes x NodeWrights) to build
MAX_PASSES: Final = 3  # plan again at once after our own cordon instead of waiting for a requeue
CONDITION_MESSAGE_LIMIT: Final = 1024

# Plan event reasons → the observability catalogue's reasons (kubectl get events --field-selector).
_EVENT_REASONS: Final[Mapping[str, str]] = {
    "PackageComplete": catalogue.Reason.PACKAGE_COMPLETED.value,
    "PackageRetry": catalogue.Reason.PACKAGE_FAILED.value,
    "Cordon": catalogue.Reason.NODE_CORDONED.value,
    "Uncordon": catalogue.Reason.NODE_UNCORDONED.value,
    "Interrupt": catalogue.Reason.INTERRUPT_STARTED.value,
}
# Package-level news that also goes on the NodeWright (a rollout's history in `kubectl describe nw`).
_NODEWRIGHT_EVENTS: Final = frozenset({"PackageStarted", "PackageComplete", "PackageFailed"})


@dataclass
class _SequencingCache:
    built_at: float = -1e9
    facts: tuple[sequencing.NodeWrightFacts, ...] = ()


class NodeReconciler:
    """Reconciles `<nw>/<node>` keys; see the module docstring."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.drainer = Drainer(rt.client)
        self.configmaps = PackageConfigMaps(rt.client, namespace=rt.options.namespace)
        self.logs = PodLogs(rt.client)
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
        )
        self._sequencing = _SequencingCache()
        self._warned: set[tuple[str, str]] = set()  # (key or pod uid, problem) already reported
        self.trust = PodTrust(rt)  # which package pods count; reports and deletes the others
        self._metadata_via_status = True  # see `_write`; off if the API server ignores it

    # ------------------------------------------------------------------------------------------------
    # Entry point

    async def reconcile(self, key: str) -> Result | None:
        nw_name, node_name = split_node_key(key)
        if not nw_name or not node_name:
            log.warning("malformed node key", key=key)
            return None
        requeue: float | None = None
        for _ in range(MAX_PASSES):
            outcome = await self._pass(key, nw_name, node_name)
            if outcome is None:
                return None
            again, after = outcome
            if after is not None:
                requeue = after if requeue is None else min(requeue, after)
            if not again:
                break
            requeue = None  # the next pass decides afresh
        return Result(requeue_after=requeue) if requeue is not None else None

    async def _pass(self, key: str, nw_name: str, node_name: str) -> tuple[bool, float | None] | None:
        """One plan-and-actuate pass: (plan again now?, requeue after), or None when done for good."""
        rt = self.rt
        raw, model, error = rt.nodewright(nw_name)
        if raw is None or model is None:
            # Gone (finalizer released: nodes already cleaned) or invalid (the rollout controller reports
            # the validation error on the object): leave nodes alone.
            if error:
                log.debug("nodewright invalid, node left alone", nodewright=nw_name, error=error)
            self.drainer.forget(key)
            return None
        node = rt.node(node_name)
        if node is None:
            self.drainer.forget(key)
            return None
        annotations = node_annotations(node)
        try:
            stored = node_state(node, nw_name)
        except MalformedNodeState as exc:
            await self._warn_once(
                key,
                f"malformed:{annotations.get(constants.state_annotation(nw_name), '')}",
                kind="Node",
                name=node_name,
                uid=node["metadata"].get("uid"),
                reason=catalogue.Reason.STATE_MALFORMED.value,
                message=f"[{nw_name}] state annotation left untouched: {exc}",
            )
            return None
        deleting = bool(model.metadata.deletion_timestamp)
        effective = effective_nodewright(model)
        pods_raw = self._package_pods(node_name, model)
        await self._flush_warnings()  # untrusted pods are reported and deleted on every path
        if not deleting and not matches_nodewright(model, node):
            return await self._unselected(key, nw_name, node, stored, pods_raw)
        if deleting:
            plan_nw = _deletion_spec(effective, stored or NodeState())
        else:
            plan_nw = effective
        summaries = await self._summaries(pods_raw, plan_nw, stored)
        admission = self._admission(node, nw_name, effective)
        state_in = replace(stored or NodeState(), admission=admission)
        now = rt.clock()
        timing = read_timing(annotations, nw_name)
        inp = NodeInput(
            nodewright=plan_nw,
            node=node_facts(node),
            state=state_in,
            pods=tuple(summaries),
            now=now,
            sequencing_blocker=self._sequencing_blocker(nw_name, node),
            options=self.plan_options,
            drain_skip=timing.drain_skip,
        )
        plan = plan_node(inp)
        selection: drain_mod.DrainSelection | None = None
        if plan.needs_drain_facts:
            workload = await self.drainer.node_pods(node_name)
            protect = model.spec.pod_non_interrupt_labels
            selection = drain_mod.select(workload, protect=protect)
            facts = DrainFacts(
                selection=selection,
                protected_since=timing.protected_since,
                draining_since=timing.draining_since,
                eviction_blocked=self.drainer.eviction_blocked(key),
            )
            plan = plan_node(replace(inp, drain=facts))
        cordon = any(isinstance(a, Cordon) for a in plan.actions)
        uncordon = any(isinstance(a, Uncordon) for a in plan.actions) and bool(stored and stored.cordoned)
        drains = [a for a in plan.actions if isinstance(a, Drain)]
        new_timing = update_timing(
            timing,
            now=now,
            cordoning=cordon,
            uncordoning=uncordon,
            protected=None if selection is None else bool(selection.protected),
            evicting=bool(drains),
            drained=None if selection is None else selection.drained,
        )
        new_timing = new_timing.with_drain_skip(plan.drain_skip)
        if plan.drain_skipped:
            # Released after a drain timeout (policy skip): the next admission starts a fresh drain timer.
            new_timing = replace(new_timing, draining_since=None)
            self.drainer.forget(key)
        if plan.status == Status.COMPLETE:
            new_timing = Timing()  # the maintenance window is over
        if deleting and (self._settled(plan, summaries) or (is_disabled(plan_nw) and not summaries)):
            # (A disabled NodeWright does nothing on the way out either: it only lets go of the node.)
            # Nothing left to do for a leaving NodeWright: release the node instead of writing status
            # (a status written now would hold the finalizer forever).
            await self._cleanup(node, nw_name, plan.state, cordoned=bool(stored and stored.cordoned))
            self.drainer.forget(key)
            return None
        previous_status = node_labels(node).get(constants.status_label(nw_name))
        node = await self._write(node, nw_name, stored, plan, cordon, uncordon, timing, new_timing, now)
        if node is None:
            self.drainer.forget(key)
            return None
        self._observe(
            model, node_name, stored, plan, state_in.admission, timing, uncordon, now, previous_status
        )
        requeue = await self._execute(key, model, plan_nw, node, plan, now)
        if inp.sequencing_blocker and state_in.admission is not None:
            # Admitted but held by an earlier NodeWright (admitted before that one appeared, or a
            # `sequencing: all` predecessor finishing on other nodes, whose events do not reach this
            # key): look again. Rare, since the rollout does not admit nodes waiting for priority.
            poll = self.plan_options.poll_interval
            requeue = poll if requeue is None else min(requeue, poll)
        # After our own cordon the overlay already shows the node unschedulable: go on right away.
        return cordon, requeue

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
        await self._flush_warnings()
        return out

    def _admission(self, node: JSON, nw_name: str, effective: NodeWright) -> StateAdmission | None:
        admission = node_admission(node, nw_name)
        if admission is None or admission.fingerprint != spec_fingerprint(effective):
            return None
        return StateAdmission(
            compartment=admission.compartment, batch=admission.batch, order=admission.order, at=admission.at
        )

    def _sequencing_blocker(self, nw_name: str, node: JSON) -> str | None:
        """The earlier NodeWright keeping this node waiting, if any.

        The facts are cached for a second, but this node's own completion is taken from its current
        labels: the event that unblocks it (the earlier NodeWright completing here) is the very node
        update that brought us here, and a stale cache would swallow it."""
        facts = self._sequencing_facts()
        if nw_name not in {f.name for f in facts}:
            return None
        node_name = str(node["metadata"]["name"])
        labels = node_labels(node)
        fresh = []
        for f in facts:
            if node_name in f.targets:
                done = labels.get(constants.status_label(f.name)) == Status.COMPLETE.value
                f = replace(
                    f, complete_on=f.complete_on | {node_name} if done else f.complete_on - {node_name}
                )
            fresh.append(f)
        blocker = sequencing.blocking(fresh, target=nw_name, node=node_name)
        return blocker.reason if blocker else None

    def _sequencing_facts(self) -> tuple[sequencing.NodeWrightFacts, ...]:
        now = time.monotonic()
        cache = self._sequencing
        if now - cache.built_at < SEQUENCING_FACTS_TTL:
            return cache.facts
        objects = self.rt.nodewrights.objects()
        if len(objects) < 2:
            cache.facts, cache.built_at = (), now  # a lone NodeWright waits for nobody
            return cache.facts
        parsed = (self.rt.models.nodewright(obj)[0] for obj in objects)
        models = [model for model in parsed if model is not None]
        facts = sequencing.facts_for(models, self.rt.nodes.objects())
        cache.facts, cache.built_at = tuple(facts), now
        return cache.facts

    # ------------------------------------------------------------------------------------------------
    # Writes

    async def _write(
        self,
        node: JSON,
        nw_name: str,
        stored: NodeState | None,
        plan: NodePlan,
        cordon: bool,
        uncordon: bool,
        timing: Timing,
        new_timing: Timing,
        now: datetime,
    ) -> JSON | None:
        """State, status label, timing, cordon and the node condition, in as few requests as possible.

        Without a cordon change everything goes in one strategic merge patch on `nodes/status` (one
        write per transition instead of two); a cordon needs `spec`, which that subresource ignores, so
        then the metadata patch carries the cordon and the condition follows in its own patch. Either
        way the state is durable before any action. Returns the newest node, None if it is gone.
        """
        name = str(node["metadata"]["name"])
        new_state = replace(plan.state, admission=None)
        old_state = replace(stored, admission=None) if stored is not None else NodeState()
        labels: dict[str, str | None] = {}
        annotations: dict[str, str | None] = {}
        status_key = constants.status_label(nw_name)
        current_status = node_labels(node).get(status_key)
        # A node this NodeWright has never touched and that is only waiting for its batch gets no
        # label and no condition: "no label" reads as waiting (rollout status, metrics, `nodewright
        # plan`), and labelling every node of a 10,000-node fleet the moment a NodeWright appears
        # would be 10,000 writes queued in front of the first batch's (N / --qps seconds of delay).
        untouched = stored is None and current_status is None and plan.status is Status.WAITING
        if current_status != plan.status.value and not untouched:
            labels[status_key] = plan.status.value
        if new_state != old_state:
            annotations[constants.state_annotation(nw_name)] = encode(new_state)
        if new_timing != timing:
            annotations[timing_annotation(nw_name)] = new_timing.encode()
        unschedulable: bool | None = None
        if cordon and not node.get("spec", {}).get("unschedulable"):
            unschedulable = True
        elif uncordon:
            unschedulable = False
        condition = None if untouched else _condition_body(node, plan.condition, now)
        if not labels and not annotations and unschedulable is None and condition is None:
            return node
        try:
            if unschedulable is None and self._metadata_via_status:
                updated = await self.rt.client.patch_node_status_metadata(
                    name,
                    labels=labels or None,
                    annotations=annotations or None,
                    conditions=[condition] if condition is not None else (),
                )
                if not metadata_applied(updated, labels=labels, annotations=annotations):
                    log.warning(
                        "the API server ignored metadata in a nodes/status patch;"
                        " writing node metadata and conditions separately from now on",
                        node=name,
                    )
                    self._metadata_via_status = False
                    updated = await self.rt.client.patch_node_metadata(
                        name, labels=labels or None, annotations=annotations or None
                    )
            else:
                if labels or annotations or unschedulable is not None:
                    updated = await self.rt.client.patch_node_metadata(
                        name,
                        labels=labels or None,
                        annotations=annotations or None,
                        unschedulable=unschedulable,
                    )
                    self.rt.node_view.record(updated)
                if condition is not None:
                    updated = await self.rt.client.patch_node_conditions(name, [condition])
        except NotFound:
            return None
        self.rt.node_view.record(updated)
        if status_key in labels:
            self.rt.enqueue_rollout(nw_name)
        return self.rt.node(name) or updated

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
                report = await self.drainer.evict(key, action.pods, force=action.force)
                if report.evicted:
                    spec = catalogue.node_draining(model.metadata.name, len(report.evicted))
                    await rt.events.record(
                        kind="Node",
                        name=node_name,
                        uid=node_uid,
                        reason=spec.reason.value,
                        message=spec.message,
                    )
                if report.any_blocked:
                    spec = catalogue.node_drain_blocked(model.metadata.name, "; ".join(report.blocked[:3]))
                    await rt.events.record(
                        kind="Node",
                        name=node_name,
                        uid=node_uid,
                        reason=spec.reason.value,
                        message=spec.message,
                        event_type="Warning",
                    )
                    requeue.append(DRAIN_BLOCKED_POLL)
                else:
                    requeue.append(DRAIN_POLL)
            elif isinstance(action, DeletePod):
                await self._delete_pod(node_name, action)
            elif isinstance(action, CreatePod):
                await self._create_pod(plan_nw, node_name, action)
            elif isinstance(action, Event):
                await self._event(model, node_name, node_uid, action)
            elif isinstance(action, RequeueAfter):
                requeue.append(action.seconds)
        return min(requeue) if requeue else None

    async def _delete_pod(self, node_name: str, action: DeletePod) -> None:
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

    async def _create_pod(self, nw: NodeWright, node_name: str, action: CreatePod) -> None:
        pkg = nw.spec.packages[action.package]
        if action.stage not in INTERRUPT_STAGES and pkg.config_map:
            await self.configmaps.ensure(nw, action.package, pkg)
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
        )
        if manifest["metadata"]["name"] != action.name:
            # The planner and the builder disagree on the pod's identity: creating it would make the
            # planner treat it as a stranger and delete it, forever. Fail loudly instead.
            raise RuntimeError(
                f"pod name mismatch for {action.package}:{action.version} {action.stage.value}: "
                f"plan {action.name}, built {manifest['metadata']['name']}"
            )
        self.rt.signer.sign(manifest)
        try:
            created = await self.rt.client.create_pod(self.rt.options.namespace, manifest)
        except Conflict as exc:
            if not exc.already_exists:
                raise
            # Created by an earlier attempt of this same plan step -- or squatted by someone else's pod,
            # which the pod scan deletes as untrusted; the planner then creates it again.
            return
        # Checked against the manifest (a mutated pod is deleted and fails like a refused create),
        # remembered by uid and sealed: see `controller.trust`.
        await self.trust.adopt(created, manifest, nw=nw)
        log.info(
            "package pod created",
            pod=action.name,
            node=node_name,
            package=action.package,
            version=action.version,
            stage=action.stage.value,
            attempt=action.attempt,
        )

    async def _event(self, model: NodeWright, node_name: str, node_uid: Any, event: Event) -> None:
        nw_name = model.metadata.name
        reason = _EVENT_REASONS.get(event.reason, event.reason)
        message = f"[{nw_name}] {event.message}"
        await self.rt.events.record(
            kind="Node", name=node_name, uid=node_uid, reason=reason, message=message, event_type=event.type
        )
        if event.reason in _NODEWRIGHT_EVENTS:
            await self.rt.events.record(
                kind=constants.KIND_NODEWRIGHT,
                name=nw_name,
                uid=model.metadata.uid,
                reason=reason,
                message=f"[{node_name}] {event.message}",
                event_type=event.type,
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
            kind=kind, name=name, uid=uid, reason=reason, message=message, event_type="Warning"
        )

    # ------------------------------------------------------------------------------------------------
    # Metrics and traces

    def _observe(
        self,
        model: NodeWright,
        node_name: str,
        stored: NodeState | None,
        plan: NodePlan,
        admission: StateAdmission | None,
        timing: Timing,
        uncordon: bool,
        now: datetime,
        previous_status: str | None,
    ) -> None:
        rt = self.rt
        nw_name = model.metadata.name
        domain = rt.metrics.domain
        old = stored or NodeState()
        rollout = _rollout_ref(model, node_name, admission or old.admission)

        def stage_ended(entry: PackageEntry, started: datetime, error: str | None) -> None:
            """One stage attempt ended (done, or failed): its duration and its span."""
            seconds = (now - started).total_seconds()
            domain.observe_stage_duration(
                nodewright=nw_name, package=entry.name, stage=entry.stage.value, seconds=seconds
            )
            if rollout is not None:
                rt.tracer.stage_finished(
                    rollout,
                    stage=entry.stage.value,
                    started_at=started,
                    finished_at=now,
                    package=entry.name,
                    version=entry.version,
                    error=error,
                )

        for entry in old.packages:
            if entry.state != PackageState.IN_PROGRESS:
                continue
            new = plan.state.entry(entry.name, entry.version)
            started = _parse(entry.started) or now
            finished = new is None or new.stage != entry.stage or new.state == PackageState.COMPLETE
            if finished:
                stage_ended(entry, started, None)
                continue
            if new is None:
                continue
            if new.retry_at is not None and entry.retry_at is None:
                domain.count_retry(nodewright=nw_name, package=entry.name, version=entry.version)
            if new.state == PackageState.ERRORING or (new.retry_at is not None and entry.retry_at is None):
                stage_ended(entry, started, new.error or "failed")
        if uncordon and timing.cordoned_at is not None:
            domain.observe_maintenance(nodewright=nw_name, seconds=(now - timing.cordoned_at).total_seconds())
        if (
            plan.status == Status.COMPLETE
            and previous_status != Status.COMPLETE.value
            and rollout is not None
        ):
            rt.tracer.node_rollout_finished(
                rollout,
                finished_at=now,
                packages={n: p.version for n, p in model.spec.packages.items()},
            )

    # ------------------------------------------------------------------------------------------------
    # Leaving nodes

    @staticmethod
    def _settled(plan: NodePlan, pods: Sequence[PodSummary]) -> bool:
        """Deletion: nothing of this NodeWright runs or is due on the node."""
        if pods or plan.status != Status.COMPLETE:
            return False
        if any(isinstance(a, (CreatePod, Drain)) for a in plan.actions):
            return False
        return not any(e.state in ACTIVE_STATES for e in plan.state.packages)

    async def _unselected(
        self, key: str, nw_name: str, node: JSON, stored: NodeState | None, pods: Sequence[JSON]
    ) -> tuple[bool, float | None] | None:
        if pods:
            # Work of ours is still running there: let it end (the pod's events bring us back).
            return False, self.plan_options.poll_interval
        await self._cleanup(node, nw_name, stored, cordoned=bool(stored and stored.cordoned))
        self.drainer.forget(key)
        return None

    async def _cleanup(self, node: JSON, nw_name: str, state: NodeState | None, *, cordoned: bool) -> None:
        """Remove our condition, status label and timing; uncordon if we cordoned; keep files-remain state.

        The condition goes first: once the status label is gone the rollout controller may release the
        finalizer, and nothing of ours may be left behind by then.
        """
        name = str(node["metadata"]["name"])
        condition_type = constants.node_condition_type(nw_name)
        if _condition_of(node, condition_type) is not None:
            try:
                updated = await self.rt.client.patch(
                    NODES,
                    name,
                    # Strategic merge: conditions merge by `type`; `$patch: delete` removes that element.
                    {"status": {"conditions": [{"type": condition_type, "$patch": "delete"}]}},
                    patch_type=PatchType.STRATEGIC,
                    subresource="status",
                )
            except NotFound:
                return
            self.rt.node_view.record(updated)
            node = self.rt.node(name) or updated
        labels = node_labels(node)
        annotations = node_annotations(node)
        status_key = constants.status_label(nw_name)
        state_key = constants.state_annotation(nw_name)
        patch_labels: dict[str, str | None] = {}
        patch_annotations: dict[str, str | None] = {}
        if status_key in labels:
            patch_labels[status_key] = None
        if timing_annotation(nw_name) in annotations:
            patch_annotations[timing_annotation(nw_name)] = None
        if state is not None:
            kept = replace(state, admission=None, cordoned=False, interrupt_at=None)
            if not kept.packages:
                if state_key in annotations:
                    patch_annotations[state_key] = None
            elif encode(kept) != annotations.get(state_key):
                patch_annotations[state_key] = encode(kept)
        unschedulable = False if cordoned else None
        if patch_labels or patch_annotations or unschedulable is not None:
            try:
                updated = await self.rt.client.patch_node_metadata(
                    name,
                    labels=patch_labels or None,
                    annotations=patch_annotations or None,
                    unschedulable=unschedulable,
                )
            except NotFound:
                return
            self.rt.node_view.record(updated)
            if patch_labels:
                self.rt.enqueue_rollout(nw_name)
            log.info("node released by nodewright", node=name, nodewright=nw_name, uncordoned=cordoned)


# ----------------------------------------------------------------------------------------------------
# Pure helpers


def node_facts(node: JSON) -> NodeFacts:
    spec = node.get("spec") or {}
    taints = tuple(
        Taint(key=str(t.get("key") or ""), effect=str(t.get("effect") or ""), value=t.get("value"))
        for t in spec.get("taints") or []
    )
    return NodeFacts(
        name=str(node["metadata"]["name"]),
        labels=dict(node_labels(node)),
        taints=taints,
        unschedulable=bool(spec.get("unschedulable")),
        ready=node_ready(node),
        boot_id=str(((node.get("status") or {}).get("nodeInfo") or {}).get("bootID") or ""),
    )


def _deletion_spec(effective: NodeWright, state: NodeState) -> NodeWright:
    """What a node must still do while its NodeWright is deleted: uninstalls and runs in flight only.

    Packages without uninstall support are left as they are on the host (files remain, D2); a package
    this node never installed is not installed on the way out.
    """
    keep = {}
    for name, pkg in effective.spec.packages.items():
        entries = state.entries_for(name)
        uninstall = bool(pkg.uninstall and pkg.uninstall.enabled and pkg.uninstall.apply)
        in_flight = any(e.state in ACTIVE_STATES for e in entries)
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


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return parse_ts(text)
    except ValueError:
        return None


def _rollout_ref(model: NodeWright, node: str, admission: StateAdmission | None) -> NodeRollout | None:
    if admission is None:
        return None
    picked = _parse(admission.at)
    if picked is None:
        return None
    return NodeRollout(
        nodewright=model.metadata.name,
        nodewright_uid=model.metadata.uid or "",
        node=node,
        picked_at=picked,
        batch=admission.batch,
        compartment=admission.compartment,
    )
