"""The simulator's path-based façade over the one Kubernetes client, `nodewright.kube.client`.

The simulator (its kubelet, rebooter and fleet tooling), the demo, the benchmarks and the e2e tests
speak in API paths (`/api/v1/nodes/gpu-node-00001/status`) and raw JSON. This module keeps those names
and nothing of the transport: the kubeconfig is read by `nodewright.kube.config.load_kubeconfig`
(inline or file certificates, tokens, exec plugins, `tls-server-name`, proxies), and every request goes
through `nodewright.kube.client.KubeClient` (its aiohttp session and TLS, per-request deadlines, a
credential refreshed after a 401, the watch inactivity watchdog, Status bodies decoded into
`nodewright.kube.resources.ApiError`).

Three settings differ from the operator's, on purpose:

- No client-side write limiter (`qps=None`) and no retries (`max_retries=0`). The simulator *is* the
  load: it creates fleets of up to 10,000 nodes and writes the node and pod status of every simulated
  kubelet. At the operator's 50 writes per second, creating 2,000 nodes alone would take 40 s and the
  kubelets' status writes would queue behind each other, lagging the operator they are there to test.
  The test API server's own Priority and Fairness still protects it. Writes that must outlive an API
  server restart are retried by their callers (`kubelet.with_retries`), which know what is safe to repeat.
- At most `max_in_flight` requests at once (watches aside): the fleet tooling's concurrency bound.
- The connection may take the request's whole deadline (`connect_timeout=timeout`), not 10 s: on a
  loaded 2-core CI machine, with the simulator's own processes busy, a TLS handshake with the test API
  server can take longer.

Errors: a refusal raises this module's `ApiError`, a `nodewright.kube.resources.ApiError` (one error
type) that also keeps the body as text and names the call in its string. A watch's ERROR event (410
Gone: relist) is yielded to the caller as an event, as the API server sends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from nodewright.kube import client, resources
from nodewright.kube.config import load_kubeconfig

JSON = dict[str, Any]
DEFAULT_TIMEOUT: Final = 30.0
USER_AGENT: Final = f"{client.USER_AGENT} (simulator)"


class ApiError(resources.ApiError):
    """A non-2xx answer from the API server: the one error type of `nodewright.kube`
    (`resources.ApiError`: status, reason and message, decoded from the Status body), its body kept as
    text and its string naming the call."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None
        error = resources.api_error(status, payload if isinstance(payload, dict) else body)
        super().__init__(status, error.reason, error.message, body)
        self.args = (f"{method} {path}: HTTP {status}: {body[:500]}",)
        self.body: str = body

    @classmethod
    def of(cls, error: resources.ApiError, method: str, path: str) -> ApiError:
        """The error `nodewright.kube` raised for this call, with its body as text."""
        body = error.body
        text = body if isinstance(body, str) else json.dumps(body) if body else ""
        return cls(error.status, method, path, text)


@contextlib.contextmanager
def _naming_the_call(method: str, path: str) -> Iterator[None]:
    try:
        yield
    except ApiError:
        raise
    except resources.ApiError as err:
        raise ApiError.of(err, method, path) from err


def resource_label(path: str) -> str:
    """The metrics label of an API path, as `nodewright.kube` writes it: `nodes`, `nodes/status`,
    `nodewrights.nodewright.io`; a path outside the resource API (`/metrics`) is its own label."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) > 1:
        group, rest = parts[1], parts[3:]
    else:
        return path
    if len(rest) > 2 and rest[0] == "namespaces":
        rest = rest[2:]
    if not rest:
        return path
    label = f"{rest[0]}.{group}" if group else rest[0]
    return f"{label}/{rest[2]}" if len(rest) > 2 else label


def _error_event(err: resources.ApiError) -> JSON:
    """A watch's ERROR event as the API server sent it (`nodewright.kube` raises it as an error)."""
    status = err.body if isinstance(err.body, dict) else None
    return {
        "type": "ERROR",
        "object": status
        or {"kind": "Status", "code": err.status, "reason": err.reason, "message": err.message},
    }


class KubeClient:
    """API paths and raw JSON over `nodewright.kube.client.KubeClient`, unpaced (module docstring)."""

    def __init__(
        self, kubeconfig: Path, *, max_in_flight: int = 48, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        config = load_kubeconfig(kubeconfig)
        self.server = config.server
        self.kube = client.KubeClient(
            config,
            qps=None,
            max_retries=0,
            timeout=timeout,
            # A connection may take the whole deadline: on a loaded CI machine a TLS handshake to the
            # test API server can take longer than the operator's 10 s connect timeout.
            connect_timeout=timeout,
            max_connections=max_in_flight + 4,  # the watches a simulator component holds open
            user_agent=USER_AGENT,
        )
        self._limit = asyncio.Semaphore(max_in_flight)
        self._timeout = timeout

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.kube.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        """One API call; returns the decoded JSON body or raises ApiError (any error status)."""
        async with self._limit:
            with _naming_the_call(method, path):
                return await self.kube.request(
                    method,
                    path,
                    resource=resource_label(path),
                    params=params,
                    body=body,
                    content_type=content_type if body is not None else None,
                )

    async def get(self, path: str, *, params: Mapping[str, str] | None = None) -> JSON:
        return await self.request("GET", path, params=params)

    async def get_text(self, path: str, *, deadline_s: float | None = None) -> str:
        """A GET of a non-JSON endpoint (e.g. the API server's `/metrics`); raises ApiError on non-2xx."""
        async with self._limit:
            with _naming_the_call("GET", path):
                return await self.kube.get_text(path, timeout=deadline_s or self._timeout)

    async def create(self, path: str, body: JSON) -> JSON:
        return await self.request("POST", path, body=body)

    async def create_or_exists(self, path: str, body: JSON) -> bool:
        """POST; True if created, False if it already existed (HTTP 409)."""
        try:
            await self.create(path, body)
        except ApiError as err:
            if err.status == 409:
                return False
            raise
        return True

    async def delete(self, path: str, *, missing_ok: bool = True, body: JSON | None = None) -> None:
        try:
            await self.request("DELETE", path, body=body)
        except ApiError as err:
            if not (missing_ok and err.status == 404):
                raise

    async def merge_patch(self, path: str, patch: JSON) -> JSON:
        return await self.request("PATCH", path, body=patch, content_type=client.PatchType.MERGE)

    async def strategic_patch(self, path: str, patch: JSON) -> JSON:
        return await self.request("PATCH", path, body=patch, content_type=client.PatchType.STRATEGIC)

    async def list_all(self, path: str, *, params: Mapping[str, str] | None = None, page: int = 500) -> JSON:
        """Paginated list; returns {"items": [...], "resourceVersion": <list RV>}."""
        items: list[JSON] = []
        query = dict(params or {})
        query["limit"] = str(page)
        while True:
            result = await self.get(path, params=query)
            items.extend(result.get("items", []))
            meta = result.get("metadata", {})
            cont = meta.get("continue")
            if not cont:
                return {"items": items, "resourceVersion": meta.get("resourceVersion", "")}
            query["continue"] = cont

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        params: Mapping[str, str] | None = None,
        timeout_s: int = 60,
    ) -> AsyncGenerator[JSON]:
        """Yield watch events until the server ends the stream (after about `timeout_s` seconds).

        A watch is a long request: the server closes it after `timeoutSeconds`, and `nodewright.kube`'s
        inactivity watchdog (a bit longer) guards against a silent hang. An ERROR event (e.g. 410 Gone)
        is yielded to the caller, which must relist.
        """
        opened = self.kube.watch_path(
            path,
            resource=resource_label(path),
            params=params,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
            inactivity_timeout=timeout_s + 15.0,
        )
        with _naming_the_call("WATCH", path):
            async with opened as stream:
                while True:
                    try:
                        event = await anext(stream)
                    except StopAsyncIteration:
                        return
                    except resources.ApiError as err:
                        yield _error_event(err)
                        return
                    yield event
