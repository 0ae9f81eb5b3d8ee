"""Package pod signatures and seals: HMACs under a key only the operator holds (`PodSigner`).

Package pods are trusted only if their signature binds their identity and what they run, and their
seal binds the uid the API server gave the pod this operator created, both HMACs under a key only the
operator holds (a Secret in its namespace, `SIGNING_SECRET_NAME`). A pod that someone else labels as a
package pod -- forged, altered or re-created -- therefore never changes a node's state. What the node
controller does with the verdict is `controller.trust`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from nodewright.api import constants
from nodewright.kube.resources import JSON
from nodewright.kube.trim import RunDigests, trim_pod
from nodewright.plan import podspec

POD_ANNOTATION_SIGNATURE: Final = f"{constants.PREFIX}signature"
POD_ANNOTATION_SEAL: Final = f"{constants.PREFIX}seal"
SIGNING_SECRET_NAME: Final = "nodewright-operator-signing-key"
SIGNATURE_VERSION: Final = 2
_SIGNATURE_TAG: Final = f"v{SIGNATURE_VERSION}"
_LEGACY_SIGNATURE: Final = re.compile(r"^[0-9a-f]{64}$")
_MAC: Final = r"[0-9a-f]{64}"
_SIGNATURE: Final = re.compile(rf"^{_SIGNATURE_TAG}:(?P<identity>{_MAC}):(?P<run>{_MAC})$")
_SEAL: Final = re.compile(rf"^{_SIGNATURE_TAG}:(?P<mac>{_MAC})$")


class UntrustedReason(StrEnum):
    """Why a pod that looks like one of our package pods is not trusted (the metric's `reason`)."""

    UNSIGNED = "unsigned"
    LEGACY_SIGNATURE = "legacy_signature"
    IDENTITY_MISMATCH = "identity_mismatch"
    SPEC_MISMATCH = "spec_mismatch"
    UNSEALED = "unsealed"
    REPLAYED = "replayed"
    MUTATED_ON_CREATE = "mutated_on_create"


UNTRUSTED_EXPLANATIONS: Final[Mapping[UntrustedReason, str]] = {
    UntrustedReason.UNSIGNED: "it carries no operator signature",
    UntrustedReason.LEGACY_SIGNATURE: (
        "it carries a signature of the previous scheme (v1), which does not bind what the pod runs;"
        " its stage runs again in a new pod"
    ),
    UntrustedReason.IDENTITY_MISMATCH: (
        "its name, node, owner or nodewright.io labels/annotations differ from what the operator signed"
    ),
    UntrustedReason.SPEC_MISMATCH: (
        "what it runs (containers, images, commands, env, volumes, privileges, node) differs from what"
        " the operator signed"
    ),
    UntrustedReason.UNSEALED: (
        "its signature is valid but it was bound to its node without the operator's seal (a pod of an"
        " older operator version that stopped before sealing it, bound by someone else, or a copy);"
        " its stage runs again in a new pod"
    ),
    UntrustedReason.REPLAYED: "its seal names another pod uid: it is a re-creation of an operator pod",
    UntrustedReason.MUTATED_ON_CREATE: (
        "the API server stored it with a spec that differs from what the operator built (a mutating"
        " admission webhook?); exclude the operator namespace from webhooks that mutate pods"
    ),
}


@dataclass(frozen=True, slots=True)
class PodVerdict:
    """The outcome of `PodSigner.check`: trusted when `reason` is None; `sealed` when the seal verified."""

    reason: UntrustedReason | None
    sealed: bool = False
    bound: bool = True  # False: not bound to its node yet, so nothing of it has run

    @property
    def trusted(self) -> bool:
        return self.reason is None


def _mac(key: bytes, *parts: str) -> str:
    # A JSON array is an unambiguous encoding of the parts (no separator can be smuggled into one).
    message = json.dumps(list(parts), separators=(",", ":"), ensure_ascii=False).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class PodSigner:
    """Marks package pods as created by this operator, with HMAC-SHA256 under a key only it holds.

    Threat model: someone who may create, delete and label pods in the operator's namespace can copy
    every label and annotation of a pod (signature included), choose its spec, and re-create it after
    deleting ours; they cannot choose the uid or creationTimestamp the API server assigns, and they do
    not know the key (a Secret in the operator namespace). A package pod counts for a node's state only
    if all of these hold:

    1. **Signature** (annotation `nodewright.io/signature`, written before create):
       `v2:<identity MAC>:<run MAC>`. The identity MAC binds the pod's name, namespace, node (the
       `nodewright.io/target-node` annotation while unbound, `nodeName` once bound), the
       uids of its controller owner references and every `nodewright.io/` label and annotation (except
       signature and seal). The run MAC binds the name and the digest of what the pod runs:
       `plan.podspec.run_spec` -- the whole pod spec, canonicalised. The canonical form drops exactly
       what kube-apiserver adds or rewrites on create, so our own pods verify as stored; the rule,
       established by creating `build_pod` output on kube-apiserver v1.36 with and without the
       ServiceAccount and DefaultTolerationSeconds admission plugins and diffing the result (the e2e
       test `e2e/test_trust.py` repeats that check on every run), is listed in `run_spec`'s docstring.
       Anything else -- another image, command, env, volume, host namespace, security context, service
       account, node or toleration, an added container, probe or lifecycle hook -- fails the run MAC.
    2. **Seal** (annotation `nodewright.io/seal`): `v2:<MAC of the pod uid and its signature>`. Stage
       and interrupt pods are created **unbound** (`plan.podspec`: no `nodeName`, a `schedulerName` no
       scheduler serves), and the operator then binds them to their node with a `Binding` that carries
       the pod's uid as a precondition and the seal as an annotation: kube-apiserver sets `nodeName`
       and the seal in one write, so a pod runs only if it is sealed. A re-created pod gets a new uid,
       so a copied seal fails.
       - An unbound pod whose signature verifies has run nothing: it is trusted as "not started". The
         node controller binds it if its stage still expects it (also after an operator restart: the
         SIGKILL between create and bind costs nothing) and deletes it otherwise.
       - A bound pod must carry a valid seal, except one this process created bound itself (drift-check
         pods, read-only and never sealed; trusted by the uid from the create response in memory,
         `PodExpectations`). A bound, unsealed pod of anyone else -- a pod of an older operator version
         that sealed after create, or a pod someone with `pods/binding` placed before the operator did
         -- is not trusted, deleted, and its stage runs again.
       The uid lives on the pod rather than in the node state: one binding per pod (which any pod
       needs anyway), no extra write.

    Versions: the version tag (`v2`) is part of both values. Pods signed by the previous scheme (v1: a
    bare MAC over metadata only, which let a re-created pod with another image pass) are treated as
    lost work: reported as `legacy_signature`, deleted, and their stage runs again in a v2 pod. A later
    scheme bumps the tag and decides again.
    """

    key: bytes = field(repr=False)
    digests: RunDigests = field(default_factory=RunDigests, repr=False, compare=False)
    """The run digest of each distinct spec, computed once: shared with the pod informer's `trim_pod`,
    so a pod is canonicalised as built (signing) and as stored (the create answer), not on every
    check and watch event."""

    @staticmethod
    def generate_key() -> bytes:
        return secrets.token_bytes(32)

    @staticmethod
    def _identity(pod: Mapping[str, Any]) -> list[str]:
        meta = pod.get("metadata") or {}
        owners = sorted(
            str(o.get("uid", "")) for o in meta.get("ownerReferences") or () if o.get("controller")
        )
        ours = (POD_ANNOTATION_SIGNATURE, POD_ANNOTATION_SEAL)
        labels = sorted(
            f"{k}={v}" for k, v in (meta.get("labels") or {}).items() if str(k).startswith(constants.PREFIX)
        )
        annotations = sorted(
            f"{k}={v}"
            for k, v in (meta.get("annotations") or {}).items()
            if str(k).startswith(constants.PREFIX) and k not in ours
        )
        return [
            "nodewright-pod-identity",
            _SIGNATURE_TAG,
            str(meta.get("name", "")),
            str(meta.get("namespace", "")),
            podspec.pod_node(pod),
            ",".join(owners),
            "\n".join(labels),
            "\n".join(annotations),
        ]

    def _identity_mac(self, pod: Mapping[str, Any]) -> str:
        return _mac(self.key, *self._identity(pod))

    def _run_mac(self, pod: Mapping[str, Any]) -> str:
        name = str((pod.get("metadata") or {}).get("name", ""))
        return _mac(self.key, "nodewright-pod-run", _SIGNATURE_TAG, name, self.digests.digest(pod))

    def trim(self, pod: JSON) -> JSON:
        """`kube.trim.trim_pod` with this signer's digests: the transform of the pod informer (and of
        the pods remembered from create answers), so a watch event of a known spec costs a fingerprint,
        not a canonicalisation."""
        return trim_pod(pod, digests=self.digests)

    def _seal_mac(self, uid: str, signature: str) -> str:
        return _mac(self.key, "nodewright-pod-seal", _SIGNATURE_TAG, uid, signature)

    def sign(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Add the signature annotation to a pod manifest (in place, before create) and return it."""
        annotations = pod.setdefault("metadata", {}).setdefault("annotations", {})
        annotations.pop(POD_ANNOTATION_SEAL, None)
        annotations.pop(POD_ANNOTATION_SIGNATURE, None)
        signature = f"{_SIGNATURE_TAG}:{self._identity_mac(pod)}:{self._run_mac(pod)}"
        annotations[POD_ANNOTATION_SIGNATURE] = signature
        return pod

    def seal(self, pod: Mapping[str, Any]) -> str:
        """The seal annotation value of a created pod (its uid and signature as the API server holds them)."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        signature = str((meta.get("annotations") or {}).get(POD_ANNOTATION_SIGNATURE) or "")
        if not uid or not signature:
            raise ValueError(f"pod {meta.get('name')!r}: a seal needs the uid and signature of a created pod")
        return f"{_SIGNATURE_TAG}:{self._seal_mac(uid, signature)}"

    def check(self, pod: Mapping[str, Any], *, created_here: bool = False) -> PodVerdict:
        """Verify `pod` (full or trimmed); `created_here`: its uid came from this process's create."""
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        signature = annotations.get(POD_ANNOTATION_SIGNATURE)
        if not isinstance(signature, str):
            return PodVerdict(UntrustedReason.UNSIGNED)
        parsed = _SIGNATURE.match(signature)
        if parsed is None:
            legacy = _LEGACY_SIGNATURE.match(signature)
            return PodVerdict(UntrustedReason.LEGACY_SIGNATURE if legacy else UntrustedReason.UNSIGNED)
        if not hmac.compare_digest(parsed["identity"], self._identity_mac(pod)):
            return PodVerdict(UntrustedReason.IDENTITY_MISMATCH)
        if not hmac.compare_digest(parsed["run"], self._run_mac(pod)):
            return PodVerdict(UntrustedReason.SPEC_MISMATCH)
        if not (pod.get("spec") or {}).get("nodeName"):
            # Signed by the key holder and placed nowhere: nothing of it has run. Whoever holds its uid,
            # the operator may bind it (with a seal) if its stage still wants it, or delete it.
            return PodVerdict(None, sealed=False, bound=False)
        seal = annotations.get(POD_ANNOTATION_SEAL)
        sealed = (
            isinstance(seal, str)
            and (m := _SEAL.match(seal)) is not None
            and hmac.compare_digest(m["mac"], self._seal_mac(str(meta.get("uid") or ""), signature))
        )
        if sealed or created_here:
            return PodVerdict(None, sealed=sealed)
        return PodVerdict(UntrustedReason.UNSEALED if seal is None else UntrustedReason.REPLAYED)

    def verify(self, pod: Mapping[str, Any], *, created_here: bool = False) -> bool:
        return self.check(pod, created_here=created_here).trusted
