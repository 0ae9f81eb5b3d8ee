"""Helpers shared by the kube-layer unit tests: metric recorders and a polling wait."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from nodewright.kube.clock import FakeClock


async def eventually(
    predicate: Callable[[], bool],
    *,
    clock: FakeClock | None = None,
    advance: float = 0.0,
    within: float = 5.0,
) -> None:
    """Wait (for local HTTP I/O) until `predicate()` holds; optionally move the fake clock meanwhile.

    Real time here only bounds how long the loopback I/O may take; the behaviour under test runs
    on the fake clock, which moves by `advance` whenever something sleeps on it.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not predicate():
        if loop.time() > end:
            raise AssertionError("condition not reached")
        if clock is not None and advance and clock.sleepers:
            clock.advance(advance)
        await asyncio.sleep(0.002)


@dataclass
class WatchRecorder:
    restarts: list[str] = field(default_factory=list)
    relists: int = 0
    events: list[str] = field(default_factory=list)

    def init_resource(
        self, *, resource: str, restart_reasons: Sequence[str], event_types: Sequence[str]
    ) -> None:
        return None

    def restart(self, *, resource: str, reason: str) -> None:
        self.restarts.append(reason)

    def relist(self, *, resource: str) -> None:
        self.relists += 1

    def event(self, *, resource: str, event_type: str) -> None:
        self.events.append(event_type)


@dataclass
class RequestRecorder:
    calls: list[tuple[str, str, str]] = field(default_factory=list)

    def observe(self, *, verb: str, resource: str, code: str, seconds: float) -> None:
        self.calls.append((verb, resource, code))


@dataclass
class LeaderRecorder:
    changes: list[bool] = field(default_factory=list)

    def set_leader(self, *, name: str, leading: bool) -> None:
        self.changes.append(leading)
