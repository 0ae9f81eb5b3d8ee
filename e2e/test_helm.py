"""The chart as users get it: packaged, pushed to an OCI registry, installed, upgraded and uninstalled by a
real helm on a control plane of its own (e2e/helm_support.py).

- The registry is Debian's docker-registry (distribution/distribution), unpacked by hack/debian/fetch.sh
  and started on 127.0.0.1 by the test; `helm push` and `helm install oci://127.0.0.1:PORT/...` use it
  over plain HTTP, as they would any registry (the reference distributes its chart the same way).
- `helm upgrade` to a chart whose CRD changed updates the CRD in the cluster (CRDs are templates).
- `helm uninstall` with no operator running: the pre-delete hook (run by `HookRunner` under its own
  ServiceAccount) releases a NodeWright that still carries the operator's finalizer and strips every key
  of ours from the node it had cordoned; the CRDs stay (crds.keep) and deleting them completes at once.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.helm_support import (
    CHART,
    NAMESPACE,
    REPO,
    ChartCluster,
    HookRunner,
    chart_cluster,
    exists,
    node_leftovers,
    scratch_root,
    stop_chart_cluster,
    wait_gone,
)
from nodewright.api import constants, nodestate
from nodewright.sim import fleet
from nodewright.sim.controlplane import free_port
from nodewright.sim.kubeapi import KubeClient

pytestmark = pytest.mark.timeout(600)

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.fixture(scope="module")
def chart() -> Iterator[ChartCluster]:
    cluster = chart_cluster(scratch_root("nodewright-helm-"))
    try:
        yield cluster
    finally:
        stop_chart_cluster(cluster)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def registry(chart: ChartCluster) -> Iterator[str]:
    """`127.0.0.1:PORT` of a local OCI registry (Debian's docker-registry), stopped at the end."""
    fetched = subprocess.run(
        ["bash", str(REPO / "hack" / "debian" / "fetch.sh"), "registry", "docker-registry"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    binary = Path(fetched.stdout.strip().splitlines()[-1]) / "usr" / "bin" / "docker-registry"
    port = free_port()
    config = chart.root / "registry.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "warn"},
                "storage": {"filesystem": {"rootdirectory": str(chart.root / "registry")}},
                "http": {"addr": f"127.0.0.1:{port}"},
            }
        )
    )
    log = (chart.root / "registry.log").open("wb")
    proc = subprocess.Popen([str(binary), "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not _answers(f"http://127.0.0.1:{port}/v2/"):
            assert proc.poll() is None, (chart.root / "registry.log").read_text()
            assert time.monotonic() < deadline, "registry did not start"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def changed_chart(work: Path, version: str) -> Path:
    """A copy of the chart at `version` whose NodeWright CRD has one more printer column."""
    copy = work / f"chart-{version}" / "nodewright"
    shutil.copytree(CHART, copy)
    meta = yaml.safe_load((copy / "Chart.yaml").read_text())
    meta["version"] = version
    (copy / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    crd_file = copy / "files" / "crds" / "nodewright.io_nodewrights.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    crd["spec"]["versions"][0].setdefault("additionalPrinterColumns", []).append(
        {"name": "Upgraded", "type": "string", "jsonPath": ".metadata.name", "priority": 1}
    )
    crd_file.write_text(yaml.safe_dump(crd, sort_keys=False))
    return copy


def pushed(chart: ChartCluster, registry: str, source: Path, work: Path) -> None:
    out = work / "packages"
    out.mkdir(exist_ok=True)
    packaged = chart.helm.run("package", str(source), "-d", str(out)).stdout
    archive = packaged.strip().split(": ")[-1]
    chart.helm.run("push", archive, f"oci://{registry}/charts", "--plain-http")


async def test_oci_chart_installs_upgrades_and_uninstalls_clean(
    chart: ChartCluster, registry: str, tmp_path: Path
) -> None:
    helm, plane = chart.helm, chart.plane
    reference = f"oci://{registry}/charts/nodewright"
    pushed(chart, registry, CHART, tmp_path)
    shown = yaml.safe_load(helm.run("show", "chart", reference, "--version", "0.1.0", "--plain-http").stdout)
    assert shown["name"] == "nodewright" and shown["version"] == "0.1.0"
    # The webhook is off here: its Service has no endpoints on a control plane without kube-proxy.
    helm.run(
        "install", "nw", reference, "--version", "0.1.0", "--plain-http", "-n", NAMESPACE,
        "--set", "webhook.enabled=false",
    )  # fmt: skip
    async with KubeClient(plane.kubeconfig) as kube:
        crd = await kube.get(f"{CRD_PATH}/nodewrights.nodewright.io")
        assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == "nw"
        deployment = await kube.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/nw-nodewright")
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":0.1.0")

        # helm upgrade updates the CRD.
        pushed(chart, registry, changed_chart(tmp_path, "0.1.1"), tmp_path)
        helm.run(
            "upgrade",
            "nw",
            reference,
            "--version",
            "0.1.1",
            "--plain-http",
            "-n",
            NAMESPACE,
            "--reuse-values",
        )
        crd = await kube.get(f"{CRD_PATH}/nodewrights.nodewright.io")
        columns = [c["name"] for c in crd["spec"]["versions"][0].get("additionalPrinterColumns") or []]
        assert "Upgraded" in columns, columns

        # What an operator that is gone left behind: a NodeWright with its finalizer, a node it cordoned.
        (name,) = await fleet.create_nodes(plane.kubeconfig, count=1, name_prefix="hl")
        await kube.create(
            "/apis/nodewright.io/v1alpha1/nodewrights",
            {
                "apiVersion": "nodewright.io/v1alpha1",
                "kind": "NodeWright",
                "metadata": {"name": "left", "finalizers": [constants.FINALIZER]},
                "spec": {
                    "nodeSelectors": {"matchLabels": {fleet.FLEET_LABEL: "hl"}},
                    "packages": {"pkg": {"version": "1.0.0", "image": "ghcr.io/example/pkg"}},
                },
            },
        )
        state = nodestate.encode(nodestate.NodeState(cordoned=True))
        await kube.merge_patch(
            f"/api/v1/nodes/{name}",
            {
                "metadata": {
                    "labels": {constants.status_label("left"): "in_progress"},
                    "annotations": {constants.state_annotation("left"): state},
                },
                "spec": {"unschedulable": True},
            },
        )
        condition = {"type": constants.node_condition_type("left"), "status": "False", "reason": "InProgress"}
        await kube.strategic_patch(f"/api/v1/nodes/{name}/status", {"status": {"conditions": [condition]}})

        async with HookRunner(kube, plane, NAMESPACE, tmp_path) as runner:
            done = await asyncio.to_thread(
                helm.run, "uninstall", "nw", "-n", NAMESPACE, "--wait", "--timeout", "2m", check=False
            )
        output = "\n".join(r.output for r in runner.runs)
        assert done.returncode == 0, f"{done.stderr}\n{output}"
        assert [r.returncode for r in runner.runs] == [0], output
        assert "NodeWright left: finalizer released" in output, output
        node = await kube.get(f"/api/v1/nodes/{name}")
        assert node_leftovers(node) == [] and not node["spec"].get("unschedulable"), node
        assert not await exists(kube, "/apis/nodewright.io/v1alpha1/nodewrights/left")
        assert not await exists(kube, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/nw-nodewright")
        # crds.keep (the default): the CRDs stay, and deleting them does not hang on a finalizer.
        for crd_name in ("nodewrights.nodewright.io", "deploymentpolicies.nodewright.io"):
            assert await exists(kube, f"{CRD_PATH}/{crd_name}")
            await kube.delete(f"{CRD_PATH}/{crd_name}")
            await wait_gone(kube, f"{CRD_PATH}/{crd_name}", within=30)
