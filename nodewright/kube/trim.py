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
"""

from __future__ import annotations

import sys
from typing import Any, Final

from nodewright.api.constants import PREFIX
from nodewright.kube.resources import JSON
from nodewright.plan.podspec import RUN_DIGEST_FIELD, run_digest

_intern = sys.intern

# Annotations kept on nodes besides our own `nodewright.io/...` ones. The cluster autoscaler's
# scale-down-disabled annotation: the controller sets it while a node is mid-upgrade (so the autoscaler
# does not delete a node we are working on) and must see whether someone else set it already.
KEPT_NODE_ANNOTATIONS: Final = frozenset({"cluster-autoscaler.kubernetes.io/scale-down-disabled"})

# The node conditions the controller reads: the kubelet's Ready, and our own (type prefix nodewright.io/).
READY: Final = "Ready"


def _interned_map(values: Any, *, keep: Any = None) -> dict[str, str]:
    if not isinstance(values, dict):
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
        "creationTimestamp": meta.get("creationTimestamp"),
    }
    if namespace:
        out["namespace"] = _intern(meta.get("namespace") or "")
    if meta.get("deletionTimestamp"):
        out["deletionTimestamp"] = meta["deletionTimestamp"]
    return out


def _condition(cond: JSON, *, full: bool) -> JSON:
    out: JSON = {"type": _intern(str(cond.get("type"))), "status": _intern(str(cond.get("status")))}
    if full:
        for field in ("reason", "message", "lastTransitionTime"):
            if cond.get(field) is not None:
                out[field] = cond[field]
    elif cond.get("lastTransitionTime"):
        out["lastTransitionTime"] = cond["lastTransitionTime"]
    return out


def trim_node(node: JSON) -> JSON:
    """Name, uid, RV, creation time, labels, our annotations, taints, unschedulable, Ready, ours,
    bootID, kernel and OS image."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    out_meta = _meta(meta, namespace=False)
    out_meta["labels"] = _interned_map(meta.get("labels"))
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
        _condition(c, full=c.get("type") != READY)
        for c in status.get("conditions") or ()
        if c.get("type") == READY or str(c.get("type", "")).startswith(PREFIX)
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


def trim_pod(pod: JSON) -> JSON:
    """What the controller needs of a package pod: identity, ownership, node, containers, progress.

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
    out_status: JSON = {"phase": _intern(str(status.get("phase") or "Pending"))}
    for field in ("initContainerStatuses", "containerStatuses"):
        if status.get(field):
            out_status[field] = [_container_status(s) for s in status[field]]
    return {"metadata": out_meta, "spec": out_spec, "status": out_status, RUN_DIGEST_FIELD: run_digest(pod)}


def node_ready(node: JSON) -> bool:
    """True if the (trimmed or full) node's Ready condition is True."""
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == READY:
            return bool(cond.get("status") == "True")
    return False
