"""The `nodewright` command (and `kubectl nodewright`): one entry point with a subcommand per job.

Each subcommand lives in its own module exposing `register(subparsers)`; the module sets a `func`
default on its parser that takes the parsed namespace and returns an exit code. Only the module of the
command being run is imported (see `nodewright.cli.commands`): the others get a placeholder parser with
their help line, which is all `nodewright --help` shows. Heavy modules are imported inside the command
funcs as well, so `nodewright <verb> --help` stays fast too.

Output conventions (`nodewright.cli.output`): library logs never reach stdout (servers excepted, they
log structured lines of their own), and output cut short by a closed pipe ends with exit status 141 and
no traceback.

Global cluster flags may come before the verb, as with kubectl (`kubectl nodewright --context prod
status`): they are moved behind it, where every cluster command defines them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import cast

from nodewright.cli import commands, output
from nodewright.cli.flags import OneLineParser

GLOBAL_VALUE_FLAGS = ("--kubeconfig", "--context", "-n", "--namespace", "--request-timeout")
DESCRIPTION = "NodeWright: a Kubernetes-native package manager for the host OS of cluster nodes."
PLUGIN_DESCRIPTION = (
    "kubectl nodewright: day-2 operations of NodeWright rollouts -- pause, status, why a node waits,"
    " targeted retries, package logs that outlive their pods, a live view."
)


def split_command(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """(the command name, argv with leading global flags moved behind the command)."""
    leading: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        if not token.startswith("-"):
            rest = list(argv[index + 1 :])
            return token, [token, *leading, *rest]
        flag = token.split("=", 1)[0]
        if flag in GLOBAL_VALUE_FLAGS:
            if "=" in token or index + 1 >= len(argv):
                leading.append(token)
                index += 1
            else:
                leading += [token, argv[index + 1]]
                index += 2
            continue
        return None, list(argv)  # -h, --help, or something the top-level parser reports
    return None, list(argv)


def build_parser(
    command: str | None = None,
    *,
    prog: str = "nodewright",
    plugin_only: bool = False,
    everything: bool | None = None,
) -> argparse.ArgumentParser:
    """The parser; `command`'s module registered for real, or every module (`everything`, the default
    without a command: what tests and shell completion walk)."""
    if everything is None:
        everything = command is None
    # Subparsers are created with the parent's class, so every command's errors are one line.
    parser = OneLineParser(prog=prog, description=PLUGIN_DESCRIPTION if plugin_only else DESCRIPTION)
    subparsers = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND"),
    )
    table = commands.by_name(plugin_only=plugin_only)
    wanted = list(table.values()) if everything else [table[command]] if command in table else []
    loaded: set[str] = set()
    for entry in wanted:
        if entry.module in loaded:
            continue
        loaded.add(entry.module)
        register: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None] = (
            importlib.import_module(entry.module).register
        )
        register(subparsers)
    for entry in table.values():
        if entry.name not in subparsers.choices:
            subparsers.add_parser(entry.name, help=entry.help, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str = "nodewright", plugin_only: bool = False) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == [commands.HIDDEN_COMPLETE]:
        from nodewright.cli.plugin.completion_verbs import complete

        return complete(args_in[1:], prog=prog, plugin_only=plugin_only)
    command, reordered = split_command(args_in)
    parser = build_parser(command, prog=prog, plugin_only=plugin_only, everything=False)
    args = parser.parse_args(reordered)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    entry = commands.by_name().get(command or "")
    logs = contextlib.nullcontext() if entry is not None and entry.logs else output.command_logging()
    try:
        with logs:
            return func(args)
    except BrokenPipeError:
        output.silence_stdout()
        return output.BROKEN_PIPE_EXIT


if __name__ == "__main__":
    sys.exit(main())
