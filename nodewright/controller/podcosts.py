"""What the pods on each node cost to disrupt, for `nodeOrder: idleFirst` (`plan.disruption`).

Idle nodes first needs, for every node, how many pods an update would interrupt. The operator otherwise
caches only its own package pods and lists a node's workload pods on demand while it drains it; a
cluster-wide pod cache would cost tens of MiB at 10,000 GPU nodes. This cache is therefore *count
only* and *lazy*:

- **Started only when needed**: the first rollout pass of a NodeWright whose DeploymentPolicy opts a
  compartment into `idleFirst` starts it (`view`); a fleet that never opts in never watches pods.
  Until its first list is stored the pass waits (`CostsPending`, planned again shortly), so the first
  batch is never taken blind; if the list does not succeed within `SYNC_GRACE` seconds (RBAC missing
  `watch` on pods, an API server that refuses), the rollout goes on in the plain pick order
  (`CostsUnavailable`, logged): ordering is an optimisation, never a safety rule.
- **Count only**: one LIST+WATCH of bound, unfinished pods (field selector
  `spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed`: a pod that finishes leaves the watch as
  a delete). Each pod is reduced on arrival, page by page, to the facts the drain's rule reads
  (`plan.drain.PodFacts`: the same rule the node gate and the drain apply); a pod that can cost nothing
  (our own package pods, for one) is not kept. Equal facts are shared (the pods of a
  ReplicaSet carry the same labels), so what remains per pod is mostly its key in its node's map:
  measured ~21 MiB for 10,000 nodes x 8 pods (`benchmarks/podcosts_memory.py`).
- The reflector (`kube.reflector`) brings pagination, 410 Gone relists, bookmarks, backoff and
  inactivity timeouts, as for every other cache.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Final, Protocol

import structlog

from nodewright.kube.client import KubeClient
from nodewright.kube.clock import SYSTEM_CLOCK, Clock
from nodewright.kube.hooks import WatchMetrics
from nodewright.kube.reflector import Reflector
from nodewright.kube.resources import JSON, PODS
from nodewright.plan.drain import PodFacts, facts_of
from nodewright.plan.rollout_input import NodePods

log = structlog.get_logger("nodewright.podcosts")

FIELD_SELECTOR: Final = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
SYNC_GRACE: Final = 120.0
"""Seconds a rollout waits for the first pod list before it goes on in the plain pick order."""
PENDING_RETRY: Final = 2.0
"""Seconds between rollout passes while the first pod list is still coming."""
MAX_SHARED_FACTS: Final = 65_536
_FACTS: Final = "nodewright.io/facts"


@dataclass(frozen=True, slots=True)
class CostsReady:
    pods: NodePods


@dataclass(frozen=True, slots=True)
class CostsPending:
    """The first pod list is still coming: plan again in `PENDING_RETRY` seconds."""


@dataclass(frozen=True, slots=True)
class CostsUnavailable:
    """The pod list did not succeed within `SYNC_GRACE`: order without costs."""


CostsView = CostsReady | CostsPending | CostsUnavailable


class Spawn(Protocol):
    def __call__(self, work: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]: ...


def _spawn_task(work: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
    return asyncio.create_task(work, name=name)


def _reduce(pod: JSON) -> JSON:
    """A listed or watched pod, reduced to its identity, node and drain facts (the transform)."""
    meta = pod.get("metadata") or {}
    return {
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName") or ""},
        _FACTS: facts_of(pod),
    }


def _key(obj: JSON) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class PodCosts:
    """The count-only, lazily started pod cache (module docstring); a `ReflectorSink`."""

    def __init__(
        self,
        client: KubeClient,
        *,
        clock: Clock = SYSTEM_CLOCK,
        metrics: WatchMetrics | None = None,
        spawn: Spawn = _spawn_task,
    ) -> None:
        self.clock = clock
        self._spawn = spawn  # the manager's: cancelled with the informers, before the client closes
        self._by_node: dict[str, dict[str, PodFacts]] = {}
        self._shared: dict[PodFacts, PodFacts] = {}
        self._synced = False
        self._started_at: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._warned = False
        self.reflector = Reflector(
            client, PODS, self, field_selector=FIELD_SELECTOR, transform=_reduce, clock=clock, metrics=metrics
        )

    # -- what the rollout asks ----------------------------------------------------------------------

    def view(self) -> CostsView:
        """The cache for a pass that needs costs: started on first use (module docstring)."""
        if self._synced:
            return CostsReady(self.facts)
        if self._task is None:
            self._started_at = self.clock.monotonic()
            self._task = self._spawn(self.reflector.run(), name="informer-pod-costs")
            log.info("idle nodes first: watching pods (count only)")
        assert self._started_at is not None
        if self.clock.monotonic() - self._started_at < SYNC_GRACE:
            return CostsPending()
        if not self._warned:
            self._warned = True
            log.warning(
                "idle nodes first: the pod list has not succeeded; ordering without disruption costs"
                " (grant the operator list and watch on pods cluster-wide)",
                waited_seconds=SYNC_GRACE,
            )
        return CostsUnavailable()

    def facts(self, node: str) -> Iterable[PodFacts]:
        return self._by_node.get(node, {}).values()

    @property
    def pods(self) -> int:
        return sum(len(pods) for pods in self._by_node.values())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- ReflectorSink ------------------------------------------------------------------------------

    def replace(self, objects: list[JSON], resource_version: str) -> None:
        self._by_node = {}
        for obj in objects:
            self._put(obj)
        if not self._synced:
            log.info("idle nodes first: pods counted", pods=self.pods, nodes=len(self._by_node))
        self._synced = True

    def upsert(self, obj: JSON) -> None:
        self._put(obj)

    def delete(self, obj: JSON) -> None:
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        pods = self._by_node.get(node)
        if pods is not None:
            pods.pop(_key(obj), None)
            if not pods:
                del self._by_node[node]

    def _put(self, obj: JSON) -> None:
        facts: Any = obj.get(_FACTS)
        if not isinstance(facts, PodFacts):
            facts = facts_of(obj)  # not reduced by the transform (a test feeding objects directly)
        if not facts.counts:
            self.delete(obj)  # e.g. a pod that started terminating and protects nothing
            return
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        if not node:
            return
        self._by_node.setdefault(node, {})[_key(obj)] = self._share(facts)

    def _share(self, facts: PodFacts) -> PodFacts:
        """One object for equal facts: the pods of a ReplicaSet carry the same labels."""
        shared = self._shared.get(facts)
        if shared is not None:
            return shared
        if len(self._shared) >= MAX_SHARED_FACTS:
            self._shared.clear()
        self._shared[facts] = facts
        return facts
