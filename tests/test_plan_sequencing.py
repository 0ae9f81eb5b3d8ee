"""`sequencing.facts_for`: the one builder the controllers and `nodewright plan` share.

Completion is for each NodeWright's *current* spec (`plan.rollout.complete_for_spec`): the status
label lags a spec edit, so an earlier NodeWright edited together with a later one must hold the later
one back on every node until the earlier one has done its new spec there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodewright.api import constants
from nodewright.api.models import NodeWright, Status
from nodewright.api.nodestate import NodeState, PackageEntry, PackageStage, PackageState, decode, encode
from nodewright.plan import sequencing
from nodewright.plan.node import node_complete
from nodewright.plan.rollout import (
    RolloutNode,
    complete_for_spec,
    plan_rollout,
    spec_fingerprint,
    status_for_spec,
)
from nodewright.plan.sequencing import CompletionMemo, blocking, facts_for
from nodewright.plan.status import report_for


def _nw(
    name: str,
    priority: int,
    *,
    sequencing: str = "node",
    deleting: bool = False,
    version: str = "1.0.0",
    drift: str | None = None,
) -> NodeWright:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: dict[str, Any] = {
        "priority": priority,
        "sequencing": sequencing,
        "nodeSelectors": {"matchLabels": {"pool": "gpu"}},
        "packages": {"pkg": {"version": version, "image": "r/p"}},
    }
    if drift is not None:
        spec["driftDetection"] = {"interval": "1h", "action": drift}
    return NodeWright.model_validate(
        {"apiVersion": constants.API_VERSION, "kind": "NodeWright", "metadata": meta, "spec": spec}
    )


def _state(version: str, state: PackageState = PackageState.COMPLETE, *, drifted: str = "") -> NodeState:
    entry = PackageEntry("pkg", version, PackageStage.CONFIG, state, drifted=drifted)
    return NodeState(packages=(entry,))


def _node(
    name: str, pool: str, *, states: Mapping[str, NodeState | str] | None = None, **labels: str
) -> dict[str, Any]:
    """A node with status labels `labels` (NodeWright -> status) and state annotations `states`
    (NodeWright -> state, or raw annotation text)."""
    annotations = {
        constants.state_annotation(nw): s if isinstance(s, str) else encode(s)
        for nw, s in (states or {}).items()
    }
    all_labels = {"pool": pool, **{constants.status_label(k): v for k, v in labels.items()}}
    return {"metadata": {"name": name, "labels": all_labels, "annotations": annotations}}


def test_targets_by_selector_and_completion_for_the_current_spec() -> None:
    done = {"infra": _state("1.0.0")}
    nodes = [
        _node("a", "gpu", states=done, infra="complete"),
        _node("b", "gpu"),
        _node("c", "cpu", states=done, infra="complete"),
        _node("d", "gpu", infra="complete"),  # a label without the state it records: not complete
    ]
    (infra,) = facts_for([_nw("infra", 10)], nodes)
    assert infra.targets == {"a", "b", "d"}
    assert infra.complete_on == {"a"}  # "c" is complete but not targeted


def test_a_deleting_nodewright_holds_nothing_back() -> None:
    nodes = [_node("a", "gpu")]
    nws = [_nw("infra", 10, sequencing="all"), _nw("app", 200)]
    assert blocking(facts_for(nws, nodes), target="app", node="a") is not None
    leaving = [_nw("infra", 10, sequencing="all", deleting=True), _nw("app", 200)]
    assert blocking(facts_for(leaving, nodes), target="app", node="a") is None


def test_a_deleting_nodewright_is_itself_blocked_by_nobody() -> None:
    # Its nodes only uninstall; the rollout controller asks about it until the finalizer is released.
    nodes = [_node("a", "gpu")]
    nws = [_nw("infra", 10, sequencing="all"), _nw("app", 200, deleting=True)]
    assert blocking(facts_for(nws, nodes), target="app", node="a") is None


@pytest.mark.parametrize("mode", ["node", "all"])
def test_an_earlier_nodewright_edited_with_a_later_one_holds_it_back_while_its_label_lags(mode: str) -> None:
    """infra 1.0.0 -> 2.0.0 and app edited together: every node still says `infra: complete` (the node
    controller has not planned them for 2.0.0 yet), but none has done 2.0.0, so app starts nowhere."""
    nodes = [
        _node(
            n,
            "gpu",
            states={"infra": _state("1.0.0"), "app": _state("1.0.0")},
            infra="complete",
            app="complete",
        )
        for n in ("a", "b")
    ]
    before = facts_for([_nw("infra", 10, sequencing=mode), _nw("app", 200)], nodes)
    assert all(blocking(before, target="app", node=n) is None for n in ("a", "b"))
    edited = [_nw("infra", 10, sequencing=mode, version="2.0.0"), _nw("app", 200, version="2.0.0")]
    facts = facts_for(edited, nodes)
    for n in ("a", "b"):
        blocker = blocking(facts, target="app", node=n)
        assert blocker is not None and blocker.name == "infra", (n, blocker)
    # infra completes 2.0.0 on "a" (state and label written together): app may start there (and, with
    # `sequencing: all`, only once infra is done everywhere).
    nodes[0] = _node("a", "gpu", states={"infra": _state("2.0.0")}, infra="complete")
    facts = facts_for(edited, nodes)
    assert (blocking(facts, target="app", node="a") is None) is (mode == "node")
    assert blocking(facts, target="app", node="b") is not None


def test_the_rollout_admits_no_node_of_the_later_nodewright_while_the_earlier_one_has_work() -> None:
    """Through the rollout planner: the later NodeWright's batch takes only nodes where the earlier one
    completed its current spec, whatever their status labels say."""
    infra, app = _nw("infra", 10, version="2.0.0"), _nw("app", 200, version="2.0.0")
    nodes = [
        _node("done", "gpu", states={"infra": _state("2.0.0")}, infra="complete"),
        _node("lagging", "gpu", states={"infra": _state("1.0.0")}, infra="complete"),
        _node(
            "running", "gpu", states={"infra": _state("2.0.0", PackageState.IN_PROGRESS)}, infra="in_progress"
        ),
    ]
    facts = facts_for([infra, app], nodes)
    rollout_nodes = []
    for node in nodes:
        name = node["metadata"]["name"]
        blocker = blocking(facts, target="app", node=name)
        rollout_nodes.append(
            RolloutNode(
                name=name,
                labels=node["metadata"]["labels"],
                creation_timestamp=None,
                status=Status.WAITING,
                needs_work=True,
                waiting_for_priority=blocker.name if blocker else None,
            )
        )
    plan = plan_rollout(
        app,
        policy=None,
        nodes=rollout_nodes,
        compartment_statuses={},
        fingerprint=spec_fingerprint(app),
        now="2026-01-01T00:00:00Z",
    )
    assert {a.node for a in plan.admissions} == {"done"}


def test_a_drifted_node_counts_as_complete_for_ordering_only_when_its_drift_is_reported() -> None:
    """The roll-up's rule: drift with `action: report` is information; with `reapply` it is work."""
    drifted = _state("1.0.0", drifted="sysctl changed")
    nodes = [_node("a", "gpu", states={"infra": drifted}, infra="drifted")]
    for action, held in (("report", False), ("reapply", True)):
        facts = facts_for([_nw("infra", 10, drift=action), _nw("app", 200)], nodes)
        assert (blocking(facts, target="app", node="a") is not None) is held, action


def test_an_unreadable_state_is_never_complete() -> None:
    nodes = [_node("a", "gpu", states={"infra": "{not json"}, infra="complete")]
    facts = facts_for([_nw("infra", 10), _nw("app", 200)], nodes)
    assert blocking(facts, target="app", node="a") is not None


def test_the_memo_decodes_a_state_again_only_when_its_text_or_the_spec_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[str] = []
    real = decode

    def counting(text: str) -> NodeState:
        decoded.append(text)
        return real(text)

    monkeypatch.setattr(sequencing, "decode", counting)
    memo = CompletionMemo()
    nodes = [_node(f"n{i}", "gpu", states={"infra": _state("1.0.0")}, infra="complete") for i in range(50)]
    nws = [_nw("infra", 10), _nw("app", 200)]
    facts_for(nws, nodes, memo=memo)
    assert len(decoded) == 50
    facts_for(nws, nodes, memo=memo)
    facts_for([_nw("infra", 10), _nw("app", 200)], nodes, memo=memo)  # equal specs, new objects
    assert len(decoded) == 50, "nothing changed: no decode"
    nodes[7] = _node(
        "n7", "gpu", states={"infra": _state("1.0.0", PackageState.IN_PROGRESS)}, infra="complete"
    )
    facts_for(nws, nodes, memo=memo)
    assert len(decoded) == 51, "one annotation changed: one decode"
    facts = facts_for([_nw("infra", 10, version="2.0.0"), _nw("app", 200)], nodes, memo=memo)
    assert len(decoded) == 101, "the spec changed: every targeted state is read again"
    (infra,) = [f for f in facts if f.name == "infra"]
    assert infra.complete_on == frozenset()


# -- properties ----------------------------------------------------------------------------------------

_VERSIONS = ("1.0.0", "2.0.0")
_STATES = st.one_of(
    st.none(),
    st.builds(
        _state,
        st.sampled_from(_VERSIONS),
        st.sampled_from(list(PackageState)),
        drifted=st.sampled_from(["", "changed"]),
    ),
)
_LABELS = st.one_of(st.none(), st.sampled_from([s.value for s in Status]), st.just("garbage"))


@st.composite
def _fleets(draw: st.DrawFn) -> list[dict[str, Any]]:
    nodes = []
    for i in range(draw(st.integers(min_value=1, max_value=6))):
        states: dict[str, NodeState | str] = {}
        labels: dict[str, str] = {}
        for nw in ("infra", "app"):
            state = draw(_STATES)
            if state is not None:
                states[nw] = state
            label = draw(_LABELS)
            if label is not None:
                labels[nw] = label
        nodes.append(_node(f"n{i}", draw(st.sampled_from(["gpu", "gpu", "cpu"])), states=states, **labels))
    return nodes


_INFRAS = st.builds(
    lambda mode, version, action: _nw("infra", 10, sequencing=mode, version=version, drift=action),
    st.sampled_from(["node", "all"]),
    st.sampled_from(_VERSIONS),
    st.sampled_from([None, "report", "reapply"]),
)


@settings(max_examples=300, deadline=None)
@given(st.data(), _fleets())
def test_the_later_nodewright_never_starts_where_the_earlier_one_has_not_completed_its_current_spec(
    data: st.DataObject, nodes: list[dict[str, Any]]
) -> None:
    """Whatever the labels say (lagging, garbage, absent), app is let through on a node only where
    infra's state completes infra's current spec -- and with `sequencing: all`, on every infra node."""
    infra = data.draw(_INFRAS)
    facts = facts_for([infra, _nw("app", 200, version=data.draw(st.sampled_from(_VERSIONS)))], nodes)

    def done(node: dict[str, Any]) -> bool:
        text = node["metadata"]["annotations"].get(constants.state_annotation("infra"))
        return text is not None and node_complete(infra, decode(text))

    infra_nodes = [n for n in nodes if n["metadata"]["labels"]["pool"] == "gpu"]
    for node in nodes:
        if blocking(facts, target="app", node=node["metadata"]["name"]) is not None:
            continue
        if infra.spec.sequencing.value == "all":
            assert all(done(n) for n in infra_nodes), node
        elif node in infra_nodes:
            assert done(node), node


@settings(max_examples=200, deadline=None)
@given(st.data(), st.lists(_fleets(), min_size=1, max_size=4))
def test_the_memo_answers_like_a_fresh_read_across_passes(
    data: st.DataObject, passes: list[list[dict[str, Any]]]
) -> None:
    """A controller's memo, carried over passes where nodes and specs change, never answers from a
    stale decode."""
    memo = CompletionMemo()
    for nodes in passes:
        nws = [data.draw(_INFRAS), _nw("app", 200, version=data.draw(st.sampled_from(_VERSIONS)))]
        assert facts_for(nws, nodes, memo=memo) == facts_for(nws, nodes)
        for node in nodes:  # the node controller's per-node question, between two builds
            fresh = CompletionMemo().complete_on(nws[0], node)
            assert memo.complete_on(nws[0], node) is fresh


@given(st.one_of(st.none(), st.sampled_from(list(Status))), st.booleans())
def test_the_roll_up_counts_complete_exactly_the_nodes_ordering_counts_complete(
    label: Status | None, needs_work: bool
) -> None:
    """One rule: `report_for` (status, `Ready`) and `complete_for_spec` (ordering, taint) agree. The
    rollout hands `report_for` the label as corrected by `status_for_spec` (`rollout_node`)."""
    status = status_for_spec(label, needs_work=needs_work)
    counted = report_for("n", status, needs_work=needs_work).status is Status.COMPLETE
    assert counted is complete_for_spec(label, needs_work=needs_work)


@pytest.mark.parametrize("value", [None, "garbage", *(s.value for s in Status)])
@pytest.mark.parametrize("needs_work", [False, True])
def test_the_memo_reads_labels_by_the_rule(value: str | None, needs_work: bool) -> None:
    """The memo never parses a label: outside `NEVER_COMPLETE` the state decides, which is what
    `complete_for_spec` says of every label (an unknown value reads as none, as in the rollout)."""
    label = Status(value) if value in {s.value for s in Status} else None
    by_memo = value not in sequencing.NEVER_COMPLETE and not needs_work
    assert by_memo is complete_for_spec(label, needs_work=needs_work)
