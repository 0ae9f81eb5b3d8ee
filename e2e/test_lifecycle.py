"""Issue 5 scenarios: the node controller and the rollout controller together on the real control plane.

Each test creates its own fleet (`<test>-<unique>` nodes selected by `sim.nodewright.io/fleet`), its
own NodeWright(s), runs the operator as a subprocess (`e2e/operator_fixture.py`), and deletes what it
made while the operator still runs (so the finalizer is released). Simulated stages take 1 s.
"""

from __future__ import annotations

import asyncio
from typing import Any

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    OperatorProcess,
    PodCreations,
    condition_of,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    get_nodewright,
    nodes_of,
    nodewright_manifest,
    package,
    package_pods,
    patch_nodewright,
    status_of,
    wait_statuses,
)
from nodewright.api.nodestate import decode
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import KubeClient


async def generation_of(kube: KubeClient, nw: str) -> int:
    obj = await get_nodewright(kube, nw)
    assert obj is not None
    return int(obj["metadata"]["generation"])


# Fixtures of the operator module, registered in this test module.
crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory


def state_of(node: dict[str, Any], nw: str) -> Any:
    return decode(node["metadata"]["annotations"][f"nodewright.io/state.{nw}"])


async def test_single_package_completes(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"single-{unique}", f"single-{unique}"
    async with fleet_of(cluster, prefix, 5):
        await create_nodewright(
            kube, nodewright_manifest(nw, fleet_prefix=prefix, packages={"tool": package()})
        )
        nodes = await wait_statuses(kube, prefix, nw, "complete", within=120)
        for node in nodes:
            state = state_of(node, nw)
            entry = state.entry("tool", "1.0.0")
            assert entry is not None and entry.state.value == "complete", state
            cond = condition_of(node, nw)
            assert cond is not None and cond["status"] == "True", cond
            assert not node["spec"].get("unschedulable")
        await delete_nodewright(kube, nw)


async def stages_run(kube: KubeClient, nw: str) -> list[tuple[str, str, str, str]]:
    """(node, package, version, stage) of every package pod currently in the namespace."""
    return sorted(
        (
            p["spec"]["nodeName"],
            p["metadata"]["labels"]["nodewright.io/package"],
            p["metadata"]["labels"]["nodewright.io/version"],
            p["metadata"]["labels"]["nodewright.io/stage"],
        )
        for p in await package_pods(kube, nw)
    )


async def test_upgrade_runs_upgrade_not_apply_and_config_change_runs_config_only(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"upg-{unique}", f"upg-{unique}"
    async with fleet_of(cluster, prefix, 3):
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw, fleet_prefix=prefix, packages={"tool": package("1.0.0", configMap={"a.conf": "1"})}
            ),
        )
        await wait_statuses(kube, prefix, nw, "complete", within=120)
        async with PodCreations(kube, nw) as watch:
            await patch_nodewright(kube, nw, {"spec": {"packages": {"tool": {"version": "1.1.0"}}}})
            nodes = await wait_statuses(
                kube, prefix, nw, "complete", within=120, generation=await generation_of(kube, nw)
            )
            stages = sorted({stage for _, _, _, stage, _ in watch.created})
            assert stages == ["config", "upgrade"], watch.created
        for node in nodes:
            state = state_of(node, nw)
            assert [e.version for e in state.packages] == ["1.1.0"], state
        # Config: add a key, change a key, remove a key: each re-runs config alone.
        old: dict[str, str] = {"a.conf": "1"}
        for data in ({"a.conf": "1", "b.conf": "x"}, {"a.conf": "2", "b.conf": "x"}, {"a.conf": "2"}):
            change: dict[str, str | None] = {**data, **{k: None for k in old if k not in data}}
            old = data
            async with PodCreations(kube, nw) as watch:
                await patch_nodewright(kube, nw, {"spec": {"packages": {"tool": {"configMap": change}}}})
                await wait_statuses(
                    kube, prefix, nw, "complete", within=120, generation=await generation_of(kube, nw)
                )
                assert {stage for _, _, _, stage, _ in watch.created} == {"config"}, (data, watch.created)
        cm = await kube.get(f"/api/v1/namespaces/nodewright-system/configmaps/{nw}-tool-1.1.0")
        assert cm["data"] == {"a.conf": "2"}
        await delete_nodewright(kube, nw)


async def test_stage_failing_twice_then_succeeding_completes(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"retry-{unique}", f"retry-{unique}"
    async with fleet_of(cluster, prefix, 2):
        async with PodCreations(kube, nw) as watch:
            pkg = package(
                env={"NODEWRIGHT_SIM_FAIL_ATTEMPTS": "2", "NODEWRIGHT_SIM_FAIL_STAGES": "apply"},
                maxAttempts=3,
            )
            await create_nodewright(
                kube, nodewright_manifest(nw, fleet_prefix=prefix, packages={"tool": pkg})
            )
            # Backoff 10 s then 20 s between the attempts.
            nodes = await wait_statuses(kube, prefix, nw, "complete", within=150)
            applies = [c for c in watch.created if c[3] == "apply"]
            assert sorted(a[4] for a in applies) == ["1", "1", "2", "2", "3", "3"], watch.created
        assert all(not state_of(n, nw).entry("tool", "1.0.0").error for n in nodes)
        await delete_nodewright(kube, nw)


async def test_image_pull_error_reports_erroring_with_reason(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"pull-{unique}", f"pull-{unique}"
    async with fleet_of(cluster, prefix, 1):
        pkg = package(env={"NODEWRIGHT_SIM_IMAGE_PULL_ERROR": "true"}, maxAttempts=1)
        await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages={"tool": pkg}))
        # One attempt: 60 s of pull errors make it a failed attempt, then erroring.
        nodes = await wait_statuses(kube, prefix, nw, "erroring", within=120)
        message = (condition_of(nodes[0], nw) or {}).get("message", "")
        assert "ImagePullBackOff" in message or "ErrImagePull" in message, message
        await delete_nodewright(kube, nw)


async def test_operator_killed_mid_rollout_resumes_without_rerunning(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"kill-{unique}", f"kill-{unique}"
    async with fleet_of(cluster, prefix, 4), PodCreations(kube, nw) as watch:
        packages = {
            "alpha": package(duration="2s"),
            "beta": package(duration="2s", dependsOn={"alpha": "1.0.0"}),
        }
        await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages=packages))

        async def some_started() -> bool:
            return len(watch.created) >= 2

        await fleet.wait_for(some_started, within=30, what="first package pods")
        operator.kill()
        await asyncio.sleep(3)  # stages finish while nobody watches
        operator.start()
        await wait_statuses(kube, prefix, nw, "complete", within=120)
        # Exactly one pod per (node, package, stage): nothing finished was re-run.
        keys = [(node, pkg, stage) for _, node, pkg, stage, _ in watch.created]
        assert len(keys) == len(set(keys)) == 4 * 2 * 2, sorted(keys)
        await delete_nodewright(kube, nw)


async def test_malformed_state_is_left_alone_and_recovers(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"bad-{unique}", f"bad-{unique}"
    async with fleet_of(cluster, prefix, 2) as names:
        bad = names[0]
        key = f"nodewright.io/state.{nw}"
        await kube.merge_patch(f"/api/v1/nodes/{bad}", {"metadata": {"annotations": {key: "{not json"}}})
        await create_nodewright(
            kube, nodewright_manifest(nw, fleet_prefix=prefix, packages={"tool": package()})
        )
        await wait_statuses(kube, prefix, nw, "complete", within=90, count=1)
        await asyncio.sleep(3)
        node = await kube.get(f"/api/v1/nodes/{bad}")
        assert node["metadata"]["annotations"][key] == "{not json", "the malformed annotation was overwritten"
        assert status_of(node, nw) is None
        await kube.merge_patch(f"/api/v1/nodes/{bad}", {"metadata": {"annotations": {key: None}}})
        await wait_statuses(kube, prefix, nw, "complete", within=90)
        await delete_nodewright(kube, nw)


async def test_delete_with_uninstall_cleans_nodes(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"del-{unique}", f"del-{unique}"
    async with fleet_of(cluster, prefix, 2):
        packages = {
            "gone": package(uninstall={"enabled": True}),
            "stays": package(),
        }
        await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages=packages))
        await wait_statuses(kube, prefix, nw, "complete", within=90)
        invariants.expect_cleanup(nw)
        await delete_nodewright(kube, nw, within=120)
        for node in await nodes_of(kube, prefix):
            assert status_of(node, nw) is None
            assert condition_of(node, nw) is None
            state = state_of(node, nw)  # files of "stays" remain on the host (D2)
            assert [e.name for e in state.packages] == ["stays"], state
            assert not node["spec"].get("unschedulable")
