"""Event-loop lag monitor: records sleep overshoot; a blocked loop shows up as lag."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodewright.observability.loop_lag import EventLoopLagMonitor
from nodewright.observability.metrics import OperatorMetrics


def block_event_loop(seconds: float) -> None:
    """Stand-in for a blocking call made on the loop (what the monitor exists to detect)."""
    time.sleep(seconds)


class Recorder:
    def __init__(self) -> None:
        self.values: list[float] = []
        self.seen = asyncio.Event()

    def record_loop_lag(self, seconds: float) -> None:
        self.values.append(seconds)
        self.seen.set()


async def test_blocked_loop_is_measured() -> None:
    rec = Recorder()
    monitor = EventLoopLagMonitor(rec, interval=0.01)
    monitor.start()
    try:
        await asyncio.wait_for(rec.seen.wait(), timeout=5)
        rec.seen.clear()
        rec.values.clear()
        block_event_loop(0.15)
        await asyncio.wait_for(rec.seen.wait(), timeout=5)
    finally:
        await monitor.stop()
    assert rec.values[0] >= 0.1
    assert all(v >= 0 for v in rec.values)


async def test_feeds_operator_metrics() -> None:
    metrics = OperatorMetrics(otlp=False)
    monitor = EventLoopLagMonitor(metrics, interval=0.005)
    task = monitor.start()
    assert monitor.start() is task
    await asyncio.sleep(0.06)
    await monitor.stop()
    assert task.cancelled()
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(metrics.render().decode())
        for s in f.samples
        if s.name.startswith("nodewright_event_loop_lag")
    }
    assert samples["nodewright_event_loop_lag_seconds_count"] >= 2
    assert samples["nodewright_event_loop_lag_last_seconds"] >= 0


def test_rejects_bad_interval() -> None:
    with pytest.raises(ValueError, match="positive"):
        EventLoopLagMonitor(Recorder.__new__(Recorder), interval=0)


async def test_lag_is_overshoot_of_injected_clock() -> None:
    """Deterministic: the clock says 0.3 s passed for a 0.001 s sleep, so the lag is 0.299 s."""
    ticks = itertools.chain([10.0, 10.3], itertools.repeat(10.3))
    rec = Recorder()
    monitor = EventLoopLagMonitor(rec, interval=0.001, clock=lambda: next(ticks))
    monitor.start()
    await asyncio.wait_for(rec.seen.wait(), timeout=5)
    await monitor.stop()
    assert rec.values[0] == pytest.approx(0.299)
