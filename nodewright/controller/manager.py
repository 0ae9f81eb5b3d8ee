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

Lifecycle of `run(setup=...)`:

0. Serve `/healthz` and `/readyz` (ready: false, `waitingFor` says on what) and run `setup`, the
   caller's start-up steps. Steps that need the API server go through `until_reachable(call)`: while
   the API server is unreachable (connection refused, DNS, timeouts, 5xx, 429) it logs one line per
   attempt (what, server, error, next try in N s) and retries with jittered exponential backoff (1 s
   doubling to `startup_backoff_cap`), forever: a start during an outage waits instead of exiting.
   Answers that retrying cannot change (401, 403, 404, an untrusted server certificate) are raised
   to the caller, which reports them. `setup` typically registers informers and controllers.
1. Start every informer (caches are kept warm on standbys too, so a failover does not cause a relist
   storm); wait for the first list of each. With a `sync_timeout`, `run()` returns 1 when it passes
   (a leader-elected replica restarts and relists); with None it keeps waiting and logs every 5 min
   (a single replica never exits over an outage).
2. Acquire the Lease (unless leader election is off). A standby keeps its caches warm but its queues
   closed: it holds no keys, reports `workqueue_depth` 0 and `leader_election_master_status` 0 (so an
   idle standby never looks like a leader that stopped reconciling). On taking over it opens the
   queues and replays every cache into the event handlers (`Informer.replay`), which enqueues what a
   process starting with those caches would: every key, without a relist. Without leader election
   the queues take keys from the start and the process reports itself leading
   (`leader_election_master_status{name="<lease name>"} 1`) once its caches are synced.
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
import random
import signal
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
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
from nodewright.kube.informer import Informer, only_version_changed
from nodewright.kube.leaderelection import LeaderElector, default_identity
from nodewright.kube.reflector import Backoff, TransformFunc
from nodewright.kube.resources import JSON, ApiError, Resource, object_key
from nodewright.kube.workqueue import Result, WorkQueue, run_workers
from nodewright.observability.logging import ReconcileRecorder, reconcile_context

log = structlog.get_logger("nodewright.manager")

Reconcile = Callable[[str], Awaitable[Result | None]]
KeyMapper = Callable[[JSON], Iterable[str]]
T = TypeVar("T")

STARTUP_BACKOFF_INITIAL = 1.0
SYNC_REPORT_INTERVAL = 300.0
"""Without a `sync_timeout`, how often an unfinished first list is reported while the Manager waits."""


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` means "the API server is not answering now" (worth waiting for) rather than an
    answer that retrying cannot change (bad credentials, missing permission or object, untrusted CA).

    Understands our `ApiError` (the one error type of `nodewright.kube`, the webhook's and the
    simulator's too), aiohttp's transport errors and any other exception with an integer HTTP `status`.
    """
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return False  # the server answered with a certificate our CA does not trust
    if isinstance(exc, aiohttp.ClientError | TimeoutError | ConnectionError):
        return True
    status = exc.status if isinstance(exc, ApiError) else getattr(exc, "status", None)
    return isinstance(status, int) and (status >= 500 or status == 429)


def describe_error(exc: BaseException) -> str:
    """A one-line description of a request failure for logs (aiohttp's text names host and port)."""
    text = " ".join(str(exc).split()) or "no details"
    return f"{type(exc).__name__}: {text[:300]}"


async def until_reachable(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    server: str,
    clock: Clock = SYSTEM_CLOCK,
    rng: random.Random | None = None,
    cap: float = 30.0,
    on_wait: Callable[[str], None] | None = None,
) -> T:
    """`await call()`, retried while the API server is unreachable (see `is_outage`), forever.

    Jittered exponential backoff from `STARTUP_BACKOFF_INITIAL` seconds doubling to `cap`; one log
    line per failed attempt naming what was tried, the server, the error and the next delay;
    `on_wait(description)` is told what is awaited (readiness reports it). Other exceptions propagate.
    """
    backoff = Backoff(clock=clock, rng=rng or random.Random(), initial=STARTUP_BACKOFF_INITIAL, cap=cap)
    started = clock.monotonic()
    attempt = 0
    while True:
        attempt += 1
        if on_wait is not None:
            on_wait(what)
        try:
            result = await call()
        except Exception as exc:
            if not is_outage(exc):
                raise
            delay = backoff.next_delay()
            error = describe_error(exc)
            if on_wait is not None:
                on_wait(f"{what}: {error}")
            log.warning(
                f"API server unreachable ({what}); next try in {delay:.1f} s",
                server=server,
                error=error,
                attempt=attempt,
                retry_in_seconds=round(delay, 1),
            )
            await clock.sleep(delay)
            continue
        if attempt > 1:
            log.info(
                f"API server reachable ({what})",
                server=server,
                attempts=attempt,
                waited_seconds=round(clock.monotonic() - started, 1),
            )
        return result


DEFAULT_LEASE_NAME = "nodewright-operator"


@dataclass(frozen=True)
class LeaderElectionConfig:
    namespace: str
    name: str = DEFAULT_LEASE_NAME
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
        """Enqueue `mapper(obj)` keys on every add, update (old and new) and delete of `informer`; an
        update that changed only the resourceVersion of the cached object enqueues nothing (the
        reconcile would read what it read before: `nodewright.kube.informer`)."""

        def enqueue(obj: JSON) -> None:
            for key in mapper(obj):
                self.queue.add(key)

        def on_update(old: JSON, new: JSON) -> None:
            if only_version_changed(old, new):
                return
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
        sync_timeout: float | None = 300.0,
        drain_timeout: float = 30.0,
        startup_backoff_cap: float = 30.0,
        rng: random.Random | None = None,
        clock: Clock = SYSTEM_CLOCK,
        watch_metrics: WatchMetrics | None = None,
        workqueue_metrics: WorkqueueMetricsProvider | None = None,
        leader_metrics: LeaderMetrics | None = None,
        reconcile_metrics: ReconcileRecorder | None = None,
        lease_name: str = DEFAULT_LEASE_NAME,
    ) -> None:
        self.client = client
        self._reconcile_metrics = reconcile_metrics
        self.sync_timeout = sync_timeout
        self.drain_timeout = drain_timeout
        self.startup_backoff_cap = startup_backoff_cap
        self.clock = clock
        self._rng = rng or random.Random()
        self._watch_metrics = watch_metrics or NoopWatchMetrics()
        self._queue_metrics = workqueue_metrics or NoopWorkqueueMetricsProvider()
        self._leader_metrics = leader_metrics or NoopLeaderMetrics()
        self._lease_name = leader_election.name if leader_election is not None else lease_name
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
                metrics=self._leader_metrics,
            )
            if leader_election is not None
            else None
        )
        if self.elector is None:
            self._leader_metrics.set_leader(name=self._lease_name, leading=False)
        self._leading = False
        self._set_up = False
        self._waiting_for: str | None = "start-up"
        self._probes_started = False
        self._background: list[asyncio.Task[None]] = []
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

    def spawn(self, work: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        """Run `work` (a cache started on first use, e.g. `controller.podcosts`) until the manager
        stops: it is cancelled with the informers, before the client it reads with is closed."""
        task = asyncio.create_task(work, name=name)
        self._background.append(task)
        return task

    @property
    def watch_metrics(self) -> WatchMetrics:
        return self._watch_metrics

    def controller(
        self, name: str, reconcile: Reconcile, *, workers: int = 1, start_limit: int | None = None
    ) -> Controller:
        if any(c.name == name for c in self._controllers):
            raise ValueError(f"controller {name!r} already registered")
        # A leader-elected replica keeps its queues closed until it leads (module docstring, step 2).
        queue: WorkQueue[str] = WorkQueue(
            name,
            clock=self.clock,
            metrics=self._queue_metrics.for_queue(name),
            intake=self.elector is None,
            start_limit=start_limit,
        )
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
        status: dict[str, Any] = {
            "ready": self._set_up and self.synced,
            "synced": {i.name: i.has_synced for i in self._informers.values()},
            "leader": self._leading,
            "identity": self.elector.identity if self.elector else None,
        }
        if not self._set_up:
            status["waitingFor"] = self._waiting_for
        return status

    def stop(self) -> None:
        """Request an orderly shutdown (what SIGTERM/SIGINT do)."""
        self._stop.set()

    # -- run ----------------------------------------------------------------------------------------

    async def start_probes(self) -> None:
        """Bind the health-probe listener now (raises OSError if the address is taken); `run()` calls
        it too, so callers use it only to fail fast before anything else starts."""
        if not self._probes_started:
            await self.health.start()
            self._probes_started = True

    async def until_reachable(self, call: Callable[[], Awaitable[T]], *, what: str) -> T:
        """`until_reachable` on the Manager's clock; `/readyz` reports what is awaited meanwhile."""

        def waiting(description: str) -> None:
            self._waiting_for = description

        return await until_reachable(
            call,
            what=what,
            server=self.client.config.server,
            clock=self.clock,
            rng=self._rng,
            cap=self.startup_backoff_cap,
            on_wait=waiting,
        )

    async def run(
        self, *, handle_signals: bool = True, setup: Callable[[], Awaitable[None]] | None = None
    ) -> int:
        """Run until stopped (0) or leadership is lost / workers crash (1); see the module docstring.

        `setup` runs first, with probes served and signals handled; exceptions it raises propagate
        (after the probes are stopped and the client is closed).
        """
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        informer_tasks: list[asyncio.Task[None]] = []
        failed = False
        try:
            await self.start_probes()
            if setup is not None and not await self._until_stopped(setup()):
                return 0
            self._set_up = True
            self._waiting_for = None
            informer_tasks = [
                asyncio.create_task(i.run(), name=f"informer-{i.name}") for i in self._informers.values()
            ]
            return await self._run_phases()
        except BaseException:
            failed = True  # the caller reports it; a "stopped" line would only bury the reason
            raise
        finally:
            stopping = [*informer_tasks, *self._background]
            for task in stopping:
                task.cancel()
            await asyncio.gather(*stopping, return_exceptions=True)
            await self.health.stop()
            await self.client.close()
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            if not failed:
                log.info("manager stopped")

    async def _run_phases(self) -> int:
        waited = 0.0
        window = self.sync_timeout if self.sync_timeout is not None else SYNC_REPORT_INTERVAL
        while not await self._until_stopped(self._wait_for_sync(), deadline=window):
            if self._stop.is_set():
                return 0
            waited += window
            if self.sync_timeout is not None:
                log.error("caches did not sync in time", timeout=self.sync_timeout, status=self.status())
                return 1
            log.warning("caches not synced yet; still waiting", waited_seconds=waited, status=self.status())
        log.info("caches synced", informers=[i.name for i in self._informers.values()])
        if self.elector is not None and not await self._until_stopped(self.elector.acquire()):
            return 0
        self._leading = True
        if self.elector is None:
            self._leader_metrics.set_leader(name=self._lease_name, leading=True)
        else:
            self._take_over()
        log.info("leading: starting workers", controllers=[c.name for c in self._controllers])
        return await self._lead()

    def _take_over(self) -> None:
        """A standby became the leader: open its queues and fill them from the warm caches."""
        for controller in self._controllers:
            controller.queue.open_intake()
        for informer in self._informers.values():
            informer.replay()
        log.info(
            "took over: queues filled from the caches",
            queued={c.name: len(c.queue) for c in self._controllers},
        )

    async def _wait_for_sync(self) -> None:
        await asyncio.gather(*(i.wait_for_sync() for i in self._informers.values()))

    async def _until_stopped(self, work: Awaitable[None], *, deadline: float | None = None) -> bool:
        """Run `work` until it finishes (True) or a stop is requested / `deadline` seconds pass (False).

        An exception raised by `work` is re-raised: a failed step must not pass for a requested stop.
        """
        task = asyncio.ensure_future(work)
        stop = asyncio.create_task(self._stop.wait())
        try:
            done, _ = await asyncio.wait({task, stop}, timeout=deadline, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, stop):
                t.cancel()
            await asyncio.gather(task, stop, return_exceptions=True)
        finished = task in done and not task.cancelled()
        failure = task.exception() if finished else None
        if failure is not None:
            raise failure
        return finished

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
