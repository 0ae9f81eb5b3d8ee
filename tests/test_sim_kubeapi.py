"""The simulator's client is a path-based façade over `nodewright.kube.client.KubeClient`.

It raises the operator client's error type (`nodewright.kube.resources.ApiError`), reads kubeconfigs
with `nodewright.kube.config` (so every credential kind the operator accepts works for it too), and
sends its writes unpaced and unretried: the simulator is the load (see `nodewright.sim.kubeapi`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from nodewright.kube import resources
from nodewright.sim.kubeapi import ApiError, KubeClient, resource_label
from tests.kubefake import FakeKube, node


def test_a_refusal_is_the_kube_error_with_the_status_decoded() -> None:
    status = {"kind": "Status", "reason": "Invalid", "message": "spec.packages: bad", "code": 422}
    err = ApiError(422, "POST", "/apis/x", json.dumps(status))
    assert isinstance(err, resources.ApiError)
    assert (err.status, err.reason, err.message) == (422, "Invalid", "spec.packages: bad")
    assert err.body == json.dumps(status)  # the text, as the simulator's callers read it
    assert str(err).startswith("POST /apis/x: HTTP 422: ")


def test_a_body_that_is_not_a_status_keeps_its_text() -> None:
    err = ApiError(502, "GET", "/api/v1/nodes", "bad gateway")
    assert (err.reason, err.message, err.body) == ("InternalError", "bad gateway", "bad gateway")


def kubeconfig(path: Path, server: str, user: dict[str, str]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "sim",
        "clusters": [{"name": "sim", "cluster": {"server": server}}],
        "users": [{"name": "sim", "user": user}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}],
    }
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[tuple[FakeKube, Path]]:
    kube = await FakeKube().start()
    try:
        yield kube, kubeconfig(tmp_path / "kubeconfig", kube.url, {"token": "test-token"})
    finally:
        await kube.stop()


async def test_a_rotated_token_file_is_read_again_after_a_401(tmp_path: Path) -> None:
    """`tokenFile` is the operator's credential handling (`nodewright.kube.credentials.TokenFile`): a 401
    makes it re-read the file and the call is repeated once with the new token."""
    token = tmp_path / "token"
    token.write_text("old\n")
    seen: list[tuple[str, str]] = []

    async def handle(request: web.Request) -> web.Response:
        authorization = request.headers.get("Authorization", "")
        seen.append((authorization, request.headers.get("User-Agent", "")))
        if authorization != f"Bearer {token.read_text().strip()}":
            return web.json_response({"kind": "Status", "code": 401, "reason": "Unauthorized"}, status=401)
        return web.json_response({"kind": "Node", "metadata": {"name": "n1"}})

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with KubeClient(kubeconfig(tmp_path / "kc", url, {"tokenFile": str(token)})) as sim:
            assert (await sim.get("/api/v1/nodes/n1"))["metadata"]["name"] == "n1"
            token.write_text("new\n")  # rotated, as a projected service-account token is
            assert (await sim.get("/api/v1/nodes/n1"))["metadata"]["name"] == "n1"
    finally:
        await runner.cleanup()
    assert [auth for auth, _ in seen] == ["Bearer old", "Bearer old", "Bearer new"]
    assert all(agent.startswith("nodewright/") and "simulator" in agent for _, agent in seen)


@pytest.mark.parametrize("status", [429, 503])
async def test_a_refused_write_is_not_retried_by_the_client(fake: tuple[FakeKube, Path], status: int) -> None:
    """Retries of the simulator's writes are its callers' choice (`kubelet.with_retries`), not the
    client's: one request, one answer."""
    kube, config = fake
    kube.fail("POST", "/api/v1/nodes", status, headers={"Retry-After": "1"})
    async with KubeClient(config) as sim:
        assert sim.kube.qps is None  # no client-side write pacing either (module docstring)
        assert sim.kube.connect_timeout == sim.kube.timeout  # a slow handshake on a loaded machine
        with pytest.raises(ApiError) as refused:
            await sim.create("/api/v1/nodes", node("n1"))
    assert refused.value.status == status
    assert str(refused.value).startswith(f"POST /api/v1/nodes: HTTP {status}: ")
    assert kube.count("POST", "/api/v1/nodes") == 1


async def test_paths_patches_and_a_missing_object(fake: tuple[FakeKube, Path]) -> None:
    kube, config = fake
    async with KubeClient(config) as sim:
        assert await sim.create_or_exists("/api/v1/nodes", node("n1"))
        assert not await sim.create_or_exists("/api/v1/nodes", node("n1"))  # 409: already there
        patched = await sim.merge_patch("/api/v1/nodes/n1", {"metadata": {"labels": {"a": "b"}}})
        assert patched["metadata"]["labels"] == {"a": "b"}
        condition = {"type": "Sim", "status": "True"}
        await sim.strategic_patch("/api/v1/nodes/n1/status", {"status": {"conditions": [condition]}})
        assert (await sim.get("/api/v1/nodes/n1"))["status"]["conditions"] == [condition]
        with pytest.raises(ApiError) as missing:
            await sim.get("/api/v1/nodes/nope")
        await sim.delete("/api/v1/nodes/nope")  # missing_ok
        listed = await sim.list_all("/api/v1/nodes", page=1)
    assert missing.value.status == 404 and "nope" in missing.value.body
    assert [n["metadata"]["name"] for n in listed["items"]] == ["n1"]
    patches = [r.content_type for r in kube.requests if r.method == "PATCH"]
    assert patches == ["application/merge-patch+json", "application/strategic-merge-patch+json"]


async def test_a_watch_yields_events_and_an_expired_version_as_an_error_event(
    fake: tuple[FakeKube, Path],
) -> None:
    """An expired resourceVersion arrives as an ERROR event (410) for the caller to relist."""
    kube, config = fake
    nodes = ("api/v1", "", "nodes")
    kube.put(nodes, node("n1"))
    kube.compact()
    since = str(kube.compacted)
    kube.put(nodes, node("n2"))
    async with KubeClient(config) as sim:
        expired = [e async for e in sim.watch("/api/v1/nodes", resource_version="1")]
        async with contextlib.aclosing(sim.watch("/api/v1/nodes", resource_version=since)) as live:
            first = await anext(live)
    assert [(e["type"], e["object"]["code"]) for e in expired] == [("ERROR", 410)]
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "n2")


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("/api/v1/nodes", "nodes"),
        ("/api/v1/nodes/n1/status", "nodes/status"),
        ("/api/v1/namespaces/ns/pods/p/binding", "pods/binding"),
        ("/api/v1/namespaces/ns", "namespaces"),
        ("/apis/nodewright.io/v1alpha1/nodewrights/nw", "nodewrights.nodewright.io"),
        ("/metrics", "/metrics"),
    ],
)
def test_the_metrics_label_of_a_path(path: str, label: str) -> None:
    assert resource_label(path) == label
