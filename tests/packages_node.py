"""A scratch directory standing for a node, for the reference package tests: run modes, then "boot" it.

`Node.run` runs one agent mode of a package through `nodewright.packaging.localrun` (as
`nodewright package run` does: payload and configMap staged like a package pod's, the operator's
environment, the agent unprivileged unless `chroot=True`).

`Node.boot` is what a reboot does to the files a package reads back, so that post-interrupt checks
have something real to compare: `/proc/sys` is emptied and the sysctl files are loaded in `sysctl
--system` order (values with several fields are written tab-separated, as procfs prints them);
`/proc/cmdline` is rebuilt from `/etc/default/grub` and `/etc/default/grub.d/*.cfg` sourced by `/bin/sh`
(as update-grub does); `w` lines of `/etc/tmpfiles.d/*.conf` are written to the files of the root that
match (systemd-tmpfiles at boot); `/proc/1/mountinfo` lists `/` and every bind mount of an enabled
`.mount` unit or a `bind` line of `/etc/fstab` (systemd mounting them at boot).
"""

from __future__ import annotations

import glob
import io
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nodewright.packaging import layout, localrun
from nodewright.sim import hostshims

REPO = Path(__file__).resolve().parents[1]
PACKAGES = REPO / "packages"
SYSCTL_DIRS = ("etc/sysctl.d", "run/sysctl.d", "usr/local/lib/sysctl.d", "usr/lib/sysctl.d", "lib/sysctl.d")


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

    def boot(self, *, kernel: str = "6.8.0-nodewright") -> None:
        self._load_sysctl()
        self.write(
            "/proc/cmdline", f"BOOT_IMAGE=/boot/vmlinuz-{kernel} root=/dev/sda1 ro {self.grub_cmdline()}\n"
        )
        self._apply_tmpfiles()
        self._mount_table()

    def _load_sysctl(self) -> None:
        shutil.rmtree(self.path("/proc/sys"), ignore_errors=True)
        chosen: dict[str, Path] = {}
        for directory in SYSCTL_DIRS:
            for path in sorted(self.path(directory).glob("*.conf")):
                chosen.setdefault(path.name, path)
        files = [chosen[name] for name in sorted(chosen)]
        if self.path("/etc/sysctl.conf").is_file():
            files.append(self.path("/etc/sysctl.conf"))
        for path in files:
            for raw in path.read_text().splitlines():
                line = raw.strip()
                if not line or line[0] in "#;" or "=" not in line:
                    continue
                key, _, value = line.partition("=")
                self.write(
                    "/proc/sys/" + key.strip().lstrip("-").replace(".", "/"), "\t".join(value.split()) + "\n"
                )

    def grub_cmdline(self) -> str:
        files = [self.path("/etc/default/grub"), *sorted(self.path("/etc/default/grub.d").glob("*.cfg"))]
        present = [str(f) for f in files if f.is_file()]
        script = "".join(f'. "${i + 1}"\n' for i in range(len(present)))
        script += 'printf "%s %s" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"\n'
        result = subprocess.run(
            ["/bin/sh", "-ec", script, "grub", *present],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return " ".join(result.stdout.split())

    def _apply_tmpfiles(self) -> None:
        for config in sorted(self.path("/etc/tmpfiles.d").glob("*.conf")):
            for raw in config.read_text().splitlines():
                fields = raw.split(None, 6)
                if len(fields) == 7 and fields[0] == "w":
                    for target in glob.glob(str(self.root) + fields[1]):
                        Path(target).write_text(fields[6] + "\n")

    def _mount_table(self) -> None:
        points = ["/"]
        wants = self.path("/etc/systemd/system/local-fs.target.wants")
        for link in sorted(wants.glob("*.mount")) if wants.is_dir() else []:
            unit = self.path(str(link.readlink()))
            settings = dict(
                line.split("=", 1) for line in unit.read_text().splitlines() if "=" in line and line[0] != "#"
            )
            if "bind" in settings.get("Options", "").split(","):
                points.append(settings["Where"])
        if self.path("/etc/fstab").is_file():
            for raw in self.path("/etc/fstab").read_text().splitlines():
                fields = raw.split()
                if len(fields) >= 4 and not fields[0].startswith("#") and "bind" in fields[3].split(","):
                    points.append(fields[1])
        lines = [
            f"{20 + n} 1 8:1 {'/' if p == '/' else '/data'} {p} rw,relatime shared:1 - ext4 /dev/sda1 rw"
            for n, p in enumerate(points)
        ]
        self.write("/proc/1/mountinfo", "\n".join(lines) + "\n")


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
