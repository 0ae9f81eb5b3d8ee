"""A read-your-writes overlay over an informer: the newest objects this process wrote.

Right after a write, the informer cache still holds the old object until the watch event arrives, and
a reconcile that ran on the stale copy would redo work. Every successful write records the returned
object here, and reads prefer it until the cache has caught up (by resourceVersion, which for
etcd-backed objects is the etcd revision and increases monotonically).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nodewright.kube.informer import Informer
from nodewright.kube.resources import JSON


def _rv(obj: JSON) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class WriteThrough:
    """The newest objects this process wrote, until the informer cache has caught up."""

    def __init__(self, informer: Informer, transform: Any = None) -> None:
        self._nodes = informer
        self._transform = transform or (lambda obj: obj)
        self._written: dict[str, JSON] = {}

    def record(self, node: JSON) -> None:
        """Remember a node object returned by a successful write (full or trimmed)."""
        trimmed = self._transform(node)
        name = str(trimmed["metadata"]["name"])
        current = self._written.get(name)
        if current is None or _rv(trimmed) >= _rv(current):
            self._written[name] = trimmed

    def get(self, name: str) -> JSON | None:
        cached = self._nodes.get(name)
        written = self._written.get(name)
        if written is None:
            return cached
        if cached is None:
            # Deleted from the cache after our write: the node is gone.
            self._written.pop(name, None)
            return None
        if _rv(cached) >= _rv(written):
            self._written.pop(name, None)
            return cached
        return written

    def newest(self, cached: Iterable[JSON]) -> list[JSON]:
        """`cached` (the informer's objects) with each object this process wrote since in its place:
        what `get` gives for each, in one pass that looks up only the few names with a write."""
        written = self._written
        if not written:
            return list(cached)
        return [
            (self.get(str(obj["metadata"]["name"])) or obj) if obj["metadata"]["name"] in written else obj
            for obj in cached
        ]

    def forget(self, name: str) -> None:
        self._written.pop(name, None)
