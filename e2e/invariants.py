"""Fleet-safety invariant monitor for e2e tests on the real control plane.

`InvariantMonitor` watches Nodes (cluster-wide), Pods (all namespaces), NodeWrights, DeploymentPolicies
and DisruptionBudgets with raw watch streams and checks, at every event, the invariants I1-I11
documented in docs/invariants.md (budget hard cap, every change through batches, no disruption without
our cordon, protected pods, foreign cordons, cleanup, stage order, halted compartments, one pod per
node and package at a time: a terminating package pod may still be running on the host, so no pod of
the same package starts on that node before it is gone; shared DisruptionBudgets: across every
NodeWright, the disrupted nodes of a pool never exceed its budget; topology domains: a compartment with a
`topologyKey` never has more domains disrupted than its budget, and admits a domain whole). A breach is
recorded as a
`Breach` with full context; the e2e fixture `invariants` fails the test on any breach or if the monitor
itself failed (crashed handler, watch that stayed broken): a monitor that cannot see must never pass.

Independence: the monitor re-derives what it needs from the wire format (labels, the state annotation
via the codec in `nodewright.api.nodestate`, the CRs' JSON). It does not import `nodewright.plan`:
compartment assignment and ceilings are computed here from the rules in docs/rollout.md, so a planner
bug cannot hide itself.

Ordering across streams. Each resource has its own watch, so an event on one stream can be processed
before an earlier write that arrives on another (the operator records its cordon on the node, then
evicts a pod; the pod's DELETE may be read first). kube-apiserver resource versions are etcd
revisions, ordered across resources, so:
- every node keeps a short history `(rv, exists, unschedulable, NodeWrights claiming the cordon)`;
- checks that relate a pod event to node state (I3a, I3b) are queued with the pod event's revision and
  evaluated against the node *as of that revision*, once the node stream has processed an event at or
  beyond it, or after `SKEW_WAIT` seconds without one (watch delivery is milliseconds; a quiet stream
  has nothing older pending);
- I8 compares revisions of halt, reset and admission writes instead of arrival order.

Relists (HTTP 410 / expired watch, reconnects after an outage, every kube-apiserver restart) are
diffed against the store: changed objects are treated as modified, vanished ones as deleted, objects
that appeared as created, in that order (a pod's success is known, and a vanished predecessor gone,
before its successor's creation: the state after the gap). Decisions for events inside a gap are made
with that state (documented limitation); a package pod that vanished before its outcome was seen is
marked `vanished`, and checks that would need that outcome (I7) do not judge its successor.

Performance: state annotations are decoded only when their text changes; compartment assignment is
cached per NodeWright and recomputed only when the NodeWright, its policy, the set of nodes or a node's
non-status labels change; per-event work is proportional to the nodes of one compartment at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import aiohttp

from nodewright.api import constants as c
from nodewright.api.admission import Admission as BatchAdmission
from nodewright.api.admission import MalformedAdmission, admission_annotation, decode_admission
from nodewright.api.nodestate import Admission, MalformedNodeState, NodeState, decode
from nodewright.plan import podspec
from nodewright.sim.fleet import WORKLOAD_JOB_LABEL, TrainingJob
from nodewright.sim.kubeapi import JSON, ApiError, KubeClient

SKEW_WAIT: Final = 1.0
"""Seconds a cross-stream check waits for the node stream to reach the pod event's revision."""
MAX_OUTAGE: Final = 60.0
"""A watch that cannot list or watch for this long makes the monitor fail (it would be blind)."""
RETRY_MAX: Final = 0.5
"""Longest wait between list/watch attempts in an outage: the API server is local, and every second of
waiting after it is back widens the gap whose events only a relist shows (after a restart, always)."""
HISTORY: Final = 64
MAX_BREACHES: Final = 1000
WATCH_SECONDS: Final = 50
CRD_POLL: Final = 2.0

INVARIANTS: Final[Mapping[str, str]] = {
    "I1": "budget hard cap: in-progress nodes of a compartment never exceed its ceiling",
    "I2": "every change through batches: nodes with unfinished package pods never exceed the ceiling",
    "I3": "no eviction or interrupt on a node NodeWright did not cordon first",
    "I4": "protected pods (podNonInterruptLabels) are never evicted nor interrupted",
    "I5": "a node cordoned by someone else is never uncordoned",
    "I6": "complete nodes are not left cordoned; deleted NodeWrights leave no node state behind",
    "I7": "package stage pods are created in stage order, each after its predecessor succeeded",
    "I8": "a halted compartment admits no new node until its batch state is reset (or a new rollout starts)",
    "I9": "one pod per node, NodeWright and package at a time: none created while another runs or terminates",
    "I10": "across NodeWrights, the disrupted nodes of a DisruptionBudget's pool never exceed its budget",
    "I11": "topology domains: never more domains of a compartment disrupted than its budget, and a domain"
    " admitted whole (one batch), never left partly done while another starts",
    "MONITOR": "the monitor itself failed; its verdict cannot be trusted",
}

OPERATOR_LABELS: Final = {c.POD_OWNER_LABEL: c.POD_OWNER_VALUE}
INTERRUPT_STAGES: Final = frozenset({"interrupt", "uninstall-interrupt"})
RUN_START_STAGES: Final = frozenset({"apply", "upgrade", "uninstall"})
WORK_STAGES: Final = frozenset({"apply", "upgrade", "config", "uninstall", "post-interrupt"})
"""Stages whose work runs in `<package>-<stage>` init containers (interrupts run in `interrupt`)."""
STATUS_IN_PROGRESS: Final = "in_progress"
STATUS_COMPLETE: Final = "complete"
_HALT_MESSAGE = re.compile(r"""compartment ['"]([^'"]+)['"] halted""")

PATHS: Final[Mapping[str, str]] = {
    "nodes": "/api/v1/nodes",
    "pods": "/api/v1/pods",
    "nodewrights": f"/apis/{c.GROUP}/{c.VERSION}/{c.PLURAL_NODEWRIGHT}",
    "policies": f"/apis/{c.GROUP}/{c.VERSION}/{c.PLURAL_POLICY}",
    "budgets": f"/apis/{c.GROUP}/{c.VERSION}/{c.PLURAL_BUDGET}",
}


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _rv(obj: Mapping[str, Any]) -> int:
    """An object's resourceVersion as an int (etcd revision); 0 when missing or not numeric."""
    text = str(obj.get("metadata", {}).get("resourceVersion", "") or "")
    return int(text) if text.isdigit() else 0


# ----------------------------------------------------------------------------------------------------
# Breaches


@dataclass(frozen=True)
class Breach:
    """One observed violation: which invariant, where, and what was seen (for a readable report)."""

    invariant: str
    summary: str
    node: str | None = None
    nodewright: str | None = None
    pods: tuple[str, ...] = ()
    resource_version: int = 0
    observed_at: str = field(default_factory=_now)
    details: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        head = f"[{self.invariant}] {self.summary}"
        ctx = [f"observed_at={self.observed_at}"]
        if self.resource_version:
            ctx.append(f"rv={self.resource_version}")
        if self.nodewright:
            ctx.append(f"nodewright={self.nodewright}")
        if self.node:
            ctx.append(f"node={self.node}")
        if self.pods:
            ctx.append(f"pods={', '.join(self.pods)}")
        lines = [head, "    " + " ".join(ctx)]
        lines += [f"    {k}: {v}" for k, v in self.details]
        return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# Label selectors and compartments, re-derived from the wire format (no nodewright.plan import).


def selector_empty(selector: Mapping[str, Any] | None) -> bool:
    return not selector or (not selector.get("matchLabels") and not selector.get("matchExpressions"))


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics; a nil or empty selector matches everything."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for req in selector.get("matchExpressions") or []:
        key, op, values = req.get("key", ""), req.get("operator", ""), req.get("values") or []
        if op == "In" and not (key in labels and labels[key] in values):
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def ceiling(budget: Mapping[str, Any], matched: int) -> int:
    """`count`, or max(1, floor(matched * percent / 100)); 100% when neither is set; 0 when empty."""
    if matched <= 0:
        return 0
    count = budget.get("count")
    if count is not None:
        return int(count)
    percent = budget.get("percent")
    percent = 100 if percent is None else int(percent)
    return max(1, matched * percent // 100)


_STRATEGY_SAFETY = {"fixed": 0, "linear": 1, "exponential": 2}


def _strategy_rank(strategy: Mapping[str, Any] | None) -> int:
    """fixed < linear < exponential < no strategy (3): lower grows more slowly, i.e. is safer."""
    if not strategy:
        return 3
    return min((_STRATEGY_SAFETY[k] for k in strategy if k in _STRATEGY_SAFETY), default=3)


@dataclass(frozen=True)
class Compartments:
    """A NodeWright's matched nodes partitioned into compartments, with each compartment's ceiling (in
    domains for a compartment with a `topologyKey`: `topology` maps it to the label)."""

    assignment: Mapping[str, str]
    ceilings: Mapping[str, int]
    source: str
    topology: Mapping[str, str] = field(default_factory=dict)
    domains: Mapping[str, str] = field(default_factory=dict)
    """node -> its domain, for the nodes of topology compartments."""

    def members(self, compartment: str) -> list[str]:
        return [n for n, comp in self.assignment.items() if comp == compartment]

    def units(self, compartment: str, nodes: Iterable[str]) -> set[str]:
        """What the ceiling counts among `nodes`: their domains, or the nodes themselves."""
        if compartment in self.topology:
            return {self.domains[n] for n in nodes}
        return set(nodes)


def domain_of(key: str, name: str, labels: Mapping[str, str]) -> str:
    """The node's value of the topology label; a node without it is a domain of its own (docs/rollout.md)."""
    return labels.get(key) or f"<{name}>"


def resolve_compartments(
    nodewright: Mapping[str, Any],
    policy: Mapping[str, Any] | None,
    nodes: Mapping[str, Mapping[str, str]],
) -> Compartments | None:
    """Assign the NodeWright's matched nodes (spec.nodeSelectors; empty = all) to compartments.

    Policy: the matching compartment; several → safest strategy, then smaller ceiling over every
    matched node the selector matches (at least 1), then name; none → `__default__`. No policy: one
    `__default__` compartment from the legacy interruptionBudget (count 0 counts as 1; unset = 100%).
    Returns None when the named policy is unknown (nothing can be judged then).
    """
    spec = nodewright.get("spec") or {}
    matched = {
        n: labels for n, labels in nodes.items() if selector_matches(spec.get("nodeSelectors"), labels)
    }
    policy_name = spec.get("deploymentPolicy")
    if not policy_name:
        budget = dict(spec.get("interruptionBudget") or {})
        if budget.get("count") is not None:
            budget = {"count": max(1, int(budget["count"]))}
        assignment = dict.fromkeys(matched, c.DEFAULT_COMPARTMENT)
        return Compartments(
            assignment,
            {c.DEFAULT_COMPARTMENT: ceiling(budget, len(matched))},
            f"legacy budget {budget or '100%'}",
        )
    if policy is None or policy.get("metadata", {}).get("name") != policy_name:
        return None
    pspec = policy.get("spec") or {}
    declared = [comp for comp in pspec.get("compartments") or [] if comp.get("name") != c.DEFAULT_COMPARTMENT]
    found = {
        n: [comp for comp in declared if selector_matches(comp.get("selector"), lb)]
        for n, lb in matched.items()
    }
    totals = {comp["name"]: sum(comp in f for f in found.values()) for comp in declared}

    def safety(comp: Mapping[str, Any]) -> tuple[int, int, str]:
        return (
            _strategy_rank(comp.get("strategy")),
            ceiling(comp.get("budget") or {}, max(1, totals[comp["name"]])),
            str(comp["name"]),
        )

    assignment = {n: (min(f, key=safety)["name"] if f else c.DEFAULT_COMPARTMENT) for n, f in found.items()}
    budgets = {comp["name"]: comp.get("budget") or {} for comp in declared}
    budgets[c.DEFAULT_COMPARTMENT] = (pspec.get("default") or {}).get("budget") or {}
    topology = {str(comp["name"]): str(comp["topologyKey"]) for comp in declared if comp.get("topologyKey")}
    domains = {
        n: domain_of(topology[comp], n, matched[n]) for n, comp in assignment.items() if comp in topology
    }
    units: dict[str, set[str]] = {name: set() for name in budgets}
    for n, comp_name in assignment.items():
        units[comp_name].add(domains.get(n, n))
    ceilings = {name: ceiling(b, len(units[name])) for name, b in budgets.items()}
    return Compartments(assignment, ceilings, f"policy {policy_name}", topology, domains)


# ----------------------------------------------------------------------------------------------------
# Pods


def pod_outcome(pod: Mapping[str, Any]) -> str | None:
    """ "succeeded", "failed" or None (still running).

    A package pod has a `pause` main container, so success is "every init container terminated with
    exit 0" (it never reaches Succeeded; phase Succeeded also counts), whatever the phase says: a real
    kubelet reports Pending between the last init container's exit and the start of `pause`, and a pod
    deleted then stays Pending while it terminates, with no host work left to do.
    """
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase == "Failed":
        return "failed"
    if phase == "Succeeded":
        return "succeeded"
    inits = status.get("initContainerStatuses") or []
    declared = len((pod.get("spec") or {}).get("initContainers") or [])
    done = all((s.get("state") or {}).get("terminated", {}).get("exitCode", 1) == 0 for s in inits)
    if inits and len(inits) >= declared and done:
        return "succeeded"
    return None


def pod_stages(pod: Mapping[str, Any], package: str | None = None) -> tuple[tuple[str, ...], frozenset[str]]:
    """(the stages a package pod runs for `package` -- default its own --, in order; those that
    succeeded), from its init containers.

    A package pod runs each stage of its transition as `<package>-<stage>` then `<package>-<stage>check`
    (an install pod: apply and config), and a chained pod (`nodewright.io/chain`) the same for each
    chained package after its own; a stage succeeded when both exited 0. An interrupt pod (one
    `interrupt` container) runs the stage of its label.
    """
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    own = labels.get(c.POD_LABEL_PACKAGE, "")
    label = labels.get(c.POD_LABEL_STAGE, "") if package is None else ""
    package = own if package is None else package
    prefix = f"{package}-"
    names = [str(x.get("name", "")) for x in (pod.get("spec") or {}).get("initContainers") or []]
    stages = tuple(
        n[len(prefix) :] for n in names if n.startswith(prefix) and n[len(prefix) :] in WORK_STAGES
    ) or ((label,) if label else ())
    exited = {
        str(st.get("name", ""))
        for st in (pod.get("status") or {}).get("initContainerStatuses") or []
        if ((st.get("state") or {}).get("terminated") or {}).get("exitCode", 1) == 0
    }
    ok = frozenset(
        stage
        for stage in stages
        if f"{prefix}{stage}" in exited
        and (f"{prefix}{stage}check" not in names or f"{prefix}{stage}check" in exited)
    )
    return stages, ok


@dataclass
class PodRecord:
    """What the checks need of a pod; package pods stay in the run history after they are gone."""

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    node: str
    phase: str
    outcome: str | None
    deleting: bool
    created_rv: int
    created_at: str
    interrupt_type: str = ""
    boot_at_create: str | None = None
    gone: bool = False
    vanished: bool = False
    """Deleted inside a watch gap: the outcome is the last one seen, which may not be the final one."""
    stages: tuple[str, ...] = ()
    """The stages the pod runs, in order (`pod_stages`)."""
    stages_ok: frozenset[str] = frozenset()
    """The stages its init containers say succeeded (a recorded success survives later status changes)."""
    chain_runs: tuple[tuple[str, str, str, tuple[str, ...], frozenset[str]], ...] = ()
    """Chained runs after its own (`nodewright.io/chain`): (package, version, first stage, stages, ok)."""

    @property
    def packages(self) -> tuple[str, ...]:
        """Every package whose host work the pod runs: its own, then the chained ones."""
        return (self.package, *(run[0] for run in self.chain_runs))

    def run_views(self) -> list[PodRecord]:
        """The pod as one record per package run it carries: itself, then one per chained run (with
        that package's labels and stages), so run histories and I7/I9 judge each package's runs."""
        views = [self]
        for package, version, stage, stages, ok in self.chain_runs:
            labels = {
                **self.labels,
                c.POD_LABEL_PACKAGE: package,
                c.POD_LABEL_VERSION: podspec.label_value(version),
                c.POD_LABEL_STAGE: stage,
            }
            views.append(replace(self, labels=labels, stages=stages, stages_ok=ok, chain_runs=()))
        return views

    @property
    def reached(self) -> tuple[str, bool]:
        """(the last stage the pod got to, whether it succeeded there): the stage that failed, or the
        last one when every stage succeeded, for I7."""
        stages = self.stages or (self.stage,)
        ok = self.stages_ok or (frozenset(stages) if self.outcome == "succeeded" else frozenset())
        for stage in stages:
            if stage not in ok:
                return stage, False
        return stages[-1], True

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def is_package(self) -> bool:
        """A package stage pod. Drift-check pods (read-only, outside batches: no cordon, no budget slot)
        are not judged as stage pods."""
        if self.labels.get(c.POD_LABEL_PURPOSE) == c.POD_PURPOSE_DRIFT_CHECK:
            return False
        return all(self.labels.get(k) == v for k, v in OPERATOR_LABELS.items())

    @property
    def stage(self) -> str:
        return self.labels.get(c.POD_LABEL_STAGE, "")

    @property
    def nodewright(self) -> str:
        return self.labels.get(c.POD_LABEL_NODEWRIGHT, "")

    @property
    def package(self) -> str:
        return self.labels.get(c.POD_LABEL_PACKAGE, "")

    @property
    def unfinished(self) -> bool:
        return not self.gone and not self.deleting and self.outcome is None

    @property
    def outcome_unknown(self) -> bool:
        """Gone before any outcome was seen, inside a watch gap: it may have succeeded or failed."""
        return self.vanished and self.outcome is None

    def describe(self) -> str:
        state = "gone" if self.gone else ("terminating" if self.deleting else self.phase)
        out = f"{self.namespace}/{self.name} ({state}"
        if self.is_package:
            out += f", stage {self.stage}, outcome {self.outcome or 'none'}"
            if len(self.stages) > 1:
                out += f", stages {'+'.join(self.stages)} (ok: {'+'.join(sorted(self.stages_ok)) or 'none'})"
        return out + f", created {self.created_at})"


@dataclass(frozen=True)
class StagePod:
    """A package pod as the monitor saw it over its life, for tests that count stage runs."""

    name: str
    uid: str
    node: str
    package: str
    version: str
    stage: str
    outcome: str | None
    """"succeeded" (for a reboot interrupt also: the node came back Ready with a new bootID), "failed",
    or None: it never finished while the monitor saw it (deleted while running, or still running)."""
    outcome_unknown: bool
    """It vanished inside a watch gap before an outcome was seen."""
    stages: tuple[str, ...] = ()
    """The stages the pod runs, in order (an install pod: apply and config)."""
    succeeded: tuple[str, ...] = ()
    """The stages it ran successfully (its init containers; an interrupt: as `outcome`)."""


def _pod_record(obj: Mapping[str, Any], old: PodRecord | None) -> PodRecord:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    interrupt_type = ""
    raw = (meta.get("annotations") or {}).get(c.POD_ANNOTATION_INTERRUPT)
    if raw:
        try:
            interrupt_type = str(json.loads(raw).get("type", ""))
        except (ValueError, AttributeError):
            interrupt_type = "unparseable"
    outcome = pod_outcome(obj)
    stages, ok = pod_stages(obj)
    links = podspec.parse_chain((meta.get("annotations") or {}).get(c.POD_ANNOTATION_CHAIN)) or ()
    previous = {run[0]: run[4] for run in old.chain_runs} if old else {}
    chain_runs = tuple(
        (package, version, stage.value, *_with_ok(pod_stages(obj, package), previous.get(package)))
        for package, version, stage in links
    )
    return PodRecord(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        labels=labels,
        node=podspec.pod_node(obj),  # created unbound, for this node (bound by the operator)
        phase=(obj.get("status") or {}).get("phase") or "Pending",
        # A recorded success survives later status changes (a deleted pod does not "unsucceed").
        outcome=outcome or (old.outcome if old else None),
        deleting=bool(meta.get("deletionTimestamp")),
        created_rv=old.created_rv if old else _rv(obj),
        created_at=meta.get("creationTimestamp", ""),
        interrupt_type=interrupt_type,
        boot_at_create=old.boot_at_create if old else None,
        stages=stages,
        stages_ok=ok | (old.stages_ok if old else frozenset()),
        chain_runs=chain_runs,
    )


def _with_ok(
    found: tuple[tuple[str, ...], frozenset[str]], before: frozenset[str] | None
) -> tuple[tuple[str, ...], frozenset[str]]:
    stages, ok = found
    return stages, ok | (before or frozenset())


# ----------------------------------------------------------------------------------------------------
# Nodes


@dataclass(frozen=True)
class NodeSnapshot:
    """A node at one revision, for "as of" queries by cross-stream checks."""

    rv: int
    exists: bool
    unschedulable: bool
    cordoning: frozenset[str]


@dataclass
class NodeRecord:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    unschedulable: bool
    state_texts: dict[str, str]
    states: dict[str, NodeState | None]
    boot_id: str
    ready: bool
    conditions: frozenset[str]
    foreign_cordon: bool = False
    cordon_owners: frozenset[str] = frozenset()

    @property
    def cordoning(self) -> frozenset[str]:
        """NodeWrights whose state annotation says they cordoned the node."""
        return frozenset(nw for nw, s in self.states.items() if s is not None and s.cordoned)

    def status(self, nodewright: str) -> str | None:
        return self.labels.get(c.status_label(nodewright))

    def admission(self, nodewright: str) -> Admission | None:
        s = self.states.get(nodewright)
        return s.admission if s is not None else None

    @property
    def disrupted(self) -> bool:
        """Out of service (I10): in progress for any NodeWright, cordoned by anyone, or NotReady."""
        in_progress = any(
            k.startswith(c.STATUS_LABEL_PREFIX) and v == STATUS_IN_PROGRESS for k, v in self.labels.items()
        )
        return in_progress or self.unschedulable or not self.ready


def _batch_admission(rec: NodeRecord, nodewright: str) -> BatchAdmission | None:
    """The rollout admission on the node (`nodewright.io/batch.<nw>`: compartment, batch, spec
    fingerprint), None when absent or unreadable."""
    text = rec.annotations.get(admission_annotation(nodewright))
    if text is None:
        return None
    try:
        return decode_admission(text)
    except MalformedAdmission:
        return None


def _selection_labels(labels: Mapping[str, str]) -> dict[str, str]:
    # Status labels change at every node transition and are no selection input; skipping them keeps
    # the compartment cache valid through a rollout.
    return {k: v for k, v in labels.items() if not k.startswith(c.STATUS_LABEL_PREFIX)}


# ----------------------------------------------------------------------------------------------------
# Watches


class MonitorFailure(RuntimeError):
    """The monitor could not observe the cluster (or crashed); its verdict is void."""


@dataclass
class _Watch:
    kind: str
    path: str
    objects: dict[tuple[str, str], JSON] = field(default_factory=dict)
    rv: str = ""
    progress: int = 0
    installed: bool = True
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    relist: bool = True
    relists: int = 0
    outage_since: float | None = None
    last_error: str = ""


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace", "") or "", meta.get("name", ""))


@dataclass
class _Pending:
    rv: int
    received: float
    check: Callable[[], None]


@dataclass
class _HaltInterval:
    """A compartment halted from revision `start` until the reset at revision `end` (None = still);
    `rollout` is the status's (rolloutFingerprint, rolloutFirstOrder) when it halted."""

    start: int
    end: int | None = None
    observed_at: str = field(default_factory=_now)
    source: str = ""
    rollout: tuple[str, int] = ("", 0)


class InvariantMonitor:
    """Watches the cluster beside a test and records `Breach`es of I1-I10 (see module docstring)."""

    def __init__(self, kubeconfig: Path, *, namespace: str = "nodewright-system") -> None:
        self.kubeconfig = Path(kubeconfig)
        self.namespace = namespace
        self.breaches: list[Breach] = []
        self.failures: list[str] = []
        self.notes: list[str] = []
        self.dropped = 0
        self._client: KubeClient | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._watches = {kind: _Watch(kind, path) for kind, path in PATHS.items()}
        self._nodes: dict[str, NodeRecord] = {}
        self._node_history: dict[str, deque[NodeSnapshot]] = {}
        self._pods: dict[tuple[str, str], PodRecord] = {}
        self._pods_by_node: dict[str, set[tuple[str, str]]] = {}
        self._runs: dict[tuple[str, str, str, str], list[PodRecord]] = {}
        self._interrupts: dict[tuple[str, str], list[PodRecord]] = {}
        self._active: dict[str, dict[str, set[tuple[str, str]]]] = {}
        self._nodewrights: dict[str, JSON] = {}
        self._policies: dict[str, JSON] = {}
        self._budgets: dict[str, JSON] = {}
        self._max_disrupted: dict[str, int] = {}
        self._max_domains: dict[tuple[str, str], int] = {}
        self._domains_started: dict[tuple[str, str], list[str]] = {}
        self._compartments: dict[str, Compartments | None] = {}
        self._halts: dict[tuple[str, str], list[_HaltInterval]] = {}
        self._resets: dict[str, int] = {}
        self._suppressed: dict[str, set[str]] = {}
        # (nw, node) -> (revision, admission, whether it was a new admission seen while monitoring)
        self._admissions: dict[tuple[str, str], tuple[int, Admission, bool]] = {}
        self._pending: deque[_Pending] = deque()
        self._expected_uncordon: set[str] = set()
        self._expected_cleanup: set[str] = set()
        self._allowed: set[tuple[str, str | None]] = set()
        self._started = False
        self._stopping = False
        self._start_rv = 0
        self._outage_clock: Callable[[], float] = time.monotonic  # how long a watch has been blind

    # -- public API ------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self, *, within: float = 60.0) -> None:
        """Start the watches and return once each has its initial list (the baseline)."""
        if self._started:
            raise RuntimeError("monitor already started")
        self._started = True
        self._client = KubeClient(self.kubeconfig, max_in_flight=8)
        for watch in self._watches.values():
            self._tasks.append(asyncio.create_task(self._run_watch(watch), name=f"invariants-{watch.kind}"))
        self._tasks.append(asyncio.create_task(self._tick(), name="invariants-tick"))
        try:
            async with asyncio.timeout(within):
                for watch in self._watches.values():
                    await watch.synced.wait()
        except TimeoutError:
            await self.stop()
            raise MonitorFailure(
                "initial list did not complete: "
                + "; ".join(
                    f"{w.kind}: {w.last_error}" for w in self._watches.values() if not w.synced.is_set()
                )
            ) from None

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._client is not None:
            await self._client.close()
            self._client = None

    def expect_uncordon(self, node: str) -> None:
        """The test is about to uncordon `node` itself (I5 allows the next uncordon of it once)."""
        self._expected_uncordon.add(node)

    def expect_cleanup(self, nodewright: str) -> None:
        """The test deleted NodeWright `nodewright`: `final_check` verifies nothing of it is left (I6)."""
        self._expected_cleanup.add(nodewright)

    def allow_deletion(self, namespace: str, pod: str | None = None) -> None:
        """The test deletes this pod (None: every pod of the namespace) itself: not an eviction (I3, I4)."""
        self._allowed.add((namespace, pod))

    def allow_workload_deletion(self, job: TrainingJob) -> None:
        """`fleet.delete_workloads(job)` is about to run: its pod deletions are the test's own."""
        for pod in job.pods:
            self._allowed.add((job.namespace, pod))

    def status_counts(self, nodewright: str) -> dict[str, int]:
        """How many nodes carry each value of `nodewright.io/status.<nodewright>`, as last seen.

        Costs no API call and answers during an API-server outage (with what was seen before it)."""
        counts: dict[str, int] = {}
        for node in self._nodes.values():
            value = node.status(nodewright)
            if value is not None:
                counts[value] = counts.get(value, 0) + 1
        return counts

    def stage_pods(self, nodewright: str) -> list[StagePod]:
        """Every package pod of `nodewright` seen since `start()` (deleted ones included), by creation."""
        pods = sorted(
            (p for (nw, *_), history in self._runs.items() if nw == nodewright for p in history),
            key=lambda p: p.created_rv,
        )
        out = []
        for p in pods:
            done = p.stage in INTERRUPT_STAGES and self._interrupt_done(p)
            outcome = "succeeded" if done else p.outcome
            stages = p.stages or (p.stage,)
            ok = p.stages_ok or (frozenset(stages) if outcome == "succeeded" else frozenset())
            out.append(
                StagePod(
                    name=p.name,
                    uid=p.uid,
                    node=p.node,
                    package=p.package,
                    version=p.labels.get(c.POD_LABEL_VERSION, ""),
                    stage=p.stage,
                    outcome=outcome,
                    outcome_unknown=p.vanished and outcome is None,
                    stages=stages,
                    succeeded=tuple(s for s in stages if s in ok),
                )
            )
        return out

    def breaches_of(self, invariant: str, *, node: str | None = None) -> list[Breach]:
        return [b for b in self.breaches if b.invariant == invariant and (node is None or b.node == node)]

    def max_disrupted(self, budget: str) -> int:
        """The most nodes of DisruptionBudget `budget`'s pool seen disrupted at once (I10's count: in
        progress for any NodeWright, cordoned by anyone, or NotReady), over the monitor's lifetime."""
        self._drain_pending(force=False)
        return self._max_disrupted.get(budget, 0)

    def max_domains_disrupted(self, nodewright: str, compartment: str) -> int:
        """The most domains of a topology compartment seen disrupted at once (I11), when work started."""
        self._drain_pending(force=False)
        return self._max_domains.get((nodewright, compartment), 0)

    def domains_started(self, nodewright: str, compartment: str) -> list[str]:
        """The domains of a topology compartment in the order their first node entered in_progress."""
        self._drain_pending(force=False)
        return list(self._domains_started.get((nodewright, compartment), []))

    async def wait_for_breach(
        self, invariant: str, *, node: str | None = None, within: float = 15.0
    ) -> Breach:
        """Wait until a breach of `invariant` (on `node`) is recorded; raise TimeoutError otherwise."""
        deadline = time.monotonic() + within
        while True:
            self._drain_pending(force=False)
            found = self.breaches_of(invariant, node=node)
            if found:
                return found[0]
            self._raise_if_failed()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no {invariant} breach{f' on {node}' if node else ''} within {within}s; "
                    f"recorded: {[str(b) for b in self.breaches] or 'none'}"
                )
            await asyncio.sleep(0.05)

    async def sync(self, *, within: float = 20.0) -> None:
        """Wait until every watch reflects the cluster as of now, then evaluate every queued check.

        Caught up = a fresh list of the resource equals the store (names and revisions), or the watch
        has processed an event at or beyond the list's revision.
        """
        assert self._client is not None, "monitor not started"
        deadline = time.monotonic() + within
        for watch in self._watches.values():
            while True:
                self._raise_if_failed()
                if not watch.installed:
                    break
                try:
                    listed = await self._client.list_all(watch.path)
                except ApiError as err:
                    if err.status == 404:
                        break
                    raise
                target = int(listed["resourceVersion"]) if str(listed["resourceVersion"]).isdigit() else 0
                current = {_key(o): _rv(o) for o in listed["items"]}
                mine = {k: _rv(o) for k, o in watch.objects.items()}
                if current == mine or (target and watch.progress >= target):
                    break
                if time.monotonic() > deadline:
                    self._fail(f"{watch.kind} watch did not catch up within {within}s (sync)")
                    break
                await asyncio.sleep(0.05)
        self._drain_pending(force=True)
        self._raise_if_failed()

    async def final_check(self) -> list[Breach]:
        """Sync, then check the end-state invariants (I6); returns every breach recorded so far."""
        if self.failures:
            return self.breaches
        try:
            await self.sync()
        except MonitorFailure:
            return self.breaches
        for node in sorted(self._nodes.values(), key=lambda n: n.name):
            self._check_complete_uncordoned(node)
        for nw in sorted(self._expected_cleanup):
            self._check_cleanup(nw)
        return self.breaches

    @property
    def crashed(self) -> bool:
        return bool(self.failures)

    def report(self) -> str:
        lines: list[str] = []
        if self.failures:
            lines.append("INVARIANT MONITOR FAILED (its verdict cannot be trusted):")
            lines += [f"  {f}" for f in self.failures]
        if self.breaches:
            lines.append(f"{len(self.breaches) + self.dropped} fleet-safety breach(es):")
            for b in self.breaches:
                lines += ["  " + line for line in str(b).splitlines()]
            if self.dropped:
                lines.append(f"  ... and {self.dropped} more not recorded")
        return "\n".join(lines) if lines else "no breach"

    def assert_clean(self) -> None:
        if self.failures or self.breaches:
            raise AssertionError(self.report())

    # -- bookkeeping ----------------------------------------------------------------------------

    def _breach(self, breach: Breach) -> None:
        if len(self.breaches) >= MAX_BREACHES:
            self.dropped += 1
            return
        self.breaches.append(breach)

    def _fail(self, message: str) -> None:
        self.failures.append(f"{_now()} {message}")

    def _raise_if_failed(self) -> None:
        if self.failures:
            raise MonitorFailure("; ".join(self.failures))

    def _allowed_deletion(self, pod: PodRecord) -> bool:
        return (pod.namespace, pod.name) in self._allowed or (pod.namespace, None) in self._allowed

    # -- watch machinery -----------------------------------------------------------------------

    async def _run_watch(self, watch: _Watch) -> None:
        assert self._client is not None
        backoff = 0.2
        while not self._stopping:
            try:
                if watch.relist:
                    listed = await self._client.list_all(watch.path)
                    watch.installed = True
                    self._apply_list(watch, listed["items"], str(listed["resourceVersion"]))
                    watch.relist = False
                    watch.synced.set()
                    watch.outage_since = None  # the API server answers again: the outage is over
                async for event in self._client.watch(
                    watch.path, resource_version=watch.rv, timeout_s=WATCH_SECONDS
                ):
                    # Over as soon as events flow, not only when the stream ends cleanly: with API-server
                    # restarts closer together than WATCH_SECONDS, no stream ends cleanly, and two outages
                    # a minute apart read as one of 60 s.
                    watch.outage_since = None
                    if not self._handle_event(watch, event):
                        break
                watch.outage_since = None
                backoff = 0.2
            except asyncio.CancelledError:
                raise
            except ApiError as err:
                if err.status == 410:
                    watch.relist = True
                    continue
                if err.status == 404 and watch.kind in ("nodewrights", "policies", "budgets"):
                    # CRDs not installed (yet): nothing to watch; poll until they are.
                    watch.installed = False
                    watch.relist = True
                    if watch.objects:
                        self._apply_list(watch, [], watch.rv)
                    watch.synced.set()
                    await asyncio.sleep(CRD_POLL)
                    continue
                if not self._outage(watch, f"HTTP {err.status}: {str(err)[:200]}"):
                    return
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_MAX)
            except (aiohttp.ClientError, TimeoutError, ConnectionError, ValueError) as err:
                # ValueError: a truncated JSON line when the server cut the stream.
                if not self._outage(watch, f"{type(err).__name__}: {err}"):
                    return
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_MAX)
            except Exception:  # a bug in a check: report it, never pass silently
                self._fail(f"{watch.kind} handler crashed:\n{traceback.format_exc()}")
                return

    def _outage(self, watch: _Watch, error: str) -> bool:
        """Record a failed list/watch attempt; False once the watch has been blind for MAX_OUTAGE."""
        now = self._outage_clock()
        watch.last_error = error
        if watch.outage_since is None:
            watch.outage_since = now
            self.notes.append(f"{_now()} {watch.kind} watch interrupted: {error}")
        if now - watch.outage_since > MAX_OUTAGE:
            self._fail(f"{watch.kind} watch could not list or watch for {MAX_OUTAGE:.0f}s (last: {error})")
            return False
        return True

    def _handle_event(self, watch: _Watch, event: JSON) -> bool:
        """Apply one watch event; False when the stream must be restarted with a relist."""
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            watch.relist = True
            watch.relists += 1
            if code not in (410, None):
                self.notes.append(f"{_now()} {watch.kind} watch error {code}: {obj.get('message', '')}")
            return False
        rv_text = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if kind == "BOOKMARK":
            watch.rv = rv_text
            watch.progress = max(watch.progress, _rv(obj))
            self._drain_pending(force=False)
            return True
        key = _key(obj)
        old = watch.objects.get(key)
        if kind == "DELETED":
            watch.objects.pop(key, None)
        else:
            watch.objects[key] = obj
        watch.rv = rv_text
        self._dispatch(watch.kind, str(kind), obj, old, rv=_rv(obj), baseline=False)
        watch.progress = max(watch.progress, _rv(obj))
        if watch.kind == "nodes":
            self._drain_pending(force=False)
        return True

    def _apply_list(self, watch: _Watch, items: list[JSON], rv: str) -> None:
        """Make the store equal a fresh list, dispatching the differences as events."""
        baseline = not watch.synced.is_set()
        fresh = {_key(o): o for o in items}
        old = watch.objects
        watch.objects = dict(fresh)
        changed = [(o, old[k]) for k, o in fresh.items() if k in old and _rv(o) != _rv(old[k])]
        added = [o for k, o in fresh.items() if k not in old]
        removed = [o for k, o in old.items() if k not in fresh]
        for obj, before in changed:
            self._dispatch(watch.kind, "MODIFIED", obj, before, rv=_rv(obj), baseline=False)
        # A vanished object was deleted somewhere in the gap; the list's revision bounds when. Removals
        # come before additions: a successor created in the gap is judged against the state after the
        # gap, in which its predecessor is gone (I2, I9), not against the predecessor still running.
        gone_rv = int(rv) if rv.isdigit() else 0
        for obj in removed:
            self._dispatch(watch.kind, "DELETED", obj, obj, rv=gone_rv, baseline=False, vanished=True)
        # Creation order matters for stage order (I7): process additions by revision.
        for obj in sorted(added, key=_rv):
            self._dispatch(watch.kind, "ADDED", obj, None, rv=_rv(obj), baseline=baseline)
        watch.rv = rv
        if rv.isdigit():
            watch.progress = max(watch.progress, int(rv))
            self._start_rv = self._start_rv or int(rv)
        if not baseline:
            watch.relists += 1
            self.notes.append(
                f"{_now()} {watch.kind} relisted: {len(added)} added, {len(changed)} changed,"
                f" {len(removed)} removed"
            )

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            try:
                self._drain_pending(force=False)
            except Exception:
                self._fail(f"queued check crashed:\n{traceback.format_exc()}")
                return

    def _defer(self, rv: int, check: Callable[[], None]) -> None:
        self._pending.append(_Pending(rv, time.monotonic(), check))
        self._drain_pending(force=False)

    def _drain_pending(self, *, force: bool) -> None:
        progress = self._watches["nodes"].progress
        now = time.monotonic()
        while self._pending:
            item = self._pending[0]
            if not (force or progress >= item.rv or now - item.received >= SKEW_WAIT):
                return
            self._pending.popleft()
            item.check()

    def _dispatch(
        self,
        kind: str,
        event: str,
        obj: JSON,
        old: JSON | None,
        *,
        rv: int,
        baseline: bool,
        vanished: bool = False,
    ) -> None:
        if kind == "nodes":
            self._on_node(event, obj, rv=rv, baseline=baseline)
        elif kind == "pods":
            self._on_pod(event, obj, rv=rv, baseline=baseline, vanished=vanished)
        elif kind == "nodewrights":
            self._on_nodewright(event, obj, old, rv=rv)
        elif kind == "budgets":
            self._on_budget(event, obj)
        else:
            self._on_policy(event, obj)

    # -- nodes ---------------------------------------------------------------------------------

    def _node_at(self, name: str, rv: int) -> NodeSnapshot | None:
        """The node as of revision `rv` (None: it did not exist then, as far as the monitor knows)."""
        found = None
        for snap in self._node_history.get(name, ()):
            if snap.rv <= rv:
                found = snap
            else:
                break
        if found is None or not found.exists:
            return None
        return found

    def _remember(self, name: str, snap: NodeSnapshot) -> None:
        hist = self._node_history.setdefault(name, deque(maxlen=HISTORY))
        if hist and (hist[-1].exists, hist[-1].unschedulable, hist[-1].cordoning) == (
            snap.exists,
            snap.unschedulable,
            snap.cordoning,
        ):
            return
        hist.append(snap)

    def _on_node(self, event: str, obj: JSON, *, rv: int, baseline: bool) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        old = self._nodes.get(name)
        if event == "DELETED":
            self._nodes.pop(name, None)
            self._remember(name, NodeSnapshot(rv, False, False, frozenset()))
            self._invalidate_all()
            return
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        texts = {
            k[len(c.STATE_ANNOTATION_PREFIX) :]: v
            for k, v in annotations.items()
            if k.startswith(c.STATE_ANNOTATION_PREFIX)
        }
        states: dict[str, NodeState | None] = {}
        for nw, text in texts.items():
            if old is not None and old.state_texts.get(nw) == text:
                states[nw] = old.states.get(nw)
                continue
            try:
                states[nw] = decode(text)
            except MalformedNodeState as err:
                states[nw] = None
                self.notes.append(f"{_now()} node {name}: malformed state of {nw}: {err}")
        status = obj.get("status") or {}
        conditions = status.get("conditions") or []
        rec = NodeRecord(
            name=name,
            labels=labels,
            annotations=annotations,
            unschedulable=bool((obj.get("spec") or {}).get("unschedulable")),
            state_texts=texts,
            states=states,
            boot_id=(status.get("nodeInfo") or {}).get("bootID", ""),
            ready=any(x.get("type") == "Ready" and x.get("status") == "True" for x in conditions),
            conditions=frozenset(str(x.get("type", "")) for x in conditions),
        )
        self._nodes[name] = rec
        self._remember(name, NodeSnapshot(rv, True, rec.unschedulable, rec.cordoning))
        if old is None or _selection_labels(old.labels) != _selection_labels(labels):
            self._invalidate_all()
        self._track_cordon(rec, old, rv, baseline=baseline)
        if baseline:
            for nw in rec.states:
                adm = rec.admission(nw)
                if adm is not None:
                    self._admissions[(nw, name)] = (rv, adm, False)
            return
        self._check_budget_on_node(rec, old, rv)
        self._check_admissions(rec, old, rv)
        self._check_shared_budgets(rec, old, rv)

    def _track_cordon(self, rec: NodeRecord, old: NodeRecord | None, rv: int, *, baseline: bool) -> None:
        """I5: ownership of a cordon is decided when the node becomes unschedulable.

        The operator writes its state (`cordoned: true`) in the same or an earlier write than the cordon
        (state first, then actions), so a node that turns unschedulable without any NodeWright claiming
        it was cordoned by someone else, and must stay cordoned until the test says otherwise.
        """
        was = old.unschedulable if old is not None else None
        if rec.unschedulable and not was:
            rec.cordon_owners = rec.cordoning
            rec.foreign_cordon = not rec.cordoning
        elif rec.unschedulable and old is not None:
            rec.foreign_cordon = old.foreign_cordon
            # A NodeWright claiming a foreign cordon later does not make it ours.
            rec.cordon_owners = old.cordon_owners | (frozenset() if old.foreign_cordon else rec.cordoning)
        elif not rec.unschedulable and was and old is not None and not baseline and old.foreign_cordon:
            if rec.name in self._expected_uncordon:
                self._expected_uncordon.discard(rec.name)
            else:
                self._breach(
                    Breach(
                        "I5",
                        "node cordoned by someone else was uncordoned",
                        node=rec.name,
                        resource_version=rv,
                        details=(
                            ("cordon", "became unschedulable without any NodeWright's cordoned flag"),
                            ("now claiming cordon", ", ".join(sorted(rec.cordoning)) or "none"),
                            ("history", self._history_text(rec.name)),
                        ),
                    )
                )

    def _history_text(self, name: str) -> str:
        return "; ".join(
            f"rv {s.rv}: "
            + (
                "deleted"
                if not s.exists
                else f"unschedulable={s.unschedulable} cordoned_by={sorted(s.cordoning)}"
            )
            for s in list(self._node_history.get(name, ()))[-6:]
        )

    # -- compartments, I1, I2 ---------------------------------------------------------------------

    def _invalidate_all(self) -> None:
        self._compartments.clear()

    def _resolved(self, nw: str) -> Compartments | None:
        if nw not in self._compartments:
            obj = self._nodewrights.get(nw)
            if obj is None:
                self._compartments[nw] = None
            else:
                policy_name = (obj.get("spec") or {}).get("deploymentPolicy")
                policy = self._policies.get(policy_name) if policy_name else None
                self._compartments[nw] = resolve_compartments(
                    obj, policy, {n: r.labels for n, r in self._nodes.items()}
                )
        return self._compartments[nw]

    def _check_budget_on_node(self, rec: NodeRecord, old: NodeRecord | None, rv: int) -> None:
        """I1, checked when a node enters in_progress: a shrinking ceiling is not the operator's start."""
        for key, value in rec.labels.items():
            if not key.startswith(c.STATUS_LABEL_PREFIX) or value != STATUS_IN_PROGRESS:
                continue
            if old is not None and old.labels.get(key) == STATUS_IN_PROGRESS:
                continue
            nw = key[len(c.STATUS_LABEL_PREFIX) :]
            comps = self._resolved(nw)
            if comps is None or rec.name not in comps.assignment:
                continue
            comp = comps.assignment[rec.name]
            members = comps.members(comp)
            busy = sorted(n for n in members if self._nodes[n].status(nw) == STATUS_IN_PROGRESS)
            cap = comps.ceilings.get(comp, 0)
            if comp in comps.topology:
                self._check_domains(nw, comps, comp, rec, rv)
            used = len(comps.units(comp, busy))
            if used > cap:
                unit = "domains" if comp in comps.topology else "nodes"
                self._breach(
                    Breach(
                        "I1",
                        f"{used} {unit} in progress in compartment {comp!r}, ceiling {cap}",
                        node=rec.name,
                        nodewright=nw,
                        resource_version=rv,
                        details=(
                            ("compartment", f"{comp} ({comps.source}; {len(members)} matched nodes)"),
                            ("in progress", ", ".join(busy[:20])),
                        ),
                    )
                )

    # -- topology domains, I11 -----------------------------------------------------------------------

    def _check_domains(self, nw: str, comps: Compartments, comp: str, rec: NodeRecord, rv: int) -> None:
        """I11, checked when a node of a topology compartment enters in_progress for `nw`.

        (a) The compartment's disrupted domains (a node in progress for any NodeWright, cordoned or
        NotReady: the planner's count) must not exceed its ceiling, this node's domain included.
        (b) The node's domain is admitted whole: every admission of `nw` on its nodes for the same spec
        carries one batch number. A domain left partly done while another starts shows as (a) with a
        budget of one domain, and as (b) otherwise (its remaining nodes come in a later batch). A node
        that was NotReady or cordoned by someone else when its domain was admitted legitimately comes
        later; scenarios with topology compartments keep their nodes Ready for (b) to hold.
        """
        members = [self._nodes[n] for n in comps.members(comp) if n in self._nodes]
        disrupted = sorted({comps.domains[n.name] for n in members if n.disrupted})
        key = (nw, comp)
        self._max_domains[key] = max(self._max_domains.get(key, 0), len(disrupted))
        domain = comps.domains[rec.name]
        started = self._domains_started.setdefault(key, [])
        if domain not in started:
            started.append(domain)
        cap = comps.ceilings.get(comp, 0)
        if len(disrupted) > cap:
            self._breach(
                Breach(
                    "I11",
                    f"{len(disrupted)} {comps.topology[comp]} domains of compartment {comp!r} disrupted,"
                    f" budget {cap}",
                    node=rec.name,
                    nodewright=nw,
                    resource_version=rv,
                    details=(
                        ("disrupted domains", ", ".join(disrupted[:20])),
                        ("disrupted nodes", ", ".join(sorted(n.name for n in members if n.disrupted))[:1000]),
                    ),
                )
            )
        self._check_domain_whole(nw, comps, comp, rec, rv)

    def _check_domain_whole(self, nw: str, comps: Compartments, comp: str, rec: NodeRecord, rv: int) -> None:
        adm = _batch_admission(rec, nw)
        if adm is None:
            return
        domain = comps.domains[rec.name]
        batches: dict[int, list[str]] = {}
        for name in comps.members(comp):
            other = self._nodes.get(name)
            theirs = (
                _batch_admission(other, nw) if other is not None and comps.domains[name] == domain else None
            )
            if theirs is not None and theirs.fingerprint == adm.fingerprint and theirs.compartment == comp:
                batches.setdefault(theirs.batch, []).append(name)
        if len(batches) > 1:
            self._breach(
                Breach(
                    "I11",
                    f"domain {domain!r} of compartment {comp!r} admitted in {len(batches)} batches,"
                    " not whole",
                    node=rec.name,
                    nodewright=nw,
                    resource_version=rv,
                    details=tuple(
                        (f"batch {b}", ", ".join(sorted(ns)[:20])) for b, ns in sorted(batches.items())
                    ),
                )
            )

    # -- shared DisruptionBudgets, I10 ---------------------------------------------------------------

    def _on_budget(self, event: str, obj: JSON) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        if event == "DELETED":
            self._budgets.pop(name, None)
        else:
            self._budgets[name] = obj

    def _check_shared_budgets(self, rec: NodeRecord, old: NodeRecord | None, rv: int) -> None:
        """I10, checked when NodeWright work makes a node disrupted that was not (it enters in_progress
        for some NodeWright while schedulable, Ready and in progress for none): the pool's disrupted
        nodes, this one included, must not exceed the budget. A cordon by a person or a NotReady node
        is no breach by itself, but it counts: after it, NodeWrights may disrupt fewer nodes."""
        for name, obj in self._budgets.items():
            spec = obj.get("spec") or {}
            if not selector_matches(spec.get("nodeSelector"), rec.labels):
                continue
            pool = [n for n in self._nodes.values() if selector_matches(spec.get("nodeSelector"), n.labels)]
            disrupted = sorted(n.name for n in pool if n.disrupted)
            self._max_disrupted[name] = max(self._max_disrupted.get(name, 0), len(disrupted))
            started = any(
                k.startswith(c.STATUS_LABEL_PREFIX)
                and v == STATUS_IN_PROGRESS
                and (old is None or old.labels.get(k) != STATUS_IN_PROGRESS)
                for k, v in rec.labels.items()
            )
            if not started or (old is not None and old.disrupted):
                continue
            cap = ceiling(spec.get("budget") or {}, len(pool))
            if len(disrupted) > cap:
                self._breach(
                    Breach(
                        "I10",
                        f"{len(disrupted)} nodes of DisruptionBudget {name!r} disrupted, budget {cap}",
                        node=rec.name,
                        resource_version=rv,
                        details=(
                            ("disrupted", ", ".join(disrupted[:20])),
                            (
                                "why",
                                "; ".join(
                                    f"{n.name}: "
                                    + ",".join(
                                        k[len(c.STATUS_LABEL_PREFIX) :]
                                        for k, v in n.labels.items()
                                        if k.startswith(c.STATUS_LABEL_PREFIX) and v == STATUS_IN_PROGRESS
                                    )
                                    + (" cordoned" if n.unschedulable else "")
                                    + ("" if n.ready else " NotReady")
                                    for n in pool
                                    if n.disrupted
                                )[:1000],
                            ),
                        ),
                    )
                )

    def _check_batch_pods(self, pod: PodRecord) -> None:
        """I2: a new package pod must not raise the compartment's busy nodes above its ceiling."""
        nw = pod.nodewright
        active = self._active.setdefault(nw, {})
        already = bool(active.get(pod.node))
        active.setdefault(pod.node, set()).add(pod.key)
        if already:
            return
        comps = self._resolved(nw)
        if comps is None or pod.node not in comps.assignment:
            return
        comp = comps.assignment[pod.node]
        busy = sorted(n for n, keys in active.items() if keys and comps.assignment.get(n) == comp)
        cap = comps.ceilings.get(comp, 0)
        if len(comps.units(comp, busy)) > cap:
            pods = [self._pods[k].describe() for n in busy for k in sorted(active[n]) if k in self._pods]
            self._breach(
                Breach(
                    "I2",
                    f"package pods unfinished on {len(busy)} nodes of compartment {comp!r}, ceiling {cap}",
                    node=pod.node,
                    nodewright=nw,
                    pods=tuple(pods[:20]),
                    resource_version=pod.created_rv,
                    details=(("compartment", f"{comp} ({comps.source})"), ("nodes", ", ".join(busy[:20]))),
                )
            )

    def _settle_active(self, pod: PodRecord) -> None:
        if pod.unfinished:
            return
        keys = self._active.get(pod.nodewright, {}).get(pod.node)
        if keys is not None:
            keys.discard(pod.key)

    # -- pods ------------------------------------------------------------------------------------

    def _on_pod(self, event: str, obj: JSON, *, rv: int, baseline: bool, vanished: bool = False) -> None:
        key = _key(obj)
        old = self._pods.get(key)
        if old is not None and old.uid != (obj.get("metadata") or {}).get("uid", ""):
            # Same name, new pod (a retry reusing the name; its DELETE fell into a watch gap).
            old.gone = old.vanished = True
            self._settle_active(old)
            self._pods.pop(key, None)
            self._pods_by_node.get(old.node, set()).discard(key)
            old = None
        rec = _pod_record(obj, old)
        if event == "DELETED":
            rec.gone = True
            rec.vanished = vanished
            self._pods.pop(key, None)
            self._pods_by_node.get(rec.node, set()).discard(key)
        else:
            self._pods[key] = rec
            self._pods_by_node.setdefault(rec.node, set()).add(key)
        if rec.is_package and rec.namespace == self.namespace:
            self._on_package_pod(rec, old, baseline=baseline)
        else:
            self._on_other_pod(event, rec, old, rv=rv, baseline=baseline)

    @staticmethod
    def _run_key(view: PodRecord) -> tuple[str, str, str, str]:
        return (
            view.nodewright,
            view.node,
            view.labels.get(c.POD_LABEL_PACKAGE, ""),
            view.labels.get(c.POD_LABEL_VERSION, ""),
        )

    def _on_package_pod(self, rec: PodRecord, old: PodRecord | None, *, baseline: bool) -> None:
        if old is None:
            node = self._nodes.get(rec.node)
            rec.boot_at_create = node.boot_id if node is not None else None
            # A chained pod is a run of each package it carries: each one is judged in its own history.
            for view in rec.run_views():
                history = self._runs.setdefault(self._run_key(view), [])
                if not baseline and not rec.gone:
                    self._check_stage_order(view, history)
                    self._check_one_pod_per_package(view)
                history.append(view)
            if rec.stage in INTERRUPT_STAGES:
                self._interrupts.setdefault((rec.nodewright, rec.node), []).append(rec)
            if rec.unfinished:
                if baseline:
                    self._active.setdefault(rec.nodewright, {}).setdefault(rec.node, set()).add(rec.key)
                else:
                    self._check_batch_pods(rec)
            if not baseline and rec.stage in INTERRUPT_STAGES:
                self._check_interrupt_protected(rec)
                self._defer(rec.created_rv, lambda: self._check_interrupt_cordon(rec))
            return
        # Update in place: the run histories hold the pod's records (one per run it carries).
        for view in rec.run_views():
            history = self._runs.setdefault(self._run_key(view), [])
            for i, h in enumerate(history):
                if h.key == rec.key and h.uid == rec.uid:
                    history[i] = view
        for i, h in enumerate(self._interrupts.get((rec.nodewright, rec.node), [])):
            if h is old:
                self._interrupts[(rec.nodewright, rec.node)][i] = rec
        self._settle_active(rec)

    def _interrupt_done(self, pod: PodRecord) -> bool:
        """An interrupt succeeded: its pod did, or (reboot) the node came back Ready with a new bootID."""
        if pod.outcome == "succeeded":
            return True
        node = self._nodes.get(pod.node)
        return (
            pod.interrupt_type == "reboot"
            and node is not None
            and node.ready
            and pod.boot_at_create is not None
            and node.boot_id != pod.boot_at_create
        )

    def _check_one_pod_per_package(self, rec: PodRecord) -> None:
        """I9 at a package pod's creation: no other pod of its (node, NodeWright, package) may still run.

        A pod that has not finished (no outcome yet) may be doing host work, also while it terminates
        (deletionTimestamp set, containers not stopped yet), whatever its version or stage. One that
        finished (init containers exited 0, or phase Failed) runs nothing but `pause` and does not count.
        The pod stream is ordered, so the store holds exactly the pods that existed at this creation.
        """
        busy = sorted(
            (
                p
                for k in self._pods_by_node.get(rec.node, set())
                if (p := self._pods[k]).key != rec.key
                and p.is_package
                and p.namespace == rec.namespace
                and p.nodewright == rec.nodewright
                and rec.package in p.packages
                and p.outcome is None
            ),
            key=lambda p: p.created_rv,
        )
        if not busy:
            return
        other = busy[-1]
        doing = "still terminating" if other.deleting else "still running"
        self._breach(
            Breach(
                "I9",
                f"{rec.stage} pod of package {rec.package!r} created while its {other.stage} pod is {doing}",
                node=rec.node,
                nodewright=rec.nodewright,
                pods=(rec.describe(), *(p.describe() for p in busy[-5:])),
                resource_version=rec.created_rv,
                details=(
                    (
                        "versions",
                        f"new {rec.labels.get(c.POD_LABEL_VERSION, '')}, other "
                        + ", ".join(p.labels.get(c.POD_LABEL_VERSION, "") for p in busy[-5:]),
                    ),
                ),
            )
        )

    def _check_stage_order(self, rec: PodRecord, history: list[PodRecord]) -> None:
        """I7 at the creation of a stage pod (see docs/invariants.md for the successor table)."""
        problem = ""
        running = [p for p in history if p.unfinished]
        if running:
            problem = f"created while {running[-1].describe()} of the same package is unfinished"
        last = history[-1] if history else None
        stage = rec.stage
        if last is not None and last.outcome_unknown:
            # Its outcome fell into a watch gap: whether this successor may follow cannot be judged.
            last = None
        if not problem and last is not None and stage not in RUN_START_STAGES:
            # A pod runs every stage of its transition (an install pod: apply, then config): what counts
            # is the stage it got to -- the one it failed in, or its last one -- and whether it
            # succeeded there, as its init containers say.
            reached, ok_last = last.reached
            if stage == "config":
                if reached in ("apply", "upgrade") and not ok_last:
                    problem = f"config before {reached} succeeded (last: {last.describe()})"
                elif reached in ("uninstall", "uninstall-interrupt"):
                    problem = f"config after {reached} without a new apply (last: {last.describe()})"
            elif stage == "interrupt":
                if not (reached == "config" and ok_last) and reached != "interrupt":
                    problem = f"interrupt not preceded by a successful config (last: {last.describe()})"
            elif stage == "post-interrupt":
                carriers = self._interrupts.get((rec.nodewright, rec.node), [])
                since = [
                    p for p in carriers if p.created_rv > (last.created_rv if reached == "config" else 0)
                ]
                if reached == "post-interrupt":
                    pass  # a retry
                elif reached not in ("config", "interrupt") or (reached == "config" and not ok_last):
                    problem = f"post-interrupt not preceded by config and interrupt (last: {last.describe()})"
                elif not since:
                    problem = f"post-interrupt without an interrupt pod on the node (last: {last.describe()})"
                elif since[-1].outcome_unknown and since[-1].interrupt_type != "reboot":
                    pass  # the interrupt's outcome fell into a watch gap
                elif not self._interrupt_done(since[-1]):
                    problem = f"post-interrupt before the interrupt succeeded ({since[-1].describe()})"
            elif (
                stage == "uninstall-interrupt"
                and not (reached == "uninstall" and ok_last)
                and reached != "uninstall-interrupt"
            ):
                problem = (
                    f"uninstall-interrupt without a successful uninstall before (last: {last.describe()})"
                )
        if problem:
            self._breach(
                Breach(
                    "I7",
                    f"stage {stage} out of order: {problem}",
                    node=rec.node,
                    nodewright=rec.nodewright,
                    pods=(rec.describe(),),
                    resource_version=rec.created_rv,
                    details=(
                        (
                            "run history",
                            " -> ".join(
                                f"{p.stage}:{p.outcome or ('gone' if p.gone else 'running')}"
                                for p in history[-8:]
                            )
                            or "none",
                        ),
                    ),
                )
            )

    def _check_interrupt_cordon(self, pod: PodRecord) -> None:
        """I3b, evaluated against the node as of the pod's creation revision."""
        snap = self._node_at(pod.node, pod.created_rv)
        if snap is None:
            return
        if snap.unschedulable:
            return
        self._breach(
            Breach(
                "I3",
                "interrupt pod created on a node that was not cordoned",
                node=pod.node,
                nodewright=pod.nodewright,
                pods=(pod.describe(),),
                resource_version=pod.created_rv,
                details=(
                    (
                        "node at creation",
                        f"unschedulable={snap.unschedulable} cordoned_by={sorted(snap.cordoning)}",
                    ),
                    ("history", self._history_text(pod.node)),
                ),
            )
        )

    def _protecting(self, pod: PodRecord) -> list[str]:
        """NodeWrights whose non-empty podNonInterruptLabels match `pod` and which select its node."""
        node = self._nodes.get(pod.node)
        out = []
        for nw, obj in self._nodewrights.items():
            spec = obj.get("spec") or {}
            sel = spec.get("podNonInterruptLabels")
            if selector_empty(sel) or not selector_matches(sel, pod.labels):
                continue
            if node is not None and not selector_matches(spec.get("nodeSelectors"), node.labels):
                continue
            out.append(nw)
        return sorted(out)

    def _check_interrupt_protected(self, pod: PodRecord) -> None:
        """I4b: the pod stream is ordered, so the node's pods are known exactly at this creation."""
        obj = self._nodewrights.get(pod.nodewright)
        sel = (obj.get("spec") or {}).get("podNonInterruptLabels") if obj else None
        if selector_empty(sel):
            return
        blocking = sorted(
            p.describe()
            for k in self._pods_by_node.get(pod.node, set())
            if (p := self._pods[k]) is not pod
            and not p.is_package
            and not p.deleting
            and p.phase in ("Running", "Pending")
            and selector_matches(sel, p.labels)
        )
        if blocking:
            self._breach(
                Breach(
                    "I4",
                    "interrupt pod created while protected pods run on the node",
                    node=pod.node,
                    nodewright=pod.nodewright,
                    pods=(pod.describe(), *blocking[:10]),
                    resource_version=pod.created_rv,
                    details=(("podNonInterruptLabels", json.dumps(sel, sort_keys=True)),),
                )
            )

    def _on_other_pod(
        self, event: str, rec: PodRecord, old: PodRecord | None, *, rv: int, baseline: bool
    ) -> None:
        """I3a and I4a: a workload or protected pod deleted/evicted while not finished."""
        if baseline or old is None or old.deleting:
            return
        if not (rec.deleting or event == "DELETED"):
            return
        if self._allowed_deletion(rec):
            return
        when = rv or self._watches["pods"].progress
        if old.phase in ("Running", "Pending") and rec.namespace != self.namespace:
            protecting = self._protecting(old)
            if protecting:
                self._breach(
                    Breach(
                        "I4",
                        f"protected pod evicted/deleted while {old.phase}",
                        node=old.node,
                        nodewright=", ".join(protecting),
                        pods=(rec.describe(),),
                        resource_version=when,
                    )
                )
        if (
            WORKLOAD_JOB_LABEL in old.labels
            and old.phase not in ("Succeeded", "Failed")
            and rec.namespace != self.namespace
        ):
            self._defer(when, lambda: self._check_eviction_cordon(rec, old.phase, when))

    def _check_eviction_cordon(self, pod: PodRecord, phase: str, rv: int) -> None:
        snap = self._node_at(pod.node, rv)
        if snap is None or snap.unschedulable:
            return
        self._breach(
            Breach(
                "I3",
                f"workload pod evicted/deleted while {phase} on a node that was not cordoned",
                node=pod.node,
                pods=(pod.describe(),),
                resource_version=rv,
                details=(
                    (
                        "node at deletion",
                        f"unschedulable={snap.unschedulable} cordoned_by={sorted(snap.cordoning)}",
                    ),
                    ("history", self._history_text(pod.node)),
                ),
            )
        )

    # -- NodeWrights, policies, I8 ------------------------------------------------------------------

    def _on_policy(self, event: str, obj: JSON) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        if event == "DELETED":
            self._policies.pop(name, None)
        else:
            self._policies[name] = obj
        self._invalidate_all()

    def _on_nodewright(self, event: str, obj: JSON, old: JSON | None, *, rv: int) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        if event == "DELETED":
            self._nodewrights.pop(name, None)
            self._compartments.pop(name, None)
            return
        self._nodewrights[name] = obj
        if old is None or old.get("spec") != obj.get("spec"):
            self._compartments.pop(name, None)
        suppressed = self._suppressed.setdefault(name, set())
        halted = halted_compartments(obj)
        if c.ANNOTATION_RESET_BATCH in (meta.get("annotations") or {}):
            # The test asked for a reset: close every open halt; a compartment halts again only after
            # the status has shown it un-halted (a stale status must not re-arm the check).
            self._resets[name] = rv
            for (nw, _comp), intervals in self._halts.items():
                if nw == name and intervals and intervals[-1].end is None:
                    intervals[-1].end = rv
            suppressed.update(halted)
        suppressed.intersection_update(halted)
        rollout = rollout_of(obj)
        for (nw, comp), intervals in self._halts.items():
            # A new rollout (the spec changed, or came back: undo) starts with a fresh batch state: once
            # the status shows the compartment no longer halted under it, the halt is over.
            last = intervals[-1] if intervals else None
            if nw == name and comp not in halted and last is not None and last.end is None:
                last.end = rv if last.rollout != rollout else None
        for comp, source in halted.items():
            if comp in suppressed:
                continue
            intervals = self._halts.setdefault((name, comp), [])
            if intervals and intervals[-1].end is None:
                continue
            interval = _HaltInterval(start=rv, source=source, rollout=rollout)
            intervals.append(interval)
            # Admissions processed before this status (other stream) but written after it.
            for (nw, node), (arv, adm, new) in sorted(self._admissions.items()):
                if new and nw == name and adm.compartment == comp and arv > rv:
                    self._report_halt_admission(nw, node, adm, arv, interval)

    def _check_admissions(self, rec: NodeRecord, old: NodeRecord | None, rv: int) -> None:
        """I8: a node's admission appearing (or its batch increasing) while its compartment is halted."""
        for nw in rec.states:
            new = rec.admission(nw)
            before = old.admission(nw) if old is not None else None
            if new is None:
                self._admissions.pop((nw, rec.name), None)
                continue
            if before is not None and new.batch <= before.batch and new.compartment == before.compartment:
                continue
            self._admissions[(nw, rec.name)] = (rv, new, True)
            for interval in self._halts.get((nw, new.compartment), []):
                if interval.start < rv and (interval.end is None or rv < interval.end):
                    self._report_halt_admission(nw, rec.name, new, rv, interval)
                    break

    def _report_halt_admission(
        self, nw: str, node: str, adm: Admission, rv: int, interval: _HaltInterval
    ) -> None:
        self._breach(
            Breach(
                "I8",
                f"node admitted into halted compartment {adm.compartment!r} (batch {adm.batch})",
                node=node,
                nodewright=nw,
                resource_version=rv,
                details=(
                    (
                        "halted",
                        f"since rv {interval.start} ({interval.source}), observed {interval.observed_at}",
                    ),
                    (
                        "admission",
                        f"compartment={adm.compartment} batch={adm.batch} order={adm.order} at={adm.at}",
                    ),
                ),
            )
        )

    # -- end-state checks (I6) ----------------------------------------------------------------------

    def _check_complete_uncordoned(self, node: NodeRecord) -> None:
        for nw, state in sorted(node.states.items()):
            if node.status(nw) != STATUS_COMPLETE or state is None:
                continue
            if state.cordoned:
                self._breach(
                    Breach(
                        "I6", "node complete but its state still says cordoned", node=node.name, nodewright=nw
                    )
                )
            elif node.unschedulable and nw in node.cordon_owners and not node.cordoning:
                self._breach(
                    Breach(
                        "I6",
                        "node complete but left unschedulable after NodeWright cordoned it",
                        node=node.name,
                        nodewright=nw,
                        details=(("history", self._history_text(node.name)),),
                    )
                )

    def _check_cleanup(self, nw: str) -> None:
        if nw in self._nodewrights:
            self._breach(Breach("I6", "NodeWright declared deleted still exists", nodewright=nw))
            return
        for node in sorted(self._nodes.values(), key=lambda n: n.name):
            left: list[str] = []
            if c.status_label(nw) in node.labels:
                left.append(f"label {c.status_label(nw)}={node.labels[c.status_label(nw)]}")
            if c.node_condition_type(nw) in node.conditions:
                left.append(f"condition {c.node_condition_type(nw)}")
            owners = [x.strip() for x in node.annotations.get(c.CORDON_ANNOTATION, "").split(",")]
            if nw in owners:
                left.append(f"annotation {c.CORDON_ANNOTATION}")
            if nw in node.state_texts:
                state = node.states.get(nw)
                # Package entries mean "files of this version may remain on the host" and are kept.
                if state is None:
                    left.append("malformed state annotation")
                elif state.admission is not None or state.cordoned or not state.packages:
                    left.append(f"state annotation beyond package entries: {node.state_texts[nw][:200]}")
            if node.unschedulable and nw in node.cordon_owners and not node.cordoning:
                left.append("node still unschedulable from its cordon")
            if left:
                self._breach(
                    Breach(
                        "I6",
                        "node keeps state of a deleted NodeWright",
                        node=node.name,
                        nodewright=nw,
                        details=tuple(("left", x) for x in left),
                    )
                )


def rollout_of(nodewright: Mapping[str, Any]) -> tuple[str, int]:
    """Which rollout the status describes: its spec fingerprint and first order number (docs/rollout.md)."""
    status = nodewright.get("status") or {}
    return str(status.get("rolloutFingerprint") or ""), int(status.get("rolloutFirstOrder") or 0)


def halted_compartments(nodewright: Mapping[str, Any]) -> dict[str, str]:
    """Compartments the status shows halted: `Halted` condition True naming them, or `shouldStop`."""
    status = nodewright.get("status") or {}
    out: dict[str, str] = {}
    for name, cs in (status.get("compartmentStatuses") or {}).items():
        if ((cs or {}).get("batchState") or {}).get("shouldStop"):
            out[name] = "batchState.shouldStop"
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Halted" and cond.get("status") == "True":
            for name in _HALT_MESSAGE.findall(str(cond.get("message", ""))):
                out.setdefault(name, "condition Halted")
    return out


def summarize(breaches: Iterable[Breach]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for b in breaches:
        counts[b.invariant] = counts.get(b.invariant, 0) + 1
    return counts
