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

The timestamps that must survive an operator restart (`protected_since`, `draining_since`, the
drain-skip memory, ...) live in the node's timing annotation, whose codec is `api.timing`. Eviction
refusal messages are kept in memory only: they are re-learnt by the next eviction attempt.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import structlog

from nodewright.kube.client import EvictionOutcome, EvictionResult, KubeClient
from nodewright.kube.resources import JSON, PODS, ApiError, NotFound, TooManyRequests

log = structlog.get_logger("nodewright.controller.drainer")

FORCE_DISALLOWED: Final = (
    "drain.policy force is not allowed by this operator (--allow-force-drain=false, Helm value"
    " drain.allowForce): pods are evicted, honouring PodDisruptionBudgets"
)


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
