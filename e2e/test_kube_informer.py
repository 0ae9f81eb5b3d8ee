"""Informers on the real control plane: scale sync, tracking another client's changes, and convergence
after an API-server restart and after etcd compaction (410 Gone → relist with synthetic deletes)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import pytest

from nodewright.kube.client import KubeClient
from nodewright.kube.config import load_kubeconfig
from nodewright.kube.informer import Informer
from nodewright.kube.resources import NODES
from nodewright.kube.trim import trim_node
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane


@dataclass
class Restarts:
    reasons: list[str] = field(default_factory=list)
    relists: int = 0

    def init_resource(
        self, *, resource: str, restart_reasons: Sequence[str], event_types: Sequence[str]
    ) -> None:
        return None

    def restart(self, *, resource: str, reason: str) -> None:
        self.reasons.append(reason)

    def relist(self, *, resource: str) -> None:
        self.relists += 1

    def event(self, *, resource: str, event_type: str) -> None:
        return None


@pytest.fixture
async def client(cluster: ControlPlane) -> AsyncIterator[KubeClient]:
    async with KubeClient(load_kubeconfig(cluster.kubeconfig), qps=500, burst=500) as c:
        yield c


async def eventually(predicate: Callable[[], object], *, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.25)


def cached_versions(informer: Informer) -> dict[str, str]:
    return {key: obj["metadata"]["resourceVersion"] for key, obj in informer.store._items.items()}


async def server_versions(client: KubeClient, selector: str) -> dict[str, str]:
    listed = await client.list(NODES, label_selector=selector)
    return {n["metadata"]["name"]: n["metadata"]["resourceVersion"] for n in listed.items}


async def converged(informer: Informer, client: KubeClient, selector: str) -> bool:
    """The cache holds exactly the server's objects at the server's versions (no lost, no phantom)."""
    return cached_versions(informer) == await server_versions(client, selector)


async def start(informer: Informer) -> asyncio.Task[None]:
    task = asyncio.create_task(informer.run())
    assert await informer.wait_for_sync(120), "informer did not sync"
    return task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def relabel(client: KubeClient, names: list[str], key: str, value: str | None) -> None:
    await asyncio.gather(*(client.patch_node_metadata(n, labels={key: value}) for n in names))


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_informer_syncs_5000_nodes_and_tracks_label_changes(
    cluster: ControlPlane, client: KubeClient, unique: str
) -> None:
    prefix = f"inf-{unique}"
    selector = f"{fleet.FLEET_LABEL}={prefix}"
    names = await fleet.create_nodes(cluster.kubeconfig, count=5000, profile="h100", name_prefix=prefix)
    try:
        informer = Informer(client, NODES, label_selector=selector, transform=trim_node)
        updates: list[str] = []
        informer.add_handler(on_update=lambda old, new: updates.append(new["metadata"]["name"]))
        started = time.monotonic()
        task = await start(informer)
        print(f"\n[e2e] informer synced 5000 nodes in {time.monotonic() - started:.1f}s")
        try:
            assert len(informer.store) == 5000
            sample = informer.get(names[1234])
            assert sample is not None and sample["metadata"]["labels"][fleet.FLEET_LABEL] == prefix
            assert "images" not in sample["status"]  # trimmed
            # Another client changes labels; the cache follows.
            changed = names[::100]
            await relabel(client, changed, "nodewright.io/e2e-mark", "on")
            await eventually(
                lambda: all(
                    (informer.get(n) or {})["metadata"]["labels"].get("nodewright.io/e2e-mark") == "on"
                    for n in changed
                ),
                within=60,
                what="label changes to reach the cache",
            )
            assert set(changed) <= set(updates)
            await eventually(lambda: converged(informer, client, selector), within=60, what="convergence")
        finally:
            await stop(task)
    finally:
        await fleet.delete_nodes(cluster.kubeconfig, names=names)


async def _mutate_fleet(
    client: KubeClient, cluster: ControlPlane, names: list[str], prefix: str
) -> list[str]:
    """Delete some nodes, relabel others, add new ones; returns the names now in the fleet."""
    await fleet.delete_nodes(cluster.kubeconfig, names=names[:10])
    await relabel(client, names[10:20], "nodewright.io/e2e-phase", "after")
    added = await fleet.create_nodes(
        cluster.kubeconfig, count=10, profile="h100", name_prefix=prefix, start_index=len(names)
    )
    return names[10:] + added


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_apiserver_restart_mid_watch_converges(
    cluster: ControlPlane, client: KubeClient, unique: str
) -> None:
    prefix = f"rst-{unique}"
    selector = f"{fleet.FLEET_LABEL}={prefix}"
    names = await fleet.create_nodes(cluster.kubeconfig, count=200, profile="h100", name_prefix=prefix)
    metrics = Restarts()
    informer = Informer(client, NODES, label_selector=selector, transform=trim_node, metrics=metrics)
    task = await start(informer)
    try:
        # Kill and restart kube-apiserver while the informer's watch is open.
        await asyncio.to_thread(cluster.restart_apiserver)
        names = await _mutate_fleet(client, cluster, names, prefix)
        await eventually(lambda: converged(informer, client, selector), within=120, what="convergence")
        assert metrics.reasons, "the watch should have been interrupted by the restart"
        assert not task.done()
    finally:
        await stop(task)
        await fleet.delete_nodes(cluster.kubeconfig, name_prefix=prefix)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_etcd_compaction_forces_relist_and_converges(
    cluster: ControlPlane, client: KubeClient, unique: str
) -> None:
    prefix = f"cmp-{unique}"
    selector = f"{fleet.FLEET_LABEL}={prefix}"
    names = await fleet.create_nodes(cluster.kubeconfig, count=200, profile="h100", name_prefix=prefix)
    metrics = Restarts()
    informer = Informer(client, NODES, label_selector=selector, transform=trim_node, metrics=metrics)
    task = await start(informer)
    others = await fleet.create_nodes(
        cluster.kubeconfig, count=5, profile="h100", name_prefix=f"oth-{unique}"
    )
    try:
        # Writes the informer does not watch move etcd's revision past the informer's resourceVersion;
        # compacting there makes that resourceVersion too old: resuming the watch must get 410.
        await relabel(client, others, "nodewright.io/e2e-bump", "1")
        await asyncio.to_thread(cluster.compact_etcd)
        names = await _mutate_fleet(client, cluster, names, prefix)
        await eventually(lambda: converged(informer, client, selector), within=120, what="convergence")
        assert "gone" in metrics.reasons, f"expected a 410 relist, saw {metrics.reasons}"
        assert metrics.relists >= 2
        assert len(informer.store) == len(names)
    finally:
        await stop(task)
        await fleet.delete_nodes(cluster.kubeconfig, name_prefix=prefix)
        await fleet.delete_nodes(cluster.kubeconfig, names=others)
