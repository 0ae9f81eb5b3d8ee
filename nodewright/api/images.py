"""Container image references: parsing and the effective image a package pod pulls.

Grammar (distribution/reference, what container runtimes parse before pulling):
`[domain/]path[:tag][@digest]`.

- A ':' belongs to the tag only when it appears after the last '/', so `registry:5000/team/pkg` has no tag
  and `registry:5000/team/pkg:1.2.3` has tag `1.2.3`. (The reference system cuts at the first ':' and
  turns `registry:5000/x` into `registry`; we do not.)
- The first component is a domain when it contains '.' or ':' or is `localhost` (Docker's normalisation);
  a domain is host names joined by '.' or a bracketed IPv6 address, with an optional port of 1-5 digits.
- Path components are lowercase: `[a-z0-9]+` joined by one of `.`, `_`, `__` or dashes. The name (domain
  and path) is at most 255 characters, as in the distribution reference.
- A tag is `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`; a digest is `sha256:`, `sha384:` or `sha512:` with exactly
  64, 96 or 128 lowercase hex digits (the algorithms runtimes verify; anything else fails at pull time).
- ASCII only, no surrounding whitespace (the API server itself refuses a container image with surrounding
  whitespace; every other mistake would only surface as `InvalidImageName` on the node).

`IMAGE_REFERENCE_PATTERN` is the same grammar as one regular expression (RE2, Rust and Python `re` read it
alike) for the CRD schema, and `IMAGE_NAME_FIND` extracts the name so a CEL rule can bound its length.

The effective image of a package: `image@containerSHA` when containerSHA is set; the image as written
when it already carries a digest or a tag (the webhook checks that the tag equals the version); otherwise
`image:version`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAME_MAX = 255
TAG_MAX = 128
DIGEST_HEX_LENGTHS = {"sha256": 64, "sha384": 96, "sha512": 128}
# Longest reference the grammar allows: name, ':' tag, '@sha512:' digest.
REFERENCE_MAX = NAME_MAX + 1 + TAG_MAX + 1 + len("sha512:") + DIGEST_HEX_LENGTHS["sha512"]

_DOMAIN_COMPONENT = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_PORT = r"[0-9]{1,5}"
# An IPv6 literal holds a ':' (Docker takes a first component as a domain only with '.', ':' or as
# localhost, so `[0]/x` is a path, and an invalid one).
_IPV6 = r"\[[a-fA-F0-9]*:[a-fA-F0-9:]*\]"
# A first component counts as a domain only with a '.', a port or as localhost (or an IPv6 address).
_DOMAIN = (
    rf"(?:localhost(?::{_PORT})?|{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})+(?::{_PORT})?"
    rf"|{_DOMAIN_COMPONENT}:{_PORT}|{_IPV6}(?::{_PORT})?)"
)
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
# Without a domain, a first component followed by '/' must not look like a domain (no '.').
_FIRST_COMPONENT = r"[a-z0-9]+(?:(?:_|__|-+)[a-z0-9]+)*"
_REMOTE = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_NAME = rf"(?:{_DOMAIN}/{_REMOTE}|{_FIRST_COMPONENT}(?:/{_PATH_COMPONENT})+|{_PATH_COMPONENT})"
_TAG_RE = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST_RE = "(?:" + "|".join(f"{alg}:[a-f0-9]{{{n}}}" for alg, n in DIGEST_HEX_LENGTHS.items()) + ")"

IMAGE_REFERENCE_PATTERN = rf"^{_NAME}(?::{_TAG_RE})?(?:@{_DIGEST_RE})?$"
IMAGE_NAME_FIND = rf"^{_NAME}"
# Docker refuses a bare 64-hex reference: it is an image ID, ambiguous with a repository name.
IMAGE_ID_PATTERN = r"^[a-f0-9]{64}$"

_COMPONENT = re.compile(_PATH_COMPONENT)
_HOST = re.compile(rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|{_IPV6})(?::{_PORT})?")
_TAG = re.compile(_TAG_RE)
_DIGEST = re.compile(r"([a-z0-9]+):([a-f0-9]+)")
_HEX64 = re.compile(IMAGE_ID_PATTERN)


class ImageReferenceError(ValueError):
    pass


@dataclass(frozen=True)
class ImageReference:
    """A parsed image reference; `registry` is None when the reference names none (Docker Hub)."""

    registry: str | None
    path: str
    tag: str | None
    digest: str | None

    @property
    def repository(self) -> str:
        """Registry and path, without tag or digest."""
        return f"{self.registry}/{self.path}" if self.registry else self.path

    def __str__(self) -> str:
        out = self.repository
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def parse_image(reference: str) -> ImageReference:
    """Parse `reference`; raises `ImageReferenceError` naming what is wrong."""
    if not reference or reference != reference.strip():
        raise ImageReferenceError("image reference is empty or has surrounding whitespace")
    if not reference.isascii() or not reference.isprintable() or " " in reference:
        raise ImageReferenceError("image reference must be printable ASCII without spaces")
    if _HEX64.search(reference):
        raise ImageReferenceError("64 hex digits is an image ID, not a reference: name the repository")
    rest, digest = reference, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        match = _DIGEST.fullmatch(digest)
        if match is None or DIGEST_HEX_LENGTHS.get(match.group(1)) != len(match.group(2)):
            raise ImageReferenceError(
                f"digest {digest!r} is not sha256:<64>, sha384:<96> or sha512:<128> lowercase hex digits"
            )
    tag = None
    last_slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > last_slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise ImageReferenceError(
                f"tag {tag!r} is invalid (letters, digits, '_', '.', '-', not starting with '.' or '-',"
                f" at most {TAG_MAX})"
            )
    parts = rest.split("/")
    registry = None
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        registry = parts.pop(0)
        if not _HOST.fullmatch(registry):
            raise ImageReferenceError(
                f"registry {registry!r} is not a host name (or [IPv6]) with an optional port of 1-5 digits"
            )
    for component in parts:
        if not _COMPONENT.fullmatch(component):
            hint = " (the repository must be lowercase)" if component.lower() != component else ""
            raise ImageReferenceError(
                f"path component {component!r} is invalid{hint}: lowercase letters and digits joined by"
                " '.', '_', '__' or '-'"
            )
    if len(rest) > NAME_MAX:
        raise ImageReferenceError(
            f"repository name is {len(rest)} characters, at most {NAME_MAX} are allowed (tag and digest"
            " not counted)"
        )
    return ImageReference(registry=registry, path="/".join(parts), tag=tag, digest=digest)


def effective_image(image: str, version: str, container_sha: str | None = None) -> str:
    """The reference a package pod pulls, following the rules in the module docstring."""
    ref = parse_image(image)
    if container_sha:
        return f"{ref.repository}@{container_sha}"
    if ref.digest or ref.tag:
        return str(ref)
    # '+' (semver build metadata) is not allowed in an image tag; `_` is the usual stand-in.
    return f"{ref.repository}:{version.replace('+', '_')}"
