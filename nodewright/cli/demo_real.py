"""The real nodes of `nodewright demo`: canaries that are real kubelets with containerd, where possible.

With root and the real nodes' base root (`make realnode`, which `make demo` runs), the demo's control
plane gets `--real-nodes` real nodes (docs/simulator.md, "Real nodes"), labelled as canaries: the canary
compartment starts on them, so the first nodes of the rollout are cordoned, drained, tuned and rebooted
for real (a new boot ID, the kubelet started again) before any simulated node is touched. Their package
pods pull from the simulator's registry what a cluster would pull from its registries: the agent and the
pause image under the names the demo's operator is given, and the `tuning` package built from
`packages/tuning` with `nodewright package build` on the project's busybox base (`make images`).

Without root or without the base root, `unavailable()` says why in one line and the demo runs on
simulated nodes alone, as before.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TUNING_IMAGE = "ghcr.io/nodewright/tuning"
READ_BACK = ("vm.max_map_count", "kernel.numa_balancing", "net.core.rmem_max")


def unavailable() -> str | None:
    """Why this machine cannot run real nodes now, or None when it can."""
    from nodewright.sim import binaries

    if os.geteuid() != 0:
        return "not running as root (real nodes need namespaces, mounts and cgroups)"
    for tool in ("unshare", "nsenter", "ip", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (Debian: util-linux, iproute2)"
    try:
        binaries.locate_realnode()
    except binaries.BinariesMissingError as err:
        return str(err)
    return None


def prepare(plane: Any, *, canary_label: str, agent_image: str, pause_image: str) -> list[str]:
    """Label the real nodes canaries and push what their package pods pull; returns their names."""
    names: list[str] = list(plane.real_node_names)
    plane.kubectl("label", "node", "--overwrite", *names, f"{canary_label}=true")
    images = plane.dir / "images"
    _run(
        sys.executable, REPO / "hack" / "images" / "build.py", "--out", images, "--only", "agent,package-base"
    )
    plane.push_image(images / "agent", agent_image)
    plane.push_image(Path(plane.dir) / "realnodes" / "pause-image", pause_image)
    version = json.loads((REPO / "packages" / "tuning" / "config.json").read_text())["package_version"]
    tuning = plane.dir / "tuning-image"
    _run(sys.executable, "-m", "nodewright", "package", "build", REPO / "packages" / "tuning",
         "--base", images / "package-base", "-o", tuning, "--force")  # fmt: skip
    plane.push_image(tuning, f"{TUNING_IMAGE}:{version}")
    return names


def read_back(plane: Any, node: str) -> list[str]:
    """What the tuning package left on a real node: its files on the node's disk, and the values its
    running kernel (the box's /proc/sys and /proc/cmdline, after the reboot) reports."""
    from nodewright.sim import box

    node_dir = plane.dir / "realnodes" / "nodes" / node
    lines = []
    for key in READ_BACK:
        done = box.run_inside(node_dir, ["cat", "/proc/sys/" + key.replace(".", "/")])
        lines.append(f"    sysctl {key} = {done.stdout.strip() or '(not set)'}")
    cmdline = box.run_inside(node_dir, ["cat", "/proc/cmdline"]).stdout.strip()
    lines.append(f"    /proc/cmdline: {cmdline}")
    boots = (node_dir / "upper" / "var" / "log" / "nodewright-box" / "boot.log").read_text().count(
        "\nboot "
    ) + 1
    lines.append(f"    boots of the node: {boots} (kubelet and containerd started again after each)")
    return lines


def _run(*argv: str | Path) -> None:
    done = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=900, check=False, cwd=REPO
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{' '.join(str(a) for a in argv[:4])} … failed ({done.returncode}): {tail}")


__all__: Sequence[str] = ("prepare", "read_back", "unavailable")
