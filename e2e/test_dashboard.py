"""Issue 32: every query of the shipped Grafana dashboard answers, asked of a real Prometheus that
scrapes the operator during a small rollout on the simulated fleet.

Prometheus is Debian's (prometheus package, unpacked by hack/debian/fetch.sh like the registry of
e2e/test_helm.py), run with its own config: one static target, the operator's `/metrics` on 127.0.0.1,
scraped every second under the job name a ServiceMonitor of a release with `fullnameOverride=gpu-ops`
would give it. The dashboard's template variables are resolved the way Grafana does (`label_values`
through the labels API, the values substituted into `$job`, `$nodewright`, ...; `$__rate_interval` is
four scrape intervals), then each expression is asked over the rollout's time range (what a dashboard
shows) and at an instant after the rollout (an idle, healthy operator): an empty answer is a panel that
says "No data", and fails the test.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    OperatorProcess,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    nodewright_manifest,
    package,
    wait_statuses,
)
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane, free_port
from nodewright.sim.kubeapi import KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "manifests" / "monitoring" / "grafana-dashboard.json"
JOB = "gpu-ops-metrics"
SCRAPE_SECONDS = 1
RATE_INTERVAL = f"{4 * SCRAPE_SECONDS}s"  # Grafana's $__rate_interval: at least four scrape intervals


@dataclass
class Prometheus:
    url: str
    log: Path

    def get(self, path: str, **params: str | list[str]) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:  # 400 for an expression Prometheus cannot parse
            pytest.fail(f"{path} {params}: {err.code} {err.read().decode(errors='replace')}")
        assert body["status"] == "success", body
        return body["data"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False


@pytest.fixture
def prometheus(operator: OperatorProcess, tmp_path: Path) -> Iterator[Prometheus]:
    fetched = subprocess.run(
        ["bash", str(REPO / "hack" / "debian" / "fetch.sh"), "prometheus", "prometheus"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    binary = Path(fetched.stdout.strip().splitlines()[-1]) / "usr" / "bin" / "prometheus"
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "scrape_timeout": f"{SCRAPE_SECONDS}s"},
                "scrape_configs": [
                    {"job_name": JOB, "static_configs": [{"targets": [f"127.0.0.1:{operator.metrics_port}"]}]}
                ],
            }
        )
    )
    port = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 60
        while not server.ready():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"prometheus did not start:\n{log.read_text()}"
            time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


# ----------------------------------------------------------------------------------------------------
# The dashboard


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title and refId, expression) of every panel target, rows included."""
    found: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels") or [])
            found.extend((f"{panel['title']} [{t['refId']}]", t["expr"]) for t in panel.get("targets") or [])

    walk(dashboard["panels"])
    return found


_LABEL_VALUES = re.compile(r"label_values\((?P<match>.*),\s*(?P<label>\w+)\)")


def substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in expr, f"unresolved template variable in {expr}"
    return expr


def resolve_variables(
    prom: Prometheus, dashboard: dict[str, Any], *, start: float, end: float
) -> dict[str, str]:
    """Each query variable's values as Grafana gets them (`label_values` = the labels API, with the
    variables before it substituted); the first value is selected (for `nodewright`: the test's)."""
    values = {"__rate_interval": RATE_INTERVAL}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        definition = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        parsed = _LABEL_VALUES.fullmatch(definition.strip())
        assert parsed is not None, f"variable {variable['name']}: not a label_values() query: {definition}"
        found = prom.get(
            f"/api/v1/label/{parsed['label']}/values",
            **{"match[]": substitute(parsed["match"], values), "start": str(start), "end": str(end)},
        )
        assert found, f"variable ${variable['name']} has no values: {definition}"
        values[variable["name"]] = regex_escape(sorted(found)[0])
    return values


def regex_escape(value: str) -> str:
    """A variable's value inside `=~"..."`, escaped as Grafana's Prometheus data source does."""
    return re.sub(r"[$^*{}\[\]'+?.()|\\]", lambda m: "\\\\" + m.group(0), value)


def answered(result: dict[str, Any]) -> bool:
    return bool(result["result"])


async def test_every_dashboard_query_answers_during_and_after_a_rollout(
    cluster: ControlPlane,
    operator: OperatorProcess,
    prometheus: Prometheus,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix = nw = f"dash-{unique}"
    dashboard = json.loads(DASHBOARD.read_text())
    queries = panel_queries(dashboard)
    assert len(queries) > 40
    async with fleet_of(cluster, prefix, 3):
        start = time.time()
        pkg = package(duration="1s", interrupt={"type": "service", "services": ["containerd"]})
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw, fleet_prefix=prefix, packages={"svc": pkg}, interruptionBudget={"count": 2}
            ),
        )
        await wait_statuses(kube, prefix, nw, "complete", within=90)

        # The last state has been scraped (the gauges say every node is complete) ...
        async def scraped() -> bool:
            done = prometheus.get(
                "/api/v1/query", query=f'nodewright_rollout_completed{{nodewright="{nw}"}} == 3'
            )
            return answered(done)

        await fleet.wait_for(scraped, within=30, what="the completed rollout scraped")
        values = resolve_variables(prometheus, dashboard, start=start, end=time.time())
        assert values["nodewright"] == regex_escape(nw) == nw and values["job"] == JOB, values

        # ... and every panel has something to show over the rollout and at an idle instant after it.
        def empty() -> list[str]:
            end = time.time()
            missing = []
            for title, expr in queries:
                promql = substitute(expr, values)
                ranged = prometheus.get(
                    "/api/v1/query_range",
                    query=promql,
                    start=str(start),
                    end=str(end),
                    step=str(SCRAPE_SECONDS),
                )
                instant = prometheus.get("/api/v1/query", query=promql, time=str(end))
                missing += [
                    f"{title}: {when}: {promql}"
                    for when, r in (("range", ranged), ("now", instant))
                    if not answered(r)
                ]
            return missing

        async def all_answer() -> bool:
            return not empty()

        try:
            await fleet.wait_for(all_answer, within=20, what="every dashboard query answered")
        except TimeoutError:
            pytest.fail("dashboard queries with no data:\n" + "\n".join(empty()))
        await delete_nodewright(kube, nw, within=60)
