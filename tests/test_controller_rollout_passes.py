"""Rollout passes: only changed nodes are derived again, and the event that settles a batch is known.

Real client and HTTP against `FakeKube`; informer stores are filled by hand.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from nodewright.api import constants
from nodewright.api.admission import Admission, admission_annotation, decode_admission, encode_admission
from nodewright.api.models import Status
from nodewright.api.nodestate import NodeState, PackageEntry, PackageStage, PackageState, encode
from nodewright.controller import rollout as rollout_mod
from nodewright.controller.rollout import RolloutReconciler
from nodewright.controller.runtime import Runtime
from nodewright.kube.client import KubeClient
from nodewright.kube.informer import Informer
from nodewright.kube.resources import NODES, NODEWRIGHTS, PODS, ApiError
from nodewright.kube.trim import trim_node
from nodewright.observability.metrics import count_package_nodes
from nodewright.plan import podspec
from nodewright.plan import rollout_input as rollout_input_mod
from nodewright.plan.rollout import NewAdmission, RolloutNode, RolloutPlan, spec_fingerprint
from nodewright.plan.rollout_input import NodeEntry
from nodewright.plan.status import NodeReport, PackageReport
from tests.kubefake import FakeKube
from tests.test_controller_nodes import NS, make_runtime, nw_obj

NODES_C = ("api/v1", "", "nodes")
NW_C = ("apis/nodewright.io/v1alpha1", "", "nodewrights")


def _node(name: str, pool: str = "a") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"{name}-uid", "labels": {"pool": pool}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"bootID": "b"}},
    }


class _Env:
    def __init__(self, kube: FakeKube, rt: Runtime) -> None:
        self.kube, self.rt = kube, rt
        self.reconciler = RolloutReconciler(rt)

    def put_node(self, node: dict[str, Any]) -> None:
        self.rt.nodes.upsert(trim_node(self.kube.put(NODES_C, node)))

    def put_nodewright(self, obj: dict[str, Any]) -> None:
        self.rt.nodewrights.upsert(self.kube.put(NW_C, obj))


@pytest.fixture
async def env() -> AsyncIterator[_Env]:
    kube = await FakeKube().start()
    client = KubeClient(kube.config(), max_retries=0)
    nodes = Informer(client, NODES, transform=trim_node)
    nodewrights = Informer(client, NODEWRIGHTS)
    rt = make_runtime(client, nodes=nodes, nodewrights=nodewrights, pods=Informer(client, PODS, namespace=NS))
    try:
        yield _Env(kube, rt)
    finally:
        await rt.events.close(grace=0.1)
        await client.close()
        await kube.stop()


async def test_only_changed_nodes_are_derived_again(env: _Env, monkeypatch: pytest.MonkeyPatch) -> None:
    derived: list[str] = []
    original = rollout_input_mod.rollout_node

    def counting(ctx: Any, node: Any, **kwargs: Any) -> Any:
        derived.append(str(node["metadata"]["name"]))
        return original(ctx, node, **kwargs)

    monkeypatch.setattr(rollout_input_mod, "rollout_node", counting)
    env.put_nodewright(nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}}))
    for i in range(5):
        env.put_node(_node(f"n{i}"))
    env.put_node(_node("other", pool="b"))

    await env.reconciler.reconcile("nw")
    assert sorted(derived) == ["n0", "n1", "n2", "n3", "n4"], "unselected nodes are never derived"
    # The first pass admitted nodes (new resourceVersions): those are derived again, once.
    derived.clear()
    for name in [f"n{i}" for i in range(5)]:
        env.rt.nodes.upsert(trim_node(env.kube.get(NODES_C, name) or {}))
    await env.reconciler.reconcile("nw")
    changed = set(derived)
    derived.clear()
    await env.reconciler.reconcile("nw")
    assert derived == [], f"nothing changed, nothing derived (second pass derived {sorted(changed)})"

    node = env.kube.get(NODES_C, "n3") or {}
    node["metadata"]["labels"][constants.status_label("nw")] = "complete"
    env.put_node(node)
    await env.reconciler.reconcile("nw")
    assert derived == ["n3"]

    derived.clear()
    obj = env.kube.get(NW_C, "nw") or {}
    obj["metadata"]["generation"] = 2
    obj["spec"]["packages"]["tool"]["version"] = "1.1.0"
    env.put_nodewright(obj)
    await env.reconciler.reconcile("nw")
    assert sorted(derived) == ["n0", "n1", "n2", "n3", "n4"], "a new spec invalidates every entry"


def _rnode(name: str, status: Status, *, compartment: str = "c0", fingerprint: str = "fp") -> RolloutNode:
    return RolloutNode(
        name=name,
        labels={},
        creation_timestamp=None,
        status=status,
        needs_work=status is not Status.COMPLETE,
        admission=Admission(compartment, 1, 0, fingerprint, "2026-01-01T00:00:00Z"),
    )


async def test_the_last_node_of_a_batch_to_settle_is_recognised(env: _Env) -> None:
    open_batches = rollout_mod._open_batches(
        [
            _rnode("a", Status.IN_PROGRESS),
            _rnode("b", Status.WAITING),
            _rnode("c", Status.COMPLETE),
            _rnode("d", Status.ERRORING),
            _rnode("e", Status.IN_PROGRESS, fingerprint="old"),
            _rnode("f", Status.IN_PROGRESS, compartment="c1"),
        ],
        "fp",
    )
    assert open_batches == {"c0": {"a", "b"}, "c1": {"f"}}
    env.reconciler._open["nw"] = open_batches
    label = constants.status_label("nw")
    assert not env.reconciler.settles_batch("nw", "a", {label: "in_progress"})
    assert not env.reconciler.settles_batch("nw", "a", {label: "complete"}), "b still works"
    assert env.reconciler.settles_batch("nw", "b", {label: "erroring"}), "an erroring node settles too"
    assert env.reconciler.settles_batch("nw", "f", {label: "complete"})
    assert not env.reconciler.settles_batch("nw", "zz", {label: "complete"})
    assert not env.reconciler.settles_batch("other", "a", {label: "complete"})


def test_nodes_admitted_or_released_by_the_pass_itself_count() -> None:
    plan = RolloutPlan(
        policy_name=None,
        policy_not_found=None,
        compartments={},
        admissions=(NewAdmission("new", Admission("c2", 3, 0, "fp", "2026-01-01T00:00:00Z")),),
        releases=("a",),
        active=(),
        waiting=(),
        halts=(),
        reset_applied=False,
        next_order=0,
    )
    nodes = [_rnode("a", Status.IN_PROGRESS), _rnode("b", Status.IN_PROGRESS)]
    assert rollout_mod._open_batches(nodes, "fp", plan) == {"c0": {"b"}, "c2": {"new"}}


def test_the_rollout_debounce_keeps_passes_to_their_share_of_the_loop() -> None:
    from nodewright.controller.operator import (
        ROLLOUT_DEBOUNCE,
        ROLLOUT_DEBOUNCE_MAX,
        ROLLOUT_LOOP_SHARE,
        rollout_debounce,
    )

    assert rollout_debounce(0.0) == ROLLOUT_DEBOUNCE, "a cheap pass waits the floor"
    cost = 0.8
    delay = rollout_debounce(cost)
    assert delay > ROLLOUT_DEBOUNCE
    assert cost / (cost + delay) <= ROLLOUT_LOOP_SHARE + 1e-9
    assert rollout_debounce(60.0) == ROLLOUT_DEBOUNCE_MAX, "never longer than the cap"


async def test_the_batch_state_is_written_before_the_admissions_it_opens(env: _Env) -> None:
    """A reader that lists nodes before it reads the NodeWright (`nodewright plan`) must never see
    admissions newer than the batch state: the status write comes first in a pass."""
    env.put_nodewright(nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}}))
    for i in range(3):
        env.put_node(_node(f"n{i}"))
    await env.reconciler.reconcile("nw")
    writes = [r for r in env.kube.requests if r.method == "PATCH"]
    status_writes = [i for i, r in enumerate(writes) if r.path.endswith("/nodewrights/nw/status")]
    admission_writes = [
        i
        for i, r in enumerate(writes)
        if "/nodes/" in r.path
        and "batch.nw" in str((r.body or {}).get("metadata", {}).get("annotations", {}))
    ]
    assert status_writes and admission_writes, [r.path for r in writes]
    assert status_writes[0] < min(admission_writes)


async def test_a_deleting_nodewright_is_released_and_its_status_written_once(env: _Env) -> None:
    obj = nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}})
    obj["metadata"]["finalizers"] = [constants.FINALIZER]
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    env.put_nodewright(obj)
    env.put_node(_node("n0", pool="b"))
    await env.reconciler.reconcile("nw")
    status_writes = [r for r in env.kube.requests if r.method == "PATCH" and r.path.endswith("/status")]
    assert len(status_writes) == 1
    released = [r for r in env.kube.requests if r.method == "PATCH" and not r.path.endswith("/status")]
    assert released and released[-1].body["metadata"]["finalizers"] is None
    stored = env.kube.get(NW_C, "nw") or {}
    assert not stored["metadata"].get("finalizers")


async def test_deleting_an_invalid_nodewright_releases_nodes_and_the_finalizer(env: _Env) -> None:
    """A spec the models refuse (stored before a stricter rule) must not make its deletion hang."""
    from nodewright.controller.nodes import NodeReconciler

    env.rt.pods.add_index("node", lambda p: [podspec.pod_node(p)])
    obj = nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}})
    obj["spec"]["packages"]["tool"]["image"] = "NOT A VALID IMAGE"
    obj["metadata"]["finalizers"] = [constants.FINALIZER]
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    env.put_nodewright(obj)
    node = _node("n0")
    node["metadata"]["labels"][constants.status_label("nw")] = "complete"
    node["metadata"]["annotations"] = {constants.state_annotation("nw"): '{"v":1}'}
    env.put_node(node)
    assert await env.reconciler.reconcile("nw") is not None, "waits for the node to be released"
    await NodeReconciler(env.rt).reconcile("nw/n0")
    env.rt.nodes.upsert(trim_node(env.kube.get(NODES_C, "n0") or {}))
    env.rt.node_view.forget("n0")
    released = env.kube.get(NODES_C, "n0") or {}
    assert constants.status_label("nw") not in released["metadata"].get("labels", {})
    assert constants.state_annotation("nw") not in (released["metadata"].get("annotations") or {})
    await env.reconciler.reconcile("nw")
    assert not (env.kube.get(NW_C, "nw") or {}).get("metadata", {}).get("finalizers")


async def test_a_deleting_nodewright_admits_only_nodes_that_hold_something_of_it(env: _Env) -> None:
    """A released (or never touched) node is no candidate of a leaving NodeWright: re-admitting it
    would have the node controller release it again, batch after batch, ahead of the nodes with work."""
    obj = nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}})
    obj["spec"]["packages"]["tool"]["uninstall"] = {"enabled": True}
    obj["metadata"]["finalizers"] = [constants.FINALIZER]
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    env.put_nodewright(obj)
    installed = NodeState(
        packages=(
            PackageEntry(
                name="tool", version="1.0.0", stage=PackageStage.CONFIG, state=PackageState.COMPLETE
            ),
        ),
        generation=1,
    )
    for i in range(3):
        node = _node(f"n{i}")
        if i == 2:
            node["metadata"]["labels"][constants.status_label("nw")] = "complete"
            node["metadata"]["annotations"] = {constants.state_annotation("nw"): encode(installed)}
        env.put_node(node)
    await env.reconciler.reconcile("nw")
    admitted = {
        r.path.rsplit("/", 1)[-1]
        for r in env.kube.requests
        if r.method == "PATCH"
        and "/nodes/" in r.path
        and admission_annotation("nw") in ((r.body or {}).get("metadata", {}).get("annotations") or {})
        and (r.body or {})["metadata"]["annotations"][admission_annotation("nw")] is not None
    }
    assert admitted == {"n2"}, admitted


async def test_a_finalizer_already_released_and_a_vanished_node_are_not_errors(env: _Env) -> None:
    """An earlier pass released the finalizer (the object is gone, its watch event not here yet), and a
    node deleted between plan and write: both are answers, not reconcile failures."""
    meta = {"name": "gone", "finalizers": [constants.FINALIZER], "resourceVersion": "7"}
    await env.reconciler._release_finalizer("gone", meta, "finalizer released")
    assert await env.reconciler._annotate_node("no-such-node", admission_annotation("nw"), None) is False


def _state_node(name: str, *entries: PackageEntry, status: str) -> dict[str, Any]:
    node = _node(name)
    node["metadata"]["labels"][constants.status_label("nw")] = status
    state = NodeState(packages=entries, boot_id="b", generation=1)
    node["metadata"]["annotations"] = {constants.state_annotation("nw"): encode(state)}
    return node


def _reachable(root: object, *, skip: set[int]) -> list[object]:
    """The data reachable from `root` (through the garbage collector's referents), `skip` excepted;
    classes are not followed (through them, and their modules, everything is reachable)."""
    seen: set[int] = set()
    todo, out = [root], []
    while todo:
        obj = todo.pop()
        if id(obj) in seen or id(obj) in skip or isinstance(obj, type):
            continue
        seen.add(id(obj))
        out.append(obj)
        todo.extend(gc.get_referents(obj))
    return out


async def test_the_memo_keeps_no_decoded_state_and_shares_equal_package_reports(env: _Env) -> None:
    """The memo lives as long as the NodeWright, one entry per node: it keeps what later phases read
    (reports, the oldest stage start), never the decoded annotation, and one copy of equal reports."""
    env.put_nodewright(nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}}))
    done = PackageEntry(
        name="tool",
        version="1.0.0",
        stage=PackageStage.CONFIG,
        state=PackageState.COMPLETE,
        started="2026-01-01T00:00:00Z",
        config=(("key", "abcd1234"),),
    )
    for name in ("n0", "n1"):
        env.put_node(_state_node(name, done, status="complete"))
    busy = PackageEntry(
        name="tool",
        version="1.0.0",
        stage=PackageStage.APPLY,
        state=PackageState.IN_PROGRESS,
        started="2026-01-01T00:10:00Z",
    )
    env.put_node(_state_node("n2", busy, status="in_progress"))
    await env.reconciler.reconcile("nw")

    entries = env.reconciler._memo["nw"].entries
    assert sorted(entries) == ["n0", "n1", "n2"]
    for entry in entries.values():
        rnode = entry.entry.rollout
        assert entry.view is not None and rnode is not None and entry.report is not None
        assert not hasattr(entry.view, "state")
        assert rnode.labels is entry.view.node["metadata"]["labels"], "labels are not copied"
        held = _reachable(entry, skip={id(entry.view.node)})
        decoded = [o for o in held if isinstance(o, NodeState | PackageEntry)]
        assert decoded == [], f"{rnode.name}: the memo holds decoded state {decoded}"
    complete = [entries[n].report for n in ("n0", "n1")]
    assert complete[0] is not None and complete[1] is not None
    assert complete[0].packages is complete[1].packages, "equal package reports are one object"
    assert complete[0].packages[0].config != "", "the config digest is reported"

    snapshot = env.rt.metrics.domain._snapshots["nw"]
    assert snapshot.oldest_stage_started_at == datetime(2026, 1, 1, 0, 10, tzinfo=UTC)
    assert snapshot.package_nodes == count_package_nodes(
        [("tool", "1.0.0", "config", "complete")] * 2 + [("tool", "1.0.0", "apply", "in_progress")]
    )


def test_the_shared_reports_stay_bounded_by_what_the_entries_use() -> None:
    memo = rollout_mod._Memo()
    for i in range(200):  # states nodes passed through and left again
        memo.shared.share([PackageReport(name="tool", version=f"0.{i}", stage="apply", state="complete")])
    kept = (PackageReport(name="tool", version="1.0", stage="config", state="complete"),)
    memo.entries = {
        "n0": rollout_mod._NodeEntry(
            "1",
            NodeEntry("n0", matched=True),
            report=NodeReport(name="n0", status=Status.COMPLETE, packages=kept),
        )
    }
    memo.prune_shared()
    assert len(memo.shared) == 2, "only the report and tuple an entry uses are kept"
    assert memo.shared.share(list(kept)) is kept, "a node reaching the kept state shares the entry's reports"


async def test_a_batch_bigger_than_the_pass_limit_is_admitted_over_several_passes(
    env: _Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.rt.options = replace(env.rt.options, admissions_per_pass=2)
    sent: list[str] = []

    async def capture(_name: str, spec: Any) -> None:
        sent.append(spec.message)

    monkeypatch.setattr(env.reconciler, "_event", capture)
    env.put_nodewright(nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}}, interruptionBudget={"count": 5}))
    for i in range(6):
        env.put_node(_node(f"n{i}"))
    key = admission_annotation("nw")

    def admitted() -> list[str]:
        return sorted(
            name
            for name in (f"n{i}" for i in range(6))
            if key in ((env.kube.get(NODES_C, name) or {})["metadata"].get("annotations") or {})
        )

    results = []
    for _ in range(3):
        results.append(await env.reconciler.reconcile("nw"))
        env.rt.nodewrights.upsert(env.kube.get(NW_C, "nw") or {})
    assert admitted() == ["n0", "n1", "n2", "n3", "n4"], "one batch of 5, two admissions per pass"
    assert [r.requeue_after if r else None for r in results[:2]] == [rollout_mod.FILL_REQUEUE] * 2
    assert results[2] is not None and results[2].requeue_after != rollout_mod.FILL_REQUEUE
    assert [m for m in sent if "batch" in m] == [
        "Compartment [__default__] batch 1 started: 5 node(s), the first 2: n0, n1"
    ]
    status = (env.kube.get(NW_C, "nw") or {})["status"]
    state = status["compartmentStatuses"]["__default__"]["batchState"]
    assert (state["plannedSize"], state["admittedSize"], state["currentBatch"]) == (5, 5, 1)
    assert await env.reconciler.reconcile("nw") is not None
    assert admitted() == ["n0", "n1", "n2", "n3", "n4"], "the whole batch is in flight: nothing more"


async def test_the_first_status_of_a_new_generation_is_not_ready_before_its_nodes_work(env: _Env) -> None:
    """Issue 29 item 1 (kstatus): after a spec edit, the status labels still say `complete` until the
    node controller has planned the nodes again. The first status written for generation N must not say
    Ready=True with observedGeneration N: Argo CD, Flux and `kubectl wait --for=condition=Ready` would
    return before the change has even started."""
    env.put_nodewright(nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}}))
    done = PackageEntry(
        name="tool",
        version="1.0.0",
        stage=PackageStage.CONFIG,
        state=PackageState.COMPLETE,
        started="2026-01-01T00:00:00Z",
    )
    for name in ("n0", "n1", "n2"):
        env.put_node(_state_node(name, done, status="complete"))
    await env.reconciler.reconcile("nw")
    first = (env.kube.get(NW_C, "nw") or {})["status"]
    ready = {c["type"]: c for c in first["conditions"]}["Ready"]
    assert (first["observedGeneration"], ready["status"], first["status"]) == (1, "True", "complete")

    obj = env.kube.get(NW_C, "nw") or {}
    obj["metadata"]["generation"] = 2
    obj["spec"]["packages"]["tool"]["version"] = "1.1.0"
    env.put_nodewright(obj)
    await env.reconciler.reconcile("nw")
    status = (env.kube.get(NW_C, "nw") or {})["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert status["observedGeneration"] == 2
    assert conditions["Ready"]["status"] == "False", conditions["Ready"]
    assert conditions["Ready"]["observedGeneration"] == 2
    assert conditions["Reconciling"]["status"] == "True", conditions["Reconciling"]
    assert status["status"] != "complete", status["status"]
    assert status["completeNodes"] == "0/3", "no node has completed generation 2 yet"


async def test_runtime_taint_held_names_the_nodes_it_holds(env: _Env) -> None:
    """Issue 29 item 7: `RuntimeTaintHeld` said "7 node(s) keep the runtime-required taint" without saying
    which; like the other aggregate conditions it names the first few (sorted) and how many more."""
    obj = nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}}, runtimeRequired=True)
    obj["metadata"]["annotations"] = {constants.ANNOTATION_PAUSE: "true"}
    env.put_nodewright(obj)
    taint = {"key": constants.DEFAULT_RUNTIME_REQUIRED_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
    for i in range(7):
        node = _node(f"n{i}")
        node["spec"]["taints"] = [taint]
        env.put_node(node)
    env.put_node(_node("free"))  # not tainted: not held
    await env.reconciler.reconcile("nw")
    status = (env.kube.get(NW_C, "nw") or {})["status"]
    held = {c["type"]: c for c in status["conditions"]}["RuntimeTaintHeld"]
    assert (held["status"], held["reason"]) == ("True", "HeldWhileInactive"), held
    message = held["message"]
    assert message.startswith("7 node(s) keep the runtime-required taint"), message
    assert "n0, n1, n2, n3, n4 and 2 more" in message, message
    assert "free" not in message and "n5" not in message, message
    assert "resume or enable it" in message, message


def _complete(nw: str, package: str, version: str) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) of a node where `nw` completed `package` at `version`."""
    entry = PackageEntry(package, version, PackageStage.CONFIG, PackageState.COMPLETE)
    return (
        {constants.status_label(nw): "complete"},
        {constants.state_annotation(nw): encode(NodeState(packages=(entry,)))},
    )


def _lagging_infra(**spec: Any) -> dict[str, Any]:
    """`infra`, earlier by priority, just edited to base 2.0.0 (every node still completed 1.0.0)."""
    infra = nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}}, priority=10, **spec)
    infra["metadata"] = {**infra["metadata"], "name": "infra", "uid": "infra-uid", "generation": 2}
    infra["spec"]["packages"] = {"base": {"version": "2.0.0", "image": "ghcr.io/x/base"}}
    return infra


async def test_a_later_nodewright_admits_no_node_where_an_earlier_one_lags_its_spec_edit(env: _Env) -> None:
    """Both edited together: n0's label still says `infra: complete` from 1.0.0; n1 completed 2.0.0."""
    env.put_nodewright(_lagging_infra())
    env.put_nodewright(nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}}))
    for name, version in (("n0", "1.0.0"), ("n1", "2.0.0")):
        node = _node(name)
        labels, annotations = _complete("infra", "base", version)
        node["metadata"]["labels"].update(labels)
        node["metadata"]["annotations"] = annotations
        env.put_node(node)
    await env.reconciler.reconcile("nw")
    admitted = {
        name
        for name in ("n0", "n1")
        if admission_annotation("nw")
        in ((env.kube.get(NODES_C, name) or {})["metadata"].get("annotations") or {})
    }
    assert admitted == {"n1"}
    status = (env.kube.get(NW_C, "nw") or {})["status"]
    assert status["waitingReasons"].get("WaitingForPriority") == 1, status["waitingReasons"]


async def test_the_runtime_taint_stays_while_a_runtime_required_nodewright_lags_its_spec_edit(
    env: _Env,
) -> None:
    """`nw` is complete on n0 and `infra` says `complete` there, but from before its edit: n0 is not
    configured for infra's current spec, so it stays unschedulable; once infra completed 2.0.0 it is freed."""
    env.put_nodewright(_lagging_infra(runtimeRequired=True))
    env.put_nodewright(nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}}, runtimeRequired=True))
    taint = {"key": constants.DEFAULT_RUNTIME_REQUIRED_TAINT_KEY, "value": "true", "effect": "NoSchedule"}

    def put(infra_version: str) -> None:
        node = env.kube.get(NODES_C, "n0") or _node("n0")
        node["spec"]["taints"] = [taint]
        for labels, notes in (
            _complete("nw", "tool", "1.0.0"),
            _complete("infra", "base", infra_version),
        ):
            node["metadata"]["labels"].update(labels)
            node["metadata"].setdefault("annotations", {}).update(notes)
        env.put_node(node)

    put("1.0.0")
    await env.reconciler.reconcile("nw")
    assert (env.kube.get(NODES_C, "n0") or {})["spec"].get("taints") == [taint]
    put("2.0.0")
    await env.reconciler.reconcile("nw")
    assert not (env.kube.get(NODES_C, "n0") or {})["spec"].get("taints")


async def test_a_spec_that_comes_back_gets_its_own_epoch_and_dead_admissions_are_removed(env: _Env) -> None:
    """The status names another fingerprint (the spec went v1 -> v2 and is back at v1): the pass starts
    a new epoch above the v1 admissions on the nodes, removes the v1 admission that never started its
    node, and admits that node again in the new epoch (`plan.rollout_epoch`)."""
    obj = nw_obj(interruptionBudget={"count": 1})
    model = env.rt.models.nodewright(obj)[0]
    assert model is not None
    fingerprint = spec_fingerprint(model)
    obj["status"] = {"rolloutFingerprint": "0000000000000000", "nextOrder": 40}
    env.put_nodewright(obj)
    dead = _node("n0")
    old = Admission("__default__", 3, 7, fingerprint, "2026-01-01T00:00:00Z")
    dead["metadata"]["annotations"] = {admission_annotation("nw"): encode_admission(old)}
    env.put_node(dead)

    await env.reconciler.reconcile("nw")

    status = (env.kube.get(NW_C, "nw") or {})["status"]
    assert status["rolloutFingerprint"] == fingerprint and status["rolloutFirstOrder"] == 8
    written = (env.kube.get(NODES_C, "n0") or {})["metadata"]["annotations"][admission_annotation("nw")]
    fresh = decode_admission(written)
    assert (fresh.order, fresh.batch, fresh.consumed) == (8, 1, False)


def _admitted(env: _Env, names: list[str]) -> list[str]:
    key = admission_annotation("nw")
    return [
        name
        for name in names
        if key in ((env.kube.get(NODES_C, name) or {})["metadata"].get("annotations") or {})
    ]


async def test_admission_writes_overlap_up_to_the_limit_in_plan_order(
    env: _Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33: a batch's admissions are written `--admission-writers` at a time (one at a time left
    a 333-node batch opening at ~5 nodes/s), started in the plan's order, each node enqueued on the
    start lane as soon as its write landed; a node gone meanwhile (404) is skipped as before."""
    env.rt.options = replace(env.rt.options, admission_writers=3)
    started: list[str] = []
    in_flight = peak = 0
    original = env.rt.client.patch_node_metadata

    async def patch(node: str, **kwargs: Any) -> Any:
        nonlocal in_flight, peak
        started.append(node)
        in_flight += 1
        peak = max(peak, in_flight)
        for _ in range(3):
            await asyncio.sleep(0)  # the other writers get to start theirs
        in_flight -= 1
        return await original(node, **kwargs)

    monkeypatch.setattr(env.rt.client, "patch_node_metadata", patch)
    starts: list[str] = []
    env.rt.enqueue_node_start = lambda _nw, node: starts.append(node)
    env.put_nodewright(nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}}, interruptionBudget={"count": 7}))
    names = [f"n{i}" for i in range(7)]
    for name in names:
        env.put_node(_node(name))
    env.kube.silent_remove(NODES_C, "n4")  # gone from the API server, still in the cache: a 404
    await env.reconciler.reconcile("nw")
    assert started == names, "every admission written, in the plan's order"
    assert peak == 3, "three writes in flight at once"
    assert sorted(starts) == ["n0", "n1", "n2", "n3", "n5", "n6"], "the gone node is skipped"
    assert _admitted(env, [n for n in names if n != "n4"]) == ["n0", "n1", "n2", "n3", "n5", "n6"]


async def test_a_failed_admission_write_keeps_those_in_flight_and_fails_the_pass(
    env: _Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails (not a 404) stops new admission writes; the ones already in flight land, are
    recorded and enqueued, and the pass then fails (retried by the queue)."""
    env.rt.options = replace(env.rt.options, admission_writers=3)
    original = env.rt.client.patch_node_metadata

    async def patch(node: str, **kwargs: Any) -> Any:
        await asyncio.sleep(0)
        if node == "n1":
            raise ApiError(500, "InternalError", "etcd leader changed")
        await asyncio.sleep(0)
        return await original(node, **kwargs)

    monkeypatch.setattr(env.rt.client, "patch_node_metadata", patch)
    starts: list[str] = []
    env.rt.enqueue_node_start = lambda _nw, node: starts.append(node)
    env.put_nodewright(nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}}, interruptionBudget={"count": 6}))
    names = [f"n{i}" for i in range(6)]
    for name in names:
        env.put_node(_node(name))
    with pytest.raises(ApiError, match="etcd leader changed"):
        await env.reconciler.reconcile("nw")
    assert _admitted(env, names) == ["n0", "n2"], "the writes in flight with the failed one landed"
    assert sorted(starts) == ["n0", "n2"]
    key = admission_annotation("nw")
    seen = [n for n in names if key in ((env.rt.node_view.get(n) or {})["metadata"].get("annotations") or {})]
    assert seen == ["n0", "n2"], "the landed writes are in the write-through view for the next pass"

    monkeypatch.setattr(env.rt.client, "patch_node_metadata", original)
    env.rt.nodewrights.upsert(env.kube.get(NW_C, "nw") or {})
    assert await env.reconciler.reconcile("nw") is not None
    # As with a crash between the status and the admissions (docs/rollout.md, "Long batches"): the
    # admissions not written are lost to this batch, which settles smaller; the nodes wait for the next.
    assert _admitted(env, names) == ["n0", "n2"]
