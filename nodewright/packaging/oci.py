"""`nodewright package build`: the package image as an OCI image layout, without a Docker daemon.

An OCI image layout (image-spec v1.1, `image-layout.md`) is a directory any registry tool can push
(`skopeo copy oci:DIR:TAG docker://...`, `crane push DIR ...`, `oras cp --from-oci-layout DIR:TAG ...`):

    DIR/oci-layout                  {"imageLayoutVersion": "1.0.0"}
    DIR/index.json                  one manifest descriptor, tagged via org.opencontainers.image.ref.name
    DIR/blobs/sha256/<digest>       the manifest, the image config and every layer

The image is the base's layers plus one gzip-compressed tar layer holding the package payload
(`layout.payload_entries`) under `skyhook-package/`. The base is either `scratch` (the payload alone) or a
local OCI layout directory, `PATH` or `PATH:REF` (REF selects an image by its ref name, as skopeo's
`oci:PATH:REF`), e.g. one made by `skopeo copy docker://busybox:1.36.1 oci:busybox:1.36.1`. An index
with several platforms is resolved with `platform` (`os/arch[/variant]`). Base blobs are verified
(sha256 and size) and copied; Docker-format base manifests are converted to OCI media types (the bytes
of the layers do not change).

A package pod's init container runs `/bin/sh`, `mkdir` and `cp` in the package image, so an image for
real nodes needs a base with a shell; `scratch` suits tools that only read the payload.

Reproducible: entries sorted, numeric owners 0:0 without names, modes normalised (directories 0755,
files 0755 when executable by their owner, else 0644), every mtime and the config's `created` time set
to `epoch` (SOURCE_DATE_EPOCH, default 0), gzip without name or time, JSON with sorted keys. The same
package and base give the same digests on any machine.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from nodewright.agent import safefile
from nodewright.agent.config import ConfigError, load_config
from nodewright.packaging import layout

JSON = dict[str, Any]

OCI_LAYOUT_FILE: Final = "oci-layout"
OCI_LAYOUT_VERSION: Final = "1.0.0"
INDEX_FILE: Final = "index.json"
MEDIA_INDEX: Final = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST: Final = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG: Final = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP: Final = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_LIST: Final = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST: Final = "application/vnd.docker.distribution.manifest.v2+json"
#: Docker media types and their OCI equivalents (same bytes).
DOCKER_TO_OCI: Final = {
    "application/vnd.docker.image.rootfs.diff.tar.gzip": MEDIA_LAYER_GZIP,
    "application/vnd.docker.image.rootfs.diff.tar": "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.docker.container.image.v1+json": MEDIA_CONFIG,
}
LAYER_MEDIA_TYPES: Final = frozenset(
    {
        "application/vnd.oci.image.layer.v1.tar",
        MEDIA_LAYER_GZIP,
        "application/vnd.oci.image.layer.v1.tar+zstd",
    }
)
REF_NAME: Final = "org.opencontainers.image.ref.name"
SCRATCH: Final = "scratch"
DEFAULT_PLATFORM: Final = "linux/amd64"
TAG: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
_SHA256: Final = re.compile(r"^sha256:[a-f0-9]{64}\Z")
_CHUNK: Final = 1 << 20
#: oci-layout, index.json, manifests and image configs (registries refuse manifests over 4 MiB).
MAX_METADATA_BYTES: Final = 4 << 20


class BuildError(Exception):
    """The image cannot be built; the message names the file or option and what to do."""


@dataclass(frozen=True)
class Platform:
    os: str
    architecture: str
    variant: str = ""

    @classmethod
    def parse(cls, text: str) -> Platform:
        parts = text.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise BuildError(
                f"platform {text!r} is not os/arch[/variant], e.g. linux/amd64 or linux/arm64/v8"
            )
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else "")

    @classmethod
    def of(cls, data: JSON) -> Platform:
        return cls(str(data.get("os", "")), str(data.get("architecture", "")), str(data.get("variant") or ""))

    def matches(self, other: Platform) -> bool:
        same = (self.os, self.architecture) == (other.os, other.architecture)
        return same and (not self.variant or not other.variant or self.variant == other.variant)

    def to_json(self) -> JSON:
        body: JSON = {"architecture": self.architecture, "os": self.os}
        if self.variant:
            body["variant"] = self.variant
        return body

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


@dataclass(frozen=True)
class BaseImage:
    description: str
    layout: Path | None = None
    manifest_digest: str | None = None
    layers: tuple[JSON, ...] = ()
    config: JSON = field(default_factory=dict)
    platform: Platform | None = None


@dataclass(frozen=True)
class BuildResult:
    layout: Path
    tag: str
    manifest_digest: str
    manifest_size: int
    config_digest: str
    layer_digest: str
    layer_size: int
    diff_id: str
    base: str
    payload_entries: int
    platform: Platform
    warnings: tuple[str, ...] = ()


# ----------------------------------------------------------------------------------------------------
# Blobs


class _Sink(Protocol):
    def write(self, data: bytes, /) -> object: ...


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to `inner` (None: discard)."""

    def __init__(self, inner: _Sink | None) -> None:
        super().__init__()
        self.inner = inner
        self.hash = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self.hash.update(chunk)
        self.size += len(chunk)
        if self.inner is not None:
            self.inner.write(chunk)
        return len(chunk)

    @property
    def digest(self) -> str:
        return f"sha256:{self.hash.hexdigest()}"


def canonical_json(data: JSON) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _blob_path(layout_dir: Path, digest: str) -> Path:
    if not _SHA256.match(digest):
        raise BuildError(
            f"{layout_dir}: digest {digest!r} is not sha256:<64 hex>; only sha256 blobs are supported"
        )
    return layout_dir / "blobs" / "sha256" / digest.removeprefix("sha256:")


def _write_blob(blobs: Path, data: bytes) -> tuple[str, int]:
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    (blobs / digest.removeprefix("sha256:")).write_bytes(data)
    return digest, len(data)


def _read_blob(layout_dir: Path, descriptor: JSON, what: str) -> bytes:
    digest = str(descriptor.get("digest", ""))
    path = _blob_path(layout_dir, digest)
    try:
        data = safefile.read_bytes(str(path), limit=MAX_METADATA_BYTES)
    except FileNotFoundError:
        raise BuildError(f"{layout_dir}: the {what} blob {digest} is missing ({path})") from None
    except safefile.Refused as exc:
        raise BuildError(f"{layout_dir}: the {what} blob {digest}: {exc}") from None
    except OSError as exc:
        raise BuildError(f"{layout_dir}: the {what} blob {digest} cannot be read: {exc.strerror}") from None
    _verify(layout_dir, descriptor, what, f"sha256:{hashlib.sha256(data).hexdigest()}", len(data))
    return data


def _verify(layout_dir: Path, descriptor: JSON, what: str, digest: str, size: int) -> None:
    if digest != descriptor.get("digest"):
        raise BuildError(
            f"{layout_dir}: the {what} blob {descriptor.get('digest')} has digest {digest}: the layout is "
            "corrupt; copy the base image again"
        )
    if descriptor.get("size") is not None and size != descriptor.get("size"):
        raise BuildError(
            f"{layout_dir}: the {what} blob {digest} has {size} bytes, its descriptor says "
            f"{descriptor.get('size')}: the layout is corrupt; copy the base image again"
        )


def _copy_blob(source_layout: Path, descriptor: JSON, blobs: Path, what: str) -> None:
    digest = str(descriptor.get("digest", ""))
    source = _blob_path(source_layout, digest)
    target = blobs / digest.removeprefix("sha256:")
    if target.exists():
        return
    hashing = _Hashing(None)
    try:
        mode = source.stat().st_mode
        if not stat.S_ISREG(mode):
            raise BuildError(
                f"{source_layout}: the {what} blob {digest} is {safefile.file_kind(mode)}, not a regular "
                f"file ({source}); copy the base image again"
            )
        size = _descriptor_size(descriptor, source)
        with source.open("rb") as reader, target.open("wb") as writer:
            while chunk := reader.read(_CHUNK):
                hashing.write(chunk)
                writer.write(chunk)
                if hashing.size > size:  # a blob growing past its descriptor: stop, _verify says so
                    break
    except FileNotFoundError:
        raise BuildError(f"{source_layout}: the {what} blob {digest} is missing ({source})") from None
    _verify(source_layout, descriptor, what, hashing.digest, hashing.size)


def _descriptor_size(descriptor: JSON, source: Path) -> int:
    size = descriptor.get("size")
    return (
        size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else source.stat().st_size
    )


def _load_json(data: bytes, where: str) -> JSON:
    try:
        value = safefile.loads_json(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise BuildError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise BuildError(f"{where}: expected a JSON object")
    return value


# ----------------------------------------------------------------------------------------------------
# The base image


def open_base(spec: str, platform: Platform | None) -> BaseImage:
    """The base named by `spec`: "scratch", or an OCI layout directory `PATH` or `PATH:REF`."""
    if spec == SCRATCH:
        return BaseImage(description=SCRATCH)
    directory, ref = _split_layout_spec(spec)
    if not os.path.lexists(directory / OCI_LAYOUT_FILE):
        raise BuildError(
            f"--base {spec}: {directory} is not an OCI image layout (no {OCI_LAYOUT_FILE} file); make one "
            f"with e.g. `skopeo copy docker://busybox:1.36.1 oci:{directory}:1.36.1`, or use --base scratch"
        )
    return open_layout(directory, ref=ref, platform=platform, where=f"--base {spec}", description=spec)


def open_layout(
    directory: Path,
    *,
    ref: str | None = None,
    digest: str | None = None,
    platform: Platform | None = None,
    where: str,
    description: str | None = None,
) -> BaseImage:
    """The image of the OCI layout `directory`: the one its index lists, the one named `ref`
    (`org.opencontainers.image.ref.name`) or the one whose manifest is `digest`, for `platform` where the
    layout has several. Every error is a BuildError starting with `where` (what the caller calls it)."""
    marker = _load_json(_read_file(directory / OCI_LAYOUT_FILE, where), str(directory / OCI_LAYOUT_FILE))
    if marker.get("imageLayoutVersion") != OCI_LAYOUT_VERSION:
        raise BuildError(
            f"{where}: imageLayoutVersion {marker.get('imageLayoutVersion')!r} is not supported "
            f"(expected {OCI_LAYOUT_VERSION})"
        )
    index = _load_json(_read_file(directory / INDEX_FILE, where), str(directory / INDEX_FILE))
    entries = [e for e in index.get("manifests") or [] if isinstance(e, dict)]
    if digest is not None:
        entries = [e for e in entries if e.get("digest") == digest]
        if not entries:
            raise BuildError(f"{where}: no image with the digest {digest} in {directory}")
    elif ref is not None:
        refs = sorted({str((e.get("annotations") or {}).get(REF_NAME)) for e in entries} - {"None"})
        entries = [e for e in entries if (e.get("annotations") or {}).get(REF_NAME) == ref]
        if not entries:
            raise BuildError(
                f"{where}: no image named {ref!r} in {directory} (names: {', '.join(refs) or 'none'})"
            )
    descriptor = _choose(entries, platform, where)
    manifest_descriptor, manifest = _resolve_manifest(directory, descriptor, platform, where)
    config_descriptor = manifest.get("config") or {}
    config = _load_json(_read_blob(directory, config_descriptor, "config"), f"{where}: the image config")
    layers = tuple(_oci_layer(layer, where) for layer in manifest.get("layers") or [])
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    if len(diff_ids) != len(layers):
        raise BuildError(
            f"{where}: the config lists {len(diff_ids)} diff_ids for {len(layers)} layers; the "
            "image is inconsistent"
        )
    image_platform = Platform.of(config)
    if platform is not None and image_platform.os and not platform.matches(image_platform):
        raise BuildError(
            f"{where} is {image_platform}, not {platform}: pass --platform {image_platform} or choose "
            f"a base for {platform}"
        )
    return BaseImage(
        description=description or str(directory),
        layout=directory,
        manifest_digest=str(manifest_descriptor["digest"]),
        layers=layers,
        config=config,
        platform=image_platform if image_platform.os else platform,
    )


def _split_layout_spec(spec: str) -> tuple[Path, str | None]:
    whole = Path(spec).expanduser()
    if whole.is_dir() or ":" not in spec:
        return whole, None
    path, _, ref = spec.rpartition(":")
    return Path(path).expanduser(), ref or None


def _read_file(path: Path, where: str) -> bytes:
    try:
        return safefile.read_bytes(str(path), limit=MAX_METADATA_BYTES)
    except safefile.Refused as exc:
        raise BuildError(f"{where}: {exc}") from None
    except OSError as exc:
        raise BuildError(f"{where}: cannot read {path}: {exc.strerror}") from None


def _choose(entries: list[JSON], platform: Platform | None, where: str) -> JSON:
    if not entries:
        raise BuildError(f"{where}: the index lists no image")
    if len(entries) == 1:
        return entries[0]
    if platform is not None:
        fitting = [e for e in entries if platform.matches(Platform.of(e.get("platform") or {}))]
        if len(fitting) == 1:
            return fitting[0]
    offered = ", ".join(
        str(Platform.of(e.get("platform") or {})) or str((e.get("annotations") or {}).get(REF_NAME, "?"))
        for e in entries
    )
    hint = "pass --platform os/arch" if platform is None else f"none or several are {platform}"
    raise BuildError(f"{where}: several images ({offered}); {hint}, or name one as PATH:REF")


def _resolve_manifest(
    directory: Path, descriptor: JSON, platform: Platform | None, where: str
) -> tuple[JSON, JSON]:
    """Follow image indexes (multi-platform) down to one image manifest."""
    for _depth in range(4):
        data = _read_blob(directory, descriptor, "manifest")
        document = _load_json(data, f"{where}: manifest {descriptor.get('digest')}")
        kind = document.get("mediaType") or descriptor.get("mediaType")
        if kind in (MEDIA_INDEX, DOCKER_LIST) or ("manifests" in document and "layers" not in document):
            entries = [e for e in document.get("manifests") or [] if isinstance(e, dict)]
            wanted = platform or Platform.parse(DEFAULT_PLATFORM)
            descriptor = _choose(entries, wanted, where)
            continue
        if kind not in (MEDIA_MANIFEST, DOCKER_MANIFEST, None):
            raise BuildError(f"{where}: {kind!r} is not an image manifest")
        return descriptor, document
    raise BuildError(f"{where}: image indexes nested too deeply")


def _oci_layer(layer: Any, where: str) -> JSON:
    if not isinstance(layer, dict):
        raise BuildError(f"{where}: a layer descriptor is not an object")
    converted = dict(layer)
    media_type = str(layer.get("mediaType", ""))
    converted["mediaType"] = DOCKER_TO_OCI.get(media_type, media_type)
    if converted["mediaType"] not in LAYER_MEDIA_TYPES:
        raise BuildError(
            f"{where}: layer {layer.get('digest')} has media type {media_type!r}, which this builder "
            "does not carry over (foreign or non-distributable layers)"
        )
    return converted


# ----------------------------------------------------------------------------------------------------
# The payload layer


def _tar_info(
    name: str, *, kind: layout.EntryKind, mtime: int, size: int = 0, mode: int = 0o644
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = mtime
    info.size = size
    info.mode = mode
    info.type = {"dir": tarfile.DIRTYPE, "file": tarfile.REGTYPE, "symlink": tarfile.SYMTYPE}[kind]
    return info


def write_payload_layer(package_dir: Path, blobs: Path, *, mtime: int) -> tuple[JSON, str, int]:
    """The payload as a gzip tar layer blob under `blobs`; returns (descriptor, diff_id, entries)."""
    entries = layout.payload_entries(package_dir)
    prefix = layout.PAYLOAD_DIR.strip("/")
    partial = blobs / ".payload-layer.partial"
    with partial.open("wb") as raw:
        compressed = _Hashing(raw)
        with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, compresslevel=9, mtime=0) as zipped:
            plain = _Hashing(zipped)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                tar.addfile(_tar_info(prefix, kind="dir", mtime=mtime, mode=0o755))
                for entry in entries:
                    name = f"{prefix}/{entry.relative}"
                    if entry.kind == "dir":
                        tar.addfile(_tar_info(name, kind="dir", mtime=mtime, mode=0o755))
                    elif entry.kind == "symlink":
                        info = _tar_info(name, kind="symlink", mtime=mtime, mode=0o777)
                        info.linkname = entry.link_target
                        tar.addfile(info)
                    else:
                        mode = 0o755 if entry.executable else 0o644
                        with entry.path.open("rb") as content:
                            size = os.fstat(content.fileno()).st_size
                            tar.addfile(
                                _tar_info(name, kind="file", mtime=mtime, size=size, mode=mode), content
                            )
    digest = compressed.digest
    partial.replace(blobs / digest.removeprefix("sha256:"))
    descriptor = {"mediaType": MEDIA_LAYER_GZIP, "digest": digest, "size": compressed.size}
    return descriptor, plain.digest, len(entries)


# ----------------------------------------------------------------------------------------------------
# Reading the payload back (the simulated kubelet's "pull")


class _HashingReader(io.RawIOBase):
    """A read-only stream that hashes and counts what is read from `inner`."""

    def __init__(self, inner: io.BufferedReader) -> None:
        super().__init__()
        self.inner = inner
        self.hash = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.inner.read(len(buffer))
        buffer[: len(data)] = data
        self.hash.update(data)
        self.size += len(data)
        return len(data)

    def drain(self) -> None:
        while self.readinto(bytearray(_CHUNK)):
            pass

    @property
    def digest(self) -> str:
        return f"sha256:{self.hash.hexdigest()}"


def extract_payload(image: BaseImage, target: Path) -> int:
    """Write what the image holds at `/skyhook-package` into the new directory `target`, layer by layer
    as a container runtime unpacks them (OCI whiteouts honoured), and return the number of entries.

    Only gzip and plain tar layers are read; each layer's digest and size are verified. Entries outside
    `skyhook-package/` are skipped; a payload entry that would leave `target` (`..`, an absolute name, a
    path through a symlink), a hard link, device or FIFO is refused: BuildError naming the layer."""
    if image.layout is None:
        raise BuildError(f"{image.description}: not an image layout")
    target.mkdir(parents=True)
    entries = 0
    for layer in image.layers:
        entries += _extract_layer(image.layout, layer, target)
    if not any(target.iterdir()):
        raise BuildError(
            f"{image.description}: the image holds nothing at {layout.PAYLOAD_DIR}; build it with "
            "`nodewright package build` or a Dockerfile that copies the package there"
        )
    return entries


def _extract_layer(layout_dir: Path, layer: JSON, target: Path) -> int:
    digest = str(layer.get("digest", ""))
    media_type = str(layer.get("mediaType", ""))
    if media_type not in (MEDIA_LAYER_GZIP, "application/vnd.oci.image.layer.v1.tar"):
        raise BuildError(
            f"{layout_dir}: layer {digest} is {media_type}; only gzip and plain tar layers can be read here"
        )
    path = _blob_path(layout_dir, digest)
    try:
        with path.open("rb") as raw:
            hashing = _HashingReader(raw)
            stream = io.BufferedReader(hashing, _CHUNK)
            gzipped = media_type == MEDIA_LAYER_GZIP
            with (
                tarfile.open(fileobj=stream, mode="r|gz")
                if gzipped
                else tarfile.open(fileobj=stream, mode="r|")
            ) as tar:
                count = sum(_extract_member(tar, member, target, digest) for member in tar)
            hashing.drain()
    except FileNotFoundError:
        raise BuildError(f"{layout_dir}: the layer blob {digest} is missing ({path})") from None
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BuildError(f"{layout_dir}: layer {digest} cannot be read as a tar archive: {exc}") from None
    _verify(layout_dir, layer, "layer", hashing.digest, hashing.size)
    return count


def _extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, digest: str) -> int:
    parts = [part for part in member.name.split("/") if part not in ("", ".")]
    prefix = layout.PAYLOAD_DIR.strip("/")
    if not parts or parts[0] != prefix:
        return 0
    relative = parts[1:]
    if ".." in relative or member.name.startswith("/"):
        raise BuildError(f"layer {digest}: entry {member.name!r} leaves {layout.PAYLOAD_DIR}; refused")
    parent = target
    for part in relative[:-1]:
        parent = parent / part
        if parent.is_symlink():
            raise BuildError(f"layer {digest}: entry {member.name!r} goes through a symlink; refused")
    if not relative:
        return 0
    name = relative[-1]
    if name == ".wh..wh..opq":  # an opaque directory: what lower layers put there is hidden
        for child in list(parent.iterdir()) if parent.is_dir() else []:
            _remove(child)
        return 0
    if name.startswith(".wh."):
        _remove(parent / name.removeprefix(".wh."))
        return 0
    destination = parent / name
    parent.mkdir(parents=True, exist_ok=True)
    if member.isdir():
        if destination.is_symlink() or (destination.exists() and not destination.is_dir()):
            _remove(destination)
        destination.mkdir(exist_ok=True)
        return 1
    if destination.is_symlink() or destination.exists():
        _remove(destination)
    if member.issym():
        os.symlink(member.linkname, destination)
    elif member.isreg():
        source = tar.extractfile(member)
        assert source is not None  # a regular file always has content
        with destination.open("wb") as out:
            shutil.copyfileobj(source, out, _CHUNK)
        destination.chmod(0o755 if member.mode & stat.S_IXUSR else 0o644)
    else:
        raise BuildError(
            f"layer {digest}: entry {member.name!r} is a hard link, device or FIFO; a package payload holds "
            "files, directories and symlinks only"
        )
    return 1


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or path.exists():
        path.unlink()


# ----------------------------------------------------------------------------------------------------
# The image


def rfc3339(epoch: int) -> str:
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build(
    package_dir: Path,
    *,
    base: str,
    output: Path,
    tag: str | None = None,
    platform: str | None = None,
    epoch: int = 0,
    force: bool = False,
) -> BuildResult:
    """Write the package image to the OCI layout `output`; raises BuildError naming what is wrong."""
    try:
        config = load_config(package_dir / layout.CONFIG_FILE)
    except ConfigError as exc:
        hint = f"`nodewright package validate {package_dir}` runs every check"
        raise BuildError(f"{exc} ({hint})" if len(exc.errors) == 1 else f"{exc}\n({hint})") from None
    try:
        layout.payload_entries(package_dir)  # refuse devices, FIFOs, sockets before writing anything
    except layout.PayloadError as exc:
        raise BuildError(str(exc)) from None
    tag = tag or config.package_version
    if not TAG.match(tag):
        raise BuildError(
            f"tag {tag!r} is not a valid image tag ([A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}); pass --tag "
            "(package pods pull <image>:<version>, so a version with '+' needs the image pinned by digest)"
        )
    if epoch < 0:
        raise BuildError(f"SOURCE_DATE_EPOCH {epoch} is negative")
    wanted = Platform.parse(platform) if platform else None
    base_image = open_base(base, wanted)
    image_platform = base_image.platform or wanted or Platform.parse(DEFAULT_PLATFORM)
    _check_output(output, package_dir=package_dir, base=base_image, force=force)
    warnings: list[str] = []
    if base_image.layout is None:
        warnings.append(
            "base scratch: the image holds only the payload; a package pod's init container runs /bin/sh, "
            "mkdir and cp in the package image, so for real nodes build on a base with a shell (busybox)"
        )
    partial = output.parent / f".{output.name}.partial-{os.getpid()}"
    if partial.exists():
        shutil.rmtree(partial)
    blobs = partial / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    try:
        result = _write_image(
            package_dir, partial, blobs, config.package_name, config.package_version, tag, base_image,
            image_platform, epoch,
        )  # fmt: skip
        if output.exists():
            shutil.rmtree(output)
        partial.replace(output)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return dataclasses.replace(result, layout=output, warnings=tuple(warnings))


def _check_output(output: Path, *, package_dir: Path, base: BaseImage, force: bool) -> None:
    resolved = output.resolve()
    if resolved == package_dir.resolve() or package_dir.resolve() in resolved.parents:
        raise BuildError(f"-o {output}: inside the package directory; the image would contain itself")
    if base.layout is not None and resolved == base.layout.resolve():
        raise BuildError(f"-o {output}: is the base layout; write the package image elsewhere")
    if output.exists():
        if not output.is_dir():
            raise BuildError(f"-o {output}: exists and is not a directory")
        if any(output.iterdir()):
            if not force:
                raise BuildError(f"-o {output}: exists and is not empty; pass --force to replace it")
            if not (output / OCI_LAYOUT_FILE).is_file():
                raise BuildError(f"-o {output}: --force replaces only an OCI layout, and this is none")
    if not output.parent.is_dir():
        raise BuildError(f"-o {output}: the directory {output.parent} does not exist")


def _write_image(
    package_dir: Path,
    root: Path,
    blobs: Path,
    name: str,
    version: str,
    tag: str,
    base: BaseImage,
    platform: Platform,
    epoch: int,
) -> BuildResult:
    created = rfc3339(epoch)
    for layer in base.layers:
        assert base.layout is not None
        _copy_blob(base.layout, layer, blobs, "layer")
    layer, diff_id, count = write_payload_layer(package_dir, blobs, mtime=epoch)
    image_config = _image_config(base, platform, name=name, version=version, created=created, diff_id=diff_id)
    config_digest, config_size = _write_blob(blobs, canonical_json(image_config))
    annotations = {
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.title": name,
        "org.opencontainers.image.version": version,
    }
    if base.manifest_digest is not None:
        annotations["org.opencontainers.image.base.digest"] = base.manifest_digest
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": config_size},
        "layers": [*base.layers, layer],
        "annotations": annotations,
    }
    manifest_digest, manifest_size = _write_blob(blobs, canonical_json(manifest))
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": manifest_digest,
                "size": manifest_size,
                "platform": platform.to_json(),
                "annotations": {REF_NAME: tag},
            }
        ],
    }
    (root / INDEX_FILE).write_bytes(canonical_json(index))
    (root / OCI_LAYOUT_FILE).write_bytes(canonical_json({"imageLayoutVersion": OCI_LAYOUT_VERSION}))
    return BuildResult(
        layout=root,
        tag=tag,
        manifest_digest=manifest_digest,
        manifest_size=manifest_size,
        config_digest=config_digest,
        layer_digest=str(layer["digest"]),
        layer_size=int(layer["size"]),
        diff_id=diff_id,
        base=base.description,
        payload_entries=count,
        platform=platform,
    )


def _image_config(
    base: BaseImage, platform: Platform, *, name: str, version: str, created: str, diff_id: str
) -> JSON:
    config = copy.deepcopy(base.config)
    config.update(platform.to_json())
    config["created"] = created
    runtime = dict(config.get("config") or {})
    labels = dict(runtime.get("Labels") or {})
    labels.update({"org.opencontainers.image.title": name, "org.opencontainers.image.version": version})
    runtime["Labels"] = labels
    config["config"] = runtime
    rootfs = dict(config.get("rootfs") or {})
    config["rootfs"] = {"type": "layers", "diff_ids": [*(rootfs.get("diff_ids") or []), diff_id]}
    step = {
        "created": created,
        "created_by": f"nodewright package build: {name} {version} payload at {layout.PAYLOAD_DIR}",
    }
    config["history"] = [*(config.get("history") or []), step]
    return config
