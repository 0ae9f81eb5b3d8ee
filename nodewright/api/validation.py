"""Semantic validation of NodeWright, DeploymentPolicy and DisruptionBudget objects, beyond the CRD schema.

The CRD schema and its CEL rules (generated from `nodewright.api.models`) are enforced by the API server
even when the admission webhook is down. This module adds the rules that need the whole object, the
previous object, or facts from the cluster, and reports *all* problems at once with the field path of
each (`spec.packages[nvidia-driver].dependsOn[cuda]`) and what to do about it:

- Kubernetes' own rules for everything the operator later copies into objects the API server validates
  (`nodewright.api.k8svalidation`): tolerations, env and `valueFrom`, configMap keys and size, label
  selectors, image references (package `image`, `agentImageOverride`), DNS names; a spec that passes
  here never makes the API server refuse a package pod or ConfigMap;
- dependsOn targets exist with the exact version, and the dependency graph has no cycle (named);
- configInterrupts keys are configMap keys, or globs (`fnmatch`) matching at least one key;
- a tag in the image equals the version; durations fit Go's time.Duration; interrupt services are
  systemd unit names;
- names are DNS subdomains, short enough for the node label/annotation keys built from them
  (63-character label names); compartment names are label values;
- on UPDATE: removing or downgrading a package with `uninstall.enabled` is refused until its uninstall
  has completed on every node (a fact the caller supplies through `PackagePresence`);
- on UPDATE with an unchanged spec (metadata-only changes: finalizers, pause/disable annotations), the
  spec rules are not re-applied, so an object stored under older, looser rules can still be paused,
  disabled and deleted (the API server ratchets its schema rules the same way);
- DeploymentPolicy compartments: unique names, and selectors that do not select the same nodes
  (compared semantically: `matchLabels: {a: b}` equals `matchExpressions: [{key: a, operator: In,
  values: [b]}]`).

Any JSON value is accepted as input (a string where an object belongs, numbers for strings, missing
metadata) and answered with field errors, never an exception: the webhook turns them into a 4xx.
Where a rule here and a schema rule blame the same field, only this module's message is kept (it says
what to do; the schema's only quotes the pattern).

Risky but legal specs produce warnings (returned to `kubectl` as admission warnings).

Everything here is pure: cluster facts are passed in as values or synchronous callables, so the webhook
fetches them first and the rules stay unit-testable.
"""

from __future__ import annotations

import fnmatch
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from pydantic import BaseModel, ValidationError

from nodewright.api import constants, semver
from nodewright.api import k8svalidation as k8s
from nodewright.api.images import ImageReferenceError, parse_image
from nodewright.api.k8svalidation import FieldError as FieldError  # re-exported: the public error type
from nodewright.api.models import (
    DeploymentPolicy,
    DisruptionBudget,
    InterruptType,
    NodeWright,
    field_cel_rules,
)
from nodewright.api.schedules import maintenance_problems

_GLOB_CHARS = set("*?[")
# Pydantic's type errors, said in JSON's words (the user wrote JSON or YAML, not Python).
_TYPE_NAMES = {
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "bool_type": "a boolean",
    "list_type": "a list",
}
_IDENT = re.compile(r"^[a-z][A-Za-z0-9]*$")
# JSON fields whose keys are user-chosen names; paths render them as [key] rather than .key.
_MAP_FIELDS = frozenset(
    {
        "packages",
        "dependsOn",
        "configInterrupts",
        "configMap",
        "matchLabels",
        "compartmentStatuses",
        "nodeCounts",
    }
)


@dataclass(frozen=True)
class ValidationResult:
    errors: list[FieldError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


class PackagePresence(Protocol):
    """Whether package `package` of NodeWright `nodewright` is still installed on any node."""

    def __call__(self, nodewright: str, package: str) -> bool: ...


# ----------------------------------------------------------------------------------------------------
# Paths


def render_path(loc: Sequence[str | int]) -> str:
    """`("spec", "packages", "a", "dependsOn", "b")` -> `spec.packages[a].dependsOn[b]`."""
    out = ""
    previous: str | int | None = None
    for part in loc:
        if isinstance(part, int) or previous in _MAP_FIELDS:
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
        previous = part if previous not in _MAP_FIELDS else None
    return out


def model_errors(exc: ValidationError) -> list[FieldError]:
    """Pydantic errors as FieldErrors (pydantic already collects every field error, not just the first)."""
    return [e for e, _ in _tagged_model_errors(exc)]


def _tagged_model_errors(exc: ValidationError) -> list[tuple[FieldError, bool]]:
    """Model errors, each tagged True when it comes from a rule (a CelRule) rather than a type or bound."""
    out: list[tuple[FieldError, bool]] = []
    for err in exc.errors(include_url=False):
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "missing":
            message = "required field is missing: set it"
        elif err["type"] in _TYPE_NAMES:
            message = f"must be {_TYPE_NAMES[err['type']]}, not {_json_type(err.get('input'))}"
        rule = err["type"] == "value_error"
        # Field-level rules are raised by the parent object as "<field>: <message>"; blame the field.
        for part in message.split("; ") if rule else [message]:
            head, sep, rest = part.partition(": ")
            if sep and _IDENT.match(head):
                out.append((FieldError(render_path([*loc, head]), rest), rule))
            else:
                out.append((FieldError(render_path(loc) or "<root>", part), rule))
    return out


def _validate_model(cls: type[BaseModel], obj: Any) -> list[tuple[FieldError, bool]]:
    try:
        cls.model_validate(obj)
    except ValidationError as exc:
        # Pydantic skips an object's rules when one of its fields is invalid; the API server evaluates
        # every CEL rule regardless, so evaluate them on the raw JSON too and report all problems.
        return [*_tagged_model_errors(exc), *((e, True) for e in cel_errors(cls, obj, []))]
    return []


def cel_errors(cls: type[BaseModel], obj: Any, loc: list[str | int]) -> list[FieldError]:
    """Evaluate the CEL rules' Python predicates on raw JSON (best effort where the shape is wrong)."""
    if not isinstance(obj, Mapping):
        return []
    out: list[FieldError] = []
    here = render_path(loc) or "<root>"
    for rule in getattr(cls, "cel_rules", ()):
        if _fails(rule.check, obj):
            where = render_path([*loc, rule.field_path.lstrip(".")]) if rule.field_path else here
            out.append(FieldError(where, rule.message))
    for name, info in cls.model_fields.items():
        alias = info.alias or (info.validation_alias if isinstance(info.validation_alias, str) else name)
        if alias not in obj or obj[alias] is None:
            continue
        value = obj[alias]
        rules = field_cel_rules(info)
        out.extend(FieldError(render_path([*loc, alias]), r.message) for r in rules if _fails(r.check, value))
        inner = _model_of(info.annotation)
        if inner is None:
            continue
        shape, model = inner
        if shape == "one":
            out.extend(cel_errors(model, value, [*loc, alias]))
        elif shape == "map" and isinstance(value, Mapping):
            for k, v in value.items():
                out.extend(cel_errors(model, v, [*loc, alias, str(k)]))
        elif shape == "list" and isinstance(value, list):
            for i, v in enumerate(value):
                out.extend(cel_errors(model, v, [*loc, alias, i]))
    return out


def _fails(check: Callable[[Any], bool], value: Any) -> bool:
    try:
        return not check(value)
    except (KeyError, TypeError, AttributeError, ValueError, ArithmeticError):
        return False  # wrong shape: the type error is reported by the model validation


def _model_of(tp: Any) -> tuple[str, type[BaseModel]] | None:
    for arg in _flatten(tp):
        origin = typing.get_origin(arg)
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return ("one", arg)
        if origin in (list, dict):
            inner = typing.get_args(arg)[-1]
            for sub in _flatten(inner):
                if isinstance(sub, type) and issubclass(sub, BaseModel):
                    return ("list" if origin is list else "map", sub)
    return None


def _flatten(tp: Any) -> list[Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return [x for a in typing.get_args(tp) for x in _flatten(a)]
    if origin is typing.Annotated:
        return _flatten(typing.get_args(tp)[0])
    return [tp]


def _merge(model: list[tuple[FieldError, bool]], semantic: list[FieldError]) -> list[FieldError]:
    """Semantic errors, plus the model's where no semantic error blames the same field.

    A semantic error at `x[key]` also replaces the model's rule message at `x` (a map-key rule such as
    "keys must be file names" is then said precisely, per key); type and size errors at `x` stay.
    """
    exact = {e.path for e in semantic}
    parents = {e.path.rsplit("[", 1)[0] for e in semantic if e.path.endswith("]")}
    kept = [e for e, rule in model if e.path not in exact and not (rule and e.path in parents)]
    return _dedupe([*semantic, *kept])


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# ----------------------------------------------------------------------------------------------------
# Label selectors


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a valid label key, or None."""
    problems = k8s.qualified_name(key)
    return f"label key {problems[0]}" if problems else None


def label_value_problem(value: str) -> str | None:
    problems = k8s.label_value(value)
    return problems[0] if problems else None


def canonical_selector(selector: Mapping[str, Any] | None) -> frozenset[tuple[str, str, frozenset[str]]]:
    """A selector as a set of requirements, so semantically equal selectors compare equal."""
    reqs: set[tuple[str, str, frozenset[str]]] = set()
    for key, value in _map(_map(selector).get("matchLabels")).items():
        reqs.add((str(key), "In", frozenset({str(value)})))
    for expr in _list(_map(selector).get("matchExpressions")):
        if isinstance(expr, Mapping):
            reqs.add(
                (
                    str(expr.get("key")),
                    str(expr.get("operator")),
                    frozenset(map(str, _list(expr.get("values")))),
                )
            )
    return frozenset(reqs)


# ----------------------------------------------------------------------------------------------------
# Dependency graph


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Every elementary cycle of `graph` once, as [a, b, ..., a], rotated to start at its smallest node."""
    cycles: set[tuple[str, ...]] = set()
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :]
                low = cycle.index(min(cycle))
                cycles.add(tuple(cycle[low:] + cycle[:low]))
            elif state.get(nxt) is None:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return [[*c, c[0]] for c in sorted(cycles)]


# ----------------------------------------------------------------------------------------------------
# NodeWright


def packages_needing_presence(new: Any, old: Any) -> list[str]:
    """Packages whose removal or downgrade on this UPDATE is only allowed once they are gone from all nodes.

    The webhook looks these up (and only these) before calling `validate_nodewright`.
    """
    if not isinstance(old, Mapping) or not old:
        return []
    old_pkgs = _packages(old)
    new_pkgs = _packages(new)
    out = []
    for name, pkg in old_pkgs.items():
        if _map(pkg.get("uninstall")).get("enabled") is not True:
            continue
        if name not in new_pkgs or _is_downgrade(pkg.get("version"), new_pkgs[name].get("version")):
            out.append(name)
    return out


def _packages(obj: Any) -> dict[str, Mapping[str, Any]]:
    packages = _map(_map(_map(obj).get("spec")).get("packages"))
    return {str(k): v for k, v in packages.items() if isinstance(v, Mapping)}


def _is_downgrade(old: Any, new: Any) -> bool:
    if not (
        isinstance(old, str) and isinstance(new, str) and semver.is_semver(old) and semver.is_semver(new)
    ):
        return False  # invalid versions are reported elsewhere and not compared, like the reference
    return semver.compare(new, old) < 0


def _metadata_name_errors(obj: Mapping[str, Any], kind: str, max_length: int) -> list[FieldError]:
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return []  # the model reports a missing or malformed metadata
    name = metadata.get("name")
    if name == "":
        return [FieldError("metadata.name", "required: name the object")]
    if not isinstance(name, str):
        return []  # a missing name or one of the wrong type is the model's to report
    if len(name) > max_length:
        return [
            FieldError(
                "metadata.name",
                f"{len(name)} characters is too long: at most {max_length}"
                + (
                    f" so the node label {constants.status_label('<name>')} stays within the 63-character"
                    " label name limit"
                    if kind == constants.KIND_NODEWRIGHT
                    else ""
                )
                + "; choose a shorter name",
            )
        ]
    return k8s.errors_at("metadata.name", k8s.dns1123_subdomain(name))


def _ratchet(errors: list[FieldError], obj: Mapping[str, Any], old: Any) -> list[FieldError]:
    """On an UPDATE that leaves the spec as stored, drop the spec's errors (see the module docstring)."""
    if not isinstance(old, Mapping) or obj.get("spec") != old.get("spec"):
        return errors
    return [e for e in errors if not (e.path == "spec" or e.path.startswith(("spec.", "spec[")))]


def validate_nodewright(
    obj: Any,
    *,
    old: Mapping[str, Any] | None = None,
    policy_exists: Callable[[str], bool] | None = None,
    presence: PackagePresence | None = None,
) -> ValidationResult:
    """All problems of a NodeWright (CREATE: old=None; UPDATE: old is the stored object).

    `policy_exists` answers whether a DeploymentPolicy exists (skipped when None); `presence` whether a
    package is still on some node (UPDATE rules are skipped when None).
    """
    if not isinstance(obj, Mapping):
        return ValidationResult([FieldError("<root>", "a NodeWright must be a JSON object")], [])
    errors: list[FieldError] = []
    warnings: list[str] = []
    model = _validate_model(NodeWright, obj)
    errors.extend(_metadata_name_errors(obj, constants.KIND_NODEWRIGHT, constants.MAX_NODEWRIGHT_NAME_LENGTH))
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return ValidationResult(_merge(model, errors), warnings)
    packages = _packages(obj)
    for key, pkg in packages.items():
        _check_package(key, pkg, packages, errors, warnings)
    graph = {k: [str(d) for d in _map(p.get("dependsOn"))] for k, p in packages.items()}
    errors.extend(
        FieldError(
            f"spec.packages[{cycle[0]}].dependsOn[{cycle[1]}]",
            f"dependency cycle {' -> '.join(cycle)}: remove one of these dependsOn entries",
        )
        for cycle in find_cycles(graph)
    )
    errors.extend(k8s.label_selector(spec.get("nodeSelectors"), "spec.nodeSelectors"))
    errors.extend(k8s.label_selector(spec.get("podNonInterruptLabels"), "spec.podNonInterruptLabels"))
    errors.extend(k8s.tolerations(spec.get("additionalTolerations"), "spec.additionalTolerations"))
    for parent in ("drain", "interruptWait"):
        timeout = _map(spec.get(parent)).get("timeout")
        if isinstance(timeout, str):
            errors.extend(k8s.errors_at(f"spec.{parent}.timeout", k8s.go_duration(timeout)))
    errors.extend(_drift_interval_errors(spec.get("driftDetection"), "spec.driftDetection"))
    for i, sink in enumerate(_list(spec.get("notifications"))):
        after = _map(sink).get("drainBlockedAfter")
        if isinstance(after, str):
            path = f"spec.notifications[{i}].drainBlockedAfter"
            errors.extend(k8s.errors_at(path, k8s.go_duration(after)))
    for name, pkg in _map(spec.get("packages")).items():
        errors.extend(
            _drift_interval_errors(_map(pkg).get("driftDetection"), f"spec.packages[{name}].driftDetection")
        )

    policy = spec.get("deploymentPolicy")
    if isinstance(policy, str) and policy:
        if problems := k8s.dns1123_subdomain(policy):
            errors.extend(
                FieldError("spec.deploymentPolicy", f"not a DeploymentPolicy name: {p}") for p in problems
            )
        elif policy_exists is not None and not policy_exists(policy):
            errors.append(
                FieldError(
                    "spec.deploymentPolicy",
                    f"DeploymentPolicy {policy!r} does not exist: create it first or fix the name",
                )
            )
    _nodewright_warnings(obj, spec, packages, warnings)
    if old is not None:
        _check_update(_name(obj), obj, old, presence, errors, warnings)
    return ValidationResult(_ratchet(_merge(model, errors), obj, old), warnings)


def _name(obj: Mapping[str, Any]) -> str:
    name = _map(obj.get("metadata")).get("name")
    return name if isinstance(name, str) else ""


def _image_errors(
    value: Any, path: str, version: Any, errors: list[FieldError], *, tag_must_match: bool
) -> None:
    if not isinstance(value, str) or not value:
        return  # type and emptiness are reported by the model
    try:
        ref = parse_image(value)
    except ImageReferenceError as exc:
        errors.append(FieldError(path, f"{exc}; write e.g. registry.example.com:5000/team/pkg"))
        return
    if tag_must_match and ref.tag is not None and isinstance(version, str) and ref.tag != version:
        errors.append(
            FieldError(
                path,
                f"tag {ref.tag!r} differs from version {version!r}: drop the tag (the version is"
                " used as the tag) or make them equal",
            )
        )


def _services_errors(interrupt: Any, path: str, errors: list[FieldError]) -> None:
    for i, unit in enumerate(_list(_map(interrupt).get("services"))):
        if isinstance(unit, str) and unit:
            errors.extend(k8s.errors_at(f"{path}.services[{i}]", k8s.systemd_unit(unit)))


def _check_package(
    key: str,
    pkg: Mapping[str, Any],
    packages: Mapping[str, Mapping[str, Any]],
    errors: list[FieldError],
    warnings: list[str],
) -> None:
    base = f"spec.packages[{key}]"
    name = pkg.get("name")
    if isinstance(name, str) and name != key:
        errors.append(
            FieldError(f"{base}.name", f"name {name!r} differs from its key {key!r}: make them equal")
        )
    if len(key) > constants.MAX_PACKAGE_NAME_LENGTH:
        errors.append(
            FieldError(
                base, f"package name longer than {constants.MAX_PACKAGE_NAME_LENGTH} characters; shorten it"
            )
        )
    version = pkg.get("version")
    _image_errors(pkg.get("image"), f"{base}.image", version, errors, tag_must_match=True)
    _image_errors(
        pkg.get("agentImageOverride"), f"{base}.agentImageOverride", version, errors, tag_must_match=False
    )
    for dep, want in _map(pkg.get("dependsOn")).items():
        path = f"{base}.dependsOn[{dep}]"
        target = packages.get(str(dep))
        if target is None:
            errors.append(
                FieldError(path, f"package {dep!r} is not in spec.packages: add it or remove this dependency")
            )
        elif not want:
            errors.append(
                FieldError(path, "the required version is empty: set the exact version of the package")
            )
        elif target.get("version") != want:
            errors.append(
                FieldError(
                    path,
                    f"requires {dep} {want} but spec.packages[{dep}].version is {target.get('version')}:"
                    " make them equal",
                )
            )
    errors.extend(k8s.config_map_data(pkg.get("configMap"), f"{base}.configMap"))
    config_keys = {str(k) for k in _map(pkg.get("configMap"))}
    for pattern, interrupt in _map(pkg.get("configInterrupts")).items():
        pattern = str(pattern)
        _services_errors(interrupt, f"{base}.configInterrupts[{pattern}]", errors)
        if pattern in config_keys:
            continue
        if _GLOB_CHARS & set(pattern) and any(fnmatch.fnmatchcase(k, pattern) for k in config_keys):
            continue
        errors.append(
            FieldError(
                f"{base}.configInterrupts[{pattern}]",
                f"matches no key of {base}.configMap: use an existing key or a glob matching one",
            )
        )
    errors.extend(k8s.env(pkg.get("env"), f"{base}.env"))
    for field_name in ("cpuRequest", "cpuLimit", "memoryRequest", "memoryLimit"):
        value = _map(pkg.get("resources")).get(field_name)
        if value is not None:
            errors.extend(k8s.quantity(value, f"{base}.resources.{field_name}"))
    for field_name in ("gracefulShutdown", "stageTimeout"):
        duration = pkg.get(field_name)
        if isinstance(duration, str):
            errors.extend(k8s.errors_at(f"{base}.{field_name}", k8s.go_duration(duration)))
    interrupt = _map(pkg.get("interrupt"))
    _services_errors(interrupt, f"{base}.interrupt", errors)
    if interrupt.get("type") == InterruptType.SERVICE and not _list(interrupt.get("services")):
        warnings.append(f"{base}.interrupt: type service with no services restarts nothing; list the units")


DRIFT_MIN_INTERVAL_NS: Final = 10 * 1_000_000_000


def _drift_interval_errors(drift: Any, base: str) -> list[FieldError]:
    interval = _map(drift).get("interval")
    if not isinstance(interval, str):
        return []
    if problems := k8s.go_duration(interval):
        return k8s.errors_at(f"{base}.interval", problems)
    if (k8s.go_duration_ns(interval) or 0) < DRIFT_MIN_INTERVAL_NS:
        return [
            FieldError(
                f"{base}.interval", f"{interval!r} is shorter than the minimum of 10s: use 10s or more"
            )
        ]
    return []


def _interrupt_type(value: Any) -> Any:
    return _map(value).get("type")


def _nodewright_warnings(
    obj: Mapping[str, Any],
    spec: Mapping[str, Any],
    packages: Mapping[str, Mapping[str, Any]],
    warnings: list[str],
) -> None:
    disruptive = sorted(
        k
        for k, p in packages.items()
        if _interrupt_type(p.get("interrupt")) not in (None, InterruptType.NOOP)
        or any(
            _interrupt_type(i) not in (None, InterruptType.NOOP)
            for i in _map(p.get("configInterrupts")).values()
        )
    )
    budget = _map(spec.get("interruptionBudget"))
    if disruptive and not spec.get("deploymentPolicy") and not ("percent" in budget or "count" in budget):
        warnings.append(
            f"spec: packages {', '.join(disruptive)} interrupt nodes and there is neither a"
            f" deploymentPolicy nor an"
            " interruptionBudget, so all selected nodes may be disrupted at once; set one of them"
        )
    reboots = sorted(
        k for k, p in packages.items() if _interrupt_type(p.get("interrupt")) == InterruptType.REBOOT
    )
    selector = _map(spec.get("podNonInterruptLabels"))
    if reboots and not (selector.get("matchLabels") or selector.get("matchExpressions")):
        warnings.append(
            f"spec.podNonInterruptLabels: empty, so packages {', '.join(reboots)} reboot nodes without"
            f" waiting for"
            " critical workloads; select the pods that must finish first"
        )
    if not spec.get("nodeSelectors"):
        warnings.append("spec.nodeSelectors: unset, so this NodeWright applies to every node of the cluster")
    annotations = _map(_map(obj.get("metadata")).get("annotations"))
    warnings.extend(
        f"metadata.annotations[{key}]: {annotations[key]!r} is neither 'true' nor 'false'"
        for key in (constants.ANNOTATION_PAUSE, constants.ANNOTATION_DISABLE)
        if key in annotations and annotations[key] not in ("true", "false")
    )


def _check_update(
    name: str,
    new: Mapping[str, Any],
    old: Mapping[str, Any],
    presence: PackagePresence | None,
    errors: list[FieldError],
    warnings: list[str],
) -> None:
    old_pkgs, new_pkgs = _packages(old), _packages(new)
    for pkg in packages_needing_presence(new, old):
        still_there = presence(name, pkg) if presence is not None else True
        old_pkg = old_pkgs[pkg]
        if pkg not in new_pkgs:
            if still_there:
                errors.append(
                    FieldError(
                        f"spec.packages[{pkg}]",
                        f"package {pkg} has uninstall.enabled and is still installed on some nodes: set"
                        " uninstall.apply: true, wait until the uninstall completed, then remove it",
                    )
                )
        elif still_there or not _map(old_pkg.get("uninstall")).get("apply"):
            errors.append(
                FieldError(
                    f"spec.packages[{pkg}].version",
                    f"downgrading {pkg} from {old_pkg.get('version')} to {new_pkgs[pkg].get('version')}"
                    f" needs the"
                    " installed version uninstalled first: set uninstall.apply: true, wait for"
                    " completion, then"
                    " change the version",
                )
            )
    for pkg, old_pkg in old_pkgs.items():
        cancelled = _map(old_pkg.get("uninstall")).get("apply") and pkg in new_pkgs
        if cancelled and not _map(new_pkgs[pkg].get("uninstall")).get("apply"):
            warnings.append(
                f"spec.packages[{pkg}].uninstall.apply: uninstall cancelled; nodes where the uninstall"
                " already completed will install the package again"
            )


# ----------------------------------------------------------------------------------------------------
# DeploymentPolicy


def _strategy_paths(spec: Any) -> list[tuple[str, Mapping[str, Any]]]:
    out: list[tuple[str, Mapping[str, Any]]] = []
    strategy = _map(spec).get("default")
    if isinstance(_map(strategy).get("strategy"), Mapping):
        out.append(("spec.default.strategy", _map(strategy)["strategy"]))
    for i, comp in enumerate(_list(_map(spec).get("compartments"))):
        if isinstance(comp, Mapping) and isinstance(comp.get("strategy"), Mapping):
            out.append((f"spec.compartments[{i}].strategy", comp["strategy"]))
    return out


def _maintenance_errors(spec: Mapping[str, Any]) -> list[FieldError]:
    """Cron schedules, time zones (the API server has no cron parser or zone database) and durations
    beyond Go's time.Duration, of maintenance windows and soak times."""
    found: list[tuple[str, Any]] = [("spec.maintenance", spec.get("maintenance"))]
    found.append(("spec.default.maintenance", _map(spec.get("default")).get("maintenance")))
    for i, comp in enumerate(_list(spec.get("compartments"))):
        found.append((f"spec.compartments[{i}].maintenance", _map(comp).get("maintenance")))
    errors = [
        FieldError(path, problem)
        for base, value in found
        if isinstance(value, Mapping)
        for path, problem in maintenance_problems(value, base)
    ]
    for base, value in found:
        for i, window in enumerate(_list(_map(value).get("windows"))):
            duration = _map(window).get("duration")
            if isinstance(duration, str):
                errors.extend(k8s.errors_at(f"{base}.windows[{i}].duration", k8s.go_duration(duration)))
    soaks = [("spec.default.soakTime", _map(spec.get("default")).get("soakTime"))]
    soaks += [
        (f"spec.compartments[{i}].soakTime", _map(c).get("soakTime"))
        for i, c in enumerate(_list(spec.get("compartments")))
    ]
    for path, soak in soaks:
        if isinstance(soak, str):
            errors.extend(k8s.errors_at(path, k8s.go_duration(soak)))
    return errors


def _health_gate_errors(spec: Mapping[str, Any]) -> list[FieldError]:
    """Health gate timeouts beyond Go's time.Duration and node condition types that are no qualified
    name (a prefix over 253 characters passes the schema's pattern)."""
    owners = [("spec.default", _map(spec.get("default")))]
    owners += [(f"spec.compartments[{i}]", _map(c)) for i, c in enumerate(_list(spec.get("compartments")))]
    errors: list[FieldError] = []
    for base, owner in owners:
        for j, gate in enumerate(_list(owner.get("healthGates"))):
            path = f"{base}.healthGates[{j}]"
            timeout = _map(gate).get("timeout")
            if isinstance(timeout, str):
                errors.extend(k8s.errors_at(f"{path}.timeout", k8s.go_duration(timeout)))
            condition = _map(_map(gate).get("nodeCondition")).get("type")
            if isinstance(condition, str):
                errors.extend(k8s.errors_at(f"{path}.nodeCondition.type", k8s.qualified_name(condition)))
    return errors


def _topology_key_errors(key: Any, path: str) -> list[FieldError]:
    """A compartment's `topologyKey` must be a label key (the nodes' label naming their rack/domain)."""
    if key is None:
        return []
    problem = label_key_problem(key) if isinstance(key, str) and key else "must be a non-empty label key"
    # (the model's pattern says the same less helpfully; this message replaces it at this path)
    if problem is None:
        return []
    return [
        FieldError(
            path,
            f"{problem}; name the node label that holds the topology domain, e.g."
            " topology.kubernetes.io/zone or your rack label",
        )
    ]


def _gate_secret_errors(spec: Mapping[str, Any], readable: frozenset[str]) -> list[FieldError]:
    """Prometheus gates whose URL Secret the operator may not read: the chart grants `get` on the Secrets
    it lists in `healthGates.secretNames` only (`readable`), so such a gate could never be evaluated
    (Unknown: it would hold every rollout of the compartment, then halt it)."""
    owners = [("spec.default", _map(spec.get("default")))]
    owners += [(f"spec.compartments[{i}]", _map(c)) for i, c in enumerate(_list(spec.get("compartments")))]
    listed = ", ".join(sorted(readable)) or "none"
    errors: list[FieldError] = []
    for base, owner in owners:
        for j, gate in enumerate(_list(owner.get("healthGates"))):
            name = _map(_map(_map(gate).get("prometheus")).get("urlSecretRef")).get("name")
            if isinstance(name, str) and name and name not in readable:
                errors.append(
                    FieldError(
                        f"{base}.healthGates[{j}].prometheus.urlSecretRef.name",
                        f"the operator may not read Secret {name!r} (the chart's healthGates.secretNames"
                        f" lists {listed}): add it there (helm upgrade) or name a listed Secret",
                    )
                )
    return errors


def validate_deploymentpolicy(
    obj: Any, *, old: Mapping[str, Any] | None = None, gate_secrets: frozenset[str] | None = None
) -> ValidationResult:
    """All problems of a DeploymentPolicy (CREATE or UPDATE; an unchanged spec is not re-validated).

    `gate_secrets`: the Secrets the operator may read for health gates (the chart's
    `healthGates.secretNames`, given to the webhook); None when not known (nothing checked)."""
    if not isinstance(obj, Mapping):
        return ValidationResult([FieldError("<root>", "a DeploymentPolicy must be a JSON object")], [])
    errors: list[FieldError] = []
    warnings: list[str] = []
    model = _validate_model(DeploymentPolicy, obj)
    errors.extend(_metadata_name_errors(obj, constants.KIND_POLICY, k8s.DNS1123_SUBDOMAIN_MAX))
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return ValidationResult(_merge(model, errors), warnings)
    seen_names: dict[str, int] = {}
    seen_selectors: dict[frozenset[tuple[str, str, frozenset[str]]], tuple[int, str]] = {}
    for i, comp in enumerate(_list(spec.get("compartments"))):
        if not isinstance(comp, Mapping):
            continue
        path = f"spec.compartments[{i}]"
        raw_name = comp.get("name")
        cname = raw_name if isinstance(raw_name, str) else ""
        if cname == constants.DEFAULT_COMPARTMENT:
            errors.append(
                FieldError(f"{path}.name", f"{cname} is reserved for nodes in no compartment; rename it")
            )
        elif isinstance(raw_name, str) and (not cname or k8s.label_value(cname)):
            errors.append(
                FieldError(
                    f"{path}.name",
                    f"{cname[:80]!r} is not a compartment name: 1-63 letters, digits, '-', '_' and '.',"
                    " starting and ending with a letter or digit (it is a metric label value and appears"
                    " in Events)",
                )
            )
        if isinstance(raw_name, str) and cname in seen_names:
            errors.append(
                FieldError(
                    f"{path}.name",
                    f"duplicate compartment name {cname!r} (also"
                    f" spec.compartments[{seen_names[cname]}]); rename one",
                )
            )
        seen_names.setdefault(cname, i)
        errors.extend(_topology_key_errors(comp.get("topologyKey"), f"{path}.topologyKey"))
        selector = comp.get("selector")
        errors.extend(k8s.label_selector(selector, f"{path}.selector"))
        canon = canonical_selector(selector if isinstance(selector, Mapping) else None)
        if not canon:
            warnings.append(f"{path}.selector: empty, so compartment {cname!r} contains every node")
        if canon in seen_selectors:
            j, other = seen_selectors[canon]
            errors.append(
                FieldError(
                    f"{path}.selector",
                    f"selects the same nodes as spec.compartments[{j}] ({other}); make the selectors distinct"
                    " or merge the compartments",
                )
            )
        else:
            seen_selectors[canon] = (i, cname)
    errors.extend(_maintenance_errors(spec))
    errors.extend(_health_gate_errors(spec))
    if gate_secrets is not None:
        errors.extend(_gate_secret_errors(spec, gate_secrets))
    for path, strategy in _strategy_paths(spec):
        for kind, params in strategy.items():
            if isinstance(params, Mapping) and params.get("failureThreshold") is None:
                warnings.append(
                    f"{path}.{kind}.failureThreshold: unset, so failing batches never stop the rollout;"
                    f" set it"
                    " to stop after that many failed batches in a row"
                )
    return ValidationResult(_ratchet(_merge(model, errors), obj, old), warnings)


def validate_disruptionbudget(obj: Any) -> ValidationResult:
    """All problems of a DisruptionBudget: the model's, its name, and Kubernetes' label-selector rules."""
    if not isinstance(obj, Mapping):
        return ValidationResult([FieldError("<root>", "a DisruptionBudget must be a JSON object")], [])
    model = _validate_model(DisruptionBudget, obj)
    errors = _metadata_name_errors(obj, constants.KIND_BUDGET, k8s.DNS1123_SUBDOMAIN_MAX)
    spec = obj.get("spec")
    warnings: list[str] = []
    if isinstance(spec, Mapping):
        selector = spec.get("nodeSelector")
        errors.extend(k8s.label_selector(selector, "spec.nodeSelector"))
        if isinstance(selector, Mapping) and not canonical_selector(selector):
            warnings.append("spec.nodeSelector: empty, so the budget's pool is every node of the cluster")
    return ValidationResult(_merge(model, errors), warnings)


def _dedupe(errors: list[FieldError]) -> list[FieldError]:
    seen: set[FieldError] = set()
    out = []
    for e in errors:
        if e not in seen:
            seen.add(e)
            out.append(e)
    return out


def format_errors(errors: Iterable[FieldError]) -> str:
    return "; ".join(str(e) for e in errors)


# ----------------------------------------------------------------------------------------------------
# Mutations (the mutating webhook's patches)


def mutation_shape_errors(kind: str, obj: Any) -> list[FieldError]:
    """What keeps the mutating webhook from computing its patch: the parts it walks must be objects.

    Only shapes the API server's schema refuses anyway, so refusing them here never blocks an object
    that would otherwise be stored.
    """
    if not isinstance(obj, Mapping):
        return [FieldError("<root>", f"a {kind} must be a JSON object")]
    out: list[FieldError] = []
    spec = obj.get("spec")
    if spec is not None and not isinstance(spec, Mapping):
        return [FieldError("spec", f"must be an object, not {_json_type(spec)}")]
    spec = _map(spec)
    if kind == constants.KIND_NODEWRIGHT:
        packages = spec.get("packages")
        if packages is not None and not isinstance(packages, Mapping):
            return [
                FieldError("spec.packages", f"must be an object (name: package), not {_json_type(packages)}")
            ]
        out.extend(
            FieldError(f"spec.packages[{k}]", f"must be an object, not {_json_type(v)}")
            for k, v in _map(packages).items()
            if v is not None and not isinstance(v, Mapping)
        )
        return out
    default = spec.get("default")
    if default is not None and not isinstance(default, Mapping):
        out.append(FieldError("spec.default", f"must be an object, not {_json_type(default)}"))
    compartments = spec.get("compartments")
    if compartments is not None and not isinstance(compartments, list):
        out.append(FieldError("spec.compartments", f"must be a list, not {_json_type(compartments)}"))
    strategies = [("spec.default.strategy", _map(default).get("strategy"))]
    for i, comp in enumerate(_list(compartments)):
        if comp is not None and not isinstance(comp, Mapping):
            out.append(FieldError(f"spec.compartments[{i}]", f"must be an object, not {_json_type(comp)}"))
        strategies.append((f"spec.compartments[{i}].strategy", _map(comp).get("strategy")))
    for path, strategy in strategies:
        if strategy is not None and not isinstance(strategy, Mapping):
            out.append(FieldError(path, f"must be an object, not {_json_type(strategy)}"))
        for name, params in _map(strategy).items():
            if params is not None and not isinstance(params, Mapping):
                out.append(FieldError(f"{path}.{name}", f"must be an object, not {_json_type(params)}"))
    return out


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "null" if value is None else "an object"


def strategy_defaults_patch(obj: Any) -> list[dict[str, Any]]:
    """JSONPatch operations filling missing strategy parameter defaults (normally the CRD does it)."""
    from nodewright.api.models import ExponentialStrategy, FixedStrategy, LinearStrategy

    classes: dict[str, type[BaseModel]] = {
        "fixed": FixedStrategy,
        "linear": LinearStrategy,
        "exponential": ExponentialStrategy,
    }
    ops: list[dict[str, Any]] = []
    for path, strategy in _strategy_paths(_map(obj).get("spec")):
        pointer = "/" + path.replace(".", "/").replace("[", "/").replace("]", "")
        for kind, params in strategy.items():
            cls = classes.get(kind)
            if cls is None or not isinstance(params, Mapping):
                continue
            for fname, info in cls.model_fields.items():
                alias = info.alias or (
                    info.validation_alias if isinstance(info.validation_alias, str) else fname
                )
                if alias not in params and info.default is not None and not info.is_required():
                    ops.append({"op": "add", "path": f"{pointer}/{kind}/{alias}", "value": info.default})
    return ops


def package_name_patch(obj: Any) -> list[dict[str, Any]]:
    """JSONPatch operations setting each package's unset `name` from its map key (as the reference does)."""
    return [
        {"op": "add", "path": f"/spec/packages/{_escape(key)}/name", "value": key}
        for key, pkg in _packages(obj).items()
        if "name" not in pkg
    ]


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")
