"""Shared state of the operator's reconcilers: caches, parsed models, node state with read-your-writes.

Two controllers work on one event loop (see `controller.operator`):

- the **rollout** controller, keyed by NodeWright name: compartments, budgets, batches. It decides
  which nodes may start work and records that decision on each node in the *admission* annotation
  `nodewright.io/batch.<nw>` (it is the only writer of that key), writes the NodeWright status, and
  keeps the runtime-required taints;
- the **node** controller, keyed by `<nw>/<node>`: the stage machine of one NodeWright on one node. It
  is the only writer of the state annotation `nodewright.io/state.<nw>`, the status label
  `nodewright.io/status.<nw>`, the node condition `nodewright.io/<nw>` and the cordon.

Because each key has exactly one writer and writes are JSON merge patches of single keys, the two never
overwrite each other. What remains is staleness: right after a write, the informer cache still holds the
old node until the watch event arrives, and a reconcile that ran on the stale copy would redo work. The
`WriteThrough` overlay closes that gap: every successful node patch records the returned object, and
reads prefer it until the cache has caught up (by resourceVersion, which for etcd-backed objects is
the etcd revision and increases monotonically).

Trust. Package pods are trusted only if their signature binds their identity and what they run, and
their seal binds the uid the API server gave the pod this operator created (`PodSigner`), both HMACs
under a key only the operator holds (a Secret in its namespace). A pod that someone else labels as a
package pod -- forged, altered or re-created -- therefore never changes a node's state.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

import pydantic
import structlog

from nodewright.api import constants, validation
from nodewright.api.models import DeploymentPolicy, NodeWright
from nodewright.api.nodestate import MalformedNodeState, NodeState, decode
from nodewright.kube.client import KubeClient
from nodewright.kube.informer import Informer
from nodewright.kube.resources import EVENTS, JSON, NotFound
from nodewright.observability.metrics import OperatorMetrics
from nodewright.observability.recorder import EventRecorder as SeriesRecorder
from nodewright.observability.tracing import RolloutTracer
from nodewright.plan import podspec, selectors
from nodewright.plan.policy import PolicyInvalid
from nodewright.plan.rollout import Admission

log = structlog.get_logger("nodewright.context")

ADMISSION_ANNOTATION_PREFIX: Final = f"{constants.PREFIX}batch."
POD_ANNOTATION_SIGNATURE: Final = f"{constants.PREFIX}signature"
POD_ANNOTATION_SEAL: Final = f"{constants.PREFIX}seal"
SIGNING_SECRET_NAME: Final = "nodewright-operator-signing-key"
NODE_KEY_SEPARATOR: Final = "/"


def admission_annotation(nodewright: str) -> str:
    return f"{ADMISSION_ANNOTATION_PREFIX}{nodewright}"


# ----------------------------------------------------------------------------------------------------
# Keys


def node_key(nodewright: str, node: str) -> str:
    """Queue key of the node controller. Neither name may contain '/' (DNS subdomain names)."""
    return f"{nodewright}{NODE_KEY_SEPARATOR}{node}"


def split_node_key(key: str) -> tuple[str, str]:
    nodewright, _, node = key.partition(NODE_KEY_SEPARATOR)
    return nodewright, node


# ----------------------------------------------------------------------------------------------------
# Admission annotation codec (written by the rollout controller, read by the node controller)


class MalformedAdmission(ValueError):
    pass


def encode_admission(admission: Admission) -> str:
    doc: dict[str, object] = {
        "c": admission.compartment,
        "b": admission.batch,
        "o": admission.order,
        "f": admission.fingerprint,
        "at": admission.at,
    }
    if admission.consumed:
        doc["d"] = True
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


_ADMISSION_KEYS: Final = frozenset({"c", "b", "o", "f", "at"})


def decode_admission(text: str) -> Admission:
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or not _ADMISSION_KEYS <= set(doc) <= _ADMISSION_KEYS | {"d"}:
            found = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
            raise MalformedAdmission(f"expected keys c, b, o, f, at (and optionally d); got {found!r}")
        compartment, batch, order, fingerprint, at = doc["c"], doc["b"], doc["o"], doc["f"], doc["at"]
        consumed = doc.get("d", False)
        if not (
            isinstance(compartment, str)
            and isinstance(fingerprint, str)
            and isinstance(at, str)
            and type(batch) is int
            and type(order) is int
            and batch >= 1
            and order >= 0
            and isinstance(consumed, bool)
        ):
            raise MalformedAdmission("field types: c, f, at strings; b >= 1 and o >= 0 integers; d boolean")
    except (ValueError, TypeError) as exc:
        if isinstance(exc, MalformedAdmission):
            raise
        raise MalformedAdmission(f"not JSON: {exc}") from exc
    # Every node of a rollout carries the same compartment and fingerprint, every node of a batch the
    # same time, and admissions outlive the rollout: one copy of each, not one per node.
    return Admission(
        compartment=sys.intern(compartment),
        batch=batch,
        order=order,
        fingerprint=sys.intern(fingerprint),
        at=sys.intern(at),
        consumed=consumed,
    )


# ----------------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True, slots=True)
class OperatorOptions:
    namespace: str = "nodewright-system"
    agent_image: str = constants.DEFAULT_AGENT_IMAGE
    pause_image: str = "registry.k8s.io/pause:3.10"
    runtime_required_taint: str = f"{constants.DEFAULT_RUNTIME_REQUIRED_TAINT_KEY}=true:NoSchedule"
    copy_dir_root: str = "/var/lib/skyhook"
    log_root: str = "/var/log/skyhook"
    reboot_timeout: float = 1200.0
    reapply_on_reboot: bool = False
    # Run dependents' installs in the pod of the package they depend on (plan.node `chain_for`); on by
    # default since it is the faster mode (fewer pods and node writes); `--no-chain-packages` turns it off.
    chain_packages: bool = True
    resync_seconds: float = 600.0
    # drain.policy force deletes pods (needs pod delete in every namespace; the chart grants it only with
    # drain.allowForce). When False such drains keep evicting and say why they do not force.
    allow_force_drain: bool = True
    # Keep the log tail of succeeded attempts too (failed ones are always kept): controller.logstore.
    keep_succeeded_logs: bool = False
    # Drift-check pods in flight at once across all NodeWrights (controller.drift).
    drift_check_limit: int = 4
    # Admissions one rollout pass writes per compartment; the rest of a bigger batch follows in the
    # next passes (plan.rollout "Long batches"), so no pass holds up the other compartments for long.
    admissions_per_pass: int = 32

    @property
    def runtime_required_taint_key(self) -> str:
        return parse_taint(self.runtime_required_taint)[0]


def parse_taint(text: str) -> tuple[str, str | None, str]:
    """`key[=value]:Effect` (kubectl syntax) → (key, value, effect)."""
    spec, sep, effect = text.rpartition(":")
    if not sep or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise ValueError(f"taint {text!r}: expected key[=value]:NoSchedule|PreferNoSchedule|NoExecute")
    key, has_value, value = spec.partition("=")
    if not key:
        raise ValueError(f"taint {text!r}: empty key")
    return key, (value if has_value else None), effect


# ----------------------------------------------------------------------------------------------------
# Parsed models, cached per resourceVersion


@dataclass(slots=True)
class _Parsed:
    resource_version: str
    model: NodeWright | DeploymentPolicy | None
    problems: tuple[str, ...] = ()

    @property
    def error(self) -> str | None:
        return "; ".join(self.problems) if self.model is None else None


MAX_PROBLEMS = 10


class ModelCache:
    """Parse cached objects into models once per resourceVersion; keep the validation problems if any.

    A NodeWright that fails validation (the webhook was bypassed, or an older CRD) must not crash a
    reconcile: the controller reports the error in the object's status and leaves its nodes alone. A
    DeploymentPolicy that fails validation (stored before a rule existed, e.g. a blackout on 2026-02-30)
    is reported on every NodeWright that uses it (`plan.policy.PolicyInvalid`), with the webhook's own
    words: each problem is `field path: what is wrong and what to do`.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], _Parsed] = {}

    def _parse(self, kind: str, obj: JSON) -> _Parsed:
        meta = obj.get("metadata") or {}
        key = (kind, str(meta.get("name")))
        rv = str(meta.get("resourceVersion") or "")
        cached = self._entries.get(key)
        if cached is not None and cached.resource_version == rv:
            return cached
        model_cls: type[NodeWright] | type[DeploymentPolicy] = (
            NodeWright if kind == constants.KIND_NODEWRIGHT else DeploymentPolicy
        )
        try:
            parsed = _Parsed(rv, model_cls.model_validate(obj))
        except pydantic.ValidationError as exc:
            parsed = _Parsed(rv, None, _problems(kind, obj, exc))
        self._entries[key] = parsed
        return parsed

    def nodewright(self, obj: JSON) -> tuple[NodeWright | None, str | None]:
        parsed = self._parse(constants.KIND_NODEWRIGHT, obj)
        model = parsed.model if isinstance(parsed.model, NodeWright) else None
        return model, parsed.error

    def policy(self, obj: JSON) -> tuple[DeploymentPolicy | None, str | None]:
        parsed = self._parse(constants.KIND_POLICY, obj)
        model = parsed.model if isinstance(parsed.model, DeploymentPolicy) else None
        return model, parsed.error

    def policy_or_problems(self, obj: JSON) -> DeploymentPolicy | PolicyInvalid:
        """The policy's model, or what is wrong with it (for the NodeWrights that use it)."""
        parsed = self._parse(constants.KIND_POLICY, obj)
        if isinstance(parsed.model, DeploymentPolicy):
            return parsed.model
        return PolicyInvalid(str((obj.get("metadata") or {}).get("name")), parsed.problems)

    def forget(self, kind: str, name: str) -> None:
        self._entries.pop((kind, name), None)


def _problems(kind: str, obj: JSON, exc: pydantic.ValidationError) -> tuple[str, ...]:
    """`field path: message` lines for an object the models refuse, at most `MAX_PROBLEMS`.

    For a policy these are the webhook's messages (they say why, e.g. "February 2026 has 28 days"); the
    problems the model itself raises are the fallback, and what a NodeWright gets (its webhook rules
    need cluster facts this cache does not have).
    """
    found = validation.validate_deploymentpolicy(obj).errors if kind == constants.KIND_POLICY else []
    found = found or validation.model_errors(exc)
    return tuple(str(e) for e in found[:MAX_PROBLEMS])


# ----------------------------------------------------------------------------------------------------
# Read-your-writes overlay for nodes


def _rv(obj: JSON) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class WriteThrough:
    """The newest objects this process wrote, until the informer cache has caught up."""

    def __init__(self, informer: Informer, transform: Any = None) -> None:
        self._nodes = informer
        self._transform = transform or (lambda obj: obj)
        self._written: dict[str, JSON] = {}

    def record(self, node: JSON) -> None:
        """Remember a node object returned by a successful write (full or trimmed)."""
        trimmed = self._transform(node)
        name = str(trimmed["metadata"]["name"])
        current = self._written.get(name)
        if current is None or _rv(trimmed) >= _rv(current):
            self._written[name] = trimmed

    def get(self, name: str) -> JSON | None:
        cached = self._nodes.get(name)
        written = self._written.get(name)
        if written is None:
            return cached
        if cached is None:
            # Deleted from the cache after our write: the node is gone.
            self._written.pop(name, None)
            return None
        if _rv(cached) >= _rv(written):
            self._written.pop(name, None)
            return cached
        return written

    def forget(self, name: str) -> None:
        self._written.pop(name, None)


# ----------------------------------------------------------------------------------------------------
# Expectations for package pods


POD_EXPECTATION_TTL: Final = 60.0
"""Seconds after which an unobserved expectation is dropped (a watch that lost the event relists)."""
OWN_POD_MEMORY: Final = 86_400.0
"""Seconds this process vouches for the uid of a pod it created. Bound pods carry their seal from the
binding on; the memory matters for pods created bound and never sealed (drift checks, which finish in
minutes). Entries normally go with the pod's delete event, so this only bounds what a missed event
leaves behind."""


class PodExpectations:
    """Package pods this process created or deleted that the pod informer has not reported yet.

    The same idea as client-go's ReplicaSet expectations: a state patch and a pod create are two
    events, and the node update often arrives first. Without this, the next reconcile sees the new
    state, no pod for it, and sends the create again (a 409) — or sends a second DELETE for a pod whose
    deletion is still on its way. Any watch event for a pod (add, update, delete) settles what we
    expected of it; the TTL only bounds memory when a watch restart swallowed that event.

    It also remembers the uid of every pod this process created (from the create response) and whether
    it was bound with its seal (see `PodSigner`): for a pod created bound and never sealed (drift
    checks), that uid is what makes the pod ours. Entries go when the pod is deleted, or after
    `OWN_POD_MEMORY` seconds.
    """

    def __init__(self, transform: Any = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._transform = transform or (lambda obj: obj)
        self._clock = clock
        self._created: dict[str, tuple[float, JSON]] = {}  # "<ns>/<name>" -> (when, trimmed pod)
        self._deleted: dict[str, float] = {}  # pod uid -> when the DELETE was accepted
        self._own: dict[str, tuple[float, bool]] = {}  # uid of a pod we created -> (when, seal written)
        self._pruned_at = self._clock()

    @staticmethod
    def _key(pod: JSON) -> str:
        meta = pod.get("metadata") or {}
        return f"{meta.get('namespace')}/{meta.get('name')}"

    def created(self, pod: JSON) -> None:
        """A create succeeded: `pod` is the API server's answer."""
        self._prune()
        now = self._clock()
        self._created[self._key(pod)] = (now, self._transform(pod))
        uid = (pod.get("metadata") or {}).get("uid")
        if uid:
            self._own[str(uid)] = (now, False)

    def sealed(self, pod: JSON) -> None:
        """The seal of a pod we created was written: `pod` is the API server's answer to that patch."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if uid in self._own:
            self._own[uid] = (self._own[uid][0], True)
        key = self._key(pod)
        if key in self._created:  # not observed yet: the sealed copy stands in for it
            self._created[key] = (self._created[key][0], self._transform(pod))

    def forget(self, pod: JSON) -> None:
        """A pod we created and deleted again at once (its binding was refused): expect nothing of it."""
        self._created.pop(self._key(pod), None)
        self._own.pop(str((pod.get("metadata") or {}).get("uid") or ""), None)

    def created_here(self, uid: str | None) -> bool:
        """Whether this process created the pod with this uid (and still remembers it)."""
        return uid is not None and uid in self._own

    def sealed_here(self, uid: str | None) -> bool:
        """A pod this process created and has bound with its seal (the watch may not show it yet)."""
        own = self._own.get(uid or "")
        return own is not None and own[1]

    def seal_pending(self, uid: str | None) -> bool:
        """A pod this process created whose seal has not been written yet."""
        own = self._own.get(uid or "")
        return own is not None and not own[1]

    def deleted(self, uid: str) -> None:
        self._prune()
        self._deleted[uid] = self._clock()

    def observed(self, pod: JSON) -> None:
        """A watch event for `pod`: the informer knows it now."""
        if self._created:
            self._created.pop(self._key(pod), None)
        if self._deleted and (meta := pod.get("metadata") or {}).get("deletionTimestamp"):
            self._deleted.pop(str(meta.get("uid")), None)

    def observed_delete(self, pod: JSON) -> None:
        self.observed(pod)
        uid = str((pod.get("metadata") or {}).get("uid"))
        self._deleted.pop(uid, None)
        self._own.pop(uid, None)

    def deletion_pending(self, uid: str | None) -> bool:
        return uid is not None and uid in self._deleted

    def pending_on(self, node: str, known: Iterable[JSON]) -> list[JSON]:
        """Pods created on `node` that `known` (the informer's pods there) does not list yet."""
        if not self._created:
            return []
        names = {self._key(p) for p in known}
        out = []
        for key, (_, pod) in self._created.items():
            if key not in names and podspec.pod_node(pod) == node:
                out.append(pod)
        return out

    def _prune(self) -> None:
        now = self._clock()
        if now - self._pruned_at < POD_EXPECTATION_TTL / 10:
            return
        self._pruned_at = now
        horizon = now - POD_EXPECTATION_TTL
        for key in [k for k, (at, _) in self._created.items() if at < horizon]:
            del self._created[key]
        for uid in [u for u, at in self._deleted.items() if at < horizon]:
            del self._deleted[uid]
        own_horizon = now - OWN_POD_MEMORY
        for uid in [u for u, (at, _) in self._own.items() if at < own_horizon]:
            del self._own[uid]


# ----------------------------------------------------------------------------------------------------
# Node helpers


def node_labels(node: JSON) -> Mapping[str, str]:
    labels: Mapping[str, str] = (node.get("metadata") or {}).get("labels") or {}
    return labels


def node_annotations(node: JSON) -> Mapping[str, str]:
    annotations: Mapping[str, str] = (node.get("metadata") or {}).get("annotations") or {}
    return annotations


def node_state(node: JSON, nodewright: str) -> NodeState | None:
    """The decoded state of `nodewright` on `node`; None when absent; raises MalformedNodeState."""
    text = node_annotations(node).get(constants.state_annotation(nodewright))
    if text is None:
        return None
    return decode(text)


def try_node_state(node: JSON, nodewright: str) -> tuple[NodeState | None, str | None]:
    try:
        return node_state(node, nodewright), None
    except MalformedNodeState as exc:
        return None, str(exc)


def node_admission(node: JSON, nodewright: str) -> Admission | None:
    """The rollout's admission of `node` for `nodewright`; a malformed one counts as absent."""
    text = node_annotations(node).get(admission_annotation(nodewright))
    if text is None:
        return None
    try:
        return decode_admission(text)
    except MalformedAdmission as exc:
        log.warning("ignoring malformed admission", node=node["metadata"]["name"], error=str(exc))
        return None


def matches_nodewright(nodewright: NodeWright, node: JSON) -> bool:
    return selectors.matches(nodewright.spec.node_selectors, node_labels(node))


def matched_nodes(nodewright: NodeWright, nodes: Iterable[JSON]) -> list[JSON]:
    return [node for node in nodes if matches_nodewright(nodewright, node)]


# ----------------------------------------------------------------------------------------------------
# Pod signatures


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
        return _mac(self.key, "nodewright-pod-run", _SIGNATURE_TAG, name, podspec.run_digest(pod))

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


# ----------------------------------------------------------------------------------------------------
# Events


class _KubeEvents:
    """`observability.recorder.EventSink` over the operator's client."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def create_event(self, namespace: str, body: JSON) -> JSON:
        return await self._client.create(EVENTS, body, namespace=namespace)

    async def patch_event(self, namespace: str, name: str, patch: JSON) -> bool:
        try:
            await self._client.patch(EVENTS, name, patch, namespace=namespace)
        except NotFound:
            return False
        return True


class EventRecorder(SeriesRecorder):
    """Events as series with counts, never dropped (`nodewright.observability.recorder`), sent through
    `client` (the operator gives Events a client with its own rate limit)."""

    def __init__(self, client: KubeClient, *, clock: Callable[[], datetime], instance: str) -> None:
        super().__init__(_KubeEvents(client), clock=clock, instance=instance)


# ----------------------------------------------------------------------------------------------------
# The runtime shared by the reconcilers


@dataclass
class Runtime:
    """Everything the reconcilers share; built once by `controller.operator.wire`.

    `enqueue_rollout(nw)` and `enqueue_node(nw, node)` are set at wiring time and add keys to the two
    controllers' queues (deduplicated, safe to call from informer handlers and reconcilers).
    """

    client: KubeClient
    options: OperatorOptions
    nodewrights: Informer
    policies: Informer
    nodes: Informer
    pods: Informer
    models: ModelCache
    node_view: WriteThrough
    nodewright_view: WriteThrough
    signer: PodSigner
    metrics: OperatorMetrics
    tracer: RolloutTracer
    events: EventRecorder
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    enqueue_rollout: Callable[[str], None] = field(default=lambda name: None)
    enqueue_node: Callable[[str, str], None] = field(default=lambda nw, node: None)
    enqueue_node_after: Callable[[str, str, float], None] = field(default=lambda nw, node, s: None)
    pod_expectations: PodExpectations = field(default_factory=PodExpectations)

    def __post_init__(self) -> None:
        self.metrics.init_untrusted_pods(reason.value for reason in UntrustedReason)

    def nodewright(self, name: str) -> tuple[JSON | None, NodeWright | None, str | None]:
        """(raw object, parsed model or None, validation error or None) of a cached NodeWright."""
        obj = self.nodewright_view.get(name)
        if obj is None:
            return None, None, None
        model, error = self.models.nodewright(obj)
        return obj, model, error

    def policy(self, name: str) -> DeploymentPolicy | PolicyInvalid | None:
        """The cached DeploymentPolicy `name`; PolicyInvalid when it fails validation; None when absent."""
        obj = self.policies.get(name)
        if obj is None:
            return None
        return self.models.policy_or_problems(obj)

    def node(self, name: str) -> JSON | None:
        """The newest known node object (our own writes included)."""
        return self.node_view.get(name)


def effective_nodewright(nodewright: NodeWright) -> NodeWright:
    """The spec the nodes must converge to: on deletion, every `uninstall.enabled` package uninstalls.

    Deleting a NodeWright runs the uninstall of the packages that support it (reference §2.16) before
    the finalizer is released. Expressing that as `uninstall.apply: true` makes it flow through the same
    stage machine and, because the spec fingerprint changes, through the same batches and budgets as any
    other change (invariant I2).
    """
    if not nodewright.metadata.deletion_timestamp:
        return nodewright
    packages = {}
    for name, pkg in nodewright.spec.packages.items():
        if pkg.uninstall is not None and pkg.uninstall.enabled and not pkg.uninstall.apply:
            pkg = pkg.model_copy(update={"uninstall": pkg.uninstall.model_copy(update={"apply": True})})
        packages[name] = pkg
    spec = nodewright.spec.model_copy(update={"packages": packages})
    return nodewright.model_copy(update={"spec": spec})
