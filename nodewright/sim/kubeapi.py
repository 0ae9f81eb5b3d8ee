"""A deliberately small asyncio client for the simulator's own API calls.

The simulator creates thousands of nodes and watches a handful of pods; it needs raw JSON, bounded
concurrency and deadlines, not a generated client. It reads a kubeconfig's current context with either
client certificates (inline `*-data` or file references) or a bearer token, which is what `sim up` and
the e2e fixture produce. The production client lives in `nodewright.kube`; this one is for test tooling,
and its errors are that client's (`ApiError` is a `nodewright.kube.resources.ApiError`): one error type.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp
import yaml

from nodewright.kube import resources

JSON = dict[str, Any]
DEFAULT_TIMEOUT = 30.0


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


def _materialise(entry: Mapping[str, Any], key: str, workdir: Path, base: Path) -> Path | None:
    """Return a file path for `key` or `key-data` of a kubeconfig entry (data is written to workdir)."""
    data = entry.get(f"{key}-data")
    if data:
        path = workdir / key
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(base64.b64decode(data))
        return path
    value = entry.get(key)
    if value:
        candidate = Path(value)
        return candidate if candidate.is_absolute() else base / candidate
    return None


def load_kubeconfig(path: Path) -> tuple[str, ssl.SSLContext, dict[str, str]]:
    """Parse the current context: returns (server URL, TLS context, extra headers)."""
    config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    context_name = config.get("current-context")
    contexts = {c["name"]: c["context"] for c in config.get("contexts", [])}
    if context_name not in contexts:
        raise ValueError(f"{path}: current-context {context_name!r} not found")
    context = contexts[context_name]
    cluster = {c["name"]: c["cluster"] for c in config.get("clusters", [])}[context["cluster"]]
    user = {u["name"]: u["user"] for u in config.get("users", [])}.get(context.get("user"), {})
    base = Path(path).resolve().parent
    headers: dict[str, str] = {}
    # Key material given inline must pass through files (ssl only loads chains from paths); the
    # temporary directory is removed as soon as the context holds the loaded keys.
    with tempfile.TemporaryDirectory(prefix="nw-kubeconfig-") as tmp:
        workdir = Path(tmp)
        ctx = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ca = _materialise(cluster, "certificate-authority", workdir, base)
            if ca is not None:
                ctx.load_verify_locations(cafile=str(ca))
        cert = _materialise(user, "client-certificate", workdir, base)
        key = _materialise(user, "client-key", workdir, base)
        if cert is not None and key is not None:
            ctx.load_cert_chain(str(cert), str(key))
    if user.get("token"):
        headers["Authorization"] = f"Bearer {user['token']}"
    return str(cluster["server"]).rstrip("/"), ctx, headers


class KubeClient:
    """JSON over HTTPS to one API server, with a bounded number of requests in flight."""

    def __init__(
        self, kubeconfig: Path, *, max_in_flight: int = 48, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self.server, self._ssl, self._headers = load_kubeconfig(kubeconfig)
        self._limit = asyncio.Semaphore(max_in_flight)
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._max_in_flight = max_in_flight

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl, limit=self._max_in_flight + 4)
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        deadline_s: float | None = None,
    ) -> JSON:
        """One API call; returns the decoded JSON body or raises ApiError (any non-2xx status)."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        deadline = aiohttp.ClientTimeout(total=deadline_s or self._timeout)
        async with (
            self._limit,
            self._get_session().request(
                method, self.server + path, data=data, params=params, headers=headers, timeout=deadline
            ) as resp,
        ):
            text = await resp.text()
            if resp.status >= 300:
                raise ApiError(resp.status, method, path, text)
            return json.loads(text) if text else {}

    async def get(self, path: str, *, params: Mapping[str, str] | None = None) -> JSON:
        return await self.request("GET", path, params=params)

    async def get_text(self, path: str, *, deadline_s: float | None = None) -> str:
        """A GET of a non-JSON endpoint (e.g. the API server's `/metrics`); raises ApiError on non-2xx."""
        deadline = aiohttp.ClientTimeout(total=deadline_s or self._timeout)
        session = self._get_session()
        async with (
            self._limit,
            session.get(self.server + path, headers={"Accept": "text/plain"}, timeout=deadline) as resp,
        ):
            text = await resp.text()
            if resp.status >= 300:
                raise ApiError(resp.status, "GET", path, text)
            return text

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
        return await self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    async def strategic_patch(self, path: str, patch: JSON) -> JSON:
        return await self.request(
            "PATCH", path, body=patch, content_type="application/strategic-merge-patch+json"
        )

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
    ) -> AsyncIterator[JSON]:
        """Yield watch events until the server ends the stream (after about `timeout_s` seconds).

        A watch is a long request: the server closes it after `timeoutSeconds`, and the read deadline
        below (a bit longer) guards against a silent hang. An ERROR event (e.g. 410 Gone) is yielded to
        the caller, which must relist.
        """
        query = dict(params or {})
        query.update(
            watch="1",
            resourceVersion=resource_version,
            timeoutSeconds=str(timeout_s),
            allowWatchBookmarks="true",
        )
        deadline = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s + 15)
        async with self._get_session().get(self.server + path, params=query, timeout=deadline) as resp:
            if resp.status >= 300:
                raise ApiError(resp.status, "WATCH", path, await resp.text())
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)
