"""Structured logging: structlog JSON in production, readable console output on a terminal.

`configure_logging(level, json=None)` sets up structlog once at start-up:
- JSON lines on stderr unless stderr is a TTY (then the console renderer); `json` forces either.
- Filtering bound loggers (a filtered call costs one `return None`), logger cached on first use.
- Shared processors: contextvars merge (per-reconcile keys), level, ISO UTC timestamp, OTel trace and
  span ids of the current span (log <-> trace correlation), exception formatting.
- Standard-library loggers (aiohttp, the OTel exporters) go through the same processors via
  `ProcessorFormatter`, so the stream stays uniform.

Per-reconcile keys use controller-runtime's names so log queries feel familiar: `controller`,
`nodewright`, `node`, `package`, `stage`, `compartment`, `reconcile_id`. `reconcile_context(...)` binds
them for the duration of one reconcile (contextvars are per asyncio task, so bind inside the worker
task), times it, logs exactly one summary line ("reconcile finished", with `result` and `duration_ms`)
and, given an `OperatorMetrics`-like recorder, feeds the controller_runtime_reconcile_* metrics.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final, Literal, Protocol, TextIO

import structlog
from opentelemetry import trace
from structlog.processors import ExceptionRenderer
from structlog.tracebacks import ExceptionDictTransformer

LOG_KEYS: Final[tuple[str, ...]] = (
    "controller",
    "key",
    "nodewright",
    "node",
    "package",
    "stage",
    "compartment",
    "reconcile_id",
)
SUMMARY_EVENT: Final = "reconcile finished"

ReconcileResult = Literal["success", "error", "requeue", "requeue_after"]


def _add_trace_ids(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event_dict.setdefault("trace_id", format(ctx.trace_id, "032x"))
        event_dict.setdefault("span_id", format(ctx.span_id, "016x"))
    return event_dict


def _level_number(level: str) -> int:
    number = logging.getLevelNamesMapping().get(level.upper())
    if number is None:
        raise ValueError(f"unknown log level {level!r}")
    return number


def configure_logging(level: str = "info", json: bool | None = None, *, stream: TextIO | None = None) -> None:
    """Configure structlog and stdlib logging; call once at start-up (tests may call it again)."""
    out = stream if stream is not None else sys.stderr
    use_json = (not out.isatty()) if json is None else json
    number = _level_number(level)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_trace_ids,
    ]
    renderer: Any
    # Tracebacks never show local variables: structlog's defaults (and rich's) print them, and the
    # frames of the API client hold the bearer token and request headers.
    if use_json:
        shared.append(ExceptionRenderer(ExceptionDictTransformer(show_locals=False)))
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(
            colors=out.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    # Third-party libraries are chatty at debug; keep them at warning unless we log at debug ourselves.
    root.setLevel(number if number <= logging.DEBUG else max(number, logging.WARNING))


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name) if name else structlog.get_logger()


class ReconcileRecorder(Protocol):
    def reconcile(self, *, controller: str, result: ReconcileResult, seconds: float) -> None: ...


class ReconcileScope:
    """Handle yielded by `reconcile_context`: bind more keys and set the outcome."""

    def __init__(self, reconcile_id: str) -> None:
        self.reconcile_id = reconcile_id
        self.result: ReconcileResult = "success"
        self.requeue_after: float | None = None
        self.fields: dict[str, Any] = {}
        self.added: set[str] = set()  # keys bound here that were not bound before: unbound on exit

    def bind(self, **keys: Any) -> None:
        """Bind keys (e.g. node, package, stage) for the rest of the reconcile and its summary line."""
        current = structlog.contextvars.get_contextvars()
        self.added.update(key for key in keys if key not in current)
        structlog.contextvars.bind_contextvars(**keys)

    def note(self, **fields: Any) -> None:
        """Add fields to the summary line only (e.g. what was decided)."""
        self.fields.update(fields)

    def requeue(self, after: float | None = None) -> None:
        if after is None:
            self.result = "requeue"
        else:
            self.result = "requeue_after"
            self.requeue_after = after


_ids = random.Random()
_cached_logger: tuple[Any, ...] | None = None


def _reconcile_logger() -> Any:
    """The `nodewright.reconcile` logger, bound once per logging configuration: `get_logger` builds a
    lazy proxy that binds afresh on every call, once per reconcile. A new configuration (or
    `structlog.testing.capture_logs`) installs a new processor list, and a new logger is bound."""
    global _cached_logger
    config = structlog.get_config()
    processors, wrapper = config["processors"], config["wrapper_class"]
    cached = _cached_logger
    if cached is None or cached[0] is not processors or cached[1] is not wrapper:
        cached = _cached_logger = (processors, wrapper, structlog.get_logger("nodewright.reconcile").bind())
    return cached[2]


WRITE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Requests of the reconcile running in this context that asked the API server to change something
# (attempts, answered or not); None outside a reconcile. A cell, so tasks spawned with a copy of the
# context count into it too.
_writes: ContextVar[list[int] | None] = ContextVar("nodewright_reconcile_writes", default=None)


def note_request(method: str) -> None:
    """Called by the API client for every request it sends (`nodewright.kube.client`)."""
    if method in WRITE_METHODS:
        cell = _writes.get()
        if cell is not None:
            cell[0] += 1


def _summary(
    log: Any,
    scope: ReconcileScope,
    *,
    error: BaseException | None,
    cancelled: bool,
    seconds: float,
    writes: int,
) -> None:
    """The summary line: info, or debug for a reconcile that wrote nothing, noted nothing and ended
    normally (most reconciles of a waiting node); error with the traceback for an escaping exception."""
    quiet = error is None and not cancelled and writes == 0 and not scope.fields
    enabled = getattr(log, "is_enabled_for", None)  # structlog's filtering loggers have it
    if quiet and enabled is not None and not enabled(logging.DEBUG):
        return  # nothing is built for a line the level filters out
    fields: dict[str, Any] = {
        "result": "cancelled" if cancelled else scope.result,
        "duration_ms": round(seconds * 1000, 3),
        "writes": writes,
    }
    if scope.requeue_after is not None:
        fields["requeue_after"] = scope.requeue_after
    fields.update(scope.fields)
    if error is not None:
        log.error(SUMMARY_EVENT, exc_info=error, **fields)
    elif quiet:
        log.debug(SUMMARY_EVENT, **fields)
    else:
        log.info(SUMMARY_EVENT, **fields)


@contextmanager
def reconcile_context(
    *,
    controller: str,
    key: str,
    metrics: ReconcileRecorder | None = None,
    logger: Any = None,
    clock: Callable[[], float] = time.monotonic,
    **keys: Any,
) -> Iterator[ReconcileScope]:
    """Bind reconcile keys, time the block, log one summary line and record reconcile metrics.

    An exception escaping the block counts as result "error", is logged with its traceback and
    re-raised. Bindings made inside the block through `scope.bind` are undone on exit.
    """
    # 64 random bits as 16 hex digits, from the process's PRNG: an id to correlate lines, not a secret,
    # and `uuid4` reads the kernel's entropy (a syscall) for every reconcile.
    scope = ReconcileScope(f"{_ids.getrandbits(64):016x}")
    log = logger if logger is not None else _reconcile_logger()
    with structlog.contextvars.bound_contextvars(
        controller=controller, key=key, reconcile_id=scope.reconcile_id, **keys
    ):
        started = clock()
        writes = [0]
        writes_token = _writes.set(writes)
        error: BaseException | None = None
        cancelled = False
        try:
            yield scope
        except Exception as exc:
            scope.result = "error"
            error = exc
            raise
        except BaseException:
            # Cancellation (shutdown) is neither a success nor a reconcile error: log it, count nothing.
            cancelled = True
            raise
        finally:
            seconds = max(0.0, clock() - started)
            _writes.reset(writes_token)
            if metrics is not None and not cancelled:
                metrics.reconcile(controller=controller, result=scope.result, seconds=seconds)
            _summary(log, scope, error=error, cancelled=cancelled, seconds=seconds, writes=writes[0])
            # Undo keys bound through scope.bind (bound_contextvars restores only its own keys).
            if scope.added:
                structlog.contextvars.unbind_contextvars(*scope.added)
