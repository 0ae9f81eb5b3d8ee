"""Notifications (controller/notify.py): payloads, delivery over real HTTP to a local receiver (retries,
permanent failures, URLs from Secrets), deduplication, the bounded queue, and the notices a rollout
pass derives (started, batch settled, node failed, halted, drain blocked, completed)."""

from __future__ import annotations

import asyncio
import base64
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web

from nodewright.api.admission import Admission
from nodewright.api.models import (
    CompartmentStatus,
    NodeWright,
    NodeWrightStatus,
    NotificationEvent,
    NotificationFormat,
    Status,
)
from nodewright.controller import notify
from nodewright.controller.notify import Notice, Notifier, RolloutNotifications, Sink
from nodewright.kube.resources import NotFound
from nodewright.observability.metrics import OperatorMetrics
from nodewright.plan.rollout import RolloutNode, plan_rollout, spec_fingerprint
from tests.test_obs_metrics import value

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def notice(
    key: str = "nw/fp/complete", event: NotificationEvent = NotificationEvent.ROLLOUT_COMPLETED
) -> Notice:
    return Notice(event, "nw", "rollout complete on 3 node(s)", key, "2026-03-01T12:00:00Z")


def test_payloads_generic_json_and_slack_text() -> None:
    halted = Notice(
        NotificationEvent.COMPARTMENT_HALTED,
        "nw",
        "2 nodes failed",
        "k",
        "2026-03-01T12:00:00Z",
        compartment="gpu",
    )
    assert notify.payload(halted, NotificationFormat.JSON) == {
        "event": "CompartmentHalted",
        "nodewright": "nw",
        "compartment": "gpu",
        "node": None,
        "message": "2 nodes failed",
        "time": "2026-03-01T12:00:00Z",
        "key": "k",
    }
    assert notify.payload(halted, NotificationFormat.SLACK) == {
        "text": "[NodeWright nw] CompartmentHalted compartment gpu: 2 nodes failed"
    }


def test_cluster_sink_flags_are_parsed_or_refused_with_the_flag_named() -> None:
    assert notify.parse_cluster_sink(None, "json") is None
    sink = notify.parse_cluster_sink("ops/url", "slack", "CompartmentHalted, RolloutCompleted")
    assert sink == Sink(
        "cluster",
        "ops",
        "url",
        NotificationFormat.SLACK,
        frozenset({NotificationEvent.COMPARTMENT_HALTED, NotificationEvent.ROLLOUT_COMPLETED}),
    )
    for bad, flag in ((("ops", "json"), "--notify-url-secret"), (("a/b", "xml"), "--notify-format")):
        with pytest.raises(ValueError, match=flag):
            notify.parse_cluster_sink(*bad)
    with pytest.raises(ValueError, match="--notify-events"):
        notify.parse_cluster_sink("a/b", "json", "Halted")


# ----------------------------------------------------------------------------------------------------
# Delivery


@dataclass
class Receiver:
    url: str
    bodies: list[Any] = field(default_factory=list)
    accepted: list[Any] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)  # statuses to answer first, then 200
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # set on every request


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    got = Receiver("")

    async def hook(request: web.Request) -> web.Response:
        got.bodies.append(await request.json())
        status = got.answers.pop(0) if got.answers else 200
        if status == 200:
            got.accepted.append(got.bodies[-1])
        got.changed.set()
        return web.Response(status=status, text="nope" if status >= 300 else "ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    got.url = f"http://127.0.0.1:{port}/hook"
    yield got
    await runner.cleanup()


class Secrets:
    """The Secret reads of the notifier (a KubeClient.get stand-in)."""

    def __init__(self, values: dict[str, dict[str, str]]) -> None:
        self.values = values
        self.reads = 0

    async def get(self, resource: Any, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        self.reads += 1
        assert namespace == "nodewright-system"
        if name not in self.values:
            raise NotFound(404, "NotFound", f"secrets {name!r} not found")
        return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in self.values[name].items()}}


class Metrics:
    """The notifier's metrics, recorded (`notify.NotifyMetrics`)."""

    def __init__(self) -> None:
        self.counts: list[tuple[str, str, str]] = []
        self.dropped: Counter[tuple[str, str]] = Counter()
        self.circuits: list[tuple[str, str]] = []
        self.queued: dict[str, int] = {}
        self.sinks: set[str] = set()

    def count_notification(self, sink: str, event: str, result: str) -> None:
        self.counts.append((sink, event, result))

    def init_notification_sink(self, sink: str, reasons: Iterable[str]) -> None:
        assert set(reasons) == {r.value for r in notify.DropReason}
        self.sinks.add(sink)
        self.queued[sink] = 0

    def count_notification_dropped(self, sink: str, reason: str) -> None:
        self.dropped[(sink, reason)] += 1

    def set_notification_queue(self, sink: str, depth: int) -> None:
        self.queued[sink] = depth

    def set_notification_circuit(self, sink: str, state: str) -> None:
        self.circuits.append((sink, state))

    def forget_notification_sink(self, sink: str) -> None:
        self.sinks.discard(sink)
        self.queued.pop(sink, None)


def counting() -> tuple[list[tuple[str, str, str]], Metrics]:
    metrics = Metrics()
    return metrics.counts, metrics


async def no_sleep(_seconds: float) -> None:
    return None


async def test_delivers_json_and_slack_retries_5xx_and_deduplicates(receiver: Receiver) -> None:
    counts, metrics = counting()
    secrets = Secrets({"hooks": {"team": receiver.url, "chat": receiver.url}})
    notifier = Notifier(secrets, "nodewright-system", metrics=metrics, sleep=no_sleep)
    sinks = [Sink("nw/team", "hooks", "team"), Sink("nw/chat", "hooks", "chat", NotificationFormat.SLACK)]
    receiver.answers = [503, 500]  # the first two POSTs fail: retried
    notifier.notify(notice(), sinks)
    notifier.notify(notice(), sinks)  # the same key again: not sent twice
    await asyncio.wait_for(notifier.join(), 10)
    texts = [b for b in receiver.accepted if "text" in b]
    assert len(texts) == 1 and texts[0]["text"].startswith("[NodeWright nw] RolloutCompleted")
    assert sum(1 for b in receiver.accepted if b.get("event") == "RolloutCompleted") == 1
    assert len(receiver.bodies) == 4, "two refused attempts, then one delivery per sink"
    assert sorted(c for c in counts if c[2] != "duplicate") == [
        ("nw/chat", "RolloutCompleted", "sent"),
        ("nw/team", "RolloutCompleted", "sent"),
    ]
    assert counts.count(("nw/team", "RolloutCompleted", "duplicate")) == 1
    await notifier.close()


async def test_permanent_failures_are_not_retried_and_are_counted(receiver: Receiver) -> None:
    counts, metrics = counting()
    secrets = Secrets({"hooks": {"url": receiver.url, "bad": "ftp://example.com/x"}})
    notifier = Notifier(secrets, "nodewright-system", metrics=metrics, sleep=no_sleep)
    receiver.answers = [404]
    notifier.notify(notice("a"), [Sink("s1", "hooks", "url")])
    notifier.notify(notice("b"), [Sink("s2", "missing", "url")])
    notifier.notify(notice("c"), [Sink("s3", "hooks", "bad")])
    notifier.notify(notice("d"), [Sink("s4", "hooks", "nokey")])
    await asyncio.wait_for(notifier.join(), 10)
    assert len(receiver.bodies) == 1, "a 404 is not retried; the others never reach the receiver"
    assert sorted(counts) == [(f"s{i}", "RolloutCompleted", "failed") for i in range(1, 5)]
    await notifier.close()


async def test_unreachable_sink_is_retried_with_backoff_then_given_up() -> None:
    counts, metrics = counting()
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)

    secrets = Secrets({"hooks": {"url": "http://127.0.0.1:9/never"}})
    notifier = Notifier(secrets, "nodewright-system", metrics=metrics, sleep=sleep, attempts=4, backoff=1.0)
    notifier.notify(notice(), [Sink("s", "hooks", "url")])
    await asyncio.wait_for(notifier.join(), 30)
    assert counts == [("s", "RolloutCompleted", "failed")]
    assert len(delays) == 3 and all(0.8 * 2**i <= d <= 1.2 * 2**i for i, d in enumerate(delays)), delays
    await notifier.close()


async def test_a_full_queue_drops_without_waiting_and_filters_unwanted_events() -> None:
    counts, metrics = counting()
    notifier = Notifier(Secrets({}), "nodewright-system", metrics=metrics, queue_size=1, sleep=no_sleep)
    only_halts = Sink("h", "x", "y", events=frozenset({NotificationEvent.COMPARTMENT_HALTED}))
    notifier.notify(notice("k1"), [only_halts])
    assert counts == [], "a sink that does not want the event is not told"
    sink = Sink("s", "missing", "url")
    notifier.notify(notice("k1"), [sink])
    notifier.notify(notice("k2"), [sink])  # the worker has not run yet: the queue (1) is full
    assert ("s", "RolloutCompleted", "dropped") in counts
    await asyncio.wait_for(notifier.join(), 10)
    await notifier.close()


# ----------------------------------------------------------------------------------------------------
# Isolation: a sink that hangs costs only itself (issue 29, item 3)

NS = "nodewright-system"
LIVENESS = 60.0
"""Bound on waiting for a condition: reached only when the code is broken (not a speed assertion)."""


@dataclass
class Hanging:
    """A webhook that accepts connections and never answers (until the test ends)."""

    url: str
    release: asyncio.Event
    started: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def hanging() -> AsyncIterator[Hanging]:
    got = Hanging("", asyncio.Event())

    async def hook(request: web.Request) -> web.Response:
        got.started.append(request.match_info["sink"])
        got.changed.set()
        await got.release.wait()
        return web.Response(text="late")

    app = web.Application()
    app.router.add_post("/hang/{sink}", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    got.url = f"http://127.0.0.1:{port}/hang"
    yield got
    got.release.set()
    await runner.cleanup()


async def until(changed: asyncio.Event, condition: Any, what: Any = str) -> None:
    """Wait (event-driven, no polling) until `condition()` holds; `changed` is set on every change;
    `what()` says what was reached instead, should the liveness bound pass."""

    async def wait() -> None:
        while not condition():
            changed.clear()
            await changed.wait()

    try:
        await asyncio.wait_for(wait(), LIVENESS)
    except TimeoutError:
        raise AssertionError(f"not reached within {LIVENESS:g} s: {what()}") from None


@pytest.mark.parametrize("stuck", [1, 30])
async def test_hanging_sinks_do_not_delay_a_good_sink(
    receiver: Receiver, hanging: Hanging, stuck: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The good sink gets all ten notices while every hanging sink's first POST still hangs: with the
    deadline out of the picture, only isolation between sinks can deliver them (on the shared queue and
    two workers of before, it got one notice with one hanging sink, none with 30)."""
    monkeypatch.setattr(notify, "REQUEST_TIMEOUT", 3600.0)
    urls = {f"s{i}": f"{hanging.url}/s{i}" for i in range(stuck)}
    secrets = Secrets({"hooks": {"good": receiver.url, **urls}})
    notifier = Notifier(secrets, NS, sleep=no_sleep)
    sinks = [Sink(f"nw/{key}", "hooks", key) for key in urls] + [Sink("nw/good", "hooks", "good")]
    for i in range(10):
        notifier.notify(notice(f"nw/fp/k{i}"), sinks)
    await until(
        receiver.changed,
        lambda: len(receiver.accepted) == 10,
        lambda: f"the good sink got {len(receiver.accepted)} of 10 notices",
    )
    await until(hanging.changed, lambda: len(hanging.started) == stuck)
    assert sorted(hanging.started) == sorted(urls), "one attempt per hanging sink, each still hanging"
    assert [b["key"] for b in receiver.accepted] == [f"nw/fp/k{i}" for i in range(10)], "in order"
    await notifier.close(grace=0)


class Clock:
    """The notifier's monotonic clock and sleep: backoff sleeps (0 with backoff=0) pass at once; a
    circuit-breaker wait parks until the test lets that time pass (`release`)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.parked_for: float | None = None
        self.parking = asyncio.Event()
        self.go = asyncio.Event()

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.parked_for = seconds
            self.parking.set()
            await self.go.wait()
            self.go.clear()
        self.now += seconds

    async def parked(self) -> float:
        await asyncio.wait_for(self.parking.wait(), LIVENESS)
        self.parking.clear()
        assert self.parked_for is not None
        return self.parked_for

    def release(self) -> None:
        self.go.set()


@dataclass
class Warnings:
    got: list[tuple[str, str, str]] = field(default_factory=list)  # (nodewright, reason, message)

    async def __call__(self, nodewright: str, spec: Any) -> None:
        assert spec.type.value == "Warning"
        self.got.append((nodewright, spec.reason.value, spec.message))


async def test_the_circuit_opens_holds_then_drops_probes_and_closes(receiver: Receiver) -> None:
    """Five unavailable attempts open the circuit; while it is open nothing is sent, the sink's queue
    holds what comes and drops the rest (circuit_open, one Warning Event); after the open period one
    probe goes out: failed, the circuit opens for twice as long; answered, it closes and the queue
    is delivered in order."""
    metrics, warnings, clock = Metrics(), Warnings(), Clock()
    receiver.answers = [503] * 6  # the five attempts of k1, then the first probe
    notifier = Notifier(
        Secrets({"hooks": {"url": receiver.url}}),
        NS,
        metrics=metrics,
        warn=warnings,
        sleep=clock.sleep,
        clock=clock.monotonic,
        backoff=0,
        queue_size=2,
    )
    sink = Sink("nw/team", "hooks", "url")
    for key in ("k1", "k2"):
        notifier.notify(notice(key), [sink])
    assert await clock.parked() == notify.BREAKER_OPEN, "k2 waits for the open circuit"
    assert notifier.circuit("nw/team") is notify.Circuit.OPEN
    assert ("nw/team", "RolloutCompleted", "failed") in metrics.counts, "k1 used its five attempts"
    assert len(receiver.bodies) == 5
    for key in ("k3", "k4", "k5", "k6"):
        notifier.notify(notice(key), [sink])
    assert metrics.dropped == {("nw/team", "circuit_open"): 2}, "the queue (2) holds k3 and k4"
    await asyncio.gather(*notifier._background)
    assert [(nw, reason) for nw, reason, _ in warnings.got] == [("nw", "NotificationsDropped")]
    assert "[nw/team] dropped (circuit_open)" in warnings.got[0][2]

    clock.release()  # the open period passes: one probe (k2), answered 503
    assert await clock.parked() == 2 * notify.BREAKER_OPEN
    assert len(receiver.bodies) == 6 and notifier.circuit("nw/team") is notify.Circuit.OPEN
    clock.release()  # the second probe is answered: closed, the queue goes out
    await asyncio.wait_for(notifier.join(), LIVENESS)
    assert [b["key"] for b in receiver.accepted] == ["k2", "k3", "k4"]
    assert [state for _, state in metrics.circuits] == ["open", "half_open", "open", "half_open", "closed"]
    assert notifier.circuit("nw/team") is notify.Circuit.CLOSED
    await notifier.close(grace=0)


def state(breaker: notify.CircuitBreaker) -> notify.Circuit:
    return breaker.state  # a call: mypy would otherwise keep `state` narrowed across wait() and record()


def test_circuit_breaker_periods_double_up_to_the_cap_and_an_answer_resets_it() -> None:
    breaker = notify.CircuitBreaker(threshold=3, open_for=10, max_open_for=35)
    for _ in range(2):
        breaker.record(available=False, now=0)
    assert state(breaker) is notify.Circuit.CLOSED and breaker.wait(0) == 0
    breaker.record(available=True, now=0)
    assert breaker.failures == 0, "an answer ends the run of failures"
    for _ in range(3):
        breaker.record(available=False, now=0)
    assert state(breaker) is notify.Circuit.OPEN and breaker.wait(4) == 6
    periods = []
    now = 0.0
    for _ in range(4):
        now = breaker.reopen_at
        assert breaker.wait(now) == 0 and state(breaker) is notify.Circuit.HALF_OPEN
        breaker.record(available=False, now=now)  # the probe fails: open again, longer
        periods.append(breaker.reopen_at - now)
    assert periods == [20, 35, 35, 35]
    breaker.wait(breaker.reopen_at)
    breaker.record(available=True, now=breaker.reopen_at)
    assert state(breaker) is notify.Circuit.CLOSED
    for _ in range(3):
        breaker.record(available=False, now=100)
    assert breaker.reopen_at == 110, "closed and opened again: the first period"


async def test_drops_are_counted_by_sink_and_reason_and_reported_at_most_once_per_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full queue drops: the metric counts every drop by sink and reason, a Warning Event goes to
    the NodeWright each dropped notice is about (the cluster sink serves several), at most once per
    DROP_REPORT_INTERVAL with the same message (the recorder counts it up in one Event)."""
    monkeypatch.setattr(notify, "REQUEST_TIMEOUT", 3600.0)
    metrics = OperatorMetrics()
    warnings, clock = Warnings(), Clock()

    async def stall(_url: str, _body: dict[str, Any]) -> None:
        await asyncio.Event().wait()

    notifier = Notifier(
        Secrets({"hooks": {"url": "http://127.0.0.1:9/x"}}),
        NS,
        metrics=metrics,
        warn=warnings,
        post=stall,
        queue_size=1,
        clock=clock.monotonic,
    )
    cluster = notify.parse_cluster_sink("hooks/url", "json")
    assert cluster is not None

    def node_failed(nodewright: str, key: str) -> Notice:
        return Notice(NotificationEvent.NODE_FAILED, nodewright, "m", key, "t")

    for i in range(4):  # the worker has not run yet: k0 waits, the other three are dropped
        notifier.notify(node_failed(f"nw{i % 2}", f"k{i}"), [cluster])
    assert value(metrics, "nodewright_notification_queue_depth", sink="cluster") == 1
    await asyncio.gather(*notifier._background)  # the worker takes k0 (its POST never ends)
    assert value(metrics, "nodewright_notifications_dropped_total", sink="cluster", reason="queue_full") == 3
    assert value(metrics, "nodewright_notifications_dropped_total", sink="cluster", reason="shutdown") == 0
    assert (
        value(metrics, "nodewright_notifications_total", sink="cluster", event="NodeFailed", result="dropped")
        == 3
    )
    assert sorted(nw for nw, _, _ in warnings.got) == ["nw0", "nw1"]
    first = {nw: message for nw, _, message in warnings.got}["nw0"]
    assert "[cluster] dropped (queue_full)" in first and "nodewright_notifications_dropped_total" in first
    notifier.notify(node_failed("nw0", "k4"), [cluster])  # fills the queue again
    clock.now += notify.DROP_REPORT_INTERVAL - 1
    notifier.notify(node_failed("nw0", "k5"), [cluster])
    await asyncio.gather(*notifier._background)
    assert len(warnings.got) == 2, "nw0 within the interval: counted, not reported"
    clock.now += 1
    notifier.notify(node_failed("nw0", "k6"), [cluster])
    await asyncio.gather(*notifier._background)
    assert warnings.got[2:] == [("nw0", "NotificationsDropped", first)], "the same message: one series"
    assert value(metrics, "nodewright_notifications_dropped_total", sink="cluster", reason="queue_full") == 5
    await notifier.close(grace=0)
    assert value(metrics, "nodewright_notifications_dropped_total", sink="cluster", reason="shutdown") == 2


async def test_shutdown_delivers_what_is_queued_within_the_grace(receiver: Receiver) -> None:
    metrics = Metrics()
    notifier = Notifier(Secrets({"hooks": {"url": receiver.url}}), NS, metrics=metrics, sleep=no_sleep)
    for key in ("k1", "k2", "k3"):
        notifier.notify(notice(key), [Sink("nw/team", "hooks", "url")])
    await notifier.close(grace=LIVENESS)  # returns as soon as the queue is delivered
    assert [b["key"] for b in receiver.accepted] == ["k1", "k2", "k3"]
    assert not metrics.dropped
    notifier.notify(notice("k4"), [Sink("nw/team", "hooks", "url")])
    assert metrics.dropped == {("nw/team", "shutdown"): 1}, "closed: nothing is queued any more"


async def test_shutdown_drops_what_is_left_after_the_grace(
    hanging: Hanging, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notify, "REQUEST_TIMEOUT", 3600.0)
    metrics, warnings = Metrics(), Warnings()
    notifier = Notifier(
        Secrets({"hooks": {"url": f"{hanging.url}/s"}}), NS, metrics=metrics, warn=warnings, sleep=no_sleep
    )
    for key in ("k1", "k2", "k3"):
        notifier.notify(notice(key), [Sink("nw/team", "hooks", "url")])
    await until(hanging.changed, lambda: len(hanging.started) == 1)
    await notifier.close(grace=0)
    assert metrics.dropped == {("nw/team", "shutdown"): 3}, "the one in flight and the two queued"
    assert [(nw, reason) for nw, reason, _ in warnings.got] == [("nw", "NotificationsDropped")]
    assert "(shutdown)" in warnings.got[0][2]


async def test_a_sink_removed_from_the_spec_stops_its_worker(
    receiver: Receiver, hanging: Hanging, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`keep` retires the sinks of a NodeWright it does not name; the cluster sink and other
    NodeWrights' sinks are untouched; a retired worker drops what it could not deliver (removed)."""
    monkeypatch.setattr(notify, "REQUEST_TIMEOUT", 3600.0)
    metrics = Metrics()
    secrets = Secrets({"hooks": {"url": receiver.url, "stuck": f"{hanging.url}/s"}})
    notifier = Notifier(secrets, NS, metrics=metrics, sleep=no_sleep, grace=0)
    stuck, team = Sink("nw/stuck", "hooks", "stuck"), Sink("nw/team", "hooks", "url")
    other, cluster = Sink("nw2/team", "hooks", "url"), Sink("cluster", "hooks", "url")
    for key in ("k1", "k2"):
        notifier.notify(notice(key), [stuck, team, other, cluster])
    await until(hanging.changed, lambda: len(hanging.started) == 1)
    await until(receiver.changed, lambda: len(receiver.accepted) == 6)
    notifier.keep("nw", ["nw/team"])
    await asyncio.gather(*notifier._retiring.values())
    assert notifier.circuit("nw/stuck") is None and metrics.dropped == {("nw/stuck", "removed"): 2}
    assert metrics.sinks == {"nw/team", "nw2/team", "cluster"}, "its gauges are gone"
    notifier.keep("nw", [])  # the NodeWright is gone
    await asyncio.gather(*notifier._retiring.values())
    assert notifier.circuit("nw/team") is None and notifier.circuit("nw2/team") is not None
    assert metrics.sinks == {"nw2/team", "cluster"}
    assert sum(1 for c in metrics.counts if c[2] == "dropped") == 2, "the rest were delivered"
    await notifier.close(grace=0)


async def test_an_attempt_has_one_deadline_for_the_secret_and_the_post(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A webhook (or Secret read) that never answers fails the attempt at the deadline: retried, then
    given up; the worker is free again."""
    monkeypatch.setattr(notify, "REQUEST_TIMEOUT", 0.01)
    metrics = Metrics()

    async def never(_url: str, _body: dict[str, Any]) -> None:
        await asyncio.Event().wait()

    secrets = Secrets({"hooks": {"url": "http://127.0.0.1:9/never"}})
    notifier = Notifier(secrets, NS, metrics=metrics, post=never, sleep=no_sleep, attempts=2)
    notifier.notify(notice(), [Sink("s", "hooks", "url")])
    await asyncio.wait_for(notifier.join(), LIVENESS)
    assert metrics.counts == [("s", "RolloutCompleted", "failed")]
    assert secrets.reads == 2
    await notifier.close(grace=0)


# ----------------------------------------------------------------------------------------------------
# What a rollout pass tells


class Captured:
    def __init__(self) -> None:
        self.notices: list[tuple[Notice, list[str]]] = []
        self.kept: dict[str, list[str]] = {}

    def notify(self, n: Notice, sinks: Any) -> None:
        self.notices.append((n, [s.name for s in sinks]))

    def keep(self, nodewright: str, sinks: Iterable[str]) -> None:
        self.kept[nodewright] = list(sinks)


def nodewright(**status: Any) -> NodeWright:
    return NodeWright.model_validate(
        {
            "metadata": {"name": "nw", "generation": 1},
            "spec": {
                "interruptionBudget": {"count": 2},
                "packages": {"tool": {"version": "1.0.0", "image": "x/tool"}},
                "notifications": [
                    {
                        "name": "team",
                        "urlSecretRef": {"name": "hooks", "key": "team"},
                        "drainBlockedAfter": "5m",
                    }
                ],
            },
            **({"status": status} if status else {}),
        }
    )


def rnode(
    name: str, fp: str, *, status: Status, needs_work: bool = True, batch: int | None = None
) -> RolloutNode:
    settled = status in (Status.ERRORING, Status.COMPLETE)  # the node controller consumed the admission
    admission = (
        Admission("__default__", batch, 0, fp, "2026-03-01T11:00:00Z", consumed=settled)
        if batch is not None
        else None
    )
    return RolloutNode(
        name=name,
        labels={},
        creation_timestamp=None,
        status=status,
        needs_work=needs_work,
        admission=admission,
    )


def events_of(captured: Captured) -> list[str]:
    return [n.event.value for n, _ in captured.notices]


def test_a_pass_reports_start_failure_drain_blocked_and_completion_once_per_transition() -> None:
    model = nodewright()
    fp = spec_fingerprint(model)
    captured = Captured()
    rollout = RolloutNotifications(captured, notify.parse_cluster_sink("ops/url", "json"))  # type: ignore[arg-type]
    fresh = [rnode("n1", fp, status=Status.WAITING), rnode("n2", fp, status=Status.WAITING)]
    plan = plan_rollout(
        model, policy=None, nodes=fresh, compartment_statuses={}, fingerprint=fp, now="2026-03-01T12:00:00Z"
    )
    assert plan.admissions
    kwargs: dict[str, Any] = {"fingerprint": fp, "conditions": {}, "drain_blocked": ()}
    rollout.after_pass(model, plan, Status.IN_PROGRESS, fresh, now=NOW, **kwargs)
    assert events_of(captured) == ["RolloutStarted"]
    assert captured.notices[0][1] == ["nw/team", "cluster"]
    assert captured.kept == {"nw": ["nw/team", "cluster"]}, "sinks no longer named are retired"

    # n1 failed, n2 is draining and blocked: the drain notice waits for drainBlockedAfter (5m).
    running = [
        rnode("n1", fp, status=Status.ERRORING, batch=1),
        rnode("n2", fp, status=Status.IN_PROGRESS, batch=1),
    ]
    plan = plan_rollout(
        model,
        policy=None,
        nodes=running,
        compartment_statuses=plan.compartment_statuses,
        fingerprint=fp,
        now="2026-03-01T12:01:00Z",
    )
    captured.notices.clear()
    blocked: dict[str, Any] = {
        **kwargs,
        "drain_blocked": ["n2"],
        "conditions": {"n1": "Erroring: step failed"},
    }
    rollout.after_pass(model, plan, Status.IN_PROGRESS, running, now=NOW, **blocked)
    assert [(n.event.value, n.node, n.message) for n, _ in captured.notices] == [
        ("NodeFailed", "n1", "Erroring: step failed")
    ]
    captured.notices.clear()
    rollout.after_pass(model, plan, Status.IN_PROGRESS, running, now=NOW + timedelta(minutes=6), **blocked)
    drained = [(n, sinks) for n, sinks in captured.notices if n.event is NotificationEvent.DRAIN_BLOCKED]
    assert len(drained) == 1 and drained[0][1] == ["nw/team"], "the cluster sink's default is 15m"
    assert drained[0][0].message.startswith("drain blocked for 6 min")

    # Complete: reported when the persisted status was not complete yet, never again after that.
    done = [rnode(n, fp, status=Status.COMPLETE, needs_work=False, batch=1) for n in ("n1", "n2")]
    plan = plan_rollout(
        model, policy=None, nodes=done, compartment_statuses={}, fingerprint=fp, now="2026-03-01T12:30:00Z"
    )
    captured.notices.clear()
    rollout.after_pass(model, plan, Status.COMPLETE, done, now=NOW, **kwargs)
    assert "RolloutCompleted" in events_of(captured)
    captured.notices.clear()
    persisted = nodewright(status="complete")
    rollout.after_pass(persisted, plan, Status.COMPLETE, done, now=NOW, **kwargs)
    assert "RolloutCompleted" not in events_of(captured)


def test_a_halt_is_reported_only_when_the_persisted_status_was_not_halted_yet() -> None:
    from nodewright.plan.rollout import Halt

    model = nodewright()
    fp = spec_fingerprint(model)
    nodes = [rnode("n1", fp, status=Status.ERRORING, batch=1)]
    plan = plan_rollout(
        model, policy=None, nodes=nodes, compartment_statuses={}, fingerprint=fp, now="2026-03-01T12:00:00Z"
    )
    from nodewright.api.reasons import HaltReason

    halted = Halt(
        "__default__", HaltReason.FAILURE_THRESHOLD, ("n1",), 1, "compartment '__default__' halted: n1 failed"
    )
    from dataclasses import replace

    plan = replace(plan, halts=(halted,))
    captured = Captured()
    rollout = RolloutNotifications(captured)  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {"fingerprint": fp, "conditions": {}, "drain_blocked": (), "now": NOW}
    rollout.after_pass(model, plan, Status.BLOCKED, nodes, **kwargs)
    assert "CompartmentHalted" in events_of(captured)
    captured.notices.clear()
    before = NodeWrightStatus(compartment_statuses={"__default__": CompartmentStatus(halted=True)})
    rollout.after_pass(model.model_copy(update={"status": before}), plan, Status.BLOCKED, nodes, **kwargs)
    assert "CompartmentHalted" not in events_of(captured)


def test_a_nodewright_without_sinks_or_gone_retires_its_sink_workers() -> None:
    model = nodewright()
    fp = spec_fingerprint(model)
    bare = model.model_copy(update={"spec": model.spec.model_copy(update={"notifications": None})})
    captured = Captured()
    rollout = RolloutNotifications(captured)  # type: ignore[arg-type]
    plan = plan_rollout(
        bare, policy=None, nodes=[], compartment_statuses={}, fingerprint=fp, now="2026-03-01T12:00:00Z"
    )
    kwargs: dict[str, Any] = {"fingerprint": fp, "conditions": {}, "drain_blocked": (), "now": NOW}
    rollout.after_pass(bare, plan, Status.COMPLETE, [], **kwargs)
    assert captured.kept == {"nw": []} and not captured.notices
    captured.kept.clear()
    rollout.forget("nw2")  # deleted
    assert captured.kept == {"nw2": []}


def test_a_spec_that_comes_back_is_told_about_again_under_its_own_rollout_key() -> None:
    """v1 -> v2 -> v1: the way back has v1's fingerprint, so keys made of the fingerprint alone were
    those of the first v1 rollout, already sent in this process (the notifier sends a key once): the way
    back's start, batches, halts and completion went untold. The epoch key tells the rollouts apart."""
    model = nodewright()
    fp = spec_fingerprint(model)
    nodes = [rnode("n1", fp, status=Status.WAITING)]
    plan = plan_rollout(
        model, policy=None, nodes=nodes, compartment_statuses={}, fingerprint=fp, now="2026-03-01T12:00:00Z"
    )
    captured = Captured()
    rollout = RolloutNotifications(captured)  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {"fingerprint": fp, "conditions": {}, "drain_blocked": (), "now": NOW}
    rollout.after_pass(model, plan, Status.IN_PROGRESS, nodes, **kwargs)
    rollout.after_pass(model, plan, Status.IN_PROGRESS, nodes, rollout_key=f"{fp}.8", **kwargs)
    keys = [n.key for n, _ in captured.notices if n.event is NotificationEvent.ROLLOUT_STARTED]
    assert keys == [f"nw/{fp}/started", f"nw/{fp}.8/started"]


def test_a_halt_notice_names_the_revision_to_go_back_to_and_the_command() -> None:
    from dataclasses import replace

    from nodewright.api.reasons import HaltReason
    from nodewright.plan.revisions import UndoHint
    from nodewright.plan.rollout import Halt

    model = nodewright()
    fp = spec_fingerprint(model)
    nodes = [rnode("n1", fp, status=Status.ERRORING, batch=1)]
    plan = plan_rollout(
        model, policy=None, nodes=nodes, compartment_statuses={}, fingerprint=fp, now="2026-03-01T12:00:00Z"
    )
    plan = replace(
        plan, halts=(Halt("__default__", HaltReason.FAILURE_THRESHOLD, ("n1",), 1, "halted: n1 failed"),)
    )
    captured = Captured()
    rollout = RolloutNotifications(captured)  # type: ignore[arg-type]
    hint = UndoHint("nw", 4, "tool:1.0.0")
    rollout.after_pass(
        model,
        plan,
        Status.BLOCKED,
        nodes,
        fingerprint=fp,
        conditions={},
        drain_blocked=(),
        now=NOW,
        undo=hint,
    )
    (halt,) = [n for n, _ in captured.notices if n.event is NotificationEvent.COMPARTMENT_HALTED]
    assert halt.message == (
        "halted: n1 failed; to go back to revision 4 (tool:1.0.0): kubectl nodewright undo nw --to-revision 4"
    )
