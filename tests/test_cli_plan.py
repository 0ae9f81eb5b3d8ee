"""`nodewright plan`: node objects → rollout nodes → report, rendering and JSON (no cluster)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from nodewright.api import constants
from nodewright.api.admission import Admission, admission_annotation, encode_admission
from nodewright.api.models import DeploymentPolicy, NodeWright, Status
from nodewright.cli import demo_cmd, plan_cmd
from nodewright.plan.rollout import spec_fingerprint
from nodewright.sim.fleet import node_manifest

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _nodes(count: int, **labels: str) -> list[dict[str, Any]]:
    nodes = []
    for i in range(count):
        node = node_manifest(i, profile="h100", labels_extra=labels)
        node["metadata"]["creationTimestamp"] = f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z"
        nodes.append(node)
    return nodes


def _demo_fleet(total: int = 40, canaries: int = 4) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = []
    for start, count, labels, _real in demo_cmd.fleet_layout(total, canaries):
        for i in range(start, start + count):
            node = node_manifest(i, profile="h100", labels_extra=labels)
            node["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
            nodes.append(node)
    return nodes


def _load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((SAMPLES / name).read_text())
    return loaded


def _demo_models() -> tuple[NodeWright, DeploymentPolicy]:
    return (
        NodeWright.model_validate(_load("demo-kernel-tuning.yaml")),
        DeploymentPolicy.model_validate(_load("demo-policy.yaml")),
    )


def test_demo_samples_predict_three_compartments() -> None:
    nw, policy = _demo_models()
    report = plan_cmd.build_report(nw, policy=policy, nodes=_demo_fleet(40, 4), now=NOW)
    comps = {c.name: c for c in report.preview.compartments}
    assert comps["canary"].matched == 4 and comps["canary"].ceiling == 1
    assert comps["canary"].sizes == (1, 1, 1, 1)
    assert comps["zone-a"].matched == 18 and comps["zone-a"].ceiling == 3  # 20% of 18
    assert comps["zone-a"].sizes == (2, 3, 3, 3, 3, 3, 1)  # linear +2 capped by the ceiling
    assert comps["zone-b"].matched == 18 and comps["zone-b"].ceiling == 4  # 25% of 18
    assert comps["zone-b"].sizes == (1, 2, 4, 4, 4, 3)
    assert report.node_statuses == {"waiting": 40}
    assert not report.exists
    assert report.fingerprint == spec_fingerprint(nw)


def test_render_table_and_totals() -> None:
    nw, policy = _demo_models()
    report = plan_cmd.build_report(nw, policy=policy, nodes=_demo_fleet(40, 4), now=NOW)
    text = plan_cmd.render(report)
    assert text.startswith("NodeWright kernel-tuning (policy: demo-rollout)\n")
    assert "zone-b" in text and "1,2,4,4,4,3" in text
    assert "predicted if every node succeeds: 40 node(s) in 17 batch(es)" in text
    assert "nodes now: waiting 40" in text
    wide = plan_cmd.render(report, wide=True)
    assert "canary batch 1 (1): " in wide


def test_json_is_serialisable_and_complete() -> None:
    nw, policy = _demo_models()
    report = plan_cmd.build_report(nw, policy=policy, nodes=_demo_fleet(20, 2), now=NOW)
    doc = json.loads(json.dumps(report.to_json()))
    assert doc["nodewright"] == "kernel-tuning"
    assert doc["policy"] == "demo-rollout"
    assert doc["now"] == "2026-01-01T12:00:00Z"
    assert doc["nodeStatuses"] == {"waiting": 20}
    names = {c["name"]: c for c in doc["compartments"]}
    assert sum(len(b["nodes"]) for c in names.values() for b in c["batches"]) == 20
    assert names["canary"]["batchSizes"] == [1, 1]


def test_policy_not_found_is_reported() -> None:
    nw, _ = _demo_models()
    report = plan_cmd.build_report(nw, policy=None, nodes=_demo_fleet(10, 2), now=NOW)
    assert report.preview.policy_not_found
    assert "not found: no node will start" in plan_cmd.render(report)


def test_blockers_right_now_come_from_the_nodes() -> None:
    nw = NodeWright.model_validate(
        {
            "metadata": {"name": "tune"},
            "spec": {
                "interruptionBudget": {"count": 2},
                "packages": {"sysctl": {"version": "1.0.0", "image": "x/sysctl"}},
            },
        }
    )
    nodes = _nodes(6)
    nodes[0]["spec"]["unschedulable"] = True  # cordoned by someone else
    nodes[1]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    nodes[2]["metadata"]["labels"][constants.LABEL_IGNORE] = "true"
    nodes[3]["spec"]["taints"] = [{"key": "maintenance", "effect": "NoSchedule"}]
    report = plan_cmd.build_report(nw, policy=None, nodes=nodes, now=NOW)
    reasons = {b.reason: b for b in report.preview.blockers}
    assert any(r.startswith("NodeUnavailable(cordoned by someone else") for r in reasons)
    assert any(r.startswith("NodeUnavailable(NotReady") for r in reasons)
    assert any("nodewright.io/ignore" in r for r in reasons)
    assert any("maintenance" in r for r in reasons)
    comp = report.preview.compartments[0]
    # two of the budget's slots are held by the unavailable nodes: nothing can start at first
    assert comp.ceiling == 2
    assert sum(comp.sizes) == 0


def test_rollout_node_reads_status_label_state_and_admission() -> None:
    nw, _ = _demo_models()
    node = _nodes(1)[0]
    admission = Admission("zone-a", 3, 7, spec_fingerprint(nw), "2026-01-01T00:00:00Z")
    node["metadata"]["labels"][constants.status_label(nw.metadata.name)] = "in_progress"
    node["metadata"].setdefault("annotations", {})[admission_annotation(nw.metadata.name)] = encode_admission(
        admission
    )
    rnode, error = plan_cmd.rollout_node(nw, node)
    assert error is None
    assert rnode.status is Status.IN_PROGRESS
    assert rnode.needs_work
    assert rnode.admission == admission
    node["metadata"]["annotations"][constants.state_annotation(nw.metadata.name)] = "{not json"
    rnode, error = plan_cmd.rollout_node(nw, node)
    assert error is not None and rnode.needs_work


def test_existing_admissions_continue_the_sequence() -> None:
    nw, policy = _demo_models()
    nodes = _demo_fleet(20, 2)
    first = plan_cmd.build_report(nw, policy=policy, nodes=nodes, now=NOW)
    canary = next(c for c in first.preview.compartments if c.name == "canary")
    admitted = canary.batches[0].nodes[0]
    for node in nodes:
        if node["metadata"]["name"] == admitted:
            adm = Admission("canary", 1, 0, spec_fingerprint(nw), "2026-01-01T00:00:00Z")
            node["metadata"].setdefault("annotations", {})[admission_annotation("kernel-tuning")] = (
                encode_admission(adm)
            )
            node["metadata"]["labels"][constants.status_label("kernel-tuning")] = "in_progress"
    again = plan_cmd.build_report(nw, policy=policy, nodes=nodes, now=NOW)
    assert again.node_statuses == {"in_progress": 1, "waiting": 19}
    canary_again = next(c for c in again.preview.compartments if c.name == "canary")
    assert [len(b.nodes) for b in canary_again.batches] == [1]  # the running node's batch is not re-admitted


def test_manifest_picking(tmp_path: Path) -> None:
    path = tmp_path / "both.yaml"
    path.write_text(
        (SAMPLES / "demo-policy.yaml").read_text()
        + "\n---\n"
        + (SAMPLES / "demo-kernel-tuning.yaml").read_text()
    )
    docs = plan_cmd.load_documents(path)
    assert len(plan_cmd.pick(docs, "NodeWright")) == 1
    assert len(plan_cmd.pick(docs, "DeploymentPolicy")) == 1
    assert len(plan_cmd.pick([{"kind": "List", "items": docs}], "NodeWright")) == 1


def test_demo_helpers() -> None:
    layout = demo_cmd.fleet_layout(11, 3, real=2)
    assert sum(count for _, count, _, _ in layout) == 11
    assert sum(count for _, count, labels, _ in layout if labels.get(demo_cmd.CANARY_LABEL)) == 3
    assert [real for _, _, labels, real in layout if labels.get(demo_cmd.CANARY_LABEL)] == [1, 1]
    assert sum(real for *_, real in demo_cmd.fleet_layout(11, 3, real=9)) == 3, "only canaries run for real"
    rows = demo_cmd.batch_comparison({"a": [1, 2], "b": [3]}, {"a": {1: 1, 2: 2}, "b": {1: 2}})
    assert rows == [("a", [1, 2], [1, 2], True), ("b", [3], [2], False)]
    assert demo_cmd.sizes_text(list(range(1, 20)), limit=3) == "1,2,3,… (19)"


def test_demo_reads_tuned_values_back_from_a_node_root(tmp_path: Path) -> None:
    (tmp_path / "proc/sys/net/core").mkdir(parents=True)
    (tmp_path / "proc/sys/net/core/rmem_max").write_text("268435456\n")
    (tmp_path / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz iommu.passthrough=1\n")
    lines = demo_cmd.read_back(tmp_path)
    assert "    sysctl net.core.rmem_max = 268435456" in lines
    assert "    sysctl vm.max_map_count = (not set)" in lines
    assert lines[-1].endswith("iommu.passthrough=1")


def test_a_full_shared_budget_holds_its_pool_and_names_who_holds_it() -> None:
    nw = NodeWright.model_validate(
        {
            "metadata": {"name": "tune"},
            "spec": {
                "nodeSelectors": {"matchLabels": {"role": "worker"}},
                "interruptionBudget": {"count": 2},
                "packages": {"sysctl": {"version": "1.0.0", "image": "x/sysctl"}},
            },
        }
    )
    nodes = _nodes(6, role="worker")
    for node in nodes[:2]:
        node["metadata"]["labels"]["pool"] = "a"
    # A node of the pool this NodeWright does not select, cordoned by a person: the pool's one slot.
    outsider = _nodes(7, pool="a")[6]
    outsider["spec"]["unschedulable"] = True
    budget = {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DisruptionBudget",
        "metadata": {"name": "pool-a", "resourceVersion": "3"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}}, "budget": {"count": 1}},
    }
    report = plan_cmd.build_report(
        nw, policy=None, nodes=[*nodes, outsider], now=NOW, budget_objects=[budget]
    )
    held = [b for b in report.preview.blockers if b.reason == "DisruptionBudget(pool-a)"]
    assert held and sorted(held[0].examples) == sorted(n["metadata"]["name"] for n in nodes[:2]), held
    # Who holds the slot is in the compartment's note (table) and message (JSON).
    note = report.preview.compartments[0].message
    assert f"{outsider['metadata']['name']} (cordoned by someone else)" in note, note
    assert "DisruptionBudget(pool-a)" in plan_cmd.render(report) and "pool-a" in note
    assert sum(report.preview.compartments[0].sizes) == 4, "the nodes outside the pool still roll out"
    without = plan_cmd.build_report(nw, policy=None, nodes=[*nodes, outsider], now=NOW)
    assert sum(without.preview.compartments[0].sizes) == 6


# ----------------------------------------------------------------------------------------------------
# A plan read while the rollout moves (issue 29 item 4)

NODES_C = ("api/v1", "", "nodes")
NW_C = ("apis/nodewright.io/v1alpha1", "", "nodewrights")
POLICY_C = ("apis/nodewright.io/v1alpha1", "", "deploymentpolicies")


def _put_world(kube: Any, fleet: Any) -> None:
    """The fleet's NodeWright (with the status the controller wrote) and nodes, into the API server."""
    kube.put(NW_C, fleet.nodewright_object())
    for name in fleet.names:
        kube.put(NODES_C, dict(fleet.node_object(name), apiVersion="v1", kind="Node"))


def _admissions(fleet: Any) -> dict[str, tuple[str, int]]:
    out = {}
    for name in fleet.names:
        adm = fleet.admission(name)
        if adm is not None and adm.fingerprint == fleet.fingerprint:
            out[name] = (adm.compartment, adm.batch)
    return out


async def test_a_plan_read_while_a_batch_settles_and_the_next_opens_predicts_from_one_moment(
    tmp_path: Path,
) -> None:
    """The nodes are listed while the last node of batch 1 is still running; before the NodeWright is
    read, that node completes and the controller opens batch 2 (status, then admissions). Paired as read,
    the new batch state and the old nodes made the preview open batch 2 again (smaller, as the running
    node still held a slot) and push its nodes into later batches: "predicts the open batch again"."""
    from nodewright.api.models import FixedStrategy, PolicyBudget, Strategy
    from tests.fleetsim import Fleet
    from tests.kubefake import FakeKube
    from tests.test_plan_fleet import fleet_of, nodewright, policy, run

    fleet = Fleet(
        nodewright(),
        policy(Strategy(fixed=FixedStrategy(initial_batch=2)), PolicyBudget(count=2)),
        fleet_of(6),
    )
    fleet.rollout_pass()
    first = sorted(_admissions(fleet))
    assert len(first) == 2
    while fleet.labels.get(first[0]) != "complete":
        fleet.node_pass(first[0])
    fleet.node_pass(first[1])
    assert fleet.labels[first[1]] == "in_progress"

    class MovingKube(FakeKube):
        """Serves the nodes as listed above; right after that list, the rollout moves on."""

        moved = False

        def _get(self, collection: Any, name: str | None, query: dict[str, str]) -> Any:
            response = super()._get(collection, name, query)
            if collection == NODES_C and name is None and not self.moved:
                self.moved = True
                while fleet.labels.get(first[1]) != "complete":
                    fleet.node_pass(first[1])
                fleet.rollout_pass()  # batch 1 settles, batch 2 opens: status, then its admissions
                _put_world(self, fleet)
            return response

    kube = MovingKube()
    await kube.start()
    try:
        _put_world(kube, fleet)
        assert fleet.policy is not None
        pol = fleet.policy.to_json_dict()
        pol.update({"apiVersion": "nodewright.io/v1alpha1", "kind": "DeploymentPolicy"})
        kube.put(POLICY_C, pol)
        config = tmp_path / "kubeconfig"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": kube.url}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        args = argparse.Namespace(
            name="nw", filename=None, policy=None, kubeconfig=str(config), context=None, request_timeout=5.0
        )
        inputs = await plan_cmd.gather(args)
        assert kube.moved
    finally:
        await kube.stop()
    report = plan_cmd.build_report(
        inputs.nodewright,
        policy=inputs.policy,
        nodes=inputs.nodes,
        all_nodewrights=inputs.all_nodewrights,
        compartment_statuses=inputs.compartment_statuses,
        exists=inputs.exists,
        now=fleet.now,
    )
    predicted = {b.number: sorted(b.nodes) for c in report.preview.compartments for b in c.batches}
    seen = _admissions(fleet)
    for name in fleet.names:
        fleet.node_pass(name)
    run(fleet)
    future: dict[int, list[str]] = {}
    for node, (_, batch) in sorted(_admissions(fleet).items()):
        if node not in seen:
            future.setdefault(batch, []).append(node)
    assert predicted == future, (predicted, future, seen)


class _Reads:
    """Fixed NodeWright objects (one per call, the last repeated) and nodes; a fake clock."""

    def __init__(self, statuses: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> None:
        self.statuses, self.node_list, self.now, self.calls = statuses, nodes, 0.0, 0

    async def nodewrights(self) -> list[dict[str, Any]]:
        status = self.statuses[min(self.calls, len(self.statuses) - 1)]
        self.calls += 1
        return [{"metadata": {"name": "nw"}, "spec": {}, "status": status}]

    async def nodes(self) -> list[dict[str, Any]]:
        return self.node_list

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def _status(batch: int, admitted: int) -> dict[str, Any]:
    state = {"currentBatch": batch, "plannedSize": admitted, "admittedSize": admitted}
    return {"rolloutFingerprint": "f", "compartmentStatuses": {"zone": {"batchState": state}}}


def _admitted_nodes(count: int) -> list[dict[str, Any]]:
    adm = encode_admission(Admission("zone", 1, 0, "f", "2026-01-01T00:00:00Z"))
    return [
        {"metadata": {"name": f"n{i}", "annotations": {admission_annotation("nw"): adm}}}
        for i in range(count)
    ]


async def test_admissions_missing_for_good_are_taken_as_they_are_after_a_moment() -> None:
    """A member released or deleted since it was admitted leaves the batch state counting it: once the
    same read has come back for `SETTLE` seconds the plan goes on (the controller plans with it too)."""
    from nodewright.plan.preview import SnapshotCheck

    reads = _Reads([_status(1, 3)], _admitted_nodes(2))
    snap = await plan_cmd.read_snapshot(reads, "nw", clock=lambda: reads.now, sleep=reads.sleep)
    assert snap.check is SnapshotCheck.ADMISSIONS_UNWRITTEN and not snap.moving
    assert plan_cmd.SETTLE <= reads.now < plan_cmd.SETTLE + 3 * plan_cmd.RETRY


async def test_a_rollout_that_never_stands_still_is_read_until_the_deadline_with_a_note() -> None:
    from nodewright.plan.preview import SnapshotCheck

    reads = _Reads([_status(b, 1) for b in range(1, 1000)], _admitted_nodes(1))
    snap = await plan_cmd.read_snapshot(reads, "nw", clock=lambda: reads.now, sleep=reads.sleep, deadline=2.0)
    assert snap.check is SnapshotCheck.STATUS_MOVED and snap.moving
    assert reads.now >= 2.0 and snap.attempts > 1
