"""The shipped alert and recording rules, run by Prometheus' own `promtool`.

`promtool check rules` validates every expression and template; `promtool test rules` runs the cases in
tests/data/promtool/ (input series, evaluation times, the exact alerts and annotations expected). Every
alert of manifests/monitoring/prometheus-rules.yaml (which the chart ships as its PrometheusRule) must
have a case where it fires and one where it stays silent.

promtool comes from Debian's prometheus package, unpacked into the cache by hack/debian/fetch.sh (no
install), like the Lua interpreter of tests/test_argocd_health.py.
"""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "manifests" / "monitoring"
CASES = Path(__file__).resolve().parent / "data" / "promtool"
SUITES = {
    # test file -> (the shipped PrometheusRule, its name in the chart rendered with fullnameOverride=gpu-ops)
    "alerts.test.yaml": (MONITORING / "prometheus-rules.yaml", "gpu-ops"),
    "skyhook-compat.test.yaml": (MONITORING / "skyhook-compat-rules.yaml", "gpu-ops-skyhook-compat"),
}


@cache
def prometheus_root() -> Path:
    """Debian's prometheus package (promtool and prometheus), unpacked once into the tools cache."""
    done = subprocess.run(
        ["bash", str(ROOT / "hack" / "debian" / "fetch.sh"), "prometheus", "prometheus"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"hack/debian/fetch.sh prometheus failed:\n{done.stderr[-2000:]}"
    return Path(done.stdout.strip().splitlines()[-1])


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = prometheus_root() / "usr" / "bin" / "promtool"
    return subprocess.run(
        [str(binary), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def rule_groups(path: Path) -> dict[str, Any]:
    """The plain rules file inside a PrometheusRule (its `spec`), as a plain Prometheus loads it."""
    doc = yaml.safe_load(path.read_text())
    assert doc["kind"] == "PrometheusRule", path
    spec: dict[str, Any] = doc["spec"]
    return spec


@cache
def chart_rules() -> dict[str, dict[str, Any]]:
    """The PrometheusRules the chart renders (by name), for a release named after its fullnameOverride."""
    from tests.test_helm_chart import render

    objs = render(
        "fullnameOverride=gpu-ops",
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.skyhookCompatibility=true",
    )
    return {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "PrometheusRule"}


def stage(suite: str, tmp_path: Path) -> Path:
    """The test file and the rules the chart ships (`rules.yaml`, which it names) side by side."""
    _, name = SUITES[suite]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(chart_rules()[name], sort_keys=False))
    shutil.copy(CASES / suite, tmp_path / suite)
    return tmp_path


def test_the_chart_ships_the_rules_of_manifests_monitoring() -> None:
    assert sorted(chart_rules()) == sorted(name for _, name in SUITES.values())
    for shipped, name in SUITES.values():
        assert chart_rules()[name] == rule_groups(shipped), name
        copy = ROOT / "helm" / "nodewright" / "files" / shipped.name
        assert yaml.safe_load(copy.read_text()) == yaml.safe_load(shipped.read_text()), f"{copy} differs"


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_rules_pass_promtool_check(suite: str, tmp_path: Path) -> None:
    work = stage(suite, tmp_path)
    done = promtool("check", "rules", "rules.yaml", cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_rules_pass_their_promtool_cases(suite: str, tmp_path: Path) -> None:
    work = stage(suite, tmp_path)
    done = promtool("test", "rules", suite, cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    alerts = {
        rule["alert"]
        for group in rule_groups(SUITES["alerts.test.yaml"][0])["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    cases = yaml.safe_load((CASES / "alerts.test.yaml").read_text())["tests"]
    checks = [check for case in cases for check in case.get("alert_rule_test", [])]
    fires = {c["alertname"] for c in checks if c.get("exp_alerts")}
    silent = {c["alertname"] for c in checks if not c.get("exp_alerts")}
    assert len(alerts) >= 12
    assert alerts - fires == set(), "alerts without a case where they fire"
    assert alerts - silent == set(), "alerts without a case where they stay silent"
    assert (fires | silent) - alerts == set(), "cases of alerts that do not exist"


def test_operator_rules_never_depend_on_the_scrape_job() -> None:
    """Issue 32: `job=~".*nodewright.*"` missed a release installed with fullnameOverride (its job is
    the metrics Service's name) and annotation-based discovery (the scrape config's name)."""
    text = (MONITORING / "prometheus-rules.yaml").read_text()
    assert "job=" not in text.replace(" ", "") and "job!" not in text


REFERENCE_METRICS = frozenset(
    {
        # The reference operator's metric names (controller-runtime registry), all gauges.
        "skyhook_status",
        "skyhook_node_status_count",
        "skyhook_node_target_count",
        "skyhook_package_state_count",
        "skyhook_package_stage_count",
        "skyhook_package_restarts_count",
        "skyhook_rollout_matched_nodes",
        "skyhook_rollout_ceiling",
        "skyhook_rollout_in_progress",
        "skyhook_rollout_completed",
        "skyhook_rollout_progress_percent",
        "skyhook_rollout_current_batch",
        "skyhook_rollout_consecutive_failures",
        "skyhook_rollout_should_stop",
    }
)


def test_every_reference_metric_is_recorded_and_tested() -> None:
    """Issue 32: dashboards built on the reference operator's names showed nothing after `nodewright
    migrate`. Each of its names is recorded from ours, and each recording has a promtool case."""
    recorded = {
        rule["record"]
        for group in rule_groups(SUITES["skyhook-compat.test.yaml"][0])["groups"]
        for rule in group["rules"]
    }
    assert recorded == REFERENCE_METRICS
    cases = yaml.safe_load((CASES / "skyhook-compat.test.yaml").read_text())["tests"]
    tested = {check["expr"] for case in cases for check in case.get("promql_expr_test", [])}
    assert REFERENCE_METRICS - tested == set(), "recorded names without a promtool case"
