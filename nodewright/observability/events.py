"""Catalogue of the Kubernetes Events NodeWright emits: reasons, types, message builders, Event bodies.

Pure (no I/O, no clock reads: time is a parameter). The reference operator reused a handful of vague
reasons (`Apply`, `Interrupt`, `State`) for different things on different objects; here each reason
names one thing that happened, is emitted on one kind of object (a NodeWright for rollout-level news, a
Node for node-level news -- node events also name the NodeWright), and always comes with the same
message shape, so `kubectl get events --field-selector reason=NodeDrainBlocked` answers a question.
Messages quote names in brackets like the reference ("Package [p:v] ...") and are capped at
`MAX_MESSAGE_LENGTH`; lists of nodes are cut to a few names and "and N more".

`build_event` returns a core/v1 Event body ready to POST. Node and NodeWright are cluster-scoped, so
their Events live in the `default` namespace (what client-go's recorder does). The name is
`<object>.<hex nanoseconds>` like client-go's. Repeats of the same (object, reason, message) are
folded into one Event with a count (`EventCorrelator`, client-go's algorithm; the recorder in
`observability.recorder` sends the result): `aggregation_key` identifies them and `bump_patch` is the
merge patch that increments `count` and moves `lastTimestamp`.

One list. The reasons, their types and meanings are `api.events` (`EventReason`, `CATALOGUE`): the plan
layer emits these codes (`plan.node.Event`), the controllers emit nothing else, and
docs/observability.md's table is checked against it by a unit test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from nodewright.api import constants
from nodewright.api.events import CATALOGUE as CATALOGUE
from nodewright.api.events import EventReason as EventReason
from nodewright.api.events import EventType as EventType
from nodewright.api.events import ReasonInfo as ReasonInfo
from nodewright.api.events import event_type as event_type
from nodewright.api.events import info as info
from nodewright.api.reasons import GateHeld

COMPONENT: Final = "nodewright-operator"
EVENT_NAMESPACE: Final = "default"
MAX_MESSAGE_LENGTH: Final = 1024
MAX_LISTED_NAMES: Final = 5


@dataclass(frozen=True, slots=True)
class ObjectRef:
    kind: str
    name: str
    api_version: str
    uid: str | None = None
    resource_version: str | None = None

    def to_json(self) -> dict[str, str]:
        ref = {"kind": self.kind, "name": self.name, "apiVersion": self.api_version}
        if self.uid:
            ref["uid"] = self.uid
        if self.resource_version:
            ref["resourceVersion"] = self.resource_version
        return ref


def node_ref(name: str, uid: str | None = None) -> ObjectRef:
    return ObjectRef(kind="Node", name=name, api_version="v1", uid=uid)


def nodewright_ref(name: str, uid: str | None = None) -> ObjectRef:
    return ObjectRef(kind=constants.KIND_NODEWRIGHT, name=name, api_version=constants.API_VERSION, uid=uid)


@dataclass(frozen=True, slots=True)
class EventSpec:
    """What to say: the reason, its type and the message (from one of the builders below)."""

    reason: EventReason
    message: str

    @property
    def type(self) -> EventType:
        return event_type(self.reason)


# ----------------------------------------------------------------------------------------------------
# Message builders


def _pkg(package: str, version: str) -> str:
    return f"[{package}:{version}]"


def list_names(names: Sequence[str], *, limit: int = MAX_LISTED_NAMES) -> str:
    """`a, b, c` or `a, b, c, d, e and 7 more` (sorted, so repeats aggregate into one Event)."""
    ordered = sorted(names)
    shown = ", ".join(ordered[:limit])
    rest = len(ordered) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown


def status_changed(old: str, new: str) -> EventSpec:
    return EventSpec(EventReason.STATUS_CHANGED, f"NodeWright status changed [{old}] -> [{new}]")


def batch_started(
    compartment: str, batch: int, nodes: Sequence[str], *, planned: int | None = None
) -> EventSpec:
    """`nodes`: those admitted by the pass that opened the batch; `planned`: the batch's size, when the
    rest is admitted by the next passes (`--admissions-per-pass`)."""
    if planned is None or planned <= len(nodes):
        return EventSpec(
            EventReason.BATCH_STARTED,
            f"Compartment [{compartment}] batch {batch} started with {len(nodes)} node(s):"
            f" {list_names(nodes)}",
        )
    return EventSpec(
        EventReason.BATCH_STARTED,
        f"Compartment [{compartment}] batch {batch} started: {planned} node(s), the first {len(nodes)}:"
        f" {list_names(nodes)}",
    )


def batch_finished(
    compartment: str, batch: int, *, succeeded: int, failed: int, failed_batch: bool
) -> EventSpec:
    reason = EventReason.BATCH_FAILED if failed_batch else EventReason.BATCH_COMPLETED
    verdict = "failed" if failed_batch else "completed"
    return EventSpec(
        reason, f"Compartment [{compartment}] batch {batch} {verdict}: {succeeded} succeeded, {failed} failed"
    )


def compartment_halted(compartment: str, *, consecutive_failures: int, threshold: int) -> EventSpec:
    return EventSpec(
        EventReason.COMPARTMENT_HALTED,
        f"Compartment [{compartment}] halted after {consecutive_failures} consecutive failed batch(es) "
        f"(threshold {threshold}); reset with the {constants.ANNOTATION_RESET_BATCH} annotation",
    )


def health_gate_holding(held: GateHeld) -> EventSpec:
    """A gate started holding a compartment (`GateHeld.describe` names the gate, query and value)."""
    return EventSpec(EventReason.HEALTH_GATE_HOLDING, held.describe())


def compartment_resumed(compartment: str) -> EventSpec:
    return EventSpec(
        EventReason.COMPARTMENT_RESUMED, f"Compartment [{compartment}] batch state reset; rollout resumes"
    )


def rollout_complete(nodes: int) -> EventSpec:
    return EventSpec(EventReason.ROLLOUT_COMPLETE, f"All {nodes} matched node(s) complete")


def rollout_paused() -> EventSpec:
    return EventSpec(EventReason.ROLLOUT_PAUSED, f"Paused by annotation {constants.ANNOTATION_PAUSE}")


def rollout_disabled() -> EventSpec:
    return EventSpec(EventReason.ROLLOUT_DISABLED, f"Disabled by annotation {constants.ANNOTATION_DISABLE}")


def policy_not_found(policy: str) -> EventSpec:
    return EventSpec(EventReason.POLICY_NOT_FOUND, f"DeploymentPolicy [{policy}] not found; rollout blocked")


def policy_invalid(message: str) -> EventSpec:
    """`message`: `plan.policy.PolicyInvalid.message` (the policy, each field and what to do)."""
    return EventSpec(EventReason.POLICY_INVALID, f"{message}; rollout blocked")


def state_malformed(nodes: Sequence[str]) -> EventSpec:
    return EventSpec(
        EventReason.STATE_MALFORMED,
        f"Node state of {len(nodes)} node(s) cannot be parsed; they are left untouched: {list_names(nodes)}",
    )


def deletion_blocked(why: str) -> EventSpec:
    return EventSpec(EventReason.DELETION_BLOCKED, f"Deletion blocked: {why}")


def notifications_dropped(sink: str, reason: str, why: str) -> EventSpec:
    """Notices for `sink` dropped (`reason`: the metric's label value, `why`: what it means). The
    message stays the same for repeats so they count up one Event."""
    return EventSpec(
        EventReason.NOTIFICATIONS_DROPPED,
        f"Notifications to sink [{sink}] dropped ({reason}): {why}; counted in"
        " nodewright_notifications_dropped_total",
    )


def package_started(
    nodewright: str, package: str, version: str, stage: str, *, attempt: int = 1
) -> EventSpec:
    suffix = f" (attempt {attempt})" if attempt > 1 else ""
    return EventSpec(
        EventReason.PACKAGE_STARTED,
        f"Package {_pkg(package, version)} stage [{stage}] started for [{nodewright}]{suffix}",
    )


def package_failed(
    nodewright: str, package: str, version: str, stage: str, *, attempt: int, error: str, will_retry: bool
) -> EventSpec:
    then = "will retry" if will_retry else "giving up"
    return EventSpec(
        EventReason.PACKAGE_FAILED,
        f"Package {_pkg(package, version)} stage [{stage}] failed for [{nodewright}] (attempt {attempt}, "
        f"{then}): {error}",
    )


def node_cordoned(nodewright: str) -> EventSpec:
    return EventSpec(EventReason.NODE_CORDONED, f"Cordoned for [{nodewright}]")


def node_draining(nodewright: str, pods: int) -> EventSpec:
    return EventSpec(EventReason.NODE_DRAINING, f"Evicting {pods} pod(s) for [{nodewright}]")


def node_drain_blocked(nodewright: str, why: str, pods: Sequence[str] = ()) -> EventSpec:
    listed = f": {list_names(pods)}" if pods else ""
    return EventSpec(EventReason.NODE_DRAIN_BLOCKED, f"Drain for [{nodewright}] blocked by {why}{listed}")


def node_uncordoned(nodewright: str) -> EventSpec:
    return EventSpec(EventReason.NODE_UNCORDONED, f"Uncordoned by [{nodewright}]")


def node_complete(nodewright: str) -> EventSpec:
    return EventSpec(EventReason.NODE_COMPLETE, f"NodeWright [{nodewright}] complete")


def node_blocked(nodewright: str, why: str) -> EventSpec:
    return EventSpec(EventReason.NODE_BLOCKED, f"Skipped by [{nodewright}]: {why}")


def untrusted_package_pod(nodewright: str, pod: str, node: str, why: str) -> EventSpec:
    """`pod` is `<namespace>/<name>`; `why` says which check failed."""
    return EventSpec(
        EventReason.UNTRUSTED_PACKAGE_POD,
        f"Pod [{pod}] on node [{node}] carries package-pod labels of [{nodewright}] but failed"
        f" verification: {why}; it was deleted and changes no node state",
    )


# ----------------------------------------------------------------------------------------------------
# Event bodies


def _rfc3339(ts: datetime) -> str:
    if ts.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def truncate(message: str, limit: int = MAX_MESSAGE_LENGTH) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."


def build_event(
    involved: ObjectRef,
    spec: EventSpec,
    *,
    now: datetime,
    reporting_instance: str,
    namespace: str = EVENT_NAMESPACE,
) -> dict[str, Any]:
    """A core/v1 Event body (count 1) for `involved`."""
    stamp = _rfc3339(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{involved.name}.{int(now.timestamp() * 1_000_000_000):x}",
            "namespace": namespace,
        },
        "involvedObject": involved.to_json(),
        "reason": spec.reason.value,
        "message": truncate(spec.message),
        "type": spec.type.value,
        "source": {"component": COMPONENT},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "reportingComponent": COMPONENT,
        "reportingInstance": reporting_instance,
    }


def aggregation_key(event: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """Events with the same key are repeats: fold them into one (see `bump_patch`)."""
    obj = event["involvedObject"]
    return (obj["kind"], obj["name"], event["reason"], event["type"], event["message"])


def bump_patch(event: dict[str, Any], *, now: datetime) -> dict[str, Any]:
    """Merge patch recording one more occurrence of an existing Event."""
    return {"count": int(event.get("count") or 1) + 1, "lastTimestamp": _rfc3339(now)}


# ----------------------------------------------------------------------------------------------------
# Correlation: client-go's EventCorrelator (aggregation of similar events, series of identical ones)

COMBINED_PREFIX: Final = "(combined from similar events): "
MAX_SIMILAR: Final = 10
SIMILAR_WINDOW: Final = 600.0
SERIES_WINDOW: Final = 3600.0
MAX_REMEMBERED: Final = 4096
"""Series and similarity groups remembered (each, least recently seen forgotten first): client-go's
LRU size for the same purpose. 20,000 held ~28 MiB once a 10,000-node rollout had produced them (a
few Events per node, each with its message); forgetting one only means its next occurrence creates
a new Event instead of counting up the old one."""

SeriesKey = tuple[str, str, str, str, str]
"""(kind, name, reason, type, message) of a series of identical events."""


@dataclass(frozen=True, slots=True)
class Correlated:
    """What one occurrence becomes: the series it joins (`key`), the message to show, and whether the
    series is new (the recorder creates an Event) or a repeat (it bumps the Event's count)."""

    key: SeriesKey
    message: str
    new_series: bool


@dataclass(slots=True)
class _Similar:
    since: datetime
    messages: set[str]


class EventCorrelator:
    """Folds events the way client-go's `EventCorrelator` does, pure (time is a parameter).

    - Identical events (same object, reason, type and message) form one series: the first creates an
      Event, repeats only increase its count (`count`, `lastTimestamp`), as `kubectl describe` shows
      ("x12 over 3m").
    - Similar events (same object, reason and type, different messages): once more than `max_similar`
      distinct messages were seen within `similar_window` seconds, further ones join one series whose
      message is `(combined from similar events): <the newest message>` -- a node retrying with a new
      message each time cannot flood the API server with Events.
    - A series unseen for `series_window` seconds (kube-apiserver's default Event TTL) ends: the next
      occurrence starts a new Event.

    Memory is bounded by `max_keys` remembered similarity groups and series (least recently seen
    forgotten first: a forgotten series simply starts a new Event). Nothing is ever dropped.
    """

    def __init__(
        self,
        *,
        max_similar: int = MAX_SIMILAR,
        similar_window: float = SIMILAR_WINDOW,
        series_window: float = SERIES_WINDOW,
        max_keys: int = MAX_REMEMBERED,
    ) -> None:
        self._max_similar = max_similar
        self._similar_window = similar_window
        self._series_window = series_window
        self._max_keys = max_keys
        self._similar: dict[tuple[str, str, str, str], _Similar] = {}
        self._series: dict[SeriesKey, datetime] = {}

    def observe(
        self, *, kind: str, name: str, reason: str, event_type: str, message: str, now: datetime
    ) -> Correlated:
        group = (kind, name, reason, event_type)
        similar = self._similar.pop(group, None)
        if similar is None or (now - similar.since).total_seconds() > self._similar_window:
            similar = _Similar(now, set())
        self._similar[group] = similar
        if message in similar.messages or len(similar.messages) < self._max_similar:
            similar.messages.add(message)
            key: SeriesKey = (kind, name, reason, event_type, message)
            shown = message
        else:
            key = (kind, name, reason, event_type, COMBINED_PREFIX)
            shown = COMBINED_PREFIX + message
        last = self._series.pop(key, None)
        new = last is None or (now - last).total_seconds() > self._series_window
        self._series[key] = now
        self._trim()
        return Correlated(key, shown, new)

    def _trim(self) -> None:
        # Least recently seen first: observe() re-inserts what it touches.
        while len(self._similar) > self._max_keys:
            del self._similar[next(iter(self._similar))]
        while len(self._series) > self._max_keys:
            del self._series[next(iter(self._series))]
