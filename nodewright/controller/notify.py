"""Notifications: rollout events posted to HTTP webhooks, in the background, never blocking a reconcile.

Sinks come from two places: each NodeWright's `spec.notifications` (sink `<nodewright>/<name>`), and one
cluster-wide sink named by the operator flags `--notify-url-secret NAME/KEY` and `--notify-format
json|slack` (sink `cluster`, told about every NodeWright). A sink's URL is a credential (whoever has it
may post to the channel), so it lives in a Secret of the operator's namespace; the chart grants `get` on
the Secrets it lists (`notifications.secretNames`) and on no other, so a NodeWright cannot make the
operator read an arbitrary Secret.

The rollout controller derives events from its pass (`controller.rollout`): RolloutStarted,
BatchSettled, NodeFailed, CompartmentHalted, DrainBlocked (a node's drain blocked for longer than the
sink's `drainBlockedAfter`) and RolloutCompleted, each with a key naming what it is about (NodeWright,
spec fingerprint, compartment, batch, node, admission).

Delivery: one sink's trouble costs only that sink. `Notifier.notify` puts the notice into the sink's
own bounded queue (`QUEUE_SIZE`; full: the notice is dropped and counted, the reconcile goes on) and
returns; each sink has its own worker, which delivers its notices in order. An attempt reads the URL
from the Secret and POSTs the payload within one deadline (`REQUEST_TIMEOUT`); connection errors,
timeouts, 429 and 5xx are retried with exponential backoff (`ATTEMPTS`), another 4xx or an unusable URL
or Secret fails at once. (Before, all sinks shared one queue and two workers: one hanging webhook held
both for minutes and every other sink waited behind it.)

Circuit breaker per sink (`CircuitBreaker`): `BREAKER_THRESHOLD` consecutive attempts that found the
sink unavailable (timeout, connection error, 429, 5xx) open the circuit for `BREAKER_OPEN` seconds,
doubling after every failed probe up to `BREAKER_MAX_OPEN`. While it is open nothing is sent and the
sink's queue holds what comes (the notice being delivered keeps its remaining attempts); then the
circuit is half-open and the next attempt is the probe: success closes it, failure opens it again. An
answer that fails for good (a 4xx) is the sink answering, not being unavailable: it counts as a
success for the breaker. Every transition is logged and shown by `nodewright_notification_circuit_state`.

Dropped notices are counted by sink and reason (`DropReason`: queue_full, circuit_open when the queue is
full while the circuit is open, shutdown, removed) in `nodewright_notifications_dropped_total`, and a
Warning Event `NotificationsDropped` goes to the NodeWright the notice is about (for a NodeWright's
own sink: the object that configured it) at most once per `DROP_REPORT_INTERVAL` per sink, reason and
NodeWright, with one log line saying how many were dropped since the last one. On shutdown
(`close`) the queues are drained for at most `SHUTDOWN_GRACE` seconds; what is left is dropped with
reason shutdown. A sink removed from its NodeWright's spec (or whose NodeWright is gone) stops taking
notices; its worker gets the same grace, then stops, and what is left is dropped with reason removed.

A key is sent to a sink once per operator process (the most recent keys are remembered); halts, starts
and completions are detected against the persisted status, so a restart does not repeat them, while a
node still failing after a restart is reported once more (at least once beats never for failures).
Metric: `nodewright_notifications_total{sink, event, result}` with result sent, failed, dropped or
duplicate.

Payloads: `json` is `{"event", "nodewright", "compartment", "node", "message", "time", "key"}`;
`slack` is `{"text": "..."}`, the body Slack- and Mattermost-compatible incoming webhooks accept.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import structlog

from nodewright.api.models import NodeWright, NodeWrightStatus, NotificationEvent, NotificationFormat, Status
from nodewright.kube.resources import SECRETS, ApiError, NotFound
from nodewright.observability import events, heap
from nodewright.observability.events import EventSpec
from nodewright.plan.podspec import parse_duration_seconds
from nodewright.plan.revisions import UndoHint
from nodewright.plan.rollout import Phase, RolloutNode, RolloutPlan, phase_of

log = structlog.get_logger("nodewright.notify")

QUEUE_SIZE = 256
"""Notices waiting per sink (its own queue: a slow sink fills only its own)."""
REQUEST_TIMEOUT = 10.0
"""Seconds per attempt: the Secret read and the POST (connect, send, answer) together."""
ATTEMPTS = 5
BACKOFF = 1.0
MAX_BACKOFF = 30.0
BREAKER_THRESHOLD = 5
"""Consecutive attempts that found a sink unavailable before its circuit opens (one notice's retries)."""
BREAKER_OPEN = 30.0
"""Seconds the circuit stays open the first time; doubled after every failed probe."""
BREAKER_MAX_OPEN = 600.0
SHUTDOWN_GRACE = 5.0
"""Seconds `close` (and a removed sink's worker) keeps delivering what is queued before dropping it."""
DROP_REPORT_INTERVAL = 60.0
"""At most one Warning Event and log line per sink, drop reason and NodeWright in this many seconds."""
MAX_REPORT_KEYS = 1024
REMEMBERED_KEYS = 10_000
CLUSTER_SINK = "cluster"

SENT, FAILED, DROPPED, DUPLICATE = "sent", "failed", "dropped", "duplicate"
RESULTS = (SENT, FAILED, DROPPED, DUPLICATE)


class DropReason(StrEnum):
    """Why a sink will never get a notice (the metric's `reason` label)."""

    QUEUE_FULL = "queue_full"
    CIRCUIT_OPEN = "circuit_open"
    SHUTDOWN = "shutdown"
    REMOVED = "removed"


DROP_MEANING: dict[DropReason, str] = {
    DropReason.QUEUE_FULL: f"its queue is full ({QUEUE_SIZE} waiting): the webhook answers slower than"
    " notices come",
    DropReason.CIRCUIT_OPEN: "the webhook is unavailable (its circuit breaker is open) and its queue is full",
    DropReason.SHUTDOWN: f"still queued when the operator stopped ({SHUTDOWN_GRACE:g} s grace)",
    DropReason.REMOVED: "the sink was removed from spec.notifications (or its NodeWright deleted)",
}


class Circuit(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class Notice:
    event: NotificationEvent
    nodewright: str
    message: str
    key: str
    """What the notice is about; the same key is sent to a sink once."""
    time: str
    compartment: str | None = None
    node: str | None = None


@dataclass(frozen=True, slots=True)
class Sink:
    """Where notices go: `name` is `<nodewright>/<sink>` for a NodeWright's sinks, or `cluster`."""

    name: str
    secret: str
    key: str
    format: NotificationFormat = NotificationFormat.JSON
    events: frozenset[NotificationEvent] | None = None
    drain_blocked_after: float = 900.0

    def wants(self, event: NotificationEvent) -> bool:
        return self.events is None or event in self.events


def sinks_of(model: NodeWright, cluster: Sink | None) -> list[Sink]:
    """The sinks told about `model`: its own, then the cluster-wide one."""
    out = [
        Sink(
            name=f"{model.metadata.name}/{sink.name}",
            secret=sink.url_secret_ref.name,
            key=sink.url_secret_ref.key,
            format=sink.format,
            events=frozenset(sink.events) if sink.events is not None else None,
            drain_blocked_after=parse_duration_seconds(sink.drain_blocked_after),
        )
        for sink in model.spec.notifications or ()
    ]
    return out + ([cluster] if cluster is not None else [])


def parse_cluster_sink(secret_ref: str | None, fmt: str, events: str | None = None) -> Sink | None:
    """`--notify-url-secret NAME/KEY` (and `--notify-format`, `--notify-events A,B`) as a Sink."""
    if not secret_ref:
        return None
    name, sep, key = secret_ref.partition("/")
    if not sep or not name or not key or "/" in key:
        raise ValueError(
            f"--notify-url-secret {secret_ref!r}: expected SECRET/KEY (a Secret of the operator's namespace)"
        )
    try:
        format_ = NotificationFormat(fmt)
    except ValueError:
        raise ValueError(f"--notify-format {fmt!r}: expected json or slack") from None
    wanted: frozenset[NotificationEvent] | None = None
    if events:
        try:
            wanted = frozenset(NotificationEvent(e.strip()) for e in events.split(",") if e.strip())
        except ValueError as exc:
            choices = ", ".join(e.value for e in NotificationEvent)
            raise ValueError(f"--notify-events {events!r}: {exc}; choose from {choices}") from None
    return Sink(CLUSTER_SINK, name, key, format_, wanted)


def payload(notice: Notice, fmt: NotificationFormat) -> dict[str, Any]:
    if fmt is NotificationFormat.SLACK:
        where = "".join(
            part
            for part in (
                f" compartment {notice.compartment}" if notice.compartment else "",
                f" node {notice.node}" if notice.node else "",
            )
        )
        return {"text": f"[NodeWright {notice.nodewright}] {notice.event.value}{where}: {notice.message}"}
    return {
        "event": notice.event.value,
        "nodewright": notice.nodewright,
        "compartment": notice.compartment,
        "node": notice.node,
        "message": notice.message,
        "time": notice.time,
        "key": notice.key,
    }


class DeliveryError(Exception):
    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


Poster = Callable[[str, dict[str, Any]], Awaitable[None]]


async def post_json(url: str, body: dict[str, Any]) -> None:
    """One POST with a deadline; DeliveryError(retry=...) on anything but a 2xx answer."""
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(url, json=body, allow_redirects=False, ssl=heap.system_tls_context()) as response,
        ):
            if 200 <= response.status < 300:
                return
            text = (await response.text(errors="replace"))[:200]
            retry = response.status == 429 or response.status >= 500
            raise DeliveryError(f"HTTP {response.status}: {text}", retry=retry)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise DeliveryError(f"{type(exc).__name__}: {exc}"[:300], retry=True) from exc


@dataclass(slots=True)
class CircuitBreaker:
    """One sink's circuit breaker (module docstring); pure: the time is passed in.

    `wait(now)` says how long to wait before the next attempt (0: go; an open circuit whose period has
    passed turns half-open and lets one probe through); the outcome of every attempt is reported with
    `record`."""

    threshold: int = BREAKER_THRESHOLD
    open_for: float = BREAKER_OPEN
    max_open_for: float = BREAKER_MAX_OPEN
    state: Circuit = Circuit.CLOSED
    failures: int = 0
    """Consecutive attempts that found the sink unavailable."""
    period: float = 0.0
    reopen_at: float = 0.0

    def wait(self, now: float) -> float:
        if self.state is Circuit.OPEN:
            if now < self.reopen_at:
                return self.reopen_at - now
            self.state = Circuit.HALF_OPEN
        return 0.0

    def record(self, *, available: bool, now: float) -> None:
        if available:
            self.state, self.failures, self.period = Circuit.CLOSED, 0, 0.0
            return
        self.failures += 1
        if self.state is Circuit.HALF_OPEN or self.failures >= self.threshold:
            first = self.state is Circuit.CLOSED
            self.period = self.open_for if first else min(self.max_open_for, self.period * 2)
            self.state = Circuit.OPEN
            self.reopen_at = now + self.period


class NotifyMetrics(Protocol):
    """What the notifier reports (`observability.metrics.OperatorMetrics` implements it)."""

    def count_notification(self, sink: str, event: str, result: str) -> None: ...
    def init_notification_sink(self, sink: str, reasons: Iterable[str]) -> None: ...
    def count_notification_dropped(self, sink: str, reason: str) -> None: ...
    def set_notification_queue(self, sink: str, depth: int) -> None: ...
    def set_notification_circuit(self, sink: str, state: str) -> None: ...
    def forget_notification_sink(self, sink: str) -> None: ...


class NoMetrics:
    """`NotifyMetrics` that record nothing (tests, tools)."""

    def count_notification(self, sink: str, event: str, result: str) -> None:
        pass

    def init_notification_sink(self, sink: str, reasons: Iterable[str]) -> None:
        pass

    def count_notification_dropped(self, sink: str, reason: str) -> None:
        pass

    def set_notification_queue(self, sink: str, depth: int) -> None:
        pass

    def set_notification_circuit(self, sink: str, state: str) -> None:
        pass

    def forget_notification_sink(self, sink: str) -> None:
        pass


Warn = Callable[[str, EventSpec], Awaitable[None]]
"""Records a Warning Event on the NodeWright named (the operator's event recorder)."""


async def _no_warning(_nodewright: str, _spec: EventSpec) -> None:
    return None


@dataclass(eq=False)
class _SinkWorker:
    """One sink: its queue, its breaker and the task delivering from the queue."""

    sink: Sink
    queue: asyncio.Queue[Notice]
    breaker: CircuitBreaker
    task: asyncio.Task[None] | None = None
    current: Notice | None = None
    """The notice being delivered (not in the queue any more, not delivered yet)."""


class Notifier:
    """Per-sink queues, workers and circuit breakers (module docstring)."""

    def __init__(
        self,
        client: Any,
        namespace: str,
        *,
        metrics: NotifyMetrics | None = None,
        warn: Warn = _no_warning,
        post: Poster = post_json,
        queue_size: int = QUEUE_SIZE,
        attempts: int = ATTEMPTS,
        backoff: float = BACKOFF,
        breaker: Callable[[], CircuitBreaker] = CircuitBreaker,
        grace: float = SHUTDOWN_GRACE,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self._metrics: NotifyMetrics = metrics or NoMetrics()
        self._warn = warn
        self._post = post
        self._queue_size = queue_size
        self._attempts = attempts
        self._backoff = backoff
        self._breaker = breaker
        self._grace = grace
        self._sleep = sleep
        self._clock = clock
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._sinks: dict[str, _SinkWorker] = {}
        self._retiring: dict[_SinkWorker, asyncio.Task[None]] = {}
        self._reported: dict[tuple[str, DropReason, str], float] = {}
        self._unreported: Counter[tuple[str, DropReason, str]] = Counter()
        self._background: set[asyncio.Task[None]] = set()
        self._closing = False

    # -- intake (a rollout pass) -------------------------------------------------------------------

    def notify(self, notice: Notice, sinks: Iterable[Sink]) -> None:
        """Queue `notice` for every sink that wants it; never waits (a full queue drops and counts)."""
        for sink in sinks:
            if not sink.wants(notice.event):
                continue
            seen = (sink.name, notice.key)
            if seen in self._seen:
                self._metrics.count_notification(sink.name, notice.event.value, DUPLICATE)
                continue
            if self._closing:
                self._drop_soon(sink.name, [notice], DropReason.SHUTDOWN)
                continue
            worker = self._worker(sink)
            try:
                worker.queue.put_nowait(notice)
            except asyncio.QueueFull:
                closed = worker.breaker.state is Circuit.CLOSED
                self._drop_soon(
                    sink.name, [notice], DropReason.QUEUE_FULL if closed else DropReason.CIRCUIT_OPEN
                )
                continue
            self._metrics.set_notification_queue(sink.name, worker.queue.qsize())
            self._remember(seen)

    def keep(self, nodewright: str, sinks: Iterable[str]) -> None:
        """Retire the workers of `nodewright`'s own sinks not named in `sinks` (removed from its spec; none
        when it is gone): they take no more notices and stop once their queue is delivered or after the
        grace (`SHUTDOWN_GRACE`), dropping what is left (reason removed)."""
        wanted, prefix = set(sinks), f"{nodewright}/"
        for name in [n for n in self._sinks if n.startswith(prefix) and n not in wanted]:
            worker = self._sinks.pop(name)
            task = asyncio.create_task(self._retire(worker), name=f"notify-retire-{name}")
            self._retiring[worker] = task
            log.info("notification sink removed; stopping its worker", sink=name)

    def circuit(self, sink: str) -> Circuit | None:
        """The circuit state of a sink (None: no worker for it)."""
        worker = self._sinks.get(sink)
        return worker.breaker.state if worker is not None else None

    def _remember(self, seen: tuple[str, str]) -> None:
        self._seen[seen] = None
        while len(self._seen) > REMEMBERED_KEYS:
            self._seen.popitem(last=False)

    def _worker(self, sink: Sink) -> _SinkWorker:
        """The sink's worker, started on its first notice; a new destination resets its breaker."""
        worker = self._sinks.get(sink.name)
        if worker is None:
            worker = _SinkWorker(sink, asyncio.Queue(maxsize=self._queue_size), self._breaker())
            self._sinks[sink.name] = worker
            self._metrics.init_notification_sink(sink.name, (r.value for r in DropReason))
        elif worker.sink != sink:
            if (worker.sink.secret, worker.sink.key) != (sink.secret, sink.key):
                worker.breaker = self._breaker()
                self._metrics.set_notification_circuit(sink.name, Circuit.CLOSED.value)
            worker.sink = sink  # queued notices go out in the current format
        if worker.task is None or worker.task.done():
            worker.task = asyncio.create_task(self._run(worker), name=f"notify-{sink.name}")
        return worker

    # -- shutdown --------------------------------------------------------------------------------------

    async def join(self) -> None:
        """Wait until every queued notice was delivered or given up (tests)."""
        await asyncio.gather(*(w.queue.join() for w in [*self._sinks.values(), *self._retiring]))

    async def close(self, *, grace: float | None = None) -> None:
        """Deliver what is queued for at most `grace` seconds (default: the notifier's), then stop every
        worker; what is left is dropped (reason shutdown) and reported before this returns (close the
        event recorder after this)."""
        grace = self._grace if grace is None else grace
        self._closing = True
        workers = list(self._sinks.values())
        self._sinks.clear()
        retiring = asyncio.gather(*self._retiring.values(), return_exceptions=True)  # own grace each
        await asyncio.gather(self._stop(workers, grace, DropReason.SHUTDOWN), retiring)
        await asyncio.gather(*self._background, return_exceptions=True)

    async def _retire(self, worker: _SinkWorker) -> None:
        try:
            await self._stop([worker], self._grace, DropReason.REMOVED)
        finally:
            self._retiring.pop(worker, None)
            if worker.sink.name not in self._sinks:  # not added back meanwhile
                self._metrics.forget_notification_sink(worker.sink.name)
                self._forget_reports(worker.sink.name)

    async def _stop(self, workers: Sequence[_SinkWorker], grace: float, reason: DropReason) -> None:
        """Let `workers` deliver for at most `grace` seconds, stop them, drop what is left."""
        busy = [
            w
            for w in workers
            if w.task is not None and not w.task.done() and (w.current is not None or not w.queue.empty())
        ]
        if busy and grace > 0:
            joins = [asyncio.create_task(w.queue.join()) for w in busy]
            await asyncio.wait(joins, timeout=grace)
            for join in joins:
                join.cancel()
            await asyncio.gather(*joins, return_exceptions=True)
        tasks = [w.task for w in workers if w.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for worker in workers:
            left = []
            if worker.current is not None:
                left.append(worker.current)
                worker.current = None
                worker.queue.task_done()
            while not worker.queue.empty():
                left.append(worker.queue.get_nowait())
                worker.queue.task_done()
            if left:
                await self._drop(worker.sink.name, left, reason)

    # -- drops ---------------------------------------------------------------------------------------

    def _drop_soon(self, sink: str, notices: Sequence[Notice], reason: DropReason) -> None:
        """`_drop` from synchronous code: counted now, reported in the background."""
        due = self._count_drops(sink, notices, reason)
        if due:
            task = asyncio.create_task(self._report_drops(sink, reason, due))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _drop(self, sink: str, notices: Sequence[Notice], reason: DropReason) -> None:
        await self._report_drops(sink, reason, self._count_drops(sink, notices, reason))

    def _count_drops(self, sink: str, notices: Sequence[Notice], reason: DropReason) -> list[tuple[str, int]]:
        """Count `notices` as dropped; (NodeWright, drops since its last report) for each NodeWright due
        a report (at most one per sink, reason and NodeWright every `DROP_REPORT_INTERVAL`)."""
        for notice in notices:
            self._metrics.count_notification(sink, notice.event.value, DROPPED)
            self._metrics.count_notification_dropped(sink, reason.value)
            self._unreported[(sink, reason, notice.nodewright)] += 1
        now = self._clock()
        if len(self._reported) > MAX_REPORT_KEYS:
            self._reported = {k: t for k, t in self._reported.items() if now - t < DROP_REPORT_INTERVAL}
        due = []
        for nodewright in sorted({n.nodewright for n in notices}):
            key = (sink, reason, nodewright)
            last = self._reported.get(key)
            if last is None or now - last >= DROP_REPORT_INTERVAL:
                self._reported[key] = now
                due.append((nodewright, self._unreported.pop(key, 0)))
        return due

    async def _report_drops(self, sink: str, reason: DropReason, due: Sequence[tuple[str, int]]) -> None:
        """One log line and one Warning Event per NodeWright (the Event's message does not change, so
        the recorder counts repeats up in one Event)."""
        spec = events.notifications_dropped(sink, reason.value, DROP_MEANING[reason])
        for nodewright, dropped in due:
            # `dropped`: since the previous line for this sink, reason and NodeWright.
            log.warning(
                "notifications dropped",
                sink=sink,
                reason=reason.value,
                nodewright=nodewright,
                dropped=dropped,
            )
            try:
                await self._warn(nodewright, spec)
            except Exception as exc:  # an Event is best effort; the metric has the count
                log.warning("notifications dropped: event not recorded", sink=sink, error=repr(exc))

    def _forget_reports(self, sink: str) -> None:
        for key in [k for k in self._reported if k[0] == sink]:
            del self._reported[key]
        for key in [k for k in self._unreported if k[0] == sink]:
            del self._unreported[key]

    # -- delivery --------------------------------------------------------------------------------------

    async def _run(self, worker: _SinkWorker) -> None:
        while True:
            notice = await worker.queue.get()
            worker.current = notice
            try:
                await self._deliver(worker, notice)
            except asyncio.CancelledError:
                raise  # `_stop` counts `current` as dropped
            except Exception as exc:  # a worker must survive anything one delivery does
                self._metrics.count_notification(worker.sink.name, notice.event.value, FAILED)
                log.error("notification delivery crashed", sink=worker.sink.name, error=repr(exc))
            worker.current = None
            worker.queue.task_done()
            self._metrics.set_notification_queue(worker.sink.name, worker.queue.qsize())

    async def _deliver(self, worker: _SinkWorker, notice: Notice) -> None:
        error = "not attempted"
        for attempt in range(self._attempts):
            if attempt and worker.breaker.state is Circuit.CLOSED:
                delay = min(MAX_BACKOFF, self._backoff * 2 ** (attempt - 1)) * random.uniform(0.8, 1.2)
                await self._sleep(delay)
            await self._until_closed(worker)
            sink = worker.sink
            try:
                await self._attempt(sink, payload(notice, sink.format))
            except DeliveryError as exc:
                error = str(exc)
                self._record(worker, available=not exc.retry)
                if exc.retry:
                    continue
                break
            self._record(worker, available=True)
            self._metrics.count_notification(sink.name, notice.event.value, SENT)
            log.info("notification sent", sink=sink.name, notice=notice.event.value, key=notice.key)
            return
        self._metrics.count_notification(worker.sink.name, notice.event.value, FAILED)
        log.warning(
            "notification not delivered",
            sink=worker.sink.name,
            notice=notice.event.value,
            key=notice.key,
            error=error,
        )

    async def _attempt(self, sink: Sink, body: dict[str, Any]) -> None:
        """One attempt within `REQUEST_TIMEOUT`: read the URL, POST."""
        deadline = REQUEST_TIMEOUT  # read now: tests lengthen it
        try:
            async with asyncio.timeout(deadline):
                url = await self._url(sink)
                await self._post(url, body)
        except TimeoutError:
            raise DeliveryError(f"no answer within {deadline:g} s", retry=True) from None

    async def _until_closed(self, worker: _SinkWorker) -> None:
        """Wait while the sink's circuit is open (it then turns half-open: the next attempt probes)."""
        while True:
            before = worker.breaker.state
            wait = worker.breaker.wait(self._clock())
            self._transition(worker, before)
            if wait <= 0:
                return
            await self._sleep(wait)

    def _record(self, worker: _SinkWorker, *, available: bool) -> None:
        before = worker.breaker.state
        worker.breaker.record(available=available, now=self._clock())
        self._transition(worker, before)

    def _transition(self, worker: _SinkWorker, before: Circuit) -> None:
        breaker, name = worker.breaker, worker.sink.name
        if breaker.state is before:
            return
        self._metrics.set_notification_circuit(name, breaker.state.value)
        if breaker.state is Circuit.OPEN:
            log.warning(
                "notification sink unavailable: circuit open",
                sink=name,
                failures=breaker.failures,
                retry_in_seconds=breaker.period,
                queued=worker.queue.qsize(),
            )
        elif breaker.state is Circuit.HALF_OPEN:
            log.info("notification sink circuit half-open: probing", sink=name)
        else:
            log.info("notification sink available again: circuit closed", sink=name)

    async def _url(self, sink: Sink) -> str:
        """The sink's URL, read from its Secret now (a rotated URL is used at once)."""
        where = f"Secret {self.namespace}/{sink.secret} key {sink.key!r}"
        try:
            secret = await self.client.get(SECRETS, sink.secret, namespace=self.namespace)
        except NotFound:
            raise DeliveryError(f"{where} not found: create it with the webhook URL", retry=False) from None
        except ApiError as exc:
            forbidden = exc.status == 403
            hint = " (list it in the chart's notifications.secretNames)" if forbidden else ""
            raise DeliveryError(f"reading {where}: {exc}{hint}"[:300], retry=not forbidden) from exc
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise DeliveryError(f"reading {where}: {exc!r}"[:300], retry=True) from exc
        raw = (secret.get("data") or {}).get(sink.key)
        if raw is None:
            raise DeliveryError(f"{where} is missing", retry=False)
        with contextlib.suppress(ValueError):
            url = base64.b64decode(raw).decode().strip()
            parts = urlsplit(url)
            if parts.scheme in ("http", "https") and parts.netloc:
                return url
        raise DeliveryError(f"{where} does not hold an http(s) URL", retry=False)


def drain_blocked_due(sinks: Sequence[Sink], blocked_for: float) -> list[Sink]:
    """The sinks whose `drainBlockedAfter` a drain blocked for `blocked_for` seconds has passed."""
    return [s for s in sinks if blocked_for >= s.drain_blocked_after]


# ----------------------------------------------------------------------------------------------------
# What a rollout pass tells the sinks


@dataclass(frozen=True, slots=True)
class _Pass:
    """One rollout pass of one NodeWright, as the notices it gives (`RolloutNotifications.after_pass`)."""

    notifier: Notifier
    name: str
    sinks: Sequence[Sink]
    now: datetime
    fingerprint: str
    plan: RolloutPlan
    ours: Sequence[RolloutNode]  # nodes admitted for the current spec
    persisted: NodeWrightStatus | None
    conditions: Mapping[str, str]
    rollout_key: str = ""  # names the rollout in the keys (`RolloutEpoch.key`); "" the fingerprint
    undo: UndoHint | None = None  # the revision a halt names with the command that restores it

    @property
    def rollout(self) -> str:
        return self.rollout_key or self.fingerprint

    def send(
        self,
        event: NotificationEvent,
        message: str,
        key: str,
        *,
        compartment: str | None = None,
        node: str | None = None,
        to: Sequence[Sink] | None = None,
    ) -> None:
        stamp = self.now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        notice = Notice(event, self.name, message, key, stamp, compartment=compartment, node=node)
        self.notifier.notify(notice, self.sinks if to is None else to)

    def started(self) -> None:
        if self.plan.admissions and not self.ours:
            self.send(
                NotificationEvent.ROLLOUT_STARTED,
                f"rollout started: {len(self.plan.admissions)} node(s) admitted into the first batch(es)",
                f"{self.name}/{self.rollout}/started",
            )

    def batches_settled(self) -> None:
        for cname, cplan in sorted(self.plan.compartments.items()):
            outcome = cplan.batch_evaluated
            if outcome is None or not outcome.evaluated:
                continue
            number = outcome.state.current_batch - 1
            members = [
                n
                for n in self.ours
                if n.admission and n.admission.compartment == cname and n.admission.batch == number
            ]
            failed = sum(phase_of(n, fingerprint=self.fingerprint) is Phase.FAILED for n in members)
            verdict = "failed" if outcome.failed else "succeeded"
            self.send(
                NotificationEvent.BATCH_SETTLED,
                f"batch {number} of compartment {cname!r} settled and {verdict}:"
                f" {len(members) - failed} succeeded, {failed} failed",
                f"{self.name}/{self.rollout}/{cname}/batch/{number}",
                compartment=cname,
            )

    def halts(self) -> None:
        before = (self.persisted.compartment_statuses or {}) if self.persisted is not None else {}
        for halt in self.plan.halts:
            previous = before.get(halt.compartment)
            if previous is not None and previous.halted:
                continue  # halted before this pass (also before a restart): told then
            batch = previous.batch_state.current_batch if previous and previous.batch_state else 0
            self.send(
                NotificationEvent.COMPARTMENT_HALTED,
                f"{halt.message}; {self.undo.sentence}" if self.undo is not None else halt.message,
                f"{self.name}/{self.rollout}/{halt.compartment}/halted/{batch}",
                compartment=halt.compartment,
            )

    def failed_nodes(self) -> None:
        for node in self.ours:
            if phase_of(node, fingerprint=self.fingerprint) is Phase.FAILED and node.admission is not None:
                self.send(
                    NotificationEvent.NODE_FAILED,
                    self.conditions.get(node.name) or "attempts exhausted",
                    f"{self.name}/{self.rollout}/{node.name}/failed/{node.admission.at}",
                    compartment=node.admission.compartment,
                    node=node.name,
                )

    def completed(self, status: Status | None) -> None:
        old = self.persisted.status if self.persisted is not None else None
        if status is Status.COMPLETE and old is not Status.COMPLETE:
            total = sum(c.status.matched for c in self.plan.compartments.values())
            self.send(
                NotificationEvent.ROLLOUT_COMPLETED,
                f"rollout complete on {total} node(s)",
                f"{self.name}/{self.rollout}/complete",
            )


class RolloutNotifications:
    """Derives a rollout pass's notices (module docstring) and hands them to the `Notifier`."""

    def __init__(self, notifier: Notifier, cluster_sink: Sink | None = None) -> None:
        self.notifier = notifier
        self.cluster_sink = cluster_sink
        self._drain_since: dict[tuple[str, str], datetime] = {}

    def forget(self, nodewright: str) -> None:
        """`nodewright` is gone or has no sinks: forget its drain clocks, retire its sinks' workers."""
        for key in [k for k in self._drain_since if k[0] == nodewright]:
            del self._drain_since[key]
        self.notifier.keep(nodewright, ())

    def after_pass(
        self,
        model: NodeWright,
        plan: RolloutPlan,
        status: Status | None,
        nodes: Sequence[RolloutNode],
        *,
        fingerprint: str,
        now: datetime,
        conditions: Mapping[str, str],
        drain_blocked: Iterable[str],
        rollout_key: str = "",
        undo: UndoHint | None = None,
    ) -> None:
        """`conditions`: node -> its NodeWright condition's message; `drain_blocked`: admitted nodes whose
        drain cannot progress now (an eviction refused, or the drain timeout passed); `rollout_key`
        names the rollout in the notices' keys (`plan.rollout_epoch.RolloutEpoch.key`; default the
        fingerprint), so a spec that comes back is told about again; `undo`, the revision before the
        current spec, is named in a halt's notice with the command that restores it."""
        name = model.metadata.name
        sinks = sinks_of(model, self.cluster_sink)
        if not sinks:
            self.forget(name)
            return
        self.notifier.keep(name, (s.name for s in sinks))
        ours = tuple(n for n in nodes if n.admission is not None and n.admission.fingerprint == fingerprint)
        told = _Pass(
            self.notifier,
            name,
            sinks,
            now,
            fingerprint,
            plan,
            ours,
            model.status,
            conditions,
            rollout_key=rollout_key,
            undo=undo,
        )
        told.started()
        told.batches_settled()
        told.halts()
        told.failed_nodes()
        self._drain_blocked(told, nodes, set(drain_blocked))
        told.completed(status)

    def _drain_blocked(self, told: _Pass, nodes: Sequence[RolloutNode], blocked: set[str]) -> None:
        """Nodes whose drain stays blocked longer than a sink's `drainBlockedAfter` (timed from the first
        pass that found them blocked)."""
        name, now = told.name, told.now
        admitted = {n.name: n.admission for n in nodes if n.admission is not None}
        for key in [k for k in self._drain_since if k[0] == name and k[1] not in blocked]:
            del self._drain_since[key]
        for node_name in sorted(blocked):
            since = self._drain_since.setdefault((name, node_name), now)
            due = drain_blocked_due(told.sinks, (now - since).total_seconds())
            adm = admitted.get(node_name)
            if due:
                minutes = int((now - since).total_seconds() // 60)
                why = told.conditions.get(node_name) or "eviction refused"
                told.send(
                    NotificationEvent.DRAIN_BLOCKED,
                    f"drain blocked for {minutes} min: {why}",
                    f"{name}/{node_name}/drain-blocked/{adm.at if adm else ''}",
                    compartment=adm.compartment if adm else None,
                    node=node_name,
                    to=due,
                )
