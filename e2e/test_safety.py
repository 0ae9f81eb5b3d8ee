"""The safety defects found by black-box testing, as scenarios on the real control plane.

Each scenario reproduces one defect of the black-box issue and shows it fixed, with the invariant monitor
watching (I1 budget cap, I2 pods within the ceiling, I3-I8, and one pod per node and package at a time):

- a spec fixed while nodes are erroring retries them through batches, within a ceiling of 1 (item 1);
- a cancelled uninstall creates the apply pod only once the uninstall pod is gone (item 2);
- a disabled NodeWright releases the cordons it holds, so a later one is not stalled (item 3);
- a node whose state was wiped starts over through a batch, never at once (item 5);
- deleting a paused or disabled NodeWright is held with `DeletionBlocked` until it is resumed or
  enabled; then every key goes (item 6);
- nodes whose state cannot be read are counted blocked, never complete (item 9);
- a package pod refused by the API server (here: a ValidatingAdmissionPolicy, as a policy engine would)
  makes the node erroring with the API server's message (item 8, operator side).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    NAMESPACE,
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
    patch_nodewright,
    status_of,
    wait_statuses,
)
from nodewright.api.nodestate import decode
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

SLOTS = re.compile(r"(\d+) of (\d+) slots in use")


async def erroring_count(kube: KubeClient, prefix: str, nw: str) -> int:
    return sum(status_of(n, nw) == "erroring" for n in await nodes_of(kube, prefix))


@contextlib.asynccontextmanager
async def slot_messages(kube: KubeClient, nw: str) -> AsyncIterator[list[tuple[int, int]]]:
    """Every `N of M slots in use` the NodeWright status reports while the block runs (polled)."""
    seen: list[tuple[int, int]] = []

    async def poll() -> None:
        while True:
            obj = await get_nodewright(kube, nw) or {}
            for compartment in ((obj.get("status") or {}).get("compartmentStatuses") or {}).values():
                match = SLOTS.search(str(compartment.get("message") or ""))
                if match:
                    seen.append((int(match.group(1)), int(match.group(2))))
            await asyncio.sleep(0.3)

    task = asyncio.create_task(poll())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_fixing_the_spec_of_erroring_nodes_retries_them_within_the_ceiling(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"fix-{unique}", f"fix-{unique}"
    async with fleet_of(cluster, prefix, 4), slot_messages(kube, nw) as slots:
        broken = package(
            env={"NODEWRIGHT_SIM_FAIL": "always", "NODEWRIGHT_SIM_FAIL_STAGES": "apply"}, maxAttempts=1
        )
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw, fleet_prefix=prefix, packages={"tool": broken}, interruptionBudget={"count": 1}
            ),
        )

        async def three_erroring() -> bool:
            return await erroring_count(kube, prefix, nw) >= 3

        await fleet.wait_for(three_erroring, within=90, what="three erroring nodes")
        # The admin fixes the package: the erroring nodes are retried one batch at a time (ceiling 1),
        # each under a fresh admission; the monitor judges every start (I1, I2).
        await patch_nodewright(kube, nw, {"spec": {"packages": {"tool": package(maxAttempts=1)}}})
        await wait_statuses(kube, prefix, nw, "complete", within=120)
        assert slots and all(used <= ceiling for used, ceiling in slots), slots
        await delete_nodewright(kube, nw)


class PodLifetimes:
    """Creation and disappearance (DELETED event) times of a NodeWright's package pods."""

    def __init__(self, kube: KubeClient, nw: str) -> None:
        self.kube, self.nw = kube, nw
        self.added: dict[str, tuple[str, float]] = {}  # name -> (stage, monotonic time)
        self.gone: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> PodLifetimes:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        params = {"labelSelector": f"nodewright.io/nodewright={self.nw}"}
        listed = await self.kube.list_all(path, params=params)

        async def run() -> None:
            loop = asyncio.get_running_loop()
            async for event in self.kube.watch(
                path, resource_version=str(listed["resourceVersion"]), params=params
            ):
                obj = event["object"]
                name = obj["metadata"]["name"]
                if event["type"] == "ADDED":
                    self.added[name] = (obj["metadata"]["labels"]["nodewright.io/stage"], loop.time())
                elif event["type"] == "DELETED":
                    self.gone[name] = loop.time()

        self._task = asyncio.create_task(run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task

    def of_stage(self, stage: str) -> list[str]:
        return [name for name, (s, _) in self.added.items() if s == stage]


async def test_cancelled_uninstall_creates_the_apply_pod_only_once_the_uninstall_pod_is_gone(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"cancel-{unique}", f"cancel-{unique}"
    async with fleet_of(cluster, prefix, 1):
        pkg = package(uninstall={"enabled": True})
        await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages={"pkg": pkg}))
        await wait_statuses(kube, prefix, nw, "complete", within=90)
        async with PodLifetimes(kube, nw) as pods:
            # A slow uninstall whose pod takes a while to terminate once deleted (a grace period on a host).
            slow = package(
                duration="30s",
                env={"NODEWRIGHT_SIM_TERMINATE_AFTER": "5s"},
                uninstall={"enabled": True, "apply": True},
            )
            await patch_nodewright(kube, nw, {"spec": {"packages": {"pkg": slow}}})

            async def uninstalling() -> bool:
                return bool(pods.of_stage("uninstall"))

            await fleet.wait_for(uninstalling, within=30, what="uninstall pod")
            await asyncio.sleep(1)
            await patch_nodewright(
                kube,
                nw,
                {"spec": {"packages": {"pkg": package(uninstall={"enabled": True, "apply": False})}}},
            )

            async def applied() -> bool:
                return bool(pods.of_stage("apply"))

            await fleet.wait_for(applied, within=60, what="apply pod after the cancel")
            [uninstall] = pods.of_stage("uninstall")
            [apply] = pods.of_stage("apply")
            assert uninstall in pods.gone, "the apply pod was created while the uninstall pod still existed"
            assert pods.added[apply][1] >= pods.gone[uninstall]
            await wait_statuses(kube, prefix, nw, "complete", within=90)
        await delete_nodewright(kube, nw)


async def test_disabled_nodewright_releases_its_cordons_and_does_not_stall_others(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, x, y = f"dis-{unique}", f"dx-{unique}", f"dy-{unique}"
    async with fleet_of(cluster, prefix, 2):
        rebooting = package(duration="6s", interrupt={"type": "reboot"})
        await create_nodewright(
            kube,
            nodewright_manifest(
                x, fleet_prefix=prefix, packages={"kernel": rebooting}, interruptionBudget={"count": 2}
            ),
        )

        async def both_cordoned_by_x() -> bool:
            nodes = await nodes_of(kube, prefix)
            ours = [
                n
                for n in nodes
                if n["spec"].get("unschedulable")
                and decode(n["metadata"]["annotations"].get(f"nodewright.io/state.{x}", '{"v":1}')).cordoned
            ]
            return len(ours) == 2

        await fleet.wait_for(both_cordoned_by_x, within=60, what=f"{x} holding both nodes cordoned")
        await patch_nodewright(kube, x, {"metadata": {"annotations": {"nodewright.io/disable": "true"}}})
        await create_nodewright(
            kube, nodewright_manifest(y, fleet_prefix=prefix, packages={"tool": package()}, priority=300)
        )
        # X lets its running pods finish, then releases its cordons: Y is not held back.
        await wait_statuses(kube, prefix, y, "complete", within=90)
        for node in await nodes_of(kube, prefix):
            assert not node["spec"].get("unschedulable"), node["metadata"]["name"]
            assert status_of(node, x) == "disabled"
        for name in (y, x):
            await patch_nodewright(kube, name, {"metadata": {"annotations": {"nodewright.io/disable": None}}})
            await delete_nodewright(kube, name, within=120)


async def test_a_wiped_state_starts_over_through_a_batch(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"wipe-{unique}", f"wipe-{unique}"
    key = f"nodewright.io/state.{nw}"
    async with fleet_of(cluster, prefix, 3) as names:
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw,
                fleet_prefix=prefix,
                packages={"tool": package(duration="3s")},
                interruptionBudget={"count": 1},
            ),
        )
        await wait_statuses(kube, prefix, nw, "complete", within=60, count=1)
        done = next(n for n in await nodes_of(kube, prefix) if status_of(n, nw) == "complete")
        name = done["metadata"]["name"]
        used = done["metadata"]["annotations"][f"nodewright.io/batch.{nw}"]
        # While the next node is in progress (ceiling 1), someone deletes the finished node's state. It
        # must not start again at once under its used admission (the monitor would see two nodes in
        # progress against a ceiling of 1); it waits for a batch.
        await kube.merge_patch(f"/api/v1/nodes/{name}", {"metadata": {"annotations": {key: None}}})
        await wait_statuses(kube, prefix, nw, "complete", within=120)
        node = await kube.get(f"/api/v1/nodes/{name}")
        assert node["metadata"]["annotations"][f"nodewright.io/batch.{nw}"] != used, "re-admitted by a batch"
        assert decode(node["metadata"]["annotations"][key]).entry("tool", "1.0.0") is not None
        assert len(names) == 3
        await delete_nodewright(kube, nw)


async def events_of(kube: KubeClient, name: str, reason: str) -> list[JSON]:
    listed = await kube.list_all(
        "/api/v1/events", params={"fieldSelector": f"involvedObject.name={name},reason={reason}"}
    )
    items: list[JSON] = listed["items"]
    return items


async def test_deleting_a_paused_or_disabled_nodewright_waits_until_resumed_then_leaves_nothing(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix = f"hold-{unique}"
    async with fleet_of(cluster, prefix, 2):
        for flag in ("nodewright.io/disable", "nodewright.io/pause"):
            nw = f"hold-{flag.rsplit('/', 1)[1]}-{unique}"
            await held_deletion(kube, invariants, prefix=prefix, nw=nw, flag=flag)


async def held_deletion(
    kube: KubeClient, invariants: InvariantMonitor, *, prefix: str, nw: str, flag: str
) -> None:
    """Delete `nw` while `flag` is set: held with DeletionBlocked; once removed, gone without a trace."""
    packages = {"gone": package(uninstall={"enabled": True}), "stays": package()}
    await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages=packages))
    await wait_statuses(kube, prefix, nw, "complete", within=90)
    await patch_nodewright(kube, nw, {"metadata": {"annotations": {flag: "true"}}})
    await kube.delete(f"{operator_fixture.NW_PATH}/{nw}")

    async def blocked() -> JSON | None:
        obj = await get_nodewright(kube, nw) or {}
        conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
        held: JSON = conds.get("DeletionBlocked", {})
        return held if held.get("status") == "True" else None

    held = await fleet.wait_for(blocked, within=30, what=f"{nw} DeletionBlocked")
    assert held["reason"] in ("Disabled", "Paused") and flag in held["message"], held

    async def warned() -> bool:
        return bool(await events_of(kube, nw, "DeletionBlocked"))

    await fleet.wait_for(warned, within=30, what="DeletionBlocked Event")
    await asyncio.sleep(3)
    assert await get_nodewright(kube, nw) is not None, "deleted while it could not clean up"
    for node in await nodes_of(kube, prefix):
        assert f"nodewright.io/state.{nw}" in node["metadata"]["annotations"]
    invariants.expect_cleanup(nw)
    async with PodCreations(kube, nw) as watch:
        await patch_nodewright(kube, nw, {"metadata": {"annotations": {flag: None}}})

        async def gone() -> bool:
            return await get_nodewright(kube, nw) is None

        await fleet.wait_for(gone, within=120, what=f"{nw} deleted after {flag} was removed")
        assert sorted(stage for _, _, _, stage, _ in watch.created) == ["uninstall", "uninstall"]
    for node in await nodes_of(kube, prefix):
        leftovers = [k for k in (node["metadata"].get("annotations") or {}) if k.endswith(f".{nw}")]
        leftovers += [k for k in node["metadata"].get("labels") or {} if k.endswith(f".{nw}")]
        assert not leftovers and condition_of(node, nw) is None, leftovers


async def test_unreadable_node_states_are_blocked_never_complete(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"garbage-{unique}", f"garbage-{unique}"
    key = f"nodewright.io/state.{nw}"
    async with fleet_of(cluster, prefix, 6) as names:
        for name in names[:3]:
            await kube.merge_patch(f"/api/v1/nodes/{name}", {"metadata": {"annotations": {key: "garbage"}}})
        await create_nodewright(
            kube, nodewright_manifest(nw, fleet_prefix=prefix, packages={"tool": package()})
        )
        await wait_statuses(kube, prefix, nw, "complete", within=90, count=3)
        await wait_statuses(kube, prefix, nw, "blocked", within=30, count=3)

        async def reported() -> JSON | None:
            status = (await get_nodewright(kube, nw) or {}).get("status") or {}
            return (
                status
                if status.get("completeNodes") == "3/6" and status.get("nodeCounts", {}).get("blocked") == 3
                else None
            )

        status = await fleet.wait_for(reported, within=30, what="malformed nodes counted blocked")
        assert status["status"] != "complete", status
        conds = {c["type"]: c for c in status["conditions"]}
        assert conds["Ready"]["status"] == "False"
        assert (
            conds["NodeStateMalformed"]["status"] == "True"
            and "3 node" in conds["NodeStateMalformed"]["message"]
        )
        for node in await nodes_of(kube, prefix):
            if node["metadata"]["name"] in names[:3]:
                assert node["metadata"]["annotations"][key] == "garbage"
                assert (condition_of(node, nw) or {}).get("reason") == "StateMalformed"
        # Corrupted after completion: the node leaves `complete` too.
        good = names[3]
        await kube.merge_patch(f"/api/v1/nodes/{good}", {"metadata": {"annotations": {key: "{"}}})
        await wait_statuses(kube, prefix, nw, "blocked", within=30, count=4)
        for name in [*names[:3], good]:
            await kube.merge_patch(f"/api/v1/nodes/{name}", {"metadata": {"annotations": {key: None}}})
        await wait_statuses(kube, prefix, nw, "complete", within=90)
        await delete_nodewright(kube, nw)


REFUSING_POLICY = "nodewright-e2e-refuse-marked-pods"


@contextlib.asynccontextmanager
async def refusing_admission_policy(kube: KubeClient) -> AsyncIterator[None]:
    """A ValidatingAdmissionPolicy that refuses pods carrying env NODEWRIGHT_E2E_REFUSE (as Kyverno,
    Gatekeeper or Pod Security admission would refuse a privileged package pod)."""
    base = "/apis/admissionregistration.k8s.io/v1"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": REFUSING_POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": "!object.spec.initContainers.exists(c, has(c.env) &&"
                    " c.env.exists(e, e.name == 'NODEWRIGHT_E2E_REFUSE'))",
                    "message": "package pods marked NODEWRIGHT_E2E_REFUSE are not allowed here",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": REFUSING_POLICY},
        "spec": {"policyName": REFUSING_POLICY, "validationActions": ["Deny"]},
    }
    await kube.create(f"{base}/validatingadmissionpolicies", policy)
    await kube.create(f"{base}/validatingadmissionpolicybindings", binding)
    await asyncio.sleep(2)  # the API server picks policies up asynchronously
    try:
        yield
    finally:
        await kube.delete(f"{base}/validatingadmissionpolicybindings/{REFUSING_POLICY}")
        await kube.delete(f"{base}/validatingadmissionpolicies/{REFUSING_POLICY}")


async def test_a_pod_the_api_server_refuses_makes_the_node_erroring_with_the_reason(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"refused-{unique}", f"refused-{unique}"
    async with fleet_of(cluster, prefix, 1) as names, refusing_admission_policy(kube):
        refused = package(env={"NODEWRIGHT_E2E_REFUSE": "1"}, maxAttempts=1)
        await create_nodewright(
            kube, nodewright_manifest(nw, fleet_prefix=prefix, packages={"tool": refused})
        )
        [node] = await wait_statuses(kube, prefix, nw, "erroring", within=60)
        message = (condition_of(node, nw) or {}).get("message", "")
        assert "refused the pod" in message and "NODEWRIGHT_E2E_REFUSE are not allowed" in message, message

        async def counted() -> bool:
            status = (await get_nodewright(kube, nw) or {}).get("status") or {}
            return bool(status.get("nodesErroring") == 1)

        await fleet.wait_for(counted, within=30, what="NodeWright status counts the erroring node")
        failed = await events_of(kube, names[0], "PackageFailed")
        assert failed and any("not allowed" in e.get("message", "") for e in failed), failed
        await delete_nodewright(kube, nw)
