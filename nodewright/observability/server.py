"""The operator's metrics endpoint: `/metrics` in Prometheus text format (`endpoints.EndpointServer`).

The address comes from the `--metrics-bind-address` flag (default `:8080`, Go syntax: an empty host
means all interfaces; `0` disables the endpoint, as in controller-runtime). The handler renders the
`OperatorMetrics` on the event loop: collection only walks small in-memory maps (no per-node
series), so it is cheaper than a thread hop. `/healthz` is not served here -- the manager owns health.
"""

from __future__ import annotations

from typing import Final

from nodewright.observability.endpoints import EndpointServer, Reply
from nodewright.observability.exposition import CONTENT_TYPE
from nodewright.observability.metrics import OperatorMetrics

DEFAULT_METRICS_BIND_ADDRESS: Final = ":8080"


def metrics_reply(metrics: OperatorMetrics) -> Reply:
    # Every name is a legacy Prometheus name, so the classic 0.0.4 text format is what we emit; older
    # Prometheus servers do not know version=1.0.0.
    return Reply(200, metrics.render(), content_type=CONTENT_TYPE)


async def start_metrics_server(metrics: OperatorMetrics, host: str, port: int) -> EndpointServer:
    """Start serving `/metrics`; stop with `await server.stop()`. Port 0 picks a free port."""
    server = EndpointServer({"/metrics": lambda: metrics_reply(metrics)})
    await server.start(host, port)
    return server


def bound_port(server: EndpointServer) -> int:
    """The port a started server listens on (useful with port 0)."""
    if server.port is None:
        raise RuntimeError("metrics server is not listening")
    return server.port
