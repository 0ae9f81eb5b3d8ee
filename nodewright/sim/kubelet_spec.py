"""From a pod's spec to local processes: what the simulated kubelet runs for each container (pure).

A real kubelet hands a container to the runtime: the image's filesystem, the pod's volumes mounted at
their `mountPath`s, the environment it computed from `env`/`envFrom`, and `command`/`args` after
`$(VAR)` expansion. The simulated kubelet (`nodewright.sim.kubelet`) has no container runtime, so it
runs the container's command as a plain process on this machine and maps the container's view onto
directories of the simulator instead:

- **Images.** An image is never pulled. Any image of the agent (repository ending in `/agent`, or one of
  the configured agent images, e.g. the operator's `--agent-image`) runs our agent,
  `python -m nodewright.agent`, with the container's args. A `pause` image is not run at all: it only
  keeps the pod Running, as the real one does. Any other image is looked up by the last component of its
  repository in directory registries: `<registry>/<name>/<tag>/` first, then `<registry>/<name>/`. The
  directory is either an OCI image layout (an `oci-layout` file: what `nodewright package build`
  writes), whose image (the one named by the tag, or pinned by the digest) the kubelet unpacks, or the
  image's package payload itself, i.e. what the image holds at `/skyhook-package`. An image found
  nowhere is an image pull error, as on a real node.
- **Mounts.** A `hostPath` volume is the node's host-root directory (`<sim dir>/roots/<node>/`) plus its
  path; configMap, secret and emptyDir volumes are materialised in a per-pod directory; the image payload
  is a per-pod copy at `/skyhook-package`, with any volume mounted inside it (the package's configMap at
  `/skyhook-package/configmaps`) placed into that copy. Each container then gets a mount table, longest
  container path first.
- **Path mapping.** Every container path in `command`, `args`, env values and `workingDir` that starts
  with a mount path is rewritten to the mapped directory (whole path components only, so `/root` maps
  but `/rooted` and `/usr/root` do not). This is what makes the operator's copy command
  (`cp -rf /skyhook-package/* /root/${SKYHOOK_DIR}`) and the agent's `<mode> /root <copyDir>` land in the
  node's host root. Paths the process builds at run time from other paths (as the agent does with its
  root argument) need no mapping; paths it hard-codes do not get one.
- **Environment.** As the kubelet builds it: `envFrom` (configMap/secret, with prefix, invalid names
  skipped) first, then `env` in order, where a literal value has `$(VAR)` expanded against the variables
  defined so far (`$$` escapes) and `valueFrom` resolves `configMapKeyRef`, `secretKeyRef` (decoded),
  `fieldRef` (metadata.name/namespace/uid/labels[...]/annotations[...], spec.nodeName,
  spec.serviceAccountName, status.hostIP(s), status.podIP(s)) and `resourceFieldRef` (requests/limits of
  cpu, memory and ephemeral-storage, node allocatable when no limit is set, with the divisor).
  A missing object or key that is not `optional` is a `CreateContainerConfigError` with the kubelet's
  wording; `command`/`args` get `$(VAR)` expansion against the container's environment.

Nothing here touches the file system or the network: callers pass the objects (ConfigMaps, Secrets)
and a directory-exists predicate in.
"""

from __future__ import annotations

import base64
import binascii
import math
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from enum import Enum
from pathlib import Path
from typing import Any, Final

from nodewright.plan.podspec import PAYLOAD_DIR

JSON = dict[str, Any]

REAL_PACKAGES_LABEL: Final = "sim.nodewright.io/real-packages"
"""Node label (value `true`) that hands the node's pods to the simulated kubelet instead of kwok."""

AGENT_REPOSITORY_SUFFIX: Final = "/agent"
PAUSE_NAME: Final = "pause"
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_FIELD_LABEL = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+@%=,:-]+$")


class ContainerConfigError(Exception):
    """The container cannot be created as specified; `reason` is what the kubelet reports."""

    def __init__(self, message: str, *, reason: str = "CreateContainerConfigError") -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def check_safe_directory(path: Path) -> None:
    """Mapped paths end up inside shell commands (the copy step): refuse any that would need quoting."""
    if not _SAFE_PATH.match(str(path)):
        raise ValueError(
            f"simulator directory {str(path)!r} contains characters that shell commands would split or "
            "expand; use a --dir made of letters, digits and -_./+@%=,:"
        )


# ----------------------------------------------------------------------------------------------------
# Images


@dataclass(frozen=True, slots=True)
class ImageRef:
    """A parsed image reference: `[registry/]repository[:tag][@digest]`."""

    registry: str
    repository: str
    tag: str
    digest: str

    @property
    def name(self) -> str:
        return self.repository.rsplit("/", 1)[-1]

    @property
    def without_tag(self) -> str:
        return f"{self.registry}/{self.repository}" if self.registry else self.repository


def parse_image(reference: str) -> ImageRef:
    """Split an image reference the way the container runtime does (registry = a first component with a
    dot or a port, or `localhost`)."""
    rest, _, digest = reference.partition("@")
    registry = ""
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, rest = first, remainder
    repository, tag = rest, ""
    last_slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > last_slash:
        repository, tag = rest[:colon], rest[colon + 1 :]
    if not repository:
        raise ValueError(f"image reference {reference!r} has no repository")
    return ImageRef(registry=registry, repository=repository, tag=tag, digest=digest)


class ImageKind(Enum):
    AGENT = "agent"  # run our agent with the container's args
    PAUSE = "pause"  # not run: keeps the pod Running
    DIRECTORY = "directory"  # a package payload directory, seen at /skyhook-package
    LAYOUT = "layout"  # an OCI image layout: its /skyhook-package, unpacked, is the payload directory


@dataclass(frozen=True, slots=True)
class ResolvedImage:
    kind: ImageKind
    directory: Path | None = None
    ref: ImageRef | None = None  # LAYOUT: which image of the layout (tag or digest)


class ImageNotFound(Exception):
    """No registry holds the image: the kubelet reports ErrImagePull, then ImagePullBackOff."""


def resolve_image(
    reference: str,
    *,
    agent_images: Iterable[str],
    registries: Sequence[Path],
    is_dir: Callable[[Path], bool],
    is_layout: Callable[[Path], bool] = lambda _path: False,
) -> ResolvedImage:
    """What the image means to the simulator (see the module docstring for the rules)."""
    try:
        ref = parse_image(reference)
    except ValueError as err:
        raise ImageNotFound(str(err)) from None
    agents = set(agent_images)
    if reference in agents or ref.without_tag in agents or ref.repository.endswith(AGENT_REPOSITORY_SUFFIX):
        return ResolvedImage(ImageKind.AGENT)
    if ref.repository == "agent" and not ref.registry:
        return ResolvedImage(ImageKind.AGENT)
    if ref.name == PAUSE_NAME:
        return ResolvedImage(ImageKind.PAUSE)
    tried = []
    for registry in registries:
        candidates = [registry / ref.name / ref.tag] if ref.tag else []
        candidates.append(registry / ref.name)
        for candidate in candidates:
            tried.append(str(candidate))
            if is_layout(candidate):
                return ResolvedImage(ImageKind.LAYOUT, candidate, ref)
            if is_dir(candidate):
                return ResolvedImage(ImageKind.DIRECTORY, candidate)
    raise ImageNotFound(
        f"image {reference!r} is not in the simulator's registries (looked for "
        f"{', '.join(tried) or 'none'}); put the package image there (`nodewright package build -o`) or "
        "its directory, or map the image to the agent"
    )


# ----------------------------------------------------------------------------------------------------
# Environment


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Kubernetes `$(VAR)` expansion: `$$` is a literal `$`, an undefined `$(VAR)` stays as written."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close < 0:
                out.append(text[i:])
                break
            name = text[i + 2 : close]
            value = lookup(name)
            out.append(value if value is not None else text[i : close + 1])
            i = close + 1
        else:
            out.append("$")
            i += 1
    return "".join(out)


ObjectKey = tuple[str, str]
"""("ConfigMap" | "Secret", name) in the pod's namespace."""


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What environment and volumes may refer to, besides ConfigMaps and Secrets."""

    pod: JSON
    host_ip: str
    pod_ip: str
    node_allocatable: Mapping[str, str] = field(default_factory=dict)


def referenced_objects(pod: JSON) -> set[ObjectKey]:
    """Every ConfigMap and Secret the pod's env, envFrom and volumes name (to fetch before starting)."""
    keys: set[ObjectKey] = set()
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for entry in container.get("envFrom") or []:
            if name := (entry.get("configMapRef") or {}).get("name"):
                keys.add(("ConfigMap", name))
            if name := (entry.get("secretRef") or {}).get("name"):
                keys.add(("Secret", name))
        for entry in container.get("env") or []:
            source = entry.get("valueFrom") or {}
            if name := (source.get("configMapKeyRef") or {}).get("name"):
                keys.add(("ConfigMap", name))
            if name := (source.get("secretKeyRef") or {}).get("name"):
                keys.add(("Secret", name))
    for volume in spec.get("volumes") or []:
        if name := (volume.get("configMap") or {}).get("name"):
            keys.add(("ConfigMap", name))
        if name := (volume.get("secret") or {}).get("secretName"):
            keys.add(("Secret", name))
    return keys


def object_data(kind: str, obj: JSON) -> dict[str, bytes]:
    """The key -> bytes content of a ConfigMap (data and binaryData) or a Secret (decoded data)."""
    out: dict[str, bytes] = {}
    if kind == "ConfigMap":
        for key, value in (obj.get("data") or {}).items():
            out[key] = str(value).encode()
        for key, value in (obj.get("binaryData") or {}).items():
            out[key] = _b64(value, kind, obj, key)
    else:
        for key, value in (obj.get("data") or {}).items():
            out[key] = _b64(value, kind, obj, key)
        for key, value in (obj.get("stringData") or {}).items():
            out[key] = str(value).encode()
    return out


def _b64(value: Any, kind: str, obj: JSON, key: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        name = (obj.get("metadata") or {}).get("name", "?")
        raise ContainerConfigError(f"{kind} {name!r} key {key!r} is not valid base64") from None


def _lookup_object(
    objects: Mapping[ObjectKey, JSON | None], kind: str, name: str, *, optional: bool
) -> JSON | None:
    obj = objects.get((kind, name))
    if obj is None and not optional:
        noun = "configmap" if kind == "ConfigMap" else "secret"
        raise ContainerConfigError(f'{noun} "{name}" not found')
    return obj


def container_env(
    container: JSON, facts: PodFacts, objects: Mapping[ObjectKey, JSON | None]
) -> dict[str, str]:
    """The container's environment as the kubelet computes it (insertion order = definition order)."""
    namespace = (facts.pod.get("metadata") or {}).get("namespace", "default")
    env: dict[str, str] = {}
    for entry in container.get("envFrom") or []:
        prefix = entry.get("prefix") or ""
        for ref_field, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
            ref = entry.get(ref_field)
            if not ref:
                continue
            obj = _lookup_object(objects, kind, ref.get("name", ""), optional=bool(ref.get("optional")))
            if obj is None:
                continue
            for key, content in object_data(kind, obj).items():
                name = prefix + key
                if _ENV_NAME.match(name):  # the kubelet skips invalid names (and reports an event)
                    env[name] = content.decode(errors="replace")
    for entry in container.get("env") or []:
        name = entry.get("name", "")
        if entry.get("valueFrom"):
            value = _value_from(entry["valueFrom"], name, container, facts, objects, namespace)
            if value is None:  # optional reference not found: the variable is not set
                continue
            env[name] = value
        else:
            env[name] = expand(str(entry.get("value", "")), env.get)
    return env


def _value_from(
    source: JSON,
    name: str,
    container: JSON,
    facts: PodFacts,
    objects: Mapping[ObjectKey, JSON | None],
    namespace: str,
) -> str | None:
    for ref_field, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
        ref = source.get(ref_field)
        if not ref:
            continue
        optional = bool(ref.get("optional"))
        obj = _lookup_object(objects, kind, ref.get("name", ""), optional=optional)
        if obj is None:
            return None
        data = object_data(kind, obj)
        key = ref.get("key", "")
        if key not in data:
            if optional:
                return None
            raise ContainerConfigError(f"couldn't find key {key} in {kind} {namespace}/{ref.get('name', '')}")
        return data[key].decode(errors="replace")
    if field_ref := source.get("fieldRef"):
        return field_value(str(field_ref.get("fieldPath", "")), facts, variable=name)
    if resource_ref := source.get("resourceFieldRef"):
        return resource_value(resource_ref, container, facts, variable=name)
    raise ContainerConfigError(f"env {name}: valueFrom has no source the kubelet knows")


def field_value(path: str, facts: PodFacts, *, variable: str) -> str:
    """The downward-API value of `path` (the fields the kubelet supports for env)."""
    meta = facts.pod.get("metadata") or {}
    spec = facts.pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": facts.host_ip,
        "status.hostIPs": facts.host_ip,
        "status.podIP": facts.pod_ip,
        "status.podIPs": facts.pod_ip,
    }
    if path in simple:
        return str(simple[path])
    match = _FIELD_LABEL.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ContainerConfigError(f"env {variable}: unsupported fieldRef fieldPath {path!r}")


_SUFFIXES: Final[dict[str, Decimal | int]] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes resource quantity (`500m`, `2`, `64Mi`, `1e3`) as a number."""
    value = str(text).strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if value.endswith(suffix) and value[: -len(suffix)]:
            try:
                return Decimal(value[: -len(suffix)]) * Decimal(_SUFFIXES[suffix])
            except InvalidOperation:
                break
    try:
        return Decimal(value)
    except InvalidOperation:
        raise ValueError(f"invalid quantity {text!r}") from None


def resource_value(ref: JSON, container: JSON, facts: PodFacts, *, variable: str) -> str:
    """`resourceFieldRef`: the container's request/limit (a limit defaults to the node's allocatable),
    divided by the divisor and rounded up, as the kubelet does."""
    resource = str(ref.get("resource", ""))
    kind, _, name = resource.partition(".")
    if kind not in ("requests", "limits") or name not in ("cpu", "memory", "ephemeral-storage"):
        raise ContainerConfigError(f"env {variable}: unsupported resourceFieldRef resource {resource!r}")
    resources = container.get("resources") or {}
    raw = (resources.get(kind) or {}).get(name)
    if raw is None and kind == "requests":
        raw = (resources.get("limits") or {}).get(name)
    if raw is None:
        raw = facts.node_allocatable.get(name, "0")
    try:
        amount = parse_quantity(str(raw))
        divisor = parse_quantity(str(ref.get("divisor") or "1"))
    except ValueError as err:
        raise ContainerConfigError(f"env {variable}: {err}") from None
    if divisor <= 0:
        raise ContainerConfigError(f"env {variable}: resourceFieldRef divisor must be positive")
    return str(math.ceil(amount / divisor))


# ----------------------------------------------------------------------------------------------------
# Volumes and mounts


@dataclass(frozen=True, slots=True)
class HostPathVolume:
    path: str  # absolute path on the node
    type: str  # "", Directory, DirectoryOrCreate, File, FileOrCreate, ...


@dataclass(frozen=True, slots=True)
class ObjectVolume:
    """A configMap or secret volume: files materialised from the object's keys."""

    kind: str  # ConfigMap | Secret
    name: str
    items: tuple[tuple[str, str, int | None], ...]  # (key, path, mode); empty = every key
    default_mode: int
    optional: bool


@dataclass(frozen=True, slots=True)
class EmptyDirVolume:
    pass


VolumeSource = HostPathVolume | ObjectVolume | EmptyDirVolume


def volume_sources(pod: JSON) -> dict[str, VolumeSource]:
    """The pod's volumes the simulator can provide; any other kind is a configuration error."""
    out: dict[str, VolumeSource] = {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = volume.get("name", "")
        if "hostPath" in volume:
            host = volume["hostPath"] or {}
            path = str(host.get("path", ""))
            if not path.startswith("/"):
                raise ContainerConfigError(f"volume {name!r}: hostPath.path {path!r} must be absolute")
            out[name] = HostPathVolume(path=posixpath.normpath(path), type=str(host.get("type") or ""))
        elif "configMap" in volume or "secret" in volume:
            kind = "ConfigMap" if "configMap" in volume else "Secret"
            source = volume.get("configMap") or volume.get("secret") or {}
            object_name = source.get("name") if kind == "ConfigMap" else source.get("secretName")
            items = tuple(
                (str(i.get("key", "")), str(i.get("path", "")), i.get("mode"))
                for i in source.get("items") or []
            )
            out[name] = ObjectVolume(
                kind=kind,
                name=str(object_name or ""),
                items=items,
                default_mode=int(source.get("defaultMode", 0o644)),
                optional=bool(source.get("optional")),
            )
        elif "emptyDir" in volume:
            out[name] = EmptyDirVolume()
        else:
            kinds = sorted(set(volume) - {"name"}) or ["(none)"]
            raise ContainerConfigError(
                f"volume {name!r}: the simulated kubelet supports hostPath, configMap, secret and emptyDir "
                f"volumes, not {', '.join(kinds)}"
            )
    return out


def object_volume_files(
    volume: ObjectVolume, obj: JSON | None, *, volume_name: str
) -> dict[str, tuple[bytes, int]]:
    """Relative path -> (content, mode) of a configMap/secret volume, as the kubelet projects it."""
    if obj is None:
        if volume.optional:
            return {}
        noun = "configmap" if volume.kind == "ConfigMap" else "secret"
        raise ContainerConfigError(f'volume {volume_name!r}: {noun} "{volume.name}" not found')
    data = object_data(volume.kind, obj)
    if not volume.items:
        return {key: (value, volume.default_mode) for key, value in data.items()}
    files: dict[str, tuple[bytes, int]] = {}
    for key, path, mode in volume.items:
        if key not in data:
            if volume.optional:
                continue
            raise ContainerConfigError(
                f"volume {volume_name!r}: key {key!r} not found in {volume.kind} {volume.name}"
            )
        files[_relative(path, volume_name)] = (data[key], volume.default_mode if mode is None else int(mode))
    return files


def _relative(path: str, volume_name: str) -> str:
    normal = posixpath.normpath(path)
    if normal.startswith(("/", "..")) or normal == ".":
        raise ContainerConfigError(
            f"volume {volume_name!r}: item path {path!r} must be relative, without '..'"
        )
    return normal


@dataclass(frozen=True, slots=True)
class Mount:
    """`container_path` in the container is `host_path` on this machine."""

    container_path: str
    host_path: str


@dataclass(frozen=True, slots=True)
class NestedMount:
    """A volume mounted inside the image payload: placed into the per-pod payload copy at `relative`.
    ConfigMap/secret content is copied (read-only anyway, and `cp -rf` must see real files); hostPath and
    emptyDir are linked so writes stay shared."""

    relative: str
    host_path: str
    copy: bool


@dataclass(frozen=True, slots=True)
class ContainerMounts:
    mounts: tuple[Mount, ...]  # longest container path first
    nested: tuple[NestedMount, ...]


def container_mounts(
    container: JSON,
    volumes: Mapping[str, VolumeSource],
    *,
    node_root: str,
    volume_dir: Callable[[str], str],
    payload_view: str | None,
) -> ContainerMounts:
    """The container's mount table. `volume_dir(name)` is where a non-hostPath volume is materialised;
    `payload_view` is the per-pod copy of the image payload (None for images without one)."""
    mounts: list[Mount] = []
    nested: list[NestedMount] = []
    if payload_view is not None:
        mounts.append(Mount(PAYLOAD_DIR, payload_view))
    cname = container.get("name", "")
    for entry in container.get("volumeMounts") or []:
        vname = entry.get("name", "")
        path = str(entry.get("mountPath", ""))
        if not path.startswith("/") or posixpath.normpath(path) == "/":
            raise ContainerConfigError(
                f"container {cname!r}: mountPath {path!r} must be an absolute path other than /"
            )
        path = posixpath.normpath(path)
        if vname not in volumes:
            raise ContainerConfigError(
                f"container {cname!r}: volumeMount {vname!r} names no volume of the pod"
            )
        source = volumes[vname]
        if isinstance(source, HostPathVolume):
            host = node_root.rstrip("/") + (source.path if source.path != "/" else "")
        else:
            host = volume_dir(vname)
        if sub := entry.get("subPath"):
            host = posixpath.join(host, _relative(str(sub), vname))
        if payload_view is not None and path.startswith(PAYLOAD_DIR + "/"):
            nested.append(
                NestedMount(path[len(PAYLOAD_DIR) + 1 :], host, copy=isinstance(source, ObjectVolume))
            )
        else:
            mounts.append(Mount(path, host or "/"))
    mounts.sort(key=lambda m: len(m.container_path), reverse=True)
    return ContainerMounts(tuple(mounts), tuple(nested))


def map_paths(text: str, mounts: Sequence[Mount]) -> str:
    """Rewrite container paths in `text` to their mapped directories (whole path components only)."""
    if not mounts:
        return text
    by_path = {m.container_path: m.host_path for m in mounts}
    alternatives = "|".join(re.escape(p) for p in sorted(by_path, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w./-])({alternatives})(?=/|$|[^\w.-])")
    return pattern.sub(lambda match: by_path[match.group(1)], text)


# ----------------------------------------------------------------------------------------------------
# The process


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None  # None: the kubelet's per-container scratch directory


def process_spec(
    container: JSON,
    *,
    image: ResolvedImage,
    env: Mapping[str, str],
    mounts: Sequence[Mount],
    agent_command: Sequence[str],
) -> ProcessSpec:
    """argv, environment and working directory of the container's process, paths mapped."""
    command = [str(c) for c in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    name = container.get("name", "")
    lookup = env.get
    argv_raw = [expand(c, lookup) for c in command] + [expand(a, lookup) for a in args]
    mapped = [map_paths(part, mounts) for part in argv_raw]
    if command:
        argv = mapped
    elif image.kind is ImageKind.AGENT:
        argv = [*agent_command, *mapped]
    else:
        raise ContainerConfigError(
            f"container {name!r}: the simulator knows no entrypoint for image {container.get('image')!r}; "
            "set command",
            reason="CreateContainerError",
        )
    if not argv:
        raise ContainerConfigError(f"container {name!r}: empty command", reason="CreateContainerError")
    mapped_env = {key: map_paths(value, mounts) for key, value in env.items()}
    working_dir = container.get("workingDir")
    cwd = map_paths(str(working_dir), mounts) if working_dir else None
    return ProcessSpec(argv=tuple(argv), env=mapped_env, cwd=cwd)
