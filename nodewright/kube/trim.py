"""Transforms that trim watched objects before they are cached (client-go's `TransformFunc`).

A Node from the API server is 10-30 KiB of JSON (images, managed fields, addresses, capacity...). The
controller needs a small fraction of it, and at 10,000 nodes the difference is hundreds of MiB. A
transform runs on every listed or watched object before it reaches the store and the handlers, so
everything downstream sees only trimmed objects. Transforms must be idempotent (a trimmed object
trimmed again is unchanged) — client-go documents the same requirement, and tests check it.

Trimmed objects keep the Kubernetes shape (`metadata`/`spec`/`status`), so code reads them as it
would read a full object, and the kept subset is listed here in one place.

Interning: label and annotation keys repeat on every node (`nvidia.com/gpu.product`, ...) and most
label values repeat across a fleet (`H100-SXM5-80GB`, `true`, zone names). `json.loads` creates fresh
string objects for each occurrence; `sys.intern` makes all nodes share one copy. Unique values (names,
uids, resourceVersions, timestamps) are not interned: there is nothing to share.

Node labels are `FrozenLabels`: a GPU node carries 60-80 labels (node-feature-discovery, GPU feature
discovery, topology), and the nodes of a pool carry the same keys. A dict of 73 labels is 1.6 KiB; a
`FrozenLabels` holds only a tuple of the values (0.6 KiB) and shares its key index with every node that
has the same keys — 1 MiB less per 1,000 nodes. It is a read-only `Mapping` (the cache is read-only
anyway); code that needs a dict of its own makes one with `dict(labels)`.
"""

from __future__ import annotations

import hashlib
import pickle
import sys
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any, Final, overload

from nodewright.api.constants import PREFIX
from nodewright.kube.resources import JSON
from nodewright.plan.podspec import RUN_DIGEST_FIELD, run_digest, run_spec_source

_intern = sys.intern

# Annotations kept on nodes besides our own `nodewright.io/...` ones. The cluster autoscaler's
# scale-down-disabled annotation: the controller sets it while a node is mid-upgrade (so the autoscaler
# does not delete a node we are working on) and must see whether someone else set it already.
KEPT_NODE_ANNOTATIONS: Final = frozenset({"cluster-autoscaler.kubernetes.io/scale-down-disabled"})

# The node conditions the controller reads: the kubelet's Ready, our own (type prefix nodewright.io/) and,
# type and status only, any other that is True (node-condition health gates).
READY: Final = "Ready"


# Key tuple -> key index, shared by every FrozenLabels with those keys. A fleet has a handful of key sets
# (one per node pool, plus our status labels); the bound only guards against a pathological churn of
# keys, and a cleared cache costs nothing but sharing for the maps built next.
_INDEXES: dict[tuple[str, ...], dict[str, int]] = {}
MAX_SHARED_INDEXES: Final = 4096


class FrozenLabels(Mapping[str, str]):
    """An immutable label map whose key index is shared by all maps with the same keys, in order."""

    __slots__ = ("_index", "_values")
    _index: dict[str, int]
    _values: tuple[str, ...]

    def __init__(self, labels: Mapping[str, str] | None = None) -> None:
        items = labels.items() if labels is not None else ()
        keys = tuple(_intern(k) for k, _ in items)
        index = _INDEXES.get(keys)
        if index is None:
            if len(_INDEXES) >= MAX_SHARED_INDEXES:
                _INDEXES.clear()
            index = _INDEXES[keys] = {k: i for i, k in enumerate(keys)}
        self._index = index
        self._values = tuple(_intern(v) if isinstance(v, str) else v for _, v in items)

    def __getitem__(self, key: str) -> str:
        return self._values[self._index[key]]

    @overload
    def get(self, key: str, /) -> str | None: ...
    @overload
    def get(self, key: str, /, default: str) -> str: ...
    @overload
    def get(self, key: str, /, default: Any) -> Any: ...
    def get(self, key: str, /, default: Any = None) -> Any:
        position = self._index.get(key)
        return default if position is None else self._values[position]

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenLabels) and other._index is self._index:
            return other._values == self._values
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # equal to dicts, which are unhashable

    def __repr__(self) -> str:
        return f"FrozenLabels({dict(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenLabels, (dict(self),))


def _interned_map(values: Any, *, keep: Any = None) -> dict[str, str]:
    if not isinstance(values, Mapping):
        return {}
    if keep is None:
        return {_intern(k): _intern(v) if isinstance(v, str) else v for k, v in values.items()}
    return {_intern(k): _intern(v) if isinstance(v, str) else v for k, v in values.items() if keep(k)}


def _keep_node_annotation(key: str) -> bool:
    return key.startswith(PREFIX) or key in KEPT_NODE_ANNOTATIONS


def _meta(meta: JSON, *, namespace: bool) -> JSON:
    out: JSON = {
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
        # Objects are created in bursts (a node pool, a batch's pods): one string per second, shared.
        "creationTimestamp": _interned(meta.get("creationTimestamp")),
    }
    if namespace:
        out["namespace"] = _intern(meta.get("namespace") or "")
    if meta.get("deletionTimestamp"):
        out["deletionTimestamp"] = meta["deletionTimestamp"]
    return out


def _interned(value: Any) -> Any:
    return _intern(value) if isinstance(value, str) else value


def _condition(cond: JSON, *, full: bool) -> JSON:
    """Type, status and transition time (and for ours, reason and message), all interned: the fleet's
    nodes share a handful of reasons and messages, and a rollout's batches move together, so their
    transition times repeat too."""
    out: JSON = {"type": _intern(str(cond.get("type"))), "status": _intern(str(cond.get("status")))}
    if full:
        for field in ("reason", "message", "lastTransitionTime"):
            if cond.get(field) is not None:
                out[field] = _interned(cond[field])
    elif cond.get("lastTransitionTime"):
        out["lastTransitionTime"] = _interned(cond["lastTransitionTime"])
    return out


def _ours_or_ready(cond: JSON) -> bool:
    return cond.get("type") == READY or str(cond.get("type", "")).startswith(PREFIX)


def _true_condition(cond: JSON) -> JSON:
    """Another condition that is True (node-problem-detector's, the kubelet's pressure ones): type and
    status only, for the node-condition health gates (`controller.gates`). Healthy nodes have none, so
    this costs nothing in a healthy fleet."""
    return {"type": _intern(str(cond.get("type"))), "status": "True"}


def trim_node(node: JSON) -> JSON:
    """Name, uid, RV, creation time, labels, our annotations, taints, unschedulable, Ready, ours,
    bootID, kernel and OS image."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    out_meta = _meta(meta, namespace=False)
    labels = meta.get("labels")
    if not isinstance(labels, FrozenLabels):
        labels = FrozenLabels(labels if isinstance(labels, Mapping) else None)
    out_meta["labels"] = labels
    out_meta["annotations"] = _interned_map(meta.get("annotations"), keep=_keep_node_annotation)
    out_spec: JSON = {}
    if spec.get("unschedulable"):
        out_spec["unschedulable"] = True
    taints = spec.get("taints")
    if taints:
        out_spec["taints"] = [
            {k: _intern(v) if isinstance(v, str) else v for k, v in taint.items()} for taint in taints
        ]
    conditions = [
        _condition(c, full=c.get("type") != READY) if _ours_or_ready(c) else _true_condition(c)
        for c in status.get("conditions") or ()
        if _ours_or_ready(c) or c.get("status") == "True"
    ]
    out_status: JSON = {"conditions": conditions}
    # bootID (reboot completion, drift re-checks); kernel and OS image (drift re-checks): interned, since
    # a fleet shares a handful of values.
    info = status.get("nodeInfo") or {}
    kept = {key: _intern(str(info[key])) for key in _NODE_INFO if info.get(key)}
    if kept:
        out_status["nodeInfo"] = kept
    return {"metadata": out_meta, "spec": out_spec, "status": out_status}


_NODE_INFO = ("bootID", "kernelVersion", "osImage")


def _container(container: JSON) -> JSON:
    out: JSON = {"name": _intern(str(container.get("name"))), "image": _intern(str(container.get("image")))}
    env = container.get("env")
    if env:
        out["env"] = env
    return out


_STATE_KEYS = ("exitCode", "reason", "message")
MAX_STATE_MESSAGE: Final = 512
_TERMINATED_KEYS = (*_STATE_KEYS, "startedAt", "finishedAt")


def _container_status(status: JSON) -> JSON:
    out: JSON = {
        "name": _intern(str(status.get("name"))),
        "ready": bool(status.get("ready")),
        "restartCount": int(status.get("restartCount") or 0),
    }
    state = status.get("state") or {}
    for phase in ("terminated", "waiting", "running"):
        detail = state.get(phase)
        if detail is not None:
            # A terminated init container keeps its times: the stages of a package pod are its init
            # containers, and their spans and durations come from these (`controller.pods`).
            keys = _TERMINATED_KEYS if phase == "terminated" else _STATE_KEYS
            condensed = {k: detail[k] for k in keys if k in detail}
            if "message" in condensed:
                # A failed container's message is its log tail (FallbackToLogsOnError): the last lines
                # say why. Other messages (a pull back-off) say it first.
                message = str(condensed["message"])
                condensed["message"] = (
                    message[-MAX_STATE_MESSAGE:] if phase == "terminated" else message[:MAX_STATE_MESSAGE]
                )
            out["state"] = {phase: condensed}
            break
    return out


class RunDigests:
    """`plan.podspec.run_digest` of each distinct pod spec, computed once: a memo owned by the operator
    (`controller.signing.PodSigner.digests`) and used by everything that needs a pod's digest -- the
    signature written before create, the check of the create answer, and `trim_pod` on every watch
    event.

    A pod's spec is immutable after create except for a few fields (`nodeName` by a binding, container
    images, `activeDeadlineSeconds`, added tolerations), yet every watch event of the pod carries the
    whole spec, and canonicalising a package pod's spec costs ~100x what fingerprinting it does. So the
    memo is keyed by a fingerprint of everything `run_spec` reads (`run_spec_source`): the SHA-256 of
    its pickle (`_fingerprint`). Equal bytes mean an equal spec, so the remembered digest is the
    digest of this very spec -- a pod changed in any way (an image patched after create, anything) has
    another fingerprint and gets its own digest, and a tampered pod cannot borrow ours short of a
    SHA-256 collision. Nothing is assumed about which fields Kubernetes lets change. Equal specs with
    their keys in another order only miss. The binding to the pod's target node is not part of
    `run_spec_source`, so a pod is canonicalised once as built and once as the API server stored it,
    whatever number of watch events it has.

    Kept: the `capacity` most recently used fingerprints (32 bytes each, with a 64-character digest:
    4,096 entries are ~1 MiB). Not thread-safe (the operator runs one event loop).
    """

    __slots__ = ("_capacity", "_known", "computed")

    def __init__(self, capacity: int = 4096) -> None:
        self._capacity = capacity
        self._known: OrderedDict[bytes, str] = OrderedDict()
        self.computed = 0  # canonicalisations done (the misses), for tests and benchmarks

    def __len__(self) -> int:
        return len(self._known)

    def digest(self, pod: Mapping[str, Any]) -> str:
        """`run_digest(pod)`: the one a trimmed pod carries, else the remembered one for its spec."""
        precomputed = pod.get(RUN_DIGEST_FIELD)
        if isinstance(precomputed, str):
            return precomputed
        key = _fingerprint(pod)
        if key is None:
            self.computed += 1
            return run_digest(pod)
        known = self._known.get(key)
        if known is not None:
            self._known.move_to_end(key)
            return known
        self.computed += 1
        digest = self._known[key] = run_digest(pod)
        if len(self._known) > self._capacity:
            self._known.popitem(last=False)
        return digest


def _fingerprint(pod: Mapping[str, Any]) -> bytes | None:
    """SHA-256 of `run_spec_source(pod)` pickled; None when it cannot be pickled (only code could
    build such a pod), and then nothing is kept.

    Pickle, not JSON: equal bytes unpickle to equal values, types included (1, 1.0 and True, a list
    and a tuple, a key 1 and "1" all differ), and it is 3x faster than `json.dumps` (15 against 49 us
    for a 7 KiB package pod; canonicalising it is 148 us). Pickle also encodes which equal strings
    are one object, so equal specs decoded differently may only miss: json.loads shares the keys of
    one document the same way on every decode, so a pod's watch events all hit one entry."""
    try:
        data = pickle.dumps(run_spec_source(pod), protocol=5)
    except (pickle.PicklingError, TypeError, ValueError, AttributeError, RecursionError):
        return None
    return hashlib.sha256(data).digest()


def trim_pod(pod: JSON, *, digests: RunDigests | None = None) -> JSON:
    """What the controller needs of a package pod: identity, ownership, node, containers, progress
    (and the pod's deadline and the kubelet's reason for ending it, `activeDeadlineSeconds` and
    `status.reason`, which drift checks have).

    The rest of the spec is dropped, but the pod's signature binds all of it: the digest of what the
    pod runs (`plan.podspec.run_digest`) is computed here from the full object and kept under
    `runDigest`. A trimmed pod keeps the digest it already carries (the API server never returns that
    key: unknown fields of a Pod are dropped on decoding).
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    out_meta = _meta(meta, namespace=True)
    out_meta["labels"] = _interned_map(meta.get("labels"))
    out_meta["annotations"] = _interned_map(meta.get("annotations"))
    owners = meta.get("ownerReferences")
    if owners:
        out_meta["ownerReferences"] = [
            {k: o[k] for k in ("apiVersion", "kind", "name", "uid", "controller") if k in o} for o in owners
        ]
    out_spec: JSON = {
        "nodeName": spec.get("nodeName"),
        "containers": [_container(c) for c in spec.get("containers") or ()],
    }
    if spec.get("initContainers"):
        out_spec["initContainers"] = [_container(c) for c in spec["initContainers"]]
    if isinstance(spec.get("activeDeadlineSeconds"), int):  # drift-check pods: when they are given up
        out_spec["activeDeadlineSeconds"] = spec["activeDeadlineSeconds"]
    out_status: JSON = {"phase": _intern(str(status.get("phase") or "Pending"))}
    if status.get("reason"):  # `DeadlineExceeded`: the kubelet ended the pod, no container failed by itself
        out_status["reason"] = _intern(str(status["reason"]))
    for field in ("initContainerStatuses", "containerStatuses"):
        if status.get(field):
            out_status[field] = [_container_status(s) for s in status[field]]
    digest = digests.digest(pod) if digests is not None else run_digest(pod)
    return {"metadata": out_meta, "spec": out_spec, "status": out_status, RUN_DIGEST_FIELD: digest}
