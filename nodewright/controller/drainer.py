"""Draining a node before an interrupt: list its workload pods, evict them, and remember since when.

Kubernetes behaviour handled here:

- **Listing.** The node's pods come from a live LIST with field selector `spec.nodeName=<node>` over all
  namespaces (the operator's pod cache only holds its own package pods). Listings are only made for
  nodes about to be interrupted (the planner asks for drain facts), so the cost is one LIST per such
  reconcile.
- **Eviction** (`POST pods/<name>/eviction`, policy/v1) is the PDB-respecting way to remove a pod:
  `201` accepted (the pod then terminates with its grace period), `429` a PodDisruptionBudget forbids
  it right now (the message names the PDB; we report it and retry later), `404` the pod is already
  gone (fine), anything else (e.g. `500` when several PDBs select the pod) is reported like a block.
- **Accepted is not gone.** An evicted pod keeps running until its grace period ends; the planner's
  drain selection lists it as `terminating` and the node counts as drained only once it has vanished.
- **Force** (spec `drain.policy: force`, after `drain.timeout`): the remaining pods are DELETEd with
  their own grace period, ignoring PDBs — the admin explicitly chose availability of the maintenance
  over the budget.

`protected_since` / `draining_since` (for `interruptWait.timeout` and `drain.timeout`) must survive an
operator restart, or a restart would silently extend every timeout. They are persisted in the node
annotation `nodewright.io/timing.<nw>` (written by the node controller in the same patch as the state
annotation, so there is no extra write), together with `cordoned_at` (the start of the maintenance
window, for the `nodewright_maintenance_seconds` histogram). The state annotation itself has a strict
schema shared with the rollout controller; these are the node controller's private bookkeeping, so
they live next to it rather than in it. Eviction refusal messages are kept in memory only: they are
re-learnt by the next eviction attempt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

import structlog

from nodewright.api import constants
from nodewright.kube.client import EvictionOutcome, KubeClient
from nodewright.kube.resources import JSON, PODS
from nodewright.plan.stages import parse_ts, ts

log = structlog.get_logger("nodewright.controller.drainer")

TIMING_ANNOTATION_PREFIX: Final = f"{constants.PREFIX}timing."


def timing_annotation(nodewright: str) -> str:
    return f"{TIMING_ANNOTATION_PREFIX}{nodewright}"


@dataclass(frozen=True, slots=True)
class Timing:
    """The node controller's persisted timestamps for one NodeWright on one node."""

    cordoned_at: datetime | None = None
    protected_since: datetime | None = None
    draining_since: datetime | None = None

    @property
    def empty(self) -> bool:
        return self.cordoned_at is None and self.protected_since is None and self.draining_since is None

    def encode(self) -> str | None:
        """Compact JSON; None when empty (the annotation is then removed)."""
        doc = {
            k: ts(v)
            for k, v in (("c", self.cordoned_at), ("p", self.protected_since), ("d", self.draining_since))
            if v is not None
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")) if doc else None

    @staticmethod
    def decode(text: str | None) -> Timing:
        """Lenient: a missing or unreadable value is an empty Timing (it only ever delays a timeout)."""
        if not text:
            return Timing()
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict):
                return Timing()
            values = {k: parse_ts(v) for k, v in doc.items() if k in ("c", "p", "d") and isinstance(v, str)}
        except ValueError:
            return Timing()
        return Timing(values.get("c"), values.get("p"), values.get("d"))


def read_timing(annotations: Mapping[str, str], nodewright: str) -> Timing:
    return Timing.decode(annotations.get(timing_annotation(nodewright)))


def update_timing(
    timing: Timing,
    *,
    now: datetime,
    cordoning: bool,
    uncordoning: bool,
    protected: bool | None,
    evicting: bool,
    drained: bool | None,
) -> Timing:
    """The timestamps after this plan. `protected`/`drained` are None when no drain facts were built."""
    if uncordoning:
        return Timing()
    t = timing
    if cordoning and t.cordoned_at is None:
        t = replace(t, cordoned_at=now)
    if protected is not None:
        if protected and t.protected_since is None:
            t = replace(t, protected_since=now)
        elif not protected:
            t = replace(t, protected_since=None)
    if evicting and t.draining_since is None:
        t = replace(t, draining_since=now)
    elif drained:
        t = replace(t, draining_since=None)
    return t


@dataclass(frozen=True, slots=True)
class EvictionReport:
    evicted: tuple[str, ...]
    blocked: tuple[str, ...]  # "ns/name: message" for refusals (PDB) and failures

    @property
    def any_blocked(self) -> bool:
        return bool(self.blocked)


class Drainer:
    """Workload pod listing and evictions for nodes being drained; remembers recent refusals."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client
        self._blocked: dict[str, tuple[str, ...]] = {}

    async def node_pods(self, node: str) -> list[JSON]:
        result = await self._client.list(PODS, field_selector=f"spec.nodeName={node}")
        return result.items

    def eviction_blocked(self, key: str) -> tuple[str, ...]:
        return self._blocked.get(key, ())

    def forget(self, key: str) -> None:
        self._blocked.pop(key, None)

    async def evict(self, key: str, pods: Iterable[str], *, force: bool) -> EvictionReport:
        evicted: list[str] = []
        blocked: list[str] = []
        for ref in pods:
            namespace, _, name = ref.partition("/")
            if force:
                gone = await self._client.delete_pod(namespace, name)
                log.info("pod force-deleted for drain", pod=ref, existed=gone)
                evicted.append(ref)
                continue
            result = await self._client.evict(namespace, name)
            if result.outcome in (EvictionOutcome.ACCEPTED, EvictionOutcome.NOT_FOUND):
                evicted.append(ref)
            else:
                message = _short(result.message) or f"HTTP {result.status}"
                blocked.append(f"{ref}: {message}")
        if blocked:
            self._blocked[key] = tuple(blocked)
        else:
            self._blocked.pop(key, None)
        return EvictionReport(tuple(evicted), tuple(blocked))


def _short(message: Any, limit: int = 200) -> str:
    text = str(message or "").strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
