"""Work queue and rate limiter: property tests of the client-go invariants, and worker behaviour."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nodewright.kube.clock import FakeClock, settle
from nodewright.kube.ratelimit import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    TokenBucket,
    default_controller_rate_limiter,
)
from nodewright.kube.workqueue import (
    START_EVERY,
    QueueShutDown,
    Result,
    TerminalError,
    WorkQueue,
    run_workers,
)

KEYS = st.sampled_from(["a", "b", "c", "d"])


class QueueMachine(RuleBasedStateMachine):
    """Drives a queue with arbitrary adds, delayed adds, gets, dones and time steps.

    The model: `pending` = keys added (now or due) and not yet handed out since; the queue must hand
    each of them out eventually (no lost add), once per batch of adds (dedupe), and never while the
    same key is being processed (exclusivity).
    """

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.clock = FakeClock()
        self.queue: WorkQueue[str] = WorkQueue("prop", clock=self.clock, start_limit=1)
        self.processing: set[str] = set()
        self.pending: set[str] = set()  # must be handed out (again) at some point
        self.delayed: dict[str, float] = {}  # key -> earliest due time (model of add_after)

    @rule(key=KEYS)
    def add(self, key: str) -> None:
        self.queue.add(key)
        self.pending.add(key)
        self.delayed.pop(key, None)

    @rule(key=KEYS)
    def add_start(self, key: str) -> None:
        self.queue.add_start(key)
        self.pending.add(key)
        self.delayed.pop(key, None)

    @rule(key=KEYS, delay=st.floats(min_value=0.001, max_value=50))
    def add_after(self, key: str, delay: float) -> None:
        self.queue.add_after(key, delay)
        if key not in self.pending:
            due = self.clock.monotonic() + delay
            self.delayed[key] = min(due, self.delayed.get(key, due))

    @rule(seconds=st.floats(min_value=0, max_value=60))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)
        now = self.clock.monotonic()
        for key, due in list(self.delayed.items()):
            if due <= now:
                del self.delayed[key]
                self.pending.add(key)

    @rule()
    def get(self) -> None:
        key = self.queue.get_nowait()
        if key is None:
            # Nothing ready: every pending key is in processing (to be requeued on done), or waits on
            # the start lane while its one start slot is taken.
            held = set(self.queue._starts) if self.queue._starting else set()
            assert self.pending <= self.processing | held
            return
        assert key not in self.processing, "a key was handed to two workers at once"
        assert key in self.pending, "a key was handed out that nobody added"
        self.processing.add(key)
        self.pending.discard(key)

    @precondition(lambda self: bool(self.processing))
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.processing)))
        self.queue.done(key)
        self.processing.discard(key)

    @invariant()
    def queue_never_holds_duplicates(self) -> None:
        ready = list(self.queue._ready) + list(self.queue._starts)
        assert len(self.queue._starting) <= 1, "more starts in flight than the start limit"
        assert len(ready) == len(set(ready))
        assert not set(ready) & self.processing

    @invariant()
    def no_lost_add(self) -> None:
        ready = set(self.queue._ready) | set(self.queue._starts)
        for key in self.pending:
            # Pending keys are ready, or will be requeued when their processing ends.
            assert key in ready or key in self.processing or self.queue.is_pending(key)
        for key in self.delayed:
            assert self.queue.is_pending(key) or key in self.processing

    def teardown(self) -> None:
        try:
            # No lost add: finish what is in flight, let every delay expire, and drain the queue.
            # Every key still owed must come out, each exactly once.
            for key in sorted(self.processing):
                self.queue.done(key)
            self.clock.advance(1000)
            handed: Counter[str] = Counter()
            while (ready := self.queue.get_nowait()) is not None:
                handed[ready] += 1
                self.queue.done(ready)
            assert set(handed) == self.pending | set(self.delayed)
            assert all(count == 1 for count in handed.values())
        finally:
            self.loop.close()
            asyncio.set_event_loop(None)


TestQueueMachine = QueueMachine.TestCase
TestQueueMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@given(st.lists(KEYS, min_size=1, max_size=30))
def test_adds_while_queued_deduplicate(keys: list[str]) -> None:
    asyncio.set_event_loop(loop := asyncio.new_event_loop())
    try:
        queue: WorkQueue[str] = WorkQueue("dedupe", clock=FakeClock())
        for key in keys:
            queue.add(key)
        handed = []
        while (ready := queue.get_nowait()) is not None:
            handed.append(ready)
        assert handed == list(dict.fromkeys(keys))  # each once, in first-add order (FIFO)
    finally:
        loop.close()
        asyncio.set_event_loop(None)


def test_add_while_processing_requeues_once_after_done() -> None:
    queue: WorkQueue[str] = WorkQueue("q", clock=FakeClock())
    queue.add("a")
    assert queue.get_nowait() == "a"
    queue.add("a")
    queue.add("a")
    assert queue.get_nowait() is None  # not handed out while processing
    queue.done("a")
    assert queue.get_nowait() == "a"
    queue.done("a")
    assert queue.get_nowait() is None


def test_start_lane_waits_for_ordinary_keys_and_its_limit() -> None:
    """Starts (a freshly admitted node's first pod) go after every ordinary key (a finished pod's
    reaction), and at most `start_limit` of them are processed at once."""
    queue: WorkQueue[str] = WorkQueue("q", clock=FakeClock(), start_limit=2)
    for key in ("s1", "s2", "s3"):
        queue.add_start(key)
    queue.add("r1")
    queue.add("s2")  # its watch event: it stays a start, queued once
    assert len(queue) == 4
    assert [queue.get_nowait() for _ in range(3)] == ["r1", "s1", "s2"]
    assert queue.get_nowait() is None, "two starts in flight: the third waits"
    queue.add("r2")
    assert queue.get_nowait() == "r2", "a reaction is served although the start lane is full"
    queue.done("s1")
    assert queue.get_nowait() == "s3"


def test_a_steady_stream_of_ordinary_keys_does_not_starve_starts() -> None:
    queue: WorkQueue[str] = WorkQueue("q", clock=FakeClock(), start_limit=1)
    queue.add_start("s1")
    handed = []
    for i in range(2 * START_EVERY):
        queue.add(f"r{i}")
    while (key := queue.get_nowait()) is not None:
        handed.append(key)
        queue.done(key)
    assert handed.index("s1") == START_EVERY - 1, "every START_EVERYth hand-out is a waiting start"


def test_a_key_queued_by_its_watch_event_first_is_still_a_start() -> None:
    queue: WorkQueue[str] = WorkQueue("q", clock=FakeClock(), start_limit=1)
    queue.add("s1")
    queue.add_start("s1")
    queue.add("r1")
    assert queue.get_nowait() == "r1"
    assert queue.get_nowait() == "s1"
    queue.add_start("s2")
    assert queue.get_nowait() is None
    queue.done("s1")
    assert queue.get_nowait() == "s2"


async def test_a_free_start_slot_wakes_a_waiting_worker() -> None:
    queue: WorkQueue[str] = WorkQueue("q", start_limit=1)
    queue.add_start("s1")
    queue.add_start("s2")
    assert await queue.get() == "s1"
    waiter = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    assert not waiter.done()
    queue.done("s1")
    assert await asyncio.wait_for(waiter, timeout=5) == "s2"


def test_delayed_add_earliest_wins() -> None:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue("q", clock=clock)
    queue.add_after("a", 10)
    queue.add_after("a", 3)
    queue.add_after("a", 20)
    clock.advance(2.9)
    assert queue.get_nowait() is None
    clock.advance(0.2)
    assert queue.get_nowait() == "a"
    queue.done("a")
    clock.advance(100)
    assert queue.get_nowait() is None  # the later delayed adds were superseded


@given(st.integers(min_value=1, max_value=80))
def test_exponential_backoff_bounds(failures: int) -> None:
    limiter = ItemExponentialFailureRateLimiter(base=0.005, max_delay=1000.0)
    delays = [limiter.when("k") for _ in range(failures)]
    assert delays[0] == 0.005
    assert all(0.005 <= d <= 1000.0 for d in delays)
    assert all(b >= a for a, b in itertools.pairwise(delays))
    assert all(b == min(2 * a, 1000.0) for a, b in itertools.pairwise(delays))
    assert limiter.num_requeues("k") == failures
    limiter.forget("k")
    assert limiter.when("k") == 0.005


@given(st.lists(st.floats(min_value=0, max_value=1), min_size=1, max_size=300))
def test_token_bucket_never_exceeds_rate(gaps: list[float]) -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=10, burst=100, clock=clock)
    start = clock.monotonic()
    release_times = []
    for gap in gaps:
        clock.advance(gap)
        release_times.append(clock.monotonic() + bucket.reserve())
    # Over any prefix, releases are bounded by burst + qps * elapsed.
    for i, t in enumerate(release_times):
        assert i + 1 <= 100 + 10 * (t - start) + 1e-6


def test_default_limiter_is_max_of_item_and_bucket() -> None:
    clock = FakeClock()
    limiter = default_controller_rate_limiter(clock=clock)
    assert isinstance(limiter, MaxOfRateLimiter)
    assert limiter.when("x") == 0.005
    # Exhaust the bucket with other keys: the overall bucket now dominates a fresh key's delay.
    for i in range(200):
        limiter.when(f"k{i}")
    assert limiter.when("fresh") > 1.0
    bucket = BucketRateLimiter(TokenBucket(qps=1, burst=1, clock=clock))
    assert bucket.num_requeues("x") == 0


async def test_workers_never_process_a_key_concurrently() -> None:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue("w", clock=clock)
    active: set[str] = set()
    processed: Counter[str] = Counter()
    gate = asyncio.Event()

    async def handler(key: str) -> None:
        assert key not in active
        active.add(key)
        await gate.wait()
        processed[key] += 1
        active.discard(key)

    workers = asyncio.create_task(run_workers(queue, handler, count=4))
    for key in ("a", "b", "a"):
        queue.add(key)
    await settle()
    assert active == {"a", "b"}
    queue.add("a")  # while "a" is processing: requeued once after done
    gate.set()
    await settle()
    assert processed == Counter({"a": 2, "b": 1})
    assert await queue.shutdown(drain=True, grace=1)
    await workers


async def test_worker_outcomes_retry_requeue_after_terminal() -> None:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue("w", clock=clock)
    calls: Counter[str] = Counter()
    outcomes: list[tuple[str, str]] = []

    async def handler(key: str) -> Result | None:
        calls[key] += 1
        if key == "flaky" and calls[key] < 3:
            raise RuntimeError("transient")
        if key == "bad":
            raise TerminalError("cannot fix")
        if key == "later" and calls[key] == 1:
            return Result(requeue_after=30)
        return None

    workers = asyncio.create_task(
        run_workers(queue, handler, count=2, on_outcome=lambda k, o, e: outcomes.append((k, o)))
    )
    for key in ("flaky", "bad", "later", "fine"):
        queue.add(key)
    await settle()
    assert calls == Counter({"flaky": 1, "bad": 1, "later": 1, "fine": 1})
    assert queue.num_requeues("flaky") == 1
    clock.advance(0.005)  # first retry after 5 ms
    await settle()
    assert calls["flaky"] == 2
    clock.advance(0.010)  # then 10 ms
    await settle()
    assert calls["flaky"] == 3 and queue.num_requeues("flaky") == 0  # forgotten on success
    clock.advance(29)
    await settle()
    assert calls["later"] == 1
    clock.advance(1)
    await settle()
    assert calls["later"] == 2
    assert calls["bad"] == 1  # terminal: never retried
    assert ("bad", "terminal") in outcomes and ("later", "requeue_after") in outcomes
    await queue.shutdown()
    await workers


async def test_shutdown_drains_in_flight_and_stops_intake() -> None:
    queue: WorkQueue[str] = WorkQueue("s", clock=FakeClock())
    release = asyncio.Event()
    finished: list[str] = []

    async def handler(key: str) -> None:
        await release.wait()
        finished.append(key)

    workers = asyncio.create_task(run_workers(queue, handler, count=1))
    queue.add("a")
    queue.add("b")
    await settle()
    shutdown = asyncio.create_task(queue.shutdown(drain=True, grace=5))
    await settle()
    assert not shutdown.done()  # waiting for "a"
    queue.add("c")  # intake stopped
    release.set()
    assert await shutdown
    await workers
    assert finished == ["a"]  # "b" was queued, not in flight: dropped (the next leader relists)
    with pytest.raises(QueueShutDown):
        await queue.get()


async def test_shutdown_drain_deadline() -> None:
    queue: WorkQueue[str] = WorkQueue("s", clock=FakeClock())
    queue.add("a")
    assert queue.get_nowait() == "a"
    assert not await queue.shutdown(drain=True, grace=0.01)


async def test_get_waits_for_delayed_key_on_fake_clock() -> None:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue("g", clock=clock)
    getter = asyncio.create_task(queue.get())
    queue.add_after("a", 5)
    await settle()
    assert not getter.done()
    clock.advance(5)
    await settle()
    assert getter.result() == "a"


class RecordingMetrics:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.unfinished_reports: list[tuple[float, float]] = []

    def add(self) -> None:
        self.calls["add"] += 1

    def depth(self, value: int) -> None:
        self.calls["depth"] += 1

    def queued_for(self, seconds: float) -> None:
        self.calls["queued_for"] += 1

    def worked_for(self, seconds: float) -> None:
        self.calls["worked_for"] += 1

    def retry(self) -> None:
        self.calls["retry"] += 1

    def unfinished(self, *, total_seconds: float, longest_seconds: float) -> None:
        self.unfinished_reports.append((total_seconds, longest_seconds))


def test_metrics_reported() -> None:
    clock = FakeClock()
    metrics = RecordingMetrics()
    queue: WorkQueue[str] = WorkQueue("m", clock=clock, metrics=metrics)
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert queue.get_nowait() == "a"
    assert queue.get_nowait() == "b"
    clock.advance(3)
    queue.report_unfinished()
    assert metrics.unfinished_reports[-1] == (6.0, 3.0)
    queue.done("a")
    queue.add_rate_limited("a")
    assert metrics.calls["add"] == 2 and metrics.calls["retry"] == 1
    assert metrics.calls["queued_for"] == 2 and metrics.calls["worked_for"] == 1


async def test_a_ready_key_wakes_one_waiting_worker_and_waiting_costs_no_tasks() -> None:
    """Issue 33: every add woke every idle worker, and each waiting worker held two tasks (a sleep
    until the earliest delayed key and an event wait), rebuilt on every wakeup. Now waiting callers
    share one timer, and a key wakes one caller; the others keep waiting undisturbed."""
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue("q", clock=clock)
    q.add_after("later", 30.0)
    resumed: list[int] = []

    async def worker(index: int) -> str:
        while True:
            key = q.get_nowait()
            if key is not None:
                return key
            resumed.append(index)
            await q._wait_for_work()

    workers = [asyncio.ensure_future(worker(i)) for i in range(8)]
    await settle()
    assert len(resumed) == 8
    helpers = asyncio.all_tasks() - set(workers) - {asyncio.current_task()}
    assert len(helpers) == 1  # the shared timer
    q.add("now")
    await settle()
    assert len(resumed) == 8  # one worker woke and took the key; no other one ran
    assert [w.result() for w in workers if w.done()] == ["now"]
    clock.advance(30.0)
    await settle()
    assert [w.result() for w in workers if w.done()] == ["now", "later"]
    assert len(resumed) == 8
    await q.shutdown(drain=False)
    await settle()
    remaining = [w for w in workers if not w.done() or w.exception() is not None]
    assert len(remaining) == 6 and all(isinstance(w.exception(), QueueShutDown) for w in remaining)


async def test_a_woken_worker_cancelled_before_it_runs_passes_the_key_on() -> None:
    q: WorkQueue[str] = WorkQueue("q")
    first = asyncio.ensure_future(q.get())
    second = asyncio.ensure_future(q.get())
    await settle()
    q.add("a")  # wakes the first
    first.cancel()  # ... which is cancelled before it runs
    await settle()
    assert first.cancelled()
    assert second.done() and second.result() == "a"


async def test_a_freed_start_slot_wakes_a_waiting_worker_for_the_next_start() -> None:
    """Wake-one and the start lane: a start that cannot be handed out (the slots are taken) consumes
    no wakeup for good; the `done` that frees a slot wakes a waiting caller, which takes the start."""
    q: WorkQueue[str] = WorkQueue("q", start_limit=1)
    first = asyncio.ensure_future(q.get())
    second = asyncio.ensure_future(q.get())
    await settle()
    q.add_start("a")
    q.add_start("b")
    await settle()
    assert [t.result() for t in (first, second) if t.done()] == ["a"]
    q.done("a")
    await settle()
    assert first.done() and second.done() and second.result() == "b"
