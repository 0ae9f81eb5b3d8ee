"""Command line of the agent, as the package pod's init containers call it.

    python -m nodewright.agent <mode> <root_mount> <copy_dir> [interrupt_b64]

and the reference agent's older forms, still found in package pods built by older operators:

    <mode> <copy_dir>                      root mount /root
    interrupt <copy_dir> <interrupt_b64>   root mount /root

A mode this agent does not know succeeds with a warning, so a newer operator can add a mode without
breaking pods that still run an older agent image.
"""

from __future__ import annotations

import os
import posixpath
import sys
from collections.abc import Mapping, Sequence
from typing import Final, TextIO

from nodewright.agent import modes
from nodewright.agent.engine import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Agent, Invocation
from nodewright.agent.logs import Reporter
from nodewright.agent.runner import StopRequest
from nodewright.agent.settings import SettingsError, read_settings

LEGACY_ROOT_MOUNT: Final = "/root"
USAGE: Final = """\
usage: python -m nodewright.agent <mode> <root_mount> <copy_dir> [interrupt_b64]
       python -m nodewright.agent <mode> <copy_dir>                     (legacy; root_mount /root)
       python -m nodewright.agent interrupt <copy_dir> <interrupt_b64>  (legacy; root_mount /root)
"""
HELP: Final = f"""{USAGE}
Runs one mode of a NodeWright package on this node: the steps listed for the mode in
<root_mount><copy_dir>/config.json, each chrooted into <root_mount> (the host's / as mounted in the pod).

modes:      {", ".join(modes.WORK_MODES)}
checks:     {", ".join(modes.CHECK_MODES)}
interrupt:  interrupt (runs the base64 JSON interrupt given as the last argument)

exit codes: 0 success, 1 a step or check failed or the package is invalid, 2 bad arguments or settings,
            128+N stopped by signal N.
environment: NODEWRIGHT_ROOT_DIR/SKYHOOK_ROOT_DIR, NODEWRIGHT_LOG_DIR/SKYHOOK_LOG_DIR,
            NODEWRIGHT_RESOURCE_ID/SKYHOOK_RESOURCE_ID, SKYHOOK_DATA_DIR, SKYHOOK_AGENT_WRITE_LOGS,
            SKYHOOK_AGENT_BUFFER_LIMIT, NODEWRIGHT_AGENT_LOG_LIMIT, OVERLAY_ALWAYS_RUN_STEP, COPY_RESOLV,
            NODEWRIGHT_AGENT_CHROOT, NODEWRIGHT_AGENT_STOP_TIMEOUT. See docs/agent.md.
"""


class UsageError(ValueError):
    pass


def parse_invocation(args: Sequence[str]) -> Invocation:
    """The invocation from the arguments after the program name; raises UsageError."""
    interrupt: str | None = None
    if len(args) == 2:
        mode, copy_dir = args
        root = LEGACY_ROOT_MOUNT
    elif len(args) == 3 and args[0] == modes.INTERRUPT:
        mode, copy_dir, interrupt = args
        root = LEGACY_ROOT_MOUNT
    elif len(args) == 3:
        mode, root, copy_dir = args
    elif len(args) == 4:
        mode, root, copy_dir, interrupt = args
    else:
        raise UsageError(f"expected 2 to 4 arguments, got {len(args)}")
    if mode == modes.INTERRUPT and not interrupt:
        raise UsageError("the interrupt mode needs the interrupt (base64 JSON) as its last argument")
    if not copy_dir.startswith("/") or ".." in copy_dir.split("/"):
        raise UsageError(
            f"copy_dir {copy_dir!r} must be an absolute path on the host without '..' "
            "(the operator passes e.g. /var/lib/skyhook/<nodewright>/<package>-<version>-<uid>-<generation>)"
        )
    return Invocation(
        mode=mode,
        root=os.path.abspath(root),
        copy_dir="/" + posixpath.normpath(copy_dir).lstrip("/"),
        interrupt=interrupt,
    )


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run the agent; returns the exit code. `argv` excludes the program name (default: sys.argv[1:])."""
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    out = sys.stdout if stdout is None else stdout
    err = sys.stderr if stderr is None else stderr
    reporter = Reporter(out, err)
    if args and args[0] in ("-h", "--help"):
        out.write(HELP)
        return EXIT_OK
    try:
        invocation = parse_invocation(args)
    except UsageError as exc:
        err.write(f"nodewright agent: {exc}\n{USAGE}")
        return EXIT_USAGE
    if invocation.mode not in modes.ALL_MODES:
        reporter.warn(
            f"this agent does not know mode {invocation.mode!r} (known: {', '.join(modes.ALL_MODES)}); "
            "nothing to do, reporting success"
        )
        return EXIT_OK
    if invocation.mode != modes.INTERRUPT and len(args) == 4:
        reporter.warn(f"the last argument is only used by the interrupt mode; ignored for {invocation.mode}")
    if not os.path.isdir(invocation.root):
        reporter.error(f"root mount {invocation.root} is not a directory: pass where the host's / is mounted")
        return EXIT_USAGE
    try:
        settings = read_settings(env, is_root=os.geteuid() == 0)
    except SettingsError as exc:
        for error in exc.errors:
            reporter.error(error)
        return EXIT_USAGE
    stop = StopRequest()
    with stop.handling_signals():
        try:
            return Agent(invocation, settings, environ=env, reporter=reporter, stop=stop).run()
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            reporter.error(f"{where}{exc.strerror or exc}")
            return EXIT_FAILED
