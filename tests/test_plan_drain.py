"""Drain selection, protected pods, label-selector matching and NodeWright sequencing."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodewright.api import constants
from nodewright.api.models import LabelSelector, LabelSelectorRequirement, Sequencing
from nodewright.plan import selectors
from nodewright.plan.drain import select
from nodewright.plan.sequencing import NodeWrightFacts, blocking, order


def pod(
    name: str,
    *,
    ns: str = "default",
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    owners: list[str] | None = None,
    annotations: dict[str, str] | None = None,
    tolerations: list[dict[str, str]] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "labels": labels or {},
        "annotations": annotations or {},
        "ownerReferences": [{"kind": k, "name": "o"} for k in owners or []],
    }
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"tolerations": tolerations or []}, "status": {"phase": phase}}


PROTECT = LabelSelector(match_labels={"job": "training"})


def test_selection_rules() -> None:
    pods = [
        pod("web"),
        pod("ds", owners=["DaemonSet"]),  # a single DaemonSet owner is enough (unlike the reference)
        pod("mirror", ns="kube-system", annotations={"kubernetes.io/config.mirror": "x"}),
        pod(
            "tol",
            tolerations=[
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
            ],
        ),
        pod("tol-all", tolerations=[{"operator": "Exists"}]),
        pod(
            "tol-noexec",
            tolerations=[
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoExecute"}
            ],
        ),
        pod("done", phase="Succeeded"),
        pod("failed", phase="Failed"),
        pod("going", deleting=True),
        pod("ours", labels={constants.POD_OWNER_LABEL: constants.POD_OWNER_VALUE}),
        pod("coredns", ns="kube-system", owners=["ReplicaSet"]),
        pod("train", labels={"job": "training"}, phase="Pending"),
        pod("train-done", labels={"job": "training"}, phase="Succeeded"),
    ]
    sel = select(pods, protect=PROTECT)
    assert sel.evict == ("default/tol-noexec", "default/train", "default/web", "kube-system/coredns")
    assert sel.terminating == ("default/going",)
    assert sel.protected == ("default/train",)
    assert not sel.drained
    assert select([pod("ds", owners=["DaemonSet"])], protect=PROTECT).drained


def test_empty_selector_protects_nothing() -> None:
    pods = [pod("a", labels={"job": "training"})]
    assert select(pods, protect=None).protected == ()
    assert select(pods, protect=LabelSelector()).protected == ()
    assert select(pods, protect=LabelSelector(match_labels={})).protected == ()


def req(key: str, op: str, values: list[str] | None = None) -> LabelSelectorRequirement:
    return LabelSelectorRequirement(key=key, operator=op, values=values)  # type: ignore[arg-type]


def test_selector_operators() -> None:
    labels = {"a": "1", "b": "2"}
    assert selectors.matches(None, labels)
    assert selectors.matches(LabelSelector(), labels)
    assert selectors.matches(LabelSelector(match_labels={"a": "1"}), labels)
    assert not selectors.matches(LabelSelector(match_labels={"a": "2"}), labels)
    assert selectors.matches(LabelSelector(match_expressions=[req("a", "In", ["1", "3"])]), labels)
    assert not selectors.matches(LabelSelector(match_expressions=[req("c", "In", ["1"])]), labels)
    assert selectors.matches(LabelSelector(match_expressions=[req("c", "NotIn", ["1"])]), labels)
    assert not selectors.matches(LabelSelector(match_expressions=[req("a", "NotIn", ["1"])]), labels)
    assert selectors.matches(LabelSelector(match_expressions=[req("a", "Exists")]), labels)
    assert not selectors.matches(LabelSelector(match_expressions=[req("a", "DoesNotExist")]), labels)
    both = LabelSelector(match_labels={"a": "1"}, match_expressions=[req("b", "In", ["9"])])
    assert not selectors.matches(both, labels)


label_maps = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.sampled_from(["1", "2"]), max_size=3)


@given(
    label_maps,
    st.sampled_from(["a", "b", "c"]),
    st.lists(st.sampled_from(["1", "2"]), min_size=1, max_size=2),
)
def test_in_and_notin_are_complements(labels: dict[str, str], key: str, values: list[str]) -> None:
    isin = selectors.matches(LabelSelector(match_expressions=[req(key, "In", values)]), labels)
    notin = selectors.matches(LabelSelector(match_expressions=[req(key, "NotIn", values)]), labels)
    assert isin != notin
    exists = selectors.matches(LabelSelector(match_expressions=[req(key, "Exists")]), labels)
    assert exists != selectors.matches(LabelSelector(match_expressions=[req(key, "DoesNotExist")]), labels)


# -- sequencing -------------------------------------------------------------------------------------------


def facts(
    name: str,
    priority: int,
    *,
    seq: Sequencing = Sequencing.NODE,
    targets: set[str] | None = None,
    complete: set[str] | None = None,
    disabled: bool = False,
    paused: bool = False,
) -> NodeWrightFacts:
    return NodeWrightFacts(
        name=name,
        priority=priority,
        sequencing=seq,
        disabled=disabled,
        paused=paused,
        targets=frozenset(targets if targets is not None else {"n1", "n2"}),
        complete_on=frozenset(complete or set()),
    )


def test_order_by_priority_then_name() -> None:
    assert [f.name for f in order([facts("b", 1), facts("a", 2), facts("a0", 1)])] == ["a0", "b", "a"]


def test_node_sequencing() -> None:
    infra = facts("infra", 10, complete={"n1"})
    user = facts("user", 200)
    assert blocking([infra, user], target="user", node="n1") is None
    b = blocking([infra, user], target="user", node="n2")
    assert b is not None and b.name == "infra"
    # Not targeting the node: no block.
    assert blocking([facts("infra", 10, targets={"n1"}), user], target="user", node="n2") is None


def test_all_sequencing_blocks_everywhere() -> None:
    infra = facts("infra", 10, seq=Sequencing.ALL, targets={"n1", "n2"}, complete={"n1"})
    b = blocking([infra, facts("user", 200)], target="user", node="n1")
    assert b is not None and "1 node" in b.reason


def test_disabled_never_blocks_paused_does() -> None:
    assert blocking([facts("infra", 10, disabled=True), facts("user", 200)], target="user", node="n1") is None
    b = blocking([facts("infra", 10, paused=True), facts("user", 200)], target="user", node="n1")
    assert b is not None and "paused" in b.reason
    # Later NodeWrights never block earlier ones.
    assert blocking([facts("infra", 10), facts("user", 200)], target="infra", node="n1") is None
