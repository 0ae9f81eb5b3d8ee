"""Where a command's words go: results on stdout, one line per problem on stderr, nothing else.

Three conventions every `nodewright` command (and `kubectl nodewright` verb) keeps, so scripts can rely
on stdout and a person sees one clear line:

- **No library logging on stdout.** structlog's default configuration prints every level, debug
  included, to stdout: a retried API request would print "retrying request" into a command's output.
  `quiet_logging()` sends library logs to stderr, errors only, and is set up by `nodewright.cli.main`
  for every command but the servers (`operator`, `webhook`), which configure their own structured logs.
  Plain tracebacks without local variables: structlog's rich renderer would print every frame's
  locals, and the API client's frames hold the bearer token.
- **A closed pipe ends output quietly.** `nodewright package build ... | head -1` closes stdout early;
  the next write raises BrokenPipeError (Python ignores SIGPIPE). `main` turns it into exit status 141
  (128 + SIGPIPE, what the shell reports for a Unix tool killed by it), without a traceback, and points
  stdout at /dev/null so the interpreter's final flush does not complain either. Commands that change
  the cluster while printing progress (`uninstall`, `migrate`) print through `say()`, which keeps the
  run going when nobody reads its output any more: stopping half-way through a sequence of writes
  because a reader went away would leave the cluster half-migrated for no reason.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Final, TextIO

BROKEN_PIPE_EXIT: Final = 141


def quiet_logging() -> None:
    """Library logs: errors only, on stderr, one plain line each (see the module docstring)."""
    import structlog

    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


@contextlib.contextmanager
def command_logging() -> Iterator[None]:
    """`quiet_logging()` for the length of one command, then the configuration before it: a command run
    in-process (tests, `make demo` calling `plan`) leaves no global logging state behind."""
    import structlog

    previous = structlog.get_config()
    quiet_logging()
    try:
        yield
    finally:
        structlog.configure(**previous)


def silence_stdout() -> None:
    """Point stdout at /dev/null: its reader is gone, and the final flush must not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (a test's capture): nothing to do
        pass


def say(line: str, *, stream: TextIO | None = None) -> None:
    """Print a progress line; a reader that went away does not stop the caller's work."""
    out = stream if stream is not None else sys.stdout
    try:
        print(line, file=out, flush=True)
    except BrokenPipeError:
        silence_stdout()
