"""KubeClient against the scripted API server: retries, limiter, conflicts, typed helpers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from nodewright.kube.client import EvictionOutcome, KubeClient, PatchType
from nodewright.kube.clock import FakeClock
from nodewright.kube.config import ClusterConfig
from nodewright.kube.credentials import StaticToken
from nodewright.kube.resources import JSON, LEASES, NODES, ApiError, Conflict, Gone, NotFound, TooManyRequests
from tests.kubefake import LEASES_C, NODES_C, FakeKube, WatchScript, node, pods_c, status_body
from tests.kubeutil import RequestRecorder


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    server = await FakeKube().start()
    yield server
    await server.stop()


@pytest.fixture
async def clock() -> FakeClock:
    return FakeClock(autojump=True)


@pytest.fixture
async def client(kube: FakeKube, clock: FakeClock) -> AsyncIterator[KubeClient]:
    c = KubeClient(kube.config(), clock=clock, metrics=RequestRecorder())
    yield c
    await c.close()


async def test_get_sends_token_and_counts_request(kube: FakeKube, client: KubeClient) -> None:
    kube.put(NODES_C, node("a"))
    got = await client.get(NODES, "a")
    assert got["metadata"]["name"] == "a"
    assert isinstance(client.metrics, RequestRecorder)
    assert client.metrics.calls == [("GET", "nodes", "200")]
    with pytest.raises(NotFound):
        await client.get(NODES, "missing")
    assert client.metrics.calls[-1] == ("GET", "nodes", "404")


async def test_429_is_retried_honouring_retry_after(
    kube: FakeKube, client: KubeClient, clock: FakeClock
) -> None:
    kube.put(NODES_C, node("a"))
    kube.fail("GET", "/nodes/a", 429, headers={"Retry-After": "7"}, times=2)
    got = await client.get(NODES, "a")
    assert got["metadata"]["name"] == "a"
    assert clock.slept == [7.0, 7.0]
    assert kube.count("GET", "/nodes/a") == 3


async def test_5xx_retried_with_growing_backoff_then_gives_up(
    kube: FakeKube, client: KubeClient, clock: FakeClock
) -> None:
    kube.fail("GET", "/nodes/a", 503, times=100)
    with pytest.raises(ApiError) as info:
        await client.get(NODES, "a")
    assert info.value.status == 503
    assert kube.count("GET", "/nodes/a") == client.max_retries + 1
    assert len(clock.slept) == client.max_retries
    # Jittered exponential: each delay is within [0.5, 1] x base * 2^attempt (capped).
    for attempt, delay in enumerate(clock.slept):
        base = min(client.backoff_cap, client.backoff_base * 2**attempt)
        assert base / 2 <= delay <= base


async def test_unsafe_create_not_retried_on_5xx(kube: FakeKube, client: KubeClient) -> None:
    kube.fail("POST", "/events", 500, times=5)
    with pytest.raises(ApiError):
        await client.create_event(
            "ns", involved={"kind": "Node", "metadata": {"name": "a"}}, reason="R", message="m"
        )
    assert kube.count("POST", "/events") == 1


async def test_create_of_named_object_is_retried_and_conflict_surfaces(
    kube: FakeKube, client: KubeClient
) -> None:
    kube.fail("POST", "/pods", 503, times=1)
    pod = {"metadata": {"name": "p"}, "spec": {"nodeName": "n"}}
    created = await client.create_pod("ns", pod)
    assert created["metadata"]["name"] == "p"
    with pytest.raises(Conflict) as info:
        await client.create_pod("ns", pod)
    assert info.value.already_exists


async def test_a_body_over_a_mebibyte_is_sent_whole_on_every_attempt(
    kube: FakeKube, client: KubeClient
) -> None:
    # Raw bytes over 1 MiB make aiohttp warn (an error under this suite's filterwarnings); the client
    # streams such a body from a fresh buffer per attempt, so the retry after the 503 sends it whole.
    kube.fail("POST", "/pods", 503, times=1)
    big = "x" * (3 << 19)
    pod = {"metadata": {"name": "p", "annotations": {"big": big}}, "spec": {"nodeName": "n"}}
    created = await client.create_pod("ns", pod)
    assert created["metadata"]["annotations"]["big"] == big
    assert kube.count("POST", "/pods") == 2


async def test_write_limiter_spaces_writes_but_not_reads(kube: FakeKube, clock: FakeClock) -> None:
    kube.put(NODES_C, node("a"))
    async with KubeClient(kube.config(), clock=clock, qps=10, burst=2) as client:
        start = clock.monotonic()
        for _ in range(5):
            await client.get(NODES, "a")
        assert clock.monotonic() == start
        for i in range(6):
            await client.patch_node_metadata("a", labels={"i": str(i)})
        # burst 2, then 4 more tokens at 10/s: 0.4 s.
        assert clock.monotonic() - start == pytest.approx(0.4)


async def test_without_qps_writes_are_not_paced(kube: FakeKube, clock: FakeClock) -> None:
    """`qps=None`: no client-side write limiter (the simulator, which is itself the load)."""
    kube.put(NODES_C, node("a"))
    async with KubeClient(kube.config(), clock=clock, qps=None, burst=1) as client:
        start = clock.monotonic()
        for i in range(6):
            await client.patch_node_metadata("a", labels={"i": str(i)})
        assert clock.monotonic() == start and clock.slept == []
    assert kube.count("PATCH", "/nodes/a") == 6


async def test_watch_path_takes_selectors_as_query_parameters(kube: FakeKube, client: KubeClient) -> None:
    kube.put(NODES_C, node("a", {"pool": "y"}))
    opened = client.watch_path(
        "/api/v1/nodes", resource="nodes", params={"labelSelector": "pool=y"}, resource_version="1"
    )
    async with opened as stream:
        event = await anext(stream)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "a")
    [request] = kube.watch_requests()
    assert request.query["labelSelector"] == "pool=y" and request.query["resourceVersion"] == "1"


async def test_modify_rereads_on_conflict(kube: FakeKube, client: KubeClient) -> None:
    kube.put(NODES_C, node("a", {"n": "0"}))
    seen: list[str] = []

    def mutate(obj: JSON) -> JSON:
        seen.append(obj["metadata"]["labels"]["n"])
        if len(seen) == 1:  # another writer gets in between our read and our write
            kube.put(NODES_C, node("a", {"n": "1"}))
        obj["metadata"]["labels"]["mine"] = "yes"
        return obj

    result = await client.modify(NODES, "a", mutate)
    assert seen == ["0", "1"]
    assert result["metadata"]["labels"] == {"n": "1", "mine": "yes"}


async def test_modify_gives_up_after_attempts(kube: FakeKube, client: KubeClient) -> None:
    kube.put(NODES_C, node("a"))
    kube.fail("PUT", "/nodes/a", 409, body=status_body(409, "Conflict", "modified"), times=10)
    with pytest.raises(Conflict):
        await client.modify(NODES, "a", lambda o: o, attempts=3)
    assert kube.count("PUT", "/nodes/a") == 3


async def test_modify_noop_does_not_write(kube: FakeKube, client: KubeClient) -> None:
    kube.put(NODES_C, node("a"))
    await client.modify(NODES, "a", lambda o: None)
    assert kube.count("PUT") == 0


async def test_patch_node_metadata_merge_semantics(kube: FakeKube, client: KubeClient) -> None:
    kube.put(NODES_C, node("a", {"keep": "1", "drop": "2"}))
    await client.patch_node_metadata(
        "a", labels={"drop": None, "new": "3"}, annotations={"nodewright.io/x": "y"}, unschedulable=True
    )
    stored = kube.get(NODES_C, "a")
    assert stored is not None
    assert stored["metadata"]["labels"] == {"keep": "1", "new": "3"}
    assert stored["metadata"]["annotations"] == {"nodewright.io/x": "y"}
    assert stored["spec"]["unschedulable"] is True
    assert kube.requests[-1].content_type == PatchType.MERGE.value
    await client.patch_node_metadata("a", unschedulable=False)
    assert "unschedulable" not in kube.get(NODES_C, "a")["spec"]  # type: ignore[index]
    with pytest.raises(Conflict):
        await client.patch_node_metadata("a", labels={"x": "y"}, resource_version="1")


async def test_patch_node_conditions_keeps_kubelet_conditions(kube: FakeKube, client: KubeClient) -> None:
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    kube.put(NODES_C, node("a", status={"conditions": [ready]}))
    ours = {"type": "nodewright.io/demo", "status": "False", "reason": "Complete"}
    await client.patch_node_conditions("a", [ours])
    request = kube.requests[-1]
    assert request.path == "/api/v1/nodes/a/status"
    assert request.content_type == PatchType.STRATEGIC.value
    assert request.body == {"status": {"conditions": [ours]}}
    conditions = kube.get(NODES_C, "a")["status"]["conditions"]  # type: ignore[index]
    assert [c["type"] for c in conditions] == ["Ready", "nodewright.io/demo"]


async def test_evict_outcomes(kube: FakeKube, client: KubeClient) -> None:
    pods = pods_c("ns")
    for name in ("ok", "guarded"):
        kube.put(pods, {"metadata": {"name": name}})
    pdb_message = "Cannot evict pod as it would violate the pod's disruption budget (pdb/web)."
    kube.evictions["guarded"] = (429, pdb_message)
    accepted = await client.evict("ns", "ok", grace_period=30)
    assert accepted.outcome is EvictionOutcome.ACCEPTED
    assert kube.requests[-1].body["deleteOptions"] == {"gracePeriodSeconds": 30}
    blocked = await client.evict("ns", "guarded")
    assert blocked.outcome is EvictionOutcome.BLOCKED and "pdb/web" in blocked.message
    assert kube.count("POST", "/guarded/eviction") == 1  # a PDB block is an answer, not retried
    gone = await client.evict("ns", "ok")
    assert gone.outcome is EvictionOutcome.NOT_FOUND
    kube.fail("POST", "/eviction", 500, body=status_body(500, "InternalError", "multiple PDBs"))
    failed = await client.evict("ns", "guarded")
    assert failed.outcome is EvictionOutcome.FAILED and failed.status == 500
    await client.evict("ns", "guarded", dry_run=True)
    assert kube.requests[-1].query == {"dryRun": "All"}


async def test_delete_pod_with_uid_precondition(kube: FakeKube, client: KubeClient) -> None:
    pods = pods_c("ns")
    created = kube.put(pods, {"metadata": {"name": "p"}})
    assert not await client.delete_pod("ns", "p", uid="someone-else")
    assert await client.delete_pod("ns", "p", uid=created["metadata"]["uid"])
    assert not await client.delete_pod("ns", "p")


async def test_patch_status_and_json_patch(kube: FakeKube, client: KubeClient) -> None:
    kube.put(LEASES_C, {"metadata": {"name": "l"}, "spec": {}})
    await client.patch_status(LEASES, "l", {"status": {"x": 1}}, namespace="nodewright-system")
    assert kube.requests[-1].path.endswith("/leases/l/status")
    kube.fail("PATCH", "/leases/l", 503, times=3)
    with pytest.raises(ApiError):  # a JSON patch is not repeated after a 5xx
        await client.patch(LEASES, "l", [{"op": "add"}], namespace="ns", patch_type=PatchType.JSON_PATCH)
    assert kube.count("PATCH", "/leases/l") == 2


async def test_list_paginates(kube: FakeKube, client: KubeClient) -> None:
    for i in range(5):
        kube.put(NODES_C, node(f"n{i}"))
    result = await client.list(NODES, limit=2)
    assert [o["metadata"]["name"] for o in result.items] == [f"n{i}" for i in range(5)]
    assert result.resource_version == str(kube.rv)
    assert kube.count("GET", "/nodes") == 3


async def test_watch_non_200_raises_with_body(kube: FakeKube, client: KubeClient) -> None:
    kube.script(NODES_C, WatchScript(status=403, body=status_body(403, "Forbidden", "nodes is forbidden")))
    with pytest.raises(ApiError) as info:
        async with client.watch(NODES, resource_version="1"):
            pass
    assert info.value.status == 403 and "forbidden" in info.value.message
    kube.script(NODES_C, WatchScript(status=410, body=status_body(410, "Expired", "too old")))
    with pytest.raises(Gone):
        async with client.watch(NODES, resource_version="1"):
            pass


async def test_watch_error_event_raises(kube: FakeKube, client: KubeClient) -> None:
    kube.script(NODES_C, WatchScript(steps=[("event", "ERROR", status_body(429, "TooManyRequests", "slow"))]))
    with pytest.raises(TooManyRequests):
        async with client.watch(NODES, resource_version="1") as stream:
            async for _ in stream:
                pass


async def test_a_text_read_for_its_tail_keeps_the_end_of_one_huge_line() -> None:
    """`tailLines` bounds lines, not bytes: a package that prints one 8 MiB line is read in bounded
    memory, and what is kept is that line's end, where a step says why it failed."""

    async def log(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        for _ in range(128):
            await resp.write(b"x" * 65536)
        await resp.write(b" step failed: disk full\n")
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/pods/p/log", log)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    c = KubeClient(
        ClusterConfig(server=url, ssl_context=None, auth=StaticToken("t")), metrics=RequestRecorder()
    )
    try:
        path = "/api/v1/namespaces/ns/pods/p/log"
        tail = await c.get_text(path, params={"tailLines": "20"}, keep_last=4096)
        whole = await c.get_text(path)
    finally:
        await c.close()
        await runner.cleanup()
    assert len(tail) == 4096 and tail.endswith(" step failed: disk full\n")
    assert len(whole) == 128 * 65536 + len(" step failed: disk full\n")
