"""`nodewright migrate` against the in-memory API server (tests/kubefake.py): what it refuses, the order
and guards of its writes, and that a second run changes nothing."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nodewright.api import nodestate
from nodewright.cli.main import main
from nodewright.cli.migrate_cmd import Migrator, Options
from nodewright.kube.client import KubeClient
from nodewright.plan import migration as m
from tests.kubefake import NODES_C, FakeKube, node
from tests.test_cli_operator import write_kubeconfig

SKYHOOKS_C = ("apis/skyhook.nvidia.com/v1alpha1", "", "skyhooks")
REF_POLICIES_C = ("apis/skyhook.nvidia.com/v1alpha1", "", "deploymentpolicies")
NODEWRIGHTS_C = ("apis/nodewright.io/v1alpha1", "", "nodewrights")
POLICIES_C = ("apis/nodewright.io/v1alpha1", "", "deploymentpolicies")
DEPLOYMENTS_C = ("apis/apps/v1", "", "deployments")


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    server = await FakeKube().start()
    yield server
    await server.stop()


def _options(**overrides: Any) -> Options:
    defaults: dict[str, Any] = {
        "apply": True,
        "allow_dropped": False,
        "our_taint": m.TaintSpec.parse("nodewright.io/runtime-required=true:NoSchedule"),
        "reference_taint": m.TaintSpec.parse(m.DEFAULT_REFERENCE_TAINT),
    }
    return Options(**{**defaults, **overrides})


async def _run(kube: FakeKube, **overrides: Any) -> int:
    async with KubeClient(kube.config(), qps=100.0, burst=100, timeout=5.0) as client:
        return await Migrator(client, _options(**overrides)).run()


def _setup(kube: FakeKube, *, extra_spec: dict[str, Any] | None = None) -> None:
    kube.put(
        REF_POLICIES_C,
        {
            "metadata": {"name": "pol"},
            "spec": {"default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}}},
        },
    )
    kube.put(
        SKYHOOKS_C,
        {
            "metadata": {"name": "stack"},
            "spec": {
                "deploymentPolicy": "pol",
                "packages": {"base": {"version": "1.0.0", "image": "ghcr.io/x/base"}},
                **(extra_spec or {}),
            },
        },
    )
    state = json.dumps(
        {"base|1.0.0": {"name": "base", "version": "1.0.0", "stage": "config", "state": "complete"}}
    )
    annotations = {m.node_state_annotation("stack"): state, m.cordon_annotation("stack"): "true"}
    kube.put(
        NODES_C, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "annotations": annotations}}
    )
    kube.put(NODES_C, node("n2"))


async def test_apply_writes_policies_then_node_states_then_nodewrights(kube: FakeKube) -> None:
    _setup(kube)
    assert await _run(kube) == 0
    writes = [
        (r.method, r.path)
        for r in kube.requests
        if r.method in ("POST", "PATCH") and "skyhook.nvidia.com" not in r.path
    ]
    assert writes == [
        ("POST", "/apis/nodewright.io/v1alpha1/deploymentpolicies"),
        ("PATCH", "/api/v1/nodes/n1"),
        ("POST", "/apis/nodewright.io/v1alpha1/nodewrights"),
    ]
    patch = next(r for r in kube.requests if r.method == "PATCH")
    assert patch.body["metadata"]["resourceVersion"], "the node write must carry its resourceVersion"
    stored = kube.get(NODES_C, "n1")
    assert stored is not None
    state = nodestate.decode(stored["metadata"]["annotations"]["nodewright.io/state.stack"])
    assert state.entry("base", "1.0.0") is not None and not state.cordoned  # n1 is schedulable: stale cordon
    nw = kube.get(NODEWRIGHTS_C, "stack")
    assert nw is not None and nw["metadata"]["annotations"][m.MIGRATED_FROM] == "Skyhook/stack"

    before = len(kube.requests)
    assert await _run(kube) == 0, "a second run is a no-op"
    assert not [r for r in kube.requests[before:] if r.method in ("POST", "PATCH", "PUT", "DELETE")]


async def test_a_conflicting_node_write_is_computed_again(kube: FakeKube) -> None:
    _setup(kube)
    kube.fail("PATCH", "/api/v1/nodes/n1", 409, body={"kind": "Status", "code": 409, "reason": "Conflict"})
    assert await _run(kube) == 0
    assert kube.count("PATCH", "/api/v1/nodes/n1") == 2
    assert kube.count("GET", "/api/v1/nodes/n1") == 1


async def test_dry_run_writes_nothing(kube: FakeKube, capsys: pytest.CaptureFixture[str]) -> None:
    _setup(kube)
    assert await _run(kube, apply=False) == 0
    assert not [r for r in kube.requests if r.method != "GET"]
    out = capsys.readouterr().out
    assert "Skyhook stack -> NodeWright stack" in out and "Removing the reference operator" in out


async def test_apply_refuses_while_the_reference_operator_runs(
    kube: FakeKube, capsys: pytest.CaptureFixture[str]
) -> None:
    _setup(kube)
    kube.put(
        DEPLOYMENTS_C,
        {
            "metadata": {"name": "controller-manager", "namespace": "skyhook"},
            "spec": {
                "replicas": 1,
                "template": {"spec": {"containers": [{"image": "nvcr.io/nvidia/skyhook/operator:v0.15.0"}]}},
            },
        },
    )
    assert await _run(kube) == 1
    assert not [r for r in kube.requests if r.method != "GET"]
    assert "scale deployment controller-manager --replicas=0" in capsys.readouterr().out


async def test_dropped_fields_need_the_explicit_flag(
    kube: FakeKube, capsys: pytest.CaptureFixture[str]
) -> None:
    _setup(kube, extra_spec={"futureKnob": True})
    assert await _run(kube) == 1
    captured = capsys.readouterr()
    assert "--allow-dropped-fields" in captured.err and "error" not in captured.out
    assert not [r for r in kube.requests if r.method != "GET"]
    assert await _run(kube, allow_dropped=True) == 0
    nw = kube.get(NODEWRIGHTS_C, "stack")
    assert nw is not None and "futureKnob" not in nw["spec"]


async def test_an_object_of_ours_that_migrate_did_not_create_is_never_touched(
    kube: FakeKube, capsys: pytest.CaptureFixture[str]
) -> None:
    _setup(kube)
    kube.put(NODEWRIGHTS_C, {"metadata": {"name": "stack"}, "spec": {"packages": {}}})
    assert await _run(kube) == 1
    captured = capsys.readouterr()
    assert "NodeWright stack already exists and was not created by migrate" in captured.err
    assert captured.err.startswith("nodewright migrate: error: ")
    assert not [r for r in kube.requests if r.method != "GET"]


async def test_a_missing_policy_makes_the_skyhook_invalid(
    kube: FakeKube, capsys: pytest.CaptureFixture[str]
) -> None:
    _setup(kube)
    kube.remove(REF_POLICIES_C, "pol")
    assert await _run(kube) == 1
    assert "DeploymentPolicy 'pol' does not exist" in capsys.readouterr().out


async def test_no_reference_objects_is_nothing_to_do(
    kube: FakeKube, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await _run(kube) == 0
    assert "nothing to migrate" in capsys.readouterr().out


async def test_a_nodewright_edited_after_the_migration_is_left_as_is(
    kube: FakeKube, capsys: pytest.CaptureFixture[str]
) -> None:
    _setup(kube)
    assert await _run(kube) == 0
    nw = kube.get(NODEWRIGHTS_C, "stack")
    assert nw is not None
    nw["spec"]["packages"]["base"]["version"] = "1.1.0"
    kube.put(NODEWRIGHTS_C, nw)
    before = len(kube.requests)
    assert await _run(kube) == 0
    assert "NodeWright stack was migrated before and has changed since: left as is" in capsys.readouterr().out
    assert not [r for r in kube.requests[before:] if r.method in ("POST", "PATCH", "PUT", "DELETE")]
    stored = kube.get(NODEWRIGHTS_C, "stack")
    assert stored is not None and stored["spec"]["packages"]["base"]["version"] == "1.1.0"


def test_an_unreachable_api_server_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    config = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    assert main(["migrate", "--kubeconfig", str(config), "--timeout", "20"]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    assert captured.out == "", "errors go to stderr, never to stdout"
    assert "cannot reach the API server" in captured.err or "timed out" in captured.err, captured.err
    assert main(["migrate", "--kubeconfig", str(tmp_path / "missing")]) == 2
    assert "cannot read kubeconfig" in capsys.readouterr().err
