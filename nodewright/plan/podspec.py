"""Pure builder of package and interrupt pod manifests, compatible with existing package images.

Package images built for the reference (NVIDIA Skyhook/NodeWright, anchor §2.12-§2.13) run unchanged:

- init container `<pkg>-init` (the package image) copies the image's `/skyhook-package` payload to a
  per-package directory on the host (`<hostRootMount>/<copyDir>`);
- for each stage the pod runs, init containers `<pkg>-<stage>` and `<pkg>-<stage>check` run the agent
  image with args `<stage> <hostRootMount> <copyDir>` and `<stage>-check <hostRootMount> <copyDir>`.
  One pod runs every stage of a transition up to the next interrupt (`transition_stages`): an install
  is `apply, apply-check, config, config-check` in one pod (an upgrade likewise), so the kubelet runs
  them back to back and the operator writes the node once when the pod ends instead of once per
  stage. The reference runs one pod per stage with the same containers, args and environment, so
  package images cannot tell the difference;
- interrupt pods have a single `interrupt` init container with args
  `interrupt <hostRootMount> <copyDir> <base64 JSON in the agent's vocabulary>`;
- a `pause` main container keeps the pod Running after the init containers finished;
- env: `SKYHOOK_LOG_DIR`, `SKYHOOK_ROOT_DIR`, `COPY_RESOLV=false`, `SKYHOOK_RESOURCE_ID`,
  `SKYHOOK_NODE_ORDER` and `NODEWRIGHT_*` equivalents, then the package env (incl. valueFrom); package
  env cannot override the operator-managed names (except `COPY_RESOLV`, a documented toggle);
- privileged, hostPID, hostNetwork, host `/` mounted with HostToContainer propagation, tolerations for
  unschedulable + the runtime-required taint + additionalTolerations.

Stage and interrupt pods are created **unbound** (no `nodeName`; `schedulerName` names no scheduler, so
none places them) with the intended node in the annotation `nodewright.io/target-node`, and the operator
binds them with a `Binding` that also carries the pod's seal (`controller.trust`): nothing of a pod runs
before the operator holding the pod's uid has sealed it, so a crash between create and seal leaves a pod
that did nothing. Drift-check pods (read-only) are created bound.

Differences from the reference: `restartPolicy: Never` (the operator owns retries, attempts are counted
and bounded, anchor §11.4); every container has `terminationMessagePolicy: FallbackToLogsOnError`, so
a container that fails carries the tail of its log (the kubelet's last 80 lines, at most 2 KiB) in its
terminated state: the reason for a failure arrives with the status that reports it, in the same watch
event, and does not depend on reading `pods/log` before the pod is deleted; the image reference keeps
registry ports intact (`registry:5000/x`, §11.8); pods carry `nodewright.io/*` labels and an `attempt`
and `spec-hash` annotation.

The spec hash covers everything whose change must replace a running pod (images, env, resources,
config data, tolerations, interrupt, grace period), and deliberately NOT the NodeWright generation,
attempt or node order: editing an unrelated part of the NodeWright must not kill running pods.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from nodewright.api import constants
from nodewright.api.images import effective_image
from nodewright.api.models import Interrupt, NodeWright, Package
from nodewright.api.nodestate import PackageStage
from nodewright.plan import interrupts as interrupts_mod
from nodewright.plan.configdiff import config_digest

PAYLOAD_DIR: Final = "/skyhook-package"
CONFIGMAP_MOUNT: Final = f"{PAYLOAD_DIR}/configmaps"
NODE_METADATA_MOUNT: Final = f"{PAYLOAD_DIR}/node-metadata"
INTERRUPT_STAGES: Final = (PackageStage.INTERRUPT, PackageStage.UNINSTALL_INTERRUPT)
# A failed container's terminated state carries its log tail (kubelet: last 80 lines, at most 2 KiB).
FAILURE_MESSAGE_POLICY: Final = {"terminationMessagePolicy": "FallbackToLogsOnError"}
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_RESERVED_ENV: Final = frozenset(
    {
        "SKYHOOK_LOG_DIR",
        "SKYHOOK_ROOT_DIR",
        "SKYHOOK_RESOURCE_ID",
        "SKYHOOK_DIR",
        *constants.ENV_NODE_ORDER,
        "NODEWRIGHT_LOG_DIR",
        "NODEWRIGHT_ROOT_DIR",
        "NODEWRIGHT_RESOURCE_ID",
    }
)


@dataclass(frozen=True, slots=True)
class PodOptions:
    namespace: str = "nodewright"
    agent_image: str = constants.DEFAULT_AGENT_IMAGE
    pause_image: str = "registry.k8s.io/pause:3.10"
    copy_dir_root: str = "/var/lib/skyhook"
    log_root: str = "/var/log/skyhook"
    host_root_mount: str = "/root"
    runtime_required_taint_key: str = constants.DEFAULT_RUNTIME_REQUIRED_TAINT_KEY
    image_pull_secret: str | None = None
    node_metadata_configmap: bool = False  # mount `<nw>-<node>-metadata` if the controller provides it
    interrupt_resources: tuple[str, str] = ("500m", "64Mi")
    pause_resources: tuple[str, str] = ("100m", "20Mi")
    extra_labels: tuple[tuple[str, str], ...] = field(default=())


# ----------------------------------------------------------------------------------------------------
# Names


def _hash(*parts: object, length: int = 8) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:length]


def _dns_label(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def safe_name(*parts: str, limit: int = 63, hash_input: tuple[object, ...] = ()) -> str:
    """DNS-1123 label from `parts`, truncated, with an 8-hex hash suffix over the full input."""
    suffix = _hash(*parts, *hash_input)
    base = _dns_label("-".join(parts))[: limit - len(suffix) - 1].rstrip("-")
    return f"{base}-{suffix}" if base else suffix


def label_value(text: str) -> str:
    """A valid label value: invalid characters become '_'; too long values are truncated + hashed."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "_", text)
    if len(value) > constants.LABEL_NAME_LIMIT or not _LABEL_VALUE.match(value):
        value = re.sub(r"^[^A-Za-z0-9]+", "", value)[:54]
        value = re.sub(r"[^A-Za-z0-9]+$", "", value)
        value = f"{value}-{_hash(text)}" if value else _hash(text)
    return value


def package_configmap_name(nodewright: str, package: str, version: str) -> str:
    """Per-version ConfigMap `<nw>-<pkg>-<ver>`, lower-cased and made a valid DNS subdomain."""
    name = re.sub(r"[^a-z0-9.-]", "-", f"{nodewright}-{package}-{version}".lower()).strip("-.")
    if len(name) > 253:
        name = f"{name[:244].rstrip('-.')}-{_hash(nodewright, package, version)}"
    return name


def node_metadata_configmap_name(nodewright: str, node: str) -> str:
    return safe_name(nodewright, node, "metadata", limit=253)


def pod_name(
    nodewright: str, package: str, version: str, stage: PackageStage, node: str, attempt: int, spec_hash: str
) -> str:
    return safe_name(nodewright, package, stage.value, node, hash_input=(version, attempt, spec_hash))


# ----------------------------------------------------------------------------------------------------
# Image references


def image_reference(image: str, version: str, container_sha: str | None = None) -> str:
    """The image a package pod pulls (rules in `nodewright.api.images`)."""
    return effective_image(image, version, container_sha)


# ----------------------------------------------------------------------------------------------------
# Pieces


def copy_dir(nw: NodeWright, package: str, version: str, options: PodOptions) -> str:
    return (
        f"{options.copy_dir_root}/{nw.metadata.name}/"
        f"{package}-{version}-{nw.metadata.uid or ''}-{nw.metadata.generation or 0}"
    )


def resource_id(nw: NodeWright, package: str, version: str, run: str = "") -> str:
    """The agent's `SKYHOOK_RESOURCE_ID`: `<nodewright>-<uid>-<generation>[-<run>]_<package>_<version>`.

    The agent keys its interrupt flags by it: an interrupt command whose flag exists is skipped, so the
    interrupt pod the kubelet runs again after the reboot it caused does not reboot again. The
    generation alone does not tell two runs apart (a drift repair, or a retry under a fresh admission,
    runs the interrupt again in the same generation), so interrupt pods add `run` (`interrupt_run`):
    every attempt of every interrupt gets its own flags. The reference agent splits the id on `_`
    into exactly three parts, so `run` never contains one.
    """
    owner = f"{nw.metadata.name}-{nw.metadata.uid or ''}-{nw.metadata.generation or 0}"
    return f"{owner}-{run}_{package}_{version}" if run else f"{owner}_{package}_{version}"


def interrupt_run(interrupt_at: str, attempt: int) -> str:
    """The identity of one attempt of a node interrupt on the host: when the interrupt started (the
    node state's `ia`, UTC, to the second) and the attempt (`20250131T120000Z.1`)."""
    return f"{re.sub(r'[^0-9A-Za-z]', '', interrupt_at)}.{attempt}"


def tolerations(nw: NodeWright, options: PodOptions) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        {"key": options.runtime_required_taint_key, "operator": "Exists"},
    ]
    out.extend(t.to_json_dict() for t in nw.spec.additional_tolerations or [])
    return out


def parse_duration_seconds(text: str) -> float:
    """Go time.ParseDuration subset used by the API (`90s`, `1h30m`, `1.5h`, `0`)."""
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    if text == "0":
        return 0.0
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"invalid duration {text!r}")
    return sum(float(n) * units[u] for n, u in parts)


def _package_env(package: Package) -> list[dict[str, Any]]:
    return [e.to_json_dict() for e in package.env or [] if e.name not in _RESERVED_ENV]


def _agent_env(
    nw: NodeWright, package: str, version: str, node_order: int, options: PodOptions, run: str = ""
) -> list[dict[str, Any]]:
    name = nw.metadata.name
    rid = resource_id(nw, package, version, run)
    log_dir = f"{options.log_root}/{name}"
    root_dir = f"{options.copy_dir_root}/{name}"
    env = [
        {"name": "SKYHOOK_LOG_DIR", "value": log_dir},
        {"name": "SKYHOOK_ROOT_DIR", "value": root_dir},
        {"name": "COPY_RESOLV", "value": "false"},
        {"name": "SKYHOOK_RESOURCE_ID", "value": rid},
        {"name": "NODEWRIGHT_LOG_DIR", "value": log_dir},
        {"name": "NODEWRIGHT_ROOT_DIR", "value": root_dir},
        {"name": "NODEWRIGHT_RESOURCE_ID", "value": rid},
    ]
    env.extend({"name": n, "value": str(node_order)} for n in constants.ENV_NODE_ORDER)
    return env


def _resources(package: Package) -> dict[str, Any] | None:
    r = package.resources
    if r is None or not (r.cpu_request or r.memory_request or r.cpu_limit or r.memory_limit):
        return None
    req = {k: v for k, v in (("cpu", r.cpu_request), ("memory", r.memory_request)) if v}
    lim = {k: v for k, v in (("cpu", r.cpu_limit), ("memory", r.memory_limit)) if v}
    return {"requests": req, "limits": lim}


def _agent_image(package: Package, options: PodOptions) -> str:
    return package.agent_image_override or options.agent_image


def spec_hash(
    nw: NodeWright,
    package: Package,
    *,
    package_name: str,
    version: str,
    stage: PackageStage,
    interrupt: Interrupt | None,
    options: PodOptions,
    repair: bool = False,
    chain: Sequence[ChainLink] = (),
    run: str = "",
) -> str:
    """Hash of everything that should replace a running pod when it changes (with a chain: the hash of
    each chained package's run as well, so a change to any of them replaces the pod). An interrupt
    pod's `run` (`interrupt_run`) is part of it: the pods of two interrupt runs never share a name, so
    a leftover pod of the last run is never taken for the next one's."""
    identity: dict[str, Any] = {
        "stage": stage.value,
        "package": package_name,
        "version": version,
        "agent": _agent_image(package, options),
        "pause": options.pause_image,
        "tolerations": tolerations(nw, options),
        "pullSecret": options.image_pull_secret,
        "paths": [options.copy_dir_root, options.log_root, options.host_root_mount],
    }
    if stage in INTERRUPT_STAGES:
        identity["interrupt"] = interrupts_mod.interrupt_json(interrupt) if interrupt else None
    else:
        identity.update(
            image=image_reference(package.image, version, package.container_sha),
            env=_package_env(package),
            resources=_resources(package),
            config=config_digest(package.config_map),
            grace=package.graceful_shutdown,
        )
    if repair:
        identity["repair"] = True  # only when set: existing pods keep their hash
    if run and stage in INTERRUPT_STAGES:
        identity["run"] = run
    if chain:  # only when set: unchained pods keep their hash
        identity["chain"] = [
            spec_hash(
                nw,
                link.package,
                package_name=link.package_name,
                version=link.version,
                stage=link.stage,
                interrupt=None,
                options=options,
            )
            for link in chain
        ]
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class ChainLink:
    """A package run that follows the pod's own package in the same pod.

    With `--chain-packages` the operator puts the runs of packages that depend only on the pod's
    package (and on each other) into its pod, after its stages: an install of `a -> b -> c` is one pod
    running `a` apply and config, then `b`'s, then `c`'s, instead of three pods one after another. Only
    runs without an interrupt are chained (the interrupt needs the node drained, and a pod of its own).
    """

    package_name: str
    package: Package
    version: str
    stage: PackageStage


def encode_chain(chain: Sequence[ChainLink]) -> str:
    return json.dumps([[c.package_name, c.version, c.stage.value] for c in chain], separators=(",", ":"))


def parse_chain(text: str | None) -> tuple[tuple[str, str, PackageStage], ...] | None:
    """The `(package, version, first stage)` of each chained run, or None when the annotation is not
    one we write (a pod with such a chain is not one of ours and is never read as one)."""
    if not text:
        return ()
    try:
        raw = json.loads(text)
        links = tuple((str(p), str(v), PackageStage(s)) for p, v, s in raw)
    except (ValueError, TypeError):
        return None
    if any(stage not in (PackageStage.APPLY, PackageStage.UPGRADE) for _, _, stage in links):
        return None
    return links


# ----------------------------------------------------------------------------------------------------
# The pod

REPAIR_ENV: Final = (
    {"name": "OVERLAY_ALWAYS_RUN_STEP", "value": "true"},
    {"name": "NODEWRIGHT_REPAIR", "value": "true"},
)
"""Extra environment of a repair run (drift, action reapply): the agent runs steps again although their
flags say they already succeeded with these arguments (the agent contract's OVERLAY_ALWAYS_RUN_STEP)."""

DRIFT_CHECK_MODES: Final = ("apply-check", "config-check")
"""Read-only modes a drift check runs for every package (plus post-interrupt-check when the package has
an interrupt: it reads the running values back)."""
_DEFAULT_STAGE_TIMEOUT: Final = str(Package.model_fields["stage_timeout"].default)


def transition_stages(stage: PackageStage) -> tuple[PackageStage, ...]:
    """The stages one pod starting at `stage` runs, in order: every stage up to the next interrupt.

    apply and upgrade are always followed by config, so their pod runs config as well; an interrupt
    has a pod of its own (the node may reboot under it) and post-interrupt follows it. (The stage
    machine, `plan.stages.pod_stages`, uses this very list.)
    """
    if stage in (PackageStage.APPLY, PackageStage.UPGRADE):
        return (stage, PackageStage.CONFIG)
    return (stage,)


def transition_modes(stage: PackageStage) -> tuple[str, ...]:
    """The agent modes of a pod starting at `stage`: each stage's work, then its check."""
    return tuple(mode for s in transition_stages(stage) for mode in (s.value, f"{s.value}-check"))


def build_pod(
    nw: NodeWright,
    package: Package,
    *,
    package_name: str,
    version: str,
    stage: PackageStage,
    node: str,
    attempt: int,
    node_order: int,
    options: PodOptions,
    interrupt: Interrupt | None = None,
    repair: bool = False,
    chain: Sequence[ChainLink] = (),
    run: str = "",
) -> dict[str, Any]:
    """The manifest of the pod running `stage` of `package_name@version` on `node` (attempt >= 1),
    followed by the runs of `chain` (see `ChainLink`).

    For interrupt stages, `package` is the carrier package, `interrupt` the merged interrupt and `run`
    the attempt's identity on the host (`interrupt_run`, part of the agent's resource id).
    `repair` marks a run that re-applies after drift (see `REPAIR_ENV`).
    """
    _check_pod_shape(stage, interrupt=interrupt, repair=repair, chain=chain)
    nw_name = nw.metadata.name
    s_hash = spec_hash(
        nw,
        package,
        package_name=package_name,
        version=version,
        stage=stage,
        interrupt=interrupt,
        options=options,
        repair=repair,
        chain=chain,
        run=run,
    )
    volumes, mounts = _base_volumes(nw_name, node, options)
    head = ChainLink(package_name, package, version, stage)
    if interrupt is not None and stage in INTERRUPT_STAGES:
        env = _agent_env(nw, package_name, version, node_order, options, run)
        init = [_interrupt_container(nw, package, package_name, version, interrupt, env, mounts, options)]
    else:
        init = _chain_containers(nw, [head, *chain], node_order, repair, volumes, mounts, options)
    spec = _pod_spec(nw, node, init, volumes, options)
    grace = None if stage in INTERRUPT_STAGES else _grace_seconds([package, *(c.package for c in chain)])
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    name = pod_name(nw_name, package_name, version, stage, node, attempt, s_hash)
    labels, annotations = _pod_keys(package_name, version, stage, attempt, s_hash, interrupt, chain)
    return _pod(nw, name, node, labels=labels, annotations=annotations, spec=spec, options=options)


def _chain_containers(
    nw: NodeWright,
    runs: Sequence[ChainLink],
    node_order: int,
    repair: bool,
    volumes: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    options: PodOptions,
) -> list[dict[str, Any]]:
    """The init containers of a run and the runs chained after it, in order (only the first repairs)."""
    return [
        container
        for index, link in enumerate(runs)
        for container in _run_containers(
            nw,
            link,
            node_order=node_order,
            repair=repair and index == 0,
            volumes=volumes,
            mounts=mounts,
            options=options,
        )
    ]


def _check_pod_shape(
    stage: PackageStage, *, interrupt: Interrupt | None, repair: bool, chain: Sequence[ChainLink]
) -> None:
    if stage in INTERRUPT_STAGES and interrupt is None:
        raise ValueError(f"stage {stage.value} needs an interrupt")
    if chain and (stage in INTERRUPT_STAGES or repair):
        raise ValueError("only the stages of a run without interrupt or repair can be followed by a chain")


def _pod_keys(
    package_name: str,
    version: str,
    stage: PackageStage,
    attempt: int,
    s_hash: str,
    interrupt: Interrupt | None,
    chain: Sequence[ChainLink],
) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations that say which package run (and attempt) the pod is."""
    labels = {
        constants.POD_LABEL_PACKAGE: package_name,
        constants.POD_LABEL_VERSION: label_value(version),
        constants.POD_LABEL_STAGE: stage.value,
    }
    annotations = {constants.POD_ANNOTATION_ATTEMPT: str(attempt), constants.POD_ANNOTATION_SPEC_HASH: s_hash}
    if interrupt is not None and stage in INTERRUPT_STAGES:
        annotations[constants.POD_ANNOTATION_INTERRUPT] = interrupts_mod.interrupt_json(interrupt)
    if chain:
        annotations[constants.POD_ANNOTATION_CHAIN] = encode_chain(chain)
    return labels, annotations


def _run_containers(
    nw: NodeWright,
    run: ChainLink,
    *,
    node_order: int,
    repair: bool,
    volumes: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    options: PodOptions,
) -> list[dict[str, Any]]:
    """One package run's init containers: its payload copy, then each stage's work and check."""
    package_mounts = _with_package_configmap(nw.metadata.name, run.package_name, run.package, volumes, mounts)
    env = _agent_env(nw, run.package_name, run.version, node_order, options) + _package_env(run.package)
    return _stage_containers(
        nw,
        run.package,
        run.package_name,
        run.version,
        modes=transition_modes(run.stage),
        env=env + (list(REPAIR_ENV) if repair else []),
        mounts=package_mounts,
        options=options,
    )


def _grace_seconds(packages: Sequence[Package]) -> int | None:
    """The pod's grace period: the longest `gracefulShutdown` of the packages it runs (None: the default)."""
    graces = [int(parse_duration_seconds(p.graceful_shutdown)) for p in packages if p.graceful_shutdown]
    return max(graces) if graces else None


def drift_check_name(nodewright: str, node: str, slot: int, spec_digest: str, basis: str = "") -> str:
    """The drift-check pod of one check slot and basis: deterministic, so a repeated create means
    "already done"; a check made again in the same slot on another basis (after a reboot or a run)
    gets another name."""
    extra = (basis,) if basis else ()
    return safe_name(nodewright, "drift", node, hash_input=(slot, spec_digest, *extra))


def drift_check_container(package: str, mode: str) -> str:
    """Container name of one package's check in a drift-check pod (`<pkg>-applycheck`, ...), the same
    names as in stage pods."""
    return _mode_container(package, mode)


def drift_check_deadline(packages: Iterable[Package]) -> int:
    """Seconds a drift-check pod may run (its `activeDeadlineSeconds`): one `stageTimeout` per package
    it checks (default 30m each), added up, as a stage pod gets one per stage it runs.

    A check pod holds back every stage pod of its NodeWright on the node until it is gone (`plan.node`),
    so a check that hangs (a check step that never returns, a payload copy stuck on the host) must end:
    the kubelet ends it at this deadline (phase `Failed`, reason `DeadlineExceeded`), and the operator
    deletes one still there `plan.drift.CHECK_GRACE` seconds later (a kubelet that is down or cut off
    ends nothing). Either way it is counted as a drift-check `error`, not as drift.
    """
    default = parse_duration_seconds(_DEFAULT_STAGE_TIMEOUT)
    total = sum(parse_duration_seconds(p.stage_timeout) or default for p in packages)
    return math.ceil(total or default)


def build_drift_check_pod(
    nw: NodeWright,
    packages: Sequence[tuple[str, Package, str]],
    *,
    node: str,
    slot: int,
    options: PodOptions,
    basis: str = "",
) -> dict[str, Any]:
    """One read-only pod checking every `(name, package, installed version)` on a complete node.

    For each package: its payload copy, then the agent's apply-check and config-check (and
    post-interrupt-check when it has an interrupt), in order; the first failing check fails the pod and
    names the package and check (`drift_check_container`). No cordon, drain or interrupt is involved;
    the agent's check modes are read-only by contract. `basis` (`plan.drift.check_basis`: what the check
    is made against, the packages' last runs and the node's boot) goes on the pod as the annotation
    `nodewright.io/drift-basis`: the result counts only while it still holds. The pod has a deadline
    (`activeDeadlineSeconds`, `drift_check_deadline`).
    """
    nw_name = nw.metadata.name
    volumes, mounts = _base_volumes(nw_name, node, options)
    init: list[dict[str, Any]] = []
    digest_parts: list[object] = []
    for name, package, version in packages:
        package_mounts = _with_package_configmap(nw_name, name, package, volumes, mounts)
        modes = DRIFT_CHECK_MODES + (("post-interrupt-check",) if package.interrupt is not None else ())
        env = _agent_env(nw, name, version, 0, options) + _package_env(package)
        init += _stage_containers(
            nw, package, name, version, modes=modes, env=env, mounts=package_mounts, options=options
        )
        digest_parts.append(
            spec_hash(
                nw,
                package,
                package_name=name,
                version=version,
                stage=PackageStage.APPLY,
                interrupt=None,
                options=options,
            )
        )
    digest = _hash(*digest_parts, length=16)
    labels = {
        constants.POD_LABEL_PURPOSE: constants.POD_PURPOSE_DRIFT_CHECK,
        constants.POD_LABEL_STAGE: constants.POD_STAGE_DRIFT_CHECK,
    }
    annotations = {constants.POD_ANNOTATION_SPEC_HASH: digest, constants.POD_ANNOTATION_DRIFT_SLOT: str(slot)}
    if basis:
        annotations[constants.POD_ANNOTATION_DRIFT_BASIS] = basis
    spec = _pod_spec(nw, node, init, volumes, options, bound=True)
    spec["activeDeadlineSeconds"] = drift_check_deadline(package for _, package, _ in packages)
    name = drift_check_name(nw_name, node, slot, digest, basis)
    return _pod(nw, name, node, labels=labels, annotations=annotations, spec=spec, options=options)


# -- the steps of a pod ------------------------------------------------------------------------------


def _base_volumes(
    nw_name: str, node: str, options: PodOptions
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The host root (and the node metadata ConfigMap) every container of a package pod mounts."""
    root_mount = {
        "name": "root-mount",
        "mountPath": options.host_root_mount,
        "mountPropagation": "HostToContainer",
    }
    volumes: list[dict[str, Any]] = [{"name": "root-mount", "hostPath": {"path": "/"}}]
    mounts: list[dict[str, Any]] = [root_mount]
    if options.node_metadata_configmap:
        volumes.append(
            {"name": "metadata", "configMap": {"name": node_metadata_configmap_name(nw_name, node)}}
        )
        mounts.append({"name": "metadata", "mountPath": NODE_METADATA_MOUNT})
    return volumes, mounts


def _with_package_configmap(
    nw_name: str,
    package_name: str,
    package: Package,
    volumes: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The mounts of the package's containers: the base ones plus its configMap (added to `volumes`)."""
    if not package.config_map:
        return mounts
    volume = f"{package_name}-configmap"
    volumes.append(
        {
            "name": volume,
            "configMap": {"name": package_configmap_name(nw_name, package_name, package.version)},
        }
    )
    return [*mounts, {"name": volume, "mountPath": CONFIGMAP_MOUNT}]


def _interrupt_container(
    nw: NodeWright,
    package: Package,
    package_name: str,
    version: str,
    interrupt: Interrupt,
    env: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    options: PodOptions,
) -> dict[str, Any]:
    cpu, mem = options.interrupt_resources
    cdir = copy_dir(nw, package_name, version, options)
    return {
        "name": "interrupt",
        "image": _agent_image(package, options),
        "imagePullPolicy": "Always",
        "args": ["interrupt", options.host_root_mount, cdir, interrupts_mod.agent_payload(interrupt)],
        "env": env,
        "securityContext": {"privileged": True},
        "volumeMounts": mounts,
        "resources": {"requests": {"cpu": cpu, "memory": mem}, "limits": {"cpu": cpu, "memory": mem}},
        **FAILURE_MESSAGE_POLICY,
    }


def _stage_containers(
    nw: NodeWright,
    package: Package,
    package_name: str,
    version: str,
    *,
    modes: Sequence[str],
    env: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    options: PodOptions,
) -> list[dict[str, Any]]:
    """The payload copy (`<pkg>-init`), then one agent container per mode, in order."""
    root = options.host_root_mount
    cdir = copy_dir(nw, package_name, version, options)
    privileged = {"privileged": True}
    target = f"{root}/${{SKYHOOK_DIR}}"
    copy = {
        "name": f"{package_name}-init",
        "image": image_reference(package.image, version, package.container_sha),
        "imagePullPolicy": "Always",
        "command": ["/bin/sh"],
        "args": ["-c", f"mkdir -p {target} && cp -rf {PAYLOAD_DIR}/* {target}"],
        "env": [{"name": "SKYHOOK_DIR", "value": cdir}],
        "securityContext": privileged,
        "volumeMounts": mounts,
        **FAILURE_MESSAGE_POLICY,
    }
    agent = _agent_image(package, options)
    steps = [
        {
            "name": _mode_container(package_name, mode),
            "image": agent,
            "imagePullPolicy": "Always",
            "args": [mode, root, cdir],
            "env": env,
            "securityContext": privileged,
            "volumeMounts": mounts,
            **FAILURE_MESSAGE_POLICY,
        }
        for mode in modes
    ]
    containers = [copy, *steps]
    resources = _resources(package)
    if resources is not None:
        for c in containers:
            c["resources"] = resources
    return containers


def _mode_container(package_name: str, mode: str) -> str:
    # Stage pods keep the reference's names (`<pkg>-<stage>`, `<pkg>-<stage>check`).
    if mode.endswith("-check"):
        return f"{package_name}-{mode.removesuffix('-check')}check"
    return f"{package_name}-{mode}"


def pod_node(pod: Mapping[str, Any]) -> str:
    """The node a package pod runs on, or will once bound (`nodewright.io/target-node`)."""
    bound = (pod.get("spec") or {}).get("nodeName")
    if bound:
        return str(bound)
    return str(
        ((pod.get("metadata") or {}).get("annotations") or {}).get(constants.POD_ANNOTATION_NODE) or ""
    )


def _pod_spec(
    nw: NodeWright,
    node: str,
    init: list[dict[str, Any]],
    volumes: list[dict[str, Any]],
    options: PodOptions,
    *,
    bound: bool = False,
) -> dict[str, Any]:
    pcpu, pmem = options.pause_resources
    placement: dict[str, Any] = (
        {"nodeName": node} if bound else {"schedulerName": constants.POD_SCHEDULER_NAME}
    )
    spec: dict[str, Any] = {
        **placement,
        "restartPolicy": "Never",
        # Package steps run as root on the host and need no API access: no ServiceAccount token is
        # mounted (the ServiceAccount admission plugin would add the namespace's `default` token).
        "automountServiceAccountToken": False,
        "hostPID": True,
        "hostNetwork": True,
        "initContainers": init,
        "containers": [
            {
                "name": "pause",
                "image": options.pause_image,
                "resources": {
                    "requests": {"cpu": pcpu, "memory": pmem},
                    "limits": {"cpu": pcpu, "memory": pmem},
                },
            }
        ],
        "tolerations": tolerations(nw, options),
        "volumes": volumes,
    }
    if options.image_pull_secret:
        spec["imagePullSecrets"] = [{"name": options.image_pull_secret}]
    return spec


def _pod(
    nw: NodeWright,
    name: str,
    node: str,
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    spec: dict[str, Any],
    options: PodOptions,
) -> dict[str, Any]:
    owner = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND_NODEWRIGHT,
        "name": nw.metadata.name,
        "uid": nw.metadata.uid or "",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    all_labels = {
        constants.POD_OWNER_LABEL: constants.POD_OWNER_VALUE,
        constants.POD_LABEL_NODEWRIGHT: nw.metadata.name,
        **labels,
        constants.POD_LABEL_NODE: label_value(node),
        **dict(options.extra_labels),
    }
    annotations = {**annotations, constants.POD_ANNOTATION_NODE: node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": options.namespace,
            "labels": all_labels,
            "annotations": dict(annotations),
            "ownerReferences": [owner],
        },
        "spec": spec,
    }


# ----------------------------------------------------------------------------------------------------
# What a pod runs, canonicalised (the part of a package pod its signature binds)

RUN_DIGEST_FIELD: Final = "runDigest"
"""Key of the run digest in a trimmed pod (`kube.trim.trim_pod` computes it from the full object)."""

SERVICE_ACCOUNT_MOUNT: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
_SA_VOLUME_PREFIX: Final = "kube-api-access-"
_SA_CA_SOURCE: Final = {
    "configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
}
_SA_NAMESPACE_SOURCE: Final = {
    "downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}
}
_DEFAULT_TOLERATION_KEYS: Final = frozenset(
    {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
)
_CONTAINER_LISTS: Final = ("initContainers", "containers", "ephemeralContainers")
# Derived by admission from other bound fields (priorityClassName, runtimeClassName), or not about what
# runs or with which privileges (container and pod resources; in-place resize may change them).
_UNBOUND_POD_FIELDS: Final = ("priority", "overhead", "resources")
_UNBOUND_CONTAINER_FIELDS: Final = ("resources", "resizePolicy")
_POD_DEFAULTS: Final[tuple[tuple[str, object], ...]] = (
    ("dnsPolicy", "ClusterFirst"),
    ("schedulerName", "default-scheduler"),
    ("enableServiceLinks", True),
    ("restartPolicy", "Always"),
    ("terminationGracePeriodSeconds", 30),
    ("preemptionPolicy", "PreemptLowerPriority"),
)
_CONTAINER_DEFAULTS: Final[tuple[tuple[str, object], ...]] = (
    ("terminationMessagePath", "/dev/termination-log"),
    ("terminationMessagePolicy", "File"),
)
# Go `bool` fields with `omitempty`: false is never serialised, so false and absent are the same.
_PLAIN_BOOLS: Final = frozenset(
    {"hostNetwork", "hostPID", "hostIPC", "stdin", "stdinOnce", "tty", "readOnly"}
)


def _default_pull_policy(image: str) -> str:
    """The imagePullPolicy the API server fills in: Always for `:latest` or no tag, else IfNotPresent."""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _is_injected_token_volume(volume: Any) -> bool:
    """The projected volume the ServiceAccount admission plugin adds (`kube-api-access-<random>`)."""
    volume = _normalise(volume)
    if not isinstance(volume, dict) or set(volume) != {"name", "projected"}:
        return False
    if not str(volume["name"]).startswith(_SA_VOLUME_PREFIX) or set(volume["projected"]) != {"sources"}:
        return False
    sources = volume["projected"]["sources"]
    if not isinstance(sources, list) or len(sources) != 3:
        return False
    token = sources[0].get("serviceAccountToken") if isinstance(sources[0], dict) else None
    return (
        isinstance(token, dict)
        and set(sources[0]) == {"serviceAccountToken"}
        and set(token) <= {"path", "expirationSeconds"}
        and token.get("path") == "token"
        and sources[1] == _SA_CA_SOURCE
        and sources[2] == _SA_NAMESPACE_SOURCE
    )


def _is_injected_token_mount(mount: Any, token_volumes: set[str]) -> bool:
    return (
        isinstance(mount, dict)
        and mount.get("name") in token_volumes
        and mount.get("mountPath") == SERVICE_ACCOUNT_MOUNT
        and mount.get("readOnly") is True
        and set(mount) == {"name", "mountPath", "readOnly"}
    )


def _is_default_toleration(toleration: Any) -> bool:
    """A toleration the DefaultTolerationSeconds admission plugin adds (its seconds are a server flag)."""
    return (
        isinstance(toleration, dict)
        and toleration.get("key") in _DEFAULT_TOLERATION_KEYS
        and toleration.get("operator") == "Exists"
        and toleration.get("effect") == "NoExecute"
        and set(toleration) <= {"key", "operator", "effect", "tolerationSeconds"}
    )


def _normalise(value: Any) -> Any:
    """Server defaults that can appear anywhere, then Go's `omitempty`: empty and plain-false go."""
    if isinstance(value, list):
        return [_normalise(v) for v in value]  # items keep their place: args ["-c", ""] means something
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        item = _normalise(item)
        if item in (None, "", {}, []) or (key in _PLAIN_BOOLS and item is False):
            continue
        if key == "defaultMode" and item == 420:
            continue
        if key == "fieldRef" and isinstance(item, dict) and item.get("apiVersion") == "v1":
            item = {k: v for k, v in item.items() if k != "apiVersion"}
        if key == "resourceFieldRef" and isinstance(item, dict):
            # Quantities come back in canonical form ("1024Ki" -> "1Mi"); the divisor only scales the
            # value of an environment variable, so it is left out instead of re-implemented here.
            item = {k: v for k, v in item.items() if k != "divisor"}
        out[key] = item
    return out


def _canonical_container(container: Any, *, host_network: bool, token_volumes: set[str]) -> Any:
    if not isinstance(container, dict):
        return container
    out = {k: v for k, v in container.items() if k not in _UNBOUND_CONTAINER_FIELDS}
    for key, default in _CONTAINER_DEFAULTS:
        if out.get(key) == default:
            del out[key]
    if out.get("imagePullPolicy") == _default_pull_policy(str(out.get("image") or "")):
        del out["imagePullPolicy"]
    mounts = out.get("volumeMounts")
    if isinstance(mounts, list):
        out["volumeMounts"] = [m for m in mounts if not _is_injected_token_mount(m, token_volumes)]
    ports = out.get("ports")
    if isinstance(ports, list):
        canonical_ports = []
        for port in ports:
            if isinstance(port, dict):
                port = dict(port)
                if port.get("protocol") == "TCP":
                    del port["protocol"]
                if host_network and port.get("hostPort") == port.get("containerPort"):
                    port.pop("hostPort", None)
            canonical_ports.append(port)
        out["ports"] = canonical_ports
    return out


def run_spec(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical form of what `pod` runs, where, and with which privileges.

    It is the whole pod `spec` -- every container list (images, commands, args, env, envFrom, mounts,
    security contexts, probes, lifecycle hooks), volumes, host namespaces, service account, node,
    tolerations, everything -- except the fields below, which kube-apiserver (v1.36, default admission
    plugins) fills in or derives on create, so that our own pods read back equal to what was built:

    - defaults, removed when they hold the default value: `dnsPolicy: ClusterFirst`, `schedulerName:
      default-scheduler`, `enableServiceLinks: true`, `restartPolicy: Always`,
      `terminationGracePeriodSeconds: 30`, `preemptionPolicy: PreemptLowerPriority`, container
      `terminationMessagePath: /dev/termination-log`, `terminationMessagePolicy: File`, the
      `imagePullPolicy` implied by the image tag, volume `defaultMode: 420`, `fieldRef.apiVersion: v1`,
      port `protocol: TCP` (and `hostPort` = `containerPort` with hostNetwork);
    - Go `omitempty`: empty strings, lists and objects (`hostPath.type: ""`, `securityContext: {}`) and
      false plain booleans (`hostNetwork`, `hostPID`, `hostIPC`, `readOnly`, `stdin`, `tty`) are absent;
    - `serviceAccountName` defaults to `default`; the deprecated `serviceAccount` mirrors it;
    - admission additions: the ServiceAccount plugin's `kube-api-access-*` token volume and its
      read-only mounts at the service-account path (exact shape only; what it grants follows from the
      bound `serviceAccountName` and `automountServiceAccountToken`), and DefaultTolerationSeconds'
      `not-ready`/`unreachable` NoExecute tolerations;
    - `nodeName` when it equals the pod's `nodewright.io/target-node` annotation (the operator's
      binding sets it after create; another node stays in and fails the digest);
    - not bound at all: `priority` and `overhead` (derived from the bound class names), pod and
      container `resources` and `resizePolicy` (quantities are rewritten, and they do not change what
      runs or its privileges), `resourceFieldRef.divisor`.

    Lists keep their order (env order matters for `$(VAR)` references; the server keeps it).
    """
    spec = run_spec_source(pod)
    if spec is None:
        return {}
    out = {k: v for k, v in spec.items() if k not in _UNBOUND_POD_FIELDS}
    for key, default in _POD_DEFAULTS:
        if out.get(key) == default:
            del out[key]
    token_volumes = _without_admission_additions(out)
    host_network = out.get("hostNetwork") is True
    for field_name in _CONTAINER_LISTS:
        containers = out.get(field_name)
        if isinstance(containers, list):
            out[field_name] = [
                _canonical_container(c, host_network=host_network, token_volumes=token_volumes)
                for c in containers
            ]
    normalised: dict[str, Any] = _normalise(out)
    return normalised


def run_spec_source(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """All that `run_spec` reads of `pod`: its `spec`, without `nodeName` when that is the node of the
    `nodewright.io/target-node` annotation (the operator's binding after create: the identity binds the
    target, so it is not part of what runs); None when the pod has no spec object.

    Pods with equal sources have equal run specs, so a cache of `run_digest` may be keyed by this
    (`kube.trim.RunDigests`): an unbound pod and the same pod bound to its target share one entry.
    """
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return None
    target = ((pod.get("metadata") or {}).get("annotations") or {}).get(constants.POD_ANNOTATION_NODE)
    if target and spec.get("nodeName") == target:
        return {k: v for k, v in spec.items() if k != "nodeName"}
    return spec


def _without_admission_additions(out: dict[str, Any]) -> set[str]:
    """Drop what admission adds to a pod spec (the default service account, its token volume, the
    default tolerations) from `out`, in place; returns the names of the token volumes dropped."""
    account = out.pop("serviceAccountName", None) or out.pop("serviceAccount", None) or "default"
    out.pop("serviceAccount", None)
    if account != "default":
        out["serviceAccountName"] = account
    volumes = out.get("volumes")
    token_volumes: set[str] = set()
    if isinstance(volumes, list):
        token_volumes = {str(v["name"]) for v in volumes if _is_injected_token_volume(v)}
        out["volumes"] = [v for v in volumes if not _is_injected_token_volume(v)]
    tolerations_ = out.get("tolerations")
    if isinstance(tolerations_, list):
        out["tolerations"] = [t for t in tolerations_ if not _is_default_toleration(t)]
    return token_volumes


def run_digest(pod: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of `run_spec(pod)`; a trimmed pod carries it precomputed in `RUN_DIGEST_FIELD`."""
    precomputed = pod.get(RUN_DIGEST_FIELD)
    if isinstance(precomputed, str):
        return precomputed
    text = json.dumps(run_spec(pod), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def run_spec_changes(built: Mapping[str, Any], stored: Mapping[str, Any], *, limit: int = 5) -> list[str]:
    """Paths where the run spec of `stored` differs from `built` (at most `limit`, for messages)."""
    changes: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if len(changes) >= limit or a == b:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key), b.get(key), f"{path}.{key}")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                walk(x, y, f"{path}[{i}]")
        else:
            changes.append(path)

    walk(run_spec(built), run_spec(stored), "spec")
    return changes
