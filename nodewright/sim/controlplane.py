"""A real local Kubernetes control plane as plain processes: etcd, kube-apiserver, kube-controller-manager,
kwok, the project's rebooter and its simulated kubelet, all on free loopback ports.

What each piece contributes, and why the flags are what they are:

- etcd (single member, `--unsafe-no-fsync`: the data is thrown away after the run).
- kube-apiserver with client-certificate authentication and RBAC. The `ServiceAccount` admission plugin is
  off so pods can be created before (or without) a `default` ServiceAccount, and `TaintNodesByCondition`
  is off because no node-lifecycle controller would ever remove the `not-ready` taint it adds to new
  nodes. The advertise address is loopback, which kube-apiserver only accepts with
  `--endpoint-reconciler-type=none` (the in-cluster `kubernetes` Service is useless out of cluster).
  `--kubelet-preferred-address-types` puts InternalDNS first: only nodes whose pods the simulated kubelet
  runs publish one (`localhost`, where kwok serves the kubelet API), so `kubectl logs` reaches their
  logs, while every other node keeps the default (Hostname first).
- kube-controller-manager running only the controllers the project relies on: the disruption controller
  (without it a new PodDisruptionBudget never gets `status.observedGeneration`, and every eviction of a
  covered running pod is answered 429 forever), the garbage collector (ownerReference cascades), the
  namespace controller (finishes namespace deletion) and the service-account controller. The
  node-lifecycle controller is deliberately absent: simulated nodes post no heartbeats.
- kwok, managing nodes annotated `kwok.x-k8s.io/node=fake` except those labelled
  `sim.nodewright.io/real-packages=true`, with the project's stages (`nodewright/sim/data/kwok_stages.yaml`)
  and no node leases (`--node-lease-duration-seconds=0`, so thousands of nodes cost no periodic writes).
  Its `Logs` API is enabled (`--enable-crds=Logs`; the project's CRD for it,
  `nodewright/sim/data/kwok_logs_crd.yaml`, is installed right after kube-apiserver starts), so its kubelet
  server answers `pods/log` for the files the simulated kubelet registers.
- the rebooter (`nodewright.sim.rebooter`), for what kwok's stages cannot express: a reboot that takes
  the node NotReady and brings it back with a new `status.nodeInfo.bootID`.
- the simulated kubelet (`nodewright.sim.kubelet`), which really runs the pods of nodes labelled
  `sim.nodewright.io/real-packages=true` as local processes against `<dir>/roots/<node>/`.

Every process runs in its own session (process group), its PID and kernel start time are recorded in
`<dir>/state.json` and its output goes to `<dir>/logs/<name>.log`. Stopping kills exactly the recorded
process groups, after checking that the PID still belongs to the process we started (the kernel start
time must match), so a recycled PID is never signalled. A component that exits while we wait for it to
become healthy is reported with the tail of its log instead of a timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from nodewright.sim import binaries, box, boxnet, fleet, pki, registry
from nodewright.sim.kubeapi import ApiError
from nodewright.sim.kubeapi import KubeClient as KubeApi
from nodewright.sim.kubelet_spec import REAL_PACKAGES_LABEL, check_safe_directory

NAMESPACE = "nodewright-system"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kwok", "rebooter", "kubelet")
# With real nodes (`real_nodes` > 0): a scheduler for the chart's Deployments, the registry the nodes pull
# from, and the boxes themselves (nodewright.sim.realnodes), in this order after the others.
REAL_NODE_COMPONENTS = ("kube-scheduler", "registry", "realnodes")
REAL_NODE_PREFIX = "real-node"
REAL_NODE_LABEL = "sim.nodewright.io/real-node"
REAL_NODES_DIR = "realnodes"
REGISTRY_DIR = "oci-registry"
# The project's definition of kwok's Logs API (kwok.x-k8s.io/v1alpha1), served for the simulated kubelet.
_KWOK_LOGS_CRD = "logs.kwok.x-k8s.io"
_READY_FILES = {"rebooter": "rebooter.ready", "kubelet": "kubelet.ready", "realnodes": "realnodes.ready"}
STATE_FILE = "state.json"
_STATE_VERSION = 1
# Seconds between SIGTERM and SIGKILL. kube-apiserver's graceful shutdown waits up to 60 s for open
# watches to end (measured), which buys nothing here (every accepted write is already in etcd), so it
# gets a short grace; etcd stops at once unless clients are still connected.
_STOP_GRACE_S = {"kube-apiserver": 2.0, "etcd": 5.0}
_DEFAULT_STOP_GRACE_S = 10.0
_START_TIMEOUTS = {
    "etcd": 30.0,
    "kube-apiserver": 120.0,
    "kube-controller-manager": 60.0,
    "kwok": 60.0,
    "rebooter": 30.0,
    "kubelet": 30.0,
    "kube-scheduler": 60.0,
    "registry": 30.0,
    "realnodes": 60.0,
}
_REAL_NODES_READY_S = 120.0


class ControlPlaneError(RuntimeError):
    """A component failed to start, died, or the state directory is unusable."""


_LISTEN_PORTS = range(20000, 32000)
"""Where listening ports are picked: below Linux's default ephemeral range (32768-60999). A port the
kernel hands out for `bind(0)` comes from the ephemeral range, where any outgoing connection (an
apiserver dialling etcd, a watch) may take it between our check and the component's own bind."""
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, outside the ephemeral range, never handed out twice by
    this process (several components are started from one batch of picks)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.choice(_LISTEN_PORTS)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise ControlPlaneError(f"no free TCP port in {_LISTEN_PORTS.start}-{_LISTEN_PORTS.stop - 1}")


def _proc_start_ticks(pid: int) -> int | None:
    """Kernel start time of `pid` in clock ticks (field 22 of /proc/<pid>/stat), None if gone/zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its closing paren.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):  # zombie or dead: nothing to signal
        return None
    return int(fields[19])


def process_running(pid: int, start_ticks: int | None = None) -> bool:
    """True if `pid` exists and is not a zombie (and, if given, started at `start_ticks`)."""
    ticks = _proc_start_ticks(pid)
    return ticks is not None and (start_ticks is None or ticks == start_ticks)


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ComponentState:
    """What is recorded for one component: enough to restart it identically and to stop exactly it."""

    argv: list[str]
    log: str
    pid: int | None = None
    start_ticks: int | None = None
    env: dict[str, str] = field(default_factory=dict)

    def alive(self) -> bool:
        return self.pid is not None and _proc_start_ticks(self.pid) == self.start_ticks


@dataclass
class ControlPlane:
    """One local control plane rooted at `dir`. Create with `ControlPlane.create()` or `.load()`."""

    dir: Path
    bin_dir: Path
    ports: dict[str, int]
    components: dict[str, ComponentState]
    namespace: str = NAMESPACE
    real_nodes: int = 0
    real_node_base: str = ""  # the base root directory of hack/realnode/build.sh
    _children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    @property
    def names(self) -> tuple[str, ...]:
        """The components of this plane in start order."""
        return COMPONENTS + (REAL_NODE_COMPONENTS if self.real_nodes else ())

    @property
    def real_node_names(self) -> list[str]:
        return [real_node_name(i) for i in range(self.real_nodes)]

    @property
    def registry(self) -> str:
        """`127.0.0.1:PORT` of the local registry (real nodes only)."""
        return f"127.0.0.1:{self.ports['registry']}"

    # ------------------------------------------------------------------ paths and addresses
    @property
    def kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    @property
    def pki(self) -> pki.Pki:
        return pki.Pki(self.dir / "pki")

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['etcd']}"

    # ------------------------------------------------------------------ creation and persistence
    @classmethod
    def create(
        cls,
        directory: Path,
        *,
        bins: binaries.ControlPlaneBinaries | None = None,
        image_dirs: Sequence[Path] = (),
        agent_images: Sequence[str] = (),
        real_nodes: int = 0,
    ) -> ControlPlane:
        """Prepare `directory` (PKI, kubeconfig, stage file, command lines); nothing is started yet.

        `real_nodes` adds that many real nodes (`real-node-0`, ...: a real kubelet and containerd each, in a
        box of its own; `nodewright.sim.realnodes`), and with them a scheduler and a registry. They need
        root and `make realnode`; a missing prerequisite raises ControlPlaneError naming it.

        `image_dirs` are extra directory registries and `agent_images` extra images that run our agent
        for the simulated kubelet (`<directory>/registry/` and the repository's `packages/` are always
        registries, and any image whose repository ends in `/agent` is the agent).
        """
        bins = bins or binaries.locate()
        base = _real_node_prerequisites(bins) if real_nodes else None
        directory = directory.resolve()
        try:
            check_safe_directory(directory)  # the simulated kubelet maps paths into shell commands
        except ValueError as err:
            raise ControlPlaneError(str(err)) from None
        existing = directory / STATE_FILE
        if existing.exists():
            old = cls.load(directory)
            running = [name for name, comp in old.components.items() if comp.alive()]
            if running:
                raise ControlPlaneError(
                    f"a control plane is already running in {directory} ({', '.join(running)}); "
                    "run `nodewright sim down` for it first"
                )
            old._remove_state()
        directory.mkdir(parents=True, exist_ok=True)
        for sub in ("logs", "etcd", "kcm", "apiserver"):
            (directory / sub).mkdir(mode=0o700, exist_ok=True)
        port_names = ["etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kwok"]
        if real_nodes:
            port_names += ["kube-scheduler", "registry"]
        ports = {name: free_port() for name in port_names}
        plane = cls(dir=directory, bin_dir=bins.dir, ports=ports, components={}, real_nodes=real_nodes)
        material = pki.generate(directory / "pki")
        pki.write_kubeconfig(
            plane.kubeconfig,
            server=plane.server,
            ca_crt=material.ca_crt,
            client_crt=material.admin_crt,
            client_key=material.admin_key,
        )
        write_kwok_stages(directory / "kwok-stages.yaml")
        if base is not None:
            plane._prepare_real_nodes(base)
        plane.components = {
            name: plane._command(name, image_dirs=image_dirs, agent_images=agent_images)
            for name in plane.names
        }
        plane.save()
        return plane

    @classmethod
    def load(cls, directory: Path) -> ControlPlane:
        path = directory.resolve() / STATE_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ControlPlaneError(f"no control plane state in {directory} ({STATE_FILE} missing)") from None
        if raw.get("version") != _STATE_VERSION:
            raise ControlPlaneError(f"{path}: unsupported state version {raw.get('version')!r}")
        plane = cls(
            dir=Path(raw["dir"]),
            bin_dir=Path(raw["bin_dir"]),
            ports={k: int(v) for k, v in raw["ports"].items()},
            components={name: ComponentState(**comp) for name, comp in raw["components"].items()},
            namespace=raw.get("namespace", NAMESPACE),
            real_nodes=int(raw.get("real_nodes", 0)),
            real_node_base=str(raw.get("real_node_base", "")),
        )
        for name in plane.names:  # a state written before a component existed: it is simply not running
            plane.components.setdefault(name, plane._command(name))
        return plane

    def save(self) -> None:
        data = {
            "version": _STATE_VERSION,
            "dir": str(self.dir),
            "bin_dir": str(self.bin_dir),
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "namespace": self.namespace,
            "real_nodes": self.real_nodes,
            "real_node_base": self.real_node_base,
            "ports": self.ports,
            "components": {name: vars(comp) for name, comp in self.components.items()},
        }
        tmp = self.dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
        tmp.replace(self.dir / STATE_FILE)

    def _command(
        self, name: str, *, image_dirs: Sequence[Path] = (), agent_images: Sequence[str] = ()
    ) -> ComponentState:
        builders: dict[str, Callable[[], list[str]]] = {
            "etcd": self._etcd_argv,
            "kube-apiserver": self._apiserver_argv,
            "kube-controller-manager": self._kcm_argv,
            "kwok": self._kwok_argv,
            "rebooter": self._rebooter_argv,
            "kubelet": lambda: self._kubelet_argv(image_dirs, agent_images),
            "kube-scheduler": self._scheduler_argv,
            "registry": self._registry_argv,
            "realnodes": self._realnodes_argv,
        }
        if name not in builders:
            raise ControlPlaneError(f"unknown component {name!r}; expected one of {', '.join(self.names)}")
        return ComponentState(argv=builders[name](), log=str(self.dir / "logs" / f"{name}.log"))

    def _etcd_argv(self) -> list[str]:
        b, d, ports = self.bin_dir, self.dir, self.ports
        client, peer = f"http://127.0.0.1:{ports['etcd']}", f"http://127.0.0.1:{ports['etcd-peer']}"
        return [
            str(b / "etcd"), "--name=sim", f"--data-dir={d / 'etcd' / 'data'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=sim={peer}", "--initial-cluster-state=new",
            "--unsafe-no-fsync=true", "--quota-backend-bytes=8589934592", "--log-level=warn",
        ]  # fmt: skip

    def _apiserver_argv(self) -> list[str]:
        b, d, p, ports = self.bin_dir, self.dir, self.pki, self.ports
        argv = [
            str(b / "kube-apiserver"), f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", f"--secure-port={ports['kube-apiserver']}",
            "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--tls-cert-file={p.serving_crt}", f"--tls-private-key-file={p.serving_key}",
            f"--client-ca-file={p.ca_crt}", f"--service-account-issuer={self.server}",
            f"--service-account-key-file={p.sa_pub}", f"--service-account-signing-key-file={p.sa_key}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--kubelet-preferred-address-types=InternalDNS,Hostname,InternalIP,ExternalDNS,ExternalIP",
            "--allow-privileged=true", "--profiling=false", f"--cert-dir={d / 'apiserver'}",
        ]  # fmt: skip
        if not self.real_nodes:
            return [
                *argv,
                "--authorization-mode=RBAC",
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            ]
        # Real nodes make it a cluster as users run one: pods get their ServiceAccount tokens (admission
        # plugin on), kubelets are authorized as nodes, and the API server reaches kubelets and the
        # webhook's endpoints through the real nodes' egress proxy (nodewright.sim.boxnet).
        return [
            *argv, "--authorization-mode=Node,RBAC", "--disable-admission-plugins=TaintNodesByCondition",
            f"--kubelet-client-certificate={p.kubelet_client_crt}",
            f"--kubelet-client-key={p.kubelet_client_key}",
            f"--egress-selector-config-file={self.dir / REAL_NODES_DIR / 'egress-selector.yaml'}",
            "--enable-aggregator-routing=true",
        ]  # fmt: skip

    def _kcm_argv(self) -> list[str]:
        controllers = ["disruption-controller", "garbage-collector-controller", "namespace-controller",
                       "serviceaccount-controller"]  # fmt: skip
        if self.real_nodes:
            # The chart's Deployments and its uninstall hook's Job, the webhook Service's endpoints and the
            # CA bundle every pod's projected token volume mounts.
            controllers += [
                "deployment-controller", "replicaset-controller", "job-controller",
                "ttl-after-finished-controller", "endpoints-controller", "endpointslice-controller",
                "root-ca-certificate-publisher-controller", "pod-garbage-collector-controller",
            ]  # fmt: skip
        return [
            str(self.bin_dir / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            f"--controllers={','.join(controllers)}", f"--root-ca-file={self.pki.ca_crt}",
            "--leader-elect=false", "--bind-address=127.0.0.1",
            f"--secure-port={self.ports['kube-controller-manager']}", f"--cert-dir={self.dir / 'kcm'}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez",
            "--kube-api-qps=500", "--kube-api-burst=1000", "--profiling=false",
        ]  # fmt: skip

    def _kwok_argv(self) -> list[str]:
        return [
            str(self.bin_dir / "kwok"), f"--kubeconfig={self.kubeconfig}",
            "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--manage-nodes-with-label-selector={REAL_PACKAGES_LABEL}!=true", "--enable-crds=Logs",
            "--cidr=10.0.0.0/16", "--node-ip=10.240.0.1", "--node-lease-duration-seconds=0", "--v=WARN",
            f"--server-address=127.0.0.1:{self.ports['kwok']}", f"--config={self.dir / 'kwok-stages.yaml'}",
        ]  # fmt: skip

    def _rebooter_argv(self) -> list[str]:
        return [
            sys.executable, "-m", "nodewright.sim.rebooter", f"--kubeconfig={self.kubeconfig}",
            f"--namespace={self.namespace}", f"--ready-file={self.dir / 'rebooter.ready'}",
        ]  # fmt: skip

    def _kubelet_argv(self, image_dirs: Sequence[Path], agent_images: Sequence[str]) -> list[str]:
        d = self.dir
        return [
            sys.executable, "-m", "nodewright.sim.kubelet", f"--kubeconfig={self.kubeconfig}",
            f"--dir={d}", f"--kwok-port={self.ports['kwok']}", f"--ready-file={d / 'kubelet.ready'}",
            *(f"--image-dir={Path(p).resolve()}" for p in image_dirs),
            *(f"--agent-image={image}" for image in agent_images),
        ]  # fmt: skip

    def _scheduler_argv(self) -> list[str]:
        return [
            str(self.bin_dir / "kube-scheduler"), f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            f"--config={self.dir / REAL_NODES_DIR / 'scheduler.yaml'}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['kube-scheduler']}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez", "--profiling=false",
        ]  # fmt: skip

    def _registry_argv(self) -> list[str]:
        binary = Path(self.real_node_base) / "docker-registry"
        return [str(binary), "serve", str(self.dir / REAL_NODES_DIR / "registry.yaml")]

    def _realnodes_argv(self) -> list[str]:
        return [
            sys.executable, "-m", "nodewright.sim.realnodes", f"--dir={self.dir / REAL_NODES_DIR}",
            f"--ready-file={self.dir / 'realnodes.ready'}", f"--kubeconfig={self.kubeconfig}",
        ]  # fmt: skip

    # ------------------------------------------------------------------ lifecycle
    def up(self) -> float:
        """Start every component in dependency order and wait until each is healthy; returns seconds."""
        started = time.monotonic()
        try:
            for name in self.names:
                self.start_component(name)
                if name == "kube-apiserver":
                    self._ensure_namespace()
                    self._ensure_kwok_logs_crd()
                elif name == "registry":
                    self._push_sandbox_image()
            if self.real_nodes:
                self.wait_real_nodes_ready()
        except BaseException:
            self.down(remove=False)
            raise
        return time.monotonic() - started

    def start_component(self, name: str) -> None:
        comp = self.components[name]
        if comp.alive():
            raise ControlPlaneError(f"{name} is already running (pid {comp.pid})")
        if name in _READY_FILES:
            (self.dir / _READY_FILES[name]).unlink(missing_ok=True)
        env = dict(os.environ)
        if name in _READY_FILES:
            # The rebooter and the kubelet are this package's own code: importable from any cwd.
            src_root = str(Path(__file__).resolve().parents[2])
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [src_root, env.get("PYTHONPATH")]))
        env.update(comp.env)
        with open(comp.log, "ab") as log:
            log.write(f"\n--- start {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(comp.argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                comp.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                env=env,
                start_new_session=True,  # own process group: stop() signals exactly this tree
            )
        comp.pid = proc.pid
        comp.start_ticks = _proc_start_ticks(proc.pid)
        self._children[name] = proc
        self.save()
        self._wait_healthy(name, proc, _START_TIMEOUTS[name])

    def kill_component(self, name: str, *, sig: int = signal.SIGTERM) -> None:
        """Stop one component (SIGTERM to its process group, SIGKILL after a grace period)."""
        comp = self.components[name]
        if comp.pid is not None and comp.alive():
            self._stop_group(name, comp, sig)
        comp.pid = None
        comp.start_ticks = None
        self._children.pop(name, None)
        self.save()

    def restart_apiserver(self) -> None:
        self.kill_component("kube-apiserver")
        self.start_component("kube-apiserver")

    def down(self, *, remove: bool = True) -> list[str]:
        """Stop all recorded processes (reverse start order); optionally delete the directory."""
        stopped = []
        for name in reversed(self.names):
            comp = self.components.get(name)
            if comp is not None and comp.pid is not None and comp.alive():
                stopped.append(name)
            if comp is not None:
                self.kill_component(name)
        if self.real_nodes:
            # realnodes removes its boxes' cgroups when it stops; after a SIGKILL nobody has.
            left = box.remove_cgroups(box.sim_id(self.dir))
            if left:
                raise ControlPlaneError(f"cgroups of the real nodes are still in use: {', '.join(left)}")
        if remove:
            self._remove_state()
        return stopped

    def _remove_state(self) -> None:
        """Delete what `create` and the components wrote, then the directory itself if nothing else is in
        it: a `--dir` pointing at a directory with other content must not lose that content."""
        for sub in ("etcd", "kcm", "apiserver", "logs", "pki", "roots", "kubelet", "registry", REAL_NODES_DIR,
                    REGISTRY_DIR):  # fmt: skip
            shutil.rmtree(self.dir / sub, ignore_errors=True)
        files = (STATE_FILE, STATE_FILE + ".tmp", "*.kubeconfig", "kwok-stages.yaml", *_READY_FILES.values())
        for pattern in files:
            for path in self.dir.glob(pattern):
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.dir.rmdir()

    def status(self) -> dict[str, dict[str, Any]]:
        """Per component: running?, pid, log path, and the log tail of any that is not running."""
        report: dict[str, dict[str, Any]] = {}
        for name in self.names:
            comp = self.components[name]
            alive = comp.alive()
            entry: dict[str, Any] = {"running": alive, "pid": comp.pid, "log": comp.log}
            if not alive and comp.pid is not None:
                entry["log_tail"] = log_tail(Path(comp.log))
            report[name] = entry
        return report

    def running_pids(self) -> list[int]:
        return [c.pid for c in self.components.values() if c.pid is not None and c.alive()]

    def _stop_group(self, name: str, comp: ComponentState, sig: int) -> None:
        assert comp.pid is not None
        pid = comp.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        child = self._children.get(name)
        deadline = time.monotonic() + _STOP_GRACE_S.get(name, _DEFAULT_STOP_GRACE_S)
        while time.monotonic() < deadline:
            if child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=0.1)  # reaps our own child, so it does not linger as a zombie
            else:
                time.sleep(0.1)
            if _proc_start_ticks(pid) != comp.start_ticks:
                break
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            if child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=5)
        # Children of the component (none expected) share its group: make sure none survive.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    # ------------------------------------------------------------------ health
    def _wait_healthy(self, name: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
        check = self._health_check(name)
        deadline = time.monotonic() + timeout
        last_error = "not checked yet"
        while True:
            code = proc.poll()
            if code is not None:
                log = self.components[name].log
                raise ControlPlaneError(
                    f"{name} exited with code {code} while starting; last lines of {log}:\n"
                    + log_tail(Path(log))
                )
            try:
                if check():
                    return
                last_error = "not ready"
            except (OSError, urllib.error.URLError, ssl.SSLError, ValueError) as err:
                last_error = str(err)
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{name} not healthy after {timeout:.0f}s ({last_error}); last lines of "
                    f"{self.components[name].log}:\n" + log_tail(Path(self.components[name].log))
                )
            time.sleep(0.2)

    def _admin_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_crt))
        ctx.load_cert_chain(str(self.pki.admin_crt), str(self.pki.admin_key))
        return ctx

    def _health_check(self, name: str) -> Callable[[], bool]:
        def http_ok(url: str, ctx: ssl.SSLContext | None = None, expect: str = "ok") -> bool:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                return resp.status == 200 and expect in resp.read().decode()

        if name == "etcd":
            return lambda: http_ok(f"{self.etcd_url}/health", expect='"health":"true"')
        if name == "kube-apiserver":
            ctx = self._admin_ssl()
            return lambda: http_ok(f"{self.server}/readyz", ctx)
        if name in ("kube-controller-manager", "kube-scheduler"):
            insecure = ssl.create_default_context()
            insecure.check_hostname = False
            insecure.verify_mode = ssl.CERT_NONE  # both serve a self-signed cert
            port = self.ports[name]
            return lambda: http_ok(f"https://127.0.0.1:{port}/healthz", insecure)
        if name == "kwok":
            return lambda: http_ok(f"http://127.0.0.1:{self.ports['kwok']}/healthz")
        if name == "registry":
            return lambda: http_ok(f"http://{self.registry}/v2/", expect="{")
        if name in _READY_FILES:
            ready = self.dir / _READY_FILES[name]
            return ready.exists
        raise ControlPlaneError(f"unknown component {name!r}")

    # ------------------------------------------------------------------ real nodes
    def _prepare_real_nodes(self, base: Path) -> None:
        """The boxes' spec, layer and disks, and the configuration of the scheduler, registry and egress."""
        self.real_node_base = str(base)
        root = self.dir / REAL_NODES_DIR
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(mode=0o700, parents=True)
        nodes = tuple(
            box.NodeSpec(name, i, box.labels_for(fleet_labels(name, i)))
            for i, name in enumerate(self.real_node_names)
        )
        spec = box.BoxesSpec(
            dir=root, base=base, sim_id=box.sim_id(self.dir), api_port=self.ports["kube-apiserver"],
            registry_port=self.ports["registry"], nodes=nodes,
        )  # fmt: skip
        spec.save()
        box.write_layer(spec.layer, plan=spec.plan)
        for node in nodes:
            box.provision(spec, node, material=self.pki)
        (root / "egress-selector.yaml").write_text(
            boxnet.egress_selector_config(root / "egress.sock"), encoding="utf-8"
        )
        (root / "scheduler.yaml").write_text(scheduler_config(self.kubeconfig), encoding="utf-8")
        storage = self.dir / REGISTRY_DIR
        storage.mkdir(mode=0o700, exist_ok=True)
        registry_config = {
            "version": 0.1,
            "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
            "http": {"addr": self.registry},
        }
        (root / "registry.yaml").write_text(yaml.safe_dump(registry_config), encoding="utf-8")

    def _push_sandbox_image(self) -> None:
        """The pause image every pod sandbox starts from, under the name containerd asks for."""
        layout = registry.binary_image_layout(
            Path(self.real_node_base) / "pause", self.dir / REAL_NODES_DIR / "pause-image",
            path="/pause", tag=SANDBOX_IMAGE.rsplit(":", 1)[1], user="65535:65535",
        )  # fmt: skip
        registry.push_layout(layout, registry=self.registry, reference=SANDBOX_IMAGE)

    def real_node_status(self) -> dict[str, dict[str, Any]]:
        """Per real node: its state, boots and how the last one ended (`realnodes`' status.json)."""
        path = self.dir / REAL_NODES_DIR / "status.json"
        try:
            status: dict[str, dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return status

    def push_image(self, layout: Path, reference: str) -> str:
        """Push an OCI image layout to this simulator's registry; real nodes pull it as `reference`."""
        if not self.real_nodes:
            raise ControlPlaneError("this simulator has no registry (it has no real nodes)")
        return registry.push_layout(layout, registry=self.registry, reference=reference)

    def wait_real_nodes_ready(self, *, within: float = _REAL_NODES_READY_S) -> None:
        """Wait until every real node is registered and Ready (its kubelet and containerd up)."""
        deadline = time.monotonic() + within
        waiting = list(self.real_node_names)
        while waiting:
            waiting = [name for name in waiting if not self._node_ready(name)]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"real node(s) {', '.join(waiting)} not Ready after {within:.0f}s; see "
                    f"{self.dir / REAL_NODES_DIR / 'nodes' / waiting[0] / 'upper/var/log/nodewright-box'}"
                    "/kubelet.log and console.log beside upper/"
                )
            time.sleep(0.5)

    def _node_ready(self, name: str) -> bool:
        try:
            node = self.api("GET", f"/api/v1/nodes/{name}")
        except ApiError as err:
            if err.status == 404:
                return False
            raise
        conditions = (node.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    # ------------------------------------------------------------------ API helpers (sync, for tests and CLI)
    def api(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json") -> Any:
        """One synchronous API call with the admin identity, through the one client (`sim.kubeapi`
        over `nodewright.kube.client`): run on a private event loop in a worker thread, so that sync
        code (start-up, fixtures) and code inside a running loop can both call it. Raises
        `sim.kubeapi.ApiError` (the one error type) on a non-2xx answer."""

        async def call() -> Any:
            async with KubeApi(self.kubeconfig, max_in_flight=1) as api:
                return await api.request(method, path, body=body, content_type=content_type)

        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="controlplane-api") as pool:
            return pool.submit(asyncio.run, call()).result()

    def _ensure_kwok_logs_crd(self) -> None:
        """Install the definition of kwok's Logs API and wait until it is served (kwok watches it)."""
        text = (
            resources.files("nodewright.sim").joinpath("data/kwok_logs_crd.yaml").read_text(encoding="utf-8")
        )
        try:
            self.api("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", yaml.safe_load(text))
        except ApiError as err:
            if err.status != 409:
                raise
        deadline = time.monotonic() + 30
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{_KWOK_LOGS_CRD}"
        while True:
            if not unestablished(self.api("GET", path)):
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"CustomResourceDefinition {_KWOK_LOGS_CRD} not established after 30s"
                )
            time.sleep(0.1)

    def wait_established(self, *targets: str, within: float = 60.0) -> None:
        """Wait until the CRDs named by `targets` (kubectl arguments: `-f <dir>`, `crd/<name>`) are
        Established; see `wait_crds_established`."""
        wait_crds_established(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}"], targets, within=within
        )

    def _ensure_namespace(self) -> None:
        try:
            self.api("POST", "/api/v1/namespaces", {"metadata": {"name": self.namespace}})
        except ApiError as err:
            if err.status != 409:
                raise

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster with the admin kubeconfig."""
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def compact_etcd(self, *, restart_apiserver: bool = True) -> int:
        """Compact etcd at its current revision so older resourceVersions answer 410 Gone; returns it.

        kube-apiserver serves watches and exact-RV lists from its watch cache, which keeps history of
        its own: compacting etcd alone changes nothing a client can see (measured: a watch and a list at
        an old RV still succeed). So by default the apiserver is restarted too, which rebuilds the cache
        from the compacted store. Afterwards a list with an older `resourceVersion` +
        `resourceVersionMatch=Exact` gets HTTP 410 (reason Expired) and a watch from an older RV gets an
        ERROR event with code 410. Open watches are cut by the restart, so a client resumes from its
        last RV and must relist: the path this exists to test.
        """
        # etcd's JSON gateway (gRPC-gateway on the client port): any range answer carries the revision.
        header = self._etcd_post("/v3/kv/range", {"key": "AA==", "limit": 1})["header"]
        revision = int(header["revision"])
        self._etcd_post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        if restart_apiserver:
            self.restart_apiserver()
        return revision

    def _etcd_post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            self.etcd_url + path, data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=10) as resp:
            result: dict[str, Any] = json.loads(resp.read())
            return result


SANDBOX_IMAGE = "registry.k8s.io/pause:3.10"


def real_node_name(index: int) -> str:
    return f"{REAL_NODE_PREFIX}-{index}"


def fleet_labels(name: str, index: int) -> dict[str, str]:
    """A real node's labels: the simulated fleet's GPU labels for its index, marked as a real node."""
    labels = fleet.node_labels(name, index, profile="h100", fleet=REAL_NODE_PREFIX)
    labels["type"] = "real"
    labels[REAL_NODE_LABEL] = "true"
    return labels


def scheduler_config(kubeconfig: Path) -> str:
    """kube-scheduler's configuration: the default profile, placing pods on real nodes only. The kwok
    nodes beside them have nothing that could run a container (their pods are bound by name, not
    scheduled), so every scheduled pod gets the added affinity `type != kwok`, as a cluster operator
    keeps workloads off a pool with a scheduler-wide affinity."""
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [
            {
                "schedulerName": "default-scheduler",
                "pluginConfig": [
                    {
                        "name": "NodeAffinity",
                        "args": {
                            "addedAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": {
                                    "nodeSelectorTerms": [
                                        {
                                            "matchExpressions": [
                                                {"key": "type", "operator": "NotIn", "values": ["kwok"]}
                                            ]
                                        }
                                    ]
                                }
                            }
                        },
                    }
                ],
            }
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def _real_node_prerequisites(bins: binaries.ControlPlaneBinaries) -> Path:
    """The real nodes' base root, after checking what they need of this machine (one line each)."""
    if os.geteuid() != 0:
        raise ControlPlaneError(
            "real nodes need root (namespaces, mounts, cgroups): run as root, or without --real-nodes"
        )
    for tool, package in (
        ("unshare", "util-linux"),
        ("nsenter", "util-linux"),
        ("ip", "iproute2"),
        ("mount", "mount"),
    ):
        if shutil.which(tool) is None:
            raise ControlPlaneError(
                f"real nodes need `{tool}`: install Debian's {package} (apt-get install {package})"
            )
    if not Path("/sys/fs/cgroup").is_dir():
        raise ControlPlaneError("real nodes need the cgroup file system at /sys/fs/cgroup")
    try:
        return binaries.locate_realnode(binaries=bins)
    except binaries.BinariesMissingError as err:
        raise ControlPlaneError(str(err)) from None


def write_kwok_stages(path: Path) -> Path:
    """Render the packaged stage definitions into the multi-document file kwok's `--config` reads.

    The data file keeps shared jq expressions as YAML anchors in one document (so the outcome rules are
    written once) and shared Go sub-templates under `x-template-defines`; kwok wants one Stage per
    document, with anchors resolved and every named template defined in the template that calls it.
    """
    source = resources.files("nodewright.sim").joinpath("data/kwok_stages.yaml").read_text(encoding="utf-8")
    document = yaml.safe_load(source)
    stages: list[dict[str, Any]] = document["stages"]
    defines: str = document.get("x-template-defines", "")
    for stage in stages:
        nxt = stage["spec"].get("next", {})
        template = nxt.get("statusTemplate")
        if template and "{{ template " in template:
            nxt["statusTemplate"] = defines + template
    documents: list[dict[str, Any]] = [KWOK_CONFIGURATION, *stages]
    path.write_text(yaml.dump_all(documents, Dumper=_LiteralDumper, sort_keys=False), encoding="utf-8")
    return path


KWOK_CONFIGURATION: dict[str, Any] = {
    "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
    "kind": "KwokConfiguration",
    # kwok plays every pod's and node's stages through a few shared workers (4 by default), while a
    # real fleet has a kubelet per node: with hundreds of package pods in flight the shared workers
    # became the queue every stage waited in (about 1 s per stage at 1,000 nodes). More workers make
    # the simulated kubelets behave more like independent ones.
    #
    # The debugging handlers are kwok's kubelet API (`/containerLogs/...`): with them kwok answers the API
    # server's `pods/log` requests from the files in `Logs` objects (see nodewright.sim.kubelet). A config
    # file that sets `options` gets no defaults for the rest, so they must be switched on here; the pprof
    # handlers that come with them are not wanted.
    "options": {
        "podPlayStageParallelism": 32,
        "nodePlayStageParallelism": 16,
        "enableDebuggingHandlers": True,
        "enableProfilingHandler": False,
    },
}


class _LiteralDumper(yaml.SafeDumper):
    """Writes multi-line strings (templates, jq programs) as literal blocks, so the file stays readable."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _represent_str)


def unestablished(listing: Any) -> list[str]:
    """Names of the CustomResourceDefinitions in `listing` (a `kubectl get -o json` answer: one object
    or a List) that are not Established yet; a CRD whose status has no conditions yet is not."""
    items = listing.get("items") if listing.get("kind") == "List" else [listing]
    waiting = []
    for crd in items or ():
        conditions = (crd.get("status") or {}).get("conditions") or []
        if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            waiting.append(str((crd.get("metadata") or {}).get("name")))
    return waiting


def wait_crds_established(kubectl: Sequence[str], targets: Sequence[str], *, within: float = 60.0) -> None:
    """Poll `kubectl get <targets>` until every CRD is Established (ControlPlaneError after `within`).

    Not `kubectl wait --for=condition=Established`: right after a CRD is created its status has no
    conditions yet, and kubectl wait then fails at once ("accessor error: <nil> is of the type <nil>",
    kubernetes/kubernetes#66439) instead of waiting, which made fresh clusters fail now and then.
    """
    deadline = time.monotonic() + within
    waiting: list[str] = []
    while True:
        done = subprocess.run(
            [*kubectl, "get", *targets, "-o", "json"], capture_output=True, text=True, timeout=30, check=False
        )
        if done.returncode == 0:
            waiting = unestablished(json.loads(done.stdout or "{}"))
            if not waiting:
                return
        else:
            waiting = [done.stderr.strip() or f"kubectl get exited {done.returncode}"]
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"CustomResourceDefinitions not established after {within:g}s: {waiting}")
        time.sleep(0.2)
