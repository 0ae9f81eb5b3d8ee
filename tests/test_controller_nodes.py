"""The node controller against the scripted in-memory API server (real client, real HTTP).

Informer stores are filled by hand (no watches), so each test controls exactly what the reconcile
reads; the writes go through `KubeClient` to `FakeKube` and are asserted there.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nodewright.api import constants
from nodewright.api.admission import Admission, admission_annotation, encode_admission
from nodewright.api.modelcache import ModelCache
from nodewright.api.models import NodeWright
from nodewright.api.nodeobject import node_facts
from nodewright.api.nodestate import NodeState, PackageEntry, PackageStage, PackageState, decode, encode
from nodewright.api.timing import Timing, update_timing
from nodewright.controller import nodes as nodes_module
from nodewright.controller.expectations import PodExpectations
from nodewright.controller.logstore import KeptLog, kept_logs, store_name
from nodewright.controller.nodes import NodeReconciler, _deletion_spec
from nodewright.controller.options import OperatorOptions
from nodewright.controller.runtime import EventRecorder, Runtime
from nodewright.controller.signing import PodSigner
from nodewright.kube.client import KubeClient
from nodewright.kube.informer import Informer
from nodewright.kube.resources import DEPLOYMENTPOLICIES, NODES, NODEWRIGHTS, PODS
from nodewright.kube.trim import trim_node, trim_pod
from nodewright.kube.writethrough import WriteThrough
from nodewright.observability.metrics import OperatorMetrics
from nodewright.observability.tracing import RolloutTracer
from nodewright.plan import podspec, sequencing
from nodewright.plan.rollout import spec_fingerprint
from nodewright.plan.rollout_input import effective_nodewright
from tests.kubefake import FakeKube, pods_c

NS = "nodewright-system"
NODES_C = ("api/v1", "", "nodes")
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def nw_obj(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": "nw", "uid": "nw-uid", "generation": 1, "resourceVersion": "1"},
        "spec": {"packages": {"tool": {"version": "1.0.0", "image": "ghcr.io/x/tool"}}, **spec},
    }


def node_obj(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "n1",
            "uid": "n1-uid",
            "labels": {"pool": "a"},
            "annotations": annotations or {},
        },
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"bootID": "b1"}},
    }


def _finish_init_containers(pod: dict[str, Any], *, like: dict[str, Any] | None = None) -> None:
    """Every init container of `pod` (named as in `like`) exited 0: the stage is done."""
    pod["status"] = {
        "phase": "Running",
        "initContainerStatuses": [
            {"name": c["name"], "state": {"terminated": {"exitCode": 0}}}
            for c in (like or pod)["spec"]["initContainers"]
        ],
    }


@dataclass
class Env:
    kube: FakeKube
    rt: Runtime
    reconciler: NodeReconciler
    rollouts: list[str]

    def put_node(self, node: dict[str, Any]) -> None:
        stored = self.kube.put(NODES_C, node)
        self.rt.nodes.upsert(trim_node(stored))

    def admit(self, fingerprint: str | None = None) -> dict[str, str]:
        model, _ = self.rt.models.nodewright(self.rt.nodewrights.get("nw") or {})
        assert model is not None
        fp = fingerprint or spec_fingerprint(effective_nodewright(model))
        adm = Admission(
            compartment="__default__", batch=1, order=3, fingerprint=fp, at="2026-01-01T11:00:00Z"
        )
        return {admission_annotation("nw"): encode_admission(adm)}

    async def first_stage_done(self) -> None:
        """Admit n1, let the node controller start the install pod (apply and config), and let that pod
        succeed (informers up to date)."""
        self.put_node(node_obj(self.admit()))
        await self.reconciler.reconcile("nw/n1")
        [pod] = self.pods()
        _finish_init_containers(pod)
        self.rt.nodes.upsert(trim_node(self.node()))
        self.rt.pods.upsert(trim_pod(pod))

    def node(self) -> dict[str, Any]:
        node = self.kube.get(NODES_C, "n1")
        assert node is not None
        return node

    def pods(self) -> list[dict[str, Any]]:
        return list(self.kube.objects.get(pods_c(NS), {}).values())


def make_runtime(
    client: KubeClient,
    *,
    nodes: Informer,
    nodewrights: Informer,
    pods: Informer,
    signer: PodSigner | None = None,
    **extra: Any,
) -> Runtime:
    """A Runtime over hand-filled informers, with the test clock `NOW`."""
    return Runtime(
        client=client,
        options=OperatorOptions(namespace=NS),
        nodewrights=nodewrights,
        policies=Informer(client, DEPLOYMENTPOLICIES),
        nodes=nodes,
        pods=pods,
        models=ModelCache(),
        node_view=WriteThrough(nodes, trim_node),
        nodewright_view=WriteThrough(nodewrights),
        signer=signer or PodSigner(b"k" * 32),
        metrics=OperatorMetrics(),
        tracer=RolloutTracer(),
        events=EventRecorder(client, clock=lambda: NOW, instance="test"),
        clock=lambda: NOW,
        **extra,
    )


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    kube = await FakeKube().start()
    client = KubeClient(kube.config(), max_retries=0)
    nodes = Informer(client, NODES, transform=trim_node)
    signer = PodSigner(b"k" * 32)
    pods = Informer(client, PODS, namespace=NS, transform=signer.trim)  # as `Operator` wires it
    pods.add_index("node", lambda p: [podspec.pod_node(p)])
    nodewrights = Informer(client, NODEWRIGHTS)
    rollouts: list[str] = []
    rt = make_runtime(
        client,
        nodes=nodes,
        nodewrights=nodewrights,
        pods=pods,
        signer=signer,
        enqueue_rollout=rollouts.append,
        pod_expectations=PodExpectations(signer.trim),
    )
    nodewrights.upsert(nw_obj())
    try:
        yield Env(kube, rt, NodeReconciler(rt), rollouts)
    finally:
        # Events are sent by a background task: stop it before the client, or it reopens a session
        # that nobody closes (a ResourceWarning, an error under this suite's warning filter).
        await rt.events.close(grace=0.1)
        await client.close()
        await kube.stop()


async def test_admitted_node_gets_state_label_condition_and_a_signed_pod(env: Env) -> None:
    env.put_node(node_obj(env.admit()))
    await env.reconciler.reconcile("nw/n1")
    node = env.node()
    state = decode(node["metadata"]["annotations"][constants.state_annotation("nw")])
    entry = state.entry("tool", "1.0.0")
    assert entry is not None and entry.stage == PackageStage.APPLY and entry.state == PackageState.IN_PROGRESS
    assert state.admission is None, "the admission is never persisted in the state"
    assert node["metadata"]["labels"][constants.status_label("nw")] == "in_progress"
    cond = next(c for c in node["status"]["conditions"] if c["type"] == "nodewright.io/nw")
    assert cond["status"] == "False"
    assert any(c["type"] == "Ready" for c in node["status"]["conditions"]), "kubelet condition kept"
    [pod] = env.pods()
    assert env.rt.signer.verify(pod)
    assert pod["spec"]["nodeName"] == "n1"
    assert env.rollouts == ["nw"], "a status change enqueues the rollout"


async def test_a_package_pod_is_canonicalised_once_per_distinct_spec(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Signing, the check of the create answer, the binding and every watch event of the pod read one
    run digest per distinct spec (canonicalising a package pod was ~14% of the operator's CPU when
    every watch event and the create path did it again)."""
    canonicalised: list[str] = []
    real = podspec.run_spec

    def counted(pod: Any) -> dict[str, Any]:
        canonicalised.append(str((pod.get("metadata") or {}).get("name")))
        return real(pod)

    monkeypatch.setattr(podspec, "run_spec", counted)
    env.put_node(node_obj(env.admit()))
    await env.reconciler.reconcile("nw/n1")
    [pod] = env.pods()
    assert pod["spec"]["nodeName"] == "n1", "signed, created, checked and bound"
    for event in range(4):  # the watch events of its life: added, bound, init containers progressing
        seen = copy.deepcopy(pod)  # every event decodes a fresh object
        seen["status"] = {"phase": "Pending" if event < 2 else "Running"}
        transform = env.rt.pods.reflector.transform
        trimmed = transform(seen) if transform else seen  # what the informer caches of the event
        assert env.rt.signer.check(trimmed).trusted
        env.rt.pods.upsert(trimmed)
    _finish_init_containers(pod)
    env.rt.pods.upsert(env.rt.signer.trim(pod))
    await env.reconciler.reconcile("nw/n1")
    assert canonicalised == [pod["metadata"]["name"]] * 2, "as built (signing) and as stored (create answer)"


async def test_admission_for_another_fingerprint_starts_nothing(env: Env) -> None:
    env.put_node(node_obj(env.admit(fingerprint="0" * 16)))
    await env.reconciler.reconcile("nw/n1")
    assert env.pods() == []
    # Untouched and waiting: no label, no condition, no write at all (no label reads as waiting).
    assert constants.status_label("nw") not in env.node()["metadata"]["labels"]
    assert env.kube.count("PATCH", "/nodes/") == 0


async def test_a_node_with_history_is_labelled_waiting(env: Env) -> None:
    done = PackageEntry("tool", "0.9.0", PackageStage.CONFIG, PackageState.COMPLETE)
    env.put_node(node_obj({constants.state_annotation("nw"): encode(NodeState(packages=(done,)))}))
    await env.reconciler.reconcile("nw/n1")
    assert env.node()["metadata"]["labels"][constants.status_label("nw")] == "waiting"


async def test_forged_package_pod_does_not_change_state(env: Env) -> None:
    env.put_node(node_obj(env.admit()))
    await env.reconciler.reconcile("nw/n1")
    [real] = env.pods()
    state_before = env.node()["metadata"]["annotations"][constants.state_annotation("nw")]
    # Someone else's copy of the pod, reporting success, without a valid signature.
    forged = dict(real)
    forged["metadata"] = {**real["metadata"], "annotations": {**real["metadata"]["annotations"]}}
    forged["metadata"]["annotations"]["nodewright.io/signature"] = "0" * 64
    _finish_init_containers(forged, like=real)
    env.rt.nodes.upsert(trim_node(env.node()))
    env.rt.pods.upsert(trim_pod(forged))
    await env.reconciler.reconcile("nw/n1")
    assert env.node()["metadata"]["annotations"][constants.state_annotation("nw")] == state_before


async def test_malformed_state_is_never_overwritten(env: Env) -> None:
    annotations = {**env.admit(), constants.state_annotation("nw"): '{"v": 1, "p": {"x": 1}}'}
    env.put_node(node_obj(annotations))
    await env.reconciler.reconcile("nw/n1")
    node = env.node()
    assert node["metadata"]["annotations"][constants.state_annotation("nw")] == '{"v": 1, "p": {"x": 1}}'
    assert node["metadata"]["labels"][constants.status_label("nw")] == "blocked", "not counted as complete"
    condition = next(
        c for c in node["status"]["conditions"] if c["type"] == constants.node_condition_type("nw")
    )
    assert (
        condition["reason"] == "StateMalformed"
        and "delete it to start this node over" in condition["message"]
    )
    assert env.pods() == []
    patches = env.kube.count("PATCH")
    await env.reconciler.reconcile("nw/n1")
    assert env.kube.count("PATCH") == patches, "reported once; nothing written while it stays malformed"


async def test_finished_install_pod_completes_the_package_in_one_patch(env: Env) -> None:
    await env.first_stage_done()
    [pod] = env.pods()
    assert [c["name"] for c in pod["spec"]["initContainers"]] == [
        "tool-init",
        "tool-apply",
        "tool-applycheck",
        "tool-config",
        "tool-configcheck",
    ]

    def node_writes() -> int:
        return sum(
            1
            for r in env.kube.requests
            if r.method == "PATCH" and r.path.endswith(("/nodes/n1", "/nodes/n1/status"))
        )

    patches = node_writes()
    await env.reconciler.reconcile("nw/n1")
    state = decode(env.node()["metadata"]["annotations"][constants.state_annotation("nw")])
    entry = state.entry("tool", "1.0.0")
    assert entry is not None and entry.stage == PackageStage.CONFIG and entry.state == PackageState.COMPLETE
    assert node_writes() - patches == 1, "state, status label and condition written in one patch"
    condition = next(
        c for c in env.node()["status"]["conditions"] if c["type"] == constants.node_condition_type("nw")
    )
    assert condition["status"] == "True" and "complete" in condition["message"]
    assert env.node()["metadata"]["labels"][constants.status_label("nw")] == "complete"
    assert env.pods() == [], "the finished pod was deleted; no pod of its own for config"


async def test_a_pod_failing_in_config_is_recorded_in_one_patch_and_retried_from_config(env: Env) -> None:
    env.put_node(node_obj(env.admit()))
    await env.reconciler.reconcile("nw/n1")
    [pod] = env.pods()
    statuses = []
    for container in pod["spec"]["initContainers"]:
        code = 1 if container["name"] == "tool-config" else 0
        statuses.append({"name": container["name"], "state": {"terminated": {"exitCode": code}}})
        if code:
            break
    pod["status"] = {"phase": "Failed", "initContainerStatuses": statuses}
    env.rt.nodes.upsert(trim_node(env.node()))
    env.rt.pods.upsert(trim_pod(pod))
    patches = env.kube.count("PATCH", "/nodes/n1")
    await env.reconciler.reconcile("nw/n1")
    assert env.kube.count("PATCH", "/nodes/n1") - patches == 1
    state = decode(env.node()["metadata"]["annotations"][constants.state_annotation("nw")])
    entry = state.entry("tool", "1.0.0")
    assert entry is not None and entry.stage == PackageStage.CONFIG and entry.retry_at is not None
    assert "config failed" in entry.error and "tool-config exited 1" in entry.error
    assert env.kube.count("DELETE", "/pods/") == 1 and env.kube.count("POST", ends="/pods") == 1


async def test_uncordon_only_when_we_cordoned(env: Env) -> None:
    done = PackageEntry("tool", "1.0.0", PackageStage.CONFIG, PackageState.COMPLETE)
    for cordoned in (False, True):
        state = encode(NodeState(packages=(done,), cordoned=cordoned))
        env.put_node(node_obj({constants.state_annotation("nw"): state}, unschedulable=True))
        await env.reconciler.reconcile("nw/n1")
        assert bool(env.node()["spec"].get("unschedulable")) is (not cordoned)


def test_deletion_spec_keeps_only_uninstalls_and_work_in_flight() -> None:
    obj = nw_obj()
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    obj["spec"]["packages"] = {
        "gone": {"version": "1.0.0", "image": "x", "uninstall": {"enabled": True}},
        "never": {"version": "1.0.0", "image": "x", "uninstall": {"enabled": True}},
        "stays": {"version": "1.0.0", "image": "x"},
        "flying": {"version": "2.0.0", "image": "x"},
    }
    effective = effective_nodewright(NodeWright.model_validate(obj))
    state = NodeState(
        packages=(
            PackageEntry("gone", "1.0.0", PackageStage.CONFIG, PackageState.COMPLETE),
            PackageEntry("stays", "1.0.0", PackageStage.CONFIG, PackageState.COMPLETE),
            PackageEntry("flying", "2.0.0", PackageStage.APPLY, PackageState.IN_PROGRESS),
        )
    )
    assert sorted(_deletion_spec(effective, state).spec.packages) == ["flying", "gone"]
    # A run of another version left in progress when the spec moved on (A -> B -> A): inert, not in
    # flight; keeping its package held the deletion forever.
    inert = PackageEntry("stays", "0.9.0", PackageStage.UPGRADE, PackageState.IN_PROGRESS)
    state = replace(state, packages=(*state.packages, inert))
    assert sorted(_deletion_spec(effective, state).spec.packages) == ["flying", "gone"]


def test_timing_tracks_cordon_protection_and_drain_and_resets_on_uncordon() -> None:
    t = update_timing(
        Timing(), now=NOW, cordoning=True, uncordoning=False, protected=None, evicting=False, drained=None
    )
    assert t.cordoned_at == NOW
    later = NOW + timedelta(seconds=30)
    t = update_timing(
        t, now=later, cordoning=False, uncordoning=False, protected=True, evicting=True, drained=False
    )
    assert (t.protected_since, t.draining_since) == (later, later)
    t2 = update_timing(
        t,
        now=later + timedelta(seconds=5),
        cordoning=False,
        uncordoning=False,
        protected=True,
        evicting=True,
        drained=False,
    )
    assert (t2.protected_since, t2.draining_since) == (later, later), "first sighting is kept"
    assert Timing.decode(t2.encode()) == t2, "survives a restart through the annotation"
    t3 = update_timing(
        t2, now=later, cordoning=False, uncordoning=False, protected=False, evicting=False, drained=True
    )
    assert (t3.protected_since, t3.draining_since, t3.cordoned_at) == (None, None, NOW)
    assert update_timing(
        t3, now=later, cordoning=False, uncordoning=True, protected=None, evicting=False, drained=None
    ).empty
    assert Timing.decode("garbage") == Timing()


def test_node_facts_from_trimmed_node() -> None:
    facts = node_facts(trim_node(node_obj(unschedulable=True, taints=[{"key": "k", "effect": "NoSchedule"}])))
    assert facts.unschedulable and facts.ready and facts.boot_id == "b1"
    assert [(t.key, t.effect) for t in facts.taints] == [("k", "NoSchedule")]


def test_timing_keeps_the_drain_skip_memory_across_uncordon_and_round_trips() -> None:
    from nodewright.api.timing import DrainSkip

    skip = DrainSkip(at=NOW, message="drain timed out after 5s (policy skip): team/web-0")
    t = Timing(cordoned_at=NOW, draining_since=NOW).with_drain_skip(skip)
    assert Timing.decode(t.encode()) == t and t.drain_skip == skip
    after = update_timing(
        t, now=NOW, cordoning=False, uncordoning=True, protected=None, evicting=False, drained=None
    )
    assert after.drain_skip == skip and after.cordoned_at is None and after.draining_since is None
    assert after.with_drain_skip(None).empty
    assert Timing.decode('{"s": "garbage"}') == Timing()


def test_eviction_refusal_message_names_the_pdb_from_the_causes() -> None:
    from nodewright.controller.drainer import _with_causes
    from nodewright.kube.resources import api_error

    body = {
        "kind": "Status",
        "reason": "TooManyRequests",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "details": {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": "The disruption budget web needs 1 healthy pods and has 1 currently",
                }
            ]
        },
    }
    text = _with_causes(api_error(429, body))
    assert text.startswith("The disruption budget web needs 1") and "Cannot evict" in text
    assert _with_causes(api_error(429, {"message": "plain"})) == "plain"


async def test_a_created_pod_is_not_created_again_before_the_watch_shows_it(env: Env) -> None:
    env.kube.creation_timestamp = "2026-01-01T11:59:00Z"  # a minute before NOW: within its deadline
    env.put_node(node_obj(env.admit()))
    await env.reconciler.reconcile("nw/n1")
    # Our own state patch brings the key back before the pod informer has seen the new pod.
    env.rt.nodes.upsert(trim_node(env.node()))
    await env.reconciler.reconcile("nw/n1")
    assert env.kube.count("POST", ends="/pods") == 1
    [pod] = env.pods()
    env.rt.pods.upsert(trim_pod(pod))
    env.rt.pod_expectations.observed(trim_pod(pod))
    await env.reconciler.reconcile("nw/n1")
    assert env.kube.count("POST", ends="/pods") == 1


async def test_a_deleted_pod_is_not_deleted_again_before_the_watch_shows_it(env: Env) -> None:
    env.kube.creation_timestamp = "2026-01-01T11:59:00Z"
    await env.first_stage_done()
    await env.reconciler.reconcile("nw/n1")
    assert env.kube.count("DELETE", "/pods/") == 1
    # The informer still lists the finished apply pod, without a deletionTimestamp.
    env.rt.nodes.upsert(trim_node(env.node()))
    await env.reconciler.reconcile("nw/n1")
    assert env.kube.count("DELETE", "/pods/") == 1
    assert env.kube.count("POST", ends="/pods") == 1  # apply and config ran in the one pod


async def test_node_metadata_falls_back_to_its_own_patch_when_status_drops_it(env: Env) -> None:
    env.kube.status_keeps_metadata = False
    env.put_node(node_obj(env.admit()))
    await env.reconciler.reconcile("nw/n1")
    node = env.node()
    assert constants.state_annotation("nw") in node["metadata"]["annotations"]
    assert node["metadata"]["labels"][constants.status_label("nw")] == "in_progress"
    assert any(c["type"] == constants.node_condition_type("nw") for c in node["status"]["conditions"])
    status_patches = env.kube.count("PATCH", "/nodes/n1/status")
    [pod] = env.pods()
    _finish_init_containers(pod)
    env.rt.nodes.upsert(trim_node(env.node()))
    env.rt.pods.upsert(trim_pod(pod))
    await env.reconciler.reconcile("nw/n1")
    state = decode(env.node()["metadata"]["annotations"][constants.state_annotation("nw")])
    entry = state.entry("tool", "1.0.0")
    assert entry is not None and entry.stage == PackageStage.CONFIG
    # From now on: metadata by merge patch, the condition alone on /status.
    assert env.kube.count("PATCH", "/nodes/n1/status") == status_patches + 1


async def test_a_state_write_never_resurrects_an_older_state(env: Env) -> None:
    """Item 5 of the safety issue: someone wiped the state on the server; the cache still shows the old
    state. The write planned from the cache carries its resourceVersion, is refused (409), and the
    node controller re-reads the node and plans from what it says now: the wipe is not undone."""
    await env.first_stage_done()
    await env.reconciler.reconcile("nw/n1")  # apply done -> config pod; state written
    cached = env.node()
    assert constants.state_annotation("nw") in cached["metadata"]["annotations"]
    env.rt.nodes.upsert(trim_node(cached))
    env.rt.node_view.forget("n1")
    # Behind the operator's back (the informer has not seen it yet): the state annotation is deleted.
    wiped = dict(
        cached, metadata={**cached["metadata"], "annotations": dict(cached["metadata"]["annotations"])}
    )
    del wiped["metadata"]["annotations"][constants.state_annotation("nw")]
    env.kube.put(NODES_C, wiped)
    for pod in env.pods():  # the config pod finishes: the cached state would advance and be written
        _finish_init_containers(pod)
        env.rt.pods.upsert(trim_pod(pod))
    await env.reconciler.reconcile("nw/n1")
    conflicts = [r for r in env.kube.requests if r.method == "PATCH" and "/nodes/n1" in r.path]
    assert conflicts, "a node write was attempted"
    text = env.node()["metadata"]["annotations"].get(constants.state_annotation("nw"))
    state = decode(text) if text is not None else NodeState()
    entry = state.entry("tool", "1.0.0")
    assert entry is None or entry.state is not PackageState.COMPLETE, "the wiped state came back"
    assert entry is None or entry.stage == PackageStage.APPLY, "started over, from apply"


async def test_settling_consumes_the_admission_in_the_same_write(env: Env) -> None:
    await env.first_stage_done()
    writes_before = env.kube.count("PATCH")
    await env.reconciler.reconcile("nw/n1")
    node = env.node()
    assert node["metadata"]["labels"][constants.status_label("nw")] == "complete"
    admission = node["metadata"]["annotations"][admission_annotation("nw")]
    assert '"d":true' in admission, admission
    assert env.kube.count("PATCH") - writes_before == 1, (
        "consumed with the completion, not in a write of its own"
    )


async def test_a_pod_the_api_server_refuses_makes_the_node_erroring_with_its_message(env: Env) -> None:
    """Item 8 (operator side): a 422 on create is a failed attempt, never `in_progress` forever."""
    one_attempt = {"tool": {"version": "1.0.0", "image": "ghcr.io/x/tool", "maxAttempts": 1}}
    env.rt.nodewrights.upsert(nw_obj(packages=one_attempt))
    refusal = 'Pod "x" is invalid: spec.tolerations[0].operator: Invalid value: "Exists"'
    env.kube.fail(
        "POST",
        "/pods",
        422,
        body={"kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422, "message": refusal},
        times=5,
    )
    env.put_node(node_obj(env.admit()))
    statuses = []
    for _ in range(3):
        await env.reconciler.reconcile("nw/n1")
        statuses.append(env.node()["metadata"]["labels"].get(constants.status_label("nw")))
    node = env.node()
    assert statuses[0] == "in_progress" and statuses[-1] == "erroring", statuses
    condition = next(
        c for c in node["status"]["conditions"] if c["type"] == constants.node_condition_type("nw")
    )
    assert "refused the pod" in condition["message"], condition
    assert "tolerations[0].operator" in condition["message"], condition
    assert env.pods() == []
    assert '"d":true' in node["metadata"]["annotations"][admission_annotation("nw")], "settled: consumed"


async def test_a_drifted_package_is_repaired_in_a_pod_that_re_runs_its_steps(env: Env) -> None:
    """driftDetection.action reapply: an admitted, drifted node gets an apply pod with the repair env."""
    env.rt.nodewrights.upsert(nw_obj(driftDetection={"action": "reapply", "interval": "10m"}))
    env.kube.creation_timestamp = "2026-01-01T11:59:00Z"
    drifted = PackageEntry(
        name="tool",
        version="1.0.0",
        stage=PackageStage.CONFIG,
        state=PackageState.COMPLETE,
        attempts=1,
        updated="2026-01-01T10:00:00Z",
        drifted="apply-check failed: value differs",
    )
    state = NodeState(packages=(drifted,), generation=1, boot_id="b1")
    annotations = {constants.state_annotation("nw"): encode(state), **env.admit()}
    env.put_node(node_obj(annotations))
    await env.reconciler.reconcile("nw/n1")
    [pod] = env.pods()
    assert pod["metadata"]["labels"][constants.POD_LABEL_STAGE] == "apply"
    env_vars = {e["name"]: e.get("value") for c in pod["spec"]["initContainers"] for e in c.get("env") or ()}
    assert env_vars.get("NODEWRIGHT_REPAIR") == "true", env_vars
    entry = decode(env.node()["metadata"]["annotations"][constants.state_annotation("nw")]).entry(
        "tool", "1.0.0"
    )
    assert entry is not None and entry.repair and entry.state == PackageState.IN_PROGRESS


def _pulling(pod: dict[str, Any], container: str, message: str) -> None:
    """`container` of `pod` cannot pull its image (the kubelet backs off); nothing has run."""
    pod["status"] = {
        "phase": "Pending",
        "initContainerStatuses": [
            {
                "name": c["name"],
                "state": {"waiting": {"reason": "ErrImagePull", "message": message}}
                if c["name"] == container
                else {"waiting": {"reason": "PodInitializing"}},
            }
            for c in pod["spec"]["initContainers"]
        ],
    }


async def test_an_image_pull_failure_that_exhausts_its_attempts_keeps_why_as_the_stage_log(env: Env) -> None:
    """Issue 29 item 6: no container ran, so no log exists; the kept log of the stage names the image,
    the kubelet's reason and message, and the attempts, once the pod is gone."""
    two_attempts = {"tool": {"version": "1.0.0", "image": "ghcr.io/x/tool", "maxAttempts": 2}}
    env.rt.nodewrights.upsert(nw_obj(packages=two_attempts))
    env.kube.creation_timestamp = "2026-01-01T11:59:00Z"  # well within the stage timeout
    env.put_node(node_obj(env.admit()))
    clock = [NOW]
    env.rt.clock = lambda: clock[0]
    pull = 'failed to pull and unpack image "ghcr.io/x/tool:1.0.0": not found'

    async def pull_fails(attempt: int) -> dict[str, Any]:
        """The pod of `attempt` is created, fails to pull, and the pull-error grace (60 s) runs out."""
        await env.reconciler.reconcile("nw/n1")
        [pod] = env.pods()
        assert pod["metadata"]["annotations"][constants.POD_ANNOTATION_ATTEMPT] == str(attempt)
        _pulling(pod, "tool-init", pull)
        env.rt.nodes.upsert(trim_node(env.node()))
        env.rt.pods.upsert(trim_pod(pod))
        env.rt.pod_expectations.observed(trim_pod(pod))
        await env.reconciler.reconcile("nw/n1")  # the grace starts
        clock[0] += timedelta(seconds=61)
        env.rt.nodes.upsert(trim_node(env.node()))
        await env.reconciler.reconcile("nw/n1")  # the grace is over: a failed attempt
        assert env.pods() == [], "the pod is deleted once its failure is recorded"
        env.rt.pods.delete(trim_pod(pod))
        env.rt.pod_expectations.observed_delete(trim_pod(pod))
        return pod

    def kept() -> KeptLog:
        store = env.kube.get(("api/v1", NS, "configmaps"), store_name("nw", "n1"))
        [entry] = kept_logs(store)
        return entry

    first = await pull_fails(1)
    entry = kept()
    assert (entry.stage, entry.outcome, entry.attempt, entry.pod) == (
        "apply",
        "failed",
        1,
        first["metadata"]["name"],
    )
    assert "attempt 1/2 of apply failed: image pull failing for 1m" in entry.message, entry
    clock[0] += timedelta(seconds=11)  # the retry's backoff
    env.rt.nodes.upsert(trim_node(env.node()))
    second = await pull_fails(2)
    state = decode(env.node()["metadata"]["annotations"][constants.state_annotation("nw")])
    assert state.entry("tool", "1.0.0").state == PackageState.ERRORING  # type: ignore[union-attr]
    entry = kept()
    assert (entry.attempt, entry.pod, entry.container) == (2, second["metadata"]["name"], "tool-init")
    assert entry.image == "ghcr.io/x/tool:1.0.0" and entry.reason == "ErrImagePull", entry
    assert "apply failed 2 time(s), giving up" in entry.message and pull in entry.message, entry
    assert entry.log == "" and entry.exit_code is None


async def test_a_pod_deleted_at_the_stage_timeout_keeps_its_log_so_far(env: Env) -> None:
    """The other attempt no container's exit explains: still running at the stage timeout."""
    one_attempt = {"tool": {"version": "1.0.0", "image": "ghcr.io/x/tool", "maxAttempts": 1}}
    env.rt.nodewrights.upsert(nw_obj(packages=one_attempt))
    env.kube.creation_timestamp = "2026-01-01T10:00:00Z"  # 2 h before NOW: past 2 x 30m
    env.put_node(node_obj(env.admit()))
    await env.reconciler.reconcile("nw/n1")
    [pod] = env.pods()
    pod["status"] = {
        "phase": "Pending",
        "initContainerStatuses": [
            {"name": "tool-init", "state": {"terminated": {"exitCode": 0}}},
            {"name": "tool-apply", "state": {"running": {"startedAt": "2026-01-01T10:00:05Z"}}},
        ],
    }
    env.rt.nodes.upsert(trim_node(env.node()))
    env.rt.pods.upsert(trim_pod(pod))
    env.rt.pod_expectations.observed(trim_pod(pod))
    env.kube.fail("GET", "/log", 200, body="STILL-WAITING-FOR-THE-DEVICE", times=4)
    await env.reconciler.reconcile("nw/n1")
    assert env.pods() == []
    store = env.kube.get(("api/v1", NS, "configmaps"), store_name("nw", "n1"))
    [entry] = kept_logs(store)
    assert (entry.stage, entry.attempt, entry.reason) == ("apply", 1, "StageTimeout"), entry
    assert "did not finish within 1h" in entry.message and "giving up" in entry.message, entry
    assert "STILL-WAITING-FOR-THE-DEVICE" in entry.log, entry


class _LogRecorder:
    """Stands in for the node controller's structlog logger: (event, fields) in the order written."""

    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    def _record(self, event: str, **fields: Any) -> None:
        self.records.append((event, fields))

    info = warning = debug = error = _record

    def events(self) -> list[str]:
        return [event for event, _ in self.records]


async def test_the_intent_to_create_a_package_pod_is_logged_before_the_request(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29 item 12: an operator SIGKILLed while a create is in flight still leaves the record of
    the pod it may have made; the outcome follows the answer."""
    recorder = _LogRecorder()
    monkeypatch.setattr(nodes_module, "log", recorder)
    sent = env.rt.client.create_pod
    seen_at_create: list[list[str]] = []

    async def create_pod(namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        seen_at_create.append(recorder.events())
        return await sent(namespace, body)

    monkeypatch.setattr(env.rt.client, "create_pod", create_pod)
    env.put_node(node_obj(env.admit()))
    await env.reconciler.reconcile("nw/n1")
    [pod] = env.pods()
    assert seen_at_create == [["creating package pod"]], "written before the request, the outcome not yet"
    [(_, intent)] = [r for r in recorder.records if r[0] == "creating package pod"]
    assert intent == {
        "pod": pod["metadata"]["name"],
        "node": "n1",
        "nodewright": "nw",
        "package": "tool",
        "version": "1.0.0",
        "stage": "apply",
        "attempt": 1,
        "chain": None,
    }
    [(_, outcome)] = [r for r in recorder.records if r[0] == "package pod created"]
    assert outcome == {**intent, "uid": pod["metadata"]["uid"]}
    assert recorder.events().index("creating package pod") < recorder.events().index("package pod created")


async def test_a_refused_package_pod_create_logs_its_intent_then_the_failure(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = _LogRecorder()
    monkeypatch.setattr(nodes_module, "log", recorder)
    refusal = 'Pod "x" is invalid: spec.tolerations[0].operator: Invalid value: "Exists"'
    env.kube.fail(
        "POST",
        "/pods",
        422,
        body={"kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422, "message": refusal},
        times=1,
    )
    env.put_node(node_obj(env.admit()))
    await env.reconciler.reconcile("nw/n1")
    creates = [r for r in recorder.records if r[0] in ("creating package pod", "package pod not created")]
    assert [event for event, _ in creates] == ["creating package pod", "package pod not created"]
    (_, intent), (_, failed) = creates
    assert failed == {**intent, "error": failed["error"]} and refusal in failed["error"], failed
    assert "package pod created" not in recorder.events()


async def test_an_earlier_nodewright_whose_label_lags_its_spec_edit_keeps_the_node_waiting(env: Env) -> None:
    """`infra` (earlier by priority) was edited to 2.0.0 together with `nw`: n1 still says
    `infra: complete` from 1.0.0 (its node controller has not planned n1 again), so `nw` starts nothing
    there although it is admitted; once infra's state has completed 2.0.0 the next pass starts it."""
    infra = nw_obj(priority=10)
    infra["metadata"] = {**infra["metadata"], "name": "infra", "uid": "infra-uid"}
    infra["spec"]["packages"] = {"base": {"version": "2.0.0", "image": "ghcr.io/x/base"}}
    env.rt.nodewrights.upsert(infra)

    def infra_done(version: str) -> dict[str, str]:
        entry = PackageEntry("base", version, PackageStage.CONFIG, PackageState.COMPLETE)
        return {constants.state_annotation("infra"): encode(NodeState(packages=(entry,)))}

    lagging = node_obj({**env.admit(), **infra_done("1.0.0")})
    lagging["metadata"]["labels"][constants.status_label("infra")] = "complete"
    env.put_node(lagging)
    await env.reconciler.reconcile("nw/n1")
    assert env.pods() == []
    assert constants.status_label("nw") not in env.node()["metadata"]["labels"], "untouched: waiting"
    done = node_obj({**env.admit(), **infra_done("2.0.0")})
    done["metadata"]["labels"][constants.status_label("infra")] = "complete"
    env.put_node(done)
    await env.reconciler.reconcile("nw/n1")
    [pod] = env.pods()
    assert pod["spec"]["nodeName"] == "n1"


async def test_an_edit_of_an_earlier_nodewright_is_not_read_against_facts_cached_for_its_old_spec(
    env: Env,
) -> None:
    """`infra` (`sequencing: all`) targets only n2, where it completed 1.0.0. The node controller has its
    ordering facts cached (a second) when infra is edited to 2.0.0: n1 must wait at once, not start
    because the cached facts still say infra is complete everywhere."""
    infra = nw_obj(priority=10, sequencing="all", nodeSelectors={"matchLabels": {"pool": "b"}})
    infra["metadata"] = {**infra["metadata"], "name": "infra", "uid": "infra-uid"}
    infra["spec"]["packages"] = {"base": {"version": "1.0.0", "image": "ghcr.io/x/base"}}
    env.rt.nodewrights.upsert(infra)
    n2 = node_obj()
    n2["metadata"].update(
        name="n2", uid="n2-uid", labels={"pool": "b", constants.status_label("infra"): "complete"}
    )
    entry = PackageEntry("base", "1.0.0", PackageStage.CONFIG, PackageState.COMPLETE)
    n2["metadata"]["annotations"] = {
        constants.state_annotation("infra"): encode(NodeState(packages=(entry,)))
    }
    env.put_node(n2)
    env.put_node(node_obj())
    await env.reconciler.reconcile("nw/n1")  # not admitted: nothing starts, the facts are cached
    assert env.pods() == []
    edited = {**infra, "metadata": {**infra["metadata"], "generation": 2, "resourceVersion": "2"}}
    edited["spec"] = {**infra["spec"], "packages": {"base": {"version": "2.0.0", "image": "ghcr.io/x/base"}}}
    env.rt.nodewrights.upsert(edited)
    env.put_node(node_obj(env.admit()))
    await env.reconciler.reconcile("nw/n1")
    assert env.pods() == [], "infra has 2.0.0 to do on n2"


async def test_a_status_write_of_another_nodewright_does_not_rebuild_the_ordering_facts(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The facts cost O(nodes x NodeWrights): a new resourceVersion from a status write (every rollout
    pass) must not rebuild them on every node reconcile; only spec, pause, disable and deletion do."""
    built: list[int] = []
    real = sequencing.facts_for

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sequencing, "facts_for", counting)
    infra = nw_obj(priority=10)
    infra["metadata"] = {**infra["metadata"], "name": "infra", "uid": "infra-uid"}
    env.rt.nodewrights.upsert(infra)
    env.put_node(node_obj())
    await env.reconciler.reconcile("nw/n1")
    env.rt.nodewrights.upsert(
        {**infra, "metadata": {**infra["metadata"], "resourceVersion": "7"}, "status": {}}
    )
    await env.reconciler.reconcile("nw/n1")
    assert len(built) == 1
    paused = {
        **infra["metadata"],
        "resourceVersion": "8",
        "annotations": {constants.ANNOTATION_PAUSE: "true"},
    }
    env.rt.nodewrights.upsert({**infra, "metadata": paused})
    await env.reconciler.reconcile("nw/n1")
    assert len(built) == 2
