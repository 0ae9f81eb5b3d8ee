"""Package pod → PodSummary: outcomes as the kubelet reports them (trimmed pod shapes)."""

from __future__ import annotations

from typing import Any

from nodewright.api import constants
from nodewright.api.nodestate import PackageStage
from nodewright.controller.pods import classify, failed_container, summarize
from nodewright.kube.trim import trim_pod
from nodewright.plan.stages import PodOutcome

INIT = ["tool-init", "tool-apply", "tool-applycheck"]


def pod(phase: str, statuses: list[dict[str, Any]], **meta: Any) -> dict[str, Any]:
    full = {
        "metadata": {
            "name": "p",
            "namespace": "nodewright-system",
            "uid": "u1",
            "creationTimestamp": "2024-01-01T00:00:00Z",
            "labels": {
                constants.POD_LABEL_PACKAGE: "tool",
                constants.POD_LABEL_VERSION: "1.2.3_b",
                constants.POD_LABEL_STAGE: "apply",
            },
            "annotations": {constants.POD_ANNOTATION_ATTEMPT: "2", constants.POD_ANNOTATION_SPEC_HASH: "abc"},
            **meta,
        },
        "spec": {
            "nodeName": "n1",
            "initContainers": [{"name": n, "image": "x"} for n in INIT],
            "containers": [],
        },
        "status": {"phase": phase, "initContainerStatuses": statuses},
    }
    return trim_pod(full)


def term(name: str, code: int, reason: str = "Completed") -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": code, "reason": reason}}}


def waiting(name: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"name": name, "state": {"waiting": {"reason": reason, "message": message}}}


def test_all_init_containers_exited_zero_is_success_while_pause_runs() -> None:
    assert classify(pod("Running", [term(n, 0) for n in INIT])) == (PodOutcome.SUCCEEDED, "")


def test_some_init_containers_done_is_running() -> None:
    statuses = [
        term("tool-init", 0),
        {"name": "tool-apply", "state": {"running": {}}},
        waiting(INIT[2], "PodInitializing"),
    ]
    assert classify(pod("Pending", statuses))[0] == PodOutcome.RUNNING


def test_failed_container_names_itself_and_counts_before_the_phase() -> None:
    statuses = [term("tool-init", 0), term("tool-apply", 1, "Error"), waiting(INIT[2], "PodInitializing")]
    for phase in ("Pending", "Failed"):
        outcome, message = classify(pod(phase, statuses))
        assert outcome == PodOutcome.FAILED
        assert "tool-apply exited 1 (Error)" in message
    assert failed_container(pod("Failed", statuses)) == ("tool-apply", 1, "Error", "")


def test_failed_phase_without_container_detail_is_a_failure() -> None:
    assert classify(pod("Failed", []))[0] == PodOutcome.FAILED


def test_pull_errors_are_reported_with_reason() -> None:
    for reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"):
        outcome, message = classify(pod("Pending", [waiting("tool-init", reason, "no such image")]))
        assert outcome == PodOutcome.PULL_ERROR
        assert reason in message and "no such image" in message


def test_pending_without_statuses_is_running() -> None:
    assert classify(pod("Pending", []))[0] == PodOutcome.RUNNING


def test_summary_maps_sanitised_version_label_back_to_the_real_version() -> None:
    summary = summarize(pod("Pending", []), version_of={("tool", "1.2.3_b"): "1.2.3+b"})
    assert summary is not None
    assert (summary.package, summary.version, summary.stage, summary.attempt, summary.spec_hash) == (
        "tool",
        "1.2.3+b",
        PackageStage.APPLY,
        2,
        "abc",
    )


def test_summary_of_pod_with_incomplete_identity_is_none() -> None:
    broken = pod("Pending", [])
    del broken["metadata"]["annotations"][constants.POD_ANNOTATION_ATTEMPT]
    assert summarize(broken, version_of={}) is None
    bad_stage = pod("Pending", [])
    bad_stage["metadata"]["labels"][constants.POD_LABEL_STAGE] = "explode"
    assert summarize(bad_stage, version_of={}) is None
