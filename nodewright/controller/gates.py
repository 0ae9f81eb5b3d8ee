"""Evaluating health gates between batches (the decision is `plan.gates`).

When the rollout planner says a compartment's gates are due (`RolloutPlan.gate_checks`: a batch settled,
its soak ended, nodes wait for the next batch), the rollout reconciler evaluates them here and plans
again with the results:

- a Prometheus gate reads the Prometheus base URL from its Secret in the operator's namespace (read at
  each evaluation, so a rotated URL is used at once; the chart grants `get` on the Secrets it lists in
  `healthGates.secretNames` only) and asks `GET <url>/api/v1/query?query=<query>` -- the query with the
  batch's node names substituted for `$NODES`. The Secret read and the query share one deadline
  (`REQUEST_TIMEOUT`); a timeout, a connection error, an HTTP error, an answer Prometheus marks
  `error`, a range vector or no sample at all is `GateOutcome.UNKNOWN`, which holds the compartment like
  a failure (a gate that cannot see the batch never opens the next one) and halts it after the gate's
  timeout, naming what went wrong;
- a node-condition gate reads the batch's nodes from the node cache: a node with the condition True
  fails the gate (a node gone from the cache does not count).

Results are kept per NodeWright and compartment (`GateResults`) until the NodeWright goes away; the
planner ignores those of another batch, and asks again for a failing gate every `RECHECK_SECONDS`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import structlog

from nodewright.api.reasons import GateHeld, GateOutcome
from nodewright.kube.resources import SECRETS, ApiError, NotFound
from nodewright.observability import heap
from nodewright.plan.gates import GateCheck, GateKind, GateResult, GateSpec, judge_conditions, judge_samples

log = structlog.get_logger(__name__)

REQUEST_TIMEOUT = 10.0
"""Seconds for one Prometheus gate: the Secret read and the query together."""

JSON = dict[str, Any]
NodeLookup = Callable[[str], Mapping[str, Any] | None]


class GateError(Exception):
    """A Prometheus gate could not be evaluated; the message is for people (it lands in the hold)."""


class SecretReader:
    """Reads a key of a Secret in the operator's namespace (`KubeClient.get`)."""

    def __init__(self, client: Any, namespace: str) -> None:
        self.client = client
        self.namespace = namespace

    async def url(self, name: str, key: str) -> str:
        where = f"Secret {self.namespace}/{name} key {key!r}"
        try:
            secret = await self.client.get(SECRETS, name, namespace=self.namespace)
        except NotFound:
            raise GateError(f"{where} not found: create it with the Prometheus URL") from None
        except ApiError as exc:
            hint = " (list it in the chart's healthGates.secretNames)" if exc.status == 403 else ""
            raise GateError(f"reading {where}: {exc}{hint}"[:300]) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise GateError(f"reading {where}: {exc!r}"[:300]) from exc
        raw = (secret.get("data") or {}).get(key)
        if raw is None:
            raise GateError(f"{where} is missing")
        try:
            url = base64.b64decode(raw).decode().strip()
        except (binascii.Error, UnicodeDecodeError):
            raise GateError(f"{where} does not hold an http(s) URL") from None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise GateError(f"{where} does not hold an http(s) URL")
        return url.rstrip("/")


class GateEvaluator:
    """Evaluates the gates of a `GateCheck` into results (module docstring)."""

    def __init__(self, secrets: SecretReader, nodes: NodeLookup) -> None:
        self.secrets = secrets
        self.nodes = nodes

    async def evaluate(self, check: GateCheck, *, now: datetime) -> dict[str, GateResult]:
        """Every gate of `check`; the Prometheus ones concurrently (each within `REQUEST_TIMEOUT`)."""
        asked = [self._one(gate, check, now=now) for gate in check.gates]
        results = {r.gate: r for r in await asyncio.gather(*asked)}
        for gate in check.gates:
            log.info(
                "health gate evaluated",
                compartment=check.compartment,
                batch=check.batch,
                gate=gate.name,
                outcome=results[gate.name].outcome.value,
                value=results[gate.name].value,
            )
        return results

    async def _one(self, gate: GateSpec, check: GateCheck, *, now: datetime) -> GateResult:
        if gate.kind is GateKind.PROMETHEUS:
            return await self._prometheus(gate, check, now=now)
        return self._conditions(gate, check, now=now)

    async def _prometheus(self, gate: GateSpec, check: GateCheck, *, now: datetime) -> GateResult:
        query = gate.describe_query(check.nodes)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                samples = await self._ask(gate, query)
        except TimeoutError:
            problem = f"no answer within {REQUEST_TIMEOUT:g}s"
        except GateError as exc:
            problem = str(exc)
        else:
            return judge_samples(gate, check.batch, query, samples, at=now)
        return GateResult(gate.name, check.batch, GateOutcome.UNKNOWN, query, None, problem, now)

    async def _ask(self, gate: GateSpec, query: str) -> list[tuple[str, float]]:
        prom = gate.model.prometheus
        assert prom is not None
        base = await self.secrets.url(prom.url_secret_ref.name, prom.url_secret_ref.key)
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(
                    f"{base}/api/v1/query", params={"query": query}, ssl=heap.system_tls_context()
                ) as resp,
            ):
                text = await resp.text()
                body = _json_or_none(text)
                if resp.status != 200 or body is None or body.get("status") != "success":
                    error = body.get("error") if isinstance(body, dict) else None
                    raise GateError(f"Prometheus answered {resp.status}: {error or text[:200]}")
        except (aiohttp.ClientError, OSError) as exc:
            raise GateError(f"asking Prometheus at {base}: {exc!r}"[:300]) from exc
        data = body.get("data")
        return _samples(data if isinstance(data, dict) else {})

    def _conditions(self, gate: GateSpec, check: GateCheck, *, now: datetime) -> GateResult:
        wanted = gate.model.node_condition.type if gate.model.node_condition is not None else ""
        bad = [name for name in check.nodes if _condition_true(self.nodes(name), wanted)]
        return judge_conditions(gate, check.batch, gate.describe_query(check.nodes), bad, at=now)


def _json_or_none(text: str) -> JSON | None:
    try:
        body = json.loads(text)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _samples(data: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(series labels, value) of an instant query's answer; a range vector is refused."""
    kind = data.get("resultType")
    result = data.get("result")
    if kind == "scalar" and isinstance(result, list) and len(result) == 2:
        return [("", _number(result[1]))]
    if kind != "vector" or not isinstance(result, list):
        raise GateError(f"the query must give an instant vector or a scalar, not {kind}")
    return [_sample(s) for s in result]


def _sample(series: Any) -> tuple[str, float]:
    """One series of an instant vector: `{"metric": {...}, "value": [time, "text"]}`."""
    if not isinstance(series, dict):
        raise GateError(f"Prometheus answered a series that is not an object: {str(series)[:100]}")
    metric, value = series.get("metric"), series.get("value")
    if not isinstance(value, list) or len(value) != 2:
        raise GateError(f"Prometheus answered a series without a [time, value] pair: {str(series)[:100]}")
    return _labels(metric if isinstance(metric, dict) else {}), _number(value[1])


def _number(text: Any) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return float("nan")


def _labels(metric: Mapping[str, Any]) -> str:
    if not metric:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(metric.items()))
    return "{" + inner + "}"


def _condition_true(node: Mapping[str, Any] | None, wanted: str) -> bool:
    if node is None:
        return False
    conditions = (node.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == wanted and c.get("status") == "True" for c in conditions)


class GateResults:
    """The latest results per NodeWright, compartment and gate (what the planner reads), and the holds
    already told about (`new_holds`)."""

    def __init__(self) -> None:
        self._results: dict[str, dict[str, dict[str, GateResult]]] = {}
        self._told: dict[str, dict[str, int]] = {}  # NodeWright -> compartment -> batch of the hold told

    def new_holds(self, nodewright: str, holds: Mapping[str, GateHeld | None]) -> list[GateHeld]:
        """The gate holds (compartment -> the plan's `health_gate`) that started since the last pass:
        one `HealthGateHolding` Event per hold, not per pass. A hold is a compartment held after one
        batch; it is told once a gate was evaluated and did not pass (not while the first evaluation
        is due), and again only after the compartment was let go (the gates passed, or it halted) or
        for a later batch. Kept in memory: an operator restart tells a hold in progress once more."""
        told = self._told.get(nodewright, {})
        now: dict[str, int] = {}
        started: list[GateHeld] = []
        for compartment, held in sorted(holds.items()):
            if held is None:
                continue
            if told.get(compartment) != held.batch:
                if held.outcome is None:
                    continue
                started.append(held)
            now[compartment] = held.batch
        self._told[nodewright] = now
        return started

    def of(self, nodewright: str) -> Mapping[str, Mapping[str, GateResult]]:
        return self._results.get(nodewright, {})

    def merged(
        self, nodewright: str, persisted: Mapping[str, Mapping[str, GateResult]]
    ) -> dict[str, dict[str, GateResult]]:
        """The results persisted in the status, overridden by those evaluated since (kept here)."""
        out = {name: dict(results) for name, results in persisted.items()}
        for name, results in self.of(nodewright).items():
            out.setdefault(name, {}).update(results)
        return out

    def record(self, nodewright: str, compartment: str, results: Mapping[str, GateResult]) -> None:
        self._results.setdefault(nodewright, {}).setdefault(compartment, {}).update(results)

    def forget(self, nodewright: str) -> None:
        self._results.pop(nodewright, None)
        self._told.pop(nodewright, None)

    async def evaluate_due(
        self, evaluator: GateEvaluator, nodewright: str, checks: Sequence[GateCheck], *, now: datetime
    ) -> None:
        for check in checks:
            self.record(nodewright, check.compartment, await evaluator.evaluate(check, now=now))
