"""Ordering between NodeWrights: priority, sequencing, pause and disable (anchor §2.8).

NodeWrights are ordered by (priority, name), lowest first. A node is "ready" for NodeWright X when every
enabled NodeWright before X either does not target the node, or has `sequencing: node` and is complete
on that node, or has `sequencing: all` and is complete on ALL its nodes. Disabled NodeWrights never
block; paused ones do block successors on the nodes where they are incomplete (pausing must not let
later work overtake unfinished infrastructure).

`facts_for` builds one `NodeWrightFacts` per NodeWright from node objects (targeted node set, per-node
completion from the status labels); `blocking` decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nodewright.api import constants
from nodewright.api.models import NodeWright, Sequencing, Status
from nodewright.plan import selectors
from nodewright.plan.node import is_disabled, is_paused


@dataclass(frozen=True, slots=True)
class NodeWrightFacts:
    name: str
    priority: int
    sequencing: Sequencing
    disabled: bool
    paused: bool
    targets: frozenset[str]  # nodes the NodeWright selects
    complete_on: frozenset[str]  # nodes where it is complete

    @property
    def complete_everywhere(self) -> bool:
        return self.targets <= self.complete_on


def order(nodewrights: Iterable[NodeWrightFacts]) -> list[NodeWrightFacts]:
    return sorted(nodewrights, key=lambda n: (n.priority, n.name))


@dataclass(frozen=True, slots=True)
class Blocker:
    name: str
    reason: str


def blocking(nodewrights: Iterable[NodeWrightFacts], *, target: str, node: str) -> Blocker | None:
    """The first NodeWright that keeps `node` from being ready for `target`, or None if ready.

    A target missing from the facts is one `facts_for` left out because it is being deleted: its nodes
    only uninstall, which waits for nobody, so nothing blocks it.
    """
    ordered = order(nodewrights)
    names = [n.name for n in ordered]
    if target not in names:
        return None
    for nw in ordered[: names.index(target)]:
        if nw.disabled:
            continue
        if nw.sequencing == Sequencing.ALL:
            if not nw.complete_everywhere:
                left = len(nw.targets - nw.complete_on)
                return Blocker(nw.name, f"{nw.name} (sequencing: all) is incomplete on {left} node(s)")
        elif node in nw.targets and node not in nw.complete_on:
            suffix = " (paused)" if nw.paused else ""
            return Blocker(nw.name, f"{nw.name}{suffix} is not complete on this node")
    return None


def facts_for(nodewrights: Iterable[NodeWright], nodes: Iterable[Mapping[str, Any]]) -> list[NodeWrightFacts]:
    """The facts of every NodeWright from node objects: targets by `nodeSelectors`, completion by the
    node's status label `nodewright.io/status.<name>` (what the node controller writes).

    One builder for the rollout controller, the node controller and `nodewright plan`, so they can never
    disagree about who waits for whom. A NodeWright being deleted orders nothing any more: it only
    uninstalls, and must not hold back the NodeWrights after it.
    """
    nodes = list(nodes)
    facts = []
    for nw in nodewrights:
        if nw.metadata.deletion_timestamp:
            continue
        label = constants.status_label(nw.metadata.name)
        targets: set[str] = set()
        complete: set[str] = set()
        for node in nodes:
            labels = (node.get("metadata") or {}).get("labels") or {}
            if selectors.matches(nw.spec.node_selectors, labels):
                name = str(node["metadata"]["name"])
                targets.add(name)
                if labels.get(label) == Status.COMPLETE.value:
                    complete.add(name)
        facts.append(
            NodeWrightFacts(
                name=nw.metadata.name,
                priority=nw.spec.priority,
                sequencing=nw.spec.sequencing,
                disabled=is_disabled(nw),
                paused=is_paused(nw),
                targets=frozenset(targets),
                complete_on=frozenset(complete),
            )
        )
    return facts
