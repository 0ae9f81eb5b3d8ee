"""The real-node lane: the chart, the operator, the webhook and package pods on real kubelets (issue 30).

A control plane with four real nodes (a real kubelet and containerd each, in a box: docs/simulator.md,
"Real nodes") and two kwok nodes, the project's images built and pushed to the simulator's registry, the
chart installed from that registry (OCI) with the real `helm` (e2e/realnode_support.py). Then, in order:

1. the operator and webhook run as pods of the project's images, pulled from the local registry, on the
   system node; the API server calls the webhook through its Service; `kubectl logs` of the operator
   goes through the real kubelet;
2. a DeploymentPolicy rollout of the reference packages `shell`, `tuning` (a reboot) and `bind-mount`
   (a service interrupt: a mount unit restarted by the node's init) over the three real target nodes and
   the two kwok nodes, to completion, with the invariant monitor watching: a protected pod is waited for
   before its node is touched, a real Deployment's pod is drained through its PodDisruptionBudget, each
   real node rebooted (a new boot ID, the kubelet started again), and every file the packages promise is
   read back from the nodes' roots, the running values from inside the boxes;
3. `kubectl logs` of a package pod and `kubectl nodewright package logs` through the real kubelet;
4. drift injected by hand into one box (a tuned sysctl changed in the running node) is detected (the
   node labelled `drifted`, nothing cordoned) and, with `action: reapply`, repaired through the batches;
5. `helm uninstall`: its pre-delete hook runs as a Job's pod on a real node and leaves every node clean;
6. after `sim down`, the machine is exactly as before (e2e/machine.py).

Needs root and `make realnode` (both given in CI by .ci/run); about five minutes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from e2e.invariants import InvariantMonitor
from e2e.realnode_support import (
    NAMESPACE,
    OPERATOR_IMAGE,
    SLEEPER_IMAGE,
    SYSTEM_NODE,
    TARGET_LABEL,
    VERSION,
    RealLane,
    package_image,
    package_version,
)
from nodewright.sim import fleet
from nodewright.sim.kubeapi import JSON, ApiError, KubeClient

# One event loop for the module: the invariant monitor watches every test from the rollout to the uninstall.
pytestmark = [pytest.mark.timeout(900), pytest.mark.real_nodes, pytest.mark.asyncio(loop_scope="module")]

NW = "real-rollout"
POLICY = "real-batches"
APPS = "e2e-apps"
PROTECTED = ("e2e.nodewright.io/protected", "true")
MOUNT_UNIT = "mnt-nwdata.mount"
NW_PATH = "/apis/nodewright.io/v1alpha1/nodewrights"


@pytest.fixture(scope="module")
def lane() -> Iterator[RealLane]:
    if os.geteuid() != 0:
        pytest.skip("real nodes need root (namespaces, mounts, cgroups): the lane runs as root in CI")
    started = RealLane.start()
    try:
        yield started
    finally:
        changed = started.stop()
        assert not changed, "the real-node run changed the machine:\n" + "\n".join(changed[:60])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def kube(lane: RealLane) -> AsyncIterator[KubeClient]:
    async with KubeClient(lane.kubeconfig) as client:
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def monitor(lane: RealLane) -> AsyncIterator[InvariantMonitor]:
    """The fleet-safety monitor (docs/invariants.md), from the rollout until the chart is uninstalled:
    `test_helm_uninstall_leaves_every_node_clean` checks it before uninstalling."""
    watching = InvariantMonitor(lane.kubeconfig, namespace=NAMESPACE)
    await watching.start()
    try:
        yield watching
    finally:
        await watching.stop()


# ----------------------------------------------------------------------------------------------------
# 1. The chart's pods


async def test_operator_and_webhook_run_as_pods_of_the_project_images(
    lane: RealLane, kube: KubeClient
) -> None:
    pods = (await kube.list_all(f"/api/v1/namespaces/{NAMESPACE}/pods"))["items"]
    chart_pods = [p for p in pods if p["metadata"]["name"].startswith("nodewright")]
    roles = sorted(p["spec"]["containers"][0]["args"][0] for p in chart_pods)
    assert roles == ["operator", "operator", "webhook", "webhook"], roles
    for pod in chart_pods:
        assert pod["spec"]["nodeName"] == SYSTEM_NODE, pod["metadata"]["name"]
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["image"] == OPERATOR_IMAGE, status
        # The kubelet pulled exactly what was pushed to the simulator's registry.
        assert status["imageID"].endswith(lane.digests[OPERATOR_IMAGE]), (status["imageID"], lane.digests)
        print(f"[real-nodes] {pod['metadata']['name']} runs {status['image']} ({status['imageID']})")
    # The mutating webhook fills each package's name: the API server reached it through its Service.
    created = await kube.create(
        NW_PATH,
        nodewright(
            "webhook-probe",
            {"shell": {"version": package_version("shell"), "image": package_image("shell")}},
            paused=True,
        ),
    )
    assert created["spec"]["packages"]["shell"]["name"] == "shell", created["spec"]
    await kube.delete(f"{NW_PATH}/webhook-probe")
    # The operator's log, through the real kubelet of the system node.
    leader = lane.kubectl("-n", NAMESPACE, "logs", "-l", "app.kubernetes.io/component=operator", "--tail=-1")
    assert "acquired leadership" in leader.stdout, leader.stdout[-2000:]


# ----------------------------------------------------------------------------------------------------
# 2. The rollout


async def test_reference_packages_roll_out_over_real_and_kwok_nodes(
    lane: RealLane, kube: KubeClient, monitor: InvariantMonitor
) -> None:
    boots = {node: await boot_id(kube, node) for node in lane.real_targets}
    guard_node = lane.real_targets[1]
    await create_workloads(kube, lane, guard_node)
    web_before = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in await app_pods(kube, "web")}
    await kube.create("/apis/nodewright.io/v1alpha1/deploymentpolicies", deployment_policy())
    await kube.create(NW_PATH, nodewright(NW, reference_packages(), deploymentPolicy=POLICY))
    await wait_complete(kube, lane.targets, within=600)
    monitor.assert_clean()
    # Every real target rebooted for real: a new boot ID, the kubelet started again under it.
    for node in lane.real_targets:
        assert await boot_id(kube, node) != boots[node], node
        starts = (lane.upper(node) / "var/log/nodewright-box/kubelet.starts").read_text().splitlines()
        assert len(starts) >= 2 and starts[-1].endswith(await boot_id(kube, node)), starts
    await check_package_results(lane)
    # The protected pod was waited for: nothing of the rollout ran on its node before it finished.
    guard = await kube.get(f"/api/v1/namespaces/{APPS}/pods/guard")
    finished = guard["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
    first_pod = min(e.get("firstTimestamp") or e["eventTime"] for e in await started_events(kube, guard_node))
    assert parse_time(first_pod) >= parse_time(finished), (first_pod, finished)
    # The Deployment's pods on the target nodes were evicted through the PDB and came back elsewhere.
    web_after = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in await app_pods(kube, "web")}
    assert len(web_after) == 2 and web_after != web_before, (web_before, web_after)


async def check_package_results(lane: RealLane) -> None:
    """What each package promises, read from each real target's root and running node."""
    for node in lane.real_targets:
        upper = lane.upper(node)
        assert (upper / "etc/nodewright-e2e/value").read_text() == "from-the-configmap", node
        sysctl = (upper / "etc/sysctl.d/90-nodewright-tuning.conf").read_text()
        assert "vm.max_map_count = 1048576" in sysctl, sysctl
        assert "iommu.passthrough=1" in (upper / "etc/default/grub.d/90-nodewright-tuning.cfg").read_text()
        unit = (upper / "etc/systemd/system" / MOUNT_UNIT).read_text()
        assert "Where=/mnt/nwdata" in unit, unit
        # The running node, as its own processes see it.
        assert lane.in_box(node, "cat", "/proc/sys/vm/max_map_count").strip() == "1048576", node
        assert "iommu.passthrough=1" in lane.in_box(node, "cat", "/proc/cmdline"), node
        assert " /mnt/nwdata " in lane.in_box(node, "cat", "/proc/1/mountinfo"), node
        print(f"[real-nodes] {node}: vm.max_map_count, iommu.passthrough and /mnt/nwdata read back")


# ----------------------------------------------------------------------------------------------------
# 3. Logs through the real kubelet


async def test_package_logs_come_through_the_real_kubelet(
    lane: RealLane, kube: KubeClient, monitor: InvariantMonitor
) -> None:
    """A config change whose step prints a marker, then takes a while: read while its pod runs."""
    node = lane.real_targets[0]
    marker = "config-step-marker-7f3a"
    scripts = {
        "config.sh": _HEADER + f'echo {marker}\ncp "$SKYHOOK_DIR/configmaps/value" "$d/value"\nsleep 8\n'
    }
    patch = {"spec": {"packages": {"shell": {"configMap": {**scripts, "value": "changed"}}}}}
    await kube.merge_patch(f"{NW_PATH}/{NW}", patch)

    async def running_config_pod() -> str | None:
        for pod in await kube_pods(kube, f"nodewright.io/nodewright={NW},nodewright.io/node={node}"):
            statuses = {s["name"]: s for s in pod["status"].get("initContainerStatuses") or []}
            if "running" in (statuses.get("shell-config") or {}).get("state", {}):
                return str(pod["metadata"]["name"])
        return None

    pod = await fleet.wait_for(
        running_config_pod, within=240, interval=0.5, what=f"a shell config pod on {node}"
    )

    async def both_show_the_marker() -> bool:
        direct = lane.kubectl("-n", NAMESPACE, "logs", pod, "-c", "shell-config", check=False).stdout
        plugin = lane.plugin(
            "package", "logs", NW, "shell", "--node", node, "--stage", "config", check=False
        ).stdout
        return marker in direct and marker in plugin

    await fleet.wait_for(
        both_show_the_marker, within=30, interval=0.5, what="the marker in kubectl logs and package logs"
    )
    await wait_complete(kube, lane.targets, within=300)
    assert (lane.upper(node) / "etc/nodewright-e2e/value").read_text() == "changed"


# ----------------------------------------------------------------------------------------------------
# 4. Drift


async def test_drift_in_a_box_is_detected_and_repaired(
    lane: RealLane, kube: KubeClient, monitor: InvariantMonitor
) -> None:
    node = lane.real_targets[2]
    lane.in_box(node, "sysctl", "-w", "vm.max_map_count=65530")
    await kube.merge_patch(
        f"{NW_PATH}/{NW}", {"spec": {"driftDetection": {"interval": "10s", "action": "report"}}}
    )
    drifted = await wait_label(kube, node, "drifted", within=180)
    assert not drifted["spec"].get("unschedulable"), "a drift report never cordons"
    await kube.merge_patch(
        f"{NW_PATH}/{NW}", {"spec": {"driftDetection": {"interval": "10s", "action": "reapply"}}}
    )
    await wait_label(kube, node, "complete", within=300)
    assert lane.in_box(node, "cat", "/proc/sys/vm/max_map_count").strip() == "1048576"


# ----------------------------------------------------------------------------------------------------
# 5. Uninstall


async def test_helm_upgrade_rolls_the_operator_and_webhook(
    lane: RealLane, kube: KubeClient, monitor: InvariantMonitor
) -> None:
    """A value changed with `helm upgrade --reuse-values`: the Deployments roll to pods with it."""
    done = await asyncio.to_thread(
        lane.helm.run, "upgrade", "nodewright", lane.chart_reference, "--version", VERSION, "--plain-http",
        "-n", NAMESPACE, "--reuse-values", "--set", "logLevel=debug", "--wait", "--timeout", "4m",
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    async def rolled() -> bool:
        pods = (await kube.list_all(f"/api/v1/namespaces/{NAMESPACE}/pods"))["items"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        operators = [p for p in live if p["spec"]["containers"][0].get("args", [])[:1] == ["operator"]]
        return len(operators) == 2 and all(
            "--log-level=debug" in p["spec"]["containers"][0]["args"] for p in operators
        )

    await fleet.wait_for(rolled, within=180, interval=1.0, what="operator pods with the upgraded value")
    monitor.assert_clean()


async def test_helm_uninstall_leaves_every_node_clean(
    lane: RealLane, kube: KubeClient, monitor: InvariantMonitor
) -> None:
    await monitor.final_check()
    monitor.assert_clean()
    await monitor.stop()
    done = await asyncio.to_thread(
        lane.helm.run,
        "uninstall",
        "nodewright",
        "-n",
        NAMESPACE,
        "--wait",
        "--timeout",
        "4m",
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    lane.installed = False
    nodes = (await kube.list_all("/api/v1/nodes"))["items"]
    for node in nodes:
        meta = node["metadata"]
        ours = [
            k
            for k in {**meta.get("labels", {}), **meta.get("annotations", {})}
            if k.startswith("nodewright.io/")
        ]
        conditions = [
            c["type"] for c in node["status"].get("conditions", []) if c["type"].startswith("nodewright.io/")
        ]
        taints = [t["key"] for t in node["spec"].get("taints") or [] if t["key"].startswith("nodewright.io/")]
        assert not (ours or conditions or taints or node["spec"].get("unschedulable")), (
            meta["name"],
            ours,
            conditions,
            taints,
        )


# ----------------------------------------------------------------------------------------------------
# Objects


def nodewright(name: str, packages: JSON, *, paused: bool = False, **spec: object) -> JSON:
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": name, "annotations": {"nodewright.io/pause": "true"} if paused else {}},
        "spec": {
            "nodeSelectors": {"matchLabels": {TARGET_LABEL: "true"}},
            "podNonInterruptLabels": {"matchLabels": dict([PROTECTED])},
            "packages": packages,
            **spec,
        },
    }


_HEADER = '#!/bin/sh\nset -eu\nd="${NODEWRIGHT_HOST_ROOT%/}/etc/nodewright-e2e"\n'
_SAME = 'cmp -s "$SKYHOOK_DIR/configmaps/value" "$d/value"\n'
SHELL_SCRIPTS = {
    "apply.sh": _HEADER + 'mkdir -p "$d"\ncp "$SKYHOOK_DIR/configmaps/value" "$d/value"\n',
    "apply_check.sh": _HEADER + _SAME,
    "config.sh": _HEADER + 'cp "$SKYHOOK_DIR/configmaps/value" "$d/value"\n',
    "config_check.sh": _HEADER + _SAME,
}


def reference_packages() -> JSON:
    return {
        "shell": {
            "version": package_version("shell"),
            "image": package_image("shell"),
            "configMap": {**SHELL_SCRIPTS, "value": "from-the-configmap"},
        },
        "tuning": {
            "version": package_version("tuning"),
            "image": package_image("tuning"),
            "interrupt": {"type": "reboot"},
            "configMap": {
                "accelerator": "hopper",
                "workload": "training",
                "overrides": "sysctl vm.max_map_count 1048576\n",
            },
        },
        "bind-mount": {
            "version": package_version("bind-mount"),
            "image": package_image("bind-mount"),
            "interrupt": {"type": "service", "services": [MOUNT_UNIT]},
            "configMap": {"mounts": "/var/lib/nwdata /mnt/nwdata\n"},
        },
    }


def deployment_policy() -> JSON:
    """Two compartments: the real targets one node at a time, the kwok nodes together."""
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DeploymentPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}},
            "compartments": [
                {
                    "name": "real",
                    "selector": {"matchLabels": {"type": "real"}},
                    "budget": {"count": 1},
                    "strategy": {"exponential": {"initialBatch": 1, "growthFactor": 2}},
                }
            ],
        },
    }


async def create_workloads(kube: KubeClient, lane: RealLane, guard_node: str) -> None:
    """A real Deployment (two replicas, a PDB allowing one down) and a protected pod that finishes."""
    await kube.create("/api/v1/namespaces", {"metadata": {"name": APPS}})
    await fleet.wait_for(lambda: _default_sa(kube), within=30, what="the default ServiceAccount of e2e-apps")
    sleeper = {
        "image": SLEEPER_IMAGE,
        "imagePullPolicy": "Always",
        "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
    }
    affinity = {"nodeSelector": {TARGET_LABEL: "true", "type": "real"}, "terminationGracePeriodSeconds": 5}
    await kube.create(
        f"/apis/apps/v1/namespaces/{APPS}/deployments",
        {
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {**affinity, "containers": [{"name": "web", **sleeper}]},
                },
            },
        },
    )
    await kube.create(
        f"/apis/policy/v1/namespaces/{APPS}/poddisruptionbudgets",
        {
            "metadata": {"name": "web"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
        },
    )
    await kube.create(
        f"/api/v1/namespaces/{APPS}/pods",
        {
            "metadata": {"name": "guard", "labels": dict([PROTECTED])},
            "spec": {
                "nodeName": guard_node,
                "restartPolicy": "Never",
                "containers": [{"name": "guard", "image": SLEEPER_IMAGE, "command": ["/bin/sleep", "20"]}],
            },
        },
    )

    async def running() -> bool:
        pods = await app_pods(kube, "web")
        return len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods)

    await fleet.wait_for(running, within=120, what="the web Deployment running on real nodes")


async def _default_sa(kube: KubeClient) -> bool:
    try:
        await kube.get(f"/api/v1/namespaces/{APPS}/serviceaccounts/default")
    except ApiError:
        return False
    return True


async def app_pods(kube: KubeClient, app: str) -> list[JSON]:
    listed = await kube.list_all(f"/api/v1/namespaces/{APPS}/pods", params={"labelSelector": f"app={app}"})
    return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]


async def boot_id(kube: KubeClient, node: str) -> str:
    return str((await kube.get(f"/api/v1/nodes/{node}"))["status"]["nodeInfo"]["bootID"])


async def wait_complete(kube: KubeClient, nodes: list[str], *, within: float) -> None:
    async def done() -> bool:
        states = {n: await node_status(kube, n) for n in nodes}
        return all(s == "complete" for s in states.values())

    try:
        await fleet.wait_for(done, within=within, interval=1.0, what=f"{NW} complete")
    except TimeoutError:
        states = {n: await node_status(kube, n) for n in nodes}
        status = (await kube.get(f"{NW_PATH}/{NW}")).get("status") or {}
        telling = [
            f"{c['type']}={c['status']}: {c['message']}"
            for c in status.get("conditions", [])
            if c.get("message")
        ]
        conditions = {
            n: [
                c.get("message")
                for c in (await kube.get(f"/api/v1/nodes/{n}"))["status"]["conditions"]
                if c["type"].startswith("nodewright.io/")
            ]
            for n in nodes
        }
        raise AssertionError(f"not complete: {states}\n{telling}\n{conditions}") from None


async def node_status(kube: KubeClient, node: str) -> str | None:
    labels = (await kube.get(f"/api/v1/nodes/{node}"))["metadata"].get("labels") or {}
    return labels.get(f"nodewright.io/status.{NW}")


async def wait_label(kube: KubeClient, node: str, want: str, *, within: float) -> JSON:
    async def probe() -> JSON | None:
        obj = await kube.get(f"/api/v1/nodes/{node}")
        return (
            obj if (obj["metadata"].get("labels") or {}).get(f"nodewright.io/status.{NW}") == want else None
        )

    result: JSON = await fleet.wait_for(probe, within=within, interval=1.0, what=f"{node} {want}")
    return result


async def started_events(kube: KubeClient, node: str) -> list[JSON]:
    """The operator's PackageStarted Events of the node: when its first package pod started."""
    listed = await kube.list_all(
        "/api/v1/namespaces/default/events",
        params={"fieldSelector": f"involvedObject.name={node},reason=PackageStarted"},
    )
    events: list[JSON] = listed["items"]
    assert events, f"no PackageStarted Event for {node}"
    return events


async def kube_pods(kube: KubeClient, selector: str) -> list[JSON]:
    listed = await kube.list_all(f"/api/v1/namespaces/{NAMESPACE}/pods", params={"labelSelector": selector})
    return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]


def parse_time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
