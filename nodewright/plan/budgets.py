"""Shared disruption budgets: one budget per pool of nodes, drawn from by every NodeWright (pure).

A `DisruptionBudget` (cluster-scoped, `nodewright.io/v1alpha1`) selects a pool of nodes and caps how
many of them may be disrupted at once, whoever disrupts them: several NodeWrights, a human who cordons
a node, a node that went NotReady. A compartment ceiling bounds one NodeWright; this bounds all of them
together, so two NodeWrights that each allow "one at a time" never reboot two nodes of the same pool.

Slots. A NodeWright that wants to admit a node of a pool first records a *slot* in the budget's status
(`status.slots[node][nodewright] = since`) with a merge patch carrying the resourceVersion it planned
from, and only then writes the admission. Two writers that planned from the same version cannot both
succeed (the second gets 409 Conflict, re-reads and plans again), so the last slot is taken once: by two
rollouts in one operator, or by two operators during a leader hand-over. A node counts as *disrupted*
in a pool when any of these holds:

- it carries a slot;
- it is cordoned (by someone else, or by another NodeWright);
- it is NotReady;
- it is `in_progress` for any NodeWright (status label): also work started before the budget existed,
  or by an operator version without budgets.

`free = ceiling - |disrupted| - ahead`, where `ahead` counts NodeWrights that were refused a slot
earlier (`status.waiting`): a freed slot goes to the longest waiting NodeWright first. A waiting
NodeWright writes the same `since` into every pool it waits for (the earliest it holds anywhere), so
the order `(since, name)` is one total order across pools and two NodeWrights waiting for two pools
cannot hold each other up in a cycle.

Releases. A NodeWright keeps a slot while its node holds a slot of its compartment (phase ACTIVE or
CARRYOVER). Then it releases it, in its own next write, once the node settled under the admission
the slot was taken for (the admission's time is not older than the slot's), or the slot was taken by
this very process for a node it did not admit after all, or the slot is older than `SLOT_GRACE` without
any admission (taken by an operator that stopped before writing the admission). The budget controller
sweeps slots of NodeWrights and nodes that no longer exist and of nodes that left the pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic

from nodewright.api import constants
from nodewright.api.models import DisruptionBudget, Status
from nodewright.api.nodeobject import node_annotations, node_labels, node_ready, try_node_state
from nodewright.plan import selectors

SLOT_GRACE = timedelta(seconds=60)
"""How long a slot without an admission is kept: an operator writes the admission right after the slot
(seconds), and a leader that lost its Lease stops acting within its renew deadline (10 s by default)."""
MAX_NAMED = 3


@dataclass(frozen=True, slots=True)
class PoolNode:
    """What a budget reads from one node (built by the controller from the node object)."""

    name: str
    labels: Mapping[str, str]
    unschedulable: bool = False
    ready: bool = True
    in_progress_for: frozenset[str] = frozenset()
    """NodeWrights whose status label on the node is `in_progress`."""
    cordoned_by: frozenset[str] = frozenset()
    """NodeWrights whose state annotation says they cordoned the node."""


def ceiling(budget: DisruptionBudget, matched: int) -> int:
    """`count`, or max(1, floor(matched x percent / 100)); 0 for an empty pool."""
    if matched <= 0:
        return 0
    spec = budget.spec.budget
    if spec.count is not None:
        return spec.count
    return max(1, matched * (spec.percent or 100) // 100)


def members(budget: DisruptionBudget, nodes: Iterable[PoolNode]) -> frozenset[str]:
    return frozenset(n.name for n in nodes if selectors.matches(budget.spec.node_selector, n.labels))


def disruption_of(node: PoolNode, *, excluding: str | None = None) -> str | None:
    """Why the node is disrupted by something other than NodeWright `excluding` (None: it is not).

    A cordon or NotReady that belongs to `excluding`'s own work (it cordoned the node, or the node is in
    progress for it, e.g. rebooting) is its own disruption, which it accounts for through its slots.
    """
    own = excluding is not None and (excluding in node.cordoned_by or excluding in node.in_progress_for)
    if node.unschedulable:
        cordoning = sorted(node.cordoned_by - {excluding} if excluding else node.cordoned_by)
        if cordoning:
            return f"cordoned by NodeWright {cordoning[0]!r}"
        if not node.cordoned_by:
            return "cordoned by someone else"
    others = sorted(node.in_progress_for - {excluding} if excluding else node.in_progress_for)
    if others:
        return f"in progress for NodeWright {others[0]!r}"
    if not node.ready and not own:
        return "NotReady"
    return None


@dataclass(frozen=True, slots=True)
class BudgetView:
    """One DisruptionBudget with its pool as the operator sees it now."""

    name: str
    ceiling: int
    members: frozenset[str]
    slots: Mapping[str, Mapping[str, str]]
    """node -> NodeWright -> since (RFC 3339), as persisted."""
    waiting: Mapping[str, str]
    """NodeWright -> since (RFC 3339), as persisted."""
    disrupted_other: Mapping[str, str]
    """Members disrupted without any slot: node -> why (cordoned, NotReady, in progress)."""
    resource_version: str = ""

    def disrupted(self) -> dict[str, str]:
        """Every disrupted member and why (a slot first)."""
        out = dict(self.disrupted_other)
        for node, holders in self.slots.items():
            if node in self.members and holders:
                out[node] = f"slot of NodeWright {sorted(holders)[0]!r}"
        return out

    def for_nodewright(self, nodewright: str, nodes: Mapping[str, PoolNode]) -> SharedBudget:
        """The planner's input for `nodewright`: what is disrupted now, and who waits longer."""
        others: dict[str, str] = {}
        for name in self.members:
            node = nodes.get(name)
            holders = [h for h in self.slots.get(name, {}) if h != nodewright]
            # Its own cordon or reboot counts too: the planner adds its holdings to these as a set, so a
            # node it works on counts once, and a node it left cordoned after an error (no slot any more)
            # still counts, being out of service until someone acts.
            why = f"slot of NodeWright {min(holders)!r}" if holders else None
            if why is None and node is not None:
                why = disruption_of(node)
            if why is not None:
                others[name] = why
        return SharedBudget(
            name=self.name,
            ceiling=self.ceiling,
            members=self.members,
            others=others,
            ahead=waiting_ahead(self.waiting, nodewright),
        )


def view(budget: DisruptionBudget, nodes: Iterable[PoolNode]) -> BudgetView:
    """The budget over the current nodes (persisted slots and waiting list from its status)."""
    listed = list(nodes)
    pool = members(budget, listed)
    status = budget.status
    slots = {n: dict(h) for n, h in ((status.slots if status else None) or {}).items() if h}
    other: dict[str, str] = {}
    for node in listed:
        if node.name not in pool or node.name in slots:
            continue
        why = disruption_of(node)
        if why is not None:
            other[node.name] = why
    return BudgetView(
        name=budget.metadata.name,
        ceiling=ceiling(budget, len(pool)),
        members=pool,
        slots=slots,
        waiting=dict((status.waiting if status else None) or {}),
        disrupted_other=other,
        resource_version=budget.metadata.resource_version or "",
    )


def waiting_ahead(waiting: Mapping[str, str], nodewright: str) -> int:
    """NodeWrights refused a slot before `nodewright` (all of them when it is not waiting itself)."""
    mine = waiting.get(nodewright)
    if mine is None:
        return sum(1 for name in waiting if name != nodewright)
    own = (parse_time(mine), nodewright)
    return sum(1 for name, since in waiting.items() if name != nodewright and (parse_time(since), name) < own)


@dataclass(frozen=True, slots=True)
class SharedBudget:
    """What one DisruptionBudget leaves a NodeWright, as `plan.rollout.plan_rollout` takes it.

    The planner adds the NodeWright's own holdings (its nodes in phase ACTIVE or CARRYOVER) to
    `others`: `free = ceiling - |others u own| - ahead`; a candidate that is not disrupted yet costs one
    free slot in every budget whose pool it belongs to.
    """

    name: str
    ceiling: int
    members: frozenset[str]
    others: Mapping[str, str] = field(default_factory=dict)
    """Members disrupted now: node -> why (another NodeWright's slot, a cordon, NotReady, in progress)."""
    ahead: int = 0

    def describe(self, own: Iterable[str]) -> str:
        """The shortfall in words: who holds the slots."""
        ours = sorted(set(own) & self.members - set(self.others))
        parts = [f"{node} ({why})" for node, why in sorted(self.others.items())]
        parts += [f"{node} (this NodeWright)" for node in ours]
        used = len(parts)
        shown = ", ".join(parts[:MAX_NAMED]) + (f" and {used - MAX_NAMED} more" if used > MAX_NAMED else "")
        text = f"DisruptionBudget {self.name!r} has no free slot ({used} of {self.ceiling} disrupted"
        text += f": {shown})" if shown else ")"
        if self.ahead:
            text += f"; {self.ahead} NodeWright(s) waiting longer get the next free slot"
        return text


class Ledger:
    """Free slots per shared budget during one plan (the planner takes them as it admits nodes)."""

    def __init__(self, budgets: Iterable[SharedBudget], *, own: Iterable[str]) -> None:
        self.budgets = {b.name: b for b in budgets}
        mine = set(own)
        self._disrupted = {b.name: set(b.others) | (mine & b.members) for b in self.budgets.values()}
        self._free = {
            b.name: b.ceiling - len(self._disrupted[b.name]) - b.ahead for b in self.budgets.values()
        }
        self.refused: set[str] = set()
        self._own = mine

    def full(self, node: str) -> SharedBudget | None:
        """The first budget (by name) that has no free slot for `node`, or None if every one has."""
        for name in sorted(self.budgets):
            budget = self.budgets[name]
            if node in budget.members and node not in self._disrupted[name] and self._free[name] < 1:
                return budget
        return None

    def full_for(self, nodes: Iterable[str]) -> SharedBudget | None:
        """The first budget (by name) without free slots for all of `nodes` together (a topology
        domain is admitted whole or not at all), or None if every one has them."""
        wanted = list(nodes)
        for name in sorted(self.budgets):
            budget = self.budgets[name]
            need = sum(1 for n in wanted if n in budget.members and n not in self._disrupted[name])
            if need and self._free[name] < need:
                return budget
        return None

    def take(self, node: str) -> None:
        for name, budget in self.budgets.items():
            if node in budget.members and node not in self._disrupted[name]:
                self._disrupted[name].add(node)
                self._free[name] -= 1
        self._own.add(node)

    def refuse(self, budget: SharedBudget) -> None:
        self.refused.add(budget.name)

    def message(self, budget: SharedBudget) -> str:
        return budget.describe(self._own)


# ----------------------------------------------------------------------------------------------------
# The slot write


@dataclass(frozen=True, slots=True)
class SlotUpdate:
    """The status of one budget after a NodeWright's pass: its slots and its place in the queue."""

    slots: dict[str, dict[str, str]]
    waiting: dict[str, str]
    acquired: tuple[str, ...]
    released: tuple[str, ...]

    def changes(self, current: BudgetView) -> bool:
        return self.slots != {n: dict(h) for n, h in current.slots.items()} or self.waiting != dict(
            current.waiting
        )


def slot_update(
    current: BudgetView,
    nodewright: str,
    *,
    holding: Iterable[str],
    admission_at: Mapping[str, str | None],
    refused: bool,
    now: datetime,
    waiting_since: str | None = None,
    fresh: Iterable[str] = (),
    known_nodes: Iterable[str] | None = None,
) -> SlotUpdate:
    """The slots and waiting list `nodewright` writes into `current`.

    `holding`: its nodes that must hold a slot now (phase ACTIVE or CARRYOVER, and the nodes it
    admits in this pass). Every member among them gets a slot (a node already disrupted for another
    reason costs nothing, but the slot records who works on it). Its other slots are released per the
    module docstring: `admission_at` maps a node to the time of its admission for this NodeWright (any
    spec), `fresh` are slots this process took in an earlier attempt of this pass. `refused`: the plan
    wanted a node of this pool but found no free slot, so the NodeWright queues (with `waiting_since`,
    the earliest it waits anywhere, or now).
    """
    stamp = _ts(now)
    keep = set(holding) & current.members
    fresh_set = set(fresh)
    known = set(known_nodes) if known_nodes is not None else None
    slots = {node: dict(holders) for node, holders in current.slots.items()}
    acquired: list[str] = []
    released: list[str] = []
    for node in sorted(keep):
        holders = slots.setdefault(node, {})
        if nodewright not in holders:
            holders[nodewright] = stamp
            acquired.append(node)
    for node in sorted(slots):
        holders = slots[node]
        since = holders.get(nodewright)
        if since is None or node in keep:
            continue
        admitted = admission_at.get(node)
        gone = known is not None and node not in known
        settled = admitted is not None and parse_time(admitted) >= parse_time(since)
        stale = now - parse_time(since) >= SLOT_GRACE
        if gone or node not in current.members or settled or node in fresh_set or stale:
            del holders[nodewright]
            released.append(node)
    slots = {node: holders for node, holders in slots.items() if holders}
    waiting = dict(current.waiting)
    if refused:
        waiting[nodewright] = min(
            (s for s in (waiting.get(nodewright), waiting_since) if s is not None),
            default=stamp,
            key=parse_time,
        )
    else:
        waiting.pop(nodewright, None)
    return SlotUpdate(slots, waiting, tuple(acquired), tuple(released))


def sweep(
    current: BudgetView, *, nodewrights: Iterable[str], nodes: Iterable[str], waiting_ok: Iterable[str]
) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Slots and waiting entries without an owner any more: the holder NodeWright is gone, the node is
    gone or left the pool; a waiting NodeWright that is gone, invalid, paused or disabled (it wants no
    slot now, and would hold the queue up)."""
    alive = set(nodewrights)
    present = set(nodes) & current.members
    slots = {
        node: {h: s for h, s in holders.items() if h in alive}
        for node, holders in current.slots.items()
        if node in present
    }
    allowed = set(waiting_ok)
    waiting = {h: s for h, s in current.waiting.items() if h in allowed}
    return {n: h for n, h in slots.items() if h}, waiting


def holders_count(slots: Mapping[str, Mapping[str, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for holders in slots.values():
        for holder in holders:
            counts[holder] = counts.get(holder, 0) + 1
    return dict(sorted(counts.items()))


def summary(current: BudgetView) -> str:
    """One line for the status: who holds the slots, and the other disrupted nodes."""
    disrupted = current.disrupted()
    counts = holders_count({n: h for n, h in current.slots.items() if n in current.members})
    parts = [f"{holder}: {n} slot(s)" for holder, n in counts.items()]
    others = sorted(current.disrupted_other.items())
    if others:
        named = ", ".join(f"{node} ({why})" for node, why in others[:MAX_NAMED])
        more = f" and {len(others) - MAX_NAMED} more" if len(others) > MAX_NAMED else ""
        parts.append(f"unavailable for other reasons: {named}{more}")
    head = f"{len(disrupted)} of {current.ceiling} disrupted"
    return (head + "; " + "; ".join(parts) if parts else head)[:1024]


def parse_time(text: str) -> datetime:
    """An RFC 3339 time as an aware datetime (naive values are UTC)."""
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _ts(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ----------------------------------------------------------------------------------------------------
# From node and budget objects


# `frozenset(<empty iterable>)` is a new 216-byte object each time (CPython has no empty-frozenset
# singleton): the pool cache keeps two per node, so nodes with nothing to say share this one.
_NONE: frozenset[str] = frozenset()


def _shared_when_empty(items: frozenset[str]) -> frozenset[str]:
    return items or _NONE


def pool_node(node: Mapping[str, Any]) -> PoolNode:
    """What a budget reads from a node object (trimmed or full)."""
    labels = node_labels(node)
    in_progress = _shared_when_empty(
        frozenset(
            key[len(constants.STATUS_LABEL_PREFIX) :]
            for key, value in labels.items()
            if key.startswith(constants.STATUS_LABEL_PREFIX) and value == Status.IN_PROGRESS.value
        )
    )
    unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
    cordoned: set[str] = set()
    if unschedulable:  # only then does it matter who cordoned; decoding every node would cost O(fleet)
        for key in node_annotations(node):
            if key.startswith(constants.STATE_ANNOTATION_PREFIX):
                nodewright = key[len(constants.STATE_ANNOTATION_PREFIX) :]
                state, _ = try_node_state(node, nodewright)
                if state is not None and state.cordoned:
                    cordoned.add(nodewright)
    return PoolNode(
        name=str(node["metadata"]["name"]),
        labels=labels,
        unschedulable=unschedulable,
        ready=node_ready(node),
        in_progress_for=in_progress,
        cordoned_by=_shared_when_empty(frozenset(cordoned)),
    )


def shared_for(
    nodewright: str,
    budgets: Iterable[DisruptionBudget],
    pool: Mapping[str, PoolNode],
    *,
    matched: Iterable[str],
) -> list[SharedBudget]:
    """What the budgets leave `nodewright`, whose selected nodes are `matched`: the budgets whose pools
    hold one of them, each with what others disrupt there (the input of `plan.rollout.plan_rollout`)."""
    return shared_from_views(nodewright, [view(model, pool.values()) for model in budgets], pool, matched)


def shared_from_views(
    nodewright: str, views: Iterable[BudgetView], pool: Mapping[str, PoolNode], matched: Iterable[str]
) -> list[SharedBudget]:
    """`shared_for` from budget views already made (the rollout controller's, which it also writes)."""
    selected = set(matched)
    return [current.for_nodewright(nodewright, pool) for current in views if current.members & selected]


def parse_budgets(objects: Iterable[Mapping[str, Any]]) -> list[DisruptionBudget]:
    """The DisruptionBudget objects as models, sorted by name; invalid ones are skipped (nothing is
    admitted on their account), as the controller does."""
    out: list[DisruptionBudget] = []
    for obj in objects:
        try:
            out.append(DisruptionBudget.model_validate(obj))
        except pydantic.ValidationError:
            continue
    return sorted(out, key=lambda b: b.metadata.name)
