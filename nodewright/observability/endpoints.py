"""The operator's own HTTP endpoints (health probes, the metrics scrape): a small HTTP/1.1 GET server.

Who calls them: the kubelet's liveness and readiness probes (`/healthz`, `/readyz`) and Prometheus
(`/metrics`). All three send a `GET` without a body, read one response and either close the connection or
reuse it; each answer here carries `Connection: close`, so every request costs one short connection,
which at a probe or scrape every few seconds is nothing. That is all the protocol the operator needs,
so it does not load aiohttp's web server for it (2.0 MiB of an idle operator's memory: its routing,
middlewares, file responses and the MIME-type table they read at import).

What the server does with what it is sent:
- `GET` and `HEAD` of a known path: the route's reply (`HEAD` without the body). The query string is
  ignored, as the routes take no parameters.
- another method: 405 with `Allow: GET, HEAD`; an unknown path: 404; a request line or header block it
  cannot read (not HTTP/1.x, over `MAX_HEAD_BYTES`): 400. A route that raises: 500, logged.
- a client that sends nothing, or too slowly, is dropped after `read_timeout` seconds, and at most
  `max_connections` are served at once (the rest are closed at once), so a stuck or hostile client can
  neither hold the event loop nor pile up tasks.

Routes run on the event loop and must be quick: they read in-memory state only (readiness flags, the
metrics collection).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Final

import structlog

log = structlog.get_logger("nodewright.endpoints")

MAX_HEAD_BYTES: Final = 16 * 1024
DEFAULT_READ_TIMEOUT: Final = 10.0
DEFAULT_WRITE_TIMEOUT: Final = 10.0
DEFAULT_MAX_CONNECTIONS: Final = 64
TEXT: Final = "text/plain; charset=utf-8"
JSON: Final = "application/json; charset=utf-8"


def parse_bind_address(address: str) -> tuple[str, int] | None:
    """Split a Go-style `[host]:port` (`:8080`, `0.0.0.0:8080`, `[::1]:9090`) into what `start` takes;
    None for `0` or an empty address (the listener is disabled, as in controller-runtime). An empty host
    means every interface. The flags (`cli.flags.bind_address`) refuse bad addresses with the flag's name
    before anything starts; this check keeps other callers honest."""
    address = address.strip()
    if address in ("", "0"):
        return None
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"invalid bind address {address!r}: expected [host]:port")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"invalid bind address {address!r}: port out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return (host or "0.0.0.0", port)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = TEXT
    headers: Mapping[str, str] = field(default_factory=dict)


Route = Callable[[], Reply]


class BadRequest(ValueError):
    """The request line or headers are not HTTP/1.x."""


def parse_request_head(head: bytes) -> tuple[str, str]:
    """The method and the path (without the query) of a request head ending in a blank line."""
    request_line, _, _headers = head.partition(b"\r\n")
    parts = request_line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise BadRequest(f"not an HTTP/1.x request line: {request_line[:80]!r}")
    method, target = parts[0], parts[1]
    if not method.isalpha() or not method.isupper() or not target.startswith(b"/"):
        raise BadRequest(f"not an HTTP/1.x request line: {request_line[:80]!r}")
    return method.decode("ascii"), target.split(b"?", 1)[0].decode("latin-1")


def render_reply(reply: Reply, *, with_body: bool = True) -> bytes:
    try:
        reason = HTTPStatus(reply.status).phrase
    except ValueError:
        reason = "Status"
    lines = [
        f"HTTP/1.1 {reply.status} {reason}",
        f"Content-Type: {reply.content_type}",
        f"Content-Length: {len(reply.body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in reply.headers.items()),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + reply.body if with_body else head


def answer(routes: Mapping[str, Route], method: str, path: str) -> Reply:
    """What the server replies to `method path` (a route that raises is a 500)."""
    if method not in ("GET", "HEAD"):
        return Reply(405, b"method not allowed\n", headers={"Allow": "GET, HEAD"})
    route = routes.get(path)
    if route is None:
        return Reply(404, b"not found\n")
    try:
        return route()
    except Exception:  # a route's bug must cost one 500, not the server
        log.exception("endpoint failed", path=path)
        return Reply(500, b"internal error\n")


class EndpointServer:
    """Serves `routes` (path -> reply function) on one address; `start()`, then `stop()`."""

    def __init__(
        self,
        routes: Mapping[str, Route],
        *,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        self._routes = dict(routes)
        self._read_timeout = read_timeout
        self._write_timeout = write_timeout
        self._max_connections = max_connections
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port: int | None = None

    async def start(self, host: str, port: int) -> None:
        """Listen on host:port (port 0 picks a free one, then in `port`); OSError if the bind fails."""
        self._server = await asyncio.start_server(self._accept, host, port, limit=MAX_HEAD_BYTES)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._connections):
            task.cancel()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 5.0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._connections) >= self._max_connections or task is None:
            writer.close()
            return
        self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away or stalled: nothing to answer
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._read_timeout)
            method, path = parse_request_head(head)
        except (asyncio.LimitOverrunError, ValueError) as exc:
            reply, method = Reply(400, f"bad request: {exc}\n".encode()), "GET"
        else:
            reply = answer(self._routes, method, path)
        writer.write(render_reply(reply, with_body=method != "HEAD"))
        await asyncio.wait_for(writer.drain(), self._write_timeout)
