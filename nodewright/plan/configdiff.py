"""ConfigMap change detection per package, and the interrupt a config change requires.

A package's `configMap` is mounted into its pods. The node records, per package entry, a short hash of
each key's value as last applied (`PackageEntry.config`). Comparing that with the spec detects added,
changed AND removed keys (the reference ignores removed keys, anchor §11.12). A change re-runs only the
`config` stage on the node; if a `configInterrupts` pattern (fnmatch-style glob: `*`, `?`, `[...]`,
matching the reference's filepath.Match for key names without `/`) matches a changed or removed key,
the matching interrupts (merged like package interrupts) run after it, then `post-interrupt`. A change
whose keys match no config interrupt never cordons the node (anchor §2.2, §2.5).

Hashes are 8 hex digits (32 bits) of SHA-256 over the value: enough to detect edits of one key, compact
enough for nodes with many keys; `config_digest` gives a full digest of the whole map for pod specs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

from nodewright.api.models import Interrupt, Package
from nodewright.plan.interrupts import merge_interrupts

KEY_HASH_LENGTH = 8


def key_hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:KEY_HASH_LENGTH]


def config_hashes(config_map: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """Per-key hashes of a configMap, sorted by key (the form stored in PackageEntry.config)."""
    return tuple(sorted((k, key_hash(v)) for k, v in (config_map or {}).items()))


def config_digest(config_map: Mapping[str, str] | None) -> str:
    h = hashlib.sha256()
    for k, v in sorted((config_map or {}).items()):
        h.update(k.encode() + b"\0" + v.encode() + b"\0")
    return h.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class ConfigDiff:
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(sorted((*self.added, *self.changed, *self.removed)))

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)


def diff(applied: tuple[tuple[str, str], ...], desired: tuple[tuple[str, str], ...]) -> ConfigDiff:
    old, new = dict(applied), dict(desired)
    return ConfigDiff(
        added=tuple(sorted(k for k in new if k not in old)),
        changed=tuple(sorted(k for k in new if k in old and old[k] != new[k])),
        removed=tuple(sorted(k for k in old if k not in new)),
    )


def config_interrupt(package: Package, changed_keys: tuple[str, ...]) -> Interrupt | None:
    """The merged interrupt of every configInterrupts pattern matching a changed key (None if none)."""
    found = [
        interrupt
        for pattern, interrupt in sorted((package.config_interrupts or {}).items())
        if any(fnmatchcase(key, pattern) for key in changed_keys)
    ]
    return merge_interrupts(found)
