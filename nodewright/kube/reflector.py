"""The reflector: keeps a cache in step with the API server by list-then-watch, forever.

The protocol it implements (client-go `tools/cache/reflector.go` is the model):

1. **List** the collection in pages (`limit`/`continue`). NodeWright lists with resourceVersion ""
   (a consistent read) rather than client-go's "0" (any cached version): with several API servers an
   RV "0" list can return data *older* than what this process has already seen (after a restart, or
   from a lagging API server), and recent API servers serve consistent lists from their watch cache
   anyway. Pagination stays on, so a 10,000-node list never has to be one response. Pages are of
   `LIST_PAGE_SIZE` (25) objects, not client-go's 500: a page is decoded whole before the informer's
   transform trims it, and what its body and objects occupied stays in the allocator's pools between the
   trimmed copies kept from it. A 500-node page of GPU nodes (~2.7 MiB of JSON) left the idle operator
   13 MiB above what it holds, a 100-node page 2.5 MiB (docs/benchmarks.md "Idle memory"); 25 nodes are
   ~130 KiB of JSON, ~0.3 MiB decoded, for 40 list requests per 1,000 nodes at start and after a
   relist. If a `continue` token expires mid-list (410), the list restarts from the beginning.
2. The list replaces the cache: objects that vanished are deleted (handlers get `on_delete` with the
   last known state — client-go's "DeletedFinalStateUnknown"), changed ones (new resourceVersion)
   updated, new ones added, unchanged ones left alone.
3. **Watch** from the list's resourceVersion with `allowWatchBookmarks=true` and a randomised
   `timeoutSeconds` (300-600 s, so a fleet of reflectors does not reconnect in lockstep). The
   resourceVersion advances on *every* event, bookmarks included: a bookmark is the server telling us
   "nothing you watch changed up to RV n", and resuming from it after a disconnect is what keeps a
   quiet watch from falling out of the server's history window (etcd compaction) and into a 410.
4. **Reconnect** after the stream ends: a clean end (the server timeout) resumes immediately from the
   last resourceVersion; a connection error, a non-200 status (checked before reading: some clients
   skip this on streams), an inactivity timeout (no byte for ~70 s — a half-open TCP connection) or
   a very short watch resumes from the last resourceVersion after a backoff.
5. **410 Gone** — as the HTTP status of the watch request or as an `ERROR` event with code 410 —
   means our resourceVersion is older than the server's history: events were lost, so relist (step 1)
   and let the replace (step 2) synthesise the deletes and updates we missed.
6. **Backoff**: jittered exponential, 0.8 s doubling to 30 s, reset after 2 minutes without failure
   (client-go's numbers: about 0.22 requests per second per reflector while the API server is sick).
7. **Malformed lines** are logged and skipped (see `WatchStream`).

The reflector never gives up; it runs until cancelled. Time comes from the injected clock, and the
randomness from an injected `random.Random`, so all of this is tested on a fake clock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Final, Protocol

import aiohttp
import structlog

from nodewright.kube.client import KubeClient, WatchInactive
from nodewright.kube.clock import SYSTEM_CLOCK, Clock
from nodewright.kube.hooks import NoopWatchMetrics, WatchMetrics
from nodewright.kube.resources import JSON, ApiError, Gone, Resource, TooManyRequests

LIST_PAGE_SIZE: Final = 25
RESTART_REASONS: Final[tuple[str, ...]] = (
    "short-watch",
    "gone",
    "throttled",
    "inactive",
    "connection",
    "error",
)
"""Reasons of `nodewright_watch_restarts_total` (besides `http-<status>` for other API errors); their
series start at 0 with the reflector."""
EVENT_TYPES: Final[tuple[str, ...]] = ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")

log = structlog.get_logger("nodewright.kube.reflector")


class ReflectorSink(Protocol):
    """Where a reflector delivers what it sees (the informer)."""

    def replace(self, objects: list[JSON], resource_version: str) -> None: ...
    def upsert(self, obj: JSON) -> None: ...
    def delete(self, obj: JSON) -> None: ...


@dataclass
class Backoff:
    """Jittered exponential backoff that resets after `reset_after` seconds without a failure."""

    clock: Clock = SYSTEM_CLOCK
    rng: random.Random = field(default_factory=random.Random)
    initial: float = 0.8
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 1.0
    reset_after: float = 120.0
    _next: float = 0.0
    _last: float | None = None

    def next_delay(self) -> float:
        now = self.clock.monotonic()
        if self._last is None or now - self._last > self.reset_after:
            self._next = self.initial
        self._last = now
        delay = min(self.cap, self._next * (1.0 + self.jitter * self.rng.random()))
        self._next = min(self.cap, self._next * self.factor)
        return delay


class Reflector:
    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        sink: ReflectorSink,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: TransformFunc | None = None,
        page_size: int = LIST_PAGE_SIZE,
        min_watch_timeout: int = 300,
        max_watch_timeout: int = 600,
        inactivity_timeout: float = 70.0,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        metrics: WatchMetrics | None = None,
    ) -> None:
        self.client = client
        self.resource = resource
        self.sink = sink
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.transform = transform
        self.page_size = page_size
        self.watch_timeout = (min_watch_timeout, max_watch_timeout)
        self.inactivity_timeout = inactivity_timeout
        self.clock = clock
        self.rng = rng or random.Random()
        self.metrics = metrics or NoopWatchMetrics()
        self.metrics.init_resource(
            resource=resource.label, restart_reasons=RESTART_REASONS, event_types=EVENT_TYPES
        )
        self.backoff = Backoff(clock=clock, rng=self.rng)
        self.resource_version = ""
        self.lists = 0
        self.watches = 0
        self._log = log.bind(resource=resource.label, namespace=namespace, selector=label_selector)

    async def run(self) -> None:
        """List and watch until cancelled."""
        need_list = True
        while True:
            try:
                if need_list:
                    await self.list_and_replace()
                    need_list = False
                healthy = await self.watch_once()
                if healthy:
                    continue
                self._restart("short-watch")
            except Gone as exc:
                self._log.info("resourceVersion expired, relisting", rv=self.resource_version, error=str(exc))
                self._restart("gone")
                if need_list:  # the list itself failed with 410 twice: back off before trying again
                    await self.clock.sleep(self.backoff.next_delay())
                need_list = True
                continue
            except TooManyRequests:
                self._restart("throttled")
            except WatchInactive:
                self._log.warning("watch inactive, reconnecting", rv=self.resource_version)
                self._restart("inactive")
            except ApiError as exc:
                self._log.warning("watch or list failed", status=exc.status, error=str(exc))
                self._restart(f"http-{exc.status}")
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                self._log.warning("watch connection failed", error=repr(exc), rv=self.resource_version)
                self._restart("connection")
            except Exception:
                # A bug (say, a transform choking on an odd object) must not silently end the
                # reflector and freeze the cache: log it, and rebuild the cache from a fresh list.
                self._log.exception("reflector error, relisting", rv=self.resource_version)
                self._restart("error")
                need_list = True
            await self.clock.sleep(self.backoff.next_delay())

    def _restart(self, reason: str) -> None:
        self.metrics.restart(resource=self.resource.label, reason=reason)

    async def list_and_replace(self) -> None:
        """A full paginated list (restarting if the continue token expires), then replace the cache."""
        self.metrics.relist(resource=self.resource.label)
        items: list[JSON] = []
        token: str | None = None
        transform = self.transform
        while True:
            try:
                page = await self.client.list_page(
                    self.resource,
                    namespace=self.namespace,
                    label_selector=self.label_selector,
                    field_selector=self.field_selector,
                    limit=self.page_size,
                    continue_token=token,
                )
            except Gone:
                if token is None:
                    raise
                self._log.info("list continue token expired, restarting the list")
                items, token = [], None
                continue
            page_items = page.get("items") or []
            items.extend([transform(o) for o in page_items] if transform else page_items)
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                break
        self.resource_version = str(meta.get("resourceVersion") or "")
        self.lists += 1
        self.sink.replace(items, self.resource_version)
        self._log.info("listed", objects=len(items), rv=self.resource_version)

    async def watch_once(self) -> bool:
        """One watch connection; True if it was healthy (ended by the server after a while or with events)."""
        timeout = self.rng.randint(*self.watch_timeout)
        started = self.clock.monotonic()
        events = 0
        self.watches += 1
        async with self.client.watch(
            self.resource,
            namespace=self.namespace,
            resource_version=self.resource_version,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=timeout,
            inactivity_timeout=self.inactivity_timeout,
        ) as stream:
            async for event in stream:
                events += 1
                self.handle_event(event)
        return events > 0 or self.clock.monotonic() - started >= 1.0

    def handle_event(self, event: JSON) -> None:
        """Apply one decoded watch event (the hot path: keep it lean)."""
        kind = event["type"]
        obj = event.get("object")
        if not isinstance(obj, dict):
            self._log.warning("watch event without an object skipped", event_type=kind)
            return
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        self.metrics.event(resource=self.resource.label, event_type=kind)
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            self._log.warning("unknown watch event type skipped", event_type=kind)
            return
        if self.transform is not None:
            obj = self.transform(obj)
        if kind == "DELETED":
            self.sink.delete(obj)
        else:
            self.sink.upsert(obj)
        if rv:
            self.resource_version = rv


class TransformFunc(Protocol):
    def __call__(self, obj: JSON, /) -> JSON: ...
