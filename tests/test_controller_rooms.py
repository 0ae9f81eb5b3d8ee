"""Unit tests of the controller's shared context: admission codec, pod signatures and seals, caches."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodewright.api import constants
from nodewright.api.admission import Admission, MalformedAdmission, decode_admission, encode_admission
from nodewright.api.modelcache import ModelCache
from nodewright.api.models import NodeWright
from nodewright.controller.expectations import OWN_POD_MEMORY, POD_EXPECTATION_TTL, PodExpectations
from nodewright.controller.options import parse_taint
from nodewright.controller.runtime import node_key, split_node_key
from nodewright.controller.signing import (
    POD_ANNOTATION_SEAL,
    POD_ANNOTATION_SIGNATURE,
    SIGNATURE_VERSION,
    PodSigner,
    PodVerdict,
    UntrustedReason,
)
from nodewright.kube.trim import trim_node, trim_pod
from nodewright.kube.writethrough import WriteThrough
from nodewright.plan.rollout_input import effective_nodewright


@given(
    compartment=st.text(min_size=1, max_size=20),
    batch=st.integers(min_value=1, max_value=10_000),
    order=st.integers(min_value=0, max_value=100_000),
    fingerprint=st.text(alphabet="0123456789abcdef", min_size=1, max_size=16),
)
def test_admission_round_trip(compartment: str, batch: int, order: int, fingerprint: str) -> None:
    admission = Admission(compartment, batch, order, fingerprint, "2026-01-01T00:00:00Z")
    assert decode_admission(encode_admission(admission)) == admission


def test_admissions_of_one_batch_share_their_strings() -> None:
    """Every node keeps its admission for as long as it is matched: the strings repeated across nodes
    (compartment, fingerprint, batch start) are one object each, not one per node."""
    first, second = (
        decode_admission(
            encode_admission(Admission("zone-a", 3, order, "0123abcd" * 2, "2026-01-01T00:00:00Z"))
        )
        for order in (1, 2)
    )
    assert first.compartment is second.compartment
    assert first.fingerprint is second.fingerprint
    assert first.at is second.at


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        '{"c":"a","b":1,"o":0,"f":"x"}',
        '{"c":"a","b":0,"o":0,"f":"x","at":"t"}',
        '{"c":"a","b":true,"o":0,"f":"x","at":"t"}',
        '{"c":"a","b":1,"o":-1,"f":"x","at":"t"}',
        '{"c":"a","b":1,"o":0,"f":"x","at":"t","extra":1}',
    ],
)
def test_malformed_admissions_are_rejected(text: str) -> None:
    with pytest.raises(MalformedAdmission):
        decode_admission(text)


def test_node_keys_round_trip() -> None:
    assert split_node_key(node_key("kernel", "gpu-node-1")) == ("kernel", "gpu-node-1")


def test_parse_taint() -> None:
    assert parse_taint("nodewright.io/runtime-required=true:NoSchedule") == (
        "nodewright.io/runtime-required",
        "true",
        "NoSchedule",
    )
    assert parse_taint("k:NoExecute") == ("k", None, "NoExecute")
    with pytest.raises(ValueError, match=r"NoSchedule"):
        parse_taint("k=v")


_RECORDED = Path(__file__).resolve().parent / "data" / "trust"


def _recorded(
    stage: str = "apply", admission: str = "default-admission"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest as built, the pod as a real kube-apiserver stored it), with our owner reference."""
    doc = json.loads((_RECORDED / f"kube-apiserver-v1.36.3-{stage}-{admission}.json").read_text())
    owner = {"apiVersion": constants.API_VERSION, "kind": "NodeWright", "name": "probe", "uid": "nw-uid",
             "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    manifest, stored = doc["manifest"], doc["stored"]
    for pod in (manifest, stored):
        pod["metadata"]["ownerReferences"] = [dict(owner)]
    return manifest, stored


def _signed_and_stored(signer: PodSigner, **kwargs: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Sign the manifest, and give the stored pod what the API server would have kept of it."""
    manifest, stored = _recorded(**kwargs)
    signer.sign(manifest)
    stored["metadata"]["annotations"] = dict(manifest["metadata"]["annotations"])
    return manifest, stored


def _sealed(signer: PodSigner, stored: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(stored)
    pod["metadata"]["annotations"][POD_ANNOTATION_SEAL] = signer.seal(pod)
    return pod


SIGNER = PodSigner(b"k" * 32)


@pytest.mark.parametrize("admission", ["sim-admission", "default-admission"])
@pytest.mark.parametrize("stage", ["apply", "interrupt"])
def test_our_pods_verify_as_a_real_api_server_stored_them(stage: str, admission: str) -> None:
    _, stored = _signed_and_stored(SIGNER, stage=stage, admission=admission)
    assert SIGNER.check(stored, created_here=True) == PodVerdict(None, sealed=False)
    assert SIGNER.check(stored).reason is UntrustedReason.UNSEALED, "no seal, not created by this process"
    sealed = _sealed(SIGNER, stored)
    assert SIGNER.check(sealed) == PodVerdict(None, sealed=True)
    assert SIGNER.check(trim_pod(sealed)) == PodVerdict(None, sealed=True), "the cache holds trimmed pods"


def test_signing_a_manifest_twice_gives_the_same_signature() -> None:
    manifest, _ = _recorded()
    first = SIGNER.sign(copy.deepcopy(manifest))["metadata"]["annotations"][POD_ANNOTATION_SIGNATURE]
    again = SIGNER.sign(SIGNER.sign(copy.deepcopy(manifest)))["metadata"]["annotations"][
        POD_ANNOTATION_SIGNATURE
    ]
    assert first == again and first.startswith(f"v{SIGNATURE_VERSION}:")


def _set(path: tuple[str | int, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        target: Any = pod
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return change


# Each bound field, tampered on a sealed pod as stored: (change, expected reason).
_IDENTITY, _SPEC = UntrustedReason.IDENTITY_MISMATCH, UntrustedReason.SPEC_MISMATCH
_L, _A = ("metadata", "labels"), ("metadata", "annotations")
_INIT = ("spec", "initContainers")
TAMPERED: dict[str, tuple[Callable[[dict[str, Any]], None], UntrustedReason]] = {
    "name": (_set(("metadata", "name"), "other"), _IDENTITY),
    "namespace": (_set(("metadata", "namespace"), "default"), _IDENTITY),
    "node": (_set(("spec", "nodeName"), "gpu-node-00001"), _IDENTITY),
    "owner uid": (_set(("metadata", "ownerReferences", 0, "uid"), "other-uid"), _IDENTITY),
    "stage label": (_set((*_L, constants.POD_LABEL_STAGE), "uninstall"), _IDENTITY),
    "package label": (_set((*_L, constants.POD_LABEL_PACKAGE), "x"), _IDENTITY),
    "extra label": (_set((*_L, "nodewright.io/extra"), "1"), _IDENTITY),
    "attempt": (_set((*_A, constants.POD_ANNOTATION_ATTEMPT), "9"), _IDENTITY),
    "spec hash": (_set((*_A, constants.POD_ANNOTATION_SPEC_HASH), "0" * 16), _IDENTITY),
    "image": (_set((*_INIT, 0, "image"), "evil.example.com/cryptominer:6.6.6"), _SPEC),
    "agent image": (_set((*_INIT, 1, "image"), "evil:1"), _SPEC),
    "command": (_set((*_INIT, 1, "command"), ["/bin/sh"]), _SPEC),
    "args": (_set((*_INIT, 1, "args"), ["apply", "/", "/tmp"]), _SPEC),
    "env": (_set((*_INIT, 1, "env"), []), _SPEC),
    "envFrom": (_set((*_INIT, 1, "envFrom"), [{"secretRef": {"name": "s"}}]), _SPEC),
    "volumeMounts": (_set((*_INIT, 1, "volumeMounts"), []), _SPEC),
    "securityContext": (_set((*_INIT, 1, "securityContext"), {"privileged": False}), _SPEC),
    "workingDir": (_set((*_INIT, 1, "workingDir"), "/x"), _SPEC),
    "volumes": (_set(("spec", "volumes", 0, "hostPath", "path"), "/etc"), _SPEC),
    "hostIPC": (_set(("spec", "hostIPC"), True), _SPEC),
    "hostPID": (_set(("spec", "hostPID"), False), _SPEC),
    "hostNetwork": (_set(("spec", "hostNetwork"), False), _SPEC),
    "serviceAccountName": (_set(("spec", "serviceAccountName"), "nodewright-operator"), _SPEC),
    "tolerations": (_set(("spec", "tolerations"), [{"operator": "Exists"}]), _SPEC),
    "pause container": (_set(("spec", "containers", 0, "image"), "evil:2"), _SPEC),
}  # fmt: skip


@pytest.mark.parametrize("field_name", sorted(TAMPERED))
def test_every_bound_field_tampered_fails_verification(field_name: str) -> None:
    _, stored = _signed_and_stored(SIGNER)
    pod = _sealed(SIGNER, stored)
    change, reason = TAMPERED[field_name]
    change(pod)
    assert SIGNER.check(pod).reason is reason
    assert SIGNER.check(pod, created_here=True).reason is reason, "our own uid does not excuse a change"
    assert SIGNER.check(trim_pod(pod)).reason is reason


def test_a_replay_with_a_new_uid_fails_even_with_every_annotation_copied() -> None:
    _, stored = _signed_and_stored(SIGNER)
    ours = _sealed(SIGNER, stored)
    replay = copy.deepcopy(ours)
    replay["metadata"]["uid"] = "11111111-0000-0000-0000-000000000000"  # the API server chose another
    assert SIGNER.check(replay).reason is UntrustedReason.REPLAYED
    assert SIGNER.check(replay, created_here=True).trusted, "... unless this process created that uid"
    resealed = copy.deepcopy(ours)
    resealed["metadata"]["annotations"][POD_ANNOTATION_SEAL] = "v2:" + "0" * 64
    assert SIGNER.check(resealed).reason is UntrustedReason.REPLAYED
    assert PodSigner(b"x" * 32).check(ours).reason is UntrustedReason.IDENTITY_MISMATCH, "another key"


@pytest.mark.parametrize(
    ("signature", "reason"),
    [
        (None, UntrustedReason.UNSIGNED),
        ("0" * 64, UntrustedReason.LEGACY_SIGNATURE),
        ("v3:" + "0" * 64 + ":" + "0" * 64, UntrustedReason.UNSIGNED),
        ("v2:" + "0" * 64, UntrustedReason.UNSIGNED),
        ("v2:" + "0" * 64 + ":" + "0" * 64, _IDENTITY),
        ("garbage", UntrustedReason.UNSIGNED),
    ],
)
def test_the_signature_version_rule(signature: str | None, reason: UntrustedReason) -> None:
    _, stored = _signed_and_stored(SIGNER)
    pod = _sealed(SIGNER, stored)
    if signature is None:
        del pod["metadata"]["annotations"][POD_ANNOTATION_SIGNATURE]
    else:
        pod["metadata"]["annotations"][POD_ANNOTATION_SIGNATURE] = signature
    assert SIGNER.check(pod).reason is reason
    assert SIGNER.check(pod, created_here=True).reason is reason


def test_a_v1_signed_pod_is_not_trusted_even_when_it_would_have_verified_under_v1() -> None:
    import hashlib
    import hmac

    _, stored = _recorded()
    meta, labels, annotations = (
        stored["metadata"],
        stored["metadata"]["labels"],
        stored["metadata"]["annotations"],
    )
    c = constants
    v1_message = "\x1f".join(
        (
            meta["name"], stored["spec"]["nodeName"], "nw-uid", labels[c.POD_LABEL_NODEWRIGHT],
            labels[c.POD_LABEL_PACKAGE], labels[c.POD_LABEL_VERSION], labels[c.POD_LABEL_STAGE],
            annotations[c.POD_ANNOTATION_ATTEMPT], annotations[c.POD_ANNOTATION_SPEC_HASH],
        )
    ).encode()  # fmt: skip
    annotations[POD_ANNOTATION_SIGNATURE] = hmac.new(b"k" * 32, v1_message, hashlib.sha256).hexdigest()
    assert SIGNER.check(stored).reason is UntrustedReason.LEGACY_SIGNATURE


def test_sealing_needs_a_created_pod() -> None:
    manifest, _ = _recorded()
    with pytest.raises(ValueError, match="uid and signature"):
        SIGNER.seal(SIGNER.sign(manifest))


class _FakeInformer:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.objects.get(key)


def _node(rv: str, value: str) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "resourceVersion": rv, "annotations": {"nodewright.io/x": value}}}


def test_write_through_prefers_newer_writes_until_the_cache_catches_up() -> None:
    informer = _FakeInformer()
    view = WriteThrough(informer, trim_node)  # type: ignore[arg-type]
    informer.objects["n1"] = trim_node(_node("10", "old"))
    view.record(_node("12", "mine"))
    assert view.get("n1")["metadata"]["annotations"]["nodewright.io/x"] == "mine"  # type: ignore[index]
    informer.objects["n1"] = trim_node(_node("11", "stale"))
    assert view.get("n1")["metadata"]["annotations"]["nodewright.io/x"] == "mine"  # type: ignore[index]
    informer.objects["n1"] = trim_node(_node("13", "newer"))
    assert view.get("n1")["metadata"]["annotations"]["nodewright.io/x"] == "newer"  # type: ignore[index]
    del informer.objects["n1"]
    view.record(_node("14", "gone"))
    assert view.get("n1") is None


def _nodewright(**extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": constants.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": "kernel", "resourceVersion": "1", **extra},
        "spec": {
            "packages": {
                "agent": {
                    "version": "1.0.0",
                    "image": "r/agent",
                    "uninstall": {"enabled": True, "apply": False},
                },
                "plain": {"version": "2.0.0", "image": "r/plain"},
            }
        },
    }


def test_deletion_uninstalls_only_packages_that_support_it() -> None:
    live = NodeWright.model_validate(_nodewright())
    assert effective_nodewright(live) is live
    deleting = NodeWright.model_validate(_nodewright(deletionTimestamp="2026-01-01T00:00:00Z"))
    effective = effective_nodewright(deleting)
    agent = effective.spec.packages["agent"].uninstall
    assert agent is not None and agent.apply
    assert effective.spec.packages["plain"].uninstall is None


def test_model_cache_reports_invalid_specs_instead_of_raising() -> None:
    cache = ModelCache()
    bad = _nodewright()
    bad["spec"]["priority"] = 0
    model, error = cache.nodewright(bad)
    assert model is None and error is not None and "priority" in error
    good = _nodewright()
    good["metadata"]["resourceVersion"] = "2"
    model, error = cache.nodewright(good)
    assert model is not None and error is None


# The Event recorder (series with counts, never dropping) is tested in tests/test_obs_recorder.py.


def _package_pod(name: str, node: str, uid: str, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}}


def test_pod_expectations_until_the_watch_reports_them() -> None:
    now = [0.0]
    exp = PodExpectations(clock=lambda: now[0])
    a, b = _package_pod("a", "n1", "ua"), _package_pod("b", "n2", "ub")
    exp.created(a)
    exp.created(b)
    assert exp.pending_on("n1", []) == [a]
    assert exp.pending_on("n1", [a]) == [], "the informer lists it: no duplicate"
    exp.observed(a)
    assert exp.pending_on("n1", []) == [], "a watch event settles the expectation"
    exp.deleted("ub")
    assert exp.deletion_pending("ub") and not exp.deletion_pending(None)
    exp.observed(b)
    assert exp.deletion_pending("ub"), "an update without deletionTimestamp is not the deletion"
    exp.observed(_package_pod("b", "n2", "ub", deleting=True))
    assert not exp.deletion_pending("ub")
    exp.deleted("ux")
    exp.observed_delete(_package_pod("x", "n3", "ux"))
    assert not exp.deletion_pending("ux")


def test_pod_expectations_expire_when_the_event_never_comes() -> None:
    now = [0.0]
    exp = PodExpectations(clock=lambda: now[0])
    exp.created(_package_pod("a", "n1", "ua"))
    exp.deleted("ub")
    now[0] = POD_EXPECTATION_TTL + 10
    exp.created(_package_pod("c", "n9", "uc"))  # any new expectation prunes the old ones
    assert exp.pending_on("n1", []) == []
    assert not exp.deletion_pending("ub")
    assert len(exp.pending_on("n9", [])) == 1


def test_pod_expectations_remember_the_uids_this_process_created_until_sealed_or_deleted() -> None:
    now = [0.0]
    exp = PodExpectations(clock=lambda: now[0])
    a = _package_pod("a", "n1", "ua")
    exp.created(a)
    assert exp.created_here("ua") and exp.seal_pending("ua")
    assert not exp.created_here("other") and not exp.created_here(None) and not exp.seal_pending("other")
    exp.observed(a)
    assert exp.created_here("ua"), "the watch reporting the pod does not make it less ours"
    sealed = copy.deepcopy(a)
    sealed["metadata"]["annotations"] = {POD_ANNOTATION_SEAL: "v2:x"}
    exp.sealed(sealed)
    assert exp.created_here("ua") and not exp.seal_pending("ua")
    assert exp.pending_on("n1", []) == [], "sealing an observed pod does not resurrect its expectation"
    b = _package_pod("b", "n1", "ub")
    exp.created(b)
    exp.sealed({**b, "metadata": {**b["metadata"], "annotations": {POD_ANNOTATION_SEAL: "v2:y"}}})
    [pending] = exp.pending_on("n1", [])
    assert pending["metadata"]["annotations"][POD_ANNOTATION_SEAL] == "v2:y", "the sealed copy stands in"
    exp.observed_delete(a)
    assert not exp.created_here("ua")
    now[0] = OWN_POD_MEMORY + 1
    exp.created(_package_pod("c", "n2", "uc"))  # prunes
    assert not exp.created_here("ub") and exp.created_here("uc")
