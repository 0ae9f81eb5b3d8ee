"""The eks-node-init package (packages/eks-node-init) on scratch roots standing for EKS GPU nodes.

Each root is an Amazon Linux 2023 or an Ubuntu EKS image as far as the package can tell: its
/etc/os-release, the image's kernel (booted by the simulator's boot, `nodewright.sim.kubelet_host`),
and the node's commands as the simulator's stand-ins (`dnf`, `apt-get`, `grubby`, `update-grub`,
`modprobe`, `uname`: `nodewright.hostroot.hostshims`), given to the steps as NODEWRIGHT_HOST_TOOLS. AWS's
EFA installer is a stand-in tarball on the node (`efa-installer: file:///...`), EFA devices are sysfs
entries. Every check is shown failing once its part of the change is undone behind its back.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodewright.hostroot import hostshims
from nodewright.sim import kubelet_host
from tests.packages_node import PACKAGES, Node, efa_devices, efa_installer_tarball, host_tools, node

PACKAGE = "eks-node-init"
STATE = "/var/lib/nodewright-eks-node-init"
GRUB_FILE = "/etc/default/grub.d/zz-nodewright-eks-node-init.cfg"
MODULES_FILE = "/etc/modules-load.d/90-nodewright-efa.conf"
EFA_PACKAGES = "/opt/amazon/efa_installed_packages"
INSTALLERS = "/opt/nodewright-test/efa"


@dataclass(frozen=True)
class Image:
    name: str
    os_release: str
    image_kernel: str
    pinned: str


AL2023 = Image(
    "al2023",
    'NAME="Amazon Linux"\nVERSION="2023"\nID="amzn"\nID_LIKE="fedora"\nVERSION_ID="2023"\n',
    "6.1.112-122.189.amzn2023.x86_64",
    "6.1.132-147.221.amzn2023.x86_64",
)
UBUNTU = Image(
    "ubuntu",
    'NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nID_LIKE=debian\n',
    "6.5.0-1024-aws",
    "6.8.0-1024-aws",
)


class Host:
    """A node root with its boot, its tools and an EFA installer on it."""

    def __init__(self, tmp_path: Path, image: Image) -> None:
        self.node: Node = node(tmp_path)
        self.image = image
        self.boots = 0
        self.node.write("/etc/os-release", image.os_release)
        if image is UBUNTU:
            self.node.write("/etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX=""\n')
        host_tools(self.node, tmp_path / "tools")
        for version in ("1.38.0", "1.47.0"):
            efa_installer_tarball(self.node.path(f"{INSTALLERS}/aws-efa-installer-{version}.tar.gz"), version)
        efa_devices(self.node, 4)
        self.boot()

    def config(self, **extra: str) -> dict[str, str]:
        return {
            "accelerator": "hopper",
            "kernel": self.image.pinned,
            "efa-installer": f"file://{INSTALLERS}/aws-efa-installer-{{version}}.tar.gz",
            **extra,
        }

    def boot(self) -> str:
        """A reboot as the simulator does it: a new bootID, the boot loader's default kernel."""
        self.boots += 1
        info = {"bootID": f"boot-{self.boots}", "kernelVersion": self.image.image_kernel, "osImage": "x"}
        return kubelet_host.boot_node(
            self.node.root, {"metadata": {"name": "n"}, "status": {"nodeInfo": info}}
        )

    def uname_r(self) -> str:
        return hostshims.running_kernel(self.node.root)

    def installer_runs(self) -> list[str]:
        log = self.node.path("/var/log/efa-installer-stand-in.log")
        return log.read_text().splitlines() if log.exists() else []

    def ok(self, mode: str, config: dict[str, str]) -> str:
        return self.node.ok(mode, PACKAGE, config)

    def fails(self, mode: str, config: dict[str, str]) -> str:
        return self.node.fails(mode, PACKAGE, config)


@pytest.fixture(params=[AL2023, UBUNTU], ids=lambda image: image.name)
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Host:
    image = request.param
    assert isinstance(image, Image)
    return Host(tmp_path, image)


@pytest.fixture
def al2023(tmp_path: Path) -> Host:
    return Host(tmp_path, AL2023)


def test_the_kernel_is_pinned_efa_installed_and_the_reboot_runs_the_kernel(host: Host) -> None:
    config = host.config()
    assert host.uname_r() == host.image.image_kernel
    text = host.ok("apply", config)
    assert f"installing kernel {host.image.pinned}" in text
    assert host.node.path(f"/boot/vmlinuz-{host.image.pinned}").is_file()
    assert host.installer_runs() == ["efa_installer.sh 1.47.0 -y"]
    assert host.node.read(EFA_PACKAGES).startswith("# EFA installer version: 1.47.0\n")
    assert "efa" in hostshims.loaded_modules(hostshims.Node(host.node.root, host.node.scratch))
    assert "the package's reboot interrupt boots kernel" in text
    if host.image is AL2023:
        assert "dnf install -y kernel-6.1.132-147.221.amzn2023.x86_64" in host.node.read(
            hostshims.COMMANDS_LOG
        )
        assert (
            host.node.read(f"{STATE}/boot-default-before").strip() == f"/boot/vmlinuz-{AL2023.image_kernel}"
        )
    else:
        log = host.node.read(hostshims.COMMANDS_LOG)
        assert "apt-get update" in log and "apt-get install -y linux-image-6.8.0-1024-aws" in log
        assert (
            'GRUB_DEFAULT="Advanced options for Ubuntu>Ubuntu, with Linux 6.8.0-1024-aws"'
            in host.node.read(GRUB_FILE)
        )
        assert "update-grub" in log
    text = host.ok("apply-check", config)
    assert f"the node has kernel {host.image.pinned} and EFA 1.47.0" in text

    text = host.fails("post-interrupt-check", config)
    assert f"the running kernel is {host.image.image_kernel} (uname -r), not {host.image.pinned}" in text

    assert host.boot() == host.image.pinned, "the simulated boot starts the boot loader's default"
    assert host.uname_r() == host.image.pinned
    text = host.ok("post-interrupt-check", config)
    assert f"ok: the running kernel is {host.image.pinned}" in text
    assert "ok: 4 EFA devices" in text and "ok: libfabric's efa provider answers" in text


def test_running_again_changes_nothing(host: Host) -> None:
    config = host.config()
    host.ok("apply", config)
    host.boot()
    text = host.ok("config", config)
    assert f"kernel {host.image.pinned} is installed" in text
    assert "the EFA installer 1.47.0's packages are installed" in text
    assert "eks-node-init: changed:" not in text and "installing" not in text
    assert host.installer_runs() == ["efa_installer.sh 1.47.0 -y"]
    host.ok("config-check", config)
    host.ok("post-interrupt-check", config)
    text = host.ok("upgrade", config)  # a new package version over the same configuration
    assert "eks-node-init: changed:" not in text
    host.ok("upgrade-check", config)


def _al2023_default_back(host: Host) -> None:
    hostshims.set_default_kernel(host.node.root, AL2023.image_kernel)


def _grub_overridden(host: Host) -> None:
    host.node.write("/etc/default/grub.d/zzz-site.cfg", "GRUB_DEFAULT=0\n")


def _unload_efa(host: Host) -> None:
    assert hostshims.main("rmmod", ["efa"], root=str(host.node.root), state=str(host.node.scratch)) == 0


UNDO_BOTH = [
    (
        "kernel removed",
        lambda h: h.node.path(f"/boot/vmlinuz-{h.image.pinned}").unlink(),
        "is not installed: /boot/vmlinuz-",
    ),
    (
        "EFA removed",
        lambda h: h.node.path(EFA_PACKAGES).unlink(),
        "EFA is none (/opt/amazon/efa_installed_packages)",
    ),
    (
        "EFA another version",
        lambda h: h.node.write(EFA_PACKAGES, "# EFA installer version: 1.38.0\n"),
        "EFA is 1.38.0 (/opt/amazon/efa_installed_packages), not the installer 1.47.0",
    ),
    (
        "efa not loaded at boot",
        lambda h: h.node.path(MODULES_FILE).unlink(),
        f"{MODULES_FILE} does not load efa",
    ),
    ("efa unloaded", _unload_efa, "the efa module is not loaded (/proc/modules)"),
    (
        "devices gone",
        lambda h: [(d / "device/driver").unlink() for d in h.node.path("/sys/class/infiniband").iterdir()],
        "0 EFA devices in /sys/class/infiniband, expected at least 1",
    ),
    (
        "provider gone",
        lambda h: h.node.path("/opt/amazon/efa/bin/fi_info").unlink(),
        "libfabric has no efa provider",
    ),
]


@pytest.mark.parametrize(("what", "undo", "message"), UNDO_BOTH, ids=[case[0] for case in UNDO_BOTH])
def test_each_check_fails_when_its_change_is_undone(
    host: Host, what: str, undo: object, message: str
) -> None:
    config = host.config()
    host.ok("apply", config)
    host.boot()
    host.ok("post-interrupt-check", config)
    assert callable(undo)
    undo(host)
    for mode in ("config-check", "post-interrupt-check"):
        assert message in host.fails(mode, config), what


@pytest.mark.parametrize(
    ("undo", "message"),
    [
        (_al2023_default_back, f"the boot loader's default is /boot/vmlinuz-{AL2023.image_kernel}, not"),
    ],
)
def test_the_boot_default_is_read_from_grubby(al2023: Host, undo: object, message: str) -> None:
    config = al2023.config()
    al2023.ok("apply", config)
    assert callable(undo)
    undo(al2023)
    assert message in al2023.fails("config-check", config)
    assert al2023.boot() == AL2023.image_kernel, "the default set back boots the image's kernel"
    text = al2023.fails("post-interrupt-check", config)
    assert f"the running kernel is {AL2023.image_kernel} (uname -r), not {AL2023.pinned}" in text
    al2023.ok("config", config)  # repair
    assert al2023.boot() == AL2023.pinned
    al2023.ok("post-interrupt-check", config)


def test_grub_default_is_read_as_update_grub_reads_it(tmp_path: Path) -> None:
    ubuntu = Host(tmp_path, UBUNTU)
    config = ubuntu.config()
    ubuntu.ok("apply", config)
    _grub_overridden(ubuntu)
    text = ubuntu.fails("config-check", config)
    assert "GRUB_DEFAULT is '0' after /etc/default/grub and grub.d/*.cfg" in text
    assert ubuntu.boot() == UBUNTU.image_kernel
    ubuntu.node.path("/etc/default/grub.d/zzz-site.cfg").unlink()
    ubuntu.node.write(GRUB_FILE, ubuntu.node.read(GRUB_FILE).replace("6.8.0-1024", "6.8.0-1023"))
    assert f"{GRUB_FILE} differs from what kernel=6.8.0-1024-aws gives" in ubuntu.fails(
        "config-check", config
    )
    ubuntu.ok("config", config)
    ubuntu.node.write("/boot/grub/grub.cfg", "menuentry 'Ubuntu, with Linux 6.5.0-1024-aws' {\n}\n")
    text = ubuntu.fails("config-check", config)
    assert "/boot/grub/grub.cfg has no entry for kernel 6.8.0-1024-aws: update-grub has not run" in text
    ubuntu.node.write("/boot/grub/grub.cfg", "menuentry 'Ubuntu, with Linux 6.8.0-1024-aws' {\n}\n")
    ubuntu.ok("config-check", config)


def test_grub_without_submenus_gets_the_top_level_entry(tmp_path: Path) -> None:
    ubuntu = Host(tmp_path, UBUNTU)
    ubuntu.node.write("/etc/default/grub", "GRUB_DEFAULT=0\nGRUB_DISABLE_SUBMENU=y\n")
    config = ubuntu.config()
    ubuntu.ok("apply", config)
    assert 'GRUB_DEFAULT="Ubuntu, with Linux 6.8.0-1024-aws"' in ubuntu.node.read(GRUB_FILE)
    assert ubuntu.boot() == UBUNTU.pinned
    ubuntu.ok("post-interrupt-check", config)


def test_efa_devices_zero_is_for_instance_types_without_efa(al2023: Host) -> None:
    for driver in al2023.node.root.glob("sys/class/infiniband/*/device"):
        (driver / "driver").unlink()
    config = al2023.config(**{"efa-devices": "0"})
    al2023.ok("apply", config)
    al2023.node.path("/opt/amazon/efa/bin/fi_info").write_text("#!/bin/sh\nexit 1\n")
    text = al2023.ok("config-check", config)
    assert (
        "efa-devices 0: the EFA devices and libfabric's efa provider (which needs one) are not compared"
        in text
    )
    assert "0 EFA devices" in al2023.fails("config-check", al2023.config())


def test_uninstall_puts_back_the_boot_default_and_removes_efa(host: Host) -> None:
    config = host.config()
    host.ok("apply", config)
    host.boot()
    text = host.ok("uninstall", config)
    assert (
        f"kernel {host.image.pinned} (installed by this package) is the running kernel, so it stays" in text
    )
    assert "efa_installer.sh 1.47.0 --uninstall -y" in host.installer_runs()
    assert not host.node.path(EFA_PACKAGES).exists()
    assert "efa" not in hostshims.loaded_modules(hostshims.Node(host.node.root, host.node.scratch))
    for path in (STATE, MODULES_FILE, GRUB_FILE):
        assert not host.node.path(path).exists(), path
    if host.image is AL2023:
        assert hostshims.default_kernel(host.node.root) == AL2023.image_kernel
    host.ok("uninstall-check", {})
    assert host.boot() == host.image.image_kernel, "the uninstall's reboot goes back to the image's kernel"
    host.node.write(MODULES_FILE, "# Written by the NodeWright eks-node-init package: x\nefa\n")
    assert f"{MODULES_FILE} is still there" in host.fails("uninstall-check", {})


def test_a_kernel_installed_before_the_reboot_is_removed_by_uninstall(al2023: Host) -> None:
    config = al2023.config()
    al2023.ok("apply", config)  # no reboot: the image's kernel still runs
    text = al2023.ok("uninstall", config)
    assert f"removing kernel {AL2023.pinned}" in text
    assert not al2023.node.path(f"/boot/vmlinuz-{AL2023.pinned}").exists()
    assert hostshims.default_kernel(al2023.node.root) == AL2023.image_kernel
    al2023.ok("uninstall-check", {})


def test_efa_the_image_had_is_put_back_at_its_version(al2023: Host) -> None:
    al2023.ok("apply", al2023.config(efa="1.38.0"))  # stands for an image with EFA 1.38.0
    al2023.node.path(f"{STATE}").rename(al2023.node.root / "prior-state")  # ... that no package installed
    al2023.node.path(MODULES_FILE).unlink()
    config = al2023.config()
    text = al2023.ok("config", config)
    assert "EFA: installed 1.38.0, configured 1.47.0" in text
    assert al2023.node.read(f"{STATE}/efa-before").strip() == "1.38.0"
    al2023.ok("config-check", config)
    al2023.ok("uninstall", config)
    assert al2023.installer_runs()[-2:] == [
        "efa_installer.sh 1.47.0 --uninstall -y",
        "efa_installer.sh 1.38.0 -y",
    ]
    assert al2023.node.read(EFA_PACKAGES).startswith("# EFA installer version: 1.38.0\n")


def test_a_new_kernel_replaces_the_pinned_one(al2023: Host) -> None:
    al2023.ok("apply", al2023.config())
    newer = "6.1.141-155.222.amzn2023.x86_64"
    text = al2023.ok("config", al2023.config(kernel=newer))
    assert f"removing kernel {AL2023.pinned} (installed by this package, no longer pinned)" in text
    assert al2023.boot() == newer
    al2023.ok("post-interrupt-check", al2023.config(kernel=newer))
    text = al2023.ok("uninstall", {})
    assert f"kernel {newer} (installed by this package) is the running kernel, so it stays installed" in text
    assert hostshims.default_kernel(al2023.node.root) == AL2023.image_kernel


def test_efa_is_downloaded_with_the_nodes_curl_and_its_checksum_verified(
    al2023: Host, tmp_path: Path
) -> None:
    tarball = al2023.node.path(f"{INSTALLERS}/aws-efa-installer-1.47.0.tar.gz")
    curl = tmp_path / "tools" / "curl"
    curl.write_text(
        "#!/bin/sh\n"
        f'echo "curl $*" >> "{tmp_path}/curl.log"\n'
        'while [ $# -gt 1 ]; do if [ "$1" = -o ]; then out=$2; fi; shift; done\n'
        f'cp "{tarball}" "$out"\n'
    )
    curl.chmod(0o755)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    config = {"accelerator": "blackwell", "kernel": AL2023.pinned, "efa-sha256": "0" * 64}
    text = al2023.fails("apply", config)
    assert f"has sha256 {digest}, not the configured efa-sha256 {'0' * 64}" in text
    assert al2023.installer_runs() == [], "nothing runs from an installer that does not match"
    al2023.ok("apply", {**config, "efa-sha256": digest})
    assert (
        "https://efa-installer.amazonaws.com/aws-efa-installer-1.47.0.tar.gz"
        in (tmp_path / "curl.log").read_text()
    )
    assert al2023.installer_runs() == ["efa_installer.sh 1.47.0 -y"]


def test_efa_none_leaves_efa_alone(al2023: Host) -> None:
    config = al2023.config(efa="none")
    text = al2023.ok("apply", config)
    assert "efa=none: EFA is not managed by this package" in text
    assert al2023.installer_runs() == [] and not al2023.node.path(MODULES_FILE).exists()
    al2023.ok("config-check", config)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"accelerator": "ampere", "kernel": "6.1.1"}, "configMap key 'accelerator' is 'ampere'; use one of"),
        ({"accelerator": "hopper", "kernel": "latest"}, "kernel 'latest' must be a kernel release"),
        ({"accelerator": "hopper", "kernel": "6.1.1;reboot"}, "may only use letters, digits and . _ + -"),
        ({"accelerator": "hopper", "kernel": "6.1.1", "efa": "latest"}, "efa 'latest' must be an installer"),
        (
            {"accelerator": "hopper", "kernel": "6.1.1", "kernel-packages": "kernel --nogpgcheck"},
            "holds an option, not a package name",
        ),
        ({"accelerator": "hopper", "kernel": "6.1.1", "efa-installer": "ftp://x/y"}, "must be an https://"),
        ({"accelerator": "hopper", "kernel": "6.1.1", "efa-devices": "many"}, "efa-devices 'many' must be"),
    ],
)
def test_bad_settings_fail_before_anything_changes(
    al2023: Host, config: dict[str, str], message: str
) -> None:
    assert message in al2023.fails("apply", config)
    assert not al2023.node.path(STATE).exists()


def test_what_the_node_cannot_do_is_refused_in_one_line(al2023: Host) -> None:
    text = al2023.node.fails("apply", PACKAGE, {"accelerator": "hopper"})
    assert "expected config file configmaps/kernel is missing" in text
    al2023.node.env.pop("NODEWRIGHT_HOST_TOOLS")
    text = al2023.fails("apply", al2023.config())
    assert (
        "installing a kernel (dnf or yum) needs the node's yum, and the node's root is the directory" in text
    )
    assert "this machine's yum must not act on it" in text
    assert "set NODEWRIGHT_HOST_TOOLS to a directory of stand-ins" in text
    assert not al2023.node.path(STATE).exists()
    al2023.node.write("/etc/os-release", "ID=cos\n")
    text = al2023.fails("apply", al2023.config())
    assert "this node's /etc/os-release says ID=cos: eks-node-init knows Amazon Linux" in text


def test_wrong_package_names_are_caught(al2023: Host) -> None:
    text = al2023.fails("apply", al2023.config(**{"kernel-packages": "kernel-livepatch-6.1"}))
    assert "set kernel-packages to the packages that hold kernel" in text


def test_the_readme_documents_every_key_and_every_default() -> None:
    readme = (PACKAGES / PACKAGE / "README.md").read_text()
    for key in (
        "accelerator",
        "kernel",
        "kernel-packages",
        "efa",
        "efa-installer",
        "efa-sha256",
        "efa-devices",
    ):
        assert re.search(rf"^\| `{re.escape(key)}`", readme, re.M), (
            f"README.md has no row for configMap key {key}"
        )
    rows = [
        line.split()
        for line in (PACKAGES / PACKAGE / "skyhook_dir" / "defaults.table").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rows
    for accelerator, key, value in rows:
        cells = [f"`{re.escape(cell)}`" for cell in (accelerator, key, value)]
        pattern = r"\|\s*" + r"\s*\|\s*".join(cells) + r"\s*\|\s*\S"
        assert re.search(pattern, readme), f"README.md has no row (with a reason) for {accelerator} {key}"
