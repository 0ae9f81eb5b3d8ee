"""The admission webhook over HTTP (aiohttp test server, no cluster): malformed bodies get a 400 with a
denied AdmissionReview naming the field, malformed objects a 422 denial naming the field path -- on the
mutating endpoints too -- and never a 500; UPDATEs that leave the spec unchanged are not re-validated.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from nodewright.webhook.server import PATHS, build_app

NW_PATHS = (PATHS["validate-nodewright"], PATHS["mutate-nodewright"])
ALL_PATHS = tuple(PATHS.values())


class _Facts:
    async def policy_exists(self, name: str) -> bool:
        return True

    async def nodewrights_using_policy(self, name: str) -> list[str]:
        return []

    async def package_present(self, nodewright: str, package: str) -> bool:
        return False


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(build_app(_Facts()))) as c:
        yield c


def _review(obj: Any, *, operation: str = "CREATE", old: Any = None) -> dict[str, Any]:
    request: dict[str, Any] = {"uid": "u-1", "operation": operation, "object": obj}
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def _nw(spec: Any, name: str = "nw") -> dict[str, Any]:
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": name},
        "spec": spec,
    }


VALID_SPEC = {
    "nodeSelectors": {"matchLabels": {"pool": "gpu"}},
    "interruptionBudget": {"count": 1},
    "packages": {"drv": {"version": "1.0.0", "image": "ghcr.io/x/drv"}},
}


@pytest.mark.parametrize("path", ALL_PATHS)
@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "<body>"),
        (b"\xff\xfe", "<body>"),
        (b"[" * 100_000 + b"]" * 100_000, "<body>"),
        (b"[]", "<body>"),
        (b'"x"', "<body>"),
        (b"null", "<body>"),
        (b'{"request": "x"}', "request"),
        (b'{"request": {"uid": 5, "operation": "CREATE", "object": {}}}', "request.uid"),
        (b'{"request": {"uid": "u", "operation": "EXPLODE", "object": {}}}', "request.operation"),
        (b'{"request": {"uid": "u", "operation": "CREATE"}}', "request.object"),
        (
            b'{"request": {"uid": "u", "operation": "UPDATE", "object": {}, "oldObject": 5}}',
            "request.oldObject",
        ),
    ],
)
async def test_malformed_bodies_get_400_naming_the_field(
    client: TestClient[Any, Any], path: str, body: bytes, field: str
) -> None:
    resp = await client.post(path, data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 400
    answer = await resp.json()
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 400
    assert f"* {field}: " in answer["response"]["status"]["message"]


@pytest.mark.parametrize("path", NW_PATHS)
@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (_nw("x"), "spec"),
        (_nw({**VALID_SPEC, "packages": []}), "spec.packages"),
        (_nw({**VALID_SPEC, "packages": {"drv": 5}}), "spec.packages[drv]"),
        ("a string", "<root>"),
        ([_nw(VALID_SPEC)], "<root>"),
    ],
)
async def test_malformed_objects_are_denied_with_422_by_both_endpoints(
    client: TestClient[Any, Any], path: str, obj: Any, field: str
) -> None:
    resp = await client.post(path, json=_review(obj))
    assert resp.status == 200
    answer = (await resp.json())["response"]
    assert answer["uid"] == "u-1"
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 422
    assert f"* {field}: " in answer["status"]["message"]


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"kind": "NodeWright", "spec": VALID_SPEC}, "metadata"),
        (_nw({**VALID_SPEC, "serial": "yes"}), "spec.serial"),
        (_nw({**VALID_SPEC, "priority": 2**63}), "spec.priority"),
        (_nw({**VALID_SPEC, "packages": {"drv": {"version": 1, "image": 2}}}), "spec.packages[drv].version"),
        (_nw(VALID_SPEC, name=""), "metadata.name"),
        (_nw(VALID_SPEC, name="Upper_Case"), "metadata.name"),
    ],
)
async def test_wrong_types_and_missing_metadata_are_denied_naming_the_field(
    client: TestClient[Any, Any], obj: Any, field: str
) -> None:
    resp = await client.post(PATHS["validate-nodewright"], json=_review(obj))
    answer = (await resp.json())["response"]
    assert (resp.status, answer["allowed"], answer["status"]["code"]) == (200, False, 422)
    assert f"* {field}: " in answer["status"]["message"]


async def test_malformed_policy_is_denied_by_the_mutating_endpoint(client: TestClient[Any, Any]) -> None:
    policy = {
        "kind": "DeploymentPolicy",
        "metadata": {"name": "p"},
        "spec": {"default": 3, "compartments": {}},
    }
    resp = await client.post(PATHS["mutate-deploymentpolicy"], json=_review(policy))
    answer = (await resp.json())["response"]
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 422
    assert "* spec.default: must be an object" in answer["status"]["message"]
    assert "* spec.compartments: must be a list" in answer["status"]["message"]


async def test_valid_object_is_allowed_and_patched(client: TestClient[Any, Any]) -> None:
    resp = await client.post(PATHS["mutate-nodewright"], json=_review(_nw(VALID_SPEC)))
    answer = (await resp.json())["response"]
    assert answer["allowed"] is True
    assert json.loads(base64.b64decode(answer["patch"])) == [
        {"op": "add", "path": "/spec/packages/drv/name", "value": "drv"}
    ]
    resp = await client.post(PATHS["validate-nodewright"], json=_review(_nw(VALID_SPEC)))
    assert (await resp.json())["response"]["allowed"] is True


async def test_update_with_unchanged_spec_is_not_revalidated(client: TestClient[Any, Any]) -> None:
    """An object stored under older rules (here: a toleration Kubernetes refuses) can still get metadata
    changes -- the operator removing its finalizer, pause/disable annotations -- but no spec change that
    keeps the problem."""
    stored = _nw({**VALID_SPEC, "additionalTolerations": [{"operator": "Exists", "value": "x"}]})
    paused = {**stored, "metadata": {**stored["metadata"], "annotations": {"nodewright.io/pause": "true"}}}
    resp = await client.post(
        PATHS["validate-nodewright"], json=_review(paused, operation="UPDATE", old=stored)
    )
    assert (await resp.json())["response"]["allowed"] is True
    edited = {**paused, "spec": {**paused["spec"], "priority": 5}}
    resp = await client.post(
        PATHS["validate-nodewright"], json=_review(edited, operation="UPDATE", old=stored)
    )
    answer = (await resp.json())["response"]
    assert answer["allowed"] is False
    assert "* spec.additionalTolerations[0].value: value must be empty" in answer["status"]["message"]
    # The same object as a CREATE is refused: ratcheting is for stored objects only.
    resp = await client.post(PATHS["validate-nodewright"], json=_review(stored))
    assert (await resp.json())["response"]["allowed"] is False


def _gated_policy(secret: str) -> dict[str, Any]:
    gate = {
        "name": "xid",
        "prometheus": {
            "urlSecretRef": {"name": secret, "key": "url"},
            "query": 'sum(xid{node=~"$NODES"}) or vector(0)',
            "comparison": "<",
            "threshold": "1",
        },
    }
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DeploymentPolicy",
        "metadata": {"name": "gpu-policy"},
        "spec": {
            "default": {
                "budget": {"count": 1},
                "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1}},
                "healthGates": [gate],
            }
        },
    }


async def test_a_gate_secret_the_chart_does_not_let_the_operator_read_is_refused() -> None:
    """The chart grants the operator `get` on the Secrets of `healthGates.secretNames` only, and tells
    the webhook (`--gate-secret-names`): a Prometheus gate naming another Secret could never be evaluated
    (it would hold, then halt, every rollout), so it is refused with one line naming the policy, the
    field and the remedy. A webhook not told the list checks nothing."""
    app = build_app(_Facts(), gate_secrets=frozenset({"prometheus-url"}))
    async with TestClient(TestServer(app)) as c:
        listed = await c.post(
            PATHS["validate-deploymentpolicy"], json=_review(_gated_policy("prometheus-url"))
        )
        assert (await listed.json())["response"]["allowed"] is True
        other = await c.post(PATHS["validate-deploymentpolicy"], json=_review(_gated_policy("team-secret")))
        answer = (await other.json())["response"]
    assert answer["allowed"] is False and answer["status"]["code"] == 422
    assert answer["status"]["message"] == (
        "DeploymentPolicy 'gpu-policy' is invalid:\n"
        "* spec.default.healthGates[0].prometheus.urlSecretRef.name: the operator may not read Secret"
        " 'team-secret' (the chart's healthGates.secretNames lists prometheus-url): add it there"
        " (helm upgrade) or name a listed Secret"
    )
    async with TestClient(TestServer(build_app(_Facts()))) as c:
        unchecked = await c.post(
            PATHS["validate-deploymentpolicy"], json=_review(_gated_policy("team-secret"))
        )
        assert (await unchecked.json())["response"]["allowed"] is True
