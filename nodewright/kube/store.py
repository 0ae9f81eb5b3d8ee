"""An indexed object cache (client-go's `cache.Indexer`, minus the locking: one event loop owns it).

Objects are stored by key (`namespace/name`, or `name` for cluster-scoped objects). An index is a
function from an object to the index values it belongs under (e.g. "pods by node": `spec.nodeName`);
`by_index(name, value)` returns the objects under a value. Index functions must be pure and cheap: they
run on every change. Readers must treat returned objects as read-only — they are the cached objects
themselves (copying 10,000 nodes per reconcile would defeat the point of a cache).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from nodewright.kube.resources import JSON

IndexFunc = Callable[[JSON], Iterable[str]]


class Store:
    def __init__(self) -> None:
        self._items: dict[str, JSON] = {}
        self._indexers: dict[str, IndexFunc] = {}
        self._indices: dict[str, dict[str, set[str]]] = {}

    def add_index(self, name: str, fn: IndexFunc) -> None:
        """Register an index; existing objects are indexed immediately."""
        if name in self._indexers:
            raise ValueError(f"index {name!r} already exists")
        self._indexers[name] = fn
        index: dict[str, set[str]] = {}
        self._indices[name] = index
        for key, obj in self._items.items():
            for value in fn(obj):
                index.setdefault(value, set()).add(key)

    def get(self, key: str) -> JSON | None:
        return self._items.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def keys(self) -> list[str]:
        return list(self._items)

    def values(self) -> list[JSON]:
        return list(self._items.values())

    def by_index(self, name: str, value: str) -> list[JSON]:
        return [self._items[key] for key in self._indices[name].get(value, ())]

    def upsert(self, key: str, obj: JSON) -> JSON | None:
        """Store `obj`; returns the previous object under `key`, if any."""
        old = self._items.get(key)
        self._items[key] = obj
        if self._indexers:
            if old is not None:
                self._unindex(key, old)
            self._index(key, obj)
        return old

    def remove(self, key: str) -> JSON | None:
        old = self._items.pop(key, None)
        if old is not None and self._indexers:
            self._unindex(key, old)
        return old

    def _index(self, key: str, obj: JSON) -> None:
        for name, fn in self._indexers.items():
            index = self._indices[name]
            for value in fn(obj):
                index.setdefault(value, set()).add(key)

    def _unindex(self, key: str, obj: JSON) -> None:
        for name, fn in self._indexers.items():
            index = self._indices[name]
            for value in fn(obj):
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]
