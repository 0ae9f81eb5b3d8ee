"""Shared DisruptionBudgets on the cluster: slots written before admissions, and the budget controller.

A `DisruptionBudget` (cluster-scoped) caps the disrupted nodes of a pool across every NodeWright, also
counting nodes cordoned by a person and NotReady nodes (semantics in `plan.budgets`). Two writers:

- **the rollout controller** of each NodeWright, through `SharedBudgets.plan`: it plans with what the
  budgets leave it (`plan.rollout.plan_rollout(shared_budgets=...)`), then writes into each budget's
  status, with a merge patch carrying the resourceVersion it planned from, the slots of every node it
  holds or admits now, the release of slots whose nodes settled, and its place in the waiting queue.
  Only when every such write succeeded does the caller write the NodeWright status and the admissions.
  A 409 Conflict means another writer (another NodeWright's pass, or another operator during a leader
  hand-over) changed the budget since: the budget is read again from the API server and the pass plans
  again, up to `ATTEMPTS` times, then gives up for now (the pass is retried shortly). So the last slot
  is taken once, whoever races for it.
- **the budget controller** (key: the budget's name): drops slots whose NodeWright or node is gone or
  whose node left the pool, and waiting entries of NodeWrights that cannot want a slot (gone, invalid,
  paused, disabled), and keeps the aggregates (`matched`, `ceiling`, `disrupted`, `unavailable`,
  `holders`, `message`) up to date, with the same precondition.

Budgets are read from an informer (a small cluster-wide cache) through a write-through view, so a pass
right after a write or a conflict plans from the newest version it knows. Every change of a budget
enqueues the rollouts of the NodeWrights waiting for one of its slots. A budget that fails validation
(the CRD's schema makes that unlikely) is ignored with one warning: nothing is admitted on its account.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pydantic
import structlog

from nodewright.api.models import DisruptionBudget, DisruptionBudgetStatus
from nodewright.api.nodeobject import node_admission
from nodewright.controller.runtime import Runtime
from nodewright.kube.informer import Informer
from nodewright.kube.resources import DISRUPTIONBUDGETS, JSON, Conflict, NotFound
from nodewright.kube.workqueue import Result
from nodewright.kube.writethrough import WriteThrough
from nodewright.plan import budgets
from nodewright.plan.budgets import BudgetView, PoolNode, SharedBudget, pool_node
from nodewright.plan.node import is_disabled, is_paused
from nodewright.plan.rollout import Phase, RolloutNode, RolloutPlan, phase_of

log = structlog.get_logger("nodewright.budgets")

ATTEMPTS = 4
"""Plan-and-write attempts of one rollout pass against conflicting budget writers."""
SWEEP_INTERVAL = 30.0
NODE_EVENT_DELAY = 2.0
"""Node events reach the budget controller coalesced: its pass reads every node of the pool."""

_HOLDS = frozenset({Phase.ACTIVE, Phase.CARRYOVER})


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) turning `old` into `new`; None when they are equal."""
    if isinstance(old, dict) and isinstance(new, dict):
        patch: dict[str, Any] = dict.fromkeys(old.keys() - new.keys())
        for key, value in new.items():
            if key not in old:
                patch[key] = value
            else:
                sub = merge_patch(old[key], value)
                if sub is not None:
                    patch[key] = sub
        return patch or None
    return None if old == new else new


@dataclass
class _Parsed:
    resource_version: str
    model: DisruptionBudget | None


@dataclass(frozen=True, slots=True)
class _Known:
    """What a rollout pass knows of its nodes when it secures its slots."""

    matched: frozenset[str]
    holding: frozenset[str]  # its nodes in progress (ACTIVE, CARRYOVER)
    admission_at: Mapping[str, str]  # node -> when its admission was written
    nodes: tuple[str, ...]  # every node of the cluster
    now: datetime


@dataclass(frozen=True, slots=True)
class Secured:
    """A plan whose slots are recorded: the caller may write the status and the admissions."""

    plan: RolloutPlan
    written: tuple[str, ...] = ()  # budgets whose status this pass wrote


@dataclass
class SharedBudgets:
    """The budgets as the operator sees them, and the slot writes of rollout passes."""

    rt: Runtime
    informer: Informer
    view: WriteThrough = field(init=False)
    _parsed: dict[str, _Parsed] = field(default_factory=dict)
    _pool: dict[str, tuple[str, PoolNode]] = field(default_factory=dict)
    _warned: set[str] = field(default_factory=set)
    _fresh: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    """NodeWright -> (budget, node) slots taken by this process whose admission is not written yet."""

    def __post_init__(self) -> None:
        self.view = WriteThrough(self.informer)

    # -- reading --------------------------------------------------------------------------------

    def models(self) -> list[DisruptionBudget]:
        out = []
        for obj in self.informer.objects():
            name = str(obj["metadata"]["name"])
            model = self.model(self.view.get(name) or obj)
            if model is not None:
                out.append(model)
        return sorted(out, key=lambda b: b.metadata.name)

    def model(self, obj: JSON) -> DisruptionBudget | None:
        meta = obj.get("metadata") or {}
        name, rv = str(meta.get("name")), str(meta.get("resourceVersion") or "")
        cached = self._parsed.get(name)
        if cached is not None and cached.resource_version == rv:
            return cached.model
        try:
            model: DisruptionBudget | None = DisruptionBudget.model_validate(obj)
            self._warned.discard(name)
        except pydantic.ValidationError as exc:
            model = None
            if name not in self._warned:
                self._warned.add(name)
                log.warning("ignoring invalid DisruptionBudget", budget=name, error=str(exc)[:500])
        self._parsed[name] = _Parsed(rv, model)
        return model

    def pool_nodes(self, nodes: Iterable[JSON]) -> dict[str, PoolNode]:
        """The nodes as budgets see them, derived once per node resourceVersion."""
        out: dict[str, PoolNode] = {}
        for node in nodes:
            meta = node["metadata"]
            name, rv = str(meta["name"]), str(meta.get("resourceVersion") or "")
            cached = self._pool.get(name)
            if cached is None or cached[0] != rv or not rv:
                cached = (rv, pool_node(node))
                self._pool[name] = cached
            out[name] = cached[1]
        for gone in self._pool.keys() - out.keys():
            del self._pool[gone]
        return out

    def views(self, pool: Mapping[str, PoolNode]) -> list[BudgetView]:
        return [budgets.view(model, pool.values()) for model in self.models()]

    # -- the rollout pass -------------------------------------------------------------------------

    async def plan(
        self,
        nodewright: str,
        *,
        nodes: Sequence[JSON],
        rollout_nodes: Sequence[RolloutNode],
        fingerprint: str,
        now: datetime,
        replan: Callable[[Sequence[SharedBudget]], RolloutPlan],
    ) -> Secured | None:
        """Plan with the budgets' headroom and record the slots; None when writers kept conflicting."""
        if not self.informer.objects():
            # No budget on the cluster (the common case): nothing to share or record, so no need to
            # derive every node's pool membership and admission on every pass.
            self._fresh.pop(nodewright, None)
            return Secured(replan(()))
        known = _Known(
            matched=frozenset(n.name for n in rollout_nodes),
            holding=frozenset(
                n.name for n in rollout_nodes if phase_of(n, fingerprint=fingerprint) in _HOLDS
            ),
            admission_at={
                str(node["metadata"]["name"]): adm.at
                for node in nodes
                if (adm := node_admission(node, nodewright)) is not None
            },
            nodes=tuple(str(node["metadata"]["name"]) for node in nodes),
            now=now,
        )
        for attempt in range(ATTEMPTS):
            try:
                return await self._attempt(nodewright, nodes, known, replan)
            except Conflict as exc:
                log.info(
                    "DisruptionBudget changed while planning; planning again",
                    nodewright=nodewright,
                    attempt=attempt + 1,
                    error=str(exc)[:200],
                )
                await self._refresh(exc)
        return None

    async def _attempt(
        self,
        nodewright: str,
        nodes: Sequence[JSON],
        known: _Known,
        replan: Callable[[Sequence[SharedBudget]], RolloutPlan],
    ) -> Secured:
        """Plan with the budgets as known now and write the slots that changed (Conflict: a writer won)."""
        pool = self.pool_nodes(nodes)
        # Nodes it no longer selects but still works on (a pod finishing) keep their slots too.
        mine = known.holding | {
            n.name for n in pool.values() if n.name not in known.matched and nodewright in n.in_progress_for
        }
        relevant = [
            v
            for v in self.views(pool)
            if v.members & known.matched
            or nodewright in v.waiting
            or any(nodewright in holders for holders in v.slots.values())
        ]
        plan = replan(budgets.shared_from_views(nodewright, relevant, pool, known.matched))
        if not relevant:
            self._fresh.pop(nodewright, None)
            return Secured(plan)
        written = await self._write_updates(nodewright, relevant, plan, known, mine)
        return Secured(plan, tuple(written))

    async def _write_updates(
        self,
        nodewright: str,
        relevant: Sequence[BudgetView],
        plan: RolloutPlan,
        known: _Known,
        mine: frozenset[str] | set[str],
    ) -> list[str]:
        """Each budget's slots and waiting entry after the plan, written where they changed."""
        admitted = {a.node for a in plan.admissions}
        since = min(
            (v.waiting[nodewright] for v in relevant if nodewright in v.waiting),
            default=None,
            key=budgets.parse_time,
        )
        written: list[str] = []
        for current in sorted(relevant, key=lambda v: v.name):
            fresh = {node for budget, node in self._fresh.get(nodewright, ()) if budget == current.name}
            update = budgets.slot_update(
                current,
                nodewright,
                holding=mine | admitted,
                admission_at=known.admission_at,
                refused=current.name in plan.budget_refusals,
                now=known.now,
                waiting_since=since,
                fresh=fresh - admitted,
                known_nodes=known.nodes,
            )
            if not update.changes(current):
                continue
            await self._write_slots(current, update)
            written.append(current.name)
            taken = self._fresh.setdefault(nodewright, set())
            taken.difference_update((current.name, n) for n in update.released)
            taken.update((current.name, n) for n in update.acquired if n in admitted)
        return written

    def admitted(self, nodewright: str) -> None:
        """The pass wrote its admissions: the slots it took are used now (released by the usual rules)."""
        self._fresh.pop(nodewright, None)

    async def _write_slots(self, current: BudgetView, update: budgets.SlotUpdate) -> None:
        obj = self.view.get(current.name) or {}
        old = dict(obj.get("status") or {})
        new = dict(old)
        new["slots"] = update.slots or None
        new["waiting"] = update.waiting or None
        new["holders"] = budgets.holders_count(update.slots) or None
        new = {k: v for k, v in new.items() if v is not None}
        patch = merge_patch(old, new) or {}
        body = {"metadata": {"resourceVersion": current.resource_version}, "status": patch}
        written = await self.rt.client.patch_status(DISRUPTIONBUDGETS, current.name, body)
        self.view.record(written)
        if update.acquired or update.released:
            log.info(
                "budget slots",
                budget=current.name,
                acquired=list(update.acquired),
                released=list(update.released),
                waiting=sorted(update.waiting),
            )

    async def _refresh(self, exc: Conflict) -> None:
        """After a conflict: read every budget afresh (the cache may still hold the version we lost to)."""
        for obj in self.informer.objects():
            name = str(obj["metadata"]["name"])
            try:
                self.view.record(await self.rt.client.get(DISRUPTIONBUDGETS, name))
            except NotFound:
                self.view.forget(name)

    # -- the budget controller ----------------------------------------------------------------------

    async def reconcile(self, name: str) -> Result | None:
        """Sweep ownerless slots and waiting entries; keep the aggregates current."""
        obj = self.view.get(name)
        if obj is None:
            self._parsed.pop(name, None)
            return None
        model = self.model(obj)
        if model is None:
            return None
        pool = self.pool_nodes(self.rt.node(str(n["metadata"]["name"])) or n for n in self.rt.nodes.objects())
        current = budgets.view(model, pool.values())
        alive, wanting = self._nodewrights()
        slots, waiting = budgets.sweep(current, nodewrights=alive, nodes=pool, waiting_ok=wanting)
        swept = model.model_copy(
            update={
                "status": (model.status or DisruptionBudgetStatus()).model_copy(
                    update={"slots": slots or None, "waiting": waiting or None}
                )
            }
        )
        after = budgets.view(swept, pool.values())
        desired = DisruptionBudgetStatus(
            observed_generation=model.metadata.generation,
            matched=len(after.members),
            ceiling=after.ceiling,
            disrupted=len(after.disrupted()),
            unavailable=len(after.disrupted_other),
            slots=slots or None,
            holders=budgets.holders_count(slots) or None,
            waiting=waiting or None,
            message=budgets.summary(after),
        ).to_json_dict()
        patch = merge_patch(dict(obj.get("status") or {}), desired)
        if patch is not None:
            body = {"metadata": {"resourceVersion": current.resource_version}, "status": patch}
            try:
                written = await self.rt.client.patch_status(DISRUPTIONBUDGETS, name, body)
            except Conflict:
                self.view.record(await self.rt.client.get(DISRUPTIONBUDGETS, name))
                return Result(requeue_after=0.2)
            except NotFound:
                return None
            self.view.record(written)
            dropped = {n for n in current.slots if n not in slots}
            if dropped or set(current.waiting) - set(waiting):
                log.info(
                    "swept DisruptionBudget",
                    budget=name,
                    slots=sorted(dropped),
                    waiting=sorted(set(current.waiting) - set(waiting)),
                )
        return Result(requeue_after=SWEEP_INTERVAL)

    def _nodewrights(self) -> tuple[set[str], set[str]]:
        """(names of every NodeWright, those that may want a slot: valid, not paused/disabled/deleting)."""
        alive: set[str] = set()
        wanting: set[str] = set()
        for obj in self.rt.nodewrights.objects():
            name = str(obj["metadata"]["name"])
            _, model, _ = self.rt.nodewright(name)
            if model is None:
                continue  # invalid: it works on nothing, so it holds nothing
            alive.add(name)
            if not (is_paused(model) or is_disabled(model)):
                wanting.add(name)
        return alive, wanting

    @staticmethod
    def waiting_nodewrights(obj: JSON) -> list[str]:
        """The NodeWrights a budget's status says wait for a slot (their rollouts go first on a change)."""
        return sorted(((obj.get("status") or {}).get("waiting") or {}).keys())
