"""Container image references: parsing and the effective image a package pod pulls.

Grammar (distribution/reference): `[registry[:port]/]path[:tag][@algorithm:hex]`. A ':' belongs to the
tag only when it appears after the last '/', so `registry:5000/team/pkg` has no tag and
`registry:5000/team/pkg:1.2.3` has tag `1.2.3`. (The reference system cuts at the first ':' and turns
`registry:5000/x` into `registry`; we do not.) The first path component is a registry host when it
contains '.' or ':' or is `localhost`, as in Docker's normalisation.

The effective image of a package: `image@containerSHA` when containerSHA is set; the image as written
when it already carries a digest or a tag (the webhook checks that the tag equals the version); otherwise
`image:version`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_HOST = re.compile(
    r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"|\[[0-9a-fA-F:]+\])(?::[0-9]{1,5})?$"
)
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}$")


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
    rest, digest = reference, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.match(digest):
            raise ImageReferenceError(f"digest {digest!r} is not algorithm:hex (e.g. sha256:<64 hex>)")
    tag = None
    last_slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > last_slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.match(tag):
            raise ImageReferenceError(f"tag {tag!r} is invalid (letters, digits, '_', '.', '-', at most 128)")
    parts = rest.split("/")
    registry = None
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        registry = parts.pop(0)
        if not _HOST.match(registry):
            raise ImageReferenceError(f"registry {registry!r} is not a host name with an optional port")
    for component in parts:
        if not _COMPONENT.match(component):
            raise ImageReferenceError(
                f"path component {component!r} is invalid (lowercase letters, digits and separators . _ __ -)"
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
