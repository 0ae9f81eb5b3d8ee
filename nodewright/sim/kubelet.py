"""The simulator's kubelet for opted-in nodes: it really runs their pods' containers as local processes.

kwok plays every pod's lifecycle from templates; for nodes labelled `sim.nodewright.io/real-packages=true`
this process does what a kubelet does instead, so package pods execute their real steps:

- **Which nodes.** It lists and watches nodes with that label. kwok is started with
  `--manage-nodes-with-label-selector=sim.nodewright.io/real-packages!=true`, so it does not manage those
  nodes or play their pods (simulated nodes post no heartbeats, so kwok has nothing else to do for them).
  For each opted-in node this kubelet "registers": it publishes an `InternalDNS` address `localhost` and
  the kwok server's port as `daemonEndpoints.kubeletEndpoint`, so the API server's `pods/log` requests for
  its pods reach kwok's kubelet server (kube-apiserver prefers InternalDNS over Hostname, see
  `nodewright.sim.controlplane`); it initialises a node without a Ready condition; and it boots the node's
  host root (`nodewright.sim.kubelet_host`). Removing the label gives the node back to kwok (pods then
  running here are abandoned: switch nodes while they are idle).
- **Pods.** Per node, a list and watch of the pods bound to it (`spec.nodeName`), like a kubelet's. A
  pod's containers run as `nodewright.sim.kubelet_spec` describes (images mapped to package directories,
  to OCI image layouts, unpacked once per manifest digest like a pull, or to our agent; mounts mapped
  into the node's host root and a per-pod directory; env resolved). Init containers run one after
  another, then the main containers together; the `pause` container "runs" without a process. Each
  start, exit, restart and failure is reported as the kubelet reports it
  (`nodewright.sim.kubelet_status`), with one status patch per transition. A container gets at most
  `--container-timeout` seconds (then SIGTERM and SIGKILL, exit code from the signal, a message saying
  why); `activeDeadlineSeconds` is honoured. A node that is not Ready (rebooting) starts nothing.
- **Deletion.** On a deletion timestamp: SIGTERM to each running container's main process, SIGKILL to its
  process tree after `deletionGracePeriodSeconds`, the final container states reported, then the pod is
  deleted with grace period 0 (uid precondition), as the kubelet does. A pod that disappears (force
  deletion) has its processes killed at once.
- **Logs.** Each container run's output goes to a CRI-format file in the pod's directory. kwok serves
  `kubectl logs` from the `Logs` objects (kwok.x-k8s.io/v1alpha1, `--enable-crds=Logs`) this kubelet
  creates per pod (named like the pod, owned by it, so the garbage collector removes them), one entry per
  container pointing at its current file (`previousLogsFile` after a restart).
- **Host commands and reboots.** Every container's PATH starts with stand-ins for `reboot`, `sysctl`,
  `systemctl`, `modprobe`, ... that act on the node's host root (`nodewright.hostroot.hostshims`). Our agent,
  running without chroot here (`NODEWRIGHT_AGENT_CHROOT=false`), does not run its interrupt commands but
  appends them to `<root><ROOT_DIR>/interrupts/requested.jsonl`; when a container exits, the node runs
  the commands it appended, through the same stand-ins, before anything else starts. A reboot (from
  either path) by an interrupt-stage package pod is handed to the simulator's rebooter as kwok's stages
  do: the pod's processes are stopped, the pod gets the condition `sim.nodewright.io/RebootPending=True`,
  and the rebooter takes the node NotReady, gives it a new bootID and finishes the pod. This kubelet then
  leaves that pod's status alone and boots the host root with the new bootID, and reports the kernel the
  boot started (the boot loader's default, `nodewright.hostroot.boot`) as the node's
  `status.nodeInfo.kernelVersion`, as a kubelet reports the kernel it runs on. A reboot asked for by any
  other pod is refused: the requesting processes are killed (reported as failures). Every container also
  gets `NODEWRIGHT_HOST_TOOLS`, the directory of the node's stand-ins, for package steps that run a
  node's package manager against the directory standing for it.
- **Restarts of this process.** Everything is rebuilt from the API: a terminal pod is not run again, a
  pod handed to the rebooter stays with it, a pod in progress continues with its next container, and a
  container reported running whose process is gone (it died with the old kubelet, which shares its
  process group) is reported terminated with 137 `ContainerStatusUnknown`, so the pod fails.

State on disk, under `--dir` (the simulator's directory): `roots/<node>/` (host roots),
`kubelet/nodes/<node>/` (stand-ins, reboot request), `kubelet/pods/<ns>_<pod>_<uid>/` (volumes, image
payload copies, logs, scratch; removed with the pod), `kubelet/images/<manifest digest>/` (payloads
unpacked from OCI image layouts), `registry/` (a directory registry tests may fill).

Run as `python -m nodewright.sim.kubelet --kubeconfig K --dir D [--kwok-port P] [--image-dir D]...
[--agent-image REF]... [--container-timeout S] [--ready-file F]`; it exits cleanly on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import ipaddress
import logging
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp

from nodewright.api import constants
from nodewright.hostroot import boot, hostshims
from nodewright.packaging import oci
from nodewright.plan.podspec import parse_duration_seconds
from nodewright.sim import fleet, kubelet_host, kubelet_spec, kubelet_status
from nodewright.sim.kubeapi import JSON, ApiError, KubeClient
from nodewright.sim.kubelet_spec import REAL_PACKAGES_LABEL, ContainerConfigError, ImageKind, ImageNotFound
from nodewright.sim.kubelet_status import ContainerRecord, Restart, Start

log = logging.getLogger("nodewright.sim.kubelet")

SOURCE_ROOT: Final = Path(__file__).resolve().parents[2]
REPO_PACKAGES: Final = SOURCE_ROOT / "packages"
REBOOT_CONDITION: Final = "sim.nodewright.io/RebootPending"
KUBELET_ADDRESS: Final = {"type": "InternalDNS", "address": "localhost"}
LOGS_API: Final = "/apis/kwok.x-k8s.io/v1alpha1"
INTERRUPT_STAGES: Final = ("interrupt", "uninstall-interrupt")
DEFAULT_CONTAINER_TIMEOUT_S: Final = 600.0
DEFAULT_GRACE_S: Final = 30.0
REBOOT_STOP_GRACE_S: Final = 5.0
TIMEOUT_STOP_GRACE_S: Final = 5.0
REBOOT_POLL_S: Final = 0.25
PULL_BACKOFF_NOTICE_S: Final = 5.0
PIPE_DRAIN_S: Final = 2.0
EXIT_POLL_S: Final = 0.1
DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
API_RETRY_DELAYS_S: Final = (0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0)
KUBELET_MARKER: Final = "NODEWRIGHT_SIM_KUBELET"
HOST_TOOLS_ENV: Final = "NODEWRIGHT_HOST_TOOLS"
CONTAINER_MARKER: Final = "NODEWRIGHT_SIM_CONTAINER"
LOST_MESSAGE: Final = (
    "the simulated kubelet restarted while this container ran; its process is gone (as after a kubelet "
    "or node restart)"
)


@dataclass(frozen=True)
class KubeletConfig:
    directory: Path
    kwok_port: int | None = None
    image_dirs: tuple[Path, ...] = ()
    agent_images: frozenset[str] = frozenset()
    container_timeout_s: float = DEFAULT_CONTAINER_TIMEOUT_S
    python: str = sys.executable

    @property
    def registries(self) -> tuple[Path, ...]:
        return (self.registry, *self.image_dirs, REPO_PACKAGES)

    @property
    def registry(self) -> Path:
        """The simulator's own directory registry (tests drop package directories here)."""
        return self.directory / "registry"

    @property
    def image_store(self) -> Path:
        """Payloads unpacked from OCI image layouts, one directory per manifest digest."""
        return self.directory / "kubelet" / "images"

    def node_root(self, node: str) -> Path:
        return self.directory / "roots" / node

    def node_state(self, node: str) -> Path:
        return self.directory / "kubelet" / "nodes" / node

    def pod_dir(self, namespace: str, name: str, uid: str) -> Path:
        return self.directory / "kubelet" / "pods" / f"{namespace}_{name}_{uid}"


def _now() -> str:
    return kubelet_host.rfc3339()


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _seconds_since(stamp: str) -> float:
    try:
        then = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return 0.0
    return max(0.0, (dt.datetime.now(dt.UTC) - then).total_seconds())


def _exit_code(returncode: int) -> int:
    """A process killed by signal N exits, as a container, with 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _node_ready(node: JSON) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def _internal_ip(node: JSON) -> str:
    for address in (node.get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address.get("address"))
    return "127.0.0.1"


async def list_and_watch(
    client: KubeClient,
    path: str,
    params: dict[str, str],
    *,
    on_list: Callable[[list[JSON]], Awaitable[None]],
    on_event: Callable[[str, JSON], Awaitable[None]],
    what: str,
) -> None:
    """List, then watch from the list's resourceVersion; relist on an ERROR event (410 Gone) or any
    failure (1 s pause), forever. Handlers run in order, one event at a time."""
    while True:
        try:
            listed = await client.list_all(path, params=params)
            await on_list(listed["items"])
            rv = listed["resourceVersion"]
            while True:
                expired = False
                async for event in client.watch(path, resource_version=rv, params=params):
                    kind, obj = event.get("type", ""), event.get("object") or {}
                    if kind == "ERROR":
                        log.info("%s: watch error %s; relisting", what, obj.get("message", obj))
                        expired = True
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        await on_event(kind, obj)
                if expired:
                    break
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the simulator must outlive API-server restarts
            log.warning("%s: list/watch failed (%r); retrying in 1s", what, err)
            await asyncio.sleep(1)


async def with_retries(call: Callable[[], Awaitable[JSON]], *, what: str) -> JSON:
    """One API write, retried on 5xx/429 answers and connection failures (an API-server restart takes a
    few seconds); other answers are raised at once."""
    for delay in (*API_RETRY_DELAYS_S, None):
        try:
            return await call()
        except ApiError as err:
            if err.status < 500 and err.status != 429:
                raise
            problem: object = err
        except (OSError, TimeoutError, aiohttp.ClientError) as err:
            problem = err
        if delay is None:
            raise RuntimeError(f"{what}: giving up after {len(API_RETRY_DELAYS_S) + 1} attempts: {problem!r}")
        log.info("%s failed (%r); retrying in %gs", what, problem, delay)
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------------------------------
# One container process


@dataclass
class RunningContainer:
    index: int
    process: asyncio.subprocess.Process
    log: kubelet_host.CriLog
    started: float  # monotonic
    deadline: float  # monotonic: the container timeout
    requests: Path  # where an unprivileged agent records the host commands it did not run
    requests_offset: int  # that file's size when the container started
    marker: str  # CONTAINER_MARKER's value in its processes' environment
    stop_message: str = ""
    finished: asyncio.Task[int] | None = None

    async def watch(self, wake: asyncio.Event) -> int:
        """Pump both streams into the log until the process exits; returns its exit code. A container
        ends with its main process: whatever it left running is killed, output still buffered is drained
        for a moment, and a leftover that held the pipes open does not keep the container running.
        (asyncio's `Process.wait()` waits for the pipes too, so the exit is watched by its return code.)"""
        assert self.process.stdout is not None and self.process.stderr is not None
        pumps = asyncio.ensure_future(
            asyncio.gather(
                self._pump("stdout", self.process.stdout), self._pump("stderr", self.process.stderr)
            )
        )
        try:
            while self.process.returncode is None:
                if pumps.done():
                    await asyncio.sleep(EXIT_POLL_S)
                else:
                    await asyncio.wait({pumps}, timeout=EXIT_POLL_S)
            code = _exit_code(self.process.returncode)
            await asyncio.to_thread(kubelet_host.kill_marked, CONTAINER_MARKER, self.marker)
            try:
                await asyncio.wait_for(asyncio.shield(pumps), PIPE_DRAIN_S)
            except TimeoutError:
                pumps.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pumps
            return code
        finally:
            if not pumps.done():
                pumps.cancel()
            pumps.add_done_callback(_consume)  # an abandoned pump's outcome is of no interest
            wake.set()

    async def _pump(self, stream: str, reader: asyncio.StreamReader) -> None:
        while chunk := await reader.read(64 * 1024):
            self.log.write(stream, chunk)
        self.log.close_stream(stream)

    def alive(self) -> bool:
        return self.process.returncode is None

    def terminate(self) -> None:
        kubelet_host.signal_process(self.process.pid, signal.SIGTERM)

    def kill(self) -> None:
        kubelet_host.kill_tree(self.process.pid)
        kubelet_host.kill_marked(CONTAINER_MARKER, self.marker)


# ----------------------------------------------------------------------------------------------------
# One pod


class PodWorker:
    """Runs one pod on one node, from its first container to its deletion."""

    def __init__(self, node: NodeAgent, pod: JSON) -> None:
        meta = pod["metadata"]
        self.node = node
        self.pod = pod
        self.uid: str = meta["uid"]
        self.name: str = meta["name"]
        self.namespace: str = meta.get("namespace", "default")
        self.config = node.config
        self.dir = self.config.pod_dir(self.namespace, self.name, self.uid)
        self.wake = asyncio.Event()
        self.deleting = False
        self.gone = False
        self.handed_off = False
        self.deadline_exceeded = False
        self.volumes_ready = False
        self.records: list[ContainerRecord] = []
        self.running: dict[int, RunningContainer] = {}
        self.retry_at: dict[int, float] = {}
        self.failures: dict[int, int] = {}
        self.last_status: JSON | None = None
        self.start_time = ""
        self.pod_ip = ""
        self.task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ identity
    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"

    @property
    def spec(self) -> JSON:
        spec: JSON = self.pod.get("spec") or {}
        return spec

    def containers(self) -> list[JSON]:
        return [*(self.spec.get("initContainers") or []), *(self.spec.get("containers") or [])]

    def is_interrupt_pod(self) -> bool:
        labels = self.pod["metadata"].get("labels") or {}
        return (
            labels.get(constants.POD_OWNER_LABEL) == constants.POD_OWNER_VALUE
            and labels.get(constants.POD_LABEL_STAGE) in INTERRUPT_STAGES
        )

    def has_processes(self) -> bool:
        return any(rc.alive() for rc in self.running.values())

    # ------------------------------------------------------------------ events from the node
    def start(self) -> None:
        self.task = asyncio.create_task(self._main(), name=f"pod-{self.namespace}/{self.name}")

    def update(self, pod: JSON) -> None:
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp") and not self.deleting:
            self.deleting = True
        self.wake.set()

    def vanished(self) -> None:
        self.gone = True
        self.deleting = True
        self.wake.set()

    # ------------------------------------------------------------------ lifecycle
    async def _main(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            self._kill_all()
            raise
        except Exception:
            log.exception("pod %s/%s: the simulated kubelet failed to run it", self.namespace, self.name)
            self._kill_all()
        finally:
            for rc in self.running.values():
                if rc.finished is not None:
                    rc.finished.cancel()
                rc.log.close()
            self.node.forget(self)

    async def _run(self) -> None:
        virtual = self._virtual_containers()
        status = self.pod.get("status") or {}
        if kubelet_status.started_before(self.pod):
            self.records = kubelet_status.records_from_status(
                self.pod, now=_now(), virtual=virtual, lost_message=LOST_MESSAGE
            )
            self.start_time = str(status.get("startTime"))
            self.pod_ip = str(status.get("podIP") or "")
            self.handed_off = status.get("phase") == "Pending" and any(
                c.get("type") == REBOOT_CONDITION and c.get("status") == "True"
                for c in status.get("conditions") or []
            )
        else:
            self.records = kubelet_status.initial_records(self.pod, virtual=virtual)
        if not self.pod_ip:
            self.pod_ip = self.node.allocate_ip(self)
        self.node.claim_ip(self.pod_ip, self)
        phase = kubelet_status.pod_phase(kubelet_status.restart_policy(self.pod), self.records)
        if kubelet_status.started_before(self.pod) and not self.deleting:
            await self._publish()  # what a restart changed (lost containers); a no-op for the others
        if not self.deleting and not self.handed_off and not kubelet_status.is_terminal(phase):
            await self._wait_until_node_ready()
            if not self.deleting:
                self.start_time = self.start_time or _now()
                await self._setup()
                await self._lifecycle()
        while not self.deleting:
            self.wake.clear()
            await self.wake.wait()
        await self._terminate()

    def is_simulated_workload(self) -> bool:
        """A workload pod of the simulator (`fleet.create_workloads`): played, not run, as kwok plays it
        on the other nodes (Running and Ready at once, then Succeeded or Failed at its finish time)."""
        return fleet.WORKLOAD_JOB_LABEL in (self.pod["metadata"].get("labels") or {})

    def _workload_finish(self) -> float | None:
        """Monotonic time at which a simulated workload ends (None: it runs until deleted)."""
        annotations = self.pod["metadata"].get("annotations") or {}
        finish_at = annotations.get(fleet.FINISH_AT_ANNOTATION)
        run_for = annotations.get(fleet.RUN_FOR_ANNOTATION)
        try:
            if finish_at:
                end = dt.datetime.fromisoformat(str(finish_at).replace("Z", "+00:00"))
                return time.monotonic() + (end - dt.datetime.now(dt.UTC)).total_seconds()
            if run_for:
                return (
                    time.monotonic() + parse_duration_seconds(str(run_for)) - _seconds_since(self.start_time)
                )
        except ValueError:
            log.warning(
                "pod %s/%s: unreadable finish annotation, runs until deleted", self.namespace, self.name
            )
        return None

    def _finish_workload(self) -> None:
        annotations = self.pod["metadata"].get("annotations") or {}
        code = 1 if annotations.get(fleet.RESULT_ANNOTATION) == "fail" else 0
        now = _now()
        self.records = [
            r.exited(code, now) if r.running_since and r.terminated is None else r for r in self.records
        ]

    def _virtual_containers(self) -> frozenset[str]:
        if self.is_simulated_workload():
            return frozenset(str(c.get("name")) for c in self.containers())
        names = set()
        for container in self.spec.get("containers") or []:
            try:
                image = kubelet_spec.parse_image(str(container.get("image", "")))
            except ValueError:
                continue
            if image.name == kubelet_spec.PAUSE_NAME:
                names.add(container["name"])
        return frozenset(names)

    async def _wait_until_node_ready(self) -> None:
        while not self.node.ready and not self.deleting:
            self.wake.clear()
            await self.wake.wait()

    async def _setup(self) -> None:
        """The pod's directory, an empty log file per container (so `kubectl logs` works at once) and its
        kwok Logs object; volumes are materialised when the first container starts."""
        for record in self.records:
            self._log_path(record.name, record.restart_count).parent.mkdir(parents=True, exist_ok=True)
            self._log_path(record.name, record.restart_count).touch()
        await self._publish_logs()

    async def _lifecycle(self) -> None:
        policy = kubelet_status.restart_policy(self.pod)
        active_deadline = self.spec.get("activeDeadlineSeconds")
        deadline = None
        if active_deadline:  # counted from the pod's start time, also across kubelet restarts
            deadline = time.monotonic() + float(active_deadline) - _seconds_since(self.start_time)
        finish = self._workload_finish() if self.is_simulated_workload() else None
        while not self.deleting and not self.handed_off:
            self.wake.clear()
            if finish is not None and time.monotonic() >= finish:
                self._finish_workload()
                finish = None
            for rc in self._collect_exits():
                await self._run_host_requests(rc)
            if self.handed_off:
                return
            if deadline is not None and time.monotonic() >= deadline and not self.deadline_exceeded:
                self.deadline_exceeded = True
                await self._stop_all(TIMEOUT_STOP_GRACE_S, "the pod exceeded its activeDeadlineSeconds")
                self._collect_exits()
            await self._enforce_timeouts()
            if self.deadline_exceeded or kubelet_status.is_terminal(
                kubelet_status.pod_phase(policy, self.records)
            ):
                await self._publish()
                return
            if self.node.ready:
                for action in kubelet_status.next_actions(policy, self.records):
                    await self._act(action)
            await self._publish()
            await self._sleep_until_next(deadline if finish is None else min(deadline or finish, finish))

    async def _act(self, action: Start | Restart) -> None:
        now = time.monotonic()
        if isinstance(action, Restart):
            record = self.records[action.index]
            if action.index not in self.retry_at:
                self.retry_at[action.index] = now + action.delay_s
                self.records[action.index] = record.restarting()
                await self._publish_logs()
            return
        if self.retry_at.get(action.index, 0.0) > now or action.index in self.running:
            return
        await self._start(action.index)

    async def _sleep_until_next(self, active_deadline: float | None) -> None:
        wakeups = list(self.retry_at.values())
        wakeups += [rc.deadline for rc in self.running.values() if rc.alive()]
        if active_deadline is not None:
            wakeups.append(active_deadline)
        timeout = max(0.05, min(wakeups) - time.monotonic()) if wakeups else None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)

    # ------------------------------------------------------------------ containers
    def _container(self, index: int) -> JSON:
        return self.containers()[index]

    def _log_path(self, container: str, run: int) -> Path:
        return self.dir / "logs" / container / f"{run}.log"

    async def _start(self, index: int) -> None:
        record = self.records[index]
        container = self._container(index)
        now = _now()
        if record.virtual:
            self.records[index] = record.started(now, f"sim://{uuid.uuid4().hex}")
            return
        self.retry_at.pop(index, None)
        try:
            image = kubelet_spec.resolve_image(
                str(container.get("image", "")),
                agent_images=self.config.agent_images,
                registries=self.config.registries,
                is_dir=Path.is_dir,
                is_layout=_is_layout,
            )
            if image.kind is ImageKind.LAYOUT:
                image = await asyncio.to_thread(pull_layout, self.config.image_store, image)
        except ImageNotFound as err:
            self._retry_later(index, "ErrImagePull", str(err))
            return
        except (oci.BuildError, OSError) as err:  # a layout that cannot be unpacked: the pull failed
            self._retry_later(index, "ErrImagePull", f"image {container.get('image')!r}: {err}")
            return
        try:
            spec = await self._prepare(index, container, image)
        except ContainerConfigError as err:
            self._retry_later(index, err.reason, err.message)
            return
        except OSError as err:
            self._retry_later(index, "CreateContainerError", f"preparing the container failed: {err}")
            return
        self.failures.pop(index, None)
        requests = self.node.root / _agent_state_dir(spec.env).lstrip("/") / "interrupts" / "requested.jsonl"
        cri = kubelet_host.CriLog(self._log_path(record.name, record.restart_count))
        container_id = f"sim://{uuid.uuid4().hex}"
        marker = container_id.removeprefix("sim://")
        env = {**spec.env, KUBELET_MARKER: str(self.config.directory), CONTAINER_MARKER: marker}
        try:
            process = await asyncio.create_subprocess_exec(
                *spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=spec.cwd,
                env=env,
            )
        except OSError as err:
            cri.close()
            started = record.started(now, container_id)
            self.records[index] = started.exited(128, _now(), reason="StartError", message=f"exec: {err}")
            log.info(
                "pod %s/%s: container %s could not start: %s", self.namespace, self.name, record.name, err
            )
            return
        started_at = time.monotonic()
        rc = RunningContainer(
            index=index,
            process=process,
            log=cri,
            started=started_at,
            deadline=started_at + self.config.container_timeout_s,
            requests=requests,
            requests_offset=_size(requests),
            marker=marker,
        )
        rc.finished = asyncio.create_task(rc.watch(self.wake), name=f"container-{self.name}-{record.name}")
        self.running[index] = rc
        self.records[index] = record.started(now, container_id)
        log.info("pod %s/%s: started %s (pid %d)", self.namespace, self.name, record.name, process.pid)

    def _retry_later(self, index: int, reason: str, message: str) -> None:
        """A start that failed before any process existed: waiting with the kubelet's reason, retried
        with the kubelet's back-off (an image pull error turns into ImagePullBackOff)."""
        count = self.failures.get(index, 0)
        self.failures[index] = count + 1
        if reason == "ErrImagePull" and count > 0:
            reason = "ImagePullBackOff"
        self.records[index] = self.records[index].waiting(reason, message)
        delay = kubelet_status.restart_delay(count)
        if reason == "ErrImagePull":
            delay = PULL_BACKOFF_NOTICE_S  # shows ErrImagePull, then ImagePullBackOff, like a kubelet
        self.retry_at[index] = time.monotonic() + delay
        if count == 0:
            log.info(
                "pod %s/%s: %s %s: %s", self.namespace, self.name, self.records[index].name, reason, message
            )

    async def _prepare(
        self, index: int, container: JSON, image: kubelet_spec.ResolvedImage
    ) -> kubelet_spec.ProcessSpec:
        """Volumes, payload copy, environment and argv for one container start."""
        facts = kubelet_spec.PodFacts(
            pod=self.pod,
            host_ip=self.node.host_ip,
            pod_ip=self.pod_ip,
            node_allocatable=(self.node.node.get("status") or {}).get("allocatable") or {},
        )
        objects = await self._fetch_objects()
        volumes = kubelet_spec.volume_sources(self.pod)
        if not self.volumes_ready:  # once per pod, as the kubelet mounts volumes before any container
            await asyncio.to_thread(self._materialise_volumes, volumes, objects)
            self.volumes_ready = True
        name = container["name"]
        view = str(self.dir / "images" / name) if image.kind is ImageKind.DIRECTORY else None
        mounts = kubelet_spec.container_mounts(
            container,
            volumes,
            node_root=str(self.node.root),
            volume_dir=lambda vname: str(self.dir / "volumes" / vname),
            payload_view=view,
        )
        if view is not None and image.directory is not None:
            await asyncio.to_thread(_build_payload_view, image.directory, Path(view), mounts.nested)
        env = kubelet_spec.container_env(container, facts, objects)
        spec = kubelet_spec.process_spec(
            container,
            image=image,
            env=env,
            mounts=mounts.mounts,
            agent_command=(self.config.python, "-m", "nodewright.agent"),
        )
        home = self.dir / "home" / name
        home.mkdir(parents=True, exist_ok=True)
        base = {
            "PATH": f"{self.node.bin_dir}:{os.environ.get('PATH', DEFAULT_PATH)}",
            # The node's commands for package steps that run a host's tools against the directory
            # standing for it (docs/packages.md, "Commands that change this machine").
            HOST_TOOLS_ENV: str(self.node.bin_dir),
            "HOSTNAME": self.node.name if self.spec.get("hostNetwork") else self.name,
            "HOME": str(home),
        }
        if image.kind is ImageKind.AGENT:
            base.update(
                PYTHONPATH=str(SOURCE_ROOT),
                PYTHONDONTWRITEBYTECODE="1",
                PYTHONUNBUFFERED="1",
                NODEWRIGHT_AGENT_CHROOT="false",
            )
        return dataclasses.replace(spec, env={**base, **spec.env}, cwd=spec.cwd or str(home))

    async def _fetch_objects(self) -> dict[kubelet_spec.ObjectKey, JSON | None]:
        objects: dict[kubelet_spec.ObjectKey, JSON | None] = {}
        for kind, name in sorted(kubelet_spec.referenced_objects(self.pod)):
            plural = "configmaps" if kind == "ConfigMap" else "secrets"
            try:
                objects[(kind, name)] = await self.node.client.get(
                    f"/api/v1/namespaces/{self.namespace}/{plural}/{name}"
                )
            except ApiError as err:
                if err.status != 404:
                    raise ContainerConfigError(f"reading {kind} {name!r} failed: HTTP {err.status}") from None
                objects[(kind, name)] = None
        return objects

    def _materialise_volumes(
        self,
        volumes: dict[str, kubelet_spec.VolumeSource],
        objects: dict[kubelet_spec.ObjectKey, JSON | None],
    ) -> None:
        for vname, source in volumes.items():
            if isinstance(source, kubelet_spec.HostPathVolume):
                _prepare_host_path(self.node.root, source, vname)
                continue
            target = self.dir / "volumes" / vname
            if isinstance(source, kubelet_spec.EmptyDirVolume):
                target.mkdir(parents=True, exist_ok=True)
                continue
            files = kubelet_spec.object_volume_files(
                source, objects.get((source.kind, source.name)), volume_name=vname
            )
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True, exist_ok=True)
            for relative, (content, mode) in files.items():
                path = target / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
                os.chmod(path, mode & 0o777)

    def _collect_exits(self) -> list[RunningContainer]:
        """Record the exits of containers whose process ended; returns them."""
        finished = []
        for index, rc in list(self.running.items()):
            if rc.finished is None or not rc.finished.done():
                continue
            del self.running[index]
            rc.log.close()
            try:
                code = rc.finished.result()
            except Exception as err:  # a broken pipe or similar: the container's outcome is unknown
                log.warning("pod %s/%s: lost track of a container: %r", self.namespace, self.name, err)
                code = kubelet_status.LOST_EXIT_CODE
            message = rc.stop_message
            container = self._container(index)
            if (
                not message
                and code != 0
                and container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
            ):
                message = rc.log.tail()
            record = self.records[index]
            self.records[index] = record.exited(code, _now(), message=message)
            log.info("pod %s/%s: %s exited with %d", self.namespace, self.name, record.name, code)
            finished.append(rc)
        return finished

    async def _run_host_requests(self, rc: RunningContainer) -> None:
        """What the node itself does for commands an unprivileged agent recorded instead of running
        (its interrupts): a reboot is handed to the rebooter, the rest run through the stand-ins."""
        commands = await asyncio.to_thread(hostshims.recorded_commands, rc.requests, rc.requests_offset)
        for argv in commands:
            program, args = os.path.basename(argv[0]), argv[1:]
            if hostshims.is_reboot(program, args):
                if self.is_interrupt_pod():
                    await self.hand_off_reboot()
                    return
                log.warning(
                    "pod %s/%s: ignoring a recorded %s outside an interrupt pod",
                    self.namespace,
                    self.name,
                    program,
                )
                continue
            log.info(
                "node %s: running %s for pod %s/%s", self.node.name, " ".join(argv), self.namespace, self.name
            )
            await asyncio.to_thread(
                hostshims.main, program, args, root=str(self.node.root), state=str(self.node.state)
            )

    async def _enforce_timeouts(self) -> None:
        now = time.monotonic()
        late = [
            rc for rc in self.running.values() if rc.alive() and now >= rc.deadline and not rc.stop_message
        ]
        for rc in late:
            rc.stop_message = (
                f"stopped by the simulated kubelet after {self.config.container_timeout_s:g}s "
                "(its --container-timeout)"
            )
        if late:
            await self._stop(late, TIMEOUT_STOP_GRACE_S)
            self._collect_exits()

    async def _stop(self, containers: list[RunningContainer], grace_s: float) -> None:
        """SIGTERM each main process; SIGKILL the process trees still there after `grace_s`."""
        for rc in containers:
            rc.terminate()
        waits = [rc.finished for rc in containers if rc.finished is not None]
        if waits:
            _done, pending = await asyncio.wait(waits, timeout=max(0.0, grace_s))
            if pending:
                for rc in containers:
                    if rc.alive():
                        rc.kill()
                await asyncio.wait(pending, timeout=10)
        for rc in containers:
            if rc.alive():  # a process that survives SIGKILL for 10 s is beyond saving; kill the tree again
                rc.kill()

    async def _stop_all(self, grace_s: float, message: str) -> None:
        alive = [rc for rc in self.running.values() if rc.alive()]
        for rc in alive:
            rc.stop_message = rc.stop_message or message
        await self._stop(alive, grace_s)

    def _kill_all(self) -> None:
        for rc in self.running.values():
            if rc.alive():
                rc.kill()

    # ------------------------------------------------------------------ reboot and deletion
    async def hand_off_reboot(self) -> None:
        """The node goes down for this interrupt pod: stop its processes and let the rebooter finish it."""
        self.handed_off = True
        self.wake.set()
        await self._stop_all(REBOOT_STOP_GRACE_S, "the node rebooted")
        for rc in self.running.values():
            rc.log.close()
        self.running.clear()
        condition = {
            "type": REBOOT_CONDITION,
            "status": "True",
            "reason": "RebootRequested",
            "message": "the interrupt rebooted the node; the simulator's rebooter takes it down",
            "lastTransitionTime": _now(),
        }
        log.info("pod %s/%s: reboot requested; handing the pod to the rebooter", self.namespace, self.name)
        await self._patch_status({"conditions": [condition]})

    async def lose_processes(self, message: str) -> None:
        """A reboot this pod may not request: its running containers die with the node's processes."""
        await self._stop_all(0.0, message)
        self.wake.set()

    async def _terminate(self) -> None:
        if self.gone:
            self._kill_all()
        else:
            alive = [rc for rc in self.running.values() if rc.alive()]
            if alive and not self.handed_off:
                await self._stop(alive, self._grace_s())
                self._collect_exits()
                await self._publish()
            await self._delete()
        self._kill_all()
        for rc in self.running.values():
            rc.log.close()
        self.running.clear()
        await asyncio.to_thread(shutil.rmtree, self.dir, True)
        self.node.release_ip(self.pod_ip, self)

    def _grace_s(self) -> float:
        meta = self.pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        return float(grace)

    async def _delete(self) -> None:
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}}

        async def delete() -> JSON:
            await self.node.client.delete(self.path, body=body)
            return {}

        try:
            await with_retries(delete, what=f"deleting pod {self.namespace}/{self.name}")
        except ApiError as err:
            if err.status != 409:  # 409: the name now belongs to another pod
                raise

    # ------------------------------------------------------------------ API writes
    async def _publish(self) -> None:
        if self.handed_off or self.gone or self.node.kubelet.stopping:
            return
        previous = (self.last_status or self.pod.get("status") or {}).get("conditions") or []
        status = kubelet_status.pod_status(
            self.pod,
            self.records,
            now=_now(),
            start_time=self.start_time or _now(),
            host_ip=self.node.host_ip,
            pod_ip=self.pod_ip,
            previous_conditions=previous,
            deadline_exceeded=self.deadline_exceeded,
        )
        if status == self.last_status:
            return
        # Conditions the kubelet does not own (DisruptionTarget, the rebooter's) are kept, as its status
        # manager keeps them; the written status replaces the lists as a whole (JSON merge patch), so a
        # condition that turned True loses its old reason and message.
        ours = {c["type"] for c in status["conditions"]}
        others = [
            c for c in (self.pod.get("status") or {}).get("conditions") or [] if c.get("type") not in ours
        ]
        await self._patch_status({**status, "conditions": [*status["conditions"], *others]}, replace=True)
        self.last_status = status

    async def _patch_status(self, status: JSON, *, replace: bool = False) -> None:
        """Write the status (uid as precondition): `replace` sends a JSON merge patch, in which lists are
        replaced; otherwise a strategic merge patch, in which conditions merge by type."""
        if self.node.kubelet.stopping:  # a stopping kubelet reports nothing, as a killed one would not
            return
        body = {"metadata": {"uid": self.uid}, "status": status}
        client = self.node.client
        patch = client.merge_patch if replace else client.strategic_patch
        try:
            await with_retries(
                lambda: patch(self.path + "/status", body), what=f"status of pod {self.namespace}/{self.name}"
            )
        except ApiError as err:
            if err.status in (404, 409):  # gone, or the name belongs to a newer pod
                self.vanished()
                return
            raise

    async def _publish_logs(self) -> None:
        """Create or update the pod's kwok `Logs` object (one entry per container, current run)."""
        entries = []
        for record in self.records:
            entry: JSON = {
                "containers": [record.name],
                "logsFile": str(self._log_path(record.name, record.restart_count)),
            }
            if record.restart_count:
                entry["previousLogsFile"] = str(self._log_path(record.name, record.restart_count - 1))
            entries.append(entry)
        owner = {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid}
        body = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": {"name": self.name, "namespace": self.namespace, "ownerReferences": [owner]},
            "spec": {"logs": entries},
        }
        await self.node.kubelet.publish_logs(self.namespace, self.name, body)


def _agent_state_dir(env: Mapping[str, str]) -> str:
    """The agent's state directory on the host, as the agent reads it from its environment."""
    for name in ("NODEWRIGHT_ROOT_DIR", "SKYHOOK_ROOT_DIR"):
        if env.get(name):
            return str(env[name])
    return "/etc/skyhook"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _is_layout(path: Path) -> bool:
    return (path / oci.OCI_LAYOUT_FILE).is_file()


def pull_layout(store: Path, image: kubelet_spec.ResolvedImage) -> kubelet_spec.ResolvedImage:
    """The payload of an OCI layout's image (`nodewright package build`'s output), unpacked once per
    manifest digest into `store` as a runtime pulls an image once; raises oci.BuildError saying why not."""
    assert image.directory is not None and image.ref is not None
    ref = image.ref
    opened = oci.open_layout(
        image.directory,
        ref=None if ref.digest else ref.tag or None,
        digest=ref.digest or None,
        where=f"image layout {image.directory}",
    )
    assert opened.manifest_digest is not None
    payload = store / opened.manifest_digest.removeprefix("sha256:")
    if payload.is_dir():
        return kubelet_spec.ResolvedImage(ImageKind.DIRECTORY, payload)
    store.mkdir(parents=True, exist_ok=True)
    partial = store / f".{payload.name}.partial-{uuid.uuid4().hex}"
    try:
        oci.extract_payload(opened, partial)
        try:
            partial.rename(payload)
        except OSError:
            if not payload.is_dir():  # not another pod's pull of the same image that won the race
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log.info("pulled %s from %s into %s", opened.manifest_digest, image.directory, payload)
    return kubelet_spec.ResolvedImage(ImageKind.DIRECTORY, payload)


def _prepare_host_path(root: Path, source: kubelet_spec.HostPathVolume, name: str) -> None:
    path = root / source.path.lstrip("/")
    kind = source.type
    if kind in ("", "DirectoryOrCreate"):
        if not path.exists():
            path.mkdir(parents=True, exist_ok=True)
    elif kind == "FileOrCreate":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    elif kind == "Directory" and not path.is_dir():
        raise ContainerConfigError(
            f"volume {name!r}: hostPath type check failed: {source.path} is not a directory"
        )
    elif kind == "File" and not path.is_file():
        raise ContainerConfigError(
            f"volume {name!r}: hostPath type check failed: {source.path} is not a file"
        )
    elif kind in ("Socket", "CharDevice", "BlockDevice") and not path.exists():
        raise ContainerConfigError(
            f"volume {name!r}: hostPath type check failed: {source.path} does not exist"
        )


def _build_payload_view(image_dir: Path, view: Path, nested: tuple[kubelet_spec.NestedMount, ...]) -> None:
    """A fresh copy of the image payload with the volumes mounted inside it placed into it."""
    shutil.rmtree(view, ignore_errors=True)
    view.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(image_dir, view, symlinks=True)
    for mount in nested:
        target = view / mount.relative
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        source = Path(mount.host_path)
        if mount.copy:
            if source.is_dir():
                shutil.copytree(source, target, symlinks=True)
            else:
                target.mkdir()
        else:
            source.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)


# ----------------------------------------------------------------------------------------------------
# One node


class NodeAgent:
    """Everything this kubelet does for one opted-in node: registration, boot, its pods, reboots."""

    def __init__(self, kubelet: Kubelet, node: JSON) -> None:
        self.kubelet = kubelet
        self.client = kubelet.client
        self.config = kubelet.config
        self.node = node
        self.name: str = node["metadata"]["name"]
        self.root = self.config.node_root(self.name)
        self.state = self.config.node_state(self.name)
        self.bin_dir = self.state / "bin"
        self.workers: dict[str, PodWorker] = {}
        self.ips: dict[str, str] = {}
        self.boot_id = ""
        self.tasks: list[asyncio.Task[None]] = []

    @property
    def ready(self) -> bool:
        return _node_ready(self.node)

    @property
    def host_ip(self) -> str:
        return _internal_ip(self.node)

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.state / hostshims.REBOOT_REQUEST_FILE).unlink(missing_ok=True)
        await asyncio.to_thread(
            hostshims.install,
            self.bin_dir,
            python=self.config.python,
            source_root=str(SOURCE_ROOT),
            root=self.root,
            state=self.state,
        )
        await self._boot_if_new()
        await self._register()
        self.tasks = [
            asyncio.create_task(self._watch_pods(), name=f"pods-{self.name}"),
            asyncio.create_task(self._watch_reboot_requests(), name=f"reboots-{self.name}"),
        ]
        log.info("node %s: running its pods for real (host root %s)", self.name, self.root)

    async def update(self, node: JSON) -> None:
        was_ready = self.ready
        self.node = node
        await self._boot_if_new()
        await self._register()
        if self.ready != was_ready:
            for worker in list(self.workers.values()):
                worker.wake.set()

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        workers = list(self.workers.values())
        for worker in workers:
            if worker.task is not None:
                worker.task.cancel()
        for task in [*self.tasks, *(w.task for w in workers if w.task is not None)]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _boot_if_new(self) -> None:
        boot_id = str((self.node.get("status") or {}).get("nodeInfo", {}).get("bootID") or "")
        if boot_id == self.boot_id:
            return
        self.boot_id = boot_id
        if boot.recorded_boot_id(self.root) != boot_id:
            log.info("node %s: booting its host root (bootID %s)", self.name, boot_id)
            kernel = await asyncio.to_thread(kubelet_host.boot_node, self.root, self.node)
            await self._report_kernel(kernel)

    async def _report_kernel(self, kernel: str) -> None:
        """status.nodeInfo.kernelVersion is the kernel the node booted, as a kubelet reports uname -r."""
        info = (self.node.get("status") or {}).get("nodeInfo") or {}
        if not kernel or info.get("kernelVersion") == kernel:
            return
        try:
            self.node = await self.client.strategic_patch(
                f"/api/v1/nodes/{self.name}/status", {"status": {"nodeInfo": {"kernelVersion": kernel}}}
            )
            log.info("node %s: booted kernel %s (was %s)", self.name, kernel, info.get("kernelVersion"))
        except ApiError as err:
            log.warning("node %s: reporting kernel %s failed: %s", self.name, kernel, err)

    async def _register(self) -> None:
        status = self.node.get("status") or {}
        patch: JSON = {}
        addresses = status.get("addresses") or []
        if KUBELET_ADDRESS not in addresses:
            patch["addresses"] = [KUBELET_ADDRESS]
        port = self.config.kwok_port
        current = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
        if port is not None and current != port:
            patch["daemonEndpoints"] = {"kubeletEndpoint": {"Port": port}}
        if not any(c.get("type") == "Ready" for c in status.get("conditions") or []):
            now = _now()
            patch["conditions"] = [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ]
        if patch:
            try:
                self.node = await self.client.strategic_patch(
                    f"/api/v1/nodes/{self.name}/status", {"status": patch}
                )
            except ApiError as err:
                log.warning("node %s: registering failed: %s", self.name, err)

    # ------------------------------------------------------------------ pods
    async def _watch_pods(self) -> None:
        await list_and_watch(
            self.client,
            "/api/v1/pods",
            {"fieldSelector": f"spec.nodeName={self.name}"},
            on_list=self._on_pod_list,
            on_event=self._on_pod_event,
            what=f"pods on {self.name}",
        )

    async def _on_pod_list(self, pods: list[JSON]) -> None:
        listed = {p["metadata"]["uid"] for p in pods}
        for uid, worker in list(self.workers.items()):
            if uid not in listed:
                worker.vanished()
        for pod in pods:
            await self._on_pod_event("MODIFIED", pod)

    async def _on_pod_event(self, kind: str, pod: JSON) -> None:
        uid = pod["metadata"]["uid"]
        worker = self.workers.get(uid)
        if kind == "DELETED":
            if worker is not None:
                worker.vanished()
            return
        if worker is not None:
            worker.update(pod)
            return
        worker = PodWorker(self, pod)
        self.workers[uid] = worker
        worker.start()

    def forget(self, worker: PodWorker) -> None:
        if self.workers.get(worker.uid) is worker:
            del self.workers[worker.uid]
        self.release_ip(worker.pod_ip, worker)

    # ------------------------------------------------------------------ pod IPs
    def allocate_ip(self, worker: PodWorker) -> str:
        if worker.spec.get("hostNetwork"):
            return self.host_ip
        cidr = (self.node.get("spec") or {}).get("podCIDR")
        if not cidr:
            return self.host_ip
        for address in list(ipaddress.ip_network(cidr, strict=False).hosts())[1:]:
            if str(address) not in self.ips:
                return str(address)
        return self.host_ip

    def claim_ip(self, address: str, worker: PodWorker) -> None:
        if address and address != self.host_ip:
            self.ips[address] = worker.uid

    def release_ip(self, address: str, worker: PodWorker) -> None:
        if self.ips.get(address) == worker.uid:
            del self.ips[address]

    # ------------------------------------------------------------------ reboots
    async def _watch_reboot_requests(self) -> None:
        request = self.state / hostshims.REBOOT_REQUEST_FILE
        while True:
            await asyncio.sleep(REBOOT_POLL_S)
            if not request.exists():
                continue
            what = request.read_text(encoding="utf-8", errors="replace").strip()
            request.unlink(missing_ok=True)
            await self._reboot(what)

    async def _reboot(self, what: str) -> None:
        busy = [w for w in self.workers.values() if w.has_processes()]
        carriers = [w for w in busy if w.is_interrupt_pod()]
        log.info("node %s: `%s` asked for a reboot (pods with processes: %d)", self.name, what, len(busy))
        for worker in busy:
            if worker in carriers:
                await worker.hand_off_reboot()
            else:
                await worker.lose_processes(
                    f"`{what}` asked for a reboot outside an interrupt pod: the simulator reboots nodes only "
                    "for interrupt-stage package pods, so the requesting processes were killed"
                )


# ----------------------------------------------------------------------------------------------------
# The process


class Kubelet:
    def __init__(self, client: KubeClient, config: KubeletConfig) -> None:
        self.client = client
        self.config = config
        self.nodes: dict[str, NodeAgent] = {}
        self.stopping = False
        self._logs_api_missing = False

    def kill_leftovers(self) -> int:
        """Kill every process a kubelet of this simulator started (none may outlive the one that ran it)."""
        return kubelet_host.kill_marked(KUBELET_MARKER, str(self.config.directory))

    async def run(self, ready_file: Path | None) -> None:
        kubelet_spec.check_safe_directory(self.config.directory)
        leftovers = await asyncio.to_thread(self.kill_leftovers)
        if leftovers:
            log.info(
                "killed %d processes a previous kubelet left behind (their pods report them lost)", leftovers
            )
        self.config.registry.mkdir(parents=True, exist_ok=True)
        ready = False

        async def on_list(nodes: list[JSON]) -> None:
            nonlocal ready
            listed = {n["metadata"]["name"] for n in nodes}
            for name in list(self.nodes):
                if name not in listed:
                    await self._drop(name)
            for node in nodes:
                await self._on_node("MODIFIED", node)
            if ready_file is not None and not ready:
                await asyncio.to_thread(ready_file.write_text, "ready\n")
                ready = True

        await list_and_watch(
            self.client,
            "/api/v1/nodes",
            {"labelSelector": f"{REAL_PACKAGES_LABEL}=true"},
            on_list=on_list,
            on_event=self._on_node,
            what="opted-in nodes",
        )

    async def _on_node(self, kind: str, node: JSON) -> None:
        name = node["metadata"]["name"]
        if kind == "DELETED":
            await self._drop(name)
            return
        agent = self.nodes.get(name)
        if agent is not None:
            await agent.update(node)
            return
        agent = NodeAgent(self, node)
        self.nodes[name] = agent
        await agent.start()

    async def _drop(self, name: str) -> None:
        agent = self.nodes.pop(name, None)
        if agent is not None:
            log.info("node %s: no longer opted in (or deleted); stopping its pods' processes", name)
            await agent.stop()

    async def publish_logs(self, namespace: str, name: str, body: JSON) -> None:
        if self._logs_api_missing:
            return
        path = f"{LOGS_API}/namespaces/{namespace}/logs"
        try:
            if await self.client.create_or_exists(path, body):
                return
            current = await self.client.get(f"{path}/{name}")
            body = {
                **body,
                "metadata": {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
            }
            await self.client.request("PUT", f"{path}/{name}", body=body)
        except ApiError as err:
            if err.status == 404 and not self._logs_api_missing:
                self._logs_api_missing = True
                log.warning("kwok's Logs API (%s) is not installed: `kubectl logs` will not work", LOGS_API)
                return
            log.warning("pod %s/%s: publishing its log files to kwok failed: %s", namespace, name, err)

    async def close(self) -> None:
        for name in list(self.nodes):
            await self._drop(name)
        await asyncio.to_thread(self.kill_leftovers)
        await self.client.close()


async def main_async(config: KubeletConfig, args: argparse.Namespace) -> int:
    client = KubeClient(Path(args.kubeconfig), max_in_flight=16)
    kubelet = Kubelet(client, config)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal() -> None:
        kubelet.stopping = True
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    runner = asyncio.create_task(kubelet.run(Path(args.ready_file) if args.ready_file else None))
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
    runner.cancel()
    stopper.cancel()
    code = 0
    with contextlib.suppress(asyncio.CancelledError):
        try:
            await runner
        except Exception:
            log.exception("the simulated kubelet failed")
            code = 1
    await kubelet.close()
    log.info("simulated kubelet stopped")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nodewright.sim.kubelet", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--dir", required=True, help="the simulator's directory (roots/, kubelet/, images/)")
    parser.add_argument("--kwok-port", type=int, default=None, help="kwok's server port (serves pods/log)")
    parser.add_argument(
        "--image-dir",
        action="append",
        default=[],
        help="extra directory registry (package directories or OCI image layouts)",
    )
    parser.add_argument("--agent-image", action="append", default=[], help="image that runs our agent")
    parser.add_argument(
        "--container-timeout",
        type=float,
        default=DEFAULT_CONTAINER_TIMEOUT_S,
        help=f"seconds a container may run (default {DEFAULT_CONTAINER_TIMEOUT_S:g})",
    )
    parser.add_argument("--ready-file", default=None)
    args = parser.parse_args(argv)
    if args.container_timeout <= 0:
        parser.error("--container-timeout must be > 0")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    config = KubeletConfig(
        directory=Path(args.dir).resolve(),
        kwok_port=args.kwok_port,
        image_dirs=tuple(Path(d).resolve() for d in args.image_dir),
        agent_images=frozenset(args.agent_image),
        container_timeout_s=args.container_timeout,
    )
    try:
        kubelet_spec.check_safe_directory(config.directory)
    except ValueError as err:
        log.error("%s", err)
        return 2
    return asyncio.run(main_async(config, args))


if __name__ == "__main__":
    sys.exit(main())
