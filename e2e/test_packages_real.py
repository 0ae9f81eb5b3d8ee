"""The whole chain with the project's reference packages really run (issue: packages).

NodeWright -> operator -> package pod spec -> the simulated kubelet -> our agent -> files changed in each
node's root (`<cluster dir>/roots/<node>/`) -> checks -> node state. The package images resolve to the
repository's `packages/<name>/` directories (a version-specific copy goes in `<cluster dir>/registry/
<name>/<version>/`), exactly what their Dockerfiles put at `/skyhook-package` in a real image.

- `shell` on three nodes: install, a config change (re-runs config only), an upgrade (the upgrade step
  sees PREVIOUS_VERSION/CURRENT_VERSION), an uninstall (files removed, the agent's history says
  uninstalled);
- `tuning` with a reboot interrupt: the post-interrupt check reads the values back from the rebooted node;
  a node where another file overrides a tuned sysctl fails that check: the node turns `erroring` with the
  check's output, and its compartment halts (failureThreshold 1) before touching the other nodes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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

REBOOT_SECONDS_ANNOTATION = "sim.nodewright.io/reboot-seconds"

_HEADER = '#!/bin/sh\nset -eu\nd="${NODEWRIGHT_HOST_ROOT%/}/etc/nodewright-e2e"\n'
_SAME = 'cmp -s "$SKYHOOK_DIR/configmaps/value" "$d/value"\n'
SHELL_SCRIPTS = {
    "apply.sh": _HEADER + 'mkdir -p "$d"\ncp "$SKYHOOK_DIR/configmaps/value" "$d/value"\n',
    "apply_check.sh": _HEADER + _SAME,
    "config.sh": _HEADER + 'cp "$SKYHOOK_DIR/configmaps/value" "$d/value"\n',
    "config_check.sh": _HEADER + _SAME,
    "upgrade.sh": _HEADER + 'echo "$PREVIOUS_VERSION -> $CURRENT_VERSION" > "$d/upgraded"\n',
    "upgrade_check.sh": _HEADER + 'test -s "$d/upgraded"\n',
    "uninstall.sh": _HEADER + 'rm -rf "$d"\n',
    "uninstall_check.sh": _HEADER + 'test ! -e "$d"\n',
}


def shell_package(version: str, value: str, **fields: object) -> JSON:
    return {
        "version": version,
        "image": "ghcr.io/nodewright/shell",
        "configMap": {**SHELL_SCRIPTS, "value": value},
        "uninstall": {"enabled": True},
        **fields,
    }


def publish_version(cluster: ControlPlane, name: str, version: str) -> None:
    """The image `<name>:<version>`: the reference package with that version in its config.json."""
    target = cluster.dir / "registry" / name / version
    if target.exists():
        return
    shutil.copytree(REPO / "packages" / name, target)
    config = json.loads((target / "config.json").read_text())
    config["package_version"] = version
    (target / "config.json").write_text(json.dumps(config, indent=2))


def root_of(cluster: ControlPlane, node: str) -> Path:
    return cluster.dir / "roots" / node


async def stages_created(watch: PodCreations) -> set[str]:
    return {stage for _, _, _, stage, _ in watch.created}


async def test_shell_package_install_config_upgrade_uninstall_on_real_roots(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix = nw = f"realsh-{unique}"
    publish_version(cluster, "shell", "1.0.0")
    publish_version(cluster, "shell", "1.1.0")
    async with fleet_of(cluster, prefix, 3, real_packages=3) as names:
        await create_nodewright(
            kube,
            nodewright_manifest(nw, fleet_prefix=prefix, packages={"shell": shell_package("1.0.0", "one")}),
        )
        await wait_statuses(kube, prefix, nw, "complete", within=180)
        for node in names:
            assert (root_of(cluster, node) / "etc/nodewright-e2e/value").read_text() == "one"

        async def generation() -> int:
            return int(((await get_nodewright(kube, nw)) or {})["metadata"]["generation"])

        # A config change re-runs config only.
        async with PodCreations(kube, nw) as watch:
            await patch_nodewright(
                kube, nw, {"spec": {"packages": {"shell": {"configMap": {"value": "two"}}}}}
            )
            await wait_statuses(kube, prefix, nw, "complete", within=180, generation=await generation())
            assert await stages_created(watch) == {"config"}, watch.created
        for node in names:
            assert (root_of(cluster, node) / "etc/nodewright-e2e/value").read_text() == "two"

        # An upgrade runs upgrade (told the versions), then config.
        async with PodCreations(kube, nw) as watch:
            await patch_nodewright(kube, nw, {"spec": {"packages": {"shell": {"version": "1.1.0"}}}})
            await wait_statuses(kube, prefix, nw, "complete", within=180, generation=await generation())
            assert await stages_created(watch) == {"upgrade"}, watch.created  # one pod: upgrade, config
        for node in names:
            upgraded = (root_of(cluster, node) / "etc/nodewright-e2e/upgraded").read_text()
            assert upgraded == "1.0.0 -> 1.1.0\n", upgraded

        # Uninstall: the files go, the agent's history on the node says so.
        async with PodCreations(kube, nw) as watch:
            await patch_nodewright(
                kube, nw, {"spec": {"packages": {"shell": {"uninstall": {"apply": True}}}}}
            )
            await wait_statuses(kube, prefix, nw, "complete", within=180, generation=await generation())
            assert await stages_created(watch) == {"uninstall"}, watch.created
        for node in names:
            root = root_of(cluster, node)
            assert not (root / "etc/nodewright-e2e").exists()
            [history_file] = root.glob(f"var/lib/skyhook/{nw}/history/shell.json")
            history = json.loads(history_file.read_text())
            assert history["current-version"] == "uninstalled", history
        await delete_nodewright(kube, nw, within=120)


def tuning_package(**fields: object) -> JSON:
    return {
        "version": "1.0.0",
        "image": "ghcr.io/nodewright/tuning",
        "interrupt": {"type": "reboot"},
        "configMap": {"accelerator": "hopper", "workload": "training"},
        "maxAttempts": 1,
        **fields,
    }


async def test_tuning_is_read_back_after_the_reboot_and_a_failing_check_halts_the_compartment(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix = nw = f"realtune-{unique}"
    policy = f"{nw}-policy"
    fast_reboot = {REBOOT_SECONDS_ANNOTATION: "0.5"}
    async with fleet_of(cluster, prefix, 4, real_packages=4, annotations_extra=fast_reboot) as names:
        # The canary (first in pick order) carries a sysctl file that overrides a tuned value and wins
        # (later in the boot order): its post-interrupt check must catch that.
        canary = sorted(names)[0]
        override = root_of(cluster, canary) / "etc/sysctl.d/99-site-override.conf"
        override.parent.mkdir(parents=True, exist_ok=True)
        override.write_text("net.core.rmem_max = 212992\n")
        await kube.create(
            "/apis/nodewright.io/v1alpha1/deploymentpolicies",
            {
                "apiVersion": "nodewright.io/v1alpha1",
                "kind": "DeploymentPolicy",
                "metadata": {"name": policy},
                "spec": {
                    "default": {
                        "budget": {"count": 1},
                        "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1}},
                    }
                },
            },
        )
        try:
            await create_nodewright(
                kube,
                nodewright_manifest(
                    nw, fleet_prefix=prefix, packages={"tuning": tuning_package()}, deploymentPolicy=policy
                ),
            )

            async def halted() -> JSON | None:
                obj = await get_nodewright(kube, nw) or {}
                conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
                return conds["Halted"] if conds.get("Halted", {}).get("status") == "True" else None

            halt = await fleet.wait_for(halted, within=180, what=f"{nw} halted by the failing check")
            assert canary in halt["message"], halt
            nodes = {n["metadata"]["name"]: n for n in await nodes_of(kube, prefix)}
            assert status_of(nodes[canary], nw) == "erroring"
            message = (condition_of(nodes[canary], nw) or {}).get("message", "")
            assert "post-interrupt" in message and "rmem_max" in message, message
            # Nothing else was touched: the compartment stopped at its canary.
            assert all(status_of(nodes[n], nw) in (None, "waiting") for n in names if n != canary), {
                n: status_of(nodes[n], nw) for n in names
            }
            # The SRE fixes the node (the override goes, the running value is corrected), asks for a
            # retry of that node (its admission removed: it goes through a batch again) and resets the
            # batch state: the canary passes its check, and the rest of the compartment rolls out.
            override.unlink()
            (root_of(cluster, canary) / "proc/sys/net/core/rmem_max").write_text("268435456\n")
            await kube.merge_patch(
                f"/api/v1/nodes/{canary}", {"metadata": {"annotations": {f"nodewright.io/batch.{nw}": None}}}
            )
            reset = {"metadata": {"annotations": {"nodewright.io/reset-batch-state": "true"}}}
            await patch_nodewright(kube, nw, reset)
            await wait_statuses(kube, prefix, nw, "complete", within=300)
            for node in names:
                root = root_of(cluster, node)
                assert (root / "proc/sys/net/core/rmem_max").read_text().strip() == "268435456"
                assert "iommu.passthrough=1" in (root / "proc/cmdline").read_text()
            await delete_nodewright(kube, nw, within=180)
        finally:
            await kube.delete(f"/apis/nodewright.io/v1alpha1/deploymentpolicies/{policy}")
