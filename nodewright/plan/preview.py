"""Rollout preview for `nodewright plan`: what the planner will do, predicted by running the planner.

`preview_rollout` does not re-implement any rule. It replays `plan_rollout` step by step against a
simulated fleet — plan, write the admissions, let every active node finish, plan again — exactly as the
controller applies a plan, so the predicted batch sequence is the sequence the controller will produce
if every node succeeds (or follows `outcome`, which tests use to inject failures). Nodes that are
blocked, unavailable or waiting for another NodeWright stay where they are; a halted compartment stops
its sequence; a paused, disabled or policy-less NodeWright predicts no batch. Time moves on only where
the planner waits for it: when nothing can start until a soak time ends or a maintenance window opens,
the replay continues at that moment (the batches are the same whenever they open); an approval gate
(`pauseAfterBatch`) ends the prediction of its compartment, since only a person opens it. Health gates
(`healthGates`) cannot be evaluated ahead of time: the replay takes every gate as passing, and says so
per gate (`AssumedGate`: the batches after which the prediction needed it to pass, and the result the
compartment status holds now, e.g. a gate failing at this moment). Shared
DisruptionBudgets (`shared_budgets`) count as they are now for the whole replay: what other NodeWrights
and other causes hold stays held (the preview cannot know when they let go), while this NodeWright's own
nodes free their slots as they finish.

A prediction is exact only from one moment of the rollout. A reader sees the NodeWright status and the
nodes in separate requests while the controller keeps writing (a pass writes the status, with the batch
state it opens, then the admissions on the nodes, one by one). `check_snapshot` says whether what was
read is one moment: the batch states the planner reads did not change while the nodes were listed
(`STATUS_MOVED` otherwise: a batch settled and the next opened between the reads, and the old nodes
paired with the new batch state made the preview open that batch again), and every admission the open
batches count is on the nodes (`ADMISSIONS_UNWRITTEN` otherwise: the pass is still writing them, or a
member was released or deleted since). `nodewright plan` reads again until the snapshot is consistent
(or, for unwritten admissions, until nothing has changed for a moment: a released or deleted member).

`ideal_makespan` turns a batch sequence into a lower bound on rollout time (used by the scale
benchmark): a batch lasts as long as its slowest node, a compartment's batches run one after another,
and compartments run in parallel.

Everything returned is JSON-serialisable (`to_json`) and `render_table` builds the human table.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from nodewright.api.admission import Admission
from nodewright.api.models import (
    BatchState,
    CompartmentStatus,
    DeploymentPolicy,
    GateStatus,
    NodeWright,
    Status,
)
from nodewright.api.reasons import GateOutcome, PolicyInvalid, WaitReason, detail_label
from nodewright.plan.budgets import SharedBudget
from nodewright.plan.gates import GateCheck, GateResult
from nodewright.plan.rollout import Phase, RolloutNode, RolloutPlan, phase_of, plan_rollout
from nodewright.plan.stages import ts

MAX_EXAMPLES = 5
Outcome = Callable[[str], Status]
"""Given a node name, the status it ends with when it runs: `Status.COMPLETE` or `Status.ERRORING`."""


@dataclass(frozen=True, slots=True)
class PlannedBatch:
    number: int
    nodes: tuple[str, ...]
    domains: tuple[str, ...] = ()
    """The topology domains of the batch (sorted), for a compartment with a `topologyKey`."""


@dataclass(frozen=True, slots=True)
class AssumedGate:
    """A health gate the prediction took as passing (it is evaluated after each batch's soak, on the
    cluster, and cannot be foreseen): after batches `batches` (those whose next batch the preview
    opened). `last`: the gate's latest result in the compartment status, if any (what it says now)."""

    gate: str
    batches: tuple[int, ...]
    last: GateStatus | None = None

    def describe(self) -> str:
        return f"evaluated after the soak of batch {_numbers(self.batches)}; the preview assumes it passes"

    def describe_last(self) -> str:
        if self.last is None:
            return "-"
        value = f" ({self.last.value})" if self.last.value is not None else ""
        return f"{self.last.outcome.value}{value} after batch {self.last.batch}"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"gate": self.gate, "assumed": "Passed", "afterBatches": list(self.batches)}
        if self.last is not None:
            doc["lastResult"] = self.last.to_json_dict()
        return doc


@dataclass(frozen=True, slots=True)
class CompartmentPreview:
    name: str
    strategy: str
    budget: str
    matched: int
    ceiling: int
    batches: tuple[PlannedBatch, ...]
    halted: bool
    message: str
    pacing: Mapping[str, Any] = field(default_factory=dict)
    """Window, soak and gate now (`windowActive`, `windowClosesAt`, `nextWindowAt`, `soakUntil`,
    `awaitingApproval`), as the compartment status shows them."""

    topology_key: str | None = None
    assumed_gates: tuple[AssumedGate, ...] = ()
    """The health gates the predicted batches need to pass (in spec order)."""

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(b.nodes) for b in self.batches)

    @property
    def batches_text(self) -> str:
        """Batch sizes; for a topology compartment in domains, then nodes: `1,2 domains (4,8 nodes)`."""
        if self.topology_key is None:
            return _sizes_text(self.sizes)
        domains = _sizes_text(tuple(len(b.domains) for b in self.batches))
        return f"{domains} domains ({_sizes_text(self.sizes)} nodes)" if self.batches else domains


@dataclass(frozen=True, slots=True)
class Blocker:
    reason: str
    count: int
    examples: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RolloutPreview:
    nodewright: str
    policy: str | None
    policy_not_found: bool
    compartments: tuple[CompartmentPreview, ...]
    blockers: tuple[Blocker, ...]
    steps: int
    policy_invalid: str | None = None
    """The policy exists but fails validation: what is wrong with it (no node will start)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "nodewright": self.nodewright,
            "policy": self.policy,
            "policyNotFound": self.policy_not_found,
            "policyInvalid": self.policy_invalid,
            "steps": self.steps,
            "compartments": [
                {
                    "name": c.name,
                    "strategy": c.strategy,
                    "budget": c.budget,
                    "matched": c.matched,
                    "ceiling": c.ceiling,
                    "halted": c.halted,
                    "message": c.message,
                    **c.pacing,
                    "batchSizes": list(c.sizes),
                    "batches": [
                        {
                            "number": b.number,
                            "nodes": list(b.nodes),
                            **({"domains": list(b.domains)} if b.domains else {}),
                        }
                        for b in c.batches
                    ],
                    **({"topologyKey": c.topology_key} if c.topology_key else {}),
                    **({"assumedGates": [g.to_json() for g in c.assumed_gates]} if c.assumed_gates else {}),
                }
                for c in self.compartments
            ],
            "blockers": [
                {"reason": b.reason, "count": b.count, "examples": list(b.examples)} for b in self.blockers
            ],
        }


@dataclass(frozen=True, slots=True)
class Simulation:
    """The plans of a simulated rollout, and the fleet as it ended."""

    plans: tuple[RolloutPlan, ...]
    nodes: tuple[RolloutNode, ...]
    statuses: Mapping[str, CompartmentStatus]
    assumed: tuple[GateCheck, ...] = ()
    """The health gates the simulation took as passing, where they were due."""


def simulate_rollout(
    nodewright: NodeWright,
    *,
    policy: DeploymentPolicy | PolicyInvalid | None,
    nodes: Sequence[RolloutNode],
    fingerprint: str,
    now: str,
    compartment_statuses: Mapping[str, CompartmentStatus] | None = None,
    outcome: Outcome | None = None,
    paused: bool = False,
    disabled: bool = False,
    max_steps: int = 10_000,
    shared_budgets: Sequence[SharedBudget] = (),
    reset_requested: bool = False,
    approvals: Mapping[str, int] | None = None,
    next_order_hint: int = 0,
    admission_limit: int | None = None,
) -> Simulation:
    """Run plan → apply → finish active nodes → plan … until nothing is admitted or running.

    Applying a plan means what the controller does: write admissions, clear releases, persist the
    compartment statuses, clear a requested reset and the approvals it recorded. Then every active node
    runs to the end of its work and ends as `outcome` says (default: complete); work in flight under an
    older admission ends and leaves the node waiting for a fresh admission.
    """
    fleet = {n.name: n for n in nodes}
    statuses = dict(compartment_statuses or {})
    approved = dict(approvals or {})
    plans: list[RolloutPlan] = []
    assumed: list[GateCheck] = []
    for _ in range(max_steps):
        plan, checks = _plan_passing_gates(
            nodewright,
            policy=policy,
            nodes=list(fleet.values()),
            compartment_statuses=statuses,
            fingerprint=fingerprint,
            at=now,
            paused=paused,
            disabled=disabled,
            shared_budgets=shared_budgets,
            reset_requested=reset_requested and not plans,
            approvals=approved,
            next_order_hint=next_order_hint,
            admission_limit=admission_limit,
        )
        plans.append(plan)
        assumed.extend(checks)
        statuses = dict(plan.compartment_statuses)
        approved = {k: v for k, v in approved.items() if k not in plan.approvals_applied}
        next_order_hint = plan.next_order
        fleet = _apply(plan, fleet)
        carryover = any(phase_of(n, fingerprint=fingerprint) is Phase.CARRYOVER for n in fleet.values())
        if not plan.admissions and not plan.active and not carryover:
            timed = any(w.reason in (WaitReason.WINDOW, WaitReason.SOAKING) for w in plan.waiting)
            if timed and plan.wake_at is not None and ts(plan.wake_at) > now:
                now = ts(plan.wake_at)  # a soak ends or a window opens: the controller plans again then
                continue
            break
        fleet = {name: _finish(node, plan, fingerprint, outcome) for name, node in fleet.items()}
    return Simulation(tuple(plans), tuple(fleet.values()), statuses, tuple(assumed))


def _plan_passing_gates(
    nodewright: NodeWright, *, at: str, **inputs: Any
) -> tuple[RolloutPlan, tuple[GateCheck, ...]]:
    """`plan_rollout` with every health gate due passing (a successful rollout's gates pass), and the
    gates so assumed."""
    plan = plan_rollout(nodewright, now=at, **inputs)
    checks = plan.gate_checks
    if checks:
        plan = plan_rollout(nodewright, now=at, gate_results=_gates_pass(checks, at=at), **inputs)
    return plan, checks


def _gates_pass(checks: Sequence[GateCheck], *, at: str) -> dict[str, dict[str, GateResult]]:
    """Every due health gate passing, as the controller would record it (the preview assumes success)."""
    moment = datetime.fromisoformat(at.replace("Z", "+00:00"))
    return {
        c.compartment: {
            g.name: GateResult(
                g.name, c.batch, GateOutcome.PASSED, g.describe_query(c.nodes), None, "", moment
            )
            for g in c.gates
        }
        for c in checks
    }


def preview_rollout(
    nodewright: NodeWright,
    *,
    policy: DeploymentPolicy | PolicyInvalid | None,
    nodes: Sequence[RolloutNode],
    fingerprint: str,
    now: str,
    compartment_statuses: Mapping[str, CompartmentStatus] | None = None,
    paused: bool = False,
    disabled: bool = False,
    shared_budgets: Sequence[SharedBudget] = (),
    reset_requested: bool = False,
    approvals: Mapping[str, int] | None = None,
    next_order_hint: int = 0,
    admission_limit: int | None = None,
) -> RolloutPreview:
    """Predict the batch sequence per compartment if every node succeeds, and what blocks right now."""
    sim = simulate_rollout(
        nodewright,
        policy=policy,
        nodes=nodes,
        fingerprint=fingerprint,
        now=now,
        compartment_statuses=compartment_statuses,
        paused=paused,
        disabled=disabled,
        shared_budgets=shared_budgets,
        reset_requested=reset_requested,
        approvals=approvals,
        next_order_hint=next_order_hint,
        admission_limit=admission_limit,
    )
    return _preview_of(nodewright.metadata.name, sim, compartment_statuses or {})


def _assumed_gates(
    sim: Simulation, statuses: Mapping[str, CompartmentStatus]
) -> dict[str, tuple[AssumedGate, ...]]:
    """Per compartment, the gates the simulation took as passing (`_plan_passing_gates`), with the
    batches they were due after and their last result in the status read."""
    due: dict[str, dict[str, set[int]]] = defaultdict(dict)
    for check in sim.assumed:
        for gate in check.gates:
            due[check.compartment].setdefault(gate.name, set()).add(check.batch)
    out: dict[str, tuple[AssumedGate, ...]] = {}
    for cname, gates in due.items():
        status = statuses.get(cname)
        last = {g.gate: g for g in (status.health_gates or ())} if status is not None else {}
        out[cname] = tuple(AssumedGate(g, tuple(sorted(b)), last.get(g)) for g, b in gates.items())
    return out


def _preview_of(name: str, sim: Simulation, statuses: Mapping[str, CompartmentStatus]) -> RolloutPreview:
    """The batches the simulation's plans opened, per compartment, and what blocked at its start."""
    first, last = sim.plans[0], sim.plans[-1]
    assumed = _assumed_gates(sim, statuses)
    grouped: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for plan in sim.plans:
        for adm in plan.admissions:
            grouped[adm.admission.compartment][adm.admission.batch].append(adm.node)
    compartments = tuple(
        CompartmentPreview(
            name=cname,
            strategy=c.strategy,
            budget=c.budget,
            matched=c.status.matched,
            ceiling=c.status.ceiling,
            batches=tuple(
                PlannedBatch(
                    n, tuple(nodes), tuple(sorted({first.domains[m] for m in nodes if m in first.domains}))
                )
                for n, nodes in sorted(grouped[cname].items())
            ),
            halted=last.compartments[cname].halt is not None if cname in last.compartments else False,
            message=c.message,
            pacing=_pacing(c.status),
            topology_key=c.topology_key,
            assumed_gates=assumed.get(cname, ()),
        )
        for cname, c in first.compartments.items()
    )
    return RolloutPreview(
        nodewright=name,
        policy=first.policy_name,
        policy_not_found=first.policy_not_found is not None,
        policy_invalid=first.policy_invalid.message if first.policy_invalid is not None else None,
        compartments=compartments,
        blockers=_blockers(first),
        steps=len(sim.plans),
    )


class SnapshotCheck(StrEnum):
    """Whether a NodeWright status and a node list read one after the other show one moment."""

    CONSISTENT = "Consistent"
    STATUS_MOVED = "StatusMoved"
    ADMISSIONS_UNWRITTEN = "AdmissionsUnwritten"


def batch_states(statuses: Mapping[str, CompartmentStatus] | None) -> dict[str, BatchState | None]:
    """The part of the persisted compartment statuses the planner reads (`plan_rollout`)."""
    return {name: status.batch_state for name, status in sorted((statuses or {}).items())}


def unwritten_admissions(
    statuses: Mapping[str, CompartmentStatus] | None, admissions: Iterable[Admission], *, fingerprint: str
) -> dict[str, int]:
    """Per compartment, admissions the open batch's state counts (`admittedSize`) that no node carries.

    The controller writes the batch state before the admissions it issues, so right after a status
    write the nodes lack them until the pass has written them all. A member released (blocked before
    it was disrupted) or deleted since also leaves its count behind.
    """
    found = Counter((a.compartment, a.batch) for a in admissions if a.fingerprint == fingerprint)
    missing: dict[str, int] = {}
    for name, state in batch_states(statuses).items():
        if state is None or state.planned_size <= 0:
            continue  # no batch took admissions since the last one settled
        lacking = state.admitted_size - found[(name, state.current_batch)]
        if lacking > 0:
            missing[name] = lacking
    return missing


def check_snapshot(
    before: Mapping[str, CompartmentStatus] | None,
    after: Mapping[str, CompartmentStatus] | None,
    admissions: Iterable[Admission],
    *,
    fingerprint: str | None,
) -> SnapshotCheck:
    """Are the nodes (their `admissions`) and the status read around them (`before` the node list,
    `after` it) one moment of the rollout of `fingerprint` (the status's `rolloutFingerprint`)?"""
    if batch_states(before) != batch_states(after):
        return SnapshotCheck.STATUS_MOVED
    if fingerprint and unwritten_admissions(after, admissions, fingerprint=fingerprint):
        return SnapshotCheck.ADMISSIONS_UNWRITTEN
    return SnapshotCheck.CONSISTENT


def ideal_makespan(
    batch_sequences: Mapping[str, Sequence[Sequence[str]]],
    durations: Mapping[str, float | Sequence[float]],
) -> float:
    """Sum over each compartment's batches of the slowest node's duration; max over compartments.

    `durations` gives each node's total duration, or its stage durations (summed). A node without an
    entry takes 0.
    """

    def node_time(node: str) -> float:
        value = durations.get(node, 0.0)
        return float(value) if isinstance(value, int | float) else float(sum(value))

    per_compartment = [
        sum(max((node_time(n) for n in batch), default=0.0) for batch in sequence)
        for sequence in batch_sequences.values()
    ]
    return max(per_compartment, default=0.0)


def batch_sequences(preview: RolloutPreview) -> dict[str, list[list[str]]]:
    """The preview's batches as plain lists, the input `ideal_makespan` takes."""
    return {c.name: [list(b.nodes) for b in c.batches] for c in preview.compartments}


def render_table(preview: RolloutPreview) -> str:
    """A fixed-width table: one row per compartment, then the current blockers."""
    header = ("COMPARTMENT", "MATCHED", "CEILING", "STRATEGY", "BUDGET", "BATCHES", "NOTE")
    rows = [
        (
            c.name,
            str(c.matched),
            str(c.ceiling),
            c.strategy,
            c.budget,
            c.batches_text,
            "halted" if c.halted else c.message,
        )
        for c in preview.compartments
    ]
    lines = [f"NodeWright {preview.nodewright} (policy: {preview.policy or '-'})"]
    if preview.policy_not_found:
        lines.append(f"DeploymentPolicy {preview.policy!r} not found: no node will start")
    if preview.policy_invalid:
        lines.append(preview.policy_invalid)
    lines.extend(_columns([header, *rows]))
    gates = [
        (c.name, g.gate, g.describe(), g.describe_last())
        for c in preview.compartments
        for g in c.assumed_gates
    ]
    if gates:
        lines.append("")
        lines.extend(_columns([("COMPARTMENT", "HEALTH GATE", "PREVIEW", "LAST RESULT"), *gates]))
    if preview.blockers:
        lines.append("")
        lines.extend(
            _columns([("WAITING", "NODES", "EXAMPLES")] + [_blocker_row(b) for b in preview.blockers])
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------


def _apply(plan: RolloutPlan, fleet: Mapping[str, RolloutNode]) -> dict[str, RolloutNode]:
    updated = dict(fleet)
    for name in plan.releases:
        updated[name] = replace(updated[name], admission=None)
    for adm in plan.admissions:
        updated[adm.node] = replace(updated[adm.node], admission=adm.admission, status=Status.WAITING)
    return updated


def _finish(node: RolloutNode, plan: RolloutPlan, fingerprint: str, outcome: Outcome | None) -> RolloutNode:
    if phase_of(node, fingerprint=fingerprint) is Phase.CARRYOVER:
        # Work in flight under an older admission ends; the node still needs a fresh admission.
        return replace(node, status=Status.WAITING)
    if node.name not in plan.active:
        return node
    result = Status.COMPLETE if outcome is None else outcome(node.name)
    # Settling consumes the admission (the node controller marks it in the same write).
    used = replace(node.admission, consumed=True) if node.admission is not None else None
    if result is Status.COMPLETE:
        return replace(node, status=Status.COMPLETE, needs_work=False, admission=used)
    return replace(node, status=result, admission=used)


_PACING_FIELDS = ("windowActive", "windowClosesAt", "nextWindowAt", "soakUntil", "awaitingApproval")


def _pacing(status: CompartmentStatus) -> dict[str, Any]:
    doc = status.to_json_dict()
    return {key: doc[key] for key in _PACING_FIELDS if key in doc}


def _blockers(plan: RolloutPlan) -> tuple[Blocker, ...]:
    names: dict[str, list[str]] = defaultdict(list)
    for waiting in plan.waiting:
        label = detail_label(waiting.detail)
        key = waiting.reason.value if label is None else f"{waiting.reason.value}({label})"
        names[key].append(waiting.node)
    return tuple(
        Blocker(reason, len(nodes), tuple(sorted(nodes)[:MAX_EXAMPLES]))
        for reason, nodes in sorted(names.items())
    )


def _numbers(numbers: Sequence[int]) -> str:
    """`1`, `1, 2 and 3`; long runs shortened: `1-9`."""
    if len(numbers) > 3 and list(numbers) == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]}-{numbers[-1]}"
    if len(numbers) == 1:
        return str(numbers[0])
    return ", ".join(str(n) for n in numbers[:-1]) + f" and {numbers[-1]}"


def _sizes_text(sizes: Sequence[int]) -> str:
    if not sizes:
        return "-"
    text = ",".join(str(s) for s in sizes[:12])
    return text + (f",… ({len(sizes)} batches)" if len(sizes) > 12 else "")


def _blocker_row(blocker: Blocker) -> tuple[str, str, str]:
    more = "" if blocker.count <= len(blocker.examples) else f" (+{blocker.count - len(blocker.examples)})"
    return (blocker.reason, str(blocker.count), ", ".join(blocker.examples) + more)


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
