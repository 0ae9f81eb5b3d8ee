"""Lease-based leader election against the fake API server, on a fake monotonic clock."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator

import pytest

from nodewright.kube.client import KubeClient
from nodewright.kube.clock import FakeClock
from nodewright.kube.leaderelection import LeaderElector
from tests.kubefake import LEASES_C, FakeKube
from tests.kubeutil import LeaderRecorder, eventually

NS = "nodewright-system"


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    server = await FakeKube().start()
    yield server
    await server.stop()


@pytest.fixture
async def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def client(kube: FakeKube, clock: FakeClock) -> AsyncIterator[KubeClient]:
    c = KubeClient(kube.config(), clock=clock, max_retries=0)
    yield c
    await c.close()


def elector(client: KubeClient, clock: FakeClock, identity: str, **kw: object) -> LeaderElector:
    # Wall clocks of the two candidates disagree wildly: decisions must not depend on them.
    skew = {"a": 0, "b": -3600}[identity]
    return LeaderElector(
        client,
        namespace=NS,
        name="nodewright-operator",
        identity=identity,
        clock=clock,
        wall=lambda: dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=clock.monotonic() + skew),
        **kw,  # type: ignore[arg-type]
    )


def holder(kube: FakeKube) -> str | None:
    lease = kube.get(LEASES_C, "nodewright-operator")
    return None if lease is None else lease["spec"].get("holderIdentity")


async def test_acquire_creates_lease_and_other_candidate_waits(
    kube: FakeKube, client: KubeClient, clock: FakeClock
) -> None:
    metrics = LeaderRecorder()
    a = elector(client, clock, "a", metrics=metrics)
    b = elector(client, clock, "b")
    await a.acquire()
    assert a.is_leader and holder(kube) == "a" and metrics.changes == [False, True]  # a standby first
    spec = kube.get(LEASES_C, "nodewright-operator")["spec"]  # type: ignore[index]
    assert spec["leaseDurationSeconds"] == 15 and spec["leaseTransitions"] == 0
    assert not await b.try_acquire_or_renew(deadline=5)
    assert b.observed_holder == "a"


async def test_leader_renews_every_retry_period(kube: FakeKube, client: KubeClient, clock: FakeClock) -> None:
    a = elector(client, clock, "a")
    await a.acquire()
    first = kube.get(LEASES_C, "nodewright-operator")["spec"]["renewTime"]  # type: ignore[index]
    hold = asyncio.create_task(a.hold())
    for _ in range(5):
        await eventually(lambda: clock.sleepers == 1)
        clock.advance(2.0)
    await eventually(lambda: kube.count("PUT", "/leases/") >= 4)
    renewed = kube.get(LEASES_C, "nodewright-operator")["spec"]  # type: ignore[index]
    assert renewed["renewTime"] > first and renewed["holderIdentity"] == "a"
    assert renewed["acquireTime"] == first  # acquireTime kept while the holder does not change
    assert a.is_leader
    hold.cancel()
    await asyncio.gather(hold, return_exceptions=True)


async def test_takeover_only_after_lease_duration_without_renewal(
    kube: FakeKube, client: KubeClient, clock: FakeClock
) -> None:
    a = elector(client, clock, "a")
    b = elector(client, clock, "b")
    await a.acquire()
    # "a" dies without releasing. "b" first sees the record now and times it on its own clock.
    assert not await b.try_acquire_or_renew(deadline=5)
    clock.advance(14.9)
    assert not await b.try_acquire_or_renew(deadline=5)
    clock.advance(0.2)
    assert await b.try_acquire_or_renew(deadline=5)
    spec = kube.get(LEASES_C, "nodewright-operator")["spec"]  # type: ignore[index]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    # The old leader, coming back, sees "b" holding a fresh lease and does not act.
    assert not await a.try_acquire_or_renew(deadline=5)
    assert not a.is_leader


async def test_renewals_reset_the_expiry_timer_of_standbys(
    kube: FakeKube, client: KubeClient, clock: FakeClock
) -> None:
    a = elector(client, clock, "a")
    b = elector(client, clock, "b")
    await a.acquire()
    for _ in range(10):  # 20 s of healthy renewals, observed by b each time
        clock.advance(2.0)
        assert await a.try_acquire_or_renew(deadline=5)
        assert not await b.try_acquire_or_renew(deadline=5)
    assert holder(kube) == "a"


async def test_leader_steps_down_when_renewal_fails_past_deadline(
    kube: FakeKube, client: KubeClient, clock: FakeClock
) -> None:
    metrics = LeaderRecorder()
    a = elector(client, clock, "a", metrics=metrics)
    await a.acquire()
    kube.fail("GET", "/leases/", 500, times=1000)  # the API server is failing
    hold = asyncio.create_task(a.hold())
    await eventually(lambda: hold.done(), clock=clock, advance=0.5)
    assert not a.is_leader and metrics.changes == [False, True, False]
    # It gave up within retry period + renew deadline of its last success.
    assert clock.monotonic() - 1000.0 <= 2.0 + 10.0 + 0.5
    assert clock.monotonic() - 1000.0 >= 2.0 + 10.0
    assert not await a.release()  # not leading any more: nothing to release


async def test_release_lets_standby_take_over_at_once(
    kube: FakeKube, client: KubeClient, clock: FakeClock
) -> None:
    a = elector(client, clock, "a")
    b = elector(client, clock, "b")
    await a.acquire()
    assert not await b.try_acquire_or_renew(deadline=5)
    assert await a.release()
    assert holder(kube) is None and not a.is_leader
    assert await b.try_acquire_or_renew(deadline=5)  # no need to wait out the lease
    assert holder(kube) == "b"


async def test_conflicting_writes_elect_exactly_one(
    kube: FakeKube, client: KubeClient, clock: FakeClock
) -> None:
    candidates = [elector(client, clock, "a"), elector(client, clock, "b")]
    results = await asyncio.gather(*(c.try_acquire_or_renew(deadline=5) for c in candidates))
    assert sorted(results) == [False, True]
    assert holder(kube) == ("a" if results[0] else "b")


def test_timing_validation(client: KubeClient) -> None:
    with pytest.raises(ValueError):
        LeaderElector(client, namespace=NS, name="x", lease_duration=5, renew_deadline=10)
