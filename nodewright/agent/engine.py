"""One agent run: a mode of one package on one node, from the copied payload to the exit code.

Order of a stage run (`apply`, `config`, `upgrade`, `uninstall`, `post-interrupt` and their checks):

1. `COPY_RESOLV` (default true): the container's `/etc/resolv.conf` is copied into the host root.
2. The package directory `<root_mount><copy_dir>` is normally filled by the pod's first init container;
   if it is missing, the image's payload directory (`SKYHOOK_DATA_DIR`) is copied there (legacy pods).
3. `config.json` is loaded and validated (every problem reported at once; nothing runs on an error).
4. Except in uninstall modes: `root_dir/` is laid over the host root and every expected config file
   must be present in `configmaps/`.
5. The steps of the mode run in order, each chrooted into the host root (see `runner`). A work step
   whose flag exists is skipped in `apply` and `post-interrupt` unless the step declares
   `idempotence: true` or `OVERLAY_ALWAYS_RUN_STEP` is set; `config`, `upgrade` and `uninstall` steps
   always run. The first failing work step ends the run. Check steps all run, and the run fails if any
   failed.
6. Checks record their results; a successful apply-check, upgrade-check or uninstall-check records the
   version in the history file, and uninstall-check removes the package's step flags.

Exit codes: 0 success, 1 a step, check or input failed, 2 bad invocation or settings, 128+N when stopped
by signal N (143 for SIGTERM: the kubelet stopping the pod). The `interrupt` mode (see `interrupts`) runs
the operator's interrupt once per resource id.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from nodewright.agent import hostfs, interrupts, modes, safefile
from nodewright.agent.config import (
    ENV_ARGUMENT_PREFIX,
    STEP_DIR,
    ConfigError,
    PackageConfig,
    Step,
    load_config,
)
from nodewright.agent.logs import CappedEcho, CappedFile, LogFiles, Reporter, Sink, utc_now
from nodewright.agent.runner import Command, Outcome, Runner, StopRequest
from nodewright.agent.settings import Settings, mirrored_names, parse_resource_id
from nodewright.agent.state import UNINSTALLED, CheckResult, HostState

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
LEGACY_NODE_FILES: Final = "/etc/nvidia-bootstrap/node-files"
CONTAINER_RESOLV: Final = "/etc/resolv.conf"
HOST_ENVIRONMENT_FILE: Final = "/etc/environment"
ROOT_OVERLAY_DIR: Final = "root_dir"
CONFIGMAP_DIR: Final = "configmaps"


@dataclass(frozen=True)
class Invocation:
    mode: str
    root: str  # where the host's `/` is mounted in this container (a directory in unprivileged mode)
    copy_dir: str  # host path of the package directory
    interrupt: str | None = None


@dataclass(frozen=True)
class _StepResult:
    passed: bool
    stopped: bool
    last_output: str = ""  # the step's last output lines, repeated in the failure summary


_STREAM_PREFIX: Final = re.compile(r"^\S+ \[(?:out|err)\] ")
"""The timestamp and stream tag the runner puts in front of each line of a step's output."""


class _LastLines(io.StringIO):
    """Keeps the last few non-empty lines written to it (stdout and stderr of one step, interleaved).

    The operator shows the tail of a failed container's log on the node condition; the agent's own
    closing lines would push the step's reason out of it, so the failure lines repeat it."""

    KEEP: Final = 3

    def __init__(self) -> None:
        super().__init__()
        self._lines: deque[str] = deque(maxlen=self.KEEP)
        self._partial = ""

    def write(self, text: str) -> int:
        chunks = (self._partial + text).split("\n")
        self._partial = chunks.pop()
        self._lines.extend(_STREAM_PREFIX.sub("", line).strip() for line in chunks if line.strip())
        return len(text)

    def text(self) -> str:
        lines = [*self._lines, *([self._partial.strip()] if self._partial.strip() else [])]
        return " / ".join(lines[-self.KEEP :])[-400:]


class Agent:
    """One run of the agent for one invocation; `run()` does it and returns the exit code."""

    def __init__(
        self,
        invocation: Invocation,
        settings: Settings,
        *,
        environ: Mapping[str, str],
        reporter: Reporter,
        stop: StopRequest,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.mode = invocation.mode
        self.invocation = invocation
        self.settings = settings
        self.root = invocation.root
        self.environ = dict(environ)
        self.reporter = reporter
        self.stop = stop
        self.clock = clock
        self.package_dir = hostfs.in_root(self.root, invocation.copy_dir)
        self.state = HostState(self.root, settings.root_dir, clock=clock, warn=reporter.warn)
        self.log_dir = hostfs.in_root(self.root, settings.log_dir)
        self.runner = Runner(
            root=self.root,
            chroot=settings.chroot,
            buffer_limit=settings.buffer_limit,
            stop=stop,
            stop_timeout=settings.stop_timeout,
        )

    # Paths as the step sees them: host paths inside the chroot, real paths without it.

    def _view(self, host_path: str) -> str:
        return host_path if self.settings.chroot else hostfs.in_root(self.root, host_path)

    @property
    def _package_view(self) -> str:
        return self._view(self.invocation.copy_dir)

    @property
    def _step_root_view(self) -> str:
        return self._package_view.rstrip("/") + "/" + STEP_DIR

    @property
    def _host_root_view(self) -> str:
        return "/" if self.settings.chroot else self.root

    @property
    def _cwd(self) -> str:
        return self._package_view if self.settings.chroot else self.root

    # The run

    def run(self) -> int:
        self._banner()
        if self.settings.copy_resolv:
            self._copy_resolv()
        if self.mode == modes.INTERRUPT:
            self._ensure_package_dir()
            return self._interrupt()
        if not self._ensure_package_dir():
            self.reporter.error(
                f"package directory {self.invocation.copy_dir} not found under {self.root} (the package "
                f"pod's init container copies the image's payload there), and this container has no "
                f"payload at {self.settings.data_dir} to copy instead"
            )
            return EXIT_FAILED
        try:
            config = load_config(os.path.join(self.package_dir, "config.json"))
        except ConfigError as exc:
            self.reporter.error(str(exc))
            return EXIT_FAILED
        for warning in config.warnings:
            self.reporter.warn(f"config.json: {warning}")
        if self.mode not in modes.UNINSTALL_MODES:
            self._overlay_root_dir()
            missing = self._missing_config_files(config)
            if missing:
                for name in missing:
                    self.reporter.error(
                        f"expected config file {CONFIGMAP_DIR}/{name} is missing: add {name!r} to the "
                        f"package's configMap (config.json lists it in expected_config_files)"
                    )
                return EXIT_FAILED
        return self._run_steps(config)

    def _banner(self) -> None:
        s = self.settings
        self.reporter.info(
            f"mode {self.mode}, root {self.root}, copy dir {self.invocation.copy_dir}, "
            f"{'chroot per step' if s.chroot else 'no chroot (unprivileged mode)'}, state {s.root_dir}, "
            f"logs {s.log_dir if s.write_logs else 'off'}, resource id {s.resource_id or '(none)'}"
        )

    def _copy_resolv(self) -> None:
        if not hostfs.copy_file_into_root(CONTAINER_RESOLV, self.root, "/etc/resolv.conf"):
            self.reporter.warn(f"COPY_RESOLV is on but this container has no {CONTAINER_RESOLV}; skipped")

    def _ensure_package_dir(self) -> bool:
        if os.path.isdir(self.package_dir):
            return True
        if not os.path.isdir(self.settings.data_dir):
            return False
        self.reporter.info(f"copying the payload {self.settings.data_dir} to {self.invocation.copy_dir}")
        shutil.copytree(self.settings.data_dir, self.package_dir, symlinks=True, dirs_exist_ok=True)
        if os.path.isdir(LEGACY_NODE_FILES):
            shutil.copytree(LEGACY_NODE_FILES, self.package_dir, symlinks=True, dirs_exist_ok=True)
        return True

    def _overlay_root_dir(self) -> None:
        source = os.path.join(self.package_dir, ROOT_OVERLAY_DIR)
        if os.path.isdir(source):
            written = hostfs.overlay(source, self.root)
            self.reporter.info(f"{ROOT_OVERLAY_DIR}/: {len(written)} files laid over the host root")

    def _missing_config_files(self, config: PackageConfig) -> list[str]:
        directory = os.path.join(self.package_dir, CONFIGMAP_DIR)
        return [
            name for name in config.expected_config_files if not os.path.exists(os.path.join(directory, name))
        ]

    # Steps

    def _run_steps(self, config: PackageConfig) -> int:
        steps = config.steps(self.mode)
        self.state.mark_start()
        if not steps:
            self.reporter.warn(f"{config.package_name} has no {self.mode} steps: nothing to do")
        versions = self._versions(config)
        results: list[CheckResult] = []
        reasons: dict[str, str] = {}
        for step in steps:
            if self.stop.requested:
                return self._stopped()
            if modes.is_check(self.mode):
                result = self._run_step(config, step, versions)
                if result.stopped:
                    return self._stopped()
                results.append(CheckResult(step=step, passed=result.passed))
                if not result.passed and result.last_output:
                    reasons[step.name] = result.last_output
                continue
            flag = self.state.step_flag(config, step)
            if self._skip(step, flag):
                continue
            result = self._run_step(config, step, versions)
            if result.stopped:
                return self._stopped()
            if not result.passed:
                return EXIT_FAILED
            self.state.write_step_flag(flag, step)
        if modes.is_check(self.mode) and steps and not self.state.record_checks(config, self.mode, results):
            failed = [
                f"{r.step.name} ({reasons[r.step.name]})" if r.step.name in reasons else r.step.name
                for r in results
                if not r.passed
            ]
            self.reporter.error(
                f"{len(failed)} of {len(results)} {self.mode} steps failed: {', '.join(failed)}"
            )
            return EXIT_FAILED
        if self.mode in modes.HISTORY_MODES:
            version = UNINSTALLED if self.mode == modes.UNINSTALL_CHECK else config.package_version
            self.state.record_version(config.package_name, version)
            if self.mode == modes.UNINSTALL_CHECK:
                self.state.remove_step_flags(config)
        self.reporter.info(f"{self.mode} of {config.package_name} {config.package_version} succeeded")
        return EXIT_OK

    def _versions(self, config: PackageConfig) -> tuple[str, str] | None:
        """(previous, current) for upgrade modes: what the history file says is installed, and ours."""
        if self.mode not in modes.UPGRADE_MODES:
            return None
        return self.state.installed_version(config.package_name), config.package_version

    def _skip(self, step: Step, flag: str) -> bool:
        if not os.path.exists(flag):
            return False
        if self.settings.always_run_steps:
            self.reporter.warn(
                f"{step.name}: flag exists but OVERLAY_ALWAYS_RUN_STEP is set: running it again"
            )
            return False
        if self.mode in modes.ALWAYS_RUN_MODES:
            self.reporter.info(f"{step.name}: flag exists; {self.mode} steps always run")
            return False
        if step.idempotence:
            self.reporter.info(f"{step.name}: flag exists; the step manages its own idempotence: running it")
            return False
        self.reporter.info(f"{step.name}: skipped, it already succeeded with these arguments ({flag})")
        return True

    def _run_step(self, config: PackageConfig, step: Step, versions: tuple[str, str] | None) -> _StepResult:
        arguments, missing = self._substitute(step.arguments)
        if missing:
            self.reporter.error(
                f"{self.mode} step {step.name} ({step.path}): environment variable(s) "
                f"{', '.join(missing)} not set, but its arguments name them (env:VAR); set them in the "
                f"package's env"
            )
            return _StepResult(passed=False, stopped=False)
        if step.upgrade_step and versions is not None:
            arguments = [*arguments, *versions]
        command = Command(
            argv=(f"{self._step_root_view}/{step.path}", *arguments),
            env=self._step_env(step, versions),
            cwd=self._cwd,
        )
        self.reporter.info(f"{self.mode} step {step.name}: {' '.join(command.argv)}")
        logs = LogFiles(self.log_dir, config.package_name, config.package_version)
        tail = _LastLines()
        outcome = self._run_logged(command, logs, step.path, tail=tail)
        passed = outcome.returncode in step.returncodes and not outcome.stopped
        verdict = "succeeded" if passed else "FAILED"
        expected = ", ".join(str(code) for code in step.returncodes)
        last = "" if passed else tail.text()
        self.reporter.info(
            f"{self.mode} step {step.name} {verdict}: exit {outcome.returncode} (success: {expected})"
            + (f"; last output: {last}" if last else "")
        )
        return _StepResult(passed=passed, stopped=outcome.stopped, last_output=last)

    def _substitute(self, arguments: tuple[str, ...]) -> tuple[list[str], list[str]]:
        values: list[str] = []
        missing: list[str] = []
        for argument in arguments:
            if argument.startswith(ENV_ARGUMENT_PREFIX):
                name = argument[len(ENV_ARGUMENT_PREFIX) :]
                if name in self.environ:
                    values.append(self.environ[name])
                else:
                    missing.append(name)
            else:
                values.append(argument)
        return values, missing

    def _step_env(self, step: Step | None, versions: tuple[str, str] | None) -> dict[str, str]:
        env = dict(self.environ)
        env.update(self._host_environment())
        if step is not None:
            env.update(step.env)
            env.update(
                {
                    "STEP_ROOT": self._step_root_view,
                    "SKYHOOK_DIR": self._package_view,
                    "NODEWRIGHT_DIR": self._package_view,
                }
            )
        if versions is not None:
            env["PREVIOUS_VERSION"], env["CURRENT_VERSION"] = versions
        env["NODEWRIGHT_HOST_ROOT"] = self._host_root_view
        env.update(mirrored_names(env))
        return env

    def _host_environment(self) -> dict[str, str]:
        try:
            return hostfs.read_environment_file(hostfs.in_root(self.root, HOST_ENVIRONMENT_FILE))
        except safefile.Refused as exc:
            self.reporter.warn(f"the host's {HOST_ENVIRONMENT_FILE} is not used: {exc}")
            return {}

    def _run_logged(
        self, command: Command, logs: LogFiles, log_name: str, *, tail: Sink | None = None
    ) -> Outcome:
        with self._log_sinks(logs, log_name) as (out, err):
            if tail is not None:
                out, err = [*out, tail], [*err, tail]
            outcome = self.runner.run(command, out=out, err=err)
        if self.settings.write_logs:
            logs.rotate(log_name)
        return outcome

    @contextmanager
    def _log_sinks(self, logs: LogFiles, log_name: str) -> Iterator[tuple[list[Sink], list[Sink]]]:
        """The step's output sinks, each keeping at most the log limit (see `logs`): the container's
        streams and, unless log files are off, the step's `.log` and `.err` files on the node."""
        limit = self.settings.log_limit
        with ExitStack() as sinks:
            out: list[Sink] = [
                sinks.enter_context(
                    CappedEcho(self.reporter.out, limit=limit, stream="stdout", clock=self.clock)
                )
            ]
            err: list[Sink] = [
                sinks.enter_context(
                    CappedEcho(self.reporter.err, limit=limit, stream="stderr", clock=self.clock)
                )
            ]
            if self.settings.write_logs:
                out_path, err_path = logs.paths(log_name, self.clock())
                os.makedirs(os.path.dirname(out_path), exist_ok=True)
                out.append(
                    sinks.enter_context(CappedFile(out_path, limit=limit, stream="stdout", clock=self.clock))
                )
                err.append(
                    sinks.enter_context(CappedFile(err_path, limit=limit, stream="stderr", clock=self.clock))
                )
            yield out, err

    def _stopped(self) -> int:
        number = int(self.stop.signal_number or signal.SIGTERM)
        self.reporter.error(f"stopped by signal {number} before {self.mode} finished: reporting failure")
        return 128 + number

    # Interrupt

    def _interrupt(self) -> int:
        payload = self.invocation.interrupt
        if not payload:
            self.reporter.error("interrupt mode needs the interrupt (base64 JSON) as its last argument")
            return EXIT_USAGE
        try:
            interrupt = interrupts.decode(payload)
            resource = parse_resource_id(self.settings.resource_id or "")
        except ValueError as exc:
            self.reporter.error(str(exc))
            return EXIT_FAILED
        if interrupt.ignored_fields:
            self.reporter.warn(
                f"interrupt fields ignored for {interrupt.type}: {', '.join(interrupt.ignored_fields)}"
            )
        if interrupt.type == interrupts.NO_OP:
            self.state.write_interrupt_flag(self.state.interrupt_flag(resource.text, interrupts.NO_OP))
            self.reporter.info("no_op interrupt: nothing to do")
            return EXIT_OK
        logs = LogFiles(self.log_dir, resource.package, resource.version)
        for index, argv in enumerate(interrupt.commands()):
            command_id = interrupt.command_id(index)
            flag = self.state.interrupt_flag(resource.text, command_id)
            if os.path.exists(flag):
                self.reporter.info(f"interrupt {command_id} already ran for {resource.text}: skipped")
                continue
            self.state.write_interrupt_flag(flag)
            if not self.settings.chroot:
                self._record_unrun_interrupt(resource.text, interrupt.type, argv)
                continue
            outcome = self._run_interrupt_command(argv, logs, command_id)
            if outcome.returncode == 0 and not outcome.stopped:
                continue
            rebooting = interrupt.type == interrupts.NODE_RESTART and (
                outcome.returncode == -signal.SIGTERM or outcome.stopped
            )
            if not rebooting:
                os.unlink(flag)
                self.reporter.error(f"interrupt command {' '.join(argv)} failed: exit {outcome.returncode}")
            return self._stopped() if outcome.stopped else EXIT_FAILED
        return EXIT_OK

    def _run_interrupt_command(self, argv: tuple[str, ...], logs: LogFiles, command_id: str) -> Outcome:
        cwd = self._package_view if os.path.isdir(self.package_dir) else "/"
        command = Command(argv=argv, env=self._step_env(None, None), cwd=cwd, make_executable=False)
        self.reporter.info(f"interrupt: {' '.join(argv)}")
        return self._run_logged(command, logs, f"interrupts/{command_id}")

    def _record_unrun_interrupt(self, resource_id: str, kind: str, argv: tuple[str, ...]) -> None:
        """Unprivileged mode never runs host commands such as `reboot`; it records what it would run."""
        path = os.path.join(self.state.base, "interrupts", "requested.jsonl")
        entry = {
            "resource_id": resource_id,
            "type": kind,
            "command": list(argv),
            "time": self.clock().isoformat(),
        }
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")
        self.reporter.info(
            f"unprivileged mode: interrupt command {' '.join(argv)} recorded in {path}, not run"
        )
