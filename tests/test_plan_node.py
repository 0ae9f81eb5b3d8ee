"""The node plan: gating (admission, pause, disable, eligibility), cordon/drain, pods, reboots, changes."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodewright.api import constants
from nodewright.api.models import (
    Interrupt,
    InterruptType,
    LabelSelector,
    NodeWright,
    NodeWrightSpec,
    ObjectMeta,
    Package,
    Status,
    Toleration,
    Uninstall,
)
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
from nodewright.plan.configdiff import config_hashes
from nodewright.plan.node import (
    AttemptFailed,
    Cordon,
    CreatePod,
    DeletePod,
    Drain,
    NodeInput,
    PlanOptions,
    RequeueAfter,
    Uncordon,
    WaitForProtectedPods,
    plan_node,
)
from nodewright.plan.stages import (
    FailureCause,
    PodOutcome,
    PodSummary,
    RetryPolicy,
    StageProgress,
    pod_stages,
)
from tests.planfake import T0, FakeNode

REBOOT = Interrupt(type=InterruptType.REBOOT)
ADMIT = Admission("__default__", 1, 3, "2025-01-01T00:00:00Z")


def make_nw(annotations: dict[str, str] | None = None, **spec: Any) -> NodeWright:
    packages = spec.pop("packages", None) or {"pa": Package(version="1.0.0", image="ghcr.io/x/pa")}
    return NodeWright(
        metadata=ObjectMeta(name="nw", uid="u", generation=1, annotations=annotations),
        spec=NodeWrightSpec(packages=packages, **spec),
    )


def creates(plan: Any) -> list[CreatePod]:
    return [a for a in plan.actions if isinstance(a, CreatePod)]


def kinds(plan: Any) -> list[str]:
    return [type(a).__name__ for a in plan.actions]


def inp(nw: NodeWright, state: NodeState | None = None, **kw: Any) -> NodeInput:
    node = kw.pop("node", NodeFacts(name="n1", labels={}, boot_id="b0"))
    return NodeInput(
        nodewright=nw, node=node, state=state, pods=kw.pop("pods", ()), now=kw.pop("now", T0), **kw
    )


# -- gating ---------------------------------------------------------------------------------------------


def test_not_admitted_waits_and_creates_nothing() -> None:
    node = FakeNode(make_nw(), admitted=False)
    plan = node.step()
    assert plan.status == Status.WAITING
    assert "admit" in plan.condition.message
    assert not creates(plan) and plan.condition.status == "False"


def test_admitted_fresh_node_installs_without_cordon() -> None:
    node = FakeNode(make_nw())
    plan = node.run()
    assert plan.status == Status.COMPLETE and plan.condition.status == "True"
    # One pod per transition: apply and config run in the same pod, one state write when it ends.
    assert [c.stage for c in node.created] == [PackageStage.APPLY]
    assert not any(isinstance(a, (Cordon, Drain, Uncordon)) for p in node.plans for a in p.actions)
    assert plan.state.admission is None and plan.state.generation == 1
    assert any(getattr(a, "reason", "") == "NodeComplete" for a in plan.actions)


def test_work_in_flight_continues_without_admission() -> None:
    node = FakeNode(make_nw())
    node.step()  # apply pod created
    node.state_text = encode(replace(decode(node.state_text or ""), admission=None))
    node.run()
    assert node.plans[-1].status == Status.COMPLETE  # the rollout lost track, the node still finished


def test_paused_creates_nothing_but_observes() -> None:
    nw = make_nw()
    node = FakeNode(nw, outcomes=lambda _: "fail@config")
    node.step()
    node.nodewright = make_nw({constants.ANNOTATION_PAUSE: "true"})
    plan = node.step()  # the pod failed in config meanwhile: recorded (apply done), no retry started
    assert plan.status == Status.PAUSED
    assert not creates(plan)
    entry = plan.state.entry("pa", "1.0.0")
    assert entry is not None and entry.stage == PackageStage.CONFIG and entry.retry_at is not None
    for _ in range(5):
        assert not creates(node.step())


def test_disabled_starts_nothing_and_releases_its_cordon_when_nothing_runs() -> None:
    disabled = make_nw({constants.ANNOTATION_DISABLE: "true"})
    pending = PackageEntry("pa", "1.0.0", PackageStage.APPLY, PackageState.PENDING)
    state = NodeState(packages=(pending,), admission=ADMIT, cordoned=True)
    plan = plan_node(inp(disabled, state, node=NodeFacts(name="n1", labels={}, unschedulable=True)))
    assert plan.status == Status.DISABLED and not creates(plan)
    assert Uncordon() in plan.actions and not plan.state.cordoned
    assert plan.state.entry("pa", "1.0.0") == pending  # the run is kept, to continue when enabled
    # Not cordoned by us: nothing to release, nothing to do.
    quiet = plan_node(inp(disabled, replace(state, cordoned=False)))
    assert quiet.status == Status.DISABLED and quiet.actions == ()


def test_disabled_keeps_its_cordon_until_running_pods_finish() -> None:
    node = FakeNode(
        make_nw(packages={"pa": Package(version="1.0.0", image="ghcr.io/x/pa", interrupt=REBOOT)})
    )
    for _ in range(20):
        plan = node.step()
        if creates(plan):
            break
    assert node.unschedulable and creates(plan)[0].stage == PackageStage.APPLY
    node.nodewright = make_nw(
        {constants.ANNOTATION_DISABLE: "true"},
        packages={"pa": Package(version="1.0.0", image="ghcr.io/x/pa", interrupt=REBOOT)},
    )
    for pod in node.pods.values():
        pod.fate = "hang"
    node.pods[creates(plan)[0].name].summary = replace(
        node.pods[creates(plan)[0].name].summary, outcome=PodOutcome.RUNNING
    )
    held = node.step()
    assert held.status == Status.DISABLED and Uncordon() not in held.actions and node.unschedulable
    assert "released once" in held.condition.message
    node.pods.clear()  # the apply pod ended and is gone
    released = node.step()
    assert Uncordon() in released.actions and not node.unschedulable and not creates(released)


def test_ignore_label_and_taints_block() -> None:
    nw = make_nw()
    ignored = plan_node(
        inp(
            nw, NodeState(admission=ADMIT), node=NodeFacts(name="n1", labels={constants.LABEL_IGNORE: "true"})
        )
    )
    assert ignored.status == Status.BLOCKED and "ignore" in ignored.condition.message and not creates(ignored)
    tainted = NodeFacts(name="n1", labels={}, taints=(Taint("gpu", "PreferNoSchedule"),))
    blocked = plan_node(inp(nw, NodeState(admission=ADMIT), node=tainted))
    assert blocked.status == Status.BLOCKED and "gpu" in blocked.condition.message
    tolerant = make_nw(additional_tolerations=[Toleration(key="gpu", operator="Exists")])
    assert creates(plan_node(inp(tolerant, NodeState(admission=ADMIT), node=tainted)))
    rt = NodeFacts(
        name="n1", labels={}, taints=(Taint(constants.DEFAULT_RUNTIME_REQUIRED_TAINT_KEY, "NoSchedule"),)
    )
    assert plan_node(inp(nw, NodeState(admission=ADMIT), node=rt)).status == Status.BLOCKED
    assert creates(plan_node(inp(make_nw(runtime_required=True), NodeState(admission=ADMIT), node=rt)))


def test_sequencing_blocker_waits() -> None:
    plan = plan_node(
        inp(make_nw(), NodeState(admission=ADMIT), sequencing_blocker="infra is not complete on this node")
    )
    assert plan.status == Status.WAITING and "infra" in plan.condition.message and not creates(plan)


# -- cordon, protected pods, drain ----------------------------------------------------------------------


def reboot_nw(**spec: Any) -> NodeWright:
    return make_nw(packages={"pa": Package(version="1.0.0", image="ghcr.io/x/pa", interrupt=REBOOT)}, **spec)


def workload(name: str, labels: dict[str, str] | None = None, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
        "spec": {},
        "status": {"phase": phase},
    }


def test_interrupt_flow_cordon_wait_drain_reboot_uncordon() -> None:
    nw = reboot_nw(pod_non_interrupt_labels=LabelSelector(match_labels={"job": "train"}))
    node = FakeNode(nw, workload=[workload("web"), workload("train", {"job": "train"})], protected_ticks=3)
    plan = node.run()
    assert plan.status == Status.COMPLETE
    seq = [
        k
        for p in node.plans
        for k in kinds(p)
        if k in ("Cordon", "WaitForProtectedPods", "Drain", "CreatePod", "Uncordon")
    ]
    assert seq[0] == "Cordon" and seq[-1] == "Uncordon"
    assert seq.index("WaitForProtectedPods") < seq.index("Drain") < seq.index("CreatePod")
    assert [c.stage for c in node.created] == [
        PackageStage.APPLY,  # apply and config, drained first
        PackageStage.INTERRUPT,
        PackageStage.POST_INTERRUPT,
    ]
    assert node.reboots == 1 and not node.unschedulable


def test_post_interrupt_waits_until_the_interrupt_pod_of_a_completed_reboot_is_gone() -> None:
    """A real kubelet that comes back from the reboot starts the old interrupt pod's init containers
    again: its status from before the reboot says nothing, so post-interrupt waits until it is gone
    (found on real nodes: the invariant monitor's I9 saw both pods of the package at once)."""
    node = FakeNode(reboot_nw(), lose_pods_on_reboot=False, reboot_delay_ticks=1)
    while node.reboots == 0 or not node.ready:
        node.step()
    (interrupt,) = [p for p in node.pods.values() if p.summary.stage == PackageStage.INTERRUPT]
    # The new kubelet runs it again (RUNNING), then it is deleted and terminates for a while.
    interrupt.summary = replace(interrupt.summary, outcome=PodOutcome.RUNNING)
    plan = node.plan()
    assert not creates(plan)
    assert [a.name for a in plan.actions if isinstance(a, DeletePod)] == [interrupt.summary.name]
    interrupt.summary = replace(interrupt.summary, terminating=True, outcome=PodOutcome.SUCCEEDED)
    plan = node.plan()
    assert not creates(plan) and not any(isinstance(a, DeletePod) for a in plan.actions)
    assert "interrupt pod" in plan.condition.message
    del node.pods[interrupt.summary.name]
    assert [c.stage for c in creates(node.plan())] == [PackageStage.POST_INTERRUPT]


def test_drain_waits_for_terminating_pods() -> None:
    nw = reboot_nw()
    from nodewright.plan.drain import DrainSelection
    from nodewright.plan.node import DrainFacts

    node = NodeFacts(name="n1", labels={}, unschedulable=True, boot_id="b0")
    facts = DrainFacts(
        selection=DrainSelection(evict=(), terminating=("default/web",), protected=()),
        eviction_blocked=("PDB web-pdb allows 0 disruptions",),
    )
    plan = plan_node(inp(nw, NodeState(admission=ADMIT, cordoned=True), node=node, drain=facts))
    assert not creates(plan) and "1 pod(s) left" in plan.condition.message and "PDB" in plan.condition.message
    assert plan.condition.reason == "Draining"
    first = plan_node(inp(nw, NodeState(admission=ADMIT, cordoned=True), node=node))
    assert first.needs_drain_facts and not creates(first)


def test_cordoned_by_someone_else_is_not_uncordoned() -> None:
    node = FakeNode(reboot_nw(), cordoned_by_other=True)
    node.run()
    assert node.plans[-1].status == Status.COMPLETE
    assert node.unschedulable
    assert not any(isinstance(a, (Cordon, Uncordon)) for p in node.plans for a in p.actions)


def test_protected_pods_rechecked_before_interrupt() -> None:
    nw = reboot_nw(pod_non_interrupt_labels=LabelSelector(match_labels={"job": "train"}))
    node = FakeNode(nw)
    while not any(c.stage == PackageStage.APPLY for c in node.created):
        node.step()
    node.workload.append(
        workload("late", {"job": "train"})
    )  # a protected pod appeared (tolerating the cordon)
    node.workload[-1]["spec"]["tolerations"] = [{"operator": "Exists"}]
    for _ in range(5):
        plan = node.step()
    assert not any(c.stage == PackageStage.INTERRUPT for c in node.created)
    assert plan.condition.reason == "WaitingForProtectedPods"
    assert any(isinstance(a, WaitForProtectedPods) for a in plan.actions)


# -- pods ----------------------------------------------------------------------------------------------


def running_state(nw: NodeWright) -> tuple[NodeState, CreatePod]:
    plan = plan_node(inp(nw, NodeState(admission=ADMIT)))
    return plan.state, creates(plan)[0]


def summary(c: CreatePod, outcome: PodOutcome = PodOutcome.RUNNING, **kw: Any) -> PodSummary:
    return PodSummary(
        name=c.name,
        package=c.package,
        version=c.version,
        stage=c.stage,
        attempt=c.attempt,
        spec_hash=c.spec_hash,
        created=kw.pop("created", T0),
        outcome=outcome,
        **kw,
    )


def test_spec_change_replaces_pod_and_stray_pods_are_deleted() -> None:
    nw = make_nw()
    state, pod = running_state(nw)
    stray = replace(summary(pod), name="stray", stage=PackageStage.UNINSTALL)
    changed = make_nw(packages={"pa": Package(version="1.0.0", image="ghcr.io/x/pa-fixed")})
    plan = plan_node(inp(changed, state, pods=(summary(pod), stray)))
    deletes = {a.name: a.reason for a in plan.actions if isinstance(a, DeletePod)}
    assert deletes == {pod.name: "pod spec changed", "stray": "no package stage expects this pod"}
    # The replaced pod may still be running its work: its successor waits until it is gone.
    assert not creates(plan) and "to finish" in plan.condition.message
    still_terminating = plan_node(inp(changed, plan.state, pods=(summary(pod),)))
    assert not creates(still_terminating)
    new = creates(plan_node(inp(changed, plan.state)))
    assert len(new) == 1 and new[0].name != pod.name and new[0].attempt == 1


def test_no_second_pod_of_a_package_while_one_may_still_run() -> None:
    """Rule 2 of the safety issue: one pod per (node, package) at a time, whatever its stage."""
    nw = make_nw(packages={"pa": Package(version="1.0.0", image="x", uninstall=Uninstall(enabled=True))})
    state, pod = running_state(nw)
    uninstalling = replace(summary(pod), name="pa-uninstall", stage=PackageStage.UNINSTALL)
    # Running, also while terminating: it may still be changing the host.
    for terminating in (False, True):
        plan = plan_node(inp(nw, state, pods=(replace(uninstalling, terminating=terminating),)))
        assert not creates(plan) and "to finish" in plan.condition.message, terminating
        assert plan.status == Status.IN_PROGRESS
    # Whose work ended (only waiting to be removed), or stuck pulling and being deleted (its containers
    # can no longer start): it does not hold the package.
    for outcome in (PodOutcome.SUCCEEDED, PodOutcome.FAILED, PodOutcome.PULL_ERROR):
        done = plan_node(inp(nw, state, pods=(replace(uninstalling, outcome=outcome, terminating=True),)))
        assert len(creates(done)) == 1, outcome


def test_retry_then_give_up() -> None:
    nw = make_nw(packages={"pa": Package(version="1.0.0", image="x", max_attempts=2)})
    state, pod = running_state(nw)
    failed = plan_node(inp(nw, state, pods=(summary(pod, PodOutcome.FAILED, message="exit 3"),)))
    e = failed.state.entry("pa", "1.0.0")
    assert e is not None and e.retry_at == "2025-01-01T00:00:10Z" and "exit 3" in e.error
    assert not creates(failed) and any(
        isinstance(a, RequeueAfter) and a.seconds == 10 for a in failed.actions
    )
    again = plan_node(inp(nw, failed.state, now=T0 + timedelta(seconds=10)))
    pod2 = creates(again)[0]
    assert pod2.attempt == 2
    gave_up = plan_node(
        inp(
            nw,
            again.state,
            pods=(summary(pod2, PodOutcome.FAILED, message="exit 3"),),
            now=T0 + timedelta(seconds=11),
        )
    )
    assert gave_up.status == Status.ERRORING and "giving up" in gave_up.condition.message
    assert any(getattr(a, "reason", "") == "PackageFailed" for a in gave_up.actions)
    assert gave_up.consume_admission  # settled: the admission it ran under is used up
    # Fixing the spec alone restarts nothing: the retry needs a fresh admission (a batch, the budget).
    fixed = make_nw(packages={"pa": Package(version="1.0.0", image="y", max_attempts=2)})
    unadmitted = replace(gave_up.state, admission=None)
    assert not creates(plan_node(inp(fixed, unadmitted, now=T0 + timedelta(seconds=20))))
    # Nor does the admission it failed under.
    assert not creates(plan_node(inp(fixed, gave_up.state, now=T0 + timedelta(seconds=20))))
    fresh = replace(gave_up.state, admission=Admission("__default__", 2, 4, "2025-01-01T00:00:15Z"))
    retry = plan_node(inp(fixed, fresh, now=T0 + timedelta(seconds=20)))
    assert creates(retry) and creates(retry)[0].attempt == 1
    assert retry.status == Status.IN_PROGRESS and not retry.consume_admission


def test_a_readmission_in_the_same_second_as_the_failure_still_retries() -> None:
    """Admissions are told apart by identity (batch/order/time), not by comparing second-precision times."""
    nw = make_nw(packages={"pa": Package(version="1.0.0", image="x", max_attempts=1)})
    state, pod = running_state(nw)
    gave_up = plan_node(inp(nw, state, pods=(summary(pod, PodOutcome.FAILED, message="exit 3"),)))
    entry = gave_up.state.entry("pa", "1.0.0")
    assert entry is not None and entry.failed_under == "1/3/2025-01-01T00:00:00Z", entry
    same_second = Admission("__default__", 2, 9, ADMIT.at)
    retry = plan_node(inp(nw, replace(gave_up.state, admission=same_second)))
    assert creates(retry) and creates(retry)[0].attempt == 1


def test_deadline_and_pull_error() -> None:
    # The package's stageTimeout (model default 30m) wins over the operator default.
    nw = make_nw(packages={"pa": Package(version="1.0.0", image="x", stage_timeout="1m")})
    opts = PlanOptions(retry=RetryPolicy(stage_timeout=3600, pull_error_grace=30))
    state, pod = running_state(nw)
    # The install pod runs apply and config: the timeout counts per stage, 2 x 1m.
    early = plan_node(inp(nw, state, pods=(summary(pod),), now=T0 + timedelta(seconds=119), options=opts))
    assert not any(isinstance(a, DeletePod) for a in early.actions)
    late = plan_node(inp(nw, state, pods=(summary(pod),), now=T0 + timedelta(seconds=121), options=opts))
    assert any(isinstance(a, DeletePod) for a in late.actions)
    assert "did not finish within 2m" in late.state.entry("pa", "1.0.0").error  # type: ignore[union-attr]
    pulling = plan_node(
        inp(
            nw,
            state,
            pods=(summary(pod, PodOutcome.PULL_ERROR, message="ErrImagePull"),),
            now=T0 + timedelta(seconds=5),
            options=opts,
        )
    )
    assert not any(isinstance(a, DeletePod) for a in pulling.actions)
    assert pulling.state.entry("pa", "1.0.0").pull_error_since == "2025-01-01T00:00:05Z"  # type: ignore[union-attr]
    expired = plan_node(
        inp(
            nw,
            pulling.state,
            pods=(summary(pod, PodOutcome.PULL_ERROR, message="ImagePullBackOff"),),
            now=T0 + timedelta(seconds=36),
            options=opts,
        )
    )
    assert "ImagePullBackOff" in expired.state.entry("pa", "1.0.0").error  # type: ignore[union-attr]


def test_reboot_timeout() -> None:
    node = FakeNode(reboot_nw(), options=PlanOptions(reboot_timeout=600))
    node.outcomes = lambda a: "hang" if a.stage == PackageStage.INTERRUPT else "succeed"
    plan = node.run()
    assert plan.status == Status.ERRORING
    assert "node did not return from reboot within 10m" in plan.condition.message
    assert node.unschedulable  # an erroring node stays cordoned


def test_reapply_on_reboot() -> None:
    node = FakeNode(make_nw(), options=PlanOptions(reapply_on_reboot=True))
    node.run()
    node.boot_id = "other"
    plan = node.step()
    assert plan.status == Status.WAITING and plan.state.packages == ()


# -- changes -------------------------------------------------------------------------------------------


def complete_entry(pkg: Package, name: str = "pa", **kw: Any) -> PackageEntry:
    return PackageEntry(
        name=name,
        version=kw.pop("version", pkg.version),
        stage=PackageStage.CONFIG,
        state=PackageState.COMPLETE,
        config=config_hashes(pkg.config_map),
        **kw,
    )


def test_config_change_without_config_interrupt_never_cordons() -> None:
    old = Package(
        version="1.0.0",
        image="x",
        interrupt=REBOOT,
        config_map={"a": "1", "b": "2"},
        config_interrupts={"a": REBOOT},
    )
    new = old.model_copy(update={"config_map": {"a": "1", "b": "3"}})
    state = NodeState(packages=(complete_entry(old),), admission=ADMIT, generation=1)
    node = FakeNode(make_nw(packages={"pa": new}), state_text=encode(state))
    node.run()
    assert [c.stage for c in node.created] == [PackageStage.CONFIG]
    assert not any(isinstance(a, Cordon) for p in node.plans for a in p.actions)


def test_removed_key_with_config_interrupt_cordons_and_interrupts() -> None:
    old = Package(
        version="1.0.0", image="x", config_map={"a.conf": "1", "b": "2"}, config_interrupts={"*.conf": REBOOT}
    )
    new = old.model_copy(update={"config_map": {"b": "2"}, "config_interrupts": {"*.conf": REBOOT}})
    state = NodeState(packages=(complete_entry(old),), admission=ADMIT, generation=1)
    node = FakeNode(make_nw(packages={"pa": new}), state_text=encode(state))
    plan = node.run()
    assert plan.status == Status.COMPLETE
    assert [c.stage for c in node.created] == [
        PackageStage.CONFIG,
        PackageStage.INTERRUPT,
        PackageStage.POST_INTERRUPT,
    ]
    assert node.reboots == 1
    assert plan.state.entry("pa", "1.0.0").config == config_hashes({"b": "2"})  # type: ignore[union-attr]


def test_downgrade_rules() -> None:
    newer = Package(version="2.0.0", image="x")
    lower = Package(version="1.0.0", image="x")
    state = NodeState(packages=(complete_entry(newer),), admission=ADMIT, generation=1)
    node = FakeNode(make_nw(packages={"pa": lower}), state_text=encode(state))
    node.run()
    assert {e.version for e in node.plans[-1].state.entries_for("pa")} == {"1.0.0", "2.0.0"}  # D2: retained
    assert node.created[0].stage == PackageStage.APPLY
    guarded = lower.model_copy(update={"uninstall": Uninstall(enabled=True)})
    plan = plan_node(inp(make_nw(packages={"pa": guarded}), state))
    assert plan.status == Status.BLOCKED and "requires uninstalling 2.0.0" in plan.condition.message


def test_uninstall_then_cancel() -> None:
    pkg = Package(version="1.0.0", image="x", interrupt=REBOOT, uninstall=Uninstall(enabled=True, apply=True))
    state = NodeState(packages=(complete_entry(pkg),), admission=ADMIT, generation=1)
    node = FakeNode(make_nw(packages={"pa": pkg}), state_text=encode(state))
    node.run()
    assert [c.stage for c in node.created] == [PackageStage.UNINSTALL, PackageStage.UNINSTALL_INTERRUPT]
    assert node.plans[-1].status == Status.COMPLETE and not node.plans[-1].state.packages
    # Cancel before anything ran: the package stays installed.
    pending = NodeState(
        packages=(replace(complete_entry(pkg), stage=PackageStage.UNINSTALL, state=PackageState.PENDING),),
        admission=ADMIT,
        cordoned=True,
    )
    keep = pkg.model_copy(update={"uninstall": Uninstall(enabled=True, apply=False)})
    plan = plan_node(
        inp(make_nw(packages={"pa": keep}), pending, node=NodeFacts(name="n1", labels={}, unschedulable=True))
    )
    assert plan.state.entry("pa", "1.0.0").state == PackageState.COMPLETE  # type: ignore[union-attr]
    assert plan.status == Status.COMPLETE and any(isinstance(a, Uncordon) for a in plan.actions)


def test_child_does_not_wait_for_unrelated_root() -> None:
    packages = {
        "pa": Package(version="1.0.0", image="x"),
        "pb": Package(version="1.0.0", image="x", depends_on={"pa": "1.0.0"}),
        "pc": Package(version="1.0.0", image="x"),
    }
    node = FakeNode(make_nw(packages=packages))
    node.outcomes = lambda a: "hang" if a.package == "pc" else "succeed"
    for _ in range(6):
        node.step()
    started = [(c.package, c.stage) for c in node.created]
    assert ("pb", PackageStage.APPLY) in started  # pc still hangs in apply
    assert started.index(("pb", PackageStage.APPLY)) > started.index(("pa", PackageStage.APPLY))
    # pb starts in the very plan that records pa complete (its dependency), not before.
    first_pb = next(p for p in node.plans if any(c.package == "pb" for c in creates(p)))
    pa = first_pb.state.entry("pa", "1.0.0")
    assert pa is not None and pa.state == PackageState.COMPLETE


def test_serial_one_package_at_a_time() -> None:
    packages = {n: Package(version="1.0.0", image="x") for n in ("pa", "pb", "pc")}
    node = FakeNode(make_nw(packages=packages, serial=True))
    node.run()
    order = [c.package for c in node.created]
    assert order == ["pa", "pb", "pc"]


# -- determinism / idempotence --------------------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 12), st.booleans())
def test_plan_is_deterministic_and_idempotent(steps: int, interrupt: bool) -> None:
    nw = reboot_nw() if interrupt else make_nw()
    node = FakeNode(nw, workload=[workload("web")])
    for _ in range(steps):
        node.step()
    first, second = node.plan(with_drain=True), node.plan(with_drain=True)
    assert first == second
    # Writing the new state and planning again (nothing executed yet) repeats only idempotent actions:
    # the same pod names (AlreadyExists), no attempt bump, no second "started" event, no state change.
    node.state_text = encode(first.state)
    again = node.plan(with_drain=True)
    assert {c.name for c in creates(again)} <= {c.name for c in creates(first)}
    for c in creates(again):
        entry = again.state.entry(c.package, c.version)
        assert entry is not None and entry.attempts == c.attempt
    started = {"PackageStarted", "InterruptStarted", "NodeComplete"}  # one vocabulary (api.events)
    assert not [a for a in again.actions if getattr(a, "reason", "") in started]
    assert again.state == first.state


def test_generation_bump_alone_keeps_node_complete_quietly() -> None:
    node = FakeNode(make_nw())
    node.run()
    node.nodewright = make_nw(priority=5).model_copy(
        update={"metadata": ObjectMeta(name="nw", uid="u", generation=2)}
    )
    plan = node.step()
    assert plan.status == Status.COMPLETE and plan.state.generation == 2
    assert not [a for a in plan.actions if getattr(a, "reason", "") == "NodeComplete"]


def test_dependency_being_uninstalled_blocks_dependent() -> None:
    packages = {
        "pa": Package(version="1.0.0", image="x", uninstall=Uninstall(enabled=True, apply=True)),
        "pb": Package(version="1.0.0", image="x", depends_on={"pa": "1.0.0"}),
    }
    plan = plan_node(inp(make_nw(packages=packages), NodeState(admission=ADMIT)))
    assert plan.status == Status.BLOCKED and "DependencyUninstalled" in plan.condition.message


def test_dependency_cycle_blocks() -> None:
    packages = {
        "pa": Package(version="1.0.0", image="x", depends_on={"pb": "1.0.0"}),
        "pb": Package(version="1.0.0", image="x", depends_on={"pa": "1.0.0"}),
    }
    plan = plan_node(inp(make_nw(packages=packages), NodeState(admission=ADMIT)))
    assert plan.status == Status.BLOCKED and "cycle" in plan.condition.message and not creates(plan)


def test_interrupts_of_packages_finishing_together_merge_into_one_reboot() -> None:
    svc = Interrupt(type=InterruptType.SERVICE, services=["containerd"])
    packages = {
        "pa": Package(version="1.0.0", image="x", interrupt=svc),
        "pb": Package(version="1.0.0", image="x", interrupt=REBOOT),
        "pc": Package(version="1.0.0", image="x", interrupt=REBOOT),
    }
    node = FakeNode(make_nw(packages=packages))
    plan = node.run()
    assert plan.status == Status.COMPLETE
    interrupts = [c for c in node.created if c.stage == PackageStage.INTERRUPT]
    assert len(interrupts) == 1 and interrupts[0].package == "pb"
    assert interrupts[0].interrupt == REBOOT and interrupts[0].covers == ("pa", "pc")
    assert node.reboots == 1
    assert sum(c.stage == PackageStage.POST_INTERRUPT for c in node.created) == 3


def test_reboot_pod_exiting_before_the_reboot_is_not_rerun() -> None:
    node = FakeNode(reboot_nw(), reboot_delay_ticks=3, lose_pods_on_reboot=False)
    plan = node.run()
    assert plan.status == Status.COMPLETE
    assert node.reboots == 1
    assert sum(c.stage == PackageStage.INTERRUPT for c in node.created) == 1


def test_a_reboot_pod_that_ends_without_a_reboot_is_retried_with_a_new_identity() -> None:
    # The agent skipped `reboot` (its flag for the pod's resource id said it had run) and exited 0: the
    # node never goes down. Not a wait for the reboot timeout with the node cordoned: after the grace,
    # a failed attempt, and the retry's pod has its own identity, so the agent reboots.
    node = FakeNode(reboot_nw(), options=PlanOptions(reboot_grace=300))
    node.outcomes = lambda a: "skip" if a.stage == PackageStage.INTERRUPT and a.attempt == 1 else "succeed"
    plan = node.run()
    assert plan.status == Status.COMPLETE and node.reboots == 1 and not node.unschedulable
    first, retry = [c for c in node.created if c.stage == PackageStage.INTERRUPT]
    assert (first.attempt, retry.attempt) == (1, 2) and first.run != retry.run and first.name != retry.name
    failed = [f for p in node.plans for f in p.failed]
    assert [f.cause for f in failed] == [FailureCause.NO_REBOOT]
    assert "did not reboot" in failed[0].message and first.name in failed[0].message
    assert node.now - T0 < timedelta(seconds=900), "well before the 20 minutes of the reboot timeout"


def test_a_reboot_that_never_happens_gives_up_with_the_reason() -> None:
    nw = make_nw(packages={"pa": Package(version="1.0.0", image="x", interrupt=REBOOT, max_attempts=2)})
    node = FakeNode(nw)
    node.outcomes = lambda a: "skip" if a.stage == PackageStage.INTERRUPT else "succeed"
    plan = node.run()
    assert plan.status == Status.ERRORING and node.reboots == 0
    assert "did not reboot" in plan.condition.message and "giving up" in plan.condition.message
    assert sum(c.stage == PackageStage.INTERRUPT for c in node.created) == 2
    assert plan.state.interrupt_at is None


def test_a_lost_interrupt_pod_comes_back_with_the_same_identity() -> None:
    # Lost before it ran (or deleted by someone): the same attempt again, with the same identity, so if
    # it did issue the reboot, the agent does not reboot a second time.
    node = FakeNode(
        reboot_nw(), outcomes=lambda a: "hang" if a.stage == PackageStage.INTERRUPT else "succeed"
    )
    while not any(c.stage == PackageStage.INTERRUPT for c in node.created):
        node.step()
    [lost] = [c for c in node.created if c.stage == PackageStage.INTERRUPT]
    node.pods.clear()
    node.step()
    again = node.created[-1]
    assert again.stage == PackageStage.INTERRUPT and again is not lost
    assert (again.name, again.run, again.attempt) == (lost.name, lost.run, lost.attempt)


def test_create_pod_matches_the_built_manifest() -> None:
    from nodewright.plan.podspec import build_pod

    nw = reboot_nw()
    node = FakeNode(nw)
    node.run()
    for c in node.created:
        pod = build_pod(
            nw,
            nw.spec.packages[c.package],
            package_name=c.package,
            version=c.version,
            stage=c.stage,
            node="node-1",
            attempt=c.attempt,
            node_order=c.node_order,
            options=node.options.pod,
            interrupt=c.interrupt,
            run=c.run,
        )
        assert pod["metadata"]["name"] == c.name
        assert pod["metadata"]["annotations"][constants.POD_ANNOTATION_SPEC_HASH] == c.spec_hash
        assert pod["metadata"]["labels"][constants.POD_LABEL_STAGE] == c.stage.value
    assert {c.node_order for c in node.created} == {0}


def test_failed_interrupt_retries_under_a_fresh_admission() -> None:
    svc = Interrupt(type=InterruptType.SERVICE, services=["bad"])
    nw = make_nw(packages={"pa": Package(version="1.0.0", image="x", interrupt=svc, max_attempts=1)})
    node = FakeNode(nw)
    node.outcomes = lambda a: "fail" if a.stage == PackageStage.INTERRUPT else "succeed"
    plan = node.run()
    assert plan.status == Status.ERRORING and node.unschedulable
    fixed = Interrupt(type=InterruptType.SERVICE, services=["good"])
    node.nodewright = make_nw(
        packages={"pa": Package(version="1.0.0", image="x", interrupt=fixed, max_attempts=1)}
    )
    node.outcomes = lambda a: "succeed"
    plan = node.run()
    assert plan.status == Status.ERRORING  # no fresh admission yet: nothing restarts
    readmitted = Admission("__default__", 2, 4, "2030-01-01T00:00:00Z")
    node.state_text = encode(replace(decode(node.state_text or ""), admission=readmitted))
    node.now = max(node.now, T0.replace(year=2030) + timedelta(seconds=1))
    plan = node.run()
    assert plan.status == Status.COMPLETE and not node.unschedulable
    assert [c.stage for c in node.created][-2:] == [PackageStage.INTERRUPT, PackageStage.POST_INTERRUPT]


# -- admin cordon and drain timeout policies (issue 6) ------------------------------------------------


def test_node_already_unschedulable_at_cordon_time_records_no_ownership() -> None:
    nw = reboot_nw()
    admin = NodeFacts(name="n1", labels={}, unschedulable=True, boot_id="b0")
    first = plan_node(inp(nw, NodeState(admission=ADMIT), node=admin))
    assert not any(isinstance(a, Cordon) for a in first.actions)
    assert first.needs_drain_facts and not first.state.cordoned
    # The run is recorded as started (work in flight), but the cordon is not ours.
    assert first.state.entry("pa", "1.0.0") is not None
    node = FakeNode(nw, cordoned_by_other=True)
    final = node.run()
    assert final.status == Status.COMPLETE and node.unschedulable
    assert not any(p.state.cordoned for p in node.plans)
    assert [c.stage for c in node.created][-2:] == [PackageStage.INTERRUPT, PackageStage.POST_INTERRUPT]


def drain_nw(policy: str, timeout: str = "5s", **spec: Any) -> NodeWright:
    from nodewright.api.models import Drain as DrainSpec

    drain = DrainSpec(timeout=timeout, policy=policy)  # type: ignore[arg-type]
    if "packages" in spec:
        return make_nw(drain=drain, **spec)
    return reboot_nw(drain=drain, **spec)


def draining(*, since_seconds: float, blocked: bool = True) -> Any:
    from nodewright.plan.drain import DrainSelection
    from nodewright.plan.node import DrainFacts

    return DrainFacts(
        selection=DrainSelection(evict=("team/web-0",), terminating=(), protected=()),
        draining_since=T0 - timedelta(seconds=since_seconds),
        eviction_blocked=(
            ("team/web-0: The disruption budget web-pdb needs 1 healthy pods and has 1 currently",)
            if blocked
            else ()
        ),
    )


HEAD = PackageEntry(name="pa", version="1.0.0", stage=PackageStage.APPLY, state=PackageState.PENDING)
CORDONED = NodeFacts(name="n1", labels={}, unschedulable=True, boot_id="b0")


def test_drain_timeout_wait_keeps_evicting_and_names_the_pdb() -> None:
    state = NodeState(packages=(HEAD,), admission=ADMIT, cordoned=True)
    plan = plan_node(inp(drain_nw("wait"), state, node=CORDONED, drain=draining(since_seconds=60)))
    drains = [a for a in plan.actions if isinstance(a, Drain)]
    assert drains == [Drain(("team/web-0",), force=False)]
    # Past the timeout the reason says so (it used to stay `Draining`), and the pods left are named.
    assert plan.status == Status.IN_PROGRESS and plan.condition.reason == "DrainTimeout"
    assert "web-pdb" in plan.condition.message and "team/web-0" in plan.condition.message
    assert "timeout 5s exceeded (policy wait)" in plan.condition.message
    assert "1 pod(s) left (team/web-0)" in plan.condition.message
    assert plan.state.cordoned and not creates(plan) and not plan.drain_skipped


def test_drain_timeout_force_deletes_after_the_timeout_only() -> None:
    state = NodeState(packages=(HEAD,), admission=ADMIT, cordoned=True)
    before = plan_node(inp(drain_nw("force"), state, node=CORDONED, drain=draining(since_seconds=2)))
    assert [a for a in before.actions if isinstance(a, Drain)] == [Drain(("team/web-0",), force=False)]
    after = plan_node(inp(drain_nw("force"), state, node=CORDONED, drain=draining(since_seconds=6)))
    assert [a for a in after.actions if isinstance(a, Drain)] == [Drain(("team/web-0",), force=True)]
    assert after.status == Status.IN_PROGRESS and not creates(after)


def test_drain_timeout_skip_releases_the_node_until_admitted_again() -> None:
    nw = drain_nw("skip")
    state = NodeState(packages=(HEAD,), admission=ADMIT, cordoned=True)
    # Before the timeout: an ordinary drain.
    early = plan_node(inp(nw, state, node=CORDONED, drain=draining(since_seconds=2)))
    assert any(isinstance(a, Drain) for a in early.actions) and not early.drain_skipped
    # After it: uncordon, the unstarted run undone, blocked with the reason, nothing evicted or created.
    plan = plan_node(inp(nw, state, node=CORDONED, drain=draining(since_seconds=6)))
    assert plan.drain_skipped and plan.drain_skip is not None and plan.drain_skip.at == T0
    assert [a for a in plan.actions if isinstance(a, (Cordon, Uncordon, Drain, CreatePod))] == [Uncordon()]
    assert plan.status == Status.BLOCKED and plan.condition.reason == "DrainTimeout"
    assert "web-pdb" in plan.condition.message and "team/web-0" in plan.condition.message
    assert not plan.state.cordoned and plan.state.entry("pa", "1.0.0") is None
    # Still admitted under the same admission (the rollout has not released it yet): stays released.
    uncordoned = NodeFacts(name="n1", labels={}, boot_id="b0")
    later = T0 + timedelta(seconds=3)
    held = plan_node(inp(nw, plan.state, node=uncordoned, now=later, drain_skip=plan.drain_skip))
    assert held.status == Status.BLOCKED and held.condition.reason == "DrainTimeout"
    assert not any(isinstance(a, (Cordon, CreatePod)) for a in held.actions)
    assert held.drain_skip == plan.drain_skip and not held.state_changed
    # Released by the rollout (no admission): still blocked with the reason, nothing starts.
    released = replace(plan.state, admission=None)
    idle = plan_node(inp(nw, released, node=uncordoned, now=later, drain_skip=plan.drain_skip))
    assert idle.status == Status.BLOCKED and not any(isinstance(a, (Cordon, CreatePod)) for a in idle.actions)
    # Admitted again later: the memory is dropped and the drain is tried afresh (cordon first).
    again = replace(released, admission=Admission("__default__", 2, 4, "2025-01-01T00:00:30Z"))
    retry = plan_node(
        inp(nw, again, node=uncordoned, now=T0 + timedelta(seconds=31), drain_skip=plan.drain_skip)
    )
    assert retry.drain_skip is None and any(isinstance(a, Cordon) for a in retry.actions)
    assert retry.status == Status.IN_PROGRESS


def test_drain_timeout_skip_never_releases_a_node_mid_run() -> None:
    """Once a stage of the interrupt-bearing run executed, skip would leave the node half-done: it
    keeps draining like `wait`."""
    nw = drain_nw("skip")
    mid = replace(HEAD, stage=PackageStage.INTERRUPT, attempts=0)
    state = NodeState(packages=(mid,), admission=ADMIT, cordoned=True)
    plan = plan_node(inp(nw, state, node=CORDONED, drain=draining(since_seconds=60)))
    assert not plan.drain_skipped and plan.status == Status.IN_PROGRESS
    assert any(isinstance(a, Drain) for a in plan.actions) and not any(
        isinstance(a, Uncordon) for a in plan.actions
    )


def test_drain_timeout_skip_on_an_admin_cordoned_node_keeps_the_cordon() -> None:
    nw = drain_nw("skip")
    state = NodeState(packages=(HEAD,), admission=ADMIT, cordoned=False)
    plan = plan_node(inp(nw, state, node=CORDONED, drain=draining(since_seconds=6)))
    assert plan.drain_skipped and plan.status == Status.BLOCKED
    assert not any(isinstance(a, (Uncordon, Cordon, Drain)) for a in plan.actions)


def test_drain_timeout_skip_of_a_config_run_keeps_the_package_complete() -> None:
    pkg = Package(
        version="1.0.0",
        image="x",
        config_map={"a": "2"},
        config_interrupts={"a": REBOOT},
    )
    nw = drain_nw("skip", packages={"pa": pkg})
    done = replace(
        complete_entry(pkg.model_copy(update={"config_map": {"a": "1"}})),
        stage=PackageStage.CONFIG,
        state=PackageState.PENDING,
        changed=("a",),
        started=None,
    )
    state = NodeState(packages=(done,), admission=ADMIT, cordoned=True)
    plan = plan_node(inp(nw, state, node=CORDONED, drain=draining(since_seconds=6)))
    assert plan.drain_skipped
    entry = plan.state.entry("pa", "1.0.0")
    assert entry is not None and entry.state == PackageState.COMPLETE and entry.changed == ()
    assert entry.config == config_hashes({"a": "1"})  # the new config was never applied


def test_cancelled_uninstall_whose_pod_was_replaced_reinstalls() -> None:
    """A spec change replaces the running uninstall pod (attempts back to 0): it may have removed files,
    so cancelling it then reinstalls from apply rather than declaring the package complete."""
    pkg = Package(version="1.0.0", image="x", uninstall=Uninstall(enabled=True, apply=False))
    replaced = replace(
        complete_entry(pkg),
        stage=PackageStage.UNINSTALL,
        state=PackageState.PENDING,
        attempts=0,
        started="2025-01-01T00:00:00Z",
    )
    plan = plan_node(inp(make_nw(packages={"pa": pkg}), NodeState(packages=(replaced,), admission=ADMIT)))
    entry = plan.state.entry("pa", "1.0.0")
    assert entry is not None and entry.stage == PackageStage.APPLY and entry.state != PackageState.COMPLETE


def test_a_version_bump_mid_run_supersedes_the_unfinished_old_run() -> None:
    """The spec moves to 2.0.0 while 1.0.0 is still at config: 2.0.0 installs, the 1.0.0 run is gone."""
    node = FakeNode(make_nw(), outcomes=lambda a: "fail@config" if a.version == "1.0.0" else "succeed")
    while not node.state or not node.state.packages or node.state.packages[0].stage != PackageStage.CONFIG:
        node.step()
    assert node.state is not None
    assert [(e.version, e.stage) for e in node.state.packages] == [("1.0.0", PackageStage.CONFIG)]
    node.nodewright = make_nw(packages={"pa": Package(version="2.0.0", image="ghcr.io/x/pa")})
    plan = node.run()
    assert plan.status.value == "complete"
    assert node.state is not None
    assert [(e.version, e.state) for e in node.state.packages] == [("2.0.0", PackageState.COMPLETE)]


# -- one pod per transition ---------------------------------------------------------------------------


def _progress(pod: CreatePod, done: int) -> tuple[StageProgress, ...]:
    return tuple(StageProgress(s, done=i < done) for i, s in enumerate(pod_stages(pod.stage)))


def test_an_install_pod_runs_apply_and_config_and_the_state_is_written_when_it_ends() -> None:
    nw = make_nw()
    state, pod = running_state(nw)
    assert pod.stage == PackageStage.APPLY and pod_stages(pod.stage) == (
        PackageStage.APPLY,
        PackageStage.CONFIG,
    )
    # While it runs, whatever its init containers say, nothing is written: one write at the end.
    halfway = summary(pod, progress=_progress(pod, 1))
    running = plan_node(inp(nw, state, pods=(halfway,), now=T0 + timedelta(seconds=3)))
    assert not running.state_changed and not creates(running)
    done = plan_node(inp(nw, state, pods=(summary(pod, PodOutcome.SUCCEEDED, progress=_progress(pod, 2)),)))
    entry = done.state.entry("pa", "1.0.0")
    assert entry is not None and entry.state == PackageState.COMPLETE and entry.stage == PackageStage.CONFIG
    assert entry.attempts == 1  # config's first attempt was the install pod
    assert entry.config == config_hashes(nw.spec.packages["pa"].config_map)
    assert done.status == Status.COMPLETE and DeletePod(pod.name, "attempt finished") in done.actions


def test_a_failure_in_config_keeps_apply_done_and_retries_from_config() -> None:
    nw = make_nw(packages={"pa": Package(version="1.0.0", image="x", max_attempts=2)})
    state, pod = running_state(nw)
    failed = summary(
        pod, PodOutcome.FAILED, message="container pa-config exited 1", progress=_progress(pod, 1)
    )
    plan = plan_node(inp(nw, state, pods=(failed,), now=T0 + timedelta(seconds=4)))
    entry = plan.state.entry("pa", "1.0.0")
    assert entry is not None and entry.stage == PackageStage.CONFIG and entry.attempts == 1
    assert entry.retry_at is not None and "attempt 1/2 of config failed" in entry.error
    assert "pa-config exited 1" in entry.error and not creates(plan)
    assert any(isinstance(a, DeletePod) and a.name == pod.name for a in plan.actions)
    # The retry is a config pod (attempt 2): apply does not run again.
    retry = plan_node(inp(nw, plan.state, now=T0 + timedelta(seconds=30)))
    [again] = creates(retry)
    assert again.stage == PackageStage.CONFIG and again.attempt == 2 and again.name != pod.name
    # Attempts are bounded per stage: the second config failure gives up.
    second = summary(again, PodOutcome.FAILED, message="exit 1", progress=_progress(again, 0))
    final = plan_node(inp(nw, retry.state, pods=(second,), now=T0 + timedelta(seconds=40)))
    gave_up = final.state.entry("pa", "1.0.0")
    assert (
        gave_up is not None
        and gave_up.state == PackageState.ERRORING
        and gave_up.stage == PackageStage.CONFIG
    )
    assert final.status == Status.ERRORING


def test_each_failed_attempt_is_reported_with_where_it_failed_and_what_was_recorded() -> None:
    """The plan says which attempt of which pod it failed, why, and the error it wrote: the controller
    keeps that as the stage's log when no container's exit says why (pull errors, timeouts)."""
    nw = make_nw(packages={"pa": Package(version="1.0.0", image="x", max_attempts=1, stage_timeout="1m")})
    opts = PlanOptions(retry=RetryPolicy(pull_error_grace=30))
    state, pod = running_state(nw)
    stuck = summary(pod, PodOutcome.PULL_ERROR, message="ErrImagePull for container pa-init: not found")
    waiting = plan_node(inp(nw, state, pods=(stuck,), now=T0 + timedelta(seconds=5), options=opts))
    assert waiting.failed == ()
    expired = plan_node(inp(nw, waiting.state, pods=(stuck,), now=T0 + timedelta(seconds=36), options=opts))
    [failed] = expired.failed
    entry = expired.state.entry("pa", "1.0.0")
    assert entry is not None and entry.state == PackageState.ERRORING
    assert failed == AttemptFailed(
        pod=pod.name,
        package="pa",
        version="1.0.0",
        stage=PackageStage.APPLY,
        attempt=1,
        cause=FailureCause.PULL_ERROR,
        message=entry.error,
        gave_up=True,
    )
    assert entry.error.startswith(
        "apply failed 1 time(s), giving up: image pull failing for 30s: ErrImagePull"
    )
    # A pod still running at the stage timeout (two stages: 2m) fails in the stage it was in.
    running = summary(pod, progress=_progress(pod, 1))
    late = plan_node(inp(nw, state, pods=(running,), now=T0 + timedelta(seconds=121), options=opts))
    [timeout] = late.failed
    assert (timeout.cause, timeout.stage, timeout.attempt) == (FailureCause.TIMEOUT, PackageStage.CONFIG, 1)
    assert "did not finish within 2m" in timeout.message
    # A container that exited non-zero says why itself.
    exited = summary(
        pod, PodOutcome.FAILED, message="container pa-apply exited 2", progress=_progress(pod, 0)
    )
    [own] = plan_node(inp(nw, state, pods=(exited,), now=T0 + timedelta(seconds=3))).failed
    assert (own.cause, own.stage, own.gave_up) == (FailureCause.POD_FAILED, PackageStage.APPLY, True)


def test_a_package_completed_by_its_third_pod_keeps_three_attempts() -> None:
    """Issue 29 item 5: fail, fail, succeed -> `attempts: 3` on the complete entry, not the 1 of the config
    stage its install pod went on into."""
    nw = make_nw()  # maxAttempts 3
    state, pod = running_state(nw)
    now = T0
    for attempt in (1, 2):
        assert pod.attempt == attempt and pod.stage == PackageStage.APPLY
        failed = summary(pod, PodOutcome.FAILED, message="exit 1", progress=_progress(pod, 0))
        now += timedelta(seconds=1)
        state = plan_node(inp(nw, state, pods=(failed,), now=now)).state
        now += timedelta(minutes=5)
        retry = plan_node(inp(nw, state, now=now))
        state, [pod] = retry.state, creates(retry)
    assert pod.attempt == 3
    done = plan_node(
        inp(nw, state, pods=(summary(pod, PodOutcome.SUCCEEDED, progress=_progress(pod, 2)),), now=now)
    )
    entry = done.state.entry("pa", "1.0.0")
    assert entry is not None and entry.state == PackageState.COMPLETE and entry.attempts == 3
    assert decode(encode(done.state)).entry("pa", "1.0.0") == entry, "kept in the annotation"
    assert done.status == Status.COMPLETE


def test_a_chained_run_completed_in_a_retried_pod_keeps_its_own_first_attempt() -> None:
    """The attempts kept on completion are those of the entry's own run: a package chained into the
    third pod of another ran there once."""
    packages = {
        "pa": Package(version="1.0.0", image="x"),
        "pb": Package(version="1.0.0", image="x", depends_on={"pa": "1.0.0"}),
    }
    fates = iter(["fail", "fail", "succeed"])
    node = FakeNode(
        make_nw(packages=packages),
        outcomes=lambda _pod: next(fates, "succeed"),
        options=PlanOptions(chain_packages=True),
    )
    node.run()
    assert [(c.package, c.attempt, c.chain) for c in node.created] == [
        ("pa", n, (("pb", "1.0.0", PackageStage.APPLY),)) for n in (1, 2, 3)
    ]
    state = node.state
    assert state is not None and {e.name: (e.state, e.attempts) for e in state.packages} == {
        "pa": (PackageState.COMPLETE, 3),
        "pb": (PackageState.COMPLETE, 1),
    }


def test_a_single_stage_pod_of_an_older_operator_advances_only_as_far_as_it_ran() -> None:
    """An apply pod built one stage per pod (before an operator upgrade) succeeds: config still runs."""
    nw = make_nw()
    state, pod = running_state(nw)
    old_shape = summary(pod, PodOutcome.SUCCEEDED, progress=(StageProgress(PackageStage.APPLY, done=True),))
    plan = plan_node(inp(nw, state, pods=(old_shape,)))
    entry = plan.state.entry("pa", "1.0.0")
    assert (
        entry is not None and entry.stage == PackageStage.CONFIG and entry.state == PackageState.IN_PROGRESS
    )
    [config] = creates(plan)
    assert config.stage == PackageStage.CONFIG and config.attempt == 1


def test_one_state_write_per_pod_for_an_install_chain() -> None:
    packages = {
        "pa": Package(version="1.0.0", image="x"),
        "pb": Package(version="1.0.0", image="x", depends_on={"pa": "1.0.0"}),
        "pc": Package(version="1.0.0", image="x", depends_on={"pb": "1.0.0"}),
    }
    node = FakeNode(make_nw(packages=packages))
    node.run()
    writes = sum(1 for p in node.plans if p.state_changed)
    # The start of the first package, then one per pod: its end records the next package's start.
    assert len(node.created) == 3 and writes == 1 + 3, [kinds(p) for p in node.plans]


def test_an_uninstall_removes_what_a_cut_short_run_of_another_version_left() -> None:
    # v1's apply was cut short by a spec of v2 (suspended: the host may hold part of v1); then the
    # admin asks to uninstall the package. Nothing of v2 is installed, so the uninstall must act on v1's
    # leftover -- before, no run was ever due and the node never counted the package as uninstalled.
    v2 = Package(version="2.0.0", image="x", uninstall=Uninstall(enabled=True, apply=True))
    for left in (PackageState.IN_PROGRESS, PackageState.ERRORING):
        leftover = replace(
            complete_entry(v2, version="1.0.0"), stage=PackageStage.APPLY, state=left, suspended=True
        )
        node = FakeNode(
            make_nw(packages={"pa": v2}), state_text=encode(NodeState(packages=(leftover,), admission=ADMIT))
        )
        node.run()
        assert [(c.stage, c.version) for c in node.created][:1] == [(PackageStage.UNINSTALL, "1.0.0")], left
        assert node.plans[-1].status == Status.COMPLETE and not node.plans[-1].state.packages, left
