"""Systematic invalid mutations of the sample manifests, for the admission tests (unit and e2e).

Every mutation changes one place of one sample (manifests/samples/, and the reference-system manifests
after changing apiVersion and kind) so that the result is invalid for a reason the generator knows, and
records where (`path`): an admission that accepts it, or refuses it without naming that place (or a
parent or child of it), has a hole. The generator walks each sample together with the generated CRD
schema, so it covers every field the samples use and every field the schema declares:

- type confusion: each value replaced by values of other JSON types (`spec: "x"`, numbers for strings,
  objects for lists, floats for integers);
- missing required fields (including `metadata` and `metadata.name`);
- unknown enum values and enum values in the wrong case;
- boundary numbers: minimum - 1, maximum + 1, 2^63 and -2^63 - 1;
- invalid strings in every string field and map key: surrounding or inner whitespace, non-ASCII, a
  trailing newline (Go's `$` does not match before it; Python's does), over-long values, the empty string
  where it is not allowed, and per field class the values Kubernetes refuses later (`../etc/passwd` as a
  configMap key, `BAD IMAGE`, a 300-character image name, `1ABC` as an env name, ...);
- absent optional fields inserted with invalid values (so fields no sample uses are covered too);
- structural cases of the embedded Kubernetes types: a toleration with operator Exists and a value,
  tolerationSeconds without NoExecute, `valueFrom: {nope: {}}`, value together with valueFrom, two
  sources, a ConfigMap over 1 MiB.

String fields are classified by their schema path in `STRING_CLASSES`: free text (configMap values, env
values) gets no string mutations, "may be empty" classes (label values, toleration keys and values,
deploymentPolicy) no empty string. A unit test fails when a string field of the schema has no class, so
a new field cannot silently escape the fuzzer.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from nodewright.api import crdgen
from tests.api_corpus import convert_reference, normalize_path, sample_documents

Loc = tuple[str | int, ...]

# ----------------------------------------------------------------------------------------------------
# String classes: schema path pattern (map keys and list items as "*") -> (class, extra invalid values)

FREE = "free"  # any string is valid (file contents, env values)
EMPTY_OK = "empty-ok"  # the empty string is valid, other generic mutations are not
STRICT = "strict"  # no generic mutation is valid, the empty string included

_IMAGES = [
    "BAD IMAGE",
    "registry.example.com/" + "a" * 300,
    "ghcr.io/Org/Pkg",
    "registry:99999999/x",
    "ghcr.io/x/y@sha256:1234",
    "a" * 64,
    "ghcr.io/x/y:-tag",
    "my_registry.io/x",
]
_DURATIONS = ["10", "1d", "-5s", "1h 30m", "99999999999999999999h"]
_LABEL_VALUES = ["-a", "a b", "a/b", "x" * 64, "a_"]
_LABEL_KEYS = ["a b", "a/b/c", "-a", "x" * 64, "/a", "Example.com/a", "a" * 254 + "/b"]
_QUANTITIES = ["lots", "-1", "0", "1.2.3", "1Qi", "1 Gi"]

STRING_CLASSES: dict[str, tuple[str, list[str]]] = {
    "metadata.name": (STRICT, ["Upper", "a_b", "-a", "x" * 254]),
    "spec.packages.*.name": (STRICT, ["Drv", "d"]),
    "spec.packages.*.version": (STRICT, ["v1.0.0", "01.0", "1.2-rc1", "latest"]),
    "spec.packages.*.image": (STRICT, _IMAGES),
    "spec.packages.*.agentImageOverride": (STRICT, _IMAGES),
    "spec.packages.*.containerSHA": (STRICT, ["sha256:" + "A" * 64, "md5:abc", "sha256:abc"]),
    "spec.packages.*.interrupt.services.*": (STRICT, ["a b", "x;reboot", "unit/name"]),
    "spec.packages.*.configInterrupts.*.services.*": (STRICT, ["a b", "x;reboot"]),
    "spec.packages.*.dependsOn.*": (STRICT, ["v1", "0.0.0-"]),
    "spec.packages.*.configMap.*": (FREE, []),
    "spec.packages.*.env.*.name": (STRICT, ["1ABC", "A=B", ".", "..", "..A", "A B"]),
    "spec.packages.*.env.*.value": (FREE, []),
    "spec.packages.*.env.*.valueFrom.secretKeyRef.name": (STRICT, ["My_Secret", "a/b"]),
    "spec.packages.*.env.*.valueFrom.secretKeyRef.key": (STRICT, ["../x", "a/b", ".."]),
    "spec.packages.*.env.*.valueFrom.configMapKeyRef.name": (STRICT, ["My_Map"]),
    "spec.packages.*.env.*.valueFrom.configMapKeyRef.key": (STRICT, ["../x"]),
    "spec.packages.*.env.*.valueFrom.fieldRef.fieldPath": (STRICT, ["spec.nope", "status.phase"]),
    "spec.packages.*.env.*.valueFrom.fieldRef.apiVersion": (EMPTY_OK, ["v2", "apps/v1"]),
    "spec.packages.*.env.*.valueFrom.resourceFieldRef.resource": (STRICT, ["limits.gpu", "cpu"]),
    "spec.packages.*.env.*.valueFrom.resourceFieldRef.containerName": (EMPTY_OK, ["Main", "a_b"]),
    "spec.packages.*.env.*.valueFrom.resourceFieldRef.divisor": (STRICT, ["2", "1Ki"]),
    "spec.packages.*.resources.*": (STRICT, _QUANTITIES),
    "spec.packages.*.gracefulShutdown": (STRICT, _DURATIONS),
    "spec.packages.*.stageTimeout": (STRICT, _DURATIONS),
    "spec.drain.timeout": (STRICT, _DURATIONS),
    "spec.interruptWait.timeout": (STRICT, _DURATIONS),
    "**.matchLabels.*": (EMPTY_OK, _LABEL_VALUES),
    "**.matchExpressions.*.key": (STRICT, _LABEL_KEYS),
    "spec.compartments.*.topologyKey": (STRICT, _LABEL_KEYS),
    "**.matchExpressions.*.values.*": (EMPTY_OK, _LABEL_VALUES),
    "spec.deploymentPolicy": (EMPTY_OK, ["Gpu_Zones", "does-not-exist"]),
    "spec.additionalTolerations.*.key": (EMPTY_OK, _LABEL_KEYS),
    "spec.additionalTolerations.*.value": (EMPTY_OK, _LABEL_VALUES),
    "spec.compartments.*.name": (STRICT, ["__default__", "zone a", "zöne"]),
    "**.soakTime": (STRICT, _DURATIONS),
    "spec.driftDetection.interval": (STRICT, [*_DURATIONS, "9s", "0"]),
    "spec.packages.*.driftDetection.interval": (STRICT, [*_DURATIONS, "1s"]),
    "**.maintenance.timeZone": (STRICT, ["Mars/Olympus", "utc+1"]),
    "**.maintenance.windows.*.timeZone": (STRICT, ["Mars/Olympus"]),
    "**.maintenance.windows.*.schedule": (STRICT, ["0 25 * * *", "every night", "0 2 * *"]),
    "**.maintenance.windows.*.duration": (STRICT, [*_DURATIONS, "0"]),
    "**.maintenance.blackouts.*.start": (
        STRICT,
        ["2026-13-01", "tomorrow", "2026-1-1", "2026-02-30", "0000-01-01"],
    ),
    "**.maintenance.blackouts.*.end": (STRICT, ["2026-02-30x", "2026/01/02", "2027-02-29", "2026-04-31"]),
    "**.maintenance.blackouts.*.reason": (FREE, []),
    "spec.notifications.*.name": (STRICT, ["team slack", "-a", "x" * 64]),
    "spec.notifications.*.urlSecretRef.name": (STRICT, ["My_Secret", "a/b"]),
    "spec.notifications.*.urlSecretRef.key": (STRICT, ["../x", "a/b", ".."]),
    "spec.notifications.*.drainBlockedAfter": (STRICT, _DURATIONS),
    "**.healthGates.*.name": (STRICT, ["xid gate", "-a", "x" * 64]),
    "**.healthGates.*.prometheus.urlSecretRef.name": (STRICT, ["My_Secret", "a/b"]),
    "**.healthGates.*.prometheus.urlSecretRef.key": (STRICT, ["../x", "a/b", ".."]),
    "**.healthGates.*.prometheus.query": (FREE, []),
    "**.healthGates.*.prometheus.threshold": (STRICT, ["one", "1,5", "1e", "0x10", "--1"]),
    "**.healthGates.*.nodeCondition.type": (STRICT, _LABEL_KEYS),
    "**.healthGates.*.timeout": (STRICT, _DURATIONS),
}
# Map keys: schema path of the map -> (class, extra invalid keys).
KEY_CLASSES: dict[str, tuple[str, list[str]]] = {
    "spec.packages": (STRICT, ["Drv", "d", "x" * 44, "a_b"]),
    "spec.packages.*.dependsOn": (STRICT, ["Base", "missing-package"]),
    "spec.packages.*.configMap": (STRICT, ["../etc/passwd", "..", ".", "a/b", "..hidden"]),
    "spec.packages.*.configInterrupts": (STRICT, ["no-such-key.conf"]),
    "**.matchLabels": (STRICT, _LABEL_KEYS),
}


def _segments_match(pattern: list[str], path: list[str]) -> bool:
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_segments_match(rest, path[i:]) for i in range(len(path) + 1))
    return bool(path) and head in ("*", path[0]) and _segments_match(rest, path[1:])


def string_class(schema_path: str, table: dict[str, tuple[str, list[str]]]) -> tuple[str, list[str]] | None:
    """The class of a schema path ("*" is one segment, a map key or list item; "**" any number)."""
    for pattern, klass in table.items():
        if _segments_match(pattern.split("."), schema_path.split(".")):
            return klass
    return None


def generic_strings(value: str, klass: str) -> list[str]:
    out = [value + " ", " " + value, "é" + value, value + "\n", "x" * 1000, value + "\x00"]
    if klass == STRICT:
        out.append("")
    return [v for v in out if v != value]


# ----------------------------------------------------------------------------------------------------
# The generator


@dataclass(frozen=True)
class Mutation:
    id: str
    sample: str
    kind: str  # NodeWright or DeploymentPolicy
    path: Loc
    how: str
    doc: dict[str, Any]

    def path_text(self) -> str:
        return ".".join(str(p) for p in self.path)


FUZZED_KINDS = ("NodeWright", "DeploymentPolicy")


def _schemas() -> dict[str, dict[str, Any]]:
    def root(crd: dict[str, Any]) -> dict[str, Any]:
        return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]

    return {
        "NodeWright": root(crdgen.nodewright_crd()),
        "DeploymentPolicy": root(crdgen.deploymentpolicy_crd()),
    }


def _set(doc: dict[str, Any], loc: Loc, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    target: Any = out
    for part in loc[:-1]:
        target = target[part]
    target[loc[-1]] = value
    return out


def _delete(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    target: Any = out
    for part in loc[:-1]:
        target = target[part]
    del target[loc[-1]]
    return out


def _rename(doc: dict[str, Any], loc: Loc, old: str, new: str) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    target: Any = out
    for part in loc:
        target = target[part]
    target[new] = target.pop(old)
    return out


def _type_of(schema: dict[str, Any]) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    return str(schema.get("type", "object"))


_CONFUSIONS: dict[str, list[Any]] = {
    "string": [7, ["x"], True],
    "integer": ["7", 1.5, True],
    "boolean": ["true", 1],
    "array": ["x", {"a": 1}],
    "object": ["x", 7, []],
    "int-or-string": [True, 1.5, ["1"]],
}


class _Walker:
    def __init__(self, sample: str, doc: dict[str, Any], kind: str) -> None:
        self.sample = sample
        self.doc = doc
        self.kind = kind
        self.out: list[Mutation] = []
        self._ids: set[str] = set()

    def emit(self, loc: Loc, how: str, doc: dict[str, Any]) -> None:
        # Renaming two keys of one map to the same bad key is the same case: keep the first.
        mutation_id = f"{self.sample}:{'.'.join(str(p) for p in loc)}:{how}"
        if mutation_id not in self._ids:
            self._ids.add(mutation_id)
            self.out.append(Mutation(mutation_id, self.sample, self.kind, loc, how, doc))

    def walk(self, value: Any, schema: dict[str, Any], loc: Loc, spath: str) -> None:
        if value is None:
            return
        kind = _type_of(schema)
        for i, other in enumerate(_CONFUSIONS[kind]):
            self.emit(loc, f"type{i}", _set(self.doc, loc, other))
        if kind == "string" or kind == "int-or-string":
            self.strings(value, schema, loc, spath)
        elif kind == "integer" and isinstance(value, int):
            self.numbers(schema, loc)
        elif kind == "array" and isinstance(value, list):
            for i, item in enumerate(value):
                self.walk(item, schema["items"], (*loc, i), f"{spath}.*")
        elif kind == "object" and isinstance(value, dict):
            self.object(value, schema, loc, spath)

    def strings(self, value: Any, schema: dict[str, Any], loc: Loc, spath: str) -> None:
        if "enum" in schema:
            self.emit(loc, "enum-unknown", _set(self.doc, loc, "Bogus"))
            if isinstance(value, str) and value.swapcase() not in schema["enum"]:
                self.emit(loc, "enum-case", _set(self.doc, loc, value.swapcase()))
            return
        klass = string_class(spath, STRING_CLASSES)
        assert klass is not None, f"no string class for {spath} (add it to STRING_CLASSES)"
        name, extra = klass
        if name == FREE:
            return
        text = value if isinstance(value, str) else str(value)
        for i, bad in enumerate([*generic_strings(text, name), *extra]):
            if bad != value:
                self.emit(loc, f"string{i}", _set(self.doc, loc, bad))

    def numbers(self, schema: dict[str, Any], loc: Loc) -> None:
        bad = [2**63, -(2**63) - 1]
        if "minimum" in schema:
            bad.append(schema["minimum"] - 1)
        if "maximum" in schema:
            bad.append(schema["maximum"] + 1)
        for i, number in enumerate(bad):
            self.emit(loc, f"bound{i}", _set(self.doc, loc, number))

    def object(self, value: dict[str, Any], schema: dict[str, Any], loc: Loc, spath: str) -> None:
        props = schema.get("properties")
        if props is None:  # a map: keys are user data
            item_schema = schema.get("additionalProperties")
            keys = string_class(spath, KEY_CLASSES)
            assert keys is not None or not value, f"no key class for {spath} (add it to KEY_CLASSES)"
            for key in sorted(value):
                if keys is not None:
                    for i, bad in enumerate([*generic_strings(key, keys[0]), *keys[1]]):
                        if bad not in value:
                            self.emit((*loc, bad), f"key{i}", _rename(self.doc, loc, key, bad))
                if isinstance(item_schema, dict):
                    self.walk(value[key], item_schema, (*loc, key), f"{spath}.*")
            return
        for name in schema.get("required", []):
            if name in value:
                self.emit((*loc, name), "missing", _delete(self.doc, (*loc, name)))
        for name, prop in props.items():
            child = f"{spath}.{name}" if spath else name
            if name in value:
                self.walk(value[name], prop, (*loc, name), child)
            else:
                self.insert(prop, (*loc, name), child)

    def insert(self, schema: dict[str, Any], loc: Loc, spath: str) -> None:
        """An absent optional field, added with invalid values."""
        kind = _type_of(schema)
        self.emit(loc, "insert-type", _set(self.doc, loc, _CONFUSIONS[kind][0]))
        if kind != "string" or "enum" in schema:
            if "enum" in schema:
                self.emit(loc, "insert-enum", _set(self.doc, loc, "Bogus"))
            return
        klass = string_class(spath, STRING_CLASSES)
        assert klass is not None, f"no string class for {spath} (add it to STRING_CLASSES)"
        if klass[0] != FREE:
            for i, bad in enumerate(["é", *klass[1][:3]]):
                self.emit(loc, f"insert-string{i}", _set(self.doc, loc, bad))


def _structural(walker: _Walker) -> None:
    """Cases of the embedded Kubernetes types that need more than one field changed."""
    doc, spec = walker.doc, walker.doc.get("spec") or {}
    if walker.kind != "NodeWright":
        return
    for i, tol in enumerate(spec.get("additionalTolerations") or []):
        loc: Loc = ("spec", "additionalTolerations", i)
        walker.emit(
            (*loc, "value"), "exists-with-value", _set(doc, loc, {**tol, "operator": "Exists", "value": "x"})
        )
        if tol.get("effect") != "NoExecute":
            walker.emit(
                (*loc, "effect"), "seconds-without-noexecute", _set(doc, loc, {**tol, "tolerationSeconds": 5})
            )
        keyless = {k: v for k, v in tol.items() if k != "key"}
        walker.emit((*loc, "operator"), "equal-without-key", _set(doc, loc, {**keyless, "operator": "Equal"}))
    for name, pkg in sorted((spec.get("packages") or {}).items()):
        base: Loc = ("spec", "packages", name)
        env = pkg.get("env") or []
        walker.emit(
            (*base, "env", len(env), "valueFrom"),
            "value-from-unknown",
            _set(doc, (*base, "env"), [*env, {"name": "FUZZ", "valueFrom": {"nope": {}}}]),
        )
        walker.emit(
            (*base, "env", len(env), "valueFrom"),
            "value-and-value-from",
            _set(
                doc,
                (*base, "env"),
                [
                    *env,
                    {"name": "FUZZ", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                ],
            ),
        )
        walker.emit(
            (*base, "env", len(env), "valueFrom"),
            "two-sources",
            _set(
                doc,
                (*base, "env"),
                [
                    *env,
                    {
                        "name": "FUZZ",
                        "valueFrom": {
                            "secretKeyRef": {"name": "s", "key": "k"},
                            "fieldRef": {"fieldPath": "spec.nodeName"},
                        },
                    },
                ],
            ),
        )
        walker.emit(
            (*base, "env", len(env), "valueFrom", "resourceFieldRef", "divisor"),
            "divisor",
            _set(
                doc,
                (*base, "env"),
                [
                    *env,
                    {
                        "name": "FUZZ",
                        "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1Mi"}},
                    },
                ],
            ),
        )
        config = pkg.get("configMap") or {}
        walker.emit(
            (*base, "configMap"),
            "config-traversal",
            _set(doc, (*base, "configMap"), {**config, "../etc/passwd": "x"}),
        )
        if config:
            big = {f"part{i}.bin": "x" * (256 * 1024) for i in range(4)}
            walker.emit(
                (*base, "configMap"), "config-too-large", _set(doc, (*base, "configMap"), {**config, **big})
            )
    if "metadata" in doc:
        walker.emit(("metadata",), "missing", _delete(doc, ("metadata",)))
        walker.emit(("metadata", "name"), "missing", _delete(doc, ("metadata", "name")))


def mutations() -> list[Mutation]:
    """Every mutation of every sample, in a stable order (the e2e test samples it with a seed)."""
    schemas = _schemas()
    out: list[Mutation] = []
    for name, doc in iter_docs():
        walker = _Walker(name, doc, doc["kind"])
        schema = schemas[doc["kind"]]
        walker.walk(doc["spec"], schema["properties"]["spec"], ("spec",), "spec")
        walker.walk(doc["metadata"]["name"], {"type": "string"}, ("metadata", "name"), "metadata.name")
        _structural(walker)
        out.extend(walker.out)
    return out


def seeded_sample(count: int, seed: int) -> list[Mutation]:
    everything = mutations()
    return random.Random(seed).sample(everything, min(count, len(everything)))


def related(path: str, mutation: Mutation, *, min_depth: int = 2) -> bool:
    """Whether an error at `path` blames the mutated place: the place itself, a parent of it (at least
    `min_depth` segments deep) or a child of it."""
    got = normalize_path(path).split(".")
    want = normalize_path(".".join(str(p) for p in mutation.path)).split(".")
    depth = min(min_depth, len(want))
    return len(got) >= depth and (got == want[: len(got)] or want == got[: len(want)])


def iter_docs() -> Iterator[tuple[str, dict[str, Any]]]:
    """The valid baseline: every sample of a kind the webhook validates, as submitted. DisruptionBudgets
    are left out: the API server alone checks them (schema and CEL rules), and their spec is a label
    selector and a budget, both fuzzed through the DeploymentPolicy samples."""
    for reference in (False, True):
        for name, raw in sample_documents(reference=reference):
            if raw.get("kind") in FUZZED_KINDS:
                yield name, convert_reference(raw) if reference else raw
