"""Pure parts of the scale benchmark harness: metric parsing, quantiles, the write minimum, durations."""

from __future__ import annotations

import math
from typing import Any

import pytest

from benchmarks import analysis
from benchmarks.analysis import PackageShape

SCRAPE = """\
# HELP rest_client_requests_total HTTP requests to the API server, by verb, resource and status code.
# TYPE rest_client_requests_total counter
rest_client_requests_total{code="200",resource="nodes",verb="PATCH"} 40.0
rest_client_requests_total{code="409",resource="nodes",verb="PATCH"} 2.0
rest_client_requests_total{code="201",resource="pods",verb="POST"} 12.0
rest_client_requests_total{code="200",resource="pods",verb="DELETE"} 12.0
rest_client_requests_total{code="200",resource="nodewrights.nodewright.io",verb="PATCH"} 5.0
rest_client_requests_total{code="201",resource="events",verb="POST"} 7.0
rest_client_requests_total{code="200",resource="nodes",verb="LIST"} 3.0
rest_client_requests_total{code="200",resource="leases.coordination.k8s.io",verb="PUT"} 1.0
# TYPE nodewright_event_loop_lag_seconds histogram
nodewright_event_loop_lag_seconds_bucket{le="0.001"} 50.0
nodewright_event_loop_lag_seconds_bucket{le="0.01"} 90.0
nodewright_event_loop_lag_seconds_bucket{le="0.1"} 99.0
nodewright_event_loop_lag_seconds_bucket{le="+Inf"} 100.0
nodewright_event_loop_lag_seconds_count 100.0
nodewright_event_loop_lag_seconds_sum 0.9
weird_metric{path="a\\"b"} 1e3
"""


def test_parse_prometheus_labels_values_and_escapes() -> None:
    samples = analysis.parse_prometheus(SCRAPE)
    key = (("code", "200"), ("resource", "nodes"), ("verb", "PATCH"))
    assert samples["rest_client_requests_total"][key] == 40.0
    assert samples["weird_metric"][(("path", 'a"b'),)] == 1000.0
    assert samples["nodewright_event_loop_lag_seconds_count"][()] == 100.0


def test_requests_table_sums_codes_and_classifies_writes() -> None:
    table = analysis.requests_table(analysis.parse_prometheus(SCRAPE))
    assert table["PATCH"]["nodes"] == 42
    assert table["LIST"] == {"nodes": 3}
    writes = analysis.classify_writes(table)
    assert writes.node_and_pod == 42 + 12 + 12
    assert writes.nodewright_status == 5
    assert writes.events == 7
    assert writes.other == 1
    assert writes.total == 66 + 5 + 7 + 1


SERVER_SCRAPE = """\
apiserver_request_total{code="201",resource="pods",subresource="",verb="POST"} 12
apiserver_request_total{code="201",resource="pods",subresource="binding",verb="POST"} 12
apiserver_request_total{code="200",resource="pods",subresource="status",verb="PATCH"} 30
apiserver_request_total{code="200",resource="pods",subresource="",verb="DELETE"} 24
apiserver_request_total{code="200",resource="nodes",subresource="",verb="PATCH"} 30
apiserver_request_total{code="200",resource="nodes",subresource="status",verb="PATCH"} 12
apiserver_request_total{code="200",resource="nodes",subresource="",verb="LIST"} 9
apiserver_request_total{code="101",resource="pods",subresource="log",verb="CONNECT"} 4
apiserver_request_total{code="200",resource="nodewrights",subresource="status",verb="PATCH"} 5
"""


def test_server_writes_and_the_other_clients_share() -> None:
    served = analysis.server_writes(analysis.parse_prometheus(SERVER_SCRAPE))
    assert served == {
        "DELETE": {"pods": 24},
        "PATCH": {"nodes": 30, "nodes/status": 12, "nodewrights/status": 5, "pods/status": 30},
        "POST": {"pods": 12, "pods/binding": 12},
    }, "reads and CONNECT (logs) are not writes; subresources are kept apart"
    assert analysis.total_writes(served) == 125
    operator = analysis.requests_table(analysis.parse_prometheus(SCRAPE))
    others = analysis.other_clients_writes(served, operator)
    # The operator: 42 node PATCHes (nodes and nodes/status alike), 12 creates, 12 deletes, 5 status.
    assert others == {"DELETE pods": 12, "PATCH pods": 30, "POST pods": 12}, (
        "what the operator wrote is taken out per verb and base resource"
    )
    assert "POST events" not in others, "an operator write the server did not count never goes negative"


def test_delta_subtracts_and_keeps_new_series() -> None:
    before = analysis.parse_prometheus('x_total{a="1"} 5\n')
    after = analysis.parse_prometheus('x_total{a="1"} 8\nx_total{a="2"} 4\n')
    d = analysis.delta(after, before)
    assert d["x_total"] == {(("a", "1"),): 3.0, (("a", "2"),): 4.0}
    assert analysis.delta(after, None) is after


def test_histogram_quantile_interpolates_like_promql() -> None:
    buckets = analysis.histogram_buckets(
        analysis.parse_prometheus(SCRAPE), "nodewright_event_loop_lag_seconds"
    )
    assert buckets[-1] == (math.inf, 100.0)
    # rank 50 falls exactly on the first bucket's upper bound
    assert analysis.histogram_quantile(0.5, buckets) == pytest.approx(0.001)
    # rank 99 is the top of the 0.1 bucket; rank 95 halfway into (0.01, 0.1] by count 90..99
    assert analysis.histogram_quantile(0.99, buckets) == pytest.approx(0.1)
    assert analysis.histogram_quantile(0.95, buckets) == pytest.approx(0.01 + 0.09 * 5 / 9)
    # in the +Inf bucket: the largest finite bound
    assert analysis.histogram_quantile(1.0, buckets) == pytest.approx(0.1)
    assert analysis.histogram_quantile(0.5, []) is None
    assert analysis.histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None


def test_percentile_linear_between_ranks() -> None:
    assert analysis.percentile([], 50) is None
    assert analysis.percentile([3.0], 99) == 3.0
    assert analysis.percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert analysis.percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0
    assert analysis.percentile(range(101), 99) == pytest.approx(99.0)


def test_minimum_writes_without_interrupt() -> None:
    one_pod = analysis.pods_for(interrupt=False)
    chain = [
        PackageShape("a", 2, pods=one_pod),
        PackageShape("b", 2, depends_on=("a",), pods=one_pod),
        PackageShape("c", 2, depends_on=("b",), pods=one_pod),
    ]
    m = analysis.minimum_writes(chain)
    # One pod per install (apply + config): admission 1 + creates 3 + seals 3 + deletes 3 + state (3 pod
    # ends + 1 start) 4; the condition rides on the state writes.
    assert m.breakdown == {
        "admission": 1,
        "pod_create": 3,
        "pod_bind": 3,
        "pod_delete": 3,
        "state": 4,
        "condition": 0,
        "cordon_uncordon": 0,
        "evictions": 0,
    }
    assert m.per_node == 14
    assert m.per_node_package == pytest.approx(14 / 3)


def test_minimum_writes_with_chained_runs() -> None:
    one_pod, interrupting = analysis.pods_for(interrupt=False), analysis.pods_for(interrupt=True)
    line = [
        PackageShape("a", 2, pods=one_pod),
        PackageShape("b", 2, depends_on=("a",), pods=one_pod),
        PackageShape("c", 2, depends_on=("b",), pods=one_pod),
    ]
    m = analysis.minimum_writes(line, chained=True)
    # The chain is one pod: admission 1 + create 1 + seal 1 + delete 1 + state (start, end) 2.
    assert (m.breakdown["pod_create"], m.breakdown["state"], m.per_node) == (1, 2, 6)
    assert m.per_node_package == pytest.approx(2.0)
    assert analysis.minimum_writes(line).per_node == 14, "without chaining: a pod per package"
    # An interrupt breaks the chain: b needs its own pods, c (after b) starts another.
    broken = [line[0], PackageShape("b", 4, depends_on=("a",), interrupt=True, pods=interrupting), line[2]]
    assert analysis.chained_pods(broken) == 1 + interrupting + 1
    # Two roots: a package depending on both is not chained into either.
    roots = [line[0], PackageShape("x", 2, pods=one_pod), PackageShape("d", 2, depends_on=("a", "x"), pods=1)]
    assert analysis.chained_pods(roots) == 3


def test_minimum_writes_counts_a_pod_per_stage_when_told_nothing_else() -> None:
    m = analysis.minimum_writes([PackageShape("a", 2), PackageShape("b", 2, depends_on=("a",))])
    assert m.breakdown["pod_create"] == 4 and m.breakdown["state"] == 5
    assert m.per_node == 18


def test_minimum_writes_with_interrupt_counts_cordon_and_evictions() -> None:
    m = analysis.minimum_writes(
        [
            PackageShape(
                "k",
                analysis.stages_for(interrupt=True),
                interrupt=True,
                pods=analysis.pods_for(interrupt=True),
            )
        ],
        workload_pods_per_node=2,
    )
    # 3 pods (apply + config, interrupt, post-interrupt): 1 + 3 + 3 + 3 + 4 + condition 1 + 2 + 2
    assert m.per_node == 19
    assert m.breakdown["pod_create"] == 3
    assert m.breakdown["evictions"] == 2


def test_the_benchmark_installs_one_pod_per_package() -> None:
    from benchmarks import run

    cfg = run.parse_args(["--nodes", "50", "--smoke"])
    shapes = run.package_shapes(cfg)
    assert [s.pod_count for s in shapes] == [1] * len(shapes)
    # The smoke run (2 chained packages): 1 + 2 + 2 + 2 + 3 writes per node.
    assert analysis.minimum_writes(shapes).per_node == 10


def test_the_benchmark_runs_the_operators_default_chained_runs() -> None:
    from benchmarks import run

    assert run.parse_args(["--nodes", "50"]).chain_packages is True
    assert run.parse_args(["--nodes", "50", "--smoke"]).chain_packages is True
    assert run.parse_args(["--nodes", "50", "--no-chain-packages"]).chain_packages is False


def test_node_duration_is_the_critical_path() -> None:
    independent = [PackageShape("a", 2), PackageShape("b", 2)]
    assert analysis.node_duration(independent, stage_seconds=1.5) == pytest.approx(3.0)
    chain = [PackageShape("a", 2), PackageShape("b", 2, depends_on=("a",)), PackageShape("c", 4, ("a",))]
    assert analysis.node_duration(chain, stage_seconds=1.0) == pytest.approx(6.0)
    reboot = [PackageShape("k", 4, interrupt=True)]
    assert analysis.node_duration(reboot, stage_seconds=1.0, reboot_seconds=2.0) == pytest.approx(6.0)
    with pytest.raises(ValueError, match="cycle"):
        analysis.node_duration([PackageShape("a", 1, ("b",)), PackageShape("b", 1, ("a",))], stage_seconds=1)


def test_in_progress_peaks() -> None:
    series = [(0.0, {"c0": 1}), (1.0, {"c0": 3, "c1": 2}), (2.0, {"c0": 0, "c1": 5})]
    assert analysis.in_progress_peaks(series) == {"c0": 3, "c1": 5}


def test_bench_manifests_are_valid_models() -> None:
    from benchmarks import run
    from nodewright.api.models import DeploymentPolicy, NodeWright

    cfg = run.parse_args(["--nodes", "300", "--packages", "3", "--compartments", "3", "--no-plot"])
    policy = DeploymentPolicy.model_validate(run.policy_manifest(cfg))
    nw = NodeWright.model_validate(run.nodewright_manifest(cfg))
    assert [c.name for c in policy.spec.compartments or []] == ["c0", "c1", "c2"]
    assert nw.spec.packages["pkg-b"].depends_on == {"pkg-a": "1.0.0"}
    assert [run.package_name(i) for i in (0, 25, 26, 27)] == ["pkg-a", "pkg-z", "pkg-aa", "pkg-ab"]
    assert run.go_duration(0.5) == "500ms"


def test_readme_table_has_a_row_per_run() -> None:
    from benchmarks import run

    result: dict[str, Any] = {
        "run": {"nodes": 50, "packages": 2, "compartments": 2, "stage_seconds": 0.5},
        "machine": {"cpu_model": "x", "nproc": 2, "memory_gib": 4.0, "python": "3.11", "kernel": "6"},
        "wall_seconds": 30.0,
        "ideal_makespan_seconds": 20.0,
        "makespan_ratio": 1.5,
        "operator": {"peak_rss_mib": 80.0, "cpu_seconds": 5.0},
        "api": {"writes_per_node_package": 8.0, "minimum_per_node_package": 7.0},
        "nodewright_status_bytes": {"max": 2048},
        "event_loop_lag_seconds": {"p50": 0.001, "p99": None},
        "controller_latency_seconds": {"p50": 0.2, "p99": 0.9},
        "pod_runtime_seconds": {"p50": 0.734},
        "invariants": {"verdict": "pass"},
    }
    text = run.render_readme([result])
    row = next(line for line in text.splitlines() if line.startswith("| 50 "))
    assert "| 0.5 (0.73) | 30.0 | 20.0 | 1.5 | - (-) |" in row
    assert "8.0 (7.0)" in row
    assert "1.0/-" in row
    assert "| 80.0 (-) |" in row  # no idle phase measured
    assert "8.0 (7.0) | - | - (-) |" in row, "runs from before the server-side counts show dashes"
    served = {
        **result,
        "api": {**result["api"], "simulator_writes": {"per_node_package": 3.1}},
        "control_plane": {"apiserver_cores": 0.93, "apiserver_cpu_ms_per_write": 8.4},
    }
    assert "8.0 (7.0) | 3.1 | 0.93 (8.4) |" in run.render_readme([served])
    assert "x, 2 CPUs, 4.0 GiB RAM" in text
    idle = {**result, "operator": {**result["operator"], "idle": {"rss_mib": 61.5}}}
    assert "| 80.0 (61.5) |" in run.render_readme([idle])
    stopped = {**result, "run": {**result["run"], "nodes": 60}, "completed": False, "nodes_complete": 12}
    row = next(line for line in run.render_readme([stopped]).splitlines() if line.startswith("| 60 "))
    assert "30.0 (stopped: 12/60 complete)" in row


def test_profile_summary_ranks_inclusive_and_self_time() -> None:
    collapsed = "\n".join(
        [
            "main (/a/nodewright/cli/main.py:1);reconcile (/a/nodewright/controller/nodes.py:10) 6",
            "main (/a/nodewright/cli/main.py:1);reconcile (/a/nodewright/controller/nodes.py:12);"
            "decode (/a/nodewright/api/nodestate.py:5) 3",
            "main (/a/nodewright/cli/main.py:2) 1",
            "garbage line",
        ]
    )
    summary = analysis.profile_summary(collapsed)
    assert summary["samples"] == 10
    inclusive = dict(map(tuple, summary["inclusive_percent"]))
    assert inclusive["main (cli/main.py)"] == 100.0
    assert inclusive["reconcile (controller/nodes.py)"] == 90.0, "two lines of one function are one row"
    own = dict(map(tuple, summary["self_percent"]))
    assert own == {
        "reconcile (controller/nodes.py)": 60.0,
        "decode (api/nodestate.py)": 30.0,
        "main (cli/main.py)": 10.0,
    }


def test_profile_components_count_a_sample_for_the_first_component_on_its_stack() -> None:
    loop = "run_forever (/a/asyncio/base_events.py:607);_run_once (/a/asyncio/base_events.py:1922)"
    collapsed = "\n".join(
        [
            f"{loop};reconcile (/a/nodewright/controller/nodes.py:10) 4",
            f"{loop};reconcile (/a/nodewright/controller/nodes.py:10);loads (/a/json/__init__.py:346) 3",
            f"{loop};trim_pod (/a/nodewright/kube/trim.py:9);"
            "RunDigests.digest (/a/nodewright/kube/trim.py:3) 2",
            f"{loop};trim_pod (/a/nodewright/kube/trim.py:9) 1",
            f"{loop} 5",
            "elsewhere (/a/x.py:1) 5",
            "garbage line",
        ]
    )
    components = analysis.profile_components(collapsed)
    assert components["samples"] == 20
    shares = {name: share for name, share in components["percent"].items() if share}
    assert shares == {
        "node reconcile + rest of controller": 20.0,
        "json decode": 15.0,
        "pod run digest": 10.0,
        "informer/cache/trim": 5.0,
        "asyncio loop": 25.0,
        "other": 25.0,
    }


def test_component_milliseconds_spread_the_operator_cpu_over_node_packages() -> None:
    ms = analysis.component_milliseconds({"json decode": 25.0, "other": 75.0}, 30.0, 1000)
    assert ms == {"json decode": 7.5, "other": 22.5}
    assert analysis.component_milliseconds({"other": 100.0}, 30.0, 0) == {}


def test_replay_makespan_sums_the_slowest_node_of_each_batch_per_compartment() -> None:
    admissions = {"a": ("c0", 1), "b": ("c0", 1), "c": ("c0", 2), "d": ("c1", 1), "e": ("c1", 2)}
    seconds = {"a": 3.0, "b": 5.0, "c": 4.0, "d": 2.0, "e": 2.5}
    assert analysis.replay_makespan(admissions, seconds) == 9.0  # c0: max(3, 5) + 4; c1: 4.5
    assert analysis.replay_makespan({}, seconds) == 0.0
    assert analysis.replay_makespan({"x": ("c0", 1)}, {}) == 0.0


def test_batch_timeline_splits_each_batch_where_operator_and_simulator_hand_over() -> None:
    admitted = {("c1", 1): 0.0, ("c1", 2): 20.0, ("c2", 1): 0.0}
    members = {"a": ("c1", 1), "b": ("c1", 1), "c": ("c1", 2), "d": ("c2", 1)}
    completed = {"a": 15.0, "b": 16.0, "c": 35.0}  # d never completed
    pods: dict[str, list[tuple[float, float | None]]] = {
        "a": [(-50.0, -40.0), (1.0, 14.0)],  # the first pod is an earlier rollout's: not this batch's
        "b": [(2.0, 15.5)],
        "c": [(21.0, 33.0)],
        "d": [(1.0, None)],
    }
    timeline = analysis.batch_timeline(admitted, members, completed, pods)
    assert [(t.compartment, t.batch, t.nodes) for t in timeline] == [("c1", 1, 2), ("c1", 2, 1), ("c2", 1, 1)]
    first = timeline[0]
    assert (first.first_pod, first.last_pod_done, first.complete) == (1.0, 15.5, 16.0)
    assert (timeline[2].last_pod_done, timeline[2].complete) == (None, None)

    summary = analysis.handover_summary(timeline)
    c1 = summary["c1"]
    assert c1["batches"] == 2
    assert c1["admission_to_first_pod"] == {"median": 1.0, "max": 1.0}
    assert c1["first_pod_to_last_pod_done"] == {"median": 13.25, "max": 14.5}
    assert c1["last_pod_done_to_complete"] == {"median": 1.25, "max": 2.0}
    # Only batch 1 has a next admission: complete at 16, batch 2 admitted at 20.
    assert c1["complete_to_next_admission"] == {"median": 4.0, "max": 4.0}
    assert c1["period"] == {"median": 20.0, "max": 20.0}
    assert summary["c2"] == {"batches": 1, "admission_to_first_pod": {"median": 1.0, "max": 1.0}}
