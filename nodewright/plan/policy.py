"""Compartments: which rollout rules govern which node.

A NodeWright rolls out through *compartments*. Each compartment is a set of nodes with a disruption
budget (its *ceiling*: the most nodes that may be in progress at once) and a batch strategy. This module
turns the NodeWright's deployment settings plus the labels of its matched nodes into that partition.

Sources of compartments, in order:

1. `spec.deploymentPolicy` names a DeploymentPolicy. Each node goes to the compartment whose selector
   matches it. A node matching none goes to `__default__` with the policy's default budget and strategy.
   A node matching several goes to the *safest* one: fixed < linear < exponential < no strategy, then the
   smaller ceiling (computed from every node of the NodeWright the compartment's selector matches, at
   least 1), then the compartment name. This is the reference's heuristic, kept because it is
   deterministic and errs towards the slower rollout; the reference docs' "most labels" rule is not what
   its code does.
2. The named policy does not exist (deleted behind the webhook's back): `PolicyNotFound`. The caller
   selects no node, sets the `PolicyNotFound` condition and reports the NodeWright as blocked. A policy
   that exists but fails validation (stored before a rule existed, e.g. a blackout on 2026-02-30, or
   written while admission was bypassed) is `PolicyInvalid`, handled the same way with the
   `PolicyInvalid` condition naming the field and what to do; the rest of the fleet is unaffected.
3. No policy: the legacy `interruptionBudget` becomes one synthetic `__default__` compartment with a
   fixed strategy (reference §3.3): no budget means 100%; `count` gives `initialBatch = max(1, min(n,
   count))` (count 0 counts as 1); `percent` gives `initialBatch = max(1, floor(n * percent / 100))`;
   batchThreshold 100, safetyLimit 50, no failureThreshold.

Pacing (`Pacing`): the compartment's maintenance windows (its own `maintenance`, else the policy's
`spec.maintenance`), its `soakTime` and its `pauseAfterBatch` gates; the legacy compartment has none.

The ceiling (`ceiling_for`) is `count`, or `max(1, floor(matched * percent / 100))`, and 0 for an empty
compartment. Unlike the reference, the rollout planner enforces it as a hard concurrency cap.

Whether batch state resets when a compartment completes or the spec fingerprint changes
(`reset_on_completion`) follows the reference precedence: the NodeWright's
`deploymentPolicyOptions.resetBatchStateOnCompletion`, then the policy's flag, otherwise false.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Protocol

from nodewright.api import constants
from nodewright.api.models import (
    Budget,
    CompartmentRollout,
    DeploymentPolicy,
    FixedStrategy,
    LabelSelector,
    Maintenance,
    NodeOrder,
    NodeWright,
    PolicyBudget,
    Strategy,
)
from nodewright.api.reasons import PolicyInvalid, PolicyNotFound, PolicyUnusable
from nodewright.plan import topology
from nodewright.plan.gates import GateSpec, specs_from_models
from nodewright.plan.selectors import keys as selector_keys
from nodewright.plan.selectors import matches
from nodewright.plan.windows import Schedule, compile_schedule, parse_duration

LEGACY_POLICY_NAME = "legacy"
"""Policy label used (metrics, status) for the synthetic compartment built from `interruptionBudget`."""


class StrategyKind(IntEnum):
    """Strategy kinds, valued by safety: a lower value grows more slowly (used to resolve overlaps)."""

    FIXED = 0
    LINEAR = 1
    EXPONENTIAL = 2
    NONE = 3

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class StrategyParams:
    """A batch strategy with every default filled in (the webhook defaults; this is the same table)."""

    kind: StrategyKind
    initial_batch: int = 1
    batch_threshold: int = 100
    failure_threshold: int | None = None
    safety_limit: int = 50
    delta: int = 1
    growth_factor: int = 2

    @classmethod
    def from_model(cls, strategy: Strategy | None) -> StrategyParams | None:
        """The first set strategy of `fixed`, `linear`, `exponential`; None when none is set."""
        if strategy is None:
            return None
        if strategy.fixed is not None:
            return cls._common(StrategyKind.FIXED, strategy.fixed)
        if strategy.linear is not None:
            return cls._common(StrategyKind.LINEAR, strategy.linear, delta=strategy.linear.delta)
        if strategy.exponential is not None:
            growth = strategy.exponential.growth_factor
            return cls._common(StrategyKind.EXPONENTIAL, strategy.exponential, growth_factor=growth)
        return None

    @classmethod
    def _common(
        cls, kind: StrategyKind, spec: FixedStrategy, *, delta: int = 1, growth_factor: int = 2
    ) -> StrategyParams:
        return cls(
            kind=kind,
            initial_batch=spec.initial_batch,
            batch_threshold=spec.batch_threshold,
            failure_threshold=spec.failure_threshold,
            safety_limit=spec.safety_limit,
            delta=delta,
            growth_factor=growth_factor,
        )

    def describe(self) -> str:
        """A one-line summary for tables and messages, e.g. `exponential(initial=1, x2)`."""
        step = {
            StrategyKind.FIXED: "",
            StrategyKind.LINEAR: f", +{self.delta}",
            StrategyKind.EXPONENTIAL: f", x{self.growth_factor}",
            StrategyKind.NONE: "",
        }[self.kind]
        stop = "" if self.failure_threshold is None else f", stop after {self.failure_threshold} failed"
        return f"{self.kind.label}(initial={self.initial_batch}{step}{stop})"


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    """A disruption budget: exactly one of `count` and `percent` is meaningful (`count` wins)."""

    count: int | None = None
    percent: int | None = None

    @classmethod
    def from_model(cls, budget: PolicyBudget) -> BudgetSpec:
        return cls(count=budget.count, percent=budget.percent)

    def describe(self) -> str:
        return f"count {self.count}" if self.count is not None else f"{self.percent}%"


def ceiling_for(budget: BudgetSpec, matched: int) -> int:
    """Most nodes of a compartment with `matched` nodes that may be in progress at once (§3.2)."""
    if matched <= 0:
        return 0
    if budget.count is not None:
        return budget.count
    percent = 100 if budget.percent is None else budget.percent
    return max(1, matched * percent // 100)


@dataclass(frozen=True, slots=True)
class Pacing:
    """When a compartment may open its next batch: maintenance windows, soak time, approval gates."""

    schedule: Schedule = field(default_factory=lambda: compile_schedule(None))
    soak_seconds: float = 0.0
    pause_after: frozenset[int] = frozenset()
    has_maintenance: bool = False
    gates: tuple[GateSpec, ...] = ()
    """Health gates that must pass after a batch soaked before the next opens (`plan.gates`)."""

    @classmethod
    def from_model(cls, own: CompartmentRollout, default: Maintenance | None) -> Pacing:
        maintenance = own.maintenance or default
        return cls(
            schedule=compile_schedule(maintenance),
            soak_seconds=parse_duration(own.soak_time).total_seconds() if own.soak_time else 0.0,
            pause_after=frozenset(own.pause_after_batch or ()),
            has_maintenance=maintenance is not None,
            gates=specs_from_models(own.health_gates),
        )


NO_PACING = Pacing()


@dataclass(frozen=True, slots=True)
class CompartmentSpec:
    """One compartment's rules. `strategy` None means "no strategy": every batch is the ceiling."""

    name: str
    selector: LabelSelector | None
    budget: BudgetSpec
    strategy: StrategyParams | None
    pacing: Pacing = NO_PACING
    topology_key: str | None = None
    """A node label naming topology domains: the budget and batches count domains (`plan.topology`)."""
    idle_first: bool = False
    """`nodeOrder: idleFirst`: candidates by disruption cost, cheapest first (`plan.disruption`)."""


class LabelledNode(Protocol):
    """What compartment assignment reads of a node (`NodeRef`, or the planner's `RolloutNode`)."""

    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...


@dataclass(frozen=True, slots=True)
class NodeRef:
    """What compartment assignment needs to know about a node."""

    name: str
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Compartments:
    """The partition of a NodeWright's nodes.

    `specs` holds every compartment of the policy (also empty ones) plus `__default__`, sorted by name;
    `members` lists each compartment's node names sorted by name; `assignment` maps a node to its
    compartment.
    """

    policy_name: str
    specs: Mapping[str, CompartmentSpec]
    members: Mapping[str, tuple[str, ...]]
    assignment: Mapping[str, str]
    reset_on_completion: bool
    domains: Mapping[str, int] = field(default_factory=dict)
    """Number of topology domains of each compartment that has a `topology_key`."""

    def ceiling(self, compartment: str) -> int:
        """The budget's ceiling: in nodes, or in domains for a compartment with a topology key."""
        if compartment in self.domains:
            return ceiling_for(self.specs[compartment].budget, self.domains[compartment])
        return ceiling_for(self.specs[compartment].budget, len(self.members.get(compartment, ())))


def resolve_compartments(
    nodewright: NodeWright,
    *,
    policy: DeploymentPolicy | PolicyInvalid | None,
    nodes: Sequence[LabelledNode],
) -> Compartments | PolicyUnusable:
    """Assign every node to one compartment (see the module docstring for the rules)."""
    spec = nodewright.spec
    if spec.deployment_policy:
        if isinstance(policy, PolicyInvalid) and policy.policy_name == spec.deployment_policy:
            return policy
        if not isinstance(policy, DeploymentPolicy) or policy.metadata.name != spec.deployment_policy:
            return PolicyNotFound(spec.deployment_policy)
        return _from_policy(nodewright, policy=policy, nodes=nodes)
    return _legacy(nodewright, nodes=nodes)


def reset_on_completion(nodewright: NodeWright, policy: DeploymentPolicy | None) -> bool:
    """Reset precedence (§3.8): NodeWright option, then the policy's flag, otherwise false."""
    options = nodewright.spec.deployment_policy_options
    if options is not None and options.reset_batch_state_on_completion is not None:
        return options.reset_batch_state_on_completion
    if policy is not None:
        return policy.spec.reset_batch_state_on_completion
    return False


def _from_policy(
    nodewright: NodeWright, *, policy: DeploymentPolicy, nodes: Sequence[LabelledNode]
) -> Compartments:
    maintenance = policy.spec.maintenance
    default = CompartmentSpec(
        name=constants.DEFAULT_COMPARTMENT,
        selector=None,
        budget=BudgetSpec.from_model(policy.spec.default.budget),
        strategy=StrategyParams.from_model(policy.spec.default.strategy),
        pacing=Pacing.from_model(policy.spec.default, maintenance),
        idle_first=policy.spec.default.node_order is NodeOrder.IDLE_FIRST,
    )
    declared = [
        CompartmentSpec(
            name=c.name,
            selector=c.selector,
            budget=BudgetSpec.from_model(c.budget),
            strategy=StrategyParams.from_model(c.strategy),
            pacing=Pacing.from_model(c, maintenance),
            topology_key=c.topology_key,
            idle_first=c.node_order is NodeOrder.IDLE_FIRST,
        )
        for c in policy.spec.compartments or ()
        if c.name != constants.DEFAULT_COMPARTMENT
    ]
    matched = _match(declared, nodes)

    def safety(c: CompartmentSpec) -> tuple[int, int, str]:
        # Overlap tie-break uses the ceiling over every node the selector matches, not only the winners.
        kind = StrategyKind.NONE if c.strategy is None else c.strategy.kind
        return (int(kind), ceiling_for(c.budget, max(1, matched.totals[c.name])), c.name)

    winner = {
        combo: (min(found, key=safety).name if found else constants.DEFAULT_COMPARTMENT)
        for combo, found in matched.found.items()
    }
    assignment = {node: winner[combo] for node, combo in matched.combos.items()}
    specs = {c.name: c for c in [*declared, default]}
    built = _build(policy.metadata.name, specs, assignment, reset_on_completion(nodewright, policy))
    if not any(spec.topology_key is not None for spec in built.specs.values()):
        return built
    labels = {node.name: node.labels for node in nodes}
    domains = {
        name: topology.count_domains(spec.topology_key, ((m, labels[m]) for m in built.members[name]))
        for name, spec in built.specs.items()
        if spec.topology_key is not None
    }
    return replace(built, domains=domains)


@dataclass(frozen=True, slots=True)
class _Matched:
    """Which declared compartments select which nodes, evaluated per distinct label combination.

    `combos` maps a node to its combination (the values, None for absent, of every label key a
    declared selector reads), `found` a combination to the compartments whose selectors match it, and
    `totals` a compartment to the number of nodes its selector matches.
    """

    combos: Mapping[str, tuple[str | None, ...]]
    found: Mapping[tuple[str | None, ...], tuple[CompartmentSpec, ...]]
    totals: Mapping[str, int]


def _match(declared: Sequence[CompartmentSpec], nodes: Sequence[LabelledNode]) -> _Matched:
    """Selector matching for every node, once per distinct combination of the labels the selectors read
    (`selectors.keys`): a fleet of thousands has few, and every rollout pass resolves every node."""
    read = sorted(frozenset[str]().union(*(selector_keys(c.selector) for c in declared)))
    combos = {node.name: tuple(map(node.labels.get, read)) for node in nodes}
    found: dict[tuple[str | None, ...], tuple[CompartmentSpec, ...]] = {}
    by_name = {node.name: node for node in nodes}
    for name, combo in combos.items():
        if combo not in found:
            labels = by_name[name].labels
            found[combo] = tuple(c for c in declared if matches(c.selector, labels))
    per_combo = Counter(combos.values())
    totals = {c.name: 0 for c in declared}
    for combo, count in per_combo.items():
        for c in found[combo]:
            totals[c.name] += count
    return _Matched(combos=combos, found=found, totals=totals)


def _legacy(nodewright: NodeWright, *, nodes: Sequence[LabelledNode]) -> Compartments:
    budget = _legacy_budget(nodewright.spec.interruption_budget)
    initial = ceiling_for(budget, len(nodes))
    strategy = StrategyParams(kind=StrategyKind.FIXED, initial_batch=max(1, min(len(nodes), initial)))
    default = CompartmentSpec(constants.DEFAULT_COMPARTMENT, None, budget, strategy)
    assignment = {node.name: constants.DEFAULT_COMPARTMENT for node in nodes}
    return _build(
        LEGACY_POLICY_NAME,
        {default.name: default},
        assignment,
        reset_on_completion(nodewright, None),
    )


def _legacy_budget(budget: Budget | None) -> BudgetSpec:
    if budget is None or (budget.count is None and budget.percent is None):
        return BudgetSpec(percent=100)
    if budget.count is not None:
        return BudgetSpec(count=max(1, budget.count))
    return BudgetSpec(percent=budget.percent)


def _build(
    policy_name: str,
    specs: Mapping[str, CompartmentSpec],
    assignment: Mapping[str, str],
    reset: bool,
) -> Compartments:
    members: dict[str, list[str]] = {name: [] for name in specs}
    for node, compartment in assignment.items():
        members[compartment].append(node)
    return Compartments(
        policy_name=policy_name,
        specs={name: specs[name] for name in sorted(specs)},
        members={name: tuple(sorted(members[name])) for name in sorted(members)},
        assignment=dict(sorted(assignment.items())),
        reset_on_completion=reset,
    )
