"""Why a node waits, computed the way the operator decides it (pure: objects and `now` in, answers out).

Untouched waiting nodes carry no label and no condition (a 10,000-node fleet is not labelled the moment
a NodeWright appears), so the answer to "why is this node waiting" cannot be read off the node: it is
computed here with the operator's own code, from the cluster as it is --

1. the planner's input is built by the constructor the rollout controller uses
   (`plan.rollout_input.rollout_input`): each matched node as a `RolloutNode` (status label, state
   annotation, admission, cordons by others or by other NodeWrights and whether those are paused or
   disabled, NotReady, ignore label and untolerated taints, node-reported blocks such as a skipped
   drain, the earlier NodeWright it waits for by priority and sequencing, an unreadable state as
   blocked with `StateMalformed`), the persisted compartment statuses with the resets asked for, the
   approvals, pause and disable, the order counter, the admissions per pass and what the shared
   DisruptionBudgets leave it (a node held by a full pool says `DisruptionBudget` and who holds its
   slots);
2. `RolloutInput.plan()` -- the very decision the controller's pass makes -- gives each node's phase
   and, for a node with pending work that is not admitted, its `Waiting` reason (a code with typed
   particulars, `api.reasons`: the answer dispatches on it, never on a message);
3. for "not in a batch yet" the planner is replayed (`plan.preview`, what `nodewright plan` prints) to
   say which batch will take the node, and for "budget full" the nodes holding the compartment's slots
   are named;
4. an admitted node is at its node gate or running: the code of the operator's node condition says
   which (protected pods, draining, drain blocked or timed out, rebooting, a stage running, erroring)
   and `DrainReport`
   adds what the cluster shows now -- the protected pods by name, the pods a PodDisruptionBudget keeps
   from being evicted and that PDB, the drain timeout and its policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property
from typing import Any

from nodewright.api import constants
from nodewright.api.models import DeploymentPolicy, LabelSelector, NodeWright, Status
from nodewright.api.nodeobject import node_condition, node_timing
from nodewright.api.nodestate import NodeState, PackageEntry, PackageState
from nodewright.api.reasons import (
    DRAINING,
    HELD_AT_GATE,
    Activity,
    BudgetHeld,
    CordonedByNodeWright,
    CordonedBySomeoneElse,
    Deferred,
    DrainSkipped,
    HaltReason,
    IgnoreLabel,
    NodeConditionReason,
    NotReady,
    PolicyInvalid,
    Predecessor,
    StateMalformed,
    UntoleratedTaints,
    WaitReason,
    condition_reason,
    detail_label,
)
from nodewright.cli.plugin.cluster import ClusterState
from nodewright.plan import drain as drain_mod
from nodewright.plan import podspec, selectors, sequencing
from nodewright.plan.budgets import parse_budgets
from nodewright.plan.disruption import DisruptionCost
from nodewright.plan.policy import Compartments, NodeRef, resolve_compartments
from nodewright.plan.preview import RolloutPreview
from nodewright.plan.rollout import CompartmentPlan, Phase, RolloutNode, RolloutPlan, Waiting, phase_of
from nodewright.plan.rollout_input import (
    DEFAULT_OPTIONS,
    DerivedNode,
    NodeContext,
    NodeEntry,
    RolloutInput,
    RolloutOptions,
    derive_node,
    node_pods_of,
    rollout_input,
)
from nodewright.plan.stages import ts

JSON = dict[str, Any]
MAX_NAMES = 5


class Answer(StrEnum):
    """The reasons `why` answers beyond the planner's `WaitReason` values: what an admitted node does."""

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

    node: Mapping[str, Any]
    state: NodeState | None
    state_error: str | None
    rollout: RolloutNode
    phase: Phase


@dataclass
class Analysis:
    """The rollout planner's decision for one NodeWright, as the controller would take it now."""

    inp: RolloutInput
    plan: RolloutPlan
    entries: dict[str, Entry]
    compartments: Compartments | None
    waiting: dict[str, Waiting] = field(default_factory=dict)
    admitted_now: dict[str, tuple[str, int]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.inp.name

    @property
    def model(self) -> NodeWright:
        return self.inp.model

    @property
    def nodewright(self) -> NodeWright:
        return self.inp.nodewright  # the effective spec (deletion turns into uninstalls)

    @property
    def policy(self) -> DeploymentPolicy | PolicyInvalid | None:
        return self.inp.policy

    @property
    def fingerprint(self) -> str:
        return self.inp.fingerprint

    @property
    def facts(self) -> Sequence[sequencing.NodeWrightFacts]:
        return self.inp.facts

    @property
    def inactive(self) -> Mapping[str, Activity]:
        return self.inp.inactive

    @property
    def paused(self) -> bool:
        return self.inp.paused

    @property
    def disabled(self) -> bool:
        return self.inp.disabled

    @property
    def now(self) -> datetime:
        return self.inp.now

    @cached_property
    def preview(self) -> RolloutPreview:
        return self.inp.preview()

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
            elif entry.rollout.unavailable is not None:
                others.append((name, entry.rollout.unavailable.describe()))
        return ours, others

    def predicted_batch(self, node: str) -> tuple[int, int, str] | None:
        """(batch number, last batch number, compartment) the replayed planner puts the node in."""
        for comp in self.preview.compartments:
            for batch in comp.batches:
                if node in batch.nodes:
                    last = comp.batches[-1].number if comp.batches else batch.number
                    return batch.number, last, comp.name
        return None


def cluster_input(
    state: ClusterState,
    name: str,
    *,
    options: RolloutOptions = DEFAULT_OPTIONS,
    entries: Callable[[NodeContext, Sequence[Mapping[str, Any]]], Sequence[NodeEntry]] | None = None,
) -> RolloutInput:
    """The rollout planner's input for `name` from what the plugin read (`plan.rollout_input`)."""
    nodewrights: dict[str, NodeWright | None] = dict.fromkeys(state.invalid)
    nodewrights.update(state.nodewrights)
    return rollout_input(
        state.nodewright(name),
        nodes=state.nodes,
        nodewrights=nodewrights,
        policies={**state.invalid_policies, **state.policies},
        budgets=parse_budgets(state.budget_objects),
        now=state.now,
        options=options,
        entries=entries,
        node_pods=node_pods_of(state.pod_facts),
    )


def analyse(state: ClusterState, name: str, *, options: RolloutOptions = DEFAULT_OPTIONS) -> Analysis:
    """Plan `name` from `state` exactly as the rollout controller's pass would."""
    derived: dict[str, tuple[Mapping[str, Any], DerivedNode]] = {}

    def keep(ctx: NodeContext, nodes: Sequence[Mapping[str, Any]]) -> list[NodeEntry]:
        out = []
        for node in nodes:
            found = derive_node(ctx, node)
            derived[found.entry.name] = (node, found)
            out.append(found.entry)
        return out

    inp = cluster_input(state, name, options=options, entries=keep)
    plan = inp.plan()
    entries = {
        rnode.name: Entry(
            derived[rnode.name][0],
            derived[rnode.name][1].state,
            derived[rnode.name][1].entry.state_error,
            rnode,
            phase_of(rnode, fingerprint=inp.fingerprint),
        )
        for rnode in inp.nodes
    }
    resolved = resolve_compartments(
        inp.nodewright, policy=inp.policy, nodes=[NodeRef(n.name, n.labels) for n in inp.nodes]
    )
    return Analysis(
        inp=inp,
        plan=plan,
        entries=entries,
        compartments=resolved if isinstance(resolved, Compartments) else None,
        waiting={w.node: w for w in plan.waiting},
        admitted_now={a.node: (a.admission.compartment, a.admission.batch) for a in plan.admissions},
    )


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
    domain: str | None = None
    """The node's topology domain, when its compartment has a `topologyKey`."""
    disruption: DisruptionCost | None = None
    """What updating the node interrupts, when its policy orders `idleFirst` (`plan.disruption`)."""

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
            **({"domain": self.domain} if self.domain is not None else {}),
            **({"disruption": self.disruption.to_json()} if self.disruption is not None else {}),
        }


Answerer = Callable[..., Explanation]


def condition(node: Mapping[str, Any], nodewright: str) -> tuple[NodeConditionReason | None, str]:
    """The code of the node's condition for `nodewright` (None: absent, or not one of ours), and its
    message (for people: shown, never read)."""
    found = node_condition(node, nodewright)
    if found is None:
        return None, ""
    return condition_reason(found.reason), found.message


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
            Answer.NOT_SELECTED,
            f"NodeWright {nw!r} does not select node {node_name!r}"
            " (its nodeSelectors do not match the node's labels)",
        )
    rnode = entry.rollout
    busy = current_entry(entry.state, analysis.nodewright)
    adm = rnode.admission
    base: dict[str, Any] = {
        "status": rnode.status.value,
        "phase": entry.phase.value,
        "compartment": analysis.compartment_of(node_name),
        "batch": adm.batch if adm is not None and adm.fingerprint == analysis.fingerprint else None,
        "stage": stage_text(busy),
        "attempts": max_attempts(entry.state),
    }

    domain = analysis.plan.domains.get(node_name)
    if domain is not None:
        base["domain"] = domain
    if rnode.disruption is not None:
        base["disruption"] = rnode.disruption

    def answer(reason: str, summary: str, *details: str, **extra: Any) -> Explanation:
        fields = {**base, **extra}
        shown = (*details, _domain_detail(analysis, node_name, domain), _cost_detail(rnode.disruption))
        return Explanation(node_name, nw, reason, summary, tuple(d for d in shown if d), **fields)

    if entry.state_error is not None:
        return answer(
            Answer.STATE_MALFORMED,
            f"state annotation {constants.state_annotation(nw)} cannot be read: nothing is done on this node",
            entry.state_error,
            f"restore the annotation, or delete it (kubectl nodewright node reset {node_name} {nw}) to start"
            " the node over through the next batch",
        )
    if node_name in analysis.admitted_now:
        compartment, batch = analysis.admitted_now[node_name]
        return answer(
            Answer.ADMITTED_NOW,
            f"admitted now: batch {batch} of compartment {compartment!r}"
            " takes it on the operator's next pass",
            compartment=compartment,
            batch=batch,
        )
    waiting = analysis.waiting.get(node_name)
    if waiting is not None:
        return _explain_waiting(analysis, entry, waiting, answer)
    return _explain_admitted(analysis, entry, busy, drain, answer)


def _domain_detail(analysis: Analysis, node: str, domain: str | None) -> str:
    """`topology domain r3: admitted, cordoned and drained as one with r3-n0, r3-n1 and 2 more`."""
    if domain is None:
        return ""
    mates = sorted(n for n, d in analysis.plan.domains.items() if d == domain and n != node)
    with_text = f" with {names_text(mates)}" if mates else " (its only node)"
    return f"topology domain {domain}: admitted, cordoned and drained as one{with_text}"


def _cost_detail(cost: DisruptionCost | None) -> str:
    """`disruption cost: idle (nodeOrder idleFirst: the cheapest nodes are taken first)`."""
    if cost is None:
        return ""
    return f"disruption cost: {cost.describe()} (nodeOrder idleFirst: the cheapest nodes are taken first)"


def _explain_waiting(analysis: Analysis, entry: Entry, waiting: Waiting, answer: Answerer) -> Explanation:
    """A node with pending work the planner does not admit: its `WaitReason`, with what to do."""
    reason = waiting.reason
    if reason in _BY_REASON:
        return _BY_REASON[reason](analysis, entry, waiting, answer)
    if reason is not WaitReason.NOT_YET_IN_BATCH:
        # Pacing and any reason added later (maintenance window, soak, approval gate): the planner's
        # own message says what it waits for and until when.
        cplan = _compartment_plan(analysis, entry, waiting)
        return answer(reason.value, waiting.message, cplan.message if cplan is not None else "")
    return _not_yet_in_batch(analysis, entry, waiting, answer)


def _compartment_plan(analysis: Analysis, entry: Entry, waiting: Waiting) -> CompartmentPlan | None:
    comp = waiting.compartment or analysis.compartment_of(entry.rollout.name)
    return analysis.plan.compartments.get(comp) if comp is not None else None


def _disabled(analysis: Analysis, entry: Entry, waiting: Waiting, answer: Answerer) -> Explanation:
    nw = analysis.name
    return answer(
        waiting.reason.value,
        f"NodeWright {nw!r} is disabled: nodes are left alone",
        f"enable it: kubectl nodewright enable {nw} (removes annotation {constants.ANNOTATION_DISABLE})",
    )


def _paused(analysis: Analysis, entry: Entry, waiting: Waiting, answer: Answerer) -> Explanation:
    nw = analysis.name
    return answer(
        waiting.reason.value,
        f"NodeWright {nw!r} is paused: no node is admitted",
        f"resume it: kubectl nodewright resume {nw} (removes annotation {constants.ANNOTATION_PAUSE})",
    )


def _policy_not_found(analysis: Analysis, entry: Entry, waiting: Waiting, answer: Answerer) -> Explanation:
    return answer(
        waiting.reason.value,
        f"DeploymentPolicy {detail_label(waiting.detail)!r} does not exist: no node of {analysis.name!r}"
        " starts until it does",
        "create the policy, or change spec.deploymentPolicy",
    )


def _policy_invalid(analysis: Analysis, entry: Entry, waiting: Waiting, answer: Answerer) -> Explanation:
    policy = detail_label(waiting.detail)
    invalid = analysis.plan.policy_invalid
    return answer(
        waiting.reason.value,
        invalid.message if invalid is not None else f"DeploymentPolicy {policy!r} is invalid",
        f"fix the fields named: kubectl edit deploymentpolicy {policy}",
    )


def _blocked(analysis: Analysis, entry: Entry, waiting: Waiting, answer: Answerer) -> Explanation:
    block = waiting.detail
    if isinstance(block, StateMalformed):
        return answer(Answer.STATE_MALFORMED, waiting.message)
    hint = ""
    if isinstance(block, UntoleratedTaints):
        hint = "tolerate the taint with spec.additionalTolerations, or remove it from the node"
    elif isinstance(block, IgnoreLabel):
        hint = f"kubectl nodewright node unignore {entry.rollout.name} removes the label"
    elif isinstance(block, DrainSkipped):
        hint = "the drain is retried after the drain timeout; fix the PodDisruptionBudget or the pods named"
    return answer(waiting.reason.value, waiting.message, hint)


def _unavailable(analysis: Analysis, entry: Entry, waiting: Waiting, answer: Answerer) -> Explanation:
    held = waiting.detail
    hint = ""
    if isinstance(held, NotReady):
        hint = "the node is NotReady: it takes a slot of the budget and is picked once it is Ready again"
    elif isinstance(held, CordonedByNodeWright) and held.activity is Activity.PAUSED:
        hint = f"resume NodeWright {held.owner!r} to let it finish and release the node"
    elif isinstance(held, CordonedBySomeoneElse):
        hint = "cordoned outside NodeWright: it takes a slot; uncordon it to make it eligible"
    return answer(waiting.reason.value, waiting.message, hint)


def _predecessor(analysis: Analysis, entry: Entry, waiting: Waiting, answer: Answerer) -> Explanation:
    other = waiting.detail.name if isinstance(waiting.detail, Predecessor) else ""
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
        waiting.reason.value,
        f"waiting for NodeWright {other!r}" + (" (paused)" if fact and fact.paused else ""),
        why,
    )


def _halted(analysis: Analysis, entry: Entry, waiting: Waiting, answer: Answerer) -> Explanation:
    comp = waiting.compartment or analysis.compartment_of(entry.rollout.name)
    cplan = _compartment_plan(analysis, entry, waiting)
    halt = cplan.halt if cplan is not None else None
    return answer(
        waiting.reason.value,
        f"compartment {comp!r} is halted: "
        + (
            "a health gate failed past its timeout"
            if halt is not None and halt.reason is HaltReason.HEALTH_GATE
            else "its failure threshold stopped new batches"
        ),
        halt.message if halt is not None else "",
        f"after fixing the cause: kubectl nodewright policy reset {analysis.name}"
        + (f" --compartment {comp}" if comp else ""),
    )


def _shared_budget(analysis: Analysis, entry: Entry, waiting: Waiting, answer: Answerer) -> Explanation:
    budget = waiting.detail.budget if isinstance(waiting.detail, BudgetHeld) else ""
    return answer(
        waiting.reason.value,
        waiting.message,
        "a DisruptionBudget caps the disrupted nodes of its pool across every NodeWright: a slot frees"
        " when one of those nodes settles or is uncordoned"
        f" (kubectl get disruptionbudget {budget} -o yaml shows the slots)",
    )


def _budget_full(analysis: Analysis, entry: Entry, waiting: Waiting, answer: Answerer) -> Explanation:
    comp = waiting.compartment or analysis.compartment_of(entry.rollout.name)
    if comp is None:
        return _not_yet_in_batch(analysis, entry, waiting, answer)
    cplan = _compartment_plan(analysis, entry, waiting)
    ours, others = analysis.slot_holders(comp)
    ceiling = cplan.status.ceiling if cplan is not None else 0
    held = [f"{n} (ours, {analysis.entries[n].rollout.status.value})" for n in ours if n in analysis.entries]
    held += [f"{n} ({why})" for n, why in others]
    return answer(
        waiting.reason.value,
        f"budget full: compartment {comp!r} has no free slot ({len(ours) + len(others)} of {ceiling} in use)",
        "slots held by: " + names_text(held, 10) if held else "",
    )


def _not_yet_in_batch(analysis: Analysis, entry: Entry, waiting: Waiting, answer: Answerer) -> Explanation:
    comp = waiting.compartment or analysis.compartment_of(entry.rollout.name)
    cplan = _compartment_plan(analysis, entry, waiting)
    if isinstance(waiting.detail, Deferred):  # in the batch already: `--admissions-per-pass` defers it
        return answer(
            WaitReason.NOT_YET_IN_BATCH.value,
            waiting.message,
            cplan.message if cplan is not None else "",
            predicted_batch=waiting.detail.batch,
        )
    predicted = analysis.predicted_batch(entry.rollout.name)
    state = cplan.status.batch_state if cplan is not None else None
    current = state.current_batch if state is not None else 0
    if predicted is None:
        return answer(
            WaitReason.NOT_YET_IN_BATCH.value, f"not in a batch yet (compartment {comp!r})", waiting.message
        )
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


_WaitingAnswer = Callable[[Analysis, Entry, Waiting, "Answerer"], "Explanation"]
_BY_REASON: Mapping[WaitReason, _WaitingAnswer] = {
    WaitReason.DISABLED: _disabled,
    WaitReason.PAUSED: _paused,
    WaitReason.POLICY_NOT_FOUND: _policy_not_found,
    WaitReason.POLICY_INVALID: _policy_invalid,
    WaitReason.BLOCKED: _blocked,
    WaitReason.NODE_UNAVAILABLE: _unavailable,
    WaitReason.WAITING_FOR_PRIORITY: _predecessor,
    WaitReason.COMPARTMENT_HALTED: _halted,
    WaitReason.DISRUPTION_BUDGET: _shared_budget,
    WaitReason.BUDGET_FULL: _budget_full,
}


def _explain_admitted(
    analysis: Analysis, entry: Entry, busy: PackageEntry | None, drain: DrainReport | None, answer: Answerer
) -> Explanation:
    """An admitted (or settled) node: what its node condition's code says it is doing."""
    nw, rnode = analysis.name, entry.rollout
    reason, message = condition(entry.node, nw)
    phase = entry.phase
    if phase in (Phase.DONE, Phase.SUCCEEDED) or (rnode.status is Status.COMPLETE and not rnode.needs_work):
        return answer(Answer.COMPLETE, f"nothing to wait for: {nw!r} is complete on this node")
    if phase is Phase.FAILED or rnode.status is Status.ERRORING:
        return _erroring(analysis, entry, busy, answer)
    if phase is Phase.CARRYOVER:
        return answer(
            Answer.CARRYOVER,
            "finishing work started under an older spec; it holds a slot, then waits for a batch of the"
            " current one",
            message,
        )
    if rnode.status is Status.PAUSED:
        return answer(
            WaitReason.PAUSED.value,
            f"NodeWright {nw!r} is paused; the node keeps what it holds",
            f"resume it: kubectl nodewright resume {nw} (removes annotation {constants.ANNOTATION_PAUSE})",
            message,
        )
    if reason is NodeConditionReason.WAITING_FOR_PROTECTED_PODS:
        return _protected(analysis, message, drain, answer)
    if reason in DRAINING:
        return _draining(analysis, entry, message, drain, answer)
    if reason is NodeConditionReason.REBOOTING:
        return answer(
            Answer.REBOOTING, "rebooting: waiting for the node to come back (new boot id, Ready)", message
        )
    if not rnode.needs_work:
        return answer(Answer.COMPLETE, f"nothing to wait for: {nw!r} is complete on this node")
    return answer(
        Answer.IN_PROGRESS,
        "in progress: " + (stage_text(busy) or message or "starting"),
        message if message and message not in stage_text(busy) else "",
        "the node is NotReady: nothing new starts until it is Ready"
        if isinstance(rnode.unavailable, NotReady)
        else "",
    )


def _erroring(analysis: Analysis, entry: Entry, busy: PackageEntry | None, answer: Answerer) -> Explanation:
    nw, node_name = analysis.name, entry.rollout.name
    errors = [
        f"{e.name}:{e.version} {e.stage.value}: {e.error}"
        for e in (entry.state.packages if entry.state else ())
        if e.state is PackageState.ERRORING
    ]
    return answer(
        Answer.ERRORING,
        "erroring: attempts exhausted, the node settled its batch and holds no slot",
        *errors[:3],
        f"after fixing the cause: kubectl nodewright node retry {node_name} {nw} (re-admitted within the"
        " budget); logs: kubectl nodewright package logs "
        + f"{nw} {busy.name if busy else 'PKG'} --node {node_name}",
    )


def _protected(analysis: Analysis, message: str, drain: DrainReport | None, answer: Answerer) -> Explanation:
    protected = list(drain.protected) if drain is not None else []
    wait = analysis.nodewright.spec.interrupt_wait
    return answer(
        Answer.PROTECTED_PODS,
        "waiting for protected pods to finish: " + (names_text(protected) if protected else message),
        f"podNonInterruptLabels of {analysis.name!r} match them; the node is cordoned, nothing is evicted",
        f"interruptWait.timeout {wait.timeout}" if wait is not None and wait.timeout else "",
    )


def _draining(
    analysis: Analysis, entry: Entry, message: str, drain: DrainReport | None, answer: Answerer
) -> Explanation:
    details: list[str] = []
    since = node_timing(entry.node, analysis.name).draining_since
    spec = analysis.nodewright.spec.effective_drain()
    timed_out = False
    if since is not None and spec.timeout:
        deadline = since + timedelta(seconds=podspec.parse_duration_seconds(spec.timeout))
        timed_out = analysis.now >= deadline
        details.append(
            f"drain timeout {spec.timeout} (policy {spec.policy})"
            + (f" passed at {ts(deadline)}" if timed_out else f" ends at {ts(deadline)}")
            + ("; it keeps evicting" if timed_out and str(spec.policy) == "wait" else "")
        )
    if drain is not None and drain.blocked:
        details[:0] = [
            f"{b.pod}: PodDisruptionBudget {b.budget} refuses the eviction ({b.why})" for b in drain.blocked
        ]
        head = "drain blocked by PodDisruptionBudget " + names_text(sorted({b.budget for b in drain.blocked}))
        return answer(Answer.DRAIN_TIMEOUT if timed_out else Answer.DRAIN_BLOCKED, head, *details, message)
    left = list(drain.evict) + list(drain.terminating) if drain is not None else []
    head = "draining: " + (f"{len(left)} pod(s) left: {names_text(left)}" if left else message)
    return answer(Answer.DRAIN_TIMEOUT if timed_out else Answer.DRAINING, head, *details)


def explain_all(analysis: Analysis) -> dict[str, Explanation]:
    return {name: explain(analysis, name) for name in sorted(analysis.entries)}


def needs_drain_facts(analysis: Analysis, node: str) -> bool:
    """Whether the node's answer gets better with its pods and PDBs (an admitted node at its gate)."""
    entry = analysis.entries.get(node)
    if entry is None or node in analysis.waiting:
        return False
    return condition(entry.node, analysis.name)[0] in HELD_AT_GATE


def protect_selector(analysis: Analysis) -> LabelSelector | None:
    return analysis.nodewright.spec.pod_non_interrupt_labels


def status_counts(analysis: Analysis) -> Mapping[str, int]:
    counts: dict[str, int] = {}
    for entry in analysis.entries.values():
        counts[entry.rollout.status.value] = counts.get(entry.rollout.status.value, 0) + 1
    return dict(sorted(counts.items()))
