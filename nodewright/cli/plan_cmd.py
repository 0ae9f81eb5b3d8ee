"""`nodewright plan`: what a rollout will do, predicted without changing anything.

    nodewright plan -f nodewright.yaml [--policy policy.yaml] [--kubeconfig K] [-o table|json]
    nodewright plan <name> [--kubeconfig K] [-o table|json]

The command reads (GET/LIST only, through `nodewright.kube`) the nodes, the DeploymentPolicy the
NodeWright names (unless given with `--policy` or in the `-f` file), every NodeWright (for priorities and
cordons), the DisruptionBudgets and, for a NodeWright that already exists, its persisted status. From
these the rollout planner's input is built by the constructor the rollout controller uses
(`plan.rollout_input.rollout_input`): each matched node as the controller sees it (status label, pending
work, admission, who holds it, what blocks it -- an unreadable state annotation counts blocked, as in the
controller --, the earlier NodeWright it waits for), the resets, approvals, pause and disable
annotations, the order counter, what the shared DisruptionBudgets leave it (nodes of a pool with no free
slot wait with reason `DisruptionBudget`, which names who holds the slots) and the operator's default
admissions per pass.

The NodeWright status and the nodes are read in separate requests while the operator keeps writing, so
they are read as one moment (`read_snapshot`): the NodeWrights, the nodes, the NodeWrights again, until
the batch states did not change around the node list and every admission they count is on the nodes
(`plan.preview.check_snapshot`; a pass writes its status before its admissions). Unwritten admissions
that stay unwritten for a second belong to members released or deleted since, and are taken as they
are. After `READ_DEADLINE` seconds of a rollout that never stands still the last read is used, with a
note.

Then `RolloutInput.preview()` (the planner itself, replayed until every node has finished) gives matched nodes
and ceilings per compartment, the batch sequence if every node succeeds, and what blocks right now.
Protected pods and PodDisruptionBudgets are not evaluated here (they only delay a drain; they do not
change the batch sequence).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from nodewright.api import constants
from nodewright.api.admission import Admission
from nodewright.api.modelcache import ModelCache
from nodewright.api.models import CompartmentStatus, DeploymentPolicy, NodeWright, NodeWrightStatus
from nodewright.api.nodeobject import node_admission
from nodewright.api.reasons import PolicyInvalid
from nodewright.api.validation import model_errors
from nodewright.cli import flags
from nodewright.cli.plugin import common
from nodewright.plan import disruption
from nodewright.plan import preview as preview_mod
from nodewright.plan.budgets import parse_budgets
from nodewright.plan.disruption import DisruptionCost
from nodewright.plan.drain import PodFacts
from nodewright.plan.preview import SnapshotCheck, check_snapshot
from nodewright.plan.rollout import RolloutNode
from nodewright.plan.rollout_input import (
    DEFAULT_ADMISSIONS_PER_PASS,
    NodePods,
    RolloutOptions,
    derive_node,
    node_context,
    node_pods_of,
    rollout_input,
)
from nodewright.plan.stages import ts

if TYPE_CHECKING:
    from nodewright.kube.client import KubeClient

JSON = dict[str, Any]
PROG = "nodewright plan"
DEFAULT_RUNTIME_TAINT_KEY = constants.DEFAULT_RUNTIME_REQUIRED_TAINT_KEY


class PlanInputError(Exception):
    """The manifests or the cluster do not give a NodeWright to plan (exit code 2)."""


# ----------------------------------------------------------------------------------------------------
# Pure part: cluster objects -> the rollout planner's input -> report


def rollout_node(
    nw: NodeWright, node: JSON, *, now: datetime | None = None
) -> tuple[RolloutNode, str | None]:
    """One selected node as the rollout controller sees it (`plan.rollout_input.derive_node`), and why
    its state annotation does not decode (None: it does)."""
    entry = derive_node(node_context(nw, now=now or datetime.now(UTC)), node).entry
    if entry.rollout is None:
        raise ValueError(f"NodeWright {nw.metadata.name!r} does not select node {node['metadata']['name']!r}")
    return entry.rollout, entry.state_error


@dataclass(frozen=True, slots=True)
class PlanReport:
    """Everything `nodewright plan` prints."""

    preview: preview_mod.RolloutPreview
    fingerprint: str
    now: str
    exists: bool
    paused: bool
    disabled: bool
    node_statuses: Mapping[str, int]
    malformed_states: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    costs: Mapping[str, DisruptionCost] = field(default_factory=dict)
    """Each node's disruption cost, when the policy orders `idleFirst` (`plan.disruption`)."""

    def to_json(self) -> dict[str, Any]:
        doc = self.preview.to_json()
        doc.update(
            {
                "fingerprint": self.fingerprint,
                "now": self.now,
                "exists": self.exists,
                "paused": self.paused,
                "disabled": self.disabled,
                "nodeStatuses": dict(sorted(self.node_statuses.items())),
                "malformedStates": list(self.malformed_states),
                **(
                    {"disruptionCosts": {n: c.to_json() for n, c in sorted(self.costs.items())}}
                    if self.costs
                    else {}
                ),
                "notes": list(self.notes),
            }
        )
        return doc


def build_report(
    nw: NodeWright,
    *,
    policy: DeploymentPolicy | PolicyInvalid | None,
    nodes: Sequence[Mapping[str, Any]],
    all_nodewrights: Sequence[NodeWright] = (),
    compartment_statuses: Mapping[str, CompartmentStatus] | None = None,
    exists: bool = False,
    now: datetime | None = None,
    runtime_taint_key: str = DEFAULT_RUNTIME_TAINT_KEY,
    budget_objects: Sequence[JSON] = (),
    invalid_nodewrights: Sequence[str] = (),
    admission_limit: int | None = DEFAULT_ADMISSIONS_PER_PASS,
    node_pods: NodePods | None = None,
) -> PlanReport:
    """Predict the rollout of `nw` over `nodes` (all cluster nodes; matching happens here), within the
    shared DisruptionBudgets `budget_objects` as they are now, from the input the rollout controller
    builds (`plan.rollout_input`). `nw` carries its persisted status (or `compartment_statuses` stand
    for it); `all_nodewrights` are the other NodeWrights, `invalid_nodewrights` those the operator
    refuses; `node_pods` the drain facts of each node's pods, for a policy ordering `idleFirst`."""
    model = _with_statuses(nw, compartment_statuses)
    nodewrights: dict[str, NodeWright | None] = dict.fromkeys(invalid_nodewrights)
    nodewrights.update({o.metadata.name: o for o in all_nodewrights})
    nodewrights[model.metadata.name] = model
    inp = rollout_input(
        model,
        nodes=nodes,
        nodewrights=nodewrights,
        policies=_policies(policy),
        now=now or datetime.now(UTC),
        budgets=parse_budgets(budget_objects),
        options=RolloutOptions(admission_limit=admission_limit, runtime_taint_key=runtime_taint_key),
        node_pods=node_pods,
    )
    malformed = inp.malformed
    notes: list[str] = []
    if inp.paused:
        notes.append(f"paused ({constants.ANNOTATION_PAUSE}): no node starts until the annotation is removed")
    if inp.disabled:
        notes.append(f"disabled ({constants.ANNOTATION_DISABLE}): nodes are left alone")
    if not inp.nodes:
        notes.append("nodeSelectors match no node")
    if malformed:
        notes.append(
            f"{len(malformed)} node(s) with an unreadable state annotation (counted blocked: nothing starts"
            " on them until the annotation is fixed or removed)"
        )
    return PlanReport(
        preview=inp.preview(),
        fingerprint=inp.fingerprint,
        now=ts(inp.now),
        exists=exists,
        paused=inp.paused,
        disabled=inp.disabled,
        node_statuses=dict(Counter(n.status.value for n in inp.nodes)),
        malformed_states=tuple(sorted(malformed)[: preview_mod.MAX_EXAMPLES]),
        notes=tuple(notes),
        costs={n.name: n.disruption for n in inp.nodes if n.disruption is not None},
    )


def _with_statuses(nw: NodeWright, statuses: Mapping[str, CompartmentStatus] | None) -> NodeWright:
    """`nw` with `statuses` as its persisted compartment statuses (when given)."""
    if statuses is None:
        return nw
    status = (nw.status or NodeWrightStatus()).model_copy(update={"compartment_statuses": dict(statuses)})
    return nw.model_copy(update={"status": status})


def _policies(policy: DeploymentPolicy | PolicyInvalid | None) -> dict[str, DeploymentPolicy | PolicyInvalid]:
    if isinstance(policy, PolicyInvalid):
        return {policy.policy_name: policy}
    return {policy.metadata.name: policy} if policy is not None else {}


def render(report: PlanReport, *, wide: bool = False) -> str:
    """The human output: the preview table, current node statuses, totals and notes."""
    lines = [preview_mod.render_table(report.preview).rstrip("\n")]
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(report.node_statuses.items())) or "none"
    lines.append("")
    lines.append(
        f"nodes now: {statuses}   ({'existing NodeWright' if report.exists else 'not applied yet'},"
        f" fingerprint {report.fingerprint})"
    )
    total_batches = sum(len(c.batches) for c in report.preview.compartments)
    longest = max((len(c.batches) for c in report.preview.compartments), default=0)
    admitted = sum(len(b.nodes) for c in report.preview.compartments for b in c.batches)
    lines.append(
        f"predicted if every node succeeds: {admitted} node(s) in {total_batches} batch(es);"
        f" the longest compartment needs {longest} batch(es) (compartments run in parallel)"
    )
    lines.extend(_cost_lines(report))
    if wide:
        for comp in report.preview.compartments:
            for batch in comp.batches:
                named = [_with_cost(n, report.costs) for n in batch.nodes]
                shown = ", ".join(named[:8]) + (f", … (+{len(named) - 8})" if len(named) > 8 else "")
                lines.append(f"  {comp.name} batch {batch.number} ({len(batch.nodes)}): {shown}")
    lines.extend(f"note: {note}" for note in report.notes)
    if report.malformed_states:
        lines.append("unreadable state on: " + ", ".join(report.malformed_states))
    return "\n".join(lines) + "\n"


def _cost_lines(report: PlanReport) -> list[str]:
    """Per compartment ordering `idleFirst`: the disruption cost of each predicted batch, summed."""
    if not report.costs:
        return []
    lines = ["disruption cost per batch (nodeOrder idleFirst: cheapest first; -o wide: per node):"]
    for comp in report.preview.compartments:
        costs = [
            f"{b.number}: {_batch_cost(b.nodes, report.costs).describe()}" for b in comp.batches if b.nodes
        ]
        if costs:
            lines.append(f"  {comp.name}  " + "; ".join(costs[:6]) + (" …" if len(costs) > 6 else ""))
    return lines


def _batch_cost(nodes: Sequence[str], costs: Mapping[str, DisruptionCost]) -> DisruptionCost:
    total = DisruptionCost()
    for node in nodes:
        total = total + costs.get(node, DisruptionCost())
    return total


def _with_cost(node: str, costs: Mapping[str, DisruptionCost]) -> str:
    cost = costs.get(node)
    return node if cost is None else f"{node} [{cost.describe()}]"


# ----------------------------------------------------------------------------------------------------
# Manifests


def load_documents(path: Path) -> list[JSON]:
    import yaml

    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
        return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PlanInputError(f"{path}: cannot read manifests: {exc}") from None


def pick(documents: Sequence[JSON], kind: str) -> list[JSON]:
    found = []
    for doc in documents:
        if doc.get("kind") == "List":
            found.extend(pick(doc.get("items") or [], kind))
        elif doc.get("kind") == kind:
            found.append(doc)
    return found


def parse_nodewright(obj: JSON) -> NodeWright:
    try:
        return NodeWright.model_validate(obj)
    except ValueError as exc:
        raise PlanInputError(f"invalid NodeWright: {exc}") from exc


def parse_policy(obj: JSON) -> DeploymentPolicy:
    try:
        return DeploymentPolicy.model_validate(obj)
    except ValidationError as exc:
        problems = "; ".join(str(e) for e in model_errors(exc)[:10])
        raise PlanInputError(f"invalid DeploymentPolicy: {problems}") from exc


# ----------------------------------------------------------------------------------------------------
# Reading one moment of the rollout

READ_DEADLINE = 30.0
"""Seconds `read_snapshot` reads again while the rollout keeps moving; then the last read is used."""
SETTLE = 1.0
"""Seconds admissions counted by a batch state may stay missing before they are taken as released or
deleted members (a pass writes its admissions within milliseconds of each other)."""
RETRY = 0.1


class ClusterReads(Protocol):
    """The two lists a plan is made from (`nodewright plan` lists them through the API)."""

    async def nodewrights(self) -> list[JSON]: ...

    async def nodes(self) -> list[JSON]: ...


@dataclass(frozen=True, slots=True)
class Snapshot:
    """NodeWrights and nodes as read together; `check` says whether they show one moment."""

    nodewrights: list[JSON]
    nodes: list[JSON]
    check: SnapshotCheck
    attempts: int
    moving: bool = False  # READ_DEADLINE passed without a consistent read


def _status_of(objects: Sequence[JSON], name: str) -> NodeWrightStatus | None:
    for obj in objects:
        if (obj.get("metadata") or {}).get("name") == name:
            try:
                return NodeWrightStatus.model_validate(obj.get("status") or {})
            except ValueError:
                return None  # the controller writes no such status; nothing to pair with the nodes
    return None


def _admissions(nodes: Sequence[JSON], name: str) -> list[Admission]:

    return [a for a in (node_admission(n, name) for n in nodes) if a is not None]


def snapshot_check(
    before: Sequence[JSON], nodes: Sequence[JSON], after: Sequence[JSON], name: str
) -> SnapshotCheck:
    """`plan.preview.check_snapshot` for the NodeWright `name` as read before and after the nodes."""
    old, new = _status_of(before, name), _status_of(after, name)
    return check_snapshot(
        old.compartment_statuses if old is not None else None,
        new.compartment_statuses if new is not None else None,
        _admissions(nodes, name),
        fingerprint=new.rollout_fingerprint if new is not None else None,
    )


async def read_snapshot(
    reads: ClusterReads,
    name: str,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    deadline: float = READ_DEADLINE,
) -> Snapshot:
    """The NodeWrights and the nodes as one moment of the rollout of `name` (module docstring).

    Each attempt lists the NodeWrights, the nodes, and the NodeWrights again. It ends at the first
    consistent attempt; one whose only flaw is unwritten admissions ends once the same read has come
    back for `SETTLE` seconds (members released or deleted: the controller plans with them as they are);
    and at `deadline` the last attempt is used (`moving`).
    """
    started = clock()
    last: tuple[Any, ...] | None = None
    since = started
    attempts = 0
    while True:
        attempts += 1
        before = await reads.nodewrights()
        nodes = await reads.nodes()
        after = await reads.nodewrights()
        check = snapshot_check(before, nodes, after, name)
        if check is SnapshotCheck.CONSISTENT:
            return Snapshot(after, nodes, check, attempts)
        now = clock()
        status = _status_of(after, name)
        seen = (
            check,
            status.compartment_statuses if status else None,
            sorted(map(repr, _admissions(nodes, name))),
        )
        if seen != last:
            last, since = seen, now
        elif check is SnapshotCheck.ADMISSIONS_UNWRITTEN and now - since >= SETTLE:
            return Snapshot(after, nodes, check, attempts)
        if now - started >= deadline:
            return Snapshot(after, nodes, check, attempts, moving=True)
        await sleep(RETRY)


# ----------------------------------------------------------------------------------------------------
# Cluster reads and the command


@dataclass
class Inputs:
    nodewright: NodeWright
    policy: DeploymentPolicy | PolicyInvalid | None
    nodes: list[JSON]
    all_nodewrights: list[NodeWright]
    compartment_statuses: dict[str, CompartmentStatus]
    exists: bool
    budget_objects: list[JSON] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    invalid_nodewrights: list[str] = field(default_factory=list)
    pod_facts: dict[str, list[PodFacts]] | None = None
    """The drain facts of each node's pods, read when the policy orders `idleFirst`."""


class _ApiReads:
    """`ClusterReads` through the API (list requests, each with the client's deadline)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def nodewrights(self) -> list[JSON]:
        from nodewright.kube.resources import NODEWRIGHTS

        return list((await self.client.list(NODEWRIGHTS)).items)

    async def nodes(self) -> list[JSON]:
        from nodewright.kube.resources import NODES

        return list((await self.client.list(NODES)).items)


def _moving_note(snapshot: Snapshot) -> str:
    return (
        f"the rollout kept changing while it was read ({snapshot.attempts} reads in {READ_DEADLINE:.0f} s):"
        " the prediction is from the last read and may be off around the batch under way"
    )


def read_files(args: argparse.Namespace) -> tuple[NodeWright | None, list[DeploymentPolicy]]:
    """The NodeWright of `-f` (if given) and the DeploymentPolicies of `-f` and `--policy`."""
    file_nw: NodeWright | None = None
    file_policies: list[DeploymentPolicy] = []
    if args.filename is not None:
        docs = load_documents(args.filename)
        nws = pick(docs, constants.KIND_NODEWRIGHT)
        if len(nws) != 1:
            raise PlanInputError(f"{args.filename}: expected exactly one NodeWright, found {len(nws)}")
        file_nw = parse_nodewright(nws[0])
        file_policies = [parse_policy(p) for p in pick(docs, constants.KIND_POLICY)]
    if args.policy is not None:
        file_policies += [parse_policy(p) for p in pick(load_documents(args.policy), constants.KIND_POLICY)]
    return file_nw, file_policies


async def gather(args: argparse.Namespace) -> Inputs:
    """`read_inputs` with the files of `args` and a client of its own, made from the cluster flags in
    `args` as every verb makes it (`--request-timeout` bounds each call)."""
    files = read_files(args)
    async with common.open_client(args) as client:
        return await read_inputs(client, args, files)


async def read_inputs(
    client: KubeClient,
    args: argparse.Namespace,
    files: tuple[NodeWright | None, list[DeploymentPolicy]],
) -> Inputs:
    """The cluster's side of the plan; `files` is what `read_files` read from -f and --policy."""
    from nodewright.cli.plugin.cluster import pod_facts
    from nodewright.cli.plugin.common import NotFoundError
    from nodewright.kube.resources import DISRUPTIONBUDGETS, NotFound

    file_nw, file_policies = files
    name = file_nw.metadata.name if file_nw is not None else args.name
    snapshot = await read_snapshot(_ApiReads(client), name)
    nodes, listed_nws = snapshot.nodes, snapshot.nodewrights
    try:
        budget_objects = (await client.list(DISRUPTIONBUDGETS)).items
    except NotFound:
        budget_objects = []  # CRD not installed (an older release): no shared budget to respect
    cache = ModelCache()
    all_nws: list[NodeWright] = []
    invalid: list[str] = []
    for obj in listed_nws:
        model, _ = cache.nodewright(obj)
        if model is not None:
            all_nws.append(model)
        else:
            invalid.append(str(obj["metadata"]["name"]))  # it orders nothing; its cordons count as others'
    existing = next((n for n in all_nws if n.metadata.name == name), None)
    nw = file_nw or existing
    if nw is None:
        raise NotFoundError(f"NodeWright {name!r} not found (give -f to plan one that is not applied)")
    if file_nw is not None and existing is not None:
        # Applying a file to an existing NodeWright keeps its persisted status (a separate subresource).
        nw = file_nw.model_copy(update={"status": existing.status})
    policy = await _policy(client, nw, file_policies)
    statuses = dict((existing.status.compartment_statuses or {}) if existing and existing.status else {})
    all_nws = [n for n in all_nws if n.metadata.name != nw.metadata.name] + [nw]
    notes = [_moving_note(snapshot)] if snapshot.moving else []
    facts = await pod_facts(client) if disruption.opted_in(policy) else None
    return Inputs(
        nw, policy, nodes, all_nws, statuses, existing is not None, budget_objects, notes, invalid, facts
    )


async def _policy(
    client: KubeClient, nw: NodeWright, file_policies: Sequence[DeploymentPolicy]
) -> DeploymentPolicy | PolicyInvalid | None:
    """The NodeWright's DeploymentPolicy: from the files, else the cluster; None when it has none or it
    does not exist (the preview reports PolicyNotFound, like the controller); a stored policy the
    operator refuses blocks the rollout (PolicyInvalid), and is predicted so."""
    from nodewright.kube.resources import DEPLOYMENTPOLICIES, NotFound

    wanted = nw.spec.deployment_policy
    if not wanted:
        return None
    policy = next((p for p in file_policies if p.metadata.name == wanted), None)
    if policy is not None:
        return policy
    try:
        stored = await client.get(DEPLOYMENTPOLICIES, wanted)
    except NotFound:
        return None
    return ModelCache().policy_or_problems(stored)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan", help="predict a rollout (compartments, ceilings, batches, blockers) without changing anything"
    )
    parser.add_argument(
        "name", nargs="?", type=flags.nodewright_name, help="an existing NodeWright (or use -f)"
    )
    parser.add_argument(
        "-f", "--filename", type=flags.existing_file_or_stdin, help="a NodeWright manifest ('-' for stdin)"
    )
    parser.add_argument(
        "--policy",
        type=flags.existing_file,
        help="a DeploymentPolicy manifest (default: read from the cluster)",
    )
    parser.add_argument("-o", "--output", choices=("table", "wide", "json"), default="table")
    common.add_cluster_flags(parser)  # kubectl's flags, as every verb of the plugin
    parser.set_defaults(func=run, prog=parser.prog)


def run(args: argparse.Namespace) -> int:
    """Exit codes as every plugin verb's (docs/plugin.md): 2 usage or unreadable manifests, 3 unknown
    NodeWright, 1 the API server unreachable (within --request-timeout per call)."""
    if (args.name is None) == (args.filename is None):
        return flags.fail(PROG, "give either a NodeWright name or -f FILE")
    try:
        files = read_files(args)  # manifests are read (once: -f - is stdin) before any connection
    except PlanInputError as exc:
        return flags.fail(PROG, exc)

    async def plan(session: common.Session) -> int:
        return await _plan(session, files)

    return common.run(args, plan)


async def _plan(session: common.Session, files: tuple[NodeWright | None, list[DeploymentPolicy]]) -> int:
    inputs = await read_inputs(session.client, session.args, files)
    report = build_report(
        inputs.nodewright,
        policy=inputs.policy,
        nodes=inputs.nodes,
        all_nodewrights=inputs.all_nodewrights,
        compartment_statuses=inputs.compartment_statuses,
        exists=inputs.exists,
        budget_objects=inputs.budget_objects,
        invalid_nodewrights=inputs.invalid_nodewrights,
        node_pods=node_pods_of(inputs.pod_facts),
    )
    report = replace(report, notes=(*report.notes, *inputs.notes))
    if session.args.output == "json":
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        sys.stdout.write(render(report, wide=session.args.output == "wide"))
    sys.stdout.flush()
    return common.OK


if __name__ == "__main__":  # `python -m nodewright.cli.plan_cmd plan ...` until it is registered
    from nodewright.cli.main import main

    sys.exit(main())
