"""Issue 32: every node-rollout trace gets its root span exactly once, however the rollout ends.

The node controller runs against the scripted API server (tests/test_controller_nodes.py's harness)
with a tracer exporting to memory. A node that fails (a package gives up) or whose rollout is
superseded by a newer generation used to leave its stage spans without a `node-rollout` parent (the
only root was emitted on completion): Jaeger and Tempo show such traces as "root span not received".
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from nodewright.api import constants
from nodewright.api.timing import Timing, TracedAdmission, read_timing
from nodewright.controller.expectations import PodExpectations
from nodewright.controller.nodes import NodeReconciler
from nodewright.kube.client import KubeClient
from nodewright.kube.informer import Informer
from nodewright.kube.resources import NODES, NODEWRIGHTS, PODS
from nodewright.kube.trim import trim_node, trim_pod
from nodewright.observability.tracing import ROOT_SPAN_NAME, RolloutEnd, RolloutTracer, trace_step
from nodewright.plan import podspec
from tests.kubefake import FakeKube
from tests.test_controller_nodes import (
    NS,
    Env,
    _finish_init_containers,
    make_runtime,
    node_obj,
    nw_obj,
)


class TracedEnv(Env):
    exporter: InMemorySpanExporter
    tracer: RolloutTracer

    def spans(self) -> list[ReadableSpan]:
        self.tracer.force_flush()
        return list(self.exporter.get_finished_spans())

    def roots(self) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == ROOT_SPAN_NAME]

    seen_pods: dict[str, dict[str, Any]]

    def sync_pods(self) -> None:
        """The informers as their watches would leave them: the API server's pods and node."""
        held = {p["metadata"]["name"]: p for p in self.pods()}
        for name, gone in list(self.seen_pods.items()):
            if name not in held:
                self.rt.pods.delete(gone)
                del self.seen_pods[name]
        for name, pod in held.items():
            self.seen_pods[name] = trim_pod(pod)
            self.rt.pods.upsert(self.seen_pods[name])
        self.rt.nodes.upsert(trim_node(self.node()))

    def timing(self) -> Timing:
        return read_timing(self.node()["metadata"].get("annotations") or {}, "nw")


@pytest.fixture
async def traced() -> AsyncIterator[TracedEnv]:
    kube = await FakeKube().start()
    client = KubeClient(kube.config(), max_retries=0)
    nodes = Informer(client, NODES, transform=trim_node)
    pods = Informer(client, PODS, namespace=NS, transform=trim_pod)
    pods.add_index("node", lambda p: [podspec.pod_node(p)])
    nodewrights = Informer(client, NODEWRIGHTS)
    exporter = InMemorySpanExporter()
    tracer = RolloutTracer(exporter=exporter)
    rollouts: list[str] = []
    rt = make_runtime(
        client,
        nodes=nodes,
        nodewrights=nodewrights,
        pods=pods,
        enqueue_rollout=rollouts.append,
        pod_expectations=PodExpectations(trim_pod),
    )
    rt.tracer = tracer
    # As the operator wires them (controller.operator): the pod watch settles the expectations.
    expectations = rt.pod_expectations
    pods.add_handler(
        on_add=expectations.observed,
        on_update=lambda _old, new: expectations.observed(new),
        on_delete=expectations.observed_delete,
    )
    nodewrights.upsert(nw_obj())
    env = TracedEnv(kube, rt, NodeReconciler(rt), rollouts)
    env.exporter, env.tracer, env.seen_pods = exporter, tracer, {}
    try:
        yield env
    finally:
        tracer.shutdown()
        await rt.events.close(grace=0.1)
        await client.close()
        await kube.stop()


def _fail_pod(env: Env) -> None:
    [pod] = env.pods()
    first = pod["spec"]["initContainers"][1]["name"]  # after tool-init: the apply step
    statuses = [
        {"name": c["name"], "state": {"terminated": {"exitCode": 0 if c["name"] != first else 1}}}
        for c in pod["spec"]["initContainers"][:2]
    ]
    pod["status"] = {"phase": "Failed", "initContainerStatuses": statuses}
    env.rt.nodes.upsert(trim_node(env.node()))
    env.rt.pods.upsert(trim_pod(pod))


async def test_a_node_that_fails_ends_its_trace_with_an_error_root(traced: TracedEnv) -> None:
    one_attempt = {"tool": {"version": "1.0.0", "image": "ghcr.io/x/tool", "maxAttempts": 1}}
    traced.rt.nodewrights.upsert(nw_obj(packages=one_attempt))
    traced.put_node(node_obj(traced.admit()))
    await traced.reconciler.reconcile("nw/n1")
    assert traced.timing().trace is not None, "the open trace is remembered on the node"
    _fail_pod(traced)
    await traced.reconciler.reconcile("nw/n1")
    assert traced.node()["metadata"]["labels"][constants.status_label("nw")] == "erroring"
    [root] = traced.roots()
    assert root.status.status_code is StatusCode.ERROR
    assert "tool 1.0.0 (apply)" in (root.status.description or ""), root.status.description
    assert root.attributes is not None and root.attributes["nodewright.outcome"] == "failed"
    children = [s for s in traced.spans() if s is not root]
    assert children and all(
        c.parent is not None
        and c.parent.span_id == root.context.span_id
        and c.context.trace_id == root.context.trace_id
        for c in children
    )
    assert any(c.status.status_code is StatusCode.ERROR for c in children), "the failed stage's span"
    assert traced.timing().trace is None, "settled: nothing left to remember"
    for _ in range(2):  # later passes (the node stays erroring) emit no second root
        await traced.reconciler.reconcile("nw/n1")
    assert len(traced.roots()) == 1


async def test_a_rollout_superseded_by_a_newer_generation_ends_with_an_error_root(traced: TracedEnv) -> None:
    traced.put_node(node_obj(traced.admit()))
    await traced.reconciler.reconcile("nw/n1")
    assert not traced.roots()
    newer = nw_obj(packages={"tool": {"version": "2.0.0", "image": "ghcr.io/x/tool"}})
    newer["metadata"].update(generation=2, resourceVersion="2")
    traced.rt.nodewrights.upsert(newer)
    traced.sync_pods()
    await traced.reconciler.reconcile("nw/n1")
    [root] = traced.roots()
    assert root.status.status_code is StatusCode.ERROR
    assert root.status.description == "superseded: the spec changed (generation 2) before the node finished"
    assert root.attributes is not None and root.attributes["nodewright.outcome"] == "superseded"
    assert root.attributes["nodewright.batch"] == 1 and root.attributes["k8s.node.name"] == "n1"
    ended = traced.timing().trace
    assert ended is not None and ended.ended
    traced.sync_pods()
    await traced.reconciler.reconcile("nw/n1")
    assert len(traced.roots()) == 1, "ended once"

    # The new spec's rollout admits the node again -- batch 1, order 3, in the same second: only the
    # fingerprint tells the two admissions apart. It gets a trace of its own, which completes.
    node = traced.node()
    node["metadata"]["annotations"].update(traced.admit())
    traced.put_node(node)
    traced.sync_pods()  # the old pod's deletion observed, as its watch would
    await traced.reconciler.reconcile("nw/n1")
    [pod] = [p for p in traced.pods() if p["metadata"]["labels"].get("nodewright.io/version") == "2.0.0"]
    _finish_init_containers(pod)
    traced.rt.nodes.upsert(trim_node(traced.node()))
    traced.rt.pods.upsert(trim_pod(pod))
    await traced.reconciler.reconcile("nw/n1")
    assert traced.node()["metadata"]["labels"][constants.status_label("nw")] == "complete"
    first, second = sorted(traced.roots(), key=lambda r: r.end_time or 0)
    assert second.attributes is not None and second.attributes["nodewright.outcome"] == "complete"
    assert second.context.trace_id != first.context.trace_id


async def test_a_completed_node_ends_its_trace_once_with_an_ok_root(traced: TracedEnv) -> None:
    await traced.first_stage_done()
    await traced.reconciler.reconcile("nw/n1")
    [root] = traced.roots()
    assert root.status.status_code is StatusCode.OK
    assert root.attributes is not None and root.attributes["nodewright.outcome"] == "complete"
    assert traced.timing() == Timing()
    await traced.reconciler.reconcile("nw/n1")
    assert len(traced.roots()) == 1


async def test_without_tracing_nothing_is_persisted(traced: TracedEnv) -> None:
    traced.rt.tracer = RolloutTracer()  # no exporter: disabled
    traced.put_node(node_obj(traced.admit()))
    await traced.reconciler.reconcile("nw/n1")
    assert traced.timing().trace is None


def test_timing_keeps_the_traced_admission_through_its_annotation() -> None:
    traced = TracedAdmission("rack-a", 2, 7, "2026-01-01T11:00:00Z", "f" * 16)
    timing = Timing(cordoned_at=datetime(2026, 1, 1, tzinfo=UTC), trace=traced)
    assert Timing.decode(timing.encode()) == timing
    assert Timing.decode('{"t": {"c": 1}}') == Timing(), "unreadable: no trace, nothing else lost"


# ----------------------------------------------------------------------------------------------------
# The rule (pure)

ADMISSIONS = [
    TracedAdmission("c", b, b, f"2026-01-01T1{b}:00:00Z", fp) for b in (1, 2, 3) for fp in ("f1", "f2")
]


@given(
    st.lists(
        st.tuples(
            st.none() | st.sampled_from(ADMISSIONS),  # the admission that lets the node work now
            st.sampled_from([None, RolloutEnd.COMPLETE, RolloutEnd.FAILED]),  # settling under it
            st.sampled_from(["f1", "f2"]),  # the spec fingerprint
        ),
        max_size=12,
    )
)
def test_every_traced_admission_ends_at_most_once_and_only_after_it_opened(steps: list[Any]) -> None:
    traced: TracedAdmission | None = None
    opened: set[str] = set()
    ended: list[str] = []
    consumed: set[str] = set()
    latest: TracedAdmission | None = None
    for drawn, settled, fingerprint in steps:
        # The rollout writes a node's admissions one after another, each newer than the last: once
        # replaced, an admission never returns (a stale one may become current again, when the spec
        # change is reverted).
        if drawn is not None and (latest is None or ADMISSIONS.index(drawn) >= ADMISSIONS.index(latest)):
            latest = drawn
        current = latest if drawn is not None else None
        if current is not None and (current.key in consumed or current.fingerprint != fingerprint):
            current = None  # a consumed or stale admission does not let the node work
        step = trace_step(traced, current, fingerprint=fingerprint, generation=3, settled=settled)
        if step.spans_into is not None:
            opened.add(step.spans_into.key)
        for end in step.ended:
            assert end.admission.key in opened, "a root for a trace that never opened"
            ended.append(end.admission.key)
            assert (end.outcome in (RolloutEnd.COMPLETE, RolloutEnd.FAILED)) == (
                current is not None and end.admission.key == current.key
            )
            if end.outcome is RolloutEnd.SUPERSEDED:
                assert end.admission.fingerprint != fingerprint
        if settled is not None and current is not None:
            consumed.add(current.key)
        traced = step.persisted
    assert len(ended) == len(set(ended)), f"a trace ended twice: {ended}"
    open_now = {traced.key} if traced is not None and not traced.ended else set()
    assert opened == set(ended) | open_now, "every opened trace is ended or still open"
