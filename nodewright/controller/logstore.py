"""Logs that outlive their pods: the log tail of each stage's last failed attempt, kept in a ConfigMap.

A package pod is deleted as soon as its attempt has been recorded (every attempt is a new pod), so
`kubectl logs` finds nothing once a stage has failed for good -- exactly when someone needs the output.
The node controller therefore keeps, per (NodeWright, node), one ConfigMap in the operator namespace:

- name `<nw>.logs.<node>` (`store_name`; hashed when longer than a DNS subdomain allows), labels
  `nodewright.io/managed-by=nodewright-operator`, `nodewright.io/nodewright=<nw>`,
  `nodewright.io/purpose=logs`, annotation `nodewright.io/node=<node>`;
- owned by the NodeWright (controller owner reference with its uid), so the garbage collector deletes
  it with the NodeWright, like the package pods and per-version ConfigMaps;
- one data key per package version and stage and outcome, `<pkg>.<version>.<stage>.failed` (and
  `.succeeded` when the operator keeps successful output too, `--keep-succeeded-logs`): a JSON
  document with the pod, attempt, container, exit code, reason, time and the last lines of the
  failing container's log (at most `MAX_LOG_CHARS`, the tail: the end of a step's output says why it
  failed). A newer attempt of the same stage replaces the older one: the store holds the *last*
  failed attempt of each stage;
- attempts the operator failed although no container did (`record_stopped`, from the plan's
  `AttemptFailed`) are kept too: image pull errors past their grace (no container ran, so there is
  no log: the entry names the container, the `image` that could not be pulled, the kubelet's reason,
  and the planner's message -- which attempt out of how many, or that it gave up, and why), and pods
  deleted at the stage timeout (the log tail of their stage containers so far);
- bounded: at most `MAX_STORE_CHARS` of data per ConfigMap (well under the 1 MiB object limit);
  when a write would exceed it, the oldest entries go first, succeeded before failed.

Writes are best effort and never fail a reconcile: one GET and one PUT with the read resourceVersion
(re-read on conflict, `KubeClient.modify`), or a create for the first entry -- the verbs the operator
already has on ConfigMaps. Each pod is recorded once (by uid). The log is fetched from the kubelet
through the API server (`pods/log`) before the controller deletes the pod; simulated (kwok) pods have
no logs, and then only the pod's own failure message is kept.

`kubectl nodewright package logs NW PKG --node N` reads the live pod if one exists, else this store
(`--previous` always reads the store).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from urllib.parse import quote

import aiohttp
import structlog

from nodewright.api import constants
from nodewright.api.models import NodeWright
from nodewright.controller.configmaps import CONFIGMAPS
from nodewright.controller.pods import container_image, pull_error
from nodewright.kube.client import KubeClient
from nodewright.kube.resources import JSON, ApiError, Conflict, NotFound
from nodewright.plan import podspec
from nodewright.plan.node import AttemptFailed
from nodewright.plan.stages import FailureCause, ts

log = structlog.get_logger("nodewright.controller.logstore")

PURPOSE: Final = "logs"
NODE_ANNOTATION: Final = f"{constants.PREFIX}node"
LOG_TAIL_LINES: Final = 200
MAX_LOG_CHARS: Final = 16 * 1024
MAX_STORE_CHARS: Final = 256 * 1024
LOG_DEADLINE: Final = 5.0
MAX_MESSAGE_CHARS: Final = 2000
STAGE_TIMEOUT: Final = "StageTimeout"  # the reason of an attempt deleted at the stage timeout
NO_REBOOT: Final = "NoReboot"  # a reboot interrupt's pod ended, but the node never went down
FAILED: Final = "failed"
SUCCEEDED: Final = "succeeded"
_SEEN_LIMIT: Final = 4096


def store_name(nodewright: str, node: str) -> str:
    name = f"{nodewright}.logs.{node}"
    if len(name) <= 253:
        return name
    return f"{nodewright}.logs.{hashlib.sha256(node.encode()).hexdigest()[:16]}"


def entry_key(package: str, version: str, stage: str, outcome: str) -> str:
    return f"{package}.{podspec.label_value(version)}.{stage}.{outcome}"


@dataclass(frozen=True, slots=True)
class KeptLog:
    """One kept attempt (the value of one data key)."""

    package: str
    version: str
    stage: str
    outcome: str
    pod: str
    attempt: int
    container: str
    exit_code: int | None
    reason: str
    at: str
    log: str
    message: str = ""
    image: str = ""  # the image of `container` when it matters: the one that could not be pulled

    def encode(self) -> str:
        doc = {
            "package": self.package,
            "version": self.version,
            "stage": self.stage,
            "outcome": self.outcome,
            "pod": self.pod,
            "attempt": self.attempt,
            "container": self.container,
            "exitCode": self.exit_code,
            "reason": self.reason,
            "at": self.at,
            "message": self.message,
            "log": self.log,
        }
        if self.image:
            doc["image"] = self.image
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @staticmethod
    def decode(text: str) -> KeptLog | None:
        """Lenient: a value that does not parse is skipped (a reader must never fail on the store)."""
        try:
            doc = json.loads(text)
            code = doc.get("exitCode")
            return KeptLog(
                package=str(doc["package"]),
                version=str(doc["version"]),
                stage=str(doc["stage"]),
                outcome=str(doc["outcome"]),
                pod=str(doc.get("pod") or ""),
                attempt=int(doc.get("attempt") or 0),
                container=str(doc.get("container") or ""),
                exit_code=int(code) if isinstance(code, int) else None,
                reason=str(doc.get("reason") or ""),
                at=str(doc.get("at") or ""),
                log=str(doc.get("log") or ""),
                message=str(doc.get("message") or ""),
                image=str(doc.get("image") or ""),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    @property
    def key(self) -> str:
        return entry_key(self.package, self.version, self.stage, self.outcome)


def kept_logs(configmap: Mapping[str, Any] | None) -> list[KeptLog]:
    """Every readable entry of a store ConfigMap, oldest first."""
    data = (configmap or {}).get("data") or {}
    entries = [e for e in (KeptLog.decode(v) for v in data.values() if isinstance(v, str)) if e is not None]
    return sorted(entries, key=lambda e: (e.at, e.key))


def bounded_data(data: Mapping[str, str], new: KeptLog, *, limit: int = MAX_STORE_CHARS) -> dict[str, str]:
    """`data` with `new` stored under its key, the oldest entries dropped (succeeded first) to fit."""
    out = dict(data)
    out[new.key] = new.encode()

    def size() -> int:
        return sum(len(k) + len(v) for k, v in out.items())

    if size() <= limit:
        return out
    others = [(KeptLog.decode(v), k) for k, v in out.items() if k != new.key]
    order = sorted(
        others,
        key=lambda item: (
            item[0] is not None and item[0].outcome == FAILED,
            item[0].at if item[0] is not None else "",
        ),
    )
    for _, key in order:
        if size() <= limit:
            break
        del out[key]
    return out


def tail(text: str, *, lines: int = LOG_TAIL_LINES, limit: int = MAX_LOG_CHARS) -> str:
    kept = text.splitlines()[-lines:]
    joined = "\n".join(kept)
    return joined[-limit:]


def desired_store(nw: NodeWright, node: str, *, namespace: str, data: Mapping[str, str]) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": store_name(nw.metadata.name, node),
            "namespace": namespace,
            "labels": {
                constants.POD_OWNER_LABEL: constants.POD_OWNER_VALUE,
                constants.POD_LABEL_NODEWRIGHT: nw.metadata.name,
                constants.POD_LABEL_PURPOSE: PURPOSE,
            },
            "annotations": {NODE_ANNOTATION: node},
            "ownerReferences": [
                {
                    "apiVersion": constants.API_VERSION,
                    "kind": constants.KIND_NODEWRIGHT,
                    "name": nw.metadata.name,
                    "uid": nw.metadata.uid or "",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": dict(data),
    }


def _init_status(pod: Mapping[str, Any], container: str) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") == container:
            return dict(status)
    return {}


def stage_containers(pod: Mapping[str, Any], package: str) -> list[str]:
    """The init containers that run the stage and its check (not the payload copy `<pkg>-init`)."""
    names = [str(c.get("name")) for c in (pod.get("spec") or {}).get("initContainers") or []]
    return [n for n in names if n != f"{package}-init"]


class LogStore:
    """Keeps the log tail of failed (and optionally succeeded) attempts; see the module docstring."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        keep_succeeded: bool = False,
        deadline: float = LOG_DEADLINE,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._keep_succeeded = keep_succeeded
        self._deadline = deadline
        self._seen: OrderedDict[str, None] = OrderedDict()

    def wants(self, outcome: str) -> bool:
        return outcome == FAILED or (outcome == SUCCEEDED and self._keep_succeeded)

    async def record(
        self,
        nw: NodeWright,
        pod: JSON,
        *,
        package: str,
        version: str,
        stage: str,
        attempt: int,
        outcome: str,
        container: str | None,
        message: str,
        now: datetime,
    ) -> bool:
        """Keep this attempt's log tail (once per pod); True when written. Never raises."""
        if not self.wants(outcome) or not self._first_time(pod):
            return False
        names = [container] if container else stage_containers(pod, package)
        terminated = (
            (_init_status(pod, container).get("state") or {}).get("terminated") or {} if container else {}
        )
        code = terminated.get("exitCode")
        entry = KeptLog(
            package=package,
            version=version,
            stage=stage,
            outcome=outcome,
            pod=str((pod.get("metadata") or {}).get("name") or ""),
            attempt=attempt,
            container=container or ",".join(names),
            exit_code=int(code) if isinstance(code, int) else None,
            reason=str(terminated.get("reason") or ""),
            at=ts(now),
            log=await self._logs(pod, names),
            message=message[:MAX_MESSAGE_CHARS],
        )
        return await self._keep(nw, pod, entry)

    async def record_stopped(
        self, nw: NodeWright, pod: JSON, failed: AttemptFailed, *, now: datetime
    ) -> bool:
        """Keep an attempt the planner failed while its pod had not failed by itself (once per pod);
        True when written. Never raises.

        An image pull error: nothing ran, so there is no log to fetch; the entry names the container
        stuck pulling, its image and the kubelet's reason, with the planner's message (the attempt out
        of how many, or that it gave up, and the kubelet's words). A stage timeout: the log tail of the
        stage containers so far, fetched before the pod is deleted. A reboot pod that ended without a
        reboot (reason `NoReboot`): its `interrupt` container's log (e.g. the agent's "already ran").
        """
        if failed.cause is FailureCause.POD_FAILED or not self._first_time(pod):
            return False  # (a pod that failed by itself is kept from its own record: `record`)
        container, reason, image, text = "", "", "", ""
        if failed.cause is FailureCause.PULL_ERROR:
            stuck = pull_error(pod)
            if stuck is not None:
                container, reason = stuck[0], stuck[1]
                image = container_image(pod, container)
        else:  # TIMEOUT, NO_REBOOT: what the stage's containers said so far (the agent says why)
            own = str(((pod.get("metadata") or {}).get("labels") or {}).get(constants.POD_LABEL_PACKAGE))
            names = stage_containers(pod, own)
            reason = NO_REBOOT if failed.cause is FailureCause.NO_REBOOT else STAGE_TIMEOUT
            container, text = ",".join(names), await self._logs(pod, names)
        entry = KeptLog(
            package=failed.package,
            version=failed.version,
            stage=failed.stage.value,
            outcome=FAILED,
            pod=str((pod.get("metadata") or {}).get("name") or ""),
            attempt=failed.attempt,
            container=container,
            exit_code=None,
            reason=reason,
            at=ts(now),
            log=text,
            message=failed.message[:MAX_MESSAGE_CHARS],
            image=image,
        )
        return await self._keep(nw, pod, entry)

    def _first_time(self, pod: JSON) -> bool:
        """True the first time a pod (by uid) is to be kept: each pod is recorded once."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or meta.get("name") or "")
        if uid in self._seen:
            return False
        self._seen[uid] = None
        while len(self._seen) > _SEEN_LIMIT:
            self._seen.popitem(last=False)
        return True

    async def _logs(self, pod: JSON, names: list[str]) -> str:
        """The tail of the logs of the pod's containers `names` (each headed by its name if several)."""
        meta = pod.get("metadata") or {}
        texts: list[str] = []
        for name in names:
            text = await self._fetch(
                str(meta.get("namespace") or self._namespace), str(meta.get("name")), name
            )
            if text:
                texts.append(text if len(names) == 1 else f"==> {name} <==\n{text}")
        return tail("\n".join(texts))

    async def _keep(self, nw: NodeWright, pod: JSON, entry: KeptLog) -> bool:
        node = podspec.pod_node(pod)
        try:
            await self._write(nw, node, entry)
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("package log not kept", pod=entry.pod, node=node, error=str(exc))
            return False
        return True

    async def _fetch(self, namespace: str, name: str, container: str) -> str:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/log"
        params = {"container": container, "tailLines": str(LOG_TAIL_LINES)}
        try:
            return await self._client.get_text(
                path, params=params, timeout=self._deadline, keep_last=MAX_LOG_CHARS * 4
            )
        except (TimeoutError, aiohttp.ClientError, OSError, ApiError) as exc:
            log.debug("pod log unavailable", pod=f"{namespace}/{name}", container=container, error=str(exc))
            return ""

    async def _write(self, nw: NodeWright, node: str, entry: KeptLog) -> None:
        name = store_name(nw.metadata.name, node)
        desired = desired_store(nw, node, namespace=self._namespace, data=bounded_data({}, entry))
        try:
            await self._client.create(CONFIGMAPS, desired, namespace=self._namespace)
            return
        except Conflict as exc:
            if not exc.already_exists:
                raise

        def mutate(current: JSON) -> JSON:
            owners = {o.get("uid") for o in (current.get("metadata") or {}).get("ownerReferences") or []}
            # A store left by an earlier NodeWright of the same name (another uid) is started afresh.
            data = (current.get("data") or {}) if nw.metadata.uid in owners else {}
            return desired_store(nw, node, namespace=self._namespace, data=bounded_data(data, entry))

        try:
            await self._client.modify(CONFIGMAPS, name, mutate, namespace=self._namespace)
        except NotFound:
            await self._client.create(CONFIGMAPS, desired, namespace=self._namespace)
