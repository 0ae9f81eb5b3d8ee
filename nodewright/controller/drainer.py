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
  over the budget. That needs `delete` on pods in every namespace; an operator started with
  `--allow-force-drain=false` (the Helm chart's default, `drain.allowForce`) keeps evicting instead and
  reports `FORCE_DISALLOWED` among the refusals, so the DrainBlocked condition says why it does not force.

`protected_since` / `draining_since` (for `interruptWait.timeout` and `drain.timeout`) must survive an
operator restart, or a restart would silently extend every timeout. They are persisted in the node
annotation `nodewright.io/timing.<nw>` (written by the node controller in the same patch as the state
annotation, so there is no extra write), together with `cordoned_at` (the start of the maintenance
window, for the `nodewright_maintenance_seconds` histogram) and the drain-skip memory (`s`, `m`:
when and why `drain.policy: skip` released the node, see `plan.node.DrainSkip`) and, with tracing on,
the admission whose node-rollout trace is open (`t`, `observability.tracing.TracedAdmission`: so the
trace's root is emitted once, also when the rollout is abandoned). The state annotation
itself has a strict schema shared with the rollout controller; these are the node controller's
private bookkeeping, so they live next to it rather than in it. Eviction refusal messages are kept
in memory only: they are re-learnt by the next eviction attempt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

import structlog

from nodewright.api import constants
from nodewright.kube.client import EvictionOutcome, EvictionResult, KubeClient
from nodewright.kube.resources import JSON, PODS, ApiError, NotFound, TooManyRequests
from nodewright.observability.tracing import TracedAdmission
from nodewright.plan.node import DrainSkip
from nodewright.plan.stages import parse_ts, ts

log = structlog.get_logger("nodewright.controller.drainer")

TIMING_ANNOTATION_PREFIX: Final = f"{constants.PREFIX}timing."
FORCE_DISALLOWED: Final = (
    "drain.policy force is not allowed by this operator (--allow-force-drain=false, Helm value"
    " drain.allowForce): pods are evicted, honouring PodDisruptionBudgets"
)
SKIP_MESSAGE_LIMIT: Final = 512


def timing_annotation(nodewright: str) -> str:
    return f"{TIMING_ANNOTATION_PREFIX}{nodewright}"


@dataclass(frozen=True, slots=True)
class Timing:
    """The node controller's persisted timestamps for one NodeWright on one node."""

    cordoned_at: datetime | None = None
    protected_since: datetime | None = None
    draining_since: datetime | None = None
    skipped_at: datetime | None = None  # drain.policy skip released the node then (plan.node.DrainSkip)
    skip_message: str = ""
    trace: TracedAdmission | None = None  # the admission whose rollout trace is open (or ended last)

    @property
    def empty(self) -> bool:
        return self.encode() is None

    @property
    def drain_skip(self) -> DrainSkip | None:
        return DrainSkip(self.skipped_at, self.skip_message) if self.skipped_at is not None else None

    def with_drain_skip(self, skip: DrainSkip | None) -> Timing:
        if skip is None:
            return replace(self, skipped_at=None, skip_message="")
        return replace(self, skipped_at=skip.at, skip_message=skip.message[:SKIP_MESSAGE_LIMIT])

    def encode(self) -> str | None:
        """Compact JSON; None when empty (the annotation is then removed)."""
        doc: dict[str, Any] = {
            k: ts(v)
            for k, v in (
                ("c", self.cordoned_at),
                ("p", self.protected_since),
                ("d", self.draining_since),
                ("s", self.skipped_at),
            )
            if v is not None
        }
        if self.skipped_at is not None and self.skip_message:
            doc["m"] = self.skip_message
        if self.trace is not None:
            doc["t"] = self.trace.encode()
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
            values = {
                k: parse_ts(v) for k, v in doc.items() if k in ("c", "p", "d", "s") and isinstance(v, str)
            }
            message = doc.get("m")
        except ValueError:
            return Timing()
        return Timing(
            values.get("c"),
            values.get("p"),
            values.get("d"),
            values.get("s"),
            message if isinstance(message, str) and values.get("s") is not None else "",
            TracedAdmission.decode(doc.get("t")),
        )


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
    """The timestamps after this plan. `protected`/`drained` are None when no drain facts were built.

    The drain-skip memory is not touched here: it follows the plan (`Timing.with_drain_skip`)."""
    if uncordoning:
        return Timing(skipped_at=timing.skipped_at, skip_message=timing.skip_message, trace=timing.trace)
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

    def __init__(self, client: KubeClient, *, allow_force: bool = True) -> None:
        self._client = client
        self._allow_force = allow_force
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
        refused_force = force and not self._allow_force
        force = force and self._allow_force
        for ref in pods:
            namespace, _, name = ref.partition("/")
            if force:
                gone = await self._client.delete_pod(namespace, name)
                log.info("pod force-deleted for drain", pod=ref, existed=gone)
                evicted.append(ref)
                continue
            result = await self._evict(namespace, name)
            if result.outcome in (EvictionOutcome.ACCEPTED, EvictionOutcome.NOT_FOUND):
                evicted.append(ref)
            else:
                message = _short(result.message) or f"HTTP {result.status}"
                blocked.append(f"{ref}: {message}")
        if blocked and refused_force:
            blocked.insert(0, FORCE_DISALLOWED)
        if blocked:
            self._blocked[key] = tuple(blocked)
        else:
            self._blocked.pop(key, None)
        return EvictionReport(tuple(evicted), tuple(blocked))

    async def _evict(self, namespace: str, name: str) -> EvictionResult:
        """policy/v1 Eviction, like `KubeClient.evict`, but a refusal's message carries its causes: the
        API server names the PodDisruptionBudget only there ("The disruption budget web needs 2
        healthy pods and has 2 currently"), and that name is what an operator needs to see."""
        body: JSON = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        try:
            await self._client.request(
                "POST",
                PODS.item_path(name, namespace, "eviction"),
                resource="pods/eviction",
                body=body,
                repeatable=False,
                retry_429=False,
            )
        except NotFound as exc:
            return EvictionResult(EvictionOutcome.NOT_FOUND, 404, exc.message)
        except TooManyRequests as exc:
            return EvictionResult(EvictionOutcome.BLOCKED, 429, _with_causes(exc), exc.retry_after)
        except ApiError as exc:
            return EvictionResult(EvictionOutcome.FAILED, exc.status, _with_causes(exc))
        return EvictionResult(EvictionOutcome.ACCEPTED, 201)


def _with_causes(exc: ApiError) -> str:
    details = exc.body.get("details") if isinstance(exc.body, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    texts = [str(c.get("message")) for c in causes or () if isinstance(c, dict) and c.get("message")]
    return "; ".join([*texts, exc.message]) if texts else exc.message


def _short(message: Any, limit: int = 200) -> str:
    text = str(message or "").strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
