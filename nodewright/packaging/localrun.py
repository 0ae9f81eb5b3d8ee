"""`nodewright package run`: one mode of a package against a directory that stands for a node's root.

On a node, a package pod does three things, and a local run repeats them:

1. the package image's init container copies the payload (`/skyhook-package/*`, with the package's
   ConfigMap mounted at `configmaps/`) to `<host root><copy dir>`. Here the payload of the package
   directory (`layout.payload_entries`) is copied to `<root><copy dir>`, replacing an earlier copy so
   that edited or deleted scripts are seen; `--config key=file` entries become `configmaps/<key>`
   exactly as a ConfigMap mount would, replacing the payload's own `configmaps/` (without any
   `--config`, the payload's `configmaps/`, if any, stays: an image default);
2. the agent runs `<mode> <root> <copy dir>` with the environment the operator gives it
   (`nodewright.plan.podspec`): `SKYHOOK_ROOT_DIR`/`NODEWRIGHT_ROOT_DIR` (flags and history under
   `/var/lib/skyhook/<nodewright>`), the log directory, the resource id, `COPY_RESOLV=false`, the node
   order, then the package's env (`--env`), which may not override the operator's names;
3. the exit code is the result.

The agent runs in-process (`nodewright.agent.main`) in its unprivileged mode: steps run without chroot
and see the root through `NODEWRIGHT_HOST_ROOT`, and interrupt commands (`reboot`...) are recorded in
`<root><state dir>/interrupts/requested.jsonl` instead of being run. `chroot=True` (root only) runs
each step chrooted into the root as on a node; the root then needs its own `/bin/sh` and tools.

After an unprivileged `interrupt` run that succeeded, the node's part is played on the root as the
simulator's nodes play it (`perform_interrupt`): a recorded `reboot` boots the root
(`nodewright.hostroot.boot`: a new boot id, `/proc/sys` reloaded from the sysctl files, `/proc/cmdline`
rebuilt from GRUB's defaults, ...), so that `post-interrupt` and `post-interrupt-check` then see the
node as it is after the reboot; `systemctl daemon-reload|restart` and `service procps force-reload` go
through the node's stand-ins (`nodewright.hostroot.hostshims`: a service restart is logged, a procps
reload loads the sysctl files). Each is logged in `<root>/var/log/nodewright-sim/commands.log`.

The root must not be this machine's `/`: a local run is for trying a package on a scratch directory.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import stat
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TextIO

from nodewright.agent import main as agent_main
from nodewright.agent import modes, safefile
from nodewright.agent.config import ConfigError, load_config
from nodewright.agent.interrupts import Interrupt, encode
from nodewright.api.k8svalidation import config_map_key, env_var_name
from nodewright.hostroot import boot, hostshims
from nodewright.packaging import layout

DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: What the operator sets on the agent container; a package's env cannot change these.
OPERATOR_ENV: Final = frozenset(
    {
        "SKYHOOK_LOG_DIR",
        "SKYHOOK_ROOT_DIR",
        "SKYHOOK_RESOURCE_ID",
        "SKYHOOK_DIR",
        "SKYHOOK_NODE_ORDER",
        "NODEWRIGHT_LOG_DIR",
        "NODEWRIGHT_ROOT_DIR",
        "NODEWRIGHT_RESOURCE_ID",
        "NODEWRIGHT_NODE_ORDER",
        "NODEWRIGHT_AGENT_CHROOT",
    }
)
#: The API server's limit on a ConfigMap's data, which is what fills configmaps/ on a node.
MAX_CONFIGMAP_BYTES: Final = 1024 * 1024
#: Where the unprivileged agent records the interrupt commands it did not run, under its state dir.
REQUESTS_FILE: Final = "interrupts/requested.jsonl"
#: Variables of this machine passed on, as a container image would set them.
INHERITED_ENV: Final = ("PATH", "LANG", "LC_ALL", "TZ")


class RunRequestError(Exception):
    """The run cannot start; `problems` lists every reason (each names the flag or file)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class RunRequest:
    mode: str
    package_dir: Path
    root: Path
    configs: Mapping[str, Path] | None = None  # ConfigMap key -> local file; None keeps the payload's
    env: Mapping[str, str] = field(default_factory=dict)
    chroot: bool = False
    interrupt: Interrupt | None = None
    identity: layout.Identity = field(default_factory=layout.Identity)


@dataclass(frozen=True)
class NodeAction:
    """What the node did for one interrupt command the unprivileged agent recorded."""

    command: tuple[str, ...]
    effect: str


@dataclass(frozen=True)
class RunResult:
    code: int
    package: str
    version: str
    copy_dir: str  # as a host path
    state_dir: Path  # real locations under the root
    log_dir: Path
    node_actions: tuple[NodeAction, ...] = ()  # an unprivileged interrupt run: the node's part, in order

    @property
    def succeeded(self) -> bool:
        return self.code == 0


def check_request(request: RunRequest, *, is_root: bool) -> list[str]:
    """Everything wrong with the request, before anything is written."""
    problems: list[str] = []
    if request.mode not in modes.ALL_MODES:
        problems.append(
            f"mode {request.mode!r} is not an agent mode; use one of: {', '.join(modes.ALL_MODES)}"
        )
    if request.mode == modes.INTERRUPT and request.interrupt is None:
        problems.append(
            "the interrupt mode needs --interrupt TYPE (reboot, service, restartAllServices, noop)"
        )
    if not os.path.lexists(request.package_dir / layout.CONFIG_FILE):  # one that cannot be used: load_config
        problems.append(f"{request.package_dir}: no {layout.CONFIG_FILE}; give a package directory")
    if _is_this_machines_root(request.root):
        problems.append(
            f"--root {request.root} is this machine's /: give a scratch directory that stands for the node's "
            "root (it is created if missing)"
        )
    elif request.root.exists() and not request.root.is_dir():
        problems.append(f"--root {request.root} exists and is not a directory")
    for key, path in (request.configs or {}).items():
        problems.extend(f"--config {key}={path}: {problem}" for problem in config_map_key(key))
        problem = _config_file_problem(path)
        if problem is not None:
            problems.append(f"--config {key}={path}: {problem}")
    for name in request.env:
        problems.extend(f"--env {name}: {problem}" for problem in env_var_name(name))
        if name in OPERATOR_ENV:
            problems.append(
                f"--env {name}: set by the operator on every package pod; a package's env cannot change it"
            )
    if request.chroot and not is_root:
        problems.append("--chroot needs root (chroot is a privileged call); leave it out to run unprivileged")
    return problems


def _config_file_problem(path: Path) -> str | None:
    try:
        info = path.stat()
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return f"cannot be read: {exc.strerror}"
    if not stat.S_ISREG(info.st_mode):
        return f"{safefile.file_kind(info.st_mode)}, not a regular file; only regular files are read"
    if info.st_size > MAX_CONFIGMAP_BYTES:
        return (
            f"{info.st_size} bytes, more than a ConfigMap holds ({safefile.size_text(MAX_CONFIGMAP_BYTES)} "
            "in all), so no NodeWright could give it to the package"
        )
    return None


def _is_this_machines_root(root: Path) -> bool:
    try:
        return root.resolve() == Path("/").resolve()
    except OSError:
        return False


def stage(package_dir: Path, root: Path, copy_dir: str, configs: Mapping[str, Path] | None = None) -> Path:
    """Copy the payload to `<root><copy_dir>` as the package pod's init container does; returns it."""
    target = root / copy_dir.lstrip("/")
    _refuse_symlinks(root, target)
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for entry in layout.payload_entries(package_dir):
        destination = target / entry.relative
        if entry.kind == "dir":
            destination.mkdir()
        elif entry.kind == "symlink":
            os.symlink(entry.link_target, destination)
        else:
            shutil.copy2(entry.path, destination)
    if configs is not None:
        configmaps = target / layout.CONFIGMAP_DIR
        if configmaps.is_symlink() or configmaps.is_file():
            configmaps.unlink()
        elif configmaps.exists():
            shutil.rmtree(configmaps)
        configmaps.mkdir()
        for key, source in sorted(configs.items()):
            (configmaps / key).write_bytes(safefile.read_bytes(str(source), limit=MAX_CONFIGMAP_BYTES))
    return target


def _refuse_symlinks(root: Path, target: Path) -> None:
    """A symlink on the way to the copy directory could point out of the root; never follow one."""
    current = root
    for part in target.relative_to(root).parts:
        current = current / part
        if current.is_symlink():
            raise RunRequestError(
                [f"{current} is a symlink; the copy directory must be a plain path inside the root"]
            )


def agent_environment(
    request: RunRequest,
    package: str,
    version: str,
    *,
    machine: Mapping[str, str] | None = None,
    interrupt_run: str = "",
) -> dict[str, str]:
    """The agent container's environment: inherited basics, the operator's variables, the package env."""
    source = os.environ if machine is None else machine
    env = {name: source[name] for name in INHERITED_ENV if name in source}
    env.setdefault("PATH", DEFAULT_PATH)
    identity = request.identity
    resource_id = identity.resource_id(package, version, interrupt_run)
    for prefix in ("SKYHOOK", "NODEWRIGHT"):
        env[f"{prefix}_LOG_DIR"] = identity.log_dir
        env[f"{prefix}_ROOT_DIR"] = identity.state_dir
        env[f"{prefix}_RESOURCE_ID"] = resource_id
        env[f"{prefix}_NODE_ORDER"] = "0"
    env["COPY_RESOLV"] = "false"
    env["NODEWRIGHT_AGENT_CHROOT"] = "true" if request.chroot else "false"
    env.update(request.env)
    return env


def run(
    request: RunRequest,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    machine_env: Mapping[str, str] | None = None,
) -> RunResult:
    """Stage the package and run the agent once; raises RunRequestError or ConfigError before running."""
    problems = check_request(request, is_root=os.geteuid() == 0)
    if problems:
        raise RunRequestError(problems)
    config = load_config(request.package_dir / layout.CONFIG_FILE, check_files=False)
    package, version = config.package_name, config.package_version
    copy_dir = request.identity.copy_dir(package, version)
    request.root.mkdir(parents=True, exist_ok=True)
    stage(request.package_dir, request.root, copy_dir, request.configs)
    argv = [request.mode, str(request.root.resolve()), copy_dir]
    if request.mode == modes.INTERRUPT and request.interrupt is not None:
        argv.append(encode(request.interrupt))
    state_dir = request.root / request.identity.state_dir.lstrip("/")
    requests = state_dir / REQUESTS_FILE
    offset = _size(requests)
    # Each interrupt run is a new attempt, with flags of its own (the operator's `interrupt_run`): a second
    # `run interrupt` on the same root reboots it again instead of being skipped as done.
    interrupt_run = _interrupt_run() if request.mode == modes.INTERRUPT else ""
    code = agent_main(
        argv,
        environ=agent_environment(
            request, package, version, machine=machine_env, interrupt_run=interrupt_run
        ),
        stdout=stdout,
        stderr=stderr,
    )
    actions: tuple[NodeAction, ...] = ()
    if request.mode == modes.INTERRUPT and code == 0 and not request.chroot:
        actions = perform_interrupt(request.root, requests, offset)
    return RunResult(
        code=code,
        package=package,
        version=version,
        copy_dir=copy_dir,
        state_dir=state_dir,
        log_dir=request.root / request.identity.log_dir.lstrip("/") / package / version,
        node_actions=actions,
    )


def _interrupt_run() -> str:
    """A run id like the operator's (`<start, UTC>.<attempt>`), to the microsecond: unique per local run."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ") + ".1"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def perform_interrupt(root: Path, requests: Path, offset: int = 0) -> tuple[NodeAction, ...]:
    """The node's part of the interrupt commands recorded in `requests` after `offset`, played on `root`
    as the simulator's nodes play it (see the module docstring); nothing after a reboot runs."""
    node = hostshims.Node(root, root / hostshims.SIM_STATE_DIR)
    actions: list[NodeAction] = []
    for argv in hostshims.recorded_commands(requests, offset):
        program, args = os.path.basename(argv[0]), argv[1:]
        node.record(program, args)
        if hostshims.is_reboot(program, args):
            boot_id = str(uuid.uuid4())
            kernel = boot.boot(root, boot.BootFacts(boot_id=boot_id))
            running = f"kernel {kernel}" if kernel else "no kernel installed in the root"
            actions.append(
                NodeAction(
                    tuple(argv),
                    f"the root booted (boot id {boot_id}, {running}): /proc/sys reloaded from the sysctl "
                    "files, /proc/cmdline rebuilt from GRUB's defaults",
                )
            )
            break  # the machine went down: what the agent recorded after the reboot never ran
        said: list[str] = []
        exit_code = hostshims.perform(node, program, args, said.append, said.append)
        effect = f"done by the node's {program} stand-in (exit {exit_code})"
        actions.append(NodeAction(tuple(argv), "; ".join([effect, *said])))
    return tuple(actions)


__all__ = [
    "ConfigError",
    "NodeAction",
    "RunRequest",
    "RunRequestError",
    "RunResult",
    "agent_environment",
    "check_request",
    "perform_interrupt",
    "run",
    "stage",
]
