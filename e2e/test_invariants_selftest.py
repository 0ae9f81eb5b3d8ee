"""Self-test of the invariant monitor: every invariant is breached by hand on the real control plane.

No operator runs here. Each test plays a misbehaving operator (or admin) with plain API calls — labels
and state annotations on nodes, package pods from `fleet.package_pod_manifest`, evictions through the
Eviction API, status patches — and asserts that the monitor reports exactly the expected invariant on
the expected node, while a correct variant of the same action next to it is not reported. The last
test plays a correct operator through a full interrupt-bearing rollout with the `invariants` fixture,
which must stay clean. A monitor that can never fail would fail these tests.

The pure helpers (compartment assignment, halted compartments, pod outcome) are also cross-checked
against the planner here: they are deliberately re-implemented, so an agreement test keeps the two
honest without making the monitor depend on the code under test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from e2e.invariants import (
    Breach,
    InvariantMonitor,
    MonitorFailure,
    halted_compartments,
    pod_outcome,
    resolve_compartments,
)
from nodewright.api import constants as c
from nodewright.api.models import DeploymentPolicy, NodeWright
from nodewright.api.nodestate import Admission, NodeState, PackageEntry, PackageStage, PackageState, encode
from nodewright.plan.policy import Compartments, NodeRef
from nodewright.plan.policy import resolve_compartments as plan_resolve
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, ApiError, KubeClient

CRDS = Path(__file__).resolve().parent.parent / "manifests" / "crds"
NW_PATH = f"/apis/{c.GROUP}/{c.VERSION}/{c.PLURAL_NODEWRIGHT}"
DP_PATH = f"/apis/{c.GROUP}/{c.VERSION}/{c.PLURAL_POLICY}"
NOW = "2026-01-01T00:00:00Z"
LONG = {"NODEWRIGHT_SIM_DURATION": "120s"}
FAST = {"NODEWRIGHT_SIM_DURATION": "200ms"}
LINGER = {"NODEWRIGHT_SIM_TERMINATE_AFTER": "60s"}
FORCE = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}


# ----------------------------------------------------------------------------------------------------
# Fixtures and helpers


@pytest.fixture(scope="module")
def crds(cluster: ControlPlane) -> None:
    """The CRDs (shared by the session, idempotent, left installed like the other e2e modules do)."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    cluster.wait_established("-f", str(CRDS))


@dataclass
class Scratch:
    """What a test created; deleted at teardown (after the `invariants` fixture's final check)."""

    client: KubeClient
    ns: str
    kubeconfig: Path
    prefixes: list[str] = field(default_factory=list)
    nodewrights: list[str] = field(default_factory=list)
    policies: list[str] = field(default_factory=list)
    jobs: list[fleet.TrainingJob] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)

    async def nodes(self, prefix: str, count: int, **kwargs: Any) -> list[str]:
        self.prefixes.append(prefix)
        return await fleet.create_nodes(self.kubeconfig, count=count, name_prefix=prefix, **kwargs)

    async def nodewright(self, name: str, spec: JSON) -> None:
        self.nodewrights.append(name)
        body = {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND_NODEWRIGHT,
            "metadata": {"name": name},
            "spec": spec,
        }
        await self.client.create(NW_PATH, body)

    async def policy(self, name: str, spec: JSON) -> None:
        self.policies.append(name)
        body = {"apiVersion": c.API_VERSION, "kind": c.KIND_POLICY, "metadata": {"name": name}, "spec": spec}
        await self.client.create(DP_PATH, body)

    async def workloads(self, **kwargs: Any) -> fleet.TrainingJob:
        job = await fleet.create_workloads(self.kubeconfig, **kwargs)
        self.jobs.append(job)
        return job

    async def package_pod(self, **kwargs: Any) -> str:
        manifest = fleet.package_pod_manifest(namespace=self.ns, **kwargs)
        self.pods.append(manifest["metadata"]["name"])
        await self.client.create(f"/api/v1/namespaces/{self.ns}/pods", manifest)
        return str(manifest["metadata"]["name"])


@pytest.fixture
async def scratch(cluster: ControlPlane) -> AsyncIterator[Scratch]:
    async with KubeClient(cluster.kubeconfig) as client:
        s = Scratch(client=client, ns=cluster.namespace, kubeconfig=cluster.kubeconfig)
        try:
            yield s
        finally:
            for job in s.jobs:
                await fleet.delete_workloads(cluster.kubeconfig, job)
            for pod in s.pods:
                # Grace 0: a pod left terminating by NODEWRIGHT_SIM_TERMINATE_AFTER goes at once too.
                await client.delete(f"/api/v1/namespaces/{s.ns}/pods/{pod}", body=FORCE)
            for nw in s.nodewrights:
                await client.delete(f"{NW_PATH}/{nw}")
            for dp in s.policies:
                await client.delete(f"{DP_PATH}/{dp}")
            for prefix in s.prefixes:
                await fleet.delete_nodes(cluster.kubeconfig, name_prefix=prefix)


@pytest.fixture
async def monitor(cluster: ControlPlane) -> AsyncIterator[InvariantMonitor]:
    """A monitor of the test's own, expected to record breaches (so not the failing fixture)."""
    async with InvariantMonitor(cluster.kubeconfig, namespace=cluster.namespace) as m:
        yield m
        assert not m.failures, m.report()


def state(
    *,
    cordoned: bool = False,
    admission: tuple[str, int, int] | None = None,
    packages: tuple[tuple[str, str, PackageStage, PackageState], ...] = (),
) -> str:
    return encode(
        NodeState(
            packages=tuple(PackageEntry(name=n, version=v, stage=s, state=t) for n, v, s, t in packages),
            admission=Admission(admission[0], admission[1], admission[2], NOW) if admission else None,
            cordoned=cordoned,
        )
    )


async def patch_node(
    client: KubeClient,
    name: str,
    *,
    labels: Mapping[str, str | None] | None = None,
    annotations: Mapping[str, str | None] | None = None,
    unschedulable: bool | None = None,
) -> None:
    """One merge patch: what the operator does when it writes state and cordon together."""
    body: JSON = {"metadata": {}}
    if labels is not None:
        body["metadata"]["labels"] = dict(labels)
    if annotations is not None:
        body["metadata"]["annotations"] = dict(annotations)
    if unschedulable is not None:
        body["spec"] = {"unschedulable": unschedulable}
    await client.merge_patch(f"/api/v1/nodes/{name}", body)


async def evict(client: KubeClient, namespace: str, pod: str) -> None:
    await client.create(
        f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction",
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}},
    )


async def wait_pod_outcome(client: KubeClient, namespace: str, pod: str, outcome: str) -> None:
    async def probe() -> bool:
        return pod_outcome(await client.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")) == outcome

    await fleet.wait_for(probe, within=30, what=f"pod {pod} {outcome}")


def nw_spec(prefix: str, **extra: Any) -> JSON:
    return {
        "nodeSelectors": {"matchLabels": {fleet.FLEET_LABEL: prefix}},
        "packages": {"pkg": {"version": "1.0.0", "image": "registry.local/packages/pkg"}},
        **extra,
    }


def count_policy(prefix: str, count: int) -> JSON:
    return {
        "default": {"budget": {"count": 5}, "strategy": {"fixed": {}}},
        "compartments": [
            {
                "name": "fleet",
                "selector": {"matchLabels": {fleet.FLEET_LABEL: prefix}},
                "budget": {"count": count},
                "strategy": {"fixed": {}},
            }
        ],
    }


# ----------------------------------------------------------------------------------------------------
# Pure cross-checks (no cluster)


def _labels(i: int) -> dict[str, str]:
    return {"zone": "abc"[i % 3], "rack": str(i % 4), "gpu": "b200" if i % 5 == 0 else "h100"}


@pytest.mark.parametrize(
    "policy_spec",
    [
        {"default": {"budget": {"percent": 50}, "strategy": {"fixed": {}}}},
        {
            "default": {"budget": {"count": 3}, "strategy": {"linear": {}}},
            "compartments": [
                # Overlaps: a node in zone a and rack 0 matches both; the fixed strategy wins.
                {"name": "za", "selector": {"matchLabels": {"zone": "a"}}, "budget": {"count": 4}},
                {
                    "name": "r0",
                    "selector": {"matchLabels": {"rack": "0"}},
                    "budget": {"percent": 20},
                    "strategy": {"fixed": {}},
                },
            ],
        },
        {
            "default": {"budget": {"count": 1}, "strategy": {"fixed": {}}},
            "compartments": [
                # Same strategy: the smaller ceiling wins, then the name.
                {
                    "name": "big",
                    "selector": {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]},
                    "budget": {"percent": 50},
                    "strategy": {"exponential": {}},
                },
                {
                    "name": "small",
                    "selector": {"matchExpressions": [{"key": "rack", "operator": "NotIn", "values": ["3"]}]},
                    "budget": {"count": 1},
                    "strategy": {"exponential": {}},
                },
                {
                    "name": "also-small",
                    "selector": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
                    "budget": {"count": 1},
                    "strategy": {"exponential": {}},
                },
            ],
        },
    ],
)
def test_compartments_agree_with_planner(policy_spec: JSON) -> None:
    nodes = {f"n{i}": _labels(i) for i in range(23)}
    nw: JSON = {"metadata": {"name": "nw"}, "spec": {"deploymentPolicy": "dp", "packages": {}}}
    dp: JSON = {"metadata": {"name": "dp"}, "spec": policy_spec}
    mine = resolve_compartments(nw, dp, nodes)
    theirs = plan_resolve(
        NodeWright.model_validate(nw),
        policy=DeploymentPolicy.model_validate(dp),
        nodes=[NodeRef(n, lb) for n, lb in nodes.items()],
    )
    assert mine is not None and isinstance(theirs, Compartments)
    assert dict(mine.assignment) == dict(theirs.assignment)
    assert {k: mine.ceilings[k] for k in theirs.specs} == {k: theirs.ceiling(k) for k in theirs.specs}


@pytest.mark.parametrize(
    ("budget", "expected"),
    [(None, 10), ({"count": 0}, 1), ({"count": 3}, 3), ({"percent": 25}, 2), ({"percent": 1}, 1)],
)
def test_legacy_ceiling(budget: JSON | None, expected: int) -> None:
    spec: JSON = {"packages": {}} | ({"interruptionBudget": budget} if budget is not None else {})
    resolved = resolve_compartments(
        {"metadata": {"name": "x"}, "spec": spec}, None, {f"n{i}": {} for i in range(10)}
    )
    assert resolved is not None
    assert resolved.ceilings[c.DEFAULT_COMPARTMENT] == expected
    assert resolve_compartments({"spec": {"deploymentPolicy": "gone"}}, None, {"n": {}}) is None


def test_halted_compartments_from_condition_and_batch_state() -> None:
    nw = {
        "status": {
            "compartmentStatuses": {"a": {"batchState": {"shouldStop": True}}, "b": {"batchState": {}}},
            "conditions": [
                {
                    "type": "Halted",
                    "status": "True",
                    "message": "compartment 'gpu-z' halted after 2 consecutive failed batches; failing nodes:"
                    " x; compartment 'cpu' halted after 3 consecutive failed batches",
                }
            ],
        }
    }
    assert set(halted_compartments(nw)) == {"a", "gpu-z", "cpu"}
    nw["status"]["conditions"][0]["status"] = "False"  # type: ignore[index]
    assert set(halted_compartments(nw)) == {"a"}


def test_pod_outcome_shapes() -> None:
    spec = {"initContainers": [{"name": "a"}, {"name": "b"}]}
    done = {"state": {"terminated": {"exitCode": 0}}}
    assert pod_outcome(
        {"spec": spec, "status": {"phase": "Running", "initContainerStatuses": [done, done]}}
    ) == ("succeeded")
    running: JSON = {"state": {"running": {}}}
    assert (
        pod_outcome({"spec": spec, "status": {"phase": "Pending", "initContainerStatuses": [done, running]}})
        is None
    )
    assert pod_outcome({"spec": spec, "status": {"phase": "Failed"}}) == "failed"
    assert pod_outcome({"status": {"phase": "Succeeded"}}) == "succeeded"
    # A real kubelet between the last init container's exit and pause's start (or deleted then).
    assert pod_outcome(
        {"spec": spec, "status": {"phase": "Pending", "initContainerStatuses": [done, done]}}
    ) == ("succeeded")


# ----------------------------------------------------------------------------------------------------
# Each invariant breached by hand


async def test_i1_budget_cap(crds: None, scratch: Scratch, monitor: InvariantMonitor, unique: str) -> None:
    prefix = f"i1-{unique}"
    nodes = await scratch.nodes(prefix, 3)
    await scratch.policy(prefix, count_policy(prefix, 1))
    await scratch.nodewright(prefix, nw_spec(prefix, deploymentPolicy=prefix))
    await monitor.sync()
    label = c.status_label(prefix)
    await patch_node(scratch.client, nodes[0], labels={label: "in_progress"})
    await patch_node(scratch.client, nodes[2], labels={label: "complete"})
    await monitor.sync()
    assert not monitor.breaches_of("I1"), monitor.report()
    await patch_node(scratch.client, nodes[1], labels={label: "in_progress"})
    breach = await monitor.wait_for_breach("I1", node=nodes[1])
    assert "ceiling 1" in breach.summary and breach.nodewright == prefix
    assert len(monitor.breaches_of("I1")) == 1


async def test_i2_package_pods_over_ceiling(
    crds: None, scratch: Scratch, monitor: InvariantMonitor, unique: str
) -> None:
    prefix = f"i2-{unique}"
    nodes = await scratch.nodes(prefix, 3)
    await scratch.policy(prefix, count_policy(prefix, 2))
    await scratch.nodewright(prefix, nw_spec(prefix, deploymentPolicy=prefix))
    await monitor.sync()
    for i, node in enumerate(nodes[:2]):
        await scratch.package_pod(name=f"{prefix}-a{i}", node=node, nodewright=prefix, env=LONG)
    # A second pod on a node that already has one does not add a busy node.
    await scratch.package_pod(
        name=f"{prefix}-b0", node=nodes[0], package="other", nodewright=prefix, env=LONG
    )
    await monitor.sync()
    assert not monitor.breaches_of("I2"), monitor.report()
    await scratch.package_pod(name=f"{prefix}-a2", node=nodes[2], nodewright=prefix, env=LONG)
    breach = await monitor.wait_for_breach("I2", node=nodes[2])
    assert "3 nodes" in breach.summary and "ceiling 2" in breach.summary


async def test_i3_eviction_and_interrupt_without_a_cordon(
    scratch: Scratch, monitor: InvariantMonitor, unique: str
) -> None:
    prefix = f"i3-{unique}"
    free, ours, admin = await scratch.nodes(prefix, 3)
    nw = prefix
    await patch_node(
        scratch.client, ours, annotations={c.state_annotation(nw): state(cordoned=True)}, unschedulable=True
    )
    # Cordoned by an admin: out of service already, so working on it is allowed (it stays cordoned).
    await patch_node(scratch.client, admin, unschedulable=True)
    job = await scratch.workloads(nodes=[free, ours, admin], job=prefix)
    await monitor.sync()
    for pod in job.pods:
        await evict(scratch.client, job.namespace, pod)
    await monitor.wait_for_breach("I3", node=free)
    await scratch.package_pod(
        name=f"{prefix}-int-free",
        node=free,
        stage="interrupt",
        nodewright=nw,
        interrupt={"type": "service"},
        env=LONG,
    )
    await scratch.package_pod(
        name=f"{prefix}-int-ours",
        node=ours,
        stage="interrupt",
        nodewright=nw,
        interrupt={"type": "service"},
        env=LONG,
    )
    await monitor.sync()
    breaches = monitor.breaches_of("I3", node=free)
    assert any("interrupt pod" in b.summary for b in breaches), monitor.report()
    assert any("workload pod" in b.summary for b in breaches), monitor.report()
    assert not monitor.breaches_of("I3", node=ours), monitor.report()
    assert not monitor.breaches_of("I3", node=admin), monitor.report()


async def test_i4_protected_pods(
    crds: None, scratch: Scratch, monitor: InvariantMonitor, unique: str
) -> None:
    prefix = f"i4-{unique}"
    node, other = await scratch.nodes(prefix, 2)
    protected = {"matchLabels": {fleet.PROTECTED_LABEL: "true"}}
    await scratch.nodewright(prefix, nw_spec(prefix, podNonInterruptLabels=protected))
    cordon = {c.state_annotation(prefix): state(cordoned=True)}
    for n in (node, other):
        await patch_node(scratch.client, n, annotations=cordon, unschedulable=True)
    job = await scratch.workloads(nodes=[node], job=prefix, protected=True)
    plain = await scratch.workloads(nodes=[other], job=f"{prefix}-plain")
    await monitor.sync()
    # Interrupt next to a protected pod; an interrupt next to an unprotected one is fine.
    await scratch.package_pod(
        name=f"{prefix}-int",
        node=node,
        stage="interrupt",
        nodewright=prefix,
        interrupt={"type": "service"},
        env=LONG,
    )
    await scratch.package_pod(
        name=f"{prefix}-int-ok",
        node=other,
        stage="interrupt",
        nodewright=prefix,
        interrupt={"type": "service"},
        env=LONG,
    )
    breach = await monitor.wait_for_breach("I4", node=node)
    assert "interrupt pod created while protected pods run" in breach.summary
    await evict(scratch.client, job.namespace, job.pods[0])
    await evict(scratch.client, plain.namespace, plain.pods[0])
    await monitor.sync()
    summaries = [b.summary for b in monitor.breaches_of("I4", node=node)]
    assert any("protected pod evicted" in s for s in summaries), monitor.report()
    assert not monitor.breaches_of("I4", node=other), monitor.report()
    assert not monitor.breaches_of("I3"), monitor.report()


async def test_i5_foreign_cordon_uncordoned(cluster: ControlPlane, scratch: Scratch, unique: str) -> None:
    prefix = f"i5-{unique}"
    before, admin, allowed, ours = await scratch.nodes(prefix, 4)
    await patch_node(scratch.client, before, unschedulable=True)  # cordoned before the monitor starts
    async with InvariantMonitor(cluster.kubeconfig, namespace=cluster.namespace) as monitor:
        await patch_node(scratch.client, admin, unschedulable=True)
        await patch_node(scratch.client, allowed, unschedulable=True)
        await patch_node(
            scratch.client,
            ours,
            annotations={c.state_annotation(prefix): state(cordoned=True)},
            unschedulable=True,
        )
        await monitor.sync()
        monitor.expect_uncordon(allowed)
        for n in (before, admin, allowed):
            await patch_node(scratch.client, n, unschedulable=False)
        await patch_node(
            scratch.client,
            ours,
            annotations={c.state_annotation(prefix): state(cordoned=False)},
            unschedulable=False,
        )
        await monitor.wait_for_breach("I5", node=before)
        await monitor.wait_for_breach("I5", node=admin)
        await monitor.sync()
        assert {b.node for b in monitor.breaches_of("I5")} == {before, admin}, monitor.report()
        assert not monitor.failures


async def test_i6_complete_but_cordoned_and_leftovers(
    crds: None, scratch: Scratch, monitor: InvariantMonitor, unique: str
) -> None:
    prefix = f"i6-{unique}"
    stuck, left_cordoned, done, leftover, files = await scratch.nodes(prefix, 5)
    nw, gone = prefix, f"{prefix}-gone"
    await scratch.nodewright(nw, nw_spec(prefix))
    await scratch.nodewright(gone, nw_spec(prefix))
    await monitor.sync()
    complete = {c.status_label(nw): "complete"}
    pkg = (("pkg", "1.0.0", PackageStage.CONFIG, PackageState.COMPLETE),)
    for n in (stuck, left_cordoned, done):
        await patch_node(
            scratch.client, n, annotations={c.state_annotation(nw): state(cordoned=True)}, unschedulable=True
        )
    # Complete, but the state still claims the cordon.
    await patch_node(
        scratch.client, stuck, labels=complete, annotations={c.state_annotation(nw): state(cordoned=True)}
    )
    # Complete and released in the state, but the node was never uncordoned.
    await patch_node(
        scratch.client,
        left_cordoned,
        labels=complete,
        annotations={c.state_annotation(nw): state(packages=pkg)},
    )
    # Correct: released and uncordoned.
    await patch_node(
        scratch.client,
        done,
        labels=complete,
        annotations={c.state_annotation(nw): state(packages=pkg)},
        unschedulable=False,
    )
    await patch_node(
        scratch.client,
        leftover,
        labels={c.status_label(gone): "in_progress"},
        annotations={c.state_annotation(gone): state(admission=(c.DEFAULT_COMPARTMENT, 1, 0), packages=pkg)},
    )
    await patch_node(scratch.client, files, annotations={c.state_annotation(gone): state(packages=pkg)})
    await scratch.client.delete(f"{NW_PATH}/{gone}")
    monitor.expect_cleanup(gone)
    await monitor.final_check()
    i6 = monitor.breaches_of("I6")
    assert {b.node for b in i6} == {stuck, left_cordoned, leftover}, monitor.report()
    assert any("still says cordoned" in b.summary for b in monitor.breaches_of("I6", node=stuck))
    assert any("left unschedulable" in b.summary for b in monitor.breaches_of("I6", node=left_cordoned))
    (left,) = monitor.breaches_of("I6", node=leftover)
    assert any("label" in v for _, v in left.details) and any("beyond package" in v for _, v in left.details)


async def test_i7_stage_order(scratch: Scratch, monitor: InvariantMonitor, unique: str) -> None:
    prefix = f"i7-{unique}"
    (node,) = await scratch.nodes(prefix, 1)
    nw = prefix
    # Package a: config while apply still runs.
    await scratch.package_pod(name=f"{prefix}-a-apply", node=node, package="a", nodewright=nw, env=LONG)
    await monitor.sync()
    await scratch.package_pod(
        name=f"{prefix}-a-config", node=node, package="a", stage="config", nodewright=nw
    )
    breach = await monitor.wait_for_breach("I7", node=node)
    assert "config" in breach.summary and "unfinished" in breach.summary
    # Package b: apply then config in order (clean), then post-interrupt without any interrupt.
    await scratch.package_pod(name=f"{prefix}-b-apply", node=node, package="b", nodewright=nw, env=FAST)
    await wait_pod_outcome(scratch.client, scratch.ns, f"{prefix}-b-apply", "succeeded")
    await monitor.sync()
    await scratch.package_pod(
        name=f"{prefix}-b-config", node=node, package="b", stage="config", nodewright=nw, env=FAST
    )
    await wait_pod_outcome(scratch.client, scratch.ns, f"{prefix}-b-config", "succeeded")
    await monitor.sync()
    assert len(monitor.breaches_of("I7")) == 1, monitor.report()
    await scratch.package_pod(
        name=f"{prefix}-b-post", node=node, package="b", stage="post-interrupt", nodewright=nw
    )
    await monitor.sync()
    (_, second) = monitor.breaches_of("I7")
    assert "without an interrupt pod" in second.summary, monitor.report()


async def test_i7_reads_how_far_an_install_pod_got(
    scratch: Scratch, monitor: InvariantMonitor, unique: str
) -> None:
    """An install pod runs apply, then config: what it leaves done is read from its init containers."""
    prefix = f"i7i-{unique}"
    (node,) = await scratch.nodes(prefix, 1)
    nw = prefix
    install = ("apply", "config")
    # Package c: the install pod fails in config: apply is done, so a config pod (the retry) may follow.
    fail_config = {**FAST, "NODEWRIGHT_SIM_FAIL": "always", "NODEWRIGHT_SIM_FAIL_STAGES": "config"}
    await scratch.package_pod(
        name=f"{prefix}-c-apply", node=node, package="c", nodewright=nw, env=fail_config, stages=install
    )
    await wait_pod_outcome(scratch.client, scratch.ns, f"{prefix}-c-apply", "failed")
    await monitor.sync()
    await scratch.package_pod(
        name=f"{prefix}-c-config", node=node, package="c", stage="config", nodewright=nw, env=FAST
    )
    await wait_pod_outcome(scratch.client, scratch.ns, f"{prefix}-c-config", "succeeded")
    await monitor.sync()
    assert not monitor.breaches_of("I7"), monitor.report()
    # Package d: the install pod fails in apply: a config pod after it is a breach.
    fail_apply = {**FAST, "NODEWRIGHT_SIM_FAIL": "always", "NODEWRIGHT_SIM_FAIL_STAGES": "apply"}
    await scratch.package_pod(
        name=f"{prefix}-d-apply", node=node, package="d", nodewright=nw, env=fail_apply, stages=install
    )
    await wait_pod_outcome(scratch.client, scratch.ns, f"{prefix}-d-apply", "failed")
    await monitor.sync()
    await scratch.package_pod(
        name=f"{prefix}-d-config", node=node, package="d", stage="config", nodewright=nw, env=FAST
    )
    breach = await monitor.wait_for_breach("I7", node=node)
    assert "config before apply succeeded" in breach.summary, monitor.report()


async def test_i8_halted_compartment_admits(
    crds: None, scratch: Scratch, monitor: InvariantMonitor, unique: str
) -> None:
    prefix = f"i8-{unique}"
    before, after, reset = await scratch.nodes(prefix, 3)
    nw = prefix
    await scratch.nodewright(nw, nw_spec(prefix))
    key = c.state_annotation(nw)
    await patch_node(
        scratch.client, before, annotations={key: state(admission=(c.DEFAULT_COMPARTMENT, 1, 0))}
    )
    await scratch.client.merge_patch(
        f"{NW_PATH}/{nw}/status",
        {"status": {"compartmentStatuses": {c.DEFAULT_COMPARTMENT: {"batchState": {"shouldStop": True}}}}},
    )
    await monitor.sync()
    # An admission that existed before the halt stays; a new one (or a higher batch) is a breach.
    await patch_node(scratch.client, after, annotations={key: state(admission=(c.DEFAULT_COMPARTMENT, 2, 1))})
    breach = await monitor.wait_for_breach("I8", node=after)
    assert "halted compartment" in breach.summary
    await patch_node(
        scratch.client, before, annotations={key: state(admission=(c.DEFAULT_COMPARTMENT, 2, 0))}
    )
    await monitor.wait_for_breach("I8", node=before)
    # The test resets the batch state: admissions are allowed again.
    await scratch.client.merge_patch(
        f"{NW_PATH}/{nw}", {"metadata": {"annotations": {c.ANNOTATION_RESET_BATCH: "true"}}}
    )
    await monitor.sync()
    await patch_node(scratch.client, reset, annotations={key: state(admission=(c.DEFAULT_COMPARTMENT, 3, 2))})
    await monitor.sync()
    assert not monitor.breaches_of("I8", node=reset), monitor.report()


async def test_i8_a_new_rollout_ends_a_halt_and_the_same_one_does_not(
    crds: None, scratch: Scratch, monitor: InvariantMonitor, unique: str
) -> None:
    prefix = f"i8r-{unique}"
    same, other = await scratch.nodes(prefix, 2)
    nw = prefix
    await scratch.nodewright(nw, nw_spec(prefix))
    key = c.state_annotation(nw)
    status_path = f"{NW_PATH}/{nw}/status"
    halted = {"compartmentStatuses": {c.DEFAULT_COMPARTMENT: {"batchState": {"shouldStop": True}}}}
    calm = {"compartmentStatuses": {c.DEFAULT_COMPARTMENT: {"batchState": {"shouldStop": False}}}}
    await scratch.client.merge_patch(status_path, {"status": {**halted, "rolloutFingerprint": "f2"}})
    await monitor.sync()
    # Un-halted in the status of the same rollout: not a reset, still enforced.
    await scratch.client.merge_patch(status_path, {"status": calm})
    await monitor.sync()
    await patch_node(scratch.client, same, annotations={key: state(admission=(c.DEFAULT_COMPARTMENT, 3, 0))})
    await monitor.wait_for_breach("I8", node=same)
    # The spec came back (an undo): a new rollout, fresh batch state, its admissions are fine.
    await scratch.client.merge_patch(
        status_path, {"status": {**calm, "rolloutFingerprint": "f1", "rolloutFirstOrder": 8}}
    )
    await monitor.sync()
    await patch_node(scratch.client, other, annotations={key: state(admission=(c.DEFAULT_COMPARTMENT, 1, 8))})
    await monitor.sync()
    assert not monitor.breaches_of("I8", node=other), monitor.report()


async def pod_or_none(client: KubeClient, namespace: str, pod: str) -> JSON | None:
    try:
        return await client.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    except ApiError as err:
        if err.status == 404:
            return None
        raise


async def wait_gone(client: KubeClient, namespace: str, pod: str, *, within: float) -> None:
    async def gone() -> bool:
        return await pod_or_none(client, namespace, pod) is None

    await fleet.wait_for(gone, within=within, what=f"pod {pod} gone")


async def test_i9_one_pod_per_package_at_a_time(
    scratch: Scratch, monitor: InvariantMonitor, unique: str
) -> None:
    prefix = f"i9-{unique}"
    node, other = await scratch.nodes(prefix, 2)
    nw, ns = prefix, scratch.ns
    # Breach 1 (the uninstall-cancel case): the uninstall pod of `a` is deleted, but a step still runs,
    # so it stays terminating (the simulator's NODEWRIGHT_SIM_TERMINATE_AFTER); the apply pod of `a` is
    # created meanwhile, for another version.
    uninstall = await scratch.package_pod(
        name=f"{prefix}-a-uninstall",
        node=node,
        package="a",
        stage="uninstall",
        nodewright=nw,
        env=LONG | LINGER,
    )
    await scratch.client.delete(f"/api/v1/namespaces/{ns}/pods/{uninstall}")
    await asyncio.sleep(1.5)
    lingering = await pod_or_none(scratch.client, ns, uninstall)
    assert lingering is not None and lingering["metadata"].get("deletionTimestamp"), lingering
    await monitor.sync()
    assert not monitor.breaches_of("I9"), monitor.report()
    await scratch.package_pod(
        name=f"{prefix}-a-apply", node=node, package="a", version="2.0.0", nodewright=nw, env=LONG
    )
    breach = await monitor.wait_for_breach("I9", node=node)
    assert "still terminating" in breach.summary and "'a'" in breach.summary, breach
    # Correct next to it: another package on the same node while `a` runs.
    await scratch.package_pod(name=f"{prefix}-d-apply", node=node, package="d", nodewright=nw, env=LONG)

    # Breach 2: the apply pod of `e` is created while its uninstall pod runs (not even deleted).
    await scratch.package_pod(
        name=f"{prefix}-e-uninstall", node=other, package="e", stage="uninstall", nodewright=nw, env=LONG
    )
    await monitor.sync()
    await scratch.package_pod(
        name=f"{prefix}-e-apply", node=other, package="e", version="2.0.0", nodewright=nw, env=LONG
    )
    breach = await monitor.wait_for_breach("I9", node=other)
    assert "still running" in breach.summary and "'e'" in breach.summary, breach

    # Correct: the uninstall pod of `b` terminates for 1 s; the apply pod is created once it is gone.
    quick = {"NODEWRIGHT_SIM_TERMINATE_AFTER": "1s"}
    b_uninstall = await scratch.package_pod(
        name=f"{prefix}-b-uninstall",
        node=other,
        package="b",
        stage="uninstall",
        nodewright=nw,
        env=LONG | quick,
    )
    await monitor.sync()
    await scratch.client.delete(f"/api/v1/namespaces/{ns}/pods/{b_uninstall}")
    await wait_gone(scratch.client, ns, b_uninstall, within=30)
    await monitor.sync()
    await scratch.package_pod(
        name=f"{prefix}-b-apply", node=other, package="b", version="2.0.0", nodewright=nw, env=LONG
    )
    # Correct: config of `c` while the apply pod that finished still exists (only `pause` runs there);
    # deleted, a finished pod does not linger, whatever NODEWRIGHT_SIM_TERMINATE_AFTER says.
    c_apply = await scratch.package_pod(
        name=f"{prefix}-c-apply", node=other, package="c", nodewright=nw, env=FAST | LINGER
    )
    await wait_pod_outcome(scratch.client, ns, c_apply, "succeeded")
    await monitor.sync()
    await scratch.package_pod(
        name=f"{prefix}-c-config", node=other, package="c", stage="config", nodewright=nw, env=LONG
    )
    await scratch.client.delete(f"/api/v1/namespaces/{ns}/pods/{c_apply}")
    await wait_gone(scratch.client, ns, c_apply, within=10)  # it does not linger
    await monitor.sync()
    assert [b.node for b in monitor.breaches_of("I9")] == [node, other], monitor.report()
    assert not monitor.breaches_of("I7"), monitor.report()


# ----------------------------------------------------------------------------------------------------
# A correct rollout played by hand: the fixture must stay clean


async def run_stage(scratch: Scratch, name: str, node: str, nw: str, stage: str, **kwargs: Any) -> None:
    await scratch.package_pod(name=name, node=node, nodewright=nw, stage=stage, env=FAST, **kwargs)
    await wait_pod_outcome(scratch.client, scratch.ns, name, "succeeded")


async def test_clean_rollout(crds: None, scratch: Scratch, invariants: InvariantMonitor, unique: str) -> None:
    prefix = f"ok-{unique}"
    nodes = await scratch.nodes(prefix, 3)
    admin_cordoned = nodes[2]
    nw = prefix
    protected = {"matchLabels": {fleet.PROTECTED_LABEL: "true"}}
    await scratch.nodewright(
        nw, nw_spec(prefix, interruptionBudget={"count": 1}, podNonInterruptLabels=protected)
    )
    await patch_node(scratch.client, admin_cordoned, unschedulable=True)  # someone else's; stays cordoned
    job = await scratch.workloads(nodes=nodes[:2], job=prefix)
    finishing = await scratch.workloads(
        nodes=nodes[:2], job=f"{prefix}-p", protected=True, run_for="1s", labels_extra={"role": "protected"}
    )
    label, key = c.status_label(nw), c.state_annotation(nw)
    for order, node in enumerate(nodes[:2]):
        # State first (cordon recorded), then the cordon itself, both in one write.
        await patch_node(
            scratch.client,
            node,
            labels={label: "in_progress"},
            annotations={key: state(cordoned=True, admission=(c.DEFAULT_COMPARTMENT, order + 1, order))},
            unschedulable=True,
        )
        await evict(scratch.client, job.namespace, f"{job.name}-{node}-0")

        async def protected_done(n: str = node) -> bool:
            pod = await scratch.client.get(
                f"/api/v1/namespaces/{finishing.namespace}/pods/{finishing.name}-{n}-0"
            )
            return pod_outcome(pod) == "succeeded"

        await fleet.wait_for(protected_done, within=30, what="protected pod finished")
        for stage in ("apply", "config"):
            await run_stage(scratch, f"{prefix}-{order}-{stage}", node, nw, stage)
        await run_stage(
            scratch, f"{prefix}-{order}-interrupt", node, nw, "interrupt", interrupt={"type": "service"}
        )
        await run_stage(scratch, f"{prefix}-{order}-post", node, nw, "post-interrupt")
        done = state(packages=(("pkg", "1.0.0", PackageStage.POST_INTERRUPT, PackageState.COMPLETE),))
        await patch_node(scratch.client, node, labels={label: "complete"}, annotations={key: done})
        await patch_node(scratch.client, node, unschedulable=False)
    # A config-only run on a complete package restarts at config (no new apply needed).
    await run_stage(scratch, f"{prefix}-0-config2", nodes[0], nw, "config")
    # The NodeWright is deleted; package entries (files on the host) may stay, the rest must go.
    await scratch.client.delete(f"{NW_PATH}/{nw}")
    for node in nodes[:2]:
        await patch_node(scratch.client, node, labels={label: None})
    invariants.expect_cleanup(nw)
    invariants.allow_workload_deletion(job)
    invariants.allow_workload_deletion(finishing)
    await invariants.sync()
    assert not invariants.breaches, invariants.report()
    # The fixture's final check (I6 end state and cleanup of `nw`) runs at teardown.


def test_breach_report_is_readable() -> None:
    b = Breach("I3", "workload pod evicted", node="n1", pods=("ns/p (Running)",), resource_version=7)
    text = str(b)
    assert text.startswith("[I3] workload pod evicted") and "node=n1" in text and "rv=7" in text


# ----------------------------------------------------------------------------------------------------
# Robustness: a monitor that cannot see must say so


async def test_survives_apiserver_restart_and_relist(
    cluster: ControlPlane, scratch: Scratch, unique: str
) -> None:
    """After compaction + restart (watches cut, old revisions expired) the monitor relists and still sees."""
    prefix = f"rs-{unique}"
    (node,) = await scratch.nodes(prefix, 1)
    async with InvariantMonitor(cluster.kubeconfig, namespace=cluster.namespace) as monitor:
        await asyncio.to_thread(cluster.compact_etcd)
        await patch_node(scratch.client, node, unschedulable=True)
        await patch_node(scratch.client, node, unschedulable=False)
        await monitor.wait_for_breach("I5", node=node, within=60)
        assert not monitor.failures, monitor.report()
        assert any("interrupted" in n or "relisted" in n for n in monitor.notes), monitor.notes


async def test_crashing_check_is_reported(
    scratch: Scratch, monitor: InvariantMonitor, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"cr-{unique}"
    (node,) = await scratch.nodes(prefix, 1)
    await monitor.sync()

    def boom(*_: object) -> None:
        raise RuntimeError("bug in a check")

    monkeypatch.setattr(monitor, "_check_budget_on_node", boom)
    await patch_node(scratch.client, node, labels={"probe": "x"})
    with pytest.raises(MonitorFailure):
        await monitor.wait_for_breach("I1", node=node, within=10)
    assert "bug in a check" in monitor.report()
    with pytest.raises(AssertionError, match="MONITOR FAILED"):
        monitor.assert_clean()
    monitor.failures.clear()  # the `monitor` fixture asserts no failure at teardown


class _RestartingServer:
    """A client whose pod watch breaks at two API-server restarts 70 s apart, with events between."""

    def __init__(self, monitor: InvariantMonitor, clock: list[float]) -> None:
        self.monitor, self.clock, self.watches = monitor, clock, 0

    async def list_all(self, path: str) -> JSON:
        return {"items": [], "resourceVersion": "1"}

    async def watch(self, path: str, *, resource_version: str, timeout_s: float) -> AsyncIterator[JSON]:
        self.watches += 1
        if self.watches == 1:  # the first restart, at t=0
            raise aiohttp.ClientPayloadError("Response payload is not completed")
        if self.watches == 2:  # events flow again at t=30; the second restart at t=70
            self.clock[0] = 30.0
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "2"}}}
            self.clock[0] = 70.0
            raise aiohttp.ClientPayloadError("Response payload is not completed")
        self.monitor._stopping = True  # the watch is back: end the test


async def test_two_api_server_restarts_a_minute_apart_are_two_short_outages(tmp_path: Path) -> None:
    """An outage ends when events flow again, not only when a watch stream ends cleanly: with restarts
    closer together than a watch's length, no stream ends cleanly (the full chaos run failed so)."""
    clock = [0.0]
    monitor = InvariantMonitor(tmp_path / "kubeconfig")
    monitor._outage_clock = lambda: clock[0]
    server = _RestartingServer(monitor, clock)
    monitor._client = server  # type: ignore[assignment]
    await asyncio.wait_for(monitor._run_watch(monitor._watches["pods"]), timeout=30)
    assert server.watches == 3
    assert monitor.failures == []
