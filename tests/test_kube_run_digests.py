"""The memo of pod run digests (`kube.trim.RunDigests`): every answer equals the uncached
`plan.podspec.run_digest`, whatever it saw before, and a pod changed after it was seen -- an image
patched on a running pod -- never verifies with the digest of the spec it had."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodewright.api import constants
from nodewright.controller.signing import POD_ANNOTATION_SEAL, PodSigner, PodVerdict, UntrustedReason
from nodewright.kube.trim import RunDigests, trim_pod
from nodewright.plan import podspec
from tests.test_plan_run_spec import DATA, TAMPERS, _api_server_defaults, _package_pods


def _variants(pod: dict[str, Any], draw: st.DrawFn) -> list[dict[str, Any]]:
    """What the operator digests of one pod: as built, as stored, bound to its node or another, tampered."""
    stored = _api_server_defaults(pod, service_account_plugin=draw(st.booleans()))
    target = podspec.pod_node(pod)
    bound, elsewhere = copy.deepcopy(stored), copy.deepcopy(stored)
    bound["spec"]["nodeName"] = target
    elsewhere["spec"]["nodeName"] = f"{target}-other"
    reordered = copy.deepcopy(stored)
    reordered["spec"] = dict(reversed(list(stored["spec"].items())))
    unannotated = copy.deepcopy(bound)
    del unannotated["metadata"]["annotations"][constants.POD_ANNOTATION_NODE]
    tampered = copy.deepcopy(stored)
    try:
        TAMPERS[draw(st.sampled_from(sorted(TAMPERS)))](tampered)
    except (IndexError, KeyError):  # a tamper of a container or volume this pod does not have
        tampered["spec"]["hostIPC"] = True
    return [pod, stored, bound, elsewhere, reordered, unannotated, tampered]


@st.composite
def _digested(draw: st.DrawFn) -> list[dict[str, Any]]:
    pods = draw(st.lists(_package_pods(), min_size=1, max_size=3))
    seen = [variant for pod in pods for variant in _variants(pod, draw)]
    order = draw(st.lists(st.sampled_from(range(len(seen))), min_size=len(seen), max_size=3 * len(seen)))
    return [copy.deepcopy(seen[i]) for i in [*range(len(seen)), *order]]


@settings(max_examples=60, deadline=None)
@given(pods=_digested(), capacity=st.sampled_from([1, 3, 4096]))
def test_the_memo_answers_what_the_uncached_digest_does(pods: list[dict[str, Any]], capacity: int) -> None:
    digests = RunDigests(capacity)
    for pod in pods:
        assert digests.digest(pod) == podspec.run_digest(pod)
        assert trim_pod(pod, digests=digests) == trim_pod(pod)
    assert len(digests) <= capacity


def _stored_apply_pod() -> tuple[PodSigner, dict[str, Any]]:
    """A pod signed by the operator, stored by a real kube-apiserver, bound to its node with the seal."""
    recorded = json.loads((DATA / "kube-apiserver-v1.36.3-apply-default-admission.json").read_text())
    signer = PodSigner(b"k" * 32)
    manifest, stored = recorded["manifest"], recorded["stored"]
    signer.sign(manifest)
    stored["metadata"]["annotations"] = dict(manifest["metadata"]["annotations"])
    stored["spec"]["nodeName"] = podspec.pod_node(stored)
    stored["metadata"]["annotations"][POD_ANNOTATION_SEAL] = signer.seal(stored)
    return signer, stored


# `serviceAccount` (deprecated) is read only without `serviceAccountName`, which a stored pod has.
STORED_TAMPERS = sorted(set(TAMPERS) - {"deprecated service account"})


@pytest.mark.parametrize("tamper", STORED_TAMPERS)
def test_a_pod_changed_after_it_was_trusted_is_not_trusted(tamper: str) -> None:
    """Kubernetes lets a pod's container images (and a few other fields) be updated after create, with
    uid, labels, annotations and seal unchanged: the memo must give the changed spec its own digest."""
    signer, stored = _stored_apply_pod()
    assert signer.check(signer.trim(stored)) == PodVerdict(None, sealed=True)
    changed = copy.deepcopy(stored)
    TAMPERS[tamper](changed)
    assert podspec.run_digest(changed) != podspec.run_digest(stored)
    want = UntrustedReason.IDENTITY_MISMATCH if tamper == "node" else UntrustedReason.SPEC_MISMATCH
    assert signer.check(changed).reason is want
    assert signer.check(signer.trim(changed)).reason is want, "as the informer caches it"
    assert signer.check(signer.trim(stored)) == PodVerdict(None, sealed=True), "the original still verifies"


def test_a_pods_watch_events_reuse_the_digest_of_its_spec() -> None:
    """A pod is canonicalised once per distinct spec: as built (signing) and as stored (the create
    answer); its binding, seal and status changes on later watch events cost no canonicalisation."""
    recorded = json.loads((DATA / "kube-apiserver-v1.36.3-apply-default-admission.json").read_text())
    signer = PodSigner(b"k" * 32)
    manifest, stored = recorded["manifest"], recorded["stored"]
    signer.sign(manifest)
    stored["metadata"]["annotations"] = dict(manifest["metadata"]["annotations"])
    assert signer.check(stored, created_here=True).trusted  # the create answer
    assert signer.digests.computed == 2
    events = [copy.deepcopy(stored) for _ in range(5)]  # each watch event decodes a fresh object
    for i, event in enumerate(events):
        if i:
            event["spec"]["nodeName"] = podspec.pod_node(event)
            event["metadata"]["annotations"][POD_ANNOTATION_SEAL] = signer.seal(stored)
            event["metadata"]["resourceVersion"] = str(100 + i)
            event["status"] = {"phase": "Running", "initContainerStatuses": [{"name": f"c{i}"}]}
        assert signer.check(signer.trim(event), created_here=True).trusted
    assert signer.digests.computed == 2


def test_the_memo_keeps_a_bounded_number_of_specs() -> None:
    digests = RunDigests(8)
    pod = json.loads((DATA / "kube-apiserver-v1.36.3-apply-default-admission.json").read_text())["stored"]
    for i in range(12):
        changed = copy.deepcopy(pod)
        changed["spec"]["activeDeadlineSeconds"] = i + 1
        assert digests.digest(changed) == podspec.run_digest(changed)
    assert len(digests) == 8
    assert digests.computed == 12
    digests.digest(changed)
    assert digests.computed == 12, "the most recent is kept"


def test_a_spec_that_is_not_json_is_digested_each_time_and_not_kept() -> None:
    pod = json.loads((DATA / "kube-apiserver-v1.36.3-apply-default-admission.json").read_text())["stored"]
    pod["spec"]["nodeSelector"] = {"zone": object()}
    digests = RunDigests()
    with pytest.raises(TypeError):
        podspec.run_digest(pod)  # no digest exists for it: the memo makes up none either
    with pytest.raises(TypeError):
        digests.digest(pod)
    assert len(digests) == 0


# `run_digest` of the recorded pods as main computed it before the memo (signatures of pods created by
# an operator before this change must keep verifying).
DIGESTS_BEFORE_THE_MEMO = {
    "apply": "ce39cb07c7e24996c982e9fbb120906f52927f99a49915c4a14a1c41232c9605",
    "interrupt": "8258a211e727c7afab3b0e7c4fdb30c97e0c7b7fe8f791021d05083641e1789f",
}


@pytest.mark.parametrize("path", sorted(DATA.glob("kube-apiserver-*.json")), ids=lambda p: p.stem)
def test_digests_are_the_ones_computed_before_the_memo(path: Path) -> None:
    recorded = json.loads(path.read_text())
    want = DIGESTS_BEFORE_THE_MEMO["interrupt" if "interrupt" in path.stem else "apply"]
    bound = copy.deepcopy(recorded["stored"])
    bound["spec"]["nodeName"] = podspec.pod_node(bound)
    digests = RunDigests()
    for pod in (recorded["manifest"], recorded["stored"], bound):
        assert podspec.run_digest(pod) == want
        assert digests.digest(pod) == want
        assert trim_pod(pod, digests=digests)[podspec.RUN_DIGEST_FIELD] == want


def test_values_equal_in_python_but_not_in_json_get_their_own_digest() -> None:
    """1, 1.0 and True are equal in Python but not in the digested JSON: the memo keeps them apart."""
    pod = json.loads((DATA / "kube-apiserver-v1.36.3-apply-default-admission.json").read_text())["stored"]
    digests = RunDigests()
    seen = set()
    for value in (1, 1.0, True, "1"):
        changed = copy.deepcopy(pod)
        changed["spec"]["activeDeadlineSeconds"] = value
        assert digests.digest(changed) == podspec.run_digest(changed)
        seen.add(digests.digest(changed))
    assert len(seen) == 4
