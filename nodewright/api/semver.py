"""Semantic versions as the reference system reads them (Go x/mod/semver applied to "v" + version).

Accepted: `1`, `1.2`, `1.2.3`, `1.2.3-rc.1`, `1.2.3+build`; shorthand forms are padded with zeros
(`1.2` == `1.2.0`). Not accepted: a leading `v`, leading zeros, pre-release or build on a shorthand.
This differs from PEP 440 (`packaging.version`), which would accept `1.2rc1` and `v1.2` and order
pre-releases differently, so it is implemented here rather than borrowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

from nodewright.api.models import SEMVER_PATTERN

_SEMVER = re.compile(SEMVER_PATTERN)


class SemverError(ValueError):
    pass


@total_ordering
@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()

    def _key(self) -> tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]:
        # A release sorts after its pre-releases; numeric identifiers sort before alphanumeric ones.
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.prerelease)
        return (self.major, self.minor, self.patch, 0 if self.prerelease else 1, pre)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()


def is_semver(text: str) -> bool:
    return _SEMVER.match(text) is not None


def parse(text: str) -> Version:
    if not is_semver(text):
        raise SemverError(f"{text!r} is not a semantic version (e.g. 1.2.3, 1.2, 1.2.3-rc1; no leading v)")
    core, _, _build = text.partition("+")
    core, _, pre = core.partition("-")
    nums = [int(x) for x in core.split(".")] + [0, 0]
    return Version(nums[0], nums[1], nums[2], tuple(pre.split(".")) if pre else ())


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 like Go's semver.Compare (build metadata ignored)."""
    va, vb = parse(a), parse(b)
    return (va > vb) - (va < vb)
