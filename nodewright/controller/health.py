"""`/healthz` and `/readyz` on the health-probe address (`--health-probe-bind-address`, default `:8081`).

- `/healthz` (liveness): 200 while the event loop answers. A wedged loop fails the probe by timing out,
  which is the failure worth a restart; a sick API server is not (restarting would only relist).
- `/readyz` (readiness): 200 once every informer has completed its first list. A standby with warm
  caches is ready too — it can take over at once. The JSON body says whether this replica leads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web


def parse_bind_address(address: str) -> tuple[str, int] | None:
    """`:8081` → ("0.0.0.0", 8081); `127.0.0.1:0` → ephemeral port; `0` or "" → disabled (None)."""
    if address in ("", "0"):
        return None
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class HealthServer:
    def __init__(self, address: str, *, status: Callable[[], dict[str, Any]]) -> None:
        self._bind = parse_bind_address(address)
        self._status = status
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> None:
        if self._bind is None:
            return
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._bind[0], self._bind[1])
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, request: web.Request) -> web.Response:
        status = self._status()
        return web.json_response(status, status=200 if status.get("ready") else 503)
