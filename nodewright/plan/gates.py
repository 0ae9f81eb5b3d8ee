"""Health gates between batches: whether the next batch of a compartment may open, must wait, or the
compartment halts.

A compartment (or the policy default) lists `healthGates`. When a batch has settled and its soak time
has passed, and nodes still wait for a later batch, every gate must pass before the next batch opens:

- a Prometheus gate asks an instant PromQL query (`$NODES` replaced by a regular expression matching
  exactly the node names of the batch that settled, `render_query`) and passes when every returned
  sample's value compares true with the threshold; no sample, or a query that cannot be asked, is not a
  pass (`GateOutcome.UNKNOWN`): a gate that cannot see the batch never lets the next one open;
- a node-condition gate passes when no node of that batch has the condition True (node-problem-detector
  and NVSentinel report hardware and kernel faults as node conditions).

The controller evaluates the gates (`controller.gates`: HTTP to Prometheus with a deadline, conditions
from the node cache) into `GateResult`s and hands them to the rollout planner; this module decides from
them (`decide`), purely: time is passed in. A gate without a result for the batch, or whose result is
older than `RECHECK_SECONDS` and not a pass, is *due*: the planner asks the controller to evaluate it
(`GateCheck`). Any gate not passing holds the compartment (waiting reason `HealthGate`, naming the gate,
the query and the value); once a gate has failed past its `timeout`, counted from the end of the soak
(the batch's settle time plus `soakTime`), the compartment halts with that gate's record (`GateHalt`):
only a reset of the batch state resumes it, as for a failure-threshold halt.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum

from nodewright.api.models import CompartmentStatus, GateComparison, GateHalt, GateStatus, HealthGate
from nodewright.api.reasons import GateHeld, GateOutcome
from nodewright.plan.windows import parse_duration

RECHECK_SECONDS = 10.0
"""A gate that did not pass is asked again this often (seconds) while it holds the compartment."""
DEFAULT_TIMEOUT_SECONDS = 600.0
"""A gate's `timeout` when unset: 10 minutes after the soak ends."""
NODES_PLACEHOLDER = "$NODES"
_REGEX_SPECIAL = re.compile(r"[^A-Za-z0-9_-]")  # node names are DNS subdomains: only "." needs escaping


class GateKind(Enum):
    PROMETHEUS = "prometheus"
    NODE_CONDITION = "nodeCondition"


@dataclass(frozen=True, slots=True)
class GateSpec:
    """One gate of a compartment, parsed: the model (for the controller: Secret, query, condition type),
    its threshold as a number and its timeout in seconds."""

    name: str
    kind: GateKind
    model: HealthGate
    threshold: float
    timeout_seconds: float

    @classmethod
    def from_model(cls, gate: HealthGate) -> GateSpec:
        kind = GateKind.PROMETHEUS if gate.prometheus is not None else GateKind.NODE_CONDITION
        threshold = float(gate.prometheus.threshold) if gate.prometheus is not None else 0.0
        timeout = parse_duration(gate.timeout).total_seconds() if gate.timeout else DEFAULT_TIMEOUT_SECONDS
        return cls(gate.name, kind, gate, threshold, timeout)

    def describe_query(self, nodes: Sequence[str]) -> str:
        """What the gate asks, as shown in holds and halts: the query with the nodes substituted, or the
        condition."""
        if self.model.prometheus is not None:
            return render_query(self.model.prometheus.query, nodes)
        condition = self.model.node_condition.type if self.model.node_condition is not None else "?"
        return f"node condition {condition}=True"


def specs_from_models(models: Sequence[HealthGate] | None) -> tuple[GateSpec, ...]:
    return tuple(GateSpec.from_model(g) for g in models or ())


@dataclass(frozen=True, slots=True)
class GateResult:
    """What the controller saw when it evaluated gate `gate` for batch `batch` at `evaluated_at`:
    `query` as asked, `value` the deciding value as text (the first failing sample, the number of nodes
    with the condition; None: no value), `detail` more for people (an error, the failing nodes)."""

    gate: str
    batch: int
    outcome: GateOutcome
    query: str
    value: str | None
    detail: str
    evaluated_at: datetime


@dataclass(frozen=True, slots=True)
class GateCheck:
    """The gates the controller must evaluate now for one compartment: after batch `batch`, whose nodes
    are `nodes` (sorted)."""

    compartment: str
    batch: int
    nodes: tuple[str, ...]
    gates: tuple[GateSpec, ...]


class Verdict(Enum):
    OPEN = "open"
    HOLD = "hold"
    HALT = "halt"


@dataclass(frozen=True, slots=True)
class GateDecision:
    """`decide`'s answer: open the next batch, hold it (`held` says why), or halt (`halt` says why).
    `due`: some gate must be evaluated (again) now; `wake_at`: when time alone changes the answer."""

    verdict: Verdict
    held: GateHeld | None = None
    halt: GateHalt | None = None
    due: bool = False
    wake_at: datetime | None = None


OPEN = GateDecision(Verdict.OPEN)


def decide(
    compartment: str,
    batch: int,
    gates: Sequence[GateSpec],
    results: Mapping[str, GateResult],
    *,
    nodes: Sequence[str],
    soak_end: datetime,
    now: datetime,
) -> GateDecision:
    """Open, hold or halt after `batch` (module docstring). `results` maps a gate name to its latest
    result; results of another batch are ignored. The first gate (in spec order) that does not pass is
    the one named; a failed or unknown result whose gate's timeout after `soak_end` passed halts."""
    current = {g.name: r for g in gates if (r := results.get(g.name)) is not None and r.batch == batch}
    failing = [g for g in gates if g.name not in current or current[g.name].outcome is not GateOutcome.PASSED]
    if not failing:
        return OPEN
    recheck = timedelta(seconds=RECHECK_SECONDS)
    due = any(g.name not in current or current[g.name].evaluated_at + recheck <= now for g in failing)
    for gate in failing:
        result = current.get(gate.name)
        if result is not None and soak_end + timedelta(seconds=gate.timeout_seconds) <= now:
            halt = GateHalt(
                gate=gate.name,
                batch=batch,
                query=result.query,
                value=result.value,
                detail=result.detail[:512],
            )
            return GateDecision(Verdict.HALT, halt=halt)
    first = failing[0]
    result = current.get(first.name)
    halt_at = soak_end + timedelta(seconds=min(g.timeout_seconds for g in failing))
    held = GateHeld(
        compartment=compartment,
        batch=batch,
        gate=first.name,
        query=result.query if result is not None else first.describe_query(nodes),
        outcome=result.outcome if result is not None else None,
        value=result.value if result is not None else None,
        detail=result.detail if result is not None else "",
        halt_at=halt_at,
    )
    rechecks = [current[g.name].evaluated_at + recheck for g in failing if g.name in current]
    wake_at = min([halt_at, *rechecks])
    return GateDecision(Verdict.HOLD, held=held, due=due, wake_at=max(wake_at, now))


# ----------------------------------------------------------------------------------------------------
# What a gate compares (pure helpers the controller uses to turn answers into results)


def render_query(template: str, nodes: Sequence[str]) -> str:
    """`template` with `$NODES` replaced by an alternation of the node names, escaped for a PromQL
    double-quoted string holding a RE2 regex (Prometheus anchors `=~` matchers at both ends)."""
    alternation = "|".join(_REGEX_SPECIAL.sub(r"\\\\\g<0>", n) for n in sorted(nodes))
    return template.replace(NODES_PLACEHOLDER, alternation)


def compare(value: float, comparison: GateComparison, threshold: float) -> bool:
    """Whether `value <comparison> threshold` holds (NaN never passes)."""
    if math.isnan(value):
        return False
    match comparison:
        case GateComparison.LT:
            return value < threshold
        case GateComparison.LE:
            return value <= threshold
        case GateComparison.GT:
            return value > threshold
        case GateComparison.GE:
            return value >= threshold
        case GateComparison.EQ:
            return value == threshold
        case GateComparison.NE:
            return value != threshold


def judge_samples(
    gate: GateSpec, batch: int, query: str, values: Sequence[tuple[str, float]], *, at: datetime
) -> GateResult:
    """The result of a Prometheus gate whose query answered `values` ((series labels, value) pairs):
    a pass when there is at least one sample and every one compares true."""
    prom = gate.model.prometheus
    assert prom is not None, "judge_samples is for Prometheus gates"
    if not values:
        return GateResult(
            gate.name, batch, GateOutcome.UNKNOWN, query, None, "the query returned no sample", at
        )
    for series, value in values:
        if not compare(value, prom.comparison, gate.threshold):
            detail = f"{series} {value:g} is not {prom.comparison.value} {prom.threshold}".strip()
            return GateResult(gate.name, batch, GateOutcome.FAILED, query, f"{value:g}", detail, at)
    return GateResult(gate.name, batch, GateOutcome.PASSED, query, f"{values[0][1]:g}", "", at)


def judge_conditions(
    gate: GateSpec, batch: int, query: str, with_condition: Sequence[str], *, at: datetime
) -> GateResult:
    """The result of a node-condition gate: the nodes of the batch that have the condition True."""
    if not with_condition:
        return GateResult(gate.name, batch, GateOutcome.PASSED, query, "0", "", at)
    shown = ", ".join(sorted(with_condition)[:10])
    more = f" and {len(with_condition) - 10} more" if len(with_condition) > 10 else ""
    detail = f"on {shown}{more}"
    return GateResult(gate.name, batch, GateOutcome.FAILED, query, str(len(with_condition)), detail, at)


def holding(held: GateHeld | None, kept: Sequence[GateStatus] | None) -> dict[str, bool]:
    """Per gate, whether it holds the compartment's next batch now (the metric
    `nodewright_health_gate_holding`): each gate with a result for the batch that settled last (`kept`,
    as in the compartment status) and the gate the hold names (`held`). While the compartment is held,
    every gate whose result for that batch is not a pass holds it (all must pass), not only the one
    named first; otherwise none does."""
    out = {g.gate: False for g in kept or ()}
    if held is None:
        return out
    for g in kept or ():
        out[g.gate] = g.batch != held.batch or g.outcome is not GateOutcome.PASSED
    out[held.gate] = True
    return out


# ----------------------------------------------------------------------------------------------------
# Results kept in the compartment status (what `why`, `status` and a restarted operator read back)


def to_status(result: GateResult) -> GateStatus:
    return GateStatus(
        gate=result.gate,
        batch=result.batch,
        outcome=result.outcome,
        query=result.query,
        value=result.value,
        detail=result.detail[:512],
        evaluated_at=result.evaluated_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def from_statuses(statuses: Mapping[str, CompartmentStatus]) -> dict[str, dict[str, GateResult]]:
    """The gate results persisted in the compartment statuses (unreadable times are dropped)."""
    out: dict[str, dict[str, GateResult]] = {}
    for name, status in statuses.items():
        for kept in status.health_gates or ():
            try:
                at = datetime.fromisoformat(kept.evaluated_at.replace("Z", "+00:00"))
            except ValueError:
                continue
            at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
            result = GateResult(kept.gate, kept.batch, kept.outcome, kept.query, kept.value, kept.detail, at)
            out.setdefault(name, {})[kept.gate] = result
    return out
