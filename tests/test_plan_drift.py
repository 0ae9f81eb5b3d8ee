"""Drift detection: the schedule, what counts as drift, and the node planner's checks and repairs."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
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
from nodewright.api.nodestate import Admission, NodeState, PackageEntry, PackageStage, PackageState
from nodewright.plan import drift
from nodewright.plan.configdiff import config_hashes
from nodewright.plan.node import (
    Cordon,
    CreateDriftCheck,
    CreatePod,
    DeletePod,
    Drain,
    DriftCheckPod,
    DriftInput,
    NodeInput,
    RequeueAfter,
    node_complete,
    plan_node,
)
from nodewright.plan.podspec import REPAIR_ENV, PodOptions, build_drift_check_pod, build_pod
from nodewright.plan.stages import PodOutcome
from tests.planfake import T0

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
    pod = DriftCheckPod(name="nw-drift-n1-x", outcome=PodOutcome.SUCCEEDED)
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
    )
    p = plan(nw, complete_state(nw), DriftInput(pods=(failed,), slot=3))
    assert p.status is Status.DRIFTED and p.condition.reason == "Drifted"
    assert "vm.swappiness is 60" in p.condition.message and "config-check" in p.condition.message
    assert any(getattr(a, "reason", "") == "Drifted" for a in p.actions)
    assert node_complete(nw, p.state), "report only: the node stays complete for the rollout"
    assert p.drift_result == "drifted"
    passed = DriftCheckPod(name="nw-drift-n1-y", outcome=PodOutcome.SUCCEEDED)
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
    done = DriftCheckPod(name="nw-drift-n1-x", outcome=PodOutcome.SUCCEEDED)
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
    pods = (DriftCheckPod(name="nw-drift-n1-x", outcome=outcome, failed_container=failed),)
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
