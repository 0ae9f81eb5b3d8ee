"""Writing into the node's root filesystem from outside it, as if from inside.

The agent runs in a container with the host's `/` mounted at `<root_mount>`; it writes the package's
`root_dir/` overlay, resolv.conf, flags, history and logs there itself, outside any chroot. A host path
such as `/lib/modules-load.d` is often reached through symlinks (`/lib -> usr/lib` on merged-/usr
systems, `/etc/resolv.conf -> /run/systemd/resolve/stub-resolv.conf`). Followed naively from the
container, an absolute symlink target points into the *container's* filesystem, so the write would land
in the wrong place. `in_root` resolves a host path the way the kernel would inside a chroot: absolute
targets restart at the root mount, `..` never climbs above it.

`overlay` lays `root_dir/` over the host root: directories are created (existing ones keep their mode
and owner), regular files are copied with their mode, and symlinks in the package are recreated as
symlinks (a package may ship `multi-user.target.wants/x.service -> /etc/systemd/system/x.service`,
which is dangling in the container but right on the host).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from typing import Final

from nodewright.agent import safefile

MAX_SYMLINKS: Final = 40  # the kernel's limit for one path lookup
MAX_ENVIRONMENT_BYTES: Final = 1024 * 1024


def host_path(root: str, path: str) -> str:
    """`path` (absolute, as seen on the host) under `root`, without resolving symlinks."""
    return root.rstrip("/") + "/" + path.lstrip("/")


def in_root(root: str, path: str, *, follow_last: bool = True) -> str:
    """The real location of host path `path` under `root`, resolving symlinks as a chroot would.

    Components that do not exist yet are kept as they are, so the result can be created.
    """
    base = root.rstrip("/")
    pending = [part for part in path.split("/") if part not in ("", ".")]
    pending.reverse()
    resolved: list[str] = []
    links = 0
    while pending:
        part = pending.pop()
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = base + "/" + "/".join([*resolved, part])
        if (pending or follow_last) and os.path.islink(candidate):
            links += 1
            if links > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, "too many levels of symbolic links", host_path(root, path))
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            pending.extend(reversed([p for p in target.split("/") if p not in ("", ".")]))
            continue
        resolved.append(part)
    return base + "/" + "/".join(resolved)


def makedirs_in_root(root: str, path: str) -> str:
    """Create host directory `path` (and its parents) under `root`; returns its real location."""
    real = in_root(root, path)
    os.makedirs(real, exist_ok=True)
    return real


def write_atomic(path: str, text: str) -> None:
    """Replace `path` with `text` so that a reader never sees half a file (a crash keeps the old one)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def overlay(source: str, root: str) -> list[str]:
    """Copy the tree `source` over the host root `root`; returns the files and symlinks written, sorted.

    Walked with an explicit stack (os.walk recurses before Python 3.12), so however deep the package's
    tree is, it is copied, not a RecursionError.
    """
    written: list[str] = []
    pending = ["/"]
    while pending:
        host_dir = pending.pop()
        directory = source if host_dir == "/" else source + host_dir
        real_dir = makedirs_in_root(root, host_dir)
        for name in sorted(os.listdir(directory)):
            item = os.path.join(directory, name)
            target = host_dir.rstrip("/") + "/" + name
            mode = os.lstat(item).st_mode
            if stat.S_ISLNK(mode):
                _replace_with_symlink(os.readlink(item), os.path.join(real_dir, name), target)
                written.append(target)
            elif stat.S_ISREG(mode):
                real = in_root(root, target)
                os.makedirs(os.path.dirname(real), exist_ok=True)
                shutil.copy2(item, real)
                written.append(target)
            elif stat.S_ISDIR(mode):
                pending.append(target)
            else:
                raise OSError(errno.EINVAL, f"root_dir may hold files, directories and symlinks only: {item}")
    return sorted(written)


def copy_file_into_root(source: str, root: str, target: str) -> bool:
    """Copy the container's file `source` to host path `target`; False when `source` does not exist."""
    if not os.path.isfile(source):
        return False
    real = in_root(root, target)
    os.makedirs(os.path.dirname(real), exist_ok=True)
    if os.path.exists(real) and os.path.samefile(source, real):
        return True
    shutil.copyfile(source, real)
    return True


def read_environment_file(path: str) -> dict[str, str]:
    """`KEY=value` lines of an /etc/environment-style file (quotes stripped, comments and junk skipped).

    A missing or unreadable file gives no variables; one that is not a regular file or is larger than
    `MAX_ENVIRONMENT_BYTES` (a package's root_dir/ may have put anything there) raises
    `safefile.Refused` without blocking on it or reading it whole.
    """
    try:
        data = safefile.read_bytes(path, limit=MAX_ENVIRONMENT_BYTES)
    except OSError:  # safefile.Refused is not an OSError: it propagates
        return {}
    lines = data.decode("utf-8", errors="replace").splitlines()
    values: dict[str, str] = {}
    for raw in lines:
        line = raw.strip()
        if line.startswith("export "):
            line = line[len("export ") :].strip()
        name, sep, value = line.partition("=")
        if not sep or not name.replace("_", "a").isalnum() or name[0].isdigit() or line.startswith("#"):
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[name] = value
    return values


def _replace_with_symlink(link_target: str, real_path: str, host_target: str) -> None:
    if os.path.lexists(real_path):
        if os.path.isdir(real_path) and not os.path.islink(real_path):
            raise OSError(
                errno.EISDIR, f"root_dir has a symlink where the host has a directory: {host_target}"
            )
        os.unlink(real_path)
    os.symlink(link_target, real_path)
