"""Chained runs (`--chain-packages`) on the real control plane: a dependency chain in one pod per node.

The operator runs with its default flags, which chain (`--no-chain-packages` turns it off: the
unchained pod shape is kept by `e2e/test_lifecycle.py`'s kill test and the chaos run's `-unchained`
variants); kwok plays the chained pods (every stage of every run takes
`NODEWRIGHT_SIM_DURATION`, the failure knobs act on the package that sets them). The invariant monitor
reads each chained pod as one run per package it carries, so I7 (stage order) and I9 (one pod per
package at a time) judge every package's runs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    OperatorProcess,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    nodes_of,
    nodewright_manifest,
    package,
    package_pods,
    wait_statuses,
)
from nodewright.api import constants
from nodewright.api.nodestate import decode
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator_factory = operator_fixture.operator_factory


def chain(duration: str = "1s", *, uninstall: bool = False, **pb_env: str) -> dict[str, JSON]:
    """pa <- pb <- pc, each stage taking `duration`; `pb_env` goes to pb (the simulator's knobs)."""
    extra: dict[str, Any] = {"uninstall": {"enabled": True}} if uninstall else {}
    return {
        "pa": package(duration=duration, **extra),
        "pb": package(duration=duration, dependsOn={"pa": "1.0.0"}, env=pb_env or None, **extra),
        "pc": package(duration=duration, dependsOn={"pb": "1.0.0"}, **extra),
    }


def completed_runs(
    invariants: InvariantMonitor, nw: str, node: str
) -> list[tuple[str, str, tuple[str, ...]]]:
    return [
        (p.package, p.stage, p.succeeded) for p in invariants.stage_pods(nw) if p.node == node and p.succeeded
    ]


async def test_a_dependency_chain_installs_in_one_pod_per_node(
    cluster: ControlPlane,
    operator_factory: Callable[..., OperatorProcess],
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    operator_factory()
    prefix, nw = f"chain-{unique}", f"chain-{unique}"
    async with fleet_of(cluster, prefix, 4):
        await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages=chain()))
        nodes = await wait_statuses(kube, prefix, nw, "complete", within=120)
        for node in nodes:
            state = decode(node["metadata"]["annotations"][constants.state_annotation(nw)])
            assert {(e.name, e.stage.value, e.state.value) for e in state.packages} == {
                (name, "config", "complete") for name in ("pa", "pb", "pc")
            }, state
            name = node["metadata"]["name"]
            pods = {p.name for p in invariants.stage_pods(nw) if p.node == name}
            assert len(pods) == 1, f"one pod ran the whole chain on {name}: {pods}"
            # The monitor saw each package's run in that pod, each with apply and config done.
            assert completed_runs(invariants, nw, name) == [
                ("pa", "apply", ("apply", "config")),
                ("pb", "apply", ("apply", "config")),
                ("pc", "apply", ("apply", "config")),
            ]
        await delete_nodewright(kube, nw)
    assert not await package_pods(kube, nw)


async def test_a_failing_chained_run_keeps_what_finished_and_retries_in_its_own_pod(
    cluster: ControlPlane,
    operator_factory: Callable[..., OperatorProcess],
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    operator_factory()
    prefix, nw = f"chainfail-{unique}", f"chainfail-{unique}"
    # pb's config fails in the first pod (attempt 1) and passes in its retry (attempt 2).
    packages = chain(NODEWRIGHT_SIM_FAIL_ATTEMPTS="1", NODEWRIGHT_SIM_FAIL_STAGES="config")
    async with fleet_of(cluster, prefix, 2):
        await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages=packages))
        nodes = await wait_statuses(kube, prefix, nw, "complete", within=180)
        for node in nodes:
            name = node["metadata"]["name"]
            state = decode(node["metadata"]["annotations"][constants.state_annotation(nw)])
            pb = state.entry("pb", "1.0.0")
            assert pb is not None and pb.state.value == "complete" and pb.attempts == 2, pb
            runs = [
                (p.package, p.stage, p.succeeded, p.outcome)
                for p in invariants.stage_pods(nw)
                if p.node == name
            ]
            # First pod: pa done, pb's apply done and its config failed, pc never started. The retry is
            # pb's config (its own pod) with pc chained after it; pa never ran again.
            assert runs == [
                ("pa", "apply", ("apply", "config"), "failed"),
                ("pb", "apply", ("apply",), "failed"),
                ("pc", "apply", (), "failed"),
                ("pb", "config", ("config",), "succeeded"),
                ("pc", "apply", ("apply", "config"), "succeeded"),
            ], runs
        await delete_nodewright(kube, nw)
    listed = await package_pods(kube, nw)
    assert not listed, json.dumps([p["metadata"]["name"] for p in listed])


async def test_an_operator_killed_while_chained_pods_run_resumes_without_rerunning(
    cluster: ControlPlane,
    operator_factory: Callable[..., OperatorProcess],
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    operator = operator_factory()
    prefix, nw = f"chainkill-{unique}", f"chainkill-{unique}"
    packages = chain("2s")
    async with fleet_of(cluster, prefix, 4):
        await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages=packages))

        async def all_started() -> bool:
            return len({p.node for p in invariants.stage_pods(nw)}) >= 4

        await fleet.wait_for(all_started, within=60, what="a chained pod on every node")
        operator.kill()
        await asyncio.sleep(4)  # runs finish inside the pods while nobody watches
        operator.start()
        await wait_statuses(kube, prefix, nw, "complete", within=120)
        # One pod per node ran the chain; nothing that finished ran again.
        pods = invariants.stage_pods(nw)
        assert len({p.name for p in pods}) == 4, sorted({p.name for p in pods})
        runs = [(p.node, p.package, s) for p in pods for s in p.succeeded]
        assert len(runs) == len(set(runs)) == 4 * 3 * 2, sorted(runs)
        await delete_nodewright(kube, nw)


async def test_deleting_the_nodewright_mid_chain_finishes_the_installs_then_uninstalls(
    cluster: ControlPlane,
    operator_factory: Callable[..., OperatorProcess],
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    operator_factory()
    prefix, nw = f"chaindel-{unique}", f"chaindel-{unique}"
    packages = chain("2s", uninstall=True)
    async with fleet_of(cluster, prefix, 2):
        await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages=packages))

        async def started() -> bool:
            return len(invariants.stage_pods(nw)) >= 2

        await fleet.wait_for(started, within=60, what="the chained pods")
        invariants.expect_cleanup(nw)
        await delete_nodewright(kube, nw, within=180)
        pods = invariants.stage_pods(nw)
        for on in {p.node for p in pods}:
            mine = [p for p in pods if p.node == on]
            # The chained install was not cut short: every package's apply and config ran, then each
            # package was uninstalled in a pod of its own.
            done = {(p.package, s) for p in mine for s in p.succeeded}
            for name in ("pa", "pb", "pc"):
                assert {(name, "apply"), (name, "config"), (name, "uninstall")} <= done, sorted(done)
            assert not [p for p in mine if p.outcome is None and not p.outcome_unknown], mine
        for left in await nodes_of(kube, prefix):
            annotations = left["metadata"].get("annotations") or {}
            assert not [k for k in annotations if k.endswith(f".{nw}")], annotations
