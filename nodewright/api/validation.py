"""Semantic validation of NodeWright and DeploymentPolicy objects, beyond what the CRD schema can check.

The CRD schema and its CEL rules (generated from `nodewright.api.models`) are enforced by the API server
even when the admission webhook is down. This module adds the rules that need the whole object, the
previous object, or facts from the cluster, and reports *all* problems at once with the field path of
each (`spec.packages[nvidia-driver].dependsOn[cuda]`) and what to do about it:

- dependsOn targets exist with the exact version, and the dependency graph has no cycle (named);
- configInterrupts keys are configMap keys, or globs (`fnmatch`) matching at least one key;
- image references parse (registry ports, tags and digests), and a tag equals the version;
- label selectors are well-formed Kubernetes label keys and values;
- names are short enough for the node label/annotation keys built from them (63-character names);
- on UPDATE: removing or downgrading a package with `uninstall.enabled` is refused until its uninstall
  has completed on every node (a fact the caller supplies through `PackagePresence`);
- DeploymentPolicy compartments: unique names, and selectors that do not select the same nodes
  (compared semantically: `matchLabels: {a: b}` equals `matchExpressions: [{key: a, operator: In,
  values: [b]}]`).

Risky but legal specs produce warnings (returned to `kubectl` as admission warnings).

Everything here is pure: cluster facts are passed in as values or synchronous callables, so the webhook
fetches them first and the rules stay unit-testable.
"""

from __future__ import annotations

import fnmatch
import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from nodewright.api import constants, semver
from nodewright.api.images import ImageReferenceError, parse_image
from nodewright.api.models import CelRule, DeploymentPolicy, InterruptType, NodeWright

_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GLOB_CHARS = set("*?[")
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
class FieldError:
    """One problem: the JSON path of the offending field, what is wrong and what to do."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


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
    out = []
    for err in exc.errors(include_url=False):
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "missing":
            message = "required field is missing: set it"
        # Field-level rules are raised by the parent object as "<field>: <message>"; blame the field.
        for part in message.split("; "):
            head, sep, rest = part.partition(": ")
            if sep and _IDENT.match(head):
                out.append(FieldError(render_path([*loc, head]), rest))
            else:
                out.append(FieldError(render_path(loc) or "<root>", part))
    return out


def _validate_model(cls: type[BaseModel], obj: Mapping[str, Any], errors: list[FieldError]) -> Any:
    try:
        return cls.model_validate(obj)
    except ValidationError as exc:
        errors.extend(model_errors(exc))
        # Pydantic skips an object's rules when one of its fields is invalid; the API server evaluates
        # every CEL rule regardless, so evaluate them on the raw JSON too and report all problems.
        errors.extend(cel_errors(cls, obj, []))
        return None


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
        rules = (m for m in info.metadata if isinstance(m, CelRule))
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


# ----------------------------------------------------------------------------------------------------
# Label selectors


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a valid label key, or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"prefix {prefix!r} of label key {key!r} must be a DNS subdomain of at most 253 characters"
    if not name or len(name) > constants.LABEL_NAME_LIMIT or not _LABEL_NAME.match(name):
        return (
            f"label key {key!r}: the name part must be 1-63 characters of letters, digits, '-', '_', '.',"
            " starting and ending with a letter or digit"
        )
    return None


def label_value_problem(value: str) -> str | None:
    if len(value) > constants.LABEL_NAME_LIMIT or not _LABEL_NAME.match(value):
        return f"label value {value!r} must be at most 63 characters of letters, digits, '-', '_', '.'"
    return None


def _check_selector(selector: Any, path: str, errors: list[FieldError]) -> None:
    if not isinstance(selector, Mapping):
        return
    for key, value in (selector.get("matchLabels") or {}).items():
        problems = (label_key_problem(str(key)), label_value_problem(str(value)))
        errors.extend(FieldError(f"{path}.matchLabels[{key}]", p) for p in problems if p)
    for i, expr in enumerate(selector.get("matchExpressions") or []):
        if not isinstance(expr, Mapping):
            continue
        if problem := label_key_problem(str(expr.get("key", ""))):
            errors.append(FieldError(f"{path}.matchExpressions[{i}].key", problem))
        value_problems = (label_value_problem(str(v)) for v in expr.get("values") or [])
        errors.extend(FieldError(f"{path}.matchExpressions[{i}].values", p) for p in value_problems if p)


def canonical_selector(selector: Mapping[str, Any] | None) -> frozenset[tuple[str, str, frozenset[str]]]:
    """A selector as a set of requirements, so semantically equal selectors compare equal."""
    reqs: set[tuple[str, str, frozenset[str]]] = set()
    for key, value in ((selector or {}).get("matchLabels") or {}).items():
        reqs.add((str(key), "In", frozenset({str(value)})))
    for expr in (selector or {}).get("matchExpressions") or []:
        if isinstance(expr, Mapping):
            reqs.add(
                (
                    str(expr.get("key")),
                    str(expr.get("operator")),
                    frozenset(map(str, expr.get("values") or [])),
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


def packages_needing_presence(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[str]:
    """Packages whose removal or downgrade on this UPDATE is only allowed once they are gone from all nodes.

    The webhook looks these up (and only these) before calling `validate_nodewright`.
    """
    if not old:
        return []
    old_pkgs = _packages(old)
    new_pkgs = _packages(new)
    out = []
    for name, pkg in old_pkgs.items():
        if not (pkg.get("uninstall") or {}).get("enabled"):
            continue
        if name not in new_pkgs or _is_downgrade(pkg.get("version"), new_pkgs[name].get("version")):
            out.append(name)
    return out


def _packages(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    packages = (obj.get("spec") or {}).get("packages") or {}
    return (
        {str(k): v for k, v in packages.items() if isinstance(v, Mapping)}
        if isinstance(packages, Mapping)
        else {}
    )


def _is_downgrade(old: Any, new: Any) -> bool:
    if not (
        isinstance(old, str) and isinstance(new, str) and semver.is_semver(old) and semver.is_semver(new)
    ):
        return False  # invalid versions are reported elsewhere and not compared, like the reference
    return semver.compare(new, old) < 0


def validate_nodewright(
    obj: Mapping[str, Any],
    *,
    old: Mapping[str, Any] | None = None,
    policy_exists: Callable[[str], bool] | None = None,
    presence: PackagePresence | None = None,
) -> ValidationResult:
    """All problems of a NodeWright (CREATE: old=None; UPDATE: old is the stored object).

    `policy_exists` answers whether a DeploymentPolicy exists (skipped when None); `presence` whether a
    package is still on some node (UPDATE rules are skipped when None).
    """
    errors: list[FieldError] = []
    warnings: list[str] = []
    _validate_model(NodeWright, obj, errors)
    name = str((obj.get("metadata") or {}).get("name") or "")
    if len(name) > constants.MAX_NODEWRIGHT_NAME_LENGTH:
        errors.append(
            FieldError(
                "metadata.name",
                f"{len(name)} characters is too long: at most {constants.MAX_NODEWRIGHT_NAME_LENGTH} so"
                f" the node"
                f" label {constants.status_label('<name>')} stays within the 63-character label name limit;"
                " choose a shorter name",
            )
        )
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        return ValidationResult(errors, warnings)
    packages = _packages(obj)
    for key, pkg in packages.items():
        _check_package(key, pkg, packages, errors, warnings)
    graph = {k: list((p.get("dependsOn") or {}).keys()) for k, p in packages.items()}
    errors.extend(
        FieldError(
            f"spec.packages[{cycle[0]}].dependsOn[{cycle[1]}]",
            f"dependency cycle {' -> '.join(cycle)}: remove one of these dependsOn entries",
        )
        for cycle in find_cycles(graph)
    )
    _check_selector(spec.get("nodeSelectors"), "spec.nodeSelectors", errors)
    _check_selector(spec.get("podNonInterruptLabels"), "spec.podNonInterruptLabels", errors)

    policy = spec.get("deploymentPolicy")
    if isinstance(policy, str) and policy:
        if not _DNS_SUBDOMAIN.match(policy):
            errors.append(
                FieldError("spec.deploymentPolicy", f"{policy!r} is not a valid DeploymentPolicy name")
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
        _check_update(name, obj, old, presence, errors, warnings)
    return ValidationResult(_dedupe(errors), warnings)


def _check_package(
    key: str,
    pkg: Mapping[str, Any],
    packages: Mapping[str, Mapping[str, Any]],
    errors: list[FieldError],
    warnings: list[str],
) -> None:
    base = f"spec.packages[{key}]"
    if "name" in pkg and pkg["name"] != key:
        errors.append(
            FieldError(f"{base}.name", f"name {pkg['name']!r} differs from its key {key!r}: make them equal")
        )
    if len(key) > constants.MAX_PACKAGE_NAME_LENGTH:
        errors.append(
            FieldError(
                base, f"package name longer than {constants.MAX_PACKAGE_NAME_LENGTH} characters; shorten it"
            )
        )
    version = pkg.get("version")
    image = pkg.get("image")
    if isinstance(image, str) and image:
        try:
            ref = parse_image(image)
        except ImageReferenceError as exc:
            errors.append(
                FieldError(f"{base}.image", f"{exc}; write e.g. registry.example.com:5000/team/pkg")
            )
        else:
            if ref.tag is not None and isinstance(version, str) and ref.tag != version:
                errors.append(
                    FieldError(
                        f"{base}.image",
                        f"tag {ref.tag!r} differs from version {version!r}: drop the tag (the version is"
                        " used as the tag) or make them equal",
                    )
                )
    deps = pkg.get("dependsOn") or {}
    if isinstance(deps, Mapping):
        for dep, want in deps.items():
            path = f"{base}.dependsOn[{dep}]"
            target = packages.get(str(dep))
            if target is None:
                errors.append(
                    FieldError(
                        path, f"package {dep!r} is not in spec.packages: add it or remove this dependency"
                    )
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
    config_keys = (
        set((pkg.get("configMap") or {}).keys()) if isinstance(pkg.get("configMap"), Mapping) else set()
    )
    for pattern in pkg.get("configInterrupts") or {}:
        pattern = str(pattern)
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
    interrupt = pkg.get("interrupt")
    if (
        isinstance(interrupt, Mapping)
        and interrupt.get("type") == InterruptType.SERVICE
        and not interrupt.get("services")
    ):
        warnings.append(f"{base}.interrupt: type service with no services restarts nothing; list the units")


def _nodewright_warnings(
    obj: Mapping[str, Any],
    spec: Mapping[str, Any],
    packages: Mapping[str, Mapping[str, Any]],
    warnings: list[str],
) -> None:
    disruptive = sorted(
        k
        for k, p in packages.items()
        if (p.get("interrupt") or {}).get("type") not in (None, InterruptType.NOOP)
        or any(
            (i or {}).get("type") not in (None, InterruptType.NOOP)
            for i in (p.get("configInterrupts") or {}).values()
        )
    )
    budget = spec.get("interruptionBudget") or {}
    if disruptive and not spec.get("deploymentPolicy") and not ("percent" in budget or "count" in budget):
        warnings.append(
            f"spec: packages {', '.join(disruptive)} interrupt nodes and there is neither a"
            f" deploymentPolicy nor an"
            " interruptionBudget, so all selected nodes may be disrupted at once; set one of them"
        )
    reboots = sorted(
        k for k, p in packages.items() if (p.get("interrupt") or {}).get("type") == InterruptType.REBOOT
    )
    selector = spec.get("podNonInterruptLabels") or {}
    if reboots and not (selector.get("matchLabels") or selector.get("matchExpressions")):
        warnings.append(
            f"spec.podNonInterruptLabels: empty, so packages {', '.join(reboots)} reboot nodes without"
            f" waiting for"
            " critical workloads; select the pods that must finish first"
        )
    if not spec.get("nodeSelectors"):
        warnings.append("spec.nodeSelectors: unset, so this NodeWright applies to every node of the cluster")
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
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
        elif still_there or not (old_pkg.get("uninstall") or {}).get("apply"):
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
        cancelled = (old_pkg.get("uninstall") or {}).get("apply") and pkg in new_pkgs
        if cancelled and not (new_pkgs[pkg].get("uninstall") or {}).get("apply"):
            warnings.append(
                f"spec.packages[{pkg}].uninstall.apply: uninstall cancelled; nodes where the uninstall"
                " already completed will install the package again"
            )


# ----------------------------------------------------------------------------------------------------
# DeploymentPolicy


def _strategy_paths(spec: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    out: list[tuple[str, Mapping[str, Any]]] = []
    default = spec.get("default") or {}
    if isinstance(default, Mapping) and isinstance(default.get("strategy"), Mapping):
        out.append(("spec.default.strategy", default["strategy"]))
    for i, comp in enumerate(spec.get("compartments") or []):
        if isinstance(comp, Mapping) and isinstance(comp.get("strategy"), Mapping):
            out.append((f"spec.compartments[{i}].strategy", comp["strategy"]))
    return out


def validate_deploymentpolicy(
    obj: Mapping[str, Any], *, old: Mapping[str, Any] | None = None
) -> ValidationResult:
    """All problems of a DeploymentPolicy (CREATE or UPDATE; the rules do not depend on the old object)."""
    errors: list[FieldError] = []
    warnings: list[str] = []
    _validate_model(DeploymentPolicy, obj, errors)
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        return ValidationResult(errors, warnings)
    seen_names: dict[str, int] = {}
    seen_selectors: dict[frozenset[tuple[str, str, frozenset[str]]], tuple[int, str]] = {}
    for i, comp in enumerate(spec.get("compartments") or []):
        if not isinstance(comp, Mapping):
            continue
        path = f"spec.compartments[{i}]"
        cname = str(comp.get("name", ""))
        if cname == constants.DEFAULT_COMPARTMENT:
            errors.append(
                FieldError(f"{path}.name", f"{cname} is reserved for nodes in no compartment; rename it")
            )
        if cname in seen_names:
            errors.append(
                FieldError(
                    f"{path}.name",
                    f"duplicate compartment name {cname!r} (also"
                    f" spec.compartments[{seen_names[cname]}]); rename one",
                )
            )
        seen_names.setdefault(cname, i)
        selector = comp.get("selector")
        _check_selector(selector, f"{path}.selector", errors)
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
    for path, strategy in _strategy_paths(spec):
        for kind, params in strategy.items():
            if isinstance(params, Mapping) and params.get("failureThreshold") is None:
                warnings.append(
                    f"{path}.{kind}.failureThreshold: unset, so failing batches never stop the rollout;"
                    f" set it"
                    " to stop after that many failed batches in a row"
                )
    return ValidationResult(_dedupe(errors), warnings)


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


def strategy_defaults_patch(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSONPatch operations filling missing strategy parameter defaults (normally the CRD does it)."""
    from nodewright.api.models import ExponentialStrategy, FixedStrategy, LinearStrategy

    classes: dict[str, type[BaseModel]] = {
        "fixed": FixedStrategy,
        "linear": LinearStrategy,
        "exponential": ExponentialStrategy,
    }
    ops: list[dict[str, Any]] = []
    spec = obj.get("spec") or {}
    for path, strategy in _strategy_paths(spec):
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


def package_name_patch(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSONPatch operations setting each package's unset `name` from its map key (as the reference does)."""
    return [
        {"op": "add", "path": f"/spec/packages/{_escape(key)}/name", "value": key}
        for key, pkg in _packages(obj).items()
        if "name" not in pkg
    ]


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def dumps_problems(result: ValidationResult) -> str:
    return json.dumps({"errors": [str(e) for e in result.errors], "warnings": result.warnings}, indent=2)
