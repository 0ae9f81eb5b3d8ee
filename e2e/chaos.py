"""Chaos for e2e rollouts: SIGKILLed operator replicas, leader failovers and kube-apiserver restarts.

What a production control plane goes through, played on the real local control plane:

- `OperatorReplicas`: operator processes (`e2e/operator_fixture.OperatorProcess`) competing for one
  Lease, kept running the way a Deployment keeps its pods: a replica that exits (a leader that lost its
  Lease in an API-server outage exits on purpose) or was killed is started again, and a start that
  fails (the API server is still away) is retried after a pause, like CrashLoopBackOff. Starts run in
  threads, so the event loop (and the invariant monitor on it) never waits for them.
- `ChaosPlan`: a seeded schedule of `kill` (SIGKILL the leader; it is restarted at once and either
  replica may win the Lease), `failover` (SIGKILL the leader and keep it down until the standby leads)
  and `apiserver` (restart kube-apiserver: every watch is cut and answered 410 afterwards) events. Each
  fires once the rollout's progress (fraction of nodes complete) reaches its threshold, plus a random
  delay, so the events are spread over the rollout however fast it runs. The seed comes from
  `NODEWRIGHT_CHAOS_SEED` or is drawn at random; `describe()` prints it with the schedule so that a
  failing run can be replayed with the same schedule (the timing of the processes still varies).
- `run_chaos(...)`: plays a plan against replicas and the control plane and returns what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final, Literal, Self

from e2e.operator_fixture import OperatorProcess
from nodewright.sim.controlplane import ControlPlane

SEED_ENV: Final = "NODEWRIGHT_CHAOS_SEED"
RESTART_PAUSE: Final = 1.0
"""Seconds between failed starts of a replica (the API server may still be away)."""

ChaosKind = Literal["kill", "failover", "apiserver"]


def chaos_seed() -> int:
    """`NODEWRIGHT_CHAOS_SEED` if set (to replay a run), else a fresh random seed."""
    text = os.environ.get(SEED_ENV, "").strip()
    if text:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{SEED_ENV}={text!r} is not an integer seed") from None
    return random.SystemRandom().randrange(2**32)


@dataclass(frozen=True)
class ChaosEvent:
    kind: ChaosKind
    at_progress: float
    """Fraction of the fleet complete (0..1) before the event may fire."""
    delay: float
    """Seconds to wait after the threshold is reached (lands the event at a random point of a stage)."""

    def __str__(self) -> str:
        return f"{self.kind} at {self.at_progress:.0%} complete + {self.delay:.1f}s"


@dataclass(frozen=True)
class ChaosPlan:
    seed: int
    events: tuple[ChaosEvent, ...]

    @classmethod
    def build(
        cls,
        seed: int,
        *,
        kills: int,
        apiserver_restarts: int,
        failovers: int,
        spread: tuple[float, float] = (0.0, 0.7),
        max_delay: float = 3.0,
    ) -> ChaosPlan:
        """Events in a seeded random order at seeded random progress thresholds within `spread`."""
        rng = random.Random(seed)
        counts: tuple[tuple[ChaosKind, int], ...] = (
            ("kill", kills),
            ("apiserver", apiserver_restarts),
            ("failover", failovers),
        )
        kinds = [kind for kind, n in counts for _ in range(n)]
        rng.shuffle(kinds)
        thresholds = sorted(rng.uniform(*spread) for _ in kinds)
        events = tuple(
            ChaosEvent(kind, round(at, 3), round(rng.uniform(0.0, max_delay), 2))
            for kind, at in zip(kinds, thresholds, strict=True)
        )
        return cls(seed, events)

    def describe(self) -> str:
        lines = [f"chaos seed {self.seed} (replay: {SEED_ENV}={self.seed}), {len(self.events)} events:"]
        lines += [f"  {i + 1:2}. {event}" for i, event in enumerate(self.events)]
        return "\n".join(lines)


class OperatorReplicas:
    """Leader-elected operator replicas, restarted whenever they are not running (see module docstring)."""

    def __init__(self, replicas: Sequence[OperatorProcess]) -> None:
        assert all(op.leader_election for op in replicas), "replicas must run with leader election"
        self.replicas = list(replicas)
        self.held: set[int] = set()
        """Replicas (by index) not to restart for now: a failover keeps the killed leader down."""
        self.restarts = 0
        self.failed_starts = 0
        self.notes: list[str] = []
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self._t0 = time.monotonic()

    async def __aenter__(self) -> Self:
        await asyncio.gather(*(asyncio.to_thread(op.start) for op in self.replicas if not op.running))
        self._tasks = [
            asyncio.create_task(self._supervise(i), name=f"operator-replica-{i}")
            for i in range(len(self.replicas))
        ]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # No cancel: a start in progress runs in a thread, which a cancel would leave behind (and its
        # process with it, unseen by the teardown). The loops see `_closing` and end after it.
        self._closing = True
        await asyncio.gather(*self._tasks)

    def note(self, text: str) -> None:
        self.notes.append(f"t={time.monotonic() - self._t0:6.1f}s {text}")

    async def _supervise(self, index: int) -> None:
        op = self.replicas[index]
        while not self._closing:
            if op.running or index in self.held:
                await asyncio.sleep(0.2)
                continue
            code = op.proc.returncode if op.proc is not None else None
            try:
                await asyncio.to_thread(op.start)
                self.restarts += 1
                self.note(f"replica {index} started again (it had exited with {code})")
            except (RuntimeError, TimeoutError) as err:
                self.failed_starts += 1
                self.note(f"replica {index} failed to start: {str(err).splitlines()[0]}")
                await asyncio.sleep(RESTART_PAUSE)

    async def _status(self) -> list[dict[str, object] | None]:
        return list(await asyncio.gather(*(asyncio.to_thread(op.readyz) for op in self.replicas)))

    async def leader(self, *, within: float, other_than: OperatorProcess | None = None) -> OperatorProcess:
        """The replica that says it leads (and is ready), waiting up to `within` seconds for one."""
        deadline = time.monotonic() + within
        while True:
            for op, status in zip(self.replicas, await self._status(), strict=True):
                if op is not other_than and status and status.get("leader") and status.get("ready"):
                    return op
            if time.monotonic() > deadline:
                raise TimeoutError(f"no replica leads after {within:.0f}s; replicas: {await self._status()}")
            await asyncio.sleep(0.2)

    async def all_ready(self, *, within: float) -> None:
        deadline = time.monotonic() + within
        while not all(status and status.get("ready") for status in await self._status()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"replicas not all ready after {within:.0f}s: {await self._status()}")
            await asyncio.sleep(0.2)

    async def kill_leader(self, *, within: float) -> OperatorProcess:
        """SIGKILL the leader; the supervisor starts it again at once."""
        leader = await self.leader(within=within)
        await asyncio.to_thread(leader.kill)
        self.note(f"SIGKILL leader replica {self.replicas.index(leader)}")
        return leader

    async def fail_over(self, *, within: float) -> float:
        """SIGKILL the leader and keep it down until another replica leads; returns how long that took."""
        await self.all_ready(within=within)
        leader = await self.leader(within=within)
        index = self.replicas.index(leader)
        self.held.add(index)
        try:
            await asyncio.to_thread(leader.kill)
            killed_at = time.monotonic()
            self.note(f"failover: SIGKILL leader replica {index}, held down")
            successor = await self.leader(within=within, other_than=leader)
            took = time.monotonic() - killed_at
            self.note(f"failover: replica {self.replicas.index(successor)} leads {took:.1f}s later")
            return took
        finally:
            self.held.discard(index)


@dataclass
class ChaosReport:
    fired: list[ChaosEvent] = field(default_factory=list)
    unfired: list[ChaosEvent] = field(default_factory=list)
    failovers: list[float] = field(default_factory=list)
    """Seconds from the leader's SIGKILL until the standby led, per failover."""
    timeline: list[str] = field(default_factory=list)


async def _reached(progress: Callable[[], float], threshold: float) -> float:
    """Wait until `progress()` reaches `threshold` or 1.0; returns the progress then."""
    while True:
        now = progress()
        if now >= threshold or now >= 1.0:
            return now
        await asyncio.sleep(0.2)


async def run_chaos(
    plan: ChaosPlan,
    *,
    replicas: OperatorReplicas,
    cluster: ControlPlane,
    progress: Callable[[], float],
    leader_within: float,
) -> ChaosReport:
    """Play `plan`: each event once `progress()` reaches its threshold and a replica leads.

    Events whose threshold is not reached before progress hits 1.0 (the rollout finished first) are
    reported as unfired: the caller decides whether that fails the test (a fleet too fast for its plan).
    """
    report = ChaosReport()
    start = time.monotonic()

    def log(text: str) -> None:
        report.timeline.append(f"t={time.monotonic() - start:6.1f}s {progress():4.0%} complete: {text}")

    for i, event in enumerate(plan.events):
        if await _reached(progress, event.at_progress) >= 1.0:
            report.unfired = list(plan.events[i:])
            log(f"rollout complete; {len(report.unfired)} events did not fire")
            break
        await asyncio.sleep(event.delay)
        # Chaos on a system that has not recovered from the previous event tests nothing new.
        await replicas.leader(within=leader_within)
        log(f"event {i + 1}: {event}")
        if event.kind == "kill":
            await replicas.kill_leader(within=leader_within)
        elif event.kind == "failover":
            report.failovers.append(await replicas.fail_over(within=leader_within))
        else:
            took = time.monotonic()
            await asyncio.to_thread(cluster.restart_apiserver)
            log(f"kube-apiserver restarted in {time.monotonic() - took:.1f}s")
        report.fired.append(event)
    with contextlib.suppress(TimeoutError):
        await replicas.leader(within=leader_within)
    return report
