"""Roles for people, proven on a real API server (helm/nodewright/templates/user-rbac.yaml, docs/security.md).

On a control plane of its own (e2e/helm_support.py, audit log on, the clusterrole-aggregation controller
running), `helm install` puts the chart in with a ServiceAccount listed in
`rbac.userRoles.pluginViewers`. With a bound token of that ServiceAccount, `kubectl-nodewright` runs as
an SRE runs it:

- every read-only verb succeeds (exit 0), and the audit log shows not one 403 for it;
- every write verb is refused by the API server (exit 1, one line naming RBAC), each set up so that it
  would write, and afterwards no NodeWright or node has changed; the 403s in the audit log are all writes.

The aggregated roles: a ServiceAccount bound to the built-in `view` reads NodeWrights,
DeploymentPolicies and DisruptionBudgets and changes none; one bound to `edit` changes them; neither
gains anything on nodes (the chart does not widen `view` or `edit` beyond its own kinds).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.helm_support import (
    CHART,
    NAMESPACE,
    ChartCluster,
    chart_cluster,
    scratch_root,
    service_account_kubeconfig,
    service_account_user,
    stop_chart_cluster,
)
from e2e.operator_fixture import nodewright_manifest, package
from nodewright.controller.logstore import KeptLog, store_name
from nodewright.sim import fleet
from nodewright.sim.kubeapi import JSON, KubeClient

pytestmark = pytest.mark.timeout(600)

PLUGIN = Path(sys.executable).with_name("kubectl-nodewright")
RELEASE = "nw"
VIEWER = "sre-viewer"
NW_API = "/apis/nodewright.io/v1alpha1"
ERRORING = {"v": 1, "p": {"tune|1.0.0": {"s": "apply", "t": "erroring", "n": 3, "e": "exit 1: boom"}}}
ADMISSION = {"c": "__default__", "b": 1, "o": 0, "f": "x", "at": "2026-01-01T00:00:00Z", "d": True}


@pytest.fixture(scope="module")
def chart() -> Iterator[ChartCluster]:
    """The chart installed (no webhook: nothing here needs admission) with the viewer ServiceAccount bound
    to the plugin's viewer role through `rbac.userRoles.pluginViewers`."""
    cluster = chart_cluster(
        scratch_root("nodewright-viewer-"), controllers=["clusterrole-aggregation-controller"]
    )
    try:
        subject = "rbac.userRoles.pluginViewers[0]"
        cluster.helm.run(
            "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
            "--set", "webhook.enabled=false", "--set", f"{subject}.kind=ServiceAccount",
            "--set", f"{subject}.name={VIEWER}", "--set", f"{subject}.namespace={NAMESPACE}",
        )  # fmt: skip
        yield cluster
    finally:
        stop_chart_cluster(cluster)


def run_plugin(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and "proxy" not in k.lower()}
    return subprocess.run(
        [str(PLUGIN), *args, "--kubeconfig", str(kubeconfig), "-n", NAMESPACE, "--request-timeout", "20"],
        capture_output=True, text=True, timeout=120, check=False, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip


async def plugin(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_plugin, kubeconfig, *args)


async def setup_objects(kube: KubeClient, kubeconfig: Path) -> tuple[str, str]:
    """A policy, two NodeWrights (one paused and disabled), two nodes with state: every write verb has
    something to write. Returns (node with an erroring package, node with the ignore label)."""
    await kube.create(
        f"{NW_API}/deploymentpolicies",
        {
            "apiVersion": "nodewright.io/v1alpha1",
            "kind": "DeploymentPolicy",
            "metadata": {"name": "rv-policy"},
            "spec": {"default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}}},
        },
    )
    pkg = package(configMap={"sysctl.conf": "vm.swappiness=10\n"})
    await kube.create(
        f"{NW_API}/nodewrights",
        nodewright_manifest("rv-nw", fleet_prefix="rv", packages={"tune": pkg}, deploymentPolicy="rv-policy"),
    )
    held = nodewright_manifest(
        "rv-held", fleet_prefix="rv", packages={"tune": pkg},
        annotations={"nodewright.io/pause": "true", "nodewright.io/disable": "true"},
    )  # fmt: skip
    await kube.create(f"{NW_API}/nodewrights", held)
    status = {"status": {"compartmentStatuses": {"__default__": {"awaitingApproval": 1}}}}
    await kube.merge_patch(f"{NW_API}/nodewrights/rv-nw/status", status)
    erroring, ignored = await fleet.create_nodes(kubeconfig, count=2, name_prefix="rv")
    await kube.merge_patch(
        f"/api/v1/nodes/{erroring}",
        {
            "metadata": {
                "annotations": {
                    "nodewright.io/state.rv-nw": json.dumps(ERRORING),
                    "nodewright.io/batch.rv-nw": json.dumps(ADMISSION),
                },
                "labels": {"nodewright.io/status.rv-nw": "erroring"},
            }
        },
    )
    await kube.merge_patch(
        f"/api/v1/nodes/{ignored}", {"metadata": {"labels": {"nodewright.io/ignore": "true"}}}
    )
    kept = KeptLog(
        package="tune", version="1.0.0", stage="apply", outcome="failed", pod="p", attempt=3,
        container="tune-apply", exit_code=1, reason="Error", at="2026-01-01T00:00:00Z", log="boom\n",
    )  # fmt: skip
    await kube.create(
        f"/api/v1/namespaces/{NAMESPACE}/configmaps",
        {"metadata": {"name": store_name("rv-nw", erroring)}, "data": {kept.key: kept.encode()}},
    )
    return erroring, ignored


async def snapshot(kube: KubeClient) -> JSON:
    """What a write verb would change: NodeWright metadata and spec, node metadata and cordon."""
    nws = (await kube.list_all(f"{NW_API}/nodewrights"))["items"]
    nodes = (await kube.list_all("/api/v1/nodes", params={"labelSelector": f"{fleet.FLEET_LABEL}=rv"}))[
        "items"
    ]
    return {
        "nodewrights": {o["metadata"]["name"]: (o["metadata"].get("annotations"), o["spec"]) for o in nws},
        "nodes": {
            o["metadata"]["name"]: (
                o["metadata"].get("labels"),
                o["metadata"].get("annotations"),
                o["spec"].get("unschedulable"),
            )
            for o in nodes
        },
    }


async def access(kube: KubeClient, user: str, verb: str, resource: str, group: str = "nodewright.io") -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
            "resourceAttributes": {"group": group, "resource": resource, "verb": verb},
        },
    }
    answer = await kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(answer["status"].get("allowed"))


async def test_a_viewer_reads_everything_the_plugin_shows_and_changes_nothing(
    chart: ChartCluster, tmp_path: Path
) -> None:
    plane = chart.plane
    async with KubeClient(plane.kubeconfig) as kube:
        await kube.create(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {"metadata": {"name": VIEWER}})
        viewer = await service_account_kubeconfig(
            kube, plane, namespace=NAMESPACE, name=VIEWER, path=tmp_path / "viewer.kubeconfig"
        )
        node, ignored = await setup_objects(kube, plane.kubeconfig)
        before = await snapshot(kube)
        user = service_account_user(NAMESPACE, VIEWER)

        reads = [
            ("status",), ("status", "rv-nw"), ("node", "list"), ("node", "list", "rv-nw"),
            ("node", "status", node), ("package", "status", "rv-nw"), ("package", "status", "rv-nw", "tune"),
            ("package", "logs", "rv-nw", "tune", "--node", node), ("policy", "show", "rv-policy"),
            ("why", node, "rv-nw"), ("watch", "--once"), ("plan", "rv-nw"), ("consistency",),
            ("consistency", "rv-nw"), ("version",),
        ]  # fmt: skip
        for args in reads:
            done = await plugin(viewer, *args)
            assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        logs = await plugin(viewer, "package", "logs", "rv-nw", "tune", "--node", node)
        assert "boom" in logs.stdout
        version = await plugin(viewer, "version")
        assert f"Operator Version: 0.1.0 (deployment {NAMESPACE}/nw-nodewright" in version.stdout, (
            version.stdout
        )
        assert chart.audit.requests_by(user) > 0
        assert chart.audit.forbidden([user]) == [], "a read-only verb needed more than the viewer role"

        writes = [
            ("pause", "rv-nw"), ("disable", "rv-nw"), ("resume", "rv-held"), ("enable", "rv-held"),
            ("approve", "rv-nw"), ("node", "ignore", node), ("node", "unignore", ignored),
            ("node", "retry", node, "rv-nw", "-y"), ("node", "reset", node, "rv-nw", "-y"),
            ("package", "rerun", "rv-nw", "tune", "--nodes", node, "-y"), ("policy", "reset", "rv-nw", "-y"),
        ]  # fmt: skip
        for args in writes:
            done = await plugin(viewer, *args)
            assert done.returncode == 1, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
            assert done.stderr.count("\n") == 1 and "forbidden" in done.stderr.lower(), (args, done.stderr)
            assert "check RBAC" in done.stderr, (args, done.stderr)
        assert await snapshot(kube) == before, "a viewer changed something"
        refused = chart.audit.forbidden([user])
        assert len(refused) >= len(writes)
        assert all(entry.split()[1] in ("patch", "update", "create", "delete") for entry in refused), refused


async def test_view_and_edit_gain_our_kinds_and_nothing_else(chart: ChartCluster) -> None:
    async with KubeClient(chart.plane.kubeconfig) as kube:
        for name, role in (("team-view", "view"), ("team-edit", "edit")):
            await kube.create_or_exists(
                f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {"metadata": {"name": name}}
            )
            binding = {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"rv-{name}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}],
            }
            await kube.create_or_exists("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
        viewer, editor = (service_account_user(NAMESPACE, n) for n in ("team-view", "team-edit"))

        async def aggregated() -> bool:
            return await access(kube, viewer, "list", "nodewrights") and await access(
                kube, editor, "patch", "nodewrights"
            )

        await fleet.wait_for(aggregated, within=60, what="view and edit aggregating the chart's roles")
        for resource in ("nodewrights", "deploymentpolicies", "disruptionbudgets"):
            for verb in ("get", "list", "watch"):
                assert await access(kube, viewer, verb, resource), (verb, resource)
            for verb in ("create", "patch", "delete"):
                assert not await access(kube, viewer, verb, resource), (verb, resource)
                assert await access(kube, editor, verb, resource), (verb, resource)
        assert not await access(kube, editor, "patch", "nodewrights/status")
        for who in (viewer, editor):
            assert not await access(kube, who, "list", "nodes", group=""), "view/edit must not gain nodes"
            assert not await access(kube, who, "patch", "nodes", group="")
