"""Notifications: rollout events posted to HTTP webhooks, in the background, never blocking a reconcile.

Sinks come from two places: each NodeWright's `spec.notifications`, and one cluster-wide sink named by
the operator flags `--notify-url-secret NAME/KEY` and `--notify-format json|slack` (told about every
NodeWright). A sink's URL is a credential (whoever has it may post to the channel), so it lives in a
Secret of the operator's namespace; the chart grants `get` on the Secrets it lists
(`notifications.secretNames`) and on no other, so a NodeWright cannot make the operator read an arbitrary
Secret.

The rollout controller derives events from its pass (`controller.rollout`): RolloutStarted,
BatchSettled, NodeFailed, CompartmentHalted, DrainBlocked (a node's drain blocked for longer than the
sink's `drainBlockedAfter`) and RolloutCompleted, each with a key naming what it is about (NodeWright,
spec fingerprint, compartment, batch, node, admission). `Notifier.notify` only puts the notice into a
bounded queue (full: the notice is dropped and counted, the reconcile goes on) and returns; worker tasks
read the URL from the Secret and POST the payload with a deadline per request (`REQUEST_TIMEOUT`),
retrying connection errors, timeouts, 429 and 5xx with exponential backoff (`ATTEMPTS`); another 4xx or
an unusable URL fails at once. A key is sent to a sink once per operator process (the most recent keys
are remembered); halts, starts and completions are detected against the persisted status, so a restart
does not repeat them, while a node still failing after a restart is reported once more (at least once
beats never for failures). Metric: `nodewright_notifications_total{sink, event, result}` with result
sent, failed, dropped or duplicate.

Payloads: `json` is `{"event", "nodewright", "compartment", "node", "message", "time", "key"}`;
`slack` is `{"text": "..."}`, the body Slack- and Mattermost-compatible incoming webhooks accept.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import structlog

from nodewright.api.models import NodeWright, NotificationEvent, NotificationFormat, Status
from nodewright.kube.resources import SECRETS, ApiError, NotFound
from nodewright.plan.podspec import parse_duration_seconds
from nodewright.plan.rollout import Phase, RolloutNode, RolloutPlan, phase_of

log = structlog.get_logger("nodewright.notify")

QUEUE_SIZE = 256
WORKERS = 2
REQUEST_TIMEOUT = 10.0
"""Seconds per POST (connect, send, answer); the Secret read has the client's own deadline."""
ATTEMPTS = 5
BACKOFF = 1.0
MAX_BACKOFF = 30.0
REMEMBERED_KEYS = 10_000
CLUSTER_SINK = "cluster"

SENT, FAILED, DROPPED, DUPLICATE = "sent", "failed", "dropped", "duplicate"
RESULTS = (SENT, FAILED, DROPPED, DUPLICATE)


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
            session.post(url, json=body, allow_redirects=False) as response,
        ):
            if 200 <= response.status < 300:
                return
            text = (await response.text(errors="replace"))[:200]
            retry = response.status == 429 or response.status >= 500
            raise DeliveryError(f"HTTP {response.status}: {text}", retry=retry)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise DeliveryError(f"{type(exc).__name__}: {exc}"[:300], retry=True) from exc


@dataclass(frozen=True, slots=True)
class _Item:
    notice: Notice
    sink: Sink


class Notifier:
    """The bounded queue and its delivery workers (module docstring)."""

    def __init__(
        self,
        client: Any,
        namespace: str,
        *,
        count: Callable[[str, str, str], None] = lambda sink, event, result: None,
        post: Poster = post_json,
        queue_size: int = QUEUE_SIZE,
        attempts: int = ATTEMPTS,
        backoff: float = BACKOFF,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self._count = count
        self._post = post
        self._queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=queue_size)
        self._attempts = attempts
        self._backoff = backoff
        self._sleep = sleep
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._workers: list[asyncio.Task[None]] = []

    def notify(self, notice: Notice, sinks: Iterable[Sink]) -> None:
        """Queue `notice` for every sink that wants it; never waits (a full queue drops and counts)."""
        for sink in sinks:
            if not sink.wants(notice.event):
                continue
            seen = (sink.name, notice.key)
            if seen in self._seen:
                self._count(sink.name, notice.event.value, DUPLICATE)
                continue
            try:
                self._queue.put_nowait(_Item(notice, sink))
            except asyncio.QueueFull:
                self._count(sink.name, notice.event.value, DROPPED)
                log.warning("notification queue full; dropped", sink=sink.name, key=notice.key)
                continue
            self._remember(seen)
            self._start()

    def sent_before(self, sink: Sink, key: str) -> bool:
        return (sink.name, key) in self._seen

    def _remember(self, seen: tuple[str, str]) -> None:
        self._seen[seen] = None
        while len(self._seen) > REMEMBERED_KEYS:
            self._seen.popitem(last=False)

    def _start(self) -> None:
        self._workers = [t for t in self._workers if not t.done()]
        while len(self._workers) < WORKERS:
            self._workers.append(asyncio.create_task(self._work(), name=f"notify-{len(self._workers)}"))

    async def join(self) -> None:
        """Wait until every queued notice was delivered or given up (tests, shutdown)."""
        await self._queue.join()

    async def close(self) -> None:
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []

    async def _work(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                await self._deliver(item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a worker must survive anything one delivery does
                self._count(item.sink.name, item.notice.event.value, FAILED)
                log.error("notification delivery crashed", sink=item.sink.name, error=repr(exc))
            finally:
                self._queue.task_done()

    async def _deliver(self, item: _Item) -> None:
        sink, notice = item.sink, item.notice
        body = payload(notice, sink.format)
        error = "not attempted"
        for attempt in range(self._attempts):
            if attempt:
                delay = min(MAX_BACKOFF, self._backoff * 2 ** (attempt - 1)) * random.uniform(0.8, 1.2)
                await self._sleep(delay)
            try:
                url = await self._url(sink)
                await self._post(url, body)
            except DeliveryError as exc:
                error = str(exc)
                if exc.retry:
                    continue
                break
            self._count(sink.name, notice.event.value, SENT)
            log.info("notification sent", sink=sink.name, notice=notice.event.value, key=notice.key)
            return
        self._count(sink.name, notice.event.value, FAILED)
        log.warning(
            "notification not delivered",
            sink=sink.name,
            notice=notice.event.value,
            key=notice.key,
            error=error,
        )

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


class RolloutNotifications:
    """Derives a rollout pass's notices (module docstring) and hands them to the `Notifier`."""

    def __init__(self, notifier: Notifier, cluster_sink: Sink | None = None) -> None:
        self.notifier = notifier
        self.cluster_sink = cluster_sink
        self._drain_since: dict[tuple[str, str], datetime] = {}

    def forget(self, nodewright: str) -> None:
        for key in [k for k in self._drain_since if k[0] == nodewright]:
            del self._drain_since[key]

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
    ) -> None:
        """`conditions`: node -> its NodeWright condition's message; `drain_blocked`: admitted nodes whose
        drain cannot progress now (an eviction refused, or the drain timeout passed)."""
        name = model.metadata.name
        sinks = sinks_of(model, self.cluster_sink)
        blocked = set(drain_blocked)
        if not sinks:
            self.forget(name)
            return
        stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        def send(
            event: NotificationEvent,
            message: str,
            key: str,
            *,
            compartment: str | None = None,
            node: str | None = None,
            to: Sequence[Sink] = sinks,
        ) -> None:
            notice = Notice(event, name, message, key, stamp, compartment=compartment, node=node)
            self.notifier.notify(notice, to)

        persisted = model.status
        ours = [n for n in nodes if n.admission is not None and n.admission.fingerprint == fingerprint]
        if plan.admissions and not ours:
            count = len(plan.admissions)
            send(
                NotificationEvent.ROLLOUT_STARTED,
                f"rollout started: {count} node(s) admitted into the first batch(es)",
                f"{name}/{fingerprint}/started",
            )
        for cname, cplan in sorted(plan.compartments.items()):
            outcome = cplan.batch_evaluated
            if outcome is not None and outcome.evaluated:
                number = outcome.state.current_batch - 1
                members = [
                    n
                    for n in ours
                    if n.admission and n.admission.compartment == cname and n.admission.batch == number
                ]
                failed = sum(phase_of(n, fingerprint=fingerprint) is Phase.FAILED for n in members)
                verdict = "failed" if outcome.failed else "succeeded"
                send(
                    NotificationEvent.BATCH_SETTLED,
                    f"batch {number} of compartment {cname!r} settled and {verdict}:"
                    f" {len(members) - failed} succeeded, {failed} failed",
                    f"{name}/{fingerprint}/{cname}/batch/{number}",
                    compartment=cname,
                )
        before = (persisted.compartment_statuses or {}) if persisted is not None else {}
        for halt in plan.halts:
            previous = before.get(halt.compartment)
            if previous is not None and previous.halted:
                continue  # halted before this pass (also before a restart): told then
            batch = previous.batch_state.current_batch if previous and previous.batch_state else 0
            send(
                NotificationEvent.COMPARTMENT_HALTED,
                halt.message,
                f"{name}/{fingerprint}/{halt.compartment}/halted/{batch}",
                compartment=halt.compartment,
            )
        for node in ours:
            if phase_of(node, fingerprint=fingerprint) is Phase.FAILED and node.admission is not None:
                send(
                    NotificationEvent.NODE_FAILED,
                    conditions.get(node.name) or "attempts exhausted",
                    f"{name}/{fingerprint}/{node.name}/failed/{node.admission.at}",
                    compartment=node.admission.compartment,
                    node=node.name,
                )
        admitted = {n.name: n.admission for n in nodes if n.admission is not None}
        for key in [k for k in self._drain_since if k[0] == name and k[1] not in blocked]:
            del self._drain_since[key]
        for node_name in sorted(blocked):
            since = self._drain_since.setdefault((name, node_name), now)
            due = drain_blocked_due(sinks, (now - since).total_seconds())
            adm = admitted.get(node_name)
            if due:
                minutes = int((now - since).total_seconds() // 60)
                send(
                    NotificationEvent.DRAIN_BLOCKED,
                    f"drain blocked for {minutes} min: {conditions.get(node_name) or 'eviction refused'}",
                    f"{name}/{node_name}/drain-blocked/{adm.at if adm else ''}",
                    compartment=adm.compartment if adm else None,
                    node=node_name,
                    to=due,
                )
        old = persisted.status if persisted is not None else None
        if status is Status.COMPLETE and old is not Status.COMPLETE:
            total = sum(c.status.matched for c in plan.compartments.values())
            send(
                NotificationEvent.ROLLOUT_COMPLETED,
                f"rollout complete on {total} node(s)",
                f"{name}/{fingerprint}/complete",
            )
