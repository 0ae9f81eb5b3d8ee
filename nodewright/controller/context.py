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

Trust. Package pods are trusted only if they carry a valid signature: an HMAC over their identity
(name, node, NodeWright uid, stage, attempt, spec hash) with a key that only the operator holds (a
Secret in its namespace). A pod that someone else labels as a package pod therefore never changes a
node's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import pydantic
import structlog

from nodewright.api import constants
from nodewright.api.models import DeploymentPolicy, NodeWright
from nodewright.api.nodestate import MalformedNodeState, NodeState, decode
from nodewright.kube.client import KubeClient
from nodewright.kube.informer import Informer
from nodewright.kube.resources import JSON
from nodewright.observability.metrics import OperatorMetrics
from nodewright.observability.tracing import RolloutTracer
from nodewright.plan import selectors
from nodewright.plan.rollout import Admission

log = structlog.get_logger("nodewright.context")

ADMISSION_ANNOTATION_PREFIX: Final = f"{constants.PREFIX}batch."
POD_ANNOTATION_SIGNATURE: Final = f"{constants.PREFIX}signature"
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
    doc = {
        "c": admission.compartment,
        "b": admission.batch,
        "o": admission.order,
        "f": admission.fingerprint,
        "at": admission.at,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def decode_admission(text: str) -> Admission:
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or set(doc) != {"c", "b", "o", "f", "at"}:
            raise MalformedAdmission(f"expected keys c, b, o, f, at; got {sorted(doc)!r}")
        compartment, batch, order, fingerprint, at = doc["c"], doc["b"], doc["o"], doc["f"], doc["at"]
        if not (
            isinstance(compartment, str)
            and isinstance(fingerprint, str)
            and isinstance(at, str)
            and type(batch) is int
            and type(order) is int
            and batch >= 1
            and order >= 0
        ):
            raise MalformedAdmission("field types: c, f, at strings; b >= 1 and o >= 0 integers")
    except (ValueError, TypeError) as exc:
        if isinstance(exc, MalformedAdmission):
            raise
        raise MalformedAdmission(f"not JSON: {exc}") from exc
    return Admission(compartment=compartment, batch=batch, order=order, fingerprint=fingerprint, at=at)


# ----------------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True, slots=True)
class OperatorOptions:
    namespace: str = "nodewright-system"
    agent_image: str = "nvcr.io/nvidia/skyhook/agent:v6.4.1"
    pause_image: str = "registry.k8s.io/pause:3.10"
    runtime_required_taint: str = f"{constants.DEFAULT_RUNTIME_REQUIRED_TAINT_KEY}=true:NoSchedule"
    copy_dir_root: str = "/var/lib/skyhook"
    log_root: str = "/var/log/skyhook"
    reboot_timeout: float = 1200.0
    reapply_on_reboot: bool = False
    resync_seconds: float = 600.0

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
    error: str | None


class ModelCache:
    """Parse cached objects into models once per resourceVersion; keep the validation error if any.

    A NodeWright that fails validation (the webhook was bypassed, or an older CRD) must not crash a
    reconcile: the controller reports the error in the object's status and leaves its nodes alone.
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
            parsed = _Parsed(rv, model_cls.model_validate(obj), None)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()[:10]
            )
            parsed = _Parsed(rv, None, problems)
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

    def forget(self, kind: str, name: str) -> None:
        self._entries.pop((kind, name), None)


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


class PodExpectations:
    """Package pods this process created or deleted that the pod informer has not reported yet.

    The same idea as client-go's ReplicaSet expectations: a state patch and a pod create are two
    events, and the node update often arrives first. Without this, the next reconcile sees the new
    state, no pod for it, and sends the create again (a 409) — or sends a second DELETE for a pod whose
    deletion is still on its way. Any watch event for a pod (add, update, delete) settles what we
    expected of it; the TTL only bounds memory when a watch restart swallowed that event.
    """

    def __init__(self, transform: Any = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._transform = transform or (lambda obj: obj)
        self._clock = clock
        self._created: dict[str, tuple[float, JSON]] = {}  # "<ns>/<name>" -> (when, trimmed pod)
        self._deleted: dict[str, float] = {}  # pod uid -> when the DELETE was accepted
        self._pruned_at = self._clock()

    @staticmethod
    def _key(pod: JSON) -> str:
        meta = pod.get("metadata") or {}
        return f"{meta.get('namespace')}/{meta.get('name')}"

    def created(self, pod: JSON) -> None:
        """A create succeeded: `pod` is the API server's answer."""
        self._prune()
        self._created[self._key(pod)] = (self._clock(), self._transform(pod))

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
        self._deleted.pop(str((pod.get("metadata") or {}).get("uid")), None)

    def deletion_pending(self, uid: str | None) -> bool:
        return uid is not None and uid in self._deleted

    def pending_on(self, node: str, known: Iterable[JSON]) -> list[JSON]:
        """Pods created on `node` that `known` (the informer's pods there) does not list yet."""
        if not self._created:
            return []
        names = {self._key(p) for p in known}
        out = []
        for key, (_, pod) in self._created.items():
            if key not in names and (pod.get("spec") or {}).get("nodeName") == node:
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


@dataclass(frozen=True, slots=True)
class PodSigner:
    """HMAC-SHA256 signatures that mark package pods as created by this operator."""

    key: bytes = field(repr=False)

    @staticmethod
    def generate_key() -> bytes:
        return secrets.token_bytes(32)

    @staticmethod
    def _message(pod: Mapping[str, Any]) -> bytes:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        owners = [o.get("uid", "") for o in meta.get("ownerReferences") or () if o.get("controller")]
        parts = (
            str(meta.get("name", "")),
            str((pod.get("spec") or {}).get("nodeName", "")),
            ",".join(sorted(owners)),
            str(labels.get(constants.POD_LABEL_NODEWRIGHT, "")),
            str(labels.get(constants.POD_LABEL_PACKAGE, "")),
            str(labels.get(constants.POD_LABEL_VERSION, "")),
            str(labels.get(constants.POD_LABEL_STAGE, "")),
            str(annotations.get(constants.POD_ANNOTATION_ATTEMPT, "")),
            str(annotations.get(constants.POD_ANNOTATION_SPEC_HASH, "")),
        )
        return "\x1f".join(parts).encode()

    def sign(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Add the signature annotation to a pod manifest (in place) and return it."""
        digest = hmac.new(self.key, self._message(pod), hashlib.sha256).hexdigest()
        pod.setdefault("metadata", {}).setdefault("annotations", {})[POD_ANNOTATION_SIGNATURE] = digest
        return pod

    def verify(self, pod: Mapping[str, Any]) -> bool:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        given = annotations.get(POD_ANNOTATION_SIGNATURE)
        if not isinstance(given, str):
            return False
        expected = hmac.new(self.key, self._message(pod), hashlib.sha256).hexdigest()
        return hmac.compare_digest(given, expected)


# ----------------------------------------------------------------------------------------------------
# Events


class EventRecorder:
    """Creates core/v1 Events in the background, dropping exact repeats within `dedupe_seconds`.

    Events about cluster-scoped objects (Nodes, NodeWrights) live in the `default` namespace, as
    client-go's recorder puts them. Events are best effort and must never slow a node down: `record`
    only queues (bounded; when full, the event is dropped and counted), and one background task sends
    them through a client with its own rate limit, so a burst of events never takes write budget from
    state transitions. A failure is logged, never raised.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        clock: Callable[[], datetime],
        instance: str,
        dedupe_seconds: float = 600.0,
        dedupe_size: int = 10_000,
        queue_size: int = 2000,
    ) -> None:
        self._client = client
        self._clock = clock
        self._instance = instance
        self._dedupe = dedupe_seconds
        self._dedupe_size = dedupe_size
        self._recent: dict[tuple[str, str, str, str], datetime] = {}
        self._queue: asyncio.Queue[tuple[JSON, str, str, str, datetime]] = asyncio.Queue(queue_size)
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0
        self.sent = 0

    async def record(
        self, *, kind: str, name: str, uid: str | None, reason: str, message: str, event_type: str = "Normal"
    ) -> None:
        now = self._clock()
        key = (kind, name, reason, message)
        last = self._recent.get(key)
        if last is not None and (now - last).total_seconds() < self._dedupe:
            return
        # Oldest first (a re-sent key moves to the end), so expiry only ever looks at the front:
        # O(1) per event, where rebuilding the map on every event once it was full cost O(map).
        self._recent.pop(key, None)
        self._recent[key] = now
        cutoff = now - timedelta(seconds=self._dedupe)
        while self._recent:
            oldest_key = next(iter(self._recent))
            if self._recent[oldest_key] >= cutoff and len(self._recent) <= self._dedupe_size:
                break
            del self._recent[oldest_key]
        api_version = "v1" if kind == "Node" else constants.API_VERSION
        involved: JSON = {
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"name": name, "uid": uid or ""},
        }
        try:
            self._queue.put_nowait((involved, reason, message, event_type, now))
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped % 100 == 1:
                log.warning("event queue full, dropping events", dropped=self.dropped)
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send(), name="event-recorder")

    async def _send(self) -> None:
        while True:
            involved, reason, message, event_type, now = await self._queue.get()
            try:
                await self._client.create_event(
                    "default",
                    involved=involved,
                    reason=reason,
                    message=message,
                    event_type=event_type,
                    instance=self._instance,
                    now=now,
                )
                self.sent += 1
            except Exception as exc:  # best effort by design (see class docstring)
                name = involved["metadata"]["name"]
                log.warning(
                    "event not recorded", kind=involved["kind"], name=name, reason=reason, error=str(exc)
                )
            finally:
                self._queue.task_done()

    async def flush(self) -> None:
        """Wait until every queued event was handled (callers bound it with `asyncio.timeout`)."""
        await self._queue.join()

    async def close(self, *, grace: float = 5.0) -> None:
        """Send what is queued (for at most `grace` seconds), then stop the sender."""
        if self._task is not None and not self._task.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


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

    def nodewright(self, name: str) -> tuple[JSON | None, NodeWright | None, str | None]:
        """(raw object, parsed model or None, validation error or None) of a cached NodeWright."""
        obj = self.nodewright_view.get(name)
        if obj is None:
            return None, None, None
        model, error = self.models.nodewright(obj)
        return obj, model, error

    def policy(self, name: str) -> DeploymentPolicy | None:
        obj = self.policies.get(name)
        if obj is None:
            return None
        model, _ = self.models.policy(obj)
        return model

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
