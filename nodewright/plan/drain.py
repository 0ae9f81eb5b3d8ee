"""Which pods on a node must be evicted before an interrupt, and which pods protect the node.

Input pods are plain dicts as returned by the API (metadata, spec, status). Compared with the
reference (anchor §2.9, §11.3):

- DaemonSet pods are recognised by an owner reference of kind DaemonSet (the reference only looked when
  a pod had more than one owner). They are recreated on the node anyway and tolerate unschedulable.
- Mirror (static) pods (`kubernetes.io/config.mirror` annotation) are managed by the kubelet and cannot
  be evicted meaningfully.
- Pods that tolerate `node.kubernetes.io/unschedulable` (effect NoSchedule or any effect, or an
  operator `Exists` toleration without key) would be scheduled right back: not evicted.
- Pods already terminating (deletionTimestamp) are not evicted again but are still waited for: the
  node counts as drained only when evicted pods are gone, not when the eviction was accepted.
- Finished pods (Succeeded/Failed) hold no workload.
- Our own package pods (`nodewright.io/managed-by=nodewright-operator`) are never evicted.
- `kube-system` gets no special treatment: its Deployment pods (e.g. CoreDNS) are evictable under their
  PDBs; its DaemonSet and static pods are skipped by the rules above.

Protected pods: Running or Pending pods matching `podNonInterruptLabels`. An EMPTY selector means no
protection (reference semantics), unlike `selectors.matches` where empty matches everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nodewright.api import constants
from nodewright.api.models import LabelSelector
from nodewright.plan import selectors

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def pod_ref(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase", ""))


def is_daemonset_pod(pod: Mapping[str, Any]) -> bool:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(o.get("kind") == "DaemonSet" for o in owners)


def is_mirror_pod(pod: Mapping[str, Any]) -> bool:
    return MIRROR_ANNOTATION in ((pod.get("metadata") or {}).get("annotations") or {})


def tolerates_unschedulable(pod: Mapping[str, Any]) -> bool:
    for t in (pod.get("spec") or {}).get("tolerations") or []:
        key, op, effect = t.get("key"), t.get("operator", "Equal"), t.get("effect")
        if effect not in (None, "", "NoSchedule"):
            continue
        if (key in (None, "") and op == "Exists") or key == UNSCHEDULABLE_TAINT:
            return True
    return False


def is_terminating(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def is_finished(pod: Mapping[str, Any]) -> bool:
    return _phase(pod) in ("Succeeded", "Failed")


def is_own_pod(pod: Mapping[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(constants.POD_OWNER_LABEL) == constants.POD_OWNER_VALUE


@dataclass(frozen=True, slots=True)
class DrainSelection:
    evict: tuple[str, ...]  # namespace/name to evict now, sorted
    terminating: tuple[str, ...]  # evicted (or otherwise deleted) pods still shutting down
    protected: tuple[str, ...]  # Running/Pending pods matching podNonInterruptLabels

    @property
    def drained(self) -> bool:
        return not self.evict and not self.terminating


def _needs_drain(pod: Mapping[str, Any]) -> bool:
    return not (
        is_finished(pod)
        or is_own_pod(pod)
        or is_daemonset_pod(pod)
        or is_mirror_pod(pod)
        or tolerates_unschedulable(pod)
    )


@dataclass(frozen=True, slots=True)
class PodFacts:
    """All the drain's rule reads of one pod: a drain evicts it (`needs_drain`), unless it is already
    `terminating`; it protects the node when `may_protect` (Running or Pending, not ours) and the
    `podNonInterruptLabels` selector matches its `labels`. Hashable, so a count-only cache shares equal
    facts between pods (`plan.disruption`)."""

    needs_drain: bool
    terminating: bool
    may_protect: bool
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def counts(self) -> bool:
        """Whether the pod can cost anything: a pod that is neither evicted nor protecting is noise."""
        return (self.needs_drain and not self.terminating) or self.may_protect

    def protects(self, protect: LabelSelector | None) -> bool:
        return (
            self.may_protect
            and not selectors.is_empty(protect)
            and selectors.matches(protect, dict(self.labels))
        )


def facts_of(pod: Mapping[str, Any]) -> PodFacts:
    may_protect = _phase(pod) in ("Running", "Pending") and not is_own_pod(pod)
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return PodFacts(
        needs_drain=_needs_drain(pod),
        terminating=is_terminating(pod),
        may_protect=may_protect,
        labels=tuple(sorted(labels.items())) if may_protect else (),
    )


def select(pods: Iterable[Mapping[str, Any]], *, protect: LabelSelector | None) -> DrainSelection:
    evict: list[str] = []
    terminating: list[str] = []
    protected: list[str] = []
    for pod in pods:
        facts = facts_of(pod)
        if facts.protects(protect):
            protected.append(pod_ref(pod))
        if not facts.needs_drain:
            continue
        (terminating if facts.terminating else evict).append(pod_ref(pod))
    return DrainSelection(
        evict=tuple(sorted(evict)), terminating=tuple(sorted(terminating)), protected=tuple(sorted(protected))
    )
