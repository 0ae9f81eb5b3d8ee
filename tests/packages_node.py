"""A scratch directory standing for a node, for the reference package tests: run modes, then "boot" it.

`Node.run` runs one agent mode of a package through `nodewright.packaging.localrun` (as
`nodewright package run` does: payload and configMap staged like a package pod's, the operator's
environment, the agent unprivileged unless `chroot=True`).

`Node.boot` is what a reboot does to the files a package reads back, so that post-interrupt checks
have something real to compare: the one simulated boot, `nodewright.hostroot.boot` (`/proc/sys` from
the sysctl files, `/proc/cmdline` from GRUB's defaults, tmpfiles `w` lines, `/proc/1/mountinfo` from the
bind mounts), which the simulator and `nodewright package run interrupt` use too.
"""

from __future__ import annotations

import io
import sys
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nodewright.hostroot import boot, hostshims
from nodewright.packaging import layout, localrun

REPO = Path(__file__).resolve().parents[1]
PACKAGES = REPO / "packages"


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


@dataclass
class Node:
    root: Path
    scratch: Path
    env: dict[str, str] = field(default_factory=dict)
    boots: int = 0

    def path(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    def read(self, host_path: str) -> str:
        return self.path(host_path).read_text()

    def write(self, host_path: str, text: str) -> None:
        target = self.path(host_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def run(
        self,
        mode: str,
        package: str | Path,
        config: Mapping[str, str] | None = None,
        *,
        chroot: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> Outcome:
        package_dir = package if isinstance(package, Path) else PACKAGES / package
        configs = None
        if config is not None:
            self.scratch.mkdir(parents=True, exist_ok=True)
            configs = {}
            for key, text in config.items():
                source = self.scratch / key
                source.write_text(text)
                configs[key] = source
        out, err = io.StringIO(), io.StringIO()
        result = localrun.run(
            localrun.RunRequest(
                mode=mode,
                package_dir=package_dir,
                root=self.root,
                configs=configs,
                env={**self.env, **(env or {})},
                chroot=chroot,
            ),
            stdout=out,
            stderr=err,
        )
        return Outcome(result.code, out.getvalue(), err.getvalue())

    def ok(
        self, mode: str, package: str | Path, config: Mapping[str, str] | None = None, *, chroot: bool = False
    ) -> str:
        """Run a mode that must succeed; returns what the agent printed."""
        outcome = self.run(mode, package, config, chroot=chroot)
        assert outcome.code == 0, outcome.text
        return outcome.text

    def fails(
        self, mode: str, package: str | Path, config: Mapping[str, str] | None = None, *, chroot: bool = False
    ) -> str:
        """Run a mode that must fail (agent exit 1); returns what the agent printed."""
        outcome = self.run(mode, package, config, chroot=chroot)
        assert outcome.code == 1, outcome.text
        return outcome.text

    # The simulated boot

    def boot(self, *, kernel: str = "6.8.0-nodewright") -> str:
        """A reboot of the node (`nodewright.hostroot.boot`, the simulator's and `package run`'s boot);
        returns the kernel it booted."""
        self.boots += 1
        return boot.boot(self.root, boot.BootFacts(boot_id=f"boot-{self.boots}", image_kernel=kernel))

    def grub_cmdline(self) -> str:
        return boot.grub_cmdline(self.root)


def node(tmp_path: Path) -> Node:
    return Node(root=tmp_path / "root", scratch=tmp_path / "configmap")


def copy_dir(package: str, version: str = "1.0.0") -> str:
    return layout.Identity().copy_dir(package, version)


# ----------------------------------------------------------------------------------------------------
# Stand-ins for node-init packages: the node's tools and AWS's EFA installer (tests only)

# AWS's efa_installer.sh as the checks see its result: /opt/amazon/efa_installed_packages with the
# installer's version, libfabric's fi_info listing the efa provider; --uninstall removes both. It acts on
# NODEWRIGHT_HOST_ROOT (a directory standing for a node, or / in a chroot) and refuses to run outside its
# directory, as the real one does.
EFA_INSTALLER_STAND_IN = r"""#!/bin/sh
# A test stand-in for AWS's efa_installer.sh (NodeWright's package tests and e2e only).
set -eu
R="${NODEWRIGHT_HOST_ROOT:-/}"
R="${R%/}"
VERSION=@VERSION@
[ -e common.sh ] || { echo "Please cd into the installer directory." >&2; exit 1; }
mkdir -p "$R/var/log"
echo "efa_installer.sh $VERSION $*" >>"$R/var/log/efa-installer-stand-in.log"
for arg in "$@"; do
	case $arg in
	-u | --uninstall)
		rm -rf "$R/opt/amazon/efa" "$R/opt/amazon/efa_installed_packages"
		echo "EFA uninstall complete."
		exit 0
		;;
	esac
done
mkdir -p "$R/opt/amazon/efa/bin"
printf '# EFA installer version: %s\n# Debug packages installed: no\n# Packages installed:\n' "$VERSION" \
	>"$R/opt/amazon/efa_installed_packages"
echo "efa-config efa-profile libfabric-aws rdma-core" >>"$R/opt/amazon/efa_installed_packages"
cat >"$R/opt/amazon/efa/bin/fi_info" <<'EOF'
#!/bin/sh
echo "provider: efa"
echo "    fabric: efa"
echo "    type: FI_EP_RDM"
EOF
chmod 755 "$R/opt/amazon/efa/bin/fi_info"
echo "EFA installation complete."
"""


def efa_installer_tarball(target: Path, version: str) -> Path:
    """`aws-efa-installer-<version>.tar.gz` holding the stand-in, as AWS's tarball lays it out."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w:gz") as tar:
        for name, text, mode in (
            (
                "aws-efa-installer/efa_installer.sh",
                EFA_INSTALLER_STAND_IN.replace("@VERSION@", version),
                0o755,
            ),
            ("aws-efa-installer/common.sh", "# stand-in\n", 0o644),
        ):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return target


def efa_devices(node: Node, count: int) -> None:
    """EFA devices as /sys shows them: /sys/class/infiniband/<dev>/device/driver -> .../drivers/efa."""
    for index in range(count):
        device = node.path(f"/sys/class/infiniband/rdmap{16 + index}s0/device")
        device.mkdir(parents=True, exist_ok=True)
        (device / "driver").symlink_to("../../../../bus/pci/drivers/efa")


def host_tools(node: Node, directory: Path) -> Path:
    """The simulator's stand-ins for the node's commands (dnf, apt-get, grubby, modprobe, uname, ...),
    acting on the node's root, given to the steps as NODEWRIGHT_HOST_TOOLS."""
    hostshims.install(
        directory, python=sys.executable, source_root=str(REPO), root=node.root, state=node.scratch
    )
    node.env["NODEWRIGHT_HOST_TOOLS"] = str(directory)
    return directory
