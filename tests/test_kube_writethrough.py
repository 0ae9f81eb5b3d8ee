"""The read-your-writes overlay: one object and the whole cache read the same newest objects."""

from __future__ import annotations

from typing import Any

from nodewright.kube.client import KubeClient
from nodewright.kube.config import ClusterConfig
from nodewright.kube.credentials import StaticToken
from nodewright.kube.informer import Informer
from nodewright.kube.resources import NODES
from nodewright.kube.writethrough import WriteThrough


def _node(name: str, rv: int, mark: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(rv), "labels": {"mark": mark}}}


def test_newest_is_get_for_every_cached_object_in_cache_order() -> None:
    informer = Informer(
        KubeClient(ClusterConfig(server="https://127.0.0.1:1", ssl_context=None, auth=StaticToken("t"))),
        NODES,
    )
    view = WriteThrough(informer)
    for name, rv in (("a", 5), ("b", 5), ("c", 5), ("d", 5)):
        informer.upsert(_node(name, rv))
    assert view.newest(informer.objects()) == informer.objects()  # nothing written: the cache itself
    view.record(_node("a", 7, "ours"))  # ahead of the cache: ours is newest
    view.record(_node("b", 3, "stale"))  # behind the cache: the cache is newest
    view.record(_node("gone", 9, "ours"))  # not cached: not listed
    newest = view.newest(informer.objects())
    assert [n["metadata"]["name"] for n in newest] == ["a", "b", "c", "d"]
    assert newest == [view.get(n["metadata"]["name"]) for n in informer.objects()]
    assert newest[0]["metadata"]["labels"]["mark"] == "ours"
    assert newest[1]["metadata"]["labels"]["mark"] == ""
