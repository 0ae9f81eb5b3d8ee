"""`config.json`, schema v1: what a package runs in each mode, validated before anything runs.

A package image carries `/skyhook-package/config.json` next to `skyhook_dir/` (its step scripts),
optionally `root_dir/` (files laid over the host root) and `configmaps/` (the package ConfigMap, mounted
by the operator). The file format is the reference agent's schema v1, so public package images load
unchanged:

    {"schema_version": "v1", "package_name": "tuning", "package_version": "1.2.0",
     "expected_config_files": ["sysctl.conf"],
     "modes": {"apply": [STEP, ...], "apply-check": [STEP, ...], ...}}

    STEP = {"name": "sysctl", "path": "apply_sysctl.sh", "arguments": ["env:TARGET"],
            "returncodes": [0], "on_host": true, "idempotence": false, "upgrade_step": false,
            "env": {"KEY": "value"}}

Every problem is collected before anything is reported, so a package author fixes them in one pass;
each message starts with the field path (`modes.apply[0].returncodes`). Rules, besides the field
types: `package_version` is a full semantic version; a mode that changes the node and has steps needs
its check mode with steps; `upgrade_step` steps only in upgrade modes and without arguments; every
step script is a regular file under `skyhook_dir/`; paths stay inside their directory, and so do the
symlinks a step script is reached through (an absolute one, or one climbing out of the package, is an
error naming the step and the target: the agent would make its target executable and run it as root).
A work step without a `<stem>_check<.ext>` check step, unknown fields and steps under `interrupt` are
warnings, not errors.

The file itself must be a regular file (symlinks followed) of at most 1 MiB, nested at most 32 levels:
a FIFO, a device (a symlink to `/dev/zero`), a larger file or deeper JSON is refused with one problem
naming the limit, before it is read or decoded (`safefile`).

`load_config` is also what `nodewright package validate` calls, so the CLI and the agent agree.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from nodewright.agent import modes, safefile

SCHEMA_VERSIONS: Final = ("v1",)
ENV_ARGUMENT_PREFIX: Final = "env:"
STEP_DIR: Final = "skyhook_dir"
_NUMBER = r"(?:0|[1-9][0-9]*)"
_PRERELEASE_ID = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_BUILD_ID = r"[0-9A-Za-z-]+"
SEMVER: Final = re.compile(
    rf"^{_NUMBER}\.{_NUMBER}\.{_NUMBER}"
    rf"(?:-{_PRERELEASE_ID}(?:\.{_PRERELEASE_ID})*)?"
    rf"(?:\+{_BUILD_ID}(?:\.{_BUILD_ID})*)?\Z"
)
#: config.json is a few KiB; a larger one is not a package's (it is read into memory whole).
MAX_CONFIG_BYTES: Final = 1024 * 1024
#: schema v1 is 5 levels deep (the file, modes, a mode's list, a step, its arguments or env).
MAX_CONFIG_DEPTH: Final = 32
STEP_NAME: Final = re.compile(r"^[A-Za-z0-9_.-]+\Z")
_TOP_LEVEL_FIELDS: Final = frozenset(
    {"schema_version", "package_name", "package_version", "expected_config_files", "modes", "root_dir"}
)
_STEP_FIELDS: Final = frozenset(
    {"name", "path", "arguments", "returncodes", "on_host", "idempotence", "upgrade_step", "env"}
)


class ConfigError(Exception):
    """config.json cannot be used; `errors` holds every problem, each starting with its field path."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(source, errors)

    def __str__(self) -> str:
        count = len(self.errors)
        if count == 1:
            return f"{self.source}: {self.errors[0]}"
        lines = [f"{self.source}: {count} problem{'s' if count != 1 else ''}:"]
        lines.extend(f"  - {error}" for error in self.errors)
        return "\n".join(lines)


@dataclass(frozen=True)
class Step:
    """One step of a mode. `idempotence=True` means the step handles re-runs itself and always runs."""

    name: str
    path: str
    arguments: tuple[str, ...]
    returncodes: tuple[int, ...]
    on_host: bool
    idempotence: bool
    upgrade_step: bool
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PackageConfig:
    schema_version: str
    package_name: str
    package_version: str
    expected_config_files: tuple[str, ...]
    modes: Mapping[str, tuple[Step, ...]]
    warnings: tuple[str, ...] = ()

    def steps(self, mode: str) -> tuple[Step, ...]:
        return self.modes.get(mode, ())


def load_config(path: str | os.PathLike[str], *, check_files: bool = True) -> PackageConfig:
    """Read and validate `<package>/config.json`; step scripts are looked up in `<package>/skyhook_dir`.

    Raises `ConfigError` with every problem found. `check_files=False` skips the script lookup (for a
    config.json checked on its own). The file must be a regular file (symlinks followed) of at most
    `MAX_CONFIG_BYTES`, nested at most `MAX_CONFIG_DEPTH` levels: anything else is refused with one
    problem saying so, before it is read or decoded.
    """
    source = os.fspath(path)
    try:
        text = safefile.read_text(source, limit=MAX_CONFIG_BYTES)
    except FileNotFoundError:
        raise ConfigError(
            source, ["file not found: a package needs config.json at its top, next to skyhook_dir/"]
        ) from None
    except safefile.Refused as exc:
        raise ConfigError(source, [exc.reason]) from None
    except OSError as exc:
        raise ConfigError(source, [f"cannot be read: {exc.strerror or exc}"]) from None
    if safefile.json_too_deep(text, MAX_CONFIG_DEPTH):
        raise ConfigError(
            source,
            [
                f"nested deeper than the {MAX_CONFIG_DEPTH}-level limit of arrays and objects "
                "(schema v1 needs 5); not decoded"
            ],
        )
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            source, [f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"]
        ) from None
    step_root = os.path.join(os.path.dirname(source), STEP_DIR) if check_files else None
    return parse_config(data, source=source, step_root=step_root)


def parse_config(data: object, *, source: str = "config.json", step_root: str | None = None) -> PackageConfig:
    """Validate decoded config.json data; `step_root` (the package's skyhook_dir) enables the file checks."""
    checker = _Checker()
    if not isinstance(data, dict):
        raise ConfigError(source, [f"(top level): expected a JSON object, got {_kind(data)}"])
    for key in sorted(set(data) - _TOP_LEVEL_FIELDS):
        checker.warn(key, "unknown field (ignored)")
    schema_version = checker.string(data, "schema_version", "")
    if schema_version is not None and schema_version not in SCHEMA_VERSIONS:
        checker.error(
            "schema_version", f"{schema_version!r} is not supported; use one of: {', '.join(SCHEMA_VERSIONS)}"
        )
    name = checker.string(data, "package_name", "")
    if name is not None and not _usable_file_name(name):
        checker.error(
            "package_name", f"{name!r} cannot name files (it names the flag, log and history files)"
        )
    version = checker.string(data, "package_version", "")
    if version is not None and not SEMVER.match(version):
        checker.error(
            "package_version", f"{version!r} is not a full semantic version such as 1.2.0 or 1.2.0-rc.1"
        )
    expected = checker.string_list(data, "expected_config_files", "")
    for index, item in enumerate(expected or ()):
        if not _relative_inside(item):
            checker.error(
                f"expected_config_files[{index}]",
                f"{item!r} must be a file name inside configmaps/ (relative, no '..')",
            )
    steps_by_mode = _parse_modes(data, checker, step_root)
    if checker.errors:
        raise ConfigError(source, checker.errors)
    assert schema_version is not None and name is not None and version is not None and expected is not None
    return PackageConfig(
        schema_version=schema_version,
        package_name=name,
        package_version=version,
        expected_config_files=tuple(expected),
        modes=steps_by_mode,
        warnings=tuple(checker.warnings),
    )


# ----------------------------------------------------------------------------------------------------
# Modes and steps


def _parse_modes(
    data: dict[str, object], checker: _Checker, step_root: str | None
) -> dict[str, tuple[Step, ...]]:
    raw_modes = checker.mapping(data, "modes")
    if raw_modes is None:
        return {}
    parsed: dict[str, tuple[Step, ...]] = {}
    for mode_name, raw_steps in raw_modes.items():
        where = f"modes.{mode_name}"
        if mode_name not in modes.ALL_MODES:
            checker.error(where, f"unknown mode{_suggestion(mode_name, modes.ALL_MODES)}")
            continue
        if not isinstance(raw_steps, list):
            checker.error(where, f"expected a list of steps, got {_kind(raw_steps)}")
            continue
        steps = [_parse_step(raw, f"{where}[{index}]", checker) for index, raw in enumerate(raw_steps)]
        parsed[mode_name] = tuple(step for step in steps if step is not None)
        if mode_name == modes.INTERRUPT and raw_steps:
            checker.warn(
                where, "steps are never run: the interrupt mode runs the interrupt the operator passes"
            )
    _check_modes(raw_modes, parsed, checker)
    if step_root is not None:
        _check_files(parsed, step_root, checker)
    _warn_missing_checks(parsed, checker)
    return parsed


def _parse_step(raw: object, where: str, checker: _Checker) -> Step | None:
    if not isinstance(raw, dict):
        checker.error(where, f"expected a step object, got {_kind(raw)}")
        return None
    for key in sorted(set(raw) - _STEP_FIELDS):
        checker.warn(f"{where}.{key}", "unknown step field (ignored)")
    before = len(checker.errors)
    name = checker.string(raw, "name", where)
    if name is not None and not STEP_NAME.match(name):
        checker.error(f"{where}.name", f"{name!r} may only use letters, digits, '_', '-' and '.'")
    path = checker.string(raw, "path", where)
    if path is not None and not _relative_inside(path):
        checker.error(f"{where}.path", f"{path!r} must be a path inside skyhook_dir/ (relative, no '..')")
    arguments = checker.string_list(raw, "arguments", where)
    for index, argument in enumerate(arguments or ()):
        if argument == ENV_ARGUMENT_PREFIX:
            checker.error(f"{where}.arguments[{index}]", "'env:' needs a variable name, e.g. 'env:NODE_NAME'")
    returncodes = checker.int_list(raw, "returncodes", where)
    on_host = checker.boolean(raw, "on_host", where)
    idempotence = checker.boolean(raw, "idempotence", where)
    upgrade_step = checker.boolean(raw, "upgrade_step", where)
    env = checker.string_map(raw, "env", where)
    if upgrade_step and arguments:
        checker.error(
            f"{where}.arguments",
            "an upgrade_step takes no arguments: it is given the previous and the new version",
        )
    if len(checker.errors) > before:
        return None
    assert name is not None and path is not None and arguments is not None and returncodes is not None
    assert on_host is not None and idempotence is not None and upgrade_step is not None
    return Step(
        name=name,
        path=path,
        arguments=tuple(arguments),
        returncodes=tuple(returncodes),
        on_host=on_host,
        idempotence=idempotence,
        upgrade_step=upgrade_step,
        env=dict(env or {}),
    )


def _check_modes(
    raw_modes: dict[str, object], parsed: dict[str, tuple[Step, ...]], checker: _Checker
) -> None:
    if not any(isinstance(steps, list) and steps for steps in raw_modes.values()):
        checker.error("modes", "no mode has any step; define at least the apply and apply-check steps")
    if not any(mode in raw_modes for mode in modes.WORK_MODES):
        checker.error(
            "modes", f"only check modes are defined; add at least one of {', '.join(modes.WORK_MODES)}"
        )
    for work, check in modes.CHECK_OF.items():
        already_reported = check in raw_modes and not isinstance(raw_modes[check], list)
        if _has_steps(raw_modes, work) and not _has_steps(raw_modes, check) and not already_reported:
            checker.error(
                f"modes.{check}",
                f"{work} has steps but {check} has none; add a check step that verifies {work}'s work",
            )
    for mode_name, steps in parsed.items():
        for index, step in enumerate(steps):
            if step.upgrade_step and mode_name not in modes.UPGRADE_MODES:
                checker.error(
                    f"modes.{mode_name}[{index}].upgrade_step",
                    "upgrade steps are only allowed in the upgrade and upgrade-check modes",
                )


def _has_steps(raw_modes: dict[str, object], mode: str) -> bool:
    steps = raw_modes.get(mode)
    return isinstance(steps, list) and len(steps) > 0


def _check_files(parsed: dict[str, tuple[Step, ...]], step_root: str, checker: _Checker) -> None:
    package_dir = os.path.dirname(step_root)
    for mode_name, steps in parsed.items():
        for index, step in enumerate(steps):
            problem = step_file_problem(package_dir, step)
            if problem is not None:
                checker.error(f"modes.{mode_name}[{index}].path", problem)


def step_file_problem(package_dir: str, step: Step) -> str | None:
    """What keeps `step`'s script from running: missing, not a regular file, or outside the package.

    A script reached through a symlink that is absolute or climbs out of the package is refused: the
    agent sets the execute bits of what the path resolves to and runs it as root, and an absolute
    target names another file in the build directory, in the container and on the node.
    """
    relative = f"{STEP_DIR}/{step.path}"
    try:
        resolved = safefile.inside(package_dir, relative)
    except OSError as exc:
        return f"step {step.name!r}: {relative} cannot be resolved: {exc.strerror}"
    if isinstance(resolved, safefile.Escape):
        return (
            f"step {step.name!r}: {relative} leads out of the package through the symlink "
            f"{resolved.link} -> {resolved.target!r}; ship the script in the package (a relative "
            "symlink that stays inside the package is fine)"
        )
    try:
        mode = os.stat(os.path.join(package_dir, resolved)).st_mode
    except OSError:
        where = os.path.join(package_dir, STEP_DIR)
        return f"{step.path!r} not found in {where}; add the script or fix the path"
    if not stat.S_ISREG(mode):
        return f"step {step.name!r}: {relative} is {safefile.file_kind(mode)}, not a script file"
    return None


def _warn_missing_checks(parsed: dict[str, tuple[Step, ...]], checker: _Checker) -> None:
    check_paths = {step.path for mode in modes.CHECK_MODES for step in parsed.get(mode, ())}
    for mode_name in modes.WORK_MODES:
        for index, step in enumerate(parsed.get(mode_name, ())):
            expected = check_script_name(step.path)
            if expected not in check_paths:
                checker.warn(
                    f"modes.{mode_name}[{index}].path",
                    f"no check step runs {expected!r}; a check per step shows that its work is complete",
                )


def check_script_name(path: str) -> str:
    """The conventional check script of a step script: `apply.sh` -> `apply_check.sh`."""
    head, _, tail = path.rpartition("/")
    stem, dot, extension = tail.rpartition(".")
    if not dot or not stem:
        stem, extension = tail, ""
    checked = f"{stem}_check.{extension}" if extension else f"{stem}_check"
    return f"{head}/{checked}" if head else checked


# ----------------------------------------------------------------------------------------------------
# Field readers


class _Checker:
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def error(self, where: str, message: str) -> None:
        self.errors.append(f"{where}: {message}")

    def warn(self, where: str, message: str) -> None:
        self.warnings.append(f"{where}: {message}")

    def mapping(self, obj: dict[str, object], key: str) -> dict[str, object] | None:
        value = self._value(obj, key, "", "an object of mode name -> list of steps", required=True)
        if value is _MISSING:
            return None
        if not isinstance(value, dict):
            self.error(key, f"expected an object of mode name -> list of steps, got {_kind(value)}")
            return None
        return value

    def _value(
        self, obj: dict[str, object], key: str, where: str, expected: str, *, required: bool
    ) -> object:
        path = f"{where}.{key}" if where else key
        if key not in obj:
            if required:
                self.error(path, f"required field missing ({expected})")
            return _MISSING
        return obj[key]

    def string(self, obj: dict[str, object], key: str, where: str) -> str | None:
        value = self._value(obj, key, where, "a string", required=True)
        if value is _MISSING:
            return None
        if not isinstance(value, str) or not value:
            self.error(_join(where, key), f"expected a non-empty string, got {_kind(value)}")
            return None
        return value

    def boolean(self, obj: dict[str, object], key: str, where: str) -> bool | None:
        value = self._value(obj, key, where, "true or false", required=True)
        if value is _MISSING:
            return None
        if not isinstance(value, bool):
            self.error(_join(where, key), f"expected true or false, got {_kind(value)}")
            return None
        return value

    def string_list(self, obj: dict[str, object], key: str, where: str) -> list[str] | None:
        value = self._value(obj, key, where, "a list of strings, may be empty", required=True)
        if value is _MISSING:
            return None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            self.error(_join(where, key), f"expected a list of strings, got {_kind(value)}")
            return None
        return list(value)

    def int_list(self, obj: dict[str, object], key: str, where: str) -> list[int] | None:
        value = self._value(obj, key, where, "a non-empty list of exit codes, e.g. [0]", required=True)
        if value is _MISSING:
            return None
        if not isinstance(value, list) or not value or not all(_is_int(item) for item in value):
            self.error(
                _join(where, key), f"expected a non-empty list of exit codes such as [0], got {_kind(value)}"
            )
            return None
        return [int(item) for item in value]

    def string_map(self, obj: dict[str, object], key: str, where: str) -> dict[str, str] | None:
        value = self._value(obj, key, where, "an object of strings", required=False)
        if value is _MISSING:
            return None
        if not isinstance(value, dict) or not all(isinstance(item, str) for item in value.values()):
            self.error(_join(where, key), f"expected an object of string values, got {_kind(value)}")
            return None
        return {str(name): str(item) for name, item in value.items()}


_MISSING: Final = object()


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: object) -> str:
    """The offending value as compact JSON, shortened, so the message shows what was written."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _suggestion(name: str, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{hint}; valid modes: {', '.join(choices)}"


def _relative_inside(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and "\x00" not in path and ".." not in parts


def _usable_file_name(name: str) -> bool:
    return name not in (".", "..") and "/" not in name and "\x00" not in name
