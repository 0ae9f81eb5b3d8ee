"""NodeWright status aggregation: node statuses and a rollout plan in, a bounded status out.

The NodeWright status holds aggregates only, so its size does not grow with the fleet: counts per node
status, per package `name:version` counts per `stage/state`, per waiting reason counts, and at most
`MAX_EXAMPLES` example node names per bucket. Node-level truth stays on the nodes.

Roll-up (reference §4.1): every node complete (or no node) → `complete`; otherwise any node
`in_progress` → `in_progress`; otherwise when all remaining nodes share one status, that status; a mixed
set → `unknown`. One addition: a halted compartment with nothing in progress turns `unknown`/`waiting`
into `blocked` (the reference shows a stopped rollout as waiting and nothing else). Overrides, in this
order, when the result is not `complete`: disabled → `disabled`; paused → `paused`; policy not found or
invalid → `blocked` (this one also when complete); waiting for a `sequencing: all` predecessor →
`waiting`.

Conditions are metav1.Condition with kstatus semantics, all present on every write, each stamped with
the NodeWright's generation (`observedGeneration`):

- `Ready`: True/`NodesConverged` when complete; else False with `Progressing`, `Blocked`, `Erroring`,
  `Paused`, `Waiting`, `Disabled` or `Unknown`. The message summarises counts with a few names.
- `Reconciling`: True while nodes are in progress or admitted (kstatus: InProgress).
- `Stalled`: True when a compartment halted, the policy is missing or invalid, or every remaining node
  is erroring or blocked (kstatus: Failed).
- `Halted` (one condition naming every halted compartment and its failing nodes), `Paused`,
  `Disabled`, `PolicyNotFound`, `PolicyInvalid` (the policy exists but fails validation: its message
  names the policy, each field and what to do), `NodeStateMalformed`, `Blocked`.

`lastTransitionTime` is carried over from the previous condition of the same type whenever its status
is unchanged (apimachinery `SetStatusCondition`), so recomputing an unchanged status yields an identical
object and no write. Conditions of other types found in the previous status (set by other parts of the
controller, e.g. drain) are kept as they are unless `extra_conditions` replaces them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from nodewright.api.models import (
    MAX_CONSISTENCY_GROUPS,
    Condition,
    ConsistencyGroup,
    NodeWright,
    NodeWrightStatus,
    Status,
)
from nodewright.api.reasons import WaitReason, detail_label
from nodewright.plan.revisions import UndoHint
from nodewright.plan.rollout import RolloutPlan, status_for_spec

MAX_EXAMPLES = 5

READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"
HALTED = "Halted"
PAUSED = "Paused"
DISABLED = "Disabled"
POLICY_NOT_FOUND = "PolicyNotFound"
POLICY_INVALID = "PolicyInvalid"
NODE_STATE_MALFORMED = "NodeStateMalformed"
BLOCKED = "Blocked"
DRIFTED = "Drifted"
RUNTIME_TAINT_HELD = "RuntimeTaintHeld"
OWNED_CONDITIONS = (
    READY,
    RECONCILING,
    STALLED,
    HALTED,
    PAUSED,
    DISABLED,
    POLICY_NOT_FOUND,
    POLICY_INVALID,
    NODE_STATE_MALFORMED,
    BLOCKED,
    DRIFTED,
)

_READY_REASON = {
    Status.COMPLETE: "NodesConverged",
    Status.IN_PROGRESS: "Progressing",
    Status.BLOCKED: "Blocked",
    Status.ERRORING: "Erroring",
    Status.PAUSED: "Paused",
    Status.WAITING: "Waiting",
    Status.DISABLED: "Disabled",
    Status.UNKNOWN: "Unknown",
    Status.DRIFTED: "NodesConverged",
}


@dataclass(frozen=True, slots=True)
class PackageReport:
    """One package entry of a node's state: what the controller read from the node annotation."""

    name: str
    version: str
    stage: str
    state: str
    config: str = ""  # digest of the configMap hashes last applied (fleet consistency)
    drifted: bool = False


@dataclass(frozen=True, slots=True)
class NodeReport:
    """`status` is what the node counts as in the roll-up (`report_for`). `drifted` marks a node whose
    label says drifted."""

    name: str
    status: Status
    packages: tuple[PackageReport, ...] = ()
    drifted: bool = False


def report_for(
    name: str, status: Status, *, needs_work: bool, packages: tuple[PackageReport, ...] = ()
) -> NodeReport:
    """What one node counts as in the roll-up, from its status for the current spec
    (`plan.rollout.status_for_spec`) and whether its state says work for that spec is pending.

    A node with pending work is never counted complete: after a spec change the status labels still
    say `complete` until the node controller has planned each node again, and counting those made the
    first status of every new generation `Ready=True` with that generation as `observedGeneration`
    before any node had started. A drifted node whose drift is only reported counts as complete
    (drift is information); one waiting for its repair (action reapply) waits.
    """
    counted = status_for_spec(status, needs_work=needs_work)
    if counted is Status.DRIFTED:
        counted = Status.WAITING if needs_work else Status.COMPLETE
        return NodeReport(name=name, status=counted, packages=packages, drifted=True)
    return NodeReport(name=name, status=counted, packages=packages)


@dataclass(frozen=True, slots=True)
class StatusSummary:
    """The computed status. `status` fits the current model; the rest are proposed status fields."""

    status: NodeWrightStatus
    node_examples: Mapping[str, tuple[str, ...]]
    package_counts: Mapping[str, Mapping[str, int]]
    waiting_reasons: Mapping[str, int]
    waiting_examples: Mapping[str, tuple[str, ...]]

    def to_json_dict(self) -> dict[str, Any]:
        data = self.status.to_json_dict()
        data["nodeExamples"] = {k: list(v) for k, v in self.node_examples.items()}
        data["packageCounts"] = {k: dict(v) for k, v in self.package_counts.items()}
        data["waitingReasons"] = dict(self.waiting_reasons)
        data["waitingExamples"] = {k: list(v) for k, v in self.waiting_examples.items()}
        return data


def roll_up(statuses: Iterable[Status], *, halted: bool = False) -> Status:
    """Reference §4.1 roll-up of node statuses (plus the halted rule; see the module docstring)."""
    # A node labelled drifted whose drift is only reported counts as complete (drift is information).
    remaining = {s for s in statuses if s not in (Status.COMPLETE, Status.DRIFTED)}
    if not remaining:
        return Status.COMPLETE
    if Status.IN_PROGRESS in remaining:
        return Status.IN_PROGRESS
    result = next(iter(remaining)) if len(remaining) == 1 else Status.UNKNOWN
    if halted and result in (Status.UNKNOWN, Status.WAITING):
        return Status.BLOCKED
    return result


def aggregate_status(
    nodewright: NodeWright,
    *,
    nodes: Sequence[NodeReport],
    plan: RolloutPlan | None,
    now: str,
    paused: bool = False,
    disabled: bool = False,
    waiting_for_sequencing: str | None = None,
    malformed_nodes: Sequence[str] = (),
    extra_conditions: Sequence[Condition] = (),
    undo: UndoHint | None = None,
) -> StatusSummary:
    """Compute the NodeWright status from its nodes and the latest rollout plan.

    `nodes` holds every matched node with its status for this NodeWright and its package entries;
    `plan` is this pass's `plan_rollout` result (None keeps the persisted compartment statuses);
    `waiting_for_sequencing` names a `sequencing: all` predecessor that is not yet complete;
    `malformed_nodes` lists nodes whose state annotation could not be parsed; `undo` is the revision
    before the current spec, which a `Halted` condition names with the command that restores it. The
    previous status (for lastTransitionTime) is read from `nodewright.status`."""
    previous = nodewright.status or NodeWrightStatus()
    waiting_names, blocked_details = _waiting_by_reason(plan)
    facts = _facts(
        nodewright,
        nodes,
        plan,
        paused=paused,
        disabled=disabled,
        sequencing=waiting_for_sequencing,
        malformed=malformed_nodes,
        waiting_counts={k: len(v) for k, v in sorted(waiting_names.items())},
        blocked_details=blocked_details,
        undo=undo,
    )
    by_status = facts.by_status
    conditions = merge_conditions(
        previous.conditions or [],
        current=[*_owned_conditions(facts), *extra_conditions],
        now=now,
    )
    compartments = plan.compartment_statuses if plan is not None else previous.compartment_statuses
    return StatusSummary(
        status=_status(nodewright, nodes, facts, conditions, compartments),
        node_examples={
            s.value: _examples(names) for s, names in sorted(by_status.items(), key=lambda i: i[0].value)
        },
        package_counts=_package_counts(nodes),
        waiting_reasons=facts.waiting_counts,
        waiting_examples={k: _examples(v) for k, v in sorted(waiting_names.items())},
    )


def _facts(
    nodewright: NodeWright,
    nodes: Sequence[NodeReport],
    plan: RolloutPlan | None,
    *,
    paused: bool,
    disabled: bool,
    sequencing: str | None,
    malformed: Sequence[str],
    waiting_counts: Mapping[str, int],
    blocked_details: Counter[str],
    undo: UndoHint | None,
) -> _Facts:
    """What the status and its conditions are made of: the nodes by status and the overall status."""
    policy_missing = plan is not None and plan.policy_not_found is not None
    policy_invalid = plan.policy_invalid if plan is not None else None
    by_status: dict[Status, list[str]] = defaultdict(list)
    for node in nodes:
        by_status[node.status].append(node.name)
    rolled = roll_up((n.status for n in nodes), halted=bool(plan.halts if plan is not None else ()))
    overall = _override(
        rolled,
        paused=paused,
        disabled=disabled,
        policy_unusable=policy_missing or policy_invalid is not None,
        sequencing=sequencing,
    )
    return _Facts(
        generation=nodewright.metadata.generation,
        overall=overall,
        by_status=by_status,
        total=len(nodes),
        plan=plan,
        paused=paused,
        disabled=disabled,
        policy_missing=policy_missing,
        sequencing=sequencing,
        malformed=sorted(malformed),
        policy_invalid=policy_invalid.message if policy_invalid is not None else None,
        waiting_counts=waiting_counts,
        blocked_details=blocked_details,
        drifted=sorted(n.name for n in nodes if n.drifted),
        undo=undo,
    )


def _waiting_by_reason(plan: RolloutPlan | None) -> tuple[dict[str, list[str]], Counter[str]]:
    """The waiting nodes by reason, and how many are blocked for each particular block."""
    names: dict[WaitReason, list[str]] = defaultdict(list)
    blocked: Counter[str] = Counter()
    for waiting in plan.waiting if plan is not None else ():
        names[waiting.reason].append(waiting.node)
        label = detail_label(waiting.detail) if waiting.reason is WaitReason.BLOCKED else None
        if label:
            blocked[label] += 1
    return {reason.value: nodes for reason, nodes in names.items()}, blocked


def _status(
    nodewright: NodeWright,
    nodes: Sequence[NodeReport],
    facts: _Facts,
    conditions: list[Condition],
    compartments: Mapping[str, Any] | None,
) -> NodeWrightStatus:
    by_status = facts.by_status
    complete = len(by_status.get(Status.COMPLETE, ()))
    return NodeWrightStatus(
        observed_generation=nodewright.metadata.generation,
        status=facts.overall,
        conditions=conditions,
        compartment_statuses=dict(sorted(compartments.items())) if compartments else None,
        nodes_in_progress=len(by_status.get(Status.IN_PROGRESS, ())),
        nodes_erroring=len(by_status.get(Status.ERRORING, ())),
        complete_nodes=f"{complete}/{len(nodes)}",
        package_list=package_list(nodewright),
        node_counts={s.value: len(names) for s, names in sorted(by_status.items(), key=lambda i: i[0].value)},
        drifted_nodes=len(facts.drifted),
        drifted_examples=list(_examples(facts.drifted)) or None,
        consistency=consistency_summary(nodes) or None,
    )


def runtime_taint_condition(held: Sequence[str], *, generation: int | None) -> Condition:
    """`RuntimeTaintHeld`: the nodes that keep the runtime-required taint only because this NodeWright is
    paused or disabled (`controller.taints`), counted and named (at most `MAX_EXAMPLES`, like every
    aggregate condition), so an SRE knows which nodes stay unschedulable. `lastTransitionTime` is left
    empty for `merge_conditions` to set."""
    message = (
        _names_message(
            f"{len(held)} node(s) keep the runtime-required taint while this NodeWright is paused or"
            " disabled:",
            held,
        )
        + "; resume or enable it (or remove it) to release them"
        if held
        else "no node is held by an inactive NodeWright"
    )
    return Condition(
        type=RUNTIME_TAINT_HELD,
        status="True" if held else "False",
        reason="HeldWhileInactive" if held else "NotHeld",
        message=message,
        last_transition_time="",
        observed_generation=generation,
    )


def consistency_summary(nodes: Sequence[NodeReport]) -> dict[str, list[ConsistencyGroup]]:
    """Per package, the distinct (version, config, state) found on the nodes with their counts, most
    common first, at most `MAX_CONSISTENCY_GROUPS` (O(1) in the fleet size): one group means uniform."""
    counts: dict[str, Counter[tuple[str, str, str]]] = defaultdict(Counter)
    for node in nodes:
        for pkg in node.packages:
            state = "drifted" if pkg.drifted else pkg.state
            counts[pkg.name][(pkg.version, pkg.config, state)] += 1
    return {
        name: [
            ConsistencyGroup(version=v, config=c, state=st, nodes=n)
            for (v, c, st), n in sorted(counter.items(), key=lambda i: (-i[1], i[0]))[:MAX_CONSISTENCY_GROUPS]
        ]
        for name, counter in sorted(counts.items())
    }


def package_list(nodewright: NodeWright) -> str:
    """Printer column: sorted `name:version` pairs, comma-separated."""
    return ",".join(f"{name}:{pkg.version}" for name, pkg in sorted(nodewright.spec.packages.items()))


def merge_conditions(
    previous: Sequence[Condition], *, current: Sequence[Condition], now: str
) -> list[Condition]:
    """Port of apimachinery `SetStatusCondition` over a whole list, in a deterministic order.

    A condition whose status is unchanged keeps its previous `lastTransitionTime`; a changed or new one
    gets `now`. Previous conditions of types not in `current` are kept unchanged (owned elsewhere).
    """
    before = {c.type: c for c in previous}
    merged: dict[str, Condition] = {c.type: c for c in previous}
    for cond in current:
        old = before.get(cond.type)
        since = old.last_transition_time if old is not None and old.status == cond.status else now
        merged[cond.type] = cond.model_copy(update={"last_transition_time": since})
    rank = {t: i for i, t in enumerate(OWNED_CONDITIONS)}
    return sorted(merged.values(), key=lambda c: (rank.get(c.type, len(rank)), c.type))


# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Facts:
    generation: int | None
    overall: Status
    by_status: Mapping[Status, Sequence[str]]
    total: int
    plan: RolloutPlan | None
    paused: bool
    disabled: bool
    policy_missing: bool
    sequencing: str | None
    malformed: Sequence[str]
    waiting_counts: Mapping[str, int]
    blocked_details: Counter[str]
    drifted: Sequence[str] = ()
    policy_invalid: str | None = None
    undo: UndoHint | None = None


def _override(
    rolled: Status, *, paused: bool, disabled: bool, policy_unusable: bool, sequencing: str | None
) -> Status:
    """`policy_unusable`: the named DeploymentPolicy is missing or invalid."""
    if rolled is Status.COMPLETE and not policy_unusable:
        return rolled
    if disabled:
        return Status.DISABLED
    if paused:
        return Status.PAUSED
    if policy_unusable:
        return Status.BLOCKED
    if sequencing:
        return Status.WAITING
    return rolled


def _condition(f: _Facts, type_: str, true: bool, reason: str, message: str = "") -> Condition:
    status: Literal["True", "False"] = "True" if true else "False"
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time="",
        observed_generation=f.generation,
    )


def _owned_conditions(f: _Facts) -> list[Condition]:
    """The conditions this roll-up owns (module docstring): progress first, then the domain ones."""
    halts = f.plan.halts if f.plan is not None else ()
    ready_reason = _READY_REASON[f.overall]
    reconciling = f.overall is Status.IN_PROGRESS or (
        f.plan is not None and bool(f.plan.active) and f.overall not in (Status.PAUSED, Status.DISABLED)
    )
    stalled, stalled_reason, stalled_message = _stalled(f, halted=bool(halts))
    return [
        _condition(f, READY, f.overall is Status.COMPLETE, ready_reason, _ready_message(f)),
        _condition(f, RECONCILING, reconciling, "Progressing" if reconciling else ready_reason),
        _condition(f, STALLED, stalled, stalled_reason, stalled_message),
        _condition(f, HALTED, bool(halts), halts[0].reason.value if halts else "NotHalted", _halt_message(f)),
        _condition(f, PAUSED, f.paused, "Paused" if f.paused else "NotPaused"),
        _condition(f, DISABLED, f.disabled, "Disabled" if f.disabled else "NotDisabled"),
        *_domain_conditions(f),
    ]


def _domain_conditions(f: _Facts) -> list[Condition]:
    """The policy, node-state, blocked and drift conditions."""
    policy = f.plan.policy_name if f.plan is not None else None
    blocked = len(f.by_status.get(Status.BLOCKED, ()))
    malformed = (
        _names_message(
            f"node state could not be parsed on {len(f.malformed)} node(s) (counted blocked; fix or"
            " delete the annotation to recover):",
            f.malformed,
        )
        if f.malformed
        else ""
    )
    drifted = (
        _names_message(f"{len(f.drifted)} node(s) failed their last drift check:", f.drifted)
        if f.drifted
        else ""
    )
    return [
        _condition(
            f,
            POLICY_NOT_FOUND,
            f.policy_missing,
            "DeploymentPolicyNotFound" if f.policy_missing else "PolicyResolved",
            f"DeploymentPolicy {policy!r} not found" if f.policy_missing else "",
        ),
        _condition(
            f,
            POLICY_INVALID,
            f.policy_invalid is not None,
            "DeploymentPolicyInvalid" if f.policy_invalid is not None else "PolicyValid",
            f.policy_invalid or "",
        ),
        _condition(
            f,
            NODE_STATE_MALFORMED,
            bool(f.malformed),
            "ParseError" if f.malformed else "AsExpected",
            malformed,
        ),
        _condition(
            f, BLOCKED, blocked > 0, "NodesBlocked" if blocked else "NotBlocked", _blocked_message(f, blocked)
        ),
        _condition(f, DRIFTED, bool(f.drifted), "NodesDrifted" if f.drifted else "NoDrift", drifted),
    ]


def _stalled(f: _Facts, *, halted: bool) -> tuple[bool, str, str]:
    if halted:
        return True, "Halted", "a compartment halted after repeated failed batches; reset to resume"
    if f.policy_missing:
        return True, "DeploymentPolicyNotFound", "the referenced DeploymentPolicy does not exist"
    if f.policy_invalid is not None:
        return True, "DeploymentPolicyInvalid", f.policy_invalid
    remaining = {s for s, names in f.by_status.items() if names and s is not Status.COMPLETE}
    active = f.plan is not None and bool(f.plan.active)
    if remaining and remaining <= {Status.ERRORING, Status.BLOCKED} and not active:
        return True, "NodesErroringOrBlocked", "every remaining node is erroring or blocked"
    return False, "AsExpected", ""


def _ready_message(f: _Facts) -> str:
    complete = len(f.by_status.get(Status.COMPLETE, ()))
    parts = [f"{complete}/{f.total} nodes complete"]
    for status in (Status.IN_PROGRESS, Status.ERRORING, Status.BLOCKED):
        names = f.by_status.get(status, ())
        if names:
            parts.append(f"{len(names)} {status.value.replace('_', ' ')} ({_names(names)})")
    if f.waiting_counts:
        parts.append("waiting: " + ", ".join(f"{k} {v}" for k, v in f.waiting_counts.items()))
    if f.sequencing:
        parts.append(f"waiting for NodeWright {f.sequencing!r} to complete on all its nodes")
    return "; ".join(parts)


def _halt_message(f: _Facts) -> str:
    halts = f.plan.halts if f.plan is not None else ()
    shown = [h.message for h in halts[:MAX_EXAMPLES]]
    if len(halts) > MAX_EXAMPLES:
        shown.append(f"and {len(halts) - MAX_EXAMPLES} more compartments")
    if halts and f.undo is not None:
        shown.append(f.undo.sentence)
    return "; ".join(shown)


def _blocked_message(f: _Facts, blocked: int) -> str:
    if not blocked:
        return ""
    reasons = ", ".join(f"{reason}: {n}" for reason, n in sorted(f.blocked_details.items())[:MAX_EXAMPLES])
    text = _names_message(f"{blocked} nodes blocked:", f.by_status.get(Status.BLOCKED, ()))
    return f"{text} ({reasons})" if reasons else text


def _names_message(prefix: str, names: Sequence[str]) -> str:
    return f"{prefix} {_names(names)}"


def _names(names: Sequence[str]) -> str:
    shown = _examples(names)
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _examples(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(names)[:MAX_EXAMPLES])


def _package_counts(nodes: Sequence[NodeReport]) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for node in nodes:
        for pkg in node.packages:
            counts[f"{pkg.name}:{pkg.version}"][f"{pkg.stage}/{pkg.state}"] += 1
    return {key: dict(sorted(counter.items())) for key, counter in sorted(counts.items())}
