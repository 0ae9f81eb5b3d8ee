"""Soak time, approval gates and maintenance windows in the rollout planner, over a simulated fleet
(tests/fleetsim.py: both planners, the budget checked on every write), with the clock passed in.
"""

from __future__ import annotations

from datetime import timedelta

from nodewright.api.models import (
    DeploymentPolicy,
    DeploymentPolicySpec,
    Maintenance,
    MaintenanceWindow,
    ObjectMeta,
    PolicyDefault,
)
from nodewright.api.reasons import WaitReason
from nodewright.plan.stages import parse_ts, ts
from tests.fleetsim import Fleet
from tests.planfake import T0
from tests.test_plan_fleet import fleet_of, nodewright


def paced_policy(**pacing: object) -> DeploymentPolicy:
    default = PolicyDefault.model_validate(
        {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}, **pacing}
    )
    return DeploymentPolicy(metadata=ObjectMeta(name="pol"), spec=DeploymentPolicySpec(default=default))


def batch_opened_at(fleet: Fleet) -> dict[int, str]:
    out: dict[int, str] = {}
    for plan in fleet.plans:
        for new in plan.admissions:
            out.setdefault(new.admission.batch, new.admission.at)
    return out


def settle_times(fleet: Fleet) -> dict[int, str]:
    out: dict[int, str] = {}
    for status in (s.batch_state for s in fleet.statuses.values()):
        if status is not None and status.settled_at:
            out[status.last_settled_batch] = status.settled_at
    return out


def test_soak_time_separates_batches_and_is_reported() -> None:
    fleet = Fleet(nodewright(), paced_policy(soakTime="60s"), fleet_of(3))
    seen_soaking = False
    settled: dict[int, str] = {}
    for _ in range(200):
        fleet.round(step=5.0)
        settled.update(settle_times(fleet))
        plan = fleet.plans[-1]
        status = plan.compartments["__default__"].status
        if any(w.reason is WaitReason.SOAKING for w in plan.waiting):
            seen_soaking = True
            assert status.soak_until is not None and status.soak_remaining_seconds is not None
            assert 0 < status.soak_remaining_seconds <= 60
        if fleet.status_counts() == {"complete": 3}:
            break
    assert fleet.status_counts() == {"complete": 3}
    assert seen_soaking
    opened = batch_opened_at(fleet)
    for batch in (2, 3):
        gap = parse_ts(opened[batch]) - parse_ts(settled[batch - 1])
        assert gap >= timedelta(seconds=60), (batch, opened, settled)


def test_gate_holds_until_that_batch_is_approved() -> None:
    fleet = Fleet(nodewright(), paced_policy(pauseAfterBatch=[1]), fleet_of(3))
    for _ in range(40):
        fleet.round()
    assert fleet.status_counts() == {"complete": 1, "waiting": 2}
    plan = fleet.plans[-1]
    assert plan.compartments["__default__"].status.awaiting_approval == 1
    assert {w.reason for w in plan.waiting} == {WaitReason.AWAITING_APPROVAL}
    # The hint is a command to copy: the NodeWright's name filled in, no placeholder.
    name = fleet.nodewright.metadata.name
    for waiting in plan.waiting:
        assert f"(kubectl nodewright approve {name} --compartment __default__)" in waiting.message
        assert "<" not in waiting.message, waiting.message
    # An approval of another batch opens nothing.
    fleet.approvals = {"__default__": 2}
    for _ in range(5):
        fleet.round()
    assert fleet.status_counts() == {"complete": 1, "waiting": 2}
    fleet.approvals = {"__default__": 1}
    fleet.round()
    assert fleet.plans[-1].approvals_applied == ("__default__",)
    fleet.approvals = {}  # the controller removes the annotation once applied
    for _ in range(60):
        fleet.round()
        if fleet.status_counts() == {"complete": 3}:
            break
    assert fleet.status_counts() == {"complete": 3}


def test_nothing_is_admitted_outside_the_window_and_admitted_nodes_finish_after_it_closes() -> None:
    opens = T0 + timedelta(minutes=2)
    local = opens + timedelta(hours=5, minutes=30)
    window = Maintenance(
        time_zone="Asia/Kolkata",  # UTC+05:30: the schedule below is written in local time
        windows=[
            MaintenanceWindow(
                schedule=f"{local.minute} {local.hour} * * *",
                duration="1m",
            )
        ],
    )
    fleet = Fleet(nodewright(reboot=True), paced_policy(maintenance=window.to_json_dict()), fleet_of(3))
    admitted_at: list[str] = []
    finished_after_close = False
    for _ in range(120):
        fleet.round(step=5.0)
        plan = fleet.plans[-1]
        admitted_at += [a.admission.at for a in plan.admissions]
        status = plan.compartments["__default__"].status
        if plan.admissions:
            assert status.window_active
        if not status.window_active and plan.active:
            finished_after_close = True
    assert admitted_at, "the window opened"
    assert all(opens <= parse_ts(t) < opens + timedelta(minutes=1) for t in admitted_at), admitted_at
    assert finished_after_close
    assert fleet.status_counts().get("in_progress", 0) == 0
    waiting = fleet.plans[-1].waiting
    assert waiting and {w.reason for w in waiting} == {WaitReason.WINDOW}
    assert fleet.plans[-1].compartments["__default__"].status.next_window_at == ts(opens + timedelta(days=1))


def test_plan_predicts_batches_across_soak_and_windows() -> None:
    from nodewright.plan.preview import preview_rollout

    window = Maintenance(windows=[MaintenanceWindow(schedule="0 3 * * *", duration="10m")])
    fleet = Fleet(nodewright(), paced_policy(soakTime="30m", maintenance=window.to_json_dict()), fleet_of(4))
    predicted = preview_rollout(
        fleet.nodewright,
        policy=fleet.policy,
        nodes=fleet.rollout_views(),
        fingerprint=fleet.fingerprint,
        now=ts(fleet.now),
    )
    sizes = {c.name: c.sizes for c in predicted.compartments if c.batches}
    assert sizes == {"__default__": (1, 1, 1, 1)}


def test_plan_json_shows_the_window_state_and_next_opening() -> None:
    from nodewright.plan.preview import preview_rollout

    window = Maintenance(windows=[MaintenanceWindow(schedule="0 3 * * *", duration="10m")])
    fleet = Fleet(nodewright(), paced_policy(maintenance=window.to_json_dict()), fleet_of(2))
    doc = preview_rollout(
        fleet.nodewright,
        policy=fleet.policy,
        nodes=fleet.rollout_views(),
        fingerprint=fleet.fingerprint,
        now=ts(fleet.now),
    ).to_json()
    (comp,) = [c for c in doc["compartments"] if c["name"] == "__default__"]
    assert comp["windowActive"] is False
    assert comp["nextWindowAt"] == ts(T0 + timedelta(hours=3))
    assert "next opens" in comp["message"]
