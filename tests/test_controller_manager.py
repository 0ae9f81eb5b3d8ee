"""The Manager against the fake API server: sync → lead → reconcile → orderly shutdown; health probes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from nodewright.controller.manager import LeaderElectionConfig, Manager
from nodewright.kube.client import KubeClient
from nodewright.kube.resources import NODES
from nodewright.kube.trim import trim_node
from nodewright.kube.workqueue import Result
from tests.kubefake import LEASES_C, NODES_C, FakeKube, node
from tests.kubeutil import eventually


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    server = await FakeKube().start()
    yield server
    await server.stop()


async def get_json(port: int, path: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(total=5)) as r,
    ):
        return r.status, (await r.json() if r.content_type == "application/json" else {})


async def test_manager_reconciles_keys_while_leading_and_shuts_down_in_order(kube: FakeKube) -> None:
    kube.put(NODES_C, node("a"))
    kube.put(NODES_C, node("b"))
    manager = Manager(
        KubeClient(kube.config()),
        leader_election=LeaderElectionConfig(namespace="nodewright-system", identity="me"),
        health_bind_address="127.0.0.1:0",
    )
    nodes = manager.informer(NODES, transform=trim_node)
    assert manager.informer(NODES, transform=trim_node) is nodes  # shared
    seen: list[str] = []
    in_flight = asyncio.Event()
    release = asyncio.Event()

    async def reconcile(key: str) -> Result | None:
        seen.append(key)
        if key == "slow":
            in_flight.set()
            await release.wait()
        return None

    controller = manager.controller("nodes", reconcile, workers=2)
    controller.watch(nodes)
    with pytest.raises(ValueError):
        manager.controller("nodes", reconcile)
    run = asyncio.create_task(manager.run(handle_signals=False))
    await eventually(lambda: manager.leading)
    await eventually(lambda: sorted(seen) == ["a", "b"])
    assert kube.get(LEASES_C, "nodewright-operator")["spec"]["holderIdentity"] == "me"  # type: ignore[index]
    port = manager.health.port
    assert port is not None
    assert await get_json(port, "/readyz") == (
        200, {"ready": True, "synced": {"nodes": True}, "leader": True, "identity": "me"}
    )  # fmt: skip
    assert (await get_json(port, "/healthz"))[0] == 200
    kube.put(NODES_C, node("a", {"changed": "1"}))
    await eventually(lambda: seen.count("a") == 2)
    # An in-flight reconcile is allowed to finish on shutdown, then the Lease is released.
    controller.queue.add("slow")
    await in_flight.wait()
    manager.stop()
    await asyncio.sleep(0.05)
    assert not run.done()
    release.set()
    assert await run == 0
    assert kube.get(LEASES_C, "nodewright-operator")["spec"]["holderIdentity"] is None  # type: ignore[index]


async def test_manager_exits_1_when_leadership_is_lost(kube: FakeKube) -> None:
    kube.put(NODES_C, node("a"))
    manager = Manager(
        KubeClient(kube.config(), max_retries=0),
        leader_election=LeaderElectionConfig(
            namespace="nodewright-system",
            identity="me",
            lease_duration=1.5,
            renew_deadline=1.0,
            retry_period=0.2,
        ),
        health_bind_address="0",
    )
    manager.controller("c", lambda key: asyncio.sleep(0, None)).watch(manager.informer(NODES))
    run = asyncio.create_task(manager.run(handle_signals=False))
    await eventually(lambda: manager.leading)
    kube.fail("GET", "/leases/", 500, times=10_000)
    assert await asyncio.wait_for(run, 10) == 1
    assert not manager.leading


async def test_sync_timeout_fails_run(kube: FakeKube) -> None:
    kube.fail("GET", "/nodes", 500, times=10_000)
    manager = Manager(KubeClient(kube.config(), max_retries=0), health_bind_address="0", sync_timeout=0.3)
    manager.informer(NODES)
    assert await manager.run(handle_signals=False) == 1


async def test_controller_records_reconcile_metrics() -> None:
    from nodewright.controller.manager import Controller
    from nodewright.kube.workqueue import WorkQueue
    from nodewright.observability.metrics import OperatorMetrics

    metrics = OperatorMetrics(otlp=False)
    outcomes: list[Result | None] = [None, Result(requeue_after=5.0)]

    async def reconcile(key: str) -> Result | None:
        if not outcomes:
            raise RuntimeError("boom")
        return outcomes.pop(0)

    controller = Controller("rollout", reconcile, workers=1, queue=WorkQueue("rollout"), metrics=metrics)
    assert await controller.reconcile("a") is None
    assert await controller.reconcile("a") == Result(requeue_after=5.0)
    with pytest.raises(RuntimeError):
        await controller.reconcile("a")
    text = metrics.render().decode()
    for result in ("success", "requeue_after", "error"):
        assert f'controller_runtime_reconcile_total{{controller="rollout",result="{result}"}} 1.0' in text, (
            text
        )
    assert 'controller_runtime_reconcile_errors_total{controller="rollout"} 1.0' in text
    assert 'controller_runtime_reconcile_time_seconds_count{controller="rollout"} 3.0' in text


def _scrape(metrics: object) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    from nodewright.observability.metrics import OperatorMetrics

    assert isinstance(metrics, OperatorMetrics)
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }


async def test_a_standby_holds_no_keys_reports_standby_and_fills_its_queues_on_takeover(
    kube: FakeKube,
) -> None:
    """Issue 32: a standby kept every key its informers saw queued (workqueue_depth 21 on an idle
    fleet, so "queued work, no reconciles" alerted) and exported no leader_election_master_status
    sample. Now its queues stay closed until it leads, it says 0, and a takeover enqueues every key
    from the warm caches."""
    from nodewright.kube.client import KubeClient as Client
    from nodewright.observability.metrics import OperatorMetrics

    for name in ("a", "b", "c"):
        kube.put(NODES_C, node(name))
    other: dict[str, Any] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "nodewright-operator", "namespace": "nodewright-system"},
        "spec": {"holderIdentity": "other", "leaseDurationSeconds": 3600, "leaseTransitions": 0},
    }
    kube.put(LEASES_C, other)
    metrics = OperatorMetrics(otlp=False)
    manager = Manager(
        Client(kube.config()),
        leader_election=LeaderElectionConfig(
            namespace="nodewright-system",
            identity="me",
            lease_duration=3.0,
            renew_deadline=2.0,
            retry_period=0.2,
        ),
        health_bind_address="0",
        workqueue_metrics=metrics.workqueues,
        leader_metrics=metrics.leader,
    )
    seen: list[str] = []

    async def reconcile(key: str) -> Result | None:
        seen.append(key)
        return None

    controller = manager.controller("nodes", reconcile)
    controller.watch(manager.informer(NODES, transform=trim_node))
    run = asyncio.create_task(manager.run(handle_signals=False))
    try:
        assert manager.elector is not None
        await eventually(
            lambda: (
                manager.synced and manager.elector is not None and manager.elector.observed_holder == "other"
            )
        )
        kube.put(NODES_C, node("a", {"changed": "1"}))  # events keep arriving on a standby
        await eventually(
            lambda: (
                (manager.informers[0].get("a") or {}).get("metadata", {}).get("labels", {}).get("changed")
                == "1"
            )
        )
        scraped = _scrape(metrics)
        assert scraped[("leader_election_master_status", frozenset({("name", "nodewright-operator")}))] == 0
        assert scraped[("workqueue_depth", frozenset({("name", "nodes")}))] == 0
        assert len(controller.queue) == 0 and not seen and not manager.leading
        # The leader goes away (its lease released): the standby takes over and reconciles every node.
        kube.put(
            LEASES_C, {**other, "spec": {**other["spec"], "holderIdentity": None, "leaseDurationSeconds": 1}}
        )
        await eventually(lambda: sorted(seen) == ["a", "b", "c"], within=10)
        assert (
            _scrape(metrics)[("leader_election_master_status", frozenset({("name", "nodewright-operator")}))]
            == 1
        )
    finally:
        manager.stop()
        await asyncio.wait_for(run, 10)


async def test_without_leader_election_the_process_reports_itself_leading(kube: FakeKube) -> None:
    """A single replica run with --no-leader-elect acts: it says so, or NodeWrightOperatorNotLeading
    (no instance with leader_election_master_status == 1) would fire for ever."""
    from nodewright.kube.client import KubeClient as Client
    from nodewright.observability.metrics import OperatorMetrics

    metrics = OperatorMetrics(otlp=False)
    manager = Manager(
        Client(kube.config()), health_bind_address="0", leader_metrics=metrics.leader, lease_name="mine"
    )
    manager.controller("c", lambda key: asyncio.sleep(0, None)).watch(manager.informer(NODES))
    status = ("leader_election_master_status", frozenset({("name", "mine")}))
    assert _scrape(metrics)[status] == 0
    run = asyncio.create_task(manager.run(handle_signals=False))
    try:
        await eventually(lambda: manager.leading)
        assert _scrape(metrics)[status] == 1
    finally:
        manager.stop()
        await asyncio.wait_for(run, 10)
