"""Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics.

The Lease's spec records the holder: `holderIdentity`, `leaseDurationSeconds`, `acquireTime`,
`renewTime`, `leaseTransitions`. Every write is a PUT carrying the resourceVersion that was read, so
two candidates racing for the lease cannot both win: one gets `409 Conflict`.

Expiry is judged with the *local monotonic clock*, never by comparing the lease's `renewTime` (another
machine's wall clock) with ours: a candidate remembers when it last saw the lease record *change*
(holder, renewTime, ...) and considers the lease expired once `leaseDurationSeconds` have passed on its
own monotonic clock without a change. Clock skew between machines therefore cannot cause two leaders.

Timing (defaults as controller-runtime: lease 15 s, renew deadline 10 s, retry period 2 s):

- A standby tries to acquire every retry period (with jitter).
- The leader renews every retry period. A renewal *round* may retry until the renew deadline has
  passed since the round began; if no attempt succeeded by then, the leader steps down: `hold()`
  returns and the caller must stop acting at once.
- Safety margin: the leader's last successful renew is at most one retry period before a failing round
  starts, so it stops acting at most `retry + renew_deadline` = 12 s after the last renew a standby
  could have observed; a standby takes over no sooner than `lease_duration` = 15 s after that.
- Each API call carries its own deadline (never longer than what is left of the round).
- On clean shutdown the leader releases the lease (empty holder, `leaseDurationSeconds: 1`), so a
  standby takes over within a retry period instead of waiting out the lease.

`LeaderMetrics.set_leader(name=..., leading=...)` reports `leader_election_master_status`: 0 from the
elector's creation (a standby says it is one, instead of exporting nothing), 1 while leading.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import random
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import structlog

from nodewright.kube.client import KubeClient
from nodewright.kube.clock import SYSTEM_CLOCK, Clock
from nodewright.kube.hooks import LeaderMetrics, NoopLeaderMetrics
from nodewright.kube.resources import JSON, LEASES, ApiError, Conflict, NotFound

log = structlog.get_logger("nodewright.kube.leaderelection")


def default_identity() -> str:
    """Pod name (or hostname) plus a random suffix: a restarted pod is a new candidate."""
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


def _micro_time(now: dt.datetime) -> str:
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(spec: JSON) -> tuple[Any, ...]:
    return (
        spec.get("holderIdentity"),
        spec.get("leaseDurationSeconds"),
        spec.get("acquireTime"),
        spec.get("renewTime"),
        spec.get("leaseTransitions"),
    )


@dataclass
class LeaderElector:
    client: KubeClient
    namespace: str
    name: str
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    clock: Clock = SYSTEM_CLOCK
    wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    metrics: LeaderMetrics = field(default_factory=NoopLeaderMetrics)
    rng: random.Random = field(default_factory=random.Random)
    _observed: tuple[Any, ...] | None = field(default=None, init=False)
    _observed_at: float = field(default=0.0, init=False)
    _lease: JSON | None = field(default=None, init=False)
    _leading: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if not (self.lease_duration > self.renew_deadline > 1.2 * self.retry_period > 0):
            raise ValueError("need lease_duration > renew_deadline > 1.2 * retry_period > 0")
        self.metrics.set_leader(name=self.name, leading=False)

    @property
    def is_leader(self) -> bool:
        return self._leading

    @property
    def observed_holder(self) -> str | None:
        return None if self._observed is None else self._observed[0]

    # -- the protocol ---------------------------------------------------------------------------------

    async def acquire(self) -> None:
        """Block until this candidate holds the lease."""
        log.info("waiting to acquire leadership", lease=self.name, identity=self.identity)
        while not await self.try_acquire_or_renew(deadline=self.renew_deadline):
            await self.clock.sleep(self.retry_period * (1.0 + 0.2 * self.rng.random()))
        log.info("acquired leadership", lease=self.name, identity=self.identity)

    async def hold(self) -> None:
        """Renew while leading; returns when a renewal round fails past the renew deadline."""
        while self._leading:
            await self.clock.sleep(self.retry_period)
            if not self._leading:
                return
            round_end = self.clock.monotonic() + self.renew_deadline
            while not await self.try_acquire_or_renew(deadline=round_end - self.clock.monotonic()):
                remaining = round_end - self.clock.monotonic()
                if remaining <= 0:
                    self._set_leading(False)
                    log.error("failed to renew the lease in time: stopped leading", lease=self.name)
                    return
                await self.clock.sleep(min(self.retry_period, remaining))

    async def release(self) -> bool:
        """Give the lease up (clean shutdown); True if released. Only the holder can release."""
        if not self._leading or self._lease is None:
            return False
        self._set_leading(False)
        lease = self._lease
        now = _micro_time(self.wall())
        spec = dict(lease.get("spec") or {})
        spec.update(holderIdentity=None, leaseDurationSeconds=1, renewTime=now, acquireTime=now)
        try:
            async with asyncio.timeout(self.renew_deadline):
                await self.client.replace(LEASES, {**lease, "spec": spec}, namespace=self.namespace)
        except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("could not release the lease", lease=self.name, error=repr(exc))
            return False
        log.info("released the lease", lease=self.name, identity=self.identity)
        return True

    async def try_acquire_or_renew(self, *, deadline: float) -> bool:
        """One attempt (bounded by `deadline` seconds); True if we hold the lease afterwards."""
        if deadline <= 0:
            return False
        try:
            async with asyncio.timeout(deadline):
                return await self._attempt()
        except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("lease attempt failed", lease=self.name, error=repr(exc))
            return False

    async def _attempt(self) -> bool:
        now = _micro_time(self.wall())
        try:
            lease = await self.client.get(LEASES, self.name, namespace=self.namespace)
        except NotFound:
            return await self._create(now)
        spec = lease.get("spec") or {}
        record = _record(spec)
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock.monotonic()
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity:
            if self.clock.monotonic() < self._observed_at + duration:
                self._set_leading(False)
                return False  # held by someone else and not expired (by our own clock)
            log.info("lease expired, taking over", lease=self.name, previous=holder)
        ours = holder == self.identity
        new_spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration),
            "acquireTime": spec.get("acquireTime") if ours else now,
            "renewTime": now,
            "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if ours else 1),
        }
        try:
            updated = await self.client.replace(LEASES, {**lease, "spec": new_spec}, namespace=self.namespace)
        except Conflict:
            return False  # someone else wrote first; the next attempt re-reads
        self._won(updated)
        return True

    async def _create(self, now: str) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.lease_duration),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            created = await self.client.create(LEASES, body, namespace=self.namespace)
        except Conflict:
            return False
        self._won(created)
        return True

    def _won(self, lease: JSON) -> None:
        self._lease = lease
        self._observed, self._observed_at = _record(lease.get("spec") or {}), self.clock.monotonic()
        self._set_leading(True)

    def _set_leading(self, leading: bool) -> None:
        if leading != self._leading:
            self._leading = leading
            self.metrics.set_leader(name=self.name, leading=leading)
