"""`sequencing.facts_for`: the one builder the controllers and `nodewright plan` share."""

from __future__ import annotations

from typing import Any

from nodewright.api import constants
from nodewright.api.models import NodeWright
from nodewright.plan.sequencing import blocking, facts_for


def _nw(name: str, priority: int, *, sequencing: str = "node", deleting: bool = False) -> NodeWright:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return NodeWright.model_validate(
        {
            "apiVersion": constants.API_VERSION,
            "kind": "NodeWright",
            "metadata": meta,
            "spec": {
                "priority": priority,
                "sequencing": sequencing,
                "nodeSelectors": {"matchLabels": {"pool": "gpu"}},
                "packages": {"pkg": {"version": "1.0.0", "image": "r/p"}},
            },
        }
    )


def _node(name: str, pool: str, **statuses: str) -> dict[str, Any]:
    labels = {"pool": pool, **{constants.status_label(k): v for k, v in statuses.items()}}
    return {"metadata": {"name": name, "labels": labels}}


def test_targets_by_selector_and_completion_by_status_label() -> None:
    nodes = [_node("a", "gpu", infra="complete"), _node("b", "gpu"), _node("c", "cpu", infra="complete")]
    (infra,) = facts_for([_nw("infra", 10)], nodes)
    assert infra.targets == {"a", "b"}
    assert infra.complete_on == {"a"}  # "c" is complete but not targeted


def test_a_deleting_nodewright_holds_nothing_back() -> None:
    nodes = [_node("a", "gpu")]
    nws = [_nw("infra", 10, sequencing="all"), _nw("app", 200)]
    assert blocking(facts_for(nws, nodes), target="app", node="a") is not None
    leaving = [_nw("infra", 10, sequencing="all", deleting=True), _nw("app", 200)]
    assert blocking(facts_for(leaving, nodes), target="app", node="a") is None


def test_a_deleting_nodewright_is_itself_blocked_by_nobody() -> None:
    # Its nodes only uninstall; the rollout controller asks about it until the finalizer is released.
    nodes = [_node("a", "gpu")]
    nws = [_nw("infra", 10, sequencing="all"), _nw("app", 200, deleting=True)]
    assert blocking(facts_for(nws, nodes), target="app", node="a") is None
