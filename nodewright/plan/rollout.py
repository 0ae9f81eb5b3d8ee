"""The rollout decision: which nodes of a NodeWright may start work now.

The controller's per-NodeWright rollout reconcile calls `plan_rollout` with a snapshot (the NodeWright,
its DeploymentPolicy, one `RolloutNode` per matched node, the persisted compartment statuses, the spec
fingerprint) and applies the `RolloutPlan`: it writes `admissions` and clears `releases` on the nodes
(node-state annotation), stores `compartment_statuses` in the NodeWright status, and raises a condition,
event and metric for each `halts` entry. Nothing here does I/O or reads a clock.

Admissions. A node may *start* work for the current spec only with an admission for the current spec
fingerprint: `{compartment, batch, order, fingerprint, at, consumed}`, persisted on the node. An
admission for an older fingerprint does not allow new work (a version bump or config change therefore
flows through the batches again, invariant I2); work already in flight under it finishes and holds a
slot meanwhile. An admission is good for one pass of the node to a settled state: the node controller
marks it `consumed` in the write that records the node complete or erroring (`erroring` only once
nothing else of the NodeWright runs there). A consumed admission starts nothing, so every later start —
the retry of an erroring package, a re-run after the state annotation was wiped or after a reboot with
`reapplyOnReboot` — needs a fresh admission, from a batch, within the ceiling. Admissions stay on the
node after it settles: they are the record of the rollout (batch membership, order numbers, whether the
spec changed since the compartment last rolled out).

Each node of a compartment is in exactly one phase for the current fingerprint `f`:

- `DONE`: no pending work (complete for the current spec);
- `PENDING`: pending work, no usable admission for `f` (none, an older fingerprint's, or consumed while
  work is due again), not running: a candidate for a later batch;
- `ACTIVE`: admitted for `f`, not consumed, not blocked, work pending (not yet started, running, or an
  erroring node the node controller is about to retry under this admission): holds a slot;
- `SUCCEEDED`: admitted for `f` and no pending work left;
- `FAILED`: admitted for `f`, consumed and `erroring`. Settled: counts as a failure of its batch and no
  longer holds a slot (the reference keeps it in the batch and stalls the compartment). Nothing runs on
  it; it is reported, not waited for, and retried only under a fresh admission (a later spec, or a
  targeted retry that removes its admission);
- `RELEASED`: admitted for `f` and `blocked` (taint, ignore label, ...) before it was disrupted: settled,
  excluded from the batch's success ratio, and its admission is released so it cannot start outside a
  batch; it is picked again once unblocked;
- `CARRYOVER`: running (`in_progress`) without a usable admission for `f` (old spec, or state written by
  an older operator): holds a slot, belongs to no batch.

Budget (invariant I1). `used = ACTIVE + CARRYOVER + nodes unavailable for other reasons`; a new batch
takes at most `ceiling - used` nodes, so the nodes in progress never exceed the ceiling. (Only a change
outside our control — nodes going NotReady, the compartment shrinking — can push `used` above it; then
nothing starts until it drops.)

Shared budgets. A DisruptionBudget (`plan.budgets`) caps the disrupted nodes of a pool across every
NodeWright; the controller passes what others disrupt in each pool (`shared_budgets`). A candidate that
is not disrupted already takes one free slot in every pool it belongs to; one whose pool has none is
skipped (reason `DisruptionBudget`, naming who holds the slots) and the batch takes the next candidate
in pick order, so a full pool delays its own nodes only. `RolloutPlan.budget_refusals` names the pools
that refused a node, for the controller to queue the NodeWright there (first come, first served).

Batches are synchronous. Batch `k` of a compartment is the set of its nodes admitted with `batch == k`
for `f`. The batch state's `currentBatch` names the batch being filled: it is *open* while at least one
node holds an admission for it. When every member has settled it is evaluated (see `batches`),
`currentBatch` advances, and in the same plan the next batch is opened with the strategy's size. Opening
a batch records only its planned size (`plannedSize`) and the admissions issued to it (`admittedSize`);
the strategy's counters change at evaluation only. Re-planning with the admissions applied changes
nothing until the batch settles.

Long batches. With `admission_limit` a plan admits at most that many nodes per compartment; the rest of
the batch (its slots already counted in this plan) is admitted by the next plans, in pick order, while
`admittedSize < plannedSize`. The controller writes a plan's admissions a few at a time
(`--admission-writers`), so a 333-node batch in one plan is a pass of many seconds on a loaded API
server, during which no other compartment's settled batch can hand over to its next one; bounded plans
keep every pass short. A batch
still taking admissions is not evaluated, even when its admitted members have all settled, so it ends
with the size its strategy gave it. The fill stops (and the batch is evaluated once its admitted
members settle) when nothing may start: a halt, a pause, a closed window, no free slot, no candidate.
Each fill is recomputed within the ceiling and the shared budgets, like an opening. The status is
written before the admissions: a crash between the two loses the admissions of that pass from the
batch, which then settles smaller, as it would without a limit.

Critical path. Compartments are planned, and their admissions listed (so written), most batches left
first, ties by name (`critical_path_order`): the rollout ends with its longest compartment, so that one
takes the shared budgets' free slots and the first admission writes of a pass. Batches left are
projected from the persisted batch state and the nodes still pending, as if every batch succeeded with
the whole ceiling free (`batches.batches_left`); a linear strategy's many small batches thus go before an
exponential one's few large ones.

Order numbers (SKYHOOK_NODE_ORDER). Admissions in a plan are numbered in pick order (compartments in
critical-path order, then node pick order) from `max(order of any admission for f) + 1`, raised to
`next_order_hint` if the caller persisted a higher counter. Numbers are stored on the node and never
recomputed, so they are unique and stable however nodes finish; a new fingerprint starts a new rollout
numbered from 0.

Pick order within a compartment: zone label `topology.kubernetes.io/zone` (nodes without one first),
then creation time, then name — so a batch fills one zone before touching the next. A compartment with
`nodeOrder: idleFirst` reorders that, stably, by each node's (or topology domain's) disruption cost,
cheapest first (`plan.disruption`): only which candidate a batch takes first changes.

Resets. A requested reset (annotation `nodewright.io/reset-batch-state`) clears every compartment's
counters and halt; with `reset_on_completion` the counters are also cleared when a compartment has no
pending, running or erroring node, and the whole state (batch number included) when the compartment's
admissions all belong to an older fingerprint. Within one fingerprint the batch number is kept, so an
admission's batch number is never ambiguous.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from operator import attrgetter

from nodewright.api.admission import Admission
from nodewright.api.models import (
    BatchState,
    CompartmentStatus,
    DeploymentPolicy,
    GateHalt,
    GateStatus,
    NodeWright,
    Status,
)
from nodewright.api.nodestate import NodeState
from nodewright.api.reasons import (
    Block,
    BudgetHeld,
    CordonedBySomeoneElse,
    Deferred,
    Gate,
    GateHeld,
    HaltedByGate,
    HaltReason,
    Pacing,
    PolicyInvalid,
    PolicyNotFound,
    PolicyUnusable,
    Predecessor,
    Soak,
    Unavailable,
    WaitDetail,
    WaitReason,
    WindowClosed,
    describe_waiting,
)
from nodewright.plan import batches, budgets, disruption, gates, topology, windows
from nodewright.plan.disruption import DisruptionCost
from nodewright.plan.node import StateRuns, node_complete
from nodewright.plan.policy import Compartments, CompartmentSpec, resolve_compartments

ZONE_LABEL = "topology.kubernetes.io/zone"
MAX_FAILING_NODES = 10
"""Failing node names carried by a `Halt` (the count is always exact)."""


APPROVE_ANNOTATION = "nodewright.io/approve"
"""On a NodeWright: `<compartment>=<batch>[,...]`, approving the gate after that batch (pauseAfterBatch)."""


def parse_approvals(text: str | None) -> dict[str, int]:
    """The approvals of `APPROVE_ANNOTATION` (`zone-a=1,zone-b=2`); unreadable entries are ignored."""
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        name, sep, number = item.strip().rpartition("=")
        if sep and name and number.isdigit():
            out[name] = int(number)
    return out


def format_approvals(approvals: Mapping[str, int]) -> str:
    return ",".join(f"{name}={batch}" for name, batch in sorted(approvals.items()))


class Phase(Enum):
    """A node's phase for one rollout (definitions in the module docstring)."""

    # Members are singletons compared by identity, so the identity hash agrees with equality; Enum's own
    # `__hash__` is a Python call, and a pass tests every node's phase against sets several times.
    __hash__ = object.__hash__

    DONE = "done"
    PENDING = "pending"
    ACTIVE = "active"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RELEASED = "released"
    CARRYOVER = "carryover"


_HOLDS_SLOT = frozenset({Phase.ACTIVE, Phase.CARRYOVER})
_SETTLED = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.RELEASED, Phase.DONE, Phase.PENDING})


@dataclass(frozen=True, slots=True)
class RolloutNode:
    """One matched node as the rollout sees it (built from the node object by `plan.rollout_input`).

    `status` is the node's status for this NodeWright and the current spec (`status_for_spec`: a
    node with pending work is never `complete`). `needs_work` is true while the node is not complete
    for the current spec. Contract with the node stage machine: a node reports `erroring` from
    its first failure until it succeeds (retries do not flip it back to `in_progress`), and reports
    `blocked` only while it holds no disruption (a node blocked mid-drain stays `in_progress`).
    `unavailable` marks a node made unavailable by someone else (cordoned by another actor, NotReady);
    `blocked` a node this NodeWright may not touch (untolerated taint, ignore label, a skipped drain,
    a block the node reported, an unreadable state); `waiting_for_priority` the name of a
    higher-priority NodeWright that must finish on this node first.
    """

    name: str
    labels: Mapping[str, str]
    creation_timestamp: str | None
    status: Status
    needs_work: bool
    admission: Admission | None = None
    unavailable: Unavailable | None = None
    blocked: Block | None = None
    waiting_for_priority: str | None = None
    disruption: DisruptionCost | None = None
    """What updating the node interrupts (`plan.disruption`); None: not counted (no pod data)."""
    created: datetime | None = field(init=False, compare=False, repr=False)
    """`creation_timestamp` parsed (naive UTC; None: missing or unreadable), once per node object:
    every pass orders every node by it (`pick_key`), and the controller keeps a node's RolloutNode
    while its resourceVersion stays the same."""

    def __post_init__(self) -> None:
        stamp = self.creation_timestamp
        object.__setattr__(self, "created", _parse_time(stamp) if stamp else None)

    @property
    def may_start_while_unavailable(self) -> bool:
        """An admin-cordoned node is out of service anyway: it may be worked on and stays cordoned."""
        return isinstance(self.unavailable, CordonedBySomeoneElse)


def status_for_spec(label: Status | None, *, needs_work: bool, runs: StateRuns | None = None) -> Status:
    """What a matched node counts as for the current spec: its status label, corrected by its state.

    The status label is the node controller's record of what the node is doing, and it lags a spec
    change: until the node controller has planned the node for the new spec, a node that completed the
    previous one still reads `complete`. Whether the node has converged to *this* spec is known from its
    state annotation (`needs_work`: the spec's package versions, configs, uninstalls and drift repairs
    against what the node completed). So a node with pending work never counts as complete -- it waits
    until it is admitted and started -- and one without pending work is not in progress (the label is
    left from work the spec no longer asks for). Every consumer (status roll-up and its `Ready`
    condition, `nodewright plan`, `kubectl nodewright why`) reads this, so a new generation's first
    status never says `Ready` before its nodes have done the work.

    Two corrections for a spec that comes back (undo, or an edit reverted) while a node still works on
    a run that one of its rollouts started (`runs`: `plan.node.state_runs`), so that the rollout
    planner counts that node against the ceiling before it admits others. A run of the current spec in
    flight makes the node in progress: the node controller continues it without admission, whatever
    the label written under the other spec says (`waiting`, or `erroring` for a run of that spec). A
    node labelled in progress with a run of another spec in flight stays in progress until the node
    controller has looked at it under this spec, even though this spec has nothing for it to do.
    """
    runs = runs or StateRuns()
    stale = label in (None, Status.WAITING, Status.COMPLETE) or (
        label is Status.ERRORING and not runs.current_erroring
    )
    if runs.current_in_flight and needs_work and stale:
        return Status.IN_PROGRESS
    if runs.other_in_flight and label is Status.IN_PROGRESS:
        return label
    if label is None:
        return Status.WAITING if needs_work else Status.COMPLETE
    if needs_work and label is Status.COMPLETE:
        return Status.WAITING
    if not needs_work and label is Status.IN_PROGRESS:
        return Status.COMPLETE
    return label


def work_pending(nodewright: NodeWright, state: NodeState | None) -> bool:
    """Whether the node's state (its decoded `nodewright.io/state.<nw>`, None when absent) has not
    completed the NodeWright's current spec: package versions, configs, uninstalls and drift repairs
    (`plan.node.node_complete`). A node without state has work pending unless the spec has no packages.
    The `needs_work` of `status_for_spec` and `complete_for_spec`."""
    if state is None:
        return bool(nodewright.spec.packages)
    return not node_complete(nodewright, state)


def complete_for_spec(label: Status | None, *, needs_work: bool) -> bool:
    """Whether the NodeWright counts as complete on a node for its *current* spec: the status label
    corrected by the state (`status_for_spec`), a drifted node whose drift is only reported included
    (drift is information; with `action: reapply` it has work pending until repaired).

    The one answer to "is X complete on node N": the status roll-up counts these nodes complete
    (`plan.status.report_for`), a later NodeWright starts on N only once every earlier one is
    (`plan.sequencing`), and the runtime-required taint leaves N only once every runtime-required
    NodeWright is (`controller.taints`). A label still saying `complete` from before a spec edit is not
    enough for any of them.
    """
    if needs_work:
        return False
    return status_for_spec(label, needs_work=False) in (Status.COMPLETE, Status.DRIFTED)


@dataclass(frozen=True, slots=True)
class NewAdmission:
    node: str
    admission: Admission


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why a node with pending work is not active: the code, and its particulars (`api.reasons`)."""

    node: str
    compartment: str | None
    reason: WaitReason
    detail: WaitDetail | None = None

    @property
    def message(self) -> str:
        return describe_waiting(self.reason, self.detail, self.compartment)


@dataclass(frozen=True, slots=True)
class Halt:
    """A compartment stopped by its failure threshold; only an explicit reset resumes it."""

    compartment: str
    reason: HaltReason
    failing_nodes: tuple[str, ...]
    failing_count: int
    message: str


@dataclass(frozen=True, slots=True)
class CompartmentPlan:
    name: str
    status: CompartmentStatus
    strategy: str
    budget: str
    used_by_others: int
    open_batch: int | None
    batch_evaluated: batches.BatchOutcome | None
    halt: Halt | None
    message: str
    window: windows.WindowState | None = None
    soak_until: datetime | None = None
    awaiting_approval: int | None = None
    wake_at: datetime | None = None
    """The next moment at which time alone changes what this compartment may do (soak ends, a window
    opens or closes); the controller plans again then."""
    opened: bool = False
    """This plan opened `open_batch` (its first admissions); later plans only add to it."""
    deferred: int = 0
    """Nodes the open batch takes that `admission_limit` left for the next plans."""
    topology_key: str | None = None
    """The compartment counts topology domains of this label (`plan.topology`); None: nodes."""
    gate_check: gates.GateCheck | None = None
    """Health gates the controller must evaluate now (then plan again with their results)."""
    health_gate: GateHeld | None = None
    """The health gate holding the next batch, if one does."""


@dataclass(frozen=True, slots=True)
class RolloutPlan:
    """What the controller applies. `active` lists the nodes allowed to work now (sorted)."""

    policy_name: str | None
    policy_not_found: PolicyNotFound | None
    compartments: Mapping[str, CompartmentPlan]
    admissions: tuple[NewAdmission, ...]
    releases: tuple[str, ...]
    active: tuple[str, ...]
    waiting: tuple[Waiting, ...]
    halts: tuple[Halt, ...]
    reset_applied: bool
    next_order: int
    approvals_applied: tuple[str, ...] = ()
    """Compartments whose gate this plan approved (from the `approvals` input)."""
    budget_refusals: tuple[str, ...] = ()
    """Shared DisruptionBudgets that had no free slot for a node this plan wanted to admit."""
    policy_invalid: PolicyInvalid | None = None
    """The named DeploymentPolicy exists but fails validation: like a missing one, nothing is admitted."""
    domains: Mapping[str, str] = field(default_factory=dict)
    """node -> its topology domain, for the nodes of compartments with a `topologyKey` (`why`, `plan`)."""

    @property
    def wake_at(self) -> datetime | None:
        """The earliest `CompartmentPlan.wake_at`: when to plan again although nothing else changes."""
        times = [c.wake_at for c in self.compartments.values() if c.wake_at is not None]
        return min(times, default=None)

    @property
    def gate_checks(self) -> tuple[gates.GateCheck, ...]:
        """The health gates due for evaluation, per compartment (`plan.gates`)."""
        return tuple(c.gate_check for c in self.compartments.values() if c.gate_check is not None)

    @property
    def deferred(self) -> int:
        """Admissions left for the next plans by `admission_limit`: plan again right after writing these."""
        return sum(c.deferred for c in self.compartments.values())

    @property
    def compartment_statuses(self) -> dict[str, CompartmentStatus]:
        return {name: c.status for name, c in self.compartments.items()}

    @property
    def waiting_counts(self) -> dict[str, int]:
        """Number of waiting nodes per reason, e.g. {"BudgetFull": 12, "NotYetInBatch": 200}."""
        counts = Counter(w.reason for w in self.waiting)  # by member: `.value` is a Python call per node
        return dict(sorted((reason.value, count) for reason, count in counts.items()))


def spec_fingerprint(nodewright: NodeWright) -> str:
    """A digest of what nodes must converge to and of what their package pods run; a change starts a
    new rollout.

    The packages, plus the NodeWright-level fields copied into every package pod (additional
    tolerations, the runtime-required toleration): a change of any of them replaces pods, and must
    therefore reach nodes (erroring ones retried included) only through fresh admissions.
    """
    spec = nodewright.spec
    doc: dict[str, object] = {
        "packages": {name: pkg.to_json_dict() for name, pkg in spec.packages.items()},
    }
    if spec.additional_tolerations:
        doc["tolerations"] = [t.to_json_dict() for t in spec.additional_tolerations]
    if spec.runtime_required:
        doc["runtimeRequired"] = True
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def pick_key(node: RolloutNode) -> tuple[str, datetime, str]:
    """Deterministic pick order: zone, then creation time (missing: last), then name."""
    return (node.labels.get(ZONE_LABEL, ""), node.created or _NEVER, node.name)


_NEVER = datetime.max.replace(tzinfo=None)


def phase_of(node: RolloutNode, *, fingerprint: str) -> Phase:
    """The node's phase for the rollout of `fingerprint` (definitions in the module docstring)."""
    admission = node.admission
    admitted = admission is not None and admission.fingerprint == fingerprint
    if admission is None or not admitted:
        if node.status is Status.IN_PROGRESS:
            return Phase.CARRYOVER
        return Phase.PENDING if node.needs_work else Phase.DONE
    if not node.needs_work:
        return Phase.SUCCEEDED
    if admission.consumed:
        if node.status is Status.IN_PROGRESS:
            return Phase.CARRYOVER  # in flight although settled once (e.g. state edited by hand)
        if node.status is Status.ERRORING:
            return Phase.FAILED
        # Settled under this admission, yet work is due again (state wiped, re-apply after a reboot):
        # a candidate for a later batch, like any node with pending work.
        return Phase.PENDING
    if node.status is Status.BLOCKED:
        return Phase.RELEASED
    # Not settled under this admission yet. An `erroring` label here is the node's state from before
    # the admission (the node controller retries it under the fresh admission): it holds a slot.
    return Phase.ACTIVE


def plan_rollout(
    nodewright: NodeWright,
    *,
    policy: DeploymentPolicy | PolicyInvalid | None,
    nodes: Sequence[RolloutNode],
    compartment_statuses: Mapping[str, CompartmentStatus],
    fingerprint: str,
    now: str,
    reset_requested: bool = False,
    paused: bool = False,
    disabled: bool = False,
    next_order_hint: int = 0,
    approvals: Mapping[str, int] | None = None,
    shared_budgets: Sequence[budgets.SharedBudget] = (),
    admission_limit: int | None = None,
    gate_results: Mapping[str, Mapping[str, gates.GateResult]] | None = None,
) -> RolloutPlan:
    """Decide admissions, batch state and why-waiting reasons for one NodeWright (module docstring).

    `now` (RFC 3339) is also the moment maintenance windows and soak times are judged at; `approvals`
    maps a compartment to the batch whose `pauseAfterBatch` gate a user approved (annotation
    `nodewright.io/approve`): it opens that gate only, so an approval never carries over to a later one.
    `shared_budgets` are the DisruptionBudgets whose pools hold matched nodes, with what other
    NodeWrights and other causes disrupt in them (`plan.budgets`): a node of a pool with no free slot is
    not admitted (reason `DisruptionBudget`), and the batch takes the next candidates instead.
    `admission_limit` caps the admissions of each compartment in this plan (the module docstring, "Long
    batches"); the nodes it defers: `CompartmentPlan.deferred`. `gate_results`: health gate results.
    """
    if admission_limit is not None and admission_limit < 1:
        raise ValueError(f"admission_limit must be at least 1, got {admission_limit}")
    resolved = resolve_compartments(nodewright, policy=policy, nodes=nodes)
    phases = {n.name: phase_of(n, fingerprint=fingerprint) for n in nodes}
    order = max([next_order_hint] + [a.order + 1 for n in nodes if (a := _current(n, fingerprint))])
    if isinstance(resolved, PolicyNotFound | PolicyInvalid):
        return _policy_unusable(
            resolved,
            nodes=nodes,
            phases=phases,
            statuses=compartment_statuses,
            paused=paused,
            disabled=disabled,
            next_order=order,
        )
    ctx = _Context(
        nodewright=nodewright.metadata.name,
        compartments=resolved,
        fingerprint=fingerprint,
        now=now,
        moment=_moment(now),
        reset_requested=reset_requested,
        paused=paused,
        disabled=disabled,
        approvals=dict(approvals or {}),
        ledger=budgets.Ledger(shared_budgets, own=(n for n, p in phases.items() if p in _HOLDS_SLOT)),
        admission_limit=admission_limit,
        gate_results=gate_results or {},
    )
    return _plan_compartments(ctx, nodes, phases=phases, statuses=compartment_statuses, order=order)


def _plan_compartments(
    ctx: _Context,
    nodes: Sequence[RolloutNode],
    *,
    phases: Mapping[str, Phase],
    statuses: Mapping[str, CompartmentStatus],
    order: int,
) -> RolloutPlan:
    """Each compartment in turn, critical path first (`critical_path_order`), numbering admissions on
    from `order`."""
    by_name = {n.name: n for n in nodes}
    plans: dict[str, CompartmentPlan] = {}
    admissions: list[NewAdmission] = []
    waiting: list[Waiting] = []
    for name in critical_path_order(ctx.compartments, phases, statuses):
        members = _in_node_order(
            ctx.compartments.specs[name],
            sorted((by_name[m] for m in ctx.compartments.members[name]), key=pick_key),
        )
        result = _plan_compartment(
            ctx, name, members=members, phases=phases, prior=statuses.get(name), order=order
        )
        plans[name] = result.plan
        admissions.extend(result.admissions)
        waiting.extend(result.waiting)
        order += len(result.admissions)
    admitted = {a.node for a in admissions}
    return RolloutPlan(
        policy_name=ctx.compartments.policy_name,
        policy_not_found=None,
        compartments=dict(sorted(plans.items())),
        admissions=tuple(admissions),
        releases=tuple(sorted(n for n, p in phases.items() if p is Phase.RELEASED)),
        active=tuple(sorted(admitted | {n for n, p in phases.items() if p is Phase.ACTIVE})),
        waiting=tuple(sorted(waiting, key=attrgetter("node"))),
        halts=tuple(p.halt for p in plans.values() if p.halt is not None),
        reset_applied=ctx.reset_requested,
        next_order=order,
        approvals_applied=tuple(
            sorted(n for n, p in plans.items() if p.status.batch_state and _approved(ctx, n, p))
        ),
        budget_refusals=tuple(sorted(ctx.ledger.refused)),
        domains=_node_domains(ctx, by_name),
    )


def critical_path_order(
    compartments: Compartments, phases: Mapping[str, Phase], statuses: Mapping[str, CompartmentStatus]
) -> list[str]:
    """The compartments in the order a plan serves them: the most batches left first (ties by name).

    The rollout ends when its longest compartment does, so that one gets the shared budgets' slots and
    the first admission writes of a pass (module docstring, "Critical path"). Batches left are projected
    from the persisted batch state, assuming success and the whole ceiling (`batches.batches_left`)."""
    left = {
        name: batches.batches_left(
            spec.strategy,
            _prior_batch_state(statuses.get(name)),
            total=len(compartments.members.get(name, ())),
            ceiling=compartments.ceiling(name),
            remaining=sum(phases.get(m) in _PICKABLE for m in compartments.members.get(name, ())),
        )
        for name, spec in compartments.specs.items()
    }
    return sorted(compartments.specs, key=lambda name: (-left[name], name))


def _prior_batch_state(status: CompartmentStatus | None) -> BatchState:
    return (
        status.batch_state if status is not None and status.batch_state is not None else batches.fresh_state()
    )


def _in_node_order(spec: CompartmentSpec, members: list[RolloutNode]) -> list[RolloutNode]:
    """The compartment's members in the order its batches take them: pick order, or with
    `nodeOrder: idleFirst` cheapest disruption first within it (`plan.disruption`)."""
    if not spec.idle_first:
        return members
    return disruption.idle_first(members, key=spec.topology_key)


def _node_domains(ctx: _Context, by_name: Mapping[str, RolloutNode]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, spec in ctx.compartments.specs.items():
        if spec.topology_key is not None:
            members = (by_name[m] for m in ctx.compartments.members[name])
            out.update(topology.node_domains(spec.topology_key, members))
    return dict(sorted(out.items()))


def _current(node: RolloutNode, fingerprint: str) -> Admission | None:
    """The node's admission when it is for `fingerprint`."""
    adm = node.admission
    return adm if adm is not None and adm.fingerprint == fingerprint else None


def _approved(ctx: _Context, name: str, plan: CompartmentPlan) -> bool:
    state = plan.status.batch_state
    return state is not None and ctx.approvals.get(name) == state.approved_batch and state.approved_batch > 0


# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Context:
    nodewright: str
    compartments: Compartments
    fingerprint: str
    now: str
    moment: datetime
    reset_requested: bool
    paused: bool
    disabled: bool
    approvals: Mapping[str, int]
    ledger: budgets.Ledger
    admission_limit: int | None
    gate_results: Mapping[str, Mapping[str, gates.GateResult]]


@dataclass(frozen=True, slots=True)
class _CompartmentResult:
    plan: CompartmentPlan
    admissions: tuple[NewAdmission, ...]
    waiting: tuple[Waiting, ...]


@dataclass(frozen=True, slots=True)
class _Slots:
    """A compartment's nodes by what they do to its ceiling."""

    holding: tuple[RolloutNode, ...]  # ours in progress (ACTIVE, CARRYOVER)
    others: tuple[RolloutNode, ...]  # unavailable for other reasons, not ours in progress
    candidates: tuple[RolloutNode, ...]  # pending and eligible, in pick order
    free: int


@dataclass(frozen=True, slots=True)
class _Settled:
    """The compartment's batch state once the open batch is evaluated (if it settled) and resets done."""

    state: BatchState
    batch: tuple[RolloutNode, ...]  # members of the batch still open
    filling: bool  # the open batch still takes admissions (`_may_fill`)
    outcome: batches.BatchOutcome | None


def _plan_compartment(
    ctx: _Context,
    name: str,
    *,
    members: Sequence[RolloutNode],
    phases: Mapping[str, Phase],
    prior: CompartmentStatus | None,
    order: int,
) -> _CompartmentResult:
    """Settle the open batch, then open or fill one, then say why the others wait."""
    spec = ctx.compartments.specs[name]
    slots = _slots(ctx.compartments.ceiling(name), members, phases, key=spec.topology_key)
    settled = _settle(ctx, name, spec, members=members, phases=phases, prior=prior, slots=slots)
    pacing = _pacing(
        ctx,
        name,
        spec,
        state=settled.state,
        waiting=bool(slots.candidates) and not settled.batch,
        members=members,
    )
    state, selection = _select(
        ctx, name, spec, pacing.state, settled=settled, slots=slots, pacing=pacing, total=len(members)
    )
    admissions = tuple(
        NewAdmission(n.name, Admission(name, state.current_batch, order + i, ctx.fingerprint, ctx.now))
        for i, n in enumerate(selection.picked)
    )
    waiting = _waiting(ctx, name, spec, state, members, phases, settled, slots, selection, pacing)
    plan = _compartment_plan(ctx, name, spec, state, members, phases, settled, slots, selection, pacing)
    return _CompartmentResult(plan, admissions, waiting)


def _slots(
    ceiling: int, members: Sequence[RolloutNode], phases: Mapping[str, Phase], *, key: str | None = None
) -> _Slots:
    holding = tuple(n for n in members if phases[n.name] in _HOLDS_SLOT)
    others = tuple(n for n in members if n.unavailable is not None and phases[n.name] not in _HOLDS_SLOT)
    candidates = tuple(n for n in members if phases[n.name] in _PICKABLE and _eligible(n))
    if key is not None:
        return _domain_slots(key, ceiling, holding, others, candidates)
    return _Slots(holding, others, candidates, ceiling - len(holding) - len(others))


def _domain_slots(
    key: str,
    ceiling: int,
    holding: tuple[RolloutNode, ...],
    others: tuple[RolloutNode, ...],
    candidates: tuple[RolloutNode, ...],
) -> _Slots:
    """Slots of a topology compartment, in domains (`plan.topology`): a domain is disrupted while any
    of its nodes holds a slot or is unavailable, and one we still work in takes no new admission."""
    ours = topology.domains_of(key, holding)
    disrupted = ours | topology.domains_of(key, others)
    free = ceiling - len(disrupted)
    waiting = tuple(n for n in candidates if topology.domain_of(key, n.name, n.labels) not in ours)
    return _Slots(holding, others, waiting, free)


def _settle(
    ctx: _Context,
    name: str,
    spec: CompartmentSpec,
    *,
    members: Sequence[RolloutNode],
    phases: Mapping[str, Phase],
    prior: CompartmentStatus | None,
    slots: _Slots,
) -> _Settled:
    """The persisted batch state with resets applied, caught up with the admissions, and the open batch
    evaluated when every member settled (and it takes no more admissions)."""
    state = prior.batch_state if prior is not None and prior.batch_state is not None else BatchState()
    state = _apply_resets(ctx, name, state=state, members=members)
    state = _catch_up(ctx, name, state=state, members=members)
    batch = tuple(_batch_members(ctx, name, state.current_batch, members))
    filling = bool(batch) and _may_fill(ctx, spec, state, candidates=slots.candidates, free=slots.free)
    outcome: batches.BatchOutcome | None = None
    if batch and not filling and all(phases[n.name] in _SETTLED for n in batch):
        outcome, state = _evaluate(ctx, spec, state, batch=batch, members=members, phases=phases)
        if spec.topology_key is not None and outcome.evaluated:
            # The strategy grows from the batch's size in its own unit: domains.
            counted = [n for n in batch if phases[n.name] in (Phase.SUCCEEDED, Phase.FAILED)]
            domains = len(topology.domains_of(spec.topology_key, counted))
            state = state.model_copy(update={"last_batch_size": domains})
        batch = ()
    if ctx.compartments.reset_on_completion and all(phases[n.name] in _COMPLETE for n in members):
        state = batches.fresh_state(current_batch=state.current_batch)
    return _Settled(state, batch, filling, outcome)


def _select(
    ctx: _Context,
    name: str,
    spec: CompartmentSpec,
    state: BatchState,
    *,
    settled: _Settled,
    slots: _Slots,
    pacing: _Pacing,
    total: int,
) -> tuple[BatchState, _Selection]:
    """Open a batch (nothing open, nothing holds new admissions) or fill the open one; the batch state
    with the selection recorded."""
    ceiling = ctx.compartments.ceiling(name)
    can_open = not settled.batch and not state.should_stop and not ctx.paused and not ctx.disabled
    selection = _Selection()
    if can_open and pacing.reason is None and slots.candidates:
        if spec.topology_key is not None:
            domains = ctx.compartments.domains.get(name, 0)
            selection = _open_domains(
                ctx,
                spec,
                spec.topology_key,
                state,
                slots=slots,
                total=total,
                ceiling=ceiling,
                domains=domains,
            )
        else:
            selection = _open_batch(
                ctx, spec, state, candidates=slots.candidates, free=slots.free, total=total, ceiling=ceiling
            )
    elif settled.filling:
        if spec.topology_key is not None:
            selection = _fill_domains(ctx, spec.topology_key, state, slots=slots)
        else:
            selection = _fill_batch(ctx, state, candidates=slots.candidates, free=slots.free)
    return selection.record(state), selection


def _open_domains(
    ctx: _Context,
    spec: CompartmentSpec,
    key: str,
    state: BatchState,
    *,
    slots: _Slots,
    total: int,
    ceiling: int,
    domains: int,
) -> _Selection:
    """Open a batch of whole domains: the strategy's size in domains (progress still in nodes), within
    the free domains, each domain admitted in one pass (`plan.topology`). `wanted` is in domains."""
    units = topology.group(key, slots.candidates)
    raw = batches.strategy_batch_size(spec.strategy, state, total=total, ceiling=ceiling, cap=domains)
    size = batches.next_batch_size(
        spec.strategy, state, total=total, remaining=len(units), ceiling=ceiling, free=slots.free, cap=domains
    )
    planned, shared = topology.pick_domains(ctx.ledger, units, size=size)
    picked = topology.within_limit(planned, ctx.admission_limit)
    return _Selection(
        planned=topology.flatten(planned),
        picked=topology.flatten(picked),
        shared=shared,
        wanted=max(1, min(raw, len(units))),
        opened=True,
    )


def _fill_domains(ctx: _Context, key: str, state: BatchState, *, slots: _Slots) -> _Selection:
    """The next whole domains of a batch planned in an earlier pass (its node count bounds them)."""
    units = topology.group(key, slots.candidates)
    planned, shared = topology.pick_domains(
        ctx.ledger, units, size=slots.free, nodes=state.planned_size - state.admitted_size
    )
    picked = topology.within_limit(planned, ctx.admission_limit)
    return _Selection(planned=topology.flatten(planned), picked=topology.flatten(picked), shared=shared)


def _waiting(
    ctx: _Context,
    name: str,
    spec: CompartmentSpec,
    state: BatchState,
    members: Sequence[RolloutNode],
    phases: Mapping[str, Phase],
    settled: _Settled,
    slots: _Slots,
    selection: _Selection,
    pacing: _Pacing,
) -> tuple[Waiting, ...]:
    """Why each pending member not admitted by this plan waits."""
    planned = {n.name for n in selection.planned}
    budget_full = (
        _domains_budget_full(
            ctx, name, spec, spec.topology_key, state, settled, slots, selection, total=len(members)
        )
        if spec.topology_key is not None
        else _budget_full_nodes(ctx, name, spec, state, settled, slots, selection, total=len(members))
    )
    picked = {n.name for n in selection.picked}
    why = _WaitFacts(
        compartment=name,
        disabled=ctx.disabled,
        paused=ctx.paused,
        halted=state.should_stop,
        halted_by=HaltedByGate(_gate_halt(name, state.gate_halt).message) if state.gate_halt else None,
        pacing=None if settled.batch else pacing.reason,
        shared=selection.shared,
        deferred=planned - picked,
        deferred_into=state.current_batch,
        budget_full=budget_full,
    )
    return tuple(
        _why_waiting(why, n) for n in members if phases[n.name] in _PICKABLE and n.name not in picked
    )


def _budget_full_nodes(
    ctx: _Context,
    name: str,
    spec: CompartmentSpec,
    state: BatchState,
    settled: _Settled,
    slots: _Slots,
    selection: _Selection,
    *,
    total: int,
) -> set[str]:
    planned = {n.name for n in selection.planned}
    return _budget_full(
        spec,
        state,
        batch=[*settled.batch, *selection.planned],
        candidates=[n for n in slots.candidates if n.name not in planned and n.name not in selection.shared],
        picked=len(selection.planned),
        wanted=selection.wanted,
        free=slots.free - len(selection.planned),
        total=total,
        ceiling=ctx.compartments.ceiling(name),
    )


def _domains_budget_full(
    ctx: _Context,
    name: str,
    spec: CompartmentSpec,
    key: str,
    state: BatchState,
    settled: _Settled,
    slots: _Slots,
    selection: _Selection,
    *,
    total: int,
) -> set[str]:
    """`BudgetFull` of a topology compartment, in domains: the candidate domains the strategy wants in
    the current batch beyond the free domains (`_budget_full` for nodes)."""
    planned = {n.name for n in selection.planned}
    rest = [n for n in slots.candidates if n.name not in planned and n.name not in selection.shared]
    units = topology.group(key, rest)
    in_batch = len(topology.domains_of(key, [*settled.batch, *selection.planned]))
    free = slots.free - len(topology.domains_of(key, selection.planned))
    if selection.wanted:
        held = units[: max(0, selection.wanted - in_batch)]
    elif settled.batch:
        raw = batches.strategy_batch_size(
            spec.strategy,
            state,
            total=total,
            ceiling=ctx.compartments.ceiling(name),
            cap=len(units) + in_batch,
        )
        held = units[max(0, free) : max(0, raw - in_batch)]
    else:
        held = []
    return {n.name for n in topology.flatten(held)}


def _compartment_plan(
    ctx: _Context,
    name: str,
    spec: CompartmentSpec,
    state: BatchState,
    members: Sequence[RolloutNode],
    phases: Mapping[str, Phase],
    settled: _Settled,
    slots: _Slots,
    selection: _Selection,
    pacing: _Pacing,
) -> CompartmentPlan:
    ceiling = ctx.compartments.ceiling(name)
    pending = bool(slots.candidates) and not settled.batch
    in_progress = len(slots.holding) + len(selection.picked)
    status = _compartment_status(ctx, state, members, phases, ceiling, in_progress, pacing, pending, name)
    message = (
        _slots_message(in_progress + len(slots.others), ceiling, len(slots.others))
        if spec.topology_key is None
        else _domains_message(spec.topology_key, ceiling, slots, selection)
    )
    if pacing.reason and pending:
        message += f"; {pacing.reason[1].describe()}"
    if selection.shared:
        message += f"; {next(iter(selection.shared.values())).describe()}"
    return CompartmentPlan(
        name=name,
        status=status,
        strategy=spec.strategy.describe() if spec.strategy else "none (batch = ceiling)",
        budget=spec.budget.describe() + (f" of {spec.topology_key} domains" if spec.topology_key else ""),
        used_by_others=len(slots.others),
        open_batch=state.current_batch if (settled.batch or selection.picked) else None,
        batch_evaluated=settled.outcome,
        halt=_halt(name, state, members=members, phases=phases) if state.should_stop else None,
        message=message,
        window=pacing.window,
        soak_until=pacing.soak_until,
        awaiting_approval=status.awaiting_approval,
        wake_at=pacing.wake_at,
        opened=selection.opened and bool(selection.picked),
        deferred=len(selection.planned) - len(selection.picked),
        topology_key=spec.topology_key,
        gate_check=pacing.gate_check,
        health_gate=pacing.reason[1] if pacing.reason and isinstance(pacing.reason[1], GateHeld) else None,
    )


def _domains_message(key: str, ceiling: int, slots: _Slots, selection: _Selection) -> str:
    ours = topology.domains_of(key, [*slots.holding, *selection.picked])
    others = topology.domains_of(key, slots.others) - ours
    text = f"{len(ours) + len(others)} of {ceiling} domains ({key}) in use"
    if ours:
        text += f": {', '.join(sorted(ours)[:5])}{' ...' if len(ours) > 5 else ''}"
    if others:
        text += f"; {len(others)} of {ceiling} by nodes unavailable for other reasons"
    return text


def _compartment_status(
    ctx: _Context,
    state: BatchState,
    members: Sequence[RolloutNode],
    phases: Mapping[str, Phase],
    ceiling: int,
    in_progress: int,
    pacing: _Pacing,
    pending: bool,
    name: str,
) -> CompartmentStatus:
    complete = sum(phases[n.name] in _COMPLETE for n in members)
    window, soak = pacing.window, pacing.soak_until
    return CompartmentStatus(
        matched=len(members),
        ceiling=ceiling,
        in_progress=in_progress,
        completed=complete,
        progress_percent=complete * 100 // len(members) if members else 0,
        batch_state=state,
        window_active=window.active if window is not None else None,
        window_closes_at=_ts(window.closes_at) if window is not None and window.closes_at else None,
        next_window_at=_ts(window.next_open) if window is not None and window.next_open else None,
        soak_until=_ts(soak) if soak is not None else None,
        soak_remaining_seconds=_remaining(soak, ctx.moment) if soak is not None else None,
        awaiting_approval=pacing.gate if pacing.gate is not None and pending else None,
        health_gates=_gate_statuses(ctx, name, state),
    )


def _gate_statuses(ctx: _Context, name: str, state: BatchState) -> list[GateStatus] | None:
    """The gate results of the batch that settled last, for the status (read back by `rollout_input`)."""
    results = ctx.gate_results.get(name, {})
    kept = [gates.to_status(r) for _, r in sorted(results.items()) if r.batch == state.last_settled_batch]
    return kept or None


def _evaluate(
    ctx: _Context,
    spec: CompartmentSpec,
    state: BatchState,
    *,
    batch: Sequence[RolloutNode],
    members: Sequence[RolloutNode],
    phases: Mapping[str, Phase],
) -> tuple[batches.BatchOutcome, BatchState]:
    """Fold the settled open batch into the batch state; the next batch number becomes current."""
    settled_number = state.current_batch
    outcome = batches.evaluate_batch(
        spec.strategy,
        state,
        succeeded=sum(phases[n.name] is Phase.SUCCEEDED for n in batch),
        failed=sum(phases[n.name] is Phase.FAILED for n in batch),
        complete_in_compartment=sum(phases[n.name] in (Phase.DONE, Phase.SUCCEEDED) for n in members),
        erroring_in_compartment=sum(phases[n.name] is Phase.FAILED for n in members),
        total=len(members),
    )
    closed = outcome.state.model_copy(
        update={
            "last_settled_batch": settled_number,
            "settled_at": ctx.now,
            "planned_size": 0,
            "admitted_size": 0,
        }
    )
    return outcome, closed


def _may_fill(
    ctx: _Context, spec: CompartmentSpec, state: BatchState, *, candidates: Sequence[RolloutNode], free: int
) -> bool:
    """Whether the open batch still takes admissions: it was planned larger than what was admitted so far
    (`admission_limit` deferred the rest), a candidate and a slot are there, and nothing holds new
    admissions (halt, pause, disable, a closed maintenance window). Such a batch is not evaluated yet, even
    if every admitted member already settled, so it ends with the size its strategy gave it."""
    if state.admitted_size >= state.planned_size or not candidates or free <= 0:
        return False
    if state.should_stop or ctx.paused or ctx.disabled:
        return False
    pacing = spec.pacing
    return not pacing.has_maintenance or windows.evaluate(pacing.schedule, ctx.moment).active


@dataclass(frozen=True, slots=True)
class _Selection:
    """The nodes a plan takes into the current batch.

    `planned` are all the nodes the batch takes now (their slots are reserved in this plan); `picked`,
    its first `admission_limit`, are admitted in this plan, the rest in the next ones (the batch state
    records both counts). `wanted` is the strategy's size when the batch opens here (0 otherwise),
    `shared` the candidates a shared DisruptionBudget kept out.
    """

    planned: tuple[RolloutNode, ...] = ()
    picked: tuple[RolloutNode, ...] = ()
    shared: Mapping[str, BudgetHeld] = field(default_factory=dict)
    wanted: int = 0
    opened: bool = False

    def record(self, state: BatchState) -> BatchState:
        if self.opened:
            return state.model_copy(
                update={"planned_size": len(self.planned), "admitted_size": len(self.picked)}
            )
        if self.picked:
            return state.model_copy(update={"admitted_size": state.admitted_size + len(self.picked)})
        return state


def _open_batch(
    ctx: _Context,
    spec: CompartmentSpec,
    state: BatchState,
    *,
    candidates: Sequence[RolloutNode],
    free: int,
    total: int,
    ceiling: int,
) -> _Selection:
    raw = batches.strategy_batch_size(spec.strategy, state, total=total, ceiling=ceiling)
    size = batches.next_batch_size(
        spec.strategy, state, total=total, remaining=len(candidates), ceiling=ceiling, free=free
    )
    planned, shared = _pick(ctx.ledger, candidates, size=size)
    return _Selection(
        planned=tuple(planned),
        picked=tuple(planned[: ctx.admission_limit]),
        shared=shared,
        wanted=max(1, min(raw, len(candidates))),
        opened=True,
    )


def _fill_batch(
    ctx: _Context, state: BatchState, *, candidates: Sequence[RolloutNode], free: int
) -> _Selection:
    size = min(state.planned_size - state.admitted_size, free)
    planned, shared = _pick(ctx.ledger, candidates, size=size)
    return _Selection(planned=tuple(planned), picked=tuple(planned[: ctx.admission_limit]), shared=shared)


@dataclass(frozen=True, slots=True)
class _Pacing:
    state: BatchState
    window: windows.WindowState | None
    soak_until: datetime | None
    gate: int | None
    reason: tuple[WaitReason, Pacing] | None
    wake_at: datetime | None
    gate_check: gates.GateCheck | None = None


def _pacing(
    ctx: _Context,
    name: str,
    spec: CompartmentSpec,
    *,
    state: BatchState,
    waiting: bool,
    members: Sequence[RolloutNode],
) -> _Pacing:
    """Whether time, a human or a health gate holds the next batch of a compartment (approval gate, then
    soak, then health gates, then window).

    A gate (`pauseAfterBatch`) holds after the batch that settled last until `approvals` names exactly
    that batch, which is then recorded as `approvedBatch` (so the approval cannot open a later gate).
    Soak time counts from when the last batch settled. A closed maintenance window only stops new
    admissions: admitted nodes finish. Health gates are judged once the soak is over (`_health`); one that
    failed past its timeout halts the compartment (the returned state records it).
    """
    pacing = spec.pacing
    window = windows.evaluate(pacing.schedule, ctx.moment) if pacing.has_maintenance else None
    soak_until: datetime | None = None
    if pacing.soak_seconds > 0 and state.settled_at:
        settled = _moment(state.settled_at)
        soak_until = settled + timedelta(seconds=pacing.soak_seconds)
        if soak_until <= ctx.moment:
            soak_until = None
    last = state.last_settled_batch
    gate: int | None = None
    if last in pacing.pause_after and state.approved_batch < last:
        if ctx.approvals.get(name) == last:
            state = state.model_copy(update={"approved_batch": last})
        else:
            gate = last
    health = gates.OPEN
    if gate is None and soak_until is None and waiting and not state.should_stop:
        health, state = _health(ctx, name, spec, state=state, members=members)
    reason: tuple[WaitReason, Pacing] | None = None
    if gate is not None:
        reason = (WaitReason.AWAITING_APPROVAL, Gate(ctx.nodewright, name, gate))
    elif soak_until is not None:
        reason = (WaitReason.SOAKING, Soak(name, last, soak_until))
    elif health.held is not None:
        reason = (WaitReason.HEALTH_GATE, health.held)
    elif window is not None and not window.active:
        reason = (WaitReason.WINDOW, WindowClosed(window.describe()))
    wakes = [soak_until, health.wake_at]
    if window is not None and waiting:
        wakes.append(window.closes_at if window.active else window.next_open)
    wake_at = min((w for w in wakes if w is not None), default=None)
    check = None
    if health.due:
        nodes = tuple(sorted(n.name for n in _batch_members(ctx, name, last, members)))
        check = gates.GateCheck(name, last, nodes, spec.pacing.gates)
    return _Pacing(state, window, soak_until, gate, reason, wake_at, check)


def _health(
    ctx: _Context, name: str, spec: CompartmentSpec, *, state: BatchState, members: Sequence[RolloutNode]
) -> tuple[gates.GateDecision, BatchState]:
    """The health gates' decision after the batch that settled last (its soak over), and the batch state
    with a halt recorded when a gate failed past its timeout (`plan.gates`)."""
    last = state.last_settled_batch
    if not spec.pacing.gates or last < 1 or not state.settled_at:
        return gates.OPEN, state
    soak_end = _moment(state.settled_at) + timedelta(seconds=spec.pacing.soak_seconds)
    decision = gates.decide(
        name,
        last,
        spec.pacing.gates,
        ctx.gate_results.get(name, {}),
        nodes=[n.name for n in _batch_members(ctx, name, last, members)],
        soak_end=soak_end,
        now=ctx.moment,
    )
    if decision.halt is not None:
        return decision, state.model_copy(update={"should_stop": True, "gate_halt": decision.halt})
    return decision, state


def _moment(text: str) -> datetime:
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _ts(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _remaining(until: datetime, now: datetime) -> int:
    return max(0, int((until - now).total_seconds() + 0.999))


_COMPLETE = frozenset({Phase.DONE, Phase.SUCCEEDED})
_PICKABLE = frozenset({Phase.PENDING, Phase.RELEASED})


def _apply_resets(
    ctx: _Context,
    name: str,
    *,
    state: BatchState,
    members: Sequence[RolloutNode],
) -> BatchState:
    admissions = [n.admission for n in members if n.admission is not None and n.admission.compartment == name]
    current = any(a.fingerprint == ctx.fingerprint for a in admissions)
    if ctx.compartments.reset_on_completion and admissions and not current and state != BatchState():
        # The spec changed since this compartment last rolled out: start the new rollout from batch 1.
        state = BatchState()
    if ctx.reset_requested:
        return batches.fresh_state(current_batch=state.current_batch)
    return state


def _catch_up(ctx: _Context, name: str, *, state: BatchState, members: Sequence[RolloutNode]) -> BatchState:
    """Never re-open a batch number that admissions on the nodes already moved past.

    The batch state is persisted in the NodeWright status and the admissions on the nodes, in two
    writes. If the status write was lost (crash between the two, or a stale cached status), the state
    names an older batch whose members have all settled: evaluating it again would open a second batch
    under the same number and double the batch size. The admissions are the more recent record, so
    the current batch is raised to the highest admitted one (that batch's evaluation is then the one
    that counts; the lost one is not replayed).
    """
    admitted = [
        n.admission.batch
        for n in members
        if n.admission is not None
        and n.admission.fingerprint == ctx.fingerprint
        and n.admission.compartment == name
    ]
    highest = max(admitted, default=0)
    if highest > state.current_batch:
        # The lost status also held the planned size of that batch: it is not filled any further.
        return state.model_copy(update={"current_batch": highest, "planned_size": 0, "admitted_size": 0})
    return state


def _batch_members(ctx: _Context, name: str, batch: int, members: Iterable[RolloutNode]) -> list[RolloutNode]:
    return [
        n
        for n in members
        if n.admission is not None
        and n.admission.fingerprint == ctx.fingerprint
        and n.admission.compartment == name
        and n.admission.batch == batch
    ]


def _pick(
    ledger: budgets.Ledger, candidates: Sequence[RolloutNode], *, size: int
) -> tuple[list[RolloutNode], dict[str, BudgetHeld]]:
    """Up to `size` candidates in pick order, skipping those whose shared DisruptionBudget has no free
    slot (node -> (budget, why), for their waiting reason); the batch then takes the next candidates."""
    picked: list[RolloutNode] = []
    shared: dict[str, BudgetHeld] = {}
    for node in candidates:
        if len(picked) >= size:
            break
        full = ledger.full(node.name)
        if full is not None:
            ledger.refuse(full)
            shared[node.name] = BudgetHeld(full.name, ledger.message(full))
            continue
        ledger.take(node.name)
        picked.append(node)
    return picked, shared


def _eligible(node: RolloutNode) -> bool:
    """May this pending node be picked? A node cordoned by an admin may (it is out of service anyway,
    and it stays cordoned afterwards); a NotReady node or one held by another NodeWright may not."""
    unavailable = node.unavailable is not None and not node.may_start_while_unavailable
    return not (unavailable or node.blocked is not None or node.waiting_for_priority)


def _budget_full(
    spec: CompartmentSpec,
    state: BatchState,
    *,
    batch: Sequence[RolloutNode],
    candidates: Sequence[RolloutNode],
    picked: int,
    wanted: int,
    free: int,
    total: int,
    ceiling: int,
) -> set[str]:
    """Candidates the strategy wants in the current batch that the ceiling keeps out (`BudgetFull`).

    When a batch opens in this plan, they are the wanted ones beyond the free slots (`candidates`: those
    neither picked nor held by a shared DisruptionBudget, `picked`: how many were). While a batch is
    open the strategy's size for it is still known (opening changes no persisted counter): the members
    it lacks are held by the budget when no slot is free for them -- without this, such nodes read
    `NotYetInBatch` from the second pass on, although a slot is what they wait for.
    """
    if wanted:
        return {n.name for n in candidates[: max(0, wanted - picked)]}
    if not batch:
        return set()
    raw = batches.strategy_batch_size(spec.strategy, state, total=total, ceiling=ceiling)
    shortfall = max(0, min(raw, len(batch) + len(candidates)) - len(batch))
    return {n.name for n in candidates[max(0, free) : shortfall]}


@dataclass(frozen=True, slots=True)
class _WaitFacts:
    """What decides why a pending node of one compartment waits, but the node itself (`_why_waiting`)."""

    compartment: str
    disabled: bool
    paused: bool
    halted: bool
    halted_by: HaltedByGate | None
    pacing: tuple[WaitReason, Pacing] | None
    shared: Mapping[str, BudgetHeld]
    deferred: AbstractSet[str]
    deferred_into: int
    budget_full: AbstractSet[str]


def _why_waiting(why: _WaitFacts, node: RolloutNode) -> Waiting:
    """The first reason that holds, in this order (every pending node of a fleet, on every pass)."""
    reason: WaitReason
    detail: WaitDetail | None = None
    if why.disabled:
        reason = WaitReason.DISABLED
    elif why.paused:
        reason = WaitReason.PAUSED
    elif node.blocked is not None:
        reason, detail = WaitReason.BLOCKED, node.blocked
    elif node.unavailable is not None:
        reason, detail = WaitReason.NODE_UNAVAILABLE, node.unavailable
    elif node.waiting_for_priority:
        reason, detail = WaitReason.WAITING_FOR_PRIORITY, Predecessor(node.waiting_for_priority)
    elif why.halted:
        reason, detail = WaitReason.COMPARTMENT_HALTED, why.halted_by
    elif why.pacing is not None:
        reason, detail = why.pacing
    elif node.name in why.shared:
        reason, detail = WaitReason.DISRUPTION_BUDGET, why.shared[node.name]
    elif node.name in why.deferred:
        reason, detail = WaitReason.NOT_YET_IN_BATCH, Deferred(why.compartment, why.deferred_into)
    elif node.name in why.budget_full:
        reason = WaitReason.BUDGET_FULL
    else:
        reason = WaitReason.NOT_YET_IN_BATCH
    return Waiting(node.name, why.compartment, reason, detail)


def _halt(
    name: str, state: BatchState, *, members: Sequence[RolloutNode], phases: Mapping[str, Phase]
) -> Halt:
    if state.gate_halt is not None:
        return _gate_halt(name, state.gate_halt)
    failing = sorted(n.name for n in members if phases[n.name] is Phase.FAILED)
    shown = failing[:MAX_FAILING_NODES]
    more = f" and {len(failing) - len(shown)} more" if len(failing) > len(shown) else ""
    nodes_text = f"; failing nodes: {', '.join(shown)}{more}" if failing else ""
    message = (
        f"compartment {name!r} halted after {state.consecutive_failures} consecutive failed batches"
        f"{nodes_text}; set annotation nodewright.io/reset-batch-state to resume"
    )
    return Halt(name, HaltReason.FAILURE_THRESHOLD, tuple(shown), len(failing), message)


def _gate_halt(name: str, halt: GateHalt) -> Halt:
    seen = f"{halt.query} = {halt.value}" if halt.value is not None else f"{halt.query}: no value"
    detail = f" ({halt.detail})" if halt.detail else ""
    message = (
        f"compartment {name!r} halted: health gate {halt.gate!r} failed after batch {halt.batch} past its"
        f" timeout: {seen}{detail}; set annotation nodewright.io/reset-batch-state to resume"
    )
    return Halt(name, HaltReason.HEALTH_GATE, (), 0, message[:1024])


def _slots_message(used: int, ceiling: int, by_others: int) -> str:
    text = f"{used} of {ceiling} slots in use"
    if by_others:
        text += f"; {by_others} of {ceiling} slots used by nodes unavailable for other reasons"
    return text


def _policy_unusable(
    missing: PolicyUnusable,
    *,
    nodes: Sequence[RolloutNode],
    phases: Mapping[str, Phase],
    statuses: Mapping[str, CompartmentStatus],
    paused: bool,
    disabled: bool,
    next_order: int,
) -> RolloutPlan:
    # Keep the persisted batch state untouched: a halted compartment must stay halted when the policy
    # comes back, so the compartment statuses are echoed, not dropped.
    reason = WaitReason.POLICY_INVALID if isinstance(missing, PolicyInvalid) else WaitReason.POLICY_NOT_FOUND
    if disabled:
        reason = WaitReason.DISABLED
    elif paused:
        reason = WaitReason.PAUSED
    waiting = tuple(
        Waiting(n.name, None, reason, missing)
        for n in sorted(nodes, key=lambda n: n.name)
        if phases[n.name] in _PICKABLE
    )
    kept = {
        name: CompartmentPlan(name, status, "", "", 0, None, None, None, missing.message)
        for name, status in sorted(statuses.items())
    }
    return RolloutPlan(
        policy_name=missing.policy_name,
        policy_not_found=missing if isinstance(missing, PolicyNotFound) else None,
        compartments=kept,
        admissions=(),
        releases=tuple(sorted(n for n, p in phases.items() if p is Phase.RELEASED)),
        active=tuple(sorted(n for n, p in phases.items() if p is Phase.ACTIVE)),
        waiting=waiting,
        halts=(),
        reset_applied=False,
        next_order=next_order,
        policy_invalid=missing if isinstance(missing, PolicyInvalid) else None,
    )


def _parse_time(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.replace(tzinfo=None) if parsed.tzinfo is None else _naive_utc(parsed)


def _naive_utc(value: datetime) -> datetime:
    offset = value.utcoffset()
    naive = value.replace(tzinfo=None)
    return naive - offset if offset is not None else naive
