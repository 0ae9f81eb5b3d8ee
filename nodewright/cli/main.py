"""The `nodewright` command: one entry point with a subcommand per job.

Each subcommand lives in its own module exposing `register(subparsers)`; the module sets a `func`
default on its parser that takes the parsed namespace and returns an exit code. Modules are imported
only when their command runs would be nicer for start-up time, but argparse needs every parser to
print `--help`, and the imports here are cheap (heavy modules are imported inside the command funcs).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import cast

from nodewright.cli import commands
from nodewright.cli.flags import OneLineParser


def build_parser() -> argparse.ArgumentParser:
    # Subparsers are created with the parent's class, so every command's errors are one line.
    parser = OneLineParser(
        prog="nodewright",
        description="NodeWright: a Kubernetes-native package manager for the host OS of cluster nodes.",
    )
    subparsers = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND"),
    )
    module: ModuleType
    for module in commands.MODULES:
        register: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None] = module.register
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
