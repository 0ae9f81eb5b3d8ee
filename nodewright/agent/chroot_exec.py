"""Helper process that enters the host root and becomes one step: chroot, chdir, chmod +x, exec.

The agent itself must stay outside the host root (it writes flags and logs through the root mount and
must outlive the step), so each step gets its own short-lived helper, started as
`python -I chroot_exec.py <root> <cwd> <chmod 0|1> -- <argv...>` with the step's environment. After
`chroot(2)` the helper replaces itself with the step (`execvp`), so the step's exit status, signals and
process id are the agent's direct child's; nothing of the helper is left running inside the host.
Failing to enter the root or to start the step exits 127 (not found) or 126 (cannot execute), the codes
a shell uses, with the reason on stderr.

Standard library only and started with `-I`: it must not import anything from the package image or the
host.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Sequence
from typing import NoReturn

NOT_FOUND = 127
CANNOT_EXECUTE = 126


def enter_and_exec(root: str, cwd: str, make_executable: bool, argv: Sequence[str]) -> NoReturn:
    try:
        os.chroot(root)
        os.chdir("/")
    except OSError as exc:
        _fail(CANNOT_EXECUTE, f"cannot chroot into {root}: {exc.strerror}")
    try:
        os.chdir(cwd)
    except OSError as exc:
        _fail(NOT_FOUND, f"cannot enter {cwd} inside {root}: {exc.strerror}")
    if make_executable:
        try:
            mode = os.stat(argv[0]).st_mode
            os.chmod(argv[0], mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as exc:
            _fail(NOT_FOUND if exc.errno == errno.ENOENT else CANNOT_EXECUTE, f"{argv[0]}: {exc.strerror}")
    try:
        os.execvp(argv[0], list(argv))
    except OSError as exc:
        code = NOT_FOUND if exc.errno == errno.ENOENT else CANNOT_EXECUTE
        _fail(code, f"cannot run {argv[0]} inside {root}: {exc.strerror}")


def _fail(code: int, message: str) -> NoReturn:
    sys.stderr.write(f"nodewright-agent: {message}\n")
    sys.stderr.flush()
    os._exit(code)


def _main(args: Sequence[str]) -> NoReturn:
    if len(args) < 5 or args[3] != "--" or args[2] not in ("0", "1"):
        _fail(2, "usage: chroot_exec.py <root> <cwd> <chmod 0|1> -- <command> [args...]")
    enter_and_exec(args[0], args[1], args[2] == "1", args[4:])


if __name__ == "__main__":
    _main(sys.argv[1:])
