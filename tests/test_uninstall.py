"""`nodewright uninstall`: what it removes from a node (pure), and a whole run against the fake API server."""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from nodewright.api import constants, nodestate
from nodewright.cli.flags import OneLineParser
from nodewright.cli.uninstall_cmd import Options, Report, Uninstaller, go_duration, node_cleanup, register
from nodewright.kube.client import KubeClient
from tests.kubefake import NODES_C, FakeKube, node

TAINT_KEY = "nodewright.io/runtime-required"
NW_C = ("apis/nodewright.io/v1alpha1", "", "nodewrights")
DP_C = ("apis/nodewright.io/v1alpha1", "", "deploymentpolicies")
DB_C = ("apis/nodewright.io/v1alpha1", "", "disruptionbudgets")
DEPLOY_C = ("apis/apps/v1", "nodewright-system", "deployments")
SECRETS_C = ("api/v1", "nodewright-system", "secrets")
CM_C = ("api/v1", "nodewright-system", "configmaps")
PODS_C = ("api/v1", "nodewright-system", "pods")
LEASES_C = ("apis/coordination.k8s.io/v1", "nodewright-system", "leases")
REVS_C = ("apis/apps/v1", "nodewright-system", "controllerrevisions")


def state(*, cordoned: bool) -> str:
    return nodestate.encode(nodestate.NodeState(cordoned=cordoned))


def ours(
    name: str = "nw1", *, cordoned: bool = False, unschedulable: bool = False, **extra: Any
) -> dict[str, Any]:
    obj = node(
        name,
        labels={constants.status_label("a"): "complete", "nodewright.io/ignore": "true", "zone": "z1"},
        spec={
            "unschedulable": unschedulable,
            "taints": [
                {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"},
                {"key": "gpu", "value": "true", "effect": "NoSchedule"},
            ],
        },
        status={
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": constants.node_condition_type("a"), "status": "True"},
            ]
        },
    )
    obj["metadata"]["annotations"] = {
        constants.state_annotation("a"): state(cordoned=cordoned),
        "nodewright.io/timing.a": "{}",
        "nodewright.io/batch.a": "x",
        constants.AUTO_TAINT_ANNOTATION: "true",
        "nodewright.io/pause": "true",  # a NodeWright-object annotation name: not ours on a node
        "other.io/keep": "1",
    }
    obj["metadata"].update(extra)
    return obj


def test_node_cleanup_removes_exactly_our_keys() -> None:
    cleanup = node_cleanup(ours(), taint_key=TAINT_KEY)
    assert cleanup.labels == (constants.status_label("a"),)
    assert cleanup.annotations == (
        constants.AUTO_TAINT_ANNOTATION,
        "nodewright.io/batch.a",
        constants.state_annotation("a"),
        "nodewright.io/timing.a",
    )
    assert cleanup.conditions == (constants.node_condition_type("a"),)
    assert cleanup.taints == ({"key": "gpu", "value": "true", "effect": "NoSchedule"},)
    assert not cleanup.uncordon and cleanup.kept_cordon is None
    patch = cleanup.metadata_patch("42")
    assert patch is not None
    assert patch["metadata"]["resourceVersion"] == "42"  # taints are a list replaced whole
    assert patch["metadata"]["labels"] == {constants.status_label("a"): None}
    assert "unschedulable" not in patch["spec"]


@pytest.mark.parametrize(
    ("cordoned_by_us", "unschedulable", "uncordon"),
    [(True, True, True), (False, True, False), (True, False, False), (False, False, False)],
)
def test_only_a_cordon_nodewright_made_is_undone(
    cordoned_by_us: bool, unschedulable: bool, uncordon: bool
) -> None:
    cleanup = node_cleanup(ours(cordoned=cordoned_by_us, unschedulable=unschedulable), taint_key=TAINT_KEY)
    assert cleanup.uncordon is uncordon
    patch = cleanup.metadata_patch("1")
    assert patch is not None
    assert ("unschedulable" in patch["spec"]) is uncordon
    if uncordon:
        assert patch["spec"]["unschedulable"] is None


def test_an_undecodable_state_keeps_the_cordon_and_says_why() -> None:
    obj = ours(unschedulable=True)
    obj["metadata"]["annotations"][constants.state_annotation("a")] = "{not json"
    cleanup = node_cleanup(obj, taint_key=TAINT_KEY)
    assert not cleanup.uncordon
    assert cleanup.kept_cordon is not None and constants.state_annotation("a") in cleanup.kept_cordon
    assert constants.state_annotation("a") in cleanup.annotations  # the key itself still goes


def test_a_node_without_our_keys_is_left_alone() -> None:
    plain = node("n", labels={"nodewright.io/ignore": "true"}, spec={"unschedulable": True})
    cleanup = node_cleanup(plain, taint_key=TAINT_KEY)
    assert cleanup.empty and cleanup.metadata_patch("1") is None


def test_durations_take_go_syntax() -> None:
    assert go_duration("0s") == 0 and go_duration("0") == 0
    assert go_duration("1h30m") == 5400 and go_duration("90s") == 90 and go_duration("250ms") == 0.25
    for bad in ("", "5", "5 m", "1d", "m5"):
        with pytest.raises(argparse.ArgumentTypeError):
            go_duration(bad)


def test_the_charts_hook_args_parse() -> None:
    parser = OneLineParser(prog="nodewright")
    register(
        cast("argparse._SubParsersAction[argparse.ArgumentParser]", parser.add_subparsers(dest="command"))
    )
    args = parser.parse_args(
        ["uninstall", "--namespace=nodewright-system", "--wait-for-package-uninstall=0s", "--timeout=300s"]
    )
    assert args.func.__module__ == "nodewright.cli.uninstall_cmd" and args.timeout == 300


# ----------------------------------------------------------------------------------------------------
# A whole run


@pytest.fixture
async def fake() -> AsyncIterator[FakeKube]:
    server = await FakeKube().start()
    yield server
    await server.stop()


def seed(fake: FakeKube) -> None:
    fake.put(NODES_C, ours("n1", cordoned=True, unschedulable=True))
    fake.put(NODES_C, ours("n2", cordoned=False, unschedulable=True))
    fake.put(NODES_C, node("n3", labels={"zone": "z"}))
    meta = {"finalizers": [constants.FINALIZER, "other.io/keep"], "deletionTimestamp": "2026-01-01T00:00:00Z"}
    fake.put(NW_C, {"metadata": {"name": "a", "finalizers": [constants.FINALIZER]}, "spec": {}})
    fake.put(NW_C, {"metadata": {"name": "b", **meta}, "spec": {}})
    fake.put(DP_C, {"metadata": {"name": "p"}, "spec": {}})
    fake.put(DB_C, {"metadata": {"name": "gpu-pool"}, "spec": {}, "status": {"slots": {"n1": "a"}}})
    fake.put(
        DEPLOY_C,
        {
            "metadata": {"name": "nw-nodewright"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app.kubernetes.io/component": "operator"}}},
        },
    )
    owned = {"labels": {constants.POD_OWNER_LABEL: constants.POD_OWNER_VALUE}}
    fake.put(PODS_C, {"metadata": {"name": "pkg-pod", **owned}})
    fake.put(PODS_C, {"metadata": {"name": "someone-else", "labels": {"app": "x"}}})
    fake.put(CM_C, {"metadata": {"name": "a-pkg-1.0.0", **owned}})
    fake.put(REVS_C, {"metadata": {"name": "a-0123456789", **owned}, "revision": 1})
    fake.put(REVS_C, {"metadata": {"name": "statefulset-rev", "labels": {"app": "x"}}, "revision": 1})
    for name in ("nodewright-operator-signing-key", "nodewright-webhook-tls", "unrelated"):
        fake.put(SECRETS_C, {"metadata": {"name": name}})
    fake.put(LEASES_C, {"metadata": {"name": "nodewright-operator"}})


async def run(fake: FakeKube, **options: Any) -> Report:
    report = Report(emit=lambda line: None)
    async with KubeClient(fake.config()) as client:
        opts = Options(
            namespace="nodewright-system", operator_deployment="nw-nodewright", gone_within=0.5, **options
        )
        await Uninstaller(client, opts, report).run()
    return report


async def test_a_run_releases_everything_and_only_what_is_ours(fake: FakeKube) -> None:
    seed(fake)
    report = await run(fake)
    # The operator was stopped before anything was released.
    assert fake.objects[DEPLOY_C]["nw-nodewright"]["spec"]["replicas"] == 0
    scale = next(i for i, r in enumerate(fake.requests) if r.path.endswith("/scale"))
    first_node_write = next(
        i for i, r in enumerate(fake.requests) if r.method == "PATCH" and "/nodes/" in r.path
    )
    assert scale < first_node_write
    # NodeWright a: deleted (the fake removes it at once); b kept by another finalizer, ours released.
    assert "a" not in fake.objects[NW_C]
    assert fake.objects[NW_C]["b"]["metadata"]["finalizers"] == ["other.io/keep"]
    assert any("still exists (finalizers of others: other.io/keep)" in p for p in report.problems)
    assert fake.objects[DP_C] == {}
    assert fake.objects[DB_C] == {}  # its slots named NodeWrights that are gone
    assert "DisruptionBudget gpu-pool: deleted" in report.lines
    n1, n2, n3 = (fake.objects[NODES_C][n] for n in ("n1", "n2", "n3"))
    for obj in (n1, n2):
        assert list(obj["metadata"]["labels"]) == ["nodewright.io/ignore", "zone"]
        assert sorted(obj["metadata"]["annotations"]) == ["nodewright.io/pause", "other.io/keep"]
        assert [t["key"] for t in obj["spec"]["taints"]] == ["gpu"]
    assert "unschedulable" not in n1["spec"]  # NodeWright cordoned n1
    assert n2["spec"]["unschedulable"] is True  # someone else cordoned n2
    assert n3["metadata"]["labels"] == {"zone": "z"}
    condition_patches = [r.body for r in fake.requests if r.path.endswith("/status")]
    assert {"type": constants.node_condition_type("a"), "$patch": "delete"} in condition_patches[0]["status"][
        "conditions"
    ]
    assert sorted(fake.objects[PODS_C]) == ["someone-else"]
    assert fake.objects[CM_C] == {}
    assert sorted(fake.objects[REVS_C]) == ["statefulset-rev"], "only the NodeWrights' revisions go"
    assert sorted(fake.objects[SECRETS_C]) == ["unrelated"]
    assert fake.objects[LEASES_C] == {}


async def test_a_dry_run_changes_nothing(fake: FakeKube) -> None:
    seed(fake)
    before = {c: {k: dict(v) for k, v in objs.items()} for c, objs in fake.objects.items()}
    report = await run(fake, dry_run=True)
    assert not [r for r in fake.requests if r.method != "GET"]
    assert {c: {k: dict(v) for k, v in objs.items()} for c, objs in fake.objects.items()} == before
    assert (
        "node n1: removed 1 label(s), 4 annotation(s), 1 condition(s), the runtime-required taint; uncordoned"
        in (report.lines)
    )


async def test_a_conflict_on_a_node_is_read_again(fake: FakeKube) -> None:
    seed(fake)
    fake.fail("PATCH", "/nodes/n1", status=409, times=1)
    await run(fake)
    assert "unschedulable" not in fake.objects[NODES_C]["n1"]["spec"]
    assert not (fake.objects[NODES_C]["n1"]["metadata"].get("annotations") or {}).get(
        constants.state_annotation("a")
    )


async def test_without_our_crds_the_nodes_and_namespace_are_still_cleaned(fake: FakeKube) -> None:
    """CRDs already deleted (or never installed): the API server answers 404 for the kinds; nothing fails."""
    seed(fake)
    fake.fail("GET", "/apis/nodewright.io/", 404, times=100)
    report = await run(fake)
    assert report.problems == []
    assert "unschedulable" not in fake.objects[NODES_C]["n1"]["spec"]
    assert sorted(fake.objects[SECRETS_C]) == ["unrelated"]


# ----------------------------------------------------------------------------------------------------
# The API server cannot be reached (the chart's pre-delete hook during an outage)


async def test_an_unreachable_api_server_is_one_line_and_exit_1(tmp_path: Path) -> None:
    from tests.test_cli_operator import assert_clean, free_port, run_to_exit, write_kubeconfig

    server = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused
    kubeconfig = write_kubeconfig(tmp_path / "kc", server)
    exited = await run_to_exit(
        [sys.executable, "-m", "nodewright", "uninstall", f"--kubeconfig={kubeconfig}"], within=120
    )
    assert exited.code == 1, exited.stderr
    assert len(exited.lines) == 1, exited.stderr
    line = exited.lines[0]
    assert line.startswith(f"nodewright uninstall: cannot reach the API server {server} ("), line
    assert "nothing was changed; check --kubeconfig" in line
    assert_clean(exited.stderr)
