"""The rollout planner's complete input, built from cluster objects: one constructor for every caller.

`rollout_input` turns what is on the cluster -- the NodeWright, every node object, the other
NodeWrights, the DeploymentPolicies, the DisruptionBudgets -- plus the operator's options and `now` into
a `RolloutInput`: everything `plan.rollout.plan_rollout` takes, decided once. The rollout controller
(`controller.rollout`), `kubectl nodewright why` and `nodewright plan` all call it, so what the plugin
and the preview say is what the controller does; a property test (`tests/test_rollout_agreement.py`)
runs the three on generated fleets and checks that they agree.

What it decides, in one place each:

- the effective spec (`effective_nodewright`: a NodeWright being deleted uninstalls) and its fingerprint;
- which nodes are candidates (`derive_node`): selected by `nodeSelectors`, and -- while the NodeWright is
  deleted -- carrying something of it (a node with nothing of a leaving NodeWright is no candidate);
- each candidate as a `RolloutNode`: status label corrected by the state (`status_for_spec`), pending
  work, admission, who holds it (`Unavailable`: NotReady, cordoned by someone else or by another
  NodeWright, and whether that one is paused or disabled), what blocks it (`Block`: the ignore label,
  untolerated taints, a skipped drain until it may be retried, a block the node reported), and an
  unreadable state annotation as blocked with `StateMalformed` (nothing starts on it);
- the earlier NodeWright each node waits for (priority and sequencing, `plan.sequencing`);
- the persisted compartment statuses with the resets asked for (`nodewright.io/reset-batch-state`:
  `true` resets every compartment in the plan, a list of names resets those here), the approvals
  (`nodewright.io/approve`), pause and disable, the order counter of the current rollout;
- the current rollout's epoch (`plan.rollout_epoch`: a spec that comes back gets batches of its own):
  the candidates' admissions of an earlier rollout of the same spec count as none, and those that never
  started their node are listed for removal (`dead`);
- what the shared DisruptionBudgets leave this NodeWright (`plan.budgets.shared_for`; the controller,
  which must also record its slots, re-plans with `with_budgets` after a write conflict);
- the admission limit per pass (`--admissions-per-pass`, `RolloutOptions`);
- each candidate's disruption cost (`plan.disruption`), when the caller passes the nodes' pods.

Deriving a node is a function of the node object and `NodeContext` only, so the controller keeps a
per-node memo around it (`entries`), keyed by the node's resourceVersion and `NodeContext.key`; a node
whose status is `blocked` is derived again every pass (a skipped drain's retry time depends on `now`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from nodewright.api import constants
from nodewright.api.admission import Admission
from nodewright.api.models import (
    CompartmentStatus,
    DeploymentPolicy,
    DisruptionBudget,
    LabelSelector,
    NodeWright,
    Status,
)
from nodewright.api.nodeobject import (
    NodeFacts,
    node_condition,
    node_labels,
    node_name,
    node_ready,
    node_status,
    node_taints,
    node_timing,
    node_unschedulable,
    try_node_admission,
    try_node_state,
)
from nodewright.api.nodestate import NodeState
from nodewright.api.reasons import (
    CORDONED_BY_SOMEONE_ELSE,
    IGNORE_LABEL,
    NOT_READY,
    Activity,
    Block,
    CordonedByNodeWright,
    DrainSkipped,
    NodeReportedBlock,
    PolicyInvalid,
    StateMalformed,
    Unavailable,
    UntoleratedTaints,
    condition_reason,
)
from nodewright.plan import batches, disruption, selectors, sequencing
from nodewright.plan.budgets import PoolNode, SharedBudget, pool_node, shared_for
from nodewright.plan.drain import PodFacts
from nodewright.plan.gates import GateResult, from_statuses
from nodewright.plan.node import is_disabled, is_paused, state_runs, untolerated_taints
from nodewright.plan.podspec import parse_duration_seconds
from nodewright.plan.preview import RolloutPreview, preview_rollout
from nodewright.plan.rollout import (
    APPROVE_ANNOTATION,
    RolloutNode,
    RolloutPlan,
    parse_approvals,
    plan_rollout,
    spec_fingerprint,
    status_for_spec,
    work_pending,
)
from nodewright.plan.rollout_epoch import RolloutEpoch, current_nodes, dead_admissions, epoch_for, order_hint
from nodewright.plan.stages import ts

JSON = Mapping[str, Any]
SKIP_RETRY_MIN = 10.0
"""Seconds at least between a drain skipped under `drain.policy: skip` and its retry."""
DEFAULT_ADMISSIONS_PER_PASS = 32
"""The operator's default `--admissions-per-pass` (`controller.options`)."""


@dataclass(frozen=True, slots=True)
class RolloutOptions:
    """The operator options that change the rollout planner's decisions."""

    admission_limit: int | None = DEFAULT_ADMISSIONS_PER_PASS
    runtime_taint_key: str = constants.DEFAULT_RUNTIME_REQUIRED_TAINT_KEY


DEFAULT_OPTIONS = RolloutOptions()


# ----------------------------------------------------------------------------------------------------
# One node


def effective_nodewright(nodewright: NodeWright) -> NodeWright:
    """The spec the nodes must converge to: on deletion, every `uninstall.enabled` package uninstalls.

    Deleting a NodeWright runs the uninstall of the packages that support it (reference §2.16) before
    the finalizer is released. Expressing that as `uninstall.apply: true` makes it flow through the same
    stage machine and, because the spec fingerprint changes, through the same batches and budgets as any
    other change (invariant I2).
    """
    if not nodewright.metadata.deletion_timestamp:
        return nodewright
    packages = {}
    for name, pkg in nodewright.spec.packages.items():
        if pkg.uninstall is not None and pkg.uninstall.enabled and not pkg.uninstall.apply:
            pkg = pkg.model_copy(update={"uninstall": pkg.uninstall.model_copy(update={"apply": True})})
        packages[name] = pkg
    spec = nodewright.spec.model_copy(update={"packages": packages})
    return nodewright.model_copy(update={"spec": spec})


def matches_nodewright(nodewright: NodeWright, node: JSON) -> bool:
    """The NodeWright's `nodeSelectors` select the node."""
    return selectors.matches(nodewright.spec.node_selectors, node_labels(node))


def activity(nodewright: NodeWright) -> Activity:
    if is_disabled(nodewright):
        return Activity.DISABLED
    if is_paused(nodewright):
        return Activity.PAUSED
    return Activity.ACTIVE


@dataclass(frozen=True, slots=True)
class NodeContext:
    """What deriving one node needs besides the node object; `key` identifies it for a memo."""

    nodewright: NodeWright  # the effective spec
    fingerprint: str
    all_nodewrights: tuple[str, ...]
    inactive: Mapping[str, Activity]
    runtime_taint_key: str
    now: datetime

    @property
    def name(self) -> str:
        return self.nodewright.metadata.name

    def key(self) -> tuple[Any, ...]:
        """Everything a derived node depends on except the node object and `now`."""
        meta = self.nodewright.metadata
        return (
            self.fingerprint,
            meta.generation,
            bool(meta.deletion_timestamp),
            self.all_nodewrights,
            tuple(sorted(self.inactive.items())),
            self.runtime_taint_key,
        )


@dataclass(frozen=True, slots=True)
class NodeEntry:
    """What one node object contributes to the input.

    `matched`: the node is a candidate of this NodeWright (selected, and for a leaving NodeWright still
    carrying something of it); `rollout` is then the node as the planner sees it (without the earlier
    NodeWright it waits for, which depends on the other nodes). `state_error` says why the state
    annotation does not decode, `admission_error` why the admission annotation does not (it then counts
    as absent).
    """

    name: str
    matched: bool
    rollout: RolloutNode | None = None
    state_error: str | None = None
    admission_error: str | None = None

    @property
    def reusable(self) -> bool:
        """Whether a memo may keep this entry while the node object is unchanged: a blocked node's
        block may end with time alone (a skipped drain is retried after the drain timeout)."""
        return self.rollout is None or self.rollout.status is not Status.BLOCKED


@dataclass(frozen=True, slots=True)
class DerivedNode:
    entry: NodeEntry
    state: NodeState | None = None


def derive_node(ctx: NodeContext, node: JSON) -> DerivedNode:
    """The node as the rollout planner sees it, with its decoded state (module docstring)."""
    name = node_name(node)
    nodewright = ctx.nodewright
    if not matches_nodewright(nodewright, node):
        return DerivedNode(NodeEntry(name, matched=False))
    state, error = try_node_state(node, ctx.name)
    admission, admission_error = try_node_admission(node, ctx.name)
    if error is not None:
        base = rollout_node(ctx, node, state=None, admission=admission)
        malformed = replace(base, status=Status.BLOCKED, needs_work=True, blocked=StateMalformed(error))
        return DerivedNode(NodeEntry(name, True, malformed, error, admission_error))
    if nodewright.metadata.deletion_timestamp and (state is None or not state.packages):
        # Nothing of a leaving NodeWright is on this node (never touched, or already released): there
        # is nothing to uninstall, so it is no candidate. Admitting it would only have the node
        # controller release it again -- and the next batch admit it again, forever, ahead of the
        # nodes that do have work.
        return DerivedNode(NodeEntry(name, matched=False))
    rnode = rollout_node(ctx, node, state=state, admission=admission)
    return DerivedNode(NodeEntry(name, True, rnode, None, admission_error), state)


def rollout_node(
    ctx: NodeContext, node: JSON, *, state: NodeState | None, admission: Admission | None
) -> RolloutNode:
    """A selected node as the rollout planner sees it.

    `needs_work` comes from the state annotation (the node controller's record), not from the status
    label, because right after a spec change the label still says `complete` until the node controller
    has looked again; the status label is used for what the node is doing, corrected by `needs_work`
    (`status_for_spec`: a node with pending work is never counted complete).
    """
    nodewright = ctx.nodewright
    needs_work = work_pending(nodewright, state)
    label = node_status(node, ctx.name)
    return RolloutNode(
        name=node_name(node),
        labels=node_labels(node),
        creation_timestamp=(node.get("metadata") or {}).get("creationTimestamp"),
        status=status_for_spec(label, needs_work=needs_work, runs=state_runs(nodewright, state)),
        needs_work=needs_work,
        admission=admission,
        unavailable=unavailable(ctx, node, own=state),
        blocked=blocked(ctx, node) or reported_block(ctx, node, label=label),
    )


def unavailable(ctx: NodeContext, node: JSON, *, own: NodeState | None) -> Unavailable | None:
    """A node made unavailable by someone else (or by another NodeWright) takes a budget slot."""
    if own is not None and own.cordoned:
        return None
    if node_unschedulable(node):
        owner = _cordon_owner(node, ctx.all_nodewrights or (ctx.name,))
        if owner is None:
            return CORDONED_BY_SOMEONE_ELSE
        return CordonedByNodeWright(owner, ctx.inactive.get(owner, Activity.ACTIVE))
    if not node_ready(node):
        return NOT_READY
    return None


def _cordon_owner(node: JSON, nodewrights: Sequence[str]) -> str | None:
    """The NodeWright whose state says it cordoned the node, if any."""
    for name in nodewrights:
        state, _ = try_node_state(node, name)
        if state is not None and state.cordoned:
            return name
    return None


def blocked(ctx: NodeContext, node: JSON) -> Block | None:
    """Why this NodeWright may not touch the node at all (ignore label, untolerated taints)."""
    labels = node_labels(node)
    if labels.get(constants.LABEL_IGNORE, "").lower() == "true":
        return IGNORE_LABEL
    facts = NodeFacts(name=node_name(node), labels=labels, taints=node_taints(node))
    untolerated = untolerated_taints(ctx.nodewright, facts, runtime_taint_key=ctx.runtime_taint_key)
    return UntoleratedTaints(tuple(untolerated)) if untolerated else None


def reported_block(ctx: NodeContext, node: JSON, *, label: Status | None) -> Block | None:
    """A block the node controller reported (status label `blocked`).

    A drain that timed out under `drain.policy: skip` is retried once the drain timeout has passed
    again (at least `SKIP_RETRY_MIN` seconds) -- "come back to it later" -- so a stuck
    PodDisruptionBudget does not make the rollout spin on one node. Other node-level blocks (e.g. a
    downgrade that needs an uninstall first) last until the node controller reports something else,
    which it does as soon as the spec changes.
    """
    if label is not Status.BLOCKED:
        return None
    skip = node_timing(node, ctx.name).drain_skip
    if skip is not None:
        timeout = parse_duration_seconds(ctx.nodewright.spec.effective_drain().timeout)
        retry_at = skip.at + timedelta(seconds=max(SKIP_RETRY_MIN, timeout))
        return None if ctx.now >= retry_at else DrainSkipped(retry_at, skip.message)
    condition = node_condition(node, ctx.name)
    if condition is None:
        return NodeReportedBlock(None, "")
    return NodeReportedBlock(condition_reason(condition.reason), condition.message)


# ----------------------------------------------------------------------------------------------------
# The whole input


@dataclass(frozen=True, slots=True)
class RolloutInput:
    """Everything one rollout pass plans from (module docstring); `plan()` is the pass's decision."""

    model: NodeWright  # as stored (annotations, status)
    nodewright: NodeWright  # the effective spec
    policy: DeploymentPolicy | PolicyInvalid | None
    fingerprint: str
    now: datetime
    entries: tuple[NodeEntry, ...]  # one per node object, in the order given
    nodes: tuple[RolloutNode, ...]  # the candidates, with the NodeWright each waits for
    compartment_statuses: Mapping[str, CompartmentStatus]
    reset_requested: bool = False
    reset_compartments: frozenset[str] = frozenset()
    approvals: Mapping[str, int] = field(default_factory=dict)
    paused: bool = False
    disabled: bool = False
    next_order_hint: int = 0
    shared_budgets: tuple[SharedBudget, ...] = ()
    admission_limit: int | None = DEFAULT_ADMISSIONS_PER_PASS
    facts: tuple[sequencing.NodeWrightFacts, ...] = ()
    inactive: Mapping[str, Activity] = field(default_factory=dict)
    all_nodewrights: tuple[str, ...] = ()  # every NodeWright's name, invalid ones included
    epoch: RolloutEpoch = field(default_factory=lambda: RolloutEpoch(""))
    """The rollout planned: `nodes` leave out the admissions of earlier rollouts of the same spec."""
    dead: tuple[str, ...] = ()  # nodes whose admission is another rollout's and started nothing: removed
    gate_results: Mapping[str, Mapping[str, GateResult]] = field(default_factory=dict)
    """Latest health gate results per compartment (`plan.gates`), evaluated by the controller."""

    @property
    def name(self) -> str:
        return self.model.metadata.name

    @property
    def policy_name(self) -> str:
        """The policy's name, `legacy` without one (the metrics' label)."""
        return self.nodewright.spec.deployment_policy or "legacy"

    @property
    def malformed(self) -> list[str]:
        """Selected nodes whose state annotation does not decode."""
        return [e.name for e in self.entries if e.state_error is not None and e.matched]

    @property
    def sequencing_blocker(self) -> str | None:
        """A `sequencing: all` predecessor that is not complete everywhere blocks the whole NodeWright."""
        for other in sequencing.order(self.facts):
            if other.name == self.name:
                return None
            if not other.disabled and other.sequencing.value == "all" and not other.complete_everywhere:
                return other.name
        return None

    def with_budgets(self, shared: Sequence[SharedBudget]) -> RolloutInput:
        return replace(self, shared_budgets=tuple(shared))

    def with_gate_results(self, results: Mapping[str, Mapping[str, GateResult]]) -> RolloutInput:
        return replace(self, gate_results=results)

    def plan(self) -> RolloutPlan:
        """The rollout controller's decision for this input."""
        return plan_rollout(
            self.nodewright,
            policy=self.policy,
            nodes=self.nodes,
            compartment_statuses=self.compartment_statuses,
            fingerprint=self.fingerprint,
            now=ts(self.now),
            reset_requested=self.reset_requested,
            approvals=self.approvals,
            paused=self.paused,
            disabled=self.disabled,
            next_order_hint=self.next_order_hint,
            shared_budgets=self.shared_budgets,
            admission_limit=self.admission_limit,
            gate_results=self.gate_results,
        )

    def preview(self) -> RolloutPreview:
        """The batch sequence the controller produces from this input if every node succeeds."""
        return preview_rollout(
            self.nodewright,
            policy=self.policy,
            nodes=self.nodes,
            fingerprint=self.fingerprint,
            now=ts(self.now),
            compartment_statuses=self.compartment_statuses,
            paused=self.paused,
            disabled=self.disabled,
            shared_budgets=self.shared_budgets,
            reset_requested=self.reset_requested,
            approvals=self.approvals,
            next_order_hint=self.next_order_hint,
            admission_limit=self.admission_limit,
        )


NodePods = Callable[[str], Iterable[PodFacts]]
"""What the drain's rule reads of the pods bound to a node (`plan.drain.facts_of`), by node name: the
controller's count-only cache (`controller.podcosts`), or pods `why` and `plan` listed."""


def node_pods_of(by_node: Mapping[str, Sequence[PodFacts]] | None) -> NodePods | None:
    """`NodePods` over facts grouped by node name (what `why` and `plan` listed); None stays None."""
    if by_node is None:
        return None
    return lambda node: by_node.get(node, ())


Entries = Callable[[NodeContext, Sequence[JSON]], Sequence[NodeEntry]]
"""Derives the entries of the node objects (`derive_node` each, or a memo around it)."""


def derive_all(ctx: NodeContext, nodes: Sequence[JSON]) -> list[NodeEntry]:
    return [derive_node(ctx, node).entry for node in nodes]


def rollout_input(
    model: NodeWright,
    *,
    nodes: Sequence[JSON],
    nodewrights: Mapping[str, NodeWright | None],
    policies: Mapping[str, DeploymentPolicy | PolicyInvalid],
    now: datetime,
    budgets: Sequence[DisruptionBudget] = (),
    options: RolloutOptions = DEFAULT_OPTIONS,
    entries: Entries | None = None,
    pool: Mapping[str, PoolNode] | None = None,
    completion: sequencing.CompletionMemo | None = None,
    node_pods: NodePods | None = None,
) -> RolloutInput:
    """The rollout planner's input for `model` (as stored) from the cluster's objects (module docstring).

    `nodewrights` holds every NodeWright by name, `model` included (None: one whose spec fails
    validation: it holds no cordon of ours to know about, and orders nothing); `policies` the
    DeploymentPolicies by name (`PolicyInvalid` for one the operator refuses); `budgets` the
    DisruptionBudgets whose slots count (`pool` their view of the nodes, when the caller keeps one);
    `completion` the caller's memo of decoded completions (`sequencing.CompletionMemo`), a cache only;
    `node_pods` the pods on a node by its name, when the caller has them: each candidate then carries
    its disruption cost (`plan.disruption`, for `nodeOrder: idleFirst`, `why` and `plan`).
    """
    nodewright = effective_nodewright(model)
    models = [m for m in nodewrights.values() if m is not None]
    ctx = NodeContext(
        nodewright=nodewright,
        fingerprint=spec_fingerprint(nodewright),
        all_nodewrights=tuple(sorted(nodewrights)),
        inactive={m.metadata.name: a for m in models if (a := activity(m)) is not Activity.ACTIVE},
        runtime_taint_key=options.runtime_taint_key,
        now=now,
    )
    derived = tuple((entries or derive_all)(ctx, nodes))
    facts = _facts(models, nodes, all_names=ctx.all_nodewrights, completion=completion)
    candidates = tuple(_with_priority(ctx.name, e.rollout, facts) for e in derived if e.rollout is not None)
    if node_pods is not None:
        candidates = _with_costs(candidates, node_pods, protect=nodewright.spec.pod_non_interrupt_labels)
    epoch = epoch_for(ctx.fingerprint, status=model.status, nodes=candidates)
    said = _annotated(model, epoch)
    return RolloutInput(
        model=model,
        nodewright=nodewright,
        policy=_policy(nodewright, policies),
        fingerprint=ctx.fingerprint,
        now=now,
        entries=derived,
        nodes=tuple(current_nodes(candidates, epoch)),
        compartment_statuses=said.compartment_statuses,
        reset_requested=said.reset_requested,
        reset_compartments=said.reset_compartments,
        approvals=said.approvals,
        paused=is_paused(model),
        disabled=is_disabled(model),
        next_order_hint=said.next_order_hint,
        shared_budgets=tuple(budgets_for(ctx.name, budgets, nodes, candidates, pool) if budgets else ()),
        admission_limit=options.admission_limit,
        facts=facts,
        inactive=ctx.inactive,
        all_nodewrights=ctx.all_nodewrights,
        epoch=epoch,
        dead=dead_admissions(candidates, epoch),
        gate_results=from_statuses(said.compartment_statuses),
    )


def _facts(
    models: Sequence[NodeWright],
    nodes: Sequence[JSON],
    *,
    all_names: Sequence[str],
    completion: sequencing.CompletionMemo | None,
) -> tuple[sequencing.NodeWrightFacts, ...]:
    if len(all_names) < 2:
        if completion is not None:
            completion.keep(all_names)
        return ()  # a lone NodeWright waits for nobody; the facts cost O(nodes) to build
    return tuple(sequencing.facts_for(models, nodes, memo=completion))


@dataclass(frozen=True, slots=True)
class _Annotated:
    """What the NodeWright object itself says about its rollout."""

    compartment_statuses: Mapping[str, CompartmentStatus]
    reset_requested: bool
    reset_compartments: frozenset[str]
    approvals: Mapping[str, int]
    next_order_hint: int


def _annotated(model: NodeWright, epoch: RolloutEpoch) -> _Annotated:
    """Its persisted status (with the compartment resets asked for), the reset and approval annotations
    and the order counter of this rollout (`epoch`)."""
    annotations = model.metadata.annotations or {}
    reset, reset_some = parse_reset_annotation(annotations.get(constants.ANNOTATION_RESET_BATCH, ""))
    status = model.status
    persisted = (status.compartment_statuses if status is not None else None) or {}
    return _Annotated(
        compartment_statuses=reset_compartments(persisted, reset_some),
        reset_requested=reset,
        reset_compartments=reset_some,
        approvals=parse_approvals(annotations.get(APPROVE_ANNOTATION)),
        next_order_hint=order_hint(epoch, status),
    )


def budgets_for(
    nodewright: str,
    models: Sequence[DisruptionBudget],
    nodes: Sequence[JSON],
    candidates: Sequence[RolloutNode],
    pool: Mapping[str, PoolNode] | None = None,
) -> list[SharedBudget]:
    """What the budgets leave `nodewright` (`plan.budgets.shared_for`) over the node objects."""
    view = pool if pool is not None else {p.name: p for p in map(pool_node, nodes)}
    return shared_for(nodewright, models, view, matched=[n.name for n in candidates])


def _with_priority(name: str, node: RolloutNode, facts: Sequence[sequencing.NodeWrightFacts]) -> RolloutNode:
    """The node with the earlier NodeWright it waits for on that node (if any)."""
    if len(facts) < 2:
        return node  # nothing to wait for
    blocker = sequencing.blocking(facts, target=name, node=node.name)
    return node if blocker is None else replace(node, waiting_for_priority=blocker.name)


def _with_costs(
    nodes: Sequence[RolloutNode], node_pods: NodePods, *, protect: LabelSelector | None
) -> tuple[RolloutNode, ...]:
    """The nodes with their disruption cost (`plan.disruption.cost_of`, the drain's own rule)."""
    return tuple(
        replace(n, disruption=disruption.cost_of_facts(node_pods(n.name), protect=protect)) for n in nodes
    )


def _policy(
    nodewright: NodeWright, policies: Mapping[str, DeploymentPolicy | PolicyInvalid]
) -> DeploymentPolicy | PolicyInvalid | None:
    wanted = nodewright.spec.deployment_policy
    return policies.get(wanted) if wanted else None


def parse_reset_annotation(text: str) -> tuple[bool, frozenset[str]]:
    """`nodewright.io/reset-batch-state`: true (every compartment) or a comma-separated list of
    compartment names (only those)."""
    value = text.strip()
    if value.lower() in ("true", "1", "yes"):
        return True, frozenset()
    if value.lower() in ("", "false", "0", "no"):
        return False, frozenset()
    return False, frozenset(part.strip() for part in value.split(",") if part.strip())


def reset_compartments(
    statuses: Mapping[str, CompartmentStatus], names: frozenset[str]
) -> dict[str, CompartmentStatus]:
    """The persisted statuses with the batch state of `names` reset as a requested reset does it
    (counters and halt cleared, the batch number kept: admissions record it)."""
    out = dict(statuses)
    for name in names & set(out):
        state = out[name].batch_state
        if state is not None:
            out[name] = out[name].model_copy(
                update={"batch_state": batches.fresh_state(current_batch=state.current_batch)}
            )
    return out


def node_context(
    nodewright: NodeWright,
    *,
    now: datetime,
    all_nodewrights: Sequence[str] = (),
    inactive: Mapping[str, Activity] | None = None,
    runtime_taint_key: str = constants.DEFAULT_RUNTIME_REQUIRED_TAINT_KEY,
) -> NodeContext:
    """A `NodeContext` for deriving single nodes (the effective spec of `nodewright`)."""
    effective = effective_nodewright(nodewright)
    return NodeContext(
        nodewright=effective,
        fingerprint=spec_fingerprint(effective),
        all_nodewrights=tuple(sorted(all_nodewrights or (nodewright.metadata.name,))),
        inactive=dict(inactive or {}),
        runtime_taint_key=runtime_taint_key,
        now=now,
    )
