"""Idle nodes first: each node's disruption cost, and the opt-in order that admits the cheapest first.

Updating a node interrupts whatever runs on it. A compartment with `nodeOrder: IdleFirst` spends its
early batches where that interrupts nothing: within the order the policy already allows, the nodes
are taken by their *disruption cost*, cheapest first.

- **Cost** (`DisruptionCost`): the node's protected pods and its evictable pods, counted by the very
  rule the node gate and the drain use (`plan.drain.select` with the NodeWright's
  `podNonInterruptLabels`): `protected` are the Running/Pending pods an interrupt waits for,
  `evictable` the pods a drain would evict now. DaemonSet pods, mirror (static) pods, pods that
  tolerate the unschedulable taint, finished pods and the operator's own package pods are evicted by
  no drain, so they cost nothing; a pod already terminating is on its way out and costs nothing either.
  Comparison is lexicographic: a node with no protected pod goes before any node with one, then the
  fewest protected, then the fewest evictable.
- **Unknown cost**: a node whose pods the caller could not count (no pod data yet) goes after every
  node with a known cost: it is not known to be idle.
- **Order** (`idle_first`): a *stable* sort of the compartment's nodes in pick order, so equal costs
  keep the pick order (zone, creation time, name: deterministic). For a compartment with a
  `topologyKey` the unit is the domain (`plan.topology`): its cost is the sum of its nodes' costs (a
  domain with any node of unknown cost is unknown), domains are ordered by it, and the nodes within a
  domain keep their pick order. Budgets, batch sizes, priority between NodeWrights, windows and gates
  are untouched: only which eligible node (or domain) a batch takes first changes.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from nodewright.api.models import DeploymentPolicy, LabelSelector, NodeOrder
from nodewright.plan import drain, topology


@dataclass(frozen=True, slots=True, order=True)
class DisruptionCost:
    """What updating a node interrupts: its protected pods, then its evictable pods (`plan.drain`)."""

    protected: int = 0
    evictable: int = 0

    @property
    def idle(self) -> bool:
        return self.protected == 0 and self.evictable == 0

    def __add__(self, other: DisruptionCost) -> DisruptionCost:
        return DisruptionCost(self.protected + other.protected, self.evictable + other.evictable)

    def describe(self) -> str:
        """`idle`, or `2 protected, 5 evictable pods` (for `plan` and `why`)."""
        if self.idle:
            return "idle"
        return f"{self.protected} protected, {self.evictable} evictable pods"

    def to_json(self) -> dict[str, int]:
        return {"protected": self.protected, "evictable": self.evictable}


IDLE = DisruptionCost()


def cost_of(pods: Iterable[Mapping[str, Any]], *, protect: LabelSelector | None) -> DisruptionCost:
    """The cost of a node running `pods` (API objects), by the drain's own rule (module docstring)."""
    return cost_of_facts(map(drain.facts_of, pods), protect=protect)


def cost_of_facts(pods: Iterable[drain.PodFacts], *, protect: LabelSelector | None) -> DisruptionCost:
    """The cost of a node running pods with these facts (`plan.drain.facts_of`): what `drain.select`
    would list as protected, and as to evict now."""
    protected = evictable = 0
    for facts in pods:
        protected += facts.protects(protect)
        evictable += facts.needs_drain and not facts.terminating
    return DisruptionCost(protected=protected, evictable=evictable)


def opted_in(policy: object) -> bool:
    """Whether a DeploymentPolicy orders any compartment (or its default) `idleFirst`: only then does
    the controller need the nodes' pod counts."""
    if not isinstance(policy, DeploymentPolicy):
        return False
    rollouts = [policy.spec.default, *(policy.spec.compartments or ())]
    return any(r.node_order is NodeOrder.IDLE_FIRST for r in rollouts)


class Costed(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def disruption(self) -> DisruptionCost | None: ...


N = TypeVar("N", bound=Costed)

_UNKNOWN = (1, DisruptionCost())


def sort_key(cost: DisruptionCost | None) -> tuple[int, DisruptionCost]:
    """Known costs first, cheapest first; unknown last."""
    return _UNKNOWN if cost is None else (0, cost)


def domain_cost(nodes: Iterable[Costed]) -> DisruptionCost | None:
    """The sum of the nodes' costs; unknown when any is."""
    total = IDLE
    for node in nodes:
        if node.disruption is None:
            return None
        total = total + node.disruption
    return total


def idle_first(nodes: Sequence[N], *, key: str | None = None) -> list[N]:
    """`nodes` (in pick order) reordered cheapest first, stably; by domain with a topology `key`."""
    if key is None:
        return sorted(nodes, key=lambda n: sort_key(n.disruption))
    units = sorted(topology.group(key, nodes), key=lambda unit: sort_key(domain_cost(unit)))
    return list(topology.flatten(units))
