"""Shell completion: `completion bash|zsh` prints a script; `__complete WORDS...` answers it.

The script hands the words typed so far to the hidden `__complete` command, which walks the same
argparse tree the command runs with (so completion can never disagree with the flags) and prints one
candidate per line: sub-commands, flags, flag choices, and -- from the cluster, with a two-second
deadline and silence on any error -- NodeWright, node, package and DeploymentPolicy names for the
arguments that take them, and kubeconfig contexts for `--context`.

kubectl (1.26 and later) completes plugin arguments by running `kubectl_complete-nodewright` from the
PATH; that console script answers like `__complete` and ends with cobra's `:4` directive (no file
completion), so `kubectl nodewright <TAB>` works once the plugin is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Sequence

from nodewright.cli.plugin import common

LOOKUP_DEADLINE = 2.0
STAGES = ("apply", "config", "upgrade", "uninstall", "interrupt", "post-interrupt", "uninstall-interrupt")

BASH = """# {prog} completion (bash): eval "$({prog} completion bash)"
_{func}() {{
    local IFS=$'\\n'
    COMPREPLY=( $({command} __complete "${{COMP_WORDS[@]:1:$COMP_CWORD}}" 2>/dev/null) )
}}
complete -o default -F _{func} {command}
"""
ZSH = (
    """# {prog} completion (zsh): eval "$({prog} completion zsh)"
autoload -U +X bashcompinit && bashcompinit
"""
    + BASH
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = common.verb_parser(
        subparsers,
        "completion",
        help="print a shell completion script (bash, zsh)",
        description="Print a completion script for bash or zsh; load it with eval.",
        examples=[
            'eval "$(kubectl-nodewright completion bash)"   # in ~/.bashrc',
            'eval "$(nodewright completion zsh)"           # in ~/.zshrc',
        ],
    )
    parser.add_argument("shell", choices=("bash", "zsh"))
    parser.set_defaults(func=run, prog=parser.prog)


def run(args: argparse.Namespace) -> int:
    prog = str(args.prog).removesuffix(" completion")
    command = "kubectl-nodewright" if prog.startswith("kubectl") else prog
    func = command.replace("-", "_")
    sys.stdout.write((BASH if args.shell == "bash" else ZSH).format(prog=prog, func=func, command=command))
    return common.OK


# ----------------------------------------------------------------------------------------------------
# Answering


def _subparsers(
    parser: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _option(parser: argparse.ArgumentParser, word: str) -> argparse.Action | None:
    flag = word.split("=", 1)[0]
    for action in parser._actions:
        if flag in action.option_strings:
            return action
    return None


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(
        action,
        argparse._StoreTrueAction | argparse._StoreFalseAction | argparse._HelpAction | argparse._CountAction,
    )


def candidates(parser: argparse.ArgumentParser, words: Sequence[str]) -> tuple[list[str], str | None]:
    """(static candidates, the kind of cluster name wanted or None) for `words` (the last is partial)."""
    from nodewright.cli.main import GLOBAL_VALUE_FLAGS, split_command

    *done, prefix = list(words) or [""]
    done = split_command(done)[1] if done else done  # global flags before the verb, as kubectl allows
    current = parser
    positionals: list[str] = []
    index = 0
    pending: argparse.Action | None = None
    while index < len(done):
        word = done[index]
        index += 1
        if pending is not None:
            pending = None
            continue
        if word.startswith("-"):
            action = _option(current, word)
            if action is not None and _takes_value(action) and "=" not in word:
                pending = action
            elif action is None and word in GLOBAL_VALUE_FLAGS:
                index += 1  # a cluster flag given before a nested verb: its value is not a word
            continue
        sub = _subparsers(current)
        if sub is not None and word in sub.choices and not positionals:
            current = sub.choices[word]
            continue
        positionals.append(word)
    if pending is not None:
        return _value_candidates(pending, prefix)
    if prefix.startswith("-"):
        flags = sorted(s for a in current._actions for s in a.option_strings)
        return [f for f in flags if f.startswith(prefix)], None
    sub = _subparsers(current)
    if sub is not None and not positionals:
        names = [n for n in sub.choices if not n.startswith("_")]
        return sorted(n for n in names if n.startswith(prefix)), None
    wanted = [a for a in current._actions if not a.option_strings and a.dest != "help"]
    if len(positionals) < len(wanted):
        action = wanted[len(positionals)]
        if action.choices:
            return sorted(str(c) for c in action.choices if str(c).startswith(prefix)), None
        return [], action.dest
    return [], None


def _value_candidates(action: argparse.Action, prefix: str) -> tuple[list[str], str | None]:
    if action.choices:
        return sorted(str(c) for c in action.choices if str(c).startswith(prefix)), None
    if action.dest == "stage":
        return [s for s in STAGES if s.startswith(prefix)], None
    return [], {"node": "node", "nodes": "node", "context": "context", "compartment": None}.get(action.dest)


async def _names(kind: str, args: argparse.Namespace) -> list[str]:
    from nodewright.kube.resources import DEPLOYMENTPOLICIES, NODES, NODEWRIGHTS

    resource = {"nodewright": NODEWRIGHTS, "node": NODES, "policy": DEPLOYMENTPOLICIES}.get(kind)
    async with common.open_client(args) as client:
        if kind == "package":
            listed = await client.list(NODEWRIGHTS)
            return sorted({p for o in listed.items for p in ((o.get("spec") or {}).get("packages") or {})})
        if resource is None:
            return []
        listed = await client.list(resource)
        return sorted(str(o["metadata"]["name"]) for o in listed.items)


def _contexts(args: argparse.Namespace) -> list[str]:
    import os
    from pathlib import Path

    import yaml

    path = getattr(args, "kubeconfig", None) or (
        os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
    )
    file = Path(path) if path else Path.home() / ".kube" / "config"
    with contextlib.suppress(OSError, yaml.YAMLError, AttributeError, TypeError):
        doc = yaml.safe_load(file.read_text())
        return sorted(str(c.get("name")) for c in doc.get("contexts") or [] if isinstance(c, dict))
    return []


def complete(words: Sequence[str], *, prog: str, plugin_only: bool) -> int:
    from nodewright.cli.main import build_parser

    common._configure_quiet_logging()
    parser = build_parser(prog=prog, plugin_only=plugin_only, everything=True)
    found, kind = candidates(parser, words)
    prefix = words[-1] if words else ""
    if kind is not None:
        # The flags typed so far (kubeconfig, context) decide which cluster is asked.
        flags = argparse.Namespace(kubeconfig=None, context=None, request_timeout=LOOKUP_DEADLINE)
        for i, word in enumerate(words[:-1]):
            for flag in ("--kubeconfig", "--context"):
                if word == flag and i + 1 < len(words) - 1:
                    setattr(flags, flag[2:], words[i + 1])
                elif word.startswith(flag + "="):
                    setattr(flags, flag[2:], word.split("=", 1)[1])
        if kind == "context":
            found = [c for c in _contexts(flags) if c.startswith(prefix)]
        else:
            with contextlib.suppress(Exception):
                names = asyncio.run(asyncio.wait_for(_names(kind, flags), LOOKUP_DEADLINE))
                found = [n for n in names if n.startswith(prefix)]
    for item in found:
        print(item)
    return common.OK


def kubectl_complete_main() -> int:
    """`kubectl_complete-nodewright`: kubectl's plugin completion hook (cobra's output shape)."""
    code = complete(sys.argv[1:], prog="kubectl nodewright", plugin_only=True)
    print(":4")
    return code
