"""Issue 5 scenarios: the node controller and the rollout controller together on the real control plane.

Each test creates its own fleet (`<test>-<unique>` nodes selected by `sim.nodewright.io/fleet`), its
own NodeWright(s), runs the operator as a subprocess (`e2e/operator_fixture.py`), and deletes what it
made while the operator still runs (so the finalizer is released). Simulated stages take 1 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import yaml

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    REPO,
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
from e2e.test_plugin import plugin, plugin_json
from nodewright.api.nodestate import decode
from nodewright.plan import podspec
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import ApiError, KubeClient


async def generation_of(kube: KubeClient, nw: str) -> int:
    obj = await get_nodewright(kube, nw)
    assert obj is not None
    return int(obj["metadata"]["generation"])


# Fixtures of the operator module, registered in this test module.
crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory


def log_records(operator: OperatorProcess) -> list[dict[str, Any]]:
    """The operator's JSON log lines, parsed (other lines skipped)."""
    records = []
    for line in operator.log_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


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
            podspec.pod_node(p),
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
            # One pod per transition: the upgrade pod runs upgrade, then config.
            assert stages == ["upgrade"], watch.created
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
        # Complete after 3 attempts, as the state and the plugin say (issue 29 item 5: it said 1).
        assert [state_of(n, nw).entry("tool", "1.0.0").attempts for n in nodes] == [3, 3]
        status = await plugin_json(cluster, "node", "status", nodes[0]["metadata"]["name"])
        [mine] = [d for d in status["nodewrights"] if d["nodewright"] == nw]
        assert [(p["state"], p["attempts"]) for p in mine["packages"]] == [("complete", 3)], mine
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
        # The pod is gone, and the stage's kept log says why (issue 29 item 6: there was none).
        node = nodes[0]["metadata"]["name"]

        async def pod_gone() -> bool:
            return not await package_pods(kube, nw)

        await fleet.wait_for(pod_gone, within=60, what="the failed pod deleted")
        logs = await plugin_json(cluster, "package", "logs", nw, "tool", "--node", node)
        assert logs["source"] == "kept", logs
        [kept] = logs["entries"]
        assert (kept["stage"], kept["outcome"], kept["attempt"], kept["container"]) == (
            "apply",
            "failed",
            1,
            "tool-init",
        ), kept
        assert kept["image"] == "ghcr.io/example/pkg:1.0.0", kept
        assert kept["reason"] in ("ErrImagePull", "ImagePullBackOff"), kept
        assert "apply failed 1 time(s), giving up: image pull failing for 1m" in kept["message"], kept
        assert "ghcr.io/example/pkg:1.0.0" in kept["message"], kept
        text = (await plugin(cluster, "package", "logs", nw, "tool", "--node", node)).stdout
        assert "image ghcr.io/example/pkg:1.0.0" in text and "giving up" in text, text
        await delete_nodewright(kube, nw)


async def test_operator_killed_mid_rollout_resumes_without_rerunning(
    cluster: ControlPlane,
    operator_factory: Callable[..., OperatorProcess],
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    # A pod per package (chained runs off): the unchained mode's pods across a SIGKILL. The chained
    # mode, the default, has its own kill test (e2e/test_chain.py).
    operator = operator_factory("--no-chain-packages")
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
        # Exactly one pod per (node, package): its install pod runs apply and config, and nothing
        # finished was re-run.
        keys = [(node, pkg, stage) for _, node, pkg, stage, _ in watch.created]
        assert len(keys) == len(set(keys)) == 4 * 2, sorted(keys)
        assert {stage for _, _, stage in keys} == {"apply"}, sorted(keys)
        # The operator's log accounts for every pod it made, across the SIGKILL: the record of the
        # intent is written before the create request leaves (issue 29 item 12).
        intents = {r.get("pod") for r in log_records(operator) if r.get("event") == "creating package pod"}
        assert {name for name, *_ in watch.created} <= intents, (watch.created, intents)
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
        assert status_of(node, nw) == "blocked", "a node whose state cannot be read is not complete"
        assert (condition_of(node, nw) or {}).get("reason") == "StateMalformed"
        status = (await get_nodewright(kube, nw) or {}).get("status") or {}
        assert status.get("completeNodes") == "1/2" and status.get("status") != "complete", status
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
            # No key of a deleted NodeWright stays on a node: not its state (the "stays" package's files
            # remain on the host; the agent's history there records them), not its admission.
            annotations = node["metadata"].get("annotations") or {}
            assert not [k for k in annotations if k.endswith(f".{nw}")], annotations
            assert not node["spec"].get("unschedulable")


# -- issue 5: ordering, downgrade, sequencing, pause/disable, eligibility, uninstall ------------------------


def _time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def first_pods(watch: PodCreations, node: str) -> dict[str, dt.datetime]:
    """Per package: creation time of its first pod on `node`."""
    out: dict[str, dt.datetime] = {}
    for name, on, pkg, _, _ in watch.created:
        if on == node:
            at = _time(watch.created_at[name])
            out[pkg] = min(out.get(pkg, at), at)
    return out


def completed_at(node: dict[str, Any], nw: str, pkg: str, version: str = "1.0.0") -> dt.datetime:
    entry = state_of(node, nw).entry(pkg, version)
    assert entry is not None and entry.state.value == "complete" and entry.updated, entry
    return _time(entry.updated)


async def test_depends_on_diamond(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """A and B run side by side; C starts on a node only after both completed there."""
    prefix, nw = f"dia-{unique}", f"dia-{unique}"
    async with fleet_of(cluster, prefix, 2), PodCreations(kube, nw) as watch:
        packages = {
            "pa": package(duration="2s"),
            "pb": package(duration="2s"),
            "pc": package(dependsOn={"pa": "1.0.0", "pb": "1.0.0"}),
        }
        await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages=packages))
        nodes = await wait_statuses(kube, prefix, nw, "complete", within=120)
        for node in nodes:
            first = first_pods(watch, node["metadata"]["name"])
            a_done, b_done = completed_at(node, nw, "pa"), completed_at(node, nw, "pb")
            assert first["pc"] >= max(a_done, b_done), (first, a_done, b_done)
            assert first["pa"] < b_done and first["pb"] < a_done, ("A and B did not overlap", first)
        await delete_nodewright(kube, nw)


async def test_priority_sequencing_node_then_all(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """hi (priority 1, one node at a time) before lo (priority 2). `sequencing: node`: lo starts on a node
    once hi completed there, before hi completed everywhere; `all`: only once hi completed everywhere."""
    prefix = f"seq-{unique}"
    async with fleet_of(cluster, prefix, 2) as names:
        for mode in ("node", "all"):
            hi, lo = f"hi{mode}-{unique}", f"lo{mode}-{unique}"
            async with PodCreations(kube, lo) as watch:
                await create_nodewright(
                    kube,
                    nodewright_manifest(
                        hi,
                        fleet_prefix=prefix,
                        packages={"base": package(duration="2s")},
                        priority=1,
                        sequencing=mode,
                        interruptionBudget={"count": 1},
                    ),
                )
                await create_nodewright(
                    kube,
                    nodewright_manifest(lo, fleet_prefix=prefix, packages={"app": package()}, priority=2),
                )
                await wait_statuses(kube, prefix, hi, "complete", within=90)
                nodes = await wait_statuses(kube, prefix, lo, "complete", within=90)
            hi_done = {n["metadata"]["name"]: completed_at(n, hi, "base") for n in nodes}
            lo_first = {name: first_pods(watch, name)["app"] for name in names}
            for name in names:
                assert lo_first[name] >= hi_done[name], (mode, name, lo_first, hi_done)
            if mode == "all":
                assert min(lo_first.values()) >= max(hi_done.values()), (lo_first, hi_done)
            else:
                assert min(lo_first.values()) < max(hi_done.values()), (
                    "lo waited for all",
                    lo_first,
                    hi_done,
                )
            await delete_nodewright(kube, lo)
            await delete_nodewright(kube, hi)


ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"


async def _label_leaves_complete(kube: KubeClient, node: str, nw: str) -> bool:
    """Whether the API server lets `nw`'s status label on `node` change from `complete` (a dry run)."""
    patch = {"metadata": {"labels": {f"nodewright.io/status.{nw}": "waiting"}}}
    try:
        await kube.request(
            "PATCH",
            f"/api/v1/nodes/{node}",
            body=patch,
            params={"dryRun": "All"},
            content_type="application/merge-patch+json",
        )
    except ApiError as err:
        if err.status in (403, 422):
            return False
        raise
    return True


@contextlib.asynccontextmanager
async def status_label_held(kube: KubeClient, nw: str, *, prefix: str, probe: str) -> AsyncIterator[None]:
    """While inside, the API server refuses every write that moves `nw`'s status label on the fleet's
    nodes away from `complete` (a ValidatingAdmissionPolicy): `nw`'s node controller cannot record that
    it planned a node for a new spec (its state and label go in one write), so the label lags the spec
    for as long as the test wants -- what a backlogged node queue, a restart or write throttling do
    for a while at fleet scale. `probe` is a fleet node whose label says `complete`: the policy is in
    force once a dry run on it is refused, and gone once one is accepted again."""
    key = f"nodewright.io/status.{nw}"
    name = f"nodewright-e2e-hold-{nw}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "objectSelector": {"matchLabels": {fleet.FLEET_LABEL: prefix}},
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["UPDATE"],
                        "resources": ["nodes", "nodes/status"],
                    }
                ],
            },
            "validations": [
                {
                    "expression": f"!(has(oldObject.metadata.labels) && '{key}' in oldObject.metadata.labels"
                    f" && oldObject.metadata.labels['{key}'] == 'complete')"
                    f" || (has(object.metadata.labels) && '{key}' in object.metadata.labels"
                    f" && object.metadata.labels['{key}'] == 'complete')",
                    "message": f"e2e: {key} stays complete for now",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    await kube.create(f"{ADMISSION_API}/validatingadmissionpolicies", policy)
    await kube.create(f"{ADMISSION_API}/validatingadmissionpolicybindings", binding)
    try:

        async def in_force() -> bool:
            return not await _label_leaves_complete(kube, probe, nw)

        await fleet.wait_for(in_force, within=30, what="the label-holding admission policy in force")
        yield
    finally:
        await kube.delete(f"{ADMISSION_API}/validatingadmissionpolicybindings/{name}")
        await kube.delete(f"{ADMISSION_API}/validatingadmissionpolicies/{name}")

        async def lifted() -> bool:
            return await _label_leaves_complete(kube, probe, nw)

        await fleet.wait_for(lifted, within=30, what="the label-holding admission policy gone")


async def test_two_ordered_nodewrights_edited_together_keep_their_order(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """hi (priority 1) and lo (priority 2) are complete; both are upgraded in one go (hi first). lo may
    start on a node only once hi completed its *new* version there, however long hi's status label
    keeps saying `complete` from the old one: here it is held by the API server until lo has shown
    what it makes of it (its nodes wait for hi), and lo's pods are watched throughout."""
    prefix = f"seqedit-{unique}"
    hi, lo = f"hi-{unique}", f"lo-{unique}"
    async with fleet_of(cluster, prefix, 2) as names:
        await create_nodewright(
            kube,
            nodewright_manifest(
                hi,
                fleet_prefix=prefix,
                packages={"base": package()},
                priority=1,
                interruptionBudget={"count": 1},
            ),
        )
        await create_nodewright(
            kube, nodewright_manifest(lo, fleet_prefix=prefix, packages={"app": package()}, priority=2)
        )
        await wait_statuses(kube, prefix, hi, "complete", within=90)
        await wait_statuses(kube, prefix, lo, "complete", within=90)
        async with PodCreations(kube, lo) as watch:
            async with status_label_held(kube, hi, prefix=prefix, probe=names[0]):
                await patch_nodewright(kube, hi, {"spec": {"packages": {"base": {"version": "1.1.0"}}}})
                await patch_nodewright(kube, lo, {"spec": {"packages": {"app": {"version": "1.1.0"}}}})
                hi_generation, lo_generation = await generation_of(kube, hi), await generation_of(kube, lo)

                async def lo_decided() -> bool:
                    if watch.created:
                        return True  # lo started although hi has not even begun 1.1.0 anywhere
                    status = ((await get_nodewright(kube, lo)) or {}).get("status") or {}
                    waiting = [c for c in status.get("conditions", []) if c["type"] == "WaitingForNodeWright"]
                    return any(
                        c["status"] == "True" and c["observedGeneration"] == lo_generation for c in waiting
                    )

                await fleet.wait_for(lo_decided, within=60, what=f"{lo} started or waits for {hi}")
                assert watch.created == [], (
                    f"{lo} started while {hi} still had 1.1.0 to do everywhere (its label lagging)",
                    watch.created,
                )
            hi_nodes = await wait_statuses(kube, prefix, hi, "complete", within=120, generation=hi_generation)
            lo_nodes = await wait_statuses(kube, prefix, lo, "complete", within=120, generation=lo_generation)
        hi_done = {n["metadata"]["name"]: completed_at(n, hi, "base", "1.1.0") for n in hi_nodes}
        for node in lo_nodes:
            name = node["metadata"]["name"]
            assert state_of(node, lo).entry("app", "1.1.0") is not None, name
            first = first_pods(watch, name)
            assert first["app"] >= hi_done[name], (name, first, hi_done)
        await delete_nodewright(kube, lo)
        await delete_nodewright(kube, hi)


async def test_pause_stops_new_starts_and_resume_continues_disable_blocks_nothing(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix = f"pd-{unique}"
    nw, off, later = f"pd-{unique}", f"off-{unique}", f"later-{unique}"
    async with fleet_of(cluster, prefix, 2), PodCreations(kube, nw) as watch:
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw,
                fleet_prefix=prefix,
                packages={"pa": package(duration="2s"), "pb": package(dependsOn={"pa": "1.0.0"})},
                interruptionBudget={"count": 1},
            ),
        )

        async def started() -> bool:
            return len(watch.created) >= 1

        await fleet.wait_for(started, within=30, what="first pod")
        await patch_nodewright(kube, nw, {"metadata": {"annotations": {"nodewright.io/pause": "true"}}})
        await wait_statuses(kube, prefix, nw, "paused", within=30)
        before = len(watch.created)
        await asyncio.sleep(4)  # nothing may start while paused: give it time to (wrongly) happen
        assert len(watch.created) == before, watch.created[before:]
        await patch_nodewright(kube, nw, {"metadata": {"annotations": {"nodewright.io/pause": "false"}}})
        await wait_statuses(kube, prefix, nw, "complete", within=90)
        assert len(watch.created) > before
        # Disabled: status disabled, nothing started, and it does not hold back a later NodeWright.
        async with PodCreations(kube, off) as off_watch:
            await create_nodewright(
                kube,
                nodewright_manifest(
                    off,
                    fleet_prefix=prefix,
                    packages={"px": package()},
                    priority=1,
                    sequencing="all",
                    annotations={"nodewright.io/disable": "true"},
                ),
            )
            await create_nodewright(
                kube, nodewright_manifest(later, fleet_prefix=prefix, packages={"py": package()}, priority=5)
            )
            await wait_statuses(kube, prefix, later, "complete", within=90)
            await wait_statuses(kube, prefix, off, "disabled", within=30)

            async def nw_disabled() -> bool:
                obj = await get_nodewright(kube, off)
                return bool((obj or {}).get("status", {}).get("status") == "disabled")

            await fleet.wait_for(nw_disabled, within=30, what="NodeWright status disabled")
            assert off_watch.created == []
        # A disabled NodeWright cannot clean up after itself, so its deletion waits until it is enabled.
        await patch_nodewright(kube, off, {"metadata": {"annotations": {"nodewright.io/disable": None}}})
        for name in (later, off, nw):
            await delete_nodewright(kube, name)


async def test_ignore_label_and_untolerated_taint_block_until_tolerated(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"elig-{unique}", f"elig-{unique}"
    async with fleet_of(cluster, prefix, 3) as names:
        ignored, tainted, free = names
        await kube.merge_patch(
            f"/api/v1/nodes/{ignored}", {"metadata": {"labels": {"nodewright.io/ignore": "true"}}}
        )
        taint = {"key": "dedicated", "value": "infer", "effect": "NoSchedule"}
        await kube.merge_patch(f"/api/v1/nodes/{tainted}", {"spec": {"taints": [taint]}})
        await create_nodewright(
            kube, nodewright_manifest(nw, fleet_prefix=prefix, packages={"tool": package()})
        )
        await wait_statuses(kube, prefix, nw, "complete", within=90, count=1)
        nodes = await wait_statuses(kube, prefix, nw, "blocked", within=30, count=2)
        by_name = {n["metadata"]["name"]: n for n in nodes}
        assert status_of(by_name[free], nw) == "complete"
        assert "nodewright.io/ignore=true" in (condition_of(by_name[ignored], nw) or {}).get("message", "")
        assert "dedicated=infer:NoSchedule" in (condition_of(by_name[tainted], nw) or {}).get("message", "")
        assert not any(podspec.pod_node(p) in (ignored, tainted) for p in await package_pods(kube, nw))
        await patch_nodewright(
            kube,
            nw,
            {
                "spec": {
                    "additionalTolerations": [{"key": "dedicated", "operator": "Equal", "value": "infer"}]
                }
            },
        )
        await wait_statuses(kube, prefix, nw, "complete", within=90, count=2)
        node = await kube.get(f"/api/v1/nodes/{tainted}")
        assert status_of(node, nw) == "complete"
        node = await kube.get(f"/api/v1/nodes/{ignored}")
        assert status_of(node, nw) == "blocked"
        await delete_nodewright(kube, nw)


async def test_downgrade_installs_lower_version_and_keeps_the_newer_entry(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """uninstall.enabled=false: the lower version is installed with `apply`, the newer entry stays.
    uninstall.enabled=true: the operator refuses (blocked, "requires uninstalling 2.0.0 first") — the
    webhook would refuse the edit, but the operator must not act on it either."""
    free_prefix, guarded_prefix = f"dg-{unique}", f"dgu-{unique}"
    free_nw, guarded_nw = f"dg-{unique}", f"dgu-{unique}"
    async with fleet_of(cluster, free_prefix, 1), fleet_of(cluster, guarded_prefix, 1):
        await create_nodewright(
            kube, nodewright_manifest(free_nw, fleet_prefix=free_prefix, packages={"pkg": package("2.0.0")})
        )
        await create_nodewright(
            kube,
            nodewright_manifest(
                guarded_nw,
                fleet_prefix=guarded_prefix,
                packages={"pkg": package("2.0.0", uninstall={"enabled": True})},
            ),
        )
        await wait_statuses(kube, free_prefix, free_nw, "complete", within=90)
        await wait_statuses(kube, guarded_prefix, guarded_nw, "complete", within=90)
        async with PodCreations(kube, free_nw) as watch, PodCreations(kube, guarded_nw) as guarded_watch:
            await patch_nodewright(kube, free_nw, {"spec": {"packages": {"pkg": {"version": "1.0.0"}}}})
            await patch_nodewright(kube, guarded_nw, {"spec": {"packages": {"pkg": {"version": "1.0.0"}}}})
            nodes = await wait_statuses(
                kube,
                free_prefix,
                free_nw,
                "complete",
                within=90,
                generation=await generation_of(kube, free_nw),
            )
            # One install pod (apply, then config).
            assert {(pkg, stage) for _, _, pkg, stage, _ in watch.created} == {("pkg", "apply")}
            state = state_of(nodes[0], free_nw)
            assert sorted(e.version for e in state.packages) == ["1.0.0", "2.0.0"], state
            guarded = await wait_statuses(kube, guarded_prefix, guarded_nw, "blocked", within=30)
            message = (condition_of(guarded[0], guarded_nw) or {}).get("message", "")
            assert "requires uninstalling 2.0.0 first" in message, message
            assert guarded_watch.created == []
        await delete_nodewright(kube, free_nw)
        await delete_nodewright(kube, guarded_nw)


async def test_uninstall_removes_the_entry_and_cancel_reinstalls(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix, nw = f"un-{unique}", f"un-{unique}"
    async with fleet_of(cluster, prefix, 1):
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw, fleet_prefix=prefix, packages={"pkg": package(uninstall={"enabled": True})}
            ),
        )
        await wait_statuses(kube, prefix, nw, "complete", within=90)
        # Uninstall: the entry goes.
        async with PodCreations(kube, nw) as watch:
            await patch_nodewright(kube, nw, {"spec": {"packages": {"pkg": {"uninstall": {"apply": True}}}}})
            nodes = await wait_statuses(
                kube, prefix, nw, "complete", within=90, generation=await generation_of(kube, nw)
            )
            assert [stage for _, _, _, stage, _ in watch.created] == ["uninstall"]
        assert state_of(nodes[0], nw).packages == ()
        # Reinstall, then a slow uninstall cancelled while its pod runs: reinstalled from apply.
        await patch_nodewright(kube, nw, {"spec": {"packages": {"pkg": {"uninstall": {"apply": False}}}}})
        await wait_statuses(kube, prefix, nw, "complete", within=90, generation=await generation_of(kube, nw))
        async with PodCreations(kube, nw) as watch:
            slow = [{"name": "NODEWRIGHT_SIM_DURATION", "value": "20s"}]
            await patch_nodewright(
                kube, nw, {"spec": {"packages": {"pkg": {"uninstall": {"apply": True}, "env": slow}}}}
            )

            async def uninstalling() -> bool:
                return any(stage == "uninstall" for _, _, _, stage, _ in watch.created)

            await fleet.wait_for(uninstalling, within=30, what="uninstall pod")
            fast = [{"name": "NODEWRIGHT_SIM_DURATION", "value": "1s"}]
            await patch_nodewright(
                kube, nw, {"spec": {"packages": {"pkg": {"uninstall": {"apply": False}, "env": fast}}}}
            )
            nodes = await wait_statuses(
                kube, prefix, nw, "complete", within=90, generation=await generation_of(kube, nw)
            )
            stages = [stage for _, _, _, stage, _ in watch.created]
            assert stages == ["uninstall", "apply"], stages  # the install pod runs apply and config
        entry = state_of(nodes[0], nw).entry("pkg", "1.0.0")
        assert entry is not None and entry.state.value == "complete"
        await delete_nodewright(kube, nw)


async def test_reference_skyhook_manifest_converted_completes(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """manifests/samples/reference/skyhook-gpu-stack.yaml, written for the reference system, converted by
    changing apiVersion and kind. Changed beyond that, for a shared test cluster only: metadata.name
    (unique per run) and spec.nodeSelectors (this test's fleet instead of every GPU node). Stages run
    with the simulator's default duration (2 s); the TOKEN secret is never resolved (no kubelet)."""
    doc = yaml.safe_load((REPO / "manifests/samples/reference/skyhook-gpu-stack.yaml").read_text())
    doc["apiVersion"], doc["kind"] = "nodewright.io/v1alpha1", "NodeWright"
    prefix = nw = f"ref-{unique}"
    doc["metadata"]["name"] = nw
    doc["spec"]["nodeSelectors"] = {"matchLabels": {fleet.FLEET_LABEL: prefix}}
    async with fleet_of(cluster, prefix, 2):
        await create_nodewright(kube, doc)
        nodes = await wait_statuses(kube, prefix, nw, "complete", within=150)
        for node in nodes:
            state = state_of(node, nw)
            assert {(e.name, e.version) for e in state.packages} == {("tuning", "1.1.2"), ("spencer", "3.2")}
            assert not node["spec"].get("unschedulable")

        async def untainted() -> bool:
            # runtimeRequired (+ autoTaintNewNodes): the rollout controller lifts the taint once a node
            # is complete, right after the status label this test waited for.
            return not any(
                t["key"] == "nodewright.io/runtime-required"
                for n in await nodes_of(kube, prefix)
                for t in n["spec"].get("taints") or []
            )

        await fleet.wait_for(untainted, within=30, what="runtime-required taints lifted")
        await delete_nodewright(kube, nw, within=120)
