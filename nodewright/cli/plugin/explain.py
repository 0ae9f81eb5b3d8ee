"""Why a node waits, computed the way the operator decides it (pure: objects and `now` in, answers out).

Untouched waiting nodes carry no label and no condition (a 10,000-node fleet is not labelled the moment
a NodeWright appears), so the answer to "why is this node waiting" cannot be read off the node: it is
computed here with the operator's own code, from the cluster as it is --

1. each matched node becomes the `RolloutNode` the rollout controller builds
   (`controller.rollout.rollout_node`: status label, state annotation, admission, cordons by others or
   by other NodeWrights and whether those are paused or disabled, NotReady, ignore label and untolerated
   taints, node-reported blocks such as a skipped drain, the earlier NodeWright it waits for by
   priority and sequencing), a node whose state does not decode is blocked with `StateMalformed` as in
   the controller; the DisruptionBudgets whose pools hold its nodes are read the same way
   (`controller.budgets.shared_for`), so a node held by a full pool says `DisruptionBudget` and who
   holds its slots;
2. `plan.rollout.plan_rollout` with the NodeWright's persisted compartment statuses, its pause,
   disable and reset annotations and its order counter -- the very call the controller makes -- gives
   each node's phase and, for a node with pending work that is not admitted, its `Waiting` reason;
3. for "not in a batch yet" the planner is replayed (`plan.preview`, what `nodewright plan` prints) to
   say which batch will take the node, and for "budget full" the nodes holding the compartment's slots
   are named;
4. an admitted node is at its node gate or running: the operator's node condition says which
   (protected pods, draining, drain timeout, rebooting, a stage running, erroring) and `DrainReport`
   adds what the cluster shows now -- the protected pods by name, the pods a PodDisruptionBudget keeps
   from being evicted and that PDB, the drain timeout and its policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from nodewright.api import constants
from nodewright.api.models import DeploymentPolicy, LabelSelector, NodeWright, Status
from nodewright.api.nodestate import NodeState, PackageEntry, PackageState
from nodewright.cli.plugin.cluster import ClusterState
from nodewright.plan import drain as drain_mod
from nodewright.plan import podspec, selectors, sequencing
from nodewright.plan.node import is_disabled, is_paused
from nodewright.plan.policy import Compartments, NodeRef, PolicyInvalid, resolve_compartments
from nodewright.plan.preview import RolloutPreview, preview_rollout
from nodewright.plan.rollout import (
    Phase,
    RolloutNode,
    RolloutPlan,
    Waiting,
    WaitReason,
    phase_of,
    plan_rollout,
    spec_fingerprint,
)
from nodewright.plan.rollout_epoch import current_nodes, epoch_for, order_hint
from nodewright.plan.stages import ts

JSON = dict[str, Any]
MAX_NAMES = 5

# One-word reasons beyond the planner's WaitReason values: what an admitted node is doing.
ADMITTED_NOW = "AdmittedNow"
IN_PROGRESS = "InProgress"
PROTECTED_PODS = "ProtectedPods"
DRAIN_BLOCKED = "DrainBlocked"
DRAIN_TIMEOUT = "DrainTimeout"
DRAINING = "Draining"
REBOOTING = "Rebooting"
ERRORING = "Erroring"
COMPLETE = "Complete"
CARRYOVER = "FinishingOlderSpec"
STATE_MALFORMED = "StateMalformed"
NOT_SELECTED = "NotSelected"


def names_text(names: Sequence[str], limit: int = MAX_NAMES) -> str:
    shown = list(names[:limit])
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


# ----------------------------------------------------------------------------------------------------
# The planner's view of one NodeWright


@dataclass(frozen=True, slots=True)
class Entry:
    """One matched node as the rollout controller sees it."""

    node: JSON
    state: NodeState | None
    state_error: str | None
    rollout: RolloutNode
    phase: Phase


@dataclass
class Analysis:
    """The rollout planner's decision for one NodeWright, as the controller would take it now."""

    model: NodeWright
    nodewright: NodeWright  # the effective spec (deletion turns into uninstalls)
    policy: DeploymentPolicy | PolicyInvalid | None
    fingerprint: str
    plan: RolloutPlan
    entries: dict[str, Entry]
    compartments: Compartments | None
    facts: list[sequencing.NodeWrightFacts]
    inactive: dict[str, str]
    paused: bool
    disabled: bool
    now: datetime
    waiting: dict[str, Waiting] = field(default_factory=dict)
    admitted_now: dict[str, tuple[str, int]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.model.metadata.name

    @cached_property
    def preview(self) -> RolloutPreview:
        status = self.model.status
        return preview_rollout(
            self.nodewright,
            policy=self.policy,
            nodes=[e.rollout for e in self.entries.values()],
            fingerprint=self.fingerprint,
            now=ts(self.now),
            compartment_statuses=(status.compartment_statuses if status is not None else None) or {},
            paused=self.paused,
            disabled=self.disabled,
        )

    def compartment_of(self, node: str) -> str | None:
        entry = self.entries.get(node)
        adm = entry.rollout.admission if entry is not None else None
        if adm is not None and adm.fingerprint == self.fingerprint:
            return adm.compartment
        if self.compartments is not None:
            return self.compartments.assignment.get(node)
        return None

    def members(self, compartment: str) -> list[str]:
        if self.compartments is None:
            return []
        return list(self.compartments.members.get(compartment, ()))

    def slot_holders(self, compartment: str) -> tuple[list[str], list[tuple[str, str]]]:
        """(nodes of ours holding a slot, (node, why) unavailable for other reasons taking one)."""
        ours: list[str] = []
        others: list[tuple[str, str]] = []
        for name in self.members(compartment):
            entry = self.entries[name]
            if entry.phase in (Phase.ACTIVE, Phase.CARRYOVER) or name in self.admitted_now:
                ours.append(name)
            elif entry.rollout.unavailable_reason:
                others.append((name, entry.rollout.unavailable_reason))
        return ours, others

    def predicted_batch(self, node: str) -> tuple[int, int, str] | None:
        """(batch number, last batch number, compartment) the replayed planner puts the node in."""
        for comp in self.preview.compartments:
            for batch in comp.batches:
                if node in batch.nodes:
                    last = comp.batches[-1].number if comp.batches else batch.number
                    return batch.number, last, comp.name
        return None


def _malformed(base: RolloutNode, error: str) -> RolloutNode:
    # The same substitution as `RolloutReconciler._malformed_entry`: counted blocked, nothing starts.
    return replace(
        base, status=Status.BLOCKED, needs_work=True, blocked_reason=f"StateMalformed: {error}"[:300]
    )


def inactive_nodewrights(state: ClusterState) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, model in state.nodewrights.items():
        if is_disabled(model):
            out[name] = "disabled"
        elif is_paused(model):
            out[name] = "paused"
    return out


def analyse(
    state: ClusterState,
    name: str,
    *,
    runtime_taint_key: str = constants.DEFAULT_RUNTIME_REQUIRED_TAINT_KEY,
) -> Analysis:
    """Plan `name` from `state` exactly as the rollout controller's pass would."""
    from nodewright.controller.budgets import shared_for
    from nodewright.controller.context import effective_nodewright, matches_nodewright, try_node_state
    from nodewright.controller.rollout import rollout_node

    model = state.nodewright(name)
    nodewright = effective_nodewright(model)
    all_names = sorted(str(o["metadata"]["name"]) for o in state.nodewright_objects)
    inactive = inactive_nodewrights(state)
    fingerprint = spec_fingerprint(nodewright)
    facts = sequencing.facts_for(list(state.nodewrights.values()), state.nodes) if len(all_names) > 1 else []
    entries: dict[str, Entry] = {}
    for node in state.nodes:
        if not matches_nodewright(nodewright, node):
            continue
        node_name = str(node["metadata"]["name"])
        node_state, error = try_node_state(node, name)
        rnode = rollout_node(
            nodewright,
            node,
            state=node_state,
            runtime_taint_key=runtime_taint_key,
            all_nodewrights=all_names,
            now=state.now,
            inactive=inactive,
        )
        if error is not None:
            rnode = _malformed(rnode, error)
        if len(facts) > 1:
            blocker = sequencing.blocking(facts, target=name, node=node_name)
            if blocker is not None:
                rnode = replace(rnode, waiting_for_priority=blocker.name)
        entries[node_name] = Entry(node, node_state, error, rnode, phase_of(rnode, fingerprint=fingerprint))
    # As the rollout controller: admissions of an earlier rollout of this spec count as none.
    epoch = epoch_for(fingerprint, status=model.status, nodes=[e.rollout for e in entries.values()])
    for node_name, entry in entries.items():
        (rnode,) = current_nodes([entry.rollout], epoch)
        entries[node_name] = replace(entry, rollout=rnode, phase=phase_of(rnode, fingerprint=fingerprint))
    policy = state.policy(nodewright.spec.deployment_policy) if nodewright.spec.deployment_policy else None
    previous = model.status
    reset = (model.metadata.annotations or {}).get(constants.ANNOTATION_RESET_BATCH, "").lower()
    paused, disabled = is_paused(model), is_disabled(model)
    rollout_nodes = [e.rollout for e in entries.values()]
    plan = plan_rollout(
        nodewright,
        policy=policy,
        nodes=rollout_nodes,
        compartment_statuses=(previous.compartment_statuses if previous is not None else None) or {},
        fingerprint=fingerprint,
        now=ts(state.now),
        reset_requested=reset in ("true", "1", "yes"),
        paused=paused,
        disabled=disabled,
        next_order_hint=order_hint(epoch, previous),
        shared_budgets=shared_for(name, state.budget_objects, state.nodes, matched=entries),
    )
    resolved = resolve_compartments(
        nodewright, policy=policy, nodes=[NodeRef(n.name, n.labels) for n in rollout_nodes]
    )
    analysis = Analysis(
        model=model,
        nodewright=nodewright,
        policy=policy,
        fingerprint=fingerprint,
        plan=plan,
        entries=entries,
        compartments=resolved if isinstance(resolved, Compartments) else None,
        facts=facts,
        inactive=inactive,
        paused=paused,
        disabled=disabled,
        now=state.now,
    )
    analysis.waiting = {w.node: w for w in plan.waiting}
    analysis.admitted_now = {a.node: (a.admission.compartment, a.admission.batch) for a in plan.admissions}
    return analysis


# ----------------------------------------------------------------------------------------------------
# What the cluster shows about a drain


@dataclass(frozen=True, slots=True)
class PdbBlock:
    pod: str
    budget: str  # namespace/name
    why: str


@dataclass(frozen=True, slots=True)
class DrainReport:
    protected: tuple[str, ...]
    evict: tuple[str, ...]
    terminating: tuple[str, ...]
    blocked: tuple[PdbBlock, ...]


def _selector(doc: Any) -> LabelSelector | None:
    if not isinstance(doc, dict):
        return None
    try:
        return LabelSelector.model_validate(doc)
    except ValueError:
        return None


def drain_report(
    pods: Sequence[JSON], budgets: Sequence[JSON], *, protect: LabelSelector | None
) -> DrainReport:
    """Protected pods, pods to evict and the PodDisruptionBudgets that refuse their eviction now."""
    selection = drain_mod.select(pods, protect=protect)
    by_ref = {drain_mod.pod_ref(p): p for p in pods}
    blocked: list[PdbBlock] = []
    for ref in selection.evict:
        pod = by_ref[ref]
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        for pdb in budgets:
            pmeta = pdb.get("metadata") or {}
            if pmeta.get("namespace") != meta.get("namespace"):
                continue
            selector = _selector((pdb.get("spec") or {}).get("selector"))
            if selector is None or not selectors.matches(selector, labels):
                continue
            status = pdb.get("status") or {}
            allowed = int(status.get("disruptionsAllowed") or 0)
            if allowed > 0:
                continue
            healthy, desired = status.get("currentHealthy"), status.get("desiredHealthy")
            detail = (
                f"disruptionsAllowed 0 (healthy {healthy}, needs {desired})" if healthy is not None else ""
            )
            blocked.append(
                PdbBlock(
                    ref, f"{pmeta.get('namespace')}/{pmeta.get('name')}", detail or "disruptionsAllowed 0"
                )
            )
    return DrainReport(selection.protected, selection.evict, selection.terminating, tuple(blocked))


# ----------------------------------------------------------------------------------------------------
# The answer


@dataclass(frozen=True, slots=True)
class Explanation:
    node: str
    nodewright: str
    reason: str
    summary: str
    details: tuple[str, ...] = ()
    status: str = ""
    phase: str = ""
    compartment: str | None = None
    batch: int | None = None
    predicted_batch: int | None = None
    last_batch: int | None = None
    stage: str = ""
    attempts: int = 0

    def to_json(self) -> JSON:
        return {
            "node": self.node,
            "nodewright": self.nodewright,
            "reason": self.reason,
            "summary": self.summary,
            "details": list(self.details),
            "status": self.status,
            "phase": self.phase,
            "compartment": self.compartment,
            "batch": self.batch,
            "predictedBatch": self.predicted_batch,
            "lastBatch": self.last_batch,
            "stage": self.stage,
            "attempts": self.attempts,
        }


Answer = Callable[..., Explanation]


def condition(node: JSON, nodewright: str) -> tuple[str, str]:
    kind = constants.node_condition_type(nodewright)
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return str(cond.get("reason") or ""), str(cond.get("message") or "")
    return "", ""


def current_entry(state: NodeState | None, nodewright: NodeWright) -> PackageEntry | None:
    """The entry a node is busy with (in flight first, then erroring, then pending)."""
    if state is None:
        return None
    rank = {
        PackageState.IN_PROGRESS: 0,
        PackageState.ERRORING: 1,
        PackageState.PENDING: 2,
        PackageState.SKIPPED: 3,
    }
    live = [e for e in state.packages if e.state in rank and e.name in nodewright.spec.packages]
    return min(live, key=lambda e: (rank[e.state], e.key)) if live else None


def stage_text(entry: PackageEntry | None) -> str:
    if entry is None:
        return ""
    return f"{entry.name}:{entry.version} {entry.stage.value} {entry.state.value}"


def max_attempts(state: NodeState | None) -> int:
    return max((e.attempts for e in (state.packages if state else ())), default=0)


def explain(analysis: Analysis, node_name: str, *, drain: DrainReport | None = None) -> Explanation:
    """The one-line answer and its detail for one node of the analysed NodeWright."""
    nw = analysis.name
    entry = analysis.entries.get(node_name)
    if entry is None:
        return Explanation(
            node_name,
            nw,
            NOT_SELECTED,
            f"NodeWright {nw!r} does not select node {node_name!r}"
            " (its nodeSelectors do not match the node's labels)",
        )
    rnode = entry.rollout
    busy = current_entry(entry.state, analysis.nodewright)
    adm = rnode.admission
    base = {
        "status": rnode.status.value,
        "phase": entry.phase.value,
        "compartment": analysis.compartment_of(node_name),
        "batch": adm.batch if adm is not None and adm.fingerprint == analysis.fingerprint else None,
        "stage": stage_text(busy),
        "attempts": max_attempts(entry.state),
    }

    def answer(reason: str, summary: str, *details: str, **extra: Any) -> Explanation:
        fields = {**base, **extra}
        return Explanation(node_name, nw, reason, summary, tuple(d for d in details if d), **fields)

    if entry.state_error is not None:
        return answer(
            STATE_MALFORMED,
            f"state annotation {constants.state_annotation(nw)} cannot be read: nothing is done on this node",
            entry.state_error,
            f"restore the annotation, or delete it (kubectl nodewright node reset {node_name} {nw}) to start"
            " the node over through the next batch",
        )
    if node_name in analysis.admitted_now:
        compartment, batch = analysis.admitted_now[node_name]
        return answer(
            ADMITTED_NOW,
            f"admitted now: batch {batch} of compartment {compartment!r}"
            " takes it on the operator's next pass",
            compartment=compartment,
            batch=batch,
        )
    waiting = analysis.waiting.get(node_name)
    if waiting is not None:
        return _explain_waiting(analysis, entry, waiting, answer)
    return _explain_admitted(analysis, entry, busy, drain, answer)


def _explain_waiting(analysis: Analysis, entry: Entry, waiting: Waiting, answer: Answer) -> Explanation:
    nw, node_name, _rnode = analysis.name, entry.rollout.name, entry.rollout
    reason = waiting.reason
    comp = waiting.compartment or analysis.compartment_of(node_name)
    cplan = analysis.plan.compartments.get(comp) if comp is not None else None
    if reason is WaitReason.DISABLED:
        return answer(
            reason.value,
            f"NodeWright {nw!r} is disabled: nodes are left alone",
            f"enable it: kubectl nodewright enable {nw} (removes annotation {constants.ANNOTATION_DISABLE})",
        )
    if reason is WaitReason.PAUSED:
        return answer(
            reason.value,
            f"NodeWright {nw!r} is paused: no node is admitted",
            f"resume it: kubectl nodewright resume {nw} (removes annotation {constants.ANNOTATION_PAUSE})",
        )
    if reason is WaitReason.POLICY_NOT_FOUND:
        return answer(
            reason.value,
            f"DeploymentPolicy {waiting.detail!r} does not exist: no node of {nw!r} starts until it does",
            "create the policy, or change spec.deploymentPolicy",
        )
    if reason is WaitReason.POLICY_INVALID:
        invalid = analysis.plan.policy_invalid
        return answer(
            reason.value,
            invalid.message if invalid is not None else f"DeploymentPolicy {waiting.detail!r} is invalid",
            f"fix the fields named: kubectl edit deploymentpolicy {waiting.detail}",
        )
    if reason is WaitReason.BLOCKED:
        detail = waiting.detail or ""
        if detail.startswith("StateMalformed"):
            return answer(STATE_MALFORMED, f"blocked: {detail}")
        hint = ""
        if "taint" in detail:
            hint = "tolerate the taint with spec.additionalTolerations, or remove it from the node"
        elif constants.LABEL_IGNORE in detail:
            hint = f"kubectl nodewright node unignore {node_name} removes the label"
        elif "drain timed out" in detail:
            hint = (
                "the drain is retried after the drain timeout; fix the PodDisruptionBudget or the pods named"
            )
        return answer(reason.value, f"blocked: {detail}", hint)
    if reason is WaitReason.NODE_UNAVAILABLE:
        detail = waiting.detail or ""
        hint = ""
        if detail == "NotReady":
            hint = "the node is NotReady: it takes a slot of the budget and is picked once it is Ready again"
        elif "paused" in detail:
            owner = detail.split("'")[1] if "'" in detail else ""
            hint = f"resume NodeWright {owner!r} to let it finish and release the node" if owner else ""
        elif "someone else" in detail:
            hint = "cordoned outside NodeWright: it takes a slot; uncordon it to make it eligible"
        return answer(reason.value, f"node unavailable: {detail}", hint)
    if reason is WaitReason.WAITING_FOR_PRIORITY:
        other = waiting.detail or ""
        fact = next((f for f in analysis.facts if f.name == other), None)
        why = ""
        if fact is not None:
            how = "on all of its nodes" if fact.sequencing.value == "all" else "on this node"
            why = (
                f"{other!r} (priority {fact.priority}, sequencing {fact.sequencing.value})"
                f" must be complete {how} first"
            )
            if fact.paused:
                why += f"; it is paused: resume it (kubectl nodewright resume {other})"
        return answer(
            reason.value,
            f"waiting for NodeWright {other!r}" + (" (paused)" if fact and fact.paused else ""),
            why,
        )
    if reason is WaitReason.COMPARTMENT_HALTED:
        halt = cplan.halt if cplan is not None else None
        return answer(
            reason.value,
            f"compartment {comp!r} is halted: its failure threshold stopped new batches",
            halt.message if halt is not None else "",
            f"after fixing the cause: kubectl nodewright policy reset {nw}"
            + (f" --compartment {comp}" if comp else ""),
        )
    if reason is WaitReason.DISRUPTION_BUDGET:
        return answer(
            reason.value,
            waiting.message,
            "a DisruptionBudget caps the disrupted nodes of its pool across every NodeWright: a slot frees"
            " when one of those nodes settles or is uncordoned"
            f" (kubectl get disruptionbudget {waiting.detail} -o yaml shows the slots)",
        )
    if reason is WaitReason.BUDGET_FULL and comp is not None:
        ours, others = analysis.slot_holders(comp)
        ceiling = cplan.status.ceiling if cplan is not None else 0
        held = [
            f"{n} (ours, {analysis.entries[n].rollout.status.value})" for n in ours if n in analysis.entries
        ]
        held += [f"{n} ({why})" for n, why in others]
        return answer(
            reason.value,
            f"budget full: compartment {comp!r} has no free slot"
            f" ({len(ours) + len(others)} of {ceiling} in use)",
            "slots held by: " + names_text(held, 10) if held else "",
        )
    if reason is not WaitReason.NOT_YET_IN_BATCH:
        # Pacing and any reason added later (maintenance window, soak, approval gate): the planner's
        # own message says what it waits for and until when.
        return answer(reason.value, waiting.message, cplan.message if cplan is not None else "")
    # Not yet in a batch.
    predicted = analysis.predicted_batch(node_name)
    state = cplan.status.batch_state if cplan is not None else None
    current = state.current_batch if state is not None else 0
    if predicted is not None:
        number, last, pcomp = predicted
        return answer(
            WaitReason.NOT_YET_IN_BATCH.value,
            f"not in a batch yet: batch {number} of {last} in compartment {pcomp!r}",
            f"current batch {current}; batches are synchronous: the next opens when every node of the"
            " current one has settled"
            if current
            else "",
            cplan.message if cplan is not None else "",
            predicted_batch=number,
            last_batch=last,
        )
    return answer(
        WaitReason.NOT_YET_IN_BATCH.value,
        f"not in a batch yet (compartment {comp!r})",
        waiting.message,
    )


def _explain_admitted(
    analysis: Analysis, entry: Entry, busy: PackageEntry | None, drain: DrainReport | None, answer: Answer
) -> Explanation:
    nw, node_name, rnode = analysis.name, entry.rollout.name, entry.rollout
    reason, message = condition(entry.node, nw)
    phase = entry.phase
    if (
        phase is Phase.DONE
        or phase is Phase.SUCCEEDED
        or (rnode.status is Status.COMPLETE and not rnode.needs_work)
    ):
        return answer(COMPLETE, f"nothing to wait for: {nw!r} is complete on this node")
    if phase is Phase.FAILED or rnode.status is Status.ERRORING:
        errors = [
            f"{e.name}:{e.version} {e.stage.value}: {e.error}"
            for e in (entry.state.packages if entry.state else ())
            if e.state is PackageState.ERRORING
        ]
        return answer(
            ERRORING,
            "erroring: attempts exhausted, the node settled its batch and holds no slot",
            *errors[:3],
            f"after fixing the cause: kubectl nodewright node retry {node_name} {nw} (re-admitted within the"
            " budget); logs: kubectl nodewright package logs "
            + f"{nw} {busy.name if busy else 'PKG'} --node {node_name}",
        )
    if phase is Phase.CARRYOVER:
        return answer(
            CARRYOVER,
            "finishing work started under an older spec; it holds a slot, then waits for a batch of the"
            " current one",
            message,
        )
    details: list[str] = []
    if rnode.status is Status.PAUSED:
        return answer(
            WaitReason.PAUSED.value,
            f"NodeWright {nw!r} is paused; the node keeps what it holds",
            f"resume it: kubectl nodewright resume {nw} (removes annotation {constants.ANNOTATION_PAUSE})",
            message,
        )
    if reason == "WaitingForProtectedPods":
        protected = list(drain.protected) if drain is not None else []
        timeout = (
            analysis.nodewright.spec.interrupt_wait.timeout
            if analysis.nodewright.spec.interrupt_wait
            else None
        )
        if timeout:
            details.append(f"interruptWait.timeout {timeout}")
        return answer(
            PROTECTED_PODS,
            "waiting for protected pods to finish: " + (names_text(protected) if protected else message),
            f"podNonInterruptLabels of {nw!r} match them; the node is cordoned, nothing is evicted",
            *details,
        )
    if reason in ("Draining", DRAIN_TIMEOUT) or "draining" in message:
        timing = _drain_timing(entry.node, nw)
        spec = analysis.nodewright.spec.effective_drain()
        timed_out = False
        if timing is not None and spec.timeout:
            deadline = timing + timedelta(seconds=podspec.parse_duration_seconds(spec.timeout))
            timed_out = analysis.now >= deadline
            details.append(
                f"drain timeout {spec.timeout} (policy {spec.policy})"
                + (f" passed at {ts(deadline)}" if timed_out else f" ends at {ts(deadline)}")
                + ("; it keeps evicting" if timed_out and str(spec.policy) == "wait" else "")
            )
        if drain is not None and drain.blocked:
            details[:0] = [
                f"{b.pod}: PodDisruptionBudget {b.budget} refuses the eviction ({b.why})"
                for b in drain.blocked
            ]
            head = "drain blocked by PodDisruptionBudget " + names_text(
                sorted({b.budget for b in drain.blocked})
            )
            return answer(DRAIN_TIMEOUT if timed_out else DRAIN_BLOCKED, head, *details, message)
        left = list(drain.evict) + list(drain.terminating) if drain is not None else []
        head = "draining: " + (f"{len(left)} pod(s) left: {names_text(left)}" if left else message)
        return answer(DRAIN_TIMEOUT if timed_out else DRAINING, head, *details)
    if reason == "Rebooting" or "reboot" in message:
        return answer(REBOOTING, "rebooting: waiting for the node to come back (new boot id, Ready)", message)
    if not rnode.needs_work:
        return answer(COMPLETE, f"nothing to wait for: {nw!r} is complete on this node")
    ready = rnode.unavailable_reason != "NotReady"
    return answer(
        IN_PROGRESS,
        "in progress: " + (stage_text(busy) or message or "starting"),
        message if message and message not in stage_text(busy) else "",
        "" if ready else "the node is NotReady: nothing new starts until it is Ready",
    )


def _drain_timing(node: JSON, nodewright: str) -> datetime | None:
    """When this attempt's first eviction was issued (the node controller's timing annotation)."""
    from nodewright.controller.drainer import read_timing

    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return read_timing(annotations, nodewright).draining_since


def explain_all(analysis: Analysis) -> dict[str, Explanation]:
    return {name: explain(analysis, name) for name in sorted(analysis.entries)}


def needs_drain_facts(analysis: Analysis, node: str) -> bool:
    """Whether the node's answer gets better with its pods and PDBs (an admitted node at its gate)."""
    entry = analysis.entries.get(node)
    if entry is None or node in analysis.waiting:
        return False
    reason, message = condition(entry.node, analysis.name)
    return reason in ("WaitingForProtectedPods", "Draining", DRAIN_TIMEOUT) or "draining" in message


def protect_selector(analysis: Analysis) -> LabelSelector | None:
    return analysis.nodewright.spec.pod_non_interrupt_labels


def status_counts(analysis: Analysis) -> Mapping[str, int]:
    counts: dict[str, int] = {}
    for entry in analysis.entries.values():
        counts[entry.rollout.status.value] = counts.get(entry.rollout.status.value, 0) + 1
    return dict(sorted(counts.items()))
