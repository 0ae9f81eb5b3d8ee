"""Issue 34 item 1 acceptance: revision history and `kubectl nodewright undo` on the simulated fleet.

A NodeWright at v1 is complete on 6 nodes; v2 (a package whose simulated stage fails on one node of
its second batch, one attempt) goes out through a canary policy (fixed batches of 2, budget 2,
failureThreshold 1): batch 1 upgrades two nodes, batch 2 fails and the compartment halts. The Halted
condition and the CompartmentHalted notification (to a local HTTP receiver) name the revision to go
back to and the exact command. `kubectl nodewright undo` (the
plugin as a subprocess, as a user runs it) writes revision 1 back; every node returns to v1 through
batches of the way back -- from batch 1, at most 2 nodes at a time -- the nodes v2 reached apply v1
again, the halt is over, and `history` shows revision 1 as the current one, renumbered 3. The invariant
monitor watches the whole test (I1: never more than 2 nodes in progress; I8: nothing admitted while
halted).

A NodeWright that Argo CD or Flux manages (their labels) refuses `undo` with one line saying to revert
in git, and writes nothing; `--force` goes back anyway.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    NAMESPACE,
    REPO,
    create_nodewright,
    get_nodewright,
    nodewright_manifest,
    package,
    patch_nodewright,
    wait_statuses,
)
from e2e.test_notifications import receiving
from e2e.test_rollout import (
    Group,
    admission_of,
    condition,
    delete_and_diagnose,
    fast_operator,
    grouped_fleet,
    observe,
    policy,
    policy_manifest,
    predicted_batches,
    run_plan_cli,
    wait_nodes,
)
from nodewright.api.nodestate import decode
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, ApiError, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator_factory = operator_fixture.operator_factory

SECRETS = f"/api/v1/namespaces/{NAMESPACE}/secrets"
CANARY = {"fixed": {"initialBatch": 2, "batchThreshold": 100, "failureThreshold": 1, "safetyLimit": 100}}


async def plugin(cluster: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "nodewright", *args, "--kubeconfig", str(cluster.kubeconfig)]
    cmd += ["-n", cluster.namespace]
    return await asyncio.to_thread(
        subprocess.run, cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )


@contextlib.asynccontextmanager
async def webhook_secret(kube: KubeClient, name: str, url: str) -> AsyncIterator[str]:
    """A Secret of the operator's namespace holding a notification sink's URL (key `url`)."""
    body = {"url": base64.b64encode(url.encode()).decode()}
    await kube.create(
        SECRETS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": body}
    )
    try:
        yield name
    finally:
        with contextlib.suppress(ApiError):
            await kube.delete(f"{SECRETS}/{name}")


async def revisions(kube: KubeClient, cluster: ControlPlane, nw: str) -> list[tuple[int, str]]:
    listed = await kube.list_all(
        f"/apis/apps/v1/namespaces/{cluster.namespace}/controllerrevisions",
        params={"labelSelector": f"nodewright.io/nodewright={nw}"},
    )
    return sorted(
        (
            int(o["revision"]),
            ",".join(f"{k}:{p['version']}" for k, p in o["data"]["spec"]["packages"].items()),
        )
        for o in listed["items"]
    )


def versions_on(node: JSON, nw: str) -> dict[str, str]:
    text = (node["metadata"].get("annotations") or {})[f"nodewright.io/state.{nw}"]
    return {e.version: e.state.value for e in decode(text).packages if e.name == "tool"}


async def test_undo_after_a_halted_upgrade_brings_every_node_back_through_batches(
    cluster: ControlPlane,
    operator_factory: Any,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
    tmp_path: Path,
) -> None:
    prefix = nw = f"undo-{unique}"
    groups = [Group("gpu", 6, {"count": 2}, CANARY)]
    async with (
        grouped_fleet(cluster, prefix, groups) as members,
        policy(kube, policy_manifest(nw, groups)),
        receiving() as receiver,
        webhook_secret(kube, nw, f"{receiver.url}/team") as secret,
    ):
        fast_operator(operator_factory)
        sink = {"name": "team", "urlSecretRef": {"name": secret, "key": "url"}}
        manifest = nodewright_manifest(
            nw,
            fleet_prefix=prefix,
            packages={"tool": package("1.0.0")},
            deploymentPolicy=nw,
            notifications=[sink],
        )
        await create_nodewright(kube, manifest)
        await wait_statuses(kube, prefix, nw, "complete", within=120)

        async def recorded(count: int) -> list[tuple[int, str]] | None:
            found = await revisions(kube, cluster, nw)
            return found if len(found) == count else None

        assert await fleet.wait_for(lambda: recorded(1), within=30, what="revision 1") == [(1, "tool:1.0.0")]

        # v2 fails on the first node of its second batch (the batches as `nodewright plan` predicts them).
        upgrade = package("2.0.0", maxAttempts=1)
        path = tmp_path / "v2.yaml"
        path.write_text(
            yaml.safe_dump({**manifest, "spec": {**manifest["spec"], "packages": {"tool": upgrade}}})
        )
        predicted = predicted_batches(await run_plan_cli(cluster, path))["gpu"]
        assert [len(predicted[b]) for b in (1, 2, 3)] == [2, 2, 2], predicted
        failing = predicted[2][0]
        upgrade["env"].append({"name": "NODEWRIGHT_SIM_FAIL_NODES", "value": failing})
        await patch_nodewright(kube, nw, {"spec": {"packages": {"tool": upgrade}}})

        async def halted() -> JSON | None:
            cond = await condition(kube, nw, "Halted")
            return cond if (cond or {}).get("status") == "True" else None

        cond = await fleet.wait_for(halted, within=120, what="Halted condition")
        assert f"kubectl nodewright undo {nw} --to-revision 1" in cond["message"], cond
        assert "revision 1 (tool:1.0.0)" in cond["message"], cond

        async def halt_notice() -> JSON | None:
            return next((b for b in receiver.got.get("team", []) if b["event"] == "CompartmentHalted"), None)

        notice = await fleet.wait_for(halt_notice, within=60, what=f"CompartmentHalted ({receiver.got})")
        assert f"kubectl nodewright undo {nw} --to-revision 1" in notice["message"], notice
        assert "revision 1 (tool:1.0.0)" in notice["message"], notice
        await wait_nodes(kube, prefix, nw, [failing], "erroring", within=60)
        upgraded = sorted({*predicted[1], *predicted[2]} - {failing})
        await wait_nodes(kube, prefix, nw, upgraded, "complete", within=60)
        assert sorted(n for _, n in await revisions(kube, cluster, nw)) == ["tool:1.0.0", "tool:2.0.0"]

        async with observe(cluster, prefix, nw) as obs, operator_fixture.PodCreations(kube, nw) as pods:
            undone = await plugin(cluster, "undo", nw, "-y")
            assert undone.returncode == 0, undone.stderr
            assert "undone to revision 1 (tool:1.0.0)" in undone.stdout, undone.stdout
            obj = await get_nodewright(kube, nw)
            assert obj is not None and obj["spec"]["packages"]["tool"]["version"] == "1.0.0"
            generation = int(obj["metadata"]["generation"])
            nodes = await wait_statuses(kube, prefix, nw, "complete", within=180, generation=generation)
            await invariants.sync()

            async def calm() -> bool:
                return (await condition(kube, nw, "Halted") or {}).get("status") == "False"

            await fleet.wait_for(calm, within=30, what="Halted False after the undo")
            # Every node is back at v1; the nodes v2 reached applied v1 again (in pods of the way back).
            for node in nodes:
                assert versions_on(node, nw).get("1.0.0") == "complete", node["metadata"]["name"]
            again = sorted({node for _, node, *_ in pods.created})
            assert again == upgraded, (again, upgraded)
            # Through batches of the way back (its admissions: the spec's fingerprint, numbered from the
            # epoch's first order), from batch 1, within the budget of 2.
            status = (await get_nodewright(kube, nw) or {}).get("status") or {}
            epoch = (status["rolloutFingerprint"], int(status.get("rolloutFirstOrder") or 0))
            assert epoch[1] > 0, "the way back is a new rollout of a spec rolled out before"
            batches: dict[int, list[str]] = {}
            for node in nodes:
                adm = admission_of(node, nw)
                if adm is not None and adm["f"] == epoch[0] and int(adm["o"]) >= epoch[1]:
                    batches.setdefault(int(adm["b"]), []).append(node["metadata"]["name"])
            assert sorted(batches) == list(range(1, len(batches) + 1)), batches
            assert all(len(ns) <= 2 for ns in batches.values()), batches
            assert sorted(n for ns in batches.values() for n in ns) == upgraded, batches
            assert obs.tracker.max_in_progress.get("gpu", 0) <= 2, obs.tracker.max_in_progress
        # The spec that came back is revision 1 again, renumbered 3.
        history = await plugin(cluster, "history", nw)
        assert history.returncode == 0, history.stderr
        current = [line.split() for line in history.stdout.splitlines() if " * " in f"{line} "]
        assert current and current[0][:2] == ["3", "*"] and current[0][-1] == "tool:1.0.0", history.stdout
        assert await revisions(kube, cluster, nw) == [(2, "tool:2.0.0"), (3, "tool:1.0.0")]
        assert members["gpu"]
        await delete_and_diagnose(kube, prefix, nw)


async def test_undo_of_a_gitops_managed_nodewright_is_refused_unless_forced(
    cluster: ControlPlane, operator_factory: Any, kube: KubeClient, unique: str, invariants: InvariantMonitor
) -> None:
    """Argo CD (label) or Flux (label) manages the NodeWright: `undo` refuses with one line that names
    the tool and says to revert in git, and writes nothing; `--force` goes back anyway, here while v2
    is still in flight on a node (budget 1: never two nodes in progress, I1)."""
    prefix = nw = f"undo-gitops-{unique}"
    async with grouped_fleet(cluster, prefix, [Group("gpu", 2, {"count": 1}, CANARY)]):
        operator_factory()
        argo = {"argocd.argoproj.io/instance": "fleet-drivers"}
        manifest = nodewright_manifest(
            nw, fleet_prefix=prefix, packages={"tool": package("1.0.0")}, interruptionBudget={"count": 1}
        )
        await create_nodewright(kube, {**manifest, "metadata": {**manifest["metadata"], "labels": argo}})
        await wait_statuses(kube, prefix, nw, "complete", within=90)
        # v2's stages are slow, so the undo below comes while v2 is in flight on a node: the node goes
        # back while its upgrade pod of v2 is still being wound down, and holds its slot until then.
        await patch_nodewright(kube, nw, {"spec": {"packages": {"tool": package("2.0.0", duration="6s")}}})

        async def two_revisions() -> list[tuple[int, str]] | None:
            found = await revisions(kube, cluster, nw)
            return found if len(found) == 2 else None

        await fleet.wait_for(two_revisions, within=30, what="revision 2")

        refused = await plugin(cluster, "undo", nw, "-y")
        assert refused.returncode == 4, (refused.stdout, refused.stderr)
        line = refused.stderr.strip()
        assert len(line.splitlines()) == 1, line
        assert "managed by Argo CD (argocd.argoproj.io/instance=fleet-drivers)" in line, line
        assert "revert the change in git instead" in line and "--force" in line, line
        flux = {"argocd.argoproj.io/instance": None, "kustomize.toolkit.fluxcd.io/name": "drivers"}
        await patch_nodewright(kube, nw, {"metadata": {"labels": flux}})
        refused = await plugin(cluster, "undo", nw, "-y")
        assert refused.returncode == 4 and "managed by Flux" in refused.stderr, refused.stderr
        obj = await get_nodewright(kube, nw)
        assert obj is not None and obj["spec"]["packages"]["tool"]["version"] == "2.0.0", "nothing written"

        await wait_statuses(kube, prefix, nw, "in_progress", within=60, count=1)
        forced = await plugin(cluster, "undo", nw, "--force", "-y")
        assert forced.returncode == 0, forced.stderr
        obj = await get_nodewright(kube, nw)
        assert obj is not None and obj["spec"]["packages"]["tool"]["version"] == "1.0.0"
        generation = int(obj["metadata"]["generation"])
        nodes = await wait_statuses(kube, prefix, nw, "complete", within=90, generation=generation)
        assert all(versions_on(node, nw).get("1.0.0") == "complete" for node in nodes)
        await invariants.sync()
        await delete_and_diagnose(kube, prefix, nw)
