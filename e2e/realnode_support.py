"""The real-node lane's cluster: real nodes, the project's images in the local registry, the chart installed.

Used by e2e/test_real_nodes.py. `RealLane.start()`:

1. takes a machine snapshot (e2e/machine.py): the lane ends by comparing another one with it;
2. starts a control plane of its own with `REAL_NODES` real nodes (nodewright.sim.realnodes: a real
   kubelet and containerd in a box each) and `KWOK_NODES` kwok nodes; `real-node-0` is the cluster's
   system node (labelled `SYSTEM_LABEL`): the chart's operator and webhook are placed there with the
   chart's own `nodeSelector` values, as an SRE keeps an operator off the nodes it reboots;
3. builds the images as `make images` does (hack/images/build.py: operator, agent, package-base) and the
   reference packages with `nodewright package build --base <package-base>`, and pushes all of them to the
   simulator's registry under the names the chart and the NodeWrights use (`ghcr.io/nodewright/...`);
4. packages the chart, pushes it to the same registry (OCI) and installs it with the real `helm`, which
   waits until the operator and webhook Deployments are available.

Everything runs for real: the scheduler places the Deployments' pods, the kubelets pull the images
(`imagePullPolicy: Always` for package pods), the API server calls the webhook through its Service and
reaches the kubelets for logs, helm's uninstall hook is a Job whose pod runs on a real node.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from e2e import machine
from e2e.helm_support import Helm, helm_binary
from nodewright.sim import box, fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, KubeClient

REPO = Path(__file__).resolve().parent.parent
NAMESPACE: Final = "nodewright-system"
REAL_NODES: Final = 4
KWOK_NODES: Final = 2
KWOK_PREFIX: Final = "kw"
SYSTEM_NODE: Final = "real-node-0"
SYSTEM_LABEL: Final = "e2e.nodewright.io/system"
TARGET_LABEL: Final = "e2e.nodewright.io/target"
VERSION: Final = "0.1.0"
OPERATOR_IMAGE: Final = f"ghcr.io/nodewright/nodewright:{VERSION}"
AGENT_IMAGE: Final = f"ghcr.io/nodewright/agent:{VERSION}"
SLEEPER_IMAGE: Final = "docker.io/library/busybox:1.35"
PACKAGES: Final = ("shell", "tuning", "bind-mount")


def package_image(name: str) -> str:
    return f"ghcr.io/nodewright/packages/{name}"


def package_version(name: str) -> str:
    """The version of the reference package `name` (its config.json): the tag it is pushed under."""
    return str(json.loads((REPO / "packages" / name / "config.json").read_text())["package_version"])


@dataclass
class RealLane:
    root: Path
    plane: ControlPlane
    helm: Helm
    before: machine.Snapshot
    digests: dict[str, str] = field(default_factory=dict)
    installed: bool = False

    @property
    def chart_reference(self) -> str:
        return f"oci://{self.plane.registry}/charts/nodewright"

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    @property
    def targets(self) -> list[str]:
        """The nodes the lane's NodeWrights select: every real node but the system one, and the kwok ones."""
        return [
            *self.plane.real_node_names[1:],
            *(fleet.node_name(KWOK_PREFIX, i) for i in range(KWOK_NODES)),
        ]

    @property
    def real_targets(self) -> list[str]:
        return self.plane.real_node_names[1:]

    def node_dir(self, node: str) -> Path:
        return self.plane.dir / "realnodes" / "nodes" / node

    def upper(self, node: str) -> Path:
        """The node's disk as the machine sees it: every file the node (or a package) wrote."""
        return self.node_dir(node) / "upper"

    def in_box(self, node: str, *command: str, check: bool = True) -> str:
        """Run `command` inside the node's box (its mount, PID and network namespaces), as its own
        processes see the node: its /proc/sys copy, its mounts."""
        done = box.run_inside(self.node_dir(node), list(command))
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(command)} on {node} exited {done.returncode}: {done.stderr}")
        return done.stdout

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        return self.plane.kubectl(*args, check=check, timeout=timeout)

    def plugin(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`kubectl nodewright ARGS` (the plugin's entry point, with this cluster's kubeconfig)."""
        done = subprocess.run(
            [sys.executable, "-c", "from nodewright.cli.plugin import main; raise SystemExit(main())", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"kubectl nodewright {' '.join(args)} exited {done.returncode}: {done.stderr}"
            )
        return done

    @classmethod
    def start(cls) -> RealLane:
        before = machine.take()
        root = Path(tempfile.mkdtemp(prefix="nodewright-real-", dir=_scratch_root()))
        plane = ControlPlane.create(root / "cp", real_nodes=REAL_NODES)
        helm = Helm(helm_binary(), plane.kubeconfig, root / "helm")
        lane = cls(root=root, plane=plane, helm=helm, before=before)
        try:
            plane.up()
            lane._label_nodes()
            lane._publish_images()
            lane._install_chart()
        except BaseException:
            lane.stop()
            raise
        return lane

    def stop(self) -> list[str]:
        """Uninstall what is left, stop everything, and return how the machine differs from before.
        NODEWRIGHT_E2E_KEEP=1 leaves the cluster running for a look (and compares nothing)."""
        if os.environ.get("NODEWRIGHT_E2E_KEEP"):
            print(f"\n[real-nodes] kept: export KUBECONFIG={self.kubeconfig}")
            return []
        if self.installed:
            self.helm.run(
                "uninstall", "nodewright", "-n", NAMESPACE, "--wait", "--timeout", "3m", check=False
            )
        self.plane.down()
        shutil.rmtree(self.root, ignore_errors=True)
        return machine.differences(self.before, machine.take())

    # ------------------------------------------------------------------ set-up steps
    def _label_nodes(self) -> None:
        import asyncio

        asyncio.run(fleet.create_nodes(self.kubeconfig, count=KWOK_NODES, name_prefix=KWOK_PREFIX))
        self.kubectl("label", "node", SYSTEM_NODE, f"{SYSTEM_LABEL}=true")
        self.kubectl("label", "node", *self.targets, f"{TARGET_LABEL}=true")

    def _publish_images(self) -> None:
        images = self.root / "images"
        _run(sys.executable, REPO / "hack" / "images" / "build.py", "--out", images,
             "--only", "operator,agent,package-base")  # fmt: skip
        self.digests[OPERATOR_IMAGE] = self.plane.push_image(images / "operator", OPERATOR_IMAGE)
        self.digests[AGENT_IMAGE] = self.plane.push_image(images / "agent", AGENT_IMAGE)
        self.digests[SLEEPER_IMAGE] = self.plane.push_image(images / "package-base", SLEEPER_IMAGE)
        (self.root / "packages").mkdir()
        for name in PACKAGES:
            out = self.root / "packages" / name
            _run(sys.executable, "-m", "nodewright", "package", "build", REPO / "packages" / name,
                 "--base", images / "package-base", "-o", out)  # fmt: skip
            reference = f"{package_image(name)}:{package_version(name)}"
            self.digests[reference] = self.plane.push_image(out, reference)

    def _install_chart(self) -> None:
        charts = self.root / "charts"
        packaged = self.helm.run("package", str(REPO / "helm" / "nodewright"), "-d", str(charts)).stdout
        archive = packaged.strip().split(": ")[-1]
        registry = self.plane.registry
        self.helm.run("push", archive, f"oci://{registry}/charts", "--plain-http")
        values = self.root / "values.yaml"
        system = {SYSTEM_LABEL: "true"}
        values.write_text(yaml.safe_dump({"nodeSelector": system, "webhook": {"nodeSelector": system}}))
        self.helm.run(
            "install", "nodewright", self.chart_reference, "--version", VERSION,
            "--plain-http", "-n", NAMESPACE, "--create-namespace", "-f", str(values),
            "--wait", "--timeout", "4m",
            timeout=300,
        )  # fmt: skip
        self.installed = True


def _run(*argv: str | Path) -> str:
    done = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=900, check=False, cwd=REPO
    )
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def _scratch_root() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


async def pods_on(kube: KubeClient, node: str, namespace: str | None = None) -> list[JSON]:
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    listed: dict[str, Any] = await kube.list_all(path, params={"fieldSelector": f"spec.nodeName={node}"})
    items: list[JSON] = listed["items"]
    return items
