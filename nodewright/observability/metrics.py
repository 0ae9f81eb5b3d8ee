"""Operator metrics: OpenTelemetry instruments exposed in Prometheus text format (and optionally OTLP).

One `OperatorMetrics` is created at start-up. It owns the `MeterProvider` (no global state, so every
instance -- and every test -- is isolated), a pull reader that `render()` collects and writes in the
Prometheus text format (`exposition`) and, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, a periodic
OTLP/HTTP reader. It hands out:

- `domain` (`DomainMetrics`): NodeWright gauges set from immutable `NodeWrightSnapshot`s built by the
  controller from the plan layer's status roll-up, plus stage-duration / maintenance histograms and a
  package retry counter;
- implementations of the kube layer's instrumentation Protocols (`nodewright.kube.hooks`), structurally
  typed so this layer never imports `kube`: `workqueues`, `requests`, `watches`, `leader`;
- `reconcile(...)` for the controller-runtime reconcile series and `record_loop_lag(...)`.

Naming. The exposition uses exactly the names Go operators use (`workqueue_depth`,
`controller_runtime_reconcile_total`, ...). The exposition maps the unit into a suffix ("s" ->
`_seconds`) and writes counters with `_total`, like the OTel Prometheus exporter with prometheus_client
did, so instruments are named with their final Prometheus name, counters end in `_total` (stripped and
re-added), and only instruments whose name already ends in `_seconds` carry unit "s". No `target_info`
and no `otel_scope_*` labels are written, so the series are byte-identical to controller-runtime's.
Histograms get explicit bucket boundaries in seconds (the SDK default is millisecond-oriented).
`EXPORTED_METRICS` lists every family name once; tests check the scrape and every PromQL expression in
the shipped dashboard and alert rules against it.

Series removal. Domain gauges are observable instruments whose callbacks read the latest snapshots: a
series that is not reported in a collection is absent from that scrape, so removing a NodeWright (or a
package or compartment disappearing from its snapshot) removes its series with no bookkeeping. The
retry counter is also observable, over a dictionary pruned together with the snapshots. Synchronous
OTel histograms cannot forget a label set, so the two domain histograms are filtered at export time
(Prometheus reader and OTLP exporter both): points of a removed NodeWright, or of a package no longer in
its snapshot, are dropped. Their aggregation state stays in the SDK (bounded by the distinct
nodewright x package x stage combinations ever seen); a NodeWright re-created under the same name
resumes its predecessor's cumulative histogram, which Prometheus' rate() handles like any counter.

Hot-path counters. The counters bumped per watch event, API request, work-queue add and reconcile
(`workqueue_adds_total`, `workqueue_retries_total`, `rest_client_requests_total`,
`nodewright_watch_*_total`, `controller_runtime_reconcile_total` and `_errors_total`) are plain
integers in a dict keyed by their label tuple (`_Counts`), reported by an observable counter when a
collection runs: an OTel synchronous `add()` costs a label-set lookup under a lock per call, and at
thousands of events per second that showed in the operator's profile (docs/benchmarks.md). Names,
labels, values and the series at 0 from the start are unchanged; only the work moves from every event
to every scrape. The four latency histograms observed per work-queue item, reconcile and request
(`workqueue_queue_duration_seconds`, `workqueue_work_duration_seconds`,
`controller_runtime_reconcile_time_seconds`, `rest_client_request_duration_seconds`) are likewise
aggregated here (`_LocalHistogram`: a bisect and four additions under an uncontended lock, where an
OTel `record()` cost 6-20 µs on the benchmark machine) and added to each collection as cumulative
histogram points with the same buckets, so the scrape and the OTLP push carry them as before.

Cardinality. No series is per node: labels are NodeWright, package, version, stage, state, status,
compartment, policy, strategy, reason, controller/queue name, verb, resource, code and notification
sink (at most 8 per NodeWright, plus `cluster`; a removed sink's gauges are forgotten) only.

Threading. Prometheus scrapes run callbacks on the event loop thread; the OTLP periodic reader runs them
on its own thread (the SDK serialises collections). Snapshot maps are replaced copy-on-write (reference
assignment is atomic) and the small mutable maps are guarded by a lock, so callbacks never see a dict
change size while iterating.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Literal, NamedTuple

import structlog
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk import metrics as sdk_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from nodewright.api.models import Status
from nodewright.api.reasons import WaitReason
from nodewright.observability import exposition

# ----------------------------------------------------------------------------------------------------
# Names (the Prometheus family names as scraped; histogram samples add _bucket/_sum/_count)

NODEWRIGHT_STATUS: Final = "nodewright_status"
NODEWRIGHT_NODES: Final = "nodewright_nodes"
NODEWRIGHT_MATCHED_NODES: Final = "nodewright_matched_nodes"
PACKAGE_NODES: Final = "nodewright_package_nodes"
PACKAGE_RETRIES: Final = "nodewright_package_retries_total"
ROLLOUT_MATCHED: Final = "nodewright_rollout_matched_nodes"
ROLLOUT_CEILING: Final = "nodewright_rollout_ceiling"
ROLLOUT_IN_PROGRESS: Final = "nodewright_rollout_in_progress"
ROLLOUT_COMPLETED: Final = "nodewright_rollout_completed"
ROLLOUT_PROGRESS: Final = "nodewright_rollout_progress_percent"
ROLLOUT_BATCH: Final = "nodewright_rollout_current_batch"
ROLLOUT_FAILURES: Final = "nodewright_rollout_consecutive_failures"
ROLLOUT_HALTED: Final = "nodewright_rollout_halted"
WINDOW_ACTIVE: Final = "nodewright_window_active"
HEALTH_GATE_HOLDING: Final = "nodewright_health_gate_holding"
DRAIN_BLOCKED: Final = "nodewright_drain_blocked_nodes"
WAITING_NODES: Final = "nodewright_waiting_nodes"
OLDEST_STAGE_AGE: Final = "nodewright_oldest_stage_age_seconds"
STAGE_DURATION: Final = "nodewright_stage_duration_seconds"
MAINTENANCE: Final = "nodewright_node_maintenance_seconds"

WQ_DEPTH: Final = "workqueue_depth"
WQ_ADDS: Final = "workqueue_adds_total"
WQ_QUEUE_DURATION: Final = "workqueue_queue_duration_seconds"
WQ_WORK_DURATION: Final = "workqueue_work_duration_seconds"
WQ_RETRIES: Final = "workqueue_retries_total"
WQ_UNFINISHED: Final = "workqueue_unfinished_work_seconds"
WQ_LONGEST: Final = "workqueue_longest_running_processor_seconds"
RECONCILE_TOTAL: Final = "controller_runtime_reconcile_total"
RECONCILE_ERRORS: Final = "controller_runtime_reconcile_errors_total"
RECONCILE_TIME: Final = "controller_runtime_reconcile_time_seconds"
LEADER_STATUS: Final = "leader_election_master_status"
REST_REQUESTS: Final = "rest_client_requests_total"
REST_DURATION: Final = "rest_client_request_duration_seconds"
WATCH_RESTARTS: Final = "nodewright_watch_restarts_total"
WATCH_RELISTS: Final = "nodewright_watch_relists_total"
WATCH_EVENTS: Final = "nodewright_watch_events_total"
LOOP_LAG: Final = "nodewright_event_loop_lag_seconds"
LOOP_LAG_LAST: Final = "nodewright_event_loop_lag_last_seconds"
UNTRUSTED_PODS: Final = "nodewright_untrusted_pods_total"
DRIFTED_NODES: Final = "nodewright_drifted_nodes"
DRIFT_CHECKS: Final = "nodewright_drift_checks_total"
NOTIFICATIONS: Final = "nodewright_notifications_total"
NOTIFICATIONS_DROPPED: Final = "nodewright_notifications_dropped_total"
NOTIFICATION_QUEUE: Final = "nodewright_notification_queue_depth"
NOTIFICATION_CIRCUIT: Final = "nodewright_notification_circuit_state"
NOTIFICATION_CIRCUIT_STATES: Final = ("closed", "open", "half_open")

EXPORTED_METRICS: Final[tuple[str, ...]] = (
    NODEWRIGHT_STATUS,
    NODEWRIGHT_NODES,
    NODEWRIGHT_MATCHED_NODES,
    PACKAGE_NODES,
    PACKAGE_RETRIES,
    ROLLOUT_MATCHED,
    ROLLOUT_CEILING,
    ROLLOUT_IN_PROGRESS,
    ROLLOUT_COMPLETED,
    ROLLOUT_PROGRESS,
    ROLLOUT_BATCH,
    ROLLOUT_FAILURES,
    ROLLOUT_HALTED,
    WINDOW_ACTIVE,
    HEALTH_GATE_HOLDING,
    DRAIN_BLOCKED,
    WAITING_NODES,
    OLDEST_STAGE_AGE,
    STAGE_DURATION,
    MAINTENANCE,
    WQ_DEPTH,
    WQ_ADDS,
    WQ_QUEUE_DURATION,
    WQ_WORK_DURATION,
    WQ_RETRIES,
    WQ_UNFINISHED,
    WQ_LONGEST,
    RECONCILE_TOTAL,
    RECONCILE_ERRORS,
    RECONCILE_TIME,
    LEADER_STATUS,
    REST_REQUESTS,
    REST_DURATION,
    WATCH_RESTARTS,
    WATCH_RELISTS,
    WATCH_EVENTS,
    LOOP_LAG,
    LOOP_LAG_LAST,
    UNTRUSTED_PODS,
    DRIFTED_NODES,
    DRIFT_CHECKS,
    NOTIFICATIONS,
    NOTIFICATIONS_DROPPED,
    NOTIFICATION_QUEUE,
    NOTIFICATION_CIRCUIT,
)

PER_NODEWRIGHT_METRICS: Final[frozenset[str]] = frozenset(
    {
        NODEWRIGHT_STATUS,
        NODEWRIGHT_NODES,
        NODEWRIGHT_MATCHED_NODES,
        PACKAGE_NODES,
        PACKAGE_RETRIES,
        ROLLOUT_MATCHED,
        ROLLOUT_CEILING,
        ROLLOUT_IN_PROGRESS,
        ROLLOUT_COMPLETED,
        ROLLOUT_PROGRESS,
        ROLLOUT_BATCH,
        ROLLOUT_FAILURES,
        ROLLOUT_HALTED,
        WINDOW_ACTIVE,
        HEALTH_GATE_HOLDING,
        DRAIN_BLOCKED,
        WAITING_NODES,
        OLDEST_STAGE_AGE,
        STAGE_DURATION,
        MAINTENANCE,
        DRIFTED_NODES,
        DRIFT_CHECKS,
    }
)
"""Families whose series belong to a NodeWright (label `nodewright`): they exist once it does. Every
other family of `EXPORTED_METRICS` that the dashboard or the alerts read is scraped from the start."""

# Histograms dropped at export for removed NodeWrights / packages (see module docstring).
_REMOVABLE_HISTOGRAMS: Final = frozenset({STAGE_DURATION, MAINTENANCE})

# ----------------------------------------------------------------------------------------------------
# Buckets (seconds)

# controller-runtime's reconcile buckets: 5 ms .. 60 s, 40 boundaries.
RECONCILE_BUCKETS: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5,
    0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0,
    6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0,
)  # fmt: skip
# client-go workqueue: exponential from 10 ns, factor 10, 12 buckets (up to 1000 s).
WORKQUEUE_BUCKETS: Final[tuple[float, ...]] = tuple(10.0**e for e in range(-8, 4))
# client-go rest_client_request_duration_seconds.
REST_BUCKETS: Final[tuple[float, ...]] = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
# Stage pods run from seconds (config) to tens of minutes (driver installs, reboots).
STAGE_BUCKETS: Final[tuple[float, ...]] = (
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1200.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
)
# A node's maintenance window (cordon -> uncordon) includes drain and reboot: minutes to hours.
MAINTENANCE_BUCKETS: Final[tuple[float, ...]] = (
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    900.0,
    1200.0,
    1800.0,
    2700.0,
    3600.0,
    5400.0,
    7200.0,
    14400.0,
    28800.0,
)
LOOP_LAG_BUCKETS: Final[tuple[float, ...]] = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class HistogramSpec(NamedTuple):
    description: str
    buckets: tuple[float, ...]


HISTOGRAMS: Final[Mapping[str, HistogramSpec]] = {
    STAGE_DURATION: HistogramSpec(
        "Duration of finished package stages (cordon .. uncordon), per package and stage.", STAGE_BUCKETS
    ),
    MAINTENANCE: HistogramSpec("Node maintenance time, cordon to uncordon.", MAINTENANCE_BUCKETS),
    WQ_QUEUE_DURATION: HistogramSpec(
        "How long an item stays in the queue before being processed.", WORKQUEUE_BUCKETS
    ),
    WQ_WORK_DURATION: HistogramSpec("How long processing an item from the queue takes.", WORKQUEUE_BUCKETS),
    RECONCILE_TIME: HistogramSpec("Time per reconcile.", RECONCILE_BUCKETS),
    REST_DURATION: HistogramSpec("API server request latency, by verb and resource.", REST_BUCKETS),
    LOOP_LAG: HistogramSpec("Event-loop scheduling lag (sleep overshoot).", LOOP_LAG_BUCKETS),
}
"""Every histogram: its HELP text and bucket boundaries in seconds (all of them have unit "s")."""

HISTOGRAM_METRICS: Final[frozenset[str]] = frozenset(HISTOGRAMS)


def _histogram(meter: Any, name: str) -> Any:
    spec = HISTOGRAMS[name]
    return meter.create_histogram(
        name, unit="s", description=spec.description, explicit_bucket_boundaries_advisory=list(spec.buckets)
    )


ReconcileResult = Literal["success", "error", "requeue", "requeue_after"]
RECONCILE_RESULTS: Final[tuple[ReconcileResult, ...]] = ("success", "error", "requeue", "requeue_after")

HELD_BY_PROTECTED_PODS: Final = "ProtectedPods"
"""`nodewright_waiting_nodes` reason of an admitted node held at its gate by protected pods."""
HELD_BY_DRAIN: Final = "DrainBlocked"
"""... by a drain that cannot progress (an eviction refused, or the drain timeout passed)."""
WAITING_REASONS: Final[tuple[str, ...]] = (
    *(r.value for r in WaitReason),
    HELD_BY_PROTECTED_PODS,
    HELD_BY_DRAIN,
)
"""The reasons of `nodewright_waiting_nodes`, each reported per NodeWright (0 when nobody waits)."""

LEGACY_POLICY: Final = "legacy"
"""Policy label value of a NodeWright without a DeploymentPolicy (interruptionBudget translation)."""

# ----------------------------------------------------------------------------------------------------
# Snapshots


class PackageKey(NamedTuple):
    package: str
    version: str
    stage: str
    state: str


STRATEGY_LABELS: Final = ("fixed", "linear", "exponential", "none")


def strategy_label(described: str) -> str:
    """The `strategy` label value from a strategy's description (`fixed(initial=1, ...)`): the kind
    only, so the label has a closed set of values (`fixed`, `linear`, `exponential`, `none` for a
    compartment without a strategy, else `unknown`)."""
    head = described.strip().lower()
    kind = head.split("(", 1)[0].split(" ", 1)[0].strip()
    return kind if kind in STRATEGY_LABELS else "unknown"


@dataclasses.dataclass(frozen=True, slots=True)
class CompartmentSnapshot:
    """One compartment's rollout state (from `CompartmentStatus` and its batch state). `strategy` is
    normalised with `strategy_label`, whatever the caller passes."""

    name: str
    policy: str = LEGACY_POLICY
    strategy: str = "unknown"
    matched: int = 0
    ceiling: int = 0
    in_progress: int = 0
    completed: int = 0
    progress_percent: int = 0
    current_batch: int = 0
    consecutive_failures: int = 0
    halted: bool = False
    window_active: bool = True
    gates: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    """Health gate name -> whether it holds the compartment's next batch now (`plan.gates.holding`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", strategy_label(self.strategy))


@dataclasses.dataclass(frozen=True, slots=True)
class NodeWrightSnapshot:
    """Everything the domain gauges show for one NodeWright at one moment.

    Built by the controller from the plan layer's status aggregation; treat the mappings as read-only.
    `package_nodes` holds node counts per (package, version, stage, state) -- build it with
    `count_package_nodes` so the counts are summed, not overwritten. `packages` names the packages in
    the spec; a package absent from it (e.g. after its uninstall) loses its histogram series too. When
    None, the package names in `package_nodes` and `package_versions` are used. `package_versions`
    (package -> version of the spec) starts the package's retry counter at 0, so `rate()` works before
    its first retry. `oldest_stage_started_at` is when the longest-running in-progress stage of any
    node started (None when no stage is in progress).
    """

    status: str
    matched: int = 0
    nodes_by_status: Mapping[str, int] = dataclasses.field(default_factory=dict)
    package_nodes: Mapping[PackageKey, int] = dataclasses.field(default_factory=dict)
    packages: frozenset[str] | None = None
    package_versions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    compartments: Sequence[CompartmentSnapshot] = ()
    drain_blocked: int = 0
    waiting_by_reason: Mapping[str, int] = dataclasses.field(default_factory=dict)
    oldest_stage_started_at: datetime | None = None

    def package_names(self) -> frozenset[str]:
        if self.packages is not None:
            return self.packages
        return frozenset(key.package for key in self.package_nodes) | frozenset(self.package_versions)


def count_package_nodes(entries: Iterable[tuple[str, str, str, str]]) -> dict[PackageKey, int]:
    """Count nodes per (package, version, stage, state) from one entry per node and package.

    The reference operator set a gauge inside a nested state x stage loop, so a package with nodes at
    `complete/config` and `complete/post-interrupt` reported only the last count; counting whole keys
    keeps every combination, and per-state or per-stage totals are then exact sums.
    """
    return dict(Counter(PackageKey(*entry) for entry in entries))


# ----------------------------------------------------------------------------------------------------
# Domain metrics

_Attrs = Mapping[str, Any]


def _now_utc() -> datetime:
    return datetime.now(UTC)


class DomainMetrics:
    """NodeWright gauges from snapshots, stage/maintenance histograms and package retries."""

    def __init__(self, meter: Any, *, now: Callable[[], datetime] = _now_utc) -> None:
        self._now = now
        self._snapshots: dict[str, NodeWrightSnapshot] = {}
        self._removed: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._retries: dict[tuple[str, str, str], int] = {}
        self._drift_checks: dict[tuple[str, str], int] = {}

        def gauge(name: str, description: str, callback: Callable[[], Iterable[Observation]]) -> None:
            unit = "s" if name.endswith("_seconds") else ""
            meter.create_observable_gauge(
                name, callbacks=[lambda _o: list(callback())], unit=unit, description=description
            )

        gauge(NODEWRIGHT_STATUS, "1 for the NodeWright's current status, 0 for the others.", self._status)
        gauge(NODEWRIGHT_NODES, "Matched nodes per node status of the NodeWright.", self._nodes)
        gauge(NODEWRIGHT_MATCHED_NODES, "Nodes matched by the NodeWright's selector.", self._matched)
        gauge(PACKAGE_NODES, "Nodes per package, version, stage and state.", self._package_nodes)
        gauge(DRAIN_BLOCKED, "Nodes whose drain is blocked (PDB or non-interruptible pods).", self._drain)
        gauge(WAITING_NODES, "Nodes waiting to be admitted, by reason.", self._waiting)
        gauge(OLDEST_STAGE_AGE, "Age of the longest-running in-progress stage.", self._oldest_stage)
        gauge(DRIFTED_NODES, "Nodes whose last drift check failed (driftDetection).", self._drifted)
        for name, attr, description in (
            (ROLLOUT_MATCHED, "matched", "Nodes in the compartment."),
            (ROLLOUT_CEILING, "ceiling", "Maximum nodes in progress at once (budget ceiling)."),
            (ROLLOUT_IN_PROGRESS, "in_progress", "Nodes in progress in the compartment."),
            (ROLLOUT_COMPLETED, "completed", "Nodes complete in the compartment."),
            (ROLLOUT_PROGRESS, "progress_percent", "Compartment progress, 0..100."),
            (ROLLOUT_BATCH, "current_batch", "Current batch number of the compartment (0 before the first)."),
            (ROLLOUT_FAILURES, "consecutive_failures", "Consecutive failed batches in the compartment."),
            (ROLLOUT_HALTED, "halted", "1 when the compartment's rollout is halted by the failure policy."),
            (WINDOW_ACTIVE, "window_active", "1 while the compartment may admit nodes (maintenance window)."),
        ):
            gauge(name, description, self._compartment_callback(attr))
        gauge(
            HEALTH_GATE_HOLDING,
            "Per health gate of the compartment: 1 while it holds the compartment's next batch.",
            self._gates_holding,
        )
        meter.create_observable_counter(
            DRIFT_CHECKS,
            callbacks=[lambda _o: list(self._drift_check_observations())],
            unit="",
            description="Drift checks that finished, by result: clean, drifted, or error (could not run).",
        )
        meter.create_observable_counter(
            PACKAGE_RETRIES,
            callbacks=[lambda _o: list(self._retry_observations())],
            unit="",
            description="Package stage retries (failed attempts that were retried).",
        )
        self._stage_duration = _histogram(meter, STAGE_DURATION)
        self._maintenance = _histogram(meter, MAINTENANCE)

    # -- controller API -----------------------------------------------------------------------------

    def update_nodewright(self, name: str, snapshot: NodeWrightSnapshot) -> None:
        """Replace the NodeWright's snapshot; series no longer present disappear on the next scrape."""
        keep = snapshot.package_names()
        versions = {
            *snapshot.package_versions.items(),
            *((k.package, k.version) for k in snapshot.package_nodes),
        }
        with self._lock:
            retries = {k: v for k, v in self._retries.items() if k[0] != name or k[1] in keep}
            for package, version in versions:
                if package in keep:
                    retries.setdefault((name, package, version), 0)
            self._retries = retries
            self._snapshots = {**self._snapshots, name: snapshot}
            if name in self._removed:
                self._removed = self._removed - {name}

    def remove_nodewright(self, name: str) -> None:
        """Forget a deleted NodeWright: all of its series disappear from the next scrape."""
        with self._lock:
            self._snapshots = {k: v for k, v in self._snapshots.items() if k != name}
            self._retries = {k: v for k, v in self._retries.items() if k[0] != name}
            self._removed = self._removed | {name}

    def observe_stage_duration(self, *, nodewright: str, package: str, stage: str, seconds: float) -> None:
        """One observation per finished stage (complete or failed attempt)."""
        self._stage_duration.record(
            max(0.0, seconds), {"nodewright": nodewright, "package": package, "stage": stage}
        )

    def observe_maintenance(self, *, nodewright: str, seconds: float) -> None:
        """One observation per node uncordoned after maintenance (time since its cordon)."""
        self._maintenance.record(max(0.0, seconds), {"nodewright": nodewright})

    def count_retry(self, *, nodewright: str, package: str, version: str, n: int = 1) -> None:
        with self._lock:
            key = (nodewright, package, version)
            self._retries[key] = self._retries.get(key, 0) + n

    def count_drift_check(self, *, nodewright: str, result: str) -> None:
        with self._lock:
            key = (nodewright, result)
            self._drift_checks[key] = self._drift_checks.get(key, 0) + 1

    def nodewrights(self) -> frozenset[str]:
        return frozenset(self._snapshots)

    # -- export filter --------------------------------------------------------------------------------

    def keeps(self, attributes: _Attrs) -> bool:
        """Whether a removable-histogram point still belongs to a live NodeWright and package."""
        nw = attributes.get("nodewright")
        if not isinstance(nw, str):
            return True
        if nw in self._removed:
            return False
        package = attributes.get("package")
        snapshot = self._snapshots.get(nw)
        if package is None or snapshot is None:
            return True
        return package in snapshot.package_names()

    # -- callbacks ----------------------------------------------------------------------------------

    def _status(self) -> Iterable[Observation]:
        for nw, snap in self._snapshots.items():
            values = {s.value for s in Status} | {snap.status}
            for status in sorted(values):
                yield Observation(1 if status == snap.status else 0, {"nodewright": nw, "status": status})

    def _nodes(self) -> Iterable[Observation]:
        for nw, snap in self._snapshots.items():
            # Every status is reported (0 when empty) so panels and ratios do not see gaps.
            for status in sorted({s.value for s in Status} | set(snap.nodes_by_status)):
                count = snap.nodes_by_status.get(status, 0)
                yield Observation(count, {"nodewright": nw, "status": status})

    def _matched(self) -> Iterable[Observation]:
        for nw, snap in self._snapshots.items():
            yield Observation(snap.matched, {"nodewright": nw})

    def _package_nodes(self) -> Iterable[Observation]:
        for nw, snap in self._snapshots.items():
            for key, count in snap.package_nodes.items():
                yield Observation(
                    count,
                    {
                        "nodewright": nw,
                        "package": key.package,
                        "version": key.version,
                        "stage": key.stage,
                        "state": key.state,
                    },
                )

    def _drain(self) -> Iterable[Observation]:
        for nw, snap in self._snapshots.items():
            yield Observation(snap.drain_blocked, {"nodewright": nw})

    def _waiting(self) -> Iterable[Observation]:
        for nw, snap in self._snapshots.items():
            # Every reason is reported (0 when nobody waits for it), like the node statuses.
            for reason in sorted(set(WAITING_REASONS) | set(snap.waiting_by_reason)):
                yield Observation(snap.waiting_by_reason.get(reason, 0), {"nodewright": nw, "reason": reason})

    def _oldest_stage(self) -> Iterable[Observation]:
        now = self._now()
        for nw, snap in self._snapshots.items():
            started = snap.oldest_stage_started_at
            age = 0.0 if started is None else max(0.0, (now - started).total_seconds())
            yield Observation(age, {"nodewright": nw})

    def _compartment_callback(self, attr: str) -> Callable[[], Iterable[Observation]]:
        def callback() -> Iterable[Observation]:
            for nw, snap in self._snapshots.items():
                for c in snap.compartments:
                    labels = {
                        "nodewright": nw,
                        "policy": c.policy,
                        "compartment": c.name,
                        "strategy": c.strategy,
                    }
                    yield Observation(int(getattr(c, attr)), labels)

        return callback

    def _gates_holding(self) -> Iterable[Observation]:
        for nw, snap in self._snapshots.items():
            for c in snap.compartments:
                labels = {"nodewright": nw, "policy": c.policy, "compartment": c.name, "strategy": c.strategy}
                for gate, holding in sorted(c.gates.items()):
                    yield Observation(int(holding), {**labels, "gate": gate})

    def _drifted(self) -> Iterable[Observation]:
        for nw, snap in self._snapshots.items():
            yield Observation(snap.nodes_by_status.get("drifted", 0), {"nodewright": nw})

    def _drift_check_observations(self) -> Iterable[Observation]:
        with self._lock:
            items = list(self._drift_checks.items())
        for (nw, result), count in items:
            if nw in self._snapshots:
                yield Observation(count, {"nodewright": nw, "result": result})

    def _retry_observations(self) -> Iterable[Observation]:
        with self._lock:
            items = list(self._retries.items())
        for (nw, package, version), count in items:
            yield Observation(count, {"nodewright": nw, "package": package, "version": version})


# ----------------------------------------------------------------------------------------------------
# Kube-layer hook implementations (structural: see nodewright.kube.hooks)


_Key = tuple[tuple[str, str], ...]


class _Counts:
    """Monotonic counts per label set, reported by an observable counter (see "Hot-path counters").

    Written on the event loop only (one writer: a `get` and a store, no lock); a collection on the
    OTLP reader's thread reads a copy (`dict.copy` runs without releasing the GIL), so it never sees
    the dict change size while iterating.
    """

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[_Key, int] = {}

    def add(self, key: _Key, n: int = 1) -> None:
        values = self._values
        values[key] = values.get(key, 0) + n

    def observe(self, _options: CallbackOptions) -> list[Observation]:
        return [Observation(value, dict(key)) for key, value in self._values.copy().items()]


class _Series:
    """One label set of a `_LocalHistogram`: cumulative like an OTel explicit-bucket histogram."""

    __slots__ = ("buckets", "count", "maximum", "minimum", "start", "total")

    def __init__(self, size: int) -> None:
        self.buckets = [0] * size
        self.count = 0
        self.total = 0.0
        self.minimum = math.inf
        self.maximum = -math.inf
        self.start = time.time_ns()


class _LocalHistogram:
    """A latency histogram aggregated in-process and exported at collection (see "Hot-path counters").

    Bucket i counts values <= bounds[i] (the last one, the rest), like OTel's explicit buckets and
    Prometheus' `le`. The lock is uncontended but for a collection on the OTLP reader's thread, which
    then reads a consistent point.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.bounds = HISTOGRAMS[name].buckets
        self._lock = threading.Lock()
        self._series: dict[_Key, _Series] = {}

    def record(self, key: _Key, value: float) -> None:
        value = max(0.0, value)
        index = bisect.bisect_left(self.bounds, value)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _Series(len(self.bounds) + 1)
            series.buckets[index] += 1
            series.count += 1
            series.total += value
            if value < series.minimum:
                series.minimum = value
            if value > series.maximum:
                series.maximum = value

    def metric(self, now: int) -> Metric | None:
        """The cumulative points so far (None before the first observation)."""
        with self._lock:
            points = [
                HistogramDataPoint(
                    attributes=dict(key),
                    start_time_unix_nano=series.start,
                    time_unix_nano=now,
                    count=series.count,
                    sum=series.total,
                    bucket_counts=list(series.buckets),
                    explicit_bounds=self.bounds,
                    min=series.minimum,
                    max=series.maximum,
                )
                for key, series in self._series.items()
            ]
        if not points:
            return None
        data = Histogram(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE)
        return Metric(name=self.name, description=HISTOGRAMS[self.name].description, unit="s", data=data)


def _with_local(data: MetricsData, histograms: Iterable[_LocalHistogram]) -> MetricsData:
    """`data` with the local histograms' metrics added to its first scope."""
    now = time.time_ns()
    extra = [m for m in (h.metric(now) for h in histograms) if m is not None]
    if not extra or not data.resource_metrics or not data.resource_metrics[0].scope_metrics:
        return data  # (a collection with no scope has nothing at all: the gauges always report)
    first = data.resource_metrics[0]
    scopes = list(first.scope_metrics)
    scopes[0] = dataclasses.replace(scopes[0], metrics=[*scopes[0].metrics, *extra])
    return dataclasses.replace(
        data, resource_metrics=[dataclasses.replace(first, scope_metrics=scopes), *data.resource_metrics[1:]]
    )


def _counter(meter: Any, name: str, description: str) -> _Counts:
    counts = _Counts()
    meter.create_observable_counter(name, callbacks=[counts.observe], unit="", description=description)
    return counts


class _Gauges:
    """Latest value per label set, reported by an observable gauge; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[tuple[str, str], ...], float] = {}

    def set(self, labels: Mapping[str, str], value: float) -> None:
        self.set_key(tuple(sorted(labels.items())), value)

    def set_key(self, key: _Key, value: float) -> None:
        with self._lock:
            self._values[key] = value

    def observe(self, _options: CallbackOptions) -> list[Observation]:
        with self._lock:
            items = list(self._values.items())
        return [Observation(value, dict(key)) for key, value in items]

    def remove(self, label: str, value: str) -> None:
        """Forget every series whose `label` is `value` (it disappears from the next collection)."""
        with self._lock:
            self._values = {k: v for k, v in self._values.items() if (label, value) not in k}


class QueueMetrics:
    """`WorkqueueMetrics` of one queue (client-go's workqueue metrics, label `name`)."""

    def __init__(self, name: str, owner: WorkqueueMetricsProvider) -> None:
        self._labels = {"name": name}
        self._key: _Key = (("name", name),)
        self._owner = owner
        self._adds = owner.adds
        self._depths = owner.depths
        self._depth: int | None = None

    def add(self) -> None:
        self._adds.add(self._key)

    def depth(self, value: int) -> None:
        if value != self._depth:  # set on every add and get: mostly the value it already has
            self._depth = value
            self._depths.set_key(self._key, value)

    def queued_for(self, seconds: float) -> None:
        self._owner.queue_duration.record(self._key, seconds)

    def worked_for(self, seconds: float) -> None:
        self._owner.work_duration.record(self._key, seconds)

    def retry(self) -> None:
        self._owner.retries.add(self._key)

    def unfinished(self, *, total_seconds: float, longest_seconds: float) -> None:
        self._owner.unfinished_work.set(self._labels, total_seconds)
        self._owner.longest_running.set(self._labels, longest_seconds)


class WorkqueueMetricsProvider:
    """`WorkqueueMetricsProvider`: one `QueueMetrics` per queue name."""

    def __init__(self, meter: Any, zeros: ZeroHistograms | None = None) -> None:
        self._zeros = zeros or ZeroHistograms()
        self.depths = _Gauges()
        self.unfinished_work = _Gauges()
        self.longest_running = _Gauges()
        meter.create_observable_gauge(
            WQ_DEPTH, callbacks=[self.depths.observe], description="Current depth of the work queue."
        )
        meter.create_observable_gauge(
            WQ_UNFINISHED,
            callbacks=[self.unfinished_work.observe],
            unit="s",
            description="Seconds of work in progress not yet observed by work_duration (stuck workers).",
        )
        meter.create_observable_gauge(
            WQ_LONGEST,
            callbacks=[self.longest_running.observe],
            unit="s",
            description="How long the longest-running processor of the queue has been running.",
        )
        self.adds = _counter(meter, WQ_ADDS, "Adds handled by the work queue.")
        self.retries = _counter(meter, WQ_RETRIES, "Retries (rate-limited re-adds).")
        self.queue_duration = _LocalHistogram(WQ_QUEUE_DURATION)
        self.work_duration = _LocalHistogram(WQ_WORK_DURATION)
        self._queues: dict[str, QueueMetrics] = {}

    def for_queue(self, name: str) -> QueueMetrics:
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = QueueMetrics(name, self)
            # Like client-go: a queue's series exist from its creation, not from its first add, so an
            # idle queue (or a standby's) is scrapeable and rate() sees the first retry: gauges and
            # counters at 0, the latency histograms with every bucket at 0.
            queue.depth(0)
            queue.unfinished(total_seconds=0.0, longest_seconds=0.0)
            labels = {"name": name}
            self.adds.add((("name", name),), 0)
            self.retries.add((("name", name),), 0)
            self._zeros.declare(WQ_QUEUE_DURATION, labels)
            self._zeros.declare(WQ_WORK_DURATION, labels)
        return queue


class RequestMetricsRecorder:
    """`RequestMetrics`: rest_client_requests_total and rest_client_request_duration_seconds."""

    def __init__(self, meter: Any) -> None:
        self._requests = _counter(
            meter, REST_REQUESTS, "HTTP requests to the API server, by verb, resource and status code."
        )
        self.duration = _LocalHistogram(REST_DURATION)

    def observe(self, *, verb: str, resource: str, code: str, seconds: float) -> None:
        self._requests.add((("verb", verb), ("code", code), ("resource", resource)))
        self.duration.record((("verb", verb), ("resource", resource)), seconds)


class WatchMetricsRecorder:
    """`WatchMetrics`: watch restarts (by reason), relists and received events."""

    def __init__(self, meter: Any) -> None:
        self._restarts = _counter(meter, WATCH_RESTARTS, "Watch streams restarted.")
        self._relists = _counter(meter, WATCH_RELISTS, "Full relists (e.g. after 410 Gone).")
        self._events = _counter(meter, WATCH_EVENTS, "Watch events received, by type.")

    def init_resource(
        self, *, resource: str, restart_reasons: Iterable[str], event_types: Iterable[str]
    ) -> None:
        """A watched resource's series at 0 before its first relist, restart or event, so `increase()`
        and alerts see the first one and the dashboard's panels are not empty on a healthy operator."""
        self._relists.add((("resource", resource),), 0)
        for reason in restart_reasons:
            self._restarts.add((("resource", resource), ("reason", reason)), 0)
        for event_type in event_types:
            self._events.add((("resource", resource), ("type", event_type)), 0)

    def restart(self, *, resource: str, reason: str) -> None:
        self._restarts.add((("resource", resource), ("reason", reason)))

    def relist(self, *, resource: str) -> None:
        self._relists.add((("resource", resource),))

    def event(self, *, resource: str, event_type: str) -> None:
        self._events.add((("resource", resource), ("type", event_type)))


class LeaderMetricsRecorder:
    """`LeaderMetrics`: leader_election_master_status{name} (1 leading, 0 standby)."""

    def __init__(self, meter: Any) -> None:
        self._status = _Gauges()
        meter.create_observable_gauge(
            LEADER_STATUS,
            callbacks=[self._status.observe],
            description="1 while this instance holds the lease, 0 on standby.",
        )

    def set_leader(self, *, name: str, leading: bool) -> None:
        self._status.set({"name": name}, 1 if leading else 0)


# ----------------------------------------------------------------------------------------------------
# Export plumbing


class ZeroHistograms:
    """Histogram series that exist from their declaration, every bucket at 0.

    client-go creates a queue's latency histograms with the queue (`WithLabelValues`), so they are
    scraped before the first item; the OTel SDK reports a histogram point (and the metric at all) only
    after a first observation. Declared label sets without a point get an empty one in the scrape
    (the Prometheus exposition; the OTLP push keeps OpenTelemetry's own semantics: no point before a
    measurement). Declarations are few and fixed (queues, controllers, the loop lag); they are never
    removed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._declared: dict[str, set[tuple[tuple[str, str], ...]]] = {}

    def declare(self, name: str, attributes: Mapping[str, str]) -> None:
        if name not in HISTOGRAMS:
            raise ValueError(f"{name} is not a histogram")
        with self._lock:
            self._declared.setdefault(name, set()).add(tuple(sorted(attributes.items())))

    def complete(self, data: MetricsData) -> MetricsData:
        """`data` with an empty point for each declared series it lacks (and the metric if absent)."""
        with self._lock:
            declared = {name: set(keys) for name, keys in self._declared.items()}
        if not declared:
            return data
        now = time.time_ns()
        missing = dict(declared)
        resource_metrics = []
        for rm in data.resource_metrics:
            scope_metrics = []
            for sm in rm.scope_metrics:
                metrics = [self._fill(m, missing.pop(m.name, set()), now) for m in sm.metrics]
                scope_metrics.append(dataclasses.replace(sm, metrics=metrics))
            resource_metrics.append(dataclasses.replace(rm, scope_metrics=scope_metrics))
        absent = [self._fill(self._metric(name), keys, now) for name, keys in missing.items() if keys]
        if absent and resource_metrics and resource_metrics[0].scope_metrics:
            first = resource_metrics[0]
            scopes = list(first.scope_metrics)
            scopes[0] = dataclasses.replace(scopes[0], metrics=[*scopes[0].metrics, *absent])
            resource_metrics[0] = dataclasses.replace(first, scope_metrics=scopes)
        # (A collection with no scope at all has nothing else either: the gauges always report.)
        return dataclasses.replace(data, resource_metrics=resource_metrics)

    @staticmethod
    def _metric(name: str) -> Metric:
        data = Histogram(data_points=[], aggregation_temporality=AggregationTemporality.CUMULATIVE)
        return Metric(name=name, description=HISTOGRAMS[name].description, unit="s", data=data)

    @staticmethod
    def _fill(metric: Metric, keys: set[tuple[tuple[str, str], ...]], now: int) -> Metric:
        if not keys or not isinstance(metric.data, Histogram):
            return metric
        present = {
            tuple(sorted((k, str(v)) for k, v in (p.attributes or {}).items()))
            for p in metric.data.data_points
        }
        bounds = HISTOGRAMS[metric.name].buckets
        empty = [
            HistogramDataPoint(
                attributes=dict(key),
                start_time_unix_nano=now,
                time_unix_nano=now,
                count=0,
                sum=0.0,
                bucket_counts=[0] * (len(bounds) + 1),
                explicit_bounds=bounds,
                min=math.inf,
                max=-math.inf,
            )
            for key in sorted(keys - present)
        ]
        if not empty:
            return metric
        points = [*metric.data.data_points, *empty]
        return dataclasses.replace(metric, data=dataclasses.replace(metric.data, data_points=points))


def _filter_metrics(data: MetricsData, keep: Callable[[_Attrs], bool]) -> MetricsData:
    """Drop points of removable histograms that `keep` rejects (see module docstring)."""

    def metric(m: Metric) -> Metric:
        if m.name not in _REMOVABLE_HISTOGRAMS or not isinstance(m.data, Histogram):
            return m
        points = [p for p in m.data.data_points if keep(p.attributes or {})]
        return dataclasses.replace(m, data=dataclasses.replace(m.data, data_points=points))

    return dataclasses.replace(
        data,
        resource_metrics=[
            dataclasses.replace(
                rm,
                scope_metrics=[
                    dataclasses.replace(sm, metrics=[metric(m) for m in sm.metrics])
                    for sm in rm.scope_metrics
                ],
            )
            for rm in data.resource_metrics
        ],
    )


class _FilteringPrometheusReader(MetricReader):
    """The scrape's pull reader: `render()` collects (running the observable callbacks on the caller's
    thread) and writes the filtered collection in the Prometheus text format."""

    def __init__(self, prepare: Callable[[MetricsData], MetricsData]) -> None:
        # Cumulative for every instrument kind, as PrometheusMetricReader asks: a scrape shows totals.
        super().__init__(
            preferred_temporality=dict.fromkeys(
                (
                    sdk_metrics.Counter,
                    sdk_metrics.UpDownCounter,
                    sdk_metrics.Histogram,
                    sdk_metrics.ObservableCounter,
                    sdk_metrics.ObservableUpDownCounter,
                    sdk_metrics.ObservableGauge,
                ),
                AggregationTemporality.CUMULATIVE,
            ),
        )
        self._prepare = prepare
        # `collect()` hands its result to `_receive_metrics`; the lock pairs each render with its own
        # collection when two threads render at once.
        self._render_lock = threading.Lock()
        self._collected: MetricsData | None = None
        self._shut_down = False

    def render(self) -> bytes:
        with self._render_lock:
            if self._shut_down:
                return b""
            self.collect()
            collected, self._collected = self._collected, None
        return b"" if collected is None else exposition.render(collected)

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        self._collected = self._prepare(metrics_data)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        # Nothing is buffered between scrapes; the base class would run every callback for nothing.
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        with self._render_lock:
            self._shut_down = True


class _FilteringExporter(MetricExporter):
    """Wraps the OTLP exporter so pushed data drops removed series like the scrape does."""

    def __init__(self, inner: MetricExporter, prepare: Callable[[MetricsData], MetricsData]) -> None:
        super().__init__()
        self._inner = inner
        self._prepare = prepare

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return self._inner.export(self._prepare(metrics_data), timeout_millis=timeout_millis)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis)


OTLP_ENDPOINT_ENV: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"


log = structlog.get_logger("nodewright.metrics")

OTLP_INTERVAL_ENV = "OTEL_METRIC_EXPORT_INTERVAL"
DEFAULT_OTLP_INTERVAL_MILLIS = 30_000.0


def otlp_export_interval_millis(env: Mapping[str, str]) -> float:
    """The OTLP push interval: `OTEL_METRIC_EXPORT_INTERVAL` (milliseconds, the OpenTelemetry
    variable), else 30 s. A value that is not a positive number is reported and ignored."""
    text = env.get(OTLP_INTERVAL_ENV, "").strip()
    if not text:
        return DEFAULT_OTLP_INTERVAL_MILLIS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        log.warning(
            f"{OTLP_INTERVAL_ENV} must be a positive number of milliseconds; using the default",
            value=text,
            default_millis=DEFAULT_OTLP_INTERVAL_MILLIS,
        )
        return DEFAULT_OTLP_INTERVAL_MILLIS
    return value


class OperatorMetrics:
    """All of the operator's metrics; create one at start-up (tests create private ones freely).

    `otlp`: None pushes over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the exporter reads the
    standard OTEL_* variables), True/False force it; `otlp_exporter` injects an exporter (tests).
    """

    def __init__(
        self,
        *,
        otlp: bool | None = None,
        otlp_exporter: MetricExporter | None = None,
        otlp_interval_seconds: float | None = None,
        service_instance: str | None = None,
        now: Callable[[], datetime] = _now_utc,
    ) -> None:
        self.zero_histograms = ZeroHistograms()
        self._prometheus = _FilteringPrometheusReader(self._scraped)
        readers: list[MetricReader] = [self._prometheus]
        if otlp is None:
            otlp = bool(os.environ.get(OTLP_ENDPOINT_ENV))
        self.otlp_enabled = bool(otlp or otlp_exporter is not None)
        if self.otlp_enabled:
            if otlp_exporter is None:
                from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

                otlp_exporter = OTLPMetricExporter()
            readers.append(
                PeriodicExportingMetricReader(
                    _FilteringExporter(otlp_exporter, self._pushed),
                    export_interval_millis=(
                        otlp_export_interval_millis(os.environ)
                        if otlp_interval_seconds is None
                        else otlp_interval_seconds * 1000
                    ),
                )
            )
        attributes: dict[str, str] = {"service.name": "nodewright-operator"}
        if service_instance:
            attributes["service.instance.id"] = service_instance
        self.provider = MeterProvider(metric_readers=readers, resource=Resource.create(attributes))
        meter = self.provider.get_meter("nodewright")
        self.domain = DomainMetrics(meter, now=now)
        self.workqueues = WorkqueueMetricsProvider(meter, self.zero_histograms)
        self.requests = RequestMetricsRecorder(meter)
        self.watches = WatchMetricsRecorder(meter)
        self.leader = LeaderMetricsRecorder(meter)
        self._reconcile_total = _counter(meter, RECONCILE_TOTAL, "Reconciles per controller and result.")
        self._reconcile_errors = _counter(meter, RECONCILE_ERRORS, "Reconciles that returned an error.")
        self._reconcile_time = _LocalHistogram(RECONCILE_TIME)
        self._loop_lag = _histogram(meter, LOOP_LAG)
        self._loop_lag_last = _Gauges()
        meter.create_observable_gauge(
            LOOP_LAG_LAST,
            callbacks=[self._loop_lag_last.observe],
            unit="s",
            description="Most recent event-loop lag measurement.",
        )
        # Scrapeable before the first measurement: it also marks a target as a NodeWright operator
        # (the alert rules and the dashboard's `job` variable join on it).
        self._loop_lag_last.set({}, 0.0)
        self.zero_histograms.declare(LOOP_LAG, {})
        self._untrusted_pods = meter.create_counter(
            UNTRUSTED_PODS,
            description="Pods with package-pod labels that failed verification and were deleted, by reason.",
        )
        self._notifications = meter.create_counter(
            NOTIFICATIONS,
            description="Notifications by sink, event and result: sent, failed (after retries), dropped"
            " (see nodewright_notifications_dropped_total) or duplicate (key already sent).",
        )
        self._notifications_dropped = meter.create_counter(
            NOTIFICATIONS_DROPPED,
            description="Notifications dropped, by sink and reason: queue_full, circuit_open (the sink's"
            " queue full while its circuit is open), shutdown (still queued after the grace), removed (the"
            " sink left the spec).",
        )
        self._notification_queue = _Gauges()
        meter.create_observable_gauge(
            NOTIFICATION_QUEUE,
            callbacks=[self._notification_queue.observe],
            description="Notices waiting in a notification sink's queue.",
        )
        self._notification_circuit = _Gauges()
        meter.create_observable_gauge(
            NOTIFICATION_CIRCUIT,
            callbacks=[self._notification_circuit.observe],
            description="1 for the current circuit state of a notification sink (closed, open, half_open),"
            " 0 for the others.",
        )
        self._closed = False

    def _local(self) -> tuple[_LocalHistogram, ...]:
        w = self.workqueues
        return (w.queue_duration, w.work_duration, self._reconcile_time, self.requests.duration)

    def _pushed(self, data: MetricsData) -> MetricsData:
        """What the OTLP push exports: the local histograms added, removed series dropped."""
        # Readers are built before `domain` exists, but nothing is collected before it does.
        return _filter_metrics(_with_local(data, self._local()), self.domain.keeps)

    def _scraped(self, data: MetricsData) -> MetricsData:
        """What the scrape shows: also the declared histograms without observations, empty."""
        data = _with_local(data, self._local())
        return _filter_metrics(self.zero_histograms.complete(data), self.domain.keeps)

    def reconcile(self, *, controller: str, result: ReconcileResult, seconds: float) -> None:
        """Record one finished reconcile (controller-runtime semantics: errors also count in _total)."""
        self._reconcile_total.add((("controller", controller), ("result", result)))
        if result == "error":
            self._reconcile_errors.add((("controller", controller),))
        self._reconcile_time.record((("controller", controller),), seconds)

    def init_controller(self, controller: str) -> None:
        """Emit zero-valued reconcile series so rate() and absence alerts work from the start (the time
        histogram with every bucket at 0)."""
        for result in RECONCILE_RESULTS:
            self._reconcile_total.add((("controller", controller), ("result", result)), 0)
        self._reconcile_errors.add((("controller", controller),), 0)
        self.zero_histograms.declare(RECONCILE_TIME, {"controller": controller})

    def init_untrusted_pods(self, reasons: Iterable[str]) -> None:
        """Zero-valued series per reason, so `increase()` and alerts see the first untrusted pod."""
        for reason in reasons:
            self._untrusted_pods.add(0, {"reason": reason})

    def count_untrusted_pod(self, reason: str) -> None:
        """One pod in the operator namespace that looked like a package pod and failed verification."""
        self._untrusted_pods.add(1, {"reason": reason})

    def count_notification(self, sink: str, event: str, result: str) -> None:
        """One notification outcome (controller.notify)."""
        self._notifications.add(1, {"sink": sink, "event": event, "result": result})

    def init_notification_sink(self, sink: str, reasons: Iterable[str]) -> None:
        """A sink's series from its start: zero drops per reason (so `increase()` and alerts see the
        first one), an empty queue, a closed circuit."""
        for reason in reasons:
            self._notifications_dropped.add(0, {"sink": sink, "reason": reason})
        self.set_notification_queue(sink, 0)
        self.set_notification_circuit(sink, "closed")

    def count_notification_dropped(self, sink: str, reason: str) -> None:
        """One notice a sink will never get (controller.notify)."""
        self._notifications_dropped.add(1, {"sink": sink, "reason": reason})

    def set_notification_queue(self, sink: str, depth: int) -> None:
        self._notification_queue.set({"sink": sink}, depth)

    def set_notification_circuit(self, sink: str, state: str) -> None:
        for each in NOTIFICATION_CIRCUIT_STATES:
            self._notification_circuit.set({"sink": sink, "state": each}, 1 if each == state else 0)

    def forget_notification_sink(self, sink: str) -> None:
        """A sink removed from the spec: its gauges disappear (counters cannot forget a label set)."""
        self._notification_queue.remove("sink", sink)
        self._notification_circuit.remove("sink", sink)

    def record_loop_lag(self, seconds: float) -> None:
        self._loop_lag.record(max(0.0, seconds))
        self._loop_lag_last.set({}, max(0.0, seconds))

    def render(self) -> bytes:
        """The Prometheus text exposition (runs the observable callbacks); empty after `shutdown()`."""
        return self._prometheus.render()

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return bool(self.provider.force_flush(timeout_millis))

    def shutdown(self) -> None:
        """Flush the OTLP reader (if any); later scrapes are empty. Blocking: call off-loop."""
        if not self._closed:
            self._closed = True
            self.provider.shutdown()
