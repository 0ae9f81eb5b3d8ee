"""Unit tests of the controller's shared context: admission codec, pod signatures, read-your-writes."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodewright.api import constants
from nodewright.api.models import NodeWright
from nodewright.controller.context import (
    POD_EXPECTATION_TTL,
    EventRecorder,
    MalformedAdmission,
    ModelCache,
    PodExpectations,
    PodSigner,
    WriteThrough,
    decode_admission,
    effective_nodewright,
    encode_admission,
    node_key,
    parse_taint,
    split_node_key,
)
from nodewright.kube.trim import trim_node
from nodewright.plan.rollout import Admission


@given(
    compartment=st.text(min_size=1, max_size=20),
    batch=st.integers(min_value=1, max_value=10_000),
    order=st.integers(min_value=0, max_value=100_000),
    fingerprint=st.text(alphabet="0123456789abcdef", min_size=1, max_size=16),
)
def test_admission_round_trip(compartment: str, batch: int, order: int, fingerprint: str) -> None:
    admission = Admission(compartment, batch, order, fingerprint, "2026-01-01T00:00:00Z")
    assert decode_admission(encode_admission(admission)) == admission


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        '{"c":"a","b":1,"o":0,"f":"x"}',
        '{"c":"a","b":0,"o":0,"f":"x","at":"t"}',
        '{"c":"a","b":true,"o":0,"f":"x","at":"t"}',
        '{"c":"a","b":1,"o":-1,"f":"x","at":"t"}',
        '{"c":"a","b":1,"o":0,"f":"x","at":"t","extra":1}',
    ],
)
def test_malformed_admissions_are_rejected(text: str) -> None:
    with pytest.raises(MalformedAdmission):
        decode_admission(text)


def test_node_keys_round_trip() -> None:
    assert split_node_key(node_key("kernel", "gpu-node-1")) == ("kernel", "gpu-node-1")


def test_parse_taint() -> None:
    assert parse_taint("nodewright.io/runtime-required=true:NoSchedule") == (
        "nodewright.io/runtime-required",
        "true",
        "NoSchedule",
    )
    assert parse_taint("k:NoExecute") == ("k", None, "NoExecute")
    with pytest.raises(ValueError, match=r"NoSchedule"):
        parse_taint("k=v")


def _pod() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "kernel-sysctl-apply-node-1-1-abcd",
            "labels": {
                constants.POD_LABEL_NODEWRIGHT: "kernel",
                constants.POD_LABEL_PACKAGE: "sysctl",
                constants.POD_LABEL_VERSION: "1.0.0",
                constants.POD_LABEL_STAGE: "apply",
            },
            "annotations": {constants.POD_ANNOTATION_ATTEMPT: "1", constants.POD_ANNOTATION_SPEC_HASH: "ff"},
            "ownerReferences": [{"uid": "nw-uid", "controller": True}],
        },
        "spec": {"nodeName": "node-1"},
    }


def test_signed_pods_verify_and_tampering_is_detected() -> None:
    signer = PodSigner(PodSigner.generate_key())
    pod = signer.sign(_pod())
    assert signer.verify(pod)
    for path in (("spec", "nodeName"), ("metadata", "labels", constants.POD_LABEL_STAGE)):
        forged = copy.deepcopy(pod)
        target = forged
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = "other"
        assert not signer.verify(forged)
    assert not PodSigner(PodSigner.generate_key()).verify(pod)
    assert not signer.verify(_pod())


class _FakeInformer:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.objects.get(key)


def _node(rv: str, value: str) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "resourceVersion": rv, "annotations": {"nodewright.io/x": value}}}


def test_write_through_prefers_newer_writes_until_the_cache_catches_up() -> None:
    informer = _FakeInformer()
    view = WriteThrough(informer, trim_node)  # type: ignore[arg-type]
    informer.objects["n1"] = trim_node(_node("10", "old"))
    view.record(_node("12", "mine"))
    assert view.get("n1")["metadata"]["annotations"]["nodewright.io/x"] == "mine"  # type: ignore[index]
    informer.objects["n1"] = trim_node(_node("11", "stale"))
    assert view.get("n1")["metadata"]["annotations"]["nodewright.io/x"] == "mine"  # type: ignore[index]
    informer.objects["n1"] = trim_node(_node("13", "newer"))
    assert view.get("n1")["metadata"]["annotations"]["nodewright.io/x"] == "newer"  # type: ignore[index]
    del informer.objects["n1"]
    view.record(_node("14", "gone"))
    assert view.get("n1") is None


def _nodewright(**extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": constants.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": "kernel", "resourceVersion": "1", **extra},
        "spec": {
            "packages": {
                "agent": {
                    "version": "1.0.0",
                    "image": "r/agent",
                    "uninstall": {"enabled": True, "apply": False},
                },
                "plain": {"version": "2.0.0", "image": "r/plain"},
            }
        },
    }


def test_deletion_uninstalls_only_packages_that_support_it() -> None:
    live = NodeWright.model_validate(_nodewright())
    assert effective_nodewright(live) is live
    deleting = NodeWright.model_validate(_nodewright(deletionTimestamp="2026-01-01T00:00:00Z"))
    effective = effective_nodewright(deleting)
    agent = effective.spec.packages["agent"].uninstall
    assert agent is not None and agent.apply
    assert effective.spec.packages["plain"].uninstall is None


def test_model_cache_reports_invalid_specs_instead_of_raising() -> None:
    cache = ModelCache()
    bad = _nodewright()
    bad["spec"]["priority"] = 0
    model, error = cache.nodewright(bad)
    assert model is None and error is not None and "priority" in error
    good = _nodewright()
    good["metadata"]["resourceVersion"] = "2"
    model, error = cache.nodewright(good)
    assert model is not None and error is None


class _EventSink:
    def __init__(self, *, fail: bool = False) -> None:
        self.created: list[tuple[str, str]] = []
        self.fail = fail
        self.gate: asyncio.Event | None = None

    async def create_event(self, namespace: str, **kwargs: Any) -> dict[str, Any]:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise RuntimeError("apiserver down")
        self.created.append((namespace, kwargs["reason"]))
        return {}


def _recorder(sink: _EventSink, **kwargs: Any) -> EventRecorder:
    return EventRecorder(sink, clock=lambda: datetime.now(UTC), instance="t", **kwargs)  # type: ignore[arg-type]


async def test_events_are_sent_in_the_background_and_deduplicated() -> None:
    sink = _EventSink()
    recorder = _recorder(sink)
    for reason in ("A", "A", "B"):
        await recorder.record(kind="Node", name="n1", uid=None, reason=reason, message="m")
    async with asyncio.timeout(5):
        await recorder.flush()
    assert sink.created == [("default", "A"), ("default", "B")]
    await recorder.close()


async def test_a_full_queue_drops_events_instead_of_blocking() -> None:
    sink = _EventSink()
    sink.gate = asyncio.Event()
    recorder = _recorder(sink, queue_size=2)
    for i in range(6):
        async with asyncio.timeout(1):
            await recorder.record(kind="Node", name="n1", uid=None, reason=f"R{i}", message="m")
    assert recorder.dropped >= 3
    sink.gate.set()
    await recorder.close()
    assert 1 <= len(sink.created) <= 3


async def test_event_failures_never_raise() -> None:
    recorder = _recorder(_EventSink(fail=True))
    await recorder.record(kind="NodeWright", name="nw", uid="u", reason="X", message="m")
    await recorder.close()
    assert recorder.sent == 0


def _package_pod(name: str, node: str, uid: str, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}}


def test_pod_expectations_until_the_watch_reports_them() -> None:
    now = [0.0]
    exp = PodExpectations(clock=lambda: now[0])
    a, b = _package_pod("a", "n1", "ua"), _package_pod("b", "n2", "ub")
    exp.created(a)
    exp.created(b)
    assert exp.pending_on("n1", []) == [a]
    assert exp.pending_on("n1", [a]) == [], "the informer lists it: no duplicate"
    exp.observed(a)
    assert exp.pending_on("n1", []) == [], "a watch event settles the expectation"
    exp.deleted("ub")
    assert exp.deletion_pending("ub") and not exp.deletion_pending(None)
    exp.observed(b)
    assert exp.deletion_pending("ub"), "an update without deletionTimestamp is not the deletion"
    exp.observed(_package_pod("b", "n2", "ub", deleting=True))
    assert not exp.deletion_pending("ub")
    exp.deleted("ux")
    exp.observed_delete(_package_pod("x", "n3", "ux"))
    assert not exp.deletion_pending("ux")


def test_pod_expectations_expire_when_the_event_never_comes() -> None:
    now = [0.0]
    exp = PodExpectations(clock=lambda: now[0])
    exp.created(_package_pod("a", "n1", "ua"))
    exp.deleted("ub")
    now[0] = POD_EXPECTATION_TTL + 10
    exp.created(_package_pod("c", "n9", "uc"))  # any new expectation prunes the old ones
    assert exp.pending_on("n1", []) == []
    assert not exp.deletion_pending("ub")
    assert len(exp.pending_on("n9", [])) == 1


async def test_event_dedupe_expires_by_age_and_forgets_the_oldest_when_full() -> None:
    sink = _EventSink()
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    recorder = EventRecorder(
        sink,  # type: ignore[arg-type]
        clock=lambda: now[0],
        instance="t",
        dedupe_seconds=60,
        dedupe_size=3,
    )

    async def send(reason: str) -> None:
        await recorder.record(kind="Node", name="n1", uid=None, reason=reason, message="m")

    for reason in ("A", "B", "C", "A"):
        await send(reason)
    now[0] += timedelta(seconds=61)
    await send("A")  # older than the window: sent again
    for reason in ("D", "E", "F"):
        await send(reason)  # the map holds 3 keys: A goes out
    await send("A")
    await send("F")  # still remembered
    async with asyncio.timeout(5):
        await recorder.flush()
    assert [r for _, r in sink.created] == ["A", "B", "C", "A", "D", "E", "F", "A"]
    await recorder.close()
