"""Reflector and informer behaviour against a scripted API server, on a fake clock."""

from __future__ import annotations

import asyncio
import json
import random
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import structlog

from nodewright.kube.client import KubeClient
from nodewright.kube.clock import FakeClock
from nodewright.kube.informer import Informer
from nodewright.kube.reflector import LIST_PAGE_SIZE, Backoff
from nodewright.kube.resources import JSON, NODES, PODS
from nodewright.kube.trim import trim_node
from nodewright.sim.fleet import node_manifest
from tests.kubefake import NODES_C, FakeKube, WatchScript, node, pods_c, status_body
from tests.kubeutil import WatchRecorder, eventually


@dataclass
class Events:
    log: list[tuple[str, str]] = field(default_factory=list)

    def add(self, obj: JSON) -> None:
        self.log.append(("add", obj["metadata"]["name"]))

    def update(self, old: JSON, new: JSON) -> None:
        self.log.append(("update", new["metadata"]["name"]))

    def delete(self, obj: JSON) -> None:
        self.log.append(("delete", obj["metadata"]["name"]))


@dataclass
class Env:
    kube: FakeKube
    clock: FakeClock
    client: KubeClient
    metrics: WatchRecorder
    events: Events
    informers: list[Informer] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def informer(self, **kwargs: Any) -> Informer:
        kwargs.setdefault("inactivity_timeout", 10_000.0)
        informer = Informer(
            self.client, NODES, clock=self.clock, metrics=self.metrics, rng=random.Random(4), **kwargs
        )
        informer.add_handler(
            on_add=self.events.add, on_update=self.events.update, on_delete=self.events.delete
        )
        self.informers.append(informer)
        self.tasks.append(asyncio.create_task(informer.run()))
        return informer


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    kube = await FakeKube().start()
    clock = FakeClock()
    client = KubeClient(kube.config(), clock=clock, max_retries=0)
    e = Env(kube, clock, client, WatchRecorder(), Events())
    yield e
    for task in e.tasks:
        task.cancel()
    await asyncio.gather(*e.tasks, return_exceptions=True)
    await client.close()
    await kube.stop()


def store_names(informer: Informer) -> list[str]:
    return sorted(informer.store.keys())


def server_names(kube: FakeKube) -> list[str]:
    return sorted(kube.objects.get(NODES_C, {}))


async def test_paginated_list_then_watch(env: Env) -> None:
    for i in range(7):
        env.kube.put(NODES_C, node(f"n{i}", {"zone": "a"}))
    informer = env.informer(page_size=3, label_selector="zone=a")
    assert await informer.wait_for_sync(5)
    assert store_names(informer) == [f"n{i}" for i in range(7)]
    lists = [r for r in env.kube.requests if r.method == "GET" and "watch" not in r.query]
    assert [r.query.get("continue") for r in lists] == [None, "107:3", "107:6"]
    assert all(r.query["labelSelector"] == "zone=a" and r.query["limit"] == "3" for r in lists)
    assert "resourceVersion" not in lists[0].query  # a consistent list (see reflector docstring)
    await eventually(lambda: len(env.kube.watch_requests()) == 1)
    watch = env.kube.watch_requests()[0]
    assert watch.query["resourceVersion"] == "107"
    assert watch.query["allowWatchBookmarks"] == "true"
    assert 300 <= int(watch.query["timeoutSeconds"]) <= 600

    env.kube.put(NODES_C, node("n2", {"zone": "a", "gpu": "h100"}))
    await eventually(lambda: ("update", "n2") in env.events.log)
    assert informer.get("n2")["metadata"]["labels"]["gpu"] == "h100"  # type: ignore[index]
    env.kube.remove(NODES_C, "n3")
    await eventually(lambda: ("delete", "n3") in env.events.log)
    assert "n3" not in informer.store


async def test_bookmarks_advance_resource_version_and_resume(env: Env) -> None:
    env.kube.put(NODES_C, node("a"))
    informer = env.informer()
    assert await informer.wait_for_sync(5)
    await eventually(lambda: len(env.kube.watch_requests()) == 1)
    env.kube.bookmark(NODES_C)
    bookmark_rv = str(env.kube.rv)
    await eventually(lambda: informer.resource_version == bookmark_rv)
    assert env.events.log == [("add", "a")]  # a bookmark is not an object change
    env.kube.close_watches()  # server ends the watch (its timeoutSeconds): resume at once, no relist
    await eventually(lambda: len(env.kube.watch_requests()) == 2)
    assert env.kube.watch_requests()[1].query["resourceVersion"] == bookmark_rv
    assert env.metrics.relists == 1


async def test_disconnect_resumes_from_last_resource_version(env: Env) -> None:
    env.kube.put(NODES_C, node("a"))
    informer = env.informer()
    assert await informer.wait_for_sync(5)
    await eventually(lambda: len(env.kube.watch_requests()) == 1)
    env.kube.put(NODES_C, node("b"))
    await eventually(lambda: "b" in informer.store)
    seen_rv = informer.resource_version
    # The stream closes; changes made while disconnected are replayed from history on resume.
    env.kube.close_watches()
    env.kube.put(NODES_C, node("c"))
    env.kube.remove(NODES_C, "a")
    await eventually(lambda: store_names(informer) == ["b", "c"], clock=env.clock, advance=1.0)
    assert env.kube.watch_requests()[1].query["resourceVersion"] == seen_rv
    assert env.metrics.relists == 1  # resumed, not relisted


async def test_gone_event_relists_with_synthetic_deletes_and_updates(env: Env) -> None:
    for name in ("a", "b", "c"):
        env.kube.put(NODES_C, node(name))
    informer = env.informer()
    assert await informer.wait_for_sync(5)
    await eventually(lambda: len(env.kube.watch_requests()) == 1)
    env.events.log.clear()
    # Changes whose events we never receive, then the history is compacted past our resourceVersion.
    env.kube.silent_remove(NODES_C, "b")
    env.kube.silent_change(NODES_C, node("c", {"changed": "yes"}))
    env.kube.silent_change(NODES_C, node("d"))
    env.kube.compact()
    env.kube.close_watches()  # the resumed watch gets an ERROR event with code 410
    await eventually(lambda: store_names(informer) == server_names(env.kube), clock=env.clock, advance=1.0)
    assert sorted(env.events.log) == [("add", "d"), ("delete", "b"), ("update", "c")]
    assert informer.get("c")["metadata"]["labels"] == {"changed": "yes"}  # type: ignore[index]
    assert "gone" in env.metrics.restarts
    assert env.metrics.relists == 2


async def test_gone_http_status_relists(env: Env) -> None:
    env.kube.put(NODES_C, node("a"))
    env.kube.script(NODES_C, WatchScript(status=410, body=status_body(410, "Expired", "too old")))
    informer = env.informer()
    assert await informer.wait_for_sync(5)
    env.kube.silent_change(NODES_C, node("z"))
    await eventually(lambda: "z" in informer.store, clock=env.clock, advance=1.0)
    assert env.metrics.relists == 2
    assert env.metrics.restarts[0] == "gone"


async def test_non_200_stream_is_an_error_then_backoff_and_resume(env: Env) -> None:
    env.kube.put(NODES_C, node("a"))
    env.kube.script(NODES_C, WatchScript(status=500, body=status_body(500, "InternalError", "etcd down")))
    informer = env.informer()
    assert await informer.wait_for_sync(5)
    await eventually(lambda: env.metrics.restarts == ["http-500"])
    assert len(env.kube.watch_requests()) == 1
    assert env.clock.sleepers == 1  # backing off, not hammering
    env.clock.advance(0.8 * 2)  # first backoff is 0.8 s with up to 100 % jitter
    await eventually(lambda: len(env.kube.watch_requests()) == 2)
    rv = env.kube.watch_requests()[0].query["resourceVersion"]
    assert env.kube.watch_requests()[1].query["resourceVersion"] == rv  # resume, no relist
    env.kube.put(NODES_C, node("b"))
    await eventually(lambda: "b" in informer.store)
    assert env.metrics.relists == 1


async def test_malformed_line_is_logged_and_skipped(env: Env) -> None:
    later = node("y")
    later["metadata"]["resourceVersion"] = "500"
    first = node("x")
    first["metadata"]["resourceVersion"] = "499"
    env.kube.script(
        NODES_C,
        WatchScript(
            steps=[
                ("event", "ADDED", first),
                ("line", b"this is not json\n"),
                ("line", b'{"no": "type"}\n'),
                ("line", b"\n"),
                ("event", "ADDED", later),
                ("hang",),
            ]
        ),
    )
    informer = env.informer()
    with structlog.testing.capture_logs() as logs:
        assert await informer.wait_for_sync(5)
        await eventually(lambda: "y" in informer.store)
    assert "x" in informer.store
    assert informer.resource_version == "500"
    assert sum(1 for entry in logs if entry["event"] == "malformed watch line skipped") == 2
    assert env.metrics.restarts == []


async def test_inactivity_timeout_reconnects_from_last_resource_version(env: Env) -> None:
    only = node("x")
    only["metadata"]["resourceVersion"] = "321"
    env.kube.script(NODES_C, WatchScript(steps=[("event", "ADDED", only), ("hang",)]))
    informer = env.informer(inactivity_timeout=70.0)
    assert await informer.wait_for_sync(5)
    await eventually(lambda: "x" in informer.store)
    env.clock.advance(69.0)
    await asyncio.sleep(0.01)
    assert len(env.kube.watch_requests()) == 1
    # No byte for a whole watchdog period: the connection is dropped and the watch resumed.
    await eventually(lambda: len(env.kube.watch_requests()) == 2, clock=env.clock, advance=10.0)
    assert env.metrics.restarts == ["inactive"]
    assert env.kube.watch_requests()[1].query["resourceVersion"] == "321"


async def test_indexes_and_late_handlers(env: Env) -> None:
    kube = env.kube
    pods = pods_c("ns")
    for i, node_name in enumerate(["n1", "n1", "n2"]):
        kube.put(pods, {"metadata": {"name": f"p{i}"}, "spec": {"nodeName": node_name}})
    informer = Informer(env.client, PODS, namespace="ns", clock=env.clock, inactivity_timeout=10_000.0)
    informer.add_index("node", lambda pod: [pod["spec"]["nodeName"]])
    env.tasks.append(asyncio.create_task(informer.run()))
    assert await informer.wait_for_sync(5)
    assert sorted(p["metadata"]["name"] for p in informer.by_index("node", "n1")) == ["p0", "p1"]
    late: list[str] = []
    informer.add_handler(on_add=lambda o: late.append(o["metadata"]["name"]))
    assert sorted(late) == ["p0", "p1", "p2"]  # synthetic adds for what is cached
    await eventually(lambda: len(kube.watch_requests()) == 1)
    kube.put(pods, {"metadata": {"name": "p1"}, "spec": {"nodeName": "n2"}})
    await eventually(lambda: len(informer.by_index("node", "n2")) == 2)
    assert [p["metadata"]["name"] for p in informer.by_index("node", "n1")] == ["p0"]


async def test_trimmed_cache_tracks_server(env: Env) -> None:
    env.kube.put(NODES_C, node("a", {"k": "v"}, status={"images": [{"names": ["x"]}]}))
    informer = env.informer(transform=trim_node)
    assert await informer.wait_for_sync(5)
    cached = informer.get("a")
    assert cached is not None and "images" not in cached["status"]
    assert cached["metadata"]["labels"] == {"k": "v"}


def test_backoff_grows_caps_and_resets() -> None:
    clock = FakeClock()
    backoff = Backoff(clock=clock, rng=random.Random(1))
    delays = []
    for _ in range(10):
        delays.append(backoff.next_delay())
        clock.advance(1.0)
    assert 0.8 <= delays[0] <= 1.6
    assert all(d <= 30.0 for d in delays)
    assert delays[-1] == 30.0
    clock.advance(121.0)
    assert backoff.next_delay() <= 1.6


async def test_transform_error_relists_instead_of_stopping(env: Env) -> None:
    env.kube.put(NODES_C, node("a"))
    calls: list[str] = []

    def flaky(obj: JSON) -> JSON:
        calls.append(obj["metadata"]["name"])
        if obj["metadata"]["name"] == "bad" and calls.count("bad") == 1:
            raise KeyError("boom")
        return obj

    informer = env.informer(transform=flaky)
    assert await informer.wait_for_sync(5)
    await eventually(lambda: len(env.kube.watch_requests()) == 1)
    env.kube.put(NODES_C, node("bad"))
    await eventually(lambda: "bad" in informer.store, clock=env.clock, advance=1.0)
    assert "error" in env.metrics.restarts and env.metrics.relists == 2


def test_a_list_page_of_gpu_nodes_decodes_within_its_memory_budget() -> None:
    """A list page is decoded whole before the transform trims it, and what it occupied stays in the
    allocator's pools among the trimmed copies kept from it: an idle operator with 1,000 cached nodes
    held 2.5 MiB more with pages of 100 than of 25 (docs/benchmarks.md "Idle memory")."""
    items = [node_manifest(i, profile="mixed") for i in range(LIST_PAGE_SIZE)]
    body = json.dumps({"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": items})
    tracemalloc.start()
    try:
        decoded = json.loads(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(decoded["items"]) == LIST_PAGE_SIZE
    assert peak <= 384 * 1024, f"a page of {LIST_PAGE_SIZE} GPU nodes decodes into {peak // 1024} KiB"
