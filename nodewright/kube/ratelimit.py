"""Rate limiters with client-go semantics: token bucket, per-item exponential backoff, max-of.

A `RateLimiter` answers three questions about an item (client-go's `workqueue.TypedRateLimiter`):
`when(item)` — how long to wait before retrying it (and record one more failure), `forget(item)` — the
item succeeded, clear its history, and `num_requeues(item)`.

The controller default (`default_controller_rate_limiter`) is client-go's: the maximum of a per-item
exponential backoff (5 ms doubling to 1000 s) and an overall token bucket (10 per second, burst 100).
The bucket only shapes *retries* — it is consulted by `add_rate_limited`, never by a plain `add` — so a
burst of real changes is not throttled, but a storm of failing items cannot hammer the API server.

`TokenBucket` is a reservation bucket like Go's `rate.Limiter.Reserve`: taking a token never fails; when
the bucket is empty the caller is told how long to wait, and tokens go negative so later callers queue
up behind it. The REST client uses the same bucket (with `wait()`) as its write QPS/burst limiter.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

from nodewright.kube.clock import SYSTEM_CLOCK, Clock


class RateLimiter(Protocol):
    def when(self, item: Hashable) -> float: ...
    def forget(self, item: Hashable) -> None: ...
    def num_requeues(self, item: Hashable) -> int: ...


class TokenBucket:
    """`qps` tokens per second, at most `burst` banked; `reserve()` returns the wait for one token."""

    def __init__(self, *, qps: float, burst: int, clock: Clock = SYSTEM_CLOCK) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock.monotonic()

    def reserve(self) -> float:
        now = self._clock.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    async def wait(self) -> float:
        """Take a token, sleeping as long as the bucket says; returns the time waited."""
        delay = self.reserve()
        if delay > 0:
            await self._clock.sleep(delay)
        return delay


class ItemExponentialFailureRateLimiter:
    """`base * 2**failures`, capped at `max_delay`; failures are counted per item until `forget`."""

    def __init__(self, *, base: float = 0.005, max_delay: float = 1000.0) -> None:
        self.base = base
        self.max_delay = max_delay
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable) -> float:
        failures = self._failures.get(item, 0)
        self._failures[item] = failures + 1
        # 2**failures overflows float long after the cap is reached; stop computing it there.
        if failures >= 64:
            return self.max_delay
        return min(self.base * float(2**failures), self.max_delay)

    def forget(self, item: Hashable) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        return self._failures.get(item, 0)


class BucketRateLimiter:
    """An overall token bucket: per-item history is not kept (`num_requeues` is always 0)."""

    def __init__(self, bucket: TokenBucket) -> None:
        self.bucket = bucket

    def when(self, item: Hashable) -> float:
        return self.bucket.reserve()

    def forget(self, item: Hashable) -> None:
        return None

    def num_requeues(self, item: Hashable) -> int:
        return 0


class MaxOfRateLimiter:
    """The longest delay of several limiters; every limiter records the failure."""

    def __init__(self, *limiters: RateLimiter) -> None:
        if not limiters:
            raise ValueError("at least one limiter")
        self.limiters = limiters

    def when(self, item: Hashable) -> float:
        return max([limiter.when(item) for limiter in self.limiters])

    def forget(self, item: Hashable) -> None:
        for limiter in self.limiters:
            limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        return max(limiter.num_requeues(item) for limiter in self.limiters)


def default_controller_rate_limiter(
    *, clock: Clock = SYSTEM_CLOCK, qps: float = 10.0, burst: int = 100
) -> MaxOfRateLimiter:
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(base=0.005, max_delay=1000.0),
        BucketRateLimiter(TokenBucket(qps=qps, burst=burst, clock=clock)),
    )
