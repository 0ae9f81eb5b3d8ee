"""Every reference package (and the `package init` scaffold) chrooted into a root holding only busybox.

This is how the steps run on a node: the agent chroots each step into the host's root, where
NODEWRIGHT_HOST_ROOT is `/` and every program is the node's. The root here has Debian's static
busybox (hack/busybox/fetch.sh) with just the applets the packages use, so a step that needs a bash-ism
or another program fails. Runs as root only (chroot is privileged), like tests/test_agent_chroot.py.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from nodewright.packaging import scaffold
from nodewright.sim import kubelet_host
from tests.packages_node import REPO, Node, efa_devices, efa_installer_tarball, node

APPLETS = (
    "sh",
    "cat",
    "cmp",
    "cp",
    "mv",
    "rm",
    "mkdir",
    "ln",
    "readlink",
    "chmod",
    "tr",
    "grep",
    "tar",
    "sha256sum",
)


@pytest.fixture(scope="module")
def busybox() -> Path:
    if os.geteuid() != 0:
        pytest.skip("chroot(2) needs root: run the tests as root (CI does) to exercise chrooted steps")
    result = subprocess.run(
        ["bash", str(REPO / "hack" / "busybox" / "fetch.sh")], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"hack/busybox/fetch.sh failed:\n{result.stderr}"
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture
def host(tmp_path: Path, busybox: Path) -> Node:
    host = node(tmp_path)
    (host.root / "bin").mkdir(parents=True)
    shutil.copy2(busybox, host.root / "bin" / "busybox")
    for applet in APPLETS:
        (host.root / "bin" / applet).symlink_to("busybox")
    host.write("/etc/environment", 'PATH="/bin"\n')
    (host.root / "dev").mkdir()
    os.mknod(host.root / "dev" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return host


def _lifecycle(host: Node, package: str | Path, config: dict[str, str], *, boot: bool = True) -> None:
    for mode in ("apply", "apply-check", "config", "config-check"):
        text = host.ok(mode, package, config, chroot=True)
        assert "chroot per step" in text
    if boot:
        host.boot()
        host.ok("post-interrupt-check", package, config, chroot=True)
    host.ok("uninstall", package, config, chroot=True)
    host.ok("uninstall-check", package, config, chroot=True)


def test_tuning(host: Node) -> None:
    config = {"accelerator": "blackwell", "workload": "inference"}
    host.ok("config", "tuning", config, chroot=True)
    grub = host.read("/etc/default/grub.d/90-nodewright-tuning.cfg")
    assert "numa_balancing=disable" in grub, "written at the host path, inside the chroot"
    text = host.ok("config", "tuning", {**config, "overrides": "grub quiet -\n"}, chroot=True)
    assert "no update-grub or grub-mkconfig on this node" in text, "on the node itself it tries update-grub"
    _lifecycle(host, "tuning", config)


def test_kdump(host: Node) -> None:
    host.write("/bin/kdump-config", "#!/bin/sh\nexit 0\n")  # the node's kdump-tools
    host.path("/bin/kdump-config").chmod(0o755)
    host.write("/etc/default/kdump-tools", "USE_KDUMP=0\n")
    _lifecycle(host, "kdump", {"crashkernel": "512M"})
    assert host.read("/etc/default/kdump-tools") == "USE_KDUMP=0\n"


def test_kdump_without_kdump_tools_or_apt(host: Node) -> None:
    text = host.fails("apply", "kdump", {"crashkernel": "512M"}, chroot=True)
    assert "kdump-tools is not installed and this node has no apt-get" in text


def test_bind_mount(host: Node) -> None:
    mounts = {"mounts": "/data/cache /var/lib/containerd-cache nofail\n"}
    _lifecycle(host, "bind-mount", mounts)
    _lifecycle(host, "bind-mount", {**mounts, "method": "fstab"})


def test_shell(host: Node) -> None:
    config = {
        "apply.sh": '#!/bin/sh\necho hello > "${NODEWRIGHT_HOST_ROOT%/}/etc/hello"\n',
        "apply_check.sh": 'grep -q hello "${NODEWRIGHT_HOST_ROOT%/}/etc/hello"\n',
        "uninstall.sh": 'rm "${NODEWRIGHT_HOST_ROOT%/}/etc/hello"\n',
        "uninstall_check.sh": 'test ! -e "${NODEWRIGHT_HOST_ROOT%/}/etc/hello"\n',
    }
    _lifecycle(host, "shell", config, boot=False)


def test_the_scaffold(host: Node, tmp_path: Path) -> None:
    package = tmp_path / "scaffolded"
    scaffold.create("scaffolded", package)
    config = {"example.conf": "level=3\n"}
    host.boot()
    for mode in ("apply", "apply-check", "config", "config-check"):
        host.ok(mode, package, config, chroot=True)
    host.fails("post-interrupt-check", package, config, chroot=True)  # no reboot since the install yet
    host.boot()  # the package's interrupt: a reboot
    for mode in ("post-interrupt", "post-interrupt-check"):
        host.ok(mode, package, config, chroot=True)
    for mode in ("uninstall", "uninstall-check"):
        host.ok(mode, package, config, chroot=True)


# The node's own commands, as shell scripts inside the busybox root: on a node the agent chroots into the
# host's root and eks-node-init finds dnf, grubby and modprobe on the node's PATH.
NODE_COMMANDS = {
    "dnf": """#!/bin/sh
echo "dnf $*" >>/var/log/dnf.log
verb=$1
shift
for p in "$@"; do
	case $verb:$p in
	install:kernel-[0-9]*)
		r=${p#kernel-}
		mkdir -p /boot /lib/modules/$r /boot/grub2
		echo image >/boot/vmlinuz-$r
		echo "saved_entry=$r" >/boot/grub2/grubenv
		;;
	remove:kernel-[0-9]*) rm -rf /boot/vmlinuz-${p#kernel-} /lib/modules/${p#kernel-} ;;
	esac
done
""",
    "grubby": """#!/bin/sh
case $1 in
--default-kernel)
	saved=
	if [ -f /boot/grub2/grubenv ]; then saved=$(grep saved_entry= /boot/grub2/grubenv); fi
	if [ -n "$saved" ]; then echo "/boot/vmlinuz-${saved#saved_entry=}"; else echo /boot/vmlinuz-IMAGE; fi
	;;
--set-default) echo "saved_entry=${2#/boot/vmlinuz-}" >/boot/grub2/grubenv ;;
esac
""",
    "modprobe": """#!/bin/sh
if [ "$1" = -r ]; then
	grep -v "^$2 " /proc/modules >/proc/modules.new || true
	mv /proc/modules.new /proc/modules
else
	echo "$1 16384 0 - Live 0x0" >>/proc/modules
fi
""",
}


def test_eks_node_init(host: Node) -> None:
    image, pinned = "6.1.112-122.189.amzn2023.x86_64", "6.1.132-147.221.amzn2023.x86_64"
    host.write("/etc/os-release", 'ID="amzn"\nVERSION_ID="2023"\n')
    for name, text in NODE_COMMANDS.items():
        host.write(f"/bin/{name}", text.replace("IMAGE", image))
        host.path(f"/bin/{name}").chmod(0o755)
    efa_installer_tarball(host.path("/opt/efa/aws-efa-installer-1.47.0.tar.gz"), "1.47.0")
    efa_devices(host, 2)

    def boot(boot_id: str) -> str:
        info = {"bootID": boot_id, "kernelVersion": image}
        return kubelet_host.boot_node(host.root, {"metadata": {"name": "n"}, "status": {"nodeInfo": info}})

    assert boot("b-1") == image
    config = {
        "accelerator": "hopper",
        "kernel": pinned,
        "efa-installer": "file:///opt/efa/aws-efa-installer-{version}.tar.gz",
    }
    text = host.ok("apply", "eks-node-init", config, chroot=True)
    assert "chroot per step" in text and "running efa_installer.sh -y" in text
    assert host.read("/var/log/dnf.log") == f"dnf install -y kernel-{pinned}\n", "the node's dnf, on PATH"
    host.ok("apply-check", "eks-node-init", config, chroot=True)
    assert boot("b-2") == pinned
    assert "ok: the running kernel is" in host.ok(
        "post-interrupt-check", "eks-node-init", config, chroot=True
    )
    text = host.ok("uninstall", "eks-node-init", config, chroot=True)
    assert f"the boot loader's default is /boot/vmlinuz-{image} again" in text
    host.ok("uninstall-check", "eks-node-init", config, chroot=True)
    assert boot("b-3") == image
