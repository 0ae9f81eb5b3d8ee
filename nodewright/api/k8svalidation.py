"""Kubernetes' own validation rules for the core/v1 and meta/v1 shapes a NodeWright embeds.

The operator copies parts of the spec into objects it creates later: tolerations, env (with `valueFrom`),
resources and images go into package pods, `configMap` becomes a ConfigMap, label selectors go to the
API server as `labelSelector` queries. The API server validates those objects only when the operator
creates them; a spec it would refuse there must be refused at admission, or the node waits on a pod
that can never exist. The rules here are the API server's (k8s.io/kubernetes `pkg/apis/core/validation`,
apimachinery `pkg/util/validation` and `pkg/api/validate/content`, Kubernetes 1.36), re-implemented on
the JSON form of the object:

- names: `IsDNS1123Label` (<= 63, `[a-z0-9]([-a-z0-9]*[a-z0-9])?`), `IsDNS1123Subdomain` (<= 253, labels
  joined by '.'), `IsQualifiedName` (label keys: optional DNS-subdomain prefix and '/', then a name of
  1-63 characters `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`), `IsValidLabelValue` (empty, or a name);
- `IsConfigMapKey` (<= 253 of `[-._a-zA-Z0-9]`, not `.` or `..`, not starting with `..`: a key is a file
  name in the pod's volume, so `../etc/passwd` is refused) and `IsEnvVarName` (`[-._a-zA-Z][-._a-zA-Z0-9]*`,
  not `.`, `..` or starting with `..`);
- tolerations (`ValidateTolerations`): key a qualified name; an empty key needs operator Exists; Exists
  takes no value, Equal (or empty) a label value; effect NoSchedule, PreferNoSchedule or NoExecute;
  tolerationSeconds only with effect NoExecute;
- env `valueFrom` (`validateEnvVarValueFrom`): exactly one of fieldRef, resourceFieldRef, configMapKeyRef,
  secretKeyRef, and not together with a non-empty `value`; fieldRef paths from the downward API list
  (subscripted `metadata.labels['k']` / `metadata.annotations['k']` with a qualified key); resourceFieldRef
  resources `limits.*`/`requests.*` of cpu, memory, ephemeral-storage or hugepages-*, with the divisors
  Kubernetes allows; key selectors need a DNS-subdomain `name` and a config-map-key `key`;
- ConfigMap data: keys as above, values together at most 1 MiB (`MaxSecretSize`);
- label selectors (`ValidateLabelSelector`): qualified keys, label values, In/NotIn with values,
  Exists/DoesNotExist without.

Where NodeWright is stricter than Kubernetes, deliberately: unknown fields inside `valueFrom` are refused
(the pod's decoder would drop them silently, so a typo like `secretKeyref` changes the meaning), fileKeyRef
is refused (alpha in Kubernetes, gated off by default), and a resourceFieldRef divisor must be written in
one of the canonical forms Kubernetes lists (`1m`, `1`, `1Ki`, ...).

Every function takes raw JSON (anything `json.loads` can return) and never raises: a value of the wrong
JSON type is skipped here, because the model validation reports it with the field path already. The
regular expressions are exported in anchored form for the CRD schema (`nodewright.api.models`), so
kubectl without the webhook refuses the same strings; they use only syntax that Go's RE2, Rust's regex
(pydantic) and Python's `re` read identically.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from nodewright.api.quantity import QuantityError, parse_quantity

# ----------------------------------------------------------------------------------------------------
# Regular expressions (unanchored bodies; `anchored()` for schema patterns, `re.fullmatch` in Python)

DNS1123_LABEL_MAX: Final = 63
DNS1123_SUBDOMAIN_MAX: Final = 253
LABEL_NAME_MAX: Final = 63
QUALIFIED_NAME_MAX: Final = DNS1123_SUBDOMAIN_MAX + 1 + LABEL_NAME_MAX
CONFIG_MAP_KEY_MAX: Final = 253
CONFIG_MAP_DATA_MAX_BYTES: Final = 1024 * 1024  # core.MaxSecretSize, also the limit of a ConfigMap's data
SYSTEMD_UNIT_MAX: Final = 255

DNS1123_LABEL_RE: Final = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN_RE: Final = rf"{DNS1123_LABEL_RE}(?:\.{DNS1123_LABEL_RE})*"
# The name part of a qualified name; the {0,61} bound keeps it within 63 characters in the pattern itself.
LABEL_NAME_RE: Final = r"(?:[A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]"
QUALIFIED_NAME_RE: Final = rf"(?:{DNS1123_SUBDOMAIN_RE}/)?{LABEL_NAME_RE}"
LABEL_VALUE_RE: Final = rf"(?:{LABEL_NAME_RE})?"
# `[-._a-zA-Z0-9]+` without `.`, `..` and a leading `..` (apimachinery's hasChDirPrefix), as one regex.
CONFIG_MAP_KEY_RE: Final = r"[-_a-zA-Z0-9][-._a-zA-Z0-9]*|\.[-_a-zA-Z0-9][-._a-zA-Z0-9]*"
ENV_VAR_NAME_RE: Final = r"[-_a-zA-Z][-._a-zA-Z0-9]*|\.[-_a-zA-Z0-9][-._a-zA-Z0-9]*"
# systemd unit names (systemd.unit(5)): ASCII letters, digits, ":-_.\" and '@' for template instances.
SYSTEMD_UNIT_RE: Final = r"[A-Za-z0-9:_.\\@-]+"

ENV_FIELD_PATHS: Final = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
# The v1 conversion maps the legacy `spec.host` to `spec.nodeName` before validating.
_LEGACY_FIELD_PATHS: Final = ("spec.host",)
_CI_SUBDOMAIN_RE: Final = (
    r"[A-Za-z0-9](?:[-A-Za-z0-9]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[-A-Za-z0-9]*[A-Za-z0-9])?)*"
)
FIELD_PATH_RE: Final = (
    "(?:"
    + "|".join(re.escape(p) for p in (*ENV_FIELD_PATHS, *_LEGACY_FIELD_PATHS))
    + rf"|metadata\.labels\['{QUALIFIED_NAME_RE}'\]"
    # Annotation keys are lowercased before the check, so the prefix may use capitals here.
    + rf"|metadata\.annotations\['(?:{_CI_SUBDOMAIN_RE}/)?{LABEL_NAME_RE}'\])"
)
FIELD_PATH_MAX: Final = len("metadata.annotations['']") + QUALIFIED_NAME_MAX

RESOURCE_FIELD_RESOURCES: Final = (
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
)
_HUGEPAGES_PREFIXES: Final = ("requests.hugepages-", "limits.hugepages-")
RESOURCE_FIELD_RE: Final = (
    r"(?:limits|requests)\.(?:cpu|memory|ephemeral-storage|hugepages-[A-Za-z0-9][-A-Za-z0-9.]*)"
)
CPU_DIVISORS: Final = ("1m", "1")
BYTE_DIVISORS: Final = ("1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei")

VALUE_FROM_SOURCES: Final = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
_SOURCE_FIELDS: Final = {
    "fieldRef": ("apiVersion", "fieldPath"),
    "resourceFieldRef": ("containerName", "resource", "divisor"),
    "configMapKeyRef": ("name", "key", "optional"),
    "secretKeyRef": ("name", "key", "optional"),
}
TOLERATION_OPERATORS: Final = ("Exists", "Equal")
TAINT_EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")
SELECTOR_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist")

# Go's time.Duration is an int64 count of nanoseconds: about 292 years.
GO_DURATION_MAX_NS: Final = 2**63 - 1
_DURATION_UNITS_NS: Final = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|μs|ms|s|m|h)")


def anchored(regex: str) -> str:
    """`^(?:regex)$`: a schema pattern (OpenAPI patterns and CEL `matches` search, they do not anchor)."""
    return f"^(?:{regex})$"


def _full(regex: str, value: str) -> bool:
    return re.fullmatch(regex, value) is not None


@dataclass(frozen=True)
class FieldError:
    """One problem: the JSON path of the offending field, what is wrong and what to do."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


# ----------------------------------------------------------------------------------------------------
# Strings. Each returns the problems of `value` (empty when valid), phrased to be appended to a path.


def dns1123_label(value: str) -> list[str]:
    if len(value) > DNS1123_LABEL_MAX:
        return [f"{value[:80]!r} is {len(value)} characters, at most {DNS1123_LABEL_MAX} are allowed"]
    if not _full(DNS1123_LABEL_RE, value):
        return [
            f"{value!r} must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending"
            " with a letter or digit (e.g. 'my-name')"
        ]
    return []


def dns1123_subdomain(value: str) -> list[str]:
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        return [f"{value[:80]!r}... is {len(value)} characters, at most {DNS1123_SUBDOMAIN_MAX} are allowed"]
    if not _full(DNS1123_SUBDOMAIN_RE, value):
        return [
            f"{value!r} must be a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', starting and"
            " ending with a letter or digit (e.g. 'example.com')"
        ]
    return []


def qualified_name(value: str) -> list[str]:
    """A label key (IsQualifiedName): `[prefix/]name`."""
    parts = value.split("/")
    if len(parts) > 2:
        return [
            f"{value!r} has more than one '/': a qualified name is an optional DNS prefix, '/' and a name"
        ]
    problems: list[str] = []
    if len(parts) == 2:
        prefix, name = parts
        if not prefix:
            problems.append(f"{value!r}: the prefix before '/' is empty")
        else:
            problems.extend(f"prefix of {value!r}: {p}" for p in dns1123_subdomain(prefix))
    else:
        name = parts[0]
    if not name:
        problems.append(f"{value!r}: the name part is empty")
    elif len(name) > LABEL_NAME_MAX:
        problems.append(f"{value!r}: the name part is {len(name)} characters, at most {LABEL_NAME_MAX}")
    elif not _full(LABEL_NAME_RE, name):
        problems.append(
            f"{value!r}: the name part must be letters, digits, '-', '_' and '.', starting and ending with a"
            " letter or digit (e.g. 'example.com/my-key')"
        )
    return problems


def label_value(value: str) -> list[str]:
    if len(value) > LABEL_NAME_MAX:
        return [f"label value {value[:80]!r} is {len(value)} characters, at most {LABEL_NAME_MAX}"]
    if not _full(LABEL_VALUE_RE, value):
        return [
            f"label value {value!r} must be empty or letters, digits, '-', '_' and '.', starting and ending"
            " with a letter or digit"
        ]
    return []


def _chdir_problem(value: str) -> str | None:
    if value in (".", ".."):
        return f"must not be {value!r}"
    if value.startswith(".."):
        return "must not start with '..'"
    return None


def config_map_key(value: str) -> list[str]:
    if len(value) > CONFIG_MAP_KEY_MAX:
        return [f"key {value[:80]!r}... is {len(value)} characters, at most {CONFIG_MAP_KEY_MAX}"]
    if problem := _chdir_problem(value):
        return [f"key {value!r} {problem}: it is a file name in the pod's volume"]
    if not _full(CONFIG_MAP_KEY_RE, value):
        return [
            f"key {value!r} must be letters, digits, '-', '_' and '.' (a file name, no '/'; e.g. 'apply.sh')"
        ]
    return []


def env_var_name(value: str) -> list[str]:
    if problem := _chdir_problem(value):
        return [f"environment variable name {value!r} {problem}"]
    if not _full(ENV_VAR_NAME_RE, value):
        return [
            f"environment variable name {value!r} must be letters, digits, '_', '-' and '.', not starting"
            " with a digit (e.g. 'MY_VAR')"
        ]
    return []


def systemd_unit(value: str) -> list[str]:
    if len(value) > SYSTEMD_UNIT_MAX:
        return [f"unit name is {len(value)} characters, at most {SYSTEMD_UNIT_MAX}"]
    if not _full(SYSTEMD_UNIT_RE, value):
        return [
            f"{value!r} is not a systemd unit name: ASCII letters, digits and ':-_.\\@' (e.g. 'containerd' or"
            " 'nvidia-persistenced.service')"
        ]
    return []


def go_duration_ns(text: str) -> int | None:
    """Nanoseconds of a Go duration in the API's syntax (`90s`, `1h30m`, `0`), None when it does not parse
    or does not fit Go's int64 time.Duration (time.ParseDuration fails on both)."""
    if text == "0":
        return 0
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    total = sum((Fraction(n) * _DURATION_UNITS_NS[u] for n, u in parts), Fraction(0))
    return int(total) if total <= GO_DURATION_MAX_NS else None


def go_duration(value: str) -> list[str]:
    if go_duration_ns(value) is None:
        return [
            f"{value[:80]!r} is not a Go duration that fits in int64 nanoseconds (at most about 292 years;"
            " e.g. '30s', '10m', '1h30m')"
        ]
    return []


# ----------------------------------------------------------------------------------------------------
# Structures on raw JSON


def errors_at(path: str, problems: list[str]) -> list[FieldError]:
    """One FieldError at `path` per problem."""
    return [FieldError(path, p) for p in problems]


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def tolerations(items: Any, path: str) -> list[FieldError]:
    """ValidateTolerations for a list of core/v1 Tolerations at `path`."""
    if not isinstance(items, list):
        return []
    out: list[FieldError] = []
    for i, tol in enumerate(items):
        if isinstance(tol, Mapping):
            out.extend(toleration(tol, f"{path}[{i}]"))
    return out


def toleration(tol: Mapping[str, Any], path: str) -> list[FieldError]:
    out: list[FieldError] = []
    key = _string(tol.get("key")) or ""
    operator = tol.get("operator")
    operator = "" if operator is None else operator
    value = _string(tol.get("value")) or ""
    effect = tol.get("effect")
    if key:
        out.extend(errors_at(f"{path}.key", qualified_name(key)))
    elif operator != "Exists" and isinstance(operator, str):
        out.append(
            FieldError(
                f"{path}.operator",
                "operator must be Exists when key is empty (an empty key with Exists tolerates every taint):"
                " set a key or use operator Exists",
            )
        )
    if tol.get("tolerationSeconds") is not None and effect != "NoExecute":
        out.append(
            FieldError(
                f"{path}.effect",
                "effect must be NoExecute when tolerationSeconds is set (it only bounds NoExecute evictions):"
                " set effect NoExecute or remove tolerationSeconds",
            )
        )
    if operator in ("Equal", ""):
        out.extend(errors_at(f"{path}.value", label_value(value)))
    elif operator == "Exists":
        if value:
            out.append(
                FieldError(
                    f"{path}.value",
                    f"value must be empty when operator is Exists: remove value {value!r} or use operator"
                    " Equal",
                )
            )
    elif isinstance(operator, str):
        out.append(FieldError(f"{path}.operator", f"unsupported operator {operator!r}: use Exists or Equal"))
    if isinstance(effect, str) and effect and effect not in TAINT_EFFECTS:
        out.append(
            FieldError(
                f"{path}.effect",
                f"unsupported effect {effect!r}: use {', '.join(TAINT_EFFECTS)} or leave empty",
            )
        )
    return out


def env(items: Any, path: str) -> list[FieldError]:
    """ValidateEnv for a list of core/v1 EnvVars at `path`."""
    if not isinstance(items, list):
        return []
    out: list[FieldError] = []
    for i, var in enumerate(items):
        if not isinstance(var, Mapping):
            continue
        here = f"{path}[{i}]"
        name = var.get("name")
        if name is None or name == "":
            out.append(FieldError(f"{here}.name", "required: name the environment variable"))
        elif isinstance(name, str):
            out.extend(errors_at(f"{here}.name", env_var_name(name)))
        if var.get("valueFrom") is not None:
            out.extend(value_from(var["valueFrom"], f"{here}.valueFrom", value=var.get("value")))
    return out


def value_from(source: Any, path: str, *, value: Any = None) -> list[FieldError]:
    """validateEnvVarValueFrom: exactly one known source, not together with a non-empty value."""
    if not isinstance(source, Mapping):
        return []
    out: list[FieldError] = []
    known = [k for k in VALUE_FROM_SOURCES if source.get(k) is not None]
    out.extend(
        FieldError(
            f"{path}.{key}",
            f"unknown source {key!r}: valueFrom takes one of {', '.join(VALUE_FROM_SOURCES)}",
        )
        for key in source
        if key not in VALUE_FROM_SOURCES
    )
    if not known:
        out.append(FieldError(path, f"set exactly one of {', '.join(VALUE_FROM_SOURCES)}"))
    elif len(known) > 1:
        out.append(FieldError(path, f"set only one of {', '.join(known)}: a variable has a single source"))
    if known and isinstance(value, str) and value:
        out.append(
            FieldError(path, "valueFrom cannot be combined with a non-empty value: remove one of them")
        )
    for key in known:
        body = source[key]
        if not isinstance(body, Mapping):
            continue
        here = f"{path}.{key}"
        out.extend(
            FieldError(f"{here}.{field}", f"unknown field: {key} has {', '.join(_SOURCE_FIELDS[key])}")
            for field in body
            if field not in _SOURCE_FIELDS[key]
        )
        if key == "fieldRef":
            out.extend(_field_ref(body, here))
        elif key == "resourceFieldRef":
            out.extend(_resource_field_ref(body, here))
        else:
            out.extend(_key_selector(body, here, "ConfigMap" if key == "configMapKeyRef" else "Secret"))
    return out


def _field_ref(ref: Mapping[str, Any], path: str) -> list[FieldError]:
    api_version = ref.get("apiVersion")
    if isinstance(api_version, str) and api_version not in ("", "v1"):
        return [
            FieldError(f"{path}.apiVersion", f"unsupported pod version {api_version!r}: use v1 or omit it")
        ]
    field_path = ref.get("fieldPath")
    if field_path is None or field_path == "":
        return [FieldError(f"{path}.fieldPath", f"required: one of {', '.join(ENV_FIELD_PATHS)}")]
    if not isinstance(field_path, str):
        return []
    if field_path.endswith("']") and "['" in field_path and not field_path.startswith("['"):
        head, _, rest = field_path.partition("['")
        subscript = rest[: -len("']")]
        if head == "metadata.labels":
            return errors_at(f"{path}.fieldPath", qualified_name(subscript))
        if head == "metadata.annotations":
            return errors_at(f"{path}.fieldPath", qualified_name(subscript.lower()))
        return [
            FieldError(
                f"{path}.fieldPath",
                f"{head!r} does not support a subscript: only metadata.labels['key'] and"
                " metadata.annotations['key'] do",
            )
        ]
    if field_path not in ENV_FIELD_PATHS and field_path not in _LEGACY_FIELD_PATHS:
        return [
            FieldError(
                f"{path}.fieldPath",
                f"unsupported field path {field_path[:100]!r}: use one of {', '.join(ENV_FIELD_PATHS)},"
                " metadata.labels['key'] or metadata.annotations['key']",
            )
        ]
    return []


def _resource_field_ref(ref: Mapping[str, Any], path: str) -> list[FieldError]:
    out: list[FieldError] = []
    container = _string(ref.get("containerName"))
    if container:
        out.extend(errors_at(f"{path}.containerName", dns1123_label(container)))
    resource = ref.get("resource")
    if resource is None or resource == "":
        return [
            *out,
            FieldError(f"{path}.resource", f"required: one of {', '.join(RESOURCE_FIELD_RESOURCES)}"),
        ]
    if not isinstance(resource, str):
        return out
    if resource not in RESOURCE_FIELD_RESOURCES and not resource.startswith(_HUGEPAGES_PREFIXES):
        out.append(
            FieldError(
                f"{path}.resource",
                f"unsupported resource {resource[:100]!r}: use one of {', '.join(RESOURCE_FIELD_RESOURCES)}"
                " or requests./limits.hugepages-<size>",
            )
        )
        return out
    divisor = ref.get("divisor")
    if divisor is None or isinstance(divisor, bool) or not isinstance(divisor, (int, str)):
        return out
    if not divisor_allowed(resource, divisor):
        allowed = CPU_DIVISORS if resource.endswith(".cpu") else BYTE_DIVISORS
        out.append(
            FieldError(
                f"{path}.divisor",
                f"divisor {divisor!r} is not supported for {resource}: use one of {', '.join(allowed)}",
            )
        )
    return out


def divisor_allowed(resource: str, divisor: int | str) -> bool:
    """Whether `divisor` is one of the canonical divisors Kubernetes allows for `resource`."""
    text = str(divisor)
    if resource.endswith(".cpu"):
        return text in CPU_DIVISORS
    return text in BYTE_DIVISORS


def _key_selector(ref: Mapping[str, Any], path: str, kind: str) -> list[FieldError]:
    out: list[FieldError] = []
    name = ref.get("name")
    if name is None or name == "":
        out.append(
            FieldError(f"{path}.name", f"required: the {kind} (in the operator's namespace) to read from")
        )
    elif isinstance(name, str):
        out.extend(errors_at(f"{path}.name", dns1123_subdomain(name)))
    key = ref.get("key")
    if key is None or key == "":
        out.append(FieldError(f"{path}.key", f"required: the key of the {kind} to read"))
    elif isinstance(key, str):
        out.extend(errors_at(f"{path}.key", config_map_key(key)))
    return out


def config_map_data(data: Any, path: str) -> list[FieldError]:
    """ValidateConfigMap for `data` (key: value) at `path`; keys are rendered as `path[key]`."""
    if not isinstance(data, Mapping):
        return []
    out: list[FieldError] = []
    total = 0
    for key, value in data.items():
        out.extend(errors_at(f"{path}[{key}]", config_map_key(str(key))))
        if isinstance(value, str):
            total += len(value.encode())
    if total > CONFIG_MAP_DATA_MAX_BYTES:
        out.append(
            FieldError(
                path,
                f"the values add up to {total} bytes; a ConfigMap holds at most {CONFIG_MAP_DATA_MAX_BYTES}"
                " (1 MiB): move large files into the package image",
            )
        )
    return out


def label_selector(selector: Any, path: str) -> list[FieldError]:
    """ValidateLabelSelector (meta/v1) at `path`."""
    if not isinstance(selector, Mapping):
        return []
    out: list[FieldError] = []
    labels = selector.get("matchLabels")
    if isinstance(labels, Mapping):
        for key, value in labels.items():
            here = f"{path}.matchLabels[{key}]"
            out.extend(errors_at(here, qualified_name(str(key))))
            if isinstance(value, str):
                out.extend(errors_at(here, label_value(value)))
    expressions = selector.get("matchExpressions")
    if not isinstance(expressions, list):
        return out
    for i, expr in enumerate(expressions):
        if not isinstance(expr, Mapping):
            continue
        here = f"{path}.matchExpressions[{i}]"
        key = expr.get("key")
        if key is None or key == "":
            out.append(FieldError(f"{here}.key", "required: the label key to test"))
        elif isinstance(key, str):
            out.extend(errors_at(f"{here}.key", qualified_name(key)))
        operator = expr.get("operator")
        values = expr.get("values")
        values = values if isinstance(values, list) else []
        if operator in ("In", "NotIn") and not values:
            out.append(FieldError(f"{here}.values", f"must be non-empty when operator is {operator}"))
        elif operator in ("Exists", "DoesNotExist") and values:
            out.append(FieldError(f"{here}.values", f"must be empty when operator is {operator}"))
        elif isinstance(operator, str) and operator not in SELECTOR_OPERATORS:
            out.append(
                FieldError(
                    f"{here}.operator",
                    f"unsupported operator {operator!r}: use one of {', '.join(SELECTOR_OPERATORS)}",
                )
            )
        for j, value in enumerate(values):
            if isinstance(value, str):
                out.extend(errors_at(f"{here}.values[{j}]", label_value(value)))
    return out


def quantity(value: Any, path: str) -> list[FieldError]:
    """A container resource quantity (resource.Quantity, non-negative) given as a JSON string or integer."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return []
    if str(value) != str(value).strip():
        return [FieldError(path, f"{value!r} has surrounding whitespace")]
    try:
        amount = parse_quantity(str(value))
    except QuantityError as exc:
        return [FieldError(path, str(exc))]
    if amount < 0:
        return [FieldError(path, f"{value!r} is negative: resource quantities are >= 0")]
    return []
