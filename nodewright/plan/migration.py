"""Migration from the reference operator (Skyhook, `skyhook.nvidia.com/v1alpha1`): pure translation.

`nodewright migrate` (nodewright/cli/migrate_cmd.py) reads the cluster and calls these functions; they
decide everything and do no I/O, so the whole migration can be shown as a plan first (docs/migration.md).

Objects. Our `NodeWright` and `DeploymentPolicy` keep the reference's field names, so a `Skyhook` or a
reference `DeploymentPolicy` translates by changing `apiVersion` and `kind`, with these adjustments:
- the pause and disable annotations (`skyhook.nvidia.com/pause|disable`) become ours, other reference
  annotations (the operator's `version` stamp) are dropped, `kubectl`'s last-applied copy too;
- `null` values are dropped (the API server prunes them; "unset" either way);
- a package's map key fills an empty `name` (the reference does the same when decoding);
- an `image` tag that differs from `version` is dropped: the reference cut the tag off and pulled
  `<image>:<version>`, so that is what ran on the nodes (our API refuses a differing tag).
Every field our API does not know is reported with its path (`dropped`), and an object our validation
refuses is reported with each problem (`invalid`): nothing is silently lost.

Node state. The reference's `skyhook.nvidia.com/nodeState_<skyhook>` annotation (JSON map
`"<name>|<version>"` -> `{name, version, image, stage, state, restarts, containerSHA}`) becomes our
`nodewright.io/state.<nodewright>` (nodewright.api.nodestate):
- a spec package recorded `complete` at its last stage (`config`, or `post-interrupt` for a package with
  an interrupt) is complete for us, with the configMap the reference applied (its per-package ConfigMap
  when given, else the spec's), so no pod runs again for it;
- a spec package anywhere else (in flight, erroring, skipped, unknown, or `complete` at a stage that
  is not its last) restarts at the start of its run: `apply`, or `upgrade` when a lower version of the
  package is complete on the node. The entry is written `pending`, so our operator continues it without
  a new admission, as the reference had already started it on that node. The agent skips apply steps
  whose flags say they already succeeded; config and interrupt run again;
- an uninstall in flight restarts the uninstall (the install is recorded complete, so our operator
  runs the uninstall again) when the spec still asks for it, and reinstalls otherwise (what the
  reference does when `uninstall.apply` goes back to false); a finished `uninstall-interrupt` means
  uninstalled (no entry);
- entries of versions or packages not in the spec stay as complete markers ("files of this version may
  remain on the host", the reference's D2 rule); they never make our operator act.
- the reference cordon (`skyhook.nvidia.com/cordon_<skyhook>: "true"` on an unschedulable node) is
  handed over: our state records that we cordoned the node, so our operator uncordons it when the node
  completes. An unschedulable node without that annotation was cordoned by someone else and stays so.
The reference's status label (`skyhook.nvidia.com/status_<skyhook>`) is not carried over: our operator
derives its own from the state; a `complete` label the state does not bear out is reported.
A node state that cannot be read exactly (bad JSON, an unknown stage or state, a key that is not
`name|version`) is reported and nothing is written for that NodeWright on the node: our operator starts
the node over from nothing, and never takes a package there for complete; its reference cordon is
reported and kept (who knows why it is there), to be released by hand after a look at the node.

Taints. The reference's runtime-required taint (default `skyhook.nvidia.com=runtime-required:NoSchedule`)
is replaced by ours on nodes that a migrated runtime-required NodeWright selects, so that our operator
removes it when the node is complete; `skyhook.nvidia.com/autoTaint_<key>` becomes our
`nodewright.io/auto-tainted`. A reference taint on a node no migrated runtime-required NodeWright selects
is reported and left. The reference ignore label (`skyhook.nvidia.com/ignore=true`) becomes ours.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Final, Literal

from pydantic import ValidationError

from nodewright.api import constants, semver
from nodewright.api.images import ImageReferenceError, parse_image
from nodewright.api.models import DeploymentPolicy, NodeWright, Package
from nodewright.api.nodestate import NodeState, PackageEntry, PackageStage, PackageState, entry_key
from nodewright.api.validation import ValidationResult, validate_deploymentpolicy, validate_nodewright
from nodewright.plan.configdiff import config_hashes
from nodewright.plan.selectors import matches

REFERENCE_GROUP: Final = constants.REFERENCE_GROUP
REFERENCE_API_VERSION: Final = f"{REFERENCE_GROUP}/v1alpha1"
REFERENCE_PREFIX: Final = f"{REFERENCE_GROUP}/"
REFERENCE_PAUSE: Final = f"{REFERENCE_PREFIX}pause"
REFERENCE_DISABLE: Final = f"{REFERENCE_PREFIX}disable"
REFERENCE_IGNORE_LABEL: Final = f"{REFERENCE_PREFIX}ignore"
REFERENCE_AUTO_TAINT_PREFIX: Final = f"{REFERENCE_PREFIX}autoTaint_"
DEFAULT_REFERENCE_TAINT: Final = f"{REFERENCE_GROUP}=runtime-required:NoSchedule"
MIGRATED_FROM: Final = f"{constants.PREFIX}migrated-from"
"""Annotation on the objects `nodewright migrate` created: `<reference kind>/<name>`, so a re-run
recognises them (and never touches a NodeWright someone else created under the same name)."""

_LAST_APPLIED: Final = "kubectl.kubernetes.io/last-applied-configuration"
_REFERENCE_STAGES: Final = frozenset(s.value for s in PackageStage)
_REFERENCE_STATES: Final = frozenset({"complete", "in_progress", "skipped", "erroring", "unknown"})
_UNINSTALL_STAGES: Final = frozenset({PackageStage.UNINSTALL, PackageStage.UNINSTALL_INTERRUPT})

Severity = Literal["invalid", "dropped", "note"]


def node_state_annotation(skyhook: str) -> str:
    return f"{REFERENCE_PREFIX}nodeState_{skyhook}"


def cordon_annotation(skyhook: str) -> str:
    return f"{REFERENCE_PREFIX}cordon_{skyhook}"


def status_key(skyhook: str) -> str:
    """The reference's node status for a Skyhook: a label and an annotation of this name."""
    return f"{REFERENCE_PREFIX}status_{skyhook}"


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing about an object that did not translate one to one: its path, what and what to do."""

    severity: Severity
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.path}: {self.message}"


@dataclass(frozen=True, slots=True)
class ObjectTranslation:
    """A reference object and ours; `manifest` is None when it cannot be translated (see findings)."""

    kind: str  # the reference kind: Skyhook or DeploymentPolicy
    name: str
    manifest: dict[str, Any] | None
    findings: tuple[Finding, ...] = ()

    @property
    def invalid(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "invalid")

    @property
    def dropped(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "dropped")

    @property
    def ok(self) -> bool:
        return self.manifest is not None and not self.invalid


# ----------------------------------------------------------------------------------------------------
# Objects


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _dropped_paths(given: Any, kept: Any, path: str) -> list[str]:
    """Paths of `given` (the input) that the model's dump `kept` no longer has."""
    if isinstance(given, dict) and isinstance(kept, dict):
        out: list[str] = []
        for key, value in given.items():
            here = f"{path}.{key}" if path else str(key)
            if key not in kept:
                out.append(here)
            else:
                out.extend(_dropped_paths(value, kept[key], here))
        return out
    if isinstance(given, list) and isinstance(kept, list) and len(given) == len(kept):
        return [
            p
            for i, (g, k) in enumerate(zip(given, kept, strict=True))
            for p in _dropped_paths(g, k, f"{path}[{i}]")
        ]
    return []


def _remove_path(doc: dict[str, Any], path: str) -> None:
    """Remove `a.b[2].c` from `doc` (paths come from `_dropped_paths`, so every step exists)."""
    parts: list[str | int] = []
    for piece in path.split("."):
        name, _, rest = piece.partition("[")
        parts.append(name)
        parts.extend(int(index.rstrip("]")) for index in (rest.split("[") if rest else []))
    target: Any = doc
    for part in parts[:-1]:
        target = target[part]
    last = parts[-1]
    if isinstance(target, dict) and isinstance(last, str):
        target.pop(last, None)


def _metadata(obj: Mapping[str, Any], kind: str) -> tuple[dict[str, Any], list[Finding]]:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    findings: list[Finding] = []
    labels = {
        str(k): str(v)
        for k, v in (meta.get("labels") or {}).items()
        if isinstance(v, str) and not str(k).startswith(REFERENCE_PREFIX)
    }
    annotations: dict[str, str] = {}
    for key, value in (meta.get("annotations") or {}).items():
        if not isinstance(value, str) or key == _LAST_APPLIED:
            continue
        if key in (REFERENCE_PAUSE, REFERENCE_DISABLE):
            if value.lower() == "true":
                ours = constants.ANNOTATION_PAUSE if key == REFERENCE_PAUSE else constants.ANNOTATION_DISABLE
                annotations[ours] = "true"
            continue
        if key.startswith(REFERENCE_PREFIX):
            findings.append(
                Finding(
                    "note", f"metadata.annotations[{key}]", "reference operator bookkeeping; not carried over"
                )
            )
            continue
        annotations[key] = value
    annotations[MIGRATED_FROM] = f"{kind}/{meta.get('name', '')}"
    out: dict[str, Any] = {"name": meta.get("name"), "annotations": annotations}
    if labels:
        out["labels"] = labels
    return out, findings


def _image_fix(pkg: dict[str, Any], path: str) -> Finding | None:
    image, version = pkg.get("image"), pkg.get("version")
    if not isinstance(image, str) or not isinstance(version, str):
        return None
    try:
        ref = parse_image(image)
    except ImageReferenceError:
        return None  # reported by the validation
    first_colon = image.find(":")
    if ref.registry and ":" in ref.registry:
        return Finding(
            "note",
            f"{path}.image",
            f"the reference cut {image!r} at its first ':' (a registry port), so it pulled"
            f" {image[:first_colon]!r}; NodeWright pulls the image as written",
        )
    if ref.tag is not None and ref.tag != version:
        pkg["image"] = ref.repository + (f"@{ref.digest}" if ref.digest else "")
        return Finding(
            "note",
            f"{path}.image",
            f"tag {ref.tag!r} dropped: the reference ignored it and pulled version {version!r},"
            " as NodeWright will",
        )
    return None


def _validation_findings(errors: Sequence[Any]) -> list[Finding]:
    return [
        Finding("invalid", str(e.path), f"{e.message} (fix the reference object, then migrate again)")
        for e in errors
    ]


def _source(
    obj: Mapping[str, Any], reference_kind: str
) -> tuple[str, dict[str, Any], dict[str, Any] | None, list[Finding]]:
    """Name, our metadata, a copy of the spec without nulls (None when there is no spec object), findings."""
    meta, findings = _metadata(obj, reference_kind)
    name = str(meta.get("name") or "")
    raw_spec = obj.get("spec")
    if not isinstance(raw_spec, Mapping):
        return name, meta, None, [*findings, Finding("invalid", "spec", "missing or not an object")]
    return name, meta, _without_nulls(copy.deepcopy(dict(raw_spec))), findings


def translate_skyhook(obj: Mapping[str, Any]) -> ObjectTranslation:
    """The NodeWright for reference Skyhook `obj` (a JSON object as the API server returns it)."""
    name, meta, spec, findings = _source(obj, "Skyhook")
    if spec is None:
        return ObjectTranslation("Skyhook", name, None, tuple(findings))
    packages = spec.get("packages")
    if isinstance(packages, dict):
        for key, pkg in packages.items():
            if not isinstance(pkg, dict):
                continue
            if not pkg.get("name"):
                pkg["name"] = key
            fix = _image_fix(pkg, f"spec.packages[{key}]")
            if fix is not None:
                findings.append(fix)
    return _checked("Skyhook", name, meta, spec, findings, model=NodeWright, validate=validate_nodewright)


def translate_policy(obj: Mapping[str, Any]) -> ObjectTranslation:
    """Our DeploymentPolicy for the reference DeploymentPolicy `obj` (same name, same fields)."""
    name, meta, spec, findings = _source(obj, "DeploymentPolicy")
    if spec is None:
        return ObjectTranslation("DeploymentPolicy", name, None, tuple(findings))
    return _checked(
        "DeploymentPolicy",
        name,
        meta,
        spec,
        findings,
        model=DeploymentPolicy,
        validate=validate_deploymentpolicy,
    )


def _checked(
    reference_kind: str,
    name: str,
    meta: dict[str, Any],
    spec: dict[str, Any],
    findings: list[Finding],
    *,
    model: type[NodeWright] | type[DeploymentPolicy],
    validate: Callable[[Mapping[str, Any]], ValidationResult],
) -> ObjectTranslation:
    """Our object from the translated `spec`: refused with every problem our validation names, else
    created without the fields our API does not know (each reported as `dropped`)."""
    kind = model.__name__
    manifest: dict[str, Any] = {
        "apiVersion": constants.API_VERSION,
        "kind": kind,
        "metadata": meta,
        "spec": spec,
    }
    result = validate(manifest)
    if not result.ok:
        findings.extend(_validation_findings(result.errors))
        return ObjectTranslation(reference_kind, name, None, tuple(findings))
    kept = model.model_validate(manifest).spec.to_json_dict()
    for path in _dropped_paths(spec, kept, "spec"):
        findings.append(
            Finding("dropped", path, f"{kind} has no such field; the object is created without it")
        )
        _remove_path(manifest, path)
    return ObjectTranslation(reference_kind, name, manifest, tuple(findings))


def same_spec(kind: str, stored: Mapping[str, Any], manifest: Mapping[str, Any]) -> bool:
    """Whether a stored object (defaults applied by the API server) has the spec of `manifest`."""
    model = NodeWright if kind == "Skyhook" else DeploymentPolicy
    try:
        a = model.model_validate(dict(stored)).spec.to_json_dict()
        b = model.model_validate(dict(manifest)).spec.to_json_dict()
    except ValidationError:
        return False
    return bool(a == b)


# ----------------------------------------------------------------------------------------------------
# Node state


@dataclass(frozen=True, slots=True)
class ReferenceEntry:
    name: str
    version: str
    stage: PackageStage
    state: str  # the reference's state (complete, in_progress, skipped, erroring, unknown)
    image: str = ""


class MalformedReferenceState(ValueError):
    pass


def parse_reference_state(text: str) -> tuple[ReferenceEntry, ...]:
    """The entries of a `nodeState_<skyhook>` annotation; `MalformedReferenceState` when not exactly
    understood (fields this code does not use are ignored, as the reference's own decoder does)."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise MalformedReferenceState(f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedReferenceState(f"expected a JSON object, got {type(doc).__name__}")
    out = []
    for key, value in doc.items():
        name, sep, version = key.partition("|")
        if not sep or not name or not version or "|" in version:
            raise MalformedReferenceState(f"key {key!r} is not '<name>|<version>'")
        if not isinstance(value, dict):
            raise MalformedReferenceState(f"{key!r}: expected an object")
        for attr, expected in (("name", name), ("version", version)):
            given = value.get(attr, expected)
            if given != expected:
                raise MalformedReferenceState(f"{key!r}: {attr} {given!r} differs from the key")
        stage, state = value.get("stage"), value.get("state")
        if stage not in _REFERENCE_STAGES:
            raise MalformedReferenceState(f"{key!r}: unknown stage {stage!r}")
        if state not in _REFERENCE_STATES:
            raise MalformedReferenceState(f"{key!r}: unknown state {state!r}")
        restarts = value.get("restarts", 0)
        if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
            raise MalformedReferenceState(f"{key!r}: restarts must be a non-negative integer")
        image = value.get("image", "")
        if not isinstance(image, str):
            raise MalformedReferenceState(f"{key!r}: image must be a string")
        out.append(ReferenceEntry(name, version, PackageStage(stage), state, image))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class NodeTranslation:
    """What migrating one (Skyhook, node) pair writes, and why. `state` None: nothing is written."""

    node: str
    skyhook: str
    state: NodeState | None
    complete: tuple[str, ...] = ()  # name|version complete for us
    restarted: tuple[str, ...] = ()  # "name|version: apply (was config/in_progress)"
    markers: tuple[str, ...] = ()  # name|version kept as inert markers
    uninstalled: tuple[str, ...] = ()
    cordon_handed_over: bool = False
    findings: tuple[Finding, ...] = ()

    @property
    def malformed(self) -> bool:
        return any(f.severity == "invalid" for f in self.findings)


def _version_key(version: str) -> semver.Version:
    try:
        return semver.parse(version)
    except semver.InvalidVersion:
        return semver.Version(0, 0, 0, ("invalid",))


def _final_stage(nodewright: NodeWright, name: str, config_updates: Sequence[str]) -> PackageStage:
    """The stage the reference completes the package at (anchor §2.2 "has interrupt"): while the
    Skyhook's `status.configUpdates` lists changed keys, the package has an interrupt only when a
    `configInterrupts` pattern matches one of them."""
    pkg = nodewright.spec.packages[name]
    if config_updates:
        interrupting = any(
            fnmatchcase(k, pattern) for pattern in pkg.config_interrupts or {} for k in config_updates
        )
    else:
        interrupting = pkg.interrupt is not None
    return PackageStage.POST_INTERRUPT if interrupting else PackageStage.CONFIG


def translate_node_state(
    *,
    node: str,
    skyhook: str,
    nodewright: NodeWright,
    annotations: Mapping[str, str],
    unschedulable: bool,
    applied_configs: Mapping[str, Mapping[str, str]] | None = None,
    config_updates: Mapping[str, Sequence[str]] | None = None,
    reference_status: str | None = None,
) -> NodeTranslation:
    """Our node state for `nodewright` (translated from Skyhook `skyhook`) on node `node`.

    `applied_configs` maps `name|version` to the configMap data the reference last applied (its
    per-package ConfigMap); a complete package records those hashes, so a change the reference had
    deferred still runs the config stage under our operator. `config_updates` is the Skyhook's
    `status.configUpdates` (package -> changed keys of the last config cycle). `reference_status` is the
    node's `status_<skyhook>` label: not carried over (our operator derives its own status from the
    state), but a `complete` that the state does not bear out is reported.
    """
    text = annotations.get(node_state_annotation(skyhook))
    findings, hand_over = _reference_cordon(skyhook, annotations, unschedulable)
    if text is None:
        if not hand_over:
            return NodeTranslation(node, skyhook, None, findings=tuple(findings))
        findings.append(
            Finding("note", "cordon", "the reference cordoned the node but recorded no package state")
        )
        return NodeTranslation(
            node, skyhook, NodeState(cordoned=True), cordon_handed_over=True, findings=tuple(findings)
        )
    try:
        entries = parse_reference_state(text)
    except MalformedReferenceState as exc:
        kept = " and the reference cordon is kept (uncordon by hand once the node is checked)"
        findings.append(
            Finding(
                "invalid",
                f"metadata.annotations[{node_state_annotation(skyhook)}]",
                f"{exc}; nothing is written: NodeWright starts this node over" + (kept if hand_over else ""),
            )
        )
        return NodeTranslation(node, skyhook, None, findings=tuple(findings))
    done = _translate_entries(nodewright, entries, applied_configs or {}, config_updates or {})
    if reference_status == "complete" and done.restarted:
        where = f"metadata.labels[{status_key(skyhook)}]"
        findings.append(
            Finding("note", where, "says complete, but the node state is not: the state is followed")
        )
    return NodeTranslation(
        node,
        skyhook,
        NodeState(packages=tuple(done.ours), cordoned=hand_over),
        complete=tuple(sorted(done.complete)),
        restarted=tuple(sorted(done.restarted)),
        markers=tuple(sorted(done.markers)),
        uninstalled=tuple(sorted(done.uninstalled)),
        cordon_handed_over=hand_over,
        findings=tuple(findings),
    )


def _reference_cordon(
    skyhook: str, annotations: Mapping[str, str], unschedulable: bool
) -> tuple[list[Finding], bool]:
    """(findings, whether the reference's cordon is handed over): a cordon the reference recorded on a
    node that is still unschedulable becomes ours; one on a schedulable node is stale."""
    cordoned = annotations.get(cordon_annotation(skyhook)) == "true"
    findings: list[Finding] = []
    if cordoned and not unschedulable:
        where = f"metadata.annotations[{cordon_annotation(skyhook)}]"
        findings.append(Finding("note", where, "stale: the node is schedulable"))
    return findings, cordoned and unschedulable


@dataclass
class _Translated:
    """The translated entries, and each reference entry's fate by `name|version`."""

    ours: list[PackageEntry] = field(default_factory=list)
    complete: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    markers: list[str] = field(default_factory=list)
    uninstalled: list[str] = field(default_factory=list)


def _translate_entries(
    nodewright: NodeWright,
    entries: Sequence[ReferenceEntry],
    configs: Mapping[str, Mapping[str, str]],
    config_updates: Mapping[str, Sequence[str]],
) -> _Translated:
    """Complete packages stay complete, versions no longer in the spec become inert markers, finished
    uninstalls are dropped, and anything caught mid-run starts over (apply, or upgrade over a lower
    complete version)."""
    out = _Translated()
    complete_versions: dict[str, list[str]] = {}
    for e in entries:
        if e.state == "complete" and e.stage not in _UNINSTALL_STAGES:
            complete_versions.setdefault(e.name, []).append(e.version)
    for e in entries:
        key = entry_key(e.name, e.version)
        pkg = nodewright.spec.packages.get(e.name)
        if e.stage == PackageStage.UNINSTALL_INTERRUPT and e.state == "complete":
            out.uninstalled.append(key)
        elif pkg is None or pkg.version != e.version:
            out.ours.append(PackageEntry(e.name, e.version, e.stage, PackageState.COMPLETE, image=e.image))
            out.markers.append(key)
        else:
            _translate_spec_entry(nodewright, pkg, e, key, configs, config_updates, complete_versions, out)
    return out


def _translate_spec_entry(
    nodewright: NodeWright,
    pkg: Package,
    e: ReferenceEntry,
    key: str,
    configs: Mapping[str, Mapping[str, str]],
    config_updates: Mapping[str, Sequence[str]],
    complete_versions: Mapping[str, list[str]],
    out: _Translated,
) -> None:
    """One entry of a package at its spec version."""
    final = _final_stage(nodewright, e.name, config_updates.get(e.name, ()))
    applied = config_hashes(configs.get(key, pkg.config_map or {}))
    settled = PackageEntry(e.name, e.version, final, PackageState.COMPLETE, image=e.image, config=applied)
    wants_uninstall = bool(pkg.uninstall and pkg.uninstall.enabled and pkg.uninstall.apply)
    if e.stage in _UNINSTALL_STAGES and wants_uninstall:
        out.ours.append(settled)
        out.restarted.append(f"{key}: uninstall again (was {e.stage.value}/{e.state})")
        return
    if (
        e.stage not in _UNINSTALL_STAGES
        and e.state == "complete"
        and e.stage in (final, PackageStage.POST_INTERRUPT)
    ):
        out.ours.append(settled)
        out.complete.append(key)
        return
    mine = _version_key(e.version)
    lower = [v for v in complete_versions.get(e.name, []) if _version_key(v) < mine]
    higher = [v for v in complete_versions.get(e.name, []) if _version_key(v) > mine]
    stage = PackageStage.UPGRADE if lower and not higher else PackageStage.APPLY
    out.ours.append(PackageEntry(e.name, e.version, stage, PackageState.PENDING, image=e.image))
    out.restarted.append(f"{key}: {stage.value} (was {e.stage.value}/{e.state})")


# ----------------------------------------------------------------------------------------------------
# Taints and the ignore label


@dataclass(frozen=True, slots=True)
class TaintSpec:
    key: str
    value: str | None
    effect: str

    @classmethod
    def parse(cls, text: str) -> TaintSpec:
        """kubectl syntax `key[=value]:Effect`."""
        head, sep, effect = text.rpartition(":")
        if not sep or not head or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ValueError(f"taint {text!r}: write key[=value]:NoSchedule|PreferNoSchedule|NoExecute")
        key, eq, value = head.partition("=")
        return cls(key, value if eq else None, effect)

    def matches(self, taint: Mapping[str, Any]) -> bool:
        return taint.get("key") == self.key and taint.get("effect") == self.effect

    def to_json(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value is not None:
            out["value"] = self.value
        return out


@dataclass(frozen=True, slots=True)
class NodeExtras:
    """Node-level writes besides the states: taints (None: unchanged), annotations, labels, findings."""

    taints: tuple[dict[str, Any], ...] | None = None
    annotations: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    findings: tuple[Finding, ...] = field(default=())


def translate_node_extras(
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    taints: Sequence[Mapping[str, Any]],
    runtime_required: Sequence[NodeWright],
    reference_taint: TaintSpec,
    our_taint: TaintSpec,
) -> NodeExtras:
    """The runtime-required taint handed over (when a migrated runtime-required NodeWright selects the
    node), the auto-taint marker and the ignore label."""
    findings: list[Finding] = []
    new_annotations: list[tuple[str, str]] = []
    new_labels: list[tuple[str, str]] = []
    if labels.get(REFERENCE_IGNORE_LABEL) == "true" and labels.get(constants.LABEL_IGNORE) != "true":
        new_labels.append((constants.LABEL_IGNORE, "true"))
    new_taints: tuple[dict[str, Any], ...] | None = None
    if any(reference_taint.matches(t) for t in taints):
        selecting = [nw.metadata.name for nw in runtime_required if matches(nw.spec.node_selectors, labels)]
        if selecting:
            kept = [dict(t) for t in taints if not reference_taint.matches(t)]
            if not any(our_taint.matches(t) for t in kept):
                kept.append(our_taint.to_json())
            new_taints = tuple(kept)
            if annotations.get(REFERENCE_AUTO_TAINT_PREFIX + reference_taint.key) == "true":
                new_annotations.append((constants.AUTO_TAINT_ANNOTATION, "true"))
        else:
            findings.append(
                Finding(
                    "note",
                    "spec.taints",
                    f"taint {reference_taint.key}:{reference_taint.effect} left: no migrated runtimeRequired"
                    " NodeWright selects this node; remove it by hand when the node is ready",
                )
            )
    return NodeExtras(new_taints, tuple(new_annotations), tuple(new_labels), tuple(findings))
