"""Codec of the per-node, per-NodeWright state annotation `nodewright.io/state.<nw>`.

The annotation is the source of truth for what one NodeWright has done on one node: which package
versions are installed, which stage each one is at, how many attempts a failing stage has used, whether
this NodeWright cordoned the node, and where the node sits in the current rollout. The operator can be
restarted at any moment and continue from it without re-running finished work, so the codec is strict:
anything it cannot fully understand raises `MalformedNodeState` and the controller must then leave the
annotation alone (never "repair" data it could not parse) and surface the error.

Wire format (version 1): compact JSON, sorted keys, no spaces, optional fields omitted when at their
default, so that a node with a handful of packages costs a few hundred bytes (annotations on one object
share a 256 KiB budget with every other tool's annotations).

    {"v": 1,                                  schema version (required)
     "p": {"<name>|<version>": {              one entry per installed/installing package version
            "s": "apply",                     stage (PackageStage)
            "t": "in_progress",               state (PackageState)
            "n": 1,                           attempts used at this stage (omitted when 0)
            "b": "2024-01-01T00:00:00Z",      first start of the current stage
            "u": "2024-01-01T00:00:05Z",      last update
            "i": "ghcr.io/x/pkg:1.2.3",       image reference run for this entry
            "c": {"<key>": "<8 hex>"},        per-key hash of the configMap data last applied
            "k": ["<key>", ...],              configMap keys changed by the config run in progress
            "e": "message",                   last error, short
            "r": "2024-...Z",                 earliest time of the next attempt (after a failure)
            "h": "<hex>",                     spec hash of the pod of the current attempt
            "x": "2024-...Z",                 first time the current pod was seen failing to pull
            "fu": "2/7/2024-...Z",            erroring: the admission it gave up under (batch/order/at)
            "dr": "apply-check: ...",         complete, but its last drift check failed (the reason)
            "rp": true,                       the run in progress repairs drift (steps run again)
            "su": true}},                     a run cut short by a spec of another version: it resumes
                                              only under a fresh admission (omitted when false)
     "a": {"c": "gpu", "b": 2, "o": 7, "at": "2024-...Z"},   rollout admission (omitted when absent)
     "cd": true,                              this NodeWright cordoned the node (omitted when false)
     "bid": "<bootID>",                       boot ID at interrupt start / at completion
     "ia": "2024-...Z",                       when the current node interrupt started
     "g": 3,                                  NodeWright generation last completed on the node
     "kv": "5.15.0-1063-nvidia",              node kernel version when last checked (drift re-check)
     "oi": "Ubuntu 22.04.4 LTS"}              node OS image when last checked

Several versions of a package may be present at once (keys are `name|version`): under the reference's
"D2" rule a present entry means "files of this version may remain on the host", so an older or newer
version is kept next to the spec version after a downgrade without uninstall.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Final, TypeVar

SCHEMA_VERSION: Final = 1
MAX_ERROR_LENGTH: Final = 512
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
_HEX = re.compile(r"^[0-9a-f]{1,64}$")
_E = TypeVar("_E", bound=StrEnum)


class MalformedNodeState(ValueError):
    """The annotation cannot be understood; the controller must not overwrite it."""


class PackageStage(StrEnum):
    APPLY = "apply"
    CONFIG = "config"
    UPGRADE = "upgrade"
    UNINSTALL = "uninstall"
    INTERRUPT = "interrupt"
    POST_INTERRUPT = "post-interrupt"
    UNINSTALL_INTERRUPT = "uninstall-interrupt"


class PackageState(StrEnum):
    PENDING = "pending"  # the stage is next but its pod has not been created yet
    IN_PROGRESS = "in_progress"  # a pod exists (or is being retried after a failed attempt)
    COMPLETE = "complete"  # the package is fully done at this version (only at its last stage)
    ERRORING = "erroring"  # attempts exhausted: needs a spec change to retry
    SKIPPED = "skipped"  # interrupt merged into another package's interrupt pod


@dataclass(frozen=True, slots=True)
class Admission:
    """The node was picked into batch `batch` of `compartment`; `order` is stable for the rollout."""

    compartment: str
    batch: int
    order: int
    at: str


@dataclass(frozen=True, slots=True)
class PackageEntry:
    name: str
    version: str
    stage: PackageStage
    state: PackageState
    attempts: int = 0
    started: str | None = None
    updated: str | None = None
    image: str = ""
    config: tuple[tuple[str, str], ...] = ()
    changed: tuple[str, ...] = ()
    error: str = ""
    retry_at: str | None = None
    spec_hash: str = ""
    pull_error_since: str | None = None
    failed_under: str = ""  # erroring: "<batch>/<order>/<at>" of the admission it gave up under ("" none)
    drifted: str = ""  # complete, but the last drift check failed: why ("" not drifted)
    repair: bool = False  # the run in progress re-applies after drift (the agent re-runs flagged steps)
    # In flight when the spec moved to another version of the package (its pod was removed): the run
    # resumes only once the rollout admits the node again (`plan.node`, "suspended runs").
    suspended: bool = False

    @property
    def key(self) -> str:
        return entry_key(self.name, self.version)

    @property
    def config_map(self) -> dict[str, str]:
        return dict(self.config)


@dataclass(frozen=True, slots=True)
class NodeState:
    packages: tuple[PackageEntry, ...] = ()
    admission: Admission | None = None
    cordoned: bool = False
    boot_id: str | None = None
    interrupt_at: str | None = None
    generation: int | None = None
    kernel: str | None = None  # status.nodeInfo.kernelVersion when last checked (drift re-check signal)
    os_image: str | None = None  # status.nodeInfo.osImage when last checked
    version: int = field(default=SCHEMA_VERSION)

    def __post_init__(self) -> None:
        keys = [e.key for e in self.packages]
        if len(set(keys)) != len(keys):
            raise ValueError(f"duplicate package entries: {sorted(keys)}")
        # Canonical order makes equality (and the encoding) independent of construction order.
        object.__setattr__(self, "packages", tuple(sorted(self.packages, key=lambda e: e.key)))

    def entry(self, name: str, version: str) -> PackageEntry | None:
        for e in self.packages:
            if e.name == name and e.version == version:
                return e
        return None

    def entries_for(self, name: str) -> tuple[PackageEntry, ...]:
        return tuple(e for e in self.packages if e.name == name)

    def with_entry(self, entry: PackageEntry) -> NodeState:
        rest = tuple(e for e in self.packages if e.key != entry.key)
        return replace(self, packages=(*rest, entry))

    def without(self, name: str, version: str) -> NodeState:
        return replace(self, packages=tuple(e for e in self.packages if e.key != entry_key(name, version)))


def entry_key(name: str, version: str) -> str:
    return f"{name}|{version}"


ERROR_HEAD: Final = 160


def truncate_error(message: str) -> str:
    """Errors are kept short (the annotation is not a log store), keeping both ends: the head says what
    failed, the tail holds the last log lines of the failing step, which say why."""
    if len(message) <= MAX_ERROR_LENGTH:
        return message
    tail = MAX_ERROR_LENGTH - ERROR_HEAD - 3
    return message[:ERROR_HEAD] + " … " + message[-tail:]


# ----------------------------------------------------------------------------------------------------
# Encoding


def _entry_to_json(e: PackageEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"s": e.stage.value, "t": e.state.value}
    if e.attempts:
        out["n"] = e.attempts
    optional: dict[str, Any] = {
        "b": e.started,
        "u": e.updated,
        "i": e.image or None,
        "e": e.error or None,
        "r": e.retry_at,
        "h": e.spec_hash or None,
        "x": e.pull_error_since,
        "fu": e.failed_under or None,
        "dr": e.drifted or None,
        "rp": True if e.repair else None,
        "su": True if e.suspended else None,
    }
    out.update({k: v for k, v in optional.items() if v is not None})
    if e.config:
        out["c"] = dict(e.config)
    if e.changed:
        out["k"] = sorted(e.changed)
    return out


def encode(state: NodeState) -> str:
    """Deterministic compact JSON (sorted keys) of `state`."""
    doc: dict[str, Any] = {"v": state.version, "p": {e.key: _entry_to_json(e) for e in state.packages}}
    if state.admission is not None:
        a = state.admission
        doc["a"] = {"c": a.compartment, "b": a.batch, "o": a.order, "at": a.at}
    if state.cordoned:
        doc["cd"] = True
    if state.boot_id is not None:
        doc["bid"] = state.boot_id
    if state.interrupt_at is not None:
        doc["ia"] = state.interrupt_at
    if state.generation is not None:
        doc["g"] = state.generation
    if state.kernel is not None:
        doc["kv"] = state.kernel
    if state.os_image is not None:
        doc["oi"] = state.os_image
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# ----------------------------------------------------------------------------------------------------
# Decoding: every field is checked; unknown fields are errors (a newer writer bumps "v").


def _fail(path: str, problem: str) -> MalformedNodeState:
    return MalformedNodeState(f"node state {path}: {problem}")


def _obj(value: Any, path: str, allowed: set[str], required: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, f"expected an object, got {type(value).__name__}")
    unknown = set(value) - allowed
    if unknown:
        raise _fail(path, f"unknown field(s) {sorted(unknown)}")
    missing = required - set(value)
    if missing:
        raise _fail(path, f"missing field(s) {sorted(missing)}")
    return value


def _str(value: Any, path: str, *, nonempty: bool = True, limit: int = 1024) -> str:
    if not isinstance(value, str):
        raise _fail(path, f"expected a string, got {type(value).__name__}")
    if nonempty and not value:
        raise _fail(path, "must not be empty")
    if len(value) > limit:
        raise _fail(path, f"longer than {limit} characters")
    return value


def _int(value: Any, path: str, *, minimum: int = 0) -> int:
    # bool is an int subclass in Python; JSON true must not be read as 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path, f"expected an integer, got {type(value).__name__}")
    if value < minimum:
        raise _fail(path, f"must be >= {minimum}")
    return value


def _ts(value: Any, path: str) -> str:
    text = _str(value, path, limit=64)
    if not _TIMESTAMP.match(text):
        raise _fail(path, f"not an RFC3339 timestamp: {text!r}")
    return text


def _bool(doc: Mapping[str, Any], key: str, path: str) -> bool:
    value = doc.get(key, False)
    if not isinstance(value, bool):
        raise _fail(path, "expected a boolean")
    return value


def _opt_ts(doc: Mapping[str, Any], key: str, path: str) -> str | None:
    return _ts(doc[key], f"{path}.{key}") if key in doc else None


def _enum(cls: type[_E], value: Any, path: str) -> _E:
    text = _str(value, path, limit=64)
    try:
        return cls(text)
    except ValueError:
        raise _fail(path, f"unknown value {text!r}; expected one of {[m.value for m in cls]}") from None


def _entry(key: str, value: Any) -> PackageEntry:
    path = f"p[{key!r}]"
    name, sep, version = key.partition("|")
    if not sep or not name or not version or "|" in version:
        raise _fail(path, "key must be '<name>|<version>'")
    fields = {"s", "t", "n", "b", "u", "i", "c", "k", "e", "r", "h", "x", "fu", "dr", "rp", "su"}
    doc = _obj(value, path, fields, {"s", "t"})
    config: tuple[tuple[str, str], ...] = ()
    if "c" in doc:
        raw = doc["c"]
        if not isinstance(raw, dict):
            raise _fail(f"{path}.c", "expected an object")
        pairs = []
        for k, h in raw.items():
            hv = _str(h, f"{path}.c[{k!r}]", limit=64)
            if not _HEX.match(hv):
                raise _fail(f"{path}.c[{k!r}]", "expected a hex hash")
            pairs.append((_str(k, f"{path}.c", limit=253), hv))
        config = tuple(sorted(pairs))
    changed: tuple[str, ...] = ()
    if "k" in doc:
        raw_k = doc["k"]
        if not isinstance(raw_k, list):
            raise _fail(f"{path}.k", "expected a list")
        changed = tuple(sorted({_str(k, f"{path}.k", limit=253) for k in raw_k}))
    spec_hash = _str(doc["h"], f"{path}.h", limit=64) if "h" in doc else ""
    if spec_hash and not _HEX.match(spec_hash):
        raise _fail(f"{path}.h", "expected a hex hash")
    return PackageEntry(
        name=name,
        version=version,
        stage=_enum(PackageStage, doc["s"], f"{path}.s"),
        state=_enum(PackageState, doc["t"], f"{path}.t"),
        attempts=_int(doc["n"], f"{path}.n") if "n" in doc else 0,
        started=_opt_ts(doc, "b", path),
        updated=_opt_ts(doc, "u", path),
        image=_str(doc["i"], f"{path}.i", limit=1024) if "i" in doc else "",
        config=config,
        changed=changed,
        error=_str(doc["e"], f"{path}.e", nonempty=False, limit=MAX_ERROR_LENGTH) if "e" in doc else "",
        retry_at=_opt_ts(doc, "r", path),
        spec_hash=spec_hash,
        pull_error_since=_opt_ts(doc, "x", path),
        failed_under=_str(doc["fu"], f"{path}.fu", limit=128) if "fu" in doc else "",
        drifted=_str(doc["dr"], f"{path}.dr", limit=MAX_ERROR_LENGTH) if "dr" in doc else "",
        repair=_bool(doc, "rp", f"{path}.rp"),
        suspended=_bool(doc, "su", f"{path}.su"),
    )


def decode(text: str) -> NodeState:
    """Parse the annotation value; raise `MalformedNodeState` for anything not exactly understood."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise MalformedNodeState(f"node state is not valid JSON: {exc}") from None
    root = _obj(doc, "root", {"v", "p", "a", "cd", "bid", "ia", "g", "kv", "oi"}, {"v", "p"})
    version = _int(root["v"], "v", minimum=1)
    if version != SCHEMA_VERSION:
        raise _fail("v", f"schema version {version} is not supported (this operator reads {SCHEMA_VERSION})")
    packages = root["p"]
    if not isinstance(packages, dict):
        raise _fail("p", "expected an object")
    entries = tuple(_entry(k, v) for k, v in packages.items())
    admission = None
    if "a" in root:
        a = _obj(root["a"], "a", {"c", "b", "o", "at"}, {"c", "b", "o", "at"})
        admission = Admission(
            compartment=_str(a["c"], "a.c", limit=253),
            batch=_int(a["b"], "a.b"),
            order=_int(a["o"], "a.o"),
            at=_ts(a["at"], "a.at"),
        )
    cordoned = root.get("cd", False)
    if not isinstance(cordoned, bool):
        raise _fail("cd", "expected a boolean")
    return NodeState(
        packages=entries,
        admission=admission,
        cordoned=cordoned,
        boot_id=_str(root["bid"], "bid", limit=128) if "bid" in root else None,
        interrupt_at=_opt_ts(root, "ia", "root"),
        generation=_int(root["g"], "g") if "g" in root else None,
        kernel=_str(root["kv"], "kv", limit=256) if "kv" in root else None,
        os_image=_str(root["oi"], "oi", limit=256) if "oi" in root else None,
        version=version,
    )
