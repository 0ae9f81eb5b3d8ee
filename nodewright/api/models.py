"""Pydantic models of the NodeWright and DeploymentPolicy custom resources (group nodewright.io/v1alpha1).

These models are the single source of truth for the API: the CRD schemas under `manifests/crds/` are
generated from them (`nodewright.api.crdgen`), the admission webhook validates with them, and the
controller reads cached objects through them. Field names and meanings match the reference system's
`Skyhook` and `DeploymentPolicy` (`skyhook.nvidia.com/v1alpha1`) so that existing manifests convert by
changing `apiVersion` and `kind`.

Conventions:
- JSON names are camelCase (`alias_generator`), Python names snake_case; `populate_by_name` lets tests
  build models with Python names.
- Unknown fields are ignored when reading from the cluster (`extra="ignore"`), so an older operator keeps
  working against a newer CRD; the CRD's structural schema prunes unknown fields on write anyway.
- Scalars are validated strictly (no "5" -> 5 coercion) because the API server does not coerce either:
  what the model accepts is what the generated schema accepts (a Hypothesis test checks the agreement).
- Defaults that the API server can apply are declared here and emitted into the schema. The API server
  applies a property's default only when its parent object is present, so nested defaults (strategy
  parameters, `drain.policy`) materialise exactly like in the model.
- Rules a structural schema cannot express (one-of, mutually exclusive fields, map-key patterns) are
  declared as `CelRule`s: the CEL expression is emitted as `x-kubernetes-validations`, and the Python
  predicate next to it, evaluated on the JSON form of the object, enforces the same rule in the model.
  The API server therefore rejects the same objects as `model_validate`, even when the webhook is down.
- The API server drops `null` values of non-nullable fields before validation ("pruning"), and the
  model treats `None` as "not set", so `failureThreshold: null` in a reference manifest means "unset".

Pause and disable are annotations (`nodewright.io/pause`, `nodewright.io/disable`), not spec fields:
metadata changes do not bump `metadata.generation`, so toggling them does not restart a rollout.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AliasGenerator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from nodewright.api import constants
from nodewright.api import k8svalidation as k8s
from nodewright.api.dates import CALENDAR_DATE_MESSAGE, CALENDAR_DATE_PATTERN, is_calendar_date
from nodewright.api.images import (
    IMAGE_ID_PATTERN,
    IMAGE_NAME_FIND,
    IMAGE_REFERENCE_PATTERN,
    NAME_MAX,
    REFERENCE_MAX,
)

# ----------------------------------------------------------------------------------------------------
# Patterns and limits shared by the models, the schema generator and the semantic validation.

PACKAGE_NAME_PATTERN = r"^[a-z][-a-z0-9]{0,41}[a-z]$"
# Semantic versioning as the reference checks it (Go's x/mod/semver on "v" + version): "1", "1.2" and
# "1.2.3" are valid; pre-release and build suffixes only after a full MAJOR.MINOR.PATCH; no leading zeros.
_NUM = r"(0|[1-9][0-9]*)"
_PRE_ID = r"(0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)"
SEMVER_PATTERN = (
    rf"^{_NUM}(\.{_NUM}(\.{_NUM}(-{_PRE_ID}(\.{_PRE_ID})*)?(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?)?)?$"
)
# Go's time.ParseDuration syntax (metav1.Duration): "90s", "1h30m", "1.5h", "0".
DURATION_PATTERN = r"^(0|([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$"
# Kubernetes resource.Quantity (decimal or binary SI suffix, or decimal exponent).
QUANTITY_PATTERN = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SHA256_DIGEST_PATTERN = r"^sha256:[a-f0-9]{64}$"
# Kubernetes' own name and key syntax (nodewright.api.k8svalidation), anchored for the schema.
QUALIFIED_NAME_PATTERN = k8s.anchored(k8s.QUALIFIED_NAME_RE)
LABEL_VALUE_PATTERN = k8s.anchored(k8s.LABEL_VALUE_RE)
CONFIG_MAP_KEY_PATTERN = k8s.anchored(k8s.CONFIG_MAP_KEY_RE)
ENV_VAR_NAME_PATTERN = k8s.anchored(k8s.ENV_VAR_NAME_RE)
# Compartment names are label values (without the empty one): they appear as metric label values, map
# keys of the status, in Events and in the node-state annotation, so they stay printable and short.
COMPARTMENT_NAME_PATTERN = k8s.anchored(k8s.LABEL_NAME_RE)
SYSTEMD_UNIT_PATTERN = k8s.anchored(k8s.SYSTEMD_UNIT_RE)

MAX_PACKAGES = 64
MAX_COMPARTMENTS = 32
MAX_DEPENDS_ON = 32
MAX_CONFIG_KEYS = 128
MAX_ENV = 128
MAX_SERVICES = 64
MAX_SELECTOR_TERMS = 32
MAX_SELECTOR_VALUES = 256
MAX_TOLERATIONS = 64
MAX_CONDITIONS = 32
LABEL_VALUE_MAX = 63
LABEL_KEY_MAX = k8s.QUALIFIED_NAME_MAX  # 253-character DNS prefix + "/" + 63-character name
SHORT_STRING = 253
IMAGE_MAX = REFERENCE_MAX
# Counts and priorities: far beyond any fleet, and exact in every JSON decoder (the API server decodes
# integers beyond int64 as floats, which its maximum check cannot tell apart from 2^63 - 1).
INT_MAX = 2**31 - 1
CONFIG_VALUE_MAX = 256 * 1024  # a ConfigMap value is bounded by the 1 MiB object limit anyway


@dataclass(frozen=True)
class CelRule:
    """One `x-kubernetes-validations` entry plus the Python predicate that enforces it in the model.

    `check` receives the JSON form (aliases, `None` omitted, defaults applied) of the object or field
    the rule is attached to, i.e. exactly what CEL's `self` sees, and returns True when the rule holds.
    `field_path` (relative JSON path, e.g. `.percent`) tells the API server which field to blame.
    """

    rule: str
    message: str
    check: Callable[[Any], bool]
    field_path: str | None = None
    reason: Literal[
        "FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"
    ] = "FieldValueInvalid"

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        if self.reason != "FieldValueInvalid":
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class SchemaExtra:
    """Schema-only annotations of a field (list/map semantics, int-or-string, preserve-unknown)."""

    values: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, **values: Any) -> SchemaExtra:
        return cls(tuple(values.items()))


def field_cel_rules(info: FieldInfo) -> list[CelRule]:
    """The field-level CelRules of a field, also those inside `Annotated[...] | None` (pydantic keeps only
    the outer Annotated metadata on the FieldInfo; the schema generator sees both)."""
    rules = [m for m in info.metadata if isinstance(m, CelRule)]
    if typing.get_origin(info.annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(info.annotation):
            if typing.get_origin(arg) is typing.Annotated:
                rules.extend(m for m in typing.get_args(arg)[1:] if isinstance(m, CelRule))
    return rules


def _json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, exclude_none=True, mode="json")
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json(v) for v in value]
    if isinstance(value, StrEnum):
        return value.value
    return value


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=AliasGenerator(validation_alias=to_camel, serialization_alias=to_camel),
        populate_by_name=True,
        extra="ignore",
        frozen=True,
        strict=True,
        use_enum_values=False,
    )

    # Object-level CEL rules; field-level ones live in the field's `Annotated` metadata.
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _check_cel_rules(self) -> Any:
        failures: list[str] = []
        own = _json(self) if self.cel_rules else None
        failures.extend(
            f"{r.field_path.lstrip('.')}: {r.message}" if r.field_path else r.message
            for r in self.cel_rules
            if not r.check(own)
        )
        for name, info in type(self).model_fields.items():
            rules = field_cel_rules(info)
            value = getattr(self, name)
            if rules and value is not None:
                as_json = _json(value)
                json_name = info.serialization_alias or info.alias or name
                failures.extend(f"{json_name}: {r.message}" for r in rules if not r.check(as_json))
        if failures:
            raise ValueError("; ".join(failures))
        return self

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _count_set(obj: dict[str, Any], *keys: str) -> int:
    return sum(1 for k in keys if k in obj)


def _stringify_int(value: Any) -> Any:
    # Quantities are int-or-string in Kubernetes (`cpuLimit: 2`); keep one Python type for consumers.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def _req(description: str, **kwargs: Any) -> Any:
    return Field(..., description=description, **kwargs)


def _text(description: str, **kwargs: Any) -> Any:
    """A documented field, optional (None) unless a default or `required=True` is given."""
    if kwargs.pop("required", False):
        return Field(..., description=description, **kwargs)
    if "default" not in kwargs and "default_factory" not in kwargs:
        kwargs["default"] = None
    return Field(description=description, **kwargs)


# ----------------------------------------------------------------------------------------------------
# Shared Kubernetes shapes

# A qualified name's pattern bounds its name part; the DNS prefix before '/' is bounded here (<= 253).
_PREFIX_RULE = CelRule(
    rule=f"self.indexOf('/') <= {k8s.DNS1123_SUBDOMAIN_MAX}",
    message=f"the prefix before '/' must be at most {k8s.DNS1123_SUBDOMAIN_MAX} characters",
    check=lambda v: v.find("/") <= k8s.DNS1123_SUBDOMAIN_MAX,
)
_LABEL_KEYS_RULE = CelRule(
    rule=f"self.all(k, k.matches(r'{QUALIFIED_NAME_PATTERN}') &&"
    f" k.indexOf('/') <= {k8s.DNS1123_SUBDOMAIN_MAX})",
    message="label keys must be qualified names: an optional DNS-subdomain prefix (<= 253) and '/', then a"
    " name of 1-63 letters, digits, '-', '_', '.' starting and ending with a letter or digit",
    check=lambda m: all(not k8s.qualified_name(k) for k in m),
)
LabelValue = Annotated[str, Field(max_length=LABEL_VALUE_MAX, pattern=LABEL_VALUE_PATTERN)]


class LabelSelectorRequirement(_Model):
    """A label selector requirement: a key, an operator and (for In/NotIn) values."""

    cel_rules = (
        CelRule(
            rule="(self.operator == 'In' || self.operator == 'NotIn') ? (has(self.values) &&"
            " size(self.values) > 0)"
            " : (!has(self.values) || size(self.values) == 0)",
            message="values must be non-empty for In and NotIn and empty for Exists and DoesNotExist",
            check=lambda o: (
                len(o.get("values", [])) > 0
                if o["operator"] in ("In", "NotIn")
                else len(o.get("values", [])) == 0
            ),
            field_path=".values",
        ),
    )

    key: Annotated[
        str, Field(min_length=1, max_length=LABEL_KEY_MAX, pattern=QUALIFIED_NAME_PATTERN), _PREFIX_RULE
    ] = _req("The label key the selector applies to: [DNS-subdomain prefix/]name, the name <= 63 characters.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = _req(
        "How the key relates to the values: In, NotIn, Exists or DoesNotExist."
    )
    values: list[LabelValue] | None = _text(
        "Label values; non-empty for In and NotIn, empty for Exists and DoesNotExist.",
        max_length=MAX_SELECTOR_VALUES,
    )


class LabelSelector(_Model):
    """A Kubernetes label selector; the requirements are ANDed. An empty selector matches everything."""

    match_labels: Annotated[dict[str, LabelValue] | None, _LABEL_KEYS_RULE] = _text(
        "Labels (key: value) an object must carry, all of them.", max_length=MAX_SELECTOR_TERMS
    )
    match_expressions: list[LabelSelectorRequirement] | None = _text(
        "Set-based requirements, all of which must hold.", max_length=MAX_SELECTOR_TERMS
    )

    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions


class Toleration(_Model):
    """A pod toleration (core/v1 Toleration) added to package and interrupt pods.

    The rules are Kubernetes' own (ValidateTolerations), so the package pods can always be created.
    """

    cel_rules = (
        CelRule(
            rule="(has(self.key) && size(self.key) > 0) || (has(self.operator) && self.operator == 'Exists')",
            message="operator must be Exists when key is empty (an empty key with Exists tolerates every"
            " taint)",
            check=lambda o: bool(o.get("key")) or o.get("operator") == "Exists",
            field_path=".operator",
        ),
        CelRule(
            rule="!has(self.operator) || self.operator != 'Exists' || !has(self.value) ||"
            " size(self.value) == 0",
            message="value must be empty when operator is Exists: remove the value or use operator Equal",
            check=lambda o: o.get("operator") != "Exists" or not o.get("value"),
            field_path=".value",
        ),
        CelRule(
            rule="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="effect must be NoExecute when tolerationSeconds is set",
            check=lambda o: "tolerationSeconds" not in o or o.get("effect") == "NoExecute",
            field_path=".effect",
        ),
    )

    key: (
        Annotated[
            str,
            Field(max_length=LABEL_KEY_MAX, pattern=k8s.anchored(f"(?:{k8s.QUALIFIED_NAME_RE})?")),
            _PREFIX_RULE,
        ]
        | None
    ) = _text("Taint key the toleration applies to (a label key); empty with operator Exists matches all.")
    operator: Literal["Exists", "Equal"] | None = _text("Exists or Equal (the default in Kubernetes).")
    value: LabelValue | None = _text(
        "Taint value to match when the operator is Equal (a label value); empty with Exists."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = _text(
        "Taint effect to match; empty matches all effects."
    )
    toleration_seconds: Annotated[int, Field(ge=-(2**31), le=INT_MAX)] | None = _text(
        "For NoExecute taints: how long the pod stays bound after the taint is added (needs effect"
        " NoExecute)."
    )


class ObjectFieldSelector(_Model):
    """A field of the package pod (downward API), e.g. spec.nodeName or metadata.labels['key']."""

    api_version: Annotated[str, Field(pattern=r"^(?:v1)?$", max_length=2)] | None = _text(
        "Version of the schema the path is written in: v1 (the default)."
    )
    field_path: Annotated[
        str, Field(min_length=1, max_length=k8s.FIELD_PATH_MAX, pattern=k8s.anchored(k8s.FIELD_PATH_RE))
    ] = _req(
        "One of "
        + ", ".join(k8s.ENV_FIELD_PATHS)
        + ", metadata.labels['key'] or metadata.annotations['key']."
    )


def _divisor_ok(o: dict[str, Any]) -> bool:
    return "divisor" not in o or k8s.divisor_allowed(str(o["resource"]), o["divisor"])


class ResourceFieldSelector(_Model):
    """A resource limit or request of a container of the package pod."""

    cel_rules = (
        CelRule(
            rule="!has(self.divisor) || (self.resource.endsWith('.cpu') ? string(self.divisor) in ["
            + ", ".join(f"'{d}'" for d in k8s.CPU_DIVISORS)
            + "] : string(self.divisor) in ["
            + ", ".join(f"'{d}'" for d in k8s.BYTE_DIVISORS)
            + "])",
            message="divisor must be 1m or 1 for cpu, and one of "
            + ", ".join(k8s.BYTE_DIVISORS)
            + " for memory, ephemeral-storage and hugepages",
            check=_divisor_ok,
            field_path=".divisor",
        ),
    )

    container_name: (
        Annotated[
            str, Field(max_length=k8s.DNS1123_LABEL_MAX, pattern=k8s.anchored(f"(?:{k8s.DNS1123_LABEL_RE})?"))
        ]
        | None
    ) = _text("Container whose resources to read; empty for the container the variable is set in.")
    resource: Annotated[
        str, Field(min_length=1, max_length=SHORT_STRING, pattern=k8s.anchored(k8s.RESOURCE_FIELD_RE))
    ] = _req(
        "limits.cpu, limits.memory, limits.ephemeral-storage, requests.cpu, requests.memory,"
        " requests.ephemeral-storage, or requests./limits.hugepages-<size>."
    )
    divisor: (
        Annotated[
            str,
            BeforeValidator(_stringify_int),
            Field(pattern=QUANTITY_PATTERN, max_length=64),
            SchemaExtra.of(**{"x-kubernetes-int-or-string": True}),
        ]
        | None
    ) = _text("Unit of the value: 1m or 1 for cpu; 1, 1k, 1Ki, 1M, 1Mi, ... for byte resources.")


class KeySelector(_Model):
    """A key of a ConfigMap or Secret in the operator's namespace (where package pods run)."""

    name: Annotated[
        str, Field(min_length=1, max_length=k8s.DNS1123_SUBDOMAIN_MAX, pattern=DNS_SUBDOMAIN_PATTERN)
    ] = _req("Name of the object (a DNS subdomain).")
    key: Annotated[
        str, Field(min_length=1, max_length=k8s.CONFIG_MAP_KEY_MAX, pattern=CONFIG_MAP_KEY_PATTERN)
    ] = _req("The key to read.")
    optional: bool | None = _text("Start the containers even when the object or key does not exist.")


class EnvVarSource(_Model):
    """core/v1 EnvVarSource: exactly one of fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef."""

    cel_rules = (
        CelRule(
            rule=" + ".join(f"(has(self.{k}) ? 1 : 0)" for k in k8s.VALUE_FROM_SOURCES) + " == 1",
            message="set exactly one of " + ", ".join(k8s.VALUE_FROM_SOURCES),
            check=lambda o: _count_set(o, *k8s.VALUE_FROM_SOURCES) == 1,
        ),
    )

    field_ref: ObjectFieldSelector | None = _text("A field of the package pod.")
    resource_field_ref: ResourceFieldSelector | None = _text("A resource limit or request of a container.")
    config_map_key_ref: KeySelector | None = _text("A key of a ConfigMap in the operator's namespace.")
    secret_key_ref: KeySelector | None = _text("A key of a Secret in the operator's namespace.")


class EnvVar(_Model):
    """A container environment variable of the package's step containers (core/v1 EnvVar)."""

    cel_rules = (
        CelRule(
            rule="!has(self.valueFrom) || !has(self.value) || size(self.value) == 0",
            message="valueFrom cannot be combined with a non-empty value: remove one of them",
            check=lambda o: "valueFrom" not in o or not o.get("value"),
            field_path=".valueFrom",
        ),
    )

    name: Annotated[str, Field(min_length=1, max_length=SHORT_STRING, pattern=ENV_VAR_NAME_PATTERN)] = _req(
        "Environment variable name: letters, digits, '_', '-' and '.', not starting with a digit."
    )
    value: str | None = _text("Literal value.", max_length=CONFIG_VALUE_MAX)
    value_from: EnvVarSource | None = _text(
        "Source of the value (core/v1 EnvVarSource: secretKeyRef, configMapKeyRef, fieldRef,"
        " resourceFieldRef). Referenced Secrets and ConfigMaps must live in the operator's namespace, where"
        " package pods run."
    )


# ----------------------------------------------------------------------------------------------------
# NodeWright


class InterruptType(StrEnum):
    SERVICE = "service"
    REBOOT = "reboot"
    NOOP = "noop"
    RESTART_ALL_SERVICES = "restartAllServices"


class Interrupt(_Model):
    """What has to happen on the node after a package (or a config key) changed before it counts as done.

    The node is cordoned and drained before any interrupt other than noop.
    """

    type: InterruptType = _req(
        "Kind of interrupt: service (restart the systemd units in `services`), reboot (reboot the node),"
        " noop (run the interrupt step without disruption) or restartAllServices.",
        strict=False,
    )
    services: (
        list[Annotated[str, Field(min_length=1, max_length=SHORT_STRING, pattern=SYSTEMD_UNIT_PATTERN)]]
        | None
    ) = _text(
        "systemd units to restart when type is service (unit names, e.g. containerd).",
        max_length=MAX_SERVICES,
    )


_QUANTITY_FIELDS = ("cpuRequest", "cpuLimit", "memoryRequest", "memoryLimit")
Quantity = Annotated[
    str,
    BeforeValidator(_stringify_int),
    Field(pattern=QUANTITY_PATTERN, max_length=64),
    SchemaExtra.of(**{"x-kubernetes-int-or-string": True}),
]


def _resources_ok(o: dict[str, Any]) -> bool:
    # Local import keeps the quantity parser in one module; it is pure.
    from nodewright.api.quantity import parse_quantity

    present = _count_set(o, *_QUANTITY_FIELDS)
    if present == 0:
        return True
    if present != 4:
        return False
    values = {k: parse_quantity(str(o[k])) for k in _QUANTITY_FIELDS}
    if any(v <= Decimal(0) for v in values.values()):
        return False
    return values["cpuLimit"] >= values["cpuRequest"] and values["memoryLimit"] >= values["memoryRequest"]


class Resources(_Model):
    """CPU and memory overrides for the package's pod. All four or none; each limit must be >= its request."""

    cel_rules = (
        CelRule(
            rule="[has(self.cpuRequest), has(self.cpuLimit), has(self.memoryRequest), has(self.memoryLimit)]"
            ".all(x, x) || [has(self.cpuRequest), has(self.cpuLimit), has(self.memoryRequest),"
            " has(self.memoryLimit)].all(x, !x)",
            message="set all of cpuRequest, cpuLimit, memoryRequest and memoryLimit, or none of them",
            check=lambda o: _count_set(o, *_QUANTITY_FIELDS) in (0, 4),
        ),
        CelRule(
            rule="!has(self.cpuRequest) || !has(self.cpuLimit) || !has(self.memoryRequest) ||"
            " !has(self.memoryLimit)"
            " || (quantity(string(self.cpuRequest)).isGreaterThan(quantity('0')) &&"
            " quantity(string(self.memoryRequest)).isGreaterThan(quantity('0'))"
            " && quantity(string(self.cpuLimit)).compareTo(quantity(string(self.cpuRequest))) >= 0"
            " && quantity(string(self.memoryLimit)).compareTo(quantity(string(self.memoryRequest))) >= 0)",
            message="requests must be positive and each limit must be greater than or equal to its request",
            check=_resources_ok,
        ),
    )

    cpu_request: Quantity | None = _text("CPU request of the package containers, e.g. 500m.")
    cpu_limit: Quantity | None = _text("CPU limit, >= cpuRequest.")
    memory_request: Quantity | None = _text("Memory request, e.g. 256Mi.")
    memory_limit: Quantity | None = _text("Memory limit, >= memoryRequest.")


class Uninstall(_Model):
    """Explicit uninstall of a package from every node (the package must ship uninstall steps)."""

    cel_rules = (
        CelRule(
            rule="!self.apply || self.enabled",
            message="uninstall.apply requires uninstall.enabled: set enabled to true or apply to false",
            check=lambda o: (not o.get("apply", False)) or o.get("enabled", False),
            field_path=".apply",
        ),
    )

    enabled: bool = _text(
        "The package supports uninstall. Removing or downgrading such a package is refused until its"
        " uninstall has completed on every node.",
        default=False,
    )
    apply: bool = _text("Uninstall the package from all nodes now. Requires enabled.", default=False)


class DrainPolicy(StrEnum):
    WAIT = "wait"
    SKIP = "skip"
    FORCE = "force"


class Drain(_Model):
    """How nodes are drained before an interrupt."""

    timeout: Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)] = _text(
        "How long to wait for evicted pods to terminate (Go duration, e.g. 10m).", default="10m"
    )
    policy: DrainPolicy = _text(
        "What to do when the timeout expires: wait (keep the node cordoned and keep evicting, reporting the"
        " blocking PodDisruptionBudget), skip (release the node: uncordon it if we cordoned it, report it"
        " blocked, let the rollout continue with other nodes and retry it later) or force (delete the"
        " remaining pods bypassing PodDisruptionBudgets, then continue).",
        default=DrainPolicy.WAIT,
        strict=False,
    )


class InterruptWait(_Model):
    """How long to wait for pods matching podNonInterruptLabels to finish before an interrupt."""

    timeout: Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)] | None = _text(
        "Maximum wait (Go duration); unset waits indefinitely, like the reference system."
    )
    action: Literal["fail", "proceed"] = _text(
        "On timeout: fail (mark the node erroring and keep it cordoned) or proceed (interrupt anyway).",
        default="fail",
    )


class DriftAction(StrEnum):
    REPORT = "report"
    REAPPLY = "reapply"


class DriftDetection(_Model):
    """Periodic re-checks of complete nodes: do they still have what this NodeWright applied?"""

    enabled: bool = _text(
        "Check this NodeWright (or package) at all; false opts a package out.", default=True
    )
    interval: Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)] = _text(
        "How often each complete node is checked (Go duration, at least 10s); checks are spread over the"
        " interval per node (a fixed offset derived from the node's name), and a node is also checked"
        " at once when it rebooted outside an interrupt of ours or its kernel or OS image changed.",
        default="1h",
    )
    action: DriftAction = _text(
        "report: a node whose check fails is labelled drifted, with a condition, an Event and metrics,"
        " and nothing else happens; reapply: it is also repaired (the package's apply and config run again,"
        " with its interrupt), through batches and budgets like any change.",
        default=DriftAction.REPORT,
        strict=False,
    )


def _image_name_ok(value: str) -> bool:
    name = re.match(IMAGE_NAME_FIND, value)
    return (name is None or len(name.group(0)) <= NAME_MAX) and re.fullmatch(IMAGE_ID_PATTERN, value) is None


# The pattern is the reference grammar; the name's length and the image-ID ambiguity need CEL.
_IMAGE_RULE = CelRule(
    rule=f"size(self.find(r'{IMAGE_NAME_FIND}')) <= {NAME_MAX} && !self.matches(r'{IMAGE_ID_PATTERN}')",
    message=f"the repository name (without tag and digest) must be at most {NAME_MAX} characters and not a"
    " bare 64-hex image ID",
    check=_image_name_ok,
)
ImageReference = Annotated[
    str, Field(min_length=1, max_length=IMAGE_MAX, pattern=IMAGE_REFERENCE_PATTERN), _IMAGE_RULE
]
_CONFIG_KEYS_RULE = CelRule(
    rule=f"self.all(k, size(k) <= {k8s.CONFIG_MAP_KEY_MAX} && k.matches(r'{CONFIG_MAP_KEY_PATTERN}'))",
    message=f"keys must be file names: 1-{k8s.CONFIG_MAP_KEY_MAX} letters, digits, '-', '_', '.', not '.' or"
    " '..' and not starting with '..'",
    check=lambda m: all(not k8s.config_map_key(k) for k in m),
)
_CONFIG_SIZE_RULE = CelRule(
    rule=f"self.map(k, size(self[k])).sum() <= {k8s.CONFIG_MAP_DATA_MAX_BYTES}",
    message=f"the values add up to more than {k8s.CONFIG_MAP_DATA_MAX_BYTES} characters; a ConfigMap holds at"
    " most 1 MiB",
    check=lambda m: sum(len(v) for v in m.values()) <= k8s.CONFIG_MAP_DATA_MAX_BYTES,
)


_NAME_RULE = CelRule(
    rule=f"self.matches('{PACKAGE_NAME_PATTERN}')",
    message=f"must match {PACKAGE_NAME_PATTERN}",
    check=lambda v: re.fullmatch(PACKAGE_NAME_PATTERN, v) is not None,
)


class Package(_Model):
    """A package installed on every selected node: an image with lifecycle steps, run by the agent."""

    cel_rules = (
        CelRule(
            rule="!has(self.containerSHA) || !self.image.contains('@')",
            message="set the digest either in image (@sha256:...) or in containerSHA, not both",
            check=lambda o: "containerSHA" not in o or "@" not in o["image"],
            field_path=".containerSHA",
        ),
    )

    name: (
        Annotated[str, Field(pattern=PACKAGE_NAME_PATTERN, max_length=constants.MAX_PACKAGE_NAME_LENGTH)]
        | None
    ) = _text("Package name; defaults to (and must equal) the key in spec.packages.")
    version: Annotated[str, Field(pattern=SEMVER_PATTERN, min_length=1, max_length=LABEL_VALUE_MAX)] = _req(
        "Semantic version of the package (1.2.3, 1.2, 1.2.3-rc1; no leading v). Used as the image tag"
        " unless image carries a tag or digest, and compared to decide upgrade or downgrade."
    )
    image: ImageReference = _req(
        "Image repository of the package, e.g. ghcr.io/org/pkg or registry:5000/pkg. The version is used"
        " as the tag; a tag in image must equal the version."
    )
    container_sha: Annotated[str, Field(pattern=SHA256_DIGEST_PATTERN, max_length=71)] | None = _text(
        "Digest (sha256:...) to pull instead of the version tag.", default=None, alias="containerSHA"
    )
    agent_image_override: ImageReference | None = _text(
        "Full image reference of the agent for this package, overriding the operator's agent image."
    )
    interrupt: Interrupt | None = _text("Interrupt needed after apply (none when unset).")
    depends_on: Annotated[
        dict[str, Annotated[str, Field(pattern=SEMVER_PATTERN, max_length=LABEL_VALUE_MAX)]] | None,
        CelRule(
            rule=f"self.all(k, k.matches('{PACKAGE_NAME_PATTERN}'))",
            message=f"dependency names must match {PACKAGE_NAME_PATTERN}",
            check=lambda m: all(re.fullmatch(PACKAGE_NAME_PATTERN, k) for k in m),
        ),
    ] = _text(
        "Packages (name: exact version) that must be complete on the node before this one starts.",
        max_length=MAX_DEPENDS_ON,
    )
    config_interrupts: dict[str, Interrupt] | None = _text(
        "Interrupt to run when a configMap key changes; keys are configMap keys or globs (*, ?, [..]).",
        max_length=MAX_CONFIG_KEYS,
    )
    config_map: Annotated[
        dict[str, Annotated[str, Field(max_length=CONFIG_VALUE_MAX)]] | None,
        _CONFIG_KEYS_RULE,
        _CONFIG_SIZE_RULE,
    ] = _text(
        "Files mounted into the package pod (key = file name); changing a value runs the config stage.",
        max_length=MAX_CONFIG_KEYS,
    )
    env: list[EnvVar] | None = _text(
        "Environment of the package containers.",
        max_length=MAX_ENV,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    resources: Resources | None = _text("CPU and memory of the package containers (all four or none).")
    graceful_shutdown: Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)] | None = _text(
        "Grace period of the package pod on termination (Go duration, e.g. 30s)."
    )
    uninstall: Uninstall | None = _text("Explicit uninstall support and trigger.")
    max_attempts: Annotated[int, Field(ge=1, le=100)] = _text(
        "How many times a failing stage is retried on a node before the node is marked erroring.", default=3
    )
    stage_timeout: Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)] = _text(
        "Maximum duration of one stage (Go duration); a stage running longer counts as a failed attempt.",
        default="30m",
    )
    drift_detection: DriftDetection | None = _text(
        "Overrides the NodeWright's driftDetection for this package (enabled: false opts it out)."
    )


class Budget(_Model):
    """Legacy interruption budget: how many nodes may be disrupted at once. At most one of percent, count."""

    cel_rules = (
        CelRule(
            rule="!(has(self.percent) && has(self.count))",
            message="set at most one of percent or count",
            check=lambda o: _count_set(o, "percent", "count") <= 1,
        ),
    )

    percent: Annotated[int, Field(ge=0, le=100)] | None = _text("Percent of the selected nodes (0..100).")
    count: Annotated[int, Field(ge=0, le=INT_MAX)] | None = _text(
        "Absolute number of nodes (0 behaves like 1)."
    )


class Sequencing(StrEnum):
    NODE = "node"
    ALL = "all"


class DeploymentPolicyOptions(_Model):
    """Per-NodeWright overrides of the referenced DeploymentPolicy."""

    reset_batch_state_on_completion: bool | None = _text(
        "Reset the batch state when the rollout completes or a package version changes; overrides the"
        " policy's resetBatchStateOnCompletion.",
        default=True,
    )


class NotificationFormat(StrEnum):
    JSON = "json"
    SLACK = "slack"


class NotificationEvent(StrEnum):
    """What a notification sink can be told about."""

    ROLLOUT_STARTED = "RolloutStarted"
    BATCH_SETTLED = "BatchSettled"
    NODE_FAILED = "NodeFailed"
    COMPARTMENT_HALTED = "CompartmentHalted"
    DRAIN_BLOCKED = "DrainBlocked"
    ROLLOUT_COMPLETED = "RolloutCompleted"


class SecretKeySelector(_Model):
    """A key of a Secret in the operator's namespace (the chart grants `get` on the Secrets it names)."""

    name: Annotated[
        str, Field(min_length=1, max_length=k8s.DNS1123_SUBDOMAIN_MAX, pattern=DNS_SUBDOMAIN_PATTERN)
    ] = _req("Name of the Secret, in the operator's namespace.")
    key: Annotated[
        str, Field(min_length=1, max_length=k8s.CONFIG_MAP_KEY_MAX, pattern=CONFIG_MAP_KEY_PATTERN)
    ] = _req("The key whose value is the webhook URL (http or https).")


MAX_NOTIFICATION_SINKS = 8


class NotificationSink(_Model):
    """An HTTP webhook told about rollout events (a chat channel's incoming webhook, an alert router)."""

    name: Annotated[
        str, Field(min_length=1, max_length=LABEL_VALUE_MAX, pattern=COMPARTMENT_NAME_PATTERN)
    ] = _req("Name of the sink (unique per NodeWright; a metric label value).")
    url_secret_ref: SecretKeySelector = _req(
        "Where the webhook URL is kept: it is a credential (whoever has it may post), so it is in a Secret"
        " of the operator's namespace."
    )
    format: NotificationFormat = _text(
        "Payload: json (an object with event, nodewright, compartment, node, message, time, key) or slack"
        " (an object with text, which Slack- and Mattermost-compatible incoming webhooks accept).",
        default=NotificationFormat.JSON,
        strict=False,
    )
    events: list[Annotated[NotificationEvent, Field(strict=False)]] | None = _text(
        "Events to send; unset sends all of them: RolloutStarted, BatchSettled, NodeFailed,"
        " CompartmentHalted, DrainBlocked, RolloutCompleted.",
        max_length=len(NotificationEvent),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    drain_blocked_after: Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)] = _text(
        "A DrainBlocked event is sent once a node's drain has been blocked for this long (Go duration).",
        default="15m",
    )


# Like apps/v1 (Deployment, StatefulSet, DaemonSet): ten earlier revisions unless told otherwise. A
# revision holds a whole spec (configMaps included, up to the object size limit), so the cap bounds what a
# NodeWright can store in etcd: 100 revisions at most.
DEFAULT_REVISION_HISTORY = 10
MAX_REVISION_HISTORY = 100


def _sink_names_unique(items: list[dict[str, Any]]) -> bool:
    names = [c["name"] for c in items]
    return len(names) == len(set(names))


def _packages_names_ok(m: dict[str, Any]) -> bool:
    return all(re.fullmatch(PACKAGE_NAME_PATTERN, k) and m[k].get("name", k) == k for k in m)


class NodeWrightSpec(_Model):
    """Desired state: which nodes, which packages, and how fast to roll them out."""

    cel_rules = (
        CelRule(
            rule="!(has(self.deploymentPolicy) && size(self.deploymentPolicy) > 0 &&"
            " has(self.interruptionBudget)"
            " && (has(self.interruptionBudget.percent) || has(self.interruptionBudget.count)))",
            message="deploymentPolicy and interruptionBudget are mutually exclusive: put the budget in"
            " the policy",
            check=lambda o: (
                not (
                    o.get("deploymentPolicy")
                    and _count_set(o.get("interruptionBudget", {}), "percent", "count")
                )
            ),
            field_path=".interruptionBudget",
        ),
    )

    node_selectors: LabelSelector | None = _text(
        "Nodes this NodeWright applies to; unset or empty selects all nodes."
    )
    packages: Annotated[
        dict[str, Package],
        CelRule(
            rule=f"self.all(k, k.matches('{PACKAGE_NAME_PATTERN}') && (!has(self[k].name) ||"
            f" self[k].name == k))",
            message=f"package keys must match {PACKAGE_NAME_PATTERN} and equal the package's name",
            check=_packages_names_ok,
        ),
    ] = _text(
        "Packages by name. dependsOn between them forms a DAG; independent packages run in parallel.",
        default_factory=dict,
        max_length=MAX_PACKAGES,
    )
    pod_non_interrupt_labels: LabelSelector | None = _text(
        "Pods matching this selector on a node (Running or Pending) block its interrupt until they finish;"
        " empty disables the check."
    )
    interruption_budget: Budget | None = _text(
        "Legacy budget when no deploymentPolicy is used; neither set means all nodes at once."
    )
    deployment_policy: (
        Annotated[
            str, Field(max_length=SHORT_STRING, pattern=k8s.anchored(f"(?:{k8s.DNS1123_SUBDOMAIN_RE})?"))
        ]
        | None
    ) = _text(
        "Name of the DeploymentPolicy that controls batches and budgets; exclusive with interruptionBudget."
    )
    deployment_policy_options: DeploymentPolicyOptions | None = _text(
        "Overrides of the policy for this object."
    )
    additional_tolerations: list[Toleration] | None = _text(
        "Tolerations added to package pods; also decide which tainted nodes are eligible.",
        max_length=MAX_TOLERATIONS,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    runtime_required: bool = _text(
        "Nodes keep the runtime-required taint until this NodeWright is complete on them.", default=False
    )
    auto_taint_new_nodes: bool = _text(
        "With runtimeRequired: taint matching nodes that were never handled by NodeWright.", default=False
    )
    priority: Annotated[int, Field(ge=1, le=INT_MAX)] = _text(
        "Order between NodeWrights: lower runs first, ties by name.", default=constants.DEFAULT_PRIORITY
    )
    sequencing: Sequencing = _text(
        "How this NodeWright gates higher priority numbers: node (per node) or all (every node first).",
        default=Sequencing.NODE,
        strict=False,
    )
    serial: bool = _text("Start at most one package at a time.", default=False)
    drain: Drain | None = _text("Drain behaviour before interrupts; defaults apply when unset.")
    interrupt_wait: InterruptWait | None = _text(
        "Bound on waiting for podNonInterruptLabels pods before an interrupt; unset waits indefinitely."
    )
    drift_detection: DriftDetection | None = _text(
        "Keep verifying complete nodes with the packages' check modes (apply-check, config-check,"
        " post-interrupt-check), and report or repair drift; off when unset."
    )
    notifications: Annotated[
        list[NotificationSink] | None,
        # Uniqueness is enforced by the API server through the list-map key; the predicate mirrors it.
        CelRule(rule="", message="notification sink names must be unique", check=_sink_names_unique),
    ] = _text(
        "Webhooks told about this rollout (started, batch settled, node failed, compartment halted, drain"
        " blocked, completed), besides the operator's cluster-wide sink (--notify-url-secret).",
        max_length=MAX_NOTIFICATION_SINKS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    revision_history_limit: Annotated[int, Field(ge=0, le=MAX_REVISION_HISTORY)] = _text(
        "How many earlier specs the operator keeps as revisions (ControllerRevisions in its namespace,"
        " owned by this NodeWright) besides the current one, for `kubectl nodewright history` and"
        " `kubectl nodewright undo`; 0 keeps only the current spec, so there is nothing to go back to."
        " Not part of a revision itself: undo keeps the value in force.",
        default=DEFAULT_REVISION_HISTORY,
    )

    def effective_drain(self) -> Drain:
        return self.drain or Drain()


class Status(StrEnum):
    """Roll-up status of a NodeWright, and of a node for one NodeWright."""

    UNKNOWN = "unknown"
    COMPLETE = "complete"
    BLOCKED = "blocked"
    WAITING = "waiting"
    DISABLED = "disabled"
    PAUSED = "paused"
    IN_PROGRESS = "in_progress"
    ERRORING = "erroring"
    DRIFTED = "drifted"  # nodes only: complete once, a drift check failed since (driftDetection)


class Condition(_Model):
    """metav1.Condition."""

    type: Annotated[str, Field(min_length=1, max_length=316)] = _req(
        "Condition type, CamelCase: Ready, Reconciling, Stalled or a domain condition."
    )
    status: Literal["True", "False", "Unknown"] = _req("True, False or Unknown.")
    reason: Annotated[str, Field(min_length=1, max_length=1024)] = _req(
        "One CamelCase word for machines and one-line displays."
    )
    message: Annotated[str, Field(max_length=32768)] = _text("Human-readable detail.", default="")
    last_transition_time: str = _req(
        "When status last changed (RFC 3339).", json_schema_extra={"format": "date-time"}
    )
    observed_generation: Annotated[int, Field(ge=0)] | None = _text(
        "metadata.generation the condition was computed from."
    )


# ----------------------------------------------------------------------------------------------------
# Health gates between batches (docs/rollout.md, "Health gates"; decided by plan.gates)

MAX_HEALTH_GATES = 8
GATE_QUERY_MAX = 4096
NUMBER_PATTERN = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$"


class GateComparison(StrEnum):
    """How a gate's value is compared with its threshold: the gate passes when `value <op> threshold`."""

    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="


class PrometheusGate(_Model):
    """A PromQL query asked of Prometheus after the soak; every sample it returns must pass."""

    url_secret_ref: SecretKeySelector = _req(
        "Where the Prometheus base URL (http or https, e.g. http://prometheus.monitoring:9090) is kept:"
        " a Secret of the operator's namespace (list it in the chart's healthGates.secretNames)."
    )
    query: Annotated[str, Field(min_length=1, max_length=GATE_QUERY_MAX)] = _req(
        "Instant PromQL query. $NODES is replaced by a regular expression matching exactly the node names"
        ' of the batch that settled, for a label matcher: node=~"$NODES". No sample is a failing value'
        " (write `... or vector(0)` where no data means healthy)."
    )
    comparison: GateComparison = _req(
        "The gate passes when every sample's value <comparison> threshold.", strict=False
    )
    threshold: Annotated[str, Field(pattern=NUMBER_PATTERN, max_length=64)] = _req(
        'The number compared with, e.g. "0" or "0.5" (a string: Kubernetes APIs keep floats out).'
    )


class NodeConditionGate(_Model):
    """No node of the batch that settled may have this condition True (e.g. set by node-problem-detector)."""

    type: Annotated[str, Field(min_length=1, max_length=LABEL_KEY_MAX, pattern=QUALIFIED_NAME_PATTERN)] = (
        _req("The node condition type, e.g. GpuXidError or KernelDeadlock.")
    )


class HealthGate(_Model):
    """A check that must pass after a batch settles (and its soak ends) before the next batch opens."""

    cel_rules = (
        CelRule(
            rule="has(self.prometheus) != has(self.nodeCondition)",
            message="set exactly one of prometheus or nodeCondition",
            check=lambda o: _count_set(o, "prometheus", "nodeCondition") == 1,
        ),
    )

    name: Annotated[
        str, Field(min_length=1, max_length=LABEL_VALUE_MAX, pattern=COMPARTMENT_NAME_PATTERN)
    ] = _req("Name of the gate (unique in its list; named in holds, halts, Events and metrics).")
    prometheus: PrometheusGate | None = _text("A Prometheus query with a comparison.")
    node_condition: NodeConditionGate | None = _text("A node condition no node of the batch may have True.")
    timeout: Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)] | None = _text(
        "How long after the soak ends the gate may keep failing before the compartment halts (Go"
        " duration; default 10m). Until then the next batch is held and the gate asked again."
    )


def _unique_gate_names(items: list[dict[str, Any]]) -> bool:
    names = [g["name"] for g in items]
    return len(names) == len(set(names))


# Uniqueness is enforced by the API server through the list-map key; the predicate mirrors it.
_GATE_NAMES_RULE = CelRule(
    rule="",
    message="health gate names must be unique",
    check=_unique_gate_names,
)


class GateOutcome(StrEnum):
    """What a health gate saw: passed, failed (a value beyond its threshold, a node condition True), or
    unknown (it could not be evaluated: Prometheus unreachable, no sample, the Secret missing)."""

    PASSED = "Passed"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class GateStatus(_Model):
    """The latest result of a health gate after the batch that settled last (read back by the planner,
    so `kubectl nodewright why` and a restarted operator see what the gate saw)."""

    gate: str = _req("Name of the gate.")
    batch: int = _req("The batch it was evaluated after.")
    outcome: GateOutcome = _req("Passed, Failed or Unknown (could not be evaluated).", strict=False)
    query: Annotated[str, Field(max_length=GATE_QUERY_MAX + 1024)] = _req(
        "The query as asked (node names substituted), or the node condition."
    )
    value: str | None = _text("The deciding value (unset: none).")
    detail: Annotated[str, Field(max_length=512)] = _text("What was wrong, for people.", default="")
    evaluated_at: str = _req("When it was evaluated (RFC 3339).", json_schema_extra={"format": "date-time"})


class GateHalt(_Model):
    """The health gate that halted the compartment, with what it saw."""

    gate: str = _req("Name of the gate.")
    batch: int = _req("The batch after which it failed.")
    query: Annotated[str, Field(max_length=GATE_QUERY_MAX + 1024)] = _req(
        "The query as asked (node names substituted), or the node condition type."
    )
    value: str | None = _text("The failing value (unset: it could not be evaluated).")
    detail: Annotated[str, Field(max_length=512)] = _text("What was wrong, for people.", default="")


class BatchState(_Model):
    """Progress of the batches of one compartment."""

    current_batch: int = _text("Number of the current batch, from 1.", default=1)
    consecutive_failures: int = _text("Failed batches in a row.", default=0)
    completed_nodes: int = _text("Nodes completed in this rollout.", default=0)
    failed_nodes: int = _text("Nodes failed in this rollout.", default=0)
    should_stop: bool = _text("The rollout stopped after too many failed batches.", default=False)
    last_batch_size: int = _text("Size of the last batch.", default=0)
    last_batch_failed: bool = _text("The last batch missed the batchThreshold.", default=False)
    last_settled_batch: int = _text("Number of the batch that settled last (0: none yet).", default=0)
    settled_at: str | None = _text(
        "When the last batch settled (RFC 3339); soakTime counts from here.",
        json_schema_extra={"format": "date-time"},
    )
    approved_batch: int = _text(
        "The last batch whose pauseAfterBatch gate was approved (0: none).", default=0
    )
    planned_size: int = _text(
        "Nodes the open batch of currentBatch was planned with when it opened (0: none open).", default=0
    )
    admitted_size: int = _text(
        "Admissions issued so far to the open batch; while fewer than plannedSize, later passes admit"
        " the rest into it (the controller writes a bounded number of admissions per pass).",
        default=0,
    )
    gate_halt: GateHalt | None = _text(
        "The health gate that halted the compartment (unset: not halted by a gate)."
    )


class CompartmentStatus(_Model):
    """Rollout progress of one compartment (`__default__` for nodes matching no compartment)."""

    matched: int = _text("Nodes in the compartment.", default=0)
    ceiling: int = _text("Budget ceiling: nodes that may be in progress at once.", default=0)
    in_progress: int = _text("Nodes in progress.", default=0)
    completed: int = _text("Nodes complete.", default=0)
    progress_percent: int = _text("completed / matched in percent.", default=0)
    batch_state: BatchState | None = _text("Batch progress.")
    used_by_others: int = _text(
        "Budget slots taken by nodes unavailable for other reasons (cordoned by someone else, NotReady).",
        default=0,
    )
    halted: bool = _text(
        "The compartment halted after too many failed batches; reset to resume.", default=False
    )
    message: Annotated[str, Field(max_length=1024)] = _text(
        "What the compartment is doing or waiting for.", default=""
    )
    window_active: bool | None = _text(
        "A maintenance window is open now (unset: the compartment has no maintenance schedule)."
    )
    window_closes_at: str | None = _text(
        "When the open window closes (RFC 3339).", json_schema_extra={"format": "date-time"}
    )
    next_window_at: str | None = _text(
        "When the next window opens, if none is open now (RFC 3339).",
        json_schema_extra={"format": "date-time"},
    )
    soak_until: str | None = _text(
        "The next batch waits for the soak time until then (RFC 3339).",
        json_schema_extra={"format": "date-time"},
    )
    soak_remaining_seconds: int | None = _text("Seconds of soak time left before the next batch may open.")
    awaiting_approval: int | None = _text(
        "The batch whose gate (pauseAfterBatch) waits for approval: `nodewright approve <nw> --compartment"
        " <name>`."
    )
    health_gates: list[GateStatus] | None = _text(
        "The latest results of the health gates after the batch that settled last."
    )


MAX_CONSISTENCY_GROUPS = 8


class ConsistencyGroup(_Model):
    """Nodes that have one package at the same version with the same configuration."""

    version: Annotated[str, Field(max_length=LABEL_VALUE_MAX)] = _req("Installed version.")
    config: Annotated[str, Field(max_length=16)] = _text(
        "Digest of the package configMap last applied (empty: none).", default=""
    )
    state: Annotated[str, Field(max_length=32)] = _text(
        "complete, in_progress, erroring, drifted...", default=""
    )
    nodes: int = _req("Number of nodes.")


class NodeWrightStatus(_Model):
    """Observed state, aggregated over the selected nodes (per-node detail lives on the nodes)."""

    observed_generation: int | None = _text("metadata.generation the status was computed from.")
    status: Status | None = _text(
        "Roll-up: unknown, complete, blocked, waiting, disabled, paused, in_progress or erroring.",
        strict=False,
    )
    conditions: list[Condition] | None = _text(
        "Ready, Reconciling, Stalled (kstatus) and domain conditions.",
        max_length=MAX_CONDITIONS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    compartment_statuses: dict[str, CompartmentStatus] | None = _text(
        "Progress per compartment.", max_length=MAX_COMPARTMENTS + 1
    )
    nodes_in_progress: int = _text("Nodes in progress or erroring.", default=0)
    nodes_erroring: int = _text("Nodes erroring.", default=0)
    complete_nodes: str = _text("complete/total nodes.", default="0/0")
    package_list: str = _text("Sorted name:version list of the packages.", default="")
    node_counts: dict[str, int] | None = _text("Number of nodes per status.", max_length=16)
    nodes_matched: int = _text("Nodes selected by nodeSelectors.", default=0)
    rollout_fingerprint: Annotated[str, Field(max_length=64)] = _text(
        "Digest of the packages the current rollout converges to; a change starts a new rollout.",
        default="",
    )
    next_order: int = _text("Next node order number (SKYHOOK_NODE_ORDER) of the current rollout.", default=0)
    rollout_first_order: int = _text(
        "Order number of the first admission of the current rollout. Admissions for the same spec from an"
        " earlier rollout (a spec that came back: `kubectl nodewright undo`, or an edit reverted by hand)"
        " have lower numbers and count as older: the way back gets batches of its own.",
        default=0,
    )
    node_examples: (
        dict[str, Annotated[list[Annotated[str, Field(max_length=253)]], Field(max_length=5)]] | None
    ) = _text("A few example node names per node status.", max_length=16)
    package_counts: dict[str, Annotated[dict[str, int], Field(max_length=32)]] | None = _text(
        "Node counts per package name:version and stage/state.", max_length=128
    )
    waiting_reasons: dict[str, int] | None = _text("Waiting nodes per reason.", max_length=16)
    waiting_examples: (
        dict[str, Annotated[list[Annotated[str, Field(max_length=253)]], Field(max_length=5)]] | None
    ) = _text("A few example node names per waiting reason.", max_length=16)
    drifted_nodes: int = _text("Nodes whose last drift check failed.", default=0)
    drifted_examples: list[Annotated[str, Field(max_length=253)]] | None = _text(
        "A few drifted nodes.", max_length=5
    )
    consistency: (
        dict[str, Annotated[list[ConsistencyGroup], Field(max_length=MAX_CONSISTENCY_GROUPS)]] | None
    ) = _text(
        "Per package, the distinct (version, config) combinations found on the nodes with their node"
        " counts (at most a few per package, most common first): uniform when there is one.",
        max_length=MAX_PACKAGES,
    )


class ObjectMeta(_Model):
    name: str
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    finalizers: list[str] | None = None


class NodeWright(_Model):
    """A set of packages to install, upgrade or uninstall on the host OS of the selected nodes."""

    cel_rules = (
        CelRule(
            rule=f"self.metadata.name.size() <= {constants.MAX_NODEWRIGHT_NAME_LENGTH}",
            message=f"metadata.name must be at most {constants.MAX_NODEWRIGHT_NAME_LENGTH} characters so"
            f" the node"
            " label nodewright.io/status.<name> fits the 63-character label name limit",
            check=lambda o: len(o["metadata"]["name"]) <= constants.MAX_NODEWRIGHT_NAME_LENGTH,
        ),
    )

    api_version: str = constants.API_VERSION
    kind: Literal["NodeWright"] = "NodeWright"
    metadata: ObjectMeta
    spec: NodeWrightSpec = _req("Desired state.")
    status: NodeWrightStatus | None = _text("Observed state.")


# ----------------------------------------------------------------------------------------------------
# DeploymentPolicy


class FixedStrategy(_Model):
    """Constant batch size: initialBatch nodes per batch."""

    initial_batch: Annotated[int, Field(ge=1, le=INT_MAX)] = _text("Nodes in the first batch.", default=1)
    batch_threshold: Annotated[int, Field(ge=1, le=100)] = _text(
        "Percent of a batch that must succeed for the batch to count as successful.", default=100
    )
    failure_threshold: Annotated[int, Field(ge=1, le=INT_MAX)] | None = _text(
        "Stop the rollout after this many failed batches in a row; unset never stops."
    )
    safety_limit: Annotated[int, Field(ge=1, le=100)] = _text(
        "Progress (percent of nodes) below which a failed batch also stops growth.", default=50
    )


class LinearStrategy(FixedStrategy):
    """Batch size grows by delta after each successful batch."""

    delta: Annotated[int, Field(ge=1, le=INT_MAX)] = _text("Nodes added to each following batch.", default=1)


class ExponentialStrategy(FixedStrategy):
    """Batch size is multiplied by growthFactor after each successful batch."""

    growth_factor: Annotated[int, Field(ge=2, le=INT_MAX)] = _text("Multiplier of the batch size.", default=2)


_STRATEGY_KEYS = ("fixed", "linear", "exponential")


class Strategy(_Model):
    """Exactly one of fixed, linear, exponential."""

    cel_rules = (
        CelRule(
            rule="(has(self.fixed) ? 1 : 0) + (has(self.linear) ? 1 : 0) + (has(self.exponential) ? 1 :"
            " 0) == 1",
            message="set exactly one of fixed, linear or exponential",
            check=lambda o: _count_set(o, *_STRATEGY_KEYS) == 1,
        ),
    )

    fixed: FixedStrategy | None = _text("Constant batches.")
    linear: LinearStrategy | None = _text("Batches growing by delta.")
    exponential: ExponentialStrategy | None = _text("Batches growing by growthFactor.")

    def kind(self) -> str:
        return next((k for k in _STRATEGY_KEYS if getattr(self, k) is not None), "unknown")


class PolicyBudget(_Model):
    """Exactly one of percent (1..100) or count (>= 1)."""

    cel_rules = (
        CelRule(
            rule="has(self.percent) != has(self.count)",
            message="set exactly one of percent or count",
            check=lambda o: _count_set(o, "percent", "count") == 1,
        ),
    )

    percent: Annotated[int, Field(ge=1, le=100)] | None = _text("Percent of the compartment's nodes.")
    count: Annotated[int, Field(ge=1, le=INT_MAX)] | None = _text("Absolute number of nodes.")


# A day that exists (nodewright.api.dates): the schema says so in CEL, so the API server refuses
# 2026-02-30 even without the webhook, with a message that says what to write.
_CALENDAR_DATE_RULE = CelRule(
    rule=f"self.matches(r'{CALENDAR_DATE_PATTERN}')",
    message=CALENDAR_DATE_MESSAGE,
    check=is_calendar_date,
)
CalendarDate = Annotated[str, Field(max_length=10), _CALENDAR_DATE_RULE]
MAX_WINDOWS = 16
# Five cron fields separated by single spaces (cronsim checks the values; the shape keeps stray
# whitespace and control characters out, which a cron evaluator would silently accept).
CRON_PATTERN = r"^[0-9A-Za-z*/,#?-]+( [0-9A-Za-z*/,#?-]+){4}$"
MAX_BLACKOUTS = 64
MAX_GATES = 32
TIME_ZONE_MAX = 64


class MaintenanceWindow(_Model):
    """A recurring period in which nodes may be admitted: a cron schedule opens it, `duration` closes it."""

    schedule: Annotated[str, Field(min_length=9, max_length=256, pattern=CRON_PATTERN)] = _req(
        "When the window opens: a cron expression (minute hour day-of-month month day-of-week) in timeZone;"
        " L, # and W are allowed, e.g. `0 22 * * 1-5` (weekdays 22:00) or `0 2 * * TUE#2` (02:00 on the"
        " second Tuesday of the month)."
    )
    duration: Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)] = _req(
        "How long the window stays open (Go duration of elapsed time, e.g. 4h; a window may cross midnight)."
    )
    time_zone: Annotated[str, Field(min_length=1, max_length=TIME_ZONE_MAX)] | None = _text(
        "IANA time zone of the schedule, e.g. Europe/Berlin; default: the maintenance timeZone."
    )


class Blackout(_Model):
    """Whole days (from start to end, both included, in the maintenance timeZone) on which nothing is
    admitted, whatever the windows say."""

    cel_rules = (
        CelRule(
            rule="self.end >= self.start",
            message="end must not be before start",
            check=lambda o: o["end"] >= o["start"],
            field_path=".end",
        ),
    )

    start: CalendarDate = _req("First day (YYYY-MM-DD).")
    end: CalendarDate = _req("Last day (YYYY-MM-DD), included.")
    reason: Annotated[str, Field(max_length=256)] | None = _text("Why (shown in the waiting reason).")


class Maintenance(_Model):
    """When nodes may be admitted: inside any window and outside every blackout. No windows means always
    (blackouts still apply). Nodes admitted inside a window finish after it closes."""

    time_zone: Annotated[str, Field(min_length=1, max_length=TIME_ZONE_MAX)] = _text(
        "IANA time zone of the windows without their own and of the blackout days, e.g. America/New_York.",
        default="UTC",
    )
    windows: list[MaintenanceWindow] | None = _text(
        "Windows; a node is admitted only while at least one is open.",
        max_length=MAX_WINDOWS,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    blackouts: list[Blackout] | None = _text(
        "Days on which no node is admitted.",
        max_length=MAX_BLACKOUTS,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )


_GATES_RULE = CelRule(
    rule="self.all(b, b >= 1)",
    message="batch numbers start at 1",
    check=lambda v: all(b >= 1 for b in v),
)


class NodeOrder(StrEnum):
    """Which eligible node a compartment's batch takes first (`plan.rollout`, `plan.disruption`)."""

    ZONE = "zone"
    IDLE_FIRST = "idleFirst"


class CompartmentRollout(_Model):
    """Pacing shared by compartments and the default: soak time, approval and health gates, node order."""

    soak_time: Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)] | None = _text(
        "How long to wait after a batch settles before the next batch opens (Go duration, e.g. 30m)."
    )
    pause_after_batch: Annotated[list[Annotated[int, Field(ge=1, le=INT_MAX)]] | None, _GATES_RULE] = _text(
        "Batch numbers after which the compartment waits for approval (`nodewright approve`, or the"
        " annotation nodewright.io/approve) before the next batch opens, e.g. [1] for a canary.",
        max_length=MAX_GATES,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    maintenance: Maintenance | None = _text(
        "When this compartment may admit nodes; unset: the policy's spec.maintenance."
    )
    health_gates: Annotated[list[HealthGate] | None, _GATE_NAMES_RULE] = _text(
        "Checks that must pass after a batch settles and soaks before the next batch opens; a failing"
        " gate holds the compartment, then halts it after the gate's timeout.",
        max_length=MAX_HEALTH_GATES,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    node_order: NodeOrder | None = _text(
        "Which nodes a batch takes first. zone (unset): by zone label, creation time, name. idleFirst:"
        " within that order, the nodes whose update interrupts least first: no pod matching"
        " podNonInterruptLabels, then the fewest pods a drain would evict (DaemonSet, static and"
        " finished pods do not count); with a topologyKey, whole domains by the sum of their nodes.",
        strict=False,
    )


class PolicyDefault(CompartmentRollout):
    """Budget, strategy and pacing of nodes that match no compartment."""

    budget: PolicyBudget = _req("Ceiling of nodes in progress at once.")
    strategy: Strategy = _req("How batches grow.")


class Compartment(CompartmentRollout):
    """A group of nodes (by label selector) with its own budget, strategy and pacing."""

    name: Annotated[
        str,
        Field(min_length=1, max_length=LABEL_VALUE_MAX, pattern=COMPARTMENT_NAME_PATTERN),
        CelRule(
            rule=f"self != '{constants.DEFAULT_COMPARTMENT}'",
            message=f"{constants.DEFAULT_COMPARTMENT} is reserved for nodes matching no compartment",
            check=lambda v: v != constants.DEFAULT_COMPARTMENT,
        ),
    ] = _req(
        "Unique name of the compartment: 1-63 letters, digits, '-', '_' and '.', starting and ending with a"
        " letter or digit (it is used as a metric label value and in Events)."
    )
    selector: LabelSelector = _req("Nodes in this compartment.")
    budget: PolicyBudget = _req("Ceiling of nodes in progress at once.")
    strategy: Strategy | None = _text("How batches grow; unset means batches of the budget ceiling.")
    topology_key: (
        Annotated[
            str, Field(min_length=1, max_length=LABEL_KEY_MAX, pattern=QUALIFIED_NAME_PATTERN), _PREFIX_RULE
        ]
        | None
    ) = _text(
        "A node label naming a topology domain (e.g. a rack or NVLink-domain label): budget, batch sizes"
        " and admissions count domains, not nodes, and a domain's nodes are admitted together. A node"
        " without the label is a domain of its own."
    )


def _unique_names(items: list[dict[str, Any]]) -> bool:
    names = [c["name"] for c in items]
    return len(names) == len(set(names))


class DeploymentPolicySpec(_Model):
    """How NodeWrights referencing this policy roll out: per compartment, budgets and batch strategies."""

    default: PolicyDefault = _req("Budget and strategy for nodes matching no compartment.")
    compartments: Annotated[
        list[Compartment] | None,
        # Uniqueness is enforced by the API server through the list-map key; the predicate mirrors it.
        CelRule(rule="", message="compartment names must be unique", check=_unique_names),
    ] = _text(
        "Compartments, matched against node labels; a node in several gets the safest.",
        max_length=MAX_COMPARTMENTS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    reset_batch_state_on_completion: bool = _text(
        "Reset batch state when a rollout completes or a package version changes.", default=True
    )
    maintenance: Maintenance | None = _text(
        "Maintenance windows and blackouts of every compartment (and the default) that sets none itself."
    )


class DeploymentPolicyStatus(_Model):
    """Summary for `kubectl get dp`, written by the operator."""

    observed_generation: int | None = _text("metadata.generation the status was computed from.")
    default_strategy: str | None = _text("Strategy of the default compartment: fixed, linear or exponential.")
    compartment_count: int | None = _text("Number of compartments besides the default.")


def policy_status(policy: DeploymentPolicy) -> DeploymentPolicyStatus:
    """The status the operator writes for a policy (pure: a function of the spec)."""
    return DeploymentPolicyStatus(
        observed_generation=policy.metadata.generation,
        default_strategy=policy.spec.default.strategy.kind(),
        compartment_count=len(policy.spec.compartments or []),
    )


class DeploymentPolicy(_Model):
    """Rollout rules (compartments, budgets, batch strategies) shared by NodeWrights."""

    api_version: str = constants.API_VERSION
    kind: Literal["DeploymentPolicy"] = "DeploymentPolicy"
    metadata: ObjectMeta
    spec: DeploymentPolicySpec = _req("Desired rollout rules.")
    status: DeploymentPolicyStatus | None = _text("Summary written by the operator.")


# ----------------------------------------------------------------------------------------------------
# DisruptionBudget


MAX_BUDGET_SLOTS = 10_000
# A moment written by the operator (RFC 3339) and parsed back by it: `format: date-time` makes the API
# server refuse one that does not exist (an edit of the status by hand), which would fail every pass.
Moment = Annotated[str, SchemaExtra.of(format="date-time")]
MAX_BUDGET_HOLDERS = 1024


class DisruptionBudgetSpec(_Model):
    """Nodes (by label selector) of which at most `budget` may be disrupted at once, whoever disrupts them."""

    node_selector: LabelSelector = _req(
        "Nodes of the pool: every NodeWright's admissions of these nodes draw from this budget; an empty"
        " selector selects every node."
    )
    budget: PolicyBudget = _req(
        "How many nodes of the pool may be disrupted at once: count, or percent of the pool's nodes (at"
        " least 1). Disrupted: admitted by a NodeWright and not settled, cordoned, NotReady, or in progress"
        " for any NodeWright."
    )


class DisruptionBudgetStatus(_Model):
    """Slots held and nodes disrupted, written by the operator (slots with resourceVersion preconditions)."""

    observed_generation: int | None = _text("metadata.generation the status was computed from.")
    matched: int = _text("Nodes the selector matches.", default=0)
    ceiling: int = _text("Nodes of the pool that may be disrupted at once.", default=0)
    disrupted: int = _text("Nodes of the pool disrupted now (with a slot or for other reasons).", default=0)
    unavailable: int = _text(
        "Disrupted nodes without a slot: cordoned by someone else, NotReady, or in progress outside a slot.",
        default=0,
    )
    slots: dict[str, Annotated[dict[str, Moment], Field(max_length=MAX_BUDGET_HOLDERS)]] | None = _text(
        "Per node of the pool, the NodeWrights holding a slot on it and since when (RFC 3339). A NodeWright"
        " records its slot here before it admits the node, with the resourceVersion it planned from.",
        max_length=MAX_BUDGET_SLOTS,
    )
    holders: dict[str, int] | None = _text("Slots held per NodeWright.", max_length=MAX_BUDGET_HOLDERS)
    waiting: dict[str, Moment] | None = _text(
        "NodeWrights refused a slot and since when: a free slot goes to the longest waiting first.",
        max_length=MAX_BUDGET_HOLDERS,
    )
    message: Annotated[str, Field(max_length=1024)] = _text(
        "Who holds the slots and which nodes are unavailable for other reasons.", default=""
    )


class DisruptionBudget(_Model):
    """A disruption budget for a pool of nodes shared by every NodeWright (like a PodDisruptionBudget, for
    nodes): the nodes of the pool disrupted at once never exceed it."""

    api_version: str = constants.API_VERSION
    kind: Literal["DisruptionBudget"] = "DisruptionBudget"
    metadata: ObjectMeta
    spec: DisruptionBudgetSpec = _req("The pool and its budget.")
    status: DisruptionBudgetStatus | None = _text("Slots and disrupted nodes, written by the operator.")
