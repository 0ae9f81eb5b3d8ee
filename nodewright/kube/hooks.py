"""Instrumentation hooks of the kube layer, as Protocols with no-op defaults.

The work queue, the REST client, the reflectors and the leader elector report what they do through
these hooks. `nodewright.observability` provides implementations that export them under the names Go
operators use (`workqueue_*`, `rest_client_requests_total`, `leader_election_master_status`), so existing
dashboards and alerts work. Keeping the hooks as Protocols keeps the kube layer free of any metrics
library and lets unit tests record calls with a plain object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class WorkqueueMetrics(Protocol):
    """Per-queue metrics (client-go's workqueue metrics, label `name`)."""

    def add(self) -> None: ...
    def depth(self, value: int) -> None: ...
    def queued_for(self, seconds: float) -> None: ...
    def worked_for(self, seconds: float) -> None: ...
    def retry(self) -> None: ...
    def unfinished(self, *, total_seconds: float, longest_seconds: float) -> None: ...


class WorkqueueMetricsProvider(Protocol):
    def for_queue(self, name: str) -> WorkqueueMetrics: ...


class RequestMetrics(Protocol):
    """One call per HTTP request the client makes (after it completes or fails)."""

    def observe(self, *, verb: str, resource: str, code: str, seconds: float) -> None: ...


class WatchMetrics(Protocol):
    def init_resource(
        self, *, resource: str, restart_reasons: Sequence[str], event_types: Sequence[str]
    ) -> None: ...
    def restart(self, *, resource: str, reason: str) -> None: ...
    def relist(self, *, resource: str) -> None: ...
    def event(self, *, resource: str, event_type: str) -> None: ...


class LeaderMetrics(Protocol):
    def set_leader(self, *, name: str, leading: bool) -> None: ...


class NoopWorkqueueMetrics:
    def add(self) -> None:
        return None

    def depth(self, value: int) -> None:
        return None

    def queued_for(self, seconds: float) -> None:
        return None

    def worked_for(self, seconds: float) -> None:
        return None

    def retry(self) -> None:
        return None

    def unfinished(self, *, total_seconds: float, longest_seconds: float) -> None:
        return None


class NoopWorkqueueMetricsProvider:
    def for_queue(self, name: str) -> WorkqueueMetrics:
        return NoopWorkqueueMetrics()


class NoopRequestMetrics:
    def observe(self, *, verb: str, resource: str, code: str, seconds: float) -> None:
        return None


class NoopWatchMetrics:
    def init_resource(
        self, *, resource: str, restart_reasons: Sequence[str], event_types: Sequence[str]
    ) -> None:
        return None

    def restart(self, *, resource: str, reason: str) -> None:
        return None

    def relist(self, *, resource: str) -> None:
        return None

    def event(self, *, resource: str, event_type: str) -> None:
        return None


class NoopLeaderMetrics:
    def set_leader(self, *, name: str, leading: bool) -> None:
        return None
