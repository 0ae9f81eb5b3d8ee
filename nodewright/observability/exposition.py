"""OpenTelemetry `MetricsData` in the Prometheus text exposition format 0.0.4.

`render` turns one collection into the bytes `/metrics` serves. It writes what the OpenTelemetry
Prometheus exporter (opentelemetry-exporter-prometheus 0.66b2) and prometheus_client's
`generate_latest` wrote for our instruments, byte for byte, without importing either: they pull in
`http.server`, `wsgiref`, `socketserver`, `gzip`, ... (1.2 MiB RSS) that the operator never uses.

Families. Every metric of every resource and scope becomes a family, in collection order; metrics that
map to the same family name are merged into one family (the first one's description is its HELP) and
each data point is one sample, or one set of samples for a histogram. A metric whose kind differs from
the family already holding its name is left out: a second TYPE line for one name makes Prometheus
reject the whole scrape. A family is written even without points (its HELP and TYPE lines only).

- A monotonic Sum is a `counter`: a trailing `_total` is stripped from the name for the family and
  added back for the HELP/TYPE lines and the sample, so `x` and `x_total` both expose `x_total`.
- A non-monotonic Sum and a Gauge are a `gauge`.
- An explicit-bucket Histogram is a `histogram`: per point, one cumulative `_bucket` sample per
  boundary (label `le`; a point attribute of that name is dropped) and `le="+Inf"`, then `_count` and
  `_sum`. Like prometheus_client, `_count` and `_sum` are left out when the first boundary is negative
  (the sum is then no counter).
- Exponential histograms have no 0.0.4 form and are skipped (no instrument or view of ours makes one).

Our reader collects with cumulative temporality, so a Sum's temporality plays no part here.

Names. Runs of characters other than `[a-zA-Z0-9:]` in a metric name, or `[a-zA-Z0-9]` in a label
name, become one `_` (so `a__b` is `a_b`), and a leading digit is replaced by `_` (the exporter's
sanitising). The unit becomes a name suffix unless the name already ends with it: "s" is `_seconds`
(the only unit our instruments use; any other unit is appended sanitised, without the exporter's UCUM
table).

Labels. A point's attributes are its labels; every point of a metric carries the union of the metric's
label names, "" where a point lacks one. Labels are written sorted by name (`le` among them). A string
value is written as is, any other value as JSON (`true`, `3`, `["a", "b"]`). Label values escape `\\`,
`"` and newline; HELP text escapes `\\` and newline.

Numbers. Sample values and `le` are written as prometheus_client's `floatToGoString` writes them:
`+Inf`, `-Inf`, `NaN`, Python's shortest repr of the float otherwise (`1.0`, `0.25`, `1e-08`), but
positive values of a million and more in Go's exponent form (`1.5e+06`) as Go clients write them.
The exporter wrote `le` with `str()`, which is the same for every boundary of ours (floats below a
million); an integer boundary is `5.0` here, where it wrote `5`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal

from opentelemetry.sdk.metrics.export import Gauge, Histogram, HistogramDataPoint, Metric, MetricsData, Sum
from opentelemetry.util.types import AttributeValue

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

_Kind = Literal["counter", "gauge", "histogram"]

_INVALID_METRIC_NAME_RUN: Final = re.compile(r"[^a-zA-Z0-9:]+")
_INVALID_LABEL_NAME_RUN: Final = re.compile(r"[^a-zA-Z0-9]+")
_UNIT_SUFFIXES: Final[Mapping[str, str]] = {"s": "seconds"}


@dataclasses.dataclass(slots=True)
class _Family:
    name: str
    kind: _Kind
    help: str
    samples: list[str] = dataclasses.field(default_factory=list)

    def text(self) -> str:
        header = f"# HELP {self.name} {_escape_help(self.help)}\n# TYPE {self.name} {self.kind}\n"
        return header + "".join(self.samples)


def render(data: MetricsData) -> bytes:
    """The 0.0.4 text exposition of one collection (see the module docstring for the rules)."""
    families: dict[str, _Family] = {}
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                _add_metric(families, metric)
    return "".join(family.text() for family in families.values()).encode()


def _add_metric(families: dict[str, _Family], metric: Metric) -> None:
    data = metric.data
    if isinstance(data, Histogram):
        family = _family_of(families, metric, "histogram")
        if family is not None:
            label_rows = _label_rows([point.attributes or {} for point in data.data_points])
            for point, labels in zip(data.data_points, label_rows, strict=True):
                family.samples.extend(_histogram_samples(family.name, labels, point))
    elif isinstance(data, Sum | Gauge):
        monotonic = isinstance(data, Sum) and data.is_monotonic
        family = _family_of(families, metric, "counter" if monotonic else "gauge")
        if family is not None:
            label_rows = _label_rows([point.attributes or {} for point in data.data_points])
            for number_point, labels in zip(data.data_points, label_rows, strict=True):
                family.samples.append(
                    _sample(family.name, _label_text(sorted(labels.items())), number_point.value)
                )


def _family_of(families: dict[str, _Family], metric: Metric, kind: _Kind) -> _Family | None:
    """The family the metric's points go to; None when that name already holds another kind."""
    name = _sanitize_metric_name(metric.name)
    if kind == "counter":
        name = name.removesuffix("_total")
    suffix = _unit_suffix(metric.unit or "")
    if suffix and not name.endswith(f"_{suffix}"):
        name = f"{name}_{suffix}"
    if kind == "counter":
        name = f"{name}_total"
    family = families.setdefault(name, _Family(name, kind, metric.description or ""))
    return family if family.kind == kind else None


def _label_rows(attribute_sets: Sequence[Mapping[str, AttributeValue]]) -> list[dict[str, str]]:
    """One label dict per point, each with every label name any point of the metric has."""
    rows = [
        {_sanitize_label_name(key): _label_value(value) for key, value in attributes.items()}
        for attributes in attribute_sets
    ]
    names = {name for row in rows for name in row}
    return [{name: row.get(name, "") for name in names} for row in rows]


def _label_value(value: AttributeValue) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _histogram_samples(base: str, labels: Mapping[str, str], point: HistogramDataPoint) -> list[str]:
    ordered = sorted((name, value) for name, value in labels.items() if name != "le")
    before_le = "".join(f"{label}," for label in _formatted_labels(p for p in ordered if p[0] < "le"))
    after_le = "".join(f",{label}" for label in _formatted_labels(p for p in ordered if p[0] > "le"))
    bounds = [*point.explicit_bounds, math.inf]
    lines = [
        _sample(f"{base}_bucket", f'{before_le}le="{format_float(bound)}"{after_le}', cumulative)
        for bound, cumulative in zip(bounds, itertools.accumulate(point.bucket_counts), strict=True)
    ]
    if bounds[0] >= 0:
        labels_text = _label_text(ordered)
        lines.append(_sample(f"{base}_count", labels_text, point.count))
        lines.append(_sample(f"{base}_sum", labels_text, point.sum))
    return lines


def _formatted_labels(pairs: Iterable[tuple[str, str]]) -> list[str]:
    return [f'{name}="{_escape_label_value(value)}"' for name, value in pairs]


def _label_text(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(_formatted_labels(pairs))


def _sample(name: str, labels_text: str, value: float) -> str:
    if labels_text:
        return f"{name}{{{labels_text}}} {format_float(value)}\n"
    return f"{name} {format_float(value)}\n"


def _sanitize_metric_name(name: str) -> str:
    return _INVALID_METRIC_NAME_RUN.sub("_", _without_leading_digit(name))


def _sanitize_label_name(name: str) -> str:
    return _INVALID_LABEL_NAME_RUN.sub("_", _without_leading_digit(name))


def _without_leading_digit(name: str) -> str:
    return f"_{name[1:]}" if name[:1].isdigit() else name


def _unit_suffix(unit: str) -> str:
    """The name suffix of an OTel unit: "s" -> "seconds", "" -> none, others sanitised."""
    return _UNIT_SUFFIXES.get(unit) or _INVALID_METRIC_NAME_RUN.sub("_", unit).strip("_")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def format_float(value: float) -> str:
    """A sample value or `le` as prometheus_client writes it (see the module docstring)."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text
