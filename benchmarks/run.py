"""Scale benchmark: one rollout over N simulated GPU nodes, measured against the policy-ideal makespan.

    python -m benchmarks.run --nodes N [--packages P] [--compartments K] [--stage-seconds S]
                             [--smoke] [--kubeconfig K] [--out DIR] [--no-plot]

Starts a simulated control plane (or uses `--kubeconfig` / `$KUBECONFIG`), creates N nodes (~70
realistic GPU labels each) spread over K compartments (label `bench.nodewright.io/compartment`),
starts the operator as a separate process, applies a DeploymentPolicy and a NodeWright with P chained
packages (`NODEWRIGHT_SIM_DURATION`), and measures until every node is complete. What is measured and
how is in `docs/benchmarks.md`. Writes `<out>/<N>-nodes.json`, `<out>/<N>-nodes.png` and regenerates
`<out>/README.md` (a table over every JSON in `<out>` plus the machine description).

`--smoke`: 50 nodes, 2 packages, 2 compartments, 0.5 s stages, output under `.sim/bench-smoke/` (not
the committed results), no plot; what `make test` runs so the harness cannot rot.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from benchmarks import analysis, runtime_env
from nodewright.api import constants
from nodewright.sim.demo import (
    OPERATOR_PYTHON_FLAGS,
    REPO_ROOT,
    DemoError,
    FleetTracker,
    NodeGroup,
    OperatorProcess,
    create_groups,
    get_nodewright,
    install_crds,
    kubectl_apply,
    split_evenly,
)
from nodewright.sim.kubeapi import ApiError, KubeClient

RESULTS = Path(__file__).parent / "results"
NODEWRIGHT = "bench"
POLICY = "bench-policy"
COMPARTMENT_LABEL = "bench.nodewright.io/compartment"
FLEET_SELECTOR = "sim.nodewright.io/fleet=bench"
NAMESPACE = "nodewright-system"
STRATEGIES = ("exponential", "linear", "fixed")
DEFAULT_STAGE_SECONDS = 2.0


@dataclass
class Config:
    nodes: int
    packages: int
    compartments: int
    stage_seconds: float
    budget_percent: int
    smoke: bool
    out: Path
    plot: bool
    kubeconfig: Path | None
    timeout_minutes: float
    stall_minutes: float
    profile: bool = False
    drift_interval: float = 0.0  # seconds; 0: no drift phase
    drift_intervals: int = 2
    drift_checks: int = 4  # the operator's --drift-checks (fleet-wide concurrent checks)
    idle_seconds: float = 0.0  # after the run: a fresh operator on the complete fleet, measured idle
    chain_packages: bool = True  # the operator's --chain-packages (its default): the package chain in one pod


# ----------------------------------------------------------------------------------------------------
# Profiling


class Profiler:
    """`py-spy record` on the operator for the measured part of the run (`--profile`).

    py-spy samples the process from outside (ptrace), so the operator runs unmodified; `--nonblocking`
    keeps the sampling from pausing it. Collapsed stacks go to `path`; `summary` ranks functions by
    the share of samples in which they are on the stack (inclusive) and on top (self).
    """

    def __init__(self, pid: int, path: Path, *, rate: int = 25) -> None:
        exe = shutil.which("py-spy")
        if exe is None:
            raise DemoError("--profile needs py-spy on PATH (it is in the dev dependencies: make venv)")
        self.path = path
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking",
             "--format", "raw", "--output", str(path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def summary(self, top: int = 25) -> dict[str, Any]:
        if not self.path.exists():
            err = self.proc.stderr.read().decode(errors="replace")[-500:] if self.proc.stderr else ""
            return {"error": f"py-spy wrote no profile: {err}"}
        collapsed = self.path.read_text()
        return analysis.profile_summary(collapsed, top=top) | {
            "components": analysis.profile_components(collapsed)["percent"],
            "stacks": str(self.path),
        }


# ----------------------------------------------------------------------------------------------------
# Manifests


def policy_manifest(cfg: Config) -> dict[str, Any]:
    """K compartments cycling exponential (x2 from 1), linear (+2 from 2), fixed (ceiling-sized)."""
    comps = []
    for k in range(cfg.compartments):
        kind = STRATEGIES[k % len(STRATEGIES)]
        strategy: dict[str, Any]
        if kind == "exponential":
            strategy = {"exponential": {"initialBatch": 1, "growthFactor": 2}}
        elif kind == "linear":
            strategy = {"linear": {"initialBatch": 2, "delta": 2}}
        else:
            strategy = {
                "fixed": {"initialBatch": max(1, cfg.nodes // cfg.compartments * cfg.budget_percent // 100)}
            }
        comps.append(
            {
                "name": f"c{k}",
                "selector": {"matchLabels": {COMPARTMENT_LABEL: f"c{k}"}},
                "budget": {"percent": cfg.budget_percent},
                "strategy": strategy,
            }
        )
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND_POLICY,
        "metadata": {"name": POLICY},
        "spec": {
            "default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}},
            "compartments": comps,
            "resetBatchStateOnCompletion": True,
        },
    }


def package_name(index: int) -> str:
    """`pkg-a`, `pkg-b`, … `pkg-z`, `pkg-ba`, … (package names must end with a letter)."""
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        letters = chr(ord("a") + rest) + letters
    return f"pkg-{letters}"


def package_shapes(cfg: Config) -> list[analysis.PackageShape]:
    """P packages depending on each other in a line (pkg-a <- pkg-b <- ...), no interrupt: apply +
    config each, in one pod (with `--chain-packages`, all of them in one pod)."""
    return [
        analysis.PackageShape(
            name=package_name(i),
            stages=analysis.stages_for(interrupt=False),
            depends_on=(package_name(i - 1),) if i > 0 else (),
            pods=analysis.pods_for(interrupt=False),
        )
        for i in range(cfg.packages)
    ]


def go_duration(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def nodewright_manifest(cfg: Config) -> dict[str, Any]:
    packages: dict[str, Any] = {}
    for shape in package_shapes(cfg):
        pkg: dict[str, Any] = {
            "version": "1.0.0",
            "image": f"registry.local/bench/{shape.name}",
            "env": [{"name": "NODEWRIGHT_SIM_DURATION", "value": go_duration(cfg.stage_seconds)}],
            "configMap": {"settings.conf": f"package={shape.name}\n"},
        }
        if shape.depends_on:
            pkg["dependsOn"] = dict.fromkeys(shape.depends_on, "1.0.0")
        packages[shape.name] = pkg
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND_NODEWRIGHT,
        "metadata": {"name": NODEWRIGHT},
        "spec": {
            "nodeSelectors": {"matchLabels": {"sim.nodewright.io/fleet": "bench"}},
            "deploymentPolicy": POLICY,
            "packages": packages,
        },
    }


# ----------------------------------------------------------------------------------------------------
# Sampling


@dataclass
class ProcessSampler:
    """RSS and CPU seconds of the operator process, every `interval` seconds."""

    pid: int
    interval: float = 0.5
    peak_rss: int = 0
    cpu_start: float | None = None
    cpu_last: float = 0.0
    rss_series: list[tuple[float, int]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def sample(self) -> None:
        try:
            proc = psutil.Process(self.pid)
            with proc.oneshot():
                rss = int(proc.memory_info().rss)
                times = proc.cpu_times()
        except psutil.Error:
            return
        cpu = float(times.user + times.system)
        if self.cpu_start is None:
            self.cpu_start = cpu
        self.cpu_last = cpu
        self.peak_rss = max(self.peak_rss, rss)
        self.rss_series.append((time.monotonic() - self.started, rss))

    @property
    def cpu_seconds(self) -> float:
        return 0.0 if self.cpu_start is None else self.cpu_last - self.cpu_start

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval)


@dataclass
class ComponentCPU:
    """CPU seconds of the control plane's processes (kube-apiserver, etcd, kwok, ...) over the rollout.

    Only for a control plane the benchmark started (it knows the pids); with `--kubeconfig` it is empty.
    """

    pids: Mapping[str, int]
    start: dict[str, float] = field(default_factory=dict)

    def _read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, pid in self.pids.items():
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue
            out[name] = float(times.user + times.system)
        return out

    def begin(self) -> None:
        self.start = self._read()

    def seconds(self) -> dict[str, float]:
        end = self._read()
        return {name: round(end[name] - self.start[name], 2) for name in end if name in self.start}


async def server_requests(kubeconfig: Path) -> analysis.Samples | None:
    """kube-apiserver's own `apiserver_request_total` (every client), or None when /metrics is unreadable."""
    try:
        async with KubeClient(kubeconfig) as client:
            text = await client.get_text("/metrics", deadline_s=60)
    except Exception as exc:  # a missing measurement must not fail the run: it is reported as absent
        log(f"kube-apiserver /metrics not readable ({exc!r}): the simulator's writes are not reported")
        return None
    wanted = "\n".join(line for line in text.splitlines() if line.startswith("apiserver_request_total"))
    return analysis.parse_prometheus(wanted)


def _pod_succeeded(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") == "Succeeded":
        return True
    inits = status.get("initContainerStatuses") or []
    return bool(inits) and all(
        ((s.get("state") or {}).get("terminated") or {}).get("exitCode") == 0 for s in inits
    )


@dataclass(slots=True)
class PodRun:
    """When the probe saw one package pod created and succeeded (batch hand-over)."""

    created: float
    succeeded: float | None = None


@dataclass
class LatencyProbe:
    """Controller latency: from a package pod's success (seen on our pod watch) to the node's next
    action (a new package pod on the node, or a change of the node's state annotation)."""

    kubeconfig: Path
    nodewright: str
    pending: dict[str, float] = field(default_factory=dict)  # node -> time its pod was seen succeeded
    succeeded_pods: set[str] = field(default_factory=set)
    samples: list[float] = field(default_factory=list)
    pods_created: int = 0
    pod_runtimes: list[float] = field(default_factory=list)  # first seen -> seen succeeded
    node_pod_seconds: dict[str, float] = field(default_factory=dict)  # node -> sum of its pod runtimes
    node_pods: dict[str, list[PodRun]] = field(default_factory=dict)  # node -> its package pods
    pod_runs: dict[str, PodRun] = field(default_factory=dict)  # pod not yet seen succeeded -> its run

    def action(self, node: str, now: float) -> None:
        seen = self.pending.pop(node, None)
        if seen is not None:
            self.samples.append(now - seen)

    def on_pod(self, kind: str, pod: Mapping[str, Any], now: float) -> None:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(constants.POD_LABEL_NODEWRIGHT) != self.nodewright:
            return
        node = str((pod.get("spec") or {}).get("nodeName") or labels.get(constants.POD_LABEL_NODE) or "")
        name = str(meta.get("name"))
        if kind == "ADDED" and name not in self.succeeded_pods and not _pod_succeeded(pod):
            self.pods_created += 1
            self.action(node, now)
            self.pod_runs[name] = run = PodRun(now)
            self.node_pods.setdefault(node, []).append(run)
        elif kind in ("ADDED", "MODIFIED") and name not in self.succeeded_pods and _pod_succeeded(pod):
            self.succeeded_pods.add(name)
            self.pending.setdefault(node, now)
            if (finished := self.pod_runs.pop(name, None)) is not None:
                finished.succeeded = now
                self.pod_runtimes.append(now - finished.created)
                self.node_pod_seconds[node] = self.node_pod_seconds.get(node, 0.0) + now - finished.created

    async def run(self) -> None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        params = {"labelSelector": f"{constants.POD_OWNER_LABEL}={constants.POD_OWNER_VALUE}"}
        async with KubeClient(self.kubeconfig, timeout=120.0) as client:
            while True:
                try:
                    listed = await client.list_all(path, params=params)
                    now = time.monotonic()
                    for pod in listed["items"]:
                        self.on_pod("MODIFIED", pod, now)
                    rv = str(listed["resourceVersion"])
                    while True:
                        async for event in client.watch(path, resource_version=rv, params=params):
                            if event.get("type") == "ERROR":
                                raise _Relist
                            obj = event.get("object") or {}
                            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                            self.on_pod(str(event.get("type")), obj, time.monotonic())
                except _Relist:
                    continue
                except (ApiError, OSError, TimeoutError, ValueError):
                    await asyncio.sleep(1.0)


class _Relist(Exception):
    pass


# ----------------------------------------------------------------------------------------------------
# The run


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu_model": model or platform.processor(),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


async def predicted_batches(
    kubeconfig: Path, nw: dict[str, Any], policy: dict[str, Any]
) -> dict[str, list[list[str]]]:
    """The planner's batch sequence for this NodeWright over the cluster's nodes (`nodewright plan`)."""
    from nodewright.api.models import DeploymentPolicy, NodeWright
    from nodewright.cli import plan_cmd
    from nodewright.kube.client import KubeClient as LeanClient
    from nodewright.kube.config import load_config
    from nodewright.kube.resources import NODES

    async with LeanClient(load_config(kubeconfig)) as client:
        nodes = (await client.list(NODES)).items
    report = plan_cmd.build_report(
        NodeWright.model_validate(nw), policy=DeploymentPolicy.model_validate(policy), nodes=nodes
    )
    from nodewright.plan.preview import batch_sequences

    return batch_sequences(report.preview)


async def measure(
    cfg: Config, kubeconfig: Path, bin_dir: Path, log_dir: Path, component_pids: Mapping[str, int]
) -> dict[str, Any]:
    git_head = _git_head()  # the code the operator runs: read before it starts, not after the run
    policy, nw = policy_manifest(cfg), nodewright_manifest(cfg)
    shapes = package_shapes(cfg)
    created = time.monotonic()
    sizes = split_evenly(cfg.nodes, cfg.compartments)
    groups, start = [], 0
    for k, size in enumerate(sizes):
        groups.append(NodeGroup(start, size, {COMPARTMENT_LABEL: f"c{k}"}))
        start += size
    await create_groups(kubeconfig, groups, profile="mixed", name_prefix="bench")
    fleet_seconds = time.monotonic() - created
    log(f"created {cfg.nodes} nodes in {fleet_seconds:.1f}s over {cfg.compartments} compartments")
    install_crds(bin_dir, kubeconfig)
    kubectl_apply(bin_dir, kubeconfig, text=json.dumps(policy))

    sequences = await predicted_batches(kubeconfig, nw, policy)
    per_node = analysis.node_duration(shapes, stage_seconds=cfg.stage_seconds)
    names = [n for seq in sequences.values() for batch in seq for n in batch]
    ideal = _ideal(sequences, dict.fromkeys(names, per_node))
    log(
        "plan: "
        + "; ".join(
            f"{c}: {len(s)} batches {','.join(str(len(b)) for b in s[:10])}" for c, s in sequences.items()
        )
        + f"; ideal makespan {ideal:.1f}s"
    )

    operator = _operator(cfg, kubeconfig, log_dir / "operator.log")
    operator.start()
    log(f"operator pid {operator.pid}, log {operator.log_path}")
    profiler = Profiler(operator.pid, log_dir / "operator.pyspy.txt") if cfg.profile else None
    sampler = ProcessSampler(operator.pid)
    components = ComponentCPU(component_pids)
    tracker = FleetTracker(kubeconfig, NODEWRIGHT)
    probe = LatencyProbe(kubeconfig, NODEWRIGHT)
    monitor, monitor_note = await _start_monitor(kubeconfig)
    tasks = [
        asyncio.create_task(sampler.run()),
        asyncio.create_task(tracker.run(label_selector=FLEET_SELECTOR)),
        asyncio.create_task(probe.run()),
    ]
    _hook_state_changes(tracker, probe)
    result: dict[str, Any] = {}
    try:
        await asyncio.wait_for(tracker.synced.wait(), 120)
        before = analysis.parse_prometheus(operator.metrics_text() or "")
        server_before = await server_requests(kubeconfig)
        components.begin()
        kubectl_apply(bin_dir, kubeconfig, text=json.dumps(nw))
        applied = time.monotonic()
        tracker.started = applied
        tracker.last_change = applied
        max_status_bytes, final_obj, completed = await _wait_complete(
            cfg, kubeconfig, tracker, operator, tasks, applied
        )
        wall = time.monotonic() - applied
        sampler.sample()
        component_seconds = components.seconds()
        after = analysis.parse_prometheus(operator.metrics_text() or "")
        server_after = await server_requests(kubeconfig)
        drift = await _measure_drift(cfg, kubeconfig, operator, sampler) if completed else None
        idle = await _measure_idle(cfg, kubeconfig, operator, log_dir) if completed else None
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        verdict = await _stop_monitor(monitor, monitor_note)
        if profiler is not None:
            profiler.stop()
        operator.stop()

    diff = analysis.delta(after, before)
    table = analysis.requests_table(diff)
    writes = analysis.classify_writes(table)
    minimum = analysis.minimum_writes(shapes, chained=cfg.chain_packages)
    node_packages = cfg.nodes * cfg.packages
    lag = analysis.histogram_buckets(diff, "nodewright_event_loop_lag_seconds")
    ceilings = {
        name: int(c.get("ceiling", 0))
        for name, c in (((final_obj or {}).get("status") or {}).get("compartmentStatuses") or {}).items()
    }
    observed = tracker.batches(((final_obj or {}).get("status") or {}).get("rolloutFingerprint") or None)
    per_node_write = writes.node_and_pod / node_packages if node_packages else 0.0
    served = (
        analysis.server_writes(analysis.delta(server_after, server_before))
        if server_after is not None and server_before is not None
        else None
    )
    fingerprint = ((final_obj or {}).get("status") or {}).get("rolloutFingerprint")
    members = {
        name: (rec.compartment, rec.batch)
        for name, rec in tracker.nodes.items()
        if rec.compartment is not None and rec.batch is not None and rec.fingerprint == fingerprint
    }
    simulated = analysis.replay_makespan(members, probe.node_pod_seconds)
    result = {
        "run": {
            "at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "nodes": cfg.nodes,
            "packages": cfg.packages,
            "compartments": cfg.compartments,
            "stage_seconds": cfg.stage_seconds,
            "budget_percent": cfg.budget_percent,
            "chain_packages": cfg.chain_packages,
            "smoke": cfg.smoke,
            # The operator ran with `python -S` on these alone (benchmarks/runtime_env.py).
            "operator_distributions": len(runtime_distributions()),
            "git": git_head,
        },
        "completed": completed,
        "nodes_complete": tracker.status_counts().get("complete", 0),
        "machine": machine(),
        "fleet_create_seconds": round(fleet_seconds, 2),
        "wall_seconds": round(wall, 2),
        "ideal_makespan_seconds": round(ideal, 2),
        # A stopped run's ratios would compare part of a rollout with the whole: left out.
        "makespan_ratio": round(wall / ideal, 3) if ideal and completed else None,
        # The same batches replayed with the pod runtimes the simulator actually delivered: what a
        # zero-latency operator would have achieved on this simulator; wall / this is the operator's
        # own factor (controller latency and batch hand-over), makespan_ratio / this the simulator's.
        "simulator_makespan_seconds": round(simulated, 2),
        "operator_makespan_ratio": round(wall / simulated, 3) if simulated and completed else None,
        "per_node_ideal_seconds": per_node,
        "batches": {
            "predicted": {c: [len(b) for b in s] for c, s in sequences.items()},
            "observed": {c: list(b.values()) for c, b in observed.items()},
        },
        "operator": {
            "peak_rss_mib": round(sampler.peak_rss / 2**20, 1),
            "cpu_seconds": round(sampler.cpu_seconds, 2),
            "rss_per_node_kib": round(sampler.peak_rss / 1024 / max(1, cfg.nodes), 1),
        },
        "api": {
            "requests": table,
            "writes": {
                "node_and_pod": writes.node_and_pod,
                "nodewright_status": writes.nodewright_status,
                "events": writes.events,
                "other": writes.other,
            },
            "writes_per_node_package": round(per_node_write, 3) if completed else None,
            "minimum_per_node_package": round(minimum.per_node_package, 3),
            "minimum_breakdown_per_node": dict(minimum.breakdown),
            "writes_vs_minimum": round(per_node_write / minimum.per_node_package, 3) if completed else None,
            "server_writes": served,
            "simulator_writes": _simulator_writes(served, table, node_packages, completed=completed),
        },
        "control_plane": _control_plane(component_seconds, served, wall),
        "operator_work": _operator_work(diff, node_packages),
        "nodewright_status_bytes": {"final": _status_bytes(final_obj), "max": max_status_bytes},
        "event_loop_lag_seconds": {
            "p50": _round(analysis.histogram_quantile(0.5, lag)),
            "p99": _round(analysis.histogram_quantile(0.99, lag)),
            "observations": int(lag[-1][1]) if lag else 0,
        },
        "controller_latency_seconds": {
            "p50": _round(analysis.percentile(probe.samples, 50)),
            "p99": _round(analysis.percentile(probe.samples, 99)),
            "max": _round(max(probe.samples, default=None)),
            "samples": len(probe.samples),
        },
        # The simulated kubelet's share: a stage pod takes `stage_seconds` plus kwok's own latency.
        "batch_handover_seconds": _handover(tracker, probe, members),
        "pod_runtime_seconds": {
            "p50": _round(analysis.percentile(probe.pod_runtimes, 50)),
            "p99": _round(analysis.percentile(probe.pod_runtimes, 99)),
            "stage_seconds": cfg.stage_seconds,
            "samples": len(probe.pod_runtimes),
        },
        "in_progress": {
            "peak": analysis.in_progress_peaks(tracker.samples),
            "ceiling": ceilings,
            "series": [[round(t, 2), counts] for t, counts in tracker.samples],
        },
        "reboots": tracker.reboots(),
        "node_statuses": tracker.status_counts(),
        "invariants": verdict,
    }
    if drift is not None:
        result["drift"] = drift
    if idle is not None:
        result["operator"]["idle"] = idle
    if profiler is not None:
        result["profile"] = profile = profiler.summary()
        if "components" in profile:
            profile["ms_per_node_package"] = analysis.component_milliseconds(
                profile["components"], sampler.cpu_seconds, node_packages
            )
    return result


async def _measure_drift(
    cfg: Config, kubeconfig: Path, operator: OperatorProcess, sampler: ProcessSampler
) -> dict[str, Any] | None:
    """Drift checking on the complete fleet, nothing drifted: what it costs per node and interval.

    `driftDetection: {interval, action: report}` is patched onto the NodeWright and the operator's
    requests are counted over `drift_intervals` intervals (after a first interval of warm-up, which holds
    the burst of every node becoming due at once from a cold start).
    """
    if cfg.drift_interval <= 0:
        return None
    interval = cfg.drift_interval
    async with KubeClient(kubeconfig) as client:
        await client.merge_patch(
            f"/apis/nodewright.io/v1alpha1/nodewrights/{NODEWRIGHT}",
            {"spec": {"driftDetection": {"interval": f"{interval:g}s", "action": "report"}}},
        )
    log(
        f"drift detection on: interval {interval:g}s; warm-up {interval:g}s,"
        f" then {cfg.drift_intervals} intervals measured"
    )
    await asyncio.sleep(interval)
    cpu_before = sampler.cpu_seconds
    before = analysis.parse_prometheus(operator.metrics_text() or "")
    started = time.monotonic()
    await asyncio.sleep(interval * cfg.drift_intervals)
    seconds = time.monotonic() - started
    sampler.sample()
    after = analysis.parse_prometheus(operator.metrics_text() or "")
    diff = analysis.delta(after, before)
    writes = analysis.classify_writes(analysis.requests_table(diff))
    checks = sum(analysis.sum_by(diff, "nodewright_drift_checks_total", ()).values())
    drifted = sum(analysis.sum_by(after, "nodewright_drifted_nodes", ()).values())
    intervals = seconds / interval
    node_intervals = cfg.nodes * intervals
    return {
        "interval_seconds": interval,
        "measured_seconds": round(seconds, 1),
        "concurrent_checks_cap": cfg.drift_checks,
        "checks": int(checks),
        "checks_per_node_per_interval": round(checks / node_intervals, 3) if node_intervals else None,
        "writes_node_and_pod": writes.node_and_pod,
        "writes_per_node_per_interval": round(writes.node_and_pod / node_intervals, 3)
        if node_intervals
        else None,
        "writes_per_check": round(writes.node_and_pod / checks, 3) if checks else None,
        "drifted_nodes": int(drifted),
        "operator_cpu_seconds": round(sampler.cpu_seconds - cpu_before, 2),
    }


RUNTIME_ENV = REPO_ROOT / ".sim" / "runtime-env"
RUNTIME_PYCACHE = REPO_ROOT / ".sim" / "runtime-pycache"


@functools.cache
def runtime_distributions() -> tuple[str, ...]:
    """Links to the runtime dependencies alone, built once per benchmark process, and their bytecode
    and the operator's compiled as the image ships them (see runtime_env)."""
    listed = tuple(runtime_env.build(RUNTIME_ENV))
    runtime_env.compile_bytecode((RUNTIME_ENV, REPO_ROOT / "nodewright"), RUNTIME_PYCACHE)
    return listed


def _handover(
    tracker: FleetTracker, probe: LatencyProbe, members: Mapping[str, tuple[str, int]]
) -> dict[str, Any]:
    """Per compartment, where a batch's time went (analysis.HANDOVER_STEPS), on the monotonic clock;
    `members`: node -> (compartment, batch) of the final fingerprint."""
    timeline = analysis.batch_timeline(
        {key: tracker.started + at for key, at in tracker.batch_starts.items()},
        members,
        {name: rec.completed_at for name, rec in tracker.nodes.items() if rec.completed_at is not None},
        {node: [(run.created, run.succeeded) for run in runs] for node, runs in probe.node_pods.items()},
    )
    return analysis.handover_summary(timeline)


def json_kubeconfig(kubeconfig: Path) -> Path:
    """The kubeconfig as JSON, beside it (relative paths in it resolve the same): the operator reads
    JSON without PyYAML (`kube.config`), so its memory is that of an operator in a cluster, which reads
    its service account and no kubeconfig, instead of 1.4 MiB more."""
    import yaml

    target = kubeconfig.with_name(kubeconfig.name + ".json")
    target.touch(mode=0o600)  # it holds the client key: never readable by others, not even briefly
    target.write_text(json.dumps(yaml.safe_load(kubeconfig.read_text())))
    return target


def _operator(cfg: Config, kubeconfig: Path, log_path: Path) -> OperatorProcess:
    runtime_distributions()  # the links must exist before the operator starts
    return OperatorProcess(
        kubeconfig=json_kubeconfig(kubeconfig),
        log_path=log_path,
        namespace=NAMESPACE,
        # What the image ships and nothing else: the venv's test tools would add ~4 MiB of imports.
        interpreter=(sys.executable, "-S", *OPERATOR_PYTHON_FLAGS),
        python_path=(RUNTIME_ENV,),
        env={"PYTHONPYCACHEPREFIX": str(RUNTIME_PYCACHE)},
        extra_args=[
            "--agent-image=registry.local/nodewright/agent:sim",
            "--pause-image=registry.local/pause:sim",
            f"--drift-checks={cfg.drift_checks}",
            f"--chain-packages={str(cfg.chain_packages).lower()}",
        ],
    )


async def _measure_idle(
    cfg: Config, kubeconfig: Path, operator: OperatorProcess, log_dir: Path
) -> dict[str, Any] | None:
    """The resident memory of an operator that starts on the complete fleet and has nothing to do.

    The rollout's operator is stopped and a fresh one started: what it holds once its caches are
    synced (every node, its NodeWright state and the kept pods) is what a cluster pays between
    rollouts; the rollout's own peak is `peak_rss_mib`. The median of the last 10 one-second samples
    is reported, with USS (memory no other process shares: the shared libraries left out).
    """
    if cfg.idle_seconds <= 0:
        return None
    operator.stop()
    fresh = _operator(cfg, kubeconfig, log_dir / "operator-idle.log")
    await asyncio.to_thread(fresh.start)
    log(f"idle phase: fresh operator pid {fresh.pid}, measured for {cfg.idle_seconds:g}s")
    rss: list[float] = []
    uss: list[float] = []
    try:
        proc = psutil.Process(fresh.pid)
        deadline = time.monotonic() + cfg.idle_seconds
        while time.monotonic() < deadline:
            info = proc.memory_full_info()
            rss.append(info.rss / 2**20)
            uss.append(info.uss / 2**20)
            await asyncio.sleep(1.0)
        cpu = sum(proc.cpu_times()[:2])
    finally:
        fresh.stop()
    return {
        "seconds": cfg.idle_seconds,
        "rss_mib": round(statistics.median(rss[-10:]), 1),
        "uss_mib": round(statistics.median(uss[-10:]), 1),
        "peak_rss_mib": round(max(rss), 1),
        "cpu_seconds": round(cpu, 2),
    }


def _ideal(sequences: Mapping[str, Sequence[Sequence[str]]], durations: Mapping[str, float]) -> float:
    from nodewright.plan.preview import ideal_makespan

    return ideal_makespan(sequences, durations)


def _hook_state_changes(tracker: FleetTracker, probe: LatencyProbe) -> None:
    """Tell the latency probe when a node's state annotation changes (the node's 'next action')."""
    key = constants.state_annotation(NODEWRIGHT)
    last: dict[str, str | None] = {}

    def on_node(node: dict[str, Any], now: float) -> None:
        meta = node.get("metadata") or {}
        name = str(meta.get("name"))
        text = (meta.get("annotations") or {}).get(key)
        if name in last and last[name] != text:
            probe.action(name, now)
        last[name] = text

    tracker.on_node = on_node


async def _wait_complete(
    cfg: Config,
    kubeconfig: Path,
    tracker: FleetTracker,
    operator: OperatorProcess,
    tasks: Sequence[asyncio.Task[None]],
    applied: float,
) -> tuple[int, dict[str, Any] | None, bool]:
    """Poll until the rollout completes: (max status bytes, last NodeWright, completed?)."""
    max_bytes = 0
    obj: dict[str, Any] | None = None
    last_report = 0.0
    async with KubeClient(kubeconfig) as client:
        while True:
            for task in tasks:
                if task.done() and task.exception() is not None:
                    raise DemoError(f"a measuring task failed: {task.exception()!r}")
            with contextlib.suppress(ApiError, OSError, TimeoutError):
                obj = await get_nodewright(client, NODEWRIGHT)
            max_bytes = max(max_bytes, _status_bytes(obj))
            now = time.monotonic()
            counts = tracker.status_counts()
            done = counts.get("complete", 0)
            if now - last_report >= 10:
                log(
                    f"{now - applied:6.0f}s  nodes {dict(sorted(counts.items()))}"
                    f"  in progress {tracker.in_progress_by_compartment()}"
                )
                last_report = now
            if done == len(tracker.nodes) and ((obj or {}).get("status") or {}).get("status") == "complete":
                return max_bytes, obj, True
            if not operator.alive():
                raise DemoError(operator.death_message())
            if now - tracker.last_change > cfg.stall_minutes * 60:
                raise DemoError(f"no node changed for {cfg.stall_minutes:g} min: {counts}\n{operator.tail()}")
            if now - applied > cfg.timeout_minutes * 60:
                # Where the machine stops is a result too: report the run as incomplete, with how far
                # it got, instead of throwing the measurements away.
                log(f"not complete after {cfg.timeout_minutes:g} min: {counts}; reporting a partial run")
                return max_bytes, obj, False
            await asyncio.sleep(1.0)


def _status_bytes(obj: Mapping[str, Any] | None) -> int:
    status = (obj or {}).get("status")
    return len(json.dumps(status, separators=(",", ":")).encode()) if status else 0


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


async def _start_monitor(kubeconfig: Path) -> tuple[Any, str]:
    try:
        from e2e.invariants import InvariantMonitor
    except ImportError as exc:
        return None, f"skipped: e2e/invariants.py not importable ({exc})"
    monitor = InvariantMonitor(kubeconfig, namespace=NAMESPACE)
    try:
        await monitor.start()
    except Exception as exc:  # the verdict must say the monitor could not run, not crash the run
        return None, f"skipped: the monitor failed to start ({exc!r})"
    return monitor, ""


async def _stop_monitor(monitor: Any, note: str) -> dict[str, Any]:
    if monitor is None:
        return {"verdict": "skipped", "note": note}
    try:
        breaches = await monitor.final_check()
    finally:
        with contextlib.suppress(Exception):
            await monitor.stop()
    failures = list(getattr(monitor, "failures", []))
    verdict = "pass" if not breaches and not failures else "breach" if breaches else "monitor-failed"
    return {
        "verdict": verdict,
        "breaches": [str(b) for b in breaches[:20]],
        "breach_count": len(breaches),
        "monitor_failures": failures[:10],
    }


def _operator_work(diff: analysis.Samples, node_packages: int) -> dict[str, Any]:
    """Reconciles per controller and watch events per resource during the run (issue 33: the work a
    node-package costs besides its writes)."""
    reconciles = {
        key[0]: int(n)
        for key, n in analysis.sum_by(diff, "controller_runtime_reconcile_total", ["controller"]).items()
    }
    events = {
        key[0]: int(n)
        for key, n in analysis.sum_by(diff, "nodewright_watch_events_total", ["resource"]).items()
    }
    adds = {key[0]: int(n) for key, n in analysis.sum_by(diff, "workqueue_adds_total", ["name"]).items()}
    return {
        "reconciles": reconciles,
        "node_reconciles_per_node_package": (
            round(reconciles.get("node", 0) / node_packages, 2) if node_packages else None
        ),
        "watch_events": events,
        "workqueue_adds": adds,
    }


def _simulator_writes(
    served: Mapping[str, Mapping[str, int]] | None,
    operator_table: Mapping[str, Mapping[str, int]],
    node_packages: int,
    *,
    completed: bool,
) -> dict[str, Any] | None:
    """The writes of every client but the operator while the rollout ran: kwok playing pods and nodes,
    the rebooter, kube-controller-manager (and the benchmark's one apply of the NodeWright)."""
    if served is None:
        return None
    by_resource = analysis.other_clients_writes(served, operator_table)
    total = sum(by_resource.values())
    return {
        "by_resource": by_resource,
        "total": total,
        "per_node_package": round(total / node_packages, 3) if completed and node_packages else None,
    }


def _control_plane(
    cpu_seconds: Mapping[str, float], served: Mapping[str, Mapping[str, int]] | None, wall: float
) -> dict[str, Any]:
    """Where the machine's CPU went, and what one write cost the API server.

    `apiserver_cpu_ms_per_write` charges all of kube-apiserver's CPU (watch fan-out, reads, admission,
    encoding) to the writes, which cause nearly all of it here; `apiserver_cores` is its average use of
    a core over the run (1.0: one core busy all the time).
    """
    total = analysis.total_writes(served) if served is not None else None
    apiserver = cpu_seconds.get("kube-apiserver")
    return {
        "cpu_seconds": dict(cpu_seconds),
        "apiserver_cores": round(apiserver / wall, 3) if apiserver is not None and wall > 0 else None,
        "server_writes_total": total,
        "server_writes_per_second": round(total / wall, 1) if total is not None and wall > 0 else None,
        "apiserver_cpu_ms_per_write": (
            round(apiserver * 1000 / total, 2) if apiserver is not None and total else None
        ),
    }


def _git_head() -> str:
    with contextlib.suppress(OSError):
        head = (REPO_ROOT / ".git" / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            ref = REPO_ROOT / ".git" / head[5:]
            return ref.read_text().strip()[:12] if ref.exists() else head[5:]
        return head[:12]
    return ""


def log(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------
# Output


def write_outputs(result: Mapping[str, Any], out: Path, *, plot: bool) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    run = result["run"]
    stem = f"{run['nodes']}-nodes"
    if float(run["stage_seconds"]) != DEFAULT_STAGE_SECONDS:
        stem += f"-{run['stage_seconds']:g}s-stages"
    if result.get("drift"):
        stem += f"-drift-{result['drift']['interval_seconds']:g}s"
    if run.get("chain_packages"):
        stem += "-chained"
    path = out / f"{stem}.json"
    result = _keep_stacks(result, out / f"{stem}.pyspy.txt")
    path.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    if plot:
        plot_in_progress(result, out / f"{stem}.png")
    (out / "README.md").write_text(render_readme(_load_results(out)), encoding="utf-8")
    return path


def _keep_stacks(result: Mapping[str, Any], target: Path) -> Mapping[str, Any]:
    """py-spy's stacks beside the JSON: the benchmark's own control plane directory, where py-spy
    wrote them, is deleted when the run ends."""
    profile = result.get("profile")
    if not isinstance(profile, Mapping) or "stacks" not in profile:
        return result
    stacks = Path(profile["stacks"])
    if not stacks.exists():
        return result
    shutil.copyfile(stacks, target)
    return {**result, "profile": {**profile, "stacks": target.name}}


def _load_results(out: Path) -> list[dict[str, Any]]:
    runs = []
    for path in sorted(out.glob("*-nodes*.json")):
        with contextlib.suppress(ValueError, OSError):
            runs.append(json.loads(path.read_text(encoding="utf-8")))
    return sorted(runs, key=lambda r: (int(r["run"]["nodes"]), float(r["run"]["stage_seconds"])))


def render_readme(runs: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "# Scale benchmark results",
        "",
        "Generated by `python -m benchmarks.run` (`make bench`); see `docs/benchmarks.md` for what is",
        "measured and how. One row per run (`<N>-nodes.json`, plot `<N>-nodes.png`).",
        "",
        "| nodes | pkgs | comps | stage s (pod p50) | wall s | ideal s | ratio | sim-replay s (ratio)"
        " | RSS MiB (idle) | CPU s | writes/node-pkg (min) | sim writes/node-pkg"
        " | API server cores (ms/write) | status KiB | loop lag p50/p99 ms | ctrl latency p50/p99 s"
        " | invariants |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        api, lag, lat = r["api"], r["event_loop_lag_seconds"], r["controller_latency_seconds"]
        pod = (r.get("pod_runtime_seconds") or {}).get("p50")
        idle = (r["operator"].get("idle") or {}).get("rss_mib")
        done = r.get("completed", True)
        replay = r.get("simulator_makespan_seconds") if done else None
        sim_writes = (api.get("simulator_writes") or {}).get("per_node_package")
        plane = r.get("control_plane") or {}
        chained = " (chained)" if r["run"].get("chain_packages") else ""
        lines.append(
            f"| {r['run']['nodes']} | {r['run']['packages']}{chained} | {r['run']['compartments']}"
            f" | {r['run']['stage_seconds']:g} ({'-' if pod is None else round(pod, 2)})"
            f" | {r['wall_seconds']}{_incomplete(r)}"
            f" | {r['ideal_makespan_seconds']} | {_or_dash(r['makespan_ratio'])}"
            f" | {_or_dash(replay)} ({_or_dash(r.get('operator_makespan_ratio'))})"
            f" | {r['operator']['peak_rss_mib']} ({_or_dash(idle)})"
            f" | {r['operator']['cpu_seconds']} | {_or_dash(api['writes_per_node_package'])}"
            f" ({api['minimum_per_node_package']})"
            f" | {_or_dash(sim_writes)}"
            f" | {_or_dash(plane.get('apiserver_cores'))}"
            f" ({_or_dash(plane.get('apiserver_cpu_ms_per_write'))})"
            f" | {round(r['nodewright_status_bytes']['max'] / 1024, 1)}"
            f" | {_ms(lag['p50'])}/{_ms(lag['p99'])} | {lat['p50']}/{lat['p99']}"
            f" | {r['invariants']['verdict']} |"
        )
    drifts = [r for r in runs if r.get("drift")]
    if drifts:
        lines += [
            "",
            "Drift checking after the rollout, nothing drifted (`--drift-interval`): the operator's node and",
            "pod writes over the measured intervals, per node and interval and per check.",
            "",
            "| nodes | interval s | cap | checks | checks/node/interval | writes/node/interval | writes/check"
            " | operator CPU s |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in drifts:
            d = r["drift"]
            lines.append(
                f"| {r['run']['nodes']} | {d['interval_seconds']:g} | {d['concurrent_checks_cap']}"
                f" | {d['checks']} | {_or_dash(d['checks_per_node_per_interval'])}"
                f" | {_or_dash(d['writes_per_node_per_interval'])} | {_or_dash(d['writes_per_check'])}"
                f" | {d['operator_cpu_seconds']} |"
            )
    machines = {json.dumps(r["machine"], sort_keys=True) for r in runs}
    lines += ["", "Machine(s):", ""]
    for m in sorted(machines):
        d = json.loads(m)
        lines.append(
            f"- {d['cpu_model']}, {d['nproc']} CPUs, {d['memory_gib']} GiB RAM, Python {d['python']},"
            f" kernel {d.get('kernel', '?')}"
        )
    lines.append("")
    return "\n".join(lines)


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _incomplete(run: Mapping[str, Any]) -> str:
    if run.get("completed", True):
        return ""
    return f" (stopped: {run.get('nodes_complete')}/{run['run']['nodes']} complete)"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def plot_in_progress(result: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = result["in_progress"]["series"]
    ceilings = result["in_progress"]["ceiling"]
    names = sorted({c for _, counts in series for c in counts})
    fig, ax = plt.subplots(figsize=(10, 5))
    for i, name in enumerate(names):
        color = f"C{i}"
        xs = [t for t, _ in series]
        ys = [counts.get(name, 0) for _, counts in series]
        ax.step(xs, ys, where="post", color=color, label=f"{name} in progress")
        if name in ceilings:
            ax.axhline(ceilings[name], color=color, linestyle="--", linewidth=1, label=f"{name} ceiling")
    run = result["run"]
    ax.set_title(
        f"{run['nodes']} nodes x {run['packages']} packages: wall {result['wall_seconds']}s,"
        f" ideal {result['ideal_makespan_seconds']}s"
    )
    ax.set_xlabel("seconds since the NodeWright was applied")
    ax.set_ylabel("nodes in progress")
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------
# Entry point


def parse_args(argv: Sequence[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--packages", type=int, default=3)
    parser.add_argument("--compartments", type=int, default=3)
    parser.add_argument(
        "--stage-seconds",
        type=float,
        default=DEFAULT_STAGE_SECONDS,
        help="simulated duration of every stage (results of other values get their own file)",
    )
    parser.add_argument("--budget-percent", type=int, default=10, help="ceiling of every compartment")
    parser.add_argument("--smoke", action="store_true", help="50 nodes, tiny durations, no plot")
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="use this cluster (default: $KUBECONFIG, else start one)",
    )
    parser.add_argument("--out", type=Path, default=None, help=f"results directory (default {RESULTS})")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--timeout", type=float, default=60.0, help="minutes")
    parser.add_argument("--stall-minutes", type=float, default=5.0)
    parser.add_argument(
        "--profile", action="store_true", help="sample the operator with py-spy; top functions in the JSON"
    )
    parser.add_argument(
        "--drift-interval",
        type=float,
        default=0.0,
        help="after the rollout, turn drift detection on with this interval (seconds) and measure its cost",
    )
    parser.add_argument("--drift-intervals", type=int, default=2, help="intervals measured (default 2)")
    parser.add_argument("--drift-checks", type=int, default=4, help="the operator's --drift-checks cap")
    parser.add_argument(
        "--chain-packages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the operator's --chain-packages, its default (the package chain of each node in one pod);"
        " --no-chain-packages measures a pod per package",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=60.0,
        help="after the run, measure a fresh operator on the complete fleet for this long (0: skip)",
    )
    args = parser.parse_args(argv)
    kubeconfig = args.kubeconfig or (Path(os.environ["KUBECONFIG"]) if os.environ.get("KUBECONFIG") else None)
    if args.smoke:
        return Config(
            nodes=50 if args.nodes == 1000 else args.nodes,
            packages=2,
            compartments=2,
            stage_seconds=0.5,
            budget_percent=20,
            smoke=True,
            out=args.out or REPO_ROOT / ".sim" / "bench-smoke",
            plot=False,
            kubeconfig=kubeconfig,
            timeout_minutes=min(args.timeout, 5.0),
            stall_minutes=min(args.stall_minutes, 2.0),
            idle_seconds=min(args.idle_seconds, 10.0),
            chain_packages=args.chain_packages,
        )
    return Config(
        nodes=args.nodes,
        packages=args.packages,
        compartments=args.compartments,
        stage_seconds=args.stage_seconds,
        budget_percent=args.budget_percent,
        smoke=False,
        out=args.out or RESULTS,
        plot=not args.no_plot,
        kubeconfig=kubeconfig,
        timeout_minutes=args.timeout,
        stall_minutes=args.stall_minutes,
        profile=args.profile,
        drift_interval=args.drift_interval,
        drift_intervals=args.drift_intervals,
        drift_checks=args.drift_checks,
        idle_seconds=args.idle_seconds,
        chain_packages=args.chain_packages,
    )


def main(argv: Sequence[str] | None = None) -> int:
    from nodewright.sim import binaries
    from nodewright.sim.controlplane import ControlPlane, ControlPlaneError

    cfg = parse_args(argv)

    def terminated(signum: int, frame: Any) -> None:
        # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the operator and the control plane
        # started below are stopped by the `finally` blocks instead of outliving the benchmark.
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminated)
    if cfg.nodes < 1 or cfg.packages < 1 or cfg.compartments < 1:
        print("--nodes, --packages and --compartments must be >= 1", file=sys.stderr)
        return 2
    plane = None
    try:
        bin_dir = binaries.locate().dir
        if cfg.kubeconfig is None:
            directory = (
                REPO_ROOT / ".sim" / ("bench-smoke" if cfg.smoke else f"bench-{cfg.nodes}") / "cluster"
            )
            with contextlib.suppress(ControlPlaneError):
                ControlPlane.load(directory).down()
            plane = ControlPlane.create(directory)
            log(f"control plane up in {plane.up():.1f}s in {plane.dir}")
            kubeconfig, log_dir = plane.kubeconfig, plane.dir / "logs"
            pids = {name: int(c["pid"]) for name, c in plane.status().items() if c["running"] and c["pid"]}
        else:
            kubeconfig, log_dir, pids = cfg.kubeconfig, cfg.out / "logs", {}
        result = asyncio.run(measure(cfg, kubeconfig, bin_dir, log_dir, pids))
        # Before the control plane goes down: its directory, deleted then, holds py-spy's stacks.
        path = write_outputs(result, cfg.out, plot=cfg.plot)
    except (binaries.BinariesMissingError, ControlPlaneError, DemoError) as exc:
        print(f"benchmark FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if plane is not None:
            plane.down()
    summary = {
        k: result[k]
        for k in (
            "wall_seconds",
            "ideal_makespan_seconds",
            "makespan_ratio",
            "simulator_makespan_seconds",
            "operator_makespan_ratio",
            "operator",
            "nodewright_status_bytes",
        )
    }
    summary["writes_per_node_package"] = result["api"]["writes_per_node_package"]
    summary["minimum_per_node_package"] = result["api"]["minimum_per_node_package"]
    summary["event_loop_lag_seconds"] = result["event_loop_lag_seconds"]
    summary["controller_latency_seconds"] = result["controller_latency_seconds"]
    summary["pod_runtime_seconds"] = result["pod_runtime_seconds"]
    summary["invariants"] = result["invariants"]["verdict"]
    print(json.dumps(summary, indent=2))
    log(f"wrote {path}")
    ok = result["invariants"]["verdict"] in ("pass", "skipped") and result["completed"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
