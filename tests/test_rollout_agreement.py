"""`kubectl nodewright why` and `nodewright plan` agree with what the rollout controller does.

The three used to assemble the rollout planner's input each in their own way, and the copies drifted:
`why` planned more admissions per pass than the controller, ignored per-compartment resets and
approvals, and `plan` batched nodes whose state annotation does not decode. Now all three build it with
`plan.rollout_input.rollout_input`; these tests run the real rollout controller
(`controller.rollout.RolloutReconciler`, over the real client and an in-memory API server) on the same
objects the plugin and the preview read, and compare:

- named regressions: each measured disagreement, as a scenario;
- a property test over generated fleets (node states, labels, admissions, cordons, taints, NotReady,
  another NodeWright earlier by priority), policies and NodeWright annotations (pause, disable, reset,
  approval) and persisted batch states: `why`'s answer for every node agrees with the decision of the
  controller's pass (who is admitted into which batch, who is released, how many wait for what), and
  `plan`'s predicted batches are the batches the controller opens, pass after pass, when every node it
  admits completes.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodewright.api import constants
from nodewright.api.admission import admission_annotation, decode_admission, encode_admission
from nodewright.api.modelcache import ModelCache
from nodewright.api.models import DeploymentPolicy, NodeWright
from nodewright.api.nodeobject import node_facts
from nodewright.api.nodestate import NodeState, PackageEntry, PackageStage, PackageState, encode
from nodewright.api.reasons import UntoleratedTaints
from nodewright.cli import plan_cmd
from nodewright.cli.plugin import explain
from nodewright.cli.plugin.cluster import ClusterState
from nodewright.controller.expectations import PodExpectations
from nodewright.controller.options import OperatorOptions
from nodewright.controller.rollout import RolloutReconciler
from nodewright.controller.runtime import EventRecorder, Runtime
from nodewright.controller.signing import PodSigner
from nodewright.kube.client import KubeClient
from nodewright.kube.informer import Informer
from nodewright.kube.resources import DEPLOYMENTPOLICIES, NODES, NODEWRIGHTS, PODS
from nodewright.kube.trim import trim_node
from nodewright.kube.writethrough import WriteThrough
from nodewright.observability.metrics import OperatorMetrics
from nodewright.observability.tracing import RolloutTracer
from nodewright.plan.rollout import spec_fingerprint
from nodewright.plan.rollout_input import RolloutOptions, blocked, node_context
from tests.kubefake import FakeKube

JSON = dict[str, Any]
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NOW_TEXT = "2026-03-01T12:00:00Z"
NS = "nodewright-system"
NODES_C = ("api/v1", "", "nodes")
NW_C = ("apis/nodewright.io/v1alpha1", "", "nodewrights")
POLICY_C = ("apis/nodewright.io/v1alpha1", "", "deploymentpolicies")
DEFAULT = constants.DEFAULT_COMPARTMENT


# ----------------------------------------------------------------------------------------------------
# Objects


def node_obj(name: str, i: int, *, zone: str = "") -> JSON:
    labels = {"pool": "gpu", "kubernetes.io/hostname": name}
    if zone:
        labels["topology.kubernetes.io/zone"] = zone
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"{name}-uid",
            "creationTimestamp": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z",
            "labels": labels,
            "annotations": {},
        },
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"bootID": "b0"}},
    }


def nodewright_obj(
    name: str = "nw",
    *,
    annotations: JSON | None = None,
    status: JSON | None = None,
    priority: int | None = None,
    **spec: Any,
) -> JSON:
    body: JSON = {
        "nodeSelectors": {"matchLabels": {"pool": "gpu"}},
        "packages": {"tool": {"version": "1.0.0", "image": "ghcr.io/example/tool"}},
        **spec,
    }
    if priority is not None:
        body["priority"] = priority
    return {
        "apiVersion": constants.API_VERSION,
        "kind": "NodeWright",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "generation": 1,
            "resourceVersion": "1",
            "annotations": dict(annotations or {}),
        },
        "spec": body,
        **({"status": status} if status else {}),
    }


def policy_obj(strategy: JSON, budget: int, pause_after: Sequence[int] = ()) -> JSON:
    default: JSON = {"budget": {"count": budget}, "strategy": strategy}
    if pause_after:
        default["pauseAfterBatch"] = list(pause_after)
    return {
        "apiVersion": constants.API_VERSION,
        "kind": "DeploymentPolicy",
        "metadata": {"name": "pol", "resourceVersion": "1"},
        "spec": {"default": default},
    }


def fingerprint_of(nw: JSON) -> str:
    return spec_fingerprint(NodeWright.model_validate(nw))


def state_text(version: str, state: PackageState, *, cordoned: bool = False) -> str:
    stage = PackageStage.CONFIG if state is PackageState.COMPLETE else PackageStage.APPLY
    entry = PackageEntry(name="tool", version=version, stage=stage, state=state, started=NOW_TEXT)
    return encode(NodeState(packages=(entry,), cordoned=cordoned, generation=1))


def admission_text(fingerprint: str, *, batch: int = 1, order: int = 0, consumed: bool = False) -> str:
    from nodewright.api.admission import Admission

    return encode_admission(Admission(DEFAULT, batch, order, fingerprint, "2026-03-01T11:00:00Z", consumed))


def cluster_state(
    nodes: Sequence[JSON], nodewrights: Sequence[JSON], policies: Sequence[JSON]
) -> ClusterState:
    cache = ModelCache()
    models: dict[str, NodeWright] = {}
    for obj in nodewrights:
        model, error = cache.nodewright(obj)
        assert model is not None, error
        models[model.metadata.name] = model
    parsed = {str(p["metadata"]["name"]): cache.policy_or_problems(p) for p in policies}
    return ClusterState(
        nodes=[dict(n) for n in nodes],
        nodewright_objects=list(nodewrights),
        nodewrights=models,
        invalid={},
        policies={k: v for k, v in parsed.items() if isinstance(v, DeploymentPolicy)},
        policy_objects={str(p["metadata"]["name"]): p for p in policies},
        now=NOW,
    )


# ----------------------------------------------------------------------------------------------------
# The rollout controller over an in-memory API server


@dataclass
class Controller:
    kube: FakeKube
    rt: Runtime
    reconciler: RolloutReconciler
    nodes: list[str] = field(default_factory=list)

    def put_node(self, obj: JSON) -> None:
        self.rt.nodes.upsert(trim_node(self.kube.put(NODES_C, obj)))

    def node(self, name: str) -> JSON:
        found = self.kube.get(NODES_C, name)
        assert found is not None
        return found

    def nodewright(self, name: str = "nw") -> JSON:
        found = self.kube.get(NW_C, name)
        assert found is not None
        return found

    def admissions(self) -> dict[str, str]:
        key = admission_annotation("nw")
        out = {}
        for name in self.nodes:
            text = (self.node(name)["metadata"].get("annotations") or {}).get(key)
            if text is not None:
                out[name] = text
        return out

    async def rollout_pass(self) -> None:
        await self.reconciler.reconcile("nw")


@asynccontextmanager
async def controller(
    nodes: Sequence[JSON], nodewrights: Sequence[JSON], policies: Sequence[JSON], *, per_pass: int
) -> AsyncIterator[Controller]:
    kube = await FakeKube().start()
    client = KubeClient(kube.config(), max_retries=0)
    node_informer = Informer(client, NODES, transform=trim_node)
    nw_informer = Informer(client, NODEWRIGHTS)
    policy_informer = Informer(client, DEPLOYMENTPOLICIES)
    rt = Runtime(
        client=client,
        options=OperatorOptions(namespace=NS, admissions_per_pass=per_pass),
        nodewrights=nw_informer,
        policies=policy_informer,
        nodes=node_informer,
        pods=Informer(client, PODS, namespace=NS),
        models=ModelCache(),
        node_view=WriteThrough(node_informer, trim_node),
        nodewright_view=WriteThrough(nw_informer),
        signer=PodSigner(b"k" * 32),
        metrics=OperatorMetrics(),
        tracer=RolloutTracer(),
        events=EventRecorder(client, clock=lambda: NOW, instance="test"),
        clock=lambda: NOW,
        pod_expectations=PodExpectations(),
    )
    env = Controller(kube, rt, RolloutReconciler(rt), [str(n["metadata"]["name"]) for n in nodes])
    for obj in nodewrights:
        nw_informer.upsert(kube.put(NW_C, json.loads(json.dumps(obj))))
    for obj in policies:
        policy_informer.upsert(kube.put(POLICY_C, json.loads(json.dumps(obj))))
    for obj in nodes:
        env.put_node(json.loads(json.dumps(obj)))
    try:
        yield env
    finally:
        await rt.events.close(grace=0.1)
        await client.close()
        await kube.stop()


def new_admissions(
    before: dict[str, str], after: dict[str, str], fingerprint: str
) -> dict[str, tuple[str, int]]:
    """(compartment, batch) of every admission this pass wrote for `fingerprint`."""
    out = {}
    for name, text in after.items():
        if before.get(name) == text:
            continue
        adm = decode_admission(text)
        if adm.fingerprint == fingerprint and not adm.consumed:
            out[name] = (adm.compartment, adm.batch)
    return out


def finish_admitted(env: Controller, fingerprint: str) -> None:
    """What the node controller does, as `plan.preview` replays it: every node admitted for the current
    spec completes it (state, label, admission consumed, one write); work in flight under an older
    admission ends and leaves the node waiting for a fresh one."""
    label_key = constants.status_label("nw")
    state_key = constants.state_annotation("nw")
    adm_key = admission_annotation("nw")
    for name in env.nodes:
        node = env.node(name)
        meta = node["metadata"]
        labels, annotations = meta.setdefault("labels", {}), meta.setdefault("annotations", {})
        adm = decode_admission(annotations[adm_key]) if adm_key in annotations else None
        current = adm is not None and adm.fingerprint == fingerprint
        if current and adm is not None and not adm.consumed and labels.get(label_key) != "blocked":
            if _malformed(annotations.get(state_key)):
                continue
            annotations[state_key] = state_text("1.0.0", PackageState.COMPLETE)
            labels[label_key] = "complete"
            annotations[adm_key] = admission_text(
                fingerprint, batch=adm.batch, order=adm.order, consumed=True
            )
        elif labels.get(label_key) == "in_progress" and not current:
            labels[label_key] = "waiting"
            if not _malformed(annotations.get(state_key)):
                # The run ends (an earlier version stays): a state still showing a run of the current
                # spec in flight would be a node the planner counts in progress until it resumes it
                # (`plan.rollout.status_for_spec`), which this stand-in never does.
                annotations[state_key] = state_text("0.9.0", PackageState.COMPLETE)
        else:
            continue
        env.put_node(node)


def _malformed(text: str | None) -> bool:
    from nodewright.api.nodestate import MalformedNodeState, decode

    if text is None:
        return False
    try:
        decode(text)
    except MalformedNodeState:
        return True
    return False


# ----------------------------------------------------------------------------------------------------
# The measured disagreements


def fleet(count: int) -> list[JSON]:
    return [node_obj(f"n{i}", i) for i in range(1, count + 1)]


async def test_why_admits_no_more_nodes_in_a_pass_than_the_controller() -> None:
    """40 new nodes, a first batch of 40, 32 admissions per pass: the controller admits 32 now and the
    other 8 in its next pass; `why n39` used to answer AdmittedNow."""
    nodes = fleet(40)
    nw = nodewright_obj(interruptionBudget={"count": 40})
    analysis = explain.analyse(cluster_state(nodes, [nw], []), "nw")
    async with controller(nodes, [nw], [], per_pass=32) as env:
        before = env.admissions()
        await env.rollout_pass()
        admitted = new_admissions(before, env.admissions(), fingerprint_of(nw))
    assert len(admitted) == 32
    assert set(analysis.admitted_now) == set(admitted)
    answer = explain.explain(analysis, "n39")
    assert "n39" not in admitted
    assert answer.reason == "NotYetInBatch", answer
    assert "next pass" in answer.summary + " ".join(answer.details)


async def test_why_after_a_compartment_reset_admits_like_the_controller() -> None:
    """`kubectl nodewright policy reset NW --compartment __default__` on a halted compartment: the
    controller's next pass admits n1; `why n1` used to keep answering CompartmentHalted."""
    nodes = fleet(3)
    halted = {
        "matched": 3,
        "ceiling": 1,
        "batchState": {"currentBatch": 3, "consecutiveFailures": 2, "shouldStop": True},
    }
    nw = nodewright_obj(
        annotations={constants.ANNOTATION_RESET_BATCH: DEFAULT},
        status={"compartmentStatuses": {DEFAULT: halted}},
        interruptionBudget={"count": 1},
    )
    answer = explain.explain(explain.analyse(cluster_state(nodes, [nw], []), "nw"), "n1")
    async with controller(nodes, [nw], [], per_pass=32) as env:
        before = env.admissions()
        await env.rollout_pass()
        admitted = new_admissions(before, env.admissions(), fingerprint_of(nw))
    assert set(admitted) == {"n1"}
    assert answer.reason == "AdmittedNow", answer


async def test_why_counts_an_approval_like_the_controller() -> None:
    """A `pauseAfterBatch` gate approved with `nodewright.io/approve`: the controller opens the next
    batch; `why` passed no approvals and kept answering AwaitingApproval."""
    nodes = fleet(3)
    done = {
        "matched": 3,
        "ceiling": 1,
        "batchState": {"currentBatch": 2, "lastSettledBatch": 1, "settledAt": "2026-03-01T11:00:00Z"},
    }
    nw = nodewright_obj(
        annotations={"nodewright.io/approve": f"{DEFAULT}=1"},
        status={"compartmentStatuses": {DEFAULT: done}},
        deploymentPolicy="pol",
    )
    pol = policy_obj({"fixed": {"initialBatch": 1}}, 1, pause_after=[1])
    first = nodes[0]
    first["metadata"]["annotations"][constants.state_annotation("nw")] = state_text(
        "1.0.0", PackageState.COMPLETE
    )
    first["metadata"]["annotations"][admission_annotation("nw")] = admission_text(
        fingerprint_of(nw), consumed=True
    )
    first["metadata"]["labels"][constants.status_label("nw")] = "complete"
    answer = explain.explain(explain.analyse(cluster_state(nodes, [nw], [pol]), "nw"), "n2")
    async with controller(nodes, [nw], [pol], per_pass=32) as env:
        before = env.admissions()
        await env.rollout_pass()
        admitted = new_admissions(before, env.admissions(), fingerprint_of(nw))
    assert set(admitted) == {"n2"}
    assert answer.reason == "AdmittedNow", answer


def test_plan_counts_an_unreadable_state_as_blocked_like_the_controller() -> None:
    """A node whose state annotation does not decode: the controller counts it blocked (nothing starts
    on it); `nodewright plan` used to count it as pending work and put it in a batch."""
    nodes = fleet(3)
    nodes[0]["metadata"]["annotations"][constants.state_annotation("nw")] = "{not json"
    nw = NodeWright.model_validate(nodewright_obj(interruptionBudget={"count": 3}))
    report = plan_cmd.build_report(nw, policy=None, nodes=nodes, now=NOW)
    batched = {n for c in report.preview.compartments for b in c.batches for n in b.nodes}
    assert batched == {"n2", "n3"}
    assert report.malformed_states == ("n1",)
    assert report.node_statuses == {"blocked": 1, "waiting": 2}
    assert any(b.reason.startswith("Blocked(StateMalformed") for b in report.preview.blockers)


def test_one_node_facts_reads_kernel_os_and_keyless_taints() -> None:
    """`node_facts` was written twice; the rollout controller's copy lacked kernel and OS image and
    turned a missing taint key into the string "None"."""
    node = node_obj("n1", 1)
    node["status"]["nodeInfo"].update({"kernelVersion": "6.8.0", "osImage": "Ubuntu 24.04"})
    node["spec"]["taints"] = [{"effect": "NoSchedule", "value": "v"}]
    facts = node_facts(node)
    assert (facts.kernel, facts.os_image) == ("6.8.0", "Ubuntu 24.04")
    assert facts.taints[0].key == ""
    nw = NodeWright.model_validate(nodewright_obj())
    block = blocked(node_context(nw, now=NOW), node)
    assert isinstance(block, UntoleratedTaints) and block.taints[0].key == ""
    assert "None" not in block.describe()


# ----------------------------------------------------------------------------------------------------
# The property: generated fleets


@dataclass(frozen=True)
class Scenario:
    nodes: list[JSON]
    nodewrights: list[JSON]
    policies: list[JSON]
    per_pass: int

    @property
    def nw(self) -> JSON:
        return self.nodewrights[0]


KINDS = ("fresh", "fresh", "done", "old", "erroring", "running", "carryover", "admitted", "malformed")


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    count = draw(st.integers(1, 9))
    use_policy = draw(st.booleans())
    annotations: JSON = {}
    if draw(st.integers(0, 9)) == 0:
        annotations[constants.ANNOTATION_PAUSE] = "true"
    if draw(st.integers(0, 14)) == 0:
        annotations[constants.ANNOTATION_DISABLE] = "true"
    reset = draw(st.sampled_from(["", "", "true", DEFAULT]))
    if reset:
        annotations[constants.ANNOTATION_RESET_BATCH] = reset
    if draw(st.booleans()):
        annotations["nodewright.io/approve"] = f"{DEFAULT}={draw(st.integers(1, 2))}"
    batch_state = draw(
        st.sampled_from(
            [
                None,
                {"currentBatch": 2, "consecutiveFailures": 2, "shouldStop": True},
                {"currentBatch": 2, "lastSettledBatch": 1, "settledAt": "2026-03-01T11:00:00Z"},
                {"currentBatch": 1, "plannedSize": 3, "admittedSize": 1},
            ]
        )
    )
    status = (
        {"compartmentStatuses": {DEFAULT: {"matched": count, "ceiling": 1, "batchState": batch_state}}}
        if batch_state
        else None
    )
    spec: JSON = (
        {"deploymentPolicy": "pol"}
        if use_policy
        else {"interruptionBudget": {"count": draw(st.integers(1, 4))}}
    )
    nw = nodewright_obj(annotations=annotations, status=status, **spec)
    fingerprint = fingerprint_of(nw)
    policies = []
    if use_policy:
        strategy = draw(
            st.sampled_from(
                [
                    {"fixed": {"initialBatch": 1}},
                    {"fixed": {"initialBatch": 2, "batchThreshold": 100}},
                    {"linear": {"initialBatch": 1, "delta": 1}},
                    {"exponential": {"initialBatch": 1, "growthFactor": 2}},
                ]
            )
        )
        policies.append(policy_obj(strategy, draw(st.integers(1, 4)), draw(st.sampled_from([(), (1,)]))))
    early = draw(st.booleans())
    others = (
        [
            nodewright_obj(
                "early",
                priority=100,
                annotations={constants.ANNOTATION_PAUSE: "true"} if draw(st.booleans()) else {},
            )
        ]
        if early
        else []
    )
    nodes = []
    for i in range(1, count + 1):
        node = node_obj(f"n{i}", i, zone=draw(st.sampled_from(["", "a", "b"])))
        meta = node["metadata"]
        labels, ann = meta["labels"], meta["annotations"]
        kind = draw(st.sampled_from(KINDS))
        label = constants.status_label("nw")
        state_key, adm_key = constants.state_annotation("nw"), admission_annotation("nw")
        if kind == "done":
            ann[state_key] = state_text("1.0.0", PackageState.COMPLETE)
            labels[label] = "complete"
        elif kind == "old":
            ann[state_key] = state_text("0.9.0", PackageState.COMPLETE)
            labels[label] = "complete"
        elif kind == "erroring":
            ann[state_key] = state_text("1.0.0", PackageState.ERRORING)
            labels[label] = "erroring"
            if draw(st.booleans()):
                ann[adm_key] = admission_text(fingerprint, order=i, consumed=True)
        elif kind == "running":
            ann[state_key] = state_text("1.0.0", PackageState.IN_PROGRESS)
            labels[label] = "in_progress"
            ann[adm_key] = admission_text(fingerprint, order=i)
        elif kind == "carryover":
            ann[state_key] = state_text("1.0.0", PackageState.IN_PROGRESS)
            labels[label] = "in_progress"
            ann[adm_key] = admission_text("0ld0ld0ld0ld0ld0", order=i)
        elif kind == "admitted":
            ann[adm_key] = admission_text(fingerprint, order=i)
        elif kind == "malformed":
            ann[state_key] = "{not json"
        extra = draw(st.sampled_from(["", "", "", "", "notready", "cordoned", "ignored", "tainted", "held"]))
        if extra == "notready":
            node["status"]["conditions"][0]["status"] = "False"
        elif extra == "cordoned":
            node["spec"]["unschedulable"] = True
        elif extra == "ignored":
            labels[constants.LABEL_IGNORE] = "true"
        elif extra == "tainted":
            node["spec"]["taints"] = [{"key": "gpu", "value": "bad", "effect": "NoSchedule"}]
        elif extra == "held" and early:
            node["spec"]["unschedulable"] = True
            ann[constants.state_annotation("early")] = state_text(
                "1.0.0", PackageState.IN_PROGRESS, cordoned=True
            )
        if early and draw(st.booleans()):
            labels[constants.status_label("early")] = "complete"
        nodes.append(node)
    return Scenario(nodes, [nw, *others], policies, draw(st.sampled_from([1, 2, 3, 32])))


def _answers(scenario: Scenario) -> tuple[explain.Analysis, dict[str, explain.Explanation]]:
    state = cluster_state(scenario.nodes, scenario.nodewrights, scenario.policies)
    analysis = explain.analyse(state, "nw", options=RolloutOptions(admission_limit=scenario.per_pass))
    return analysis, {name: explain.explain(analysis, name) for name in analysis.entries}


async def _why_agrees(scenario: Scenario) -> None:
    analysis, answers = _answers(scenario)
    fingerprint = fingerprint_of(scenario.nw)
    async with controller(
        scenario.nodes, scenario.nodewrights, scenario.policies, per_pass=scenario.per_pass
    ) as env:
        before = env.admissions()
        await env.rollout_pass()
        after = env.admissions()
        status = env.nodewright().get("status") or {}
    admitted = new_admissions(before, after, fingerprint)
    released = {n for n in before if n not in after}
    assert {n for n, a in answers.items() if a.reason == "AdmittedNow"} == set(admitted)
    assert {n: (a.compartment, a.batch) for n, a in answers.items() if a.reason == "AdmittedNow"} == admitted
    assert set(analysis.plan.releases) == released
    counted = Counter(w.reason.value for w in analysis.plan.waiting)
    assert dict(counted) == status.get("waitingReasons", {})
    for reason, examples in (status.get("waitingExamples") or {}).items():
        for name in examples:  # `why` says what the controller counts (an unreadable state first)
            unreadable = analysis.entries[name].state_error is not None
            assert answers[name].reason == ("StateMalformed" if unreadable else reason), (name, reason)
    for name, waiting in analysis.waiting.items():
        unreadable = analysis.entries[name].state_error is not None
        assert answers[name].reason == ("StateMalformed" if unreadable else waiting.reason.value), name


async def _plan_agrees(scenario: Scenario) -> None:
    nw = NodeWright.model_validate(scenario.nw)
    report = plan_cmd.build_report(
        nw,
        policy=ModelCache().policy_or_problems(scenario.policies[0]) if scenario.policies else None,
        nodes=scenario.nodes,
        all_nodewrights=[NodeWright.model_validate(o) for o in scenario.nodewrights[1:]],
        now=NOW,
        admission_limit=scenario.per_pass,
    )
    predicted = {(c.name, b.number): sorted(b.nodes) for c in report.preview.compartments for b in c.batches}
    fingerprint = fingerprint_of(scenario.nw)
    opened: dict[tuple[str, int], list[str]] = {}
    async with controller(
        scenario.nodes, scenario.nodewrights, scenario.policies, per_pass=scenario.per_pass
    ) as env:
        for _ in range(60):
            before = env.admissions()
            await env.rollout_pass()
            admitted = new_admissions(before, env.admissions(), fingerprint)
            for name, key in admitted.items():
                opened.setdefault(key, []).append(name)
            busy = _busy(env, fingerprint)
            finish_admitted(env, fingerprint)
            if not admitted and not busy:
                break
    assert {k: sorted(v) for k, v in opened.items()} == predicted


def _busy(env: Controller, fingerprint: str) -> list[str]:
    """Nodes working after a pass: admitted for the current spec and not settled, or in progress under
    an older admission (the preview's `active` and carried-over nodes)."""
    adm_key, label_key = admission_annotation("nw"), constants.status_label("nw")
    out = []
    for name in env.nodes:
        meta = env.node(name)["metadata"]
        text = (meta.get("annotations") or {}).get(adm_key)
        adm = decode_admission(text) if text is not None else None
        current = adm is not None and adm.fingerprint == fingerprint
        if (current and adm is not None and not adm.consumed) or (
            not current and (meta.get("labels") or {}).get(label_key) == "in_progress"
        ):
            out.append(name)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_why_agrees_with_the_controllers_pass(scenario: Scenario) -> None:
    asyncio.run(_why_agrees(scenario))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_plan_predicts_the_controllers_batches(scenario: Scenario) -> None:
    asyncio.run(_plan_agrees(scenario))
