"""Drift detection: the schedule, what counts as drift, and the node planner's checks and repairs."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nodewright.api.models import (
    DriftAction,
    DriftDetection,
    Interrupt,
    InterruptType,
    NodeWright,
    NodeWrightSpec,
    ObjectMeta,
    Package,
    Status,
)
from nodewright.api.nodeobject import NodeFacts
from nodewright.api.nodestate import (
    Admission,
    NodeState,
    PackageEntry,
    PackageStage,
    PackageState,
    encode,
)
from nodewright.plan import drift
from nodewright.plan.configdiff import config_hashes
from nodewright.plan.drain import DrainSelection
from nodewright.plan.node import (
    Cordon,
    CreateDriftCheck,
    CreatePod,
    DeletePod,
    Drain,
    DrainFacts,
    DriftCheckPod,
    DriftInput,
    Event,
    NodeInput,
    RequeueAfter,
    node_complete,
    plan_node,
)
from nodewright.plan.podspec import (
    REPAIR_ENV,
    PodOptions,
    build_drift_check_pod,
    build_pod,
    run_digest,
    run_spec,
)
from nodewright.plan.stages import PodOutcome
from tests.planfake import T0, FakeNode

REBOOT = Interrupt(type=InterruptType.REBOOT)


def nodewright(action: DriftAction = DriftAction.REPORT, **packages: Package) -> NodeWright:
    pkgs = packages or {"tune": Package(version="1.0.0", image="ghcr.io/x/tune", config_map={"a": "1"})}
    return NodeWright(
        metadata=ObjectMeta(name="nw", uid="u", generation=1),
        spec=NodeWrightSpec(packages=pkgs, drift_detection=DriftDetection(interval="10m", action=action)),
    )


def complete_state(nw: NodeWright, **kw: Any) -> NodeState:
    entries = tuple(
        PackageEntry(
            name,
            pkg.version,
            PackageStage.POST_INTERRUPT if pkg.interrupt else PackageStage.CONFIG,
            PackageState.COMPLETE,
            config=config_hashes(pkg.config_map),
            **kw.pop(name, {}),
        )
        for name, pkg in nw.spec.packages.items()
    )
    return NodeState(packages=entries, generation=1, boot_id="b0", **kw)


def plan(
    nw: NodeWright, state: NodeState, drift_input: DriftInput | None, *, node: NodeFacts | None = None
) -> Any:
    return plan_node(
        NodeInput(
            nodewright=nw,
            node=node or NodeFacts(name="n1", labels={}, boot_id="b0"),
            state=state,
            pods=(),
            now=T0,
            drift=drift_input,
        )
    )


def kinds(p: Any, kind: type) -> list[Any]:
    return [a for a in p.actions if isinstance(a, kind)]


def basis(nw: NodeWright, state: NodeState, boot_id: str = "b0") -> str:
    """The basis a check pod created now on this node carries."""
    return drift.check_basis(nw, state, boot_id=boot_id).encode()


# -- settings and schedule -----------------------------------------------------------------------------


def test_settings_precedence_opt_out_and_the_shortest_interval_per_node() -> None:
    nw = nodewright(
        pa=Package(version="1.0.0", image="x"),
        pb=Package(version="1.0.0", image="x", drift_detection=DriftDetection(interval="1m")),
        pc=Package(version="1.0.0", image="x", drift_detection=DriftDetection(enabled=False)),
    )
    assert drift.settings_for(nw, "pa") == drift.DriftSettings(600.0, DriftAction.REPORT)
    assert drift.settings_for(nw, "pb") == drift.DriftSettings(60.0, DriftAction.REPORT)
    assert drift.settings_for(nw, "pc") is None
    assert sorted(drift.checked_packages(nw)) == ["pa", "pb"]
    assert drift.node_interval(nw) == 60.0
    fast = nodewright(pa=Package(version="1.0.0", image="x", drift_detection=DriftDetection(interval="1s")))
    assert drift.node_interval(fast) == drift.MIN_INTERVAL
    plain = {"pa": Package(version="1.0.0", image="x")}
    off = NodeWright(metadata=ObjectMeta(name="nw"), spec=NodeWrightSpec(packages=plain))
    assert drift.node_interval(off) is None


@settings(max_examples=200, deadline=None)
@given(
    node=st.text(alphabet="abcdef0123456789-", min_size=1, max_size=20),
    interval=st.floats(10, 86_400),
    now=st.floats(1.6e9, 2e9),
)
def test_one_slot_per_interval_per_node(node: str, interval: float, now: float) -> None:
    offset = drift.offset("nw", node, interval)
    assert 0 <= offset < interval
    wait = drift.seconds_to_next_slot(now, nodewright="nw", node=node, interval=interval)
    assert 0 <= wait <= interval + 1e-6
    here = drift.slot(now, nodewright="nw", node=node, interval=interval)
    assert drift.slot(now + wait + 1e-3, nodewright="nw", node=node, interval=interval) == here + 1
    assert drift.slot(now + wait + interval - 1e-3, nodewright="nw", node=node, interval=interval) == here + 1


def test_checks_of_a_fleet_spread_over_the_interval() -> None:
    interval = 3600.0
    offsets = [drift.offset("gpu-tuning", f"gpu-node-{i:05d}", interval) for i in range(2000)]
    per_tenth = [sum(1 for o in offsets if k * 360 <= o < (k + 1) * 360) for k in range(10)]
    assert all(140 <= n <= 260 for n in per_tenth), per_tenth


def test_host_changes_ask_for_a_check_but_our_own_reboot_does_not() -> None:
    state = NodeState(boot_id="b0", kernel="5.15", os_image="Ubuntu 22.04")
    assert drift.recheck_reason(state, boot_id="b0", kernel="5.15", os_image="Ubuntu 22.04") is None
    assert "rebooted" in (drift.recheck_reason(state, boot_id="b1", kernel="5.15", os_image="") or "")
    ours = replace(state, interrupt_at="2025-01-01T00:00:00Z")
    assert drift.recheck_reason(ours, boot_id="b1", kernel="5.15", os_image="") is None
    assert "kernel" in (drift.recheck_reason(state, boot_id="b0", kernel="6.8", os_image="") or "")
    assert "OS image" in (drift.recheck_reason(state, boot_id="b0", kernel="", os_image="RHEL 9") or "")


def test_what_a_check_pod_says() -> None:
    a, b = Package(version="1.0.0", image="x"), Package(version="2.0.0", image="y", interrupt=REBOOT)
    checked = [("pa", a, "1.0.0"), ("pb", b, "2.0.0")]
    clean = drift.read_outcome(checked, succeeded=True, failed_container=None, message="")
    assert clean.result == "clean" and clean.clean == {"pa", "pb"}
    found = drift.read_outcome(
        checked, succeeded=False, failed_container="pb-post-interruptcheck", message="x"
    )
    assert found.drifted == {"pb": "post-interrupt-check failed: x"} and found.clean == {"pa"}
    assert found.result == "drifted"
    broken = drift.read_outcome(checked, succeeded=False, failed_container="pb-init", message="no shell")
    assert broken.result == "error" and not broken.drifted and broken.clean == {"pa"}


def test_the_check_pod_runs_every_check_mode_read_only_and_is_one_per_slot() -> None:
    nw = nodewright(tune=Package(version="1.0.0", image="ghcr.io/x/tune", interrupt=REBOOT))
    checked = drift.check_plan(nw, complete_state(nw))
    pod = build_drift_check_pod(nw, checked, node="n1", slot=7, options=PodOptions())
    names = [c["name"] for c in pod["spec"]["initContainers"]]
    assert names == ["tune-init", "tune-applycheck", "tune-configcheck", "tune-post-interruptcheck"]
    modes = [c["args"][0] for c in pod["spec"]["initContainers"][1:]]
    assert modes == ["apply-check", "config-check", "post-interrupt-check"]
    # A check that finds drift says what in its status (its log tail), not only in `pods/log`.
    assert {c["terminationMessagePolicy"] for c in pod["spec"]["initContainers"]} == {"FallbackToLogsOnError"}
    again = build_drift_check_pod(nw, checked, node="n1", slot=7, options=PodOptions())
    later = build_drift_check_pod(nw, checked, node="n1", slot=8, options=PodOptions())
    assert again["metadata"]["name"] == pod["metadata"]["name"] != later["metadata"]["name"]


# -- the node planner ----------------------------------------------------------------------------------


def test_a_due_node_gets_a_check_pod_without_cordon_or_drain() -> None:
    nw = nodewright()
    state = complete_state(nw)
    p = plan(nw, state, DriftInput(slot=3, due=True, may_start=True))
    [check] = kinds(p, CreateDriftCheck)
    assert check.slot == 3 and check.packages == ("tune",)
    assert not kinds(p, Cordon) and not kinds(p, Drain) and not kinds(p, CreatePod)
    assert p.status is Status.COMPLETE and p.state == state, "starting a check writes nothing"


def test_a_due_node_waits_for_a_free_check_slot_and_a_quiet_one_for_its_next_slot() -> None:
    nw = nodewright()
    busy = plan(nw, complete_state(nw), DriftInput(slot=3, due=True, may_start=False))
    assert not kinds(busy, CreateDriftCheck)
    assert [r.seconds for r in kinds(busy, RequeueAfter)] == [drift.DUE_RETRY]
    quiet = plan(nw, complete_state(nw), DriftInput(slot=3, due=False, may_start=True, seconds_to_next=42))
    assert not kinds(quiet, CreateDriftCheck) and [r.seconds for r in kinds(quiet, RequeueAfter)] == [42]


def test_a_clean_check_changes_nothing_on_the_node() -> None:
    nw = nodewright()
    state = complete_state(nw)
    pod = DriftCheckPod(name="nw-drift-n1-x", outcome=PodOutcome.SUCCEEDED, basis=basis(nw, state))
    p = plan(nw, state, DriftInput(pods=(pod,), slot=3))
    assert p.drift_result == "clean" and p.state == state, "nothing to write: 2 writes per check"
    assert [d.name for d in kinds(p, DeletePod)] == ["nw-drift-n1-x"]


def test_a_failing_check_reports_drift_and_a_passing_one_clears_it() -> None:
    nw = nodewright()
    failed = DriftCheckPod(
        name="nw-drift-n1-x",
        outcome=PodOutcome.FAILED,
        failed_container="tune-configcheck",
        message="container tune-configcheck exited 1; log: vm.swappiness is 60, want 10",
        basis=basis(nw, complete_state(nw)),
    )
    p = plan(nw, complete_state(nw), DriftInput(pods=(failed,), slot=3))
    assert p.status is Status.DRIFTED and p.condition.reason == "Drifted"
    assert "vm.swappiness is 60" in p.condition.message and "config-check" in p.condition.message
    assert any(getattr(a, "reason", "") == "Drifted" for a in p.actions)
    assert node_complete(nw, p.state), "report only: the node stays complete for the rollout"
    assert p.drift_result == "drifted"
    passed = DriftCheckPod(name="nw-drift-n1-y", outcome=PodOutcome.SUCCEEDED, basis=basis(nw, p.state))
    healed = plan(nw, p.state, DriftInput(pods=(passed,), slot=4))
    assert healed.status is Status.COMPLETE and not healed.state.packages[0].drifted


def test_reapply_repairs_through_a_fresh_admission_with_steps_run_again() -> None:
    nw = nodewright(DriftAction.REAPPLY)
    drifted = complete_state(nw, tune={"drifted": "config-check failed: value differs"})
    assert not node_complete(nw, drifted), "work to do: the rollout admits the node through a batch"
    waiting = plan(nw, drifted, DriftInput(slot=3))
    assert waiting.status is Status.DRIFTED and "repair" in waiting.condition.message
    assert not kinds(waiting, CreatePod), "no repair without an admission"
    admitted = replace(drifted, admission=Admission("__default__", 2, 5, "2025-01-01T00:00:00Z"))
    repair = plan(nw, admitted, DriftInput(slot=3))
    [pod] = kinds(repair, CreatePod)
    assert pod.stage is PackageStage.APPLY and pod.repair
    manifest = build_pod(
        nw, nw.spec.packages["tune"], package_name="tune", version="1.0.0", stage=pod.stage,
        node="n1", attempt=1, node_order=5, options=PodOptions(), repair=True,
    )  # fmt: skip
    env = manifest["spec"]["initContainers"][1]["env"]
    assert all(e in env for e in REPAIR_ENV), "the agent runs the flagged steps again"
    assert manifest["metadata"]["name"] == pod.name


def test_no_stage_pod_starts_while_a_check_runs() -> None:
    nw = nodewright()
    pkg = nw.spec.packages["tune"]
    changed = nodewright(tune=pkg.model_copy(update={"config_map": {"a": "2"}}))
    admitted = replace(complete_state(nw), admission=Admission("__default__", 2, 5, "2025-01-01T00:00:00Z"))
    running = DriftCheckPod(name="nw-drift-n1-x", outcome=PodOutcome.RUNNING)
    p = plan(changed, admitted, DriftInput(pods=(running,), slot=3))
    assert not kinds(p, CreatePod) and "nw-drift-n1-x" in p.condition.message
    later = plan(changed, admitted, DriftInput(slot=3))
    assert kinds(later, CreatePod)


def test_a_reboot_nobody_asked_for_makes_the_node_due_and_is_remembered_until_checked() -> None:
    nw = nodewright()
    state = complete_state(nw)
    rebooted = NodeFacts(name="n1", labels={}, boot_id="b1")
    p = plan(nw, state, DriftInput(slot=3, due=False, may_start=True), node=rebooted)
    [check] = kinds(p, CreateDriftCheck)
    assert "rebooted" in check.reason and p.state.boot_id == "b0", "kept until a check has run"
    assert check.basis == basis(nw, state, "b1"), "made against the new boot"
    done = DriftCheckPod(name="nw-drift-n1-x", outcome=PodOutcome.SUCCEEDED, basis=check.basis)
    after = plan(nw, p.state, DriftInput(pods=(done,), slot=3), node=rebooted)
    assert after.state.boot_id == "b1" and not kinds(after, CreateDriftCheck)


@settings(max_examples=100, deadline=None)
@given(
    due=st.booleans(),
    may_start=st.booleans(),
    outcome=st.sampled_from(list(PodOutcome)),
    failed=st.sampled_from([None, "tune-applycheck", "tune-configcheck", "tune-init"]),
    reapply=st.booleans(),
    minutes=st.integers(0, 100),
)
def test_checks_never_cordon_drain_or_interrupt(
    due: bool, may_start: bool, outcome: PodOutcome, failed: str | None, reapply: bool, minutes: int
) -> None:
    nw = nodewright(DriftAction.REAPPLY if reapply else DriftAction.REPORT)
    made = basis(nw, complete_state(nw))
    pods = (DriftCheckPod(name="nw-drift-n1-x", outcome=outcome, failed_container=failed, basis=made),)
    p = plan_node(
        NodeInput(
            nodewright=nw,
            node=NodeFacts(name="n1", labels={}, boot_id="b0"),
            state=complete_state(nw),
            pods=(),
            now=T0 + timedelta(minutes=minutes),
            drift=DriftInput(pods=pods, slot=3, due=due, may_start=may_start),
        )
    )
    assert not kinds(p, Cordon) and not kinds(p, Drain)
    assert not kinds(p, CreatePod), "without an admission nothing but a check may start"


# -- checks next to runs: one at a time, and a result counts only for the node it saw -----------------


def repair_due(nw: NodeWright) -> NodeState:
    """Complete, its last check found drift, and the rollout admitted it for the repair."""
    drifted = complete_state(nw, tune={"drifted": "post-interrupt-check failed: rmem_max is 4096"})
    return replace(drifted, admission=Admission("__default__", 2, 5, "2025-01-01T00:00:00Z"))


def plan_through_gates(nw: NodeWright, state: NodeState, drift_input: DriftInput) -> Any:
    """Plan on a node whose cordon is observed and that has nothing to drain."""
    return plan_node(
        NodeInput(
            nodewright=nw,
            node=NodeFacts(name="n1", labels={}, boot_id="b0", unschedulable=True),
            state=state,
            pods=(),
            now=T0,
            drain=DrainFacts(DrainSelection(evict=(), terminating=(), protected=())),
            drift=drift_input,
        )
    )


@settings(max_examples=100, deadline=None)
@given(outcome=st.sampled_from(list(PodOutcome)), terminating=st.booleans(), reapply=st.booleans())
def test_no_stage_pod_starts_while_a_check_pod_is_on_the_node_whatever_its_phase(
    outcome: PodOutcome, terminating: bool, reapply: bool
) -> None:
    # A check pod holds the node until it is gone: running, Pending, or showing its containers' exits
    # from before a reboot while the kubelet starts them again (a real kubelet reports it Pending with
    # the old statuses), or ended and read. The repair (or a config run) waits for it.
    nw = installed = nodewright(
        DriftAction.REAPPLY, tune=Package(version="1.0.0", image="x", interrupt=REBOOT)
    )
    state = repair_due(installed)
    if not reapply:  # a config change instead of a repair
        pkg = installed.spec.packages["tune"]
        nw = nodewright(DriftAction.REAPPLY, tune=pkg.model_copy(update={"config_map": {"a": "2"}}))
        state = replace(complete_state(installed), admission=state.admission)
    check = DriftCheckPod(name="nw-drift-n1-x", outcome=outcome, terminating=terminating)
    p = plan_through_gates(nw, state, DriftInput(pods=(check,), slot=3))
    assert not kinds(p, CreatePod), f"a stage pod next to a {outcome.value} check pod"
    assert "nw-drift-n1-x" in p.condition.message, p.condition.message
    gone = plan_through_gates(nw, p.state, DriftInput(slot=3))
    assert kinds(gone, CreatePod), "once it is gone the run starts"


def test_a_check_that_ends_while_a_repair_is_due_is_read_at_once() -> None:
    nw = nodewright(DriftAction.REAPPLY)
    state = repair_due(nw)
    clean = DriftCheckPod(name="nw-drift-n1-x", outcome=PodOutcome.SUCCEEDED, basis=basis(nw, state))
    p = plan(nw, state, DriftInput(pods=(clean,), slot=3))
    assert [d.name for d in kinds(p, DeletePod)] == ["nw-drift-n1-x"] and p.drift_result == "clean"
    assert p.status is Status.COMPLETE and not kinds(p, CreatePod), "it healed: nothing to repair"


def test_a_check_older_than_the_last_completed_run_does_not_count() -> None:
    # The scenario of the real-node lane: a check started before the repair (here: it was created on
    # the drifted node) ends only after the repair completed. Its "drifted" says nothing about the
    # repaired node: it is removed without a verdict, and no second repair starts.
    nw = nodewright(DriftAction.REAPPLY, tune=Package(version="1.0.0", image="x", interrupt=REBOOT))
    before = complete_state(nw, tune={"updated": "2025-01-01T00:00:00Z", "started": "2025-01-01T00:00:00Z"})
    [check] = kinds(plan(nw, before, DriftInput(slot=3, due=True, may_start=True)), CreateDriftCheck)
    repaired = complete_state(nw, tune={"updated": "2025-01-01T00:09:30Z", "started": "2025-01-01T00:09:00Z"})
    stale = DriftCheckPod(
        name="nw-drift-n1-x",
        outcome=PodOutcome.FAILED,
        failed_container="tune-post-interruptcheck",
        message="rmem_max is 4096",
        basis=check.basis,
    )
    p = plan(nw, repaired, DriftInput(pods=(stale,), slot=3))
    assert p.status is Status.COMPLETE and p.drift_result is None and p.state == repaired
    [delete] = kinds(p, DeletePod)
    assert delete.name == "nw-drift-n1-x" and "void" in delete.reason and "ran again" in delete.reason
    assert not [a for a in p.actions if getattr(a, "reason", "") == "Drifted"]
    # The same result on the node it was made against counts.
    counted = plan(nw, before, DriftInput(pods=(stale,), slot=3))
    assert counted.drift_result == "drifted" and not node_complete(nw, counted.state)


def test_a_check_that_ran_across_a_reboot_does_not_count_and_the_node_is_checked_again() -> None:
    nw = nodewright()
    state = complete_state(nw)
    ran = DriftCheckPod(name="nw-drift-n1-x", outcome=PodOutcome.SUCCEEDED, basis=basis(nw, state, "b0"))
    rebooted = NodeFacts(name="n1", labels={}, boot_id="b1")
    p = plan(nw, state, DriftInput(pods=(ran,), slot=3, may_start=True), node=rebooted)
    assert p.drift_result is None and "reboot" in kinds(p, DeletePod)[0].reason
    assert p.state.boot_id == "b0", "the new boot is not recorded as checked"
    again = plan(nw, p.state, DriftInput(slot=3, may_start=True), node=rebooted)
    [check] = kinds(again, CreateDriftCheck)
    assert "rebooted" in check.reason and check.basis == basis(nw, state, "b1")


def test_the_check_pod_carries_its_basis_and_a_new_basis_is_a_new_pod() -> None:
    nw = nodewright(tune=Package(version="1.0.0", image="ghcr.io/x/tune", interrupt=REBOOT))
    state = complete_state(nw)
    checked = drift.check_plan(nw, state)
    one = build_drift_check_pod(nw, checked, node="n1", slot=7, options=PodOptions(), basis=basis(nw, state))
    other = build_drift_check_pod(
        nw, checked, node="n1", slot=7, options=PodOptions(), basis=basis(nw, state, "b1")
    )
    assert one["metadata"]["annotations"]["nodewright.io/drift-basis"] == basis(nw, state)
    assert one["metadata"]["name"] != other["metadata"]["name"]
    assert drift.CheckBasis.parse(basis(nw, state)) == drift.check_basis(nw, state, boot_id="b0")
    assert drift.CheckBasis.parse("") is None and drift.CheckBasis.parse("no-boot") is None
    # The drift mark is a check's result, not part of what a check is made against.
    marked = complete_state(nw, tune={"drifted": "x"})
    assert basis(nw, marked) == basis(nw, state)


def test_a_repair_of_a_reboot_package_reboots_again_with_its_own_interrupt_identity() -> None:
    # The agent skips an interrupt command whose flag exists for the pod's resource id. A repair in the
    # same generation as the install needs an identity of its own, or its reboot never happens.
    nw = nodewright(
        DriftAction.REAPPLY, tune=Package(version="1.0.0", image="ghcr.io/x/tune", interrupt=REBOOT)
    )
    node = FakeNode(nw)
    assert node.run().status is Status.COMPLETE and node.reboots == 1
    done = node.state
    assert done is not None
    [entry] = done.packages
    node.state_text = encode(
        replace(
            done,
            packages=(replace(entry, drifted="post-interrupt-check failed"),),
            admission=Admission("__default__", 2, 1, "2025-01-01T01:00:00Z"),
        )
    )
    node.now += timedelta(hours=1)
    assert node.run().status is Status.COMPLETE and node.reboots == 2
    install, repair = [c for c in node.created if c.stage is PackageStage.INTERRUPT]
    assert install.attempt == repair.attempt == 1
    assert install.name != repair.name, "the repair's interrupt pod is not the install's"

    def resource_id(c: CreatePod) -> str:
        pod = build_pod(
            nw, nw.spec.packages["tune"], package_name=c.package, version=c.version, stage=c.stage,
            node=node.name, attempt=c.attempt, node_order=c.node_order, options=node.options.pod,
            interrupt=c.interrupt, run=c.run,
        )  # fmt: skip
        env = {e["name"]: e["value"] for e in pod["spec"]["initContainers"][0]["env"]}
        assert env["SKYHOOK_RESOURCE_ID"] == env["NODEWRIGHT_RESOURCE_ID"]
        return str(env["SKYHOOK_RESOURCE_ID"])

    ids = {resource_id(install), resource_id(repair)}
    assert len(ids) == 2, ids
    for rid in ids:  # the reference agent's contract: <owner>_<package>_<version>, split on "_"
        owner, package, version = rid.split("_")
        assert owner.startswith("nw-u-1-") and (package, version) == ("tune", "1.0.0")


# -- a check pod's deadline ----------------------------------------------------------------------------


def plan_at(nw: NodeWright, state: NodeState, drift_input: DriftInput, *, now: datetime) -> Any:
    """Plan at `now` on a node whose cordon is observed and that has nothing to drain."""
    return plan_node(
        NodeInput(
            nodewright=nw,
            node=NodeFacts(name="n1", labels={}, boot_id="b0", unschedulable=True),
            state=state,
            pods=(),
            now=now,
            drain=DrainFacts(DrainSelection(evict=(), terminating=(), protected=())),
            drift=drift_input,
        )
    )


def test_a_check_pod_has_a_deadline_of_one_stage_timeout_per_package_bound_by_its_signature() -> None:
    nw = nodewright(
        pa=Package(version="1.0.0", image="x", stage_timeout="10m"), pb=Package(version="1.0.0", image="y")
    )
    checked = drift.check_plan(nw, complete_state(nw))
    pod = build_drift_check_pod(nw, checked, node="n1", slot=7, options=PodOptions())
    assert pod["spec"]["activeDeadlineSeconds"] == 600 + 1800, "pb: the default stageTimeout, 30m"
    # What the pod runs includes its deadline: changing it on the pod makes it untrusted (docs/trust.md).
    assert run_spec(pod)["activeDeadlineSeconds"] == 2400
    longer = copy.deepcopy(pod)
    longer["spec"]["activeDeadlineSeconds"] = 10**6
    assert run_digest(longer) != run_digest(pod)


def test_a_hung_check_pod_is_deleted_past_its_deadline_as_a_check_error_and_the_repair_then_starts() -> None:
    nw = nodewright(DriftAction.REAPPLY)
    state = repair_due(nw)  # admitted for a repair, which waits for the check pod to be gone
    created = T0 - timedelta(hours=2)
    hung = DriftCheckPod(
        name="nw-drift-n1-x",
        outcome=PodOutcome.RUNNING,
        basis=basis(nw, state),
        created=created,
        deadline=600,
    )
    expires = created + timedelta(seconds=600 + drift.CHECK_GRACE)
    waiting = plan_at(nw, state, DriftInput(pods=(hung,), slot=3), now=expires - timedelta(seconds=7))
    assert not kinds(waiting, DeletePod) and not kinds(waiting, CreatePod)
    assert waiting.drift_result is None
    overran = plan_at(nw, state, DriftInput(pods=(hung,), slot=3), now=expires)
    [delete] = kinds(overran, DeletePod)
    assert delete.name == "nw-drift-n1-x" and "overran its deadline" in delete.reason, delete
    assert overran.drift_result == "error", "counted as a check that could not run, not as drift"
    [failed] = [e for e in kinds(overran, Event) if e.reason == "DriftCheckFailed"]
    assert "11m after it was created" in failed.message and failed.type == "Warning", failed
    assert overran.state.packages == state.packages, "no verdict: the drift marks are unchanged"
    assert not kinds(overran, CreatePod), "the repair waits until the pod is gone"
    gone = plan_at(nw, overran.state, DriftInput(slot=3), now=expires)
    assert kinds(gone, CreatePod)


def test_a_check_pod_without_a_deadline_is_given_the_one_its_packages_get_now() -> None:
    # A check pod of an older operator version has no activeDeadlineSeconds; it must not hold forever.
    nw = nodewright()
    state = complete_state(nw)
    created = T0 - timedelta(seconds=1800 + drift.CHECK_GRACE)
    old = DriftCheckPod(
        name="nw-drift-n1-x", outcome=PodOutcome.RUNNING, basis=basis(nw, state), created=created
    )
    p = plan_at(nw, state, DriftInput(pods=(old,), slot=3), now=T0)
    assert [d.name for d in kinds(p, DeletePod)] == ["nw-drift-n1-x"] and p.drift_result == "error"
    younger = replace(old, created=created + timedelta(seconds=1))
    assert not kinds(plan_at(nw, state, DriftInput(pods=(younger,), slot=3), now=T0), DeletePod)


def test_a_complete_node_with_a_running_check_is_planned_again_at_the_check_deadline() -> None:
    # No pod event comes from a hung check: the planner asks to look again when it runs out.
    nw = nodewright()
    state = complete_state(nw)
    running = DriftCheckPod(
        name="nw-drift-n1-x", outcome=PodOutcome.RUNNING, basis=basis(nw, state), created=T0, deadline=600
    )
    p = plan_at(nw, state, DriftInput(pods=(running,), slot=3), now=T0)
    assert p.status is Status.COMPLETE
    assert [r.seconds for r in kinds(p, RequeueAfter)] == [600 + drift.CHECK_GRACE]


def test_a_check_the_kubelet_ended_at_its_deadline_is_an_error_not_drift() -> None:
    # The kubelet kills the check that was running: its container reads as failed, but the pod's reason
    # (DeadlineExceeded, kept in the trimmed cache: tests/test_kube_trim.py) says why.
    nw = nodewright(DriftAction.REAPPLY)
    state = complete_state(nw)
    killed = DriftCheckPod(
        name="nw-drift-n1-x",
        outcome=PodOutcome.DEADLINE,
        failed_container="tune-configcheck",
        message="Pod was active on the node longer than the specified deadline",
        basis=basis(nw, state),
    )
    p = plan(nw, state, DriftInput(pods=(killed,), slot=3))
    assert p.drift_result == "error" and not drift.drifted_entries(p.state, nw)
    assert p.status is Status.COMPLETE and [d.name for d in kinds(p, DeletePod)] == ["nw-drift-n1-x"]
