"""What a boot does to a directory standing for a node's root: the one simulated boot.

A post-interrupt check reads values back from the running node (`/proc/sys`, `/proc/cmdline`,
`/proc/1/mountinfo`, `uname -r`), and only what a package made persistent survives a reboot. So the
boot rebuilds the running state from the persistent files, as a Linux node's boot does:

- `/proc/sys/kernel/random/boot_id` gets the new boot id;
- `/proc/sys` is emptied and the sysctl files are loaded in `sysctl --system` order
  (`nodewright.hostroot.hostshims.system_files`; several fields tab-separated, as procfs prints them);
- the booted kernel is the boot loader's default, if that kernel is installed (`/boot/vmlinuz-<release>`
  in the root, or the image's): a `GRUB_DEFAULT` (from `/etc/default/grub` and `grub.d/*.cfg`) naming a
  menu entry `... with Linux <release>`; otherwise, unless `GRUB_DEFAULT` is another value than `saved`,
  the `saved_entry` of `/boot/grub2/grubenv` or `/boot/grub/grubenv` (what `grubby --set-default`
  writes); else the image's kernel (`BootFacts.image_kernel`, installed on the first boot as
  `/boot/vmlinuz-<release>` and `/lib/modules/<release>/`). A real GRUB whose `GRUB_DEFAULT` is an index
  boots that entry, usually the newest kernel; the simulation boots the image's. The release goes to
  `/proc/sys/kernel/osrelease` (what `uname -r` prints);
- `/proc/cmdline` is `BOOT_IMAGE=/boot/vmlinuz-<release> root=/dev/sda1 ro` and `GRUB_CMDLINE_LINUX`
  and `GRUB_CMDLINE_LINUX_DEFAULT` of `/etc/default/grub` and `/etc/default/grub.d/*.cfg`, sourced by
  `/bin/sh` as update-grub does (no `BOOT_IMAGE=` when no kernel is known);
- `/proc/modules` lists the modules of `/etc/modules` and `/etc/modules-load.d/*.conf`;
- `w` lines of `/etc/tmpfiles.d/*.conf` are written to the files of the root their path matches
  (systemd-tmpfiles at boot);
- `/proc/1/mountinfo` lists `/` and every bind mount of an enabled `.mount` unit
  (`/etc/systemd/system/local-fs.target.wants/`) or a `bind` line of `/etc/fstab` (systemd mounting them);
- `/etc/hostname` and `/etc/os-release` are written if missing and the caller knows them.

Callers: `nodewright package run interrupt --interrupt reboot` (`nodewright.packaging.localrun`), the
simulated kubelet for a node first seen or given a new bootID (`nodewright.sim.kubelet_host.boot_node`),
and the reference package tests (`tests/packages_node.py`).
"""

from __future__ import annotations

import glob
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from nodewright.hostroot import hostshims

BOOT_ID_PATH: Final = "proc/sys/kernel/random/boot_id"
CMDLINE_PATH: Final = "proc/cmdline"
MOUNTINFO_PATH: Final = "proc/1/mountinfo"
_BOOT_SCRIPT_TIMEOUT_S: Final = 10.0
_MOUNT_WANTS: Final = "etc/systemd/system/local-fs.target.wants"


@dataclass(frozen=True)
class BootFacts:
    """What the machine itself brings to a boot (not in the root's files)."""

    boot_id: str
    hostname: str | None = None  # /etc/hostname, written if missing
    os_image: str | None = None  # e.g. "Ubuntu 22.04.4 LTS": /etc/os-release, written if missing
    image_kernel: str | None = None  # the node image's kernel, installed on the first boot


def boot(root: Path, facts: BootFacts) -> str:
    """Bring `root` to the state right after a boot; returns the release of the kernel it booted ("" if
    the root names none)."""
    for sub in ("etc", "var/log", "tmp", "run", "proc"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    _write_if_missing(root / "etc" / "hostname", facts.hostname and facts.hostname + "\n")
    _write_if_missing(root / "etc" / "os-release", facts.os_image and os_release(facts.os_image))
    shutil.rmtree(root / "proc" / "sys", ignore_errors=True)
    hostshims.load_files(hostshims.Node(root, root), hostshims.system_files(root), quiet=True, out=_quiet)
    _write(root / BOOT_ID_PATH, facts.boot_id + "\n")
    if not (root / hostshims.IMAGE_KERNEL_FILE).exists() and facts.image_kernel:
        install_image_kernel(root, facts.image_kernel)
    kernel = booted_kernel(root)
    if kernel:
        _write(root / hostshims.OSRELEASE_FILE, kernel + "\n")
    image = f"BOOT_IMAGE=/boot/vmlinuz-{kernel} " if kernel else ""
    _write(root / CMDLINE_PATH, f"{image}root=/dev/sda1 ro {grub_cmdline(root)}".strip() + "\n")
    _write(
        root / "proc" / "modules",
        "".join(f"{m} 16384 0 - Live 0x0000000000000000\n" for m in boot_modules(root)),
    )
    apply_tmpfiles(root)
    _write(root / MOUNTINFO_PATH, mount_table(root))
    return kernel


def recorded_boot_id(root: Path) -> str | None:
    """The boot id of the root's last boot, None if it never booted."""
    try:
        return (root / BOOT_ID_PATH).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _quiet(_text: str) -> None:
    pass


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _write_if_missing(path: Path, text: str | None) -> None:
    if text and not path.exists():
        _write(path, text)


def os_release(os_image: str) -> str:
    """A minimal /etc/os-release for an image name such as "Ubuntu 22.04.4 LTS"."""
    words = os_image.split()
    distro = words[0].lower() if words else "linux"
    version = words[1] if len(words) > 1 else ""
    short = ".".join(version.split(".")[:2])
    return (
        f'PRETTY_NAME="{os_image}"\nNAME="{words[0] if words else "Linux"}"\n'
        f'VERSION_ID="{short}"\nVERSION="{version}"\nID={distro}\n'
    )


# ----------------------------------------------------------------------------------------------------
# The boot loader and the kernel


def grub_cmdline(root: Path) -> str:
    """GRUB_CMDLINE_LINUX and _DEFAULT after sourcing the node's /etc/default/grub(.d) with /bin/sh."""
    return " ".join(
        _grub_sourced(root, 'printf "%s %s" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"').split()
    )


def grub_default(root: Path) -> str:
    """GRUB_DEFAULT after sourcing the node's /etc/default/grub(.d) with /bin/sh ("" if unset)."""
    return _grub_sourced(root, 'printf "%s" "$GRUB_DEFAULT"').strip()


def _grub_sourced(root: Path, printer: str) -> str:
    """What `printer` prints after /bin/sh sourced /etc/default/grub and grub.d/*.cfg, as update-grub does."""
    files = [root / "etc" / "default" / "grub"]
    grub_d = root / "etc" / "default" / "grub.d"
    if grub_d.is_dir():
        files += sorted(grub_d.glob("*.cfg"))
    present = [str(f) for f in files if f.is_file()]
    if not present:
        return ""
    script = "".join(f'. "${i + 1}"\n' for i in range(len(present)))
    script += printer + "\n"
    try:
        result = subprocess.run(
            ["/bin/sh", "-c", script, "grub", *present],
            capture_output=True,
            text=True,
            timeout=_BOOT_SCRIPT_TIMEOUT_S,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout if result.returncode == 0 else ""


def booted_kernel(root: Path) -> str:
    """The release the boot loader starts (see the module docstring), "" when the node names none."""
    installed = hostshims.installed_kernels(root)
    default = grub_default(root)
    chosen = hostshims.kernel_of_entry(default, installed) if default else None
    if chosen is None and default in ("", "saved"):
        chosen = hostshims.grubenv_kernel(root)
    return chosen or hostshims.image_kernel(root)


def install_image_kernel(root: Path, release: str) -> None:
    """The image's own kernel, as a node's disk has it: /boot/vmlinuz-<release>, /lib/modules/<release>/."""
    _write(root / hostshims.IMAGE_KERNEL_FILE, release + "\n")
    vmlinuz = root / "boot" / f"vmlinuz-{release}"
    if not vmlinuz.exists():
        _write(vmlinuz, f"simulated kernel image {release} (the node image's)\n")
    (root / "lib" / "modules" / release).mkdir(parents=True, exist_ok=True)


def boot_modules(root: Path) -> list[str]:
    """The modules /etc/modules and /etc/modules-load.d/*.conf load at boot, in order, once each."""
    files = [root / "etc" / "modules"]
    load_d = root / "etc" / "modules-load.d"
    if load_d.is_dir():
        files += sorted(load_d.glob("*.conf"))
    modules: list[str] = []
    for path in files:
        if not path.is_file():
            continue
        for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = raw.split("#", 1)[0].strip()
            if line and not line.startswith(";"):
                name = line.split()[0].replace("-", "_")
                if name not in modules:
                    modules.append(name)
    return modules


# ----------------------------------------------------------------------------------------------------
# systemd at boot: tmpfiles and mounts


def apply_tmpfiles(root: Path) -> None:
    """`w PATH - - - - CONTENT` lines of /etc/tmpfiles.d/*.conf: CONTENT written to each existing file of
    the root PATH matches (a glob), as systemd-tmpfiles does at boot. Other line types are not simulated."""
    tmpfiles = root / "etc" / "tmpfiles.d"
    for config in sorted(tmpfiles.glob("*.conf")) if tmpfiles.is_dir() else []:
        for raw in config.read_text(encoding="utf-8", errors="replace").splitlines():
            fields = raw.split(None, 6)
            if len(fields) != 7 or fields[0] != "w" or not fields[1].startswith("/"):
                continue
            for target in glob.glob(glob.escape(str(root)) + fields[1]):
                path = Path(target)
                if path.is_file() and not path.is_symlink():
                    path.write_text(fields[6] + "\n", encoding="utf-8")


def mount_table(root: Path) -> str:
    """/proc/1/mountinfo after systemd mounted the root's bind mounts (enabled .mount units, fstab)."""
    points = ["/", *_unit_bind_mounts(root), *_fstab_bind_mounts(root)]
    lines = [
        f"{20 + n} 1 8:1 {'/' if point == '/' else '/data'} {point} rw,relatime shared:1 - ext4 /dev/sda1 rw"
        for n, point in enumerate(points)
    ]
    return "\n".join(lines) + "\n"


def _unit_bind_mounts(root: Path) -> list[str]:
    wants = root / _MOUNT_WANTS
    points = []
    for link in sorted(wants.glob("*.mount")) if wants.is_dir() else []:
        target = link.readlink() if link.is_symlink() else link
        unit = root / str(target).lstrip("/") if target.is_absolute() else wants / target
        try:
            text = unit.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        settings = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and line[0] != "#")
        if "bind" in settings.get("Options", "").split(",") and settings.get("Where"):
            points.append(settings["Where"].strip())
    return points


def _fstab_bind_mounts(root: Path) -> list[str]:
    fstab = root / "etc" / "fstab"
    if not fstab.is_file():
        return []
    points = []
    for raw in fstab.read_text(encoding="utf-8", errors="replace").splitlines():
        fields = raw.split()
        if len(fields) >= 4 and not fields[0].startswith("#") and "bind" in fields[3].split(","):
            points.append(fields[1])
    return points
