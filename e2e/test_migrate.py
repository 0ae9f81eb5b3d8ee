"""Issue 18 acceptance (migration from Skyhook), on the real control plane with our operator running.

Reference-format CRDs (e2e/fixtures/reference-crds.yaml), a reference DeploymentPolicy and a paused
Skyhook with three packages, and three nodes carrying the reference's node state:
- node 0: every package complete;
- node 1: `tool` still in flight (apply/in_progress);
- node 2: `kernel` (service interrupt) at config/complete, its interrupt still to come, and the node
  cordoned by the reference (`cordon_<skyhook>` + unschedulable);
- node 3: a node state the migration cannot read (an unknown stage).
The Skyhook is runtimeRequired, and node 1 carries the reference's runtime-required taint.

`nodewright migrate` without --apply prints the plan and writes nothing; with a reference operator
Deployment scaled up, --apply refuses; once it is gone, --apply creates the objects (the NodeWright
paused, as the Skyhook is) and writes the node states. The invariant monitor starts then (the cordon is
ours from its first look), the NodeWright is resumed, and the rollout finishes with package pods only for
`tool` on node 1, `kernel` on node 2 and every package on node 3 (started over, never taken for
complete); node 2's handed-over cordon is released and node 1's handed-over taint removed by our
operator. A second --apply changes nothing.

A config change the reference had deferred (its per-package ConfigMap still holds the old data) runs
the config stage under our operator, and only that.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import NAMESPACE, NW_PATH, PodCreations, nodes_of, package, wait_statuses
from nodewright.api import nodestate
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "reference-crds.yaml"
REF = "/apis/skyhook.nvidia.com/v1alpha1"
OUR_POLICIES = "/apis/nodewright.io/v1alpha1/deploymentpolicies"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"


def migrate(cluster: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodewright", "migrate", "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def run_migrate(cluster: ControlPlane, *args: str, expect: int) -> str:
    done = await asyncio.to_thread(migrate, cluster, *args)
    assert done.returncode == expect, f"migrate {args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


@pytest.fixture(scope="session")
def reference_crds(cluster: ControlPlane) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(FIXTURE))
    cluster.wait_established("-f", str(FIXTURE))


def _entry(name: str, version: str, stage: str, state: str) -> tuple[str, JSON]:
    return f"{name}|{version}", {
        "name": name,
        "version": version,
        "image": f"ghcr.io/example/{name}:{version}",
        "stage": stage,
        "state": state,
        "restarts": 0,
    }


def _reference_state(*entries: tuple[str, JSON]) -> str:
    return json.dumps(dict(entries))


async def test_migrate_hands_over_without_rerunning_completed_packages(
    cluster: ControlPlane, reference_crds: None, operator: Any, kube: KubeClient, unique: str
) -> None:
    name = f"mig-{unique}"
    prefix = f"mig-{unique}"
    policy = {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "DeploymentPolicy",
        "metadata": {"name": name},
        "spec": {"default": {"budget": {"count": 3}, "strategy": {"fixed": {"initialBatch": 3}}}},
    }
    skyhook = {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": name, "annotations": {"skyhook.nvidia.com/pause": "true"}},
        "spec": {
            "nodeSelectors": {"matchLabels": {fleet.FLEET_LABEL: prefix}},
            "deploymentPolicy": name,
            "runtimeRequired": True,
            "packages": {
                "base": package("1.0.0", image="ghcr.io/example/base", configMap={"a.conf": "x=1"}),
                "kernel": package(
                    "2.0.0",
                    image="ghcr.io/example/kernel",
                    interrupt={"type": "service", "services": ["containerd"]},
                ),
                "tool": package("1.0.0", image="ghcr.io/example/tool:latest"),
            },
        },
    }
    state_key, cordon_key = f"skyhook.nvidia.com/nodeState_{name}", f"skyhook.nvidia.com/cordon_{name}"
    base_done = _entry("base", "1.0.0", "config", "complete")
    kernel_done = _entry("kernel", "2.0.0", "post-interrupt", "complete")
    tool_done = _entry("tool", "1.0.0", "config", "complete")
    reference_states = [
        _reference_state(base_done, kernel_done, tool_done),
        _reference_state(base_done, kernel_done, _entry("tool", "1.0.0", "apply", "in_progress")),
        _reference_state(base_done, _entry("kernel", "2.0.0", "config", "complete"), tool_done),
        _reference_state(base_done, kernel_done, _entry("tool", "1.0.0", "bake", "complete")),
    ]
    await kube.create(f"{REF}/deploymentpolicies", policy)
    await kube.create(f"{REF}/skyhooks", skyhook)
    try:
        async with operator_fixture.fleet_of(cluster, prefix, 4) as names:
            for node, text in zip(names, reference_states, strict=True):
                await kube.merge_patch(
                    f"/api/v1/nodes/{node}", {"metadata": {"annotations": {state_key: text}}}
                )
            cordoned, tainted, malformed = names[2], names[1], names[3]
            await kube.merge_patch(
                f"/api/v1/nodes/{tainted}",
                {
                    "spec": {
                        "taints": [
                            {"key": "skyhook.nvidia.com", "value": "runtime-required", "effect": "NoSchedule"}
                        ]
                    }
                },
            )
            await kube.merge_patch(
                f"/api/v1/nodes/{cordoned}",
                {"metadata": {"annotations": {cordon_key: "true"}}, "spec": {"unschedulable": True}},
            )

            # Dry run: the plan, and nothing written.
            plan = await run_migrate(cluster, expect=0)
            assert f"Skyhook {name} -> NodeWright {name} (paused, as the Skyhook is)" in plan, plan
            assert (
                f"node {names[0]}: Skyhook {name}: complete base|1.0.0, kernel|2.0.0, tool|1.0.0" in plan
            ), plan
            assert "tool|1.0.0: apply (was apply/in_progress)" in plan, plan
            assert f"node {cordoned}: Skyhook {name}:" in plan and "cordon handed over" in plan, plan
            assert "tag 'latest' dropped" in plan, plan
            assert f"node {malformed}: Skyhook {name}: invalid:" in plan and "unknown stage 'bake'" in plan, (
                plan
            )
            assert f"node {tainted}: runtime-required taint skyhook.nvidia.com handed over" in plan, plan
            assert (await operator_fixture.get_nodewright(kube, name)) is None
            for listed in await nodes_of(kube, prefix):
                assert f"nodewright.io/state.{name}" not in (listed["metadata"].get("annotations") or {})

            # While the reference operator runs, --apply refuses and writes nothing.
            await kube.create(DEPLOYMENTS, _reference_operator_deployment(unique))
            refused = await asyncio.to_thread(migrate, cluster, "--apply")
            assert refused.returncode == 1, refused.stdout
            assert "refusing --apply while the reference operator may still act" in refused.stderr
            assert (await operator_fixture.get_nodewright(kube, name)) is None
            await kube.delete(f"{DEPLOYMENTS}/skyhook-operator-{unique}")

            async with PodCreations(kube, name) as pods:
                applied = await run_migrate(cluster, "--apply", expect=0)
                assert f"NodeWright {name}: created" in applied, applied
                nw = await operator_fixture.get_nodewright(kube, name)
                assert nw is not None and nw["metadata"]["annotations"]["nodewright.io/pause"] == "true"
                assert (await kube.get(f"{OUR_POLICIES}/{name}"))["metadata"]["name"] == name
                written = {
                    n["metadata"]["name"]: (n["metadata"].get("annotations") or {}).get(
                        f"nodewright.io/state.{name}"
                    )
                    for n in await nodes_of(kube, prefix)
                }
                states = {node: nodestate.decode(text) for node, text in written.items() if text is not None}
                assert states[cordoned].cordoned and not states[names[0]].cordoned
                assert malformed not in states, "nothing is written for a node state that cannot be read"
                taints = (await kube.get(f"/api/v1/nodes/{tainted}"))["spec"]["taints"]
                assert [t["key"] for t in taints] == ["nodewright.io/runtime-required"], taints

                monitor = InvariantMonitor(cluster.kubeconfig, namespace=cluster.namespace)
                await monitor.start()
                try:
                    await kube.merge_patch(
                        f"{NW_PATH}/{name}", {"metadata": {"annotations": {"nodewright.io/pause": None}}}
                    )
                    done = await wait_statuses(kube, prefix, name, "complete", within=180)
                    await monitor.final_check()
                finally:
                    await monitor.stop()
                assert not monitor.failures and not monitor.breaches, monitor.report()

                by_node = {n["metadata"]["name"]: n for n in done}
                assert not by_node[cordoned]["spec"].get("unschedulable"), (
                    "the handed-over cordon was not released"
                )
                assert not by_node[tainted]["spec"].get("taints"), "the handed-over taint was not removed"
                # The second run finds everything migrated already and changes nothing.
                again = await run_migrate(cluster, "--apply", expect=0)
                assert f"NodeWright {name}: exists" in again and "left as is" in again, again
                await asyncio.sleep(2)
            created = {(node, pkg) for _pod, node, pkg, _stage, _attempt in pods.created}
            assert created == {
                (names[1], "tool"),
                (cordoned, "kernel"),
                (malformed, "base"),
                (malformed, "kernel"),
                (malformed, "tool"),
            }, pods.created
            stages = sorted(stage for _pod, node, pkg, stage, _a in pods.created if node == cordoned)
            assert stages == ["apply", "interrupt", "post-interrupt"], pods.created
            await operator_fixture.delete_nodewright(kube, name)
    finally:
        await kube.delete(f"{OUR_POLICIES}/{name}")
        await kube.delete(f"{REF}/skyhooks/{name}")
        await kube.delete(f"{REF}/deploymentpolicies/{name}")


def _reference_operator_deployment(unique: str) -> JSON:
    labels = {"app": f"skyhook-operator-{unique}"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"skyhook-operator-{unique}"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [{"name": "manager", "image": "nvcr.io/nvidia/skyhook/operator:v0.15.0"}]
                },
            },
        },
    }


async def test_a_config_change_the_reference_deferred_runs_after_the_migration(
    cluster: ControlPlane,
    reference_crds: None,
    operator: Any,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """The reference updates a package's ConfigMap only once every node is complete: until then its
    complete nodes run the old data. The migration records what the reference ConfigMap holds, so the
    new configMap runs its config stage under our operator (and nothing else runs)."""
    name = f"migc-{unique}"
    prefix = f"migc-{unique}"
    skyhook = {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": name},
        "spec": {
            "nodeSelectors": {"matchLabels": {fleet.FLEET_LABEL: prefix}},
            "interruptionBudget": {"count": 2},
            "packages": {
                "base": package("1.0.0", image="ghcr.io/example/base", configMap={"a.conf": "x=1"}),
                "other": package("1.0.0", image="ghcr.io/example/other", configMap={"b.conf": "y=1"}),
            },
        },
    }
    applied = {"base": {"a.conf": "x=0"}, "other": {"b.conf": "y=1"}}  # base's new data not applied yet
    configmaps = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    for pkg, data in applied.items():
        await kube.create(
            configmaps,
            {
                "metadata": {
                    "name": f"{name}-{pkg}-1.0.0",
                    "labels": {"skyhook.nvidia.com/name": name},
                    "annotations": {
                        "skyhook.nvidia.com/name": name,
                        "skyhook.nvidia.com/Package.Name": pkg,
                        "skyhook.nvidia.com/Package.Version": "1.0.0",
                    },
                },
                "data": data,
            },
        )
    await kube.create(f"{REF}/skyhooks", skyhook)
    state = _reference_state(
        _entry("base", "1.0.0", "config", "complete"), _entry("other", "1.0.0", "config", "complete")
    )
    try:
        async with operator_fixture.fleet_of(cluster, prefix, 2) as names:
            for node in names:
                await kube.merge_patch(
                    f"/api/v1/nodes/{node}",
                    {"metadata": {"annotations": {f"skyhook.nvidia.com/nodeState_{name}": state}}},
                )
            await invariants.sync()
            async with PodCreations(kube, name) as pods:
                await run_migrate(cluster, "--apply", expect=0)
                await wait_statuses(kube, prefix, name, "complete", within=120)
                await asyncio.sleep(2)
            assert sorted((node, pkg, stage) for _p, node, pkg, stage, _a in pods.created) == [
                (node, "base", "config") for node in sorted(names)
            ], pods.created
            await operator_fixture.delete_nodewright(kube, name)
    finally:
        await kube.delete(f"{REF}/skyhooks/{name}")
        for pkg in applied:
            await kube.delete(f"{configmaps}/{name}-{pkg}-1.0.0")
