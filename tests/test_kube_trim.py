"""Trimming transforms: what is kept, idempotence, interning."""

from __future__ import annotations

import copy
import json
import pickle
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodewright.api.nodeobject import node_ready
from nodewright.controller.pods import classify
from nodewright.kube.trim import FrozenLabels, trim_node, trim_pod
from nodewright.plan.stages import PodOutcome

LABEL_KEYS = st.sampled_from(
    ["nvidia.com/gpu.product", "topology.kubernetes.io/zone", "nodewright.io/status.a", "x"]
)


def full_node(labels: dict[str, str], annotations: dict[str, str]) -> dict:  # type: ignore[type-arg]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "n1",
            "uid": "u1",
            "resourceVersion": "7",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": labels,
            "annotations": annotations,
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {
            "podCIDR": "10.0.0.0/24",
            "unschedulable": True,
            "taints": [{"key": "nodewright.io/runtime-required", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": {"cpu": "96"},
            "images": [{"names": ["big"], "sizeBytes": 1}],
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok",
                 "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-02T00:00:00Z"},
                {"type": "nodewright.io/a", "status": "False", "reason": "Complete", "message": "done"},
            ],
            "nodeInfo": {"bootID": "boot-1", "kernelVersion": "6.8"},
        },
    }  # fmt: skip


@given(
    st.dictionaries(LABEL_KEYS, st.text(max_size=10), max_size=4),
    st.dictionaries(
        st.sampled_from(
            ["nodewright.io/state.a", "other/x", "cluster-autoscaler.kubernetes.io/scale-down-disabled"]
        ),
        st.text(max_size=5),
    ),
)
def test_trim_node_keeps_what_the_controller_needs_and_is_idempotent(
    labels: dict[str, str], annotations: dict[str, str]
) -> None:
    node = full_node(labels, annotations)
    original = copy.deepcopy(node)
    trimmed = trim_node(node)
    assert node == original  # the input is not modified
    assert trim_node(trimmed) == trimmed
    meta = trimmed["metadata"]
    assert meta["labels"] == labels
    assert meta["annotations"] == {k: v for k, v in annotations.items() if k != "other/x"}
    assert (meta["name"], meta["uid"], meta["resourceVersion"]) == ("n1", "u1", "7")
    assert "managedFields" not in meta
    assert trimmed["spec"] == {"unschedulable": True, "taints": original["spec"]["taints"]}
    assert [c["type"] for c in trimmed["status"]["conditions"]] == ["Ready", "nodewright.io/a"]
    assert trimmed["status"]["conditions"][1]["message"] == "done"
    assert "lastHeartbeatTime" not in trimmed["status"]["conditions"][0]  # changes every few seconds
    assert trimmed["status"]["nodeInfo"] == {"bootID": "boot-1", "kernelVersion": "6.8"}  # drift re-checks
    assert node_ready(trimmed)


def test_trim_node_interns_label_strings_across_nodes() -> None:
    a = trim_node(json.loads(json.dumps(full_node({"nvidia.com/gpu.product": "H100-SXM5-80GB"}, {}))))
    b = trim_node(json.loads(json.dumps(full_node({"nvidia.com/gpu.product": "H100-SXM5-80GB"}, {}))))
    ((ka, va),) = a["metadata"]["labels"].items()
    ((kb, vb),) = b["metadata"]["labels"].items()
    assert ka is kb and va is vb
    assert va is sys.intern("H100-SXM5-80GB")


def test_trim_node_shares_the_strings_a_fleet_repeats_in_its_conditions_and_creation_times() -> None:
    """Nodes created in one burst and settled by one rollout step carry the same creation time and the
    same condition reasons, messages and transition times: each is one string in the cache, not one a
    node (json.loads makes a fresh string for every occurrence)."""
    a = trim_node(json.loads(json.dumps(full_node({}, {}))))
    b = trim_node(json.loads(json.dumps(full_node({}, {}))))
    assert a["metadata"]["creationTimestamp"] is b["metadata"]["creationTimestamp"]
    ready_a, ours_a = a["status"]["conditions"]
    ready_b, ours_b = b["status"]["conditions"]
    assert ready_a["lastTransitionTime"] is ready_b["lastTransitionTime"]
    assert ours_a["reason"] is ours_b["reason"] and ours_a["message"] is ours_b["message"]
    assert ours_a == {"type": "nodewright.io/a", "status": "False", "reason": "Complete", "message": "done"}
    # Unique values stay the decoder's own strings: interning them would share nothing.
    assert a["metadata"]["uid"] is not b["metadata"]["uid"]


def test_trim_pod() -> None:
    pod = {
        "metadata": {
            "name": "p", "namespace": "nodewright-system", "uid": "u", "resourceVersion": "3",
            "labels": {"nodewright.io/node": "n1"}, "annotations": {"nodewright.io/attempt": "2"},
            "ownerReferences": [{"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "name": "nw",
                                 "uid": "o", "controller": True, "blockOwnerDeletion": True}],
            "deletionTimestamp": "2026-01-01T00:00:00Z", "managedFields": [{}],
        },
        "spec": {
            "nodeName": "n1", "volumes": [{"name": "v"}],
            "initContainers": [{"name": "apply", "image": "img:1", "env": [{"name": "A", "value": "1"}],
                                "command": ["x"]}],
            "containers": [{"name": "pause", "image": "pause:3"}],
        },
        "status": {
            "phase": "Running", "podIP": "1.2.3.4",
            "initContainerStatuses": [{
                "name": "apply", "ready": False, "restartCount": 1, "image": "img:1",
                "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "m" * 2000 + "end"}},
            }],
            "containerStatuses": [{
                "name": "pause", "ready": True, "restartCount": 0, "state": {"running": {"startedAt": "t"}},
            }],
        },
    }  # fmt: skip
    t = trim_pod(pod)
    assert trim_pod(t) == t
    assert t["metadata"]["deletionTimestamp"] and t["metadata"]["namespace"] == "nodewright-system"
    assert t["metadata"]["ownerReferences"][0] == {
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "name": "nw", "uid": "o",
        "controller": True,
    }  # fmt: skip
    assert t["spec"] == {
        "nodeName": "n1",
        "containers": [{"name": "pause", "image": "pause:3"}],
        "initContainers": [{"name": "apply", "image": "img:1", "env": [{"name": "A", "value": "1"}]}],
    }
    init = t["status"]["initContainerStatuses"][0]
    assert init["state"]["terminated"]["exitCode"] == 1 and len(init["state"]["terminated"]["message"]) == 512
    assert init["state"]["terminated"]["message"].endswith("mend")  # a log tail: its end says why
    assert t["status"]["containerStatuses"][0]["state"] == {"running": {}}
    assert t["status"]["phase"] == "Running"


def test_a_trimmed_drift_check_pod_keeps_its_deadline_and_the_kubelet_s_reason_for_ending_it() -> None:
    """A check the kubelet ended at its `activeDeadlineSeconds` has its running container killed (exit
    137): only the pod's reason tells that apart from a check that failed, i.e. from drift."""
    pod = {
        "metadata": {"name": "nw-drift-n1-x", "namespace": "nodewright-system", "uid": "u"},
        "spec": {
            "nodeName": "n1", "activeDeadlineSeconds": 1800,
            "initContainers": [
                {"name": "tune-init", "image": "i"}, {"name": "tune-applycheck", "image": "a"},
            ],
            "containers": [{"name": "pause", "image": "pause:3"}],
        },
        "status": {
            "phase": "Failed", "reason": "DeadlineExceeded",
            "message": "Pod was active on the node longer than the specified deadline",
            "initContainerStatuses": [
                {"name": "tune-init", "state": {"terminated": {"exitCode": 0}}},
                {"name": "tune-applycheck", "state": {"terminated": {"exitCode": 137, "reason": "Error"}}},
            ],
        },
    }  # fmt: skip
    t = trim_pod(pod)
    assert trim_pod(t) == t
    assert t["spec"]["activeDeadlineSeconds"] == 1800 and t["status"]["reason"] == "DeadlineExceeded"
    assert classify(t)[0] is PodOutcome.DEADLINE


LABEL_MAPS = st.dictionaries(LABEL_KEYS | st.text(max_size=8), st.text(max_size=8), max_size=6)


@given(LABEL_MAPS, LABEL_MAPS)
def test_frozen_labels_behave_like_the_dict_they_were_made_from(
    labels: dict[str, str], other: dict[str, str]
) -> None:
    frozen = FrozenLabels(labels)
    assert frozen == labels and labels == frozen and dict(frozen) == labels
    assert list(frozen) == list(labels) and list(frozen.items()) == list(labels.items())
    assert len(frozen) == len(labels) and bool(frozen) == bool(labels)
    for key in [*labels, *other]:
        assert (key in frozen) == (key in labels)
        assert frozen.get(key) == labels.get(key) and frozen.get(key, "-") == labels.get(key, "-")
    assert (FrozenLabels(other) == frozen) == (other == labels)
    assert copy.deepcopy(frozen) == labels and pickle.loads(pickle.dumps(frozen)) == labels


def test_frozen_labels_share_the_key_index_of_equal_key_sets_and_refuse_writes() -> None:
    a = FrozenLabels({"zone": "a", "gpu": "h100"})
    b = FrozenLabels({"zone": "b", "gpu": "h100"})
    c = FrozenLabels({"gpu": "h100", "zone": "a"})  # the same keys in another order: its own index
    assert a._index is b._index and a._index is not c._index
    assert a != b and a == c and a == {"gpu": "h100", "zone": "a"}
    with pytest.raises(TypeError):
        a["zone"] = "c"  # type: ignore[index]
    with pytest.raises(TypeError):
        hash(a)
    assert json.loads(json.dumps(dict(a))) == a


def test_trimmed_node_labels_are_frozen_and_trimming_again_keeps_them() -> None:
    trimmed = trim_node(full_node({"nvidia.com/gpu.product": "H100", "zone": "z"}, {}))
    labels = trimmed["metadata"]["labels"]
    assert isinstance(labels, FrozenLabels) and labels == {"nvidia.com/gpu.product": "H100", "zone": "z"}
    assert trim_node(trimmed)["metadata"]["labels"] is labels
    assert trim_node({"metadata": {"name": "bare"}})["metadata"]["labels"] == {}
