"""The per-package stage machine: unit rules and a random simulation against the fake node."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodewright.api.models import (
    Interrupt,
    InterruptType,
    NodeWright,
    NodeWrightSpec,
    ObjectMeta,
    Package,
    Status,
    Uninstall,
)
from nodewright.api.nodestate import Admission, NodeState, PackageEntry, PackageStage, PackageState, encode
from nodewright.plan.node import CreatePod, PlanOptions
from nodewright.plan.stages import (
    Done,
    Observation,
    PodOutcome,
    PodSummary,
    RetryPolicy,
    advance,
    fail_attempt,
    next_stage,
    observe_pod,
    run_interrupt,
)
from tests.planfake import T0, FakeNode

REBOOT = Interrupt(type=InterruptType.REBOOT)


def entry(stage: PackageStage, state: PackageState = PackageState.IN_PROGRESS, **kw: Any) -> PackageEntry:
    return PackageEntry(name="pa", version="1.0.0", stage=stage, state=state, **kw)


def test_next_stage_table() -> None:
    S = PackageStage
    assert next_stage(S.APPLY, has_interrupt=False) == S.CONFIG
    assert next_stage(S.UPGRADE, has_interrupt=True) == S.CONFIG
    assert next_stage(S.CONFIG, has_interrupt=False) == Done.COMPLETE
    assert next_stage(S.CONFIG, has_interrupt=True) == S.INTERRUPT
    assert next_stage(S.INTERRUPT, has_interrupt=True) == S.POST_INTERRUPT
    assert next_stage(S.POST_INTERRUPT, has_interrupt=True) == Done.COMPLETE
    assert next_stage(S.UNINSTALL, has_interrupt=False) == Done.REMOVE
    assert next_stage(S.UNINSTALL, has_interrupt=True) == S.UNINSTALL_INTERRUPT
    assert next_stage(S.UNINSTALL_INTERRUPT, has_interrupt=True) == Done.REMOVE


def test_has_interrupt_rules() -> None:
    pkg = Package(
        version="1.0.0",
        image="x",
        interrupt=REBOOT,
        config_map={"a": "1", "b": "2"},
        config_interrupts={"a": Interrupt(type=InterruptType.SERVICE, services=["s"])},
    )
    assert run_interrupt(pkg, entry(PackageStage.APPLY)) == REBOOT
    # A config change only interrupts when a configInterrupts pattern matches a changed key.
    assert run_interrupt(pkg, entry(PackageStage.CONFIG, changed=("b",))) is None
    assert run_interrupt(pkg, entry(PackageStage.CONFIG, changed=("a", "b"))) == Interrupt(
        type=InterruptType.SERVICE, services=["s"]
    )
    assert run_interrupt(pkg, entry(PackageStage.UNINSTALL)) == REBOOT


def test_advance_records_config_and_completes() -> None:
    pkg = Package(version="1.0.0", image="x")
    done = advance(
        entry(PackageStage.CONFIG, changed=("k",), attempts=2, error="boom"),
        pkg,
        now=T0,
        applied_config=(("k", "abcd1234"),),
    )
    assert done is not None
    assert done.state == PackageState.COMPLETE and done.config == (("k", "abcd1234"),)
    # The attempts it took stay on the complete entry (issue 16: they used to vanish on completion).
    assert done.changed == () and done.attempts == 2 and done.error == ""
    nxt = advance(entry(PackageStage.APPLY), pkg, now=T0, applied_config=())
    assert nxt is not None and (nxt.stage, nxt.state) == (PackageStage.CONFIG, PackageState.PENDING)
    assert advance(entry(PackageStage.UNINSTALL), pkg, now=T0, applied_config=()) is None


def test_retry_backoff_and_give_up() -> None:
    policy = RetryPolicy(max_attempts=3, backoff_base=10, backoff_cap=15)
    assert [policy.backoff(n) for n in (1, 2, 3)] == [10, 15, 15]
    first = fail_attempt(entry(PackageStage.APPLY, attempts=1), reason="exit 1", now=T0, policy=policy)
    assert not first.gave_up and first.entry.retry_at == "2025-01-01T00:00:10Z"
    assert "attempt 1/3" in first.entry.error
    last = fail_attempt(entry(PackageStage.APPLY, attempts=3), reason="exit 1", now=T0, policy=policy)
    assert last.gave_up and last.entry.state == PackageState.ERRORING and "exit 1" in last.entry.error


def pod(
    outcome: PodOutcome, *, age: float = 0.0, message: str = "", stage: PackageStage = PackageStage.CONFIG
) -> PodSummary:
    return PodSummary(
        name="p",
        package="pa",
        version="1.0.0",
        stage=stage,
        attempt=1,
        spec_hash="h",
        created=T0 - timedelta(seconds=age),
        outcome=outcome,
        message=message,
    )


def test_observe_deadline_and_pull_grace() -> None:
    policy = RetryPolicy(stage_timeout=100, pull_error_grace=60)
    e = entry(PackageStage.APPLY, attempts=1)
    assert observe_pod(pod(PodOutcome.RUNNING, age=50), e, now=T0, policy=policy).recheck_after == 50
    timed_out = observe_pod(pod(PodOutcome.RUNNING, age=100), e, now=T0, policy=policy)
    assert timed_out.observation == Observation.FAILED and "1m40s" not in timed_out.reason
    assert "100s" in timed_out.reason
    first = observe_pod(pod(PodOutcome.PULL_ERROR, message="ErrImagePull"), e, now=T0, policy=policy)
    assert first.observation == Observation.WAIT and first.pull_error_since == "2025-01-01T00:00:00Z"
    later = observe_pod(
        pod(PodOutcome.PULL_ERROR, message="ImagePullBackOff"),
        entry(PackageStage.APPLY, attempts=1, pull_error_since="2024-12-31T23:58:59Z"),
        now=T0,
        policy=policy,
    )
    assert later.observation == Observation.FAILED and "ImagePullBackOff" in later.reason
    assert (
        observe_pod(pod(PodOutcome.SUCCEEDED), e, now=T0, policy=policy).observation == Observation.SUCCEEDED
    )


def test_the_stage_timeout_counts_per_stage_of_the_pod() -> None:
    policy = RetryPolicy(stage_timeout=100)
    e = entry(PackageStage.APPLY, attempts=1)
    install = pod(PodOutcome.RUNNING, age=150, stage=PackageStage.APPLY)  # apply and config: 200 s
    assert install.stages == (PackageStage.APPLY, PackageStage.CONFIG)
    assert observe_pod(install, e, now=T0, policy=policy).recheck_after == 50
    late = observe_pod(replace(install, created=T0 - timedelta(seconds=200)), e, now=T0, policy=policy)
    assert late.observation == Observation.FAILED and "2 stages did not finish within 200s" in late.reason


def test_for_package_reads_model_fields() -> None:
    pkg = Package(version="1.0.0", image="x", max_attempts=5, stage_timeout="2m")
    policy = RetryPolicy.for_package(pkg, RetryPolicy())
    assert policy.max_attempts == 5 and policy.stage_timeout == 120


# -- random simulation ---------------------------------------------------------------------------------

interrupts = st.sampled_from(
    [
        None,
        None,
        REBOOT,
        Interrupt(type=InterruptType.SERVICE, services=["a"]),
        Interrupt(type=InterruptType.NOOP),
        Interrupt(type=InterruptType.RESTART_ALL_SERVICES),
    ]
)


@st.composite
def nodewrights(draw: st.DrawFn) -> NodeWright:
    n = draw(st.integers(1, 4))
    names = [f"p{chr(97 + i)}" for i in range(n)]
    packages = {}
    for i, name in enumerate(names):
        deps = draw(st.lists(st.sampled_from(names[:i]), max_size=2, unique=True)) if i else []
        cfg = draw(
            st.dictionaries(st.sampled_from(["a.conf", "b.sh"]), st.sampled_from(["1", "2"]), max_size=2)
        )
        packages[name] = Package(
            version=draw(st.sampled_from(["1.0.0", "1.2"])),
            image=f"ghcr.io/x/{name}",
            interrupt=draw(interrupts),
            config_map=cfg or None,
            config_interrupts={"*.conf": REBOOT} if "a.conf" in cfg and draw(st.booleans()) else None,
            depends_on=dict.fromkeys(deps, "0") or None,
            uninstall=Uninstall(enabled=True) if draw(st.booleans()) else None,
            max_attempts=draw(st.integers(1, 3)),
        )
    # depends_on versions must equal the dependency's version (webhook rule); fix them up.
    packages = {
        k: p.model_copy(
            update={"depends_on": {d: packages[d].version for d in p.depends_on} if p.depends_on else None}
        )
        for k, p in packages.items()
    }
    return NodeWright(
        metadata=ObjectMeta(name="nw", uid="u", generation=1),
        spec=NodeWrightSpec(packages=packages, serial=draw(st.booleans())),
    )


def scripted(data: st.DataObject, *, failures: bool) -> Any:
    def fate(action: CreatePod) -> str:
        if not failures:
            return "succeed"
        return data.draw(
            st.sampled_from(["succeed", "succeed", "succeed", "fail", "fail@config", "pull_error", "hang"]),
            label=f"{action.package}/{action.stage}/{action.attempt}",
        )

    return fate


OPTIONS = PlanOptions(
    retry=RetryPolicy(stage_timeout=600, pull_error_grace=30, backoff_base=5, backoff_cap=20),
    reboot_timeout=900,
)


def _settled(node: FakeNode, nw: NodeWright, *, expect_complete: bool) -> None:
    final = node.plans[-1]
    assert final.status in (Status.COMPLETE, Status.ERRORING)
    if expect_complete:
        assert final.status == Status.COMPLETE, final.condition.message
    if final.status == Status.COMPLETE:
        assert not node.unschedulable or node.cordoned_by_other
        assert not final.state.cordoned and final.state.admission is None
        for name, pkg in nw.spec.packages.items():
            e = final.state.entry(name, pkg.version)
            assert e is not None and e.state == PackageState.COMPLETE
    else:
        assert any(e.state == PackageState.ERRORING for e in final.state.packages)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodewrights(), st.data(), st.booleans(), st.booleans())
def test_random_runs_keep_invariants_and_terminate(
    nw: NodeWright, data: st.DataObject, failures: bool, other_cordon: bool
) -> None:
    workload = [
        {"metadata": {"name": "web", "namespace": "default"}, "spec": {}, "status": {"phase": "Running"}}
    ]
    node = FakeNode(
        nw,
        outcomes=scripted(data, failures=failures),
        options=OPTIONS,
        workload=workload,
        cordoned_by_other=other_cordon,
        lose_pods_on_reboot=data.draw(st.booleans()),
        reboot_delay_ticks=data.draw(st.integers(0, 3)),
    )
    node.run()
    _settled(node, nw, expect_complete=not failures)
    if not failures:
        # Every reboot pod caused exactly one reboot: none was re-run after the node went down.
        reboot_pods = [
            c for c in node.created if c.interrupt is not None and c.interrupt.type == InterruptType.REBOOT
        ]
        assert node.reboots == len(reboot_pods) <= 1 + len(nw.spec.packages)
    interrupting = any(p.interrupt is not None for p in nw.spec.packages.values())
    if not interrupting:
        assert not any(type(a).__name__ in ("Cordon", "Drain") for p in node.plans for a in p.actions)
    if failures or node.plans[-1].status != Status.COMPLETE:
        return
    # Then change the spec (version bump, config change or uninstall) and run again.
    change = data.draw(st.sampled_from(["version", "config", "uninstall"]))
    name = data.draw(st.sampled_from(sorted(nw.spec.packages)))
    pkg = nw.spec.packages[name]
    if change == "version":
        new_pkg = pkg.model_copy(update={"version": "3.0.0"})
    elif change == "config":
        new_pkg = pkg.model_copy(update={"config_map": {**(pkg.config_map or {}), "a.conf": "changed"}})
    else:
        new_pkg = pkg.model_copy(update={"uninstall": Uninstall(enabled=True, apply=True)})
    packages = {
        k: (new_pkg if k == name else p).model_copy(
            update={
                "depends_on": {
                    d: (new_pkg if d == name else nw.spec.packages[d]).version for d in p.depends_on
                }
            }
            if p.depends_on
            else {}
        )
        for k, p in nw.spec.packages.items()
    }
    nw2 = nw.model_copy(
        update={
            "spec": nw.spec.model_copy(update={"packages": packages}),
            "metadata": ObjectMeta(name="nw", uid="u", generation=2),
        }
    )
    node.nodewright = nw2
    waiting = node.step()
    assert waiting.status == Status.WAITING  # a change goes through the rollout: admission needed
    assert not any(isinstance(a, CreatePod) for a in waiting.actions)
    # The rollout planner admits the node for the new generation.
    admitted = replace(waiting.state, admission=Admission("__default__", 2, 0, "2025-01-01T00:00:00Z"))
    node.state_text = encode(admitted)
    node.run()
    final = node.plans[-1]
    assert final.status == Status.COMPLETE, final.condition.message
    if change == "uninstall":
        assert not final.state.entries_for(name)
    if change == "version":
        versions = {e.version for e in final.state.entries_for(name)}
        assert versions == {"3.0.0"}  # the upgrade dropped the old entry


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodewrights(), st.integers(0, 12), st.data())
def test_admission_withdrawn_mid_run_finishes_started_work_only(
    nw: NodeWright, k: int, data: st.DataObject
) -> None:
    node = FakeNode(nw, options=OPTIONS, reboot_delay_ticks=data.draw(st.integers(0, 2)))
    for _ in range(k):
        node.step()
    if node.plans and node.plans[-1].status == Status.COMPLETE:
        return
    node.state_text = encode(replace(node.state or NodeState(), admission=None))
    plan = node.run()  # FakeNode.check fails the test if new work starts without admission
    assert plan.status in (Status.COMPLETE, Status.WAITING), plan.condition.message
    if plan.status == Status.WAITING:
        # Started work finished; the node went back into service while it waits for re-admission.
        assert not node.pods and not plan.state.cordoned
        assert not node.unschedulable
    node.state_text = encode(
        replace(plan.state, admission=Admission("__default__", 2, 1, "2025-01-01T00:00:00Z"))
    )
    assert node.run().status == Status.COMPLETE
