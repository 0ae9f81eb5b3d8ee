"""Issue 18 acceptance (part): maintenance windows, soak time and approval gates on the real control plane.

Each test creates its own fleet and DeploymentPolicy, runs the operator as a subprocess and the
invariant monitor beside it; batches are read from the admissions the rollout controller writes on the
nodes (`nodewright.io/batch.<nw>`: compartment, batch, order, fingerprint, time).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    create_nodewright,
    delete_nodewright,
    get_nodewright,
    nodes_of,
    nodewright_manifest,
    package,
    patch_nodewright,
    status_of,
    wait_statuses,
)
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

POLICY_PATH = "/apis/nodewright.io/v1alpha1/deploymentpolicies"
ZONE = "Asia/Kolkata"  # UTC+05:30: a schedule written in UTC would be wrong by five and a half hours


@contextlib.asynccontextmanager
async def policy(kube: KubeClient, name: str, default: JSON, **spec: Any) -> AsyncIterator[JSON]:
    manifest = {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DeploymentPolicy",
        "metadata": {"name": name},
        "spec": {"default": default, **spec},
    }
    created = await kube.create(POLICY_PATH, manifest)
    try:
        yield created
    finally:
        await kube.delete(f"{POLICY_PATH}/{name}")


def admissions(nodes: list[JSON], nw: str) -> dict[str, JSON]:
    out = {}
    for node in nodes:
        text = (node["metadata"].get("annotations") or {}).get(f"nodewright.io/batch.{nw}")
        if text:
            out[node["metadata"]["name"]] = json.loads(text)
    return out


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def compartment(kube: KubeClient, nw: str) -> JSON:
    obj = await get_nodewright(kube, nw) or {}
    return dict(((obj.get("status") or {}).get("compartmentStatuses") or {}).get("__default__") or {})


async def test_window_admits_nothing_before_it_and_in_flight_nodes_finish_after_it_closes(
    cluster: ControlPlane, operator: Any, kube: KubeClient, unique: str, invariants: InvariantMonitor
) -> None:
    prefix = nw = f"win-{unique}"
    # The next whole minute at least 20 s away: the window opens then, for one minute, in a zone
    # that is not UTC.
    now = datetime.now(UTC)
    opens = (now + timedelta(seconds=80)).replace(second=0, microsecond=0)
    local = opens.astimezone(ZoneInfo(ZONE))
    maintenance = {
        "timeZone": ZONE,
        "windows": [{"schedule": f"{local.minute} {local.hour} * * *", "duration": "1m"}],
    }
    default = {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}, "maintenance": maintenance}
    async with (
        operator_fixture.fleet_of(cluster, prefix, 4),
        policy(kube, f"win-{unique}", default),
    ):
        # Two stages of 40 s each: the first batch is still running when the window closes.
        manifest = nodewright_manifest(
            nw,
            fleet_prefix=prefix,
            packages={"tool": package(duration="40s")},
            deploymentPolicy=f"win-{unique}",
        )
        await create_nodewright(kube, manifest)
        await asyncio.sleep(5)
        before = await compartment(kube, nw)
        assert before.get("windowActive") is False, before
        assert parse(before["nextWindowAt"]) == opens, before
        obj = await get_nodewright(kube, nw) or {}
        assert ((obj.get("status") or {}).get("waitingReasons") or {}).get("Window") == 4, obj.get("status")
        assert not admissions(await nodes_of(kube, prefix), nw), "admitted before the window opened"

        await wait_statuses(kube, prefix, nw, "in_progress", within=120, count=2)
        after_open = admissions(await nodes_of(kube, prefix), nw)
        assert len(after_open) == 2, after_open
        assert all(opens <= parse(a["at"]) < opens + timedelta(minutes=1) for a in after_open.values())

        # The window closes while both run; they finish, and nothing else is admitted.
        await wait_statuses(kube, prefix, nw, "complete", within=240, count=2)
        assert datetime.now(UTC) > opens + timedelta(minutes=1)
        await asyncio.sleep(5)
        nodes = await nodes_of(kube, prefix)
        assert set(admissions(nodes, nw)) == set(after_open)
        # Nodes never admitted carry no status label or `waiting`.
        statuses = sorted(status_of(n, nw) or "waiting" for n in nodes)
        assert statuses == ["complete", "complete", "waiting", "waiting"], statuses
        closed = await compartment(kube, nw)
        assert closed.get("windowActive") is False and parse(closed["nextWindowAt"]) == opens + timedelta(
            days=1
        )
        await delete_nodewright(kube, nw, within=120)


async def test_soak_time_between_batches_and_a_gate_that_holds_until_approved(
    cluster: ControlPlane, operator: Any, kube: KubeClient, unique: str, invariants: InvariantMonitor
) -> None:
    prefix = nw = f"gate-{unique}"
    default = {
        "budget": {"count": 1},
        "strategy": {"fixed": {"initialBatch": 1}},
        "soakTime": "15s",
        "pauseAfterBatch": [1],
    }
    async with operator_fixture.fleet_of(cluster, prefix, 3), policy(kube, f"gate-{unique}", default):
        manifest = nodewright_manifest(
            nw,
            fleet_prefix=prefix,
            packages={"tool": package(duration="1s")},
            deploymentPolicy=f"gate-{unique}",
        )
        await create_nodewright(kube, manifest)
        await wait_statuses(kube, prefix, nw, "complete", within=120, count=1)

        async def gated() -> JSON | None:
            comp = await compartment(kube, nw)
            return comp if comp.get("awaitingApproval") == 1 else None

        await fleet.wait_for(gated, within=60, what="gate after batch 1")
        await asyncio.sleep(20)  # longer than the soak: only the gate holds it now
        assert len(admissions(await nodes_of(kube, prefix), nw)) == 1
        obj = await get_nodewright(kube, nw) or {}
        assert ((obj.get("status") or {}).get("waitingReasons") or {}).get("AwaitingApproval") == 2

        # What `kubectl nodewright approve <nw>` writes.
        await patch_nodewright(
            kube, nw, {"metadata": {"annotations": {"nodewright.io/approve": "__default__=1"}}}
        )
        await wait_statuses(kube, prefix, nw, "complete", within=180)

        async def consumed() -> bool:
            obj = await get_nodewright(kube, nw) or {}
            return "nodewright.io/approve" not in ((obj.get("metadata") or {}).get("annotations") or {})

        await fleet.wait_for(consumed, within=30, what="approval consumed")
        adm = admissions(await nodes_of(kube, prefix), nw)
        by_batch = {int(a["b"]): parse(a["at"]) for a in adm.values()}
        assert sorted(by_batch) == [1, 2, 3], adm
        # (approvedBatch went with the rest of the batch state: resetBatchStateOnCompletion.)
        # Batch 3 opened at least the soak time after batch 2 settled (settledAt is batch 3's settle
        # now, so compare with batch 2's admission plus its run: at least 15 s between admissions).
        assert by_batch[3] - by_batch[2] >= timedelta(seconds=15), by_batch
        await delete_nodewright(kube, nw, within=120)
