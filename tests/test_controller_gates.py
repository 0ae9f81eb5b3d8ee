"""controller.gates: a health gate's evaluation into a typed result, against an HTTP server on 127.0.0.1
answering as Prometheus' query API does, the URL read from a Secret (a stub client)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web

from nodewright.api.models import (
    GateComparison,
    HealthGate,
    NodeConditionGate,
    PrometheusGate,
    SecretKeySelector,
)
from nodewright.api.reasons import GateHeld, GateOutcome
from nodewright.controller.gates import GateEvaluator, GateResults, SecretReader
from nodewright.kube.resources import NotFound
from nodewright.plan.gates import GateCheck, GateSpec

NOW = datetime(2026, 1, 1, tzinfo=UTC)
# Answers no Prometheus gives, but a proxy or another server at the URL might: each is one Unknown.
MALFORMED: dict[str, Any] = {
    "not-objects": {"resultType": "vector", "result": ["n0", 3]},
    "no-pair": {"resultType": "vector", "result": [{"metric": {"node": "n0"}, "value": [0]}]},
    "data-a-list": [1, 2],
}


class Secrets:
    def __init__(self, data: dict[str, str]) -> None:
        self.data = data

    async def get(self, _resource: Any, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        if name not in self.data:
            raise NotFound(404, "NotFound", f"secrets {name!r} not found")
        return {"data": {"url": base64.b64encode(self.data[name].encode()).decode()}}


@pytest.fixture
async def prometheus() -> AsyncIterator[tuple[str, list[str]]]:
    """A stand-in for /api/v1/query: `xid{node=...}` answers per node, anything else a 400."""
    asked: list[str] = []

    async def query(request: web.Request) -> web.Response:
        text = request.query["query"]
        asked.append(text)
        if text in MALFORMED:
            return web.json_response({"status": "success", "data": MALFORMED[text]})
        if not text.startswith("xid"):
            return web.json_response({"status": "error", "error": "parse error"}, status=400)
        result = [
            {"metric": {"node": "n0"}, "value": [0, "0"]},
            {"metric": {"node": "n1"}, "value": [0, "3"]},
        ]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", asked
    await runner.cleanup()


def gate(query: str, secret: str = "prom") -> GateSpec:
    return GateSpec.from_model(
        HealthGate(
            name="xid",
            prometheus=PrometheusGate(
                url_secret_ref=SecretKeySelector(name=secret, key="url"),
                query=query,
                comparison=GateComparison.LT,
                threshold="1",
            ),
        )
    )


async def test_a_failing_sample_fails_the_gate_naming_the_query_and_the_value(
    prometheus: tuple[str, list[str]],
) -> None:
    url, asked = prometheus
    evaluator = GateEvaluator(SecretReader(Secrets({"prom": url}), "ns"), lambda _n: None)
    check = GateCheck("c", 2, ("n0", "n1"), (gate('xid{node=~"$NODES"}'),))
    [result] = (await evaluator.evaluate(check, now=NOW)).values()
    assert asked == ['xid{node=~"n0|n1"}']
    assert (result.outcome, result.value, result.batch) == (GateOutcome.FAILED, "3", 2)
    assert result.query == 'xid{node=~"n0|n1"}' and 'node="n1"' in result.detail


async def test_an_error_answer_or_a_missing_secret_is_unknown_with_why(
    prometheus: tuple[str, list[str]],
) -> None:
    url, _ = prometheus
    evaluator = GateEvaluator(SecretReader(Secrets({"prom": url}), "ns"), lambda _n: None)
    [bad] = (await evaluator.evaluate(GateCheck("c", 1, ("n0",), (gate("nonsense"),)), now=NOW)).values()
    assert bad.outcome is GateOutcome.UNKNOWN and "400" in bad.detail and "parse error" in bad.detail
    [missing] = (
        await evaluator.evaluate(GateCheck("c", 1, ("n0",), (gate("xid", secret="gone"),)), now=NOW)
    ).values()
    assert missing.outcome is GateOutcome.UNKNOWN and "Secret ns/gone" in missing.detail


async def test_a_node_condition_true_on_a_batch_node_fails_the_gate() -> None:
    nodes = {
        "n0": {"status": {"conditions": [{"type": "GpuXidError", "status": "False"}]}},
        "n1": {"status": {"conditions": [{"type": "GpuXidError", "status": "True"}]}},
    }
    spec = GateSpec.from_model(HealthGate(name="npd", node_condition=NodeConditionGate(type="GpuXidError")))
    evaluator = GateEvaluator(SecretReader(Secrets({}), "ns"), nodes.get)
    results = GateResults()
    await results.evaluate_due(evaluator, "nw", [GateCheck("c", 1, ("n0", "n1"), (spec,))], now=NOW)
    result = results.of("nw")["c"]["npd"]
    assert (result.outcome, result.value, result.detail) == (GateOutcome.FAILED, "1", "on n1")
    only_n0 = await evaluator.evaluate(GateCheck("c", 1, ("n0",), (spec,)), now=NOW)
    assert only_n0["npd"].outcome is GateOutcome.PASSED


@pytest.mark.parametrize("query", sorted(MALFORMED))
async def test_a_malformed_answer_is_unknown_not_an_exception(
    prometheus: tuple[str, list[str]], query: str
) -> None:
    url, _ = prometheus
    evaluator = GateEvaluator(SecretReader(Secrets({"prom": url}), "ns"), lambda _n: None)
    [result] = (await evaluator.evaluate(GateCheck("c", 1, ("n0",), (gate(query),)), now=NOW)).values()
    assert result.outcome is GateOutcome.UNKNOWN and result.detail


def held(compartment: str, batch: int, outcome: GateOutcome | None, gate: str = "xid") -> GateHeld:
    return GateHeld(compartment, batch, gate, "q", outcome, "4", "", NOW)


def test_a_gate_hold_is_told_once_per_hold_not_per_pass() -> None:
    """The `HealthGateHolding` Event: once when a gate starts holding a compartment (evaluated, not
    passing), not again on the passes that re-check it, again for a hold after a later batch or once
    the compartment was let go in between; another NodeWright's holds are its own."""
    results = GateResults()
    # The first evaluation is due: nothing is known yet, so nothing is told.
    assert results.new_holds("nw", {"a": held("a", 1, None)}) == []
    failing = held("a", 1, GateOutcome.FAILED)
    assert results.new_holds("nw", {"a": failing, "b": None}) == [failing]
    # Re-checks of the same hold, whatever they see (another gate named, Unknown): told already.
    assert results.new_holds("nw", {"a": held("a", 1, GateOutcome.UNKNOWN, gate="npd")}) == []
    assert results.new_holds("nw", {"a": held("a", 1, None)}) == []
    assert results.new_holds("other", {"a": failing}) == [failing]
    # The gates passed, the next batch ran, and a gate holds after it: a new hold.
    assert results.new_holds("nw", {"a": None}) == []
    later = held("a", 2, GateOutcome.FAILED)
    assert results.new_holds("nw", {"a": later}) == [later]
    assert results.new_holds("nw", {"a": later}) == []
    # Let go (e.g. halted, then reset) and held again after the same batch: told again.
    assert results.new_holds("nw", {}) == []
    assert results.new_holds("nw", {"a": later}) == [later]
    results.forget("nw")
    assert results.new_holds("nw", {"a": later}) == [later]
