"""Events as series (issue 16): client-go's correlation rules, and a recorder that never drops one.

The benchmark used to log "event queue full, dropping events" (13 at 300 nodes, 112 at 1,000): a
bounded queue of single Events. These tests drive the correlator with an injected clock and the
recorder against an in-memory sink that records every create and patch, so the counts the API server
would hold can be checked exactly.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nodewright.controller.runtime import EventRecorder as OperatorRecorder
from nodewright.observability import events as ev
from nodewright.observability.recorder import EventRecorder

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Sink:
    """Stands in for the API server's events endpoint: stores Events, applies merge patches."""

    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.creates = 0
        self.patches = 0
        self.gate: asyncio.Event | None = None
        self.fail_creates = False
        self.gone: set[str] = set()

    async def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_creates:
            raise RuntimeError("apiserver down")
        self.creates += 1
        name = f"{body['involvedObject']['name']}.{self.creates:x}"
        stored = {**body, "metadata": {"name": name, "namespace": namespace}}
        self.events[name] = stored
        return stored

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        self.patches += 1
        if name in self.gone or name not in self.events:
            self.events.pop(name, None)
            return False
        self.events[name].update(patch)
        return True

    def counts(self) -> dict[tuple[str, str, str], int]:
        out: dict[tuple[str, str, str], int] = {}
        for e in self.events.values():
            key = (e["involvedObject"]["name"], e["reason"], e["message"])
            out[key] = out.get(key, 0) + int(e["count"])
        return out


# ----------------------------------------------------------------------------------------------------
# The correlator (pure)


def test_identical_events_form_one_series_and_expire_after_the_series_window() -> None:
    corr = ev.EventCorrelator(series_window=60)
    first = corr.observe(kind="Node", name="n", reason="R", event_type="Normal", message="m", now=T0)
    again = corr.observe(
        kind="Node", name="n", reason="R", event_type="Normal", message="m", now=T0 + timedelta(seconds=30)
    )
    assert first.new_series and not again.new_series and first.key == again.key
    later = corr.observe(
        kind="Node", name="n", reason="R", event_type="Normal", message="m", now=T0 + timedelta(seconds=100)
    )
    assert later.new_series, "unseen for longer than the window: a new Event"


def test_more_than_ten_messages_for_one_object_and_reason_are_combined() -> None:
    corr = ev.EventCorrelator()
    results = [
        corr.observe(kind="Node", name="n", reason="R", event_type="Warning", message=f"m{i}", now=T0)
        for i in range(14)
    ]
    assert all(not r.message.startswith(ev.COMBINED_PREFIX) for r in results[:10])
    combined = results[10:]
    assert all(r.message == ev.COMBINED_PREFIX + f"m{i + 10}" for i, r in enumerate(combined))
    assert len({r.key for r in combined}) == 1 and combined[0].new_series and not combined[1].new_series
    # A message seen before still joins its own series; another object is not affected.
    assert (
        corr.observe(kind="Node", name="n", reason="R", event_type="Warning", message="m3", now=T0).message
        == "m3"
    )
    other = corr.observe(kind="Node", name="n2", reason="R", event_type="Warning", message="m99", now=T0)
    assert other.message == "m99"


def test_the_correlator_memory_is_bounded() -> None:
    corr = ev.EventCorrelator(max_keys=100)
    for i in range(1000):
        corr.observe(kind="Node", name=f"n{i}", reason="R", event_type="Normal", message="m", now=T0)
    assert len(corr._series) <= 100 and len(corr._similar) <= 100


# ----------------------------------------------------------------------------------------------------
# The recorder


def recorder(sink: Sink, **kwargs: Any) -> EventRecorder:
    return EventRecorder(sink, clock=lambda: T0, instance="op-0", **kwargs)


async def test_a_burst_of_ten_thousand_events_drops_nothing_and_writes_few_requests() -> None:
    sink = Sink()
    sink.gate = asyncio.Event()  # the API server is slow: everything waits behind the first create
    rec = recorder(sink, bump_interval=0.0)
    nodes = [f"node-{i:04d}" for i in range(1000)]
    for round_ in range(10):
        for node in nodes:
            await rec.record(
                kind="Node",
                name=node,
                uid=None,
                reason="NodeDrainBlocked",
                message="PDB web",
                event_type="Warning",
            )
        assert rec.pending <= len(nodes), "pending writes are bounded by series, not occurrences"
        del round_
    sink.gate.set()
    async with asyncio.timeout(30):
        await rec.flush()
    counts = sink.counts()
    assert sum(counts.values()) == 10_000, "every occurrence is counted"
    assert counts[("node-0000", "NodeDrainBlocked", "PDB web")] == 10
    assert sink.creates == 1000 and sink.patches == 0, "repeats waiting for the create only raise its count"
    assert rec.dropped == 0
    await rec.close()


async def test_repeats_after_the_create_bump_the_count_at_most_once_per_interval() -> None:
    sink = Sink()
    now = [0.0]
    rec = EventRecorder(sink, clock=lambda: T0, instance="i", bump_interval=60.0, monotonic=lambda: now[0])
    await rec.record(kind="Node", name="n", uid="u", reason="R", message="m")
    async with asyncio.timeout(5):
        await rec.flush()
    assert sink.creates == 1
    rec._urgent = False
    for _ in range(5):
        await rec.record(kind="Node", name="n", uid="u", reason="R", message="m")
    await asyncio.sleep(0.05)
    assert sink.patches == 0, "the interval has not passed"
    now[0] = 61.0
    rec._wake.set()
    async with asyncio.timeout(5):
        await rec.flush()
    assert sink.patches == 1 and sink.counts() == {("n", "R", "m"): 6}
    [stored] = sink.events.values()
    assert stored["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u"}
    assert stored["source"] == {"component": "nodewright-operator"} and stored["type"] == "Normal"
    await rec.close()


async def test_an_expired_event_is_created_again_with_its_count() -> None:
    sink = Sink()
    rec = recorder(sink, bump_interval=0.0)
    await rec.record(kind="NodeWright", name="nw", uid=None, reason="R", message="m")
    async with asyncio.timeout(5):
        await rec.flush()
    sink.gone.update(sink.events)
    await rec.record(kind="NodeWright", name="nw", uid=None, reason="R", message="m")
    async with asyncio.timeout(5):
        await rec.flush()
    assert sink.creates == 2 and sink.counts() == {("nw", "R", "m"): 2}
    [stored] = sink.events.values()
    assert stored["involvedObject"]["apiVersion"] == "nodewright.io/v1alpha1"
    await rec.close()


async def test_failures_never_raise_and_record_never_blocks() -> None:
    sink = Sink()
    sink.fail_creates = True
    rec = recorder(sink)
    async with asyncio.timeout(1):
        for i in range(100):
            await rec.record(kind="Node", name="n", uid=None, reason=f"R{i}", message="m")
    await rec.close(grace=1.0)
    assert rec.failed >= 1 and rec.sent == 0


@pytest.mark.parametrize("recorder_class", [EventRecorder, OperatorRecorder])
def test_the_operator_recorder_is_the_series_recorder(recorder_class: type[Any]) -> None:
    assert issubclass(recorder_class, EventRecorder)


async def test_the_recorder_remembers_as_many_series_as_client_go_and_forgets_the_oldest() -> None:
    sink = Sink()
    rec = recorder(sink, bump_interval=0.0)
    for i in range(ev.MAX_REMEMBERED + 1):  # one more node than remembered, each with one Event
        await rec.record(kind="Node", name=f"n{i}", uid=None, reason="R", message="m")
    async with asyncio.timeout(30):
        await rec.flush()
    assert sink.creates == ev.MAX_REMEMBERED + 1
    # The newest series is still known: a repeat counts up its Event. The oldest was forgotten: a
    # repeat creates a new Event (never drops it).
    await rec.record(kind="Node", name=f"n{ev.MAX_REMEMBERED}", uid=None, reason="R", message="m")
    await rec.record(kind="Node", name="n0", uid=None, reason="R", message="m")
    async with asyncio.timeout(30):
        await rec.flush()
    assert (sink.creates, sink.patches) == (ev.MAX_REMEMBERED + 2, 1)
    assert sum(sink.counts().values()) == ev.MAX_REMEMBERED + 3
    await rec.close()


async def test_a_node_event_names_its_nodewright_in_the_related_object() -> None:
    """`kubectl nodewright why NODE NW` selects a node's Events by the NodeWright they are for: the
    Event's `related` object, never its message."""
    sink = Sink()
    rec = recorder(sink)
    await rec.record(kind="Node", name="n1", uid=None, reason="NodeCordoned", message="[nw] x", related="nw")
    await rec.record(kind="Node", name="n1", uid=None, reason="NodeCordoned", message="[other] x")
    await rec.close(grace=1.0)
    related = sorted(str((e.get("related") or {}).get("name")) for e in sink.events.values())
    assert related == ["None", "nw"]
    [ours] = [e for e in sink.events.values() if e.get("related")]
    assert ours["related"] == {"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "name": "nw"}
