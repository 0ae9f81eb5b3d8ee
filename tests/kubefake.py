"""A scripted, in-memory Kubernetes API server (aiohttp) for unit tests of the kube layer.

It speaks enough of the REST protocol to exercise the real client code over real HTTP:

- collections of JSON objects addressed like the real API (`/api/v1/nodes`, `/api/v1/namespaces/ns/pods`,
  `/apis/<group>/<version>/...`), a global resourceVersion counter, and a history of events;
- GET (item and paginated list with `limit`/`continue`), POST (create, `generateName`, 409 AlreadyExists,
  `pods/<name>/eviction`, and `pods/<name>/binding` with its uid precondition and annotations), PUT
  (409 on a stale resourceVersion), PATCH (JSON merge patch; strategic merge of `status.conditions` by
  `type`), DELETE;
- watches: *live* (history after the requested resourceVersion, then changes as they happen, 410 if the
  resourceVersion is older than the compaction point) or *scripted* (the next queued `WatchScript` for that
  collection: literal lines, pauses, HTTP statuses, hangs);
- fault injection (`fail(...)`: the next N matching requests answer a given status, body and headers);
- a log of every request for assertions (`requests`).

Tests drive time through an injected `FakeClock`; this server never sleeps on its own.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from nodewright.kube.config import ClusterConfig, StaticToken

JSON = dict[str, Any]
Collection = tuple[str, str, str]  # (api prefix, namespace or "", plural)


@dataclass
class Req:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str


@dataclass
class Fault:
    method: str
    path_contains: str
    status: int
    body: Any
    headers: dict[str, str]
    times: int


@dataclass
class WatchScript:
    """A scripted watch response.

    steps: ("line", bytes) writes a raw line; ("event", type, obj) writes a JSON event; ("wait", Event)
    pauses until the asyncio.Event is set; ("hang",) never writes again (until the client goes away).
    status != 200 answers the request with that status and `body` instead of a stream.
    """

    steps: list[tuple[Any, ...]] = field(default_factory=list)
    status: int = 200
    body: Any = None


def status_body(code: int, reason: str, message: str) -> JSON:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}  # fmt: skip


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_patch(target: JSON, patch: JSON) -> JSON:
    """Merge patch, except that `status.conditions` merges by `type` (the node-status strategy)."""
    conditions = ((patch.get("status") or {}).get("conditions")) if isinstance(patch, dict) else None
    if conditions is None:
        result: JSON = merge_patch(target, patch)
        return result
    rest = copy.deepcopy(patch)
    del rest["status"]["conditions"]
    merged: JSON = merge_patch(target, rest)
    existing = list((merged.get("status") or {}).get("conditions") or [])
    by_type = {c["type"]: i for i, c in enumerate(existing)}
    for cond in conditions:
        if cond["type"] in by_type:
            existing[by_type[cond["type"]]] = {**existing[by_type[cond["type"]]], **cond}
        else:
            existing.append(cond)
    merged.setdefault("status", {})["conditions"] = existing
    return merged


class FakeKube:
    def __init__(self) -> None:
        self.rv = 100
        self.compacted = 0
        self.objects: dict[Collection, dict[str, JSON]] = {}
        self.history: dict[Collection, list[tuple[int, str, JSON]]] = {}
        self.scripts: dict[Collection, deque[WatchScript]] = {}
        self.watchers: dict[Collection, set[asyncio.Queue[JSON | None]]] = {}
        self.faults: list[Fault] = []
        self.requests: list[Req] = []
        self.evictions: dict[str, tuple[int, str]] = {}  # pod name -> (status, message) to answer
        # The node status strategy keeps metadata changes on `/status`; False plays an API server that
        # resets them (as the CRD status subresource does).
        self.status_keeps_metadata = True
        self.creation_timestamp = "2026-01-01T00:00:00Z"
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> FakeKube:
        app = web.Application(client_max_size=3 << 20)  # the API server's request limit (3 MiB)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        self.close_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    def config(self) -> ClusterConfig:
        return ClusterConfig(server=self.url, ssl_context=None, auth=StaticToken("test-token"))

    # -- state manipulation (as "another client") -----------------------------------------------------

    def put(self, collection: Collection, obj: JSON, *, event: str | None = None) -> JSON:
        """Create or replace an object, recording an ADDED/MODIFIED event (or `event`)."""
        name = obj["metadata"]["name"]
        existed = name in self.objects.setdefault(collection, {})
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", self.creation_timestamp)
        if collection[1]:
            meta["namespace"] = collection[1]
        return self._commit(collection, event or ("MODIFIED" if existed else "ADDED"), obj)

    def remove(self, collection: Collection, name: str) -> JSON | None:
        obj = self.objects.get(collection, {}).pop(name, None)
        if obj is not None:
            self._commit(collection, "DELETED", copy.deepcopy(obj), store=False)
        return obj

    def get(self, collection: Collection, name: str) -> JSON | None:
        return self.objects.get(collection, {}).get(name)

    def compact(self) -> None:
        """Forget history: any watch or continue from an older resourceVersion gets 410 Gone."""
        self.compacted = self.rv
        for items in self.history.values():
            items.clear()

    def silent_change(self, collection: Collection, obj: JSON) -> None:
        """Change state without notifying watchers (as if the events were lost)."""
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects.setdefault(collection, {})[obj["metadata"]["name"]] = obj

    def silent_remove(self, collection: Collection, name: str) -> None:
        self.rv += 1
        self.objects.get(collection, {}).pop(name, None)

    def bookmark(self, collection: Collection) -> None:
        self.rv += 1
        event = {
            "type": "BOOKMARK",
            "object": {"kind": "Bookmark", "metadata": {"resourceVersion": str(self.rv)}},
        }
        for q in self.watchers.get(collection, ()):
            q.put_nowait(event)

    def close_watches(self) -> None:
        for queues in self.watchers.values():
            for q in queues:
                q.put_nowait(None)

    def script(self, collection: Collection, *scripts: WatchScript) -> None:
        self.scripts.setdefault(collection, deque()).extend(scripts)

    def fail(
        self,
        method: str,
        path_contains: str,
        status: int,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
        times: int = 1,
    ) -> None:
        self.faults.append(Fault(method.upper(), path_contains, status, body, headers or {}, times))

    def watch_requests(self) -> list[Req]:
        return [r for r in self.requests if r.query.get("watch") in ("1", "true")]

    def count(self, method: str, path_contains: str = "", *, ends: str = "") -> int:
        return sum(
            1
            for r in self.requests
            if r.method == method and path_contains in r.path and r.path.endswith(ends)
        )

    def _commit(self, collection: Collection, kind: str, obj: JSON, *, store: bool = True) -> JSON:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if store:
            self.objects.setdefault(collection, {})[obj["metadata"]["name"]] = obj
        snapshot = copy.deepcopy(obj)
        event: JSON = {"type": kind, "object": snapshot}
        self.history.setdefault(collection, []).append((self.rv, kind, snapshot))
        for q in self.watchers.get(collection, ()):
            q.put_nowait(event)
        return copy.deepcopy(obj)

    # -- HTTP ---------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        query = dict(request.query)
        self.requests.append(Req(request.method, request.path, query, body, request.content_type))
        for fault in self.faults:
            if fault.times > 0 and fault.method == request.method and fault.path_contains in request.path:
                fault.times -= 1
                return web.json_response(fault.body or status_body(fault.status, "Injected", "injected"),
                                         status=fault.status, headers=fault.headers)  # fmt: skip
        collection, name, sub = parse_path(request.path)
        if request.method == "GET" and name is None and query.get("watch") in ("1", "true"):
            return await self._watch(request, collection, query)
        if request.method == "GET":
            return self._get(collection, name, query)
        if request.method == "POST" and sub == "eviction" and name is not None:
            return self._evict(collection, name)
        if request.method == "POST" and sub == "binding" and name is not None:
            return self._bind(collection, name, body or {})
        if request.method == "POST":
            return self._create(collection, body or {})
        assert name is not None
        if request.method == "PUT":
            return self._replace(collection, name, body or {})
        if request.method == "PATCH":
            if sub == "status" and isinstance(body, dict):
                body = {k: v for k, v in body.items() if k != "spec"}  # `/status` never changes spec
                if not self.status_keeps_metadata:
                    body.pop("metadata", None)
            return self._patch(collection, name, body, request.content_type)
        if request.method == "DELETE":
            return self._delete(collection, name, body)
        return web.json_response(status_body(405, "MethodNotAllowed", "no"), status=405)

    def _get(self, collection: Collection, name: str | None, query: dict[str, str]) -> web.Response:
        items = self.objects.get(collection, {})
        if name is not None:
            if name not in items:
                return web.json_response(status_body(404, "NotFound", f"{name} not found"), status=404)
            return web.json_response(items[name])
        limit = int(query.get("limit") or 0)
        start, snapshot = 0, self.rv
        token = query.get("continue")
        if token:
            snap, offset = token.split(":")
            if int(snap) < self.compacted:
                return web.json_response(status_body(410, "Expired", "continue token expired"), status=410)
            start, snapshot = int(offset), int(snap)
        ordered = [items[k] for k in sorted(items)]
        selector = query.get("labelSelector")
        if selector:
            ordered = [o for o in ordered if _matches(o, selector)]
        page = ordered[start : start + limit] if limit else ordered[start:]
        meta: JSON = {"resourceVersion": str(snapshot)}
        if limit and start + limit < len(ordered):
            meta["continue"] = f"{snapshot}:{start + limit}"
        return web.json_response({"kind": "List", "apiVersion": "v1", "metadata": meta, "items": page})

    def _create(self, collection: Collection, body: JSON) -> web.Response:
        meta = body.setdefault("metadata", {})
        meta.pop("uid", None)  # like kube-apiserver: a created object always gets a fresh uid
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if meta["name"] in self.objects.get(collection, {}):
            return web.json_response(status_body(409, "AlreadyExists", f"{meta['name']} already exists"),
                                     status=409)  # fmt: skip
        return web.json_response(self.put(collection, body), status=201)

    def _replace(self, collection: Collection, name: str, body: JSON) -> web.Response:
        current = self.objects.get(collection, {}).get(name)
        if current is None:
            return web.json_response(status_body(404, "NotFound", f"{name} not found"), status=404)
        sent_rv = body.get("metadata", {}).get("resourceVersion")
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            return web.json_response(status_body(409, "Conflict", "the object has been modified"), status=409)
        body["metadata"]["uid"] = current["metadata"]["uid"]
        return web.json_response(self.put(collection, body))

    def _patch(self, collection: Collection, name: str, body: Any, content_type: str) -> web.Response:
        current = self.objects.get(collection, {}).get(name)
        if current is None:
            return web.json_response(status_body(404, "NotFound", f"{name} not found"), status=404)
        sent_rv = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            return web.json_response(status_body(409, "Conflict", "the object has been modified"), status=409)
        sent_uid = (body.get("metadata") or {}).get("uid") if isinstance(body, dict) else None
        if sent_uid and sent_uid != current["metadata"]["uid"]:
            # kube-apiserver: `metadata.uid: Invalid value: ...: field is immutable` (a uid precondition).
            return web.json_response(
                status_body(422, "Invalid", "metadata.uid: field is immutable"), status=422
            )
        if content_type == "application/strategic-merge-patch+json":
            updated = strategic_patch(current, body)
        elif content_type == "application/merge-patch+json":
            updated = merge_patch(current, body)
        else:
            return web.json_response(status_body(415, "UnsupportedMediaType", content_type), status=415)
        return web.json_response(self.put(collection, updated))

    def _delete(self, collection: Collection, name: str, body: JSON | None) -> web.Response:
        current = self.objects.get(collection, {}).get(name)
        if current is None:
            return web.json_response(status_body(404, "NotFound", f"{name} not found"), status=404)
        uid = ((body or {}).get("preconditions") or {}).get("uid")
        if uid and uid != current["metadata"]["uid"]:
            return web.json_response(status_body(409, "Conflict", "uid precondition failed"), status=409)
        return web.json_response(self.remove(collection, name))

    def _bind(self, collection: Collection, name: str, body: JSON) -> web.Response:
        """kube-apiserver's BindingREST: uid precondition, once only, annotations copied onto the pod."""
        current = self.objects.get(collection, {}).get(name)
        if current is None:
            return web.json_response(status_body(404, "NotFound", f"pods {name} not found"), status=404)
        meta = body.get("metadata") or {}
        if meta.get("uid") and meta["uid"] != current["metadata"]["uid"]:
            return web.json_response(status_body(409, "Conflict", "uid precondition failed"), status=409)
        if (current.get("spec") or {}).get("nodeName"):
            message = f"pod {name} is already assigned to node {current['spec']['nodeName']!r}"
            return web.json_response(status_body(409, "Conflict", message), status=409)
        updated = copy.deepcopy(current)
        updated.setdefault("spec", {})["nodeName"] = (body.get("target") or {}).get("name")
        updated["metadata"].setdefault("annotations", {}).update(meta.get("annotations") or {})
        self.put(collection, updated)
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)

    def _evict(self, collection: Collection, name: str) -> web.Response:
        if name not in self.objects.get(collection, {}):
            return web.json_response(status_body(404, "NotFound", f"pods {name} not found"), status=404)
        status, message = self.evictions.get(name, (201, ""))
        if status != 201:
            return web.json_response(status_body(status, "TooManyRequests", message), status=status)
        self.remove(collection, name)
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)

    async def _watch(
        self, request: web.Request, collection: Collection, query: dict[str, str]
    ) -> web.StreamResponse:
        scripts = self.scripts.get(collection)
        if scripts:
            return await self._scripted(request, scripts.popleft())
        rv = int(query.get("resourceVersion") or 0)
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        if rv and rv < self.compacted:
            gone = {"type": "ERROR", "object": status_body(410, "Expired", f"too old resource version: {rv}")}
            await resp.write(json.dumps(gone).encode() + b"\n")
            return resp
        queue: asyncio.Queue[JSON | None] = asyncio.Queue()
        for event_rv, kind, obj in self.history.get(collection, []):
            if event_rv > rv:
                queue.put_nowait({"type": kind, "object": obj})
        self.watchers.setdefault(collection, set()).add(queue)
        try:
            while (event := await queue.get()) is not None:
                await resp.write(json.dumps(event).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.watchers[collection].discard(queue)
        return resp

    async def _scripted(self, request: web.Request, script: WatchScript) -> web.StreamResponse:
        if script.status != 200:
            return web.json_response(script.body, status=script.status)
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        try:
            for step in script.steps:
                if step[0] == "line":
                    await resp.write(step[1])
                elif step[0] == "event":
                    await resp.write(json.dumps({"type": step[1], "object": step[2]}).encode() + b"\n")
                elif step[0] == "wait":
                    await step[1].wait()
                elif step[0] == "hang":
                    await asyncio.Event().wait()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return resp


def parse_path(path: str) -> tuple[Collection, str | None, str | None]:
    parts = [p for p in path.split("/") if p]
    if parts[0] == "api":
        prefix, rest = "/".join(parts[:2]), parts[2:]
    else:
        prefix, rest = "/".join(parts[:3]), parts[3:]
    namespace = ""
    if rest and rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    return (prefix, namespace, plural), name, sub


def _matches(obj: JSON, selector: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


NODES_C: Collection = ("api/v1", "", "nodes")
LEASES_C: Collection = ("apis/coordination.k8s.io/v1", "nodewright-system", "leases")


def pods_c(namespace: str) -> Collection:
    return ("api/v1", namespace, "pods")


def node(name: str, labels: dict[str, str] | None = None, **extra: Any) -> JSON:
    obj: JSON = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}
    obj.update(extra)
    return obj


def names(objs: Iterable[JSON]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)
