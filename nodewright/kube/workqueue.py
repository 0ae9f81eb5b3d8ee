"""A work queue with client-go semantics, on one asyncio loop.

Properties (client-go `util/workqueue` package doc, which reviewers will recognise):

- **Fair**: keys are handed out in the order they became ready (FIFO).
- **Stingy**: a key added many times before a worker takes it is processed once (the *dirty* set).
- **Exclusive**: a key is never processed by two workers at once (the *processing* set). A key added
  while it is being processed is not handed out again until `done(key)`; then it is requeued once.
- **Delayed adds**: `add_after(key, delay)` makes a key ready later; if the key is already waiting, the
  earliest ready time wins.
- **Rate-limited retries**: `add_rate_limited(key)` = `add_after(key, limiter.when(key))`; the default
  limiter is max(per-key exponential 5 ms → 1000 s, overall bucket 10 qps / burst 100). `forget(key)`
  clears the key's failure history; `num_requeues(key)` exposes it.
- **Closed intake** (NodeWright's addition): a queue created with `intake=False` ignores adds until
  `open_intake()`. A leader-elected standby keeps its queues closed, so it holds no keys and its
  `workqueue_depth` says 0 (like controller-runtime, whose controllers start their event sources only
  once elected); on taking over, the Manager opens them and replays its warm caches into them.
- **Start lane** (NodeWright's addition): `add_start(key)` queues a key that will start new work (a
  node just admitted: its first pod) on a second ready list, handed out when no ordinary key is ready
  (or, so that a steady stream of ordinary keys cannot starve starts, as every `START_EVERY`th key
  handed out while starts wait) and while fewer than `start_limit` start keys are being processed.
  Reactions to running work (a pod finished, a gate passed) thus never wait behind a burst of starts,
  and starts take at most `start_limit` workers, so the rest stay free for reactions. A key already
  queued ordinarily moves to the start lane (its watch event may beat the caller); an ordinary `add` of
  a key on the start lane leaves it there (FIFO among starts, stingy as ever).
- **Shutdown**: `shutdown()` stops intake (adds are ignored), drops keys not yet handed out, wakes all
  waiting `get()` callers with `QueueShutDown`, and (with `drain=True`) waits — with a deadline — for
  the keys being processed to be marked done.

One deliberate divergence from client-go: after shutdown, keys still *queued* are dropped instead of
handed out. NodeWright shuts a queue down when it stops leading (or the process is terminating), and
acting on further keys then would risk two operators acting at once. Reconciliation is level-triggered,
so whoever leads next relists and rediscovers all the work.

Delayed keys are promoted to the ready list whenever the queue is touched (`add`, `get`, `len`), so the
queue is usable with a `FakeClock` and from synchronous code (`get_nowait`), which the property tests
rely on. Waiting `get()` callers queue up (FIFO), and each key made ready wakes exactly one of them, like
client-go's `cond.Signal()`: with 64 node workers idle, waking all of them for every add cost 64 task
switches, and each woken worker built two tasks to wait again (issue 33). While callers wait and keys
are delayed, one timer task sleeps (on the injected clock) until the earliest delayed key is due; an
earlier delayed add re-arms it. A woken caller that is cancelled before it runs passes its wakeup on.

`run_workers(queue, handler, count=N)` runs N worker tasks: get → handler → done, with controller-
runtime's outcome rules: success → `forget`; a `Result(requeue_after=s)` → `forget` then `add_after`;
an exception → `add_rate_limited` (logged); `TerminalError` → logged and forgotten, not requeued.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog

from nodewright.kube.clock import SYSTEM_CLOCK, Clock
from nodewright.kube.hooks import NoopWorkqueueMetrics, WorkqueueMetrics
from nodewright.kube.ratelimit import RateLimiter, default_controller_rate_limiter

K = TypeVar("K", bound=Hashable)

log = structlog.get_logger("nodewright.workqueue")

START_EVERY = 4
"""While start-lane keys wait and a start slot is free, at least every 4th key handed out is a start: a
node queue that always has reactions queued (pod events of thousands of running nodes on a saturated
operator) still starts admitted nodes, at a quarter of its pace, instead of never."""


class QueueShutDown(Exception):
    """Raised by `get()` once the queue is shut down."""


class TerminalError(Exception):
    """Raised by a handler for a failure that retrying cannot fix: logged, not requeued."""


@dataclass(frozen=True, slots=True)
class Result:
    """What a handler may return: `requeue_after` seconds → look at the key again later."""

    requeue_after: float | None = None


class WorkQueue(Generic[K]):
    def __init__(
        self,
        name: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        rate_limiter: RateLimiter | None = None,
        metrics: WorkqueueMetrics | None = None,
        intake: bool = True,
        start_limit: int | None = None,
    ) -> None:
        self.name = name
        self._intake = intake
        self._clock = clock
        self._limiter = rate_limiter or default_controller_rate_limiter(clock=clock)
        self._metrics = metrics or NoopWorkqueueMetrics()
        self._ready: deque[K] = deque()
        self._starts: deque[K] = deque()  # the start lane: ready keys served after `_ready`
        self._starting: set[K] = set()  # start-lane keys being processed
        self._start_limit = start_limit
        self._since_start = 0  # ordinary keys handed out while starts waited (`START_EVERY`)
        self._dirty: set[K] = set()
        self._processing: dict[K, float] = {}  # key -> when processing started
        self._added_at: dict[K, float] = {}  # key -> when it entered the ready list (queued_for)
        self._waiting: dict[K, float] = {}  # delayed key -> ready time (earliest wins)
        self._heap: list[tuple[float, int, K]] = []
        self._seq = itertools.count()
        self._getters: deque[asyncio.Future[None]] = deque()  # waiting get() callers, oldest first
        self._timer: asyncio.Task[None] | None = None  # wakes the queue when the earliest delay is due
        self._timer_due = 0.0
        self._idle = asyncio.Event()
        self._idle.set()
        self._shutting_down = False

    # -- intake -------------------------------------------------------------------------------------

    def add(self, key: K) -> None:
        if self._shutting_down or not self._intake or key in self._dirty:
            return
        self._metrics.add()
        self._dirty.add(key)
        self._waiting.pop(key, None)  # ready now: a pending delayed add is superseded
        if key in self._processing:
            return  # requeued by done()
        self._push_ready(key)

    def add_start(self, key: K) -> None:
        """Queue `key` on the start lane (module docstring, "Start lane")."""
        if self._shutting_down or not self._intake:
            return
        if key in self._dirty:
            if key in self._processing or key not in self._ready:
                return  # requeued by done(), or on the start lane already
            self._ready.remove(key)  # its watch event came first: a start all the same
            self._starts.append(key)
            return
        self._metrics.add()
        self._dirty.add(key)
        self._waiting.pop(key, None)
        if key in self._processing:
            return
        self._starts.append(key)
        self._added_at[key] = self._clock.monotonic()
        self._metrics.depth(len(self._ready) + len(self._starts))
        self._wake_one()

    def add_after(self, key: K, delay: float) -> None:
        if self._shutting_down or not self._intake:
            return
        if delay <= 0:
            self.add(key)
            return
        if key in self._dirty:
            return  # already ready (or requeued after processing): sooner than any delay
        ready_at = self._clock.monotonic() + delay
        current = self._waiting.get(key)
        if current is not None and current <= ready_at:
            return
        self._waiting[key] = ready_at
        heapq.heappush(self._heap, (ready_at, next(self._seq), key))
        if self._getters:
            self._arm_timer()

    def add_rate_limited(self, key: K) -> None:
        if self._shutting_down or not self._intake:
            return
        self._metrics.retry()
        self.add_after(key, self._limiter.when(key))

    def open_intake(self) -> None:
        """Take keys from now on (see "Closed intake" in the module docstring)."""
        self._intake = True

    def forget(self, key: K) -> None:
        self._limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        return self._limiter.num_requeues(key)

    # -- processing ---------------------------------------------------------------------------------

    def get_nowait(self) -> K | None:
        """The next ready key (now marked processing), or None; raises `QueueShutDown` when shut down."""
        if self._shutting_down:
            raise QueueShutDown(self.name)
        self._promote_due()
        may_start = self._may_start()
        if self._ready and not (may_start and self._since_start >= START_EVERY - 1):
            key = self._ready.popleft()
            self._since_start = self._since_start + 1 if may_start else 0
        elif may_start:
            key = self._starts.popleft()
            self._starting.add(key)
            self._since_start = 0
        else:
            return None
        now = self._clock.monotonic()
        self._metrics.queued_for(now - self._added_at.pop(key, now))
        self._dirty.discard(key)
        self._processing[key] = now
        self._idle.clear()
        self._metrics.depth(len(self._ready) + len(self._starts))
        return key

    async def get(self) -> K:
        while True:
            key = self.get_nowait()
            if key is not None:
                if self._getters and (self._ready or self._may_start()):
                    # More is ready while callers sleep (this caller may have taken a key another
                    # wakeup was for): wake the next one, so no ready key waits for a later add.
                    self._wake_one()
                return key
            await self._wait_for_work()

    def done(self, key: K) -> None:
        started = self._processing.pop(key, None)
        if started is None:
            return
        self._metrics.worked_for(self._clock.monotonic() - started)
        if key in self._starting:
            self._starting.discard(key)
            if self._starts:
                self._wake_one()  # a start slot is free
        if key in self._dirty and not self._shutting_down:
            self._push_ready(key)
        if not self._processing:
            self._idle.set()

    # -- shutdown -----------------------------------------------------------------------------------

    async def shutdown(self, *, drain: bool = True, grace: float | None = None) -> bool:
        """Stop intake and hand-out; with `drain`, wait (≤ `grace` seconds) for in-flight keys to be done.

        Returns True when nothing is being processed any more.
        """
        self._shutting_down = True
        self._ready.clear()
        self._starts.clear()
        self._dirty.clear()
        self._waiting.clear()
        self._heap.clear()
        self._added_at.clear()
        self._metrics.depth(0)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._getters:  # every waiting get() raises QueueShutDown
            self._wake_one()
        if drain and self._processing:
            try:
                async with asyncio.timeout(grace):
                    await self._idle.wait()
            except TimeoutError:
                log.warning(
                    "workqueue drain deadline passed", queue=self.name, in_flight=len(self._processing)
                )
        return not self._processing

    # -- introspection ------------------------------------------------------------------------------

    def __len__(self) -> int:
        self._promote_due()
        return len(self._ready) + len(self._starts)

    @property
    def processing(self) -> frozenset[K]:
        return frozenset(self._processing)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def is_pending(self, key: K) -> bool:
        """True if the key is ready, delayed, or will be requeued after processing."""
        return key in self._dirty or key in self._waiting

    def report_unfinished(self) -> None:
        now = self._clock.monotonic()
        ages = [now - started for started in self._processing.values()]
        self._metrics.unfinished(total_seconds=sum(ages), longest_seconds=max(ages, default=0.0))

    async def run_unfinished_reporter(self, *, interval: float = 1.0) -> None:
        """Report unfinished work every `interval` seconds (client-go does this every 500 ms)."""
        while not self._shutting_down:
            self.report_unfinished()
            await self._clock.sleep(interval)

    # -- internals ----------------------------------------------------------------------------------

    def _push_ready(self, key: K) -> None:
        self._ready.append(key)
        self._added_at[key] = self._clock.monotonic()
        self._metrics.depth(len(self._ready) + len(self._starts))
        self._wake_one()

    def _promote_due(self) -> None:
        now = self._clock.monotonic()
        while self._heap and self._heap[0][0] <= now:
            ready_at, _, key = heapq.heappop(self._heap)
            if self._waiting.get(key) == ready_at:  # otherwise a stale entry superseded by an earlier one
                del self._waiting[key]
                self.add(key)

    def _may_start(self) -> bool:
        """A start-lane key is waiting and a start slot is free."""
        return bool(self._starts) and (self._start_limit is None or len(self._starting) < self._start_limit)

    def _wake_one(self) -> None:
        """Wake the longest-waiting `get()` caller, if any (one ready key, one caller)."""
        getters = self._getters
        while getters:
            getter = getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def _arm_timer(self) -> None:
        """Have a timer wake the queue when the earliest delayed key is due (re-armed if earlier)."""
        if not self._heap or self._shutting_down:
            return
        due = self._heap[0][0]
        if self._timer is not None:
            if self._timer_due <= due:
                return
            self._timer.cancel()
        self._timer_due = due
        self._timer = asyncio.ensure_future(self._fire(due))

    async def _fire(self, due: float) -> None:
        await self._clock.sleep(due - self._clock.monotonic())
        self._timer = None
        self._promote_due()  # each promoted key wakes one caller
        if self._getters:
            self._arm_timer()

    async def _wait_for_work(self) -> None:
        getter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._getters.append(getter)
        self._arm_timer()
        try:
            await getter
        except asyncio.CancelledError:
            if getter.done() and not getter.cancelled():
                self._wake_one()  # woken for a key, but this caller will not take it: pass it on
            raise


async def run_workers(
    queue: WorkQueue[K],
    handler: Callable[[K], Awaitable[Result | None]],
    *,
    count: int = 1,
    on_outcome: Callable[[K, str, BaseException | None], None] | None = None,
) -> None:
    """Run `count` workers on `queue` until it is shut down (returns when all have exited).

    `on_outcome(key, outcome, error)` — outcome is "success", "requeue_after", "error" or "terminal" —
    lets the caller count reconciles (controller_runtime_reconcile_total) without wrapping the handler.
    Cancelling this coroutine cancels in-flight handlers; keys are still marked done.
    """

    async def worker(index: int) -> None:
        while True:
            try:
                key = await queue.get()
            except QueueShutDown:
                return
            try:
                outcome, error = await _handle(queue, handler, key)
            finally:
                queue.done(key)
            if on_outcome is not None:
                on_outcome(key, outcome, error)

    async with asyncio.TaskGroup() as group:
        for index in range(count):
            group.create_task(worker(index), name=f"{queue.name}-worker-{index}")


async def _handle(
    queue: WorkQueue[K], handler: Callable[[K], Awaitable[Result | None]], key: K
) -> tuple[str, BaseException | None]:
    try:
        result = await handler(key)
    except TerminalError as exc:
        queue.forget(key)
        log.error("reconcile failed permanently", queue=queue.name, key=str(key), error=str(exc))
        return "terminal", exc
    except Exception as exc:
        queue.add_rate_limited(key)
        log.warning(
            "reconcile failed, requeued with backoff",
            queue=queue.name,
            key=str(key),
            error=repr(exc),
            requeues=queue.num_requeues(key),
        )
        return "error", exc
    queue.forget(key)
    if result is not None and result.requeue_after is not None and result.requeue_after > 0:
        queue.add_after(key, result.requeue_after)
        return "requeue_after", None
    return "success", None
