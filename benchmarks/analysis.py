"""Pure parts of the scale benchmark: metric parsing, quantiles, the write minimum, the ideal makespan input.

Everything here is a function of its arguments (no clock, no I/O) and is unit-tested in
`tests/test_bench_units.py`. The derivations are explained in `docs/benchmarks.md`.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

# ----------------------------------------------------------------------------------------------------
# Prometheus text exposition

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Labels = tuple[tuple[str, str], ...]
Samples = dict[str, dict[Labels, float]]


def _unescape(value: str) -> str:
    return value.replace(r"\"", '"').replace(r"\n", "\n").replace("\\\\", "\\")


def parse_prometheus(text: str) -> Samples:
    """`{metric: {sorted label pairs: value}}` from the text exposition format (comments skipped)."""
    out: Samples = defaultdict(dict)
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, _, label_text, value = match.group(1), match.group(2), match.group(3), match.group(4)
        labels = tuple(sorted((k, _unescape(v)) for k, v in _LABEL.findall(label_text or "")))
        try:
            out[name][labels] = float(value)
        except ValueError:
            continue
    return dict(out)


def delta(after: Samples, before: Samples | None) -> Samples:
    """Counter/histogram increase between two scrapes (a series absent before counts from 0)."""
    if before is None:
        return after
    out: Samples = {}
    for name, series in after.items():
        old = before.get(name, {})
        out[name] = {labels: value - old.get(labels, 0.0) for labels, value in series.items()}
    return out


def sum_by(samples: Samples, metric: str, keys: Sequence[str]) -> dict[tuple[str, ...], float]:
    """Sum of a metric's series grouped by the given label names (like PromQL `sum by`)."""
    grouped: dict[tuple[str, ...], float] = defaultdict(float)
    for labels, value in samples.get(metric, {}).items():
        as_dict = dict(labels)
        grouped[tuple(as_dict.get(k, "") for k in keys)] += value
    return dict(grouped)


def histogram_buckets(samples: Samples, metric: str) -> list[tuple[float, float]]:
    """Cumulative `(le, count)` of a histogram, summed over all label sets, sorted by `le`."""
    totals: dict[float, float] = defaultdict(float)
    for labels, value in samples.get(f"{metric}_bucket", {}).items():
        le = dict(labels).get("le")
        if le is None:
            continue
        totals[math.inf if le in ("+Inf", "Inf", "inf") else float(le)] += value
    return sorted(totals.items())


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """PromQL `histogram_quantile`: linear interpolation inside the bucket holding the q-quantile.

    Returns None with no observations. A quantile in the +Inf bucket returns the largest finite bound
    (as Prometheus does). The lower bound of the first bucket is 0 (durations are non-negative).
    """
    if not buckets or not 0.0 <= q <= 1.0:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


# ----------------------------------------------------------------------------------------------------
# Plain percentiles (controller latency samples)


def percentile(values: Iterable[float], p: float) -> float | None:
    """The p-th percentile (0..100) with linear interpolation between closest ranks; None if empty."""
    data = sorted(values)
    if not data:
        return None
    if len(data) == 1:
        return data[0]
    position = (len(data) - 1) * min(100.0, max(0.0, p)) / 100.0
    low = math.floor(position)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (position - low)


# ----------------------------------------------------------------------------------------------------
# API requests


READ_VERBS = frozenset({"GET", "LIST", "WATCH"})


def requests_table(samples: Samples, metric: str = "rest_client_requests_total") -> dict[str, dict[str, int]]:
    """`{verb: {resource: count}}` from `rest_client_requests_total` (all codes)."""
    table: dict[str, dict[str, int]] = defaultdict(dict)
    for (verb, resource), value in sum_by(samples, metric, ("verb", "resource")).items():
        if value:
            table[verb][resource] = table[verb].get(resource, 0) + round(value)
    return {v: dict(sorted(r.items())) for v, r in sorted(table.items())}


@dataclass(frozen=True, slots=True)
class WriteCounts:
    node_and_pod: int
    """Writes the stage machine is measured on: nodes (incl. status/eviction subresources) and pods."""
    nodewright_status: int
    events: int
    other: int

    @property
    def total(self) -> int:
        return self.node_and_pod + self.nodewright_status + self.events + self.other


def classify_writes(table: Mapping[str, Mapping[str, int]]) -> WriteCounts:
    """Split the operator's writes (every verb but GET/LIST/WATCH) by what they are for."""
    node_pod = status = events = other = 0
    for verb, resources in table.items():
        if verb.upper() in READ_VERBS:
            continue
        for resource, count in resources.items():
            base = resource.split("/")[0].split(".")[0]
            if base in ("nodes", "pods"):
                node_pod += count
            elif base == "nodewrights":
                status += count
            elif base == "events":
                events += count
            else:
                other += count
    return WriteCounts(node_pod, status, events, other)


def _base_resource(resource: str) -> str:
    """`pods/binding` -> `pods`, `nodewrights.nodewright.io` -> `nodewrights` (the client's spelling)."""
    return resource.split("/")[0].split(".")[0]


def server_writes(samples: Samples) -> dict[str, dict[str, int]]:
    """Writes kube-apiserver served, from every client: `{verb: {resource[/subresource]: count}}`.

    From `apiserver_request_total` (all codes); CONNECT (logs, exec) is not a write.
    """
    table: dict[str, dict[str, int]] = defaultdict(dict)
    grouped = sum_by(samples, "apiserver_request_total", ("verb", "resource", "subresource"))
    for (verb, resource, subresource), value in grouped.items():
        if verb.upper() in READ_VERBS or verb.upper() == "CONNECT" or not value:
            continue
        name = f"{resource}/{subresource}" if subresource else resource
        table[verb][name] = table[verb].get(name, 0) + round(value)
    return {v: dict(sorted(r.items())) for v, r in sorted(table.items())}


def total_writes(table: Mapping[str, Mapping[str, int]]) -> int:
    return sum(
        count
        for verb, resources in table.items()
        if verb.upper() not in READ_VERBS
        for count in resources.values()
    )


def other_clients_writes(
    server: Mapping[str, Mapping[str, int]], operator: Mapping[str, Mapping[str, int]]
) -> dict[str, int]:
    """What the API server wrote for clients other than the operator, per verb and base resource
    (`"PATCH pods"` counts `pods/status` patches too).

    `server` is `server_writes`; `operator` the operator's own `requests_table`. The two spell
    subresources differently (the client counts `nodes/status` patches as `nodes`), so the comparison is
    per base resource. A request the operator sent that never reached the server (no response) makes
    a difference negative; it is floored at 0.
    """
    totals: dict[str, int] = defaultdict(int)
    for sign, table in ((1, server), (-1, operator)):
        for verb, resources in table.items():
            if verb.upper() in READ_VERBS:
                continue
            for resource, count in resources.items():
                totals[f"{verb.upper()} {_base_resource(resource)}"] += sign * count
    return {key: count for key, count in sorted(totals.items()) if count > 0}


# ----------------------------------------------------------------------------------------------------
# The minimum number of writes the stage machine needs


@dataclass(frozen=True, slots=True)
class PackageShape:
    """One package as the benchmark installs it: its stage count, whether it reboots the node, and how
    many pods its install takes (`pods_for`; 0: as many as stages)."""

    name: str
    stages: int
    depends_on: tuple[str, ...] = ()
    interrupt: bool = False
    pods: int = 0

    @property
    def pod_count(self) -> int:
        return self.pods or self.stages


def stages_for(*, interrupt: bool) -> int:
    """Stages of a fresh install: apply, config, and interrupt, post-interrupt when it interrupts."""
    return 4 if interrupt else 2


def pods_for(*, interrupt: bool) -> int:
    """Pods of a fresh install: one for apply + config (one pod per transition, `plan.podspec.
    transition_stages`), and one each for the interrupt and post-interrupt when it interrupts."""
    return 3 if interrupt else 1


@dataclass(frozen=True, slots=True)
class WriteMinimum:
    per_node: int
    per_node_package: float
    breakdown: Mapping[str, int]


def chained_pods(packages: Sequence[PackageShape]) -> int:
    """Pods of one node's install with `--chain-packages` (`plan.node._Planner.chain_for`): a package
    without interrupt whose dependencies all run in one pod whose own package has no interrupt runs in
    that pod too; every other package starts pods of its own (`pod_count`)."""
    pod_of: dict[str, int] = {}
    heads: dict[int, PackageShape] = {}
    pods = 0
    for package in packages:  # in dependency order, as the benchmark lists them
        groups = {pod_of.get(d) for d in package.depends_on}
        joined = next(iter(groups)) if len(groups) == 1 else None
        if (
            package.depends_on
            and joined is not None
            and not package.interrupt
            and not heads[joined].interrupt
        ):
            pod_of[package.name] = joined
            continue
        pod_of[package.name] = len(heads)
        heads[len(heads)] = package
        pods += package.pod_count
    return pods


def minimum_writes(
    packages: Sequence[PackageShape], *, workload_pods_per_node: int = 0, chained: bool = False
) -> WriteMinimum:
    """The fewest node/pod writes one node needs to install `packages` (derivation in docs/benchmarks.md).

    Per node:
    - 1 admission (the rollout controller records batch membership on the node);
    - per pod: 1 pod create and 1 pod delete (a package pod's pause container never exits, so the pod
      must be removed), and 1 binding that places the created pod on its node together with its seal
      over its uid (the uid exists only once the pod does, and the pod must not run unsealed; see
      `controller.signing.PodSigner`). One pod runs every stage of a transition up to the next
      interrupt (an install: apply and config in one pod), so an install without interrupt is 1 pod;
    - state annotation writes: the start of a node's work must be durable before the first pod exists
      (1 write: all root packages start together once admitted), and every pod's end is a durable
      transition (1 write each, for all the stages the pod ran), which also records the next pod's
      start, or the package's completion and the start of the packages depending on it. So `pods + 1`.
      (Completions that happen to coincide could share a write; the minimum does not count on lucky
      timing.)
    - the node condition `nodewright.io/<nw>` costs no request of its own without an interrupt: the
      node status subresource takes metadata too, so it rides on the state writes (the last one sets
      it True). With an interrupt the last state write also uncordons, which is `spec` and cannot go
      through `nodes/status`, so the condition needs 1 write of its own;
    - with an interrupt: cordon and uncordon (2), and one eviction per workload pod.
    The NodeWright status and Events are per rollout / optional and are reported separately.
    With `chained` (`--chain-packages`) dependents run in their dependency's pod (`chained_pods`).
    """
    pods = chained_pods(packages) if chained else sum(p.pod_count for p in packages)
    interrupts = any(p.interrupt for p in packages)
    breakdown = {
        "admission": 1,
        "pod_create": pods,
        "pod_bind": pods,
        "pod_delete": pods,
        "state": pods + 1,
        "condition": 1 if interrupts else 0,
        "cordon_uncordon": 2 if interrupts else 0,
        "evictions": workload_pods_per_node if interrupts else 0,
    }
    per_node = sum(breakdown.values())
    return WriteMinimum(
        per_node=per_node,
        per_node_package=per_node / max(1, len(packages)),
        breakdown=breakdown,
    )


# ----------------------------------------------------------------------------------------------------
# Ideal makespan inputs


def node_duration(
    packages: Sequence[PackageShape], *, stage_seconds: float, reboot_seconds: float = 0.0
) -> float:
    """Critical path through the package DAG on one node: each package takes stages * stage_seconds
    (plus the reboot when it interrupts); a package starts when all its dependencies completed."""
    by_name = {p.name: p for p in packages}
    memo: dict[str, float] = {}

    def finish(name: str, trail: frozenset[str]) -> float:
        if name in memo:
            return memo[name]
        if name in trail:
            raise ValueError(f"dependency cycle through {name}")
        pkg = by_name[name]
        start = max((finish(d, trail | {name}) for d in pkg.depends_on if d in by_name), default=0.0)
        own = pkg.stages * stage_seconds + (reboot_seconds if pkg.interrupt else 0.0)
        memo[name] = start + own
        return memo[name]

    return max((finish(p.name, frozenset()) for p in packages), default=0.0)


def in_progress_peaks(samples: Sequence[tuple[float, Mapping[str, int]]]) -> dict[str, int]:
    """Largest observed in-progress count per compartment over a time series."""
    peaks: dict[str, int] = {}
    for _, counts in samples:
        for name, value in counts.items():
            peaks[name] = max(peaks.get(name, 0), value)
    return peaks


def replay_makespan(admissions: Mapping[str, tuple[str, int]], node_seconds: Mapping[str, float]) -> float:
    """The makespan of the observed batches if every batch had started the moment the previous one
    ended: per compartment, the sum over its batches of the slowest node's time; the slowest
    compartment wins. `admissions`: node -> (compartment, batch); `node_seconds`: the node's own time
    (e.g. the sum of its pods' runtimes). Nodes without a time count as 0.
    """
    slowest: dict[str, dict[int, float]] = defaultdict(dict)
    for node, (compartment, batch) in admissions.items():
        seconds = node_seconds.get(node, 0.0)
        batches = slowest[compartment]
        batches[batch] = max(batches.get(batch, 0.0), seconds)
    return max((sum(b.values()) for b in slowest.values()), default=0.0)


@dataclass(frozen=True, slots=True)
class BatchTimes:
    """When one batch's steps happened, in seconds on one clock (None: not seen)."""

    compartment: str
    batch: int
    nodes: int
    admitted: float
    first_pod: float | None
    last_pod_done: float | None
    complete: float | None


HANDOVER_STEPS = (
    "admission_to_first_pod",
    "first_pod_to_last_pod_done",
    "last_pod_done_to_complete",
    "complete_to_next_admission",
    "period",
)
"""A batch's time, split where the operator and the simulator hand over to each other: the operator
turns an admission into pods; the simulated kubelet runs them (the stages' own time plus its
latency); the operator sees the last pod end and writes the node complete; the rollout pass sees
the batch settled and admits the next one. `period`: admission to the next batch's admission."""


def batch_timeline(
    admitted: Mapping[tuple[str, int], float],
    members: Mapping[str, tuple[str, int]],
    completed: Mapping[str, float],
    pods: Mapping[str, Sequence[tuple[float, float | None]]],
) -> list[BatchTimes]:
    """Each batch's times. `admitted`: (compartment, batch) -> first admission seen; `members`: node
    -> its (compartment, batch); `completed`: node -> when it was seen complete; `pods`: node ->
    (seen created, seen succeeded or None) of its package pods. Only pods created after the batch's
    admission count for it (a node's earlier pods belong to an earlier rollout)."""
    grouped: dict[tuple[str, int], list[str]] = defaultdict(list)
    for node, key in members.items():
        grouped[key].append(node)
    timeline = []
    for (compartment, batch), nodes in sorted(grouped.items()):
        start = admitted.get((compartment, batch))
        if start is None:
            continue
        runs = [run for n in nodes for run in pods.get(n, ()) if run[0] >= start]
        done = [end for _, end in runs if end is not None]
        ends = [completed[n] for n in nodes if n in completed]
        timeline.append(
            BatchTimes(
                compartment=compartment,
                batch=batch,
                nodes=len(nodes),
                admitted=start,
                first_pod=min((created for created, _ in runs), default=None),
                last_pod_done=max(done, default=None),
                complete=max(ends) if len(ends) == len(nodes) else None,
            )
        )
    return timeline


def handover_summary(timeline: Sequence[BatchTimes]) -> dict[str, dict[str, Any]]:
    """Per compartment: its batch count and the median (and max) of each step of `HANDOVER_STEPS`
    over its batches, in seconds; the steps of a batch add up to its period."""
    by_compartment: dict[str, list[BatchTimes]] = defaultdict(list)
    for times in timeline:
        by_compartment[times.compartment].append(times)
    summary: dict[str, dict[str, Any]] = {}
    for compartment, batches in sorted(by_compartment.items()):
        batches.sort(key=lambda t: t.batch)
        steps: dict[str, list[float]] = {step: [] for step in HANDOVER_STEPS}
        for times, following in zip(batches, [*batches[1:], None], strict=True):
            nxt = following.admitted if following is not None else None
            pairs = (
                (times.admitted, times.first_pod),
                (times.first_pod, times.last_pod_done),
                (times.last_pod_done, times.complete),
                (times.complete, nxt),
                (times.admitted, nxt),
            )
            for step, (begin, end) in zip(HANDOVER_STEPS, pairs, strict=True):
                if begin is not None and end is not None:
                    steps[step].append(end - begin)
        summary[compartment] = {"batches": len(batches)} | {
            step: {"median": _round3(percentile(values, 50)), "max": _round3(max(values))}
            for step, values in steps.items()
            if values
        }
    return summary


def _round3(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# ----------------------------------------------------------------------------------------------------
# Profiles


def profile_summary(collapsed: str, *, top: int = 25) -> dict[str, Any]:
    """Rank functions in py-spy's collapsed stacks (`frame;frame;... count` per line).

    inclusive: share of samples with the function anywhere on the stack (counted once per sample);
    self: share of samples with it on top. Frames are `function (file:line)`; the line is dropped so
    one function is one row.
    """
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for stack, count in _stacks(collapsed):
        total += count
        frames = [_frame_name(f) for f in stack]
        for name in set(frames):
            inclusive[name] = inclusive.get(name, 0) + count
        if frames:
            own[frames[-1]] = own.get(frames[-1], 0) + count

    def ranked(table: Mapping[str, int]) -> list[list[Any]]:
        rows = sorted(table.items(), key=lambda kv: -kv[1])[:top]
        return [[name, round(100.0 * n / total, 1)] for name, n in rows]

    return {"samples": total, "inclusive_percent": ranked(inclusive), "self_percent": ranked(own)}


def _frame_name(frame: str) -> str:
    """`reconcile (/x/nodewright/controller/nodes.py:123)` -> `reconcile (controller/nodes.py)`."""
    head, sep, rest = frame.partition(" (")
    if not sep:
        return frame
    path = rest.rstrip(")").rsplit(":", 1)[0]
    return f"{head} ({'/'.join(path.split('/')[-2:])})"


PROFILE_COMPONENTS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    (
        "json decode",
        (
            "json/decoder.py",
            "json/__init__.py:loads",
            "kube/client.py:_decode",
            "kube/client.py:WatchStream.decode",
            "kube/client.py:decode",
        ),
    ),
    ("pod run digest", ("plan/podspec.py:run_digest", "plan/podspec.py:run_spec", "kube/trim.py:RunDigests")),
    ("json encode", ("json/encoder.py", "json/__init__.py:dumps")),
    ("logging", ("structlog/", "observability/logging.py", "logging/__init__.py")),
    ("metrics/otel", ("opentelemetry/", "observability/metrics.py", "observability/exposition.py")),
    ("events", ("observability/events.py", "observability/recorder.py")),
    ("pydantic models", ("pydantic/", "pydantic_core")),
    ("planner (plan/)", ("nodewright/plan/",)),
    ("api codecs (api/)", ("nodewright/api/",)),
    ("http client", ("aiohttp/", "yarl/", "multidict/", "ssl.py", "kube/client.py", "kube/ratelimit.py")),
    ("informer/cache/trim", ("kube/informer.py", "kube/store.py", "kube/trim.py", "kube/reflector.py")),
    ("rollout pass + status", ("controller/rollout.py", "controller/budgets.py", "controller/gates.py")),
    ("node reconcile + rest of controller", ("controller/",)),
    ("work queue", ("kube/workqueue.py",)),
    ("asyncio loop", ("asyncio/", "selectors.py")),
)
"""Components of operator CPU for `profile_components`: a sample belongs to the first component (in
this order) whose pattern names a frame of its stack, so a JSON decode inside a reconcile counts as
decoding and what is left of a reconcile as the reconcile. Patterns match `file:function` of a frame."""


def _stacks(collapsed: str) -> Iterator[tuple[list[str], int]]:
    """py-spy's collapsed stacks, `frame;frame;... count` per line: each stack's frames and count."""
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if stack and count_text.isdigit():
            yield [f for f in stack.split(";") if f], int(count_text)


def profile_components(collapsed: str) -> dict[str, Any]:
    """Share of samples per component of `PROFILE_COMPONENTS` (plus "other") in py-spy's collapsed
    stacks: a breakdown of where the operator's CPU goes."""
    counts: dict[str, int] = dict.fromkeys([name for name, _ in PROFILE_COMPONENTS] + ["other"], 0)
    total = 0
    for stack, count in _stacks(collapsed):
        total += count
        frames = [_frame_key(f) for f in stack]
        counts[_component(frames)] += count
    return {
        "samples": total,
        "percent": {name: round(100.0 * n / total, 1) if total else 0.0 for name, n in counts.items()},
    }


def component_milliseconds(
    percent: Mapping[str, float], cpu_seconds: float, node_packages: int
) -> dict[str, float]:
    """Each component's share of the operator's CPU over the run, in milliseconds per node-package
    (py-spy samples only running threads, so a share of samples is a share of CPU time)."""
    if node_packages <= 0:
        return {}
    return {
        name: round(pct / 100.0 * cpu_seconds * 1000.0 / node_packages, 2) for name, pct in percent.items()
    }


def _component(frames: Sequence[str]) -> str:
    for name, patterns in PROFILE_COMPONENTS:
        if any(pattern in frame for frame in frames for pattern in patterns):
            return name
    return "other"


def _frame_key(frame: str) -> str:
    """`reconcile (/x/controller/nodes.py:123)` -> `(/x/controller/nodes.py:reconcile`."""
    head, sep, rest = frame.partition(" (")
    if not sep:
        return frame
    return f"({rest.rstrip(')').rsplit(':', 1)[0]}:{head}"
