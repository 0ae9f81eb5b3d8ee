"""A real node's box: its root file system, its files, and the clean-up of what it leaves in the kernel.

A real node is a kubelet and containerd running in a box that can never touch the machine (docs/simulator.md,
"Real nodes"). The box is made of namespaces (mount, PID, network, UTS, IPC: `stage1.sh` and
`nodewright.sim.realnodes`) over an overlay root:

- the **base** (lower, read-only, shared): Debian's runc and libraries, Debian's static busybox as the
  node's shell and tools, containerd 2, the CNI plugins and the kubelet (`hack/realnode/build.sh`,
  cached outside the repository);
- the **box layer** (lower, per simulator, written here): the node's init configuration and boot, the
  `systemctl`/`service`/`modprobe` stand-ins that act on the box (`nodewright/sim/data/box/`),
  containerd's configuration (every registry host is the simulator's registry), `/etc/os-release`,
  users, an empty `resolv.conf` (nothing in a box can ask DNS anything);
- the node's **upper** directory (its disk, persistent across reboots): what `provision` writes before
  the first boot (hostname, machine ID, the kubelet's configuration and credentials, the CNI
  configuration with the node's pod subnet) and everything the node and its packages write afterwards.

`/proc/sys` in a box is the node's own copy of the machine's tunables (`snapshot_sysctl`, taken once;
`net/` is the box namespace's own, for real), so a package's sysctl writes stay in the box. The kubelet
runs its pods in the cgroup root `cgroup_root(sim_id, node)` in every hierarchy; `remove_cgroups` takes
those directories away again after the box's processes are gone, so the machine's cgroup tree ends as
it began.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

import yaml

from nodewright.sim import pki
from nodewright.sim.boxnet import AddressPlan

CGROUP_TOP: Final = "nodewright.sim"
CGROUP_FS: Final = Path("/sys/fs/cgroup")
LAYER_DIR: Final = "layer"
NODES_DIR: Final = "nodes"
SPEC_FILE: Final = "spec.json"
_BOX_FILES: Final = ("boot", "inittab-gen", "lib.sh", "run", "shutdown", "systemctl", "service", "modprobe")
# Stand-ins on the PATH of the node's root (the commands packages call), each a link into the layer.
_COMMANDS: Final = {
    "usr/bin/systemctl": "systemctl",
    "usr/sbin/service": "service",
    "sbin/modprobe": "modprobe",
    "sbin/insmod": "modprobe",
    "sbin/rmmod": "modprobe",
    "usr/sbin/update-grub": "update-grub",
}
OS_RELEASE: Final = (
    'PRETTY_NAME="NodeWright node box (Debian 12 libraries, busybox)"\nNAME="NodeWright node box"\n'
    'ID=nodewright-box\nID_LIKE=debian\nVERSION_ID="12"\n'
)


@dataclass(frozen=True)
class NodeSpec:
    """One real node: its name, index (its addresses) and labels."""

    name: str
    index: int
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BoxesSpec:
    """Everything the `realnodes` process needs, written by the control plane as `<dir>/spec.json`."""

    dir: Path
    base: Path  # the cached base root directory (hack/realnode/build.sh): root/ and pause
    sim_id: str
    api_port: int
    registry_port: int
    nodes: tuple[NodeSpec, ...]
    plan: AddressPlan = field(default_factory=AddressPlan)

    @property
    def layer(self) -> Path:
        return self.dir / LAYER_DIR

    def node_dir(self, name: str) -> Path:
        return self.dir / NODES_DIR / name

    @property
    def lowerdirs(self) -> str:
        return f"{self.layer}:{self.base / 'root'}"

    def save(self) -> None:
        data = {
            "dir": str(self.dir),
            "base": str(self.base),
            "sim_id": self.sim_id,
            "api_port": self.api_port,
            "registry_port": self.registry_port,
            "nodes": [{"name": n.name, "index": n.index, "labels": n.labels} for n in self.nodes],
        }
        (self.dir / SPEC_FILE).write_text(json.dumps(data, indent=2), encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> BoxesSpec:
        data: dict[str, Any] = json.loads((directory / SPEC_FILE).read_text(encoding="utf-8"))
        return cls(
            dir=Path(data["dir"]),
            base=Path(data["base"]),
            sim_id=data["sim_id"],
            api_port=int(data["api_port"]),
            registry_port=int(data["registry_port"]),
            nodes=tuple(NodeSpec(n["name"], int(n["index"]), dict(n["labels"])) for n in data["nodes"]),
        )


def sim_id(directory: Path) -> str:
    """A short name for one simulator directory, used in cgroup paths (several simulators side by side)."""
    return hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:10]


def cgroup_root(sim: str, node: str) -> str:
    return f"/{CGROUP_TOP}/{sim}/{node}"


# ----------------------------------------------------------------------------------------------------
# The box layer (per simulator)


def _box_data(name: str) -> str:
    return resources.files("nodewright.sim").joinpath(f"data/box/{name}").read_text(encoding="utf-8")


def stage1_script() -> Path:
    path = Path(str(resources.files("nodewright.sim").joinpath("data/box/stage1.sh")))
    return path


def write_layer(layer: Path, *, plan: AddressPlan) -> None:
    """The box layer: init configuration, stand-ins, containerd's configuration, identity files."""
    shutil.rmtree(layer, ignore_errors=True)
    box = layer / "etc" / "nodewright-box"
    (box / "services.d").mkdir(parents=True)
    for name in _BOX_FILES:
        _write(box / name, _box_data(name), mode=0o644 if name == "lib.sh" else 0o755)
    for name in ("containerd", "kubelet"):
        _write(box / "services.d" / name, _box_data(f"services.d/{name}"), mode=0o755)
    _write(box / "update-grub", _UPDATE_GRUB, mode=0o755)
    for target, name in _COMMANDS.items():
        link = layer / target
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(f"/etc/nodewright-box/{name}")
    etc = layer / "etc"
    _write(etc / "containerd" / "config.toml", containerd_config())
    _write(etc / "containerd" / "certs.d" / "_default" / "hosts.toml", registry_hosts(plan.registry))
    _write(etc / "os-release", OS_RELEASE)
    _write(
        etc / "passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
    )
    _write(etc / "group", "root:x:0:\nnogroup:x:65534:\n")
    _write(etc / "resolv.conf", "# No name server: nothing in a NodeWright node box may ask DNS anything.\n")
    _write(etc / "hosts", "127.0.0.1 localhost\n")
    _write(etc / "default" / "grub", 'GRUB_CMDLINE_LINUX=""\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    (etc / "default" / "grub.d").mkdir(parents=True, exist_ok=True)
    for directory in ("sysctl.d", "modules-load.d", "systemd/system"):
        (etc / directory).mkdir(parents=True, exist_ok=True)


_UPDATE_GRUB: Final = """#!/bin/sh
# update-grub of the box: writes /boot/grub/grub.cfg with the command line the node's next boot uses
# (the box's boot reads /etc/default/grub and grub.d itself, as GRUB's generated configuration would).
. /etc/nodewright-box/lib.sh
mkdir -p /boot/grub
printf 'linux /boot/vmlinuz-%s %s\\n' "$(uname -r)" "$(boot_cmdline | cut -d' ' -f2-)" > /boot/grub/grub.cfg
echo "Generating grub configuration file ... done"
"""


def containerd_config() -> str:
    """containerd 2's configuration for a box (version 3 schema). `restrict_oom_score_adj`: root here may
    not lower OOM scores (the sandbox would not start); no iptables, no SELinux; CNI from /opt/cni/bin."""
    return """version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "/etc/containerd/certs.d"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "registry.k8s.io/pause:3.10"
"""


def registry_hosts(registry: str) -> str:
    """Every registry host is the simulator's registry (`_default`), with no fallback to the real host:
    `server` is the local registry too, so a missing image fails here instead of going out."""
    return (
        f'server = "http://{registry}"\n\n[host."http://{registry}"]\n  capabilities = ["pull", "resolve"]\n'
    )


# ----------------------------------------------------------------------------------------------------
# A node's disk before its first boot


def provision(spec: BoxesSpec, node: NodeSpec, *, material: pki.Pki) -> Path:
    """Create the node's directories and seed its upper directory; returns the node directory."""
    plan, directory = spec.plan, spec.node_dir(node.name)
    for sub in ("upper", "work", "merged", "containerd"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    upper = directory / "upper"
    _write(upper / "etc" / "hostname", node.name + "\n")
    _write(
        upper / "etc" / "machine-id",
        hashlib.sha256(f"{spec.sim_id}/{node.name}".encode()).hexdigest()[:32] + "\n",
    )
    box = upper / "etc" / "nodewright-box"
    _write(box / "node-ip", plan.node_ip(node.index) + "\n")
    _write(box / "cgroup-root", cgroup_root(spec.sim_id, node.name) + "\n")
    _write(box / "node-labels", ",".join(f"{k}={v}" for k, v in sorted(node.labels.items())) + "\n")
    _write(upper / "etc" / "cni" / "net.d" / "10-box.conflist", cni_config(plan.pod_subnet(node.index)))
    kubelet = upper / "var" / "lib" / "kubelet"
    _write(kubelet / "config.yaml", yaml.safe_dump(kubelet_config(spec, node), sort_keys=False))
    crt, key = pki.issue_client_cert(
        material, f"node-{node.name}", user=f"system:node:{node.name}", groups=("system:nodes",)
    )
    shutil.copyfile(material.ca_crt, kubelet / "ca.crt")
    pki.write_kubeconfig(
        kubelet / "kubeconfig",
        server=f"https://{plan.service_ip}:443",
        ca_crt=material.ca_crt,
        client_crt=crt,
        client_key=key,
    )
    return directory


def cni_config(subnet: str) -> str:
    """A bridge on the node (its pods' gateway) with host-local addresses from the node's subnet; no
    masquerade (no iptables): pod addresses are routed in the lab as they are."""
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "box",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                }
            ],
        },
        indent=2,
    )


def kubelet_config(spec: BoxesSpec, node: NodeSpec) -> dict[str, Any]:
    """The kubelet's configuration in a box: every setting that would touch the machine turned off or
    pointed into the box (docs/simulator.md, "Real nodes")."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root(spec.sim_id, node.name),
        "failCgroupV1": False,
        "failSwapOn": False,
        # Check the three kernel defaults instead of writing them (the box's /proc/sys has them).
        "protectKernelDefaults": True,
        # No KUBE-* chains: they would drop non-local traffic to 127.0.0.0/8.
        "makeIPTablesUtilChains": False,
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "resolvConf": "/etc/resolv.conf",
        "podLogsDir": "/var/log/pods",
        "serializeImagePulls": False,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": "/var/lib/kubelet/ca.crt"},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "localStorageCapacityIsolation": False,
        "healthzBindAddress": "127.0.0.1",
        "readOnlyPort": 0,
        "shutdownGracePeriod": "0s",
    }


# ----------------------------------------------------------------------------------------------------
# Kernel state a box starts from, and what it leaves


def snapshot_sysctl(target: Path) -> None:
    """Copy the machine's /proc/sys values (read only) into `target/sysctl` (all but net/) and
    `target/sysctl-netcore` (net/core): what every box's /proc/sys starts from at each boot."""
    for sub in ("sysctl", "sysctl-netcore"):
        shutil.rmtree(target / sub, ignore_errors=True)
    _copy_values(Path("/proc/sys"), target / "sysctl", skip=("net",))
    _copy_values(Path("/proc/sys/net/core"), target / "sysctl-netcore", skip=())


def _copy_values(source: Path, target: Path, *, skip: tuple[str, ...]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for dirpath, dirnames, filenames in os.walk(source):
        here = Path(dirpath)
        if here == source:
            dirnames[:] = [d for d in dirnames if d not in skip]
        dest = target / here.relative_to(source)
        dest.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            with contextlib.suppress(OSError):
                value = (here / name).read_bytes()
                (dest / name).write_bytes(value)
                (dest / name).chmod(0o644)


def remove_cgroups(sim: str, *, within_s: float = 10.0) -> list[str]:
    """Remove the cgroups of simulator `sim` in every hierarchy, deepest first, and the shared top
    directory when it is empty; returns what could not be removed (a process still in it) after
    `within_s` seconds of retrying."""
    deadline = time.monotonic() + within_s
    while True:
        left: list[str] = []
        for hierarchy in _hierarchies():
            top = hierarchy / CGROUP_TOP
            _remove_tree(top / sim, left)
            with contextlib.suppress(OSError):
                top.rmdir()  # only when no other simulator uses it
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _hierarchies() -> list[Path]:
    try:
        return [p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []


def _remove_tree(root: Path, left: list[str]) -> None:
    if not root.is_dir():
        return
    for dirpath, _dirnames, _files in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
        try:
            os.rmdir(dirpath)
        except OSError:
            left.append(dirpath)


def _write(path: Path, text: str, *, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


def labels_for(node_labels: Mapping[str, str]) -> dict[str, str]:
    """The labels a kubelet may set on its own node: those outside kubernetes.io and k8s.io, and the
    topology and instance-type labels it is allowed to; the kubelet sets hostname, os and arch itself."""
    allowed = {
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "node.kubernetes.io/instance-type",
    }
    out = {}
    for key, value in node_labels.items():
        prefix = key.split("/", 1)[0] if "/" in key else ""
        if key in allowed or not (prefix.endswith("kubernetes.io") or prefix.endswith("k8s.io")):
            out[key] = value
    return out


# ----------------------------------------------------------------------------------------------------
# Looking into a running box


def init_pid(node_dir: Path) -> int | None:
    """The PID (on the machine) of the box's init: the child of the `unshare` naming `node_dir`."""
    needle = str(node_dir).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if argv and argv[0].endswith(b"unshare") and needle in argv:
                children = (entry / "task" / entry.name / "children").read_text().split()
                if children:
                    return int(children[0])
    return None


def run_inside(node_dir: Path, argv: list[str], *, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run `argv` in the box of `node_dir` (its mount, PID, network and UTS namespaces): the node as its
    own processes see it (its /proc/sys copy, its mounts), e.g. to read a running value or to change one
    by hand, as someone with a root shell on the node would."""
    pid = init_pid(node_dir)
    if pid is None:
        raise FileNotFoundError(f"no running box for {node_dir}")
    return subprocess.run(
        ["nsenter", "-t", str(pid), "-m", "-p", "-n", "-u", "--", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
