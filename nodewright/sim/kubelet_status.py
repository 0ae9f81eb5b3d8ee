"""What a kubelet reports while it runs a pod, and what it does next (pure; time is passed in).

The simulated kubelet keeps one `ContainerRecord` per container of a pod and derives everything the API
sees from them, the way the kubelet's status manager does:

- **Container statuses.** A container is `waiting` (with a reason: `PodInitializing` before its turn,
  `ContainerCreating`, `ErrImagePull`/`ImagePullBackOff`, `CreateContainerConfigError`,
  `CrashLoopBackOff`), `running` (startedAt) or `terminated` (exitCode, reason `Completed` for 0 and
  `Error` otherwise, startedAt/finishedAt, message). `restartCount` counts restarts and `lastState` keeps
  the previous termination. Init containers are `ready` once they exited 0; main containers while they run
  (no probes are simulated).
- **Phase** (the kubelet's `getPhase`): `Pending` until every init container exited 0 and every main
  container started; with `restartPolicy: Never` a failed init container makes the pod `Failed` at once
  (this is the package pods' policy: the operator owns retries), with `OnFailure`/`Always` it is restarted
  after a back-off (10 s doubling to 5 min) and the pod stays `Pending`. Then `Running` while a main
  container runs; when all have exited, `Succeeded` if all exited 0, else `Failed` (`Never`), restarted
  (`OnFailure` for failures, `Always` for any exit).
- **Conditions**: `PodScheduled` (bound by nodeName), `PodReadyToStartContainers` (the sandbox exists),
  `Initialized` (every init container exited 0; otherwise `ContainersNotInitialized` listing them),
  `ContainersReady` and `Ready` (every main container running; `ContainersNotReady` listing the others,
  `PodCompleted`/`PodFailed` once terminal). A condition keeps its `lastTransitionTime` while its status
  does not change.
- **Next step**: init containers one after another, then all main containers together; a container whose
  process is gone is restarted or not by the restart policy.
- **Resuming after a kubelet restart**: the records are rebuilt from the pod's reported status. A
  container reported running whose process this kubelet no longer has is lost: it is recorded as
  terminated with exit code 137 and reason `ContainerStatusUnknown`, as a real kubelet reports a container
  it cannot find, so a package pod fails and the operator decides about a retry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

JSON = dict[str, Any]

WAITING: Final = "waiting"
RUNNING: Final = "running"
TERMINATED: Final = "terminated"
LOST_EXIT_CODE: Final = 137
LOST_REASON: Final = "ContainerStatusUnknown"
BACKOFF_INITIAL_S: Final = 10.0
BACKOFF_MAX_S: Final = 300.0
RESTART_POLICIES: Final = ("Always", "OnFailure", "Never")


@dataclass(frozen=True, slots=True)
class Termination:
    exit_code: int
    reason: str
    started_at: str
    finished_at: str
    message: str = ""
    container_id: str = ""

    def to_json(self) -> JSON:
        out: JSON = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
        }
        if self.message:
            out["message"] = self.message
        if self.container_id:
            out["containerID"] = self.container_id
        return out


def exit_reason(exit_code: int) -> str:
    return "Completed" if exit_code == 0 else "Error"


@dataclass(frozen=True, slots=True)
class ContainerRecord:
    """The kubelet's knowledge of one container. Exactly one of waiting/running/terminated applies:
    `terminated` if set, else `running_since` if set, else waiting with `waiting_reason`."""

    name: str
    image: str
    init: bool
    virtual: bool = False  # the pause container: "runs" without a process
    waiting_reason: str = "PodInitializing"
    waiting_message: str = ""
    running_since: str | None = None
    terminated: Termination | None = None
    last_termination: Termination | None = None
    restart_count: int = 0
    container_id: str = ""

    @property
    def state(self) -> str:
        if self.terminated is not None:
            return TERMINATED
        if self.running_since is not None:
            return RUNNING
        return WAITING

    @property
    def succeeded(self) -> bool:
        return self.terminated is not None and self.terminated.exit_code == 0

    @property
    def failed(self) -> bool:
        return self.terminated is not None and self.terminated.exit_code != 0

    def waiting(self, reason: str, message: str = "") -> ContainerRecord:
        return dataclasses.replace(self, waiting_reason=reason, waiting_message=message, running_since=None)

    def started(self, now: str, container_id: str) -> ContainerRecord:
        return dataclasses.replace(
            self, running_since=now, terminated=None, waiting_message="", container_id=container_id
        )

    def exited(
        self, exit_code: int, now: str, *, reason: str | None = None, message: str = ""
    ) -> ContainerRecord:
        termination = Termination(
            exit_code=exit_code,
            reason=reason or exit_reason(exit_code),
            started_at=self.running_since or now,
            finished_at=now,
            message=message,
            container_id=self.container_id,
        )
        return dataclasses.replace(self, running_since=None, terminated=termination)

    def restarting(self, reason: str = "CrashLoopBackOff", message: str = "") -> ContainerRecord:
        """Back to waiting, the last run kept as lastState and counted."""
        return dataclasses.replace(
            self,
            terminated=None,
            running_since=None,
            last_termination=self.terminated,
            restart_count=self.restart_count + 1,
            waiting_reason=reason,
            waiting_message=message,
        )

    def to_status(self) -> JSON:
        state: JSON
        if self.terminated is not None:
            state = {"terminated": self.terminated.to_json()}
        elif self.running_since is not None:
            state = {"running": {"startedAt": self.running_since}}
        else:
            waiting: JSON = {"reason": self.waiting_reason}
            if self.waiting_message:
                waiting["message"] = self.waiting_message
            state = {"waiting": waiting}
        running = self.running_since is not None and self.terminated is None
        out: JSON = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.succeeded if self.init else running,
            "started": running,
            "restartCount": self.restart_count,
            "state": state,
        }
        if self.container_id and self.state != WAITING:
            out["containerID"] = self.container_id
        if self.last_termination is not None:
            out["lastState"] = {"terminated": self.last_termination.to_json()}
        return out


def initial_records(pod: JSON, *, virtual: frozenset[str] = frozenset()) -> list[ContainerRecord]:
    """Records for a pod nothing has run yet (init containers first, in order)."""
    spec = pod.get("spec") or {}
    records = [
        ContainerRecord(name=c["name"], image=c.get("image", ""), init=True)
        for c in spec.get("initContainers") or []
    ]
    records += [
        ContainerRecord(name=c["name"], image=c.get("image", ""), init=False, virtual=c["name"] in virtual)
        for c in spec.get("containers") or []
    ]
    return records


def restart_policy(pod: JSON) -> str:
    policy = (pod.get("spec") or {}).get("restartPolicy") or "Always"
    return policy if policy in RESTART_POLICIES else "Always"


def restart_delay(restart_count: int) -> float:
    """The kubelet's crash-loop back-off before restart number `restart_count + 1`."""
    return min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2.0 ** max(0, restart_count))


def restarts_after(policy: str, exit_code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


# ----------------------------------------------------------------------------------------------------
# Phase and next step


def pod_phase(policy: str, records: Sequence[ContainerRecord]) -> str:
    for record in records:
        if not record.init:
            continue
        if record.succeeded:
            continue
        if record.failed and policy == "Never":
            return "Failed"
        return "Pending"
    mains = [r for r in records if not r.init]
    if not mains:
        return "Succeeded"
    if any(r.state == WAITING and r.last_termination is None for r in mains):
        return "Pending"
    if any(r.state == RUNNING for r in mains):
        return "Running"
    exits = [(r.terminated or r.last_termination) for r in mains]
    codes = [t.exit_code for t in exits if t is not None]
    if policy == "Always":
        return "Running"
    if all(code == 0 for code in codes):
        return "Succeeded"
    return "Running" if policy == "OnFailure" else "Failed"


@dataclass(frozen=True, slots=True)
class Start:
    index: int


@dataclass(frozen=True, slots=True)
class Restart:
    index: int
    delay_s: float


Action = Start | Restart


def next_actions(policy: str, records: Sequence[ContainerRecord]) -> list[Action]:
    """What to start now: the first unfinished init container, or every main container that is due.
    Empty while something runs that must finish first, or once the pod is terminal."""
    if pod_phase(policy, records) in ("Succeeded", "Failed"):
        return []
    for index, record in enumerate(records):
        if not record.init or record.succeeded:
            continue
        if record.state == RUNNING:
            return []
        if record.state == TERMINATED:
            return [Restart(index, restart_delay(record.restart_count))]
        return [Start(index)]
    actions: list[Action] = []
    for index, record in enumerate(records):
        if record.init:
            continue
        if record.state == WAITING:
            actions.append(Start(index))
        elif record.terminated is not None and restarts_after(policy, record.terminated.exit_code):
            actions.append(Restart(index, restart_delay(record.restart_count)))
    return actions


def is_terminal(phase: str) -> bool:
    return phase in ("Succeeded", "Failed")


# ----------------------------------------------------------------------------------------------------
# Pod status


def _condition(
    kind: str, ok: bool, now: str, previous: Mapping[str, JSON], *, reason: str = "", message: str = ""
) -> JSON:
    status = "True" if ok else "False"
    old = previous.get(kind) or {}
    changed = old.get("status") != status
    out: JSON = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": now
        if changed or not old.get("lastTransitionTime")
        else old["lastTransitionTime"],
    }
    if not ok and reason:
        out["reason"] = reason
    if not ok and message:
        out["message"] = message
    return out


def pod_status(
    pod: JSON,
    records: Sequence[ContainerRecord],
    *,
    now: str,
    start_time: str,
    host_ip: str,
    pod_ip: str,
    previous_conditions: Sequence[JSON] | None = None,
    deadline_exceeded: bool = False,
) -> JSON:
    """The pod's `status` for these records: what the kubelet would write. `previous_conditions` (default:
    the pod's reported ones) keep transition times; `deadline_exceeded` is the kubelet's verdict on
    `activeDeadlineSeconds` (phase Failed, reason DeadlineExceeded)."""
    policy = restart_policy(pod)
    phase = "Failed" if deadline_exceeded else pod_phase(policy, records)
    if previous_conditions is None:
        previous_conditions = (pod.get("status") or {}).get("conditions") or []
    previous = {c.get("type", ""): c for c in previous_conditions}
    inits = [r for r in records if r.init]
    mains = [r for r in records if not r.init]
    incomplete = [r.name for r in inits if not r.succeeded]
    unready = [r.name for r in mains if r.state != RUNNING]
    terminal = is_terminal(phase)
    if terminal:
        ready_reason = "PodCompleted" if phase == "Succeeded" else "PodFailed"
        ready_message = ""
    else:
        ready_reason = "ContainersNotReady"
        ready_message = f"containers with unready status: [{' '.join(unready)}]"
    containers_ready = not unready and not terminal
    conditions = [
        _condition("PodReadyToStartContainers", not terminal, now, previous),
        _condition(
            "Initialized",
            not incomplete,
            now,
            previous,
            reason="ContainersNotInitialized",
            message=f"containers with incomplete status: [{' '.join(incomplete)}]",
        ),
        _condition("Ready", containers_ready, now, previous, reason=ready_reason, message=ready_message),
        _condition(
            "ContainersReady", containers_ready, now, previous, reason=ready_reason, message=ready_message
        ),
        _condition("PodScheduled", True, now, previous),
    ]
    status: JSON = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": start_time,
        "containerStatuses": [r.to_status() for r in mains],
    }
    if inits:
        status["initContainerStatuses"] = [r.to_status() for r in inits]
    if deadline_exceeded:
        status["reason"] = "DeadlineExceeded"
        status["message"] = "Pod was active on the node longer than the specified deadline"
    return status


# ----------------------------------------------------------------------------------------------------
# Resuming


def _termination_from(state: JSON, fallback_time: str) -> Termination:
    return Termination(
        exit_code=int(state.get("exitCode", 0)),
        reason=str(state.get("reason") or exit_reason(int(state.get("exitCode", 0)))),
        started_at=str(state.get("startedAt") or fallback_time),
        finished_at=str(state.get("finishedAt") or fallback_time),
        message=str(state.get("message") or ""),
        container_id=str(state.get("containerID") or ""),
    )


def records_from_status(
    pod: JSON, *, now: str, virtual: frozenset[str] = frozenset(), lost_message: str
) -> list[ContainerRecord]:
    """Rebuild the records from the pod's reported status after a kubelet restart. A real container
    reported running is lost (terminated 137 `ContainerStatusUnknown` with `lost_message`); a virtual one
    (pause) simply runs on."""
    records = initial_records(pod, virtual=virtual)
    status = pod.get("status") or {}
    reported = {s.get("name"): s for s in status.get("initContainerStatuses") or []}
    reported.update({s.get("name"): s for s in status.get("containerStatuses") or []})
    rebuilt: list[ContainerRecord] = []
    for record in records:
        entry = reported.get(record.name)
        if not entry:
            rebuilt.append(record)
            continue
        state = entry.get("state") or {}
        last = (entry.get("lastState") or {}).get("terminated")
        record = dataclasses.replace(
            record,
            restart_count=int(entry.get("restartCount") or 0),
            last_termination=_termination_from(last, now) if last else None,
            container_id=str(entry.get("containerID") or ""),
        )
        if "terminated" in state:
            record = dataclasses.replace(record, terminated=_termination_from(state["terminated"], now))
        elif "running" in state:
            since = str(state["running"].get("startedAt") or now)
            record = dataclasses.replace(record, running_since=since)
            if not record.virtual:
                record = record.exited(LOST_EXIT_CODE, now, reason=LOST_REASON, message=lost_message)
        elif "waiting" in state:
            waiting = state["waiting"] or {}
            record = record.waiting(
                str(waiting.get("reason") or "PodInitializing"), str(waiting.get("message") or "")
            )
        rebuilt.append(record)
    return rebuilt


def started_before(pod: JSON) -> bool:
    """Whether a kubelet already reported this pod (it has a start time)."""
    return bool((pod.get("status") or {}).get("startTime"))
