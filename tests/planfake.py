"""A fake node that executes node plans, for property tests of the stage machine (and the controller).

`FakeNode` holds what the API server and the kubelet would: the state annotation (as encoded text, so
every step goes through the codec), cordon, bootID/Ready, the NodeWright's package pods and the
node's workload pods. `step()` plans (twice when the plan asks for drain facts, like the controller),
checks the safety invariants on the plan, writes the state, executes the actions, then lets time pass:
pods finish according to a scripted `Outcomes` policy, reboots change the bootID (the node is NotReady
for a moment and may garbage-collect pods), evicted pods terminate, protected pods finish.

A pod runs the stages of its transition (`stages.pod_stages`: apply and config in one install pod) and
reports them as the controller reads init container statuses (`PodSummary.progress`): fate
`"fail@config"` fails the pod in its config stage with apply done (a pod without that stage succeeds),
`"fail"` in its first stage. A pod that carries chained runs (`CreatePod.chain`) runs them after its
own, in order; fate `"fail@<package>:<stage>"` fails it in that run's stage (the runs before it done, the
ones after it not started; a pod without that run succeeds).

Invariants checked at every step (violations raise `InvariantError`):
- no package entry skips a stage (state transitions follow the stage machine);
- no pre-interrupt/interrupt pod of an interrupt-bearing run is created on an uncordoned node;
- Uncordon only when this NodeWright cordoned the node (never a node someone else cordoned);
- no new work starts on a node without admission (only runs already in flight continue);
- attempts never exceed the package's max attempts;
- the interrupt pod never runs together with another stage pod of the NodeWright.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from nodewright.api.models import InterruptType, NodeWright
from nodewright.api.nodeobject import NodeFacts, Taint
from nodewright.api.nodestate import (
    Admission,
    NodeState,
    PackageEntry,
    PackageStage,
    PackageState,
    decode,
    encode,
)
from nodewright.plan import drain as drain_mod
from nodewright.plan.node import (
    Cordon as CordonAction,
)
from nodewright.plan.node import (
    CreatePod,
    DeletePod,
    DrainFacts,
    NodeInput,
    NodePlan,
    PlanOptions,
    RequeueAfter,
    Uncordon,
    plan_node,
)
from nodewright.plan.node import (
    Drain as DrainAction,
)
from nodewright.plan.stages import (
    INTERRUPT_STAGES,
    PRE_INTERRUPT_STAGES,
    ChainedRun,
    Done,
    PodOutcome,
    PodSummary,
    RetryPolicy,
    StageProgress,
    next_stage,
    pod_stages,
    run_interrupt,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)

# Decides the fate of a created pod: "succeed", "fail", "pull_error", "hang" (runs until the deadline),
# "skip" (an interrupt pod exits 0 without interrupting: the agent's flag says it ran already).
Outcomes = Callable[[CreatePod], str]


def always_succeed(_: CreatePod) -> str:
    return "succeed"


class InvariantError(AssertionError):
    pass


@dataclass
class FakePod:
    summary: PodSummary
    fate: str
    interrupt_type: InterruptType | None
    ticks: int = 0


@dataclass
class FakeNode:
    nodewright: NodeWright
    outcomes: Outcomes = always_succeed
    name: str = "node-1"
    admitted: bool = True
    options: PlanOptions = field(default_factory=PlanOptions)
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    cordoned_by_other: bool = False
    workload: list[dict[str, Any]] = field(default_factory=list)
    protected_ticks: int = 0  # protected workload pods finish after this many ticks
    lose_pods_on_reboot: bool = True
    reboot_delay_ticks: int = 0  # the reboot pod exits 0 this many ticks before the node goes down
    sequencing_blocker: str | None = None
    now: datetime = T0
    boot_id: str = "boot-0"
    ready: bool = True
    state_text: str | None = None
    pods: dict[str, FakePod] = field(default_factory=dict)
    plans: list[NodePlan] = field(default_factory=list)
    created: list[CreatePod] = field(default_factory=list)
    reboots: int = 0
    _not_ready_ticks: int = 0
    _reboot_in: int = 0
    _terminating: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cordoned_by_other:
            self.unschedulable = True
        if self.admitted and self.state_text is None:
            self.state_text = encode(
                NodeState(admission=Admission("__default__", 1, 0, "2025-01-01T00:00:00Z"))
            )

    # -- inputs -----------------------------------------------------------------------------------------

    @property
    def state(self) -> NodeState | None:
        return decode(self.state_text) if self.state_text is not None else None

    def facts(self) -> NodeFacts:
        return NodeFacts(
            name=self.name,
            labels=dict(self.labels),
            taints=self.taints,
            unschedulable=self.unschedulable,
            ready=self.ready,
            boot_id=self.boot_id,
        )

    def drain_facts(self) -> DrainFacts:
        protect = self.nodewright.spec.pod_non_interrupt_labels
        return DrainFacts(selection=drain_mod.select(self.workload, protect=protect))

    def plan(self, *, with_drain: bool = False) -> NodePlan:
        inp = NodeInput(
            nodewright=self.nodewright,
            node=self.facts(),
            state=self.state,
            pods=tuple(p.summary for p in sorted(self.pods.values(), key=lambda p: p.summary.name)),
            now=self.now,
            drain=self.drain_facts() if with_drain else None,
            sequencing_blocker=self.sequencing_blocker,
            options=self.options,
        )
        return plan_node(inp)

    # -- one reconcile ------------------------------------------------------------------------------------

    def step(self) -> NodePlan:
        before = self.state
        plan = self.plan()
        if plan.needs_drain_facts:
            plan = self.plan(with_drain=True)
        self.check(before, plan)
        self.plans.append(plan)
        self.state_text = encode(plan.state)
        requeue = None
        for action in plan.actions:
            if isinstance(action, CordonAction):
                self.unschedulable = True
            elif isinstance(action, Uncordon):
                self.unschedulable = False
            elif isinstance(action, DrainAction):
                for ref in action.pods:
                    self._terminating.setdefault(ref, 1)
            elif isinstance(action, DeletePod):
                self.pods.pop(action.name, None)
            elif isinstance(action, CreatePod):
                self.create(action)
            elif isinstance(action, RequeueAfter):
                requeue = action.seconds
        self.tick(requeue)
        return plan

    def create(self, action: CreatePod) -> None:
        if action.name in self.pods:
            return  # AlreadyExists: creation is idempotent by name
        self.created.append(action)
        summary = PodSummary(
            name=action.name,
            package=action.package,
            version=action.version,
            stage=action.stage,
            attempt=action.attempt,
            spec_hash=action.spec_hash,
            created=self.now,
            outcome=PodOutcome.RUNNING,
            progress=_progress(action.stage, done=0),
            chain=tuple(
                ChainedRun(package, version, stage, _progress(stage, done=0))
                for package, version, stage in action.chain
            ),
        )
        itype = action.interrupt.type if action.interrupt else None
        self.pods[action.name] = FakePod(summary, self.outcomes(action), itype)

    def tick(self, requeue: float | None) -> None:
        self.now += timedelta(seconds=min(requeue or 5.0, 120.0))
        if self._not_ready_ticks:
            self._not_ready_ticks -= 1
            self.ready = self._not_ready_ticks == 0
        if self._reboot_in:
            self._reboot_in -= 1
            if not self._reboot_in:
                self.reboot()
        for ref in list(self._terminating):
            self.workload = [p for p in self.workload if drain_mod.pod_ref(p) != ref]
            del self._terminating[ref]
        if self.protected_ticks:
            self.protected_ticks -= 1
            if not self.protected_ticks:
                protect = self.nodewright.spec.pod_non_interrupt_labels
                self.workload = [
                    p for p in self.workload if not drain_mod.select([p], protect=protect).protected
                ]
        for pod in list(self.pods.values()):
            if pod.summary.outcome != PodOutcome.RUNNING and pod.fate != "pull_error":
                continue
            pod.ticks += 1
            if pod.fate == "skip":
                pod.summary = replace(_succeeded(pod.summary), finished=self.now)
            elif pod.fate == "succeed":
                if pod.interrupt_type == InterruptType.REBOOT and self.reboot_delay_ticks:
                    # "reboot" issued: the agent exits 0, the node goes down a little later.
                    pod.summary = replace(pod.summary, outcome=PodOutcome.SUCCEEDED, finished=self.now)
                    self._reboot_in = self.reboot_delay_ticks
                elif pod.interrupt_type == InterruptType.REBOOT:
                    self.reboot()
                    if pod.summary.name not in self.pods:
                        continue
                    # The agent is killed by the reboot: the pod shows up Failed afterwards.
                    pod.summary = replace(pod.summary, outcome=PodOutcome.FAILED, message="killed by reboot")
                else:
                    pod.summary = _succeeded(pod.summary)
            elif pod.fate.startswith("fail@") and ":" in pod.fate:
                pod.summary = _failed_in_run(pod.summary, *pod.fate[5:].split(":", 1))
            elif pod.fate.startswith("fail@") and pod.fate[5:] not in [s.value for s in pod.summary.stages]:
                pod.summary = _succeeded(pod.summary)  # the failing stage is not one this pod runs
            elif pod.fate == "fail" or pod.fate.startswith("fail@"):
                values = [s.value for s in pod.summary.stages]
                at = values.index(pod.fate[5:]) if pod.fate.startswith("fail@") else 0
                pod.summary = replace(
                    pod.summary,
                    outcome=PodOutcome.FAILED,
                    message="exit code 1",
                    progress=_progress(pod.summary.stage, done=at),
                )
            elif pod.fate == "pull_error":
                pod.summary = replace(pod.summary, outcome=PodOutcome.PULL_ERROR, message="ImagePullBackOff")
            # "hang": stays running until the planner's stage deadline deletes it.

    def reboot(self) -> None:
        self.reboots += 1
        self.boot_id = f"boot-{self.reboots}"
        self.ready = False
        self._not_ready_ticks = 2
        if self.lose_pods_on_reboot:
            self.pods.clear()

    def run(self, *, max_steps: int = 400) -> NodePlan:
        """Step until the node is complete or erroring with nothing left to do."""
        plan = self.step()
        for _ in range(max_steps):
            if plan.status.value == "complete" and not self.pods:
                return plan
            if plan.status.value in ("erroring", "blocked", "waiting", "paused", "disabled") and self.quiet(
                plan
            ):
                return plan
            plan = self.step()
        raise InvariantError(f"did not settle in {max_steps} steps: {plan.status} {plan.condition.message}")

    def quiet(self, plan: NodePlan) -> bool:
        state = plan.state
        busy = [e for e in state.packages if e.state in (PackageState.IN_PROGRESS, PackageState.PENDING)]
        return not self.pods and not busy and not any(isinstance(a, CreatePod) for a in plan.actions)

    # -- invariants ---------------------------------------------------------------------------------------

    def max_attempts(self, name: str) -> int:
        pkg = self.nodewright.spec.packages.get(name)
        if pkg is None:
            return self.options.retry.max_attempts
        return RetryPolicy.for_package(pkg, self.options.retry).max_attempts

    def check(self, before: NodeState | None, plan: NodePlan) -> None:
        old = before or NodeState()
        new = plan.state
        for entry in new.packages:
            if entry.attempts > self.max_attempts(entry.name):
                raise InvariantError(f"{entry.key} attempts {entry.attempts} > max")
            prev = old.entry(entry.name, entry.version)
            if prev is None:
                continue  # checked below: only at its first stage, or after a pod that ran it
            _check_transition(self.nodewright, prev, entry)
        chained = {run.package: run for pod in self.pods.values() for run in pod.summary.chain}
        for entry in new.packages:
            if old.entry(entry.name, entry.version) is not None:
                continue
            run = chained.get(entry.name)
            if run is not None and run.version == entry.version:
                # Its first attempt ran in a pod of another package: it moves on from that run's stage.
                started = PackageEntry(entry.name, entry.version, run.stage, PackageState.IN_PROGRESS)
                try:
                    _check_transition(self.nodewright, started, entry)
                except InvariantError:
                    # Or it completed in the pod and its next run (an uninstall) started in this plan.
                    done = PackageEntry(entry.name, entry.version, PackageStage.CONFIG, PackageState.COMPLETE)
                    _check_transition(self.nodewright, done, entry)
            elif entry.stage not in (PackageStage.APPLY, PackageStage.UPGRADE):
                raise InvariantError(f"{entry.key} appeared at {entry.stage} without a pod that ran it")
        creates = [a for a in plan.actions if isinstance(a, CreatePod)]
        for action in creates:
            target = new.entry(action.package, action.version)
            if target is None:
                raise InvariantError(f"pod created for {action.package} without a state entry")
            pkg = self.nodewright.spec.packages[action.package]
            gated = action.stage in INTERRUPT_STAGES or (
                action.stage in PRE_INTERRUPT_STAGES and run_interrupt(pkg, target) is not None
            )
            # Cordon actions are executed before CreatePod in the same plan, but the planner waits for
            # the cordon to be observed before creating such pods.
            if gated and not self.unschedulable:
                raise InvariantError(f"{action.stage} pod of {action.package} on an uncordoned node")
            if old.admission is None:
                prev = old.entry(action.package, action.version)
                if prev is None or prev.state not in (
                    PackageState.PENDING,
                    PackageState.IN_PROGRESS,
                    PackageState.SKIPPED,
                ):
                    raise InvariantError(f"new work {action.package} started without admission")
            live = [p for p in self.pods.values() if not _deleted(plan, p.summary.name)]
            if action.stage in INTERRUPT_STAGES and any(p.summary.name != action.name for p in live):
                raise InvariantError("interrupt pod created while other package pods run")
            if action.stage not in INTERRUPT_STAGES and any(
                p.summary.stage in INTERRUPT_STAGES for p in live
            ):
                raise InvariantError("stage pod created during an interrupt")
        if any(isinstance(a, Uncordon) for a in plan.actions) and (
            self.cordoned_by_other or not old.cordoned
        ):
            raise InvariantError("uncordoned a node this NodeWright did not cordon")


def _progress(stage: PackageStage, *, done: int) -> tuple[StageProgress, ...]:
    """A non-interrupt pod's stages with the first `done` of them finished (interrupt pods: none)."""
    if stage in INTERRUPT_STAGES:
        return ()
    return tuple(StageProgress(s, done=i < done) for i, s in enumerate(pod_stages(stage)))


def _succeeded(summary: PodSummary) -> PodSummary:
    return replace(
        summary,
        outcome=PodOutcome.SUCCEEDED,
        progress=_progress(summary.stage, done=len(summary.stages)),
        chain=tuple(replace(r, progress=_progress(r.stage, done=len(r.stages))) for r in summary.chain),
    )


def _failed_in_run(summary: PodSummary, package: str, stage: str) -> PodSummary:
    """The pod failed in `stage` of the run of `package` it carries (its own or a chained one)."""
    runs = [(summary.package, summary.stages), *((r.package, r.stages) for r in summary.chain)]
    index = next((i for i, (name, _) in enumerate(runs) if name == package), None)
    if index is None or stage not in [s.value for s in runs[index][1]]:
        return _succeeded(summary)
    at = [s.value for s in runs[index][1]].index(stage)

    def done(i: int, stages: tuple[PackageStage, ...]) -> int:
        return len(stages) if i < index else at if i == index else 0

    return replace(
        summary,
        outcome=PodOutcome.FAILED,
        message="exit code 1",
        progress=_progress(summary.stage, done=done(0, summary.stages)),
        chain=tuple(
            replace(r, progress=_progress(r.stage, done=done(i + 1, r.stages)))
            for i, r in enumerate(summary.chain)
        ),
    )


def _deleted(plan: NodePlan, name: str) -> bool:
    return any(isinstance(a, DeletePod) and a.name == name for a in plan.actions)


def _check_transition(nw: NodeWright, prev: PackageEntry, new: PackageEntry) -> None:
    if prev.stage == new.stage:
        return
    spec = nw.spec.packages.get(prev.name)
    stopped = prev.suspended or prev.state == PackageState.ERRORING
    if stopped and new.stage == PackageStage.UNINSTALL and (spec is None or spec.version != prev.version):
        return  # what a stopped run of another version left is uninstalled (`plan.node._uninstallable`)
    # One pod runs every stage of its transition: the entry may move to any later stage of that pod
    # (the pod failed there) or past its last one.
    chain = pod_stages(prev.stage)
    allowed: set[PackageStage] = set(chain[1:])
    for has in (True, False):
        nxt = next_stage(chain[-1], has_interrupt=has)
        if not isinstance(nxt, Done):
            allowed.add(nxt)
    if prev.state == PackageState.COMPLETE:
        allowed |= {PackageStage.CONFIG, PackageStage.UNINSTALL}  # a config run or an uninstall starts
        if new.repair:
            allowed.add(PackageStage.APPLY)  # a drift repair runs the whole install again
    if prev.stage == PackageStage.UNINSTALL:
        allowed |= {PackageStage.APPLY, PackageStage.CONFIG, PackageStage.POST_INTERRUPT}  # cancelled
    if new.stage not in allowed:
        raise InvariantError(
            f"{prev.key}: {prev.stage}/{prev.state} -> {new.stage}/{new.state} skips a stage"
        )
    if prev.state not in (PackageState.IN_PROGRESS, PackageState.SKIPPED, PackageState.COMPLETE) and not (
        prev.stage == PackageStage.UNINSTALL
    ):
        raise InvariantError(f"{prev.key}: left {prev.stage} from state {prev.state}")
