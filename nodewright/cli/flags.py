"""Flag checking shared by the `nodewright` commands: argparse types and one-line failures.

Every bad invocation ends the same way: one line on stderr that names the flag (or the object) and
says what to do, and exit status 2 -- never a traceback, never the multi-line usage text.

- `OneLineParser` is the parser class of the whole command tree (`add_subparsers` creates children of
  the parent's class): its `error()` prints `<prog>: error: <what> (see <prog> --help)`.
- The argparse *types* below check ranges and formats at parse time, so `--qps=-5` or
  `--health-probe-bind-address=garbage` are refused before anything starts. Kubernetes names follow the
  API server's own rules (RFC 1123 labels and subdomains, RFC 1035 labels for Services), so a flag is
  never accepted here and refused by the API server later.
- `UsageError` is for what types cannot see (two flags that disagree, a port that is taken, a
  kubeconfig whose CA does not parse, a namespace that does not exist); `fail()` prints it the same
  way and returns the exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import os
import re
import socket
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

if TYPE_CHECKING:
    from nodewright.kube.config import ClusterConfig

USAGE_ERROR = 2

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_HOST_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", re.IGNORECASE)
DISABLED_ADDRESS = "0"


class UsageError(Exception):
    """A bad flag value or a start-up resource that is not usable; the message is the whole story."""


def one_line(text: object) -> str:
    """Collapse whitespace (YAML, pydantic and OpenSSL messages span lines) so an error stays one line."""
    return " ".join(str(text).split())


def fail(prog: str, message: object, *, stream: TextIO | None = None) -> int:
    """Print `<prog>: <message>` as one line on stderr and return the usage-error exit status."""
    print(f"{prog}: {one_line(message)}", file=stream if stream is not None else sys.stderr, flush=True)
    return USAGE_ERROR


def cluster_config(kubeconfig: str | Path | None) -> ClusterConfig:
    """The cluster of `--kubeconfig` (in-cluster settings without it); a UsageError names the problem."""
    from nodewright.kube.config import ConfigError, load_config

    try:
        return load_config(kubeconfig)
    except ConfigError as exc:
        hint = "" if kubeconfig else " (pass --kubeconfig, or run in a cluster)"
        raise UsageError(f"{exc}{hint}") from None


def run_against_cluster(
    prog: str,
    args: argparse.Namespace,
    main: Callable[[argparse.Namespace, ClusterConfig], Coroutine[Any, Any, int]],
) -> int:
    """Load the cluster of `args.kubeconfig` and run `main` on it; a UsageError is one line and exit 2."""
    try:
        return asyncio.run(main(args, cluster_config(args.kubeconfig)))
    except UsageError as exc:
        return fail(prog, exc)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (argparse prints the whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


# ----------------------------------------------------------------------------------------------------
# Numbers


def _number(text: str, convert: Callable[[str], float]) -> float:
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):  # NaN and infinities compare badly
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def float_above(bound: float) -> Callable[[str], float]:
    """A float strictly greater than `bound` (e.g. a rate or a period that must be positive)."""

    def parse(text: str) -> float:
        value = _number(text, float)
        if value <= bound:
            raise argparse.ArgumentTypeError(f"must be greater than {bound:g}, got {text}")
        return value

    parse.__name__ = f"number greater than {bound:g}"
    return parse


def float_at_least(bound: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = _number(text, float)
        if value < bound:
            raise argparse.ArgumentTypeError(f"must be at least {bound:g}, got {text}")
        return value

    parse.__name__ = f"number of at least {bound:g}"
    return parse


def int_at_least(bound: int, *, at_most: int | None = None) -> Callable[[str], int]:
    """An integer in [bound, at_most]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < bound:
            raise argparse.ArgumentTypeError(f"must be at least {bound}, got {value}")
        if at_most is not None and value > at_most:
            raise argparse.ArgumentTypeError(f"must be at most {at_most}, got {value}")
        return value

    parse.__name__ = f"whole number of at least {bound}"
    return parse


positive_float = float_above(0)
non_negative_float = float_at_least(0)
positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
port_number = int_at_least(1, at_most=65535)


_TRUE = frozenset({"1", "t", "true", "y", "yes", "on"})
_FALSE = frozenset({"0", "f", "false", "n", "no", "off"})


def boolean(text: str) -> bool:
    """true/false, 1/0, t/f, yes/no, on/off in any case: what Go flags accept (Helm templates write
    `--leader-elect=true`) and a few more."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def add_switch(parser: argparse.ArgumentParser, name: str, *, default: bool, help: str) -> None:
    """`--name`, `--name=true|false` (Go flag syntax) and `--no-name`, all setting one destination."""
    dest = name.removeprefix("--").replace("-", "_")
    parser.add_argument(
        name, dest=dest, nargs="?", const=True, default=default, type=boolean, metavar="true|false", help=help
    )
    parser.add_argument(
        f"--no-{name.removeprefix('--')}", dest=dest, action="store_false", help=argparse.SUPPRESS
    )


# ----------------------------------------------------------------------------------------------------
# Addresses


def _host_problem(host: str) -> str | None:
    if not host:
        return None  # all interfaces
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if len(host) <= 253 and _HOST_NAME.match(host):
        return None
    return f"{host!r} is not an IP address or a host name"


def host_address(text: str) -> str:
    """A host to listen on: an IPv4/IPv6 address or a host name (no port)."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty (0.0.0.0 listens on all interfaces)")
    problem = _host_problem(text[1:-1] if text.startswith("[") and text.endswith("]") else text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def bind_address(text: str) -> str:
    """A Go-style `[host]:port` to listen on (`:8081`, `127.0.0.1:0`, `[::1]:8080`); `0` (or empty)
    disables the listener. Returned normalised (`0` for disabled), so every consumer parses it the same."""
    value = text.strip()
    if value in ("", DISABLED_ADDRESS):
        return DISABLED_ADDRESS
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not [host]:port (e.g. :8081 or 127.0.0.1:8081; 0 disables it)"
        )
    if int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: port {port} is above 65535")
    bracketed = host.startswith("[") and host.endswith("]")
    if ":" in host and not bracketed:
        raise argparse.ArgumentTypeError(f"{text!r}: write an IPv6 host in brackets, e.g. [::1]:{port}")
    problem = _host_problem(host[1:-1] if bracketed else host)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r}: {problem}")
    return value


def check_bindable(flag: str, host: str, port: int) -> None:
    """Bind (and release) `host`:`port` now, so a taken port is reported before a long wait, by a
    server that must not listen yet (the webhook's readiness probe is its port being open)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise listen_failure(flag, f"{host}:{port}", exc) from None
    for family, kind, proto, _name, address in infos:
        with socket.socket(family, kind, proto) as sock:
            # As asyncio's create_server does on Unix: TIME_WAIT sockets do not block a restart.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise listen_failure(flag, f"{host}:{port}", exc) from None


def listen_failure(flag: str, address: object, exc: OSError) -> UsageError:
    """The message for a listener that could not start (port taken, address not on this host)."""
    # asyncio wraps bind errors ("error while attempting to bind on address ..."): say it plainly.
    reason = os.strerror(exc.errno) if exc.errno else one_line(exc)
    hint = "choose a free port" if exc.errno == errno.EADDRINUSE else "choose an address of this host"
    return UsageError(f"{flag} {address}: cannot listen: {reason}; {hint}")


# ----------------------------------------------------------------------------------------------------
# Kubernetes names, images, taints and paths


def dns_label(text: str) -> str:
    """An RFC 1123 label (namespaces): lowercase letters, digits and '-', at most 63 characters."""
    if len(text) > 63 or not _DNS_LABEL.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid name: at most 63 lowercase letters, digits and '-',"
            " starting and ending with a letter or digit"
        )
    return text


def dns_1035_label(text: str) -> str:
    """An RFC 1035 label (Service names): like `dns_label`, but starting with a letter."""
    if len(text) > 63 or not _DNS_1035_LABEL.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid Service name: at most 63 lowercase letters, digits and '-',"
            " starting with a letter and ending with a letter or digit"
        )
    return text


def dns_subdomain(text: str, *, max_length: int = 253) -> str:
    """An RFC 1123 subdomain (most object names): labels of [a-z0-9-] joined by '.'."""
    if len(text) > max_length or not _DNS_SUBDOMAIN.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid name: at most {max_length} lowercase letters, digits, '-' and '.',"
            " starting and ending with a letter or digit"
        )
    return text


def nodewright_name(text: str) -> str:
    """A NodeWright name: a subdomain short enough that `nodewright.io/status.<name>` is a label key."""
    from nodewright.api import constants

    return dns_subdomain(text, max_length=constants.MAX_NODEWRIGHT_NAME_LENGTH)


def image_reference(text: str) -> str:
    from nodewright.api.images import ImageReferenceError, parse_image

    try:
        parse_image(text)
    except ImageReferenceError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an image reference: {exc}") from None
    if len(text) > 4096:
        raise argparse.ArgumentTypeError("image reference is longer than 4096 characters")
    return text


def taint(text: str) -> str:
    """`key[=value]:Effect` with a valid label key and value (what the API server accepts on a node)."""
    from nodewright.api.validation import label_key_problem, label_value_problem
    from nodewright.controller.options import parse_taint

    try:
        key, value, _effect = parse_taint(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    problem = label_key_problem(key) or (label_value_problem(value) if value else None)
    if problem:
        raise argparse.ArgumentTypeError(f"taint {text!r}: {problem}")
    return text


def absolute_path(text: str) -> str:
    """An absolute POSIX path on the host (package pods mount it as a hostPath)."""
    path = PurePosixPath(text)
    if not path.is_absolute() or "\0" in text or ".." in path.parts:
        raise argparse.ArgumentTypeError(f"{text!r} is not an absolute path without '..'")
    return text


def existing_file(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return path


def existing_file_or_stdin(text: str) -> Path:
    return Path("-") if text == "-" else existing_file(text)
