"""Shared DisruptionBudgets (plan/budgets.py) and their use by the rollout planner.

Properties: a plan never takes more free slots of a pool than the pool has (whatever others hold, who
waits longer, how the pool overlaps compartments); a freed slot goes to the NodeWright that waited
longest; slots are released only once their node settled, or when they were never used.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from nodewright.api.admission import Admission
from nodewright.api.models import (
    DeploymentPolicy,
    DeploymentPolicySpec,
    DisruptionBudget,
    DisruptionBudgetSpec,
    DisruptionBudgetStatus,
    FixedStrategy,
    NodeWright,
    NodeWrightSpec,
    ObjectMeta,
    PolicyBudget,
    PolicyDefault,
    Status,
    Strategy,
)
from nodewright.api.reasons import CORDONED_BY_SOMEONE_ELSE, WaitReason, detail_label
from nodewright.plan import budgets
from nodewright.plan.budgets import PoolNode, SharedBudget, slot_update
from nodewright.plan.rollout import RolloutNode, plan_rollout

NOW = "2025-01-01T00:00:00Z"
T0 = datetime(2025, 1, 1, tzinfo=UTC)
FP = "fp"


def budget(
    count: int | None = 1, *, percent: int | None = None, status: dict[str, object] | None = None
) -> DisruptionBudget:
    amount: dict[str, int] = {"percent": percent} if percent is not None else {"count": count or 1}
    return DisruptionBudget(
        metadata=ObjectMeta(name="pool-a", resource_version="7"),
        spec=DisruptionBudgetSpec.model_validate(
            {"nodeSelector": {"matchLabels": {"pool": "a"}}, "budget": amount}
        ),
        status=DisruptionBudgetStatus.model_validate(status) if status else None,
    )


def nodewright(name: str = "kernel") -> NodeWright:
    return NodeWright(
        metadata=ObjectMeta(name=name, generation=1),
        spec=NodeWrightSpec.model_validate(
            {"packages": {"pkg": {"version": "1.0", "image": "x"}}, "deploymentPolicy": "pol"}
        ),
    )


def policy(initial: int, count: int) -> DeploymentPolicy:
    return DeploymentPolicy(
        metadata=ObjectMeta(name="pol"),
        spec=DeploymentPolicySpec(
            default=PolicyDefault(
                budget=PolicyBudget(count=count),
                strategy=Strategy(fixed=FixedStrategy(initial_batch=initial)),
            )
        ),
    )


def rnode(name: str, *, pool: bool, admitted: bool = False, status: Status = Status.WAITING) -> RolloutNode:
    return RolloutNode(
        name=name,
        labels={"pool": "a"} if pool else {},
        creation_timestamp=None,
        status=status,
        needs_work=True,
        admission=Admission("__default__", 1, 0, FP, NOW) if admitted else None,
    )


# ----------------------------------------------------------------------------------------------------
# What counts as disrupted


def test_disruption_of_names_the_cause_and_ignores_the_asking_nodewrights_own_work() -> None:
    admin = PoolNode("a", {}, unschedulable=True)
    assert budgets.disruption_of(admin) == "cordoned by someone else"
    ours = PoolNode("b", {}, unschedulable=True, cordoned_by=frozenset({"kernel"}))
    assert budgets.disruption_of(ours, excluding="kernel") is None
    assert budgets.disruption_of(ours, excluding="drivers") == "cordoned by NodeWright 'kernel'"
    rebooting = PoolNode("c", {}, ready=False, in_progress_for=frozenset({"kernel"}))
    assert budgets.disruption_of(rebooting, excluding="kernel") is None
    assert budgets.disruption_of(rebooting, excluding="drivers") == "in progress for NodeWright 'kernel'"
    assert budgets.disruption_of(PoolNode("d", {}, ready=False)) == "NotReady"
    assert budgets.disruption_of(PoolNode("e", {})) is None


def test_view_counts_slots_cordons_and_in_progress_work_and_the_percent_ceiling() -> None:
    nodes = [
        PoolNode("n1", {"pool": "a"}),
        PoolNode("n2", {"pool": "a"}, unschedulable=True),
        PoolNode("n3", {"pool": "a"}, in_progress_for=frozenset({"old"})),
        PoolNode("n4", {"pool": "a"}),
        PoolNode("x", {"pool": "b"}, unschedulable=True),
    ]
    b = budget(None, percent=50, status={"slots": {"n1": {"kernel": NOW}}})
    v = budgets.view(b, nodes)
    assert v.members == {"n1", "n2", "n3", "n4"} and v.ceiling == 2
    assert v.disrupted() == {
        "n1": "slot of NodeWright 'kernel'",
        "n2": "cordoned by someone else",
        "n3": "in progress for NodeWright 'old'",
    }
    shared = v.for_nodewright("kernel", {n.name: n for n in nodes})
    assert set(shared.others) == {"n2", "n3"}, "its own slot is not someone else's"
    assert budgets.summary(v).startswith("3 of 2 disrupted; kernel: 1 slot(s)")


def test_waiting_order_is_first_come_first_served_then_by_name() -> None:
    waiting = {"b": "2025-01-01T00:00:05Z", "a": "2025-01-01T00:00:05Z", "c": "2025-01-01T00:00:01Z"}
    assert budgets.waiting_ahead(waiting, "c") == 0
    assert budgets.waiting_ahead(waiting, "a") == 1
    assert budgets.waiting_ahead(waiting, "b") == 2
    assert budgets.waiting_ahead(waiting, "new") == 3, "one that does not wait yet comes after all of them"


# ----------------------------------------------------------------------------------------------------
# The planner


def test_a_full_pool_holds_its_nodes_and_the_batch_takes_the_next_candidates() -> None:
    nodes = [rnode("a1", pool=True), rnode("a2", pool=True), rnode("b1", pool=False), rnode("b2", pool=False)]
    # x is a node of the pool this NodeWright does not select, being rebooted by another one.
    shared = SharedBudget("pool-a", 1, frozenset({"a1", "a2", "x"}), {"x": "slot of NodeWright 'drivers'"})
    plan = plan_rollout(
        nodewright(),
        policy=policy(initial=2, count=4),
        nodes=nodes,
        compartment_statuses={},
        fingerprint=FP,
        now=NOW,
        shared_budgets=[shared],
    )
    assert [a.node for a in plan.admissions] == ["b1", "b2"]
    why = {w.node: w for w in plan.waiting}
    assert why["a2"].reason is WaitReason.DISRUPTION_BUDGET and detail_label(why["a2"].detail) == "pool-a"
    assert why["a1"].reason is WaitReason.DISRUPTION_BUDGET
    assert "x (slot of NodeWright 'drivers')" in why["a2"].message
    assert plan.budget_refusals == ("pool-a",)


def test_an_already_disrupted_node_costs_no_slot() -> None:
    # a1 is cordoned by an admin: out of service already, so working on it disrupts nothing more.
    nodes = [replace_unavailable(rnode("a1", pool=True)), rnode("a2", pool=True)]
    shared = SharedBudget("pool-a", 1, frozenset({"a1", "a2"}), {"a1": "cordoned by someone else"})
    plan = plan_rollout(
        nodewright(),
        policy=policy(initial=2, count=3),
        nodes=nodes,
        compartment_statuses={},
        fingerprint=FP,
        now=NOW,
        shared_budgets=[shared],
    )
    assert [a.node for a in plan.admissions] == ["a1"]
    assert {w.node: w.reason for w in plan.waiting} == {"a2": WaitReason.DISRUPTION_BUDGET}


def replace_unavailable(node: RolloutNode) -> RolloutNode:
    return replace(node, unavailable=CORDONED_BY_SOMEONE_ELSE)


def test_own_nodes_in_flight_take_slots_and_waiters_ahead_take_the_free_ones() -> None:
    nodes = [rnode("a1", pool=True, admitted=True, status=Status.IN_PROGRESS), rnode("a2", pool=True)]
    roomy = SharedBudget("pool-a", 2, frozenset({"a1", "a2"}))
    plan = plan_rollout(
        nodewright(),
        policy=policy(initial=1, count=2),
        nodes=nodes,
        compartment_statuses={},
        fingerprint=FP,
        now=NOW,
        shared_budgets=[roomy],
    )
    # The batch of a1 is open: nothing new either way; once it settles, a2 may take the second slot.
    assert not plan.admissions
    settled = [rnode("a1", pool=True, admitted=True, status=Status.COMPLETE), rnode("a2", pool=True)]
    settled[0] = replace(settled[0], needs_work=False)
    for ahead, expected in ((0, ["a2"]), (1, ["a2"]), (2, [])):
        shared = SharedBudget("pool-a", 2, frozenset({"a1", "a2"}), ahead=ahead)
        plan = plan_rollout(
            nodewright(),
            policy=policy(initial=1, count=2),
            nodes=settled,
            compartment_statuses={},
            fingerprint=FP,
            now=NOW,
            shared_budgets=[shared],
        )
        assert [a.node for a in plan.admissions] == expected, ahead


@settings(max_examples=200, deadline=None)
@given(
    pool=st.lists(st.booleans(), min_size=1, max_size=12),
    others=st.sets(st.integers(0, 11), max_size=6),
    holding=st.sets(st.integers(0, 11), max_size=4),
    ceiling=st.integers(1, 4),
    ahead=st.integers(0, 3),
    initial=st.integers(1, 8),
)
def test_a_plan_never_takes_more_slots_than_the_pool_has(
    pool: list[bool], others: set[int], holding: set[int], ceiling: int, ahead: int, initial: int
) -> None:
    names = [f"n{i:02d}" for i in range(len(pool))]
    members = frozenset(n for n, p in zip(names, pool, strict=True) if p)
    nodes = [
        rnode(n, pool=p, admitted=i in holding, status=Status.IN_PROGRESS if i in holding else Status.WAITING)
        for i, (n, p) in enumerate(zip(names, pool, strict=True))
    ]
    disrupted_by_others = {names[i]: "cordoned by someone else" for i in others if i < len(names)}
    shared = SharedBudget(
        "pool-a", ceiling, members, {n: w for n, w in disrupted_by_others.items() if n in members}, ahead
    )
    plan = plan_rollout(
        nodewright(),
        policy=policy(initial=initial, count=12),
        nodes=nodes,
        compartment_statuses={},
        fingerprint=FP,
        now=NOW,
        shared_budgets=[shared],
    )
    own = {names[i] for i in holding if i < len(names)}
    before = (set(shared.others) | own) & members
    new = {a.node for a in plan.admissions} & members - before
    assert len(new) <= max(0, ceiling - len(before) - ahead), (sorted(before), sorted(new))
    if new:
        assert len(before | new) + ahead <= ceiling


# ----------------------------------------------------------------------------------------------------
# Slot writes


def view(**status: object) -> budgets.BudgetView:
    nodes = [PoolNode(f"n{i}", {"pool": "a"}) for i in range(4)]
    return budgets.view(budget(2, status=status), nodes)


def test_slots_are_taken_for_held_nodes_and_kept_while_they_hold() -> None:
    update = slot_update(view(), "kernel", holding={"n0", "x"}, admission_at={}, refused=False, now=T0)
    assert update.slots == {"n0": {"kernel": NOW}} and update.acquired == ("n0",)
    again = slot_update(
        view(slots=update.slots), "kernel", holding={"n0"}, admission_at={}, refused=False, now=T0
    )
    assert not again.changes(view(slots=update.slots))


def test_a_slot_is_released_once_its_node_settled_under_the_admission_it_was_taken_for() -> None:
    since = "2025-01-01T00:00:00Z"
    held = view(slots={"n0": {"kernel": since, "drivers": since}})
    later = T0 + timedelta(seconds=5)
    # The admission is older than the slot: the slot's own admission has not been written yet.
    kept = slot_update(
        held, "kernel", holding=(), admission_at={"n0": "2024-12-31T23:00:00Z"}, refused=False, now=later
    )
    assert kept.slots["n0"] == {"kernel": since, "drivers": since} and not kept.released
    done = slot_update(held, "kernel", holding=(), admission_at={"n0": since}, refused=False, now=later)
    assert done.slots == {"n0": {"drivers": since}} and done.released == ("n0",)
    unused = slot_update(held, "kernel", holding=(), admission_at={}, refused=False, now=later, fresh={"n0"})
    assert unused.released == ("n0",), "taken by this process for a node it did not admit after all"
    stale = slot_update(
        held, "kernel", holding=(), admission_at={}, refused=False, now=T0 + budgets.SLOT_GRACE
    )
    assert stale.released == ("n0",), "an operator that stopped before writing the admission"
    gone = slot_update(held, "kernel", holding=(), admission_at={}, refused=False, now=later, known_nodes=[])
    assert gone.released == ("n0",)


def test_a_refused_nodewright_queues_with_its_earliest_waiting_time() -> None:
    update = slot_update(
        view(waiting={"drivers": NOW}),
        "kernel",
        holding=(),
        admission_at={},
        refused=True,
        now=T0 + timedelta(seconds=9),
        waiting_since="2025-01-01T00:00:03Z",
    )
    assert update.waiting == {"drivers": NOW, "kernel": "2025-01-01T00:00:03Z"}
    served = slot_update(
        view(waiting=update.waiting), "kernel", holding={"n1"}, admission_at={}, refused=False, now=T0
    )
    assert served.waiting == {"drivers": NOW}


def test_sweep_drops_slots_of_gone_nodewrights_and_nodes_and_waiters_that_want_nothing() -> None:
    current = view(
        slots={"n0": {"kernel": NOW, "gone": NOW}, "n1": {"kernel": NOW}, "zz": {"kernel": NOW}},
        waiting={"kernel": NOW, "paused": NOW},
    )
    slots, waiting = budgets.sweep(
        current, nodewrights=["kernel", "paused"], nodes=["n0", "n2"], waiting_ok=["kernel"]
    )
    assert slots == {"n0": {"kernel": NOW}} and waiting == {"kernel": NOW}
