"""The machine side of the simulated kubelet: node host roots, container logs and process trees.

- **Host roots.** Each opted-in node has a directory `<sim dir>/roots/<node>/` that plays its root file
  system: `hostPath` volumes map into it, so the agent's `<root_mount>` and the package's copy directory,
  flags, history and logs land there. It persists across kubelet restarts and simulated reboots and is
  removed by `sim down`.
- **Boot.** When a node is first seen, and whenever its `status.nodeInfo.bootID` changes (the rebooter's
  simulated reboot), the node "boots": `/proc/sys/kernel/random/boot_id` gets the bootID, the runtime
  kernel state under `/proc/sys` is reset and the sysctl files are loaded (`sysctl --system` order, see
  `nodewright.sim.hostshims`), `/proc/cmdline` is rebuilt from `GRUB_CMDLINE_LINUX` and
  `GRUB_CMDLINE_LINUX_DEFAULT` of `/etc/default/grub` and `/etc/default/grub.d/*.cfg` (sourced by
  `/bin/sh`, as update-grub does), `/proc/modules` is emptied except for modules listed in
  `/etc/modules` and `/etc/modules-load.d/*.conf`, and `/etc/hostname` and `/etc/os-release` are written
  if missing. So a change a package makes persistent survives a reboot and a runtime-only change does not.
- **The booted kernel.** The first boot records the node's `status.nodeInfo.kernelVersion` as the
  image's kernel (`<root>/var/lib/nodewright-sim/image-kernel`) and installs it (`/boot/vmlinuz-<release>`,
  `/lib/modules/<release>/`). Every boot starts the boot loader's
  default, if that kernel is installed (`/boot/vmlinuz-<release>` in the root, or the image's): a
  `GRUB_DEFAULT` (from `/etc/default/grub` and `grub.d/*.cfg`) naming a menu entry `... with Linux
  <release>`; otherwise, unless `GRUB_DEFAULT` is another value than `saved`, the `saved_entry` of
  `/boot/grub2/grubenv` or `/boot/grub/grubenv` (what `grubby --set-default` writes); else the image's
  kernel. (A real GRUB whose `GRUB_DEFAULT` is an index boots that entry, usually the newest kernel; the
  simulation boots the image's.) The release is written to `/proc/sys/kernel/osrelease` (what `uname -r`
  prints, and the node's `uname` stand-in reads) and to `BOOT_IMAGE=` of `/proc/cmdline`, and the
  simulated kubelet reports it as the node's `status.nodeInfo.kernelVersion`.
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
import shutil
import signal
import subprocess
from collections import deque
from pathlib import Path
from typing import Any, Final

from nodewright.sim import hostshims

JSON = dict[str, Any]
CRI_MAX_LINE: Final = 16 * 1024
TAIL_LINES: Final = 80
TAIL_BYTES: Final = 2048
BOOT_ID_PATH: Final = "proc/sys/kernel/random/boot_id"
_BOOT_SCRIPT_TIMEOUT_S: Final = 10.0


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


def _os_release(os_image: str) -> str:
    words = os_image.split()
    distro = words[0].lower() if words else "linux"
    version = words[1] if len(words) > 1 else ""
    short = ".".join(version.split(".")[:2])
    return (
        f'PRETTY_NAME="{os_image}"\nNAME="{words[0] if words else "Linux"}"\n'
        f'VERSION_ID="{short}"\nVERSION="{version}"\nID={distro}\n'
    )


def grub_cmdline(root: Path) -> str:
    """GRUB_CMDLINE_LINUX and _DEFAULT after sourcing the node's /etc/default/grub(.d) with /bin/sh."""
    return " ".join(
        _grub_sourced(root, 'printf "%s %s" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"').split()
    )


def grub_default(root: Path) -> str:
    """GRUB_DEFAULT after sourcing the node's /etc/default/grub(.d) with /bin/sh ("" if unset)."""
    return _grub_sourced(root, 'printf "%s" "$GRUB_DEFAULT"').strip()


def _grub_sourced(root: Path, printer: str) -> str:
    """What `printer` prints after /bin/sh sourced /etc/default/grub and grub.d/*.cfg, as update-grub does."""
    files = [root / "etc" / "default" / "grub"]
    grub_d = root / "etc" / "default" / "grub.d"
    if grub_d.is_dir():
        files += sorted(grub_d.glob("*.cfg"))
    present = [str(f) for f in files if f.is_file()]
    if not present:
        return ""
    script = "".join(f'. "${i + 1}"\n' for i in range(len(present)))
    script += printer + "\n"
    try:
        result = subprocess.run(
            ["/bin/sh", "-c", script, "grub", *present],
            capture_output=True,
            text=True,
            timeout=_BOOT_SCRIPT_TIMEOUT_S,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout if result.returncode == 0 else ""


def booted_kernel(root: Path) -> str:
    """The release the boot loader starts (see the module docstring), "" when the node names none."""
    installed = hostshims.installed_kernels(root)
    default = grub_default(root)
    chosen = hostshims.kernel_of_entry(default, installed) if default else None
    if chosen is None and default in ("", "saved"):
        chosen = hostshims.grubenv_kernel(root)
    return chosen or hostshims.image_kernel(root)


def boot_modules(root: Path) -> list[str]:
    files = [root / "etc" / "modules"]
    load_d = root / "etc" / "modules-load.d"
    if load_d.is_dir():
        files += sorted(load_d.glob("*.conf"))
    modules: list[str] = []
    for path in files:
        if not path.is_file():
            continue
        for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = raw.split("#", 1)[0].strip()
            if line and not line.startswith(";"):
                name = line.split()[0].replace("-", "_")
                if name not in modules:
                    modules.append(name)
    return modules


def recorded_boot_id(root: Path) -> str | None:
    try:
        return (root / BOOT_ID_PATH).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def install_image_kernel(root: Path, release: str) -> None:
    """The image's own kernel, as a node's disk has it: /boot/vmlinuz-<release>, /lib/modules/<release>/."""
    image = root / hostshims.IMAGE_KERNEL_FILE
    image.parent.mkdir(parents=True, exist_ok=True)
    image.write_text(release + "\n", encoding="utf-8")
    vmlinuz = root / "boot" / f"vmlinuz-{release}"
    vmlinuz.parent.mkdir(parents=True, exist_ok=True)
    if not vmlinuz.exists():
        vmlinuz.write_text(f"simulated kernel image {release} (the node image's)\n", encoding="utf-8")
    (root / "lib" / "modules" / release).mkdir(parents=True, exist_ok=True)


def boot_node(root: Path, node: JSON) -> str:
    """Bring the node's root to the state right after a boot with the node's current bootID; returns the
    release of the kernel it booted ("" if the node names none)."""
    name = node.get("metadata", {}).get("name", "node")
    info = node.get("status", {}).get("nodeInfo") or {}
    for sub in ("etc", "var/log", "tmp", "run", "proc"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    hostname = root / "etc" / "hostname"
    if not hostname.exists():
        hostname.write_text(name + "\n", encoding="utf-8")
    os_release = root / "etc" / "os-release"
    if not os_release.exists():
        os_release.write_text(_os_release(str(info.get("osImage") or "Linux")), encoding="utf-8")
    shutil.rmtree(root / "proc" / "sys", ignore_errors=True)
    state = hostshims.Node(root, root)
    hostshims.load_files(state, hostshims.system_files(root), quiet=True, out=lambda _text: None)
    boot_id = root / BOOT_ID_PATH
    boot_id.parent.mkdir(parents=True, exist_ok=True)
    boot_id.write_text(str(info.get("bootID") or "") + "\n", encoding="utf-8")
    if not (root / hostshims.IMAGE_KERNEL_FILE).exists() and info.get("kernelVersion"):
        install_image_kernel(root, str(info["kernelVersion"]))
    kernel = booted_kernel(root)
    if kernel:
        (root / hostshims.OSRELEASE_FILE).write_text(kernel + "\n", encoding="utf-8")
    cmdline = f"BOOT_IMAGE=/boot/vmlinuz-{kernel} root=/dev/sda1 ro {grub_cmdline(root)}".strip()
    (root / "proc" / "cmdline").write_text(cmdline + "\n", encoding="utf-8")
    modules = root / "proc" / "modules"
    modules.write_text(
        "".join(f"{m} 16384 0 - Live 0x0000000000000000\n" for m in boot_modules(root)), encoding="utf-8"
    )
    return kernel
