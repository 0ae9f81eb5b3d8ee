"""Notifications (controller/notify.py): payloads, delivery over real HTTP to a local receiver (retries,
permanent failures, URLs from Secrets), deduplication, the bounded queue, and the notices a rollout
pass derives (started, batch settled, node failed, halted, drain blocked, completed)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web

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
from nodewright.plan.rollout import Admission, RolloutNode, plan_rollout, spec_fingerprint

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


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    got = Receiver("")

    async def hook(request: web.Request) -> web.Response:
        got.bodies.append(await request.json())
        status = got.answers.pop(0) if got.answers else 200
        if status == 200:
            got.accepted.append(got.bodies[-1])
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


def counting() -> tuple[list[tuple[str, str, str]], Any]:
    seen: list[tuple[str, str, str]] = []
    return seen, lambda sink, event, result: seen.append((sink, event, result))


async def no_sleep(_seconds: float) -> None:
    return None


async def test_delivers_json_and_slack_retries_5xx_and_deduplicates(receiver: Receiver) -> None:
    counts, count = counting()
    secrets = Secrets({"hooks": {"team": receiver.url, "chat": receiver.url}})
    notifier = Notifier(secrets, "nodewright-system", count=count, sleep=no_sleep)
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
    counts, count = counting()
    secrets = Secrets({"hooks": {"url": receiver.url, "bad": "ftp://example.com/x"}})
    notifier = Notifier(secrets, "nodewright-system", count=count, sleep=no_sleep)
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
    counts, count = counting()
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)

    secrets = Secrets({"hooks": {"url": "http://127.0.0.1:9/never"}})
    notifier = Notifier(secrets, "nodewright-system", count=count, sleep=sleep, attempts=4, backoff=1.0)
    notifier.notify(notice(), [Sink("s", "hooks", "url")])
    await asyncio.wait_for(notifier.join(), 30)
    assert counts == [("s", "RolloutCompleted", "failed")]
    assert len(delays) == 3 and all(0.8 * 2**i <= d <= 1.2 * 2**i for i, d in enumerate(delays)), delays
    await notifier.close()


async def test_a_full_queue_drops_without_waiting_and_filters_unwanted_events() -> None:
    counts, count = counting()
    notifier = Notifier(Secrets({}), "nodewright-system", count=count, queue_size=1, sleep=no_sleep)
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
# What a rollout pass tells


class Captured:
    def __init__(self) -> None:
        self.notices: list[tuple[Notice, list[str]]] = []

    def notify(self, n: Notice, sinks: Any) -> None:
        self.notices.append((n, [s.name for s in sinks]))


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
    halted = Halt("__default__", "failures", ("n1",), 1, "compartment '__default__' halted: n1 failed")
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
