"""What every `kubectl nodewright` verb shares: kubectl's flags, the API session, output, confirmation,
dry runs and exit codes.

Flags follow kubectl: `--kubeconfig` (else `$KUBECONFIG`, else in-cluster, else `~/.kube/config`),
`--context`, `-n/--namespace` (the operator's namespace, where package pods and the kept logs live:
default `$NODEWRIGHT_NAMESPACE`, else `nodewright-system`; the context's namespace is not used, since
NodeWrights and nodes are cluster-scoped and the context's namespace is rarely the operator's),
`--request-timeout` (seconds, per API request), `-o table|wide|json|yaml`, `--dry-run=client|server`
on every write and `-y/--yes` for verbs that change nodes.

Exit codes (stable; scripts may rely on them):

| code | meaning |
|---|---|
| 0 | done (or nothing to do) |
| 1 | the API server could not be reached or refused the request (network, 403, 5xx, timeout) |
| 2 | usage: a bad flag, argument or kubeconfig |
| 3 | not found: the named NodeWright, node, policy or package does not exist, or is invalid (refused |
|   | by the operator: the line names each field and what to do) |
| 4 | refused: not safe or not possible now (not confirmed, the object changed meanwhile, work in flight) |

Dry runs: `client` computes and prints the change without sending anything; `server` sends it with
`dryRun=All`, so the API server (and the admission webhook) validate it and nothing is stored.
Every request has a deadline (`--request-timeout`); reads and writes are retried a few times on
transient errors by the client, as in the operator.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from nodewright.kube.client import KubeClient, PatchType
    from nodewright.kube.resources import Resource

JSON = dict[str, Any]

OK: Final = 0
FAILED: Final = 1
USAGE: Final = 2
NOT_FOUND: Final = 3
REFUSED: Final = 4

DEFAULT_NAMESPACE: Final = "nodewright-system"
NAMESPACE_ENV: Final = "NODEWRIGHT_NAMESPACE"
FIELD_MANAGER: Final = "kubectl-nodewright"
OUTPUTS: Final = ("table", "wide", "json", "yaml")


class PluginError(Exception):
    """A failure the user is told about in one line; `code` is the exit status."""

    code = FAILED

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class NotFoundError(PluginError):
    code = NOT_FOUND


class Refused(PluginError):
    code = REFUSED


class UsageProblem(PluginError):
    code = USAGE


# ----------------------------------------------------------------------------------------------------
# Flags


def positive_seconds(text: str) -> float:
    try:
        value = float(text.rstrip("s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster")
    group.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, in-cluster)"
    )
    group.add_argument("--context", default=None, help="kubeconfig context (default: current-context)")
    group.add_argument(
        "-n",
        "--namespace",
        default=None,
        type=namespace_name,
        help=f"the operator's namespace (default: ${NAMESPACE_ENV}, else {DEFAULT_NAMESPACE})",
    )
    group.add_argument(
        "--request-timeout",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="deadline of each API request (default 30)",
    )


def namespace_name(text: str) -> str:
    """`-n`: a namespace name as the API server accepts it (an RFC 1123 label)."""
    from nodewright.cli.flags import dns_label

    return dns_label(text)


def add_output_flag(parser: argparse.ArgumentParser, choices: Sequence[str] = OUTPUTS) -> None:
    parser.add_argument(
        "-o", "--output", choices=tuple(choices), default="table", help="output format (default table)"
    )


def add_write_flags(parser: argparse.ArgumentParser, *, confirm: bool) -> None:
    parser.add_argument(
        "--dry-run",
        nargs="?",
        const="client",
        default="none",
        choices=("none", "client", "server"),
        help="client: print the change only; server: let the API server validate it, store nothing",
    )
    if confirm:
        parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def verb_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    *,
    help: str,
    description: str,
    examples: Sequence[str],
) -> argparse.ArgumentParser:
    """A verb's parser: help line, description and an Examples block in `--help`."""
    epilog = "examples:\n" + "\n".join(f"  {line}" for line in examples) if examples else None
    return subparsers.add_parser(
        name,
        help=help,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def show_help(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """The `func` of a command group run without a subcommand: its help, exit 2."""

    def func(_args: argparse.Namespace) -> int:
        parser.print_help()
        return USAGE

    return func


def operator_namespace(args: argparse.Namespace) -> str:
    return str(getattr(args, "namespace", None) or os.environ.get(NAMESPACE_ENV) or DEFAULT_NAMESPACE)


# ----------------------------------------------------------------------------------------------------
# Running a verb


@dataclass
class Session:
    """One invocation: the parsed flags and the API client (None for client-only work)."""

    args: argparse.Namespace
    client: KubeClient

    @property
    def namespace(self) -> str:
        return operator_namespace(self.args)

    @property
    def dry_run(self) -> str:
        return str(getattr(self.args, "dry_run", "none") or "none")

    async def patch(
        self,
        resource: Resource,
        name: str,
        body: JSON,
        *,
        namespace: str | None = None,
        patch_type: PatchType | None = None,
        subresource: str | None = None,
    ) -> JSON | None:
        """A patch honouring `--dry-run`: None for client dry runs (nothing sent)."""
        from nodewright.kube.client import PatchType

        kind = patch_type or PatchType.MERGE
        if self.dry_run == "client":
            return None
        params = {"fieldManager": FIELD_MANAGER}
        if self.dry_run == "server":
            params["dryRun"] = "All"
        return await self.client.request(
            "PATCH",
            resource.item_path(name, namespace, subresource),
            resource=resource.label,
            body=body,
            content_type=kind.value,
            params=params,
            repeatable=kind is not PatchType.JSON_PATCH,
        )


def _configure_quiet_logging() -> None:
    """Library code logs through structlog; a CLI shows its own messages only (on stderr)."""
    from nodewright.cli.output import quiet_logging

    quiet_logging()


@contextlib.asynccontextmanager
async def open_client(args: argparse.Namespace) -> AsyncIterator[KubeClient]:
    from nodewright.kube.client import KubeClient
    from nodewright.kube.config import load_config, load_kubeconfig

    context = getattr(args, "context", None)
    kubeconfig = getattr(args, "kubeconfig", None)
    config = load_kubeconfig(kubeconfig, context=context) if context else load_config(kubeconfig)
    timeout = float(getattr(args, "request_timeout", 30.0) or 30.0)
    async with KubeClient(
        config,
        timeout=timeout,
        connect_timeout=min(10.0, timeout),
        call_deadline=timeout,  # --request-timeout bounds each call, its retries included
        max_retries=2,
        field_manager=FIELD_MANAGER,
    ) as client:
        yield client


def prog_of(args: argparse.Namespace) -> str:
    return str(getattr(args, "prog", None) or "kubectl nodewright")


def run(args: argparse.Namespace, body: Callable[[Session], Awaitable[int]]) -> int:
    """Run `body` with a session; every failure becomes one line on stderr and its exit code."""
    import aiohttp

    from nodewright.kube.config import ConfigError
    from nodewright.kube.resources import ApiError
    from nodewright.kube.resources import NotFound as ApiNotFound

    _configure_quiet_logging()
    prog = prog_of(args)

    async def main() -> int:
        async with open_client(args) as client:
            return await body(Session(args, client))

    try:
        return asyncio.run(main())
    except PluginError as exc:
        return report(prog, str(exc), exc.code)
    except ConfigError as exc:
        return report(prog, f"{exc} (pass --kubeconfig/--context or set $KUBECONFIG)", USAGE)
    except ApiNotFound as exc:
        return report(prog, f"not found: {exc.message}", NOT_FOUND)
    except ApiError as exc:
        hint = (
            " (check RBAC: the plugin needs the verbs listed in docs/plugin.md)" if exc.status == 403 else ""
        )
        return report(prog, f"the API server refused the request: {exc}{hint}", FAILED)
    except BrokenPipeError:
        raise  # stdout's reader went away: `nodewright.cli.main` ends quietly
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        text = str(exc) or type(exc).__name__
        return report(prog, f"cannot reach the API server: {text}", FAILED)
    except KeyboardInterrupt:
        return 130


def report(prog: str, message: str, code: int) -> int:
    print(f"{prog}: {' '.join(message.split())}", file=sys.stderr, flush=True)
    return code


# ----------------------------------------------------------------------------------------------------
# Output


def emit(args: argparse.Namespace, doc: Any, render: Callable[[bool], str]) -> None:
    """Print `doc` as JSON/YAML, or `render(wide)` for table/wide."""
    output = str(getattr(args, "output", "table") or "table")
    if output == "json":
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    elif output == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    else:
        text = render(output == "wide")
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    sys.stdout.flush()


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """kubectl's table shape: upper-case headers, columns padded to the widest cell, three spaces."""
    cells = [[str(h).upper() for h in headers], *[["" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["   ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in cells]
    return "\n".join(lines) + "\n"


def confirm(args: argparse.Namespace, question: str) -> None:
    """Ask before a change to nodes; `-y` or a dry run skips the question. Refuses without a terminal."""
    if getattr(args, "yes", False) or str(getattr(args, "dry_run", "none")) != "none":
        return
    if not sys.stdin.isatty():
        raise Refused(f"{question} -- not confirmed: pass -y (--yes) to run without a terminal")
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise Refused("not confirmed; nothing changed")


def write_result(
    args: argparse.Namespace,
    *,
    action: str,
    kind: str,
    name: str,
    changed: bool,
    detail: str,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """What a write verb prints: kubectl's `<kind>/<name> <done>` line, or a JSON/YAML result."""
    dry = str(getattr(args, "dry_run", "none") or "none")
    doc: JSON = {
        "action": action,
        "kind": kind,
        "name": name,
        "changed": changed,
        "dryRun": dry,
        "message": detail,
        **(extra or {}),
    }
    suffix = f" (dry run: {dry})" if dry != "none" else ""
    emit(args, doc, lambda _wide: f"{kind.lower()}/{name} {detail}{suffix}")
