"""Two NodeWrights under one shared DisruptionBudget, both planners run like the controllers
(tests/fleetsim.py `SharedFleet`): the budget holds on every write whatever the strategies, failures,
reboots and a person's cordon do, the passes that lose a race to the budget's resourceVersion plan again,
and both rollouts finish (everything settles: complete, or erroring where a package always fails).
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from nodewright.api.models import Compartment as PolicyCompartment
from nodewright.api.models import (
    DeploymentPolicy,
    DeploymentPolicySpec,
    DisruptionBudget,
    ExponentialStrategy,
    FixedStrategy,
    Interrupt,
    InterruptType,
    NodeWright,
    NodeWrightSpec,
    ObjectMeta,
    Package,
    PolicyBudget,
    PolicyDefault,
    Status,
    Strategy,
)
from tests.fleetsim import Fleet, SharedFleet

POOL = {"pool": "a"}


def nodewright(name: str, *, reboot: bool) -> NodeWright:
    pkg = Package(
        version="1.0.0",
        image="ghcr.io/x/tune",
        interrupt=Interrupt(type=InterruptType.REBOOT) if reboot else None,
        max_attempts=2,
    )
    return NodeWright(
        metadata=ObjectMeta(name=name, uid=f"u-{name}", generation=1),
        spec=NodeWrightSpec(packages={"tune": pkg}, deployment_policy="pol"),
    )


def policy(strategy: Strategy, *, pool_count: int, default_count: int) -> DeploymentPolicy:
    """A pool compartment whose own ceiling alone would let one NodeWright disrupt `pool_count` nodes."""
    compartment = PolicyCompartment.model_validate(
        {
            "name": "pool",
            "selector": {"matchLabels": POOL},
            "budget": {"count": pool_count},
            "strategy": strategy.to_json_dict(),
        }
    )
    return DeploymentPolicy(
        metadata=ObjectMeta(name="pol"),
        spec=DeploymentPolicySpec(
            default=PolicyDefault(budget=PolicyBudget(count=default_count), strategy=strategy),
            compartments=[compartment],
        ),
    )


def budget(count: int) -> DisruptionBudget:
    return DisruptionBudget.model_validate(
        {
            "metadata": {"name": "gpu-pool", "resourceVersion": "1"},
            "spec": {"nodeSelector": {"matchLabels": POOL}, "budget": {"count": count}},
        }
    )


def shared_fleet(
    *, per_nw: int, in_pool: int, ceiling: int, strategy: Strategy, reboot: bool, seed: int
) -> SharedFleet:
    fleets = []
    for nw in ("alpha", "beta"):
        names = [f"{nw}-{i:02d}" for i in range(per_nw)]
        fleets.append(
            Fleet(
                nodewright(nw, reboot=reboot),
                policy(strategy, pool_count=2, default_count=3),
                names,
                extra_labels=dict.fromkeys(names[:in_pool], POOL),
            )
        )
    return SharedFleet(fleets, budget(ceiling), rng=random.Random(seed))


def run(shared: SharedFleet, *, rounds: int = 400) -> None:
    for _ in range(rounds):
        shared.round()  # raises FleetBreach on any I1, I2 or I10 breach
        if shared.settled():
            return
    raise AssertionError(f"did not settle: {[f.status_counts() for f in shared.fleets]}")


def test_two_rollouts_with_reboots_share_a_budget_of_one_and_both_finish() -> None:
    strategy = Strategy(fixed=FixedStrategy(initial_batch=2))
    shared = shared_fleet(per_nw=6, in_pool=3, ceiling=1, strategy=strategy, reboot=True, seed=1)
    run(shared)
    assert [f.status_counts() for f in shared.fleets] == [{"complete": 6}, {"complete": 6}]
    assert shared.max_disrupted == 1, "the pool was used, one node at a time"
    assert shared.conflicts > 0, "the two passes raced for the budget, and the loser planned again"
    shared.round()  # the pass the last completion triggers
    assert not (shared.budget.status and shared.budget.status.slots), "every slot was released"


def test_a_cordon_by_a_person_fills_the_budget_until_it_is_lifted() -> None:
    strategy = Strategy(fixed=FixedStrategy(initial_batch=1))
    shared = shared_fleet(per_nw=3, in_pool=2, ceiling=1, strategy=strategy, reboot=False, seed=2)
    cordoned = shared.fleets[1].nodes["beta-00"]
    cordoned.unschedulable = True
    cordoned.cordoned_by_other = True
    for _ in range(30):
        shared.round()
    pool = {"alpha-00", "alpha-01", "beta-01"}
    started = sorted(n for f in shared.fleets for n in f.names if n in pool and n in f.labels)
    assert not started, f"nothing else of the pool may start while the cordoned node fills it: {started}"
    cordoned.unschedulable = False
    cordoned.cordoned_by_other = False
    run(shared)
    assert [f.status_counts() for f in shared.fleets] == [{"complete": 3}, {"complete": 3}]


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    per_nw = draw(st.integers(2, 6))
    names = [f"{nw}-{i:02d}" for nw in ("alpha", "beta") for i in range(per_nw)]
    return {
        "kind": draw(st.sampled_from(["fixed", "exponential"])),
        "initial": draw(st.integers(1, 3)),
        "per_nw": per_nw,
        "in_pool": draw(st.integers(1, per_nw)),
        "ceiling": draw(st.integers(1, 2)),
        "reboot": draw(st.booleans()),
        "seed": draw(st.integers(0, 1000)),
        "failing": sorted(draw(st.sets(st.sampled_from(names), max_size=3))),
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_the_shared_budget_holds_on_every_write_and_both_rollouts_settle(scenario: dict[str, Any]) -> None:
    params: dict[str, Any] = {"initial_batch": scenario["initial"]}
    strategy = (
        Strategy(fixed=FixedStrategy.model_validate(params))
        if scenario["kind"] == "fixed"
        else Strategy(exponential=ExponentialStrategy.model_validate(params))
    )
    reboot, failing = scenario["reboot"], set(scenario["failing"])
    shared = shared_fleet(
        per_nw=scenario["per_nw"],
        in_pool=scenario["in_pool"],
        ceiling=scenario["ceiling"],
        strategy=strategy,
        reboot=reboot,
        seed=scenario["seed"],
    )
    for fleet in shared.fleets:
        fleet.fate = lambda node, _pod: "fail" if node in failing else "succeed"
    run(shared)
    pool = shared.view()
    # A node that failed a reboot package stays cordoned (docs/stages.md): out of service, it keeps its
    # share of the budget until someone acts, so the pool's other nodes may be left waiting.
    full = reboot and len(failing & pool.members) >= pool.ceiling
    for fleet in shared.fleets:
        for name in fleet.names:
            status = fleet.labels.get(name)
            note(f"{name}: {status}")
            done = Status.ERRORING.value if name in failing else Status.COMPLETE.value
            if full and name in pool.members:
                assert status in (None, Status.WAITING.value, done), (name, status)
            elif name in failing:
                assert status == Status.ERRORING.value, (name, fleet.status_counts())
            else:
                assert status == Status.COMPLETE.value, (name, fleet.status_counts())
    assert shared.max_disrupted <= pool.ceiling
