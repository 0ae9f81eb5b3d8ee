"""Host settings packages write, read from their ConfigMaps: which sysctl and kernel parameters, which
values, and where two packages disagree (pure).

A node has one value per sysctl and one kernel command line. Two packages that set the same key to
different values on one node fight: the one that runs last wins, the other's check fails (or, worse,
passes at apply time and fails after the next reboot), and the rollout halts on a node for reasons
neither package shows. This module finds such pairs before a node sees them, from the NodeWright specs
alone: `nodewright package validate -f` and the admission webhook (a warning naming both packages) use
it.

A package's settings are visible when its ConfigMap carries them in one of these forms (docs/packages.md,
"Declaring host settings"); other keys are the package's own business and are not read:

- **sysctl settings** under `sysctl.conf`, or any key ending in `sysctl.conf` (`90-gpu-sysctl.conf`), in
  sysctl.d(5) form: `key = value` lines, `#`/`;` comments, a leading `-` (ignore errors) dropped, `/`
  in keys read as `.`;
- **kernel parameters** under `grub.conf` (or a key ending in it) or `cmdline`: whitespace-separated
  `name[=value]`, `#` comments; `-` and `_` in names are one parameter, as the kernel reads them;
- **both**, in the reference `tuning` package's `overrides` (recognised beside its `accelerator` key):
  lines `sysctl KEY VALUE` / `grub KEY VALUE` (`-`: a parameter without value; `!`: a removal, which
  sets nothing);
- **`crashkernel=`**, the value of a `crashkernel` key (the reference `kdump` package's).

The first two are the formats of NVIDIA's reference `tuning` package and of sysctl.d/GRUB themselves,
so a package that takes its settings that way is covered by following them; the last two are this
repository's `tuning` and `kdump` packages. `tuning`'s intent table (`accelerator` x `workload`) lives in
its image and is not seen here: only its `overrides` are. Values compare after
whitespace is collapsed (`4096  131072` and `4096 131072` are one value). Within one package a key set
twice is the package's own order (the last one counts), never a conflict.

A conflict is one key with two different values from two packages, each named with its NodeWright, its
ConfigMap key and the value. Whether two NodeWrights can meet on a node is a question for the cluster
(their selectors' intersection, `selector_intersection`, sent to the API server as a label selector);
two packages of one NodeWright always meet.

Everything here reads NodeWright objects as plain mappings (`metadata.name`, `spec.packages`,
`spec.nodeSelectors`), leniently: `nodewright package validate -f` runs it on manifests nobody has
validated yet, without pydantic (package authoring starts fast), and a shape it cannot read is simply
nothing to compare.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

_SYSCTL_KEY: Final = re.compile(r"^[A-Za-z0-9_*][A-Za-z0-9_.*/-]*$")
_PARAM_NAME: Final = re.compile(r"^[A-Za-z0-9_.-]+$")


class SettingKind(StrEnum):
    SYSCTL = "sysctl"
    KERNEL_PARAMETER = "kernel parameter"


@dataclass(frozen=True, slots=True)
class HostSetting:
    kind: SettingKind
    key: str
    value: str
    """Whitespace collapsed; "" for a kernel parameter without a value (`nosmt`)."""
    source: str
    """The ConfigMap key it was read from."""


@dataclass(frozen=True, slots=True)
class PackageSettings:
    settings: tuple[HostSetting, ...]
    problems: tuple[str, ...]
    """Lines of a recognised key that do not parse (`sysctl.conf line 3: 'x' is not key = value`)."""


@dataclass(frozen=True, slots=True)
class Writer:
    """Who writes a setting: a package of a NodeWright, and where in its ConfigMap."""

    nodewright: str
    package: str
    source: str
    value: str

    def describe(self) -> str:
        shown = self.value if self.value else "(set, without a value)"
        return (
            f"package {self.package!r} of NodeWright {self.nodewright!r} sets {shown}"
            f" (configMap key {self.source})"
        )


@dataclass(frozen=True, slots=True)
class Conflict:
    kind: SettingKind
    key: str
    first: Writer
    second: Writer

    def describe(self) -> str:
        return (
            f"{self.kind} {self.key}: {self.first.describe()}, {self.second.describe()}; on a node both"
            " reach, the one that runs last wins and the other's check fails -- give both the same value or"
            " leave the key to one package"
        )


# ----------------------------------------------------------------------------------------------------
# Reading one package's ConfigMap


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _content_lines(text: str, comments: str) -> Iterable[tuple[int, str]]:
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and line[0] not in comments:
            yield number, line


def _sysctl(source: str, text: str) -> tuple[list[HostSetting], list[str]]:
    settings, problems = [], []
    for number, line in _content_lines(text, "#;"):
        key, sep, value = line.removeprefix("-").partition("=")
        key = key.strip().replace("/", ".")
        if not sep or not _SYSCTL_KEY.match(key):
            problems.append(f"{source} line {number}: {line[:80]!r} is not `key = value`")
            continue
        settings.append(HostSetting(SettingKind.SYSCTL, key, _collapse(value), source))
    return settings, problems


def _parameter(source: str, token: str) -> HostSetting | None:
    name, sep, value = token.partition("=")
    if not _PARAM_NAME.match(name):
        return None
    return HostSetting(SettingKind.KERNEL_PARAMETER, name.replace("-", "_"), value if sep else "", source)


def _kernel(source: str, text: str) -> tuple[list[HostSetting], list[str]]:
    settings, problems = [], []
    for number, line in _content_lines(text, "#"):
        for token in line.split():
            found = _parameter(source, token)
            if found is None:
                problems.append(f"{source} line {number}: {token[:80]!r} is not a kernel parameter")
            else:
                settings.append(found)
    return settings, problems


def _tuning_overrides(source: str, text: str) -> tuple[list[HostSetting], list[str]]:
    settings, problems = [], []
    for number, line in _content_lines(text, "#"):
        fields = line.split(None, 2)
        if len(fields) < 3 or fields[0] not in ("sysctl", "grub", "power"):
            problems.append(f"{source} line {number}: {line[:80]!r} is not `KIND KEY VALUE`")
            continue
        kind, key, value = fields
        if value == "!" or kind == "power":
            continue  # a removal writes nothing; power settings are sysfs writes, not sysctl keys
        if kind == "sysctl":
            settings.append(HostSetting(SettingKind.SYSCTL, key, _collapse(value), source))
        else:
            name = key.replace("-", "_")
            settings.append(
                HostSetting(SettingKind.KERNEL_PARAMETER, name, "" if value == "-" else value, source)
            )
    return settings, problems


def _reader(key: str, config_map: Mapping[str, str]) -> str | None:
    if key.endswith("sysctl.conf"):
        return "sysctl"
    if key.endswith("grub.conf") or key == "cmdline":
        return "kernel"
    if key == "overrides" and "accelerator" in config_map:
        return "tuning"
    if key == "crashkernel":
        return "crashkernel"
    return None


def _crashkernel(source: str, text: str) -> tuple[list[HostSetting], list[str]]:
    value = _collapse(text)
    if not value or " " in value:
        return [], [f"{source}: {text[:80]!r} is not one crashkernel= value"]
    return [HostSetting(SettingKind.KERNEL_PARAMETER, "crashkernel", value, source)], []


_READERS: Final = {
    "sysctl": _sysctl,
    "kernel": _kernel,
    "tuning": _tuning_overrides,
    "crashkernel": _crashkernel,
}


def package_settings(config_map: Mapping[str, str] | None) -> PackageSettings:
    """The host settings one package's ConfigMap declares (module docstring), last value per key."""
    latest: dict[tuple[SettingKind, str], HostSetting] = {}
    problems: list[str] = []
    for key in sorted(config_map or {}):
        reader = _reader(key, config_map or {})
        text = (config_map or {})[key]
        if reader is None or not isinstance(text, str):
            continue
        found, bad = _READERS[reader](key, text)
        problems.extend(bad)
        for setting in found:
            latest[(setting.kind, setting.key)] = setting
    return PackageSettings(tuple(latest.values()), tuple(problems))


# ----------------------------------------------------------------------------------------------------
# Conflicts


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def nodewright_name(obj: Mapping[str, Any]) -> str:
    return str(_mapping(obj.get("metadata")).get("name") or "")


def node_selector(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(_mapping(obj.get("spec")).get("nodeSelectors"))


def writers(nodewright: Mapping[str, Any]) -> dict[tuple[SettingKind, str], list[Writer]]:
    """Every (kind, key) the NodeWright's packages set, with who sets it to what."""
    out: dict[tuple[SettingKind, str], list[Writer]] = {}
    name = nodewright_name(nodewright)
    packages = _mapping(_mapping(nodewright.get("spec")).get("packages"))
    for package_key in sorted(packages):
        config_map = _mapping(_mapping(packages[package_key]).get("configMap"))
        for setting in package_settings(config_map).settings:
            writer = Writer(name, str(package_key), setting.source, setting.value)
            out.setdefault((setting.kind, setting.key), []).append(writer)
    return out


def conflicts_within(nodewright: Mapping[str, Any]) -> list[Conflict]:
    """Pairs of packages of one NodeWright that set one key to different values."""
    found: list[Conflict] = []
    for (kind, key), listed in sorted(writers(nodewright).items()):
        for index, first in enumerate(listed):
            later = listed[index + 1 :]
            found.extend(
                Conflict(kind, key, first, second) for second in later if second.value != first.value
            )
    return found


def conflicts_between(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[Conflict]:
    """Pairs (a package of `ours`, a package of `theirs`) that set one key to different values."""
    mine, other = writers(ours), writers(theirs)
    found: list[Conflict] = []
    for kind, key in sorted(mine.keys() & other.keys()):
        found.extend(
            Conflict(kind, key, a, b)
            for a in mine[(kind, key)]
            for b in other[(kind, key)]
            if a.value != b.value
        )
    return found


# ----------------------------------------------------------------------------------------------------
# Where two NodeWrights meet


def _requirements(selector: Mapping[str, Any]) -> tuple[dict[str, str], list[Mapping[str, Any]]]:
    labels = {str(k): str(v) for k, v in _mapping(selector.get("matchLabels")).items()}
    expressions = [e for e in selector.get("matchExpressions") or [] if isinstance(e, Mapping)]
    return labels, expressions


def _expression(req: Mapping[str, Any]) -> str:
    key, operator = str(req.get("key") or ""), str(req.get("operator") or "")
    values = ",".join(str(v) for v in req.get("values") or [])
    return {
        "In": f"{key} in ({values})",
        "NotIn": f"{key} notin ({values})",
        "Exists": key,
        "DoesNotExist": f"!{key}",
    }.get(operator, key)


def selector_intersection(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """The label selector (API query syntax) of the nodes both `nodeSelectors` select; "" for every node;
    None when no node can match both (one label required with two different values)."""
    labels_a, expressions_a = _requirements(a)
    labels_b, expressions_b = _requirements(b)
    for key in labels_a.keys() & labels_b.keys():
        if labels_a[key] != labels_b[key]:
            return None
    merged = {**labels_a, **labels_b}
    terms = [f"{key}={value}" for key, value in sorted(merged.items())]
    terms += [_expression(r) for r in [*expressions_a, *expressions_b]]
    return ",".join(terms)
