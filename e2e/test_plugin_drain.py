"""`why` on admitted nodes held at their gate (issue 16): protected pods by name, the PodDisruptionBudget
refusing an eviction (pod and PDB), the drain timeout and its policy -- read from the cluster as it is
-- and the operator's own counts of such nodes (`ProtectedPods`, `DrainBlocked`), which used to be in
no waiting count, and its condition reason `DrainTimeout` once the timeout passed under policy wait.
"""

from __future__ import annotations

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    OperatorProcess,
    condition_of,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    get_nodewright,
    nodewright_manifest,
    package,
    wait_statuses,
)
from e2e.test_plugin_why import until_reason
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory


async def test_protected_pods_pdb_and_drain_timeout_are_named(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix = nw = f"wdr-{unique}"
    async with fleet_of(cluster, prefix, 2) as names:
        protected_node, pdb_node = names
        protected = await fleet.create_workloads(
            cluster.kubeconfig, nodes=[protected_node], job=f"prot-{unique}", protected=True
        )
        stuck = await fleet.create_workloads(
            cluster.kubeconfig, nodes=[pdb_node], job=f"pdb-{unique}", min_available=1
        )
        pkg = package(duration="2s", interrupt={"type": "service", "services": ["containerd"]})
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw,
                fleet_prefix=prefix,
                packages={"svc": pkg},
                interruptionBudget={"count": 2},
                podNonInterruptLabels={"matchLabels": {fleet.PROTECTED_LABEL: "true"}},
                drain={"timeout": "5s", "policy": "wait"},
            ),
        )
        answer = await until_reason(cluster, protected_node, nw, "ProtectedPods")
        assert f"{protected.namespace}/{protected.pods[0]}" in answer["summary"], answer

        answer = await until_reason(cluster, pdb_node, nw, "DrainTimeout", within=90)
        pod = f"{stuck.namespace}/{stuck.pods[0]}"
        assert answer["summary"] == f"drain blocked by PodDisruptionBudget {stuck.namespace}/{stuck.pdb}", (
            answer
        )
        assert any(
            d.startswith(f"{pod}: PodDisruptionBudget {stuck.namespace}/{stuck.pdb} refuses")
            for d in answer["details"]
        )
        assert any(
            "drain timeout 5s (policy wait) passed" in d and "keeps evicting" in d for d in answer["details"]
        )

        # The operator says the same: condition reason DrainTimeout naming the pod, and both nodes in
        # its waiting counts.
        async def reported() -> JSON | None:
            node = await kube.get(f"/api/v1/nodes/{pdb_node}")
            cond = condition_of(node, nw) or {}
            return cond if cond.get("reason") == "DrainTimeout" else None

        cond = await fleet.wait_for(reported, within=30, what="condition DrainTimeout")
        assert f"1 pod(s) left ({pod})" in cond["message"], cond

        async def counted() -> JSON | None:
            reasons = (((await get_nodewright(kube, nw)) or {}).get("status") or {}).get(
                "waitingReasons"
            ) or {}
            return reasons if reasons.get("ProtectedPods") == 1 and reasons.get("DrainBlocked") == 1 else None

        await fleet.wait_for(counted, within=60, what="ProtectedPods and DrainBlocked counted")

        # Let both go: the protected job ends, the PDB relaxes; the rollout completes.
        invariants.allow_workload_deletion(protected)
        await fleet.delete_workloads(cluster.kubeconfig, protected)
        await kube.merge_patch(
            f"/apis/policy/v1/namespaces/{stuck.namespace}/poddisruptionbudgets/{stuck.pdb}",
            {"spec": {"minAvailable": 0}},
        )
        await wait_statuses(kube, prefix, nw, "complete", within=120)
        await delete_nodewright(kube, nw, within=90)
        invariants.expect_cleanup(nw)
        await fleet.delete_workloads(cluster.kubeconfig, stuck)
