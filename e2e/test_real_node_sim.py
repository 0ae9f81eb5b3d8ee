"""`nodewright sim up --real-nodes 2 --nodes 2`, a reboot from a privileged pod, `sim down`: nothing changed.

The acceptance of real nodes (issue 30), through the CLI as a user runs it: two real nodes whose
`containerRuntimeVersion` is containerd 2's and two kwok nodes, all Ready; a privileged hostPID pod with the
node's root mounted at /host (the shape of NodeWright's package pods) writes a sysctl and a sysctl file in
the node's root and reboots it; the node comes back with a new boot ID and the file's value, while the
machine's own value never changed; `sim down` leaves the machine snapshot (e2e/machine.py) unchanged.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from e2e import machine
from nodewright.sim import box
from nodewright.sim.kubeapi import JSON, KubeClient

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.timeout(600), pytest.mark.real_nodes]
SLEEPER = "docker.io/library/busybox:1.35"


def sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodewright", "sim", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def reboot_pod(node: str) -> JSON:
    script = (
        "chroot /host /bin/sh -c 'sysctl -w vm.swappiness=7"
        " && echo vm.swappiness = 21 > /etc/sysctl.d/90-e2e.conf && reboot'; sleep 60"
    )
    return {
        "metadata": {"name": f"reboot-{node}"},
        "spec": {
            "nodeName": node,
            "hostPID": True,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "c",
                    "image": SLEEPER,
                    "command": ["/bin/sh", "-c", script],
                    "securityContext": {"privileged": True},
                    "volumeMounts": [
                        {"name": "host", "mountPath": "/host", "mountPropagation": "HostToContainer"}
                    ],
                }
            ],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
        },
    }


def test_sim_up_with_real_nodes_and_down_leaves_the_machine_as_before() -> None:
    before = machine.take()
    swappiness = Path("/proc/sys/vm/swappiness").read_text()
    directory = Path(tempfile.mkdtemp(prefix="nodewright-sim-real-", dir="/dev/shm")) / "sim"
    up = sim("up", "--real-nodes", "2", "--nodes", "2", "--dir", str(directory))
    try:
        assert up.returncode == 0, up.stderr
        kubeconfig = Path(up.stdout.strip().splitlines()[-1])
        images = directory.parent / "images"
        build = [
            sys.executable,
            str(REPO / "hack/images/build.py"),
            "--out",
            str(images),
            "--only",
            "package-base",
        ]
        subprocess.run(build, capture_output=True, check=True, timeout=600)
        pushed = sim("push", "--dir", str(directory), str(images / "package-base"), SLEEPER)
        assert pushed.returncode == 0, pushed.stderr
        asyncio.run(nodes_ready_and_one_rebooted(kubeconfig))
        node_dir = directory / "realnodes" / "nodes" / "real-node-1"
        after_boot = box.run_inside(node_dir, ["cat", "/proc/sys/vm/swappiness"])
        assert after_boot.stdout.strip() == "21", after_boot  # the file's value, set by the node's boot
        status = json.loads((directory / "realnodes" / "status.json").read_text())
        assert status["real-node-1"]["boots"] == 2 and status["real-node-1"]["last_end"] == "reboot", status
        assert Path("/proc/sys/vm/swappiness").read_text() == swappiness  # never the machine's
    finally:
        down = sim("down", "--dir", str(directory))
        shutil.rmtree(directory.parent, ignore_errors=True)
    assert down.returncode == 0, down.stderr
    changed = machine.differences(before, machine.take())
    assert not changed, "sim up/down with real nodes changed the machine:\n" + "\n".join(changed[:60])


async def nodes_ready_and_one_rebooted(kubeconfig: Path) -> None:
    async with KubeClient(kubeconfig) as kube:
        nodes = {n["metadata"]["name"]: n for n in (await kube.list_all("/api/v1/nodes"))["items"]}
        assert set(nodes) == {"real-node-0", "real-node-1", "gpu-node-00000", "gpu-node-00001"}
        for name in ("real-node-0", "real-node-1"):
            info = nodes[name]["status"]["nodeInfo"]
            assert info["containerRuntimeVersion"].startswith("containerd://2."), info
            ready = {c["type"]: c["status"] for c in nodes[name]["status"]["conditions"]}["Ready"]
            assert ready == "True", nodes[name]["status"]["conditions"]
        boot = nodes["real-node-1"]["status"]["nodeInfo"]["bootID"]
        listed = await kube.get("/api/v1/nodes", params={"fieldSelector": "metadata.name=real-node-1"})
        await kube.create("/api/v1/namespaces/default/pods", reboot_pod("real-node-1"))
        # Every status the node goes through, from a watch: Ready, then not (the box down), then Ready
        # again with a new boot ID.
        seen: list[tuple[str, str]] = []
        stream = kube.watch(
            "/api/v1/nodes",
            resource_version=listed["metadata"]["resourceVersion"],
            params={"fieldSelector": "metadata.name=real-node-1"},
            timeout_s=120,
        )
        async for event in stream:
            status = event["object"].get("status") or {}
            ready = {c["type"]: c["status"] for c in status.get("conditions") or []}.get("Ready", "")
            if not seen or seen[-1] != (ready, status["nodeInfo"]["bootID"]):
                seen.append((ready, status["nodeInfo"]["bootID"]))
            if seen[-1][0] == "True" and seen[-1][1] != boot:
                break
        assert seen[-1][0] == "True" and seen[-1][1] != boot, seen
        assert any(ready != "True" for ready, _ in seen), f"never NotReady during the reboot: {seen}"
