"""Traces of node rollouts: one trace per node per rollout of a NodeWright, exported over OTLP/HTTP.

Shape: a root span `node-rollout` (from the moment the node is picked into a batch to its uncordon)
with one child span per finished stage: cordon, wait, drain, apply, upgrade, config, interrupt,
post-interrupt, uninstall, uncordon. Attributes: `nodewright.name`, `k8s.node.name`,
`nodewright.package.name`, `nodewright.package.version`, `nodewright.compartment`, `nodewright.batch`,
and `nodewright.stage` on stage spans. A failed stage has status ERROR, the error message as status
description and an `exception` event.

Restart safety. A node rollout lasts minutes to hours and spans many reconciles and possibly operator
restarts, so nothing is held open in memory: each span is emitted when its stage finishes, with start
and end timestamps taken from the node state the controller persists, and the ids are derived
deterministically from the rollout's identity -- (NodeWright uid, node, time the node was picked,
batch, spec fingerprint of the admission) -- which the controller can rebuild after a restart:

- trace id = first 16 bytes of sha256("nodewright-trace/<uid>/<node>/<picked_at>/<batch>/<fingerprint>"),
- root span id = 8 bytes of sha256 of the same key + "/root".

Stage spans emitted before the root name it as their (remote) parent; the root span itself is emitted
last by `node_rollout_finished`, with the derived ids forced through an `IdGenerator` that reads a
context variable (the SDK's public extension point for ids). A backend therefore assembles one trace
per node rollout whatever the number of restarts in between; a stage whose end was lost in a crash is
simply missing.

Every trace gets its root exactly once, however the node's rollout ends (`trace_step`, `RolloutEnd`):
it settles under its admission (`complete`, or `failed`: a package gave up, status ERROR with the
packages' errors), or it is abandoned -- `superseded` (the spec changed: a newer generation), `withdrawn`
(the rollout took the admission back or replaced it), `unselected` (the node left the selector),
`deleted` (the NodeWright is being deleted) -- all ERROR with the reason as status description and as
`nodewright.outcome`. The node controller persists the admission whose trace is open
(`TracedAdmission`, in its timing annotation), so an abandoned trace is ended by the first pass that
sees its admission gone or stale, also after a restart, and never twice (without an OTLP endpoint
nothing is persisted).

Cost. Without `OTEL_EXPORTER_OTLP_ENDPOINT` (or an injected exporter) no TracerProvider is created and
every method returns immediately. With one, spans go through a `BatchSpanProcessor` (export on a
background thread). `force_flush`/`shutdown` block: call them through `asyncio.to_thread` (or use
`aclose`) so the exporter's HTTP request cannot stall the event loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import os
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Final, Protocol

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import SpanContext, SpanKind, StatusCode, TraceFlags

from nodewright.api.timing import TracedAdmission

ROOT_SPAN_NAME: Final = "node-rollout"
STAGES: Final[tuple[str, ...]] = (
    "cordon",
    "wait",
    "drain",
    "uninstall",
    "apply",
    "upgrade",
    "config",
    "interrupt",
    "post-interrupt",
    "uncordon",
)
OTLP_ENDPOINT_ENV: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"

ATTR_NODEWRIGHT: Final = "nodewright.name"
ATTR_NODE: Final = "k8s.node.name"
ATTR_PACKAGE: Final = "nodewright.package.name"
ATTR_VERSION: Final = "nodewright.package.version"
ATTR_COMPARTMENT: Final = "nodewright.compartment"
ATTR_BATCH: Final = "nodewright.batch"
ATTR_STAGE: Final = "nodewright.stage"
ATTR_OUTCOME: Final = "nodewright.outcome"


@dataclass(frozen=True, slots=True)
class NodeRollout:
    """Identity of one node's rollout; every field must be recoverable from persisted state."""

    nodewright: str
    nodewright_uid: str
    node: str
    picked_at: datetime
    batch: int
    compartment: str
    fingerprint: str = ""  # of the spec the node was admitted for ("" for ids of older releases)

    def _key(self) -> str:
        key = f"nodewright-trace/{self.nodewright_uid}/{self.node}/{self.picked_at.isoformat()}/{self.batch}"
        # A spec change restarts batch numbering and admission times have second precision: the
        # fingerprint keeps a superseded rollout and its successor in two traces.
        return f"{key}/{self.fingerprint}" if self.fingerprint else key

    @property
    def trace_id(self) -> int:
        value = int.from_bytes(hashlib.sha256(self._key().encode()).digest()[:16], "big")
        return value or 1  # the all-zero id is invalid

    @property
    def root_span_id(self) -> int:
        value = int.from_bytes(hashlib.sha256((self._key() + "/root").encode()).digest()[:8], "big")
        return value or 1

    def base_attributes(self) -> dict[str, str | int]:
        return {
            ATTR_NODEWRIGHT: self.nodewright,
            ATTR_NODE: self.node,
            ATTR_COMPARTMENT: self.compartment,
            ATTR_BATCH: self.batch,
        }


class RolloutEnd(StrEnum):
    """How a node's rollout (one admission of the node) ended: the root span's `nodewright.outcome`."""

    COMPLETE = "complete"  # every package complete: status OK
    FAILED = "failed"  # a package gave up (the node is erroring)
    SUPERSEDED = "superseded"  # the spec changed (a newer generation) before the node settled
    WITHDRAWN = "withdrawn"  # the rollout took the node's admission back, or admitted it anew
    UNSELECTED = "unselected"  # the node no longer matches the NodeWright's selector
    DELETED = "deleted"  # the NodeWright is being deleted


@dataclass(frozen=True, slots=True)
class TraceEnd:
    """The root span one pass emits: for which admission, how, and the status description."""

    admission: TracedAdmission
    outcome: RolloutEnd
    reason: str


@dataclass(frozen=True, slots=True)
class TraceStep:
    """What one node-controller pass does to the node's rollout trace (see `trace_step`)."""

    spans_into: TracedAdmission | None  # the trace this pass's stage and gate spans belong to
    ended: tuple[TraceEnd, ...]  # the root spans to emit after the pass's write (oldest first)
    persisted: TracedAdmission | None  # what the timing annotation keeps afterwards


IDLE: Final = TraceStep(None, (), None)


def trace_step(
    traced: TracedAdmission | None,
    current: TracedAdmission | None,
    *,
    fingerprint: str,
    generation: int | None,
    settled: RolloutEnd | None = None,
    settled_reason: str = "",
    deleting: bool = False,
) -> TraceStep:
    """The rule for when a node-rollout trace ends (pure).

    `traced` is the persisted admission of the open (or last) trace, `current` the admission that lets
    the node work now (current spec fingerprint, not consumed), `settled` how the node settled under
    `current` in this pass (COMPLETE or FAILED, when the plan consumes the admission).

    - A trace opens with the first pass under an admission, and ends when the node settles under it.
    - A trace whose admission is no longer the current one ends at once: `deleted` while the NodeWright
      is being deleted, `superseded` when its fingerprint is not the spec's any more, else `withdrawn`.
    - A trace ends once: an admission whose trace was abandoned is never traced again (a settled one
      is consumed, so it never comes back).
    """
    ended: tuple[TraceEnd, ...] = ()
    if traced is not None and not traced.ended and (current is None or current.key != traced.key):
        ended = (TraceEnd(traced, *_abandoned(traced, fingerprint, generation, deleting)),)
        traced = replace(traced, ended=True)
    if current is None:
        return TraceStep(None, ended, traced)
    if traced is not None and traced.key == current.key and traced.ended:
        return TraceStep(None, ended, traced)  # its trace ended already (the spec came back)
    if settled is not None:
        # Settling consumes the admission, which therefore never lets the node work again: nothing
        # to remember.
        return TraceStep(current, (*ended, TraceEnd(current, settled, settled_reason)), None)
    return TraceStep(current, ended, current)


def _abandoned(
    traced: TracedAdmission, fingerprint: str, generation: int | None, deleting: bool
) -> tuple[RolloutEnd, str]:
    if deleting:
        outcome = RolloutEnd.DELETED
    elif traced.fingerprint != fingerprint:
        outcome = RolloutEnd.SUPERSEDED
    else:
        outcome = RolloutEnd.WITHDRAWN
    return outcome, describe_end(outcome, generation=generation)


def describe_end(outcome: RolloutEnd, *, generation: int | None = None) -> str:
    """The root span's status description of an abandoned rollout."""
    match outcome:
        case RolloutEnd.SUPERSEDED:
            at = f" (generation {generation})" if generation is not None else ""
            return f"superseded: the spec changed{at} before the node finished"
        case RolloutEnd.WITHDRAWN:
            return "withdrawn: the rollout took the node's admission back or admitted it anew"
        case RolloutEnd.UNSELECTED:
            return "unselected: the node no longer matches the NodeWright's selector"
        case RolloutEnd.DELETED:
            return "deleted: the NodeWright is being deleted"
        case _:
            return outcome.value


_forced_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "nodewright_forced_ids", default=None
)


class _DeterministicIdGenerator(IdGenerator):
    """Random ids, except while a root span with derived ids is being started."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        forced = _forced_ids.get()
        return forced[1] if forced is not None else self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        forced = _forced_ids.get()
        return forced[0] if forced is not None else self._random.generate_trace_id()


def _ns(ts: datetime) -> int:
    if ts.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    return int(ts.timestamp() * 1_000_000_000)


class RolloutTracer:
    """Emits node-rollout traces; a disabled tracer (no exporter) does nothing at all."""

    def __init__(self, *, exporter: SpanExporter | None = None, service_instance: str | None = None) -> None:
        self._provider: TracerProvider | None = None
        self._tracer: trace.Tracer | None = None
        if exporter is None:
            return
        attributes = {"service.name": "nodewright-operator"}
        if service_instance:
            attributes["service.instance.id"] = service_instance
        self._provider = TracerProvider(
            resource=Resource.create(attributes), id_generator=_DeterministicIdGenerator()
        )
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("nodewright")

    @classmethod
    def from_environment(cls, *, service_instance: str | None = None) -> RolloutTracer:
        """OTLP/HTTP export when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (standard OTEL_* variables apply)."""
        if not os.environ.get(OTLP_ENDPOINT_ENV):
            return cls()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return cls(exporter=OTLPSpanExporter(), service_instance=service_instance)

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def stage_finished(
        self,
        rollout: NodeRollout,
        *,
        stage: str,
        started_at: datetime,
        finished_at: datetime,
        package: str | None = None,
        version: str | None = None,
        error: str | None = None,
    ) -> None:
        """Emit the span of one finished stage (or failed attempt) of a node rollout."""
        if self._tracer is None:
            return
        parent = trace.set_span_in_context(
            trace.NonRecordingSpan(
                SpanContext(
                    trace_id=rollout.trace_id,
                    span_id=rollout.root_span_id,
                    is_remote=True,
                    trace_flags=TraceFlags(TraceFlags.SAMPLED),
                )
            )
        )
        attributes = rollout.base_attributes()
        attributes[ATTR_STAGE] = stage
        if package is not None:
            attributes[ATTR_PACKAGE] = package
        if version is not None:
            attributes[ATTR_VERSION] = version
        span = self._tracer.start_span(
            stage, context=parent, kind=SpanKind.INTERNAL, attributes=attributes, start_time=_ns(started_at)
        )
        _finish(span, error=error, end=finished_at)

    def node_rollout_finished(
        self,
        rollout: NodeRollout,
        *,
        finished_at: datetime,
        packages: dict[str, str] | None = None,
        error: str | None = None,
        outcome: RolloutEnd | None = None,
    ) -> None:
        """Emit the root span, from the batch pick (`rollout.picked_at`) to the uncordon (or abandonment).

        `outcome` defaults to FAILED with an `error`, else COMPLETE; any outcome but COMPLETE has status
        ERROR (described by `error`, or the outcome's name)."""
        if self._tracer is None:
            return
        attributes: dict[str, str | int] = rollout.base_attributes()
        if packages:
            attributes[ATTR_PACKAGE] = ",".join(sorted(packages))
            attributes[ATTR_VERSION] = ",".join(f"{p}={v}" for p, v in sorted(packages.items()))
        token = _forced_ids.set((rollout.trace_id, rollout.root_span_id))
        try:
            span = self._tracer.start_span(
                ROOT_SPAN_NAME,
                context=trace.set_span_in_context(trace.INVALID_SPAN),
                kind=SpanKind.INTERNAL,
                attributes=attributes,
                start_time=_ns(rollout.picked_at),
            )
        finally:
            _forced_ids.reset(token)
        if outcome is None:
            outcome = RolloutEnd.FAILED if error else RolloutEnd.COMPLETE
        span.set_attribute(ATTR_OUTCOME, outcome.value)
        failure = None if outcome is RolloutEnd.COMPLETE else (error or outcome.value)
        _finish(span, error=failure, end=finished_at)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Blocking: export everything pending. Call via `asyncio.to_thread` from the event loop."""
        return self._provider.force_flush(timeout_millis) if self._provider is not None else True

    def shutdown(self) -> None:
        """Blocking: flush and stop the exporter thread."""
        if self._provider is not None:
            self._provider.shutdown()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.shutdown)


def _finish(span: trace.Span, *, error: str | None, end: datetime) -> None:
    if error:
        span.set_status(StatusCode.ERROR, error)
        span.add_event("exception", {"exception.message": error}, timestamp=_ns(end))
    else:
        span.set_status(StatusCode.OK)
    span.end(end_time=_ns(end))


class GateTimes(Protocol):
    """The node controller's persisted maintenance timestamps (`api.timing.Timing`)."""

    @property
    def protected_since(self) -> datetime | None: ...

    @property
    def draining_since(self) -> datetime | None: ...


@dataclass(frozen=True, slots=True)
class GateSpan:
    stage: str
    started_at: datetime
    finished_at: datetime
    error: str | None = None


def gate_spans(
    before: GateTimes,
    after: GateTimes,
    *,
    now: datetime,
    cordoned: bool,
    uncordoned: bool,
    drain_skipped: bool = False,
) -> list[GateSpan]:
    """The node-gate spans one node-controller pass ended: `cordon` and `uncordon` (the write), `wait`
    (protected pods waited for: from when they were first seen until they were gone) and `drain` (from
    the first eviction until every evicted pod was gone; ERROR when `drain.policy: skip` released the
    node instead). Times come from the persisted timing annotation, so spans survive restarts."""
    spans: list[GateSpan] = []
    if cordoned:
        spans.append(GateSpan("cordon", now, now))
    if before.protected_since is not None and after.protected_since is None:
        spans.append(GateSpan("wait", before.protected_since, now))
    if before.draining_since is not None and after.draining_since is None:
        error = "drain timed out (policy skip): node released" if drain_skipped else None
        spans.append(GateSpan("drain", before.draining_since, now, error))
    if uncordoned:
        spans.append(GateSpan("uncordon", now, now))
    return spans
