"""Prometheus text exposition of OTel MetricsData: exact bytes, and prometheus_client's parser agrees."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Buckets,
    DataT,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.util.types import AttributeValue
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric as ParsedFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from nodewright.observability import exposition
from nodewright.observability.exposition import format_float, render
from nodewright.observability.metrics import NODEWRIGHT_MATCHED_NODES, NodeWrightSnapshot, OperatorMetrics

CUMULATIVE = AggregationTemporality.CUMULATIVE


def number(value: float, **attributes: AttributeValue) -> NumberDataPoint:
    return NumberDataPoint(attributes=attributes, start_time_unix_nano=0, time_unix_nano=0, value=value)


def observations(
    bounds: Sequence[float], counts: Sequence[int], total: float, **attributes: AttributeValue
) -> HistogramDataPoint:
    return HistogramDataPoint(
        attributes=attributes,
        start_time_unix_nano=0,
        time_unix_nano=0,
        count=sum(counts),
        sum=total,
        bucket_counts=list(counts),
        explicit_bounds=list(bounds),
        min=0.0,
        max=0.0,
    )


def metric(name: str, data: DataT, *, description: str = "", unit: str = "") -> Metric:
    return Metric(name=name, description=description, unit=unit, data=data)


def counter(name: str, *points: NumberDataPoint, description: str = "", unit: str = "") -> Metric:
    return metric(name, Sum(list(points), CUMULATIVE, is_monotonic=True), description=description, unit=unit)


def gauge(name: str, *points: NumberDataPoint, description: str = "", unit: str = "") -> Metric:
    return metric(name, Gauge(list(points)), description=description, unit=unit)


def histogram(name: str, *points: HistogramDataPoint, description: str = "", unit: str = "") -> Metric:
    return metric(name, Histogram(list(points), CUMULATIVE), description=description, unit=unit)


def scope(*metrics: Metric, name: str = "nodewright") -> ScopeMetrics:
    return ScopeMetrics(scope=InstrumentationScope(name), metrics=list(metrics), schema_url="")


def collection(*scopes: ScopeMetrics, resources: int = 1) -> MetricsData:
    """`resources` copies of one resource holding the scopes (a family spread over resources)."""
    resource = ResourceMetrics(resource=Resource.create({}), scope_metrics=list(scopes), schema_url="")
    return MetricsData(resource_metrics=[resource] * resources)


def text(*metrics: Metric) -> str:
    return render(collection(scope(*metrics))).decode()


def parse(exposed: str) -> dict[str, ParsedFamily]:
    return {family.name: family for family in text_string_to_metric_families(exposed)}


def test_empty_collection_renders_nothing() -> None:
    assert render(MetricsData(resource_metrics=[])) == b""
    assert render(collection(scope())) == b""


def test_content_type_is_the_classic_text_format() -> None:
    assert exposition.CONTENT_TYPE == CONTENT_TYPE_PLAIN_0_0_4 == "text/plain; version=0.0.4; charset=utf-8"


def test_counter_exposes_total_whether_or_not_the_name_has_it() -> None:
    assert text(counter("adds_total", number(3, name="q"), description="Adds.")) == (
        '# HELP adds_total Adds.\n# TYPE adds_total counter\nadds_total{name="q"} 3.0\n'
    )
    assert (
        text(counter("adds", number(3))) == "# HELP adds_total \n# TYPE adds_total counter\nadds_total 3.0\n"
    )


def test_gauge_and_non_monotonic_sum_are_gauges() -> None:
    updown = metric("in_flight", Sum([number(-2)], CUMULATIVE, is_monotonic=False), description="Now.")
    assert text(gauge("depth", number(7, name="q")), updown) == (
        '# HELP depth \n# TYPE depth gauge\ndepth{name="q"} 7.0\n'
        "# HELP in_flight Now.\n# TYPE in_flight gauge\nin_flight -2.0\n"
    )


def test_histogram_buckets_are_cumulative_with_le_sorted_among_labels() -> None:
    point = observations([0.1, 1.0], [2, 0, 1], 3.5, name="q", a="x")
    assert text(histogram("work_seconds", point, description="Work.", unit="s")) == (
        "# HELP work_seconds Work.\n"
        "# TYPE work_seconds histogram\n"
        'work_seconds_bucket{a="x",le="0.1",name="q"} 2.0\n'
        'work_seconds_bucket{a="x",le="1.0",name="q"} 2.0\n'
        'work_seconds_bucket{a="x",le="+Inf",name="q"} 3.0\n'
        'work_seconds_count{a="x",name="q"} 3.0\n'
        'work_seconds_sum{a="x",name="q"} 3.5\n'
    )


def test_histogram_point_attribute_le_gives_way_to_the_bucket_label() -> None:
    family = parse(text(histogram("h", observations([1.0], [1, 0], 0.5, le="attr", z="1"))))["h"]
    assert [s.labels for s in family.samples] == [
        {"le": "1.0", "z": "1"},
        {"le": "+Inf", "z": "1"},
        {"z": "1"},
        {"z": "1"},
    ]


def test_histogram_without_observations() -> None:
    assert text(histogram("lag_seconds", unit="s")) == "# HELP lag_seconds \n# TYPE lag_seconds histogram\n"
    zero = parse(text(histogram("lag_seconds", observations([0.5], [0, 0], 0), unit="s")))
    assert [(s.name, s.labels, s.value) for s in zero["lag_seconds"].samples] == [
        ("lag_seconds_bucket", {"le": "0.5"}, 0.0),
        ("lag_seconds_bucket", {"le": "+Inf"}, 0.0),
        ("lag_seconds_count", {}, 0.0),
        ("lag_seconds_sum", {}, 0.0),
    ]


def test_histogram_with_negative_buckets_has_no_sum_or_count() -> None:
    exposed = text(histogram("offset", observations([-1.0, 1.0], [1, 1, 0], -0.5)))
    assert [s.name for s in parse(exposed)["offset"].samples] == ["offset_bucket"] * 3


def test_histogram_parses_to_the_observations() -> None:
    bounds = [0.005, 0.025, 0.1, 1.0, 60.0]
    counts = [1, 0, 4, 2, 0, 3]
    family = parse(text(histogram("rest_seconds", observations(bounds, counts, 99.25, verb="GET"), unit="s")))
    buckets = {s.labels["le"]: s.value for s in family["rest_seconds"].samples if s.name.endswith("_bucket")}
    assert buckets == {"0.005": 1, "0.025": 1, "0.1": 5, "1.0": 7, "60.0": 7, "+Inf": 10}
    totals = {s.name: s.value for s in family["rest_seconds"].samples if not s.name.endswith("_bucket")}
    assert totals == {"rest_seconds_count": 10, "rest_seconds_sum": 99.25}


def test_points_with_different_labels_are_samples_of_one_family() -> None:
    exposed = text(gauge("leader", number(1, name="a"), number(0, name="b", zone="z1"), number(2)))
    assert exposed == (
        "# HELP leader \n# TYPE leader gauge\n"
        'leader{name="a",zone=""} 1.0\n'
        'leader{name="b",zone="z1"} 0.0\n'
        'leader{name="",zone=""} 2.0\n'
    )


def test_same_family_across_scopes_and_resources_is_merged() -> None:
    first = scope(counter("events_total", number(1, type="ADDED"), description="Events."), name="one")
    second = scope(counter("events", number(2, type="DELETED"), description="Other words."), name="two")
    exposed = render(collection(first, second, resources=2)).decode()
    assert exposed.count("# TYPE") == 1
    assert exposed.startswith("# HELP events_total Events.\n# TYPE events_total counter\n")
    family = parse(exposed)["events"]
    assert [(s.labels["type"], s.value) for s in family.samples] == [
        ("ADDED", 1),
        ("DELETED", 2),
        ("ADDED", 1),
        ("DELETED", 2),
    ]


def test_families_keep_collection_order() -> None:
    exposed = text(gauge("zeta", number(1)), counter("alpha", number(1)), gauge("mid", number(1)))
    assert [line.split()[2] for line in exposed.splitlines() if line.startswith("# TYPE")] == [
        "zeta",
        "alpha_total",
        "mid",
    ]


def test_a_name_taken_by_another_kind_is_left_out() -> None:
    exposed = text(gauge("jobs", number(1)), histogram("jobs", observations([1.0], [1, 0], 0.5)))
    assert exposed == "# HELP jobs \n# TYPE jobs gauge\njobs 1.0\n"


def test_exponential_histograms_are_skipped() -> None:
    empty = Buckets(offset=0, bucket_counts=[])
    point = ExponentialHistogramDataPoint(
        attributes={},
        start_time_unix_nano=0,
        time_unix_nano=0,
        count=1,
        sum=1.0,
        scale=0,
        zero_count=0,
        positive=empty,
        negative=empty,
        flags=0,
        min=1.0,
        max=1.0,
    )
    skipped = metric("sizes", ExponentialHistogram([point], CUMULATIVE))
    assert text(skipped, gauge("kept", number(1))) == "# HELP kept \n# TYPE kept gauge\nkept 1.0\n"


def test_unit_suffix() -> None:
    assert "# TYPE wait_seconds gauge" in text(gauge("wait", number(1), unit="s"))
    assert "# TYPE wait_seconds gauge" in text(gauge("wait_seconds", number(1), unit="s"))
    assert "wait_seconds_total 1.0" in text(counter("wait_total", number(1), unit="s"))
    assert "# TYPE size_kb gauge" in text(gauge("size", number(1), unit="/kb/"))


def test_names_are_sanitised() -> None:
    exposed = text(gauge("http.server..active-requests", number(1, **{"service.name": "x", "2xx": "y"})))
    assert 'http_server_active_requests{_xx="y",service_name="x"} 1.0\n' in exposed
    assert text(gauge("9lives:ok", number(1))).endswith("\n_lives:ok 1.0\n")
    assert 'a_b{c_d="1"} 1.0\n' in text(gauge("a__b", number(1, c__d="1")))


def test_label_and_help_escaping() -> None:
    exposed = text(gauge("g", number(1, sink='q"\\\nz ünï'), description="back\\slash\nnewline"))
    assert exposed == (
        "# HELP g back\\\\slash\\nnewline\n# TYPE g gauge\n" + 'g{sink="q\\"\\\\\\nz ünï"} 1.0\n'
    )
    family = parse(exposed)["g"]
    assert family.documentation == "back\\slash\nnewline"
    assert family.samples[0].labels == {"sink": 'q"\\\nz ünï'}


def test_non_string_attribute_values_are_json() -> None:
    exposed = text(gauge("g", number(1, flag=True, n=3, ratio=0.5, names=("a", "b"))))
    assert 'g{flag="true",n="3",names="[\\"a\\", \\"b\\"]",ratio="0.5"} 1.0\n' in exposed


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "NaN"),
        (1, "1.0"),
        (0, "0.0"),
        (-0.0, "-0.0"),
        (0.25, "0.25"),
        (1e-08, "1e-08"),
        (123456.0, "123456.0"),
        (1_000_000.0, "1e+06"),
        (1_234_567.0, "1.234567e+06"),
        (-2_000_000.0, "-2000000.0"),
        (10**20, "1e+20"),
    ],
)
def test_format_float(value: float, written: str) -> None:
    assert format_float(value) == written


def test_special_sample_values_parse() -> None:
    exposed = text(gauge("g", number(math.inf, k="a"), number(-math.inf, k="b"), number(math.nan, k="c")))
    values = [s.value for s in parse(exposed)["g"].samples]
    assert values[:2] == [math.inf, -math.inf] and math.isnan(values[2])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.floats(), st.integers(min_value=-(2**63), max_value=2**63)))
def test_format_float_matches_prometheus_client(value: float) -> None:
    assert format_float(value) == floatToGoString(value)  # type: ignore[no-untyped-call]


@settings(max_examples=500, deadline=None)
@given(label_value=st.text())
def test_any_label_value_round_trips(label_value: str) -> None:
    exposed = render(collection(scope(gauge("g", number(1, v=label_value, w="after"))))).decode()
    assert parse(exposed)["g"].samples[0].labels == {"v": label_value, "w": "after"}


@settings(max_examples=300, deadline=None)
@given(help_text=st.text().filter(lambda t: t == t.strip()))
def test_any_help_text_round_trips(help_text: str) -> None:
    """The parser strips the line, so HELP text with surrounding whitespace is out of scope."""
    exposed = render(collection(scope(gauge("g", number(1), description=help_text)))).decode()
    assert parse(exposed)["g"].documentation == help_text


@settings(max_examples=100, deadline=None)
@given(
    points=st.dictionaries(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["x", "y"])),
        st.integers(min_value=0, max_value=10**9),
        max_size=6,
    )
)
def test_counter_points_parse_to_their_values(points: dict[tuple[str, str], int]) -> None:
    exposed = text(counter("c_total", *(number(v, name=n, kind=k) for (n, k), v in points.items())))
    parsed = {(s.labels["name"], s.labels["kind"]): s.value for s in parse(exposed)["c"].samples}
    assert parsed == points


def test_operator_metrics_render_after_shutdown_is_empty() -> None:
    metrics = OperatorMetrics(otlp=False)
    metrics.domain.update_nodewright("nw", NodeWrightSnapshot(status="complete", matched=2))
    assert f'{NODEWRIGHT_MATCHED_NODES}{{nodewright="nw"}} 2.0'.encode() in metrics.render()
    metrics.shutdown()
    assert metrics.render() == b""


def test_concurrent_renders_each_get_a_whole_scrape() -> None:
    metrics = OperatorMetrics(otlp=False)
    metrics.domain.update_nodewright("nw", NodeWrightSnapshot(status="complete", matched=2))
    expected = metrics.render()
    scrapes: list[bytes] = []

    def scrape() -> None:
        scrapes.extend(metrics.render() for _ in range(20))

    threads = [threading.Thread(target=scrape) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert scrapes == [expected] * 80


def test_metrics_modules_do_not_import_prometheus_client() -> None:
    code = (
        "import sys\n"
        "import nodewright.observability.metrics, nodewright.observability.server\n"
        "banned = ('prometheus_client', 'opentelemetry.exporter.prometheus')\n"
        "print(sorted(m for m in sys.modules if m.startswith(banned)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
