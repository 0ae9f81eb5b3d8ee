"""The reasons NodeWright gives, as codes: node condition reasons, waiting and blocking reasons.

Kubernetes' convention for conditions holds for every reason here: a `reason` is a programmatic
CamelCase code that consumers dispatch on, a `message` is for people. Meaning therefore travels
between layers as these values -- an enum member, and where a reason has particulars a small frozen
record of them (the owner of a cordon, the taints, the retry time, the policy) -- and each record has
one `describe()` that renders the human message. No code path reads a message back: rewording one
changes what people read, never what the operator, the status, the metrics, `kubectl nodewright why`,
`watch`, the demo or a notification does.

- `NodeConditionReason`: the node condition `nodewright.io/<nw>` the node controller writes (and so
  what the rollout controller counts as held at the node gate: `HELD_AT_GATE`, `drain_held`).
- `WaitReason`: why a node with pending work is not active (the rollout planner's answer, counted in the
  NodeWright status and `nodewright_waiting_nodes`), with its `WaitDetail`.
- `Unavailable`: a node made unavailable by someone else (it takes a budget slot); `Block`: a node this
  NodeWright may not touch at all.

The Event reasons are the other vocabulary of codes: `api.events`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import ClassVar

from nodewright.api import constants
from nodewright.api.models import GateOutcome as GateOutcome
from nodewright.api.nodeobject import Taint

BLOCK_TEXT = 300
"""Characters of a block's description (it is carried into status messages and the plugin's lines)."""


def _ts(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeConditionReason(StrEnum):
    """Reason of the node condition `nodewright.io/<nw>`: what this NodeWright is doing on the node."""

    COMPLETE = "Complete"
    DRIFTED = "Drifted"
    IN_PROGRESS = "InProgress"
    WAITING_FOR_PROTECTED_PODS = "WaitingForProtectedPods"
    DRAINING = "Draining"
    """Evicting; whether an eviction was refused is the timing annotation's `drain_blocked` (`api.timing`)."""
    DRAIN_TIMEOUT = "DrainTimeout"
    """`drain.timeout` passed: still draining (policy wait), or released (policy skip, status blocked)."""
    REBOOTING = "Rebooting"
    ERRORING = "Erroring"
    BLOCKED = "Blocked"
    PAUSED = "Paused"
    DISABLED = "Disabled"
    WAITING = "Waiting"
    STATE_MALFORMED = "StateMalformed"


HELD_AT_GATE = frozenset(
    {
        NodeConditionReason.WAITING_FOR_PROTECTED_PODS,
        NodeConditionReason.DRAINING,
        NodeConditionReason.DRAIN_TIMEOUT,
    }
)
"""An admitted node at its node gate (protected pods, drain): `nodewright_drain_blocked_nodes`."""
DRAINING = frozenset({NodeConditionReason.DRAINING, NodeConditionReason.DRAIN_TIMEOUT})


def drain_held(reason: NodeConditionReason | None, *, evictions_refused: bool) -> bool:
    """An admitted node whose drain cannot progress: the drain timeout passed, or it is draining and an
    eviction was refused (the node controller records that in the timing annotation, `api.timing`)."""
    if reason is NodeConditionReason.DRAIN_TIMEOUT:
        return True
    return reason is NodeConditionReason.DRAINING and evictions_refused


def condition_reason(text: str | None) -> NodeConditionReason | None:
    """The code of a node condition as read from a node (None: absent, or not one of ours)."""
    try:
        return NodeConditionReason(text) if text else None
    except ValueError:
        return None


class WaitReason(StrEnum):
    """Why a node with pending work is not active (closed set; `NodeUnavailable` added to the brief's)."""

    NOT_YET_IN_BATCH = "NotYetInBatch"
    BUDGET_FULL = "BudgetFull"
    COMPARTMENT_HALTED = "CompartmentHalted"
    WAITING_FOR_PRIORITY = "WaitingForPriority"
    PAUSED = "Paused"
    DISABLED = "Disabled"
    BLOCKED = "Blocked"
    NODE_UNAVAILABLE = "NodeUnavailable"
    POLICY_NOT_FOUND = "PolicyNotFound"
    POLICY_INVALID = "PolicyInvalid"
    WINDOW = "Window"
    SOAKING = "Soaking"
    AWAITING_APPROVAL = "AwaitingApproval"
    DISRUPTION_BUDGET = "DisruptionBudget"
    HEALTH_GATE = "HealthGate"


class HaltReason(StrEnum):
    """Why a compartment halted (the `Halted` condition's reason); only a batch-state reset resumes it."""

    FAILURE_THRESHOLD = "FailureThresholdReached"
    HEALTH_GATE = "HealthGateFailed"


# ----------------------------------------------------------------------------------------------------
# Unavailable: someone else holds the node (it takes a slot of the budget)


class Activity(StrEnum):
    """Whether another NodeWright works (its cordons are temporary) or holds still."""

    ACTIVE = "active"
    PAUSED = "paused"
    DISABLED = "disabled"


class UnavailableReason(StrEnum):
    NOT_READY = "NotReady"
    CORDONED_BY_SOMEONE_ELSE = "CordonedBySomeoneElse"
    CORDONED_BY_NODEWRIGHT = "CordonedByNodeWright"


@dataclass(frozen=True, slots=True)
class NotReady:
    reason: ClassVar[UnavailableReason] = UnavailableReason.NOT_READY

    def describe(self) -> str:
        return "NotReady"


@dataclass(frozen=True, slots=True)
class CordonedBySomeoneElse:
    """Cordoned outside NodeWright: out of service anyway, so it may be worked on (and stays cordoned)."""

    reason: ClassVar[UnavailableReason] = UnavailableReason.CORDONED_BY_SOMEONE_ELSE

    def describe(self) -> str:
        return "cordoned by someone else"


@dataclass(frozen=True, slots=True)
class CordonedByNodeWright:
    """Cordoned by another NodeWright (`owner`): a paused one keeps its cordons until it is resumed, a
    disabled one releases them once its running pods have finished."""

    owner: str
    activity: Activity = Activity.ACTIVE
    reason: ClassVar[UnavailableReason] = UnavailableReason.CORDONED_BY_NODEWRIGHT

    def describe(self) -> str:
        if self.activity is Activity.PAUSED:
            return (
                f"cordoned by NodeWright {self.owner!r}, which is paused (it keeps the cordon until resumed)"
            )
        if self.activity is Activity.DISABLED:
            return f"cordoned by NodeWright {self.owner!r}, which is disabled (released once its pods finish)"
        return f"cordoned by NodeWright {self.owner!r}"


Unavailable = NotReady | CordonedBySomeoneElse | CordonedByNodeWright
NOT_READY = NotReady()
CORDONED_BY_SOMEONE_ELSE = CordonedBySomeoneElse()


# ----------------------------------------------------------------------------------------------------
# Blocked: this NodeWright may not touch the node


class BlockReason(StrEnum):
    IGNORE_LABEL = "IgnoreLabel"
    UNTOLERATED_TAINTS = "UntoleratedTaints"
    DRAIN_SKIPPED = "DrainSkipped"
    NODE_REPORTED = "NodeReported"
    STATE_MALFORMED = "StateMalformed"


@dataclass(frozen=True, slots=True)
class IgnoreLabel:
    reason: ClassVar[BlockReason] = BlockReason.IGNORE_LABEL

    def describe(self) -> str:
        return f"node carries {constants.LABEL_IGNORE}=true"


@dataclass(frozen=True, slots=True)
class UntoleratedTaints:
    taints: tuple[Taint, ...]
    reason: ClassVar[BlockReason] = BlockReason.UNTOLERATED_TAINTS

    def describe(self) -> str:
        listed = ", ".join(f"{t.key}={t.value or ''}:{t.effect}" for t in self.taints[:3])
        return f"taint not tolerated: {listed}"


@dataclass(frozen=True, slots=True)
class DrainSkipped:
    """A drain timed out under `drain.policy: skip`; the node is retried from `retry_at` on. `message` is
    what the node controller said when it released the node (for people)."""

    retry_at: datetime
    message: str
    reason: ClassVar[BlockReason] = BlockReason.DRAIN_SKIPPED

    def describe(self) -> str:
        return f"drain timed out, retried after {_ts(self.retry_at)}: {self.message}"[:BLOCK_TEXT]


@dataclass(frozen=True, slots=True)
class NodeReportedBlock:
    """The node controller reported the node blocked (status label `blocked`), with its condition: a
    downgrade that needs an uninstall first, a dependency cycle, ... (`condition` None: no condition)."""

    condition: NodeConditionReason | None
    message: str
    reason: ClassVar[BlockReason] = BlockReason.NODE_REPORTED

    def describe(self) -> str:
        if self.condition is None:
            return "blocked on the node"
        text = f"{self.condition.value}: {self.message}" if self.message else self.condition.value
        return text[:BLOCK_TEXT]


@dataclass(frozen=True, slots=True)
class StateMalformed:
    """The state annotation does not decode: counted blocked, nothing starts, until it is fixed."""

    error: str
    reason: ClassVar[BlockReason] = BlockReason.STATE_MALFORMED

    def describe(self) -> str:
        return f"StateMalformed: {self.error}"[:BLOCK_TEXT]


Block = IgnoreLabel | UntoleratedTaints | DrainSkipped | NodeReportedBlock | StateMalformed
IGNORE_LABEL = IgnoreLabel()


# ----------------------------------------------------------------------------------------------------
# The DeploymentPolicy a NodeWright names, when it cannot be used


@dataclass(frozen=True, slots=True)
class PolicyNotFound:
    """The NodeWright names a DeploymentPolicy that does not exist."""

    policy_name: str

    @property
    def message(self) -> str:
        return self.describe()

    def describe(self) -> str:
        return f"DeploymentPolicy {self.policy_name!r} not found; no node is started until it exists"


@dataclass(frozen=True, slots=True)
class PolicyInvalid:
    """The named DeploymentPolicy exists but fails validation (stored before a rule existed, or written
    while admission was bypassed). `problems` are `field path: what to do` lines, e.g.
    `spec.maintenance.blackouts[0].start: '2026-02-30' does not exist: ...`."""

    policy_name: str
    problems: tuple[str, ...]

    @property
    def message(self) -> str:
        return self.describe()

    def describe(self) -> str:
        listed = "; ".join(self.problems) or "it fails validation"
        return (
            f"DeploymentPolicy {self.policy_name!r} is invalid: {listed}; no node is started until it is"
            f" fixed (kubectl edit deploymentpolicy {self.policy_name})"
        )


PolicyUnusable = PolicyNotFound | PolicyInvalid
"""Why a NodeWright that names a DeploymentPolicy has no compartments: nothing starts until it changes."""


# ----------------------------------------------------------------------------------------------------
# Details of the other waiting reasons


@dataclass(frozen=True, slots=True)
class Predecessor:
    """The earlier NodeWright (priority, sequencing) that must finish on the node first."""

    name: str

    def describe(self) -> str:
        return f"waiting for NodeWright {self.name!r}"


@dataclass(frozen=True, slots=True)
class Gate:
    """`pauseAfterBatch`: batch `batch` of the compartment settled; the next waits for an approval."""

    nodewright: str
    compartment: str
    batch: int

    def describe(self) -> str:
        return (
            f"batch {self.batch} of {self.compartment!r} settled; the next batch waits for approval"
            f" (kubectl nodewright approve {self.nodewright} --compartment {self.compartment})"
        )


@dataclass(frozen=True, slots=True)
class Soak:
    """The compartment soaks after batch `batch` until `until`."""

    compartment: str
    batch: int
    until: datetime

    def describe(self) -> str:
        return f"soaking after batch {self.batch} of {self.compartment!r} until {_ts(self.until)}"


@dataclass(frozen=True, slots=True)
class WindowClosed:
    """No maintenance window is open; `description` says which blackout or when the next one opens."""

    description: str

    def describe(self) -> str:
        return self.description


@dataclass(frozen=True, slots=True)
class BudgetHeld:
    """A shared DisruptionBudget (`budget`) has no free slot for the node; `holders` says who holds them."""

    budget: str
    holders: str

    def describe(self) -> str:
        return self.holders


@dataclass(frozen=True, slots=True)
class Deferred:
    """Taken into batch `batch` by this plan; `--admissions-per-pass` leaves its admission to the next."""

    compartment: str
    batch: int

    def describe(self) -> str:
        where = f"batch {self.batch} of {self.compartment!r}"
        return f"taken into {where}; its admission is written in the next pass"


@dataclass(frozen=True, slots=True)
class GateHeld:
    """A health gate holds the compartment's next batch after batch `batch`: `outcome` None means it was
    not evaluated yet; otherwise `query` (as asked) gave `value` (None: no value), `detail` says more.
    `halt_at` is when the compartment halts if the gate still does not pass."""

    compartment: str
    batch: int
    gate: str
    query: str
    outcome: GateOutcome | None
    value: str | None
    detail: str
    halt_at: datetime

    def describe(self) -> str:
        where = f"health gate {self.gate!r} after batch {self.batch} of {self.compartment!r}"
        if self.outcome is None:
            seen = "is being evaluated"
        elif self.outcome is GateOutcome.UNKNOWN:
            seen = f"could not be evaluated ({self.detail}); query {self.query}"
        else:
            seen = f"fails: {self.query} = {self.value}" + (f" ({self.detail})" if self.detail else "")
        return f"{where} {seen}; halts at {_ts(self.halt_at)} unless it passes"[:BLOCK_TEXT]


Pacing = Gate | Soak | WindowClosed | GateHeld


@dataclass(frozen=True, slots=True)
class HaltedByGate:
    """The compartment is halted by a health gate; `message` names the gate, the query and the value."""

    message: str

    def describe(self) -> str:
        return self.message[:BLOCK_TEXT]


"""Time or a person holds a compartment's next batch."""
WaitDetail = (
    Block | Unavailable | Predecessor | Pacing | BudgetHeld | Deferred | PolicyUnusable | HaltedByGate
)


def describe_waiting(reason: WaitReason, detail: WaitDetail | None, compartment: str | None) -> str:
    """The human message of a waiting node (`plan.rollout.Waiting.message`)."""
    if reason is WaitReason.DISABLED:
        return "the NodeWright is disabled"
    if reason is WaitReason.PAUSED:
        return "the NodeWright is paused"
    if reason is WaitReason.BLOCKED and detail is not None:
        return f"blocked: {detail.describe()}"
    if reason is WaitReason.NODE_UNAVAILABLE and detail is not None:
        return f"node unavailable: {detail.describe()}"
    if reason is WaitReason.COMPARTMENT_HALTED:
        if detail is not None:
            return detail.describe()
        return f"compartment {compartment!r} is halted; reset to resume"
    if reason is WaitReason.BUDGET_FULL:
        return f"compartment {compartment!r} has no free slot"
    if detail is not None:
        return detail.describe()
    return f"waiting for a later batch of {compartment!r}"


def detail_label(detail: WaitDetail | None) -> str | None:
    """The short name of a waiting reason's particulars, as `nodewright plan` groups its blockers
    (`Blocked(<why>)`, `WaitingForPriority(<NodeWright>)`, `DisruptionBudget(<budget>)`, ...)."""
    if isinstance(detail, Predecessor):
        return detail.name
    if isinstance(detail, BudgetHeld):
        return detail.budget
    if isinstance(detail, PolicyNotFound | PolicyInvalid):
        return detail.policy_name
    if isinstance(detail, GateHeld):
        return detail.gate
    if isinstance(detail, HaltedByGate):
        return None
    if isinstance(detail, Gate | Soak | WindowClosed | Deferred) or detail is None:
        return None
    return detail.describe()
