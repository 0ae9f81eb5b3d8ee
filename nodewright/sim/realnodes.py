"""The simulator's real nodes: boxes with a real kubelet and containerd, their network, and their reboots.

    python -m nodewright.sim.realnodes --dir DIR --ready-file FILE

Started by the control plane (`nodewright sim up --real-nodes K`) after kube-apiserver and the registry,
with `DIR/spec.json` written by it (`nodewright.sim.box.BoxesSpec`) and each node's disk provisioned. This
one process:

1. snapshots the machine's /proc/sys values (read only), the start of every box's own /proc/sys;
2. creates the lab network namespace and its forwarders (`nodewright.sim.boxnet`): the `kubernetes`
   Service address -> kube-apiserver, the lab gateway's registry port -> the local registry, and the
   HTTP CONNECT proxy on `DIR/egress.sock` that kube-apiserver's egress selector uses to reach kubelets
   and pods;
3. boots every box: `unshare` with new mount, PID, network, UTS and IPC namespaces runs `stage1.sh`,
   which waits until this process has joined the box's network namespace to the lab, then builds the
   node's root and executes the node's init (busybox init: its boot, then containerd and the kubelet);
4. supervises them. A box whose init ends by SIGHUP was rebooted (reboot(2) in a PID namespace ends its
   init that way, and busybox init's own reboot on SIGTERM ends in the same call): every process of the
   node is gone with its PID namespace, and the box boots again on the same disk with a new boot ID. A
   box powered off (SIGINT) stays off. A box that ended otherwise (a crash) boots again after a pause.
   When a box goes down its Node's Ready condition turns Unknown (`NodeStatusUnknown`, "Kubelet stopped
   posting node status"): what kube-controller-manager's node-lifecycle controller writes on a real
   cluster once a kubelet is silent. That controller cannot run here (the kwok nodes post no heartbeats),
   and a box reboots in seconds, well inside its grace period, so this process plays that one write; the
   kubelet sets Ready again when it is back.

SIGTERM (`sim down`) stops every box (its init is killed, the kernel kills the rest of its PID
namespace), removes the boxes' cgroups and exits; the lab namespace goes with this process. Every
`unshare` dies with this process (parent-death signal) and takes its box along (`--kill-child`), so a
SIGKILL leaves nothing running either; `nodewright.sim.controlplane` removes the cgroups then.

`DIR/status.json` records, per node, its boots and how the last one ended (for `sim status` and tests).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import datetime as dt
import errno
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from nodewright.sim import box, boxnet
from nodewright.sim.kubeapi import ApiError, KubeClient

log = logging.getLogger("nodewright.sim.realnodes")

STATUS_FILE: Final = "status.json"
EGRESS_SOCKET: Final = "egress.sock"
_BOOT_TIMEOUT_S: Final = 30.0
_CRASH_PAUSE_S: Final = 2.0
_API_TIMEOUT_S: Final = 10.0
_PR_SET_PDEATHSIG: Final = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:  # runs in the forked child before exec
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class BootError(RuntimeError):
    """A box could not be started (its first process, its network)."""


@dataclass
class NodeRecord:
    boots: int = 0
    state: str = "starting"
    last_end: str = ""
    since: str = ""


@dataclass
class Box:
    """One real node's box and its supervision."""

    spec: box.BoxesSpec
    node: box.NodeSpec
    lab: boxnet.Lab
    kubeconfig: Path
    record: NodeRecord = field(default_factory=NodeRecord)
    proc: asyncio.subprocess.Process | None = None
    stopping: bool = False

    @property
    def dir(self) -> Path:
        return self.spec.node_dir(self.node.name)

    async def supervise(self, changed: asyncio.Event) -> None:
        while not self.stopping:
            try:
                await self.boot()
            except BootError as err:
                log.error("%s: %s", self.node.name, err)
                self._set(state="failed", last_end=str(err), changed=changed)
                await self._kill()
                await asyncio.sleep(_CRASH_PAUSE_S)
                continue
            self._set(state="running", changed=changed)
            assert self.proc is not None
            code = await self.proc.wait()
            if self.stopping:
                break
            ended = _ending(code)
            log.info("%s: %s", self.node.name, ended)
            await self.report_down(ended)
            if ended == "poweroff":
                self._set(state="off", last_end=ended, changed=changed)
                return
            self._set(state="rebooting", last_end=ended, changed=changed)
            if ended != "reboot":
                await asyncio.sleep(_CRASH_PAUSE_S)

    async def boot(self) -> None:
        fifo = self.dir / "net.fifo"
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo, 0o600)
        console = (self.dir / "console.log").open("ab")
        console.write(f"--- boot {_now()}\n".encode())
        console.flush()
        self.proc = await asyncio.create_subprocess_exec(
            "unshare", "--mount", "--pid", "--net", "--uts", "--ipc", "--fork", "--propagation", "private",
            "--kill-child", "/bin/sh", str(box.stage1_script()), str(self.dir), self.spec.lowerdirs,
            str(self.spec.dir),
            stdin=asyncio.subprocess.DEVNULL, stdout=console, stderr=asyncio.subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
        console.close()
        self.record.boots += 1
        init_pid = await self._init_pid()
        try:
            await asyncio.to_thread(self.lab.attach, index=self.node.index, box_pid=init_pid)
        except OSError as err:
            raise BootError(f"joining the box to the lab network failed: {err}") from None
        await asyncio.to_thread(_signal_fifo, fifo)

    async def report_down(self, ended: str) -> None:
        """The node-lifecycle controller's write for a silent kubelet (module docstring)."""
        now = _now()
        condition = {
            "type": "Ready",
            "status": "Unknown",
            "reason": "NodeStatusUnknown",
            "message": f"Kubelet stopped posting node status (the node's box ended: {ended}).",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        try:
            async with KubeClient(self.kubeconfig) as kube:
                await asyncio.wait_for(
                    kube.strategic_patch(
                        f"/api/v1/nodes/{self.node.name}/status", {"status": {"conditions": [condition]}}
                    ),
                    _API_TIMEOUT_S,
                )
        except (TimeoutError, ApiError, OSError) as err:
            log.warning("%s: could not mark the node NotReady: %s", self.node.name, err)

    async def _init_pid(self) -> int:
        """The box's first process: the only child of `unshare --fork`."""
        assert self.proc is not None
        deadline = time.monotonic() + _BOOT_TIMEOUT_S
        while time.monotonic() < deadline:
            child = _first_child(self.proc.pid)
            if child is not None:
                return child
            if self.proc.returncode is not None:
                raise BootError(f"unshare exited {self.proc.returncode} (see {self.dir / 'console.log'})")
            await asyncio.sleep(0.02)
        raise BootError(f"the box's first process did not start within {_BOOT_TIMEOUT_S:.0f}s")

    async def stop(self) -> None:
        self.stopping = True
        await self._kill()

    async def _kill(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)  # --kill-child: the box's init gets SIGKILL too
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.proc.wait(), 10)

    def _set(self, *, state: str, changed: asyncio.Event, last_end: str | None = None) -> None:
        self.record.state = state
        self.record.since = _now()
        if last_end is not None:
            self.record.last_end = last_end
        changed.set()


def _ending(code: int) -> str:
    """How a box's init ended, from `unshare`'s exit (it re-raises the signal that ended its child)."""
    if code == -signal.SIGHUP:
        return "reboot"
    if code == -signal.SIGINT:
        return "poweroff"
    return f"crash (exit {code})" if code >= 0 else f"crash (signal {signal.Signals(-code).name})"


def _first_child(pid: int) -> int | None:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _signal_fifo(fifo: Path) -> None:
    """Tell stage1 the network is wired: one line into its FIFO (it opened it for reading at start)."""
    deadline = time.monotonic() + _BOOT_TIMEOUT_S
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:
            if err.errno != errno.ENXIO or time.monotonic() > deadline:
                raise BootError(f"stage1 is not reading {fifo}: {err}") from None
            time.sleep(0.02)
            continue
        try:
            os.write(fd, b"wired\n")
        finally:
            os.close(fd)
        return


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ----------------------------------------------------------------------------------------------------
# The process


async def run(spec: box.BoxesSpec, ready_file: Path, kubeconfig: Path) -> int:
    box.snapshot_sysctl(spec.dir)
    lab = boxnet.Lab(spec.plan)
    plan = spec.plan
    servers: list[asyncio.AbstractServer] = [
        await boxnet.forward(lab.fd, address=plan.service_ip, port=443, target_port=spec.api_port),
        await boxnet.forward(
            lab.fd, address=plan.gateway, port=plan.registry_port, target_port=spec.registry_port
        ),
    ]
    names = {n.name: plan.node_ip(n.index) for n in spec.nodes}
    proxy = boxnet.ConnectProxy(
        lab, names=names, lab_networks=[plan.lab_cidr, f"{plan.pod_cidr_prefix}.0.0/16"]
    )
    servers.append(await proxy.serve(spec.dir / EGRESS_SOCKET))
    boxes = [Box(spec, node, lab, kubeconfig) for node in spec.nodes]
    changed = asyncio.Event()
    tasks = [asyncio.create_task(b.supervise(changed), name=f"box-{b.node.name}") for b in boxes]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    writer = asyncio.create_task(_write_status(spec.dir, boxes, changed, ready_file))
    stopped = asyncio.create_task(stop.wait())
    code = 0
    # A supervisor ends by itself only for a box powered off; one that raised leaves its node unwatched:
    # stop everything and exit non-zero, so `sim status` shows the component died, with this log.
    pending: set[asyncio.Task[object]] = {stopped, *tasks}
    while not stop.is_set():
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        failed = [t for t in done if t is not stopped and not t.cancelled() and t.exception() is not None]
        for task in failed:
            log.error("%s failed: %r", task.get_name(), task.exception())
        if failed:
            code = 1
            break
        if not pending - {stopped}:  # every box powered off: the lab stays until `sim down`
            await stop.wait()
    log.info("stopping %d box(es)", len(boxes))
    await asyncio.gather(*(b.stop() for b in boxes))
    for task in [*tasks, writer, stopped]:
        task.cancel()
    await asyncio.gather(*tasks, writer, stopped, return_exceptions=True)
    for server in servers:
        server.close()
    left = await asyncio.to_thread(box.remove_cgroups, spec.sim_id)
    if left:
        log.error("cgroups still in use after the boxes stopped: %s", ", ".join(left))
    lab.close()
    return 1 if left or code else 0


async def _write_status(directory: Path, boxes: list[Box], changed: asyncio.Event, ready_file: Path) -> None:
    ready_written = False
    while True:
        await changed.wait()
        changed.clear()
        _save_status(directory, {b.node.name: vars(b.record) for b in boxes})
        if not ready_written and all(b.record.boots > 0 for b in boxes):
            _mark_ready(ready_file)
            ready_written = True


def _mark_ready(ready_file: Path) -> None:
    ready_file.write_text(_now(), encoding="utf-8")


def _save_status(directory: Path, status: dict[str, dict[str, object]]) -> None:
    tmp = directory / (STATUS_FILE + ".tmp")
    tmp.write_text(json.dumps(status, indent=2), encoding="utf-8")
    tmp.replace(directory / STATUS_FILE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nodewright.sim.realnodes", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dir", type=Path, required=True, help="the real nodes' directory (spec.json)")
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--kubeconfig", type=Path, required=True, help="to mark a node whose box is down")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    if os.geteuid() != 0:
        print("nodewright.sim.realnodes: real nodes need root (namespaces, mounts, cgroups)", file=sys.stderr)
        return 2
    try:
        spec = box.BoxesSpec.load(args.dir)
    except (OSError, ValueError, KeyError) as err:
        print(f"nodewright.sim.realnodes: {args.dir / box.SPEC_FILE}: {err}", file=sys.stderr)
        return 2
    return asyncio.run(run(spec, args.ready_file, args.kubeconfig))


if __name__ == "__main__":
    sys.exit(main())
