"""The admission fuzzer's mutations (tests/admission_fuzz.py) against the Python validation and the webhook.

Every mutation must be refused by `nodewright.api.validation` with an error naming the mutated place (or
a parent or child of it), the samples must stay accepted, and the webhook's handlers must answer every
mutation -- as CREATE, as UPDATE of the sample, and on the mutating endpoints -- with an AdmissionReview
whose denial carries a 4xx code: never an exception, never 500. The e2e admission test submits a seeded
sample of the same mutations to a real API server with the real webhook.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from nodewright.api import crdgen
from nodewright.webhook.server import Handlers
from tests.admission_fuzz import (
    FREE,
    KEY_CLASSES,
    STRING_CLASSES,
    Mutation,
    iter_docs,
    mutations,
    related,
    string_class,
)
from tests.test_api_validation import EXISTING_POLICIES, _validate

MUTATIONS = mutations()


class _Facts:
    async def policy_exists(self, name: str) -> bool:
        return name in EXISTING_POLICIES

    async def nodewrights_using_policy(self, name: str) -> list[str]:
        return []

    async def package_present(self, nodewright: str, package: str) -> bool:
        return False


def test_generator_produces_every_kind_of_mutation() -> None:
    assert len(MUTATIONS) >= 3000
    hows = {m.how.rstrip("0123456789") for m in MUTATIONS}
    assert {
        "type",
        "missing",
        "enum-unknown",
        "enum-case",
        "bound",
        "string",
        "key",
        "insert-type",
        "insert-string",
        "exists-with-value",
        "value-from-unknown",
        "config-traversal",
        "config-too-large",
    } <= hows
    assert len({m.id for m in MUTATIONS}) == len(MUTATIONS), "mutation ids must be unique"


@pytest.mark.parametrize(("name", "doc"), list(iter_docs()), ids=[n for n, _ in iter_docs()])
def test_unmutated_samples_are_accepted(name: str, doc: dict[str, Any]) -> None:
    assert _validate(doc).errors == [], name


def test_every_mutation_is_refused_naming_the_field() -> None:
    accepted: list[str] = []
    unnamed: list[str] = []
    for m in MUTATIONS:
        errors = _validate(m.doc).errors
        if not errors:
            accepted.append(m.id)
        elif not any(related(e.path, m) for e in errors):
            unnamed.append(f"{m.id}: {[str(e) for e in errors][:3]}")
    assert not accepted, f"{len(accepted)} invalid mutations accepted, e.g. {accepted[:10]}"
    assert not unnamed, f"{len(unnamed)} refused without naming the field, e.g. {unnamed[:5]}"


def _string_fields(schema: dict[str, Any], spath: str) -> Iterator[tuple[str, str]]:
    """(schema path, "value" or "key") of every free-form string and every map of the schema."""
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string") or (kind == "string" and "enum" not in schema):
        yield spath, "value"
    elif kind == "array":
        yield from _string_fields(schema["items"], f"{spath}.*")
    elif kind == "object" and "properties" in schema:
        for name, prop in schema["properties"].items():
            yield from _string_fields(prop, f"{spath}.{name}")
    elif kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        yield spath, "key"
        yield from _string_fields(schema["additionalProperties"], f"{spath}.*")


@pytest.mark.parametrize("crd", [crdgen.nodewright_crd(), crdgen.deploymentpolicy_crd()], ids=["nw", "dp"])
def test_every_string_field_of_the_schema_has_a_fuzz_class(crd: dict[str, Any]) -> None:
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    missing = [
        f"{path} ({what})"
        for path, what in _string_fields(spec, "spec")
        if string_class(path, STRING_CLASSES if what == "value" else KEY_CLASSES) is None
    ]
    assert not missing, f"add these to tests/admission_fuzz.py: {missing}"


def test_free_text_fields_take_any_text() -> None:
    """The fields the fuzzer leaves alone (class FREE) really accept anything: file contents, env values."""
    assert {k for k, v in STRING_CLASSES.items() if v[0] == FREE} == {
        "spec.packages.*.configMap.*",
        "spec.packages.*.env.*.value",
        "**.maintenance.blackouts.*.reason",
        "**.healthGates.*.prometheus.query",  # any PromQL text (not empty: the schema's minLength)
    }
    doc = dict(iter_docs())["gpu-driver-upgrade.yaml:gpu-driver"]
    package = doc["spec"]["packages"]["nvidia-driver"]
    text = " ünïcode, spaces, tabs\t and\nnewlines; ../etc/passwd = \x00 "
    package["configMap"] = {**package["configMap"], "odd.conf": text, "empty.conf": ""}
    package["env"] = [*package["env"], {"name": "ODD", "value": text}, {"name": "EMPTY", "value": ""}]
    assert _validate(doc).errors == []


def _review(m: Mutation, operation: str, old: dict[str, Any] | None) -> dict[str, Any]:
    request: dict[str, Any] = {"uid": m.id, "operation": operation, "object": m.doc}
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def _code(answer: dict[str, Any]) -> int:
    response = answer["response"]
    return 200 if response["allowed"] else int(response["status"]["code"])


async def test_webhook_answers_every_mutation_with_a_4xx_denial() -> None:
    handlers = Handlers(_Facts())
    originals = dict(iter_docs())
    problems: list[str] = []
    for m in MUTATIONS:
        validate = (
            handlers.validate_nodewright if m.kind == "NodeWright" else handlers.validate_deploymentpolicy
        )
        mutate = handlers.mutate_nodewright if m.kind == "NodeWright" else handlers.mutate_deploymentpolicy
        created = await validate(_review(m, "CREATE", None))
        if not 400 <= _code(created) < 500:
            problems.append(f"{m.id}: CREATE answered {_code(created)}")
        updated = await validate(_review(m, "UPDATE", originals[m.sample]))
        if _code(updated) >= 500:
            problems.append(f"{m.id}: UPDATE answered {_code(updated)}")
        mutated = await mutate(_review(m, "CREATE", None))
        if _code(mutated) >= 500 or (not mutated["response"]["allowed"] and _code(mutated) < 400):
            problems.append(f"{m.id}: mutating webhook answered {_code(mutated)}")
        if created["response"]["uid"] != m.id:
            problems.append(f"{m.id}: uid not echoed")
    assert not problems, f"{len(problems)} bad answers, e.g. {problems[:10]}"
