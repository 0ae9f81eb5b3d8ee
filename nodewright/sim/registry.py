"""The simulator's local OCI registry: Debian's docker-registry on 127.0.0.1, and pushing image layouts to it.

Real nodes pull every image the way a production kubelet does (`imagePullPolicy: Always` included), so the
images they run must come from a registry. The simulator starts Debian's `docker-registry`
(distribution/distribution, unpacked by `hack/debian/fetch.sh`, never installed) on a free loopback port
and pushes OCI image layouts into it: the `make images` outputs, the package images `nodewright package
build` writes, and the sandbox image. containerd on each real node is told (its `hosts.toml`) that every
registry host is this one, so `ghcr.io/nodewright/agent:0.1.0` is pulled from `<registry>/nodewright/agent`
and nothing is ever fetched from outside the machine.

The push is the OCI distribution API over plain HTTP, standard library only: for each blob a HEAD (skip
what the registry has), else a monolithic upload (POST an upload session, PUT its location with
`?digest=`), then a PUT of the manifest under the tag. Nothing else speaks to the registry from here.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

JSON = dict[str, Any]
_TIMEOUT_S: Final = 60.0
_MANIFEST_TYPES: Final = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)


class RegistryError(RuntimeError):
    """A push the registry refused, or a layout that cannot be pushed."""


@dataclass(frozen=True)
class ImageRef:
    """`[host/]repository[:tag]` split; the host is dropped when pushing (every host maps to ours)."""

    host: str
    repository: str
    tag: str

    @classmethod
    def parse(cls, reference: str) -> ImageRef:
        name, _, tag = (
            reference.rpartition(":") if ":" in reference.rsplit("/", 1)[-1] else (reference, "", "")
        )
        tag = tag or "latest"
        first, _, rest = name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            host, repository = first, rest
        else:
            host, repository = "docker.io", name if "/" in name else f"library/{name}"
        return cls(host, repository, tag)

    def __str__(self) -> str:
        return f"{self.host}/{self.repository}:{self.tag}"


def push_layout(layout: Path, *, registry: str, reference: str) -> str:
    """Push the single image of the OCI layout `layout` to `http://<registry>` under `reference`'s
    repository and tag; returns the manifest digest."""
    ref = ImageRef.parse(reference)
    index = _read_json(layout / "index.json")
    manifests = index.get("manifests") or []
    if len(manifests) != 1:
        raise RegistryError(f"{layout}: expected one image in index.json, found {len(manifests)}")
    descriptor = manifests[0]
    manifest_bytes = _blob(layout, descriptor["digest"])
    manifest = json.loads(manifest_bytes)
    for blob in [manifest["config"], *manifest.get("layers", [])]:
        _push_blob(registry, ref.repository, layout, blob["digest"])
    media_type = descriptor.get("mediaType") or manifest.get("mediaType") or _MANIFEST_TYPES[0]
    url = f"http://{registry}/v2/{ref.repository}/manifests/{urllib.parse.quote(ref.tag)}"
    _request("PUT", url, data=manifest_bytes, headers={"Content-Type": media_type})
    return str(descriptor["digest"])


def _push_blob(registry: str, repository: str, layout: Path, digest: str) -> None:
    base = f"http://{registry}/v2/{repository}/blobs"
    try:
        _request("HEAD", f"{base}/{digest}")
        return
    except RegistryError:
        pass
    started = _request("POST", f"{base}/uploads/")
    location = started.headers.get("Location")
    if not location:
        raise RegistryError(f"the registry answered an upload of {digest} without a Location")
    location = urllib.parse.urljoin(f"http://{registry}/", location)
    separator = "&" if "?" in location else "?"
    _request(
        "PUT",
        f"{location}{separator}digest={urllib.parse.quote(digest)}",
        data=_blob(layout, digest),
        headers={"Content-Type": "application/octet-stream"},
    )


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: Any


def _request(
    method: str, url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None
) -> _Answer:
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=_TIMEOUT_S) as resp:
            resp.read()
            return _Answer(resp.status, resp.headers)
    except urllib.error.HTTPError as err:
        raise RegistryError(f"{method} {url}: HTTP {err.code} {err.read()[:300]!r}") from None
    except (urllib.error.URLError, OSError) as err:
        raise RegistryError(f"{method} {url}: {err}") from None


def _read_json(path: Path) -> JSON:
    try:
        data: JSON = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise RegistryError(f"{path}: {err}") from None
    return data


def _blob(layout: Path, digest: str) -> bytes:
    algorithm, _, hexdigest = digest.partition(":")
    try:
        return (layout / "blobs" / algorithm / hexdigest).read_bytes()
    except OSError as err:
        raise RegistryError(f"{layout}: blob {digest} missing ({err})") from None


# ----------------------------------------------------------------------------------------------------
# Single-binary images (the sandbox image)


def binary_image_layout(
    binary: Path, out: Path, *, path: str, tag: str, user: str = "0:0", architecture: str = "amd64"
) -> Path:
    """An OCI layout of one image holding `binary` at `path`, its entrypoint; reproducible (mtime 0)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(path.lstrip("/"))
        data = binary.read_bytes()
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        tar.addfile(info, io.BytesIO(data))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    config = {
        "architecture": architecture,
        "os": "linux",
        "config": {"Entrypoint": [path], "User": user},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(content: bytes, media_type: str) -> JSON:
        digest = hashlib.sha256(content).hexdigest()
        (blobs / digest).write_bytes(content)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(content)}

    config_desc = put(json.dumps(config, sort_keys=True).encode(), "application/vnd.oci.image.config.v1+json")
    layer_desc = put(layer, "application/vnd.oci.image.layer.v1.tar+gzip")
    manifest = {
        "schemaVersion": 2,
        "mediaType": _MANIFEST_TYPES[0],
        "config": config_desc,
        "layers": [layer_desc],
    }
    manifest_desc = put(json.dumps(manifest, sort_keys=True).encode(), _MANIFEST_TYPES[0])
    manifest_desc["annotations"] = {"org.opencontainers.image.ref.name": tag}
    (out / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}), encoding="utf-8")
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_desc],
    }
    (out / "index.json").write_text(json.dumps(index), encoding="utf-8")
    return out
