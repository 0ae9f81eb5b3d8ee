"""The generated CRD schema (plus the CEL rules' Python predicates) and the pydantic models accept the same
objects. A small validator of the structural-schema subset crdgen emits stands in for the API server:
defaults are applied first (as the API server does when decoding), then types, enums, bounds, patterns,
required fields, and finally the CEL predicates kept next to each rule in the models.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nodewright.api import crdgen
from nodewright.api.models import CelRule, DeploymentPolicySpec, NodeWrightSpec, field_cel_rules
from nodewright.api.validation import _model_of  # the same walk the webhook uses for CEL predicates

_RULES: dict[str, CelRule] = {}


def _collect(cls: Any, seen: set[Any]) -> None:
    if cls in seen:
        return
    seen.add(cls)
    for rule in getattr(cls, "cel_rules", ()):
        _RULES[rule.rule] = rule
    for info in cls.model_fields.values():
        for meta in field_cel_rules(info):
            if meta.rule:
                _RULES[meta.rule] = meta
        inner = _model_of(info.annotation)
        if inner:
            _collect(inner[1], seen)


_collect(NodeWrightSpec, set())
_collect(DeploymentPolicySpec, set())


def _go_anchors(pattern: str) -> str:
    """The API server matches patterns with Go's RE2, where `$` is the end of the text; in Python it also
    matches before a final newline. Our patterns use `$` only as their last character."""
    return pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern


def schema_accepts(schema: dict[str, Any], value: Any) -> tuple[bool, Any]:
    """(valid, defaulted value) for the emitted subset of OpenAPI v3."""
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            return False, value
    else:
        kind = schema["type"]
        checks = {
            "string": lambda v: isinstance(v, str),
            "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "boolean": lambda v: isinstance(v, bool),
            "array": lambda v: isinstance(v, list),
            "object": lambda v: isinstance(v, dict),
        }
        if not checks[kind](value):
            return False, value
    if "enum" in schema and value not in schema["enum"]:
        return False, value
    if isinstance(value, str):
        if len(value) > schema.get("maxLength", 1 << 30) or len(value) < schema.get("minLength", 0):
            return False, value
        if "pattern" in schema and not re.search(_go_anchors(schema["pattern"]), value):
            return False, value
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if is_int and not schema.get("minimum", -(1 << 63)) <= value <= schema.get("maximum", 1 << 63):
        return False, value
    ok = True
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", 1 << 30):
            return False, value
        items = []
        for v in value:
            good, v2 = schema_accepts(schema["items"], v)
            ok &= good
            items.append(v2)
        keys = schema.get("x-kubernetes-list-map-keys")
        if keys and len({tuple(i.get(k) for k in keys) for i in items if isinstance(i, dict)}) != len(items):
            ok = False
        value = items
    elif isinstance(value, dict):
        if len(value) > schema.get("maxProperties", 1 << 30):
            return False, value
        out = dict(value)
        props = schema.get("properties")
        if props is not None:
            out = {k: v for k, v in out.items() if k in props}  # pruning of unknown fields
            for name, prop in props.items():
                if name not in out and "default" in prop:
                    out[name] = prop["default"]
            for name in schema.get("required", []):
                ok &= name in out
            for name, v in list(out.items()):
                good, out[name] = schema_accepts(props[name], v)
                ok &= good
        elif isinstance(schema.get("additionalProperties"), dict):
            for name, v in list(out.items()):
                good, out[name] = schema_accepts(schema["additionalProperties"], v)
                ok &= good
        value = out
    if ok:
        for rule in schema.get("x-kubernetes-validations", []):
            try:
                ok &= _RULES[rule["rule"]].check(value)
            except (KeyError, TypeError, ValueError):
                ok = False
    return ok, value


def _spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]  # type: ignore[no-any-return]


NW_SPEC = _spec_schema(crdgen.nodewright_crd())
DP_SPEC = _spec_schema(crdgen.deploymentpolicy_crd())

names = st.sampled_from(["aa", "drv", "tools", "Bad", "a", "x" * 44, "__default__", "zone a", "zöne", "aa\n"])
versions = st.sampled_from(["1.0.0", "1.2", "01.0", "v1", "1.2.3-rc1", "", 3])
ints = st.one_of(st.integers(-2, 120), st.sampled_from([True, "5", 2**31 - 1, 2**31, 2**63]))
bools = st.one_of(st.booleans(), st.sampled_from(["true", 1]))
quantities = st.one_of(st.sampled_from(["100m", "1", "2Gi", "0", "-1", "lots"]), st.integers(-1, 3))
interrupt = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["service", "reboot", "noop", "restartAllServices", "kexec"]),
        "services": st.lists(st.sampled_from(["a.service", "", "a b", "getty@tty1.service"]), max_size=2),
    },
)
images = st.sampled_from(
    [
        "ghcr.io/x/y",
        "",
        "r:5000/x",
        "BAD IMAGE",
        "a" * 64,
        "ghcr.io/" + "a" * 248,
        "ghcr.io/" + "a" * 247,
        "x@sha256:" + "a" * 64,
        "Upper/x",
        "x:tag\n",
    ]
)
label_keys = st.sampled_from(["a", "", "a b", "example.com/a", "a" * 253 + "/b", "a" * 254 + "/b", "x" * 64])
label_values = st.sampled_from(["x", "", "a b", "-x", "x" * 63, "x" * 64])
config_keys = st.sampled_from(["a.sh", "../x", "..", ".x", "a b", "x" * 254])
key_selector = st.fixed_dictionaries(
    {}, optional={"name": st.sampled_from(["s", "", "S_1"]), "key": config_keys, "optional": bools}
)
value_from = st.fixed_dictionaries(
    {},
    optional={
        "secretKeyRef": key_selector,
        "configMapKeyRef": key_selector,
        "fieldRef": st.fixed_dictionaries(
            {"fieldPath": st.sampled_from(["spec.nodeName", "status.phase", "metadata.labels['a b']"])},
            optional={"apiVersion": st.sampled_from(["v1", "v2", ""])},
        ),
        "resourceFieldRef": st.fixed_dictionaries(
            {"resource": st.sampled_from(["limits.cpu", "requests.memory", "limits.gpu"])},
            optional={"divisor": st.sampled_from(["1m", "1Ki", 1, "2"]), "containerName": st.just("c")},
        ),
        "nope": st.just({}),
    },
)
env_var = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["A", "1A", ".", "..A", "", "my.var"]),
        "value": st.sampled_from(["", "x"]),
        "valueFrom": value_from,
    },
)
toleration = st.fixed_dictionaries(
    {},
    optional={
        "key": label_keys,
        "operator": st.sampled_from(["Exists", "Equal", "Lt"]),
        "value": label_values,
        "effect": st.sampled_from(["NoExecute", "NoSchedule", "Sometimes"]),
        "tolerationSeconds": st.sampled_from([5, -1, 2**40]),
    },
)
package = st.fixed_dictionaries(
    {},
    optional={
        "name": names,
        "version": versions,
        "image": images,
        "agentImageOverride": images,
        "containerSHA": st.sampled_from(["sha256:" + "a" * 64, "bad"]),
        "env": st.lists(env_var, max_size=2),
        "configMap": st.dictionaries(config_keys, st.just("x"), max_size=2),
        "interrupt": interrupt,
        "dependsOn": st.dictionaries(names, versions, max_size=2),
        "resources": st.fixed_dictionaries(
            {},
            optional=dict.fromkeys(("cpuRequest", "cpuLimit", "memoryRequest", "memoryLimit"), quantities),
        ),
        "uninstall": st.fixed_dictionaries({}, optional={"enabled": bools, "apply": bools}),
        "maxAttempts": ints,
        "stageTimeout": st.sampled_from(["30m", "1h30m", "soon"]),
    },
)
budget = st.fixed_dictionaries({}, optional={"percent": ints, "count": ints})
nw_spec = st.fixed_dictionaries(
    {},
    optional={
        "packages": st.dictionaries(names, package, max_size=3),
        "interruptionBudget": budget,
        "deploymentPolicy": st.sampled_from(["", "gpu", "Bad_Name"]),
        "additionalTolerations": st.lists(toleration, max_size=2),
        "nodeSelectors": st.fixed_dictionaries(
            {}, optional={"matchLabels": st.dictionaries(label_keys, label_values, max_size=2)}
        ),
        "priority": ints,
        "sequencing": st.sampled_from(["node", "all", "zone"]),
        "serial": bools,
        "drain": st.fixed_dictionaries({}, optional={"policy": st.sampled_from(["wait", "kill"])}),
    },
)
strategy_params = st.fixed_dictionaries(
    {},
    optional=dict.fromkeys(
        ("initialBatch", "batchThreshold", "failureThreshold", "safetyLimit", "delta", "growthFactor"), ints
    ),
)
strategy = st.fixed_dictionaries(
    {}, optional=dict.fromkeys(("fixed", "linear", "exponential"), strategy_params)
)
selector = st.fixed_dictionaries(
    {},
    optional={
        "matchLabels": st.dictionaries(st.sampled_from(["a", "b"]), st.sampled_from(["x", "y"]), max_size=2),
        "matchExpressions": st.lists(
            st.fixed_dictionaries(
                {"key": st.sampled_from(["a", ""]), "operator": st.sampled_from(["In", "Exists", "Eq"])},
                optional={"values": st.lists(st.sampled_from(["x", "y"]), max_size=2)},
            ),
            max_size=2,
        ),
    },
)
dp_spec = st.fixed_dictionaries(
    {},
    optional={
        "default": st.fixed_dictionaries({}, optional={"budget": budget, "strategy": strategy}),
        "compartments": st.lists(
            st.fixed_dictionaries(
                {}, optional={"name": names, "selector": selector, "budget": budget, "strategy": strategy}
            ),
            max_size=3,
        ),
        "resetBatchStateOnCompletion": bools,
    },
)


def _model_accepts(cls: Any, value: dict[str, Any]) -> bool:
    try:
        cls.model_validate(value)
    except ValueError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(nw_spec)
def test_nodewright_spec_model_and_schema_agree(spec: dict[str, Any]) -> None:
    assert _model_accepts(NodeWrightSpec, spec) == schema_accepts(NW_SPEC, spec)[0], spec


@settings(max_examples=400, deadline=None)
@given(dp_spec)
def test_deploymentpolicy_spec_model_and_schema_agree(spec: dict[str, Any]) -> None:
    assert _model_accepts(DeploymentPolicySpec, spec) == schema_accepts(DP_SPEC, spec)[0], spec
