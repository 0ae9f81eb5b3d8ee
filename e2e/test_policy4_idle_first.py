"""Issue 34 item 4 acceptance: idle nodes first, on the real control plane with the simulated fleet.

Six simulated GPU nodes; training pods run on the first four (one of them protected by the
NodeWright's `podNonInterruptLabels`), the last two are idle. Plain pick order (creation time, name)
would take the first two nodes first; a DeploymentPolicy whose compartment sets `nodeOrder: idleFirst`
with batches of two makes the operator count every node's pods (its count-only pod cache) and take the
two idle nodes in batch 1, the node with protected pods last. `kubectl nodewright why` shows each
node's disruption cost, and the invariant monitor records no breach.
"""

from __future__ import annotations

import contextlib
from typing import Any

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import NW_PATH, create_nodewright, delete_nodewright, package, wait_statuses
from e2e.test_plugin import create_policy, why
from nodewright.api.admission import admission_annotation, decode_admission
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import ApiError, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

POLICIES = "/apis/nodewright.io/v1alpha1/deploymentpolicies"
OWNER = "e2e.nodewright.io/owner"


async def test_idle_first_takes_the_idle_nodes_in_the_first_batch(
    cluster: ControlPlane, operator: Any, kube: KubeClient, unique: str, invariants: InvariantMonitor
) -> None:
    policy_name, nw, prefix = f"idle-{unique}", f"id-{unique}", f"id-{unique}"
    await create_policy(
        kube,
        policy_name,
        {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}},
        compartments=[
            {
                "name": "gpus",
                "selector": {"matchLabels": {OWNER: unique}},
                "nodeOrder": "idleFirst",
                "budget": {"count": 2},
                "strategy": {"fixed": {"initialBatch": 2}},
            }
        ],
    )
    jobs: list[fleet.TrainingJob] = []
    try:
        async with operator_fixture.fleet_of(cluster, prefix, 6, labels_extra={OWNER: unique}) as names:
            busy, protected, idle = names[:3], names[3], names[4:]
            jobs.append(
                await fleet.create_workloads(
                    cluster.kubeconfig, nodes=busy, job=f"busy-{unique}", namespace=f"w-{unique}"
                )
            )
            jobs.append(
                await fleet.create_workloads(
                    cluster.kubeconfig,
                    nodes=[protected],
                    job=f"prot-{unique}",
                    namespace=f"w-{unique}",
                    protected=True,
                )
            )
            await invariants.sync()
            await create_nodewright(
                kube,
                {
                    "apiVersion": "nodewright.io/v1alpha1",
                    "kind": "NodeWright",
                    "metadata": {"name": nw},
                    "spec": {
                        "nodeSelectors": {"matchLabels": {OWNER: unique}},
                        "deploymentPolicy": policy_name,
                        "podNonInterruptLabels": {"matchLabels": {fleet.PROTECTED_LABEL: "true"}},
                        "packages": {"tuned": package()},
                    },
                },
            )
            # `why` shows the cost the operator orders by (the protected node waits for the last batch).
            answer = await why(cluster, protected, nw)
            assert answer.get("disruption") == {"protected": 1, "evictable": 1}, answer
            await wait_statuses(kube, prefix, nw, "complete", within=600)

            batch_of: dict[str, int] = {}
            for name in names:
                node = await kube.get(f"/api/v1/nodes/{name}")
                admission = decode_admission(node["metadata"]["annotations"][admission_annotation(nw)])
                assert admission.compartment == "gpus", admission
                batch_of[name] = admission.batch
            assert sorted(n for n, b in batch_of.items() if b == 1) == sorted(idle), batch_of
            assert batch_of[protected] == max(batch_of.values()), batch_of
            assert all(batch_of[n] > 1 for n in busy), batch_of

            await invariants.sync()
            assert not invariants.breaches, invariants.report()
            await delete_nodewright(kube, nw, within=120)
    finally:
        for job in jobs:
            with contextlib.suppress(ApiError):
                await fleet.delete_workloads(cluster.kubeconfig, job)
        with contextlib.suppress(ApiError):
            await kube.delete(f"{NW_PATH}/{nw}")
        with contextlib.suppress(ApiError):
            await kube.delete(f"{POLICIES}/{policy_name}")
