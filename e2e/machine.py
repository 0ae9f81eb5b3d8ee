"""A snapshot of what a real-node run must leave exactly as it found it on this machine.

Real nodes (docs/simulator.md, "Real nodes") run a kubelet, containerd and privileged pods as root. Their
boxes are built so that nothing reaches the machine: `take()` reads what would show it if something did,
and `differences()` names every change between two snapshots:

- `sysctl`: every value under /proc/sys of the machine (its network namespace included), except the
  counters that move by themselves (`VOLATILE_SYSCTLS`);
- `mounts`: the machine's mount table (/proc/self/mountinfo of this process, mount IDs dropped);
- `links`, `addresses`, `routes`: `ip` for the machine's network namespace;
- `firewall`: the nftables ruleset (Debian's nft, unpacked by hack/debian/fetch.sh, never installed) and
  the legacy iptables tables the kernel has loaded;
- `cgroups`: the top-level directories of every cgroup hierarchy;
- `etc`, `run`, `var-lib-kubelet`: every entry of /etc, /run and /var/lib/kubelet with its type, mode and
  (files) content digest or (links) target;
- `namespaces`: the mount, PID and network namespaces of every process; a run may end none that existed
  before it (their processes are not ours to stop), and may leave none behind (`differences` reports
  only namespaces that appeared, since unrelated processes may end theirs meanwhile).

Reading is all it does: no file is written outside the test's own directory.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

REPO = Path(__file__).resolve().parent.parent
VOLATILE_SYSCTLS: Final = frozenset(
    {
        "fs.dentry-state",
        "fs.file-nr",
        "fs.inode-nr",
        "fs.inode-state",
        "kernel.ns_last_pid",
        "kernel.random.uuid",
        "kernel.random.entropy_avail",
        "fs.quota.syncs",
        "fs.quota.lookups",
        "fs.quota.reads",
        "fs.quota.writes",
        "fs.quota.drops",
        "fs.quota.allocated_dquots",
        "fs.quota.free_dquots",
        "fs.quota.cache_hits",
        "net.netfilter.nf_conntrack_count",
    }
)
_FILE_DIGEST_LIMIT: Final = 1 << 20
_ONLY_ADDITIONS: Final = frozenset({"namespaces"})


@dataclass(frozen=True)
class Snapshot:
    parts: dict[str, frozenset[str]]


def take() -> Snapshot:
    return Snapshot(
        {
            "sysctl": frozenset(_sysctls()),
            "mounts": frozenset(_mounts()),
            "links": frozenset(_ip("-o", "link", "show")),
            "addresses": frozenset(_ip("-o", "addr", "show")),
            "routes": frozenset(
                _ip("route", "show", "table", "all") + _ip("-6", "route", "show", "table", "all")
            ),
            "firewall": frozenset(_firewall()),
            "cgroups": frozenset(_cgroups()),
            "etc": frozenset(_tree(Path("/etc"))),
            "run": frozenset(_tree(Path("/run"))),
            "var-lib-kubelet": frozenset(_tree(Path("/var/lib/kubelet"))),
            "namespaces": frozenset(_namespaces()),
        }
    )


def differences(before: Snapshot, after: Snapshot) -> list[str]:
    """One line per entry that appeared (+) or disappeared (-), by part."""
    lines = []
    for part in sorted(before.parts.keys() | after.parts.keys()):
        old, new = before.parts.get(part, frozenset()), after.parts.get(part, frozenset())
        if part not in _ONLY_ADDITIONS:
            lines += [f"{part}: - {entry}" for entry in sorted(old - new)]
        lines += [f"{part}: + {entry}" for entry in sorted(new - old)]
    return lines


def _sysctls() -> Iterator[str]:
    root = Path("/proc/sys")
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            key = ".".join(path.relative_to(root).parts)
            if key in VOLATILE_SYSCTLS:
                continue
            try:
                value = path.read_text(errors="replace").strip()
            except OSError:
                continue  # write-only or refusing reads: nothing to compare
            yield f"{key} = {' '.join(value.split())}"


def _mounts() -> Iterator[str]:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        yield " ".join(fields[2:])  # without the mount ID and parent ID, which a remount renumbers


def _ip(*args: str) -> list[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=True)
    return [" ".join(line.split()) for line in done.stdout.splitlines() if line.strip()]


def _firewall() -> Iterator[str]:
    for table in ("ip_tables_names", "ip6_tables_names", "arp_tables_names"):
        path = Path("/proc/net") / table
        if path.exists():
            yield from (f"{table}: {name}" for name in path.read_text().split())
    root = _nft_root()
    env = {**os.environ, "LD_LIBRARY_PATH": f"{root}/usr/lib/x86_64-linux-gnu:{root}/lib/x86_64-linux-gnu"}
    done = subprocess.run(
        [str(root / "usr" / "sbin" / "nft"), "list", "ruleset"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=True,
    )
    yield from (f"nft: {line.strip()}" for line in done.stdout.splitlines() if line.strip())


def _nft_root() -> Path:
    done = subprocess.run(
        ["bash", str(REPO / "hack" / "debian" / "fetch.sh"), "nft", "nftables", "libnftables1", "libnftnl11",
         "libmnl0", "libjansson4", "libxtables12"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    return Path(done.stdout.strip().splitlines()[-1])


def _cgroups() -> Iterator[str]:
    top = Path("/sys/fs/cgroup")
    for hierarchy in sorted(top.iterdir()):
        if hierarchy.is_dir() and not hierarchy.is_symlink():
            yield from (f"{hierarchy.name}/{child.name}" for child in hierarchy.iterdir() if child.is_dir())


def _tree(root: Path) -> Iterator[str]:
    if not root.exists():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            try:
                info = path.lstat()
            except OSError:
                continue
            yield f"{path} {_describe(path, info)}"


def _describe(path: Path, info: os.stat_result) -> str:
    mode = stat.filemode(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        return f"{mode} -> {os.readlink(path)}"
    if stat.S_ISREG(info.st_mode) and info.st_size <= _FILE_DIGEST_LIMIT:
        try:
            return f"{mode} {hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
        except OSError:
            return f"{mode} unreadable"
    return f"{mode} {info.st_size if stat.S_ISREG(info.st_mode) else ''}".rstrip()


def _namespaces() -> Iterator[str]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        for kind in ("mnt", "pid", "net"):
            try:
                target = os.readlink(entry / "ns" / kind)
            except OSError:
                continue
            yield target
