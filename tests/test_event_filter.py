"""Issue 33: watch updates that change nothing a reconcile reads enqueue no reconcile.

A kubelet heartbeat moves only fields the node cache does not keep; a pod's conditions likewise. After
trimming, such an update differs from the cached object in `metadata.resourceVersion` alone, and the
operator's handlers skip it (`nodewright.kube.informer.only_version_changed`). A change of anything
cached still enqueues the node's key.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest

from nodewright.controller.manager import Controller, Manager
from nodewright.controller.operator import Operator
from nodewright.controller.options import OperatorOptions
from nodewright.controller.signing import PodSigner
from nodewright.kube.client import KubeClient
from nodewright.kube.informer import Informer, only_version_changed
from nodewright.kube.resources import PODS
from nodewright.kube.trim import trim_node, trim_pod
from nodewright.kube.workqueue import WorkQueue
from nodewright.observability.metrics import OperatorMetrics
from nodewright.observability.tracing import RolloutTracer
from tests.kubefake import FakeKube
from tests.test_controller_nodes import NS, nw_obj


def _node(rv: str, heartbeat: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n0", "uid": "n0-uid", "resourceVersion": rv, "labels": labels or {"pool": "a"}},
        "spec": {},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": heartbeat,
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                },
                {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": heartbeat},
            ],
            "nodeInfo": {"bootID": "b"},
        },
    }


def _drain(queue: WorkQueue[str]) -> list[str]:
    keys = []
    while (key := queue.get_nowait()) is not None:
        keys.append(key)
        queue.done(key)
    return keys


@pytest.fixture
async def operator() -> AsyncIterator[Operator]:
    kube = await FakeKube().start()
    client = KubeClient(kube.config(), max_retries=0)
    metrics = OperatorMetrics(otlp=False)
    op = Operator(
        Manager(client, health_bind_address="127.0.0.1:0"),
        options=OperatorOptions(namespace=NS),
        metrics=metrics,
        tracer=RolloutTracer(),
        signer=PodSigner(b"k" * 32),
    )
    try:
        yield op
    finally:
        await op.rt.events.close(grace=0.1)
        await client.close()
        await kube.stop()


async def test_a_heartbeat_enqueues_no_node_reconcile_and_a_label_change_does(operator: Operator) -> None:
    rt = operator.rt
    rt.nodewrights.upsert(nw_obj())
    rt.nodes.upsert(trim_node(_node("1", "2026-01-01T00:00:00Z")))
    assert _drain(operator.node.queue) == ["nw/n0"]
    _drain(operator.rollout.queue)

    rt.nodes.upsert(trim_node(_node("2", "2026-01-01T00:00:10Z")))
    assert _drain(operator.node.queue) == []
    assert operator.rollout.queue.waiting == 0 and len(operator.rollout.queue) == 0
    assert operator.budget.queue.waiting == 0

    rt.nodes.upsert(trim_node(_node("3", "2026-01-01T00:00:20Z", labels={"pool": "b"})))
    assert _drain(operator.node.queue) == ["nw/n0"]


def _pod(rv: str, *, ready: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": NS,
            "uid": "p-uid",
            "resourceVersion": rv,
            "labels": {"a": "b"},
        },
        "spec": {"nodeName": "n0", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]},
    }


async def test_a_pod_update_of_uncached_fields_enqueues_nothing() -> None:
    informer = Informer(client=None, resource=PODS)  # type: ignore[arg-type]  # never run
    controller = Controller("node", lambda key: None, workers=1, queue=WorkQueue("node"))  # type: ignore[arg-type,return-value]
    controller.watch(informer, lambda pod: [str(pod["metadata"]["name"])])
    informer.upsert(trim_pod(_pod("1", ready="False")))
    assert _drain(controller.queue) == ["p"]
    informer.upsert(trim_pod(_pod("2", ready="True")))  # a condition only: not in the cache
    assert _drain(controller.queue) == []
    informer.upsert(trim_pod(_pod("3", ready="True", phase="Succeeded")))
    assert _drain(controller.queue) == ["p"]


def test_only_version_changed() -> None:
    old = trim_node(_node("1", "t1"))
    assert only_version_changed(old, trim_node(_node("2", "t2")))
    assert only_version_changed(old, old)
    assert not only_version_changed(old, trim_node(_node("2", "t2", labels={"pool": "b"})))
    changed = copy.deepcopy(old)
    changed["metadata"]["annotations"] = {"nodewright.io/x": "y"}
    assert not only_version_changed(old, changed)
    extra = dict(old, extra={})
    assert not only_version_changed(old, extra)
    assert not only_version_changed(extra, old)
    assert not only_version_changed({"metadata": {"resourceVersion": "1"}}, {"metadata": {"uid": "u"}})
