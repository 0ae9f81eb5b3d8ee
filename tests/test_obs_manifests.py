"""The shipped Grafana dashboard and Prometheus rules only use metrics the operator exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodewright.observability.metrics import EXPORTED_METRICS, HISTOGRAM_METRICS

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "manifests" / "monitoring" / "grafana-dashboard.json"
RULES = ROOT / "manifests" / "monitoring" / "prometheus-rules.yaml"

_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"inf", "nan", "Inf", "NaN"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w$:.])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w(])(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """Metric names referenced by a PromQL expression (functions, keywords, labels, durations dropped)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    return {name for name in _IDENT.findall(text) if name not in _KEYWORDS}


def unknown_metrics(names: set[str]) -> set[str]:
    exported = set(EXPORTED_METRICS)
    known = exported | {h + suffix for h in HISTOGRAM_METRICS for suffix in ("_bucket", "_sum", "_count")}
    return names - known


def dashboard_exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, dict) and isinstance(value.get("query"), str):
                yield value["query"]
            else:
                yield from dashboard_exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from dashboard_exprs(item)


def rule_exprs() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    groups = doc["spec"]["groups"] if "spec" in doc else doc["groups"]
    return [(rule.get("alert") or rule.get("record"), rule["expr"]) for g in groups for rule in g["rules"]]


def label_values_metric(expr: str) -> str:
    # label_values(metric{...}, label) -> the metric; a template query is also an expression here.
    match = re.fullmatch(r"label_values\((.*),\s*\w+\)", expr.strip())
    return match.group(1) if match else expr


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'sum by (le, stage) (rate(x_seconds_bucket{a="b",c=~"$d"}[$__rate_interval]))',
            {"x_seconds_bucket"},
        ),
        ("histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) > 0.5", {"a_bucket"}),
        ('(sum(m{job=~".*nw.*"}) or vector(0)) == 0', {"m"}),
        ("a / on() group_left(x) b and c offset 5m", {"a", "b", "c"}),
        ('count(max by (nodewright) (s{n="x y (z)"}))', {"s"}),
        ("clamp_min(sum(c), 1) * 100 + 1e3", {"c"}),
    ],
)
def test_metric_name_extraction(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_checker_rejects_unknown_names() -> None:
    assert unknown_metrics(metric_names("rate(workqueue_adds_total[5m]) + nodewright_bogus")) == {
        "nodewright_bogus"
    }
    assert unknown_metrics({"workqueue_depth_bucket"}) == {"workqueue_depth_bucket"}


def test_dashboard_structure() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"]
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "nodewright", "compartment", "package", "job"} <= variables
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    rows = [p["title"] for p in panels if p["type"] == "row"]
    assert rows == [
        "Rollout overview",
        "Packages",
        "Compartments and batches",
        "Stage durations",
        "Stuck and waiting nodes",
        "Operator health",
    ]
    for panel in panels:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert all(t["expr"] and t["refId"] for t in panel["targets"])
            assert panel["datasource"]["uid"] == "${datasource}"
    exprs = " ".join(dashboard_exprs(dash))
    for needed in (
        "nodewright_rollout_progress_percent",
        "nodewright_rollout_current_batch",
        "histogram_quantile",
        "nodewright_waiting_nodes",
        "nodewright_drain_blocked_nodes",
        "workqueue_depth",
        "controller_runtime_reconcile_errors_total",
        "rest_client_requests_total",
        "leader_election_master_status",
        "nodewright_event_loop_lag_seconds_bucket",
        "nodewright_watch_relists_total",
    ):
        assert needed in exprs, needed


def test_dashboard_expressions_use_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [label_values_metric(e) for e in dashboard_exprs(dash)]
    assert len(exprs) > 30
    used: set[str] = set()
    for expr in exprs:
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
        names = metric_names(expr)
        assert names, expr
        assert unknown_metrics(names) == set(), expr
        used |= names
    assert "nodewright_stage_duration_seconds_bucket" in used


def test_rules_use_exported_metrics_and_cover_the_issue() -> None:
    rules = rule_exprs()
    for name, expr in rules:
        assert expr.count("(") == expr.count(")"), name
        names = metric_names(expr)
        assert names, name
        assert unknown_metrics(names) == set(), (name, expr)
    alerts = {name for name, _ in rules}
    assert {
        "NodeWrightCompartmentHalted",
        "NodeWrightNodeStuckInStage",
        "NodeWrightDrainBlocked",
        "NodeWrightOperatorNotLeading",
        "NodeWrightOperatorNotReconciling",
        "NodeWrightWatchRelistStorm",
    } <= alerts


def test_rules_are_well_formed() -> None:
    doc = yaml.safe_load(RULES.read_text())
    assert doc["kind"] == "PrometheusRule"
    for group in doc["spec"]["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}
            assert rule["annotations"]["summary"]
            assert re.fullmatch(r"\d+[smh]", rule["for"])
