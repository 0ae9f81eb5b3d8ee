"""The operator's metrics endpoint: an aiohttp app serving `/metrics` in Prometheus text format.

The address comes from the `--metrics-bind-address` flag (default `:8080`, Go syntax: an empty host
means all interfaces; `0` disables the endpoint, as in controller-runtime). The handler renders the
`OperatorMetrics` on the event loop: collection only walks small in-memory maps (no per-node
series), so it is cheaper than a thread hop. `/healthz` is not served here -- the manager owns health.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from nodewright.observability.exposition import CONTENT_TYPE
from nodewright.observability.metrics import OperatorMetrics

DEFAULT_METRICS_BIND_ADDRESS: Final = ":8080"
_METRICS_KEY: Final = web.AppKey("nodewright_metrics", OperatorMetrics)


def parse_bind_address(address: str) -> tuple[str, int] | None:
    """Split a Go-style `host:port` (`:8080`, `0.0.0.0:8080`, `[::1]:9090`); None for "0" (disabled)."""
    address = address.strip()
    if address == "0":
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


async def _metrics_handler(request: web.Request) -> web.Response:
    body = request.app[_METRICS_KEY].render()
    # Every name is a legacy Prometheus name, so the classic 0.0.4 text format is what we emit; older
    # Prometheus servers do not know version=1.0.0. The charset parameter needs the raw header.
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def make_metrics_app(metrics: OperatorMetrics) -> web.Application:
    app = web.Application()
    app[_METRICS_KEY] = metrics
    app.router.add_get("/metrics", _metrics_handler)
    return app


def add_metrics_route(app: web.Application, metrics: OperatorMetrics) -> None:
    """Serve `/metrics` from an existing app (e.g. when the manager shares one port with health probes)."""
    app[_METRICS_KEY] = metrics
    app.router.add_get("/metrics", _metrics_handler)


async def start_metrics_server(metrics: OperatorMetrics, host: str, port: int) -> web.AppRunner:
    """Start serving `/metrics`; stop with `await runner.cleanup()`. Port 0 picks a free port."""
    runner = web.AppRunner(make_metrics_app(metrics), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port a started runner listens on (useful with port 0)."""
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    raise RuntimeError("metrics server is not listening")
