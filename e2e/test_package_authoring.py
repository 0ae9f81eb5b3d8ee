"""A newcomer's first package, end to end on the simulated fleet, without an outside registry.

`nodewright package init` -> `nodewright package build --base <package-base>` (the busybox base `make
images` writes, built here by hack/images/build.py) into the simulator's directory registry -> a
NodeWright with the scaffold's reboot interrupt -> the operator -> package pods on simulated-kubelet
nodes (`real_packages`), which pull the image from the OCI layout exactly as built (its
`/skyhook-package` unpacked) -> our agent -> the node roots -> a simulated reboot -> the scaffold's
post-interrupt check, which passes only if the node really booted again after the install.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    REPO,
    OperatorProcess,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    nodewright_manifest,
    wait_statuses,
)
from nodewright.cli.main import main
from nodewright.hostroot import boot
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

REBOOT_SECONDS_ANNOTATION = "sim.nodewright.io/reboot-seconds"


@pytest.fixture(scope="module")
def package_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """build/images/package-base, as `make images` writes it."""
    out = tmp_path_factory.mktemp("images")
    result = subprocess.run(
        [sys.executable, str(REPO / "hack/images/build.py"), "--only", "package-base", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"hack/images/build.py --only package-base failed:\n{result.stderr}"
    return out / "package-base"


def package_cli(*argv: str) -> None:
    assert main(["package", *argv]) == 0, argv


async def test_a_scaffolded_package_built_onto_the_package_base_runs_on_simulated_nodes(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
    package_base: Path,
    tmp_path: Path,
) -> None:
    name = f"first-{unique}-pkg"
    prefix = nw = f"author-{unique}"
    source = tmp_path / name
    package_cli("init", name, "--dir", str(source))
    package_cli("validate", str(source))
    # The image, as built, in the simulator's directory registry: <registry>/<name>/ is the OCI layout.
    layout_dir = cluster.dir / "registry" / name
    package_cli("build", str(source), "--base", str(package_base), "-o", str(layout_dir))
    manifest_digest = json.loads((layout_dir / "index.json").read_text())["manifests"][0]["digest"]

    fast_reboot = {REBOOT_SECONDS_ANNOTATION: "0.5"}
    async with fleet_of(cluster, prefix, 2, real_packages=2, annotations_extra=fast_reboot) as names:
        package = {
            "version": "0.1.0",
            "image": f"registry.example.com/packages/{name}",
            "interrupt": {"type": "reboot"},
            "configMap": {"example.conf": "level=3\n"},
        }
        await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages={name: package}))
        await wait_statuses(kube, prefix, nw, "complete", within=240)
        pulled = cluster.dir / "kubelet" / "images" / manifest_digest.removeprefix("sha256:")
        assert (pulled / "config.json").read_bytes() == (source / "config.json").read_bytes()
        for node in names:
            root = cluster.dir / "roots" / node
            assert (root / f"etc/{name}/conf.d/example.conf").read_text() == "level=3\n"
            assert (root / f"etc/{name}/defaults.conf").is_file(), "root_dir/ of the image's payload"
            installed = (root / f"var/lib/{name}/installed").read_text().strip()
            after = (root / f"var/lib/{name}/post-interrupt").read_text().strip()
            now = boot.recorded_boot_id(root)
            assert installed not in ("", "unknown"), "apply read the boot id of the booted node"
            assert after == now != installed, "post-interrupt ran after the reboot, which its check verified"
        await delete_nodewright(kube, nw, within=180)
