"""The Manager: informers, leader election, controllers' workers, health probes, orderly shutdown.

Registration API (what reconcilers code against)::

    manager = Manager(client, leader_election=LeaderElectionConfig(namespace="nodewright-system"))
    nodes = manager.informer(NODES, transform=trim_node)            # shared per (resource, selectors)
    nodewrights = manager.informer(NODEWRIGHTS)

    async def reconcile(key: str) -> Result | None:                  # level-triggered: read the caches
        nw = nodewrights.get(key)
        ...
        return Result(requeue_after=30)                              # or None; raise to retry w/ backoff

    rollout = manager.controller("rollout", reconcile, workers=4)
    rollout.watch(nodewrights)                                       # key = the object's key
    rollout.watch(nodes, lambda node: owners_of(node))               # or any keys derived from it
    exit_code = await manager.run()

- `manager.informer(...)` returns an `Informer` (store, indexes, `get`, `by_index`); the same arguments
  return the same informer, so controllers share caches. Register informers and controllers before
  `run()`.
- A `Controller` is a named `WorkQueue[str]` plus a reconcile function. `watch(informer, mapper)` maps
  add/update/delete events to keys (default: the object's own key) and adds them to the queue.
  `controller.queue.add(key)` / `add_after(key, s)` enqueue directly (e.g. from another controller).
- `reconcile(key)` outcomes follow controller-runtime: return None → done (backoff forgotten);
  `Result(requeue_after=s)` → look again in s seconds; raise → retried with per-key exponential backoff
  (5 ms → 1000 s, overall 10 qps); raise `TerminalError` → logged, not retried. A key is never
  reconciled by two workers at once. Each reconcile runs with structlog context `controller`, `key`,
  `reconcile_id`.

Lifecycle of `run()`:

1. Serve `/healthz` and `/readyz`; start every informer (caches are kept warm on standbys too, so a
   failover does not cause a relist storm); wait for the first list of each (`sync_timeout`).
2. Acquire the Lease (unless leader election is off). Event handlers enqueue keys all along; the
   queues are only *worked* while leading.
3. While leading: N workers per controller, plus the Lease renewal.
4. Lost the Lease (renewal failed past the renew deadline) → workers are cancelled at once and `run()`
   returns 1: the process must exit and start over as a candidate, as Go operators do. Nothing may
   act after leadership is lost.
5. SIGTERM/SIGINT (or `stop()`) → orderly shutdown: stop leading (queues stop handing out keys and
   accepting new ones) → drain in-flight reconciles (`drain_timeout`, then cancel) → release the Lease
   (a standby takes over within its retry period) → stop informers and probes → close the client.
   Returns 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from nodewright.controller.health import HealthServer
from nodewright.kube.client import KubeClient
from nodewright.kube.clock import SYSTEM_CLOCK, Clock
from nodewright.kube.hooks import (
    LeaderMetrics,
    NoopLeaderMetrics,
    NoopWatchMetrics,
    NoopWorkqueueMetricsProvider,
    WatchMetrics,
    WorkqueueMetricsProvider,
)
from nodewright.kube.informer import Informer
from nodewright.kube.leaderelection import LeaderElector, default_identity
from nodewright.kube.reflector import TransformFunc
from nodewright.kube.resources import JSON, Resource, object_key
from nodewright.kube.workqueue import Result, WorkQueue, run_workers
from nodewright.observability.logging import ReconcileRecorder, reconcile_context

log = structlog.get_logger("nodewright.manager")

Reconcile = Callable[[str], Awaitable[Result | None]]
KeyMapper = Callable[[JSON], Iterable[str]]


@dataclass(frozen=True)
class LeaderElectionConfig:
    namespace: str
    name: str = "nodewright-operator"
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


def _own_key(obj: JSON) -> Iterable[str]:
    return (object_key(obj),)


class Controller:
    """A named work queue, a reconcile function, and the informer events that feed the queue."""

    def __init__(
        self,
        name: str,
        reconcile: Reconcile,
        *,
        workers: int,
        queue: WorkQueue[str],
        metrics: ReconcileRecorder | None = None,
    ) -> None:
        self.name = name
        self.workers = workers
        self.queue = queue
        self._reconcile = reconcile
        self._metrics = metrics
        self.reconciles = 0

    def watch(self, informer: Informer, mapper: KeyMapper = _own_key) -> None:
        """Enqueue `mapper(obj)` keys on every add, update (old and new) and delete of `informer`."""

        def enqueue(obj: JSON) -> None:
            for key in mapper(obj):
                self.queue.add(key)

        def on_update(old: JSON, new: JSON) -> None:
            enqueue(old)
            enqueue(new)

        informer.add_handler(on_add=enqueue, on_update=on_update, on_delete=enqueue)

    async def reconcile(self, key: str) -> Result | None:
        """One reconcile with the `reconcile_context` of docs/observability.md: log keys, one summary
        line, and the `controller_runtime_reconcile_*` series when the Manager has reconcile metrics."""
        self.reconciles += 1
        with reconcile_context(controller=self.name, key=key, metrics=self._metrics) as scope:
            result = await self._reconcile(key)
            if result is not None and result.requeue_after is not None:
                scope.requeue(after=result.requeue_after)
            return result


class Manager:
    def __init__(
        self,
        client: KubeClient,
        *,
        leader_election: LeaderElectionConfig | None = None,
        health_bind_address: str = ":8081",
        sync_timeout: float = 300.0,
        drain_timeout: float = 30.0,
        clock: Clock = SYSTEM_CLOCK,
        watch_metrics: WatchMetrics | None = None,
        workqueue_metrics: WorkqueueMetricsProvider | None = None,
        leader_metrics: LeaderMetrics | None = None,
        reconcile_metrics: ReconcileRecorder | None = None,
    ) -> None:
        self.client = client
        self._reconcile_metrics = reconcile_metrics
        self.sync_timeout = sync_timeout
        self.drain_timeout = drain_timeout
        self.clock = clock
        self._watch_metrics = watch_metrics or NoopWatchMetrics()
        self._queue_metrics = workqueue_metrics or NoopWorkqueueMetricsProvider()
        self._informers: dict[tuple[Any, ...], Informer] = {}
        self._controllers: list[Controller] = []
        self._stop = asyncio.Event()
        self.elector = (
            LeaderElector(
                client,
                namespace=leader_election.namespace,
                name=leader_election.name,
                identity=leader_election.identity,
                lease_duration=leader_election.lease_duration,
                renew_deadline=leader_election.renew_deadline,
                retry_period=leader_election.retry_period,
                clock=clock,
                metrics=leader_metrics or NoopLeaderMetrics(),
            )
            if leader_election is not None
            else None
        )
        self._leading = False
        self.health = HealthServer(health_bind_address, status=self.status)

    # -- registration -------------------------------------------------------------------------------

    def informer(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: TransformFunc | None = None,
    ) -> Informer:
        key = (resource, namespace, label_selector, field_selector, transform)
        if key not in self._informers:
            self._informers[key] = Informer(
                self.client,
                resource,
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                transform=transform,
                clock=self.clock,
                metrics=self._watch_metrics,
            )
        return self._informers[key]

    def controller(self, name: str, reconcile: Reconcile, *, workers: int = 1) -> Controller:
        if any(c.name == name for c in self._controllers):
            raise ValueError(f"controller {name!r} already registered")
        queue: WorkQueue[str] = WorkQueue(name, clock=self.clock, metrics=self._queue_metrics.for_queue(name))
        controller = Controller(
            name, reconcile, workers=workers, queue=queue, metrics=self._reconcile_metrics
        )
        self._controllers.append(controller)
        return controller

    # -- state --------------------------------------------------------------------------------------

    @property
    def informers(self) -> list[Informer]:
        return list(self._informers.values())

    @property
    def synced(self) -> bool:
        return all(i.has_synced for i in self._informers.values())

    @property
    def leading(self) -> bool:
        return self._leading

    def status(self) -> dict[str, Any]:
        return {
            "ready": self.synced,
            "synced": {i.name: i.has_synced for i in self._informers.values()},
            "leader": self._leading,
            "identity": self.elector.identity if self.elector else None,
        }

    def stop(self) -> None:
        """Request an orderly shutdown (what SIGTERM/SIGINT do)."""
        self._stop.set()

    # -- run ----------------------------------------------------------------------------------------

    async def run(self, *, handle_signals: bool = True) -> int:
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        informer_tasks = [
            asyncio.create_task(i.run(), name=f"informer-{i.name}") for i in self._informers.values()
        ]
        try:
            await self.health.start()
            return await self._run_phases()
        finally:
            for task in informer_tasks:
                task.cancel()
            await asyncio.gather(*informer_tasks, return_exceptions=True)
            await self.health.stop()
            await self.client.close()
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            log.info("manager stopped")

    async def _run_phases(self) -> int:
        if not await self._until_stopped(self._wait_for_sync(), deadline=self.sync_timeout):
            if self._stop.is_set():
                return 0
            log.error("caches did not sync in time", timeout=self.sync_timeout, status=self.status())
            return 1
        log.info("caches synced", informers=[i.name for i in self._informers.values()])
        if self.elector is not None and not await self._until_stopped(self.elector.acquire()):
            return 0
        self._leading = True
        log.info("leading: starting workers", controllers=[c.name for c in self._controllers])
        return await self._lead()

    async def _wait_for_sync(self) -> None:
        await asyncio.gather(*(i.wait_for_sync() for i in self._informers.values()))

    async def _until_stopped(self, work: Awaitable[None], *, deadline: float | None = None) -> bool:
        """Run `work` until it finishes (True) or a stop is requested / `deadline` seconds pass (False)."""
        task = asyncio.ensure_future(work)
        stop = asyncio.create_task(self._stop.wait())
        try:
            done, _ = await asyncio.wait({task, stop}, timeout=deadline, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, stop):
                t.cancel()
            await asyncio.gather(task, stop, return_exceptions=True)
        return task in done and not task.cancelled() and task.exception() is None

    async def _lead(self) -> int:
        workers = {
            asyncio.create_task(run_workers(c.queue, c.reconcile, count=c.workers), name=f"workers-{c.name}")
            for c in self._controllers
        }
        reporters = {asyncio.create_task(c.queue.run_unfinished_reporter()) for c in self._controllers}
        hold = asyncio.create_task(self.elector.hold()) if self.elector else None
        stop = asyncio.create_task(self._stop.wait())
        watched = {stop, *workers} | ({hold} if hold else set())
        done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        lost = hold is not None and hold in done
        crashed = [t for t in workers if t in done]
        self._leading = False
        if lost or crashed:
            # Stop acting now: no drain, another replica may already be taking over.
            if crashed:
                log.error("workers crashed", error=repr(crashed[0].exception()))
            for task in workers:
                task.cancel()
        else:
            log.info("shutting down: stop intake, drain in-flight reconciles", timeout=self.drain_timeout)
            drained = await asyncio.gather(
                *(c.queue.shutdown(drain=True, grace=self.drain_timeout) for c in self._controllers)
            )
            if not all(drained):
                log.warning("drain deadline passed; cancelling remaining reconciles")
            for task in workers:
                task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for task in (*reporters, stop, *((hold,) if hold else ())):
            task.cancel()
        await asyncio.gather(*reporters, stop, *((hold,) if hold else ()), return_exceptions=True)
        for c in self._controllers:
            with contextlib.suppress(Exception):
                await c.queue.shutdown(drain=False)
        if lost or crashed:
            log.error("stopped leading: exiting so that exactly one replica acts")
            return 1
        if self.elector is not None:
            await self.elector.release()
        return 0
