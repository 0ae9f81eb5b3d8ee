"""Running one step (or interrupt command) as a child process, chrooted into the host root or not.

Chroot mode (the default when the agent is root, as in a privileged package pod): each command runs in
a fresh helper process that chroots into `<root_mount>` and execs the command (`chroot_exec.py`), so the
chroot lasts exactly one step, as in the reference agent. Paths the step sees are host paths.

Unprivileged mode (not root, or `NODEWRIGHT_AGENT_CHROOT=false`): the command runs directly, with the
host-root directory as its working directory and absolute paths under it (`<root>/<copy_dir>/...`). The
simulated kubelet and `nodewright package run` use it against a directory that stands for a node's
root. Nothing confines such a step: a script that writes `/etc/x` writes the machine's `/etc/x`, which
is why steps are told the root in `NODEWRIGHT_HOST_ROOT`.

Both modes stream stdout and stderr through `LineWriter`s while the command runs and never wait on a
pipe forever: once the command has exited, output still arriving from a daemon it left behind (holding
the pipe) is read for `OUTPUT_GRACE` seconds, then the agent moves on. Each command gets its own
session (process group); a stop request (SIGTERM/SIGINT to the agent) is forwarded to that group as
SIGTERM and, if it has not exited after the stop timeout, SIGKILL. The package pods use the host's PID
namespace, so a step the agent left running would outlive the pod.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Final

from nodewright.agent import chroot_exec
from nodewright.agent.logs import LineWriter, Sink

HELPER: Final = os.path.abspath(chroot_exec.__file__)
POLL_SECONDS: Final = 0.1
OUTPUT_GRACE: Final = 1.0


@dataclass(frozen=True)
class Command:
    """What to run: `argv[0]` and `cwd` as the command sees them (host paths when chrooted)."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    make_executable: bool = True


@dataclass(frozen=True)
class Outcome:
    returncode: int  # negative: killed by that signal (subprocess convention)
    stopped: bool  # a stop request arrived while the command ran


@dataclass
class StopRequest:
    """Set from the SIGTERM/SIGINT handler; the runner and the engine look at it between reads."""

    signal_number: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def requested(self) -> bool:
        return self.signal_number is not None

    def request(self, signal_number: int = signal.SIGTERM) -> None:
        if self.signal_number is None:
            self.signal_number = signal_number

    @contextlib.contextmanager
    def handling_signals(self) -> Iterator[None]:
        """Route SIGTERM and SIGINT to this request for the duration (main thread only; else a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signal_number: int, frame: FrameType | None) -> None:
            self.request(signal_number)

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old if old is not None else signal.SIG_DFL)


@dataclass(frozen=True)
class Runner:
    """Runs commands in `root`, chrooted or not; output goes to the given sinks."""

    root: str
    chroot: bool
    buffer_limit: int
    stop: StopRequest
    stop_timeout: float

    def run(self, command: Command, *, out: Sequence[Sink], err: Sequence[Sink]) -> Outcome:
        stdout = LineWriter("out", out, limit=self.buffer_limit)
        stderr = LineWriter("err", err, limit=self.buffer_limit)
        try:
            process = self._spawn(command)
        except OSError as exc:
            code = chroot_exec.NOT_FOUND if exc.errno == errno.ENOENT else chroot_exec.CANNOT_EXECUTE
            stderr.feed(f"nodewright-agent: cannot run {command.argv[0]}: {exc.strerror}\n".encode())
            stderr.close()
            return Outcome(returncode=code, stopped=self.stop.requested)
        assert process.stdout is not None and process.stderr is not None
        try:
            self._pump(process, {process.stdout.fileno(): stdout, process.stderr.fileno(): stderr})
        finally:
            process.stdout.close()
            process.stderr.close()
        return Outcome(returncode=process.wait(), stopped=self.stop.requested)

    def _spawn(self, command: Command) -> subprocess.Popen[bytes]:
        if self.chroot:
            argv = [
                sys.executable,
                "-I",
                HELPER,
                self.root,
                command.cwd,
                "1" if command.make_executable else "0",
                "--",
                *command.argv,
            ]
        else:
            argv = list(command.argv)
            if command.make_executable:
                _make_executable(argv[0])
        return subprocess.Popen(
            argv,
            cwd=None if self.chroot else command.cwd,
            env=dict(command.env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def _pump(self, process: subprocess.Popen[bytes], writers: dict[int, LineWriter]) -> None:
        selector = selectors.DefaultSelector()
        for fd in writers:
            selector.register(fd, selectors.EVENT_READ)
        exited_at: float | None = None
        signalled_at: float | None = None
        killed = False
        try:
            while selector.get_map():
                for key, _ in selector.select(timeout=POLL_SECONDS):
                    data = os.read(key.fd, self.buffer_limit)
                    if data:
                        writers[key.fd].feed(data)
                    else:
                        selector.unregister(key.fd)
                        writers[key.fd].close()
                now = time.monotonic()
                if self.stop.requested and signalled_at is None:
                    _signal_group(process.pid, signal.SIGTERM)
                    signalled_at = now
                if signalled_at is not None and not killed and now - signalled_at >= self.stop_timeout:
                    _signal_group(process.pid, signal.SIGKILL)
                    killed = True
                if exited_at is None and process.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at >= OUTPUT_GRACE:
                    break
        finally:
            for key in list(selector.get_map().values()):
                writers[key.fd].close()
            selector.close()


def _make_executable(path: str) -> None:
    with contextlib.suppress(OSError):  # a missing file is reported when it fails to start
        mode = os.stat(path).st_mode
        if stat.S_ISREG(mode):
            os.chmod(path, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _signal_group(pid: int, signal_number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal_number)
