"""`drain.allowForce` (chart) / `--allow-force-drain` (operator): without it, `drain.policy: force` never
deletes a pod -- the chart then grants no pod delete -- and the drain keeps evicting, saying why."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from nodewright.controller.drainer import FORCE_DISALLOWED, Drainer
from nodewright.kube.client import KubeClient
from tests.kubefake import FakeKube, pods_c


@pytest.fixture
async def fake() -> AsyncIterator[FakeKube]:
    server = await FakeKube().start()
    server.put(pods_c("work"), {"metadata": {"name": "held"}, "spec": {"nodeName": "n1"}})
    server.put(pods_c("work"), {"metadata": {"name": "free"}, "spec": {"nodeName": "n1"}})
    server.evictions["held"] = (429, "Cannot evict pod as it would violate the pod's disruption budget.")
    yield server
    await server.stop()


async def test_force_allowed_deletes_the_pods(fake: FakeKube) -> None:
    async with KubeClient(fake.config()) as client:
        report = await Drainer(client, allow_force=True).evict(
            "nw/n1", ["work/held", "work/free"], force=True
        )
    assert report.evicted == ("work/held", "work/free") and report.blocked == ()
    assert [r.method for r in fake.requests] == ["DELETE", "DELETE"]
    assert fake.objects[pods_c("work")] == {}


async def test_force_disallowed_evicts_and_says_why(fake: FakeKube) -> None:
    async with KubeClient(fake.config()) as client:
        drainer = Drainer(client, allow_force=False)
        report = await drainer.evict("nw/n1", ["work/held", "work/free"], force=True)
    assert not [r for r in fake.requests if r.method == "DELETE"]
    assert [r.path.rsplit("/", 1)[-1] for r in fake.requests] == ["eviction", "eviction"]
    assert report.evicted == ("work/free",)
    assert report.blocked[0] == FORCE_DISALLOWED
    assert report.blocked[1].startswith("work/held: ") and "disruption budget" in report.blocked[1]
    assert drainer.eviction_blocked("nw/n1") == report.blocked
    assert "held" in fake.objects[pods_c("work")]


async def test_without_force_nothing_changes(fake: FakeKube) -> None:
    async with KubeClient(fake.config()) as client:
        report = await Drainer(client, allow_force=False).evict("nw/n1", ["work/held"], force=False)
    assert FORCE_DISALLOWED not in report.blocked and len(report.blocked) == 1
