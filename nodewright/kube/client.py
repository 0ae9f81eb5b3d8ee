"""`KubeClient`: the operator's only HTTP client to the Kubernetes API.

One `aiohttp.ClientSession` for the process. Every request has a deadline: unary calls a `total`
timeout; watch streams a connect timeout, a `sock_read` timeout and an inactivity watchdog on the
injected clock (no bytes for `inactivity_timeout` seconds → the connection is closed and the caller
reconnects), because a half-open TCP connection otherwise hangs a watch forever.

Writes (every verb but GET) pass a client-side token bucket (`qps`/`burst`, like client-go's), so a
reconcile storm cannot flood the API server; API Priority and Fairness is the server-side backstop.
`qps=None` turns the bucket off, and `max_retries=0` the retries below: the simulator does both
(`nodewright.sim.kubeapi`), because it *is* the load (10,000 kubelets' node and pod status writes, or
the creation of a whole fleet) against its own test API server, and must not be paced like a
controller; it does its own retrying where a write must outlive an API-server restart.

Retries (jittered exponential backoff on the injected clock, bounded by `max_retries`):

- 429 Too Many Requests: always retried (APF rejected the request before executing it), honouring
  `Retry-After` (header or `details.retryAfterSeconds`). Eviction is the exception: there 429 means a
  PodDisruptionBudget forbids the eviction right now, a result for the caller, not a transient error.
- Connection refused / DNS failure (the request never left): always retried.
- 5xx, timeouts and connections dropped mid-request: retried only for requests that are safe to
  repeat (GET, PUT with a resourceVersion, DELETE, merge/strategic patches, and creates of a named
  object). A create retried after a lost response may meet `409 AlreadyExists` for the object its first
  attempt created; then the existing object is read and returned.
- 409 Conflict on an update means the object changed since it was read: `modify()` re-reads it, calls
  the caller's mutate callback on the fresh copy and tries again.
- 401 Unauthorized: the credential is told (`Auth.expire()`); a token file is re-read, an exec plugin
  runs again, and the request is repeated once with the new credential, as client-go does.

`call_deadline` (the CLI's `--request-timeout`) bounds one call with all its retries: each attempt's
timeout is cut to what is left, and no retry starts past it.

Connection settings come from `ClusterConfig` (kubeconfig parity, `nodewright.kube.config`): the TLS
context, `tls-server-name` as the SNI and certificate name, and an HTTP(S) proxy (HTTPS to the API
server through a CONNECT tunnel) with its Proxy-Authorization.

Each request is reported once to `RequestMetrics.observe(verb, resource, code, seconds)` (code is the
HTTP status, or "<error>" when no response arrived), the shape of client-go's
`rest_client_requests_total`.

Patches: `patch_node_metadata` uses a JSON merge patch (null deletes a key). `patch_node_conditions`
uses a *strategic* merge patch on `nodes/status`: `NodeStatus.conditions` merges by `type`, so only our
conditions change; a JSON merge patch would replace the whole list and wipe the kubelet's Ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import io
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import aiohttp
import structlog

from nodewright.kube.clock import SYSTEM_CLOCK, Clock
from nodewright.kube.config import ClusterConfig
from nodewright.kube.hooks import NoopRequestMetrics, RequestMetrics
from nodewright.kube.ratelimit import TokenBucket
from nodewright.kube.resources import (
    EVENTS,
    JSON,
    NODES,
    PODS,
    ApiError,
    Conflict,
    NotFound,
    Resource,
    TooManyRequests,
    api_error,
)
from nodewright.observability.logging import note_request

log = structlog.get_logger("nodewright.kube.client")

USER_AGENT: Final = "nodewright/0.1.0"
READ_BUFSIZE: Final = 2**21  # 2 MiB: etcd's request limit is ~1.5 MiB, a watch line holds one object
_TAIL_CHUNK: Final = 64 * 1024  # a log streamed for its tail is read this much at a time


class PatchType(StrEnum):
    MERGE = "application/merge-patch+json"
    STRATEGIC = "application/strategic-merge-patch+json"
    JSON_PATCH = "application/json-patch+json"
    APPLY = "application/apply-patch+yaml"


class EvictionOutcome(StrEnum):
    ACCEPTED = "accepted"
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget forbids it now; message names the PDB
    NOT_FOUND = "not-found"  # the pod is already gone
    FAILED = "failed"  # anything else (e.g. 500: several PDBs select the pod)


@dataclass(frozen=True, slots=True)
class EvictionResult:
    outcome: EvictionOutcome
    status: int
    message: str = ""
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[JSON]
    resource_version: str


@dataclass
class _Attempts:
    transport_errors: int = 0


class WatchInactive(TimeoutError):
    """No bytes arrived on a watch stream for the inactivity timeout."""


def _micro_time(now: dt.datetime) -> str:
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class KubeClient:
    """Typed helpers over the Kubernetes REST API, returning plain dicts (see module docstring)."""

    config: ClusterConfig
    qps: float | None = 50.0
    """Writes per second the client sends at most (None: no client-side limit, see the module docstring)."""
    burst: int = 100
    timeout: float = 30.0
    connect_timeout: float = 10.0
    max_retries: int = 5
    call_deadline: float | None = None
    """Seconds one call may take with all its retries (None: `max_retries` attempts of `timeout` each).
    A command line's `--request-timeout` sets it: the user's deadline is the whole call's."""
    backoff_base: float = 0.2
    backoff_cap: float = 10.0
    max_retry_after: float = 60.0
    clock: Clock = SYSTEM_CLOCK
    metrics: RequestMetrics = field(default_factory=NoopRequestMetrics)
    user_agent: str = USER_AGENT
    rng: random.Random = field(default_factory=random.Random)
    field_manager: str = "nodewright"
    max_connections: int = 100
    """Connections open to the API server at once (requests beyond it wait for a free one)."""
    _session: aiohttp.ClientSession | None = field(default=None, init=False)
    _writes: TokenBucket | None = field(init=False)

    def __post_init__(self) -> None:
        self._writes = (
            None if self.qps is None else TokenBucket(qps=self.qps, burst=self.burst, clock=self.clock)
        )

    # -- lifecycle ----------------------------------------------------------------------------------

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                ssl=self.config.ssl_context if self.config.ssl_context is not None else True,
                limit=self.max_connections,
                enable_cleanup_closed=True,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                read_bufsize=READ_BUFSIZE,
                headers={"User-Agent": self.user_agent, "Accept": "application/json"},
                raise_for_status=False,
            )
        return self._session

    async def _headers(self, content_type: str | None) -> dict[str, str]:
        headers: dict[str, str] = {}
        authorization = await self.config.auth.authorization()
        if authorization:
            headers["Authorization"] = authorization
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _request_kwargs(self) -> dict[str, Any]:
        """What every request adds for the cluster's connection settings (kubeconfig fields)."""
        kwargs: dict[str, Any] = {}
        if self.config.tls_server_name:
            kwargs["server_hostname"] = self.config.tls_server_name  # SNI and certificate name check
        proxy = self.config.proxy
        if proxy is not None:
            kwargs["proxy"] = proxy.url
            if proxy.authorization:
                kwargs["proxy_headers"] = {"Proxy-Authorization": proxy.authorization}
        return kwargs

    def _refused_credentials(self, status: int) -> bool:
        """On a 401, let the credential refresh itself; True when a retry may carry a new one."""
        return status == 401 and self.config.auth.expire()

    # -- the request loop ---------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        resource: str,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        repeatable: bool | None = None,
        retry_429: bool = True,
        verb: str | None = None,
        attempts: _Attempts | None = None,
    ) -> JSON:
        """One API call with retries; returns the decoded JSON body or raises `ApiError`."""
        method = method.upper()
        if repeatable is None:
            repeatable = method in ("GET", "PUT", "DELETE")
        attempts = attempts or _Attempts()
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        if data is not None and content_type is None:
            content_type = "application/json"
        give_up_at = None if self.call_deadline is None else self.clock.monotonic() + self.call_deadline
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            if method != "GET" and self._writes is not None:
                await self._writes.wait()
            budget = self._attempt_timeout(give_up_at)
            try:
                call = (method, path, resource, params, data, content_type, verb or method)
                return await self._once_authenticated(*call, timeout=budget)
            except TooManyRequests as exc:
                if not retry_429 or last:
                    raise
                failure: Exception = exc
                delay = min(exc.retry_after or self._backoff(attempt), self.max_retry_after)
            except ApiError as exc:
                if exc.status < 500 or not repeatable or last:
                    raise
                failure, delay = exc, self._backoff(attempt)
            except aiohttp.ClientConnectorError as exc:
                if last:
                    raise
                failure, delay = exc, self._backoff(attempt)
            except (aiohttp.ClientError, TimeoutError) as exc:
                attempts.transport_errors += 1
                if not repeatable or last:
                    raise
                failure, delay = exc, self._backoff(attempt)
            if self._out_of_time(give_up_at, delay):
                raise failure
            log.debug("retrying request", method=method, path=path, attempt=attempt + 1, delay=delay)
            await self.clock.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _once_authenticated(
        self,
        method: str,
        path: str,
        resource: str,
        params: Mapping[str, str] | None,
        data: bytes | None,
        content_type: str | None,
        verb: str,
        *,
        timeout: float,  # noqa: ASYNC109 - the attempt's own deadline, handed to aiohttp
    ) -> JSON:
        """`_once`, and once more when a 401 made the credential refresh itself (a rotated token file,
        an exec plugin's token revoked before its expiry)."""
        call = (method, path, resource, params, data, content_type, verb)
        try:
            return await self._once(*call, timeout=timeout)
        except ApiError as exc:
            if not self._refused_credentials(exc.status):
                raise
        return await self._once(*call, timeout=timeout)

    def _attempt_timeout(self, give_up_at: float | None) -> float:
        """An attempt's own deadline: `timeout`, cut to what is left of the call's deadline."""
        if give_up_at is None:
            return self.timeout
        return max(0.001, min(self.timeout, give_up_at - self.clock.monotonic()))

    def _out_of_time(self, give_up_at: float | None, delay: float) -> bool:
        """Whether a retry after `delay` would start past the call's deadline (then the error stands)."""
        return give_up_at is not None and self.clock.monotonic() + delay >= give_up_at

    def _backoff(self, attempt: int) -> float:
        base = min(self.backoff_cap, self.backoff_base * float(2**attempt))
        return base * (0.5 + self.rng.random() / 2)

    async def _once(
        self,
        method: str,
        path: str,
        resource: str,
        params: Mapping[str, str] | None,
        data: bytes | None,
        content_type: str | None,
        verb: str,
        *,
        timeout: float,  # noqa: ASYNC109 - the attempt's own deadline, handed to aiohttp
    ) -> JSON:
        started = time.perf_counter()
        code = "<error>"
        try:
            headers = await self._headers(content_type)
            async with self._http().request(
                method,
                self.config.server + path,
                params=params,
                data=_body(data),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=min(timeout, self.connect_timeout)),
                **self._request_kwargs(),
            ) as resp:
                code = str(resp.status)
                text = await resp.text()
                retry_after = resp.headers.get("Retry-After")
        finally:
            self.metrics.observe(
                verb=verb, resource=resource, code=code, seconds=time.perf_counter() - started
            )
            note_request(method)  # a write makes the reconcile's summary line an info line
        payload = _decode(text)
        if int(code) >= 400:
            raise api_error(int(code), _with_retry_after(payload, retry_after))
        return payload if isinstance(payload, dict) else {}

    # -- reads --------------------------------------------------------------------------------------

    async def get_text(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        timeout: float = 10.0,  # noqa: ASYNC109 - the HTTP request's own deadline, handed to aiohttp
        keep_last: int | None = None,
    ) -> str:
        """GET a body that is not JSON (pod logs are text/plain), once, within `timeout` seconds.

        With `keep_last`, only the body's last `keep_last` bytes are held while it streams in: a pod's
        log is the package's output, and `tailLines` bounds lines, not bytes (one line of a gigabyte
        is one line), so a caller that keeps a tail reads in bounded memory whatever the package wrote.
        Raises `ApiError` (or a subclass) for HTTP >= 400 and aiohttp/timeout errors on transport
        failures; no retries: callers of text endpoints are best effort.
        """
        resource = "pods/log" if path.endswith("/log") else "text"
        started = time.perf_counter()
        code = "<error>"
        try:
            headers = await self._headers(None)
            headers["Accept"] = "text/plain, */*"
            async with self._http().get(
                self.config.server + path,
                params=params,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=min(timeout, self.connect_timeout)),
                **self._request_kwargs(),
            ) as resp:
                code = str(resp.status)
                if keep_last is None or resp.status >= 400:
                    text = await resp.text(errors="replace")
                else:
                    text = (await _read_tail(resp.content, keep_last)).decode(errors="replace")
        finally:
            self.metrics.observe(
                verb="GET", resource=resource, code=code, seconds=time.perf_counter() - started
            )
        if int(code) >= 400:
            self._refused_credentials(int(code))
            raise api_error(int(code), _decode(text))
        return text

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> JSON:
        return await self.request("GET", resource.item_path(name, namespace), resource=resource.label)

    async def list_page(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = 500,
        continue_token: str | None = None,
        resource_version: str | None = None,
    ) -> JSON:
        params: dict[str, str] = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        if limit:
            params["limit"] = str(limit)
        if continue_token:
            params["continue"] = continue_token
        elif resource_version is not None:
            params["resourceVersion"] = resource_version
        return await self.request(
            "GET", resource.collection_path(namespace), resource=resource.label, params=params, verb="LIST"
        )

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = 500,
    ) -> ListResult:
        """A consistent paginated list (`limit`/`continue`); the RV is the list's, for a following watch."""
        items: list[JSON] = []
        token: str | None = None
        while True:
            page = await self.list_page(
                resource,
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                limit=limit,
                continue_token=token,
            )
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if not token:
                return ListResult(items, str(meta.get("resourceVersion") or ""))

    # -- writes -------------------------------------------------------------------------------------

    async def create(self, resource: Resource, body: JSON, *, namespace: str | None = None) -> JSON:
        meta = body.get("metadata") or {}
        named = bool(meta.get("name"))
        attempts = _Attempts()
        try:
            return await self.request(
                "POST",
                resource.collection_path(namespace or meta.get("namespace")),
                resource=resource.label,
                body=body,
                params={"fieldManager": self.field_manager},
                repeatable=named,
                attempts=attempts,
            )
        except Conflict as exc:
            if not (exc.already_exists and named and attempts.transport_errors):
                raise
            # Our first attempt most likely created it and the response was lost.
            return await self.get(resource, meta["name"], namespace=namespace or meta.get("namespace"))

    async def replace(self, resource: Resource, body: JSON, *, namespace: str | None = None) -> JSON:
        """PUT; carries `metadata.resourceVersion` from `body`, so a stale write fails with `Conflict`."""
        meta = body.get("metadata") or {}
        return await self.request(
            "PUT",
            resource.item_path(meta["name"], namespace or meta.get("namespace")),
            resource=resource.label,
            body=body,
            params={"fieldManager": self.field_manager},
        )

    async def delete(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        grace_period: int | None = None,
        uid: str | None = None,
        propagation: str | None = None,
    ) -> JSON:
        body: JSON = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        if propagation is not None:
            body["propagationPolicy"] = propagation
        return await self.request(
            "DELETE", resource.item_path(name, namespace), resource=resource.label, body=body
        )

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
        subresource: str | None = None,
    ) -> JSON:
        params = {"fieldManager": self.field_manager}
        if patch_type is PatchType.APPLY:
            params["force"] = "true"
        return await self.request(
            "PATCH",
            resource.item_path(name, namespace, subresource),
            resource=resource.label,
            body=patch,
            content_type=patch_type.value,
            params=params,
            # Merge-style patches set fields to values: applying one twice is harmless.
            repeatable=patch_type is not PatchType.JSON_PATCH,
        )

    async def modify(
        self,
        resource: Resource,
        name: str,
        mutate: Callable[[JSON], JSON | None],
        *,
        namespace: str | None = None,
        attempts: int = 5,
    ) -> JSON:
        """Read-modify-write with optimistic concurrency.

        `mutate(obj)` gets the current object and returns the desired one (or None: nothing to change,
        the current object is returned). The PUT carries the read resourceVersion; on `409 Conflict`
        the object is re-read and `mutate` runs again on the fresh copy, up to `attempts` times.
        """
        for attempt in range(attempts):
            current = await self.get(resource, name, namespace=namespace)
            desired = mutate(current)
            if desired is None:
                return current
            desired.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
            try:
                return await self.replace(resource, desired, namespace=namespace)
            except Conflict:
                if attempt == attempts - 1:
                    raise
                log.debug("conflict, re-reading", resource=resource.label, name=name, attempt=attempt + 1)
        raise AssertionError("unreachable")  # pragma: no cover

    async def patch_status(
        self,
        resource: Resource,
        name: str,
        patch: JSON,
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
    ) -> JSON:
        """Patch the `status` subresource (CRDs with `subresources.status` ignore status on the main one)."""
        return await self.patch(
            resource, name, patch, namespace=namespace, patch_type=patch_type, subresource="status"
        )

    # -- node helpers -------------------------------------------------------------------------------

    async def patch_node_metadata(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        unschedulable: bool | None = None,
        resource_version: str | None = None,
    ) -> JSON:
        """One merge patch for labels, annotations and cordon; a None value deletes the key.

        With `resource_version` the patch only applies to that version of the node (409 otherwise).
        """
        metadata: JSON = {}
        if labels:
            metadata["labels"] = dict(labels)
        if annotations:
            metadata["annotations"] = dict(annotations)
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        patch: JSON = {"metadata": metadata} if metadata else {}
        if unschedulable is not None:
            # null rather than false when uncordoning: the field is omitempty, as kubectl uncordon leaves it.
            patch["spec"] = {"unschedulable": True if unschedulable else None}
        return await self.patch(NODES, name, patch, patch_type=PatchType.MERGE)

    async def patch_node_conditions(self, name: str, conditions: Sequence[JSON]) -> JSON:
        """Add or update node conditions by `type`, leaving every other condition untouched."""
        return await self.patch(
            NODES,
            name,
            {"status": {"conditions": list(conditions)}},
            patch_type=PatchType.STRATEGIC,
            subresource="status",
        )

    async def patch_node_status_metadata(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        conditions: Sequence[JSON] = (),
        resource_version: str | None = None,
    ) -> JSON:
        """Labels, annotations and conditions in ONE strategic merge patch on `nodes/status`.

        With `resource_version` the patch only applies to that version of the node (409 otherwise).

        The node status strategy resets `spec` on this subresource but keeps metadata changes (the
        NodeRestriction admission plugin polices kubelets' label changes made this way). Callers must
        check the answer with `metadata_applied` and fall back to `patch_node_metadata` if a future API
        server drops them. A None value deletes the key (strategic merge treats null as delete).
        """
        metadata: JSON = {}
        if labels:
            metadata["labels"] = dict(labels)
        if annotations:
            metadata["annotations"] = dict(annotations)
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        patch: JSON = {"metadata": metadata} if metadata else {}
        if conditions:
            patch["status"] = {"conditions": list(conditions)}
        return await self.patch(NODES, name, patch, patch_type=PatchType.STRATEGIC, subresource="status")

    # -- pods ---------------------------------------------------------------------------------------

    async def create_pod(self, namespace: str, body: JSON) -> JSON:
        return await self.create(PODS, body, namespace=namespace)

    async def delete_pod(
        self, namespace: str, name: str, *, grace_period: int | None = None, uid: str | None = None
    ) -> bool:
        """Delete a pod; False if it was already gone (or replaced by another pod of the same name)."""
        try:
            await self.delete(PODS, name, namespace=namespace, grace_period=grace_period, uid=uid)
        except NotFound:
            return False
        except Conflict:
            if uid is None:
                raise
            return False  # uid precondition failed: the pod we meant no longer exists
        return True

    async def bind_pod(
        self, namespace: str, name: str, *, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        """Bind an unscheduled pod to `node` (POST `pods/<name>/binding`, what a scheduler does).

        kube-apiserver applies the Binding only to the pod with `uid` (409 otherwise) that is not bound
        yet (409 "already assigned"), and copies the Binding's annotations onto the pod in the same
        write: the pod starts with them or not at all.
        """
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": dict(annotations)},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.request(
            "POST",
            PODS.item_path(name, namespace, "binding"),
            resource="pods/binding",
            body=body,
            params={"fieldManager": self.field_manager},
            # A lost answer retried gets 409 "already assigned": the caller re-reads the pod.
            repeatable=True,
        )

    async def evict(
        self, namespace: str, pod: str, *, grace_period: int | None = None, dry_run: bool = False
    ) -> EvictionResult:
        """policy/v1 Eviction: the PDB-respecting way to remove a pod from a node being drained."""
        body: JSON = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace},
        }
        if grace_period is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_period}
        params = {"dryRun": "All"} if dry_run else None
        try:
            await self.request(
                "POST",
                PODS.item_path(pod, namespace, "eviction"),
                resource="pods/eviction",
                body=body,
                params=params,
                # 500 here usually means a broken configuration (several PDBs select the pod): report it.
                repeatable=False,
                retry_429=False,  # 429 = a PodDisruptionBudget forbids it now: an answer, not a hiccup
            )
        except NotFound as exc:
            return EvictionResult(EvictionOutcome.NOT_FOUND, 404, exc.message)
        except TooManyRequests as exc:
            return EvictionResult(EvictionOutcome.BLOCKED, 429, exc.message, exc.retry_after)
        except ApiError as exc:
            return EvictionResult(EvictionOutcome.FAILED, exc.status, exc.message)
        return EvictionResult(EvictionOutcome.ACCEPTED, 201)

    # -- events -------------------------------------------------------------------------------------

    async def create_event(
        self,
        namespace: str,
        *,
        involved: JSON,
        reason: str,
        message: str,
        event_type: str = "Normal",
        action: str = "",
        component: str = "nodewright-operator",
        instance: str = "",
        now: dt.datetime | None = None,
    ) -> JSON:
        """A core/v1 Event about `involved` (an object or an ObjectReference dict)."""
        meta = involved.get("metadata") or involved
        reference = {
            "apiVersion": involved.get("apiVersion", ""),
            "kind": involved.get("kind", ""),
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "uid": meta.get("uid", ""),
        }
        stamp = _micro_time(now or dt.datetime.now(dt.UTC))
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{reference['name'] or 'nodewright'}.", "namespace": namespace},
            "involvedObject": {k: v for k, v in reference.items() if v},
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "action": action or reason,
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": instance or component,
            "firstTimestamp": stamp[:19] + "Z",
            "lastTimestamp": stamp[:19] + "Z",
            "eventTime": stamp,
            "count": 1,
        }
        return await self.create(EVENTS, body, namespace=namespace)

    # -- watch --------------------------------------------------------------------------------------

    def watch(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
        inactivity_timeout: float = 70.0,
    ) -> contextlib.AbstractAsyncContextManager[WatchStream]:
        """Open a watch; yields a `WatchStream` of event dicts. Non-200 → `ApiError` (with the body)."""
        params: dict[str, str] = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        return self.watch_path(
            resource.collection_path(namespace),
            resource=resource.label,
            params=params,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            allow_bookmarks=allow_bookmarks,
            inactivity_timeout=inactivity_timeout,
        )

    @contextlib.asynccontextmanager
    async def watch_path(
        self,
        path: str,
        *,
        resource: str,
        params: Mapping[str, str] | None = None,
        resource_version: str | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
        inactivity_timeout: float = 70.0,
    ) -> AsyncIterator[WatchStream]:
        """`watch` of a collection given by its path (`resource` is the metrics label); `params` are
        further query parameters (selectors)."""
        query = {"watch": "1"}
        if resource_version:
            query["resourceVersion"] = resource_version
        if allow_bookmarks:
            query["allowWatchBookmarks"] = "true"
        if timeout_seconds is not None:
            query["timeoutSeconds"] = str(timeout_seconds)
        query.update(params or {})
        started = time.perf_counter()
        code = "<error>"
        # sock_read is a backstop behind the watchdog: bookmarks arrive about once a minute.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.connect_timeout, sock_read=inactivity_timeout + 30.0
        )
        try:
            headers = await self._headers(None)
            resp = await self._http().get(
                self.config.server + path,
                params=query,
                headers=headers,
                timeout=timeout,
                **self._request_kwargs(),
            )
            code = str(resp.status)
        finally:
            self.metrics.observe(
                verb="WATCH", resource=resource, code=code, seconds=time.perf_counter() - started
            )
        try:
            if resp.status != 200:
                self._refused_credentials(resp.status)  # the caller's next watch has a fresh credential
                text = await _read_error_body(resp, self.timeout)
                raise api_error(resp.status, _decode(text))
            stream = WatchStream(resp, clock=self.clock, inactivity_timeout=inactivity_timeout)
            async with stream:
                yield stream
        finally:
            resp.release()
            resp.close()


async def _read_error_body(resp: aiohttp.ClientResponse, deadline: float) -> str:
    try:
        async with asyncio.timeout(deadline):
            return await resp.text()
    except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
        return ""


def _with_retry_after(payload: JSON | str, header: str | None) -> JSON | str:
    """Fold a `Retry-After: <seconds>` header into the Status body's `details.retryAfterSeconds`."""
    if not header or not header.strip().isdigit():
        return payload
    body: JSON = payload if isinstance(payload, dict) else {"message": payload}
    details = body.setdefault("details", {})
    if isinstance(details, dict):
        details.setdefault("retryAfterSeconds", int(header.strip()))
    return body


LARGE_BODY: Final = 1 << 20
"""Bytes above which a request body is streamed from a buffer: aiohttp warns (ResourceWarning) that a
larger raw `bytes` body may hold the event loop. A fresh buffer per attempt, as a retry reads it again."""


def _body(data: bytes | None) -> bytes | io.BytesIO | None:
    return io.BytesIO(data) if data is not None and len(data) > LARGE_BODY else data


def _decode(text: str) -> JSON | str:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


class WatchStream:
    """Events of one watch connection, as dicts `{"type": ..., "object": {...}}`.

    - Lines that are not JSON objects with a `type` are logged and skipped (`malformed` counts them).
    - An `ERROR` event raises the `ApiError` its Status describes (`Gone` for code 410: relist).
    - End of stream (server `timeoutSeconds`, or the server going away cleanly) ends iteration.
    - A watchdog on the injected clock closes the connection after `inactivity_timeout` seconds without
      a byte, and iteration raises `WatchInactive`.
    """

    def __init__(self, resp: aiohttp.ClientResponse, *, clock: Clock, inactivity_timeout: float) -> None:
        self._resp = resp
        self._clock = clock
        self._inactivity = inactivity_timeout
        self._lines = 0
        self._timed_out = False
        self._watchdog: asyncio.Task[None] | None = None
        self.malformed = 0

    async def __aenter__(self) -> WatchStream:
        self._watchdog = asyncio.create_task(self._watch_activity(), name="watch-inactivity")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog

    async def _watch_activity(self) -> None:
        while True:
            seen = self._lines
            await self._clock.sleep(self._inactivity)
            if self._lines == seen:
                self._timed_out = True
                self._resp.close()
                return

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> JSON:
        while True:
            line = await self._readline()
            if not line:
                raise StopAsyncIteration
            event = self.decode(line)
            if event is not None:
                return event

    async def _readline(self) -> bytes:
        try:
            line = await self._resp.content.readline()
        except (aiohttp.ClientError, TimeoutError) as exc:
            if self._timed_out:
                raise WatchInactive(f"no data for {self._inactivity}s") from exc
            raise
        self._lines += 1
        if not line and self._timed_out:
            raise WatchInactive(f"no data for {self._inactivity}s")
        return line

    def decode(self, line: bytes) -> JSON | None:
        """Parse one line; None for blank or malformed lines; raises for ERROR events."""
        if line.isspace():
            return None
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            self.malformed += 1
            log.warning("malformed watch line skipped", line=line[:200].decode(errors="replace"))
            return None
        if event["type"] == "ERROR":
            status = event.get("object") or {}
            code = status.get("code") if isinstance(status, dict) else None
            raise api_error(int(code) if isinstance(code, int) else 500, status)
        return event


def metadata_applied(
    obj: JSON, *, labels: Mapping[str, str | None] | None, annotations: Mapping[str, str | None] | None
) -> bool:
    """Whether `obj` (a write's answer) carries these label/annotation values (None: key absent)."""
    meta = obj.get("metadata") or {}
    for wanted, have in ((labels, meta.get("labels") or {}), (annotations, meta.get("annotations") or {})):
        for key, value in (wanted or {}).items():
            if have.get(key) != value:
                return False
    return True


async def _read_tail(stream: aiohttp.StreamReader, keep: int) -> bytes:
    """The last `keep` bytes of `stream`, read to its end in chunks; never more than `keep` plus one
    chunk held at once."""
    held = bytearray()
    async for chunk in stream.iter_chunked(_TAIL_CHUNK):
        held += chunk
        if len(held) > keep:
            del held[: len(held) - keep]
    return bytes(held)
