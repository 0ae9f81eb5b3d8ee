"""A whole fleet run by both pure planners the way the two controllers run them, for property tests.

`Fleet` holds what the API server would: per node the state annotation (through the codec), the status
label, the admission annotation (rollout form, with its fingerprint and `consumed` flag) and the
NodeWright status (compartment batch state). Each node is a `FakeNode` (tests/planfake.py), which plays
the kubelet: pods finish per a scripted fate, reboots change the bootID, evicted pods terminate.

One `round()` is what the operator does in a few seconds:
- a rollout pass: `plan.rollout_input.derive_node` derives each node's view from its objects (the
  controller's own code), `plan_rollout` decides; the status is written, then the admissions (the
  controller's order);
- a node pass per node: the node controller's rules (an admission is handed to the planner only when it
  is for the current fingerprint and not consumed; the admission is never persisted in the state; a
  plan that settles the node consumes its admission; the state, label and consumption are one write).

After every write the fleet-safety invariants are checked (raising `FleetBreach`):
- I1: per compartment, nodes labelled `in_progress` never exceed the ceiling;
- I2: per compartment, nodes with a pod that may still run (FakeNode pod outcome running) never exceed
  the ceiling.
Time is shared: every node plans at the fleet's clock.

`SharedFleet` runs several `Fleet`s (one NodeWright each, on their own nodes) under one shared
DisruptionBudget, the way the operator does (`controller.budgets`): every rollout pass plans with what
the budget leaves it, then writes its slots into the budget's status with a resourceVersion
precondition, then its status, then its admissions. The passes of one round all plan from the same
budget version before any of them writes, in a shuffled order, so every round but the quietest has
writers racing for the same version: the loser's write is refused (409) and it re-reads and plans again,
as the controller does. After every write (budget status, NodeWright status, admissions, every node
write) I10 is checked: the disrupted nodes of the pool (in progress for any NodeWright, cordoned,
NotReady) never exceed the budget, and neither do the pool nodes running a package pod.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from nodewright.api import constants
from nodewright.api.admission import Admission, decode_admission, encode_admission
from nodewright.api.models import (
    CompartmentStatus,
    DeploymentPolicy,
    DisruptionBudget,
    DisruptionBudgetStatus,
    NodeWright,
    Status,
)
from nodewright.api.nodestate import Admission as StateAdmission
from nodewright.api.nodestate import NodeState, encode
from nodewright.api.reasons import WaitReason
from nodewright.plan import budgets as budget_plan
from nodewright.plan.budgets import pool_node
from nodewright.plan.node import CreatePod, PlanOptions
from nodewright.plan.policy import Compartments, NodeRef, resolve_compartments
from nodewright.plan.rollout import Phase, RolloutPlan, phase_of, plan_rollout, spec_fingerprint
from nodewright.plan.rollout_input import derive_node, node_context
from nodewright.plan.stages import PodOutcome, RetryPolicy, ts
from tests.planfake import T0, FakeNode

OPTIONS = PlanOptions(
    retry=RetryPolicy(max_attempts=2, stage_timeout=600, pull_error_grace=30, backoff_base=5, backoff_cap=10),
    reboot_timeout=900,
)

Fate = Callable[[str, CreatePod], str]
"""Given the node name and the pod being created, its fate: "succeed" or "fail" (see FakeNode)."""


class FleetBreach(AssertionError):
    pass


@dataclass
class Fleet:
    nodewright: NodeWright
    policy: DeploymentPolicy | None
    names: list[str]
    fate: Fate = lambda _node, _pod: "succeed"
    now: Any = T0
    nodes: dict[str, FakeNode] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # node -> status label value
    admissions: dict[str, str] = field(default_factory=dict)  # node -> admission annotation text
    statuses: dict[str, CompartmentStatus] = field(default_factory=dict)
    next_order: int = 0
    reset: bool = False
    approvals: dict[str, int] = field(default_factory=dict)  # the nodewright.io/approve annotation
    plans: list[RolloutPlan] = field(default_factory=list)
    breaches: list[str] = field(default_factory=list)
    extra_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # node -> more labels
    on_write: Callable[[], None] | None = None
    """Also run after every write (a `SharedFleet` checks its budget there)."""
    admission_limit: int | None = None
    """The operator's `--admissions-per-pass` (None: every admission of a batch in one pass)."""

    def __post_init__(self) -> None:
        for index, name in enumerate(self.names):
            self.nodes[name] = FakeNode(
                self.nodewright,
                name=name,
                admitted=False,
                options=OPTIONS,
                outcomes=self._fate_of(name),
                labels={"topology.kubernetes.io/zone": f"z{index % 2}", **self.extra_labels.get(name, {})},
            )

    def _fate_of(self, node: str) -> Callable[[CreatePod], str]:
        """The node's pod fates, read from `fate` at each creation (tests change it mid-run)."""

        def outcome(pod: CreatePod) -> str:
            return self.fate(node, pod)

        return outcome

    # -- objects as the API server would hold them ---------------------------------------------------

    def node_object(self, name: str) -> dict[str, Any]:
        node = self.nodes[name]
        nw = self.nodewright.metadata.name
        annotations: dict[str, str] = {}
        if node.state_text is not None:
            annotations[constants.state_annotation(nw)] = node.state_text
        if name in self.admissions:
            annotations[f"{constants.PREFIX}batch.{nw}"] = self.admissions[name]
        labels = dict(node.labels)
        if name in self.labels:
            labels[constants.status_label(nw)] = self.labels[name]
        return {
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": annotations,
                "creationTimestamp": f"2024-01-01T00:00:{self.names.index(name):02d}Z",
            },
            "spec": {"unschedulable": True} if node.unschedulable else {},
            "status": {
                "conditions": [{"type": "Ready", "status": "True" if node.ready else "False"}],
                "nodeInfo": {"bootID": node.boot_id},
            },
        }

    def nodewright_object(self) -> dict[str, Any]:
        """The NodeWright as the API server holds it, with what the rollout passes wrote in its status."""
        obj = self.nodewright.to_json_dict()
        obj.update({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright"})
        obj["status"] = {
            "compartmentStatuses": {c: s.to_json_dict() for c, s in sorted(self.statuses.items())},
            "rolloutFingerprint": self.fingerprint,
            "nextOrder": self.next_order,
        }
        return obj

    def admission(self, name: str) -> Admission | None:
        text = self.admissions.get(name)
        return decode_admission(text) if text is not None else None

    @property
    def fingerprint(self) -> str:
        return spec_fingerprint(self.nodewright)

    def compartments(self) -> Compartments:
        refs = [NodeRef(n, self.nodes[n].labels) for n in self.names]
        resolved = resolve_compartments(self.nodewright, policy=self.policy, nodes=refs)
        assert isinstance(resolved, Compartments)
        return resolved

    # -- the two controllers -------------------------------------------------------------------------

    def rollout_views(self) -> list[Any]:
        ctx = node_context(self.nodewright, now=self.now)
        out = []
        for name in self.names:
            rnode = derive_node(ctx, self.node_object(name)).entry.rollout
            assert rnode is not None, f"{name} is selected"
            out.append(rnode)
        return out

    def rollout_plan(self, shared: Sequence[budget_plan.SharedBudget] = ()) -> RolloutPlan:
        return plan_rollout(
            self.nodewright,
            policy=self.policy,
            nodes=self.rollout_views(),
            compartment_statuses=self.statuses,
            fingerprint=self.fingerprint,
            now=ts(self.now),
            reset_requested=self.reset,
            next_order_hint=self.next_order,
            approvals=self.approvals,
            shared_budgets=shared,
            admission_limit=self.admission_limit,
        )

    def write_status(self, plan: RolloutPlan) -> None:
        self.statuses = dict(plan.compartment_statuses)
        self.next_order = plan.next_order
        if plan.reset_applied:
            self.reset = False

    def write_admissions(self, plan: RolloutPlan) -> None:
        for name in plan.releases:
            self.admissions.pop(name, None)
        for new in plan.admissions:
            self.admissions[new.node] = encode_admission(new.admission)

    def rollout_pass(self) -> RolloutPlan:
        plan = self.rollout_plan()
        self.plans.append(plan)
        self.write_status(plan)
        self.check()
        self.write_admissions(plan)
        self.check()
        return plan

    def node_pass(self, name: str) -> None:
        node = self.nodes[name]
        admission = self.admission(name)
        usable = (
            admission is not None and not admission.consumed and admission.fingerprint == self.fingerprint
        )
        state = node.state
        planner_admission = (
            StateAdmission(admission.compartment, admission.batch, admission.order, admission.at)
            if usable and admission is not None
            else None
        )
        node.state_text = encode(replace(state or NodeState(), admission=planner_admission))
        node.nodewright = self.nodewright
        node.now = self.now
        plan = node.step()
        # The controller never persists the admission inside the state annotation, and writes nothing
        # for a node it never touched that only waits.
        written = replace(plan.state, admission=None)
        untouched = state is None and name not in self.labels and plan.status is Status.WAITING
        node.state_text = None if state is None and written == NodeState() else encode(written)
        if not untouched:
            self.labels[name] = plan.status.value
        if plan.consume_admission and admission is not None and usable:
            self.admissions[name] = encode_admission(replace(admission, consumed=True))
        self.check()

    def round(self, *, step: float = 5.0) -> None:
        self.rollout_pass()
        for name in self.names:
            self.node_pass(name)
        self.now += timedelta(seconds=step)

    # -- checks --------------------------------------------------------------------------------------

    def check(self) -> None:
        if self.on_write is not None:
            self.on_write()
        compartments = self.compartments()
        for compartment, members in compartments.members.items():
            ceiling = compartments.ceiling(compartment)
            in_progress = [n for n in members if self.labels.get(n) == Status.IN_PROGRESS.value]
            running = [
                n
                for n in members
                if any(p.summary.outcome is PodOutcome.RUNNING for p in self.nodes[n].pods.values())
            ]
            if len(in_progress) > ceiling:
                self.breach(
                    f"I1 {compartment}: {len(in_progress)} in_progress > ceiling {ceiling}: {in_progress}"
                )
            if len(running) > ceiling:
                self.breach(f"I2 {compartment}: pods on {len(running)} nodes > ceiling {ceiling}: {running}")

    def breach(self, message: str) -> None:
        self.breaches.append(f"{ts(self.now)} {message}")
        raise FleetBreach(self.breaches[-1])

    def settled(self) -> bool:
        """Nothing runs and nothing more will start (every node complete, erroring or out of budget), not
        even once a soak time ends or a maintenance window opens."""
        if any(node.pods for node in self.nodes.values()):
            return False
        if any(value == Status.IN_PROGRESS.value for value in self.labels.values()):
            return False  # e.g. a reboot in flight under an older spec (carry-over): no pod, still busy
        plan = self.rollout_plan()
        timed = any(w.reason in (WaitReason.WINDOW, WaitReason.SOAKING) for w in plan.waiting)
        return not plan.admissions and not plan.active and not timed

    def status_counts(self) -> Mapping[str, int]:
        counts: dict[str, int] = {}
        for name in self.names:
            value = self.labels.get(name, "waiting")
            counts[value] = counts.get(value, 0) + 1
        return counts


@dataclass
class SharedFleet:
    """Several NodeWrights (one `Fleet` each, on disjoint nodes) under one shared DisruptionBudget."""

    fleets: list[Fleet]
    budget: DisruptionBudget
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    resource_version: int = 1
    conflicts: int = 0
    max_disrupted: int = 0
    breaches: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for fleet in self.fleets:
            fleet.on_write = self.check

    # -- the budget as the API server holds it ---------------------------------------------------------

    def node_objects(self) -> list[dict[str, Any]]:
        return [fleet.node_object(name) for fleet in self.fleets for name in fleet.names]

    def pool(self) -> dict[str, budget_plan.PoolNode]:
        return {n.name: n for n in (pool_node(obj) for obj in self.node_objects())}

    def view(self) -> budget_plan.BudgetView:
        stored = self.budget.model_copy(
            update={
                "metadata": self.budget.metadata.model_copy(
                    update={"resource_version": str(self.resource_version)}
                )
            }
        )
        return budget_plan.view(stored, self.pool().values())

    def write_budget(self, version: str, update: budget_plan.SlotUpdate) -> bool:
        """A status patch with a resourceVersion precondition: False (409) when the budget changed."""
        if version != str(self.resource_version):
            self.conflicts += 1
            return False
        status = self.budget.status or DisruptionBudgetStatus()
        self.budget = self.budget.model_copy(
            update={
                "status": status.model_copy(
                    update={"slots": update.slots or None, "waiting": update.waiting or None}
                )
            }
        )
        self.resource_version += 1
        self.check()
        return True

    # -- passes ---------------------------------------------------------------------------------------

    def prepare(self, fleet: Fleet) -> tuple[budget_plan.BudgetView, RolloutPlan, budget_plan.SlotUpdate]:
        """Plan `fleet`'s pass from the budget as it is now, and the slot write it would make."""
        nw = fleet.nodewright.metadata.name
        current = self.view()
        views = fleet.rollout_views()
        shared = [current.for_nodewright(nw, self.pool())] if current.members & set(fleet.names) else []
        plan = fleet.rollout_plan(shared)
        fingerprint = fleet.fingerprint
        holding = {
            v.name for v in views if phase_of(v, fingerprint=fingerprint) in (Phase.ACTIVE, Phase.CARRYOVER)
        }
        admission_at = {name: adm.at for name in fleet.names if (adm := fleet.admission(name)) is not None}
        update = budget_plan.slot_update(
            current,
            nw,
            holding=holding | {a.node for a in plan.admissions},
            admission_at=admission_at,
            refused=current.name in plan.budget_refusals,
            now=fleet.now,
            waiting_since=current.waiting.get(nw),
            known_nodes=[n for f in self.fleets for n in f.names],
        )
        return current, plan, update

    def apply(
        self, fleet: Fleet, current: budget_plan.BudgetView, plan: RolloutPlan, update: budget_plan.SlotUpdate
    ) -> bool:
        """The controller's write order: budget slots, then status, then admissions. False on 409."""
        if update.changes(current) and not self.write_budget(current.resource_version, update):
            return False
        fleet.plans.append(plan)
        fleet.write_status(plan)
        fleet.check()
        fleet.write_admissions(plan)
        fleet.check()
        return True

    def round(self, *, step: float = 5.0) -> None:
        """Every NodeWright plans from the same budget version, then they write in a random order; a
        pass refused by the precondition plans again from the newer version (up to 4 attempts)."""
        prepared = [(fleet, *self.prepare(fleet)) for fleet in self.fleets]
        self.rng.shuffle(prepared)
        for fleet, current, plan, update in prepared:
            for _ in range(4):
                if self.apply(fleet, current, plan, update):
                    break
                current, plan, update = self.prepare(fleet)
        for fleet in self.fleets:
            for name in fleet.names:
                fleet.node_pass(name)
        for fleet in self.fleets:
            fleet.now += timedelta(seconds=step)

    def settled(self) -> bool:
        """Nothing runs and no pass would admit anything, within the budget as it is now."""
        for fleet in self.fleets:
            if any(node.pods for node in fleet.nodes.values()):
                return False
            if any(value == Status.IN_PROGRESS.value for value in fleet.labels.values()):
                return False
            current, plan, update = self.prepare(fleet)
            if plan.admissions or plan.active or update.changes(current):
                return False  # a pass would admit, or release a slot that lets another admit
        return True

    # -- I10 ------------------------------------------------------------------------------------------

    def check(self) -> None:
        current = self.view()
        disrupted = sorted(
            name
            for name, node in self.pool().items()
            if name in current.members and (node.in_progress_for or node.unschedulable or not node.ready)
        )
        running = sorted(
            name
            for fleet in self.fleets
            for name in fleet.names
            if name in current.members
            and any(p.summary.outcome is PodOutcome.RUNNING for p in fleet.nodes[name].pods.values())
        )
        self.max_disrupted = max(self.max_disrupted, len(disrupted))
        for what, nodes in (("disrupted", disrupted), ("running package pods", running)):
            if len(nodes) > current.ceiling:
                self.breaches.append(
                    f"I10 {len(nodes)} pool nodes {what} > budget {current.ceiling}: {nodes}"
                )
                raise FleetBreach(self.breaches[-1])
