"""Injected time for the kube layer.

Everything here that waits or measures elapsed time (work-queue delays and backoff, token buckets,
reflector backoff and the watch inactivity watchdog, lease expiry, client retries) takes a `Clock`
instead of calling `time.monotonic()` / `asyncio.sleep()` directly. Production uses `SystemClock`;
tests use `FakeClock`, whose time only moves when the test says so (or, with `autojump=True`, jumps
forward to the deadline of every sleep), so backoff, lease and timeout behaviour is tested instantly
and deterministically.

Only monotonic time is modelled. Wall-clock timestamps that must be written to the API (a Lease's
`renewTime`) are produced by separate callables and never used for decisions.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


SYSTEM_CLOCK = SystemClock()


class FakeClock:
    """A manually driven monotonic clock for tests.

    `sleep()` parks the caller until `advance()` moves time past its deadline. With `autojump=True`
    a sleep moves time forward by itself (after yielding once to the loop), which suits code that
    only needs "the delay was respected" rather than interleaving with other sleepers.
    """

    def __init__(self, start: float = 1000.0, *, autojump: bool = False) -> None:
        self._now = start
        self._autojump = autojump
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.slept.append(seconds)
        if self._autojump:
            await asyncio.sleep(0)
            self._now += seconds
            self._wake()
            return
        if seconds == 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has passed."""
        self._now += seconds
        self._wake()

    @property
    def sleepers(self) -> int:
        self._drop_cancelled()
        return len(self._sleepers)

    def _drop_cancelled(self) -> None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)

    def _wake(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)


async def settle(rounds: int = 20) -> None:
    """Yield to the event loop a few times so that ready callbacks and tasks run."""
    for _ in range(rounds):
        await asyncio.sleep(0)
