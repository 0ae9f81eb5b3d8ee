"""`kubectl nodewright why` / `node list` / `status`: the answers computed from cluster objects (pure).

Each scenario builds the objects a cluster would hold (nodes with labels, taints, Ready, the operator's
annotations and conditions; NodeWrights; policies) and checks the one-word reason, the one-line
answer and its detail, against what the rollout planner decides for the same objects.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from nodewright.api.models import DeploymentPolicy, NodeWright
from nodewright.cli.plugin import explain
from nodewright.cli.plugin.cluster import ClusterState
from nodewright.cli.plugin.common import NotFoundError
from nodewright.cli.plugin.status_verbs import render_many, render_one, status_doc
from nodewright.cli.plugin.view import screen

JSON = dict[str, Any]
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
FLEET = "fleet.example.com/pool"


def node(name: str, i: int, *, ready: bool = True, annotations: JSON | None = None, **spec: Any) -> JSON:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": str(100 + i),
            "creationTimestamp": f"2026-01-01T00:00:{i:02d}Z",
            "labels": {FLEET: "a", "kubernetes.io/hostname": name},
            "annotations": dict(annotations or {}),
        },
        "spec": dict(spec),
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def nodewright(
    name: str = "nw", *, annotations: JSON | None = None, status: JSON | None = None, **spec: Any
) -> JSON:
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "NodeWright",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "generation": 1,
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "nodeSelectors": {"matchLabels": {FLEET: "a"}},
            "packages": {"tool": {"version": "1.0.0", "image": "ghcr.io/example/tool"}},
            **spec,
        },
        **({"status": status} if status else {}),
    }


def policy(name: str, budget: int, strategy: JSON) -> JSON:
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DeploymentPolicy",
        "metadata": {"name": name},
        "spec": {"default": {"budget": {"count": budget}, "strategy": strategy}},
    }


def state(nodes: list[JSON], nws: list[JSON], policies: Sequence[JSON] = ()) -> ClusterState:
    return ClusterState(
        nodes=nodes,
        nodewright_objects=nws,
        nodewrights={o["metadata"]["name"]: NodeWright.model_validate(o) for o in nws},
        invalid={},
        policies={p["metadata"]["name"]: DeploymentPolicy.model_validate(p) for p in policies},
        policy_objects={p["metadata"]["name"]: p for p in policies},
        now=NOW,
    )


def admission(batch: int, order: int, fingerprint: str, *, consumed: bool = False) -> str:
    doc: JSON = {"c": "__default__", "b": batch, "o": order, "f": fingerprint, "at": "2026-03-01T11:59:00Z"}
    if consumed:
        doc["d"] = True
    return json.dumps(doc)


def fingerprint(nw: JSON) -> str:
    from nodewright.plan.rollout import spec_fingerprint

    return spec_fingerprint(NodeWright.model_validate(nw))


def running(
    i: int, nw: JSON, *, reason: str = "InProgress", message: str = "tool:1.0.0 apply in_progress"
) -> JSON:
    name = nw["metadata"]["name"]
    state_doc = {"v": 1, "p": {"tool|1.0.0": {"s": "apply", "t": "in_progress", "n": 1}}}
    n = node(
        f"n{i}",
        i,
        annotations={
            f"nodewright.io/state.{name}": json.dumps(state_doc),
            f"nodewright.io/batch.{name}": admission(1, i, fingerprint(nw)),
        },
    )
    n["metadata"]["labels"][f"nodewright.io/status.{name}"] = "in_progress"
    n["status"]["conditions"].append(
        {"type": f"nodewright.io/{name}", "status": "False", "reason": reason, "message": message}
    )
    return n


def why(st: ClusterState, node_name: str, nw: str = "nw", **kw: Any) -> explain.Explanation:
    return explain.explain(explain.analyse(st, nw), node_name, **kw)


def test_not_yet_in_batch_says_which_batch_will_take_the_node() -> None:
    nw = nodewright(deploymentPolicy="pol")
    nodes = [running(0, nw), running(1, nw), *(node(f"n{i}", i) for i in range(2, 6))]
    st = state(nodes, [nw], [policy("pol", 2, {"fixed": {"initialBatch": 2}})])
    answer = why(st, "n5")
    assert answer.reason == "NotYetInBatch"
    assert answer.predicted_batch == 3 and answer.last_batch == 3
    assert answer.summary == "not in a batch yet: batch 3 of 3 in compartment '__default__'"
    assert "2 of 2 slots in use" in answer.details
    assert why(st, "n2").predicted_batch == 2
    running_answer = why(st, "n0")
    assert running_answer.reason == "InProgress" and running_answer.stage == "tool:1.0.0 apply in_progress"


def test_budget_full_while_the_batch_is_open_names_the_slot_holders() -> None:
    # The strategy wants 3 per batch, the ceiling is 1: batch 1 holds n0; n1, n2 wait for the budget.
    nw = nodewright(deploymentPolicy="pol")
    nodes = [running(0, nw), *(node(f"n{i}", i) for i in range(1, 4))]
    st = state(nodes, [nw], [policy("pol", 1, {"fixed": {"initialBatch": 3}})])
    analysis = explain.analyse(st, "nw")
    reasons = {n: explain.explain(analysis, n).reason for n in ("n1", "n2", "n3")}
    assert reasons == {"n1": "BudgetFull", "n2": "BudgetFull", "n3": "NotYetInBatch"}
    answer = explain.explain(analysis, "n1")
    assert answer.summary == "budget full: compartment '__default__' has no free slot (1 of 1 in use)"
    assert answer.details == ("slots held by: n0 (ours, in_progress)",)
    assert analysis.plan.waiting_counts == {"BudgetFull": 2, "NotYetInBatch": 1}


def test_paused_disabled_and_policy_missing() -> None:
    paused = nodewright("p", annotations={"nodewright.io/pause": "true"})
    off = nodewright("d", annotations={"nodewright.io/disable": "true"})
    lost = nodewright("m", deploymentPolicy="missing")
    st = state([node("n0", 0)], [paused, off, lost])
    assert why(st, "n0", "p").reason == "Paused"
    assert "kubectl nodewright resume p" in why(st, "n0", "p").details[0]
    assert why(st, "n0", "d").reason == "Disabled"
    answer = why(st, "n0", "m")
    assert answer.reason == "PolicyNotFound" and "'missing'" in answer.summary


def test_a_node_admitted_before_the_pause_says_how_to_resume() -> None:
    nw = nodewright("p", annotations={"nodewright.io/pause": "true"})
    held = running(0, nw)
    held["metadata"]["labels"]["nodewright.io/status.p"] = "paused"
    answer = why(state([held], [nw]), "n0", "p")
    assert answer.reason == "Paused", answer
    assert answer.summary == "NodeWright 'p' is paused; the node keeps what it holds"
    assert "kubectl nodewright resume p" in answer.details[0], answer


def test_waiting_for_an_earlier_paused_nodewright() -> None:
    first = nodewright("first", priority=1, annotations={"nodewright.io/pause": "true"})
    later = nodewright("later", priority=2)
    st = state([node("n0", 0)], [first, later])
    answer = why(st, "n0", "later")
    assert answer.reason == "WaitingForPriority"
    assert answer.summary == "waiting for NodeWright 'first' (paused)"
    assert "priority 1" in answer.details[0] and "kubectl nodewright resume first" in answer.details[0]


def test_node_level_reasons_taint_ignore_not_ready_cordon_and_malformed_state() -> None:
    nw = nodewright()
    nodes = [
        node("n0", 0, taints=[{"key": "example.com/x", "value": "y", "effect": "NoSchedule"}]),
        node("n1", 1, ready=False),
        node("n2", 2, annotations={"nodewright.io/state.nw": "{broken"}),
        node("n3", 3),
    ]
    nodes[3]["metadata"]["labels"]["nodewright.io/ignore"] = "true"
    st = state(nodes, [nw])
    taint = why(st, "n0")
    assert (
        taint.reason == "Blocked"
        and taint.summary == "blocked: taint not tolerated: example.com/x=y:NoSchedule"
    )
    assert "additionalTolerations" in taint.details[0]
    notready = why(st, "n1")
    assert notready.reason == "NodeUnavailable" and notready.summary == "node unavailable: NotReady"
    broken = why(st, "n2")
    assert broken.reason == "StateMalformed" and "node reset n2 nw" in broken.details[-1]
    ignored = why(st, "n3")
    assert ignored.reason == "Blocked" and "node unignore n3" in ignored.details[0]
    assert why(st, "n9").reason == "NotSelected"
    with pytest.raises(NotFoundError):
        st.node("n9")


def test_a_halted_compartment() -> None:
    nw = nodewright(deploymentPolicy="pol")
    fp = fingerprint(nw)
    failed_state = {"v": 1, "p": {"tool|1.0.0": {"s": "apply", "t": "erroring", "n": 1, "e": "boom"}}}
    failed = node(
        "n0",
        0,
        annotations={
            "nodewright.io/state.nw": json.dumps(failed_state),
            "nodewright.io/batch.nw": admission(1, 0, fp, consumed=True),
        },
    )
    failed["metadata"]["labels"]["nodewright.io/status.nw"] = "erroring"
    st = state(
        [failed, node("n1", 1), node("n2", 2)],
        [nw],
        [policy("pol", 1, {"fixed": {"initialBatch": 1, "failureThreshold": 1}})],
    )
    answer = why(st, "n1")
    assert answer.reason == "CompartmentHalted"
    assert "policy reset nw --compartment __default__" in answer.details[-1]
    erroring = why(st, "n0")
    assert erroring.reason == "Erroring" and "tool:1.0.0 apply: boom" in erroring.details[0]
    assert "node retry n0 nw" in erroring.details[-1]


def test_admitted_nodes_at_their_gate_name_protected_pods_and_the_refusing_pdb() -> None:
    nw = nodewright(
        podNonInterruptLabels={"matchLabels": {"protect": "yes"}}, drain={"timeout": "5m", "policy": "wait"}
    )
    protected = running(
        0, nw, reason="WaitingForProtectedPods", message="waiting for protected pods: ns/job-0"
    )
    draining = running(1, nw, reason="Draining", message="draining: 1 pod(s) left (ns/web-0)")
    draining["metadata"]["annotations"]["nodewright.io/timing.nw"] = json.dumps({"d": "2026-03-01T11:50:00Z"})
    st = state([protected, draining], [nw])
    pods = [
        {
            "metadata": {"name": "job-0", "namespace": "ns", "labels": {"protect": "yes"}},
            "spec": {},
            "status": {"phase": "Running"},
        },
        {
            "metadata": {"name": "web-0", "namespace": "ns", "labels": {"app": "web"}},
            "spec": {},
            "status": {"phase": "Running"},
        },
    ]
    pdbs = [
        {
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1},
        },
        {
            "metadata": {"name": "other", "namespace": "ns2"},
            "spec": {"selector": {}},
            "status": {"disruptionsAllowed": 0},
        },
    ]
    analysis = explain.analyse(st, "nw")
    assert explain.needs_drain_facts(analysis, "n0") and explain.needs_drain_facts(analysis, "n1")
    report = explain.drain_report(pods, pdbs, protect=explain.protect_selector(analysis))
    assert report.protected == ("ns/job-0",)
    assert [(b.pod, b.budget) for b in report.blocked] == [("ns/web-0", "ns/web")]
    answer = explain.explain(analysis, "n0", drain=report)
    assert answer.reason == "ProtectedPods" and answer.summary.endswith("ns/job-0")
    blocked = explain.explain(analysis, "n1", drain=report)
    assert blocked.reason == "DrainTimeout"  # first eviction 11:50, timeout 5m, now 12:00
    assert blocked.summary == "drain blocked by PodDisruptionBudget ns/web"
    assert (
        blocked.details[0] == "ns/web-0: PodDisruptionBudget ns/web refuses the eviction"
        " (disruptionsAllowed 0 (healthy 1, needs 1))"
    )
    assert (
        "drain timeout 5m (policy wait) passed at 2026-03-01T11:55:00Z; it keeps evicting" in blocked.details
    )


def test_status_and_the_watch_screen_render_the_same_numbers() -> None:
    nw = nodewright(deploymentPolicy="pol")
    nodes = [running(0, nw), *(node(f"n{i}", i) for i in range(1, 4))]
    st = state(nodes, [nw], [policy("pol", 1, {"fixed": {"initialBatch": 3}})])
    doc = status_doc(explain.analyse(st, "nw"))
    [comp] = doc["compartments"]
    assert (comp["matched"], comp["ceiling"], comp["slotsUsed"], comp["currentBatch"]) == (4, 1, 1, 1)
    assert doc["waiting"] == {"BudgetFull": 2, "NotYetInBatch": 1}
    table = render_one(doc, wide=True)
    assert "__default__" in table and "1/1" in table and "BudgetFull 2" in table
    assert "nw" in render_many([doc], wide=False)
    lines = screen(
        [doc],
        events={
            "nw": [
                {
                    "lastTimestamp": "2026-03-01T11:59:58Z",
                    "reason": "BatchStarted",
                    "count": 3,
                    "message": "m",
                }
            ]
        },
        width=100,
        elapsed=75,
    )
    assert lines[0] == "kubectl nodewright watch  01:15"
    bar = next(line for line in lines if "__default__" in line)
    assert "0/4" in bar and "slots   1/1" in bar and "░" in bar
    assert any("BatchStarted" in line and "x3" in line for line in lines)
    assert all(len(line) <= 100 for line in lines)
    assert len(screen([doc, doc, doc], width=80, height=10)) == 10


def test_pacing_reasons_are_answered_with_the_planners_message() -> None:
    nw = nodewright(deploymentPolicy="pol")
    gated = policy("pol", 1, {"fixed": {"initialBatch": 1}})
    # Sundays 03:00-04:00 UTC; NOW is Sunday 12:00: closed.
    gated["spec"]["maintenance"] = {"windows": [{"schedule": "0 3 * * 0", "duration": "1h"}]}
    st = state([node("n0", 0)], [nw], [gated])
    answer = why(st, "n0")
    assert answer.reason == "Window", answer
    assert answer.summary and "not in a batch yet" not in answer.summary


def test_a_full_shared_disruption_budget_names_the_budget_and_who_holds_its_slots() -> None:
    # Another NodeWright's slot on x9 (a node of the pool this one does not select) fills the budget.
    nw = nodewright(deploymentPolicy="pol")
    nodes = [node(f"n{i}", i) for i in range(3)]
    other = node("x9", 9)
    other["metadata"]["labels"][FLEET] = "b"
    for n in (nodes[0], nodes[1], other):
        n["metadata"]["labels"]["pool"] = "gpu"
    budget = {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DisruptionBudget",
        "metadata": {"name": "gpu-pool", "resourceVersion": "5"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "gpu"}}, "budget": {"count": 1}},
        "status": {"slots": {"x9": {"drivers": "2026-03-01T11:58:00Z"}}},
    }
    st = state([*nodes, other], [nw], [policy("pol", 3, {"fixed": {"initialBatch": 3}})])
    st.budget_objects = [budget]
    analysis = explain.analyse(st, "nw")
    assert [a.node for a in analysis.plan.admissions] == ["n2"], "outside the pool the batch goes on"
    answer = explain.explain(analysis, "n0")
    assert answer.reason == "DisruptionBudget"
    assert "DisruptionBudget 'gpu-pool' has no free slot" in answer.summary
    assert "x9 (slot of NodeWright 'drivers')" in answer.summary
    assert any("kubectl get disruptionbudget gpu-pool" in d for d in answer.details), answer.details
