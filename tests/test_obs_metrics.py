"""Metrics: scrape the real /metrics handler and parse the exposition with prometheus_client's parser."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.metrics.export import MetricsData as OtelMetricsData
from prometheus_client.parser import text_string_to_metric_families

from nodewright.api.models import Status
from nodewright.observability import metrics as m
from nodewright.observability.endpoints import parse_bind_address
from nodewright.observability.metrics import (
    EXPORTED_METRICS,
    HISTOGRAM_METRICS,
    CompartmentSnapshot,
    NodeWrightSnapshot,
    OperatorMetrics,
    PackageKey,
    count_package_nodes,
)
from nodewright.observability.server import bound_port, start_metrics_server

Sample = tuple[str, dict[str, str], float]


def samples(metrics: OperatorMetrics) -> list[Sample]:
    text = metrics.render().decode()
    return [
        (s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples
    ]


def series(metrics: OperatorMetrics, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {frozenset(labels.items()): value for n, labels, value in samples(metrics) if n == name}


def value(metrics: OperatorMetrics, metric: str, /, **labels: str) -> float | None:
    return series(metrics, metric).get(frozenset(labels.items()))


def snapshot(**overrides: object) -> NodeWrightSnapshot:
    base: dict[str, object] = {
        "status": "in_progress",
        "matched": 5,
        "nodes_by_status": {"complete": 2, "in_progress": 2, "waiting": 1},
        "package_nodes": count_package_nodes(
            [
                ("driver", "1.2", "config", "complete"),
                ("driver", "1.2", "post-interrupt", "complete"),
                ("driver", "1.2", "post-interrupt", "complete"),
                ("driver", "1.2", "apply", "in_progress"),
                ("tools", "0.3", "config", "complete"),
            ]
        ),
        "compartments": (
            CompartmentSnapshot(
                name="rack-a",
                policy="p1",
                strategy="linear",
                matched=3,
                ceiling=2,
                in_progress=1,
                completed=2,
                progress_percent=66,
                current_batch=2,
                consecutive_failures=1,
                halted=True,
                gates={"xid": True, "npd": False},
            ),
            CompartmentSnapshot(name="__default__", policy="p1", strategy="fixed", matched=2, ceiling=1),
        ),
        "drain_blocked": 1,
        "waiting_by_reason": {"budget": 1, "priority": 0},
    }
    base.update(overrides)
    return NodeWrightSnapshot(**base)  # type: ignore[arg-type]


@pytest.fixture
def metrics() -> OperatorMetrics:
    return OperatorMetrics(otlp=False)


async def test_handler_serves_prometheus_text(metrics: OperatorMetrics) -> None:
    metrics.domain.update_nodewright("gpu-drivers", snapshot())
    server = await start_metrics_server(metrics, "127.0.0.1", 0)
    try:
        port = bound_port(server)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics", timeout=aiohttp.ClientTimeout(total=5)) as resp,
        ):
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = await resp.text()
    finally:
        await server.stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["nodewright_matched_nodes"].samples[0].value == 5
    # Exactly the controller-runtime style: no target_info, no otel_scope_* labels.
    assert "target_info" not in families
    assert all(not k.startswith("otel_") for f in families.values() for s in f.samples for k in s.labels)


def test_private_instances_are_isolated() -> None:
    a, b = OperatorMetrics(otlp=False), OperatorMetrics(otlp=False)
    a.domain.update_nodewright("only-in-a", snapshot())
    assert value(a, "nodewright_matched_nodes", nodewright="only-in-a") == 5
    assert series(b, "nodewright_matched_nodes") == {}


def test_domain_gauges_equal_snapshot(metrics: OperatorMetrics) -> None:
    metrics.domain.update_nodewright("nw", snapshot())
    status = series(metrics, "nodewright_status")
    assert {dict(k)["status"]: v for k, v in status.items()} == {
        s.value: (1.0 if s is Status.IN_PROGRESS else 0.0) for s in Status
    }
    nodes = {dict(k)["status"]: v for k, v in series(metrics, "nodewright_nodes").items()}
    assert nodes["complete"] == 2 and nodes["in_progress"] == 2 and nodes["waiting"] == 1
    assert nodes["erroring"] == 0 and set(nodes) == {s.value for s in Status}
    assert value(metrics, "nodewright_matched_nodes", nodewright="nw") == 5
    assert value(metrics, "nodewright_drain_blocked_nodes", nodewright="nw") == 1
    assert value(metrics, "nodewright_waiting_nodes", nodewright="nw", reason="budget") == 1
    labels = {"nodewright": "nw", "policy": "p1", "compartment": "rack-a", "strategy": "linear"}
    expected = {
        "nodewright_rollout_matched_nodes": 3,
        "nodewright_rollout_ceiling": 2,
        "nodewright_rollout_in_progress": 1,
        "nodewright_rollout_completed": 2,
        "nodewright_rollout_progress_percent": 66,
        "nodewright_rollout_current_batch": 2,
        "nodewright_rollout_consecutive_failures": 1,
        "nodewright_rollout_halted": 1,
    }
    for name, want in expected.items():
        assert value(metrics, name, **labels) == want, name
    default = {"nodewright": "nw", "policy": "p1", "compartment": "__default__", "strategy": "fixed"}
    assert value(metrics, "nodewright_rollout_halted", **default) == 0


def test_the_health_gate_gauge_is_per_gate(metrics: OperatorMetrics) -> None:
    """`nodewright_health_gate_holding` names the gate: one series per gate of a compartment, 1 for those
    holding its next batch; a compartment without gates has none."""
    metrics.domain.update_nodewright("nw", snapshot())
    labels = {"nodewright": "nw", "policy": "p1", "compartment": "rack-a", "strategy": "linear"}
    got = {dict(k)["gate"]: v for k, v in series(metrics, "nodewright_health_gate_holding").items()}
    assert got == {"xid": 1, "npd": 0}
    assert value(metrics, "nodewright_health_gate_holding", **labels, gate="xid") == 1


def test_package_nodes_are_summed_not_overwritten(metrics: OperatorMetrics) -> None:
    metrics.domain.update_nodewright("nw", snapshot())
    got = series(metrics, "nodewright_package_nodes")
    by_state: Counter[str] = Counter()
    for key, v in got.items():
        labels = dict(key)
        if labels["package"] == "driver":
            by_state[labels["state"]] += int(v)
    # The reference bug kept only the last stage's count for state "complete" (2 or 1, not 3).
    assert by_state == {"complete": 3, "in_progress": 1}
    assert (
        value(
            metrics,
            "nodewright_package_nodes",
            nodewright="nw",
            package="driver",
            version="1.2",
            stage="post-interrupt",
            state="complete",
        )
        == 2
    )


@settings(max_examples=40, deadline=None)
@given(
    entries=st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.sampled_from(["1", "2"]),
            st.sampled_from(["apply", "config", "interrupt", "post-interrupt"]),
            st.sampled_from(["complete", "in_progress", "erroring"]),
        ),
        max_size=60,
    )
)
def test_package_counts_match_entries_property(entries: list[tuple[str, str, str, str]]) -> None:
    """Per-state and per-stage totals from the scrape equal counts over the raw per-node entries."""
    metrics = OperatorMetrics(otlp=False)
    metrics.domain.update_nodewright("nw", snapshot(package_nodes=count_package_nodes(entries)))
    got = series(metrics, "nodewright_package_nodes")
    per_state: Counter[tuple[str, str]] = Counter()
    per_stage: Counter[tuple[str, str]] = Counter()
    for key, v in got.items():
        labels = dict(key)
        per_state[labels["package"], labels["state"]] += int(v)
        per_stage[labels["package"], labels["stage"]] += int(v)
    assert per_state == Counter((e[0], e[3]) for e in entries)
    assert per_stage == Counter((e[0], e[2]) for e in entries)
    assert sum(got.values()) == len(entries)


def test_removed_nodewright_series_disappear(metrics: OperatorMetrics) -> None:
    d = metrics.domain
    d.update_nodewright("gone", snapshot())
    d.update_nodewright("kept", snapshot())
    d.observe_stage_duration(nodewright="gone", package="driver", stage="apply", seconds=30)
    d.observe_stage_duration(nodewright="kept", package="driver", stage="apply", seconds=30)
    d.observe_maintenance(nodewright="gone", seconds=600)
    d.count_retry(nodewright="gone", package="driver", version="1.2")
    before = samples(metrics)
    assert any(labels.get("nodewright") == "gone" for _, labels, _ in before)

    d.remove_nodewright("gone")
    after = samples(metrics)
    assert [s for s in after if s[1].get("nodewright") == "gone"] == []
    assert value(metrics, "nodewright_matched_nodes", nodewright="kept") == 5
    assert value(
        metrics, "nodewright_stage_duration_seconds_count", nodewright="kept", package="driver", stage="apply"
    )


def test_packages_and_compartments_no_longer_present_disappear(metrics: OperatorMetrics) -> None:
    d = metrics.domain
    d.update_nodewright("nw", snapshot())
    d.observe_stage_duration(nodewright="nw", package="tools", stage="config", seconds=3)
    d.count_retry(nodewright="nw", package="tools", version="0.3")
    assert (
        value(metrics, "nodewright_package_retries_total", nodewright="nw", package="tools", version="0.3")
        == 1
    )

    only_driver = count_package_nodes([("driver", "1.2", "config", "complete")])
    d.update_nodewright("nw", snapshot(package_nodes=only_driver, compartments=()))
    names = {(n, labels.get("package"), labels.get("compartment")) for n, labels, _ in samples(metrics)}
    assert not any(pkg == "tools" for _, pkg, _ in names)
    assert not any(comp is not None for _, _, comp in names)
    assert series(metrics, "nodewright_rollout_halted") == {}


def test_recreated_nodewright_reports_again(metrics: OperatorMetrics) -> None:
    d = metrics.domain
    d.update_nodewright("nw", snapshot())
    d.observe_maintenance(nodewright="nw", seconds=100)
    d.remove_nodewright("nw")
    assert series(metrics, "nodewright_node_maintenance_seconds_count") == {}
    d.update_nodewright("nw", snapshot())
    assert value(metrics, "nodewright_matched_nodes", nodewright="nw") == 5
    assert value(metrics, "nodewright_node_maintenance_seconds_count", nodewright="nw") == 1


def test_histograms_count_observations(metrics: OperatorMetrics) -> None:
    d = metrics.domain
    d.update_nodewright("nw", snapshot())
    durations = [0.5, 4, 45, 45, 700]
    for seconds in durations:
        d.observe_stage_duration(nodewright="nw", package="driver", stage="apply", seconds=seconds)
    d.observe_stage_duration(nodewright="nw", package="driver", stage="config", seconds=2)
    labels = {"nodewright": "nw", "package": "driver", "stage": "apply"}
    assert value(metrics, "nodewright_stage_duration_seconds_count", **labels) == 5
    assert value(metrics, "nodewright_stage_duration_seconds_sum", **labels) == sum(durations)
    assert value(metrics, "nodewright_stage_duration_seconds_bucket", le="60.0", **labels) == 4
    assert value(metrics, "nodewright_stage_duration_seconds_bucket", le="+Inf", **labels) == 5
    config = {"nodewright": "nw", "package": "driver", "stage": "config"}
    assert value(metrics, "nodewright_stage_duration_seconds_count", **config) == 1


def test_oldest_stage_age_uses_clock() -> None:
    now = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
    metrics = OperatorMetrics(otlp=False, now=lambda: now)
    metrics.domain.update_nodewright("busy", snapshot(oldest_stage_started_at=now - timedelta(minutes=40)))
    metrics.domain.update_nodewright("idle", snapshot())
    assert value(metrics, "nodewright_oldest_stage_age_seconds", nodewright="busy") == 2400
    assert value(metrics, "nodewright_oldest_stage_age_seconds", nodewright="idle") == 0


def test_workqueue_gauges_exist_from_queue_creation(metrics: OperatorMetrics) -> None:
    metrics.workqueues.for_queue("idle")
    assert value(metrics, "workqueue_depth", name="idle") == 0
    assert value(metrics, "workqueue_unfinished_work_seconds", name="idle") == 0
    assert value(metrics, "workqueue_longest_running_processor_seconds", name="idle") == 0


def test_series_the_dashboard_and_alerts_read_exist_before_first_use(metrics: OperatorMetrics) -> None:
    """Issue 32: `workqueue_retries_total` (and the watch restart/relist counters) appeared only with
    the first retry, so dashboard panels said "No data" on a healthy operator and `increase()` missed
    the first one. Counters start at 0, histograms of a fixed label set with every bucket at 0 (what
    client-go's `WithLabelValues` does for a queue's latency histograms)."""
    from nodewright.kube.reflector import EVENT_TYPES, RESTART_REASONS

    metrics.workqueues.for_queue("node")
    metrics.init_controller("node")
    metrics.watches.init_resource(resource="nodes", restart_reasons=RESTART_REASONS, event_types=EVENT_TYPES)
    metrics.domain.update_nodewright("nw", snapshot(package_versions={"driver": "1.2", "fresh": "0.1"}))
    assert value(metrics, "workqueue_adds_total", name="node") == 0
    assert value(metrics, "workqueue_retries_total", name="node") == 0
    assert value(metrics, "nodewright_watch_relists_total", resource="nodes") == 0
    for reason in ("gone", "inactive", "connection", "short-watch", "throttled", "error"):
        assert value(metrics, "nodewright_watch_restarts_total", resource="nodes", reason=reason) == 0, reason
    assert value(metrics, "nodewright_watch_events_total", resource="nodes", type="BOOKMARK") == 0
    assert value(metrics, "nodewright_event_loop_lag_last_seconds") == 0
    for reason in ("NotYetInBatch", "BudgetFull", "CompartmentHalted", "ProtectedPods", "DrainBlocked"):
        assert value(metrics, "nodewright_waiting_nodes", nodewright="nw", reason=reason) == 0, reason
    for package, version in (("driver", "1.2"), ("tools", "0.3"), ("fresh", "0.1")):
        labels = {"nodewright": "nw", "package": package, "version": version}
        assert value(metrics, "nodewright_package_retries_total", **labels) == 0, package
    for histogram, labels in (
        ("workqueue_queue_duration_seconds", {"name": "node"}),
        ("workqueue_work_duration_seconds", {"name": "node"}),
        ("controller_runtime_reconcile_time_seconds", {"controller": "node"}),
        ("nodewright_event_loop_lag_seconds", {}),
    ):
        assert value(metrics, f"{histogram}_count", **labels) == 0, histogram
        assert value(metrics, f"{histogram}_bucket", **labels, le="+Inf") == 0, histogram
    # A first observation replaces the empty point (one series, not two).
    metrics.workqueues.for_queue("node").queued_for(0.5)
    metrics.workqueues.for_queue("node").retry()
    assert value(metrics, "workqueue_queue_duration_seconds_count", name="node") == 1
    assert len(series(metrics, "workqueue_queue_duration_seconds_count")) == 1
    assert value(metrics, "workqueue_retries_total", name="node") == 1
    metrics.domain.count_retry(nodewright="nw", package="fresh", version="0.1")
    assert (
        value(metrics, "nodewright_package_retries_total", nodewright="nw", package="fresh", version="0.1")
        == 1
    )


def test_declared_empty_histograms_are_not_pushed_over_otlp() -> None:
    """OTLP keeps OpenTelemetry's semantics (no point before a measurement): an empty point would carry
    min=+inf and max=-inf, which the scrape never shows."""
    exporter = _RecordingExporter()
    metrics = OperatorMetrics(otlp_exporter=exporter, otlp_interval_seconds=3600)
    try:
        metrics.init_controller("rollout")
        metrics.force_flush()
        names = {
            metric.name
            for batch in exporter.batches
            for rm in batch.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
        }
        assert "controller_runtime_reconcile_total" in names
        assert "controller_runtime_reconcile_time_seconds" not in names
        assert value(metrics, "controller_runtime_reconcile_time_seconds_count", controller="rollout") == 0
    finally:
        metrics.shutdown()


def test_workqueue_hooks_move_series(metrics: OperatorMetrics) -> None:
    q = metrics.workqueues.for_queue("node")
    assert metrics.workqueues.for_queue("node") is q
    other = metrics.workqueues.for_queue("rollout")
    for _ in range(3):
        q.add()
    q.depth(7)
    other.depth(1)
    q.queued_for(0.002)
    q.worked_for(0.3)
    q.worked_for(0.03)
    q.retry()
    q.unfinished(total_seconds=12.5, longest_seconds=4.0)
    assert value(metrics, "workqueue_adds_total", name="node") == 3
    assert value(metrics, "workqueue_depth", name="node") == 7
    assert value(metrics, "workqueue_depth", name="rollout") == 1
    assert value(metrics, "workqueue_retries_total", name="node") == 1
    assert value(metrics, "workqueue_queue_duration_seconds_count", name="node") == 1
    assert value(metrics, "workqueue_work_duration_seconds_count", name="node") == 2
    assert value(metrics, "workqueue_work_duration_seconds_bucket", name="node", le="0.1") == 1
    assert value(metrics, "workqueue_unfinished_work_seconds", name="node") == 12.5
    assert value(metrics, "workqueue_longest_running_processor_seconds", name="node") == 4.0
    q.depth(0)
    assert value(metrics, "workqueue_depth", name="node") == 0


def test_request_watch_leader_hooks(metrics: OperatorMetrics) -> None:
    metrics.requests.observe(verb="PATCH", resource="nodes", code="200", seconds=0.02)
    metrics.requests.observe(verb="PATCH", resource="nodes", code="200", seconds=0.03)
    metrics.requests.observe(verb="PATCH", resource="nodes", code="429", seconds=0.01)
    assert value(metrics, "rest_client_requests_total", verb="PATCH", resource="nodes", code="200") == 2
    assert value(metrics, "rest_client_requests_total", verb="PATCH", resource="nodes", code="429") == 1
    assert value(metrics, "rest_client_request_duration_seconds_count", verb="PATCH", resource="nodes") == 3

    metrics.watches.restart(resource="nodes", reason="timeout")
    metrics.watches.relist(resource="nodes")
    metrics.watches.relist(resource="nodes")
    metrics.watches.event(resource="pods", event_type="MODIFIED")
    assert value(metrics, "nodewright_watch_restarts_total", resource="nodes", reason="timeout") == 1
    assert value(metrics, "nodewright_watch_relists_total", resource="nodes") == 2
    assert value(metrics, "nodewright_watch_events_total", resource="pods", type="MODIFIED") == 1

    metrics.leader.set_leader(name="nodewright-operator", leading=True)
    assert value(metrics, "leader_election_master_status", name="nodewright-operator") == 1
    metrics.leader.set_leader(name="nodewright-operator", leading=False)
    assert value(metrics, "leader_election_master_status", name="nodewright-operator") == 0


def test_reconcile_metrics(metrics: OperatorMetrics) -> None:
    metrics.init_controller("rollout")
    assert value(metrics, "controller_runtime_reconcile_total", controller="rollout", result="error") == 0
    metrics.reconcile(controller="rollout", result="success", seconds=0.01)
    metrics.reconcile(controller="rollout", result="error", seconds=0.2)
    metrics.reconcile(controller="rollout", result="requeue_after", seconds=0.02)
    assert value(metrics, "controller_runtime_reconcile_total", controller="rollout", result="error") == 1
    assert value(metrics, "controller_runtime_reconcile_total", controller="rollout", result="success") == 1
    assert value(metrics, "controller_runtime_reconcile_errors_total", controller="rollout") == 1
    assert value(metrics, "controller_runtime_reconcile_time_seconds_count", controller="rollout") == 3
    buckets = [
        labels["le"] for n, labels, _ in samples(metrics) if n.endswith("reconcile_time_seconds_bucket")
    ]
    assert len(buckets) == len(m.RECONCILE_BUCKETS) + 1


def test_notification_sink_series_start_at_zero_and_disappear_with_the_sink(metrics: OperatorMetrics) -> None:
    reasons = ("queue_full", "circuit_open", "shutdown", "removed")
    metrics.init_notification_sink("nw/team", reasons)
    metrics.init_notification_sink("cluster", reasons)
    assert series(metrics, "nodewright_notifications_dropped_total") == {
        frozenset({("sink", sink), ("reason", r)}): 0 for sink in ("nw/team", "cluster") for r in reasons
    }
    metrics.count_notification_dropped("nw/team", "circuit_open")
    metrics.set_notification_queue("nw/team", 256)
    metrics.set_notification_circuit("nw/team", "open")
    assert (
        value(metrics, "nodewright_notifications_dropped_total", sink="nw/team", reason="circuit_open") == 1
    )
    assert value(metrics, "nodewright_notification_queue_depth", sink="nw/team") == 256
    assert {
        labels["state"]: v
        for n, labels, v in samples(metrics)
        if n == "nodewright_notification_circuit_state" and labels["sink"] == "nw/team"
    } == {"closed": 0, "open": 1, "half_open": 0}
    metrics.forget_notification_sink("nw/team")
    for gauge in ("nodewright_notification_queue_depth", "nodewright_notification_circuit_state"):
        assert {dict(k)["sink"] for k in series(metrics, gauge)} == {"cluster"}, gauge


def test_exported_names_match_scrape(metrics: OperatorMetrics) -> None:
    """Exercise every instrument; the scrape's families are exactly EXPORTED_METRICS."""
    d = metrics.domain
    d.update_nodewright("nw", snapshot())
    d.observe_stage_duration(nodewright="nw", package="driver", stage="apply", seconds=1)
    d.observe_maintenance(nodewright="nw", seconds=100)
    d.count_retry(nodewright="nw", package="driver", version="1.2")
    q = metrics.workqueues.for_queue("node")
    q.add()
    q.depth(1)
    q.queued_for(0.1)
    q.worked_for(0.1)
    q.retry()
    q.unfinished(total_seconds=0, longest_seconds=0)
    metrics.requests.observe(verb="GET", resource="nodes", code="200", seconds=0.1)
    metrics.watches.restart(resource="nodes", reason="gone")
    metrics.watches.relist(resource="nodes")
    metrics.watches.event(resource="nodes", event_type="ADDED")
    metrics.leader.set_leader(name="x", leading=True)
    metrics.reconcile(controller="node", result="error", seconds=0.1)
    metrics.record_loop_lag(0.001)
    metrics.count_untrusted_pod("replayed")
    d.count_drift_check(nodewright="nw", result="clean")
    metrics.count_notification("nw/team", "RolloutCompleted", "sent")
    metrics.init_notification_sink("nw/team", ["queue_full"])

    names: set[str] = set()
    for name, _, _ in samples(metrics):
        for suffix in ("_bucket", "_sum", "_count", "_created"):
            base = name.removesuffix(suffix)
            if base != name and base in HISTOGRAM_METRICS:
                name = base
                break
        names.add(name)
    assert names == set(EXPORTED_METRICS)
    assert len(EXPORTED_METRICS) == len(set(EXPORTED_METRICS))


class _RecordingExporter(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[OtelMetricsData] = []

    def export(
        self, metrics_data: OtelMetricsData, timeout_millis: float = 10_000, **_: object
    ) -> MetricExportResult:
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **_: object) -> None:
        return None


def _pushed_nodewrights(batch: OtelMetricsData, metric_name: str) -> set[str]:
    return {
        str(p.attributes["nodewright"])
        for rm in batch.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == metric_name
        for p in metric.data.data_points
        if p.attributes
    }


def test_otlp_push_drops_removed_series_too() -> None:
    exporter = _RecordingExporter()
    metrics = OperatorMetrics(otlp_exporter=exporter, otlp_interval_seconds=3600)
    try:
        metrics.domain.update_nodewright("a", snapshot())
        metrics.domain.update_nodewright("b", snapshot())
        for nw in ("a", "b"):
            metrics.domain.observe_stage_duration(nodewright=nw, package="driver", stage="apply", seconds=3)
        metrics.domain.remove_nodewright("a")
        assert metrics.force_flush()
        last = exporter.batches[-1]
        assert _pushed_nodewrights(last, m.STAGE_DURATION) == {"b"}
        assert _pushed_nodewrights(last, m.NODEWRIGHT_MATCHED_NODES) == {"b"}
    finally:
        metrics.shutdown()


def test_otlp_disabled_without_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert not OperatorMetrics().otlp_enabled
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    pushing = OperatorMetrics(otlp_interval_seconds=3600)
    assert pushing.otlp_enabled
    pushing.provider.shutdown(timeout_millis=100)


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (":8080", ("0.0.0.0", 8080)),
        ("127.0.0.1:9090", ("127.0.0.1", 9090)),
        ("[::1]:8443", ("::1", 8443)),
        (":8081", ("0.0.0.0", 8081)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:9", ("::1", 9)),
        ("0", None),
        ("", None),
    ],
)
def test_parse_bind_address(address: str, expected: tuple[str, int] | None) -> None:
    assert parse_bind_address(address) == expected


@pytest.mark.parametrize("address", ["8080", "host:", "host:http", ":70000"])
def test_parse_bind_address_rejects(address: str) -> None:
    with pytest.raises(ValueError, match="invalid bind address"):
        parse_bind_address(address)


def test_snapshot_gauges_follow_random_updates(metrics: OperatorMetrics) -> None:
    """Repeated updates and removals: the scrape always shows exactly the live snapshots."""
    rng = random.Random(7)
    live: dict[str, int] = {}
    for _ in range(50):
        name = f"nw-{rng.randrange(5)}"
        if rng.random() < 0.3:
            metrics.domain.remove_nodewright(name)
            live.pop(name, None)
        else:
            matched = rng.randrange(100)
            metrics.domain.update_nodewright(name, snapshot(matched=matched))
            live[name] = matched
        got = {dict(k)["nodewright"]: v for k, v in series(metrics, "nodewright_matched_nodes").items()}
        assert got == live
    assert metrics.domain.nodewrights() == frozenset(live)


def test_package_key_is_named() -> None:
    assert count_package_nodes([("p", "1", "apply", "complete")]) == {
        PackageKey("p", "1", "apply", "complete"): 1
    }


def test_hook_implementations_satisfy_kube_protocols(metrics: OperatorMetrics) -> None:
    """Structural check (mypy verifies the assignments); the kube layer accepts these objects."""
    from nodewright.kube import hooks

    provider: hooks.WorkqueueMetricsProvider = metrics.workqueues
    queue: hooks.WorkqueueMetrics = provider.for_queue("q")
    requests: hooks.RequestMetrics = metrics.requests
    watches: hooks.WatchMetrics = metrics.watches
    leader: hooks.LeaderMetrics = metrics.leader
    queue.add()
    requests.observe(verb="GET", resource="nodes", code="200", seconds=0.0)
    watches.relist(resource="nodes")
    leader.set_leader(name="l", leading=True)
    assert value(metrics, "workqueue_adds_total", name="q") == 1


def test_otlp_interval_from_the_opentelemetry_variable() -> None:
    from nodewright.observability.metrics import DEFAULT_OTLP_INTERVAL_MILLIS, otlp_export_interval_millis

    assert otlp_export_interval_millis({}) == DEFAULT_OTLP_INTERVAL_MILLIS
    assert otlp_export_interval_millis({"OTEL_METRIC_EXPORT_INTERVAL": "5000"}) == 5000.0
    for bad in ("soon", "0", "-5", "nan"):
        interval = otlp_export_interval_millis({"OTEL_METRIC_EXPORT_INTERVAL": bad})
        assert interval == DEFAULT_OTLP_INTERVAL_MILLIS


def test_hot_path_histograms_match_an_otel_histogram_in_scrape_and_push() -> None:
    """Issue 33: the per-item latency histograms are aggregated in-process; scraped and pushed, their
    points equal what the OTel SDK aggregates for the same observations (buckets `le`, sum, count,
    min, max)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

    from nodewright.observability.exposition import format_float

    values = [0.0, 0.005, 0.0051, 0.3, 2.0, 1e6, -1.0]
    reference_reader = InMemoryMetricReader()
    reference = MeterProvider(metric_readers=[reference_reader]).get_meter("ref")
    otel = m._histogram(reference, m.RECONCILE_TIME)
    for v in values:
        otel.record(max(0.0, v), {"controller": "node"})
    reference_data = reference_reader.get_metrics_data()
    assert reference_data is not None
    (expected,) = [
        p
        for rm in reference_data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        for p in metric.data.data_points
    ]
    exporter = _RecordingExporter()
    metrics = OperatorMetrics(otlp_exporter=exporter, otlp_interval_seconds=3600)
    try:
        for v in values:
            metrics.reconcile(controller="node", result="success", seconds=v)
        assert metrics.force_flush()
        (pushed,) = [
            p
            for batch in exporter.batches[-1:]
            for rm in batch.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if metric.name == m.RECONCILE_TIME
            for p in metric.data.data_points
        ]
        assert isinstance(expected, HistogramDataPoint) and isinstance(pushed, HistogramDataPoint)
        for field in ("count", "sum", "min", "max", "explicit_bounds", "attributes"):
            assert getattr(pushed, field) == getattr(expected, field), field
        assert list(pushed.bucket_counts) == list(expected.bucket_counts)
        cumulative = 0
        for bound, n in zip(expected.explicit_bounds, expected.bucket_counts, strict=False):
            cumulative += n
            assert value(
                metrics, f"{m.RECONCILE_TIME}_bucket", controller="node", le=format_float(bound)
            ) == (cumulative)
        assert value(metrics, f"{m.RECONCILE_TIME}_count", controller="node") == len(values)
    finally:
        metrics.shutdown()
