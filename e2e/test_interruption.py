"""Issue 6 scenarios: cordon, protected pods, PDB-respecting drain and reboots on the real control plane.

Workloads come from `nodewright.sim.fleet.create_workloads` (pods bound by nodeName, an unreconciled
ReplicaSet owner so the disruption controller computes `maxUnavailable`, optional PDB); reboots are
performed by the simulator's rebooter (node NotReady, then a new bootID).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    OperatorProcess,
    PodCreations,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    nodes_of,
    nodewright_manifest,
    package,
    wait_statuses,
)
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

PROTECT = {"matchLabels": {fleet.PROTECTED_LABEL: "true"}}


async def shrink_with_evictions(kube: KubeClient, job: fleet.TrainingJob) -> None:
    """Keep the job's ReplicaSet replicas equal to its live pods, like a job that shrinks on eviction.

    Nothing recreates evicted pods in the simulator, so with `maxUnavailable: 1` the disruption
    controller would allow exactly one eviction ever (expected = replicas). A real training job is
    rescheduled or shrinks; shrinking `replicas` gives the next node its PDB slot once the evicted pod
    is gone — which is exactly the one-slot-at-a-time behaviour under test.
    """
    path = f"/apis/apps/v1/namespaces/{job.namespace}/replicasets/{job.name}"
    while True:
        listed = await kube.list_all(
            f"/api/v1/namespaces/{job.namespace}/pods",
            params={"labelSelector": f"{fleet.WORKLOAD_JOB_LABEL}={job.name}"},
        )
        live = len(listed["items"])
        rs = await kube.get(path)
        if rs["spec"].get("replicas") != live:
            await kube.merge_patch(path, {"spec": {"replicas": live}})
            if job.pdb:
                # The disruption controller recomputes on pod and PDB events, not on ReplicaSet edits:
                # touch the PDB so the new expected count is used now.
                await kube.merge_patch(
                    f"/apis/policy/v1/namespaces/{job.namespace}/poddisruptionbudgets/{job.pdb}",
                    {"metadata": {"annotations": {"e2e.nodewright.io/replicas": str(live)}}},
                )
        await asyncio.sleep(0.5)


def _time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_reboot_with_pdb_and_protected_job(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"rb-{unique}", f"rb-{unique}"
    async with fleet_of(cluster, prefix, 6) as names:
        boot_before = {
            n["metadata"]["name"]: n["status"]["nodeInfo"]["bootID"] for n in await nodes_of(kube, prefix)
        }
        training = await fleet.create_workloads(
            cluster.kubeconfig, nodes=names[:4], job=f"train-{unique}", max_unavailable=1
        )
        protected = await fleet.create_workloads(
            cluster.kubeconfig, nodes=names[4:], job=f"prot-{unique}", protected=True, run_for="10s"
        )
        shrinker = asyncio.create_task(shrink_with_evictions(kube, training))
        try:
            async with PodCreations(kube, nw) as watch:
                pkg = package(interrupt={"type": "reboot"})
                await create_nodewright(
                    kube,
                    nodewright_manifest(
                        nw, fleet_prefix=prefix, packages={"driver": pkg}, podNonInterruptLabels=PROTECT
                    ),
                )
                nodes = await wait_statuses(kube, prefix, nw, "complete", within=180)
            for node in nodes:
                name = node["metadata"]["name"]
                assert node["status"]["nodeInfo"]["bootID"] != boot_before[name], f"{name} did not reboot"
                assert not node["spec"].get("unschedulable"), f"{name} left cordoned"
            # Protected nodes: no package pod before the protected pods finished.
            finished = {}
            for pod_name in protected.pods:
                pod = await kube.get(f"/api/v1/namespaces/{protected.namespace}/pods/{pod_name}")
                term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
                finished[pod["spec"]["nodeName"]] = _time(term["finishedAt"])
            for pod_name, node_name, _, _, _ in watch.created:
                if node_name in finished:
                    assert _time(watch.created_at[pod_name]) >= finished[node_name], (pod_name, finished)
            # The training pods were evicted (one PDB slot at a time: the invariant monitor checks it).
            listed = await kube.list_all(
                f"/api/v1/namespaces/{training.namespace}/pods",
                params={"labelSelector": f"{fleet.WORKLOAD_JOB_LABEL}={training.name}"},
            )
            assert listed["items"] == []
            await delete_nodewright(kube, nw)
        finally:
            shrinker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await shrinker
            for job in (training, protected):
                invariants.allow_workload_deletion(job)
                await fleet.delete_workloads(cluster.kubeconfig, job)


async def test_admin_cordoned_node_is_not_taken_and_keeps_its_cordon(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """A node an admin cordoned is unavailable for the rollout (it is not admitted while cordoned) and the
    operator never uncordons it; once the admin uncordons it, it is taken and ends uncordoned."""
    prefix, nw = f"adm-{unique}", f"adm-{unique}"
    async with fleet_of(cluster, prefix, 2) as names:
        await kube.merge_patch(f"/api/v1/nodes/{names[0]}", {"spec": {"unschedulable": True}})
        pkg = package(interrupt={"type": "service", "services": ["containerd"]})
        await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages={"svc": pkg}))
        await wait_statuses(kube, prefix, nw, "complete", within=90, count=1)
        await asyncio.sleep(2)
        by_name = {n["metadata"]["name"]: n for n in await nodes_of(kube, prefix)}
        assert by_name[names[0]]["spec"].get("unschedulable") is True, "admin cordon removed"
        assert not by_name[names[1]]["spec"].get("unschedulable"), "our cordon left behind"
        invariants.expect_uncordon(names[0])
        await kube.merge_patch(f"/api/v1/nodes/{names[0]}", {"spec": {"unschedulable": None}})
        nodes = await wait_statuses(kube, prefix, nw, "complete", within=90)
        assert not any(n["spec"].get("unschedulable") for n in nodes)
        await delete_nodewright(kube, nw)
