"""The agent's environment settings, read once at start and checked before anything runs.

The operator passes the agent's settings as container environment variables. The reference agent reads
`SKYHOOK_*` names; ours reads the `NODEWRIGHT_*` name first and the `SKYHOOK_*` name second, so pods built
by either operator work (ours sets both to the same value):

| Setting | Variables | Default |
|---|---|---|
| state directory on the host | `NODEWRIGHT_ROOT_DIR`, `SKYHOOK_ROOT_DIR` | `/etc/skyhook` |
| log directory on the host | `NODEWRIGHT_LOG_DIR`, `SKYHOOK_LOG_DIR` | `/var/log/skyhook` |
| payload in the image (legacy copy) | `NODEWRIGHT_DATA_DIR`, `SKYHOOK_DATA_DIR` | `/skyhook-package` |
| resource id `<nw>-<uid>-<gen>[-<run>]_<pkg>_<ver>` | `NODEWRIGHT_RESOURCE_ID`, `SKYHOOK_RESOURCE_ID` | - |
| write step log files | `NODEWRIGHT_AGENT_WRITE_LOGS`, `SKYHOOK_AGENT_WRITE_LOGS` | `true` |
| output read size (1 B to 1 MiB) | `NODEWRIGHT_AGENT_BUFFER_LIMIT`, `SKYHOOK_AGENT_BUFFER_LIMIT` | 8 KiB |
| output kept per step and stream (64 KiB to 1 GiB) | `NODEWRIGHT_AGENT_LOG_LIMIT` | 2 MiB |
| run steps whose flag exists | `OVERLAY_ALWAYS_RUN_STEP` | `false` |
| copy the container's resolv.conf to the host | `COPY_RESOLV` | `true` |
| chroot into the host root per step | `NODEWRIGHT_AGENT_CHROOT` | `true` when root, else `false` |
| wait for a step after SIGTERM before SIGKILL | `NODEWRIGHT_AGENT_STOP_TIMEOUT` (seconds, up to 3600) | 10 |

Booleans accept true/false, 1/0, yes/no (any case). Sizes are whole numbers of bytes in decimal digits,
seconds decimal numbers (`2.5`); each has the range above, outside which it means nothing (a pipe
never holds more than 1 MiB to read at once, and `os.read` allocates the whole size asked for; the
kubelet kills a pod once its grace period, 30 s for package pods, is over). A bad value is reported
with the variable's name and the range.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

DEFAULT_ROOT_DIR: Final = "/etc/skyhook"
DEFAULT_LOG_DIR: Final = "/var/log/skyhook"
DEFAULT_DATA_DIR: Final = "/skyhook-package"
DEFAULT_BUFFER_LIMIT: Final = 8 * 1024
BUFFER_LIMIT_RANGE: Final = (1, 1024 * 1024)
DEFAULT_LOG_LIMIT: Final = 2 * 1024 * 1024
LOG_LIMIT_RANGE: Final = (64 * 1024, 1024 * 1024 * 1024)
DEFAULT_STOP_TIMEOUT: Final = 10.0
STOP_TIMEOUT_RANGE: Final = (0.0, 3600.0)  # exclusive, inclusive

ROOT_DIR_VARS: Final = ("NODEWRIGHT_ROOT_DIR", "SKYHOOK_ROOT_DIR")
LOG_DIR_VARS: Final = ("NODEWRIGHT_LOG_DIR", "SKYHOOK_LOG_DIR")
DATA_DIR_VARS: Final = ("NODEWRIGHT_DATA_DIR", "SKYHOOK_DATA_DIR")
RESOURCE_ID_VARS: Final = ("NODEWRIGHT_RESOURCE_ID", "SKYHOOK_RESOURCE_ID")
WRITE_LOGS_VARS: Final = ("NODEWRIGHT_AGENT_WRITE_LOGS", "SKYHOOK_AGENT_WRITE_LOGS")
BUFFER_LIMIT_VARS: Final = ("NODEWRIGHT_AGENT_BUFFER_LIMIT", "SKYHOOK_AGENT_BUFFER_LIMIT")
ALWAYS_RUN_VAR: Final = "OVERLAY_ALWAYS_RUN_STEP"
COPY_RESOLV_VAR: Final = "COPY_RESOLV"
CHROOT_VAR: Final = "NODEWRIGHT_AGENT_CHROOT"
STOP_TIMEOUT_VAR: Final = "NODEWRIGHT_AGENT_STOP_TIMEOUT"
LOG_LIMIT_VAR: Final = "NODEWRIGHT_AGENT_LOG_LIMIT"

#: Suffixes shared by a SKYHOOK_<x> and a NODEWRIGHT_<x> variable; steps see both spellings.
MIRRORED_SUFFIXES: Final = (
    "DIR",
    "ROOT_DIR",
    "LOG_DIR",
    "DATA_DIR",
    "RESOURCE_ID",
    "NODE_ORDER",
    "AGENT_WRITE_LOGS",
    "AGENT_BUFFER_LIMIT",
)
_DIGITS: Final = re.compile(r"[0-9]+\Z")
_DECIMAL: Final = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\Z")
_TRUE: Final = frozenset({"true", "1", "yes"})
_FALSE: Final = frozenset({"false", "0", "no"})


class SettingsError(Exception):
    """One or more environment variables have values the agent cannot use."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("; ".join(errors))


@dataclass(frozen=True)
class Settings:
    root_dir: str
    log_dir: str
    data_dir: str
    resource_id: str | None
    write_logs: bool
    buffer_limit: int
    log_limit: int
    always_run_steps: bool
    copy_resolv: bool
    chroot: bool
    stop_timeout: float


@dataclass(frozen=True)
class ResourceId:
    """`<nodewright>-<uid>-<generation>[-<run>]_<package>_<version>`: the package pod's identity (an
    interrupt pod's carries its attempt's run, so its flags are its own)."""

    text: str
    package: str
    version: str


def read_settings(environ: Mapping[str, str], *, is_root: bool) -> Settings:
    """Settings from the environment; raises `SettingsError` naming every bad variable."""
    errors: list[str] = []
    root_dir = _absolute_dir(environ, ROOT_DIR_VARS, DEFAULT_ROOT_DIR, errors)
    log_dir = _absolute_dir(environ, LOG_DIR_VARS, DEFAULT_LOG_DIR, errors)
    data_dir = _absolute_dir(environ, DATA_DIR_VARS, DEFAULT_DATA_DIR, errors)
    resource_id = _first(environ, RESOURCE_ID_VARS)
    write_logs = _boolean(environ, WRITE_LOGS_VARS, True, errors)
    always_run = _boolean(environ, (ALWAYS_RUN_VAR,), False, errors)
    copy_resolv = _boolean(environ, (COPY_RESOLV_VAR,), True, errors)
    chroot = _boolean(environ, (CHROOT_VAR,), is_root, errors)
    if chroot and not is_root:
        errors.append(
            f"{CHROOT_VAR}=true needs root (chroot is a privileged call): run the agent as root "
            f"or set {CHROOT_VAR}=false to run steps without chroot"
        )
    buffer_limit = _bytes(environ, BUFFER_LIMIT_VARS, DEFAULT_BUFFER_LIMIT, BUFFER_LIMIT_RANGE, errors)
    log_limit = _bytes(environ, (LOG_LIMIT_VAR,), DEFAULT_LOG_LIMIT, LOG_LIMIT_RANGE, errors)
    stop_timeout = _seconds(environ, (STOP_TIMEOUT_VAR,), DEFAULT_STOP_TIMEOUT, STOP_TIMEOUT_RANGE, errors)
    if errors:
        raise SettingsError(errors)
    return Settings(
        root_dir=root_dir,
        log_dir=log_dir,
        data_dir=data_dir,
        resource_id=resource_id or None,
        write_logs=write_logs,
        buffer_limit=buffer_limit,
        log_limit=log_limit,
        always_run_steps=always_run,
        copy_resolv=copy_resolv,
        chroot=chroot,
        stop_timeout=stop_timeout,
    )


def parse_resource_id(text: str) -> ResourceId:
    """Split a resource id into package and version; raises ValueError with what is wrong."""
    owner, sep, rest = text.partition("_")
    package, sep2, version = rest.rpartition("_")
    if not (sep and sep2 and owner and package and version):
        raise ValueError(
            f"resource id {text!r} is not <nodewright>-<uid>-<generation>_<package>_<version> "
            f"(set {RESOURCE_ID_VARS[0]} or {RESOURCE_ID_VARS[1]} as the operator does)"
        )
    return ResourceId(text=text, package=package, version=version)


def mirrored_names(environ: Mapping[str, str]) -> dict[str, str]:
    """For each SKYHOOK_<x>/NODEWRIGHT_<x> pair with one side set, the other side with the same value."""
    extra: dict[str, str] = {}
    for suffix in MIRRORED_SUFFIXES:
        ours, theirs = f"NODEWRIGHT_{suffix}", f"SKYHOOK_{suffix}"
        if ours in environ and theirs not in environ:
            extra[theirs] = environ[ours]
        elif theirs in environ and ours not in environ:
            extra[ours] = environ[theirs]
    return extra


def parse_boolean(text: str) -> bool | None:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    return None


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        if name in environ:
            return environ[name]
    return None


def _which(environ: Mapping[str, str], names: tuple[str, ...]) -> str:
    return next((name for name in names if name in environ), names[0])


def _boolean(environ: Mapping[str, str], names: tuple[str, ...], default: bool, errors: list[str]) -> bool:
    raw = _first(environ, names)
    if raw is None or raw == "":
        return default
    value = parse_boolean(raw)
    if value is None:
        errors.append(f"{_which(environ, names)}={raw!r}: expected true or false")
        return default
    return value


def _bytes(
    environ: Mapping[str, str],
    names: tuple[str, ...],
    default: int,
    limits: tuple[int, int],
    errors: list[str],
) -> int:
    raw = _first(environ, names)
    if raw is None or raw == "":
        return default
    text = raw.strip()
    lowest, highest = limits
    if _DIGITS.match(text) and len(text) <= 12 and lowest <= int(text) <= highest:
        return int(text)
    errors.append(
        f"{_which(environ, names)}={raw!r}: expected a whole number of bytes from {lowest} to {highest}"
    )
    return default


def _seconds(
    environ: Mapping[str, str],
    names: tuple[str, ...],
    default: float,
    limits: tuple[float, float],
    errors: list[str],
) -> float:
    raw = _first(environ, names)
    if raw is None or raw == "":
        return default
    text = raw.strip()
    above, highest = limits
    if _DECIMAL.match(text) and len(text) <= 20 and above < float(text) <= highest:
        return float(text)
    errors.append(
        f"{_which(environ, names)}={raw!r}: expected a number of seconds greater than {above:g} "
        f"and at most {highest:g}"
    )
    return default


def _absolute_dir(environ: Mapping[str, str], names: tuple[str, ...], default: str, errors: list[str]) -> str:
    raw = _first(environ, names)
    if raw is None or raw == "":
        return default
    parts = [part for part in raw.split("/") if part not in ("", ".")]
    if not raw.startswith("/") or ".." in parts or "\x00" in raw:
        errors.append(f"{_which(environ, names)}={raw!r}: expected an absolute path on the host without '..'")
        return default
    return "/" + "/".join(parts)
