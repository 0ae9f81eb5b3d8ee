"""Issue 18 acceptance (part): notifications reach a local HTTP receiver, from the real operator.

A receiver started by the test (aiohttp, on 127.0.0.1) takes the POSTs. The webhook URLs live in a
Secret of the operator's namespace. Two NodeWrights roll out on their own nodes: one whose package
succeeds, with a Slack-format sink (it gets `{"text": ...}` for the start and the completion), and one
whose package fails on every node under a policy with `failureThreshold: 1`, with a JSON sink (it gets
NodeFailed and CompartmentHalted with the compartment named). The operator's cluster-wide sink
(`--notify-url-secret`, JSON) is told about both. The receiver answers the first POST with 503: it is
retried. No event key arrives twice at one sink.
"""

from __future__ import annotations

import base64
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from e2e import operator_fixture
from e2e.operator_fixture import (
    NAMESPACE,
    NW_PATH,
    create_nodewright,
    delete_nodewright,
    nodewright_manifest,
    package,
)
from e2e.test_plugin import create_policy
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, ApiError, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator_factory = operator_fixture.operator_factory

SECRETS = f"/api/v1/namespaces/{NAMESPACE}/secrets"
POLICIES = "/apis/nodewright.io/v1alpha1/deploymentpolicies"


class Receiver:
    def __init__(self) -> None:
        self.got: dict[str, list[JSON]] = {}
        self.refuse_first = True
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.refuse_first:
            self.refuse_first = False
            return web.Response(status=503, text="try again")
        self.got.setdefault(request.match_info["sink"], []).append(body)
        return web.Response(text="ok")

    def events(self, sink: str) -> list[str]:
        return [str(b.get("event") or b.get("text")) for b in self.got.get(sink, [])]


@contextlib.asynccontextmanager
async def receiving() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/hook/{sink}", receiver.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    receiver.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield receiver
    finally:
        await runner.cleanup()


async def test_halts_failures_and_completions_reach_the_sinks(
    cluster: ControlPlane, operator_factory: Any, kube: KubeClient, unique: str, invariants: Any
) -> None:
    secret = f"hooks-{unique}"
    ok_nw, bad_nw, policy = f"ntf-ok-{unique}", f"ntf-bad-{unique}", f"ntf-{unique}"
    async with (
        receiving() as receiver,
        operator_fixture.fleet_of(cluster, f"nok-{unique}", 3) as ok_nodes,
        operator_fixture.fleet_of(cluster, f"nbad-{unique}", 3) as bad_nodes,
    ):
        urls = {k: f"{receiver.url}/{k}" for k in ("chat", "router", "cluster")}
        await kube.create(
            SECRETS,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in urls.items()},
            },
        )
        try:
            operator_factory(f"--notify-url-secret={secret}/cluster", "--notify-format=json")
            await create_policy(
                kube,
                policy,
                {
                    "budget": {"count": 1},
                    "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1}},
                },
            )
            chat = {"name": "chat", "urlSecretRef": {"name": secret, "key": "chat"}, "format": "slack"}
            router = {"name": "router", "urlSecretRef": {"name": secret, "key": "router"}}
            await create_nodewright(
                kube,
                nodewright_manifest(
                    ok_nw,
                    fleet_prefix=f"nok-{unique}",
                    packages={"tool": package()},
                    interruptionBudget={"count": 3},
                    notifications=[chat],
                ),
            )
            failing = package(env={"NODEWRIGHT_SIM_FAIL_NODES": ",".join(bad_nodes)}, maxAttempts=1)
            await create_nodewright(
                kube,
                nodewright_manifest(
                    bad_nw,
                    fleet_prefix=f"nbad-{unique}",
                    packages={"tool": failing},
                    deploymentPolicy=policy,
                    notifications=[router],
                ),
            )

            async def arrived() -> bool:
                chat_texts = receiver.events("chat")
                router_events = receiver.events("router")
                cluster_events = [
                    (b.get("nodewright"), b.get("event")) for b in receiver.got.get("cluster", [])
                ]
                return (
                    any("RolloutCompleted" in t for t in chat_texts)
                    and "CompartmentHalted" in router_events
                    and (ok_nw, "RolloutCompleted") in cluster_events
                    and (bad_nw, "CompartmentHalted") in cluster_events
                )

            await fleet.wait_for(arrived, within=180, interval=0.5, what=f"notifications ({receiver.got})")
            chat_bodies = receiver.got["chat"]
            assert all(set(b) == {"text"} for b in chat_bodies), chat_bodies
            assert any(t["text"].startswith(f"[NodeWright {ok_nw}] RolloutStarted") for t in chat_bodies)
            halted = next(b for b in receiver.got["router"] if b["event"] == "CompartmentHalted")
            assert halted["nodewright"] == bad_nw and halted["compartment"] == "__default__", halted
            assert halted["key"].startswith(f"{bad_nw}/"), halted
            failed = [b for b in receiver.got["router"] if b["event"] == "NodeFailed"]
            assert failed and {b["node"] for b in failed} <= set(bad_nodes), failed
            assert not any(b["nodewright"] == ok_nw for b in receiver.got["router"]), (
                "sinks are per NodeWright"
            )
            for sink, bodies in receiver.got.items():
                keys = Counter(str(b.get("key") or b.get("text")) for b in bodies)
                assert max(keys.values()) == 1, f"{sink} got a notice twice: {keys}"
            assert ok_nodes  # the completed fleet is the one the chat sink was told about
            for nw in (ok_nw, bad_nw):
                await delete_nodewright(kube, nw, within=120)
        finally:
            for nw in (ok_nw, bad_nw):
                with contextlib.suppress(ApiError):
                    await kube.delete(f"{NW_PATH}/{nw}")
            with contextlib.suppress(ApiError):
                await kube.delete(f"{POLICIES}/{policy}")
            with contextlib.suppress(ApiError):
                await kube.delete(f"{SECRETS}/{secret}")
