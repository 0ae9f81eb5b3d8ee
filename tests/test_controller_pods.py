"""Package pod → PodSummary: outcomes as the kubelet reports them (trimmed pod shapes)."""

from __future__ import annotations

from typing import Any

from nodewright.api import constants
from nodewright.api.nodestate import PackageStage
from nodewright.controller.pods import (
    classify,
    failed_container,
    finished_at,
    needs_log_tail,
    stage_progress,
    summarize,
    summarize_with_logs,
)
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


INSTALL = ["tool-init", "tool-apply", "tool-applycheck", "tool-config", "tool-configcheck"]


def install_pod(phase: str, statuses: list[dict[str, Any]]) -> dict[str, Any]:
    full = pod(phase, statuses)
    full["spec"]["initContainers"] = [{"name": n, "image": "x"} for n in INSTALL]
    return full


def timed(name: str, code: int, started: str, finished: str) -> dict[str, Any]:
    reason = "Completed" if code == 0 else "Error"
    detail = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": finished}
    return {"name": name, "state": {"terminated": detail}}


def test_an_install_pod_reports_each_stage_with_the_times_of_its_containers() -> None:
    statuses = [
        timed("tool-init", 0, "2024-01-01T00:00:01Z", "2024-01-01T00:00:02Z"),
        timed("tool-apply", 0, "2024-01-01T00:00:02Z", "2024-01-01T00:00:04Z"),
        timed("tool-applycheck", 0, "2024-01-01T00:00:04Z", "2024-01-01T00:00:05Z"),
        timed("tool-config", 0, "2024-01-01T00:00:05Z", "2024-01-01T00:00:07Z"),
        timed("tool-configcheck", 1, "2024-01-01T00:00:07Z", "2024-01-01T00:00:08Z"),
    ]
    # The trimmed pod (what the informer caches) still has the times.
    summary = summarize(trim_pod(install_pod("Failed", statuses)), version_of={})
    assert summary is not None and summary.outcome is PodOutcome.FAILED
    apply, config = summary.progress
    assert (apply.stage, apply.done, config.stage, config.done) == (
        PackageStage.APPLY,
        True,
        PackageStage.CONFIG,
        False,
    )
    assert apply.started is not None and apply.started.second == 2
    assert apply.finished is not None and apply.finished.second == 5  # the check's finish
    assert config.started is not None and config.started.second == 5
    assert stage_progress(install_pod("Failed", statuses), "tool") == summary.progress


def test_a_stage_is_not_done_until_its_check_exited_zero() -> None:
    running = [
        term("tool-init", 0),
        term("tool-apply", 0),
        {"name": "tool-applycheck", "state": {"running": {}}},
    ]
    progress = stage_progress(install_pod("Pending", running), "tool")
    assert [(p.stage, p.done) for p in progress] == [
        (PackageStage.APPLY, False),
        (PackageStage.CONFIG, False),
    ]
    done = [term(n, 0) for n in INSTALL[:3]] + [waiting("tool-config", "PodInitializing")]
    progress = stage_progress(install_pod("Pending", done), "tool")
    assert [(p.stage, p.done) for p in progress] == [(PackageStage.APPLY, True), (PackageStage.CONFIG, False)]


def test_an_interrupt_pod_has_no_stage_containers() -> None:
    full = pod("Running", [term("interrupt", 0)])
    full["spec"]["initContainers"] = [{"name": "interrupt", "image": "x"}]
    assert stage_progress(full, "tool") == ()


async def test_a_log_the_kubelet_cannot_serve_yet_is_asked_for_again_within_the_deadline() -> None:
    """Right after a container exits the kubelet may answer an error or an empty log for a moment; the
    pod is deleted once its failure is recorded, so the tail is asked for again before giving up."""
    from nodewright.controller.pods import PodLogs
    from nodewright.kube.client import KubeClient
    from tests.kubefake import FakeKube

    kube = await FakeKube().start()
    try:
        async with KubeClient(kube.config(), max_retries=0) as client:
            pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}}
            kube.fail("GET", "/pods/p/log", 404, times=1)
            kube.fail("GET", "/pods/p/log", 500, times=1)
            kube.fail("GET", "/pods/p/log", 200, body="rmem_max is 212992, want 268435456", times=1)
            tail = await PodLogs(client, deadline=5.0).tail(pod, "tuning-post-interruptcheck")
            assert "rmem_max is 212992" in tail, tail
            assert kube.count("GET", "/pods/p/log") == 3

            kube.fail("GET", "/pods/q/log", 404, times=100)
            other = {"metadata": {"name": "q", "namespace": "ns", "uid": "u2"}}
            assert await PodLogs(client, deadline=1.2).tail(other, "c") == ""
            assert 2 <= kube.count("GET", "/pods/q/log") <= 4, "bounded by the deadline"
    finally:
        await kube.stop()


def test_a_failed_container_carrying_its_log_tail_says_why_on_one_line() -> None:
    """FallbackToLogsOnError: the kubelet puts the log tail in the terminated state; its last lines say
    why, and the message is one line for the node condition and the Event."""
    tail = (
        "step 1 ok\n\n  tuning: sysctl net.core.rmem_max is '212992', not '268435456'\nERROR: 1 of 1 failed\n"
    )
    failed = term("tool-apply", 1, "Error")
    failed["state"]["terminated"]["message"] = tail
    outcome, message = classify(pod("Failed", [term("tool-init", 0), failed]))
    assert outcome == PodOutcome.FAILED
    assert message == (
        "container tool-apply exited 1 (Error): step 1 ok | tuning: sysctl net.core.rmem_max is '212992',"
        " not '268435456' | ERROR: 1 of 1 failed"
    )
    assert needs_log_tail(pod("Failed", [term("tool-init", 0), failed])) is None


def test_the_cache_keeps_the_end_of_a_long_log_tail() -> None:
    failed = term("tool-apply", 1, "Error")
    failed["state"]["terminated"]["message"] = "early output\n" * 200 + "the reason it failed"
    _, message = classify(pod("Failed", [failed]))
    assert message.endswith("the reason it failed") and len(message) < 700


def test_the_log_is_read_only_when_the_status_does_not_carry_the_tail() -> None:
    statuses = [term("tool-init", 0), term("tool-apply", 1, "Error")]
    assert needs_log_tail(pod("Failed", statuses)) == "tool-apply"
    blank = term("tool-apply", 1, "Error")
    blank["state"]["terminated"]["message"] = "\n \n"
    assert needs_log_tail(pod("Failed", [blank])) == "tool-apply"
    assert needs_log_tail(pod("Running", [term(n, 0) for n in INIT])) is None


class _Logs:
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def tail(self, pod: Any, container: str) -> str:
        self.asked.append(container)
        return "from the log endpoint"


async def test_summaries_fetch_the_log_only_for_failures_without_a_message() -> None:
    versions = {("tool", "1.2.3_b"): "1.2.3+b"}
    logs = _Logs()
    with_tail = term("tool-apply", 1, "Error")
    with_tail["state"]["terminated"]["message"] = "the reason"
    summary = await summarize_with_logs(
        pod("Failed", [term("tool-init", 0), with_tail]),
        version_of=versions,
        logs=logs,  # type: ignore[arg-type]
    )
    assert summary is not None and summary.message.endswith("exited 1 (Error): the reason")
    assert logs.asked == []
    summary = await summarize_with_logs(
        pod("Failed", [term("tool-init", 0), term("tool-apply", 1, "Error")]),
        version_of=versions,
        logs=logs,  # type: ignore[arg-type]
    )
    assert summary is not None and summary.message.endswith("; log: from the log endpoint")
    assert logs.asked == ["tool-apply"]


def test_an_ended_pod_says_when_its_work_ended() -> None:
    # The reboot interrupt's grace is counted from there (a pod that exits 0 while the node stays up).
    def at(name: str, code: int, finished: str) -> dict[str, Any]:
        return {"name": name, "state": {"terminated": {"exitCode": code, "finishedAt": finished}}}

    done = pod(
        "Running",
        [
            at("tool-init", 0, "2024-01-01T00:00:05Z"),
            at("tool-apply", 0, "2024-01-01T00:00:09Z"),
            at("tool-applycheck", 0, "2024-01-01T00:00:12Z"),
        ],
    )
    summary = summarize(done, version_of={})
    assert summary is not None and summary.finished is not None
    assert summary.finished.isoformat() == "2024-01-01T00:00:12+00:00"
    failed = pod(
        "Failed",
        [
            at("tool-init", 0, "2024-01-01T00:00:05Z"),
            at("tool-apply", 1, "2024-01-01T00:00:07Z"),
            waiting("tool-applycheck", "PodInitializing"),
        ],
    )
    assert str(finished_at(failed)) == "2024-01-01 00:00:07+00:00"
    running = summarize(pod("Running", [at("tool-init", 0, "2024-01-01T00:00:05Z")]), version_of={})
    assert running is not None and running.finished is None
