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
- `eks-node-init` on Amazon Linux 2023 and Ubuntu roots: the kernel is installed with the node's package
  manager (the simulator's dnf and apt-get stand-ins), made the boot default (grubby, GRUB), booted by the
  reboot interrupt and read back (`uname -r`, the node's `status.nodeInfo.kernelVersion`); EFA is
  installed from a stand-in installer on the node; the uninstall's reboot boots the image's kernel again.
"""

from __future__ import annotations

import json
import shutil
import subprocess
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
from nodewright.hostroot import hostshims
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, KubeClient
from tests.packages_node import Node, efa_devices, efa_installer_tarball

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


AL2023_OS_RELEASE = 'NAME="Amazon Linux"\nVERSION="2023"\nID="amzn"\nID_LIKE="fedora"\nVERSION_ID="2023"\n'
NODE_INIT_KERNELS = {"al2023": "6.1.132-147.221.amzn2023.x86_64", "ubuntu": "6.8.0-1024-aws"}
EFA_INSTALLERS = "/opt/nodewright-e2e"


def node_init_package(kernel: str) -> JSON:
    return {
        "version": "1.0.0",
        "image": "ghcr.io/nodewright/eks-node-init",
        "interrupt": {"type": "reboot"},
        "configInterrupts": {"*": {"type": "reboot"}},
        "uninstall": {"enabled": True},
        "maxAttempts": 1,
        "configMap": {
            "accelerator": "hopper",
            "kernel": kernel,
            "efa-installer": f"file://{EFA_INSTALLERS}/aws-efa-installer-{{version}}.tar.gz",
            "efa-devices": "2",
        },
    }


def stage_node_image(cluster: ControlPlane, node: str, image: str) -> None:
    """What the node's image has before NodeWright: its os-release (Ubuntu's is the profile's), an EFA
    installer on its disk, two EFA devices."""
    root = Node(root=root_of(cluster, node), scratch=cluster.dir / "scratch" / node)
    if image == "al2023":
        root.write("/etc/os-release", AL2023_OS_RELEASE)
    efa_installer_tarball(root.path(f"{EFA_INSTALLERS}/aws-efa-installer-1.47.0.tar.gz"), "1.47.0")
    efa_devices(root, 2)


def uname_r(cluster: ControlPlane, node: str) -> str:
    """`uname -r` on the node: its uname stand-in, as a package step runs it."""
    result = subprocess.run(
        [str(cluster.dir / "kubelet" / "nodes" / node / "bin" / "uname"), "-r"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.strip()


async def test_eks_node_init_pins_the_kernel_and_reads_it_back_after_the_reboot(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    fast_reboot = {REBOOT_SECONDS_ANNOTATION: "0.5"}
    prefixes = {image: f"init-{image[:3]}-{unique}" for image in NODE_INIT_KERNELS}
    async with (
        fleet_of(cluster, prefixes["al2023"], 2, real_packages=2, annotations_extra=fast_reboot) as al2023,
        fleet_of(cluster, prefixes["ubuntu"], 2, real_packages=2, annotations_extra=fast_reboot) as ubuntu,
    ):
        nodes = {"al2023": al2023, "ubuntu": ubuntu}
        images = {node: image for image, names in nodes.items() for node in names}
        for node, image in images.items():
            stage_node_image(cluster, node, image)
        image_kernel = {
            n["metadata"]["name"]: n["status"]["nodeInfo"]["kernelVersion"]
            for n in await _all(kube, prefixes)
        }
        for image, prefix in prefixes.items():
            await create_nodewright(
                kube,
                nodewright_manifest(
                    prefix,
                    fleet_prefix=prefix,
                    packages={"eks-node-init": node_init_package(NODE_INIT_KERNELS[image])},
                ),
            )
        for prefix in prefixes.values():
            await wait_statuses(kube, prefix, prefix, "complete", within=240)

        reported = {
            n["metadata"]["name"]: n["status"]["nodeInfo"]["kernelVersion"]
            for n in await _all(kube, prefixes)
        }
        for node, image in images.items():
            root, pinned = root_of(cluster, node), NODE_INIT_KERNELS[image]
            assert (root / f"boot/vmlinuz-{pinned}").is_file(), node
            assert uname_r(cluster, node) == pinned, f"{node} runs the pinned kernel after the reboot"
            assert reported[node] == pinned, "the kubelet reports the booted kernel"
            assert (
                (root / "opt/amazon/efa_installed_packages")
                .read_text()
                .startswith("# EFA installer version: 1.47.0")
            )
            assert "efa" in hostshims.loaded_modules(hostshims.Node(root, root)), "loaded at boot"
            log = (root / hostshims.COMMANDS_LOG).read_text()
            if image == "al2023":
                assert f"dnf install -y kernel-{pinned}" in log and "apt-get" not in log
                assert f"saved_entry={pinned}" in (root / "boot/grub2/grubenv").read_text()
            else:
                assert f"apt-get install -y linux-image-{pinned}" in log and "grubby" not in log
                assert (
                    f"with Linux {pinned}"
                    in (root / "etc/default/grub.d/zz-nodewright-eks-node-init.cfg").read_text()
                )

        # Uninstall: the boot default goes back, and the uninstall's reboot boots the image's kernel.
        for prefix in prefixes.values():
            generation = int(((await get_nodewright(kube, prefix)) or {})["metadata"]["generation"])
            await patch_nodewright(
                kube, prefix, {"spec": {"packages": {"eks-node-init": {"uninstall": {"apply": True}}}}}
            )
            await wait_statuses(kube, prefix, prefix, "complete", within=240, generation=generation + 1)
        reported = {
            n["metadata"]["name"]: n["status"]["nodeInfo"]["kernelVersion"]
            for n in await _all(kube, prefixes)
        }
        for node in images:
            assert uname_r(cluster, node) == image_kernel[node] == reported[node], node
            assert not (root_of(cluster, node) / "var/lib/nodewright-eks-node-init").exists()
            assert not (root_of(cluster, node) / "opt/amazon/efa_installed_packages").exists()
        for prefix in prefixes.values():
            await delete_nodewright(kube, prefix, within=120)


async def _all(kube: KubeClient, prefixes: dict[str, str]) -> list[JSON]:
    return [node for prefix in prefixes.values() for node in await nodes_of(kube, prefix)]
