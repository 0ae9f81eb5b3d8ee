"""Issue 34, item 2: health gates between batches, asked of a real Prometheus.

Prometheus is Debian's (the prometheus package, unpacked by hack/debian/fetch.sh as for
e2e/test_dashboard.py), listening on 127.0.0.1 and scraping one loopback target every second: a stand-in
exporter the test controls (an aiohttp server on 127.0.0.1 serving `/metrics` with an `xid_errors`
gauge per node). Its URL is in a Secret of the operator's namespace, named by the policy's gate.

- With a bad value (every node reports XID errors), batch 1 completes, the gate fails, the compartment
  is held and then halted when the gate's timeout passes -- before batch 2 opens -- with a reason naming
  the gate, the query and the value, in the status, the Halted condition and an Event.
- With good values the rollout completes through every batch.
"""

from __future__ import annotations

import base64
import contextlib
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    NAMESPACE,
    create_nodewright,
    delete_nodewright,
    get_nodewright,
    nodes_of,
    nodewright_manifest,
    package,
    wait_statuses,
)
from e2e.test_plugin import plugin_json, why
from e2e.test_plugin_why import until_reason
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane, free_port
from nodewright.sim.kubeapi import JSON, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

REPO = Path(__file__).resolve().parent.parent
SECRETS = f"/api/v1/namespaces/{NAMESPACE}/secrets"
POLICIES = "/apis/nodewright.io/v1alpha1/deploymentpolicies"
EVENTS = "/api/v1/namespaces/default/events"  # Events of cluster-scoped objects (client-go's choice)
QUERY = 'max(xid_errors{node=~"$NODES"})'


@dataclass
class Exporter:
    """`/metrics` with `xid_errors{node=...}` = `values[node]` (the test changes them at will)."""

    values: dict[str, float] = field(default_factory=dict)
    target: str = ""

    async def metrics(self, _request: web.Request) -> web.Response:
        lines = ["# TYPE xid_errors gauge"]
        lines += [f'xid_errors{{node="{node}"}} {value}' for node, value in sorted(self.values.items())]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


@contextlib.asynccontextmanager
async def exporting() -> AsyncIterator[Exporter]:
    exporter = Exporter()
    app = web.Application()
    app.router.add_get("/metrics", exporter.metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    exporter.target = f"127.0.0.1:{port}"
    try:
        yield exporter
    finally:
        await runner.cleanup()


@pytest.fixture(scope="module")
def prometheus_binary() -> Path:
    fetched = subprocess.run(
        ["bash", str(REPO / "hack" / "debian" / "fetch.sh"), "prometheus", "prometheus"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    return Path(fetched.stdout.strip().splitlines()[-1]) / "usr" / "bin" / "prometheus"


@contextlib.contextmanager
def prometheus(binary: Path, tmp_path: Path, target: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Prometheus on 127.0.0.1 scraping only `target` (loopback) every second; yields its URL."""
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [{"job_name": "xid", "static_configs": [{"targets": [target]}]}],
            }
        )
    )
    port = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def scraped(url: str, proc: subprocess.Popen[bytes], nodes: list[str], value: float) -> None:
    """Wait until Prometheus answers `xid_errors` = `value` for every node (scraped at least once)."""

    async def probe() -> bool:
        assert proc.poll() is None, "prometheus exited"
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session,
                session.get(f"{url}/api/v1/query", params={"query": "xid_errors"}) as resp,
            ):
                body = await resp.json()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False
        seen = {
            s["metric"].get("node"): float(s["value"][1]) for s in (body.get("data") or {}).get("result", [])
        }
        return all(seen.get(n) == value for n in nodes)

    await fleet.wait_for(probe, within=90, what=f"prometheus scraped xid_errors={value}")


@contextlib.asynccontextmanager
async def gated_policy(kube: KubeClient, name: str, secret: str, url: str) -> AsyncIterator[None]:
    await kube.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret},
            "data": {"url": base64.b64encode(url.encode()).decode()},
        },
    )
    gate = {
        "name": "xid",
        "prometheus": {
            "urlSecretRef": {"name": secret, "key": "url"},
            "query": QUERY,
            "comparison": "<",
            "threshold": "1",
        },
        # Long enough for `kubectl nodewright why` to see the hold on a loaded machine.
        "timeout": "45s",
    }
    npd = {"name": "npd", "nodeCondition": {"type": "GpuXidError"}, "timeout": "45s"}
    default = {
        "budget": {"count": 1},
        "strategy": {"fixed": {"initialBatch": 1}},
        "healthGates": [gate, npd],
    }
    manifest = {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DeploymentPolicy",
        "metadata": {"name": name},
        "spec": {"default": default},
    }
    await kube.create(POLICIES, manifest)
    try:
        yield
    finally:
        await kube.delete(f"{POLICIES}/{name}")
        await kube.delete(f"{SECRETS}/{secret}")


def admitted(nodes: list[JSON], nw: str) -> list[str]:
    return sorted(
        n["metadata"]["name"]
        for n in nodes
        if (n["metadata"].get("annotations") or {}).get(f"nodewright.io/batch.{nw}")
    )


def halted_condition(obj: JSON | None) -> JSON | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Halted" and cond.get("status") == "True":
            return dict(cond)
    return None


async def test_a_failing_gate_halts_the_compartment_before_the_next_batch(
    cluster: ControlPlane,
    operator: Any,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
    prometheus_binary: Path,
    tmp_path: Path,
) -> None:
    prefix = nw = f"hg-bad-{unique}"
    async with exporting() as exporter, operator_fixture.fleet_of(cluster, prefix, 3) as names:
        for name in names:
            exporter.values[name] = 5  # every node reports XID errors
        with prometheus(prometheus_binary, tmp_path, exporter.target) as (url, proc):
            await scraped(url, proc, names, 5)
            async with gated_policy(kube, nw, f"prom-{unique}", url):
                await create_nodewright(
                    kube,
                    nodewright_manifest(
                        nw, fleet_prefix=prefix, packages={"tool": package()}, deploymentPolicy=nw
                    ),
                )
                await wait_statuses(kube, prefix, nw, "complete", within=120, count=1)
                waiting = sorted(set(names) - set(admitted(await nodes_of(kube, prefix), nw)))[0]
                held = await until_reason(cluster, waiting, nw, "HealthGate", within=60)
                assert "health gate 'xid'" in held["summary"] and "= 5" in held["summary"], held
                label = f'nodewright="{nw}"'

                async def holding() -> bool:
                    async with (
                        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
                        session.get(f"http://127.0.0.1:{operator.metrics_port}/metrics") as resp,
                    ):
                        text = await resp.text()
                    return any(
                        line.startswith("nodewright_health_gate_holding{")
                        and label in line
                        and line.split()[-1] in ("1", "1.0")
                        for line in text.splitlines()
                    )

                await fleet.wait_for(holding, within=30, what="nodewright_health_gate_holding 1")

                async def halted() -> JSON | None:
                    return halted_condition(await get_nodewright(kube, nw))

                cond = await fleet.wait_for(halted, within=120, what=f"{nw} halted by its gate")
                assert cond["reason"] == "HealthGateFailed", cond
                assert "health gate 'xid'" in cond["message"] and "= 5" in cond["message"], cond
                assert "xid_errors{node=~" in cond["message"], cond
                nodes = await nodes_of(kube, prefix)
                assert len(admitted(nodes, nw)) == 1, "the next batch opened although the gate failed"
                obj = await get_nodewright(kube, nw) or {}
                compartment = obj["status"]["compartmentStatuses"]["__default__"]
                assert compartment["halted"] is True
                assert compartment["batchState"]["gateHalt"]["gate"] == "xid", compartment
                assert compartment["batchState"]["gateHalt"]["value"] == "5", compartment

                async def halt_event() -> JSON | None:
                    listed = await kube.list_all(EVENTS)
                    return next(
                        (
                            e
                            for e in listed.get("items", [])
                            if e.get("reason") == "CompartmentHalted"
                            and (e.get("involvedObject") or {}).get("name") == nw
                        ),
                        None,
                    )

                event = await fleet.wait_for(halt_event, within=30, what="CompartmentHalted event")
                assert "health gate 'xid'" in event["message"], event
                answer = await why(cluster, waiting, nw)
                assert answer["reason"] == "CompartmentHalted", answer
                assert "health gate" in answer["summary"], answer
                shown = await plugin_json(cluster, "status", nw)
                [halt] = shown["halts"]
                assert "health gate 'xid'" in halt["message"] and "= 5" in halt["message"], halt
                await delete_nodewright(kube, nw, within=120)


async def test_a_passing_gate_lets_the_rollout_complete(
    cluster: ControlPlane,
    operator: Any,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
    prometheus_binary: Path,
    tmp_path: Path,
) -> None:
    prefix = nw = f"hg-ok-{unique}"
    async with exporting() as exporter, operator_fixture.fleet_of(cluster, prefix, 3) as names:
        for name in names:
            exporter.values[name] = 0
        with prometheus(prometheus_binary, tmp_path, exporter.target) as (url, proc):
            await scraped(url, proc, names, 0)
            async with gated_policy(kube, nw, f"prom-{unique}", url):
                await create_nodewright(
                    kube,
                    nodewright_manifest(
                        nw, fleet_prefix=prefix, packages={"tool": package()}, deploymentPolicy=nw
                    ),
                )
                await wait_statuses(kube, prefix, nw, "complete", within=180)
                obj = await get_nodewright(kube, nw)
                assert halted_condition(obj) is None, obj
                batches = {
                    n["metadata"]["name"]: n["metadata"]["annotations"][f"nodewright.io/batch.{nw}"]
                    for n in await nodes_of(kube, prefix)
                }
                assert len(batches) == 3, batches
                await delete_nodewright(kube, nw, within=120)
