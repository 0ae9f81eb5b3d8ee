"""Reading files that a package or a user hands over: regular files only, bounded size and nesting.

A package's `config.json`, the host's `/etc/environment` (which a package's `root_dir/` may replace),
the agent's history files and the files `nodewright package` reads all come from someone else. Read
naively, a FIFO blocks the reader forever, a symlink to `/dev/zero` fills memory until the process is
killed, and a JSON document nested 100,000 levels deep raises `RecursionError` out of `json.loads`.
So:

- `read_bytes` stats the path first (following symlinks, as `open` would) and refuses anything that
  is not a regular file *before* opening it: opening a device can have effects of its own. The file is
  then opened non-blocking (a FIFO swapped in after the check cannot block) and checked again on the
  open descriptor; it is read up to `limit` bytes and refused if it holds more;
- `loads_json` refuses documents nested deeper than `max_depth` before decoding them;
- `inside` resolves a path below a directory the way the kernel would, following symlinks, and tells
  where it leaves the directory: a package's step script must stay inside the package on every machine
  (an absolute symlink means something else in the build directory, the container and on the node).

`Refused` carries the path and one sentence saying what is wrong and what the limit is.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Final

MAX_SYMLINKS: Final = 40  # the kernel's limit for one path lookup
DEFAULT_MAX_DEPTH: Final = 64
_CHUNK: Final = 64 * 1024
_JSON_TOKENS: Final = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


class Refused(Exception):
    """The file cannot be used as given; `reason` says why, naming the limit that was exceeded."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(path, reason)

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def size_text(count: int) -> str:
    """`4 MiB`, `512 KiB`, `300 bytes`: a limit as people write it."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size and count % size == 0:
            return f"{count // size} {unit}"
    return f"{count} bytes"


def read_bytes(path: str, *, limit: int) -> bytes:
    """The content of the regular file `path` (symlinks followed), at most `limit` bytes.

    Raises `Refused` for anything else and `OSError` (e.g. `FileNotFoundError`) when it cannot be read.
    """
    _check_regular(path, os.stat(path).st_mode)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        _check_regular(path, info.st_mode)
        if info.st_size > limit:
            raise Refused(path, _too_large(limit, f" ({info.st_size} bytes)"))
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # the file grew while it was read
                raise Refused(path, _too_large(limit, " (it grew while it was read)"))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str, *, limit: int) -> str:
    """`read_bytes` decoded as UTF-8; a file that is not UTF-8 is `Refused`."""
    data = read_bytes(path, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(path, f"not UTF-8 text (byte {exc.start} cannot be decoded)") from None


def json_too_deep(text: str, max_depth: int) -> bool:
    """Whether `text` opens more than `max_depth` arrays/objects inside each other (strings skipped)."""
    depth = 0
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token == "[" or token == "{":
            depth += 1
            if depth > max_depth:
                return True
        elif token == "]" or token == "}":
            depth -= 1
    return False


def loads_json(text: str, *, max_depth: int = DEFAULT_MAX_DEPTH) -> object:
    """`json.loads` for documents nested at most `max_depth` levels; raises ValueError otherwise."""
    if json_too_deep(text, max_depth):
        raise ValueError(f"nested deeper than {max_depth} levels of arrays and objects")
    return json.loads(text)


@dataclass(frozen=True)
class Escape:
    """Where a path lookup leaves its directory: the symlink (relative to the directory) and its target."""

    link: str
    target: str


def inside(base: str, relative: str) -> str | Escape:
    """Resolve `relative` below the directory `base` as a path lookup would, symlinks included.

    Returns the resolved path relative to `base` when the lookup stays inside `base`, or the `Escape`
    when a symlink on the way is absolute or climbs out of `base` (a `..` above `base` in `relative`
    itself is an escape with link `.` and target `..`). Components that do not exist are kept as they
    are. Raises OSError(ELOOP) past `MAX_SYMLINKS` links.
    """
    base = base.rstrip("/") or "/"
    pending = [part for part in relative.split("/") if part not in ("", ".")]
    pending.reverse()
    resolved: list[str] = []
    links = 0
    while pending:
        part = pending.pop()
        if part == "..":
            if not resolved:
                return Escape(".", "..")
            resolved.pop()
            continue
        candidate = os.path.join(base, *resolved, part)
        if not os.path.islink(candidate):
            resolved.append(part)
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise OSError(errno.ELOOP, "too many levels of symbolic links", os.path.join(base, relative))
        target = os.readlink(candidate)
        if target.startswith("/") or _climbs_out(len(resolved), target):
            return Escape("/".join([*resolved, part]), target)
        pending.extend(reversed([p for p in target.split("/") if p not in ("", ".")]))
    return "/".join(resolved)


def _climbs_out(depth: int, target: str) -> bool:
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def _check_regular(path: str, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    what = file_kind(mode)
    try:
        if os.path.islink(path):
            what = f"a symlink to {os.readlink(path)!r}, {what}"
    except OSError:
        pass
    raise Refused(path, f"{what}, not a regular file; only regular files are read")


def _too_large(limit: int, detail: str) -> str:
    return f"larger than the {size_text(limit)} limit for this file{detail}"
