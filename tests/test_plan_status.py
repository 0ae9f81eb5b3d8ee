"""Status roll-up, conditions (kstatus, lastTransitionTime), bounded size and counts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nodewright.api import constants
from nodewright.api.models import (
    Condition,
    NodeWright,
    NodeWrightSpec,
    NodeWrightStatus,
    ObjectMeta,
    Status,
)
from nodewright.api.nodestate import NodeState, PackageEntry, PackageStage, PackageState, encode
from nodewright.api.timing import parse_ts
from nodewright.plan.rollout import RolloutNode, plan_rollout
from nodewright.plan.rollout_input import derive_node, node_context
from nodewright.plan.status import (
    MAX_EXAMPLES,
    OWNED_CONDITIONS,
    NodeReport,
    PackageReport,
    aggregate_status,
    merge_conditions,
    report_for,
    roll_up,
)

T0, T1 = "2025-01-01T00:00:00Z", "2025-01-01T01:00:00Z"


def nw(status: NodeWrightStatus | None = None, **spec: object) -> NodeWright:
    return NodeWright(
        metadata=ObjectMeta(name="nw", generation=4), spec=NodeWrightSpec.model_validate(spec), status=status
    )


def reports(*statuses: Status) -> list[NodeReport]:
    return [NodeReport(f"n{i:04d}", s) for i, s in enumerate(statuses)]


def conds(summary_status: NodeWrightStatus) -> dict[str, Condition]:
    return {c.type: c for c in summary_status.conditions or []}


def test_roll_up_rules() -> None:
    assert roll_up([]) is Status.COMPLETE
    assert roll_up([Status.COMPLETE, Status.COMPLETE]) is Status.COMPLETE
    assert roll_up([Status.COMPLETE, Status.IN_PROGRESS, Status.ERRORING]) is Status.IN_PROGRESS
    assert roll_up([Status.COMPLETE, Status.ERRORING, Status.ERRORING]) is Status.ERRORING
    assert roll_up([Status.WAITING, Status.ERRORING]) is Status.UNKNOWN
    assert roll_up([Status.WAITING, Status.ERRORING], halted=True) is Status.BLOCKED


def test_complete_is_ready_and_printer_columns() -> None:
    packages = {"zeta": {"version": "2.0.0", "image": "i"}, "alpha": {"version": "1.0.0", "image": "i"}}
    out = aggregate_status(
        nw(packages=packages), nodes=reports(Status.COMPLETE, Status.COMPLETE), plan=None, now=T0
    )
    s = out.status
    assert s.status is Status.COMPLETE and s.observed_generation == 4
    assert (s.complete_nodes, s.nodes_in_progress, s.nodes_erroring) == ("2/2", 0, 0)
    assert s.package_list == "alpha:1.0.0,zeta:2.0.0"
    c = conds(s)
    assert [x.type for x in s.conditions or []] == list(OWNED_CONDITIONS)
    assert c["Ready"].status == "True" and c["Ready"].reason == "NodesConverged"
    assert c["Reconciling"].status == "False" and c["Stalled"].status == "False"
    assert all(x.observed_generation == 4 and x.last_transition_time == T0 for x in c.values())


def test_in_progress_reconciling_and_erroring_stalled() -> None:
    s = aggregate_status(nw(), nodes=reports(Status.IN_PROGRESS, Status.WAITING), plan=None, now=T0).status
    c = conds(s)
    assert s.status is Status.IN_PROGRESS
    assert (c["Ready"].status, c["Ready"].reason) == ("False", "Progressing")
    assert c["Reconciling"].status == "True"
    s = aggregate_status(nw(), nodes=reports(Status.COMPLETE, Status.ERRORING), plan=None, now=T0).status
    c = conds(s)
    assert s.status is Status.ERRORING and c["Stalled"].status == "True"
    assert c["Ready"].reason == "Erroring"


def test_overrides_in_order() -> None:
    nodes = reports(Status.WAITING)
    assert aggregate_status(
        nw(), nodes=nodes, plan=None, now=T0, disabled=True, paused=True
    ).status.status is (Status.DISABLED)
    paused = aggregate_status(nw(), nodes=nodes, plan=None, now=T0, paused=True).status
    assert paused.status is Status.PAUSED and conds(paused)["Paused"].status == "True"
    seq = aggregate_status(nw(), nodes=reports(Status.UNKNOWN), plan=None, now=T0, waiting_for_sequencing="x")
    assert seq.status.status is Status.WAITING
    # Policy not found turns even a complete NodeWright into blocked.
    missing = plan_rollout(
        nw(deployment_policy="gone"), policy=None, nodes=[], compartment_statuses={}, fingerprint="f", now=T0
    )
    out = aggregate_status(nw(deployment_policy="gone"), nodes=reports(Status.COMPLETE), plan=missing, now=T0)
    c = conds(out.status)
    assert out.status.status is Status.BLOCKED
    assert c["PolicyNotFound"].status == "True" and c["Stalled"].reason == "DeploymentPolicyNotFound"


def test_last_transition_time_preserved_and_identical_output() -> None:
    first = aggregate_status(nw(), nodes=reports(Status.IN_PROGRESS), plan=None, now=T0).status
    again = aggregate_status(nw(first), nodes=reports(Status.IN_PROGRESS), plan=None, now=T1).status
    assert again == first
    done = aggregate_status(nw(first), nodes=reports(Status.COMPLETE), plan=None, now=T1).status
    c = conds(done)
    assert c["Ready"].last_transition_time == T1
    assert c["Paused"].last_transition_time == T0


def test_foreign_conditions_are_kept_and_extra_replace_them() -> None:
    drain = Condition(type="DrainBlocked", status="True", reason="PDB", last_transition_time=T0)
    merged = merge_conditions([drain], current=[], now=T1)
    assert merged == [drain]
    cleared = drain.model_copy(update={"status": "False", "reason": "Drained"})
    merged = merge_conditions([drain], current=[cleared], now=T1)
    assert merged[0].status == "False" and merged[0].last_transition_time == T1


def test_malformed_nodes_message_is_bounded() -> None:
    names = [f"node-{i}" for i in range(9)]
    s = aggregate_status(
        nw(), nodes=reports(Status.COMPLETE), plan=None, now=T0, malformed_nodes=names
    ).status
    c = conds(s)["NodeStateMalformed"]
    assert c.status == "True" and c.reason == "ParseError"
    assert "and 4 more" in c.message and "node-8" not in c.message


def test_halted_condition_and_waiting_reasons() -> None:
    from nodewright.api.models import BatchState, CompartmentStatus

    halted_state = {
        "__default__": CompartmentStatus(batch_state=BatchState(should_stop=True, consecutive_failures=2))
    }
    nodes = [
        RolloutNode("a", {}, None, Status.ERRORING, True),
        RolloutNode("b", {}, None, Status.WAITING, True),
    ]
    plan = plan_rollout(
        nw(), policy=None, nodes=nodes, compartment_statuses=halted_state, fingerprint="f", now=T0
    )
    out = aggregate_status(nw(), nodes=reports(Status.ERRORING, Status.WAITING), plan=plan, now=T0)
    c = conds(out.status)
    assert c["Halted"].status == "True" and "__default__" in c["Halted"].message
    assert c["Stalled"].status == "True" and c["Stalled"].reason == "Halted"
    assert out.status.status is Status.BLOCKED
    assert out.waiting_reasons == {"CompartmentHalted": 2}


@given(st.lists(st.sampled_from(list(Status)), max_size=2000))
def test_size_bounded_and_counts_sum(statuses: list[Status]) -> None:
    nodes = [
        NodeReport(f"n{i:05d}", s, (PackageReport("kmod", "1.0.0", "apply", "complete"),))
        for i, s in enumerate(statuses)
    ]
    out = aggregate_status(nw(), nodes=nodes, plan=None, now=T0)
    assert sum((out.status.node_counts or {}).values()) == len(nodes)
    assert all(len(v) <= MAX_EXAMPLES for v in out.node_examples.values())
    assert sum(out.package_counts.get("kmod:1.0.0", {}).values()) == len(nodes)
    # Size does not grow with the number of nodes: every message names at most MAX_EXAMPLES per bucket.
    assert len(str(out.to_json_dict())) < 6000


# A node's status label lags a spec change (issue 29 item 1): Ready never reflects an older generation.

_LABELS = st.sampled_from([None, *(s.value for s in Status)])


@settings(deadline=None)
@given(
    nodes=st.lists(st.tuples(_LABELS, st.sampled_from(["1.0.0", "2.0.0", None])), min_size=1, max_size=6),
    spec_version=st.sampled_from(["1.0.0", "2.0.0"]),
)
def test_ready_only_when_every_node_completed_this_spec(
    nodes: list[tuple[str | None, str | None]], spec_version: str
) -> None:
    """Whatever the status labels say (the node controller may not have looked at a node since the spec
    changed), the roll-up is complete and Ready=True only when every node's state has completed the spec's
    packages; and a node that completed them is never counted in progress."""
    model = nw(packages={"tool": {"version": spec_version, "image": "i"}})
    reports_: list[NodeReport] = []
    converged: list[bool] = []
    for i, (label, done_version) in enumerate(nodes):
        state = None
        if done_version is not None:
            entry = PackageEntry(name="tool", version=done_version, stage=PackageStage.CONFIG,
                                 state=PackageState.COMPLETE, started=T0)  # fmt: skip
            state = NodeState(packages=(entry,), generation=1)
        obj = {
            "metadata": {
                "name": f"n{i}",
                "labels": {constants.status_label("nw"): label} if label is not None else {},
                "annotations": {constants.state_annotation("nw"): encode(state)} if state else {},
            },
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        derived = derive_node(node_context(model, now=parse_ts(T0), runtime_taint_key="k"), obj).entry
        assert derived.rollout is not None
        rnode = derived.rollout
        reports_.append(report_for(rnode.name, rnode.status, needs_work=rnode.needs_work))
        converged.append(done_version == spec_version)
        if done_version == spec_version:
            assert reports_[-1].status is not Status.IN_PROGRESS
        else:
            assert reports_[-1].status is not Status.COMPLETE
    out = aggregate_status(model, nodes=reports_, plan=None, now=T0).status
    ready = conds(out)["Ready"]
    if ready.status == "True" or out.status is Status.COMPLETE:
        assert all(converged), (nodes, spec_version, out.status, ready.message)
    assert out.complete_nodes == f"{sum(r.status is Status.COMPLETE for r in reports_)}/{len(nodes)}"
