"""Event-loop lag monitor: how late the loop runs a callback that was due.

Everything in the operator shares one event loop, so a blocking call (a large JSON parse, a sync
library, a GC pause) delays every watch, reconcile and lease renewal. The monitor sleeps for a fixed
interval and records the overshoot (actual elapsed minus requested) into
`nodewright_event_loop_lag_seconds` (histogram) and `nodewright_event_loop_lag_last_seconds` (gauge).
One timer per interval: negligible cost at the default 0.5 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class LagRecorder(Protocol):
    def record_loop_lag(self, seconds: float) -> None: ...


class EventLoopLagMonitor:
    def __init__(
        self,
        recorder: LagRecorder,
        *,
        interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self._recorder = recorder
        self._interval = interval
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Measure until cancelled."""
        while True:
            started = self._clock()
            await asyncio.sleep(self._interval)
            self._recorder.record_loop_lag(max(0.0, self._clock() - started - self._interval))

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name="event-loop-lag")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise
