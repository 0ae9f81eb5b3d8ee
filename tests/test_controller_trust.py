"""Package pod trust in the node controller (`controller.trust`), against the scripted API server.

The attacker of these tests can do what a user with pod rights in the operator namespace can: delete
our pod and create another one with every label and annotation copied (signature and seal included),
with another image, on another node, or with exactly our spec. The API server gives each created pod a
fresh uid, as kube-apiserver does.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import re
from typing import Any

import pytest

from nodewright.api import constants
from nodewright.api.nodestate import PackageStage, PackageState, decode
from nodewright.controller.expectations import PodExpectations
from nodewright.controller.nodes import NodeReconciler
from nodewright.controller.signing import POD_ANNOTATION_SEAL, POD_ANNOTATION_SIGNATURE, UntrustedReason
from nodewright.controller.trust import UNTRUSTED_DELETE_GRACE, PodMutatedOnCreate
from nodewright.kube.trim import trim_node, trim_pod
from nodewright.plan import podspec
from tests import test_controller_nodes as nodes_tests
from tests.kubefake import pods_c
from tests.test_controller_nodes import NOW, NS, Env, _finish_init_containers, node_obj

env = nodes_tests.env  # the node controller over FakeKube (fixture)

PODS_C = pods_c(NS)


def state_entry(env: Env) -> Any:
    state = decode(env.node()["metadata"]["annotations"][constants.state_annotation("nw")])
    return state.entry("tool", "1.0.0")


async def start_apply_pod(env: Env) -> dict[str, Any]:
    """Admit n1; the node controller creates (and binds, sealed) the apply pod; informers up to date."""
    env.kube.creation_timestamp = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")  # a fresh pod, not a stuck one
    env.put_node(node_obj(env.admit()))
    await env.reconciler.reconcile("nw/n1")
    [pod] = env.pods()
    env.rt.nodes.upsert(trim_node(env.node()))
    env.rt.pods.upsert(trim_pod(pod))
    env.rt.pod_expectations.observed(trim_pod(pod))
    return pod


def replace_pod(env: Env, ours: dict[str, Any], forged: dict[str, Any]) -> dict[str, Any]:
    """The attacker deletes `ours` and creates `forged` (the API server assigns a new uid)."""
    env.kube.remove(PODS_C, ours["metadata"]["name"])
    env.rt.pods.delete(trim_pod(ours))
    env.rt.pod_expectations.observed_delete(trim_pod(ours))
    forged = copy.deepcopy(forged)
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        forged["metadata"].pop(key, None)
    stored = env.kube.put(PODS_C, forged)
    env.rt.pods.upsert(trim_pod(stored))
    return stored


def deletes_of(env: Env, name: str) -> list[Any]:
    return [r.body for r in env.kube.requests if r.method == "DELETE" and r.path.endswith(f"/pods/{name}")]


async def warning_events(env: Env) -> list[dict[str, Any]]:
    async with asyncio.timeout(5):
        await env.rt.events.flush()
    return [
        r.body
        for r in env.kube.requests
        if r.method == "POST" and r.path.endswith("/events") and r.body["reason"] == "UntrustedPackagePod"
    ]


def untrusted_count(env: Env, reason: UntrustedReason) -> float:
    text = env.rt.metrics.render().decode()
    match = re.search(rf'^nodewright_untrusted_pods_total\{{reason="{reason.value}"\}} (\S+)$', text, re.M)
    assert match is not None, text
    return float(match.group(1))


def succeed(env: Env, pod: dict[str, Any]) -> None:
    """The kubelet reports every init container of `pod` done (exit 0)."""
    _finish_init_containers(pod)
    env.kube.put(PODS_C, pod)
    env.rt.pods.upsert(trim_pod(pod))


def bindings(env: Env) -> list[Any]:
    return [r.body for r in env.kube.requests if r.method == "POST" and r.path.endswith("/binding")]


async def test_created_pods_are_bound_with_their_seal_under_a_uid_precondition(env: Env) -> None:
    pod = await start_apply_pod(env)
    [create] = [r.body for r in env.kube.requests if r.method == "POST" and r.path.endswith("/pods")]
    assert "nodeName" not in create["spec"], "created unbound: nothing runs before the binding"
    assert create["spec"]["schedulerName"] == constants.POD_SCHEDULER_NAME
    assert create["metadata"]["annotations"][constants.POD_ANNOTATION_NODE] == "n1"
    [binding] = bindings(env)
    assert binding["metadata"]["uid"] == pod["metadata"]["uid"] and binding["target"]["name"] == "n1"
    annotations = pod["metadata"]["annotations"]
    assert binding["metadata"]["annotations"] == {POD_ANNOTATION_SEAL: annotations[POD_ANNOTATION_SEAL]}
    assert annotations[POD_ANNOTATION_SIGNATURE].startswith("v2:") and pod["spec"]["nodeName"] == "n1"
    assert [r for r in env.kube.requests if r.method == "PATCH" and "/pods/" in r.path] == [], "no patch"
    assert env.rt.signer.check(trim_pod(pod)).sealed


async def test_a_pod_bound_here_is_not_bound_again_while_the_cache_lags(env: Env) -> None:
    # The watch delivers the create (unbound) after the binding was answered: the reconcile that event
    # brings must not bind again (it would only be answered 409 "already assigned").
    pod = await start_apply_pod(env)
    unbound = copy.deepcopy(pod)
    unbound["spec"].pop("nodeName")
    unbound["metadata"]["annotations"].pop(POD_ANNOTATION_SEAL)
    env.rt.pods.upsert(trim_pod(unbound))
    env.rt.pod_expectations.observed(trim_pod(unbound))
    await env.reconciler.reconcile("nw/n1")
    assert len(bindings(env)) == 1, bindings(env)
    assert deletes_of(env, pod["metadata"]["name"]) == []


@pytest.mark.parametrize(
    ("attack", "reason"),
    [
        ("another image", UntrustedReason.SPEC_MISMATCH),
        ("exact replay", UntrustedReason.REPLAYED),
    ],
)
async def test_a_recreated_pod_never_counts_is_reported_and_deleted(
    env: Env, attack: str, reason: UntrustedReason
) -> None:
    ours = await start_apply_pod(env)
    forged = copy.deepcopy(ours)  # every label and annotation, signature and seal included
    if attack == "another image":
        for container in forged["spec"]["initContainers"]:
            container["image"] = "evil.example.com/cryptominer:6.6.6"
    _finish_init_containers(forged)  # ... and it reports success
    stored = replace_pod(env, ours, forged)
    await env.reconciler.reconcile("nw/n1")

    entry = state_entry(env)
    assert (entry.stage, entry.state) == (PackageStage.APPLY, PackageState.IN_PROGRESS), "not counted"
    [delete] = deletes_of(env, stored["metadata"]["name"])
    assert delete["preconditions"] == {"uid": stored["metadata"]["uid"]}
    assert delete["gracePeriodSeconds"] == UNTRUSTED_DELETE_GRACE
    events = await warning_events(env)
    assert sorted(e["involvedObject"]["kind"] for e in events) == ["Node", "NodeWright"]
    assert all(stored["metadata"]["name"] in e["message"] and e["type"] == "Warning" for e in events)
    assert untrusted_count(env, reason) == 1

    # Seen again before the watch reports the deletion: neither reported nor deleted twice.
    await env.reconciler.reconcile("nw/n1")
    assert len(deletes_of(env, stored["metadata"]["name"])) == 1
    assert len(await warning_events(env)) == 2 and untrusted_count(env, reason) == 1

    # Gone: the planner sees the stage's pod as lost and creates our own again; only that one counts.
    env.rt.pods.delete(trim_pod(stored))
    env.rt.pod_expectations.observed_delete(trim_pod(stored))
    await env.reconciler.reconcile("nw/n1")
    [again] = env.pods()
    assert again["metadata"]["uid"] != stored["metadata"]["uid"]
    assert again["spec"]["initContainers"][0]["image"] == ours["spec"]["initContainers"][0]["image"]
    assert env.rt.signer.check(trim_pod(again)).sealed
    succeed(env, again)
    env.rt.nodes.upsert(trim_node(env.node()))
    await env.reconciler.reconcile("nw/n1")
    assert state_entry(env).stage == PackageStage.CONFIG


async def test_a_signature_copied_to_another_node_fails_on_that_node(env: Env) -> None:
    ours = await start_apply_pod(env)
    env.put_node({**node_obj(), "metadata": {**node_obj()["metadata"], "name": "n2", "uid": "n2-uid"}})
    forged = copy.deepcopy(ours)
    forged["metadata"]["name"] = "copied"
    forged["spec"]["nodeName"] = "n2"
    for key in ("uid", "resourceVersion"):
        forged["metadata"].pop(key)
    stored = env.kube.put(PODS_C, forged)
    env.rt.pods.upsert(trim_pod(stored))
    await env.reconciler.reconcile("nw/n2")
    [delete] = deletes_of(env, "copied")
    assert delete["preconditions"] == {"uid": stored["metadata"]["uid"]}
    events = await warning_events(env)
    assert {(e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in events} == {
        ("Node", "n2"),
        ("NodeWright", "nw"),
    }
    assert untrusted_count(env, UntrustedReason.IDENTITY_MISMATCH) == 1
    assert deletes_of(env, ours["metadata"]["name"]) == [], "our pod on n1 is untouched"


async def test_a_restarted_operator_binds_its_unbound_pods_and_redoes_unsealed_bound_ones(env: Env) -> None:
    env.kube.fail("POST", "/binding", 500, times=10)  # the binding fails (the client retries 5xx)
    ours = await start_apply_pod(env)
    assert "nodeName" not in ours["spec"] and POD_ANNOTATION_SEAL not in ours["metadata"]["annotations"]
    env.kube.faults.clear()

    # Killed before the binding: the next operator finds a signed pod that has run nothing, which its
    # stage still expects. It binds it (with the seal) instead of running the stage again.
    restarted = NodeReconciler(dataclasses.replace(env.rt, pod_expectations=PodExpectations(trim_pod)))
    await restarted.reconcile("nw/n1")
    assert deletes_of(env, ours["metadata"]["name"]) == [], "an unbound pod of ours is not lost work"
    [bound] = env.pods()
    assert bound["metadata"]["uid"] == ours["metadata"]["uid"] and bound["spec"]["nodeName"] == "n1"
    assert bindings(env)[-1]["metadata"]["uid"] == ours["metadata"]["uid"]
    env.rt.pods.upsert(trim_pod(bound))
    assert env.rt.signer.check(trim_pod(bound)).sealed

    again = NodeReconciler(dataclasses.replace(env.rt, pod_expectations=PodExpectations(trim_pod)))
    await again.reconcile("nw/n1")
    assert deletes_of(env, ours["metadata"]["name"]) == [], "a sealed pod survives a restart"

    # Bound without our seal (an older operator version's pod, or someone with pods/binding): it may
    # have run anything of what we signed at any time, so it does not count and its stage is redone.
    unsealed = copy.deepcopy(bound)
    del unsealed["metadata"]["annotations"][POD_ANNOTATION_SEAL]
    env.kube.put(PODS_C, unsealed)
    env.rt.pods.upsert(trim_pod(unsealed))
    await again.reconcile("nw/n1")
    assert len(deletes_of(env, ours["metadata"]["name"])) == 1
    assert untrusted_count(env, UntrustedReason.UNSEALED) == 1
    assert state_entry(env).state == PackageState.IN_PROGRESS, "not wedged: the stage is simply redone"


async def test_an_unbound_pod_no_stage_expects_is_deleted_not_bound(env: Env) -> None:
    ours = await start_apply_pod(env)
    stale = copy.deepcopy(ours)
    stale["metadata"]["name"] = "stale"
    stale["metadata"]["annotations"][constants.POD_ANNOTATION_ATTEMPT] = "7"
    del stale["spec"]["nodeName"]
    env.rt.signer.sign(stale)
    for key in ("uid", "resourceVersion"):
        stale["metadata"].pop(key)
    stored = env.kube.put(PODS_C, stale)
    env.rt.pods.upsert(trim_pod(stored))
    await env.reconciler.reconcile("nw/n1")
    assert len(deletes_of(env, "stale")) == 1
    assert [b for b in bindings(env) if b["metadata"]["name"] == "stale"] == []
    assert await warning_events(env) == [], "ours and harmless: removed without a warning"


async def test_a_refused_binding_deletes_the_pod_and_fails_the_attempt_naming_the_permission(
    env: Env,
) -> None:
    one_attempt = {"tool": {"version": "1.0.0", "image": "ghcr.io/x/tool", "maxAttempts": 1}}
    env.rt.nodewrights.upsert(nodes_tests.nw_obj(packages=one_attempt))
    env.kube.fail("POST", "/binding", 403, times=5)
    env.kube.creation_timestamp = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    env.put_node(node_obj(env.admit()))
    for _ in range(3):
        await env.reconciler.reconcile("nw/n1")
    assert env.pods() == [], "an unbound pod that cannot be bound does not linger"
    node = env.node()
    condition = next(
        c for c in node["status"]["conditions"] if c["type"] == constants.node_condition_type("nw")
    )
    assert "pods/binding" in condition["message"], condition
    assert node["metadata"]["labels"][constants.status_label("nw")] == "erroring"


async def test_a_seal_never_lands_on_a_pod_that_replaced_ours(env: Env) -> None:
    ours = await start_apply_pod(env)
    unbound = copy.deepcopy(ours)
    del unbound["spec"]["nodeName"]
    del unbound["metadata"]["annotations"][POD_ANNOTATION_SEAL]
    impostor = replace_pod(env, ours, unbound)
    assert await env.reconciler.trust.bind(trim_pod(ours)) is False  # e.g. a retried binding of ours
    assert env.kube.get(PODS_C, impostor["metadata"]["name"]) == impostor, "409: uid precondition"


async def test_a_pod_mutated_on_create_is_deleted_and_its_create_refused(env: Env) -> None:
    """An admission webhook injected a container: the operator never runs what it did not build.

    `PodMutatedOnCreate` is a 422, which the node controller records as a refused create: a failed
    attempt with this message (retried with backoff, then `erroring`)."""
    original = env.kube._create

    def webhook(collection: Any, body: dict[str, Any]) -> Any:
        if collection == PODS_C:
            body["spec"]["containers"].append({"name": "injected", "image": "sidecar:1"})
        return original(collection, body)

    env.kube._create = webhook  # type: ignore[method-assign]
    model, _ = env.rt.models.nodewright(env.rt.nodewrights.get("nw") or {})
    assert model is not None
    manifest = podspec.build_pod(
        model,
        model.spec.packages["tool"],
        package_name="tool",
        version="1.0.0",
        stage=PackageStage.APPLY,
        node="n1",
        attempt=1,
        node_order=0,
        options=env.reconciler.pod_options,
    )
    env.rt.signer.sign(manifest)
    created = await env.rt.client.create_pod(NS, manifest)
    with pytest.raises(PodMutatedOnCreate, match=r"spec\.containers") as refused:
        await env.reconciler.trust.adopt(created, manifest, nw=model)
    assert refused.value.status == 422 and "exclude namespace nodewright-system" in refused.value.message
    assert env.pods() == [], "deleted at once"
    [delete] = deletes_of(env, created["metadata"]["name"])
    assert delete["preconditions"] == {"uid": created["metadata"]["uid"]}
    assert untrusted_count(env, UntrustedReason.MUTATED_ON_CREATE) == 1
    [event, _] = await warning_events(env)
    assert "spec.containers" in event["message"]
    assert not env.rt.pod_expectations.created_here(created["metadata"]["uid"]), "never vouched for"
    assert bindings(env) == [], "never bound, so it never ran"


async def test_our_pod_of_an_earlier_nodewright_of_the_same_name_is_left_to_the_gc(env: Env) -> None:
    ours = await start_apply_pod(env)
    earlier = copy.deepcopy(ours)
    earlier["metadata"]["name"] = "earlier"
    earlier["metadata"]["ownerReferences"][0]["uid"] = "old-nw-uid"
    env.rt.signer.sign(earlier)
    for key in ("uid", "resourceVersion"):
        earlier["metadata"].pop(key)
    stored = env.kube.put(PODS_C, earlier)
    stored["metadata"]["annotations"][POD_ANNOTATION_SEAL] = env.rt.signer.seal(stored)
    env.rt.pods.upsert(trim_pod(stored))
    await env.reconciler.reconcile("nw/n1")
    assert deletes_of(env, "earlier") == [] and await warning_events(env) == []


def test_a_mutated_create_reads_as_a_refused_one() -> None:
    exc = PodMutatedOnCreate("pod x was stored with a spec that differs")
    assert exc.status == 422 and "differs" in str(exc)
