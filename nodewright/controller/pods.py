"""Package pods → `PodSummary`: what the stage machine needs to know about one attempt's pod.

Package pods run their work in init containers (`<pkg>-init` copies the payload, then for each stage
of the transition `<pkg>-<stage>` and `<pkg>-<stage>check` run the agent: an install pod runs
`apply, applycheck, config, configcheck`) and then a `pause` main container, with `restartPolicy:
Never`. The kubelet runs init containers one after another and stops at the first that exits non-zero,
so the init container statuses say how far the pod got: a stage is done when its work container and
its check both terminated with exit code 0 (`stage_progress`, with the kubelet's start and finish
times for the stage's span), and the stage of a failed pod is its first stage not done. How the kubelet
reports each outcome, and how it is read here:

- **Succeeded**: every init container `terminated` with exit code 0 (the pod is then phase `Running`
  with `pause` up; it never reaches `Succeeded` because of `pause`, though a pod that somehow did is
  read the same way).
- **Failed**: with `restartPolicy: Never` a non-zero init container exit fails the pod (phase
  `Failed`); the kubelet may report the terminated container a moment before the phase, so either
  signal counts. The message names the container, exit code and reason, plus the last lines of its log
  (see Logs below).
- **Pull errors**: an init container `waiting` with `ErrImagePull`, `ImagePullBackOff`,
  `InvalidImageName` or `CreateContainerConfigError`; the planner turns them into a failed attempt only
  after a grace period, because registries hiccup.
- **Deadline**: phase `Failed` with `status.reason == DeadlineExceeded` (activeDeadlineSeconds, which
  drift-check pods have; the trimmed cache keeps `status.reason`). The kubelet kills the container
  that was running, so this is read before any failed container: a check cut off by its deadline is
  not a failing check.
- Anything else (Pending, init containers running or `PodInitializing`) is still running.

A pod with chained runs (`nodewright.io/chain`, `--chain-packages`) runs the init containers of each
chained package after its own package's, named the same way; each run's progress is read from its own
containers.

Only pods that carry a complete, well-formed set of our labels/annotations become summaries; the
caller has already checked the signature and the owner (see `controller.nodes`).

Logs: our containers have `terminationMessagePolicy: FallbackToLogsOnError`, so the kubelet puts the
tail of a failed container's log (last 80 lines, at most 2 KiB) in its terminated state's `message`,
and the reason arrives in the watch event that reports the failure. Only when that message is empty (a
pod created by an older operator, a kubelet that could not read the log) is the log read:
`GET /api/v1/namespaces/<ns>/pods/<name>/log?container=<c>&tailLines=20` returns text/plain, not
JSON, so it is read with a raw GET on the client's session under a short deadline. That read is best
effort, and lost for good once the pod is deleted: the log endpoint may not answer within the
deadline (a kubelet busy or restarting), and kwok pods have no logs (the API answers 400/404
"container not found"/"no kubelet"): any error yields no log lines, never a failed reconcile. Log lines
are fetched once per failed pod (cached by uid).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote

import aiohttp
import structlog

from nodewright.api import constants
from nodewright.api.nodestate import PackageStage
from nodewright.kube.client import KubeClient
from nodewright.kube.resources import JSON, ApiError
from nodewright.plan import podspec
from nodewright.plan.stages import INTERRUPT_STAGES, ChainedRun, PodOutcome, PodSummary, StageProgress

log = structlog.get_logger("nodewright.controller.pods")

PULL_ERROR_REASONS: Final = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"}
)
LOG_TAIL_LINES: Final = 20
LOG_DEADLINE: Final = 3.0
LOG_RETRY_PAUSE: Final = 0.5
MAX_LOG_CHARS: Final = 1500
# What is read of a failed container's log (its end): enough for the last lines at any width.
LOG_READ_BYTES: Final = 64 * 1024
_LOG_CACHE_SIZE: Final = 512
_WORK_STAGES: Final = {s.value: s for s in PackageStage if s not in INTERRUPT_STAGES}


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _init_statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((pod.get("status") or {}).get("initContainerStatuses") or [])


def _init_names(pod: Mapping[str, Any]) -> list[str]:
    return [str(c.get("name")) for c in (pod.get("spec") or {}).get("initContainers") or []]


def _state(status: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    state = status.get("state") or {}
    for phase in ("terminated", "waiting", "running"):
        if phase in state and state[phase] is not None:
            return phase, state[phase]
    return "", {}


def failed_container(pod: Mapping[str, Any]) -> tuple[str, int, str, str] | None:
    """(name, exit code, reason, message) of the first init container that exited non-zero."""
    for status in _init_statuses(pod):
        phase, detail = _state(status)
        if phase == "terminated" and int(detail.get("exitCode") or 0) != 0:
            return (
                str(status.get("name")),
                int(detail.get("exitCode") or 0),
                str(detail.get("reason") or ""),
                str(detail.get("message") or ""),
            )
    return None


def pull_error(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(name, reason, message) of the first init container waiting on an image pull error."""
    for status in _init_statuses(pod):
        phase, detail = _state(status)
        if phase == "waiting" and detail.get("reason") in PULL_ERROR_REASONS:
            return str(status.get("name")), str(detail["reason"]), str(detail.get("message") or "")
    return None


def container_image(pod: Mapping[str, Any], name: str) -> str:
    """The image the pod's (init) container `name` runs ("" when it has no such container)."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        if container.get("name") == name:
            return str(container.get("image") or "")
    return ""


def _exited_zero(status: Mapping[str, Any] | None) -> bool:
    if status is None:
        return False
    phase, detail = _state(status)
    return phase == "terminated" and int(detail.get("exitCode") or 0) == 0


def _terminated_at(status: Mapping[str, Any] | None, key: str) -> datetime | None:
    if status is None:
        return None
    phase, detail = _state(status)
    return _parse_time(detail.get(key)) if phase == "terminated" else None


def stage_progress(pod: Mapping[str, Any], package: str) -> tuple[StageProgress, ...]:
    """The stages a package pod runs, in container order, and how far each got.

    Stage containers are named `<pkg>-<stage>` and `<pkg>-<stage>check` (the reference's names); a
    stage is done when both terminated with exit code 0. An interrupt pod (container `interrupt`) has
    none: its completion is the interrupt's, not a container's.
    """
    names = _init_names(pod)
    statuses = {str(st.get("name")): st for st in _init_statuses(pod)}
    prefix = f"{package}-"
    out: list[StageProgress] = []
    for name in names:
        stage = _WORK_STAGES.get(name[len(prefix) :]) if name.startswith(prefix) else None
        if stage is None:
            continue
        check = f"{name}check"
        work_status, check_status = statuses.get(name), statuses.get(check)
        done = _exited_zero(work_status) and (check not in names or _exited_zero(check_status))
        out.append(
            StageProgress(
                stage=stage,
                done=done,
                started=_terminated_at(work_status, "startedAt"),
                finished=_terminated_at(check_status if check in names else work_status, "finishedAt"),
            )
        )
    return tuple(out)


def finished_at(pod: Mapping[str, Any]) -> datetime | None:
    """When an ended pod's work ended: the latest exit among its init containers (the kubelet's clock;
    None when it reported no times). Containers after a failed one never start."""
    times = [t for st in _init_statuses(pod) if (t := _terminated_at(st, "finishedAt")) is not None]
    return max(times) if times else None


def classify(pod: Mapping[str, Any]) -> tuple[PodOutcome, str]:
    """The pod's outcome and a short message (reason, failing container) — without log lines."""
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    if phase == "Failed" and status.get("reason") == "DeadlineExceeded":
        return PodOutcome.DEADLINE, str(status.get("message") or "pod exceeded its active deadline")
    failed = failed_container(pod)
    if failed is not None:
        name, code, reason, message = failed
        text = f"container {name} exited {code}" + (f" ({reason})" if reason else "")
        message = one_line(message)
        return PodOutcome.FAILED, text + (f": {message}" if message else "")
    if phase == "Failed":
        reason = str(status.get("reason") or "")
        message = str(status.get("message") or "")
        return PodOutcome.FAILED, ("pod failed" + (f" ({reason})" if reason else "")) + (
            f": {message}" if message else ""
        )
    stuck = pull_error(pod)
    if stuck is not None:
        name, reason, message = stuck
        return PodOutcome.PULL_ERROR, f"{reason} for container {name}" + (f": {message}" if message else "")
    statuses = _init_statuses(pod)
    names = _init_names(pod)
    done = {
        str(st.get("name"))
        for st in statuses
        if _state(st)[0] == "terminated" and int(_state(st)[1].get("exitCode") or 0) == 0
    }
    # Every declared init container must have exited 0; with no spec (never for our pods) fall back to
    # the statuses we have.
    expected = set(names) if names else {str(st.get("name")) for st in statuses}
    if expected and expected <= done:
        return PodOutcome.SUCCEEDED, ""
    if phase == "Succeeded":
        return PodOutcome.SUCCEEDED, ""
    return PodOutcome.RUNNING, ""


def one_line(text: str) -> str:
    """A multi-line message (a log tail) as one line: its non-blank lines joined by ` | `."""
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


def needs_log_tail(pod: Mapping[str, Any]) -> str | None:
    """The failed container whose log tail must be fetched to say why it failed, or None: there is no
    failed container, or its terminated state already carries the tail (`FallbackToLogsOnError`)."""
    failed = failed_container(pod)
    if failed is None or one_line(failed[3]):
        return None
    return failed[0]


def summarize(pod: Mapping[str, Any], *, version_of: Mapping[tuple[str, str], str]) -> PodSummary | None:
    """The `PodSummary` of a package pod, or None when its labels/annotations are incomplete.

    `version_of` maps (package, version label value) → the real version: the version label is
    sanitised (`1.2.3+b` becomes `1.2.3_b`), while the planner matches pods to entries by real version.
    """
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    package = labels.get(constants.POD_LABEL_PACKAGE)
    version_label = labels.get(constants.POD_LABEL_VERSION)
    stage_text = labels.get(constants.POD_LABEL_STAGE)
    attempt_text = annotations.get(constants.POD_ANNOTATION_ATTEMPT)
    created = _parse_time(meta.get("creationTimestamp"))
    if not (package and version_label and stage_text and attempt_text and created and meta.get("name")):
        return None
    try:
        stage = PackageStage(stage_text)
        attempt = int(attempt_text)
    except ValueError:
        return None
    links = podspec.parse_chain(annotations.get(constants.POD_ANNOTATION_CHAIN))
    if links is None:
        return None
    outcome, message = classify(pod)
    return PodSummary(
        name=str(meta["name"]),
        package=str(package),
        version=version_of.get((str(package), str(version_label)), str(version_label)),
        stage=stage,
        attempt=attempt,
        spec_hash=str(annotations.get(constants.POD_ANNOTATION_SPEC_HASH) or ""),
        created=created,
        outcome=outcome,
        message=message,
        terminating=bool(meta.get("deletionTimestamp")),
        bound=bool((pod.get("spec") or {}).get("nodeName")),
        progress=stage_progress(pod, str(package)),
        chain=tuple(
            ChainedRun(name, version, first, stage_progress(pod, name)) for name, version, first in links
        ),
        finished=finished_at(pod) if outcome is not PodOutcome.RUNNING else None,
    )


class PodLogs:
    """Best-effort tail of a failed container's log, fetched once per pod uid."""

    def __init__(self, client: KubeClient, *, deadline: float = LOG_DEADLINE) -> None:
        self._client = client
        self._deadline = deadline
        self._cache: OrderedDict[str, str] = OrderedDict()

    async def tail(self, pod: JSON, container: str) -> str:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or meta.get("name"))
        key = f"{uid}/{container}"
        if key in self._cache:
            return self._cache[key]
        text = await self._fetch(str(meta.get("namespace") or ""), str(meta.get("name") or ""), container)
        self._cache[key] = text
        while len(self._cache) > _LOG_CACHE_SIZE:
            self._cache.popitem(last=False)
        return text

    async def _fetch(self, namespace: str, name: str, container: str) -> str:
        """The tail, tried again until the deadline while the kubelet has none to give: right after a
        container exits, the kubelet may answer an error or an empty log for a moment (its log
        registration can trail the status it reported), and the pod is deleted once its failure is
        recorded, so this is the only chance to read it."""
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/log"
        params = {"container": container, "tailLines": str(LOG_TAIL_LINES)}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._deadline
        body, error = "", ""
        while True:
            remaining = deadline - loop.time()
            try:
                body = await self._client.get_text(
                    path, params=params, timeout=max(0.1, remaining), keep_last=LOG_READ_BYTES
                )
                error = ""
            except (TimeoutError, aiohttp.ClientError, OSError, ApiError) as exc:
                body, error = "", str(exc) or type(exc).__name__
            if body.strip() or deadline - loop.time() < LOG_RETRY_PAUSE:
                break
            await asyncio.sleep(LOG_RETRY_PAUSE)
        if not body.strip():
            log.info(
                "pod log unavailable", pod=f"{namespace}/{name}", container=container, error=error or "empty"
            )
            return ""
        lines = [line for line in body.splitlines() if line.strip()][-LOG_TAIL_LINES:]
        text = " | ".join(lines)
        return text[-MAX_LOG_CHARS:]


async def summarize_with_logs(
    pod: JSON, *, version_of: Mapping[tuple[str, str], str], logs: PodLogs | None
) -> PodSummary | None:
    """`summarize`, adding the failed container's last log lines to the message of a failed pod whose
    status does not carry them (pods of an older operator, kubelets that lost the tail)."""
    summary = summarize(pod, version_of=version_of)
    if summary is None or summary.outcome != PodOutcome.FAILED or logs is None:
        return summary
    container = needs_log_tail(pod)
    if container is None:
        return summary
    tail = await logs.tail(pod, container)
    if not tail:
        return summary
    return replace(summary, message=f"{summary.message}; log: {tail}")
