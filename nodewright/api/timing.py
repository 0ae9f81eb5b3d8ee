"""Codec of the node controller's timing annotation `nodewright.io/timing.<nw>`, and RFC 3339 helpers.

`protected_since` / `draining_since` (for `interruptWait.timeout` and `drain.timeout`) must survive an
operator restart, or a restart would silently extend every timeout. They are persisted in this
annotation (written by the node controller in the same patch as the state annotation, so there is no
extra write), together with `cordoned_at` (the start of the maintenance window, for the
`nodewright_maintenance_seconds` histogram), the drain-skip memory (`s`, `m`: when and why
`drain.policy: skip` released the node, `DrainSkip`), whether the drain in progress had an eviction
refused (`b`: the rollout controller counts such a node as held by its drain) and, with tracing on, the
admission whose
node-rollout trace is open (`t`, `TracedAdmission`: so the trace's root is emitted once, also when the
rollout is abandoned). The state annotation itself has a strict schema shared with the rollout
controller; these are the node controller's private bookkeeping, so they live next to it rather than
in it. The rollout controller reads the drain-skip memory (when a skipped node may be retried) and the
refused evictions; the node condition's message says the same for people.

Wire format: compact JSON, sorted keys, `{"c", "p", "d", "s": RFC 3339 times, "m": skip message,
"b": true (an eviction refused), "t": traced admission}`, every key optional; an empty timing removes the
annotation. Decoding is lenient: a missing or unreadable value is an empty timing (it only ever delays a
timeout).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

from nodewright.api import constants

TIMING_ANNOTATION_PREFIX: Final = f"{constants.PREFIX}timing."
SKIP_MESSAGE_LIMIT: Final = 512


def ts(moment: datetime) -> str:
    """RFC 3339 in UTC with second precision, as every timestamp NodeWright writes."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def parse_ts_or_none(text: str | None) -> datetime | None:
    """A timestamp read from an object someone else may have written: None when absent or unreadable."""
    if not text:
        return None
    try:
        return parse_ts(text)
    except ValueError:
        return None


def timing_annotation(nodewright: str) -> str:
    return f"{TIMING_ANNOTATION_PREFIX}{nodewright}"


@dataclass(frozen=True, slots=True)
class DrainSkip:
    """The node controller's memory of a drain that timed out under `drain.policy: skip`.

    The node was released (uncordoned if we cordoned it, the run not started) at `at`. It stays
    `blocked` (reason `DrainTimeout`) until the rollout admits it again with an admission newer than
    `at`; then the drain is tried afresh (new timer).
    """

    at: datetime
    message: str


@dataclass(frozen=True, slots=True)
class TracedAdmission:
    """The admission whose node-rollout trace is open on a node (or was, with `ended`).

    The node controller keeps it in its timing annotation: it names the trace (`at` is the trace's
    `picked_at`) after the admission itself was replaced, and `ended` keeps an admission that comes
    back (a spec change reverted) from getting a second root.
    """

    compartment: str
    batch: int
    order: int
    at: str
    fingerprint: str
    ended: bool = False

    @property
    def key(self) -> str:
        # The fingerprint too: a new spec's rollout numbers its batches and orders from the start
        # again, and admission times have second precision.
        return f"{self.fingerprint}/{self.batch}/{self.order}/{self.at}"

    def encode(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "c": self.compartment,
            "b": self.batch,
            "o": self.order,
            "at": self.at,
            "f": self.fingerprint,
        }
        if self.ended:
            doc["e"] = True
        return doc

    @staticmethod
    def decode(doc: object) -> TracedAdmission | None:
        """Lenient: anything unreadable is None (a trace then just misses its root)."""
        if not isinstance(doc, dict):
            return None
        c, b, o, at, f, e = (doc.get(k) for k in ("c", "b", "o", "at", "f", "e"))
        if not (isinstance(c, str) and isinstance(b, int) and isinstance(o, int)):
            return None
        if not (isinstance(at, str) and isinstance(f, str) and isinstance(e, bool | None)):
            return None
        return TracedAdmission(c, b, o, at, f, bool(e))


@dataclass(frozen=True, slots=True)
class Timing:
    """The node controller's persisted timestamps for one NodeWright on one node."""

    cordoned_at: datetime | None = None
    protected_since: datetime | None = None
    draining_since: datetime | None = None
    skipped_at: datetime | None = None  # drain.policy skip released the node then (`DrainSkip`)
    skip_message: str = ""
    trace: TracedAdmission | None = None  # the admission whose rollout trace is open (or ended last)
    drain_blocked: bool = False  # draining, and the last eviction attempt had a refusal (PDB, error)

    @property
    def empty(self) -> bool:
        return self.encode() is None

    @property
    def drain_skip(self) -> DrainSkip | None:
        return DrainSkip(self.skipped_at, self.skip_message) if self.skipped_at is not None else None

    def with_drain_skip(self, skip: DrainSkip | None) -> Timing:
        if skip is None:
            return replace(self, skipped_at=None, skip_message="")
        return replace(self, skipped_at=skip.at, skip_message=skip.message[:SKIP_MESSAGE_LIMIT])

    def encode(self) -> str | None:
        """Compact JSON; None when empty (the annotation is then removed)."""
        doc: dict[str, Any] = {
            k: ts(v)
            for k, v in (
                ("c", self.cordoned_at),
                ("p", self.protected_since),
                ("d", self.draining_since),
                ("s", self.skipped_at),
            )
            if v is not None
        }
        if self.skipped_at is not None and self.skip_message:
            doc["m"] = self.skip_message
        if self.drain_blocked:
            doc["b"] = True
        if self.trace is not None:
            doc["t"] = self.trace.encode()
        return json.dumps(doc, sort_keys=True, separators=(",", ":")) if doc else None

    @staticmethod
    def decode(text: str | None) -> Timing:
        """Lenient: a missing or unreadable value is an empty Timing (it only ever delays a timeout)."""
        if not text:
            return Timing()
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict):
                return Timing()
            values = {
                k: parse_ts(v) for k, v in doc.items() if k in ("c", "p", "d", "s") and isinstance(v, str)
            }
            message = doc.get("m")
        except ValueError:
            return Timing()
        return Timing(
            values.get("c"),
            values.get("p"),
            values.get("d"),
            values.get("s"),
            message if isinstance(message, str) and values.get("s") is not None else "",
            TracedAdmission.decode(doc.get("t")),
            doc.get("b") is True,
        )


def read_timing(annotations: Mapping[str, str], nodewright: str) -> Timing:
    """The timing of `nodewright` from a node's annotations (a mapping)."""
    return Timing.decode(annotations.get(timing_annotation(nodewright)))


def update_timing(
    timing: Timing,
    *,
    now: datetime,
    cordoning: bool,
    uncordoning: bool,
    protected: bool | None,
    evicting: bool,
    drained: bool | None,
) -> Timing:
    """The timestamps after this plan. `protected`/`drained` are None when no drain facts were built.

    The drain-skip memory is not touched here: it follows the plan (`Timing.with_drain_skip`)."""
    if uncordoning:
        return Timing(skipped_at=timing.skipped_at, skip_message=timing.skip_message, trace=timing.trace)
    t = timing
    if cordoning and t.cordoned_at is None:
        t = replace(t, cordoned_at=now)
    if protected is not None:
        if protected and t.protected_since is None:
            t = replace(t, protected_since=now)
        elif not protected:
            t = replace(t, protected_since=None)
    if evicting and t.draining_since is None:
        t = replace(t, draining_since=now)
    elif drained:
        t = replace(t, draining_since=None)
    return t
