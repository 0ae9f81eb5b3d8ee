"""Issue 8 acceptance: the operator's metrics and traces during a real rollout on the simulated fleet.

Metrics are scraped from the operator subprocess' `/metrics` and compared with what the nodes say
(status labels `nodewright.io/status.<nw>`, state annotations). The operator updates the domain gauges at
the end of each rollout reconcile, so "the same moment" is defined as: after completion they match
exactly; during the rollout a consistent triple (scrape, read labels, scrape) is one whose label counts
equal one of the two scrapes.

Traces go to an in-process OTLP/HTTP collector stand-in (an aiohttp server decoding
`ExportTraceServiceRequest`s, as in tests/test_obs_tracing.py); the operator is started with
`OTEL_EXPORTER_OTLP_ENDPOINT` pointing at it and a short batch-span-processor delay.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.proto.trace.v1.trace_pb2 import Status as SpanStatus
from prometheus_client.parser import text_string_to_metric_families

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    OperatorProcess,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    nodes_of,
    nodewright_manifest,
    package,
    patch_nodewright,
    started_operators,
    status_of,
    wait_statuses,
)
from nodewright.api.models import Status
from nodewright.api.nodestate import decode
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

Samples = dict[str, list[tuple[dict[str, str], float]]]
STATUSES = [s.value for s in Status]


async def scrape(op: OperatorProcess) -> Samples:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(f"http://127.0.0.1:{op.metrics_port}/metrics") as resp,
    ):
        assert resp.status == 200
        text = await resp.text()
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name].append((dict(s.labels), float(s.value)))
    return samples


def select(samples: Samples, metric: str, /, **match: str) -> list[tuple[dict[str, str], float]]:
    return [
        (labels, v)
        for labels, v in samples.get(metric, [])
        if all(labels.get(k) == w for k, w in match.items())
    ]


def total(samples: Samples, metric: str, /, **match: str) -> float:
    return sum(v for _, v in select(samples, metric, **match))


def gauge_counts(samples: Samples, nw: str) -> dict[str, int]:
    """`nodewright_nodes{nodewright=nw}` by status (every status value is reported, 0 when empty)."""
    return {labels["status"]: int(v) for labels, v in select(samples, "nodewright_nodes", nodewright=nw)}


def label_counts(nodes: Sequence[JSON], nw: str) -> dict[str, int]:
    """Node statuses from the labels, as the controller counts them (no label yet = waiting)."""
    counts = Counter(status_of(n, nw) or Status.WAITING.value for n in nodes)
    return {s: counts.get(s, 0) for s in STATUSES}


def series_of(samples: Samples, nw: str) -> list[str]:
    return sorted(
        {name for name, rows in samples.items() for labels, _ in rows if labels.get("nodewright") == nw}
    )


# ----------------------------------------------------------------------------------------------------
# Metrics


async def test_metrics_follow_the_rollout(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix = nw = f"obs-{unique}"
    count = 20
    async with fleet_of(cluster, prefix, count):
        before = await scrape(operator)
        adds_before = total(before, "workqueue_adds_total", name="node")
        reconciles_before = total(before, "controller_runtime_reconcile_total", controller="rollout")
        assert select(before, "workqueue_depth", name="node"), "workqueue_depth{name=node} not exported"

        await create_nodewright(
            kube,
            nodewright_manifest(
                nw, fleet_prefix=prefix, packages={"tool": package()}, interruptionBudget={"count": 4}
            ),
        )

        # During the rollout: a consistent (scrape, labels, scrape) triple with nodes in progress.
        async def consistent_mid_rollout() -> dict[str, int] | None:
            first = gauge_counts(await scrape(operator), nw)
            labels = label_counts(await nodes_of(kube, prefix), nw)
            second = gauge_counts(await scrape(operator), nw)
            mid = labels["in_progress"] > 0 and labels["complete"] < count
            return labels if mid and labels in (first, second) else None

        seen = await fleet.wait_for(consistent_mid_rollout, within=60, interval=0.1, what="consistent scrape")
        assert sum(seen.values()) == count and seen["in_progress"] <= 4, seen

        nodes = await wait_statuses(kube, prefix, nw, "complete", within=120)

        # After completion: exact agreement (the last rollout reconcile may still be on its way).
        async def settled() -> Samples | None:
            samples = await scrape(operator)
            labels = label_counts(await nodes_of(kube, prefix), nw)
            return samples if gauge_counts(samples, nw) == labels else None

        after = await fleet.wait_for(settled, within=30, what="gauges equal to the node labels")
        assert gauge_counts(after, nw) == {s: (count if s == "complete" else 0) for s in STATUSES}
        assert select(after, "nodewright_matched_nodes", nodewright=nw)[0][1] == count
        assert total(after, "nodewright_status", nodewright=nw, status="complete") == 1
        # Package node counts equal the state annotations.
        from_states: Counter[tuple[str, str, str, str]] = Counter()
        for node in nodes:
            state = decode(node["metadata"]["annotations"][f"nodewright.io/state.{nw}"])
            for e in state.packages:
                from_states[(e.name, e.version, e.stage.value, e.state.value)] += 1
        exported = {
            (labels["package"], labels["version"], labels["stage"], labels["state"]): int(v)
            for labels, v in select(after, "nodewright_package_nodes", nodewright=nw)
            if v
        }
        assert exported == dict(from_states) == {("tool", "1.0.0", "config", "complete"): count}, exported
        # One stage-duration observation per finished stage: apply and config on every node.
        durations = {
            labels["stage"]: int(v)
            for labels, v in select(
                after, "nodewright_stage_duration_seconds_count", nodewright=nw, package="tool"
            )
        }
        assert durations == {"apply": count, "config": count}, durations
        assert total(after, "nodewright_rollout_completed", nodewright=nw, compartment="__default__") == count
        assert total(after, "nodewright_rollout_ceiling", nodewright=nw, compartment="__default__") == 4
        # Controller health moved.
        assert total(after, "workqueue_adds_total", name="node") > adds_before
        assert total(after, "controller_runtime_reconcile_total", controller="rollout") > reconciles_before
        assert select(after, "workqueue_depth", name="node")
        assert total(after, "controller_runtime_reconcile_time_seconds_count", controller="rollout") > 0

        await delete_nodewright(kube, nw, within=120)

        async def gone() -> bool:
            return not series_of(await scrape(operator), nw)

        try:
            await fleet.wait_for(gone, within=15, what="series of the deleted NodeWright gone")
        except TimeoutError:
            pytest.fail(f"series still exported after deletion: {series_of(await scrape(operator), nw)}")


# ----------------------------------------------------------------------------------------------------
# Traces


@dataclass
class Collector:
    """OTLP/HTTP collector stand-in: records every span POSTed to /v1/traces."""

    url: str = ""
    spans: list[Span] = field(default_factory=list)
    metric_posts: int = 0

    @staticmethod
    def attrs(span: Span) -> dict[str, object]:
        out: dict[str, object] = {}
        for kv in span.attributes:
            v = kv.value
            out[kv.key] = v.int_value if v.HasField("int_value") else v.string_value
        return out


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    received = Collector()

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        msg = ExportTraceServiceRequest()
        msg.ParseFromString(body)
        for rs in msg.resource_spans:
            for ss in rs.scope_spans:
                received.spans.extend(ss.spans)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    async def metrics(_request: web.Request) -> web.Response:
        received.metric_posts += 1  # the operator also pushes its metrics over OTLP; accept them
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    app.router.add_post("/v1/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    received.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield received
    finally:
        await runner.cleanup()


class TracingOperator(OperatorProcess):
    """The operator command line run under `env` with the OTLP variables (operator_fixture unchanged)."""

    otel_env: Mapping[str, str] = {}

    def command(self) -> list[str]:
        return ["env", *(f"{k}={v}" for k, v in self.otel_env.items()), *super().command()]


@pytest.fixture
def tracing_operator(
    cluster: ControlPlane, crds: None, tmp_path: Path, collector: Collector
) -> Iterator[Callable[[], OperatorProcess]]:
    def build() -> OperatorProcess:
        op = TracingOperator(cluster, tmp_path)
        op.otel_env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "5",
        }
        return op

    yield from started_operators(build)


async def test_one_trace_per_node_rollout(
    cluster: ControlPlane,
    tracing_operator: Callable[[], OperatorProcess],
    collector: Collector,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix = nw = f"trace-{unique}"
    tracing_operator()
    async with fleet_of(cluster, prefix, 5) as names:
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw, fleet_prefix=prefix, packages={"tool": package()}, interruptionBudget={"count": 2}
            ),
        )
        await wait_statuses(kube, prefix, nw, "complete", within=120)

        def ours() -> list[Span]:
            return [s for s in collector.spans if Collector.attrs(s).get("nodewright.name") == nw]

        async def roots_and_children() -> bool:
            spans = ours()
            return sum(s.name == "node-rollout" for s in spans) >= 5 and len(spans) >= 15

        await fleet.wait_for(roots_and_children, within=30, what="5 node traces exported")
        await asyncio.sleep(1.0)  # anything late (a duplicate) would show up within a few export rounds
        spans = ours()
        roots = [s for s in spans if s.name == "node-rollout"]
        assert len(roots) == 5, [(Collector.attrs(s), s.trace_id.hex()) for s in roots]
        assert sorted(str(Collector.attrs(r)["k8s.node.name"]) for r in roots) == sorted(names)
        assert len({r.trace_id for r in roots}) == 5
        by_trace: dict[bytes, list[Span]] = defaultdict(list)
        for s in spans:
            by_trace[s.trace_id].append(s)
        assert set(by_trace) == {r.trace_id for r in roots}, "spans outside the 5 node traces"
        for root in roots:
            attrs = Collector.attrs(root)
            assert not root.parent_span_id, "the root has a parent"
            assert (
                attrs["nodewright.outcome"] == "complete" and attrs["nodewright.compartment"] == "__default__"
            )
            children = [s for s in by_trace[root.trace_id] if s is not root]
            assert sorted(c.name for c in children) == ["apply", "config"], [c.name for c in children]
            for child in children:
                cattrs = Collector.attrs(child)
                assert child.parent_span_id == root.span_id, child.name
                assert cattrs["k8s.node.name"] == attrs["k8s.node.name"]
                assert cattrs["nodewright.stage"] == child.name
                assert (
                    cattrs["nodewright.package.name"] == "tool"
                    and cattrs["nodewright.package.version"] == "1.0.0"
                )
                assert cattrs["nodewright.batch"] == attrs["nodewright.batch"]
                assert root.start_time_unix_nano <= child.start_time_unix_nano
                assert child.end_time_unix_nano <= root.end_time_unix_nano
            apply_span = next(c for c in children if c.name == "apply")
            config_span = next(c for c in children if c.name == "config")
            assert apply_span.end_time_unix_nano <= config_span.start_time_unix_nano + 1_000_000_000
        # Batches of 2: nodes of one batch share a batch number, three batches in all.
        assert sorted(Counter(Collector.attrs(r)["nodewright.batch"] for r in roots).values()) == [
            1,
            2,
            2,
        ]
        await delete_nodewright(kube, nw, within=60)


async def test_the_node_gate_has_spans_cordon_wait_drain_uncordon(
    cluster: ControlPlane,
    tracing_operator: Callable[[], OperatorProcess],
    collector: Collector,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """Issue 16: the traces had no spans for the node gate although the docs promised them. An
    interrupt-bearing package on two nodes: one waits for a protected pod, both evict a workload pod."""
    prefix = nw = f"gate-{unique}"
    tracing_operator()
    async with fleet_of(cluster, prefix, 2) as names:
        work = await fleet.create_workloads(cluster.kubeconfig, nodes=names, job=f"gw-{unique}")
        guard = await fleet.create_workloads(
            cluster.kubeconfig, nodes=names[:1], job=f"gp-{unique}", protected=True, run_for="6s"
        )
        pkg = package(duration="1s", interrupt={"type": "service", "services": ["containerd"]})
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw,
                fleet_prefix=prefix,
                packages={"svc": pkg},
                interruptionBudget={"count": 2},
                podNonInterruptLabels={"matchLabels": {fleet.PROTECTED_LABEL: "true"}},
            ),
        )
        await wait_statuses(kube, prefix, nw, "complete", within=120)

        def ours() -> list[Span]:
            return [s for s in collector.spans if Collector.attrs(s).get("nodewright.name") == nw]

        async def exported() -> bool:
            return sum(s.name == "node-rollout" for s in ours()) >= 2

        await fleet.wait_for(exported, within=30, what="2 node traces exported")
        await asyncio.sleep(1.0)
        by_node: dict[str, list[Span]] = defaultdict(list)
        for span in ours():
            by_node[str(Collector.attrs(span)["k8s.node.name"])].append(span)
        for node in names:
            spans = by_node[node]
            [root] = [s for s in spans if s.name == "node-rollout"]
            children = sorted((s for s in spans if s is not root), key=lambda s: s.start_time_unix_nano)
            stages = [c.name for c in children]
            expected = {"cordon", "drain", "apply", "config", "interrupt", "post-interrupt", "uncordon"}
            if node == names[0]:
                expected.add("wait")
            assert set(stages) == expected, (node, stages)
            for child in children:
                assert child.parent_span_id == root.span_id and child.trace_id == root.trace_id
                assert root.start_time_unix_nano <= child.start_time_unix_nano
                assert child.end_time_unix_nano <= root.end_time_unix_nano
            start = {c.name: c.start_time_unix_nano for c in children}
            end = {c.name: c.end_time_unix_nano for c in children}
            # Persisted times (stage starts, the first eviction) have second precision: one second of slack.
            second = 1_000_000_000
            assert start["cordon"] <= start["drain"] + second and end["drain"] <= start["apply"] + second
            assert end["post-interrupt"] <= start["uncordon"] + second
            if "wait" in start:
                assert end["wait"] - start["wait"] >= 2 * second, "the protected pod ran for seconds"
                assert end["wait"] <= start["drain"] + second
        await delete_nodewright(kube, nw, within=60)
        invariants.allow_workload_deletion(work)
        invariants.allow_workload_deletion(guard)
        await fleet.delete_workloads(cluster.kubeconfig, work)
        await fleet.delete_workloads(cluster.kubeconfig, guard)


async def test_a_failed_node_rollout_has_a_root_span_with_error(
    cluster: ControlPlane,
    tracing_operator: Callable[[], OperatorProcess],
    collector: Collector,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """Issue 32: a node whose package gave up left its stage spans (one of them ERROR) without a
    `node-rollout` root, the only root being emitted on completion ("root span not received" in Jaeger
    or Tempo). Two of three nodes fail."""
    prefix = nw = f"fail-{unique}"
    tracing_operator()
    async with fleet_of(cluster, prefix, 3) as names:
        failing = names[:2]
        broken = package(maxAttempts=1, env={"NODEWRIGHT_SIM_FAIL_NODES": ",".join(failing)})
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw, fleet_prefix=prefix, packages={"tool": broken}, interruptionBudget={"count": 3}
            ),
        )

        def ours() -> list[Span]:
            return [s for s in collector.spans if Collector.attrs(s).get("nodewright.name") == nw]

        def roots_of(nodes: Sequence[str]) -> list[Span]:
            return [
                s for s in ours() if s.name == "node-rollout" and Collector.attrs(s)["k8s.node.name"] in nodes
            ]

        await wait_statuses(kube, prefix, nw, "erroring", count=2, within=60)

        async def failed_roots() -> bool:
            return len(roots_of(failing)) >= 2

        await fleet.wait_for(failed_roots, within=30, what="the failed nodes' root spans")
        for root in roots_of(failing):
            attrs = Collector.attrs(root)
            assert root.status.code == SpanStatus.STATUS_CODE_ERROR, root.status
            assert attrs["nodewright.outcome"] == "failed"
            assert "tool 1.0.0" in root.status.message, root.status.message
            children = [s for s in ours() if s.trace_id == root.trace_id and s is not root]
            assert children, "the failed stage's span"
            assert all(c.parent_span_id == root.span_id for c in children)
            assert any(c.status.code == SpanStatus.STATUS_CODE_ERROR for c in children)
        await wait_statuses(kube, prefix, nw, "complete", count=1, within=60)

        async def all_roots() -> bool:
            return len(roots_of(names)) >= 3

        await fleet.wait_for(all_roots, within=30, what="the completed node's root span")
        await asyncio.sleep(1.0)  # anything late (a duplicate) would show up within a few export rounds
        outcomes = sorted(str(Collector.attrs(r)["nodewright.outcome"]) for r in roots_of(names))
        assert outcomes == ["complete", "failed", "failed"], "one root per node rollout"
        await delete_nodewright(kube, nw, within=60)


async def test_a_rollout_superseded_by_a_newer_generation_ends_its_node_traces(
    cluster: ControlPlane,
    tracing_operator: Callable[[], OperatorProcess],
    collector: Collector,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix = nw = f"supersede-{unique}"
    tracing_operator()
    async with fleet_of(cluster, prefix, 2) as names:
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw,
                fleet_prefix=prefix,
                packages={"tool": package(duration="20s")},
                interruptionBudget={"count": 2},
            ),
        )
        await wait_statuses(kube, prefix, nw, "in_progress", within=60)
        await patch_nodewright(kube, nw, {"spec": {"packages": {"tool": package("1.1.0", duration="1s")}}})

        def roots() -> list[Span]:
            return [
                s
                for s in collector.spans
                if s.name == "node-rollout" and Collector.attrs(s).get("nodewright.name") == nw
            ]

        async def superseded() -> bool:
            return sum(Collector.attrs(r)["nodewright.outcome"] == "superseded" for r in roots()) >= 2

        await fleet.wait_for(superseded, within=30, what="the superseded rollouts' root spans")
        for root in (r for r in roots() if Collector.attrs(r)["nodewright.outcome"] == "superseded"):
            assert root.status.code == SpanStatus.STATUS_CODE_ERROR
            assert root.status.message.startswith("superseded: the spec changed (generation 2)"), root.status
        await wait_statuses(kube, prefix, nw, "complete", within=120, generation=2)

        async def completed() -> bool:
            return sum(Collector.attrs(r)["nodewright.outcome"] == "complete" for r in roots()) >= 2

        try:
            await fleet.wait_for(completed, within=30, what="the new rollouts' root spans")
        except TimeoutError:
            pytest.fail(f"roots: {[(Collector.attrs(r), r.status) for r in roots()]}")
        outcomes = Counter(
            (str(Collector.attrs(r)["k8s.node.name"]), str(Collector.attrs(r)["nodewright.outcome"]))
            for r in roots()
        )
        assert outcomes == Counter({(n, o): 1 for n in names for o in ("superseded", "complete")}), outcomes
        await delete_nodewright(kube, nw, within=60)


async def test_every_family_the_dashboard_and_alerts_read_is_scraped_from_the_start(
    operator: OperatorProcess,
) -> None:
    """Issue 32: `workqueue_retries_total`, the watch restart and relist counters (and, without leader
    election, `leader_election_master_status`) appeared only once used, so panels said "No data" and
    alerts could not see a first increase. Before any NodeWright exists, every family the shipped
    dashboard and alert rules read is scraped, except the per-NodeWright ones."""
    from nodewright.observability.metrics import HISTOGRAM_METRICS, PER_NODEWRIGHT_METRICS
    from tests.test_obs_manifests import (
        DASHBOARD,
        dashboard_exprs,
        label_values_metric,
        metric_names,
        rule_exprs,
    )

    exprs = [label_values_metric(e) for e in dashboard_exprs(json.loads(DASHBOARD.read_text()))]
    used = {name for expr in exprs for name in metric_names(expr)}
    used |= {name for _, expr in rule_exprs() for name in metric_names(expr)}

    def family(name: str) -> str:
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        return base if base in HISTOGRAM_METRICS else name

    expected = {name for name in used if family(name) not in PER_NODEWRIGHT_METRICS}
    assert len(expected) >= 15, expected
    scraped = await scrape(operator)
    assert expected - set(scraped) == set(), "families the dashboard or the alerts read are missing"
