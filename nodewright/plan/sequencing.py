"""Ordering between NodeWrights: priority, sequencing, pause and disable (anchor §2.8).

NodeWrights are ordered by (priority, name), lowest first. A node is "ready" for NodeWright X when every
enabled NodeWright before X either does not target the node, or has `sequencing: node` and is complete
on that node, or has `sequencing: all` and is complete on ALL its nodes. Disabled NodeWrights never
block; paused ones do block successors on the nodes where they are incomplete (pausing must not let
later work overtake unfinished infrastructure).

`facts_for` builds one `NodeWrightFacts` per NodeWright from node objects (targeted node set, per-node
completion); `blocking` decides.

Completion is for the earlier NodeWright's *current* spec (`plan.rollout.complete_for_spec`, the rule
the status roll-up uses): its status label corrected by its state annotation. The label lags a spec
edit -- it says `complete` from the previous generation until the node controller has planned the node
again -- so when an earlier and a later NodeWright are edited together, reading the label alone let the
later one start on nodes where the earlier one had not even begun its new spec. Reading the state
costs a decode per (NodeWright, node): `CompletionMemo` keeps what each node's state says until its
state annotation text or the NodeWright's spec changes (the label is read every time), so a pass over
10,000 nodes decodes only the annotations that changed since the last one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nodewright.api import constants
from nodewright.api.models import NodeWright, Sequencing, Status
from nodewright.api.nodestate import MalformedNodeState, decode
from nodewright.plan import drift, selectors
from nodewright.plan.node import is_disabled, is_paused
from nodewright.plan.rollout import complete_for_spec, spec_fingerprint, work_pending


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


NEVER_COMPLETE: frozenset[str] = frozenset(
    s.value for s in Status if not complete_for_spec(s, needs_work=False)
)
"""Status label values under which no state makes a node complete (`erroring`, `waiting`, ...): no
decode needed. Under any other label (`complete`, `drifted`, `in_progress`, none, or a value this
operator does not know, which says nothing) the node is complete exactly when its state has no work
pending for the spec: `complete_for_spec` answered without parsing the label."""


class _SpecCompletion:
    """One NodeWright's spec and, per node, (state annotation text, work pending for that spec)."""

    __slots__ = ("entries", "key", "label_key", "nodewright", "state_key")

    def __init__(self, nodewright: NodeWright, key: object) -> None:
        self.nodewright = nodewright
        self.key = key
        self.label_key = constants.status_label(nodewright.metadata.name)
        self.state_key = constants.state_annotation(nodewright.metadata.name)
        self.entries: dict[str, tuple[str | None, bool]] = {}

    def complete(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
        if labels.get(self.label_key) in NEVER_COMPLETE:
            return False
        text = annotations.get(self.state_key)
        cached = self.entries.get(name)
        if cached is None or cached[0] != text:
            cached = self.entries[name] = (text, self._work_pending(text))
        return not cached[1]

    def _work_pending(self, text: str | None) -> bool:
        try:
            return work_pending(self.nodewright, decode(text) if text is not None else None)
        except MalformedNodeState:
            return True  # unreadable: never complete (the rollout reports the node StateMalformed)


def _spec_key(nodewright: NodeWright) -> object:
    """What completion depends on in the spec (`plan.node.node_complete`): the packages (versions,
    configs, uninstalls: the fingerprint) and which of them repair drift."""
    spec = nodewright.spec
    return spec_fingerprint(nodewright), tuple(
        sorted(n for n in spec.packages if drift.reapplies(nodewright, n))
    )


class CompletionMemo:
    """Whether each NodeWright is complete on each node for its current spec (`complete_for_spec`), with
    the state annotation decoded only when its text changed since the last question.

    Owned by a controller and asked on every pass; pure (no I/O, no clock): an entry is a function of
    the spec, the label and the annotation text, and is dropped when the spec changes, the NodeWright
    leaves the facts or the node stops being targeted.
    """

    def __init__(self) -> None:
        self._specs: dict[str, _SpecCompletion] = {}

    def spec(self, nodewright: NodeWright) -> _SpecCompletion:
        name = nodewright.metadata.name
        known = self._specs.get(name)
        if known is not None and known.nodewright is nodewright:
            return known
        key = _spec_key(nodewright)
        if known is None or known.key != key:
            known = self._specs[name] = _SpecCompletion(nodewright, key)
        known.nodewright = nodewright
        return known

    def complete_on(self, nodewright: NodeWright, node: Mapping[str, Any]) -> bool:
        """Whether `nodewright` is complete on `node` for its current spec."""
        meta = node.get("metadata") or {}
        return self.spec(nodewright).complete(
            str(meta.get("name")), meta.get("labels") or {}, meta.get("annotations") or {}
        )

    def keep(self, names: Iterable[str]) -> None:
        """Forget the NodeWrights not in `names` (deleted, or leaving)."""
        kept = set(names)
        for name in [n for n in self._specs if n not in kept]:
            del self._specs[name]


def facts_for(
    nodewrights: Iterable[NodeWright],
    nodes: Iterable[Mapping[str, Any]],
    *,
    memo: CompletionMemo | None = None,
) -> list[NodeWrightFacts]:
    """The facts of every NodeWright from node objects: targets by `nodeSelectors`, completion for the
    NodeWright's current spec (`plan.rollout.complete_for_spec`: the status label
    `nodewright.io/status.<name>` corrected by the state annotation `nodewright.io/state.<name>`).

    One builder for the rollout controller, the node controller and `nodewright plan`, so they can never
    disagree about who waits for whom. A NodeWright being deleted orders nothing any more: it only
    uninstalls, and must not hold back the NodeWrights after it. `memo` carries decoded completions
    from one call to the next (a controller's); without it every state is decoded.
    """
    memo = memo if memo is not None else CompletionMemo()
    nodes = list(nodes)
    facts = []
    for nw in nodewrights:
        if nw.metadata.deletion_timestamp:
            continue
        completion = memo.spec(nw)
        previous, completion.entries = completion.entries, {}
        targets: set[str] = set()
        complete: set[str] = set()
        for node in nodes:
            meta = node.get("metadata") or {}
            labels = meta.get("labels") or {}
            if selectors.matches(nw.spec.node_selectors, labels):
                name = str(meta["name"])
                targets.add(name)
                if name in previous:
                    completion.entries[name] = previous[name]
                if completion.complete(name, labels, meta.get("annotations") or {}):
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
    memo.keep(f.name for f in facts)
    return facts
