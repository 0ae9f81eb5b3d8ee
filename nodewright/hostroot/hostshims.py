"""Stand-ins for the commands that would change this machine instead of the node a directory stands for.

Package steps and the agent's interrupts run as plain processes in the simulator (see
`nodewright.sim.kubelet`), so `reboot`, `sysctl -w`, `modprobe` or `systemctl restart` would act on the
machine running the simulator (as root in CI). The simulated kubelet puts a
directory of these stand-ins first on every container's PATH; each acts on the node's host-root
directory instead, which models the node's running kernel and services as files:

- `reboot`, `poweroff`, `halt`, `shutdown` (not `-c`) and `systemctl reboot|poweroff|halt|kexec` write
  the node's reboot request and block, as a machine going down does: the kubelet then stops the pod's
  processes and hands the pod to the simulator's rebooter (which changes the node's bootID).
- `sysctl` reads and writes `<root>/proc/sys/<key, dots as slashes>` (several fields tab-separated, as
  procfs holds them); `-p [FILE...]` and `--system`
  load sysctl files (`--system`: `/etc/sysctl.d`, `/run/sysctl.d`, `/usr/local/lib/sysctl.d`,
  `/usr/lib/sysctl.d`, `/lib/sysctl.d` by file name, the first directory winning, then
  `/etc/sysctl.conf`); reading an unknown key fails with exit code 255 unless `-e` is given.
- `systemctl` and `service` are recorded; `is-active`/`is-enabled` answer `active`/`enabled`;
  `service procps force-reload|reload|restart|start` loads the sysctl files (this is what the
  reference's `restartAllServices` interrupt runs).
- `modprobe`, `rmmod` and `lsmod` keep the list of loaded modules in `<root>/proc/modules`.
- `update-grub`, `grub-mkconfig` and `grub2-mkconfig` are recorded only: the simulated boot reads
  `/etc/default/grub` directly.
- **Test stand-ins for a package manager and a boot loader** (they model what node-init packages rely
  on, nothing more): `dnf`, `yum` and `apt-get` keep the installed package names in
  `<root>/var/lib/nodewright-sim/packages`; installing a kernel package (`kernel-<release>`,
  `kernel<N.M>-<release>`, `linux-image-<release>`) writes `/boot/vmlinuz-<release>` and
  `/lib/modules/<release>/`, and with `dnf`/`yum` also makes it the boot default (as Amazon Linux's
  kernel-install does); removing the running kernel is refused, as the real ones refuse it. `update`,
  `makecache` and `clean` do nothing; nothing is downloaded. `grubby --set-default /boot/vmlinuz-<release>`
  writes `saved_entry=<release>` to `<root>/boot/grub2/grubenv`, `grubby --default-kernel` prints the
  default (see `default_kernel`). `uname` answers from the node: `-r` is
  `<root>/proc/sys/kernel/osrelease`, which the simulated boot writes.

Every invocation is appended to `<root>/var/log/nodewright-sim/commands.log` (time, command, args).
The simulated kubelet and `nodewright package run` perform the interrupt commands our unprivileged agent
records (instead of running them) through the same functions (`perform`), so `service procps
force-reload` has the same effect either way; a recorded reboot boots the root (`nodewright.hostroot.boot`).
Paths given to `sysctl -p` are read inside the root (a path already under the root is taken as is).
The simulated boot resets `<root>/proc/sys` and loads the same sysctl files, so a value survives a
reboot only if a file configures it, as on a real node.

Standard library only: each stand-in is a tiny script that imports this module.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

REBOOT_REQUEST_FILE: Final = "reboot-requested"
COMMANDS_LOG: Final = "var/log/nodewright-sim/commands.log"
SYSCTL_DIRS: Final = (
    "etc/sysctl.d",
    "run/sysctl.d",
    "usr/local/lib/sysctl.d",
    "usr/lib/sysctl.d",
    "lib/sysctl.d",
)
REBOOT_COMMANDS: Final = ("reboot", "poweroff", "halt", "shutdown")
PROGRAMS: Final = (
    *REBOOT_COMMANDS,
    "systemctl",
    "service",
    "sysctl",
    "modprobe",
    "rmmod",
    "lsmod",
    "update-grub",
    "grub-mkconfig",
    "grub2-mkconfig",
    "dnf",
    "yum",
    "apt-get",
    "grubby",
    "uname",
)
SIM_STATE_DIR: Final = "var/lib/nodewright-sim"
IMAGE_KERNEL_FILE: Final = f"{SIM_STATE_DIR}/image-kernel"
PACKAGES_FILE: Final = f"{SIM_STATE_DIR}/packages"
OSRELEASE_FILE: Final = "proc/sys/kernel/osrelease"
GRUBENV_FILES: Final = ("boot/grub2/grubenv", "boot/grub/grubenv")
_RPM_KERNEL: Final = re.compile(r"^kernel(?:\d+\.\d+)?(?:-core)?-(\d[\w.+~-]*)$")
_DEB_KERNEL: Final = re.compile(r"^linux-image-(?:unsigned-)?(\d[\w.+~-]*)$")
_APT_OPTIONS_WITH_VALUE: Final = ("-o", "-c", "-t", "--option", "--config-file", "--target-release")


class Node:
    """The simulated node a stand-in acts on: its host root and the kubelet's state directory for it."""

    def __init__(self, root: Path, state: Path) -> None:
        self.root = root
        self.state = state

    def inside(self, path: str) -> Path:
        """A host path (absolute, as on the node) inside the root; a path already under it is kept."""
        candidate = Path(path)
        try:
            candidate.relative_to(self.root)
            return candidate
        except ValueError:
            return self.root / path.lstrip("/")

    def record(self, program: str, args: Sequence[str]) -> None:
        log = self.root / COMMANDS_LOG
        log.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with log.open("a", encoding="utf-8") as fh:
            fh.write(f"{stamp} {program} {' '.join(args)}\n")


# ----------------------------------------------------------------------------------------------------
# reboot


def request_reboot(node: Node, program: str, args: Sequence[str]) -> int:
    node.state.mkdir(parents=True, exist_ok=True)
    request = node.state / REBOOT_REQUEST_FILE
    tmp = request.with_suffix(".tmp")
    tmp.write_text(f"{program} {' '.join(args)}\n", encoding="utf-8")
    tmp.replace(request)
    print(f"simulated node: {program} requested a reboot; the node goes down now", flush=True)
    # A machine going down does not return to the caller: wait to be stopped.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        time.sleep(3600)


def is_reboot(program: str, args: Sequence[str]) -> bool:
    """Whether the command takes the machine down (a cancelled shutdown does not)."""
    if program == "shutdown":
        return "-c" not in args and "--cancel" not in args
    if program == "systemctl":
        verbs = [a for a in args if not a.startswith("-")]
        return bool(verbs) and verbs[0] in ("reboot", "poweroff", "halt", "kexec")
    return program in REBOOT_COMMANDS


# ----------------------------------------------------------------------------------------------------
# sysctl


def _key_path(node: Node, key: str) -> Path:
    parts = key.replace(".", "/") if "/" not in key else key
    return node.root / "proc" / "sys" / parts.strip("/")


def _key_name(node: Node, path: Path) -> str:
    return str(path.relative_to(node.root / "proc" / "sys")).replace("/", ".")


def write_key(node: Node, key: str, value: str) -> None:
    """A running value as procfs holds it: several fields tab-separated (`4096\t131072\t6291456`)."""
    path = _key_path(node, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\t".join(value.split()) + "\n", encoding="utf-8")


def read_key(node: Node, key: str) -> str | None:
    try:
        return _key_path(node, key).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def parse_sysctl_file(text: str) -> list[tuple[str, str, bool]]:
    """(key, value, ignore_errors) per assignment line; comments start with # or ;."""
    entries = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.strip()
        ignore = key.startswith("-")
        entries.append((key.lstrip("-").strip(), value.strip(), ignore))
    return entries


def system_files(root: Path) -> list[Path]:
    """The files `sysctl --system` loads, in order."""
    chosen: dict[str, Path] = {}
    for directory in SYSCTL_DIRS:
        base = root / directory
        if not base.is_dir():
            continue
        for path in base.glob("*.conf"):
            chosen.setdefault(path.name, path)
    files = [chosen[name] for name in sorted(chosen)]
    legacy = root / "etc" / "sysctl.conf"
    if legacy.is_file():
        files.append(legacy)
    return files


def load_files(node: Node, files: Sequence[Path], *, quiet: bool, out: Callable[[str], None]) -> None:
    for path in files:
        if not quiet:
            out(f"* Applying {path} ...")
        for key, value, _ignore in parse_sysctl_file(path.read_text(encoding="utf-8", errors="replace")):
            write_key(node, key, value)
            if not quiet:
                out(f"{key} = {value}")


def sysctl(node: Node, args: Sequence[str], out: Callable[[str], None], err: Callable[[str], None]) -> int:
    values_only = quiet = ignore_unknown = names_only = False
    load_mode = system = list_all = False
    load: list[str] = []
    keys: list[str] = []
    for arg in args:
        if arg in ("-n", "--values"):
            values_only = True
        elif arg in ("-N", "--names"):
            names_only = True
        elif arg in ("-q", "--quiet"):
            quiet = True
        elif arg in ("-e", "--ignore"):
            ignore_unknown = True
        elif arg in ("-a", "-A", "-X", "--all"):
            list_all = True
        elif arg == "--system":
            system = True
        elif arg in ("-p", "--load"):
            load_mode = True
        elif arg.startswith("-p") or arg.startswith("--load="):
            load_mode = True
            load.append(arg[2:] if arg.startswith("-p") else arg.split("=", 1)[1])
        elif arg.startswith("-"):
            continue  # -w and formatting flags change nothing here
        elif load_mode and "=" not in arg:
            load.append(arg)  # `-p FILE...`
        else:
            keys.append(arg)
    if load_mode and not load:
        load.append("/etc/sysctl.conf")
    if system:
        load_files(node, system_files(node.root), quiet=quiet, out=out)
    for name in load:
        path = node.inside(name)
        if not path.is_file():
            err(f'sysctl: cannot open "{name}": No such file or directory')
            return 255
        load_files(node, [path], quiet=quiet, out=out)
    if list_all:
        base = node.root / "proc" / "sys"
        for path in sorted(p for p in base.rglob("*") if p.is_file()):
            out(
                _format(
                    _key_name(node, path), path.read_text(encoding="utf-8").strip(), values_only, names_only
                )
            )
    code = 0
    for key in keys:
        if "=" in key:
            name, _, value = key.partition("=")
            write_key(node, name.strip(), value)
            if not quiet:
                out(_format(name.strip(), value.strip(), values_only, names_only))
            continue
        value_read = read_key(node, key)
        if value_read is None:
            if not ignore_unknown:
                err(f"sysctl: cannot stat /proc/sys/{key.replace('.', '/')}: No such file or directory")
                code = 255
            continue
        out(_format(key, value_read, values_only, names_only))
    return code


def _format(key: str, value: str, values_only: bool, names_only: bool) -> str:
    if values_only:
        return value
    if names_only:
        return key
    return f"{key} = {value}"


# ----------------------------------------------------------------------------------------------------
# services, modules, grub


def systemctl(node: Node, args: Sequence[str], out: Callable[[str], None]) -> int:
    verbs = [a for a in args if not a.startswith("-")]
    verb = verbs[0] if verbs else ""
    if verb == "is-active":
        out("active")
    elif verb == "is-enabled":
        out("enabled")
    elif verb == "status":
        for unit in verbs[1:]:
            out(f"* {unit} - simulated unit\n   Active: active (running)")
    return 0


def service(node: Node, args: Sequence[str], out: Callable[[str], None]) -> int:
    if len(args) >= 2 and args[0] == "procps" and args[1] in ("force-reload", "reload", "restart", "start"):
        load_files(node, system_files(node.root), quiet=True, out=out)
    return 0


def _modules_file(node: Node) -> Path:
    return node.root / "proc" / "modules"


def loaded_modules(node: Node) -> list[str]:
    try:
        text = _modules_file(node).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [line.split()[0] for line in text.splitlines() if line.strip()]


def _write_modules(node: Node, modules: Sequence[str]) -> None:
    path = _modules_file(node)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{m} 16384 0 - Live 0x0000000000000000\n" for m in modules), encoding="utf-8")


def modprobe(node: Node, args: Sequence[str], *, remove: bool) -> int:
    names = [a for a in args if not a.startswith("-")]
    remove = remove or "-r" in args or "--remove" in args
    if not remove:
        names = names[:1]  # modprobe MODULE [parameters...]
    modules = loaded_modules(node)
    for name in names:
        canonical = name.replace("-", "_")
        if remove:
            modules = [m for m in modules if m != canonical]
        elif canonical not in modules:
            modules.append(canonical)
    _write_modules(node, modules)
    return 0


# ----------------------------------------------------------------------------------------------------
# kernels, the package manager, the boot loader and uname (test stand-ins)


def image_kernel(root: Path) -> str:
    """The kernel the node's image boots (recorded by the first simulated boot), or ""."""
    try:
        return (root / IMAGE_KERNEL_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def running_kernel(root: Path) -> str:
    try:
        return (root / OSRELEASE_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return image_kernel(root)


def installed_kernels(root: Path) -> set[str]:
    """Releases with an image in /boot, and the image's own kernel."""
    boot = root / "boot"
    found = {p.name[len("vmlinuz-") :] for p in boot.glob("vmlinuz-*")} if boot.is_dir() else set()
    image = image_kernel(root)
    return found | ({image} if image else set())


def kernel_of_entry(entry: str, installed: set[str]) -> str | None:
    """The installed release a boot entry names: itself, `<machine-id>-<release>` (BLS), or a GRUB menu
    path ending in `with Linux <release>`."""
    entry = entry.strip().strip("\"'")
    for release in sorted(installed, key=len, reverse=True):
        if entry in (release, f"/boot/vmlinuz-{release}") or entry.endswith(f"-{release}"):
            return release
        if entry.endswith(f"with Linux {release}"):
            return release
    return None


def grubenv_kernel(root: Path) -> str | None:
    """The installed release `saved_entry` of the node's grubenv names (grubby, grub-set-default)."""
    installed = installed_kernels(root)
    for name in GRUBENV_FILES:
        try:
            text = (root / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("saved_entry="):
                return kernel_of_entry(line.partition("=")[2], installed)
    return None


def default_kernel(root: Path) -> str:
    """What `grubby --default-kernel` names: grubenv's saved entry, else the image's kernel."""
    return grubenv_kernel(root) or image_kernel(root)


def set_default_kernel(root: Path, release: str) -> None:
    env = root / GRUBENV_FILES[0]
    env.parent.mkdir(parents=True, exist_ok=True)
    env.write_text(f"# GRUB Environment Block (simulated)\nsaved_entry={release}\n", encoding="utf-8")


def kernel_release(package: str) -> str | None:
    """The kernel release a package holds (`kernel-6.1.1-1.amzn2023.x86_64`, `linux-image-6.8.0-1-aws`)."""
    match = _RPM_KERNEL.match(package) or _DEB_KERNEL.match(package)
    return match.group(1) if match else None


def installed_packages(node: Node) -> list[str]:
    try:
        text = (node.root / PACKAGES_FILE).read_text(encoding="utf-8")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip()]


def _write_packages(node: Node, names: Sequence[str]) -> None:
    path = node.root / PACKAGES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{n}\n" for n in names), encoding="utf-8")


def package_manager(
    node: Node, program: str, args: Sequence[str], out: Callable[[str], None], err: Callable[[str], None]
) -> int:
    """`dnf`/`yum`/`apt-get` install, remove and a few no-op verbs, acting on the node's root."""
    words: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif program == "apt-get" and arg in _APT_OPTIONS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            words.append(arg)
    verb, names = (words[0], words[1:]) if words else ("", [])
    if verb in ("update", "makecache", "clean", "check-update"):
        out(f"{program} (simulated): nothing to fetch")
        return 0
    if verb == "install":
        return _install(node, program, names, out)
    if verb in ("remove", "erase", "purge"):
        return _remove(node, program, names, out, err)
    err(f"{program} (simulated node): '{verb}' is not simulated (install, remove, update are)")
    return 1


def _install(node: Node, program: str, names: Sequence[str], out: Callable[[str], None]) -> int:
    installed = installed_packages(node)
    for name in names:
        if name not in installed:
            installed.append(name)
        release = kernel_release(name)
        if release is not None:
            image = node.root / "boot" / f"vmlinuz-{release}"
            image.parent.mkdir(parents=True, exist_ok=True)
            image.write_text(f"simulated kernel image {release}\n", encoding="utf-8")
            (node.root / "lib" / "modules" / release).mkdir(parents=True, exist_ok=True)
            if program != "apt-get":  # Amazon Linux's kernel-install makes a new kernel the default
                set_default_kernel(node.root, release)
        out(f"Installed: {name}")
    _write_packages(node, installed)
    return 0


def _remove(
    node: Node, program: str, names: Sequence[str], out: Callable[[str], None], err: Callable[[str], None]
) -> int:
    running = running_kernel(node.root)
    protected = [n for n in names if kernel_release(n) == running]
    if protected:
        err(f"{program}: the operation would remove the running kernel ({' '.join(protected)}): refused")
        return 1
    installed = [n for n in installed_packages(node) if n not in names]
    for name in names:
        release = kernel_release(name)
        if release is not None:
            (node.root / "boot" / f"vmlinuz-{release}").unlink(missing_ok=True)
            shutil.rmtree(node.root / "lib" / "modules" / release, ignore_errors=True)
        out(f"Removed: {name}")
    _write_packages(node, installed)
    return 0


def grubby(node: Node, args: Sequence[str], out: Callable[[str], None], err: Callable[[str], None]) -> int:
    """`grubby --default-kernel`, `--set-default[=]/boot/vmlinuz-<release>`, `--default-index`."""
    if "--default-kernel" in args:
        out(f"/boot/vmlinuz-{default_kernel(node.root)}")
        return 0
    if "--default-index" in args:
        out("0")
        return 0
    for index, arg in enumerate(args):
        if arg == "--set-default" or arg.startswith("--set-default="):
            path = arg.partition("=")[2] or (args[index + 1] if index + 1 < len(args) else "")
            release = kernel_of_entry(path, installed_kernels(node.root))
            if release is None or not path.startswith("/boot/vmlinuz-"):
                err(f"The param {path} is incorrect")
                return 1
            set_default_kernel(node.root, release)
            out(f"The default is /boot/loader/entries/{release}.conf with kernel {path}")
            return 0
    err(f"grubby (simulated node): {' '.join(args) or 'no arguments'} is not simulated")
    return 1


def uname(node: Node, args: Sequence[str], out: Callable[[str], None]) -> int:
    fields = {
        "s": "Linux",
        "n": _hostname(node),
        "r": running_kernel(node.root) or "unknown",
        "v": "#1 SMP (simulated node)",
        "m": platform.machine(),
    }
    wanted: list[str] = []
    for arg in args:
        letters = "snrvm" if arg in ("-a", "--all") else arg.lstrip("-")
        wanted.extend(letter for letter in letters if letter in fields and letter not in wanted)
    out(" ".join(fields[letter] for letter in sorted(wanted or ["s"], key="snrvm".index)))
    return 0


def _hostname(node: Node) -> str:
    try:
        return (node.root / "etc" / "hostname").read_text(encoding="utf-8").strip() or "node"
    except OSError:
        return "node"


def recorded_commands(path: Path, offset: int = 0) -> list[list[str]]:
    """The commands an unprivileged agent appended to its requests file (`<root><state dir>/interrupts/
    requested.jsonl`, one JSON object with a `command` list per line) after `offset` bytes; lines that
    are not such an object are skipped."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return []
    commands = []
    for line in data.decode(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        command = entry.get("command") if isinstance(entry, dict) else None
        if isinstance(command, list) and command:
            commands.append([str(part) for part in command])
    return commands


def main(program: str, args: Sequence[str], *, root: str, state: str) -> int:
    """Entry point of a stand-in script (`program` is the command it replaces)."""
    node = Node(Path(root), Path(state))
    node.record(program, args)

    def out(text: str) -> None:
        print(text, flush=True)

    def err(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    if is_reboot(program, args):
        return request_reboot(node, program, args)
    return perform(node, program, args, out, err)


def perform(
    node: Node, program: str, args: Sequence[str], out: Callable[[str], None], err: Callable[[str], None]
) -> int:
    """What `program args` does to the node's root (a reboot excepted: the caller boots the root, see
    `nodewright.hostroot.boot`). A program without a stand-in does nothing here (it is only recorded)."""
    if program == "shutdown":
        out("simulated node: no shutdown scheduled")
        return 0
    if program == "sysctl":
        return sysctl(node, args, out, err)
    if program == "systemctl":
        return systemctl(node, args, out)
    if program == "service":
        return service(node, args, out)
    if program in ("modprobe", "rmmod"):
        return modprobe(node, args, remove=program == "rmmod")
    if program == "lsmod":
        out("Module                  Size  Used by")
        for module in loaded_modules(node):
            out(f"{module:<24}16384  0")
        return 0
    if program in ("dnf", "yum", "apt-get"):
        return package_manager(node, program, args, out, err)
    if program == "grubby":
        return grubby(node, args, out, err)
    if program == "uname":
        return uname(node, args, out)
    return 0  # update-grub and friends: recorded only


def script(program: str, *, python: str, source_root: str, root: Path, state: Path) -> str:
    """The text of the stand-in script for `program`."""
    return (
        f"#!{python}\n"
        "import sys\n"
        f"sys.path.insert(0, {source_root!r})\n"
        "from nodewright.hostroot.hostshims import main\n"
        f"sys.exit(main({program!r}, sys.argv[1:], root={str(root)!r}, state={str(state)!r}))\n"
    )


def install(directory: Path, *, python: str, source_root: str, root: Path, state: Path) -> None:
    """Write every stand-in into `directory` (executable)."""
    directory.mkdir(parents=True, exist_ok=True)
    for program in PROGRAMS:
        path = directory / program
        text = script(program, python=python, source_root=source_root, root=root, state=state)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text, encoding="utf-8")
            os.chmod(tmp, 0o755)
            tmp.replace(path)
