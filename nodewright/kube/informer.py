"""Informers: a reflector, an indexed store and event handlers for one resource (and selector).

The contract (client-go's shared-informer doc comment, adapted to one event loop):

- The cache is eventually consistent with the API server. Per object, the states seen are a
  subsequence of its real states, in order; intermediate states may be skipped.
- Handlers are called synchronously, after the store is updated, in registration order, on the loop
  that runs the reflector. They must be cheap — map the change to work-queue keys and return; never
  await or do I/O in a handler.
- `on_add(obj)`, `on_update(old, new)`, `on_delete(obj)`. After a relist (410 Gone), objects that
  vanished get `on_delete` with their last known state (the final state is unknown), changed objects
  `on_update`, new ones `on_add`.
- A handler added after objects are cached first receives a synthetic `on_add` for each of them.
- `has_synced` becomes true after the first complete list has been stored; `wait_for_sync(timeout)`.
- Identity is the key (`namespace/name` or `name`), not the UID: a delete and re-create between
  two observations can look like an update.
- Cached objects are shared (and, with a transform, trimmed): treat them as read-only.

Most updates of a watched object change nothing a controller reads once the transform has trimmed it:
a kubelet's heartbeat moves `lastHeartbeatTime` (dropped from cached nodes), a pod's conditions move
(dropped from cached pods), a field manager touches `managedFields`. The cached object then differs
from the previous one in `metadata.resourceVersion` alone, and `only_version_changed(old, new)` says
so, for handlers that map updates to work (`Controller.watch`, the node controller) to skip them: a
reconcile reads the cache, and the cache says what it said before. Handlers that track
resourceVersions themselves (the pod expectations) still get every update.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from nodewright.kube.client import KubeClient
from nodewright.kube.clock import SYSTEM_CLOCK, Clock
from nodewright.kube.hooks import WatchMetrics
from nodewright.kube.reflector import LIST_PAGE_SIZE, Reflector, TransformFunc
from nodewright.kube.resources import JSON, Resource, object_key
from nodewright.kube.store import IndexFunc, Store

log = structlog.get_logger("nodewright.kube.informer")


@dataclass(frozen=True, slots=True)
class EventHandler:
    on_add: Callable[[JSON], None] | None = None
    on_update: Callable[[JSON, JSON], None] | None = None
    on_delete: Callable[[JSON], None] | None = None


class Informer:
    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: TransformFunc | None = None,
        name: str | None = None,
        page_size: int = LIST_PAGE_SIZE,
        inactivity_timeout: float = 70.0,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        metrics: WatchMetrics | None = None,
    ) -> None:
        self.resource = resource
        self.name = name or resource.label
        self.store = Store()
        self._handlers: list[EventHandler] = []
        self._synced = asyncio.Event()
        self.reflector = Reflector(
            client,
            resource,
            self,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            transform=transform,
            page_size=page_size,
            inactivity_timeout=inactivity_timeout,
            clock=clock,
            rng=rng,
            metrics=metrics,
        )

    # -- public API ---------------------------------------------------------------------------------

    def add_index(self, name: str, fn: IndexFunc) -> None:
        self.store.add_index(name, fn)

    def add_handler(
        self,
        *,
        on_add: Callable[[JSON], None] | None = None,
        on_update: Callable[[JSON, JSON], None] | None = None,
        on_delete: Callable[[JSON], None] | None = None,
    ) -> EventHandler:
        handler = EventHandler(on_add, on_update, on_delete)
        self._handlers.append(handler)
        if on_add is not None:
            for obj in self.store.values():
                on_add(obj)
        return handler

    def replay(self) -> None:
        """Every cached object as an add to every handler: what handlers registered on a process that
        starts with this cache would see (a standby that takes over fills its queues this way)."""
        for obj in self.store.values():
            self._dispatch_add(obj)

    def get(self, key: str) -> JSON | None:
        return self.store.get(key)

    def objects(self) -> list[JSON]:
        return self.store.values()

    def by_index(self, index: str, value: str) -> list[JSON]:
        return self.store.by_index(index, value)

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    @property
    def resource_version(self) -> str:
        return self.reflector.resource_version

    async def wait_for_sync(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Wait until the first list is stored; False if `timeout` seconds pass first."""
        try:
            async with asyncio.timeout(timeout):
                await self._synced.wait()
        except TimeoutError:
            return False
        return True

    async def run(self) -> None:
        """Run the reflector until cancelled."""
        await self.reflector.run()

    # -- ReflectorSink ------------------------------------------------------------------------------

    def replace(self, objects: list[JSON], resource_version: str) -> None:
        store = self.store
        fresh: dict[str, JSON] = {object_key(o): o for o in objects}
        for key in [k for k in store if k not in fresh]:
            old = store.remove(key)
            if old is not None:
                self._dispatch_delete(old)
        for key, obj in fresh.items():
            old = store.get(key)
            if old is None:
                store.upsert(key, obj)
                self._dispatch_add(obj)
            elif _rv(old) != _rv(obj):
                store.upsert(key, obj)
                self._dispatch_update(old, obj)
        self._synced.set()

    def upsert(self, obj: JSON) -> None:
        old = self.store.upsert(object_key(obj), obj)
        if old is None:
            self._dispatch_add(obj)
        else:
            self._dispatch_update(old, obj)

    def delete(self, obj: JSON) -> None:
        self.store.remove(object_key(obj))
        # Handlers get the object's final state from the event. A delete for an object we never saw
        # (created and deleted between list and watch) is still reported: handlers are level-triggered,
        # and a spurious delete of an absent key is harmless.
        self._dispatch_delete(obj)

    # -- dispatch -----------------------------------------------------------------------------------

    def _dispatch_add(self, obj: JSON) -> None:
        for handler in self._handlers:
            if handler.on_add is not None:
                self._call(handler.on_add, obj)

    def _dispatch_update(self, old: JSON, new: JSON) -> None:
        for handler in self._handlers:
            if handler.on_update is not None:
                self._call(handler.on_update, old, new)

    def _dispatch_delete(self, obj: JSON) -> None:
        for handler in self._handlers:
            if handler.on_delete is not None:
                self._call(handler.on_delete, obj)

    def _call(self, fn: Callable[..., None], *args: JSON) -> None:
        try:
            fn(*args)
        except Exception:
            # One buggy handler must not stop the cache (or other handlers) from seeing events.
            log.exception("informer event handler failed", informer=self.name)


def only_version_changed(old: JSON, new: JSON) -> bool:
    """True when `new` equals `old` but for `metadata.resourceVersion` (see the module docstring)."""
    if old is new:
        return True
    if old.keys() != new.keys():
        return False
    for field, value in new.items():
        if field != "metadata" and old[field] != value:
            return False
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    if old_meta.keys() != new_meta.keys():
        return False
    return all(key == "resourceVersion" or old_meta[key] == value for key, value in new_meta.items())


def _rv(obj: JSON) -> object:
    return (obj.get("metadata") or {}).get("resourceVersion")
