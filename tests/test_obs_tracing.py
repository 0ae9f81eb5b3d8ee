"""Node-rollout traces received by an in-process OTLP/HTTP collector stand-in."""

from __future__ import annotations

import asyncio
import gzip
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp import web
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from nodewright.observability.tracing import ROOT_SPAN_NAME, NodeRollout, RolloutTracer

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=UTC)
STAGES = ("cordon", "wait", "drain", "apply", "config", "interrupt", "post-interrupt", "uncordon")


@dataclass
class Collector:
    url: str
    spans: list[Span] = field(default_factory=list)
    resources: list[dict[str, str]] = field(default_factory=list)

    def attrs(self, span: Span) -> dict[str, object]:
        out: dict[str, object] = {}
        for kv in span.attributes:
            v = kv.value
            out[kv.key] = v.int_value if v.HasField("int_value") else v.string_value
        return out


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    received = Collector(url="")

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        msg = ExportTraceServiceRequest()
        msg.ParseFromString(body)
        for rs in msg.resource_spans:
            received.resources.append({kv.key: kv.value.string_value for kv in rs.resource.attributes})
            for ss in rs.scope_spans:
                received.spans.extend(ss.spans)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    received.url = f"http://127.0.0.1:{port}/v1/traces"
    try:
        yield received
    finally:
        await runner.cleanup()


def rollout(node: str, *, batch: int = 1) -> NodeRollout:
    return NodeRollout(
        nodewright="gpu-drivers",
        nodewright_uid="6c1e0f4e-uid",
        node=node,
        picked_at=T0 + timedelta(minutes=batch),
        batch=batch,
        compartment="rack-a",
    )


def run_node(tracer: RolloutTracer, ref: NodeRollout, *, fail_apply_once: bool = False) -> None:
    t = ref.picked_at
    for stage in STAGES:
        package = None if stage in {"cordon", "wait", "drain", "uncordon", "interrupt"} else "driver"
        if stage == "apply" and fail_apply_once:
            tracer.stage_finished(
                ref,
                stage=stage,
                package="driver",
                version="550.1",
                started_at=t,
                finished_at=t + timedelta(seconds=20),
                error="exit code 3",
            )
            t += timedelta(seconds=20)
        tracer.stage_finished(
            ref,
            stage=stage,
            package=package,
            version="550.1" if package else None,
            started_at=t,
            finished_at=t + timedelta(seconds=30),
        )
        t += timedelta(seconds=30)
    tracer.node_rollout_finished(ref, finished_at=t, packages={"driver": "550.1"})


async def test_five_node_rollout_yields_five_traces(collector: Collector) -> None:
    tracer = RolloutTracer(
        exporter=OTLPSpanExporter(endpoint=collector.url, timeout=5), service_instance="op-0"
    )
    nodes = [f"gpu-{i}" for i in range(5)]
    for i, node in enumerate(nodes):
        run_node(tracer, rollout(node, batch=1 + i // 2), fail_apply_once=(node == "gpu-3"))
    # The exporter posts from a worker thread to a server on this loop: flush off-loop.
    assert await asyncio.to_thread(tracer.force_flush, 10_000)
    await tracer.aclose()

    by_trace: dict[bytes, list[Span]] = defaultdict(list)
    for span in collector.spans:
        by_trace[span.trace_id].append(span)
    assert len(by_trace) == 5
    seen_nodes: set[str] = set()
    for spans in by_trace.values():
        roots = [s for s in spans if s.name == ROOT_SPAN_NAME]
        assert len(roots) == 1
        root = roots[0]
        assert root.parent_span_id == b""
        children = [s for s in spans if s is not root]
        assert all(s.parent_span_id == root.span_id for s in children)
        node = str(collector.attrs(root)["k8s.node.name"])
        seen_nodes.add(node)
        names = [s.name for s in sorted(children, key=lambda s: s.start_time_unix_nano)]
        if node == "gpu-3":
            assert names == ["cordon", "wait", "drain", "apply", "apply", *STAGES[4:]]
            failed = [s for s in children if s.status.code == Status.STATUS_CODE_ERROR]
            assert len(failed) == 1 and failed[0].status.message == "exit code 3"
            assert [e.name for e in failed[0].events] == ["exception"]
        else:
            assert names == list(STAGES)
            assert all(s.status.code == Status.STATUS_CODE_OK for s in children)
        # Root covers batch pick to uncordon; children lie inside it.
        assert root.start_time_unix_nano == min(s.start_time_unix_nano for s in spans)
        assert root.end_time_unix_nano == max(s.end_time_unix_nano for s in spans)
        apply = next(s for s in children if s.name == "apply")
        attrs = collector.attrs(apply)
        assert attrs["nodewright.name"] == "gpu-drivers"
        assert attrs["nodewright.package.name"] == "driver"
        assert attrs["nodewright.package.version"] == "550.1"
        assert attrs["nodewright.compartment"] == "rack-a"
        assert attrs["nodewright.stage"] == "apply"
        assert attrs["k8s.node.name"] == node
        assert isinstance(attrs["nodewright.batch"], int) and attrs["nodewright.batch"] >= 1
    assert seen_nodes == set(nodes)
    assert all(r.get("service.name") == "nodewright-operator" for r in collector.resources)


async def test_spans_across_restart_join_one_trace(collector: Collector) -> None:
    """Two tracer instances (an operator restart in between) emit into the same trace."""
    ref = rollout("gpu-9")
    before = RolloutTracer(exporter=OTLPSpanExporter(endpoint=collector.url, timeout=5))
    before.stage_finished(ref, stage="cordon", started_at=T0, finished_at=T0 + timedelta(seconds=1))
    await before.aclose()
    # After the restart the controller rebuilds the same NodeRollout from persisted node state.
    after = RolloutTracer(exporter=OTLPSpanExporter(endpoint=collector.url, timeout=5))
    rebuilt = NodeRollout(**{f: getattr(ref, f) for f in ref.__dataclass_fields__})
    after.stage_finished(
        rebuilt, stage="drain", started_at=T0 + timedelta(seconds=1), finished_at=T0 + timedelta(seconds=5)
    )
    after.node_rollout_finished(rebuilt, finished_at=T0 + timedelta(seconds=9))
    await after.aclose()
    assert len({s.trace_id for s in collector.spans}) == 1
    root = next(s for s in collector.spans if s.name == ROOT_SPAN_NAME)
    assert {s.parent_span_id for s in collector.spans if s is not root} == {root.span_id}
    assert int.from_bytes(root.trace_id, "big") == ref.trace_id


def test_distinct_rollouts_get_distinct_ids() -> None:
    a, b = rollout("n1", batch=1), rollout("n1", batch=2)
    assert a.trace_id != b.trace_id and a.root_span_id != b.root_span_id
    assert rollout("n1").trace_id == rollout("n1").trace_id


def test_disabled_tracer_is_noop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    tracer = RolloutTracer.from_environment()
    assert not tracer.enabled
    tracer.stage_finished(rollout("n"), stage="apply", started_at=T0, finished_at=T0)
    tracer.node_rollout_finished(rollout("n"), finished_at=T0)
    assert tracer.force_flush()
    tracer.shutdown()


def test_enabled_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    tracer = RolloutTracer.from_environment()
    assert tracer.enabled
    tracer.shutdown()


def test_naive_timestamps_rejected() -> None:
    tracer = RolloutTracer(exporter=OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces"))
    try:
        with pytest.raises(ValueError, match="timezone-aware"):
            tracer.stage_finished(
                rollout("n"), stage="apply", started_at=datetime(2025, 1, 1), finished_at=datetime(2025, 1, 1)
            )
    finally:
        tracer.shutdown()
