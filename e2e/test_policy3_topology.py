"""Issue 34 item 3 acceptance: whole topology domains, on the real control plane with the simulated fleet.

24 simulated GPU nodes in the simulator's racks (`sim.nodewright.io/rack`, 8 nodes a rack), one
NodeWright rolling out a package with a reboot, and a DeploymentPolicy whose compartment names the rack
label as its `topologyKey` with a budget of one domain. The invariant monitor (I1 in domains, I11)
records no breach: never two racks disrupted at once (its peak is exactly one rack), every rack admitted
whole (all its nodes in one batch, one batch per rack), and `kubectl nodewright why` names each node's
rack.
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
from nodewright.sim.kubeapi import JSON, ApiError, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

POLICIES = "/apis/nodewright.io/v1alpha1/deploymentpolicies"
OWNER = "e2e.nodewright.io/owner"
RACKS = 3


async def test_a_budget_of_one_rack_disrupts_whole_racks_one_at_a_time(
    cluster: ControlPlane, operator: Any, kube: KubeClient, unique: str, invariants: InvariantMonitor
) -> None:
    policy_name, nw = f"racks-{unique}", f"rk-{unique}"
    prefix = f"rk-{unique}"
    await create_policy(
        kube,
        policy_name,
        {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}},
        compartments=[
            {
                "name": "racks",
                "selector": {"matchLabels": {OWNER: unique}},
                "topologyKey": fleet.RACK_LABEL,
                "budget": {"count": 1},
                "strategy": {"fixed": {"initialBatch": 1}},
            }
        ],
    )
    try:
        async with operator_fixture.fleet_of(
            cluster, prefix, fleet.NODES_PER_RACK * RACKS, labels_extra={OWNER: unique}
        ) as names:
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
                        "packages": {"kernel": package(interrupt={"type": "reboot"})},
                    },
                },
            )
            # `why` names the node's rack (the last rack waits while the first ones roll).
            last = names[-1]
            answer = await why(cluster, last, nw)
            rack_of_last = (await kube.get(f"/api/v1/nodes/{last}"))["metadata"]["labels"][fleet.RACK_LABEL]
            assert answer["domain"] == rack_of_last, answer
            await wait_statuses(kube, prefix, nw, "complete", within=900)

            nodes = [await kube.get(f"/api/v1/nodes/{n}") for n in names]
            batches: dict[str, set[int]] = {}
            for node in nodes:
                meta = node["metadata"]
                admission = decode_admission(meta["annotations"][admission_annotation(nw)])
                assert admission.compartment == "racks", admission
                batches.setdefault(meta["labels"][fleet.RACK_LABEL], set()).add(admission.batch)
            assert len(batches) == RACKS, batches
            # Every rack was admitted whole (one batch), and each rack had a batch of its own.
            assert all(len(b) == 1 for b in batches.values()), batches
            assert len({b for bs in batches.values() for b in bs}) == RACKS, batches

            await invariants.sync()
            assert not invariants.breaches_of("I11") and not invariants.breaches_of("I1"), invariants.report()
            assert invariants.max_domains_disrupted(nw, "racks") == 1
            assert sorted(invariants.domains_started(nw, "racks")) == sorted(batches), invariants.report()
            await delete_nodewright(kube, nw, within=120)
    finally:
        with contextlib.suppress(ApiError):
            await kube.delete(f"{NW_PATH}/{nw}")
        with contextlib.suppress(ApiError):
            await kube.delete(f"{POLICIES}/{policy_name}")


def test_the_monitor_counts_racks_of_a_topology_compartment() -> None:
    """The monitor's own compartment resolution (independent of the planner) counts domains."""
    from e2e.invariants import resolve_compartments

    nodes: dict[str, dict[str, str]] = {
        **{f"a{i}": {OWNER: "x", fleet.RACK_LABEL: "r0"} for i in range(3)},
        **{f"b{i}": {OWNER: "x", fleet.RACK_LABEL: "r1"} for i in range(3)},
        "loose": {OWNER: "x"},
    }
    nw: JSON = {"spec": {"nodeSelectors": {"matchLabels": {OWNER: "x"}}, "deploymentPolicy": "p"}}
    policy: JSON = {
        "metadata": {"name": "p"},
        "spec": {
            "default": {"budget": {"count": 1}},
            "compartments": [
                {
                    "name": "racks",
                    "selector": {"matchLabels": {OWNER: "x"}},
                    "topologyKey": fleet.RACK_LABEL,
                    "budget": {"percent": 70},
                }
            ],
        },
    }
    comps = resolve_compartments(nw, policy, nodes)
    assert comps is not None
    # 3 domains (r0, r1, the unlabelled node alone): 70% = 2 domains, not 4 of 7 nodes.
    assert comps.ceilings["racks"] == 2
    assert comps.units("racks", ["a0", "a1", "b2"]) == {"r0", "r1"}
    assert comps.domains["loose"] == "<loose>"
