"""Whole topology domains: a compartment whose budget and batches count domains, not nodes.

A DeploymentPolicy compartment may name a node label as its `topologyKey` (a rack label, an NVLink
domain label, `topology.kubernetes.io/zone`). The nodes sharing a value of that label form one *domain*.
A multi-node training job spans its domain, so disrupting one node of it costs the whole domain; the
planner therefore works in domains for such a compartment:

- **Ceiling** in domains: `count`, or `max(1, floor(domains x percent / 100))`
  (`policy.Compartments.ceiling`).
- **Used**: a domain is *disrupted* while any of its nodes holds a slot (ours in progress, or older
  work) or is unavailable for other reasons (cordoned, NotReady). `free = ceiling - disrupted domains`.
- **Candidates**: the pending, eligible nodes of domains we are not working in; a domain with one of
  our nodes still in progress takes no new admission until all of them settled (a node that joins it, or
  is unblocked, meanwhile waits for a later batch), so a domain is never partly started while another
  starts.
- **Batches** are sized in domains by the strategy (`lastBatchSize` records the domains of the settled
  batch), and a domain is admitted whole: all its candidates in the same batch and the same pass
  (`--admissions-per-pass` is rounded up to whole domains). A node of the domain that may not start
  (NotReady, blocked) is left out and picked later, when it can; the domain counts as disrupted until
  then if the node is unavailable.
- **Shared DisruptionBudgets**: a domain is admitted only when every pool it touches has a free slot for
  all its nodes together; otherwise the whole domain waits (`DisruptionBudget`) and the batch takes the
  next domain. A domain larger than a pool's budget therefore never starts: raise that budget.

A node without the label is a domain of its own (named `<node>` in angle brackets, which no label value
can contain), so a misspelt key falls back to one node per domain: slower, never less safe.

Pure: no I/O, no clock. Generic over anything with `name` and `labels` (the planner's `RolloutNode`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from nodewright.api.reasons import BudgetHeld


class Labelled(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...


N = TypeVar("N", bound=Labelled)


class Budget(Protocol):
    @property
    def name(self) -> str: ...


B = TypeVar("B", bound=Budget)


class Ledger(Protocol[B]):
    """The free slots of shared DisruptionBudgets during a plan (`plan.budgets.Ledger`)."""

    def full_for(self, nodes: Iterable[str]) -> B | None: ...

    def take(self, node: str) -> None: ...

    def refuse(self, budget: B) -> None: ...

    def message(self, budget: B) -> str: ...


def domain_of(key: str, name: str, labels: Mapping[str, str]) -> str:
    """The domain of a node: its value of label `key`, or `<name>` when it has none."""
    value = labels.get(key)
    return value if value else f"<{name}>"


def count_domains(key: str | None, nodes: Iterable[tuple[str, Mapping[str, str]]]) -> int:
    """Distinct domains among `(name, labels)`; with no key, the number of nodes."""
    if key is None:
        return sum(1 for _ in nodes)
    return len({domain_of(key, name, labels) for name, labels in nodes})


def domains_of(key: str, nodes: Iterable[N]) -> set[str]:
    return {domain_of(key, n.name, n.labels) for n in nodes}


def group(key: str, nodes: Sequence[N]) -> list[tuple[N, ...]]:
    """`nodes` grouped by domain; domains in the order of their first node, nodes in their given order.

    The planner passes its candidates in pick order, so domains are picked by their first node's
    pick key (zone, creation time, name): deterministic, and a zone is filled before the next.
    """
    groups: dict[str, list[N]] = {}
    for node in nodes:
        groups.setdefault(domain_of(key, node.name, node.labels), []).append(node)
    return [tuple(g) for g in groups.values()]


def within_limit(units: Sequence[tuple[N, ...]], limit: int | None) -> list[tuple[N, ...]]:
    """The first units whose nodes fit in `limit` admissions; always at least one unit (a domain is
    never split across passes), all of them when there is no limit."""
    if limit is None:
        return list(units)
    taken: list[tuple[N, ...]] = []
    count = 0
    for unit in units:
        if taken and count + len(unit) > limit:
            break
        taken.append(unit)
        count += len(unit)
    return taken


def flatten(units: Iterable[tuple[N, ...]]) -> tuple[N, ...]:
    return tuple(n for unit in units for n in unit)


def node_domains(key: str, nodes: Iterable[N]) -> dict[str, str]:
    """node name -> domain, for `why` and `plan`."""
    return {n.name: domain_of(key, n.name, n.labels) for n in nodes}


def pick_domains(
    ledger: Ledger[B], units: Sequence[tuple[N, ...]], *, size: int, nodes: int | None = None
) -> tuple[list[tuple[N, ...]], dict[str, BudgetHeld]]:
    """Up to `size` domains in order (until they hold `nodes` nodes, when given: a domain that grew
    since its batch was planned is still admitted whole), skipping a
    domain for which a shared DisruptionBudget lacks the slots of all its nodes (each of its nodes is
    then held by that budget); the batch takes the next domains instead."""
    picked: list[tuple[N, ...]] = []
    shared: dict[str, BudgetHeld] = {}
    count = 0
    for unit in units:
        if len(picked) >= size or (nodes is not None and count >= nodes):
            break
        full = ledger.full_for(n.name for n in unit)
        if full is not None:
            ledger.refuse(full)
            shared.update({n.name: BudgetHeld(full.name, ledger.message(full)) for n in unit})
            continue
        for node in unit:
            ledger.take(node.name)
        picked.append(unit)
        count += len(unit)
    return picked, shared
