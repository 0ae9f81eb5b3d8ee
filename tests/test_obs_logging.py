"""Structured logging: JSON output, per-reconcile keys, one summary line, reconcile metrics."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog
from opentelemetry.sdk.trace import TracerProvider
from structlog.testing import capture_logs

from nodewright.observability.logging import (
    SUMMARY_EVENT,
    configure_logging,
    get_logger,
    reconcile_context,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []

    def reconcile(self, *, controller: str, result: str, seconds: float) -> None:
        self.calls.append((controller, result, seconds))


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    logging.getLogger().handlers = []


def lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]


def test_json_lines_with_bound_keys_and_summary() -> None:
    buf = io.StringIO()
    configure_logging("info", json=True, stream=buf)
    clock, rec = FakeClock(), Recorder()
    log = get_logger("test")
    with reconcile_context(
        controller="node", key="gpu-drivers/gpu-1", metrics=rec, clock=clock, nodewright="gpu-drivers"
    ) as rc:
        rc.bind(node="gpu-1", package="driver", stage="apply")
        log.info("pod created", pod="p-1")
        clock.now += 0.25
        rc.requeue(after=5.0)
        rc.note(decision="wait-for-pod")
    log.info("after")
    out = lines(buf)
    assert [o["event"] for o in out] == ["pod created", SUMMARY_EVENT, "after"]
    inner, summary, after = out
    for record in (inner, summary):
        assert record["controller"] == "node"
        assert record["nodewright"] == "gpu-drivers"
        assert record["node"] == "gpu-1"
        assert record["package"] == "driver"
        assert record["stage"] == "apply"
        assert record["reconcile_id"] == summary["reconcile_id"]
        assert record["level"] == "info"
        assert str(record["timestamp"]).endswith("Z")
    assert summary["result"] == "requeue_after"
    assert summary["requeue_after"] == 5.0
    assert summary["duration_ms"] == 250.0
    assert summary["decision"] == "wait-for-pod"
    assert "node" not in after and "reconcile_id" not in after and "controller" not in after
    assert rec.calls == [("node", "requeue_after", 0.25)]


def test_error_is_logged_once_and_counted() -> None:
    buf = io.StringIO()
    configure_logging("info", json=True, stream=buf)
    rec = Recorder()
    with pytest.raises(RuntimeError), reconcile_context(controller="rollout", key="nw", metrics=rec):
        raise RuntimeError("boom")
    (summary,) = lines(buf)
    assert summary["event"] == SUMMARY_EVENT
    assert summary["level"] == "error"
    assert summary["result"] == "error"
    assert "boom" in json.dumps(summary["exception"])
    assert rec.calls[0][:2] == ("rollout", "error")


async def test_cancellation_is_not_a_reconcile_result() -> None:
    rec = Recorder()

    async def worker() -> None:
        with reconcile_context(controller="node", key="k", metrics=rec):
            await asyncio.sleep(10)

    with capture_logs() as logs:
        task = asyncio.create_task(worker())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert rec.calls == []
    assert [(e["event"], e["result"]) for e in logs] == [(SUMMARY_EVENT, "cancelled")]


async def test_concurrent_reconciles_do_not_mix_keys() -> None:
    buf = io.StringIO()
    configure_logging("info", json=True, stream=buf)

    async def one(node: str) -> None:
        with reconcile_context(controller="node", key=node) as rc:
            rc.bind(node=node)
            await asyncio.sleep(0)
            get_logger().info("step")

    await asyncio.gather(*(asyncio.create_task(one(f"n{i}")) for i in range(5)))
    logs = lines(buf)
    for e in logs:
        assert e["key"] == e["node"]
    steps = [e for e in logs if e["event"] == "step"]
    assert sorted(str(e["node"]) for e in steps) == [f"n{i}" for i in range(5)]
    ids = {e["reconcile_id"] for e in logs}
    assert len(ids) == 5


def test_level_filters_and_rejects_unknown() -> None:
    buf = io.StringIO()
    configure_logging("warning", json=True, stream=buf)
    log = get_logger()
    log.info("hidden")
    log.warning("shown")
    assert [o["event"] for o in lines(buf)] == ["shown"]
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging("loud", json=True, stream=io.StringIO())


def test_stdlib_loggers_go_through_the_same_pipeline() -> None:
    buf = io.StringIO()
    configure_logging("info", json=True, stream=buf)
    logging.getLogger("aiohttp.client").warning("connection reset %s", "x")
    (record,) = lines(buf)
    assert record["event"] == "connection reset x"
    assert record["level"] == "warning"
    assert record["logger"] == "aiohttp.client"


def test_trace_ids_added_inside_a_span() -> None:
    buf = io.StringIO()
    configure_logging("info", json=True, stream=buf)
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("work") as span:
        get_logger().info("inside")
    (record,) = lines(buf)
    assert record["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert record["span_id"] == format(span.get_span_context().span_id, "016x")


def test_console_renderer_when_not_json() -> None:
    buf = io.StringIO()
    configure_logging("info", json=False, stream=buf)
    get_logger().info("hello", node="n1")
    text = buf.getvalue()
    assert "hello" in text and "node" in text and "n1" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_json_is_default_when_not_a_tty() -> None:
    buf = io.StringIO()  # isatty() is False
    configure_logging("info", stream=buf)
    get_logger().info("x")
    assert lines(buf)[0]["event"] == "x"


def _fail_with_a_secret_local() -> None:
    authorization = "Bearer sekrit-token-0123456789"
    raise RuntimeError(f"request failed ({len(authorization)} bytes of header)")


@pytest.mark.parametrize("use_json", [True, False])
def test_tracebacks_never_show_local_variables(use_json: bool) -> None:
    """The API client's frames hold the bearer token: a logged exception must not print locals."""
    buf = io.StringIO()
    configure_logging("info", json=use_json, stream=buf)
    try:
        _fail_with_a_secret_local()
    except RuntimeError:
        get_logger().exception("reconcile failed")
        logging.getLogger("stdlib").exception("stdlib too")
    text = buf.getvalue()
    assert "request failed" in text and "_fail_with_a_secret_local" in text, text
    assert "sekrit" not in text, text


def test_the_plugin_logs_errors_without_local_variables(capsys: pytest.CaptureFixture[str]) -> None:
    """`kubectl nodewright` shows library errors on stderr: plain tracebacks, never frame locals."""
    from nodewright.cli.plugin.common import _configure_quiet_logging

    _configure_quiet_logging()
    try:
        try:
            _fail_with_a_secret_local()
        except RuntimeError:
            get_logger().exception("watch failed")
        get_logger().warning("below the plugin's level")
    finally:
        structlog.reset_defaults()
    err = capsys.readouterr().err
    assert "watch failed" in err and "_fail_with_a_secret_local" in err, err
    assert "sekrit" not in err and "below the plugin's level" not in err, err


async def test_a_reconcile_that_wrote_nothing_logs_its_summary_only_at_debug() -> None:
    """Issue 33: most reconciles of a node waiting on its pod read the cache and write nothing; their
    summary line is debug. A reconcile that sent a write (answered or not) keeps its info line, with
    the number of writes."""
    from nodewright.kube.client import KubeClient
    from nodewright.kube.resources import NODES
    from tests.kubefake import NODES_C, FakeKube, node

    kube = await FakeKube().start()
    client = KubeClient(kube.config(), max_retries=0)
    try:
        kube.put(NODES_C, node("n1"))
        for level, expected in (("info", [("patched", 1)]), ("debug", [("read", 0), ("patched", 1)])):
            buf = io.StringIO()
            configure_logging(level, json=True, stream=buf)
            with reconcile_context(controller="node", key="read"):
                await client.get(NODES, "n1")
            with reconcile_context(controller="node", key="patched") as rc:
                await client.patch_node_metadata("n1", labels={"a": "b"})
                rc.requeue(after=1.0)
            summaries = [o for o in lines(buf) if o["event"] == SUMMARY_EVENT]
            assert [(o["key"], o["writes"]) for o in summaries] == expected, level
            assert [o["level"] for o in summaries] == (["info"] if level == "info" else ["debug", "info"])
    finally:
        await client.close()
        await kube.stop()
