"""Both planners together over a whole fleet (tests/fleetsim.py): budgets hold whatever happens, and
`nodewright plan` predicts exactly from any moment of a rollout (also with soak times and maintenance
windows, where the plan replays the waits).

Regressions of the black-box safety issue:
- a spec edit while nodes are erroring used to restart every erroring node at once under its old
  admission, past the ceiling (I1/I2); retries now need a fresh admission from a batch;
- a node whose state was wiped after it completed used to start again at once under its (old, used)
  admission; settling now consumes the admission;
- `nodewright plan` taken mid-rollout could pair admissions with an older batch state and predict the
  open batch's successors from stale counters; the status is now written before the admissions;
- (issue 29 item 4) a batch settling and the next opening between the plan's node list and its read of
  the NodeWright made the preview open the batch under way again; the plan now reads until the status
  and the nodes show one moment (`plan_cmd.read_snapshot`), tested with the operator writing between
  and during the reads.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from nodewright.api import constants
from nodewright.api.admission import encode_admission
from nodewright.api.models import (
    DeploymentPolicy,
    DeploymentPolicySpec,
    EnvVar,
    ExponentialStrategy,
    FixedStrategy,
    Interrupt,
    InterruptType,
    LinearStrategy,
    NodeWright,
    NodeWrightSpec,
    ObjectMeta,
    Package,
    PolicyBudget,
    PolicyDefault,
    Status,
    Strategy,
)
from nodewright.cli import plan_cmd
from nodewright.plan.node import CreatePod
from nodewright.plan.preview import SnapshotCheck, preview_rollout
from nodewright.plan.stages import ts
from tests.fleetsim import Fleet

MAX_ROUNDS = 400


def nodewright(*, env: str = "v1", version: str = "1.0.0", reboot: bool = False) -> NodeWright:
    pkg = Package(
        version=version,
        image="ghcr.io/x/tune",
        env=[EnvVar(name="MODE", value=env)],
        interrupt=Interrupt(type=InterruptType.REBOOT) if reboot else None,
        max_attempts=2,
    )
    return NodeWright(
        metadata=ObjectMeta(name="nw", uid="u", generation=1),
        spec=NodeWrightSpec(packages={"tune": pkg}, deployment_policy="pol"),
    )


def policy(strategy: Strategy, budget: PolicyBudget, **pacing: Any) -> DeploymentPolicy:
    default = PolicyDefault.model_validate(
        {"budget": budget.to_json_dict(), "strategy": strategy.to_json_dict(), **pacing}
    )
    return DeploymentPolicy(metadata=ObjectMeta(name="pol"), spec=DeploymentPolicySpec(default=default))


PACING: dict[str, dict[str, Any]] = {
    "none": {},
    "soak": {"soakTime": "20s"},
    # Open one minute in every three (in a zone with a half-hour offset): batches wait for windows.
    "window": {
        "maintenance": {
            "timeZone": "Asia/Kolkata",
            "windows": [{"schedule": "*/3 * * * *", "duration": "1m"}],
        }
    },
}


def fleet_of(count: int, **kw: Any) -> list[str]:
    return [f"node-{i:02d}" for i in range(count)]


def env_of(pod: CreatePod, nw: NodeWright) -> str:
    env = nw.spec.packages[pod.package].env or []
    return str(env[0].value) if env else ""


def run(fleet: Fleet, *, rounds: int = MAX_ROUNDS) -> None:
    for _ in range(rounds):
        fleet.round()
        if fleet.settled():
            return
    raise AssertionError(f"fleet did not settle: {fleet.status_counts()}")


# ----------------------------------------------------------------------------------------------------
# Regressions


def test_fixing_the_spec_of_erroring_nodes_retries_them_through_batches_within_the_ceiling() -> None:
    broken = nodewright(env="broken")
    fleet = Fleet(
        broken, policy(Strategy(fixed=FixedStrategy(initial_batch=1)), PolicyBudget(count=1)), fleet_of(5)
    )
    fleet.fate = lambda _node, pod: "fail" if env_of(pod, fleet.nodewright) == "broken" else "succeed"
    for _ in range(60):
        fleet.round()
    erroring = [n for n, v in fleet.labels.items() if v == Status.ERRORING.value]
    assert len(erroring) >= 3, fleet.status_counts()  # several nodes failed, one batch after another
    fleet.nodewright = nodewright(env="fixed")  # the admin fixes the env
    run(fleet)  # every write is checked against I1/I2 (ceiling 1)
    assert fleet.status_counts() == {"complete": 5}
    # The erroring nodes restarted one by one, each under a fresh admission of the new spec.
    assert all(fleet.admission(n).fingerprint == fleet.fingerprint for n in erroring)  # type: ignore[union-attr]


def test_a_wiped_state_starts_over_through_a_batch_not_under_the_used_admission() -> None:
    fleet = Fleet(
        nodewright(),
        policy(Strategy(fixed=FixedStrategy(initial_batch=1)), PolicyBudget(count=1)),
        fleet_of(3),
    )
    for _ in range(8):
        fleet.round()
    done = [n for n, v in fleet.labels.items() if v == Status.COMPLETE.value]
    assert done, fleet.status_counts()
    first = done[0]
    admission = fleet.admission(first)
    assert admission is not None and admission.consumed  # settling used it up
    fleet.nodes[first].state_text = None  # someone deletes the state annotation
    fleet.node_pass(first)
    assert not fleet.nodes[first].pods, "nothing may start under a consumed admission"
    run(fleet)
    assert fleet.status_counts() == {"complete": 3}
    assert fleet.admission(first) != admission  # it went through a batch again


# ----------------------------------------------------------------------------------------------------
# Properties


@st.composite
def fleets(draw: st.DrawFn) -> tuple[Fleet, list[tuple[int, str]]]:
    count = draw(st.integers(2, 8))
    kind = draw(st.sampled_from(["fixed", "linear", "exponential"]))
    initial = draw(st.integers(1, 3))
    failure = draw(st.none() | st.integers(1, 3))
    common: dict[str, Any] = {"initial_batch": initial, "failure_threshold": failure, "batch_threshold": 100}
    strategy = {
        "fixed": lambda: Strategy(fixed=FixedStrategy.model_validate(common)),
        "linear": lambda: Strategy(linear=LinearStrategy.model_validate({**common, "delta": 1})),
        "exponential": lambda: Strategy(exponential=ExponentialStrategy.model_validate(common)),
    }[kind]()
    budget = draw(
        st.builds(PolicyBudget, count=st.integers(1, 3))
        | st.builds(PolicyBudget, percent=st.integers(20, 100))
    )
    reboot = draw(st.booleans())
    fleet = Fleet(nodewright(env="e0", reboot=reboot), policy(strategy, budget), fleet_of(count))
    failing = draw(st.sets(st.tuples(st.sampled_from(fleet.names), st.integers(0, 3)), max_size=count * 2))
    fleet.fate = lambda node, pod: (
        "fail" if (node, int(env_of(pod, fleet.nodewright)[1:])) in failing else "succeed"
    )
    events = draw(
        st.lists(st.tuples(st.integers(0, 80), st.sampled_from(["edit", "reset", "wipe"])), max_size=6)
    )
    note(f"strategy={kind} initial={initial} failure={failure} budget={budget} reboot={reboot}")
    note(f"failing={sorted(failing)} events={sorted(events)}")
    return fleet, sorted(events)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_ceiling_holds_through_failures_spec_edits_resets_and_wiped_states(
    scenario: tuple[Fleet, list[tuple[int, str]]],
) -> None:
    fleet, events = scenario
    edits = 0
    for round_number in range(100):
        for at, what in events:
            if at != round_number:
                continue
            if what == "edit" and edits < 3:
                edits += 1
                fleet.nodewright = nodewright(
                    env=f"e{edits}", reboot=fleet.nodewright.spec.packages["tune"].interrupt is not None
                )
            elif what == "reset":
                fleet.reset = True
            elif what == "wipe":
                done = sorted(n for n, v in fleet.labels.items() if v == Status.COMPLETE.value)
                if done:
                    fleet.nodes[done[0]].state_text = None
        fleet.round()  # raises FleetBreach on any I1/I2 breach
    # The last spec, with failures from now on impossible, converges everywhere it is allowed to.
    final = edits + 1
    fleet.nodewright = nodewright(
        env=f"e{final}", reboot=fleet.nodewright.spec.packages["tune"].interrupt is not None
    )
    fleet.fate = lambda _node, _pod: "succeed"
    run(fleet)
    halted = {h.compartment for h in fleet.plans[-1].halts}
    if not halted:
        assert fleet.status_counts() == {"complete": len(fleet.names)}, fleet.status_counts()


# ----------------------------------------------------------------------------------------------------
# `nodewright plan` at any moment


def _actual(fleet: Fleet, start: int) -> dict[str, list[tuple[int, list[str]]]]:
    grouped: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for plan in fleet.plans[start:]:
        for new in plan.admissions:
            grouped[new.admission.compartment][new.admission.batch].append(new.node)
    return {c: [(b, sorted(n)) for b, n in sorted(batches.items())] for c, batches in grouped.items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    count=st.integers(3, 14),
    kind=st.sampled_from(["fixed", "linear", "exponential"]),
    initial=st.integers(1, 3),
    ceiling=st.integers(1, 5),
    moment=st.integers(0, 60),
    point=st.sampled_from(["before-pass", "nodes-before-the-pass-status-after", "after-pass"]),
    pacing=st.sampled_from(sorted(PACING)),
)
def test_plan_taken_at_any_moment_predicts_the_rest_of_the_rollout(
    count: int, kind: str, initial: int, ceiling: int, moment: int, point: str, pacing: str
) -> None:
    strategy = {
        "fixed": Strategy(fixed=FixedStrategy(initial_batch=initial)),
        "linear": Strategy(linear=LinearStrategy(initial_batch=initial, delta=1)),
        "exponential": Strategy(exponential=ExponentialStrategy(initial_batch=initial, growth_factor=2)),
    }[kind]
    fleet = Fleet(
        nodewright(), policy(strategy, PolicyBudget(count=ceiling), **PACING[pacing]), fleet_of(count)
    )
    for _ in range(moment):
        fleet.round()
    # The reader lists the nodes, then reads the NodeWright (its status) -- `nodewright plan`'s order --
    # with a rollout pass of the operator possibly in between (its status write, then its admissions).
    before_nodes, before_status = fleet.rollout_views(), dict(fleet.statuses)
    index = len(fleet.plans)
    fleet.rollout_pass()
    after_nodes, after_status = fleet.rollout_views(), dict(fleet.statuses)
    nodes, statuses, start = {
        "before-pass": (before_nodes, before_status, index),
        "nodes-before-the-pass-status-after": (before_nodes, after_status, index),
        "after-pass": (after_nodes, after_status, index + 1),
    }[point]
    predicted = preview_rollout(
        fleet.nodewright,
        policy=fleet.policy,
        nodes=nodes,
        fingerprint=fleet.fingerprint,
        now=ts(fleet.now),
        compartment_statuses=statuses,
    )
    for name in fleet.names:
        fleet.node_pass(name)
    run(fleet)
    expected = _actual(fleet, start)
    got = {
        c.name: [(b.number, sorted(b.nodes)) for b in c.batches] for c in predicted.compartments if c.batches
    }
    assert got == expected


# ----------------------------------------------------------------------------------------------------
# `nodewright plan` reading a rollout that moves while it is read (issue 29 item 4)


class MovingReads:
    """`nodewright plan`'s two lists over a fleet whose operator keeps working between them.

    Each list is one moment (an API list is). Before each, a few of these happen: a node pass, a
    rollout pass's status write (its releases and admissions are then written one per step, in the
    controller's order; no new pass starts before they are all written), or the next of those writes.
    Waiting (`sleep`) lets time pass and at least one pending write land, as the controller's writes
    follow each other within milliseconds.
    """

    def __init__(self, fleet: Fleet, rng: random.Random, *, steps: int) -> None:
        self.fleet, self.rng, self.steps = fleet, rng, steps
        self.pending: list[Callable[[], None]] = []
        self.clock = 0.0

    def pass_status(self) -> None:
        plan = self.fleet.rollout_plan()
        self.fleet.plans.append(plan)
        self.fleet.write_status(plan)
        self.fleet.check()
        for name in plan.releases:
            self.pending.append(partial(self.release, name))
        for new in plan.admissions:
            self.pending.append(partial(self.admit, new.node, encode_admission(new.admission)))

    def release(self, node: str) -> None:
        self.fleet.admissions.pop(node, None)

    def admit(self, node: str, text: str) -> None:
        self.fleet.admissions[node] = text

    def write_next(self) -> None:
        self.pending.pop(0)()
        self.fleet.check()

    def step(self) -> None:
        choice = self.rng.random()
        if self.pending and choice < 0.5:
            self.write_next()
        elif not self.pending and choice < 0.3:
            self.pass_status()
        else:
            self.fleet.node_pass(self.rng.choice(self.fleet.names))

    def move(self) -> None:
        for _ in range(self.rng.randint(0, self.steps)):
            self.step()

    async def nodewrights(self) -> list[dict[str, Any]]:
        self.move()
        return [self.fleet.nodewright_object()]

    async def nodes(self) -> list[dict[str, Any]]:
        self.move()
        return [self.fleet.node_object(n) for n in self.fleet.names]

    async def sleep(self, seconds: float) -> None:
        self.clock += seconds
        if self.pending:
            self.write_next()
        self.move()

    def finish(self) -> None:
        while self.pending:
            self.write_next()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    count=st.integers(3, 14),
    kind=st.sampled_from(["fixed", "linear", "exponential"]),
    initial=st.integers(1, 3),
    ceiling=st.integers(1, 6),
    limit=st.sampled_from([None, 1, 2]),
    moment=st.integers(0, 40),
    steps=st.integers(1, 6),
    rng=st.randoms(use_true_random=False),
)
def test_plan_read_while_the_rollout_moves_predicts_the_rest_of_it(
    count: int,
    kind: str,
    initial: int,
    ceiling: int,
    limit: int | None,
    moment: int,
    steps: int,
    rng: random.Random,
) -> None:
    """Issue 29 item 4: the NodeWright and the nodes are read in separate requests while the operator
    writes (a batch settles and the next opens between them; a pass is half-way through writing its
    admissions). `nodewright plan` reads until the two show one moment (`read_snapshot`), and then
    predicts exactly what the controller does from there."""
    strategy = {
        "fixed": Strategy(fixed=FixedStrategy(initial_batch=initial)),
        "linear": Strategy(linear=LinearStrategy(initial_batch=initial, delta=1)),
        "exponential": Strategy(exponential=ExponentialStrategy(initial_batch=initial, growth_factor=2)),
    }[kind]
    fleet = Fleet(nodewright(), policy(strategy, PolicyBudget(count=ceiling)), fleet_of(count))
    fleet.admission_limit = limit
    reads = MovingReads(fleet, rng, steps=steps)
    for _ in range(moment):
        reads.step()
    snap = asyncio.run(
        plan_cmd.read_snapshot(reads, "nw", clock=lambda: reads.clock, sleep=reads.sleep, deadline=60.0)
    )
    note(f"read after {snap.attempts} attempt(s): {snap.check}")
    assert snap.check is SnapshotCheck.CONSISTENT and not snap.moving
    models = [NodeWright.model_validate(o) for o in snap.nodewrights]
    report = plan_cmd.build_report(
        fleet.nodewright,
        policy=fleet.policy,
        nodes=snap.nodes,
        all_nodewrights=models,
        compartment_statuses=models[0].status.compartment_statuses if models[0].status else None,
        exists=True,
        now=fleet.now,
    )
    predicted = {
        c.name: {b.number: sorted(b.nodes) for b in c.batches}
        for c in report.preview.compartments
        if c.batches
    }
    seen = {
        str(n["metadata"]["name"])
        for n in snap.nodes
        if f"{constants.PREFIX}batch.nw" in n["metadata"]["annotations"]
    }
    reads.finish()
    run(fleet)
    future: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name in fleet.names:
        adm = fleet.admission(name)
        if adm is not None and name not in seen:
            future[adm.compartment][adm.batch].append(name)
    expected = {c: {b: sorted(n) for b, n in bs.items()} for c, bs in future.items()}
    assert predicted == expected
