"""Smoke tests of the simulator on the real control plane: fleet scale, workload and package-pod knobs,
PDB-guarded eviction through the disruption controller, simulated reboots, and process lifecycle."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane, ControlPlaneError, process_running
from nodewright.sim.kubeapi import JSON, ApiError, KubeClient

NS = "nodewright-system"


@pytest.fixture
async def client(cluster: ControlPlane) -> AsyncIterator[KubeClient]:
    async with KubeClient(cluster.kubeconfig) as c:
        yield c


async def get_pod(client: KubeClient, namespace: str, name: str) -> JSON:
    return await client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


async def wait_pod(
    client: KubeClient, namespace: str, name: str, check: Any, what: str, within: float = 20
) -> JSON:
    async def probe() -> JSON | None:
        pod = await get_pod(client, namespace, name)
        return pod if check(pod) else None

    result: JSON = await fleet.wait_for(probe, within=within, what=f"pod {name} {what}")
    return result


def condition(obj: JSON, kind: str) -> str | None:
    for c in obj.get("status", {}).get("conditions") or []:
        if c["type"] == kind:
            return str(c["status"])
    return None


def phase(p: str) -> Any:
    return lambda pod: pod.get("status", {}).get("phase") == p


async def test_thousand_gpu_nodes(cluster: ControlPlane, client: KubeClient, unique: str) -> None:
    prefix = f"scale-{unique}"
    started = time.monotonic()
    names = await fleet.create_nodes(cluster.kubeconfig, count=1000, profile="mixed", name_prefix=prefix)
    created = time.monotonic() - started
    try:
        listed = await client.list_all(
            "/api/v1/nodes", params={"labelSelector": f"{fleet.FLEET_LABEL}={prefix}"}
        )
        elapsed = time.monotonic() - started
        print(f"\n[e2e] created 1000 nodes in {created:.2f}s, listed them after {elapsed:.2f}s")
        nodes = {n["metadata"]["name"]: n for n in listed["items"]}
        assert sorted(nodes) == sorted(names) and len(nodes) == 1000
        first, fourth = nodes[fleet.node_name(prefix, 0)], nodes[fleet.node_name(prefix, 3)]
        labels = first["metadata"]["labels"]
        assert len(labels) >= 60
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert fourth["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-B200"  # mixed: every 4th
        assert [nodes[fleet.node_name(prefix, i)]["metadata"]["labels"]["topology.kubernetes.io/zone"]
                for i in range(4)] == ["zone-a", "zone-b", "zone-c", "zone-a"]  # fmt: skip
        assert first["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert condition(first, "Ready") == "True"
        boot_ids = {n["status"]["nodeInfo"]["bootID"] for n in nodes.values()}
        assert len(boot_ids) == 1000
        assert (
            first["status"]["nodeInfo"]["kernelVersion"]
            == labels["feature.node.kubernetes.io/kernel-version.full"]
        )
        table = cluster.kubectl("get", "nodes", "-l", f"{fleet.FLEET_LABEL}={prefix}", "--no-headers")
        assert len(table.stdout.splitlines()) == 1000
    finally:
        await fleet.delete_nodes(cluster.kubeconfig, name_prefix=prefix)


async def test_workload_knobs(cluster: ControlPlane, client: KubeClient, unique: str) -> None:
    prefix = f"wl-{unique}"
    nodes = await fleet.create_nodes(cluster.kubeconfig, count=2, name_prefix=prefix)
    ok = await fleet.create_workloads(cluster.kubeconfig, nodes=nodes[:1], job=f"ok-{unique}", run_for="3s")
    bad = await fleet.create_workloads(
        cluster.kubeconfig, nodes=nodes[1:], job=f"bad-{unique}", run_for="1s", result="fail"
    )
    forever = await fleet.create_workloads(cluster.kubeconfig, nodes=nodes[:1], job=f"forever-{unique}")
    try:
        ns, ok_pod, bad_pod = ok.namespace, ok.pods[0], bad.pods[0]
        running = await wait_pod(client, ns, forever.pods[0], phase("Running"), "Running")
        assert condition(running, "Ready") == "True" and running["status"]["podIP"]
        done = await wait_pod(client, ns, ok_pod, phase("Succeeded"), "Succeeded")
        assert condition(done, "Ready") == "False"  # a finished pod must not count as healthy for PDBs
        terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == 0
        ran = dt.datetime.fromisoformat(terminated["finishedAt"]) - dt.datetime.fromisoformat(
            done["status"]["startTime"]
        )
        assert ran >= dt.timedelta(seconds=2), ran  # it ran for run-for=3s (timestamps have 1s resolution)
        failed = await wait_pod(client, ns, bad_pod, phase("Failed"), "Failed")
        assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1
        assert condition(failed, "Ready") == "False"
        still = await get_pod(client, ns, forever.pods[0])
        assert still["status"]["phase"] == "Running"
    finally:
        for job in (ok, bad, forever):
            await fleet.delete_workloads(cluster.kubeconfig, job)
        await fleet.delete_nodes(cluster.kubeconfig, names=nodes)


def init_states(pod: JSON) -> list[tuple[str, Any]]:
    out = []
    for s in pod["status"].get("initContainerStatuses") or []:
        (kind, detail), = s["state"].items()  # fmt: skip
        out.append((kind, detail.get("exitCode", detail.get("reason"))))
    return out


async def test_package_pod_knobs(cluster: ControlPlane, client: KubeClient, unique: str) -> None:
    prefix = f"pkg-{unique}"
    nodes = await fleet.create_nodes(cluster.kubeconfig, count=3, name_prefix=prefix)
    fail_here = nodes[1]
    base_env = {"NODEWRIGHT_SIM_DURATION": "1s"}
    pods = {
        "ok": fleet.package_pod_manifest(name=f"ok-{unique}", node=nodes[0], env=base_env),
        "node-fail": fleet.package_pod_manifest(
            name=f"nodefail-{unique}",
            node=fail_here,
            env={**base_env, "NODEWRIGHT_SIM_FAIL_NODES": f"x, {fail_here}"},
        ),
        "node-ok": fleet.package_pod_manifest(
            name=f"nodeok-{unique}",
            node=nodes[2],
            env={**base_env, "NODEWRIGHT_SIM_FAIL_NODES": f"x, {fail_here}"},
        ),
        "attempt1": fleet.package_pod_manifest(
            name=f"att1-{unique}",
            node=nodes[2],
            attempt=1,
            env={**base_env, "NODEWRIGHT_SIM_FAIL_ATTEMPTS": "1"},
        ),
        "attempt2": fleet.package_pod_manifest(
            name=f"att2-{unique}",
            node=nodes[2],
            attempt=2,
            env={**base_env, "NODEWRIGHT_SIM_FAIL_ATTEMPTS": "1"},
        ),
        "stage-filtered": fleet.package_pod_manifest(
            name=f"cfg-{unique}",
            node=nodes[0],
            stage="config",
            env={**base_env, "NODEWRIGHT_SIM_FAIL": "always", "NODEWRIGHT_SIM_FAIL_STAGES": "apply"},
        ),
        "pull": fleet.package_pod_manifest(
            name=f"pull-{unique}", node=nodes[0], env={**base_env, "NODEWRIGHT_SIM_IMAGE_PULL_ERROR": "true"}
        ),
    }
    try:
        for body in pods.values():
            await client.create(f"/api/v1/namespaces/{NS}/pods", body)
        name = {k: v["metadata"]["name"] for k, v in pods.items()}
        for key in ("ok", "node-ok", "attempt2", "stage-filtered"):
            pod = await wait_pod(client, NS, name[key], phase("Running"), "Running")
            assert init_states(pod) == [("terminated", 0)] * 3, key
            assert [next(iter(s["state"])) for s in pod["status"]["containerStatuses"]] == ["running"]
            assert condition(pod, "Ready") == "True"
        for key in ("node-fail", "attempt1"):
            pod = await wait_pod(client, NS, name[key], phase("Failed"), "Failed")
            assert init_states(pod) == [
                ("terminated", 0),
                ("terminated", 1),
                ("waiting", "PodInitializing"),
            ], key
            failing = pod["status"]["initContainerStatuses"][1]
            assert failing["name"] == "pkg-apply" and failing["state"]["terminated"]["reason"] == "Error"
        pull = await wait_pod(
            client,
            NS,
            name["pull"],
            lambda p: bool(p["status"].get("initContainerStatuses")),
            "image pull status",
        )
        assert pull["status"]["phase"] == "Pending"
        assert init_states(pull)[0] in (("waiting", "ErrImagePull"), ("waiting", "ImagePullBackOff"))
    finally:
        for body in pods.values():
            await client.delete(f"/api/v1/namespaces/{NS}/pods/{body['metadata']['name']}")
        await fleet.delete_nodes(cluster.kubeconfig, names=nodes)


async def evict(client: KubeClient, namespace: str, pod: str) -> int:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    try:
        await client.create(f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", body)
    except ApiError as err:
        return err.status
    return 201


async def test_pdb_eviction(cluster: ControlPlane, client: KubeClient, unique: str) -> None:
    prefix = f"pdb-{unique}"
    nodes = await fleet.create_nodes(cluster.kubeconfig, count=2, name_prefix=prefix)
    strict = await fleet.create_workloads(
        cluster.kubeconfig, nodes=nodes, job=f"strict-{unique}", min_available=2
    )
    loose = await fleet.create_workloads(
        cluster.kubeconfig, nodes=nodes, job=f"loose-{unique}", max_unavailable=1, protected=True
    )
    ns = strict.namespace
    pdb_path = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
    try:
        for pod in strict.pods + loose.pods:
            await wait_pod(client, ns, pod, lambda p: condition(p, "Ready") == "True", "Ready")

        async def pdb_settled(name: str, allowed: int) -> Any:
            pdb = await client.get(f"{pdb_path}/{name}")
            st = pdb.get("status", {})
            return (
                st.get("observedGeneration") == pdb["metadata"]["generation"]
                and st.get("disruptionsAllowed") == allowed
            )

        await fleet.wait_for(lambda: pdb_settled(strict.pdb or "", 0), within=20, what="strict PDB status")
        # maxUnavailable needs the pods' controllerRef to resolve (the unreconciled StatefulSet owner).
        await fleet.wait_for(lambda: pdb_settled(loose.pdb or "", 1), within=20, what="loose PDB status")
        assert await evict(client, ns, strict.pods[0]) == 429

        await client.merge_patch(f"{pdb_path}/{strict.pdb}", {"spec": {"minAvailable": 1}})
        await fleet.wait_for(lambda: pdb_settled(strict.pdb or "", 1), within=20, what="relaxed PDB")
        assert await evict(client, ns, strict.pods[0]) == 201

        async def gone() -> bool:
            try:
                await get_pod(client, ns, strict.pods[0])
            except ApiError as err:
                return err.status == 404
            return False

        await fleet.wait_for(gone, within=20, what="evicted pod to disappear")
        # The budget is spent now: the second pod is protected again.
        await fleet.wait_for(lambda: pdb_settled(strict.pdb or "", 0), within=20, what="spent PDB")
        assert await evict(client, ns, strict.pods[1]) == 429
    finally:
        await fleet.delete_workloads(cluster.kubeconfig, strict)
        await fleet.delete_workloads(cluster.kubeconfig, loose)
        await fleet.delete_nodes(cluster.kubeconfig, names=nodes)


async def test_reboot_changes_boot_id_and_hang_stays_not_ready(
    cluster: ControlPlane, client: KubeClient, unique: str
) -> None:
    prefix = f"rb-{unique}"
    nodes = await fleet.create_nodes(
        cluster.kubeconfig,
        count=2,
        name_prefix=prefix,
        annotations_extra={"sim.nodewright.io/reboot-seconds": "2"},
    )
    ok_node, hang_node = nodes
    await client.merge_patch(
        f"/api/v1/nodes/{hang_node}", {"metadata": {"annotations": {"sim.nodewright.io/reboot-hang": "true"}}}
    )
    before = {n: (await client.get(f"/api/v1/nodes/{n}"))["status"]["nodeInfo"]["bootID"] for n in nodes}
    interrupt = {"type": "reboot", "services": []}
    env = {"NODEWRIGHT_SIM_DURATION": "500ms"}
    pods = [
        fleet.package_pod_manifest(
            name=f"rb-{unique}-{i}", node=n, stage="interrupt", env=env, interrupt=interrupt
        )
        for i, n in enumerate(nodes)
    ]
    try:
        for body in pods:
            await client.create(f"/api/v1/namespaces/{NS}/pods", body)

        async def not_ready(node: str) -> bool:
            return condition(await client.get(f"/api/v1/nodes/{node}"), "Ready") == "False"

        await fleet.wait_for(lambda: not_ready(ok_node), within=20, interval=0.1, what="node to go NotReady")
        done = await wait_pod(
            client, NS, pods[0]["metadata"]["name"], phase("Running"), "Running after reboot"
        )
        assert init_states(done) == [("terminated", 0)] * 3
        node = await client.get(f"/api/v1/nodes/{ok_node}")
        assert condition(node, "Ready") == "True"
        assert node["status"]["nodeInfo"]["bootID"] != before[ok_node]

        await fleet.wait_for(lambda: not_ready(hang_node), within=20, what="hanging node to go NotReady")
        await asyncio.sleep(4)  # twice the reboot time: it must still be down
        hung = await client.get(f"/api/v1/nodes/{hang_node}")
        assert condition(hung, "Ready") == "False"
        assert hung["status"]["nodeInfo"]["bootID"] == before[hang_node]
        assert (await get_pod(client, NS, pods[1]["metadata"]["name"]))["status"]["phase"] == "Pending"
    finally:
        for body in pods:
            await client.delete(f"/api/v1/namespaces/{NS}/pods/{body['metadata']['name']}")
        await fleet.delete_nodes(cluster.kubeconfig, names=nodes)


def test_lifecycle_of_a_second_cluster(cluster: ControlPlane) -> None:
    """A cluster side by side with the session one: etcd compaction, apiserver restart, a crashed
    component reported, and `down` leaving no process and no state behind."""
    scratch = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="nodewright-e2e-2-", dir=scratch) as tmp:
        plane = ControlPlane.create(Path(tmp) / "cp")
        recorded: list[tuple[int | None, int | None]] = []
        try:
            plane.up()
            assert plane.server != cluster.server
            cm = {"metadata": {"name": "probe"}, "data": {"v": "1"}}
            created = plane.api("POST", "/api/v1/namespaces/default/configmaps", cm)
            old_rv = created["metadata"]["resourceVersion"]
            plane.api("PATCH", "/api/v1/namespaces/default/configmaps/probe", {"data": {"v": "2"}},
                      content_type="application/merge-patch+json")  # fmt: skip
            plane.compact_etcd()
            with pytest.raises(ApiError) as gone:
                plane.api("GET", f"/api/v1/namespaces/default/configmaps?resourceVersion={old_rv}"
                          "&resourceVersionMatch=Exact")  # fmt: skip
            assert gone.value.status == 410
            watch = plane.api("GET", f"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={old_rv}"
                              "&timeoutSeconds=1")  # fmt: skip
            assert watch["type"] == "ERROR" and watch["object"]["code"] == 410

            old_pid = plane.components["kube-apiserver"].pid
            plane.restart_apiserver()
            assert plane.components["kube-apiserver"].pid != old_pid
            assert plane.kubectl("get", "configmap", "probe", "-o", "jsonpath={.data.v}").stdout == "2"

            plane.kill_component("kwok")
            assert plane.status()["kwok"]["running"] is False
            good_argv = list(plane.components["kwok"].argv)
            plane.components["kwok"].argv.append("--no-such-flag")
            started = time.monotonic()
            with pytest.raises(ControlPlaneError, match="exited with code") as crashed:
                plane.start_component("kwok")
            assert "no-such-flag" in str(crashed.value)  # the log tail explains the crash
            assert time.monotonic() - started < 30
            plane.components["kwok"].argv = good_argv
            plane.start_component("kwok")
            assert plane.status()["kwok"]["running"] is True

            reloaded = ControlPlane.load(plane.dir)  # what `sim down` from another process sees
            recorded = [(c.pid, c.start_ticks) for c in reloaded.components.values()]
            assert all(pid is not None for pid, _ in recorded)
        finally:
            plane.down()
        assert not [pid for pid, ticks in recorded if pid is not None and process_running(pid, ticks)]
        assert not plane.dir.exists()
        assert json.loads(json.dumps(cluster.status()))["kube-apiserver"]["running"] is True
