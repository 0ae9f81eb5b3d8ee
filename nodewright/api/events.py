"""The Event reasons NodeWright emits: one vocabulary, with each reason's type, object and meaning.

Each reason names one thing that happened, is emitted on one kind of object (a NodeWright for
rollout-level news, a Node for node-level news -- node events also name the NodeWright) and has one
type. The node planner (`plan.node`) emits these codes directly; the controllers emit nothing else, and
docs/observability.md's table is checked against `CATALOGUE` by a unit test. Message builders and Event
bodies are `observability.events`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from nodewright.api import constants


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class EventReason(StrEnum):
    # NodeWright events (involvedObject: the NodeWright)
    STATUS_CHANGED = "StatusChanged"
    BATCH_STARTED = "BatchStarted"
    BATCH_COMPLETED = "BatchCompleted"
    BATCH_FAILED = "BatchFailed"
    COMPARTMENT_HALTED = "CompartmentHalted"
    COMPARTMENT_RESUMED = "CompartmentResumed"
    HEALTH_GATE_HOLDING = "HealthGateHolding"
    ROLLOUT_COMPLETE = "RolloutComplete"
    ROLLOUT_PAUSED = "RolloutPaused"
    ROLLOUT_DISABLED = "RolloutDisabled"
    POLICY_NOT_FOUND = "PolicyNotFound"
    POLICY_INVALID = "PolicyInvalid"
    STATE_MALFORMED = "StateMalformed"
    DELETION_BLOCKED = "DeletionBlocked"
    INVALID_SPEC = "InvalidSpec"
    NOTIFICATIONS_DROPPED = "NotificationsDropped"
    # Node events (involvedObject: the Node)
    PACKAGE_STARTED = "PackageStarted"
    PACKAGE_COMPLETED = "PackageCompleted"
    PACKAGE_FAILED = "PackageFailed"
    PACKAGE_RETRIED = "PackageRetried"
    PACKAGE_UNINSTALLED = "PackageUninstalled"
    UNINSTALL_CANCELLED = "UninstallCancelled"
    NODE_CORDONED = "NodeCordoned"
    NODE_DRAINING = "NodeDraining"
    NODE_DRAIN_BLOCKED = "NodeDrainBlocked"
    NODE_DRAIN_TIMEOUT = "NodeDrainTimeout"
    PROTECTED_PODS_TIMEOUT = "ProtectedPodsTimeout"
    INTERRUPT_STARTED = "InterruptStarted"
    INTERRUPT_COMPLETED = "InterruptCompleted"
    INTERRUPT_FAILED = "InterruptFailed"
    NODE_REBOOTED = "NodeRebooted"
    NODE_UNCORDONED = "NodeUncordoned"
    NODE_COMPLETE = "NodeComplete"
    NODE_BLOCKED = "NodeBlocked"
    DRIFTED = "Drifted"
    DRIFT_CLEARED = "DriftCleared"
    DRIFT_REPAIRED = "DriftRepaired"
    DRIFT_CHECK_FAILED = "DriftCheckFailed"
    UNTRUSTED_PACKAGE_POD = "UntrustedPackagePod"


@dataclass(frozen=True, slots=True)
class ReasonInfo:
    reason: EventReason
    type: EventType
    kind: str  # the kind of the involved object
    meaning: str
    also_on_nodewright: bool = False  # a Node event also recorded on the NodeWright (its rollout history)

    @property
    def objects(self) -> str:
        """The docs' "Object" column."""
        return f"{self.kind} and NodeWright" if self.also_on_nodewright else self.kind


_NW = constants.KIND_NODEWRIGHT
CATALOGUE: Final[tuple[ReasonInfo, ...]] = (
    ReasonInfo(EventReason.STATUS_CHANGED, EventType.NORMAL, _NW, "Roll-up status changed"),
    ReasonInfo(
        EventReason.BATCH_STARTED, EventType.NORMAL, _NW, "A compartment admitted a new batch of nodes"
    ),
    ReasonInfo(
        EventReason.BATCH_COMPLETED, EventType.NORMAL, _NW, "A batch finished within its failure threshold"
    ),
    ReasonInfo(
        EventReason.BATCH_FAILED, EventType.WARNING, _NW, "A batch finished with too many failed nodes"
    ),
    ReasonInfo(
        EventReason.COMPARTMENT_HALTED, EventType.WARNING, _NW, "A compartment stopped admitting nodes"
    ),
    ReasonInfo(EventReason.COMPARTMENT_RESUMED, EventType.NORMAL, _NW, "A halted compartment was reset"),
    ReasonInfo(
        EventReason.HEALTH_GATE_HOLDING,
        EventType.WARNING,
        _NW,
        "A health gate started holding a compartment's next batch (once per hold: the gate, query and value)",
    ),
    ReasonInfo(EventReason.ROLLOUT_COMPLETE, EventType.NORMAL, _NW, "Every matched node is complete"),
    ReasonInfo(EventReason.ROLLOUT_PAUSED, EventType.NORMAL, _NW, "The pause annotation stopped admissions"),
    ReasonInfo(
        EventReason.ROLLOUT_DISABLED, EventType.NORMAL, _NW, "The disable annotation stopped the rollout"
    ),
    ReasonInfo(
        EventReason.POLICY_NOT_FOUND, EventType.WARNING, _NW, "The referenced DeploymentPolicy is missing"
    ),
    ReasonInfo(
        EventReason.POLICY_INVALID,
        EventType.WARNING,
        _NW,
        "The referenced DeploymentPolicy fails validation (each field and what to do); nothing starts",
    ),
    ReasonInfo(
        EventReason.STATE_MALFORMED, EventType.WARNING, _NW, "Node state annotations cannot be parsed"
    ),
    ReasonInfo(EventReason.DELETION_BLOCKED, EventType.WARNING, _NW, "The finalizer cannot complete"),
    ReasonInfo(
        EventReason.INVALID_SPEC, EventType.WARNING, _NW, "The spec fails validation; nodes are left alone"
    ),
    ReasonInfo(
        EventReason.NOTIFICATIONS_DROPPED,
        EventType.WARNING,
        _NW,
        "Notices about the NodeWright were dropped for a notification sink",
    ),
    ReasonInfo(
        EventReason.PACKAGE_STARTED, EventType.NORMAL, "Node", "A package stage pod was created", True
    ),
    ReasonInfo(
        EventReason.PACKAGE_COMPLETED, EventType.NORMAL, "Node", "A package is complete on the node", True
    ),
    ReasonInfo(EventReason.PACKAGE_FAILED, EventType.WARNING, "Node", "A package stage attempt failed", True),
    ReasonInfo(
        EventReason.PACKAGE_RETRIED,
        EventType.NORMAL,
        "Node",
        "An erroring package restarts under a fresh admission",
    ),
    ReasonInfo(EventReason.PACKAGE_UNINSTALLED, EventType.NORMAL, "Node", "A package was uninstalled", True),
    ReasonInfo(
        EventReason.UNINSTALL_CANCELLED,
        EventType.NORMAL,
        "Node",
        "uninstall.apply was set back before it finished",
    ),
    ReasonInfo(EventReason.NODE_CORDONED, EventType.NORMAL, "Node", "The node was cordoned for maintenance"),
    ReasonInfo(EventReason.NODE_DRAINING, EventType.NORMAL, "Node", "Evictions were issued"),
    ReasonInfo(
        EventReason.NODE_DRAIN_BLOCKED, EventType.WARNING, "Node", "Drain cannot progress (PDB, pods)"
    ),
    ReasonInfo(
        EventReason.NODE_DRAIN_TIMEOUT,
        EventType.WARNING,
        "Node",
        "drain.timeout passed under policy skip: the node is released and retried later",
    ),
    ReasonInfo(
        EventReason.PROTECTED_PODS_TIMEOUT,
        EventType.WARNING,
        "Node",
        "interruptWait.timeout passed with protected pods still running: the run fails",
    ),
    ReasonInfo(
        EventReason.INTERRUPT_STARTED, EventType.NORMAL, "Node", "The merged interrupt pod was created"
    ),
    ReasonInfo(EventReason.INTERRUPT_COMPLETED, EventType.NORMAL, "Node", "The interrupt finished"),
    ReasonInfo(
        EventReason.INTERRUPT_FAILED,
        EventType.WARNING,
        "Node",
        "The node did not return from its reboot in time",
    ),
    ReasonInfo(
        EventReason.NODE_REBOOTED, EventType.NORMAL, "Node", "A reboot was observed (boot id changed)", True
    ),
    ReasonInfo(EventReason.NODE_UNCORDONED, EventType.NORMAL, "Node", "The node was returned to service"),
    ReasonInfo(
        EventReason.NODE_COMPLETE, EventType.NORMAL, "Node", "All packages of the NodeWright are complete"
    ),
    ReasonInfo(
        EventReason.NODE_BLOCKED, EventType.WARNING, "Node", "The node is skipped (taint or ignore label)"
    ),
    ReasonInfo(
        EventReason.DRIFTED, EventType.WARNING, "Node", "A drift check found a complete package changed"
    ),
    ReasonInfo(EventReason.DRIFT_CLEARED, EventType.NORMAL, "Node", "A drifted package's check passes again"),
    ReasonInfo(EventReason.DRIFT_REPAIRED, EventType.NORMAL, "Node", "A drifted package was re-applied"),
    ReasonInfo(EventReason.DRIFT_CHECK_FAILED, EventType.WARNING, "Node", "A drift check pod could not run"),
    ReasonInfo(
        EventReason.UNTRUSTED_PACKAGE_POD,
        EventType.WARNING,
        "Node",
        "A pod with package-pod labels failed verification and was deleted",
        True,
    ),
)
_BY_REASON: Final = {info.reason: info for info in CATALOGUE}


def event_type(reason: EventReason) -> EventType:
    return _BY_REASON[reason].type


def info(reason: EventReason) -> ReasonInfo:
    return _BY_REASON[reason]
