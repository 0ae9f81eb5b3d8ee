"""The machine side of the simulated kubelet: node host roots, container logs and process trees.

- **Host roots.** Each opted-in node has a directory `<sim dir>/roots/<node>/` that plays its root file
  system: `hostPath` volumes map into it, so the agent's `<root_mount>` and the package's copy directory,
  flags, history and logs land there. It persists across kubelet restarts and simulated reboots and is
  removed by `sim down`.
- **Boot.** When a node is first seen, and whenever its `status.nodeInfo.bootID` changes (the rebooter's
  simulated reboot), the node's root boots (`nodewright.hostroot.boot`, the one simulated boot, which
  `nodewright package run` uses too): the bootID, the running kernel state rebuilt from the sysctl,
  GRUB, module, tmpfiles and mount files, and `/etc/hostname` and `/etc/os-release` from the node object
  if missing. So a change a package makes persistent survives a reboot and a runtime-only change does
  not. The first boot installs the node's `status.nodeInfo.kernelVersion` as the image's kernel; every
  boot starts the boot loader's default, and the simulated kubelet reports the release it booted as the
  node's `status.nodeInfo.kernelVersion`.
- **Logs.** A container's output is written as the kubelet writes it, in the CRI log format
  (`<RFC3339Nano> <stdout|stderr> <F|P> <text>`, a `P` piece for each 16 KiB of a longer line), one file
  per run: `<pod dir>/logs/<container>/<restartCount>.log`. kwok's kubelet server reads these files for
  `kubectl logs` (see `nodewright.sim.kubelet`). The last lines are kept for
  `terminationMessagePolicy: FallbackToLogsOnError`.
- **Process trees.** Container processes stay in the kubelet's process group, and each carries two
  environment markers, `NODEWRIGHT_SIM_KUBELET=<sim dir>` and `NODEWRIGHT_SIM_CONTAINER=<id>`, which its
  children inherit even when they start a session of their own (the agent runs each step in one).
  Stopping a container is what a runtime does: SIGTERM to its main process, then SIGKILL to it, every
  descendant found through `/proc` and every process carrying its marker; when a container's main
  process exits, whatever it left behind is killed the same way (a runtime kills the container's cgroup).
  A stopping kubelet kills every process with its marker, and a starting one kills the leftovers of a
  predecessor that could not (SIGKILL), so no container process outlives the simulator.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
from collections import deque
from pathlib import Path
from typing import Any, Final

from nodewright.hostroot import boot

JSON = dict[str, Any]
CRI_MAX_LINE: Final = 16 * 1024
TAIL_LINES: Final = 80
TAIL_BYTES: Final = 2048


def rfc3339(moment: dt.datetime | None = None) -> str:
    """Seconds precision, as the API server stores container times."""
    return (moment or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_nano(moment: dt.datetime | None = None) -> str:
    moment = moment or dt.datetime.now(dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}000Z"


# ----------------------------------------------------------------------------------------------------
# Logs


class CriLog:
    """One container run's log file in the CRI format, written as output arrives."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("ab")
        self._pending: dict[str, bytes] = {"stdout": b"", "stderr": b""}
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._partial_tail: dict[str, str] = {}

    def write(self, stream: str, data: bytes) -> None:
        if self._file.closed:  # the container was given up on (kubelet stopping): output is dropped
            return
        buffered = self._pending[stream] + data
        *lines, rest = buffered.split(b"\n")
        for line in lines:
            self._emit(stream, line, full=True)
        while len(rest) >= CRI_MAX_LINE:
            self._emit(stream, rest[:CRI_MAX_LINE], full=False)
            rest = rest[CRI_MAX_LINE:]
        self._pending[stream] = rest
        self._file.flush()

    def close_stream(self, stream: str) -> None:
        """End of a stream: an unterminated last line is still a full line."""
        if self._file.closed:
            return
        if self._pending[stream]:
            self._emit(stream, self._pending[stream], full=True)
            self._pending[stream] = b""
        self._file.flush()

    def close(self) -> None:
        for stream in self._pending:
            self.close_stream(stream)
        self._file.close()  # closing twice is harmless

    def tail(self) -> str:
        text = "\n".join(self._tail)
        return text[-TAIL_BYTES:]

    def _emit(self, stream: str, piece: bytes, *, full: bool) -> None:
        tag = b"F" if full else b"P"
        self._file.write(rfc3339_nano().encode() + b" " + stream.encode() + b" " + tag + b" " + piece + b"\n")
        text = self._partial_tail.pop(stream, "") + piece.decode(errors="replace")
        if full:
            self._tail.append(text[-TAIL_BYTES:])
        else:
            self._partial_tail[stream] = text[-TAIL_BYTES:]


def parse_cri_log(text: str) -> list[tuple[str, str]]:
    """(stream, line) pairs of a CRI log, partial pieces joined (for tests and tools)."""
    out: list[tuple[str, str]] = []
    partial: dict[str, str] = {}
    for raw in text.splitlines():
        _stamp, stream, tag, *rest = raw.split(" ", 3)
        piece = rest[0] if rest else ""
        if tag == "P":
            partial[stream] = partial.get(stream, "") + piece
            continue
        out.append((stream, partial.pop(stream, "") + piece))
    return out


# ----------------------------------------------------------------------------------------------------
# Process trees


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        found.extend(int(p) for p in text.split())
    return found


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (breadth first), read from /proc."""
    seen: list[int] = []
    queue = _children(pid)
    while queue:
        child = queue.pop(0)
        if child in seen:
            continue
        seen.append(child)
        queue.extend(_children(child))
    return seen


def signal_process(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and all its descendants (collected first, so none is reparented away unseen)."""
    for target in [pid, *descendants(pid)]:
        signal_process(target, signal.SIGKILL)


def processes_with_env(name: str, value: str) -> list[int]:
    """PIDs (other than this process) whose environment at exec had `name=value`."""
    needle = f"{name}={value}".encode()
    found = []
    own = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            environ = Path(f"/proc/{entry.name}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_marked(name: str, value: str) -> int:
    """SIGKILL every process whose environment has `name=value`; returns how many were signalled."""
    targets = processes_with_env(name, value)
    for pid in targets:
        signal_process(pid, signal.SIGKILL)
    return len(targets)


# ----------------------------------------------------------------------------------------------------
# Host roots and boot


def boot_node(root: Path, node: JSON) -> str:
    """Boot the node's root with the node's current bootID (`nodewright.hostroot.boot`); returns the
    release of the kernel it booted ("" if the node names none)."""
    info = node.get("status", {}).get("nodeInfo") or {}
    facts = boot.BootFacts(
        boot_id=str(info.get("bootID") or ""),
        hostname=str(node.get("metadata", {}).get("name") or "node"),
        os_image=str(info.get("osImage") or "Linux"),
        image_kernel=str(info.get("kernelVersion") or "") or None,
    )
    return boot.boot(root, facts)
