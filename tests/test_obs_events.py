"""Event catalogue: reasons, types, message shapes and core/v1 Event bodies."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nodewright.observability import events as ev

NOW = datetime(2025, 3, 1, 8, 30, 15, 123456, tzinfo=UTC)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "observability.md"


def test_catalogue_covers_every_reason_once() -> None:
    reasons = [info.reason for info in ev.CATALOGUE]
    assert sorted(reasons) == sorted(ev.EventReason)
    assert len(reasons) == len(set(reasons))
    for info in ev.CATALOGUE:
        assert re.fullmatch(r"[A-Z][A-Za-z]+", info.reason.value)
        assert info.kind in {"Node", "NodeWright"}


@pytest.mark.parametrize(
    ("spec", "reason", "etype"),
    [
        (
            ev.compartment_halted("rack-a", consecutive_failures=3, threshold=3),
            "CompartmentHalted",
            "Warning",
        ),
        (ev.state_malformed(["n1"]), "StateMalformed", "Warning"),
        (ev.policy_not_found("p"), "PolicyNotFound", "Warning"),
        (ev.node_drain_blocked("nw", "PodDisruptionBudget"), "NodeDrainBlocked", "Warning"),
        (
            ev.package_failed("nw", "p", "1", "apply", attempt=2, error="x", will_retry=True),
            "PackageFailed",
            "Warning",
        ),
        (ev.batch_finished("c", 2, succeeded=1, failed=3, failed_batch=True), "BatchFailed", "Warning"),
        (ev.batch_finished("c", 2, succeeded=4, failed=0, failed_batch=False), "BatchCompleted", "Normal"),
        (ev.package_started("nw", "p", "1", "apply"), "PackageStarted", "Normal"),
        (ev.node_uncordoned("nw"), "NodeUncordoned", "Normal"),
        (ev.rollout_complete(10), "RolloutComplete", "Normal"),
    ],
)
def test_reason_and_type(spec: ev.EventSpec, reason: str, etype: str) -> None:
    assert spec.reason.value == reason
    assert spec.type.value == etype


def test_messages() -> None:
    assert ev.package_started("gpu", "driver", "550.1", "apply", attempt=2).message == (
        "Package [driver:550.1] stage [apply] started for [gpu] (attempt 2)"
    )
    assert (
        ev.status_changed("in_progress", "complete").message
        == "NodeWright status changed [in_progress] -> [complete]"
    )
    msg = ev.batch_started("rack-a", 3, [f"n{i:02d}" for i in range(12, 0, -1)]).message
    assert msg == "Compartment [rack-a] batch 3 started with 12 node(s): n01, n02, n03, n04, n05 and 7 more"
    assert "reset-batch-state" in ev.compartment_halted("c", consecutive_failures=2, threshold=2).message
    assert ev.package_failed(
        "nw", "p", "1", "config", attempt=5, error="timeout", will_retry=False
    ).message.endswith("(attempt 5, giving up): timeout")


def test_build_event_body() -> None:
    body = ev.build_event(
        ev.node_ref("gpu-1", uid="u-1"), ev.node_cordoned("gpu-drivers"), now=NOW, reporting_instance="op-0"
    )
    assert body["apiVersion"] == "v1" and body["kind"] == "Event"
    assert body["metadata"]["namespace"] == "default"
    assert re.fullmatch(r"gpu-1\.[0-9a-f]+", body["metadata"]["name"])
    assert body["involvedObject"] == {"kind": "Node", "name": "gpu-1", "apiVersion": "v1", "uid": "u-1"}
    assert body["reason"] == "NodeCordoned"
    assert body["type"] == "Normal"
    assert body["source"] == {"component": "nodewright-operator"}
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2025-03-01T08:30:15Z"
    assert body["count"] == 1
    assert body["reportingComponent"] == "nodewright-operator"
    assert body["reportingInstance"] == "op-0"

    nw = ev.build_event(
        ev.nodewright_ref("gpu-drivers"), ev.rollout_paused(), now=NOW, reporting_instance="op-0"
    )
    assert nw["involvedObject"]["apiVersion"] == "nodewright.io/v1alpha1"
    assert nw["involvedObject"]["kind"] == "NodeWright"


def test_long_messages_are_truncated() -> None:
    spec = ev.deletion_blocked("x" * 5000)
    body = ev.build_event(ev.nodewright_ref("n"), spec, now=NOW, reporting_instance="i")
    assert len(body["message"]) == ev.MAX_MESSAGE_LENGTH and body["message"].endswith("...")


def test_aggregation_and_bump() -> None:
    a = ev.build_event(
        ev.node_ref("n"), ev.node_drain_blocked("nw", "PDB", ["p2", "p1"]), now=NOW, reporting_instance="i"
    )
    b = ev.build_event(
        ev.node_ref("n"),
        ev.node_drain_blocked("nw", "PDB", ["p1", "p2"]),
        now=NOW + timedelta(1),
        reporting_instance="i",
    )
    assert ev.aggregation_key(a) == ev.aggregation_key(b)
    assert ev.bump_patch(a, now=NOW + timedelta(minutes=1)) == {
        "count": 2,
        "lastTimestamp": "2025-03-01T08:31:15Z",
    }


def test_naive_time_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        ev.build_event(
            ev.node_ref("n"), ev.node_complete("nw"), now=datetime(2025, 1, 1), reporting_instance="i"
        )


def test_every_reason_is_documented() -> None:
    text = DOCS.read_text()
    for reason in ev.EventReason:
        assert f"`{reason.value}`" in text, reason


# ----------------------------------------------------------------------------------------------------
# One list: the catalogue, the plan's event names, the controllers' reasons and the docs agree


def _docs_rows() -> dict[str, tuple[str, str]]:
    section = DOCS.read_text().split("\n## Events\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


def test_the_docs_table_is_the_catalogue() -> None:
    documented = _docs_rows()
    expected = {i.reason.value: (i.type.value, i.objects) for i in ev.CATALOGUE}
    assert documented == expected


def _plan_event_reasons() -> list[str]:
    """The reason of every `Event(...)` the plan layer can emit, read from its source (`EventReason.X`)."""
    import ast

    found: list[str] = []
    for path in (Path(ev.__file__).resolve().parents[1] / "plan").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Event":
                first = node.args[0] if node.args else None
                assert isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name), ast.dump(node)
                assert first.value.id == "EventReason", ast.dump(node)
                found.append(first.attr)
    return found


def test_every_plan_event_is_a_catalogue_reason() -> None:
    """One vocabulary: the plan layer names its Events with the catalogue's codes (no name to translate)."""
    reasons = _plan_event_reasons()
    assert {"PACKAGE_STARTED", "NODE_REBOOTED", "NODE_DRAIN_TIMEOUT", "NODE_CORDONED"} <= set(reasons)
    assert set(reasons) <= set(ev.EventReason.__members__)
    # The defects of issue 16: reboots are NodeRebooted (and reach the NodeWright too).
    assert ev.info(ev.EventReason.NODE_REBOOTED).also_on_nodewright
    from nodewright.plan.node import Event

    assert Event(ev.EventReason.PACKAGE_FAILED, "x").type == "Warning"
    assert Event(ev.EventReason.PACKAGE_RETRIED, "x").type == "Normal"


def test_controllers_record_only_catalogue_reasons() -> None:
    """Every `events.record(reason=...)` in the controllers names a catalogue reason (a string literal
    that is a reason, or `<catalogue>.EventReason.X.value`, or a spec built by the catalogue)."""
    import ast

    root = Path(ev.__file__).resolve().parents[1] / "controller"
    literals: set[str] = set()
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "record":
                continue
            for keyword in node.keywords:
                if keyword.arg == "reason" and isinstance(keyword.value, ast.Constant):
                    literals.add(str(keyword.value.value))
                if keyword.arg == "reason" and isinstance(keyword.value, ast.Attribute):
                    inner = keyword.value.value
                    if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Attribute):
                        assert inner.value.attr == "EventReason", ast.dump(inner)
                        assert inner.attr in ev.EventReason.__members__, ast.dump(inner)
    assert literals <= {r.value for r in ev.EventReason}, literals - {r.value for r in ev.EventReason}
