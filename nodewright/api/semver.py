"""Semantic Versioning 2.0.0 parsing and precedence, with the reference's lenient forms.

Package versions decide upgrade vs downgrade on a node (anchor §2.4). The reference compares with Go's
`x/mod/semver` after prefixing `v`, which accepts `1` and `1.2` as `1.0.0` / `1.2.0`; we accept the same
forms (and an optional leading `v`) but otherwise follow semver.org exactly:

- MAJOR.MINOR.PATCH are compared numerically; numeric identifiers have no leading zeros.
- A version with a pre-release has lower precedence than the same version without one.
- Pre-release identifiers are compared left to right: numeric ones numerically, alphanumeric ones in
  ASCII order, numeric < alphanumeric, and a shorter list is lower when all shared identifiers are equal.
- Build metadata (`+...`) is ignored for precedence (two versions differing only in build compare equal).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

_NUM = r"0|[1-9]\d*"
_ID = r"[0-9A-Za-z-]+"
_PATTERN = re.compile(
    rf"^v?(?P<major>{_NUM})(?:\.(?P<minor>{_NUM})(?:\.(?P<patch>{_NUM})"
    rf"(?:-(?P<pre>{_ID}(?:\.{_ID})*))?(?:\+(?P<build>{_ID}(?:\.{_ID})*))?)?)?$"
)


class InvalidVersion(ValueError):
    pass


@total_ordering
@dataclass(frozen=True, slots=True, eq=False)
class Version:
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()
    build: tuple[str, ...] = ()

    def _key(self) -> tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]:
        # A release (no pre-release) sorts after every pre-release of the same triple: flag 1 vs 0.
        pre = tuple((0, int(i), "") if i.isdigit() else (1, 0, i) for i in self.prerelease)
        return (self.major, self.minor, self.patch, 0 if self.prerelease else 1, pre)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: Version) -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text


def parse(text: str) -> Version:
    m = _PATTERN.match(text)
    if m is None:
        raise InvalidVersion(f"not a semantic version: {text!r}")
    pre = tuple(m["pre"].split(".")) if m["pre"] else ()
    for ident in pre:
        if ident.isdigit() and len(ident) > 1 and ident[0] == "0":
            raise InvalidVersion(f"numeric pre-release identifier with a leading zero in {text!r}")
    return Version(
        major=int(m["major"]),
        minor=int(m["minor"] or 0),
        patch=int(m["patch"] or 0),
        prerelease=pre,
        build=tuple(m["build"].split(".")) if m["build"] else (),
    )


def is_valid(text: str) -> bool:
    try:
        parse(text)
    except InvalidVersion:
        return False
    return True


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 by semver precedence; raises InvalidVersion for an unparsable input."""
    va, vb = parse(a), parse(b)
    return (va > vb) - (va < vb)


# Strict form used by API validation: the CRD's `version` pattern has no leading `v` (the reference
# prefixes `v` itself, so a `v` in the spec would become `vv1.2.3` there and be rejected).
SemverError = InvalidVersion


def is_semver(text: str) -> bool:
    """A valid spec `version`: semver (shorthand `1`/`1.2` allowed), without a leading `v`."""
    return not text.startswith("v") and is_valid(text)
