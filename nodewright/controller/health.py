"""`/healthz` and `/readyz` on the health-probe address (`--health-probe-bind-address`, default `:8081`).

- `/healthz` (liveness): 200 while the event loop answers. A wedged loop fails the probe by timing out,
  which is the failure worth a restart; a sick API server is not (restarting would only relist).
- `/readyz` (readiness): 200 once every informer has completed its first list. A standby with warm
  caches is ready too — it can take over at once. The JSON body says whether this replica leads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from nodewright.observability.endpoints import JSON, EndpointServer, Reply, parse_bind_address


class HealthServer:
    def __init__(self, address: str, *, status: Callable[[], dict[str, Any]]) -> None:
        self._bind = parse_bind_address(address)
        self._status = status
        self._server: EndpointServer | None = None
        self.port: int | None = None

    async def start(self) -> None:
        if self._bind is None:
            return
        server = EndpointServer({"/healthz": self._healthz, "/readyz": self._readyz})
        await server.start(*self._bind)
        self._server, self.port = server, server.port

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop()

    def _healthz(self) -> Reply:
        return Reply(200, b"ok")

    def _readyz(self) -> Reply:
        status = self._status()
        return Reply(200 if status.get("ready") else 503, json.dumps(status).encode(), content_type=JSON)
