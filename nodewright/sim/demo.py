"""Running the real operator against the simulator: the pieces `nodewright demo` and the benchmark share.

- `OperatorProcess`: `python -m nodewright operator ...` as a child process in its own process group, on
  free loopback ports for probes and metrics, its output in a log file; `stop()` signals exactly that
  group (SIGTERM, SIGKILL after a grace period); `metrics_text()` scrapes `/metrics`.
- `kubectl_apply`, `install_crds`: server-side apply with the built kubectl.
- `NodeGroup` / `create_groups`: a fleet made of ranges of node indices with extra labels (compartments).
- `FleetTracker`: one list + watch of the nodes (no polling), keeping per node the status label of one
  NodeWright, its admission (compartment, batch), Ready and bootID (reboots), and a time series of
  nodes in progress per compartment. A watch costs the API server far less than listing thousands of
  nodes every few seconds, so measuring does not distort what is measured.

Progress for humans comes from the NodeWright's own `status.compartmentStatuses` (what the operator
reports) and from the tracker (what the nodes say); the summary compares the two with the plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp

from nodewright.api import constants
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlaneError, free_port, log_tail, wait_crds_established
from nodewright.sim.kubeapi import ApiError, KubeClient

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = REPO_ROOT / "manifests" / "crds"
SAMPLES_DIR = REPO_ROOT / "manifests" / "samples"
ADMISSION_PREFIX = f"{constants.PREFIX}batch."
JSON = dict[str, Any]


class DemoError(RuntimeError):
    """Something the run cannot continue from; the message says what and where to look."""


# ----------------------------------------------------------------------------------------------------
# The operator as a child process


# The images run the operator without docstrings and traceback column ranges (docs/install.md "Images"):
# 2.8 MiB of an idle operator's resident memory, and nothing in it reads them. The simulated fleet runs
# it the same.
OPERATOR_PYTHON_FLAGS: Final = ("-OO", "-X", "no_debug_ranges")


@dataclass
class OperatorProcess:
    """The operator, started as `python -m nodewright operator` with its log in `log_path`."""

    kubeconfig: Path
    log_path: Path
    namespace: str = "nodewright-system"
    extra_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    interpreter: Sequence[str] = (sys.executable, *OPERATOR_PYTHON_FLAGS)
    """How Python is started (the benchmark adds `-S` to leave out the venv's site-packages)."""
    python_path: Sequence[Path] = ()
    """Directories before the repository on `PYTHONPATH`."""
    health_port: int = 0
    metrics_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise DemoError("operator not started")
        return self.proc.pid

    def argv(self) -> list[str]:
        return [
            *self.interpreter, "-m", "nodewright", "operator",
            f"--kubeconfig={self.kubeconfig}", f"--namespace={self.namespace}", "--no-leader-elect",
            f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
            f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
            # The production default (--qps 50) is conservative for shared API servers; the simulated
            # control plane is ours alone, so demo and benchmark runs allow more writes per second.
            "--qps=200", "--burst=400",
            "--log-format=json", *self.extra_args,
        ]  # fmt: skip

    def start(self, *, ready_within: float = 120.0) -> None:
        self.health_port = self.health_port or free_port()
        self.metrics_port = self.metrics_port or free_port()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [*map(str, self.python_path), str(REPO_ROOT), env.get("PYTHONPATH")])
        )
        env.update(self.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + ready_within
        while time.monotonic() < deadline:
            if not self.alive():
                raise DemoError(self.death_message("exited while starting"))
            if self._get(self.health_port, "/readyz") is not None:
                return
            time.sleep(0.3)
        raise DemoError(f"operator not ready after {ready_within:.0f}s\n{self.tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        return f"--- last lines of {self.log_path}:\n{log_tail(self.log_path, lines)}"

    def death_message(self, what: str = "died") -> str:
        code = None if self.proc is None else self.proc.poll()
        return f"the operator {what} (exit code {code})\n{self.tail()}"

    def _get(self, port: int, path: str, timeout: float = 5.0) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
                return str(resp.read().decode()) if resp.status == 200 else None
        except (OSError, urllib.error.URLError):
            return None

    def metrics_text(self) -> str | None:
        """The Prometheus exposition of the operator, None if it does not answer."""
        return self._get(self.metrics_port, "/metrics", timeout=20.0)

    def stop(self, *, grace: float = 20.0) -> int | None:
        """SIGTERM to the operator's process group, SIGKILL after `grace`; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode


# ----------------------------------------------------------------------------------------------------
# kubectl


def kubectl_apply(
    bin_dir: Path, kubeconfig: Path, *, paths: Sequence[Path] = (), text: str | None = None
) -> str:
    """`kubectl apply --server-side` of files/directories or of `text`; returns kubectl's output."""
    args = [
        str(bin_dir / "kubectl"),
        f"--kubeconfig={kubeconfig}",
        "apply",
        "--server-side",
        "--force-conflicts",
    ]
    for path in paths:
        args += ["-f", str(path)]
    if text is not None:
        args += ["-f", "-"]
    done = subprocess.run(args, input=text, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise DemoError(f"kubectl apply failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def install_crds(bin_dir: Path, kubeconfig: Path, *, within: float = 60.0) -> None:
    """Apply the CRDs and wait until every one of them is Established."""
    kubectl_apply(bin_dir, kubeconfig, paths=[CRD_DIR])
    kubectl = [str(bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}"]
    try:
        wait_crds_established(kubectl, ["-f", str(CRD_DIR)], within=within)
    except ControlPlaneError as exc:
        raise DemoError(str(exc)) from exc


# ----------------------------------------------------------------------------------------------------
# Fleet


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """Nodes `<prefix>-<index>` for index in [start, start + count), with extra labels."""

    start: int
    count: int
    labels: Mapping[str, str]
    real_packages: int = 0  # the first N of the group run their package pods for real (simulated kubelet)


async def create_groups(
    kubeconfig: Path, groups: Sequence[NodeGroup], *, profile: str = "mixed", name_prefix: str = "gpu-node"
) -> list[str]:
    names: list[str] = []
    for group in groups:
        if group.count > 0:
            names += await fleet.create_nodes(
                kubeconfig,
                count=group.count,
                start_index=group.start,
                profile=profile,
                name_prefix=name_prefix,
                labels_extra=group.labels,
                real_packages=min(group.real_packages, group.count),
            )
    return names


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` split into `parts` sizes differing by at most one (the larger ones first)."""
    if parts <= 0:
        return []
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


# ----------------------------------------------------------------------------------------------------
# Watching the fleet


PROTECTED_WAIT = re.compile(r"waiting for protected pods: ([^;]+)")


@dataclass
class ProtectedWait:
    """A node held at its gate by protected pods (the operator's condition says which), and how long."""

    pods: tuple[str, ...]
    since: float
    until: float | None = None


@dataclass
class NodeRecord:
    status: str | None = None
    compartment: str | None = None
    batch: int | None = None
    fingerprint: str | None = None
    boot_id: str = ""
    reboots: int = 0
    ready: bool = True
    unschedulable: bool = False
    in_progress_since: float | None = None
    completed_at: float | None = None
    protected: ProtectedWait | None = None


def _admission(annotations: Mapping[str, str], nodewright: str) -> tuple[str | None, int | None, str | None]:
    text = annotations.get(ADMISSION_PREFIX + nodewright)
    if not text:
        return None, None, None
    try:
        doc = json.loads(text)
        return str(doc["c"]), int(doc["b"]), str(doc.get("f", ""))
    except (ValueError, KeyError, TypeError):
        return None, None, None


@dataclass
class FleetTracker:
    """Per-node view of one NodeWright's rollout, kept current by a node watch (see module docstring)."""

    kubeconfig: Path
    nodewright: str
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    max_in_progress: dict[str, int] = field(default_factory=dict)
    last_change: float = field(default_factory=time.monotonic)
    started: float = field(default_factory=time.monotonic)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    errors: int = 0
    batch_starts: dict[tuple[str, int], float] = field(default_factory=dict)
    """(compartment, batch) -> seconds since start when its first admission was seen."""
    on_node: Callable[[JSON, float], None] | None = None
    """Called with every node object seen (list and watch), before the tracker's own update."""

    def _update(self, node: JSON, now: float) -> None:
        if self.on_node is not None:
            self.on_node(node, now)
        meta = node.get("metadata") or {}
        name = str(meta.get("name"))
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        status = node.get("status") or {}
        rec = self.nodes.get(name)
        first = rec is None
        rec = rec or NodeRecord()
        new_status = labels.get(constants.status_label(self.nodewright))
        compartment, batch, fingerprint = _admission(annotations, self.nodewright)
        boot_id = str((status.get("nodeInfo") or {}).get("bootID") or "")
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        if not first and boot_id and rec.boot_id and boot_id != rec.boot_id:
            rec.reboots += 1
        changed = (new_status, compartment, batch, fingerprint, ready) != (
            rec.status,
            rec.compartment,
            rec.batch,
            rec.fingerprint,
            rec.ready,
        )
        if compartment is not None and batch is not None:
            self.batch_starts.setdefault((compartment, batch), now - self.started)
        self._protected(rec, status, now)
        if new_status == "in_progress" and rec.status != "in_progress":
            rec.in_progress_since = now
        if new_status == "complete" and rec.status != "complete":
            rec.completed_at = now
        rec.status, rec.compartment, rec.batch, rec.fingerprint = new_status, compartment, batch, fingerprint
        rec.boot_id, rec.ready = boot_id or rec.boot_id, ready
        rec.unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
        self.nodes[name] = rec
        if changed and not first:
            self.last_change = now
            self._sample(now)

    def _protected(self, rec: NodeRecord, status: Mapping[str, Any], now: float) -> None:
        kind = constants.node_condition_type(self.nodewright)
        cond = next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)
        waiting = cond is not None and cond.get("reason") == "WaitingForProtectedPods"
        if waiting and (rec.protected is None or rec.protected.until is not None):
            found = PROTECTED_WAIT.search(str(cond.get("message") or "")) if cond else None
            pods = tuple(p.strip() for p in found.group(1).split(",")) if found else ()
            if rec.protected is None:
                rec.protected = ProtectedWait(pods, now)
            else:
                rec.protected.until = None
        elif not waiting and rec.protected is not None and rec.protected.until is None:
            rec.protected.until = now

    def protected_waits(self) -> list[tuple[str, ProtectedWait]]:
        """Nodes that waited for protected pods, longest wait first."""
        waits = [(n, r.protected) for n, r in self.nodes.items() if r.protected is not None]
        end = time.monotonic()
        return sorted(waits, key=lambda item: -((item[1].until or end) - item[1].since))

    def _sample(self, now: float) -> None:
        counts = self.in_progress_by_compartment()
        for comp, n in counts.items():
            self.max_in_progress[comp] = max(self.max_in_progress.get(comp, 0), n)
        if not self.samples or self.samples[-1][1] != counts:
            self.samples.append((now - self.started, counts))

    def in_progress_by_compartment(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for rec in self.nodes.values():
            if rec.status == "in_progress" and rec.compartment is not None:
                counts[rec.compartment] += 1
        comps = {r.compartment for r in self.nodes.values() if r.compartment is not None}
        return {c: counts.get(c, 0) for c in sorted(comps)}

    def status_counts(self) -> dict[str, int]:
        # No status label: not touched yet, which the operator reports as waiting.
        return dict(Counter(r.status or "waiting" for r in self.nodes.values()))

    def batches(self, fingerprint: str | None = None) -> dict[str, dict[int, int]]:
        """Observed batch sizes per compartment (admissions of `fingerprint`, default: all)."""
        out: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        for rec in self.nodes.values():
            if rec.compartment is None or rec.batch is None:
                continue
            if fingerprint is not None and rec.fingerprint != fingerprint:
                continue
            out[rec.compartment][rec.batch] += 1
        return {c: dict(sorted(b.items())) for c, b in sorted(out.items())}

    def reboots(self) -> int:
        return sum(r.reboots for r in self.nodes.values())

    async def run(self, *, label_selector: str | None = None) -> None:
        """List, then watch from the list's resourceVersion; relist on expiry; runs until cancelled."""
        params = {"labelSelector": label_selector} if label_selector else None
        async with KubeClient(self.kubeconfig, timeout=120.0) as client:
            while True:
                try:
                    listed = await client.list_all("/api/v1/nodes", params=params)
                    now = time.monotonic()
                    for node in listed["items"]:
                        self._update(node, now)
                    self._sample(now)
                    self.synced.set()
                    rv = str(listed["resourceVersion"])
                    while True:
                        async for event in client.watch("/api/v1/nodes", resource_version=rv, params=params):
                            kind, obj = event.get("type"), event.get("object") or {}
                            if kind == "ERROR":
                                raise _Relist()
                            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                            if kind in ("ADDED", "MODIFIED"):
                                self._update(obj, time.monotonic())
                            elif kind == "DELETED":
                                self.nodes.pop(str(obj["metadata"]["name"]), None)
                except _Relist:
                    continue
                except (ApiError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                    self.errors += 1
                    if self.errors > 50:
                        raise DemoError(f"node watch keeps failing: {exc!r}") from exc
                    await asyncio.sleep(1.0)


class _Relist(Exception):
    pass


# ----------------------------------------------------------------------------------------------------
# The NodeWright's own report


async def get_nodewright(client: KubeClient, name: str) -> JSON | None:
    try:
        return await client.get(f"/apis/{constants.API_VERSION}/{constants.PLURAL_NODEWRIGHT}/{name}")
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def compartment_statuses(nodewright: JSON | None) -> dict[str, JSON]:
    status = (nodewright or {}).get("status") or {}
    comps: dict[str, JSON] = status.get("compartmentStatuses") or {}
    return dict(sorted(comps.items()))


def bar(done: int, total: int, *, width: int = 24) -> str:
    if total <= 0:
        return "·" * width
    filled = min(width, round(width * done / total))
    return "█" * filled + "░" * (width - filled)


class Screen:
    """Redraws a block of lines in place on a terminal; elsewhere prints it when it changed (≤ every 10 s)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._drawn = 0
        self._last: list[str] = []
        self._last_print = 0.0

    def show(self, lines: list[str]) -> None:
        if self.tty:
            if self._drawn:
                self.stream.write(f"\x1b[{self._drawn}F\x1b[J")
            self.stream.write("\n".join(lines) + "\n")
            self._drawn = len(lines)
        else:
            now = time.monotonic()
            if (
                lines[1:] != self._last[1:] and now - self._last_print >= 10.0
            ) or now - self._last_print >= 60.0:
                self.stream.write("\n".join(lines) + "\n")
                self._last_print = now
        self._last = lines
        self.stream.flush()

    def release(self) -> None:
        """Keep what is drawn; later output starts below it."""
        self._drawn = 0
