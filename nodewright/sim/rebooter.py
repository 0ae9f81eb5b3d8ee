"""The simulator's rebooter: simulated node reboots, the part of package-pod simulation kwok cannot express.

A real "reboot" interrupt makes the node's kubelet stop posting status (the node turns NotReady), the
machine restarts, and the kubelet comes back with a new `status.nodeInfo.bootID` (the kernel's
`/proc/sys/kernel/random/boot_id`). The operator detects the finished reboot by that bootID change, so
the simulation has to produce it, and kwok's stages can only patch status from templates that keep the
bootID.

Hand-off: kwok's `sim-package-reboot-handoff` stage marks a started reboot-interrupt package pod (one
that is not going to fail by the sim knobs) with the pod condition `sim.nodewright.io/RebootPending=True`
after the package's NODEWRIGHT_SIM_DURATION. This process watches package pods of the interrupt stages in
the operator namespace and, for each pod with that condition:

1. records `sim.nodewright.io/reboot-of=<pod uid>` on the node (so a restarted rebooter neither reboots
   twice nor forgets a reboot in progress) and sets the node's Ready condition to False;
2. if the node has the annotation `sim.nodewright.io/reboot-hang: "true"`, stops there: the node never
   comes back (and the pod never finishes), like a machine stuck in firmware;
3. otherwise waits `sim.nodewright.io/reboot-seconds` (node annotation, default 2) and sets Ready=True with
   a fresh random bootID;
4. finishes the pod like the real agent does after the reboot: every init container terminated with
   exit code 0, the pause container running, phase Running, RebootPending=False.

Node status is changed with strategic-merge patches on the status subresource (conditions merge by type,
so the other conditions are kept). Run as `python -m nodewright.sim.rebooter --kubeconfig K`; it lists and
then watches (relisting on 410 Gone or any stream error), touches `--ready-file` after the first list,
and exits cleanly on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
import logging
import signal
import sys
import uuid
from pathlib import Path

from nodewright.sim.kubeapi import JSON, ApiError, KubeClient

log = logging.getLogger("nodewright.sim.rebooter")

REBOOT_CONDITION = "sim.nodewright.io/RebootPending"
REBOOT_OF_ANNOTATION = "sim.nodewright.io/reboot-of"
REBOOT_SECONDS_ANNOTATION = "sim.nodewright.io/reboot-seconds"
REBOOT_HANG_ANNOTATION = "sim.nodewright.io/reboot-hang"
DEFAULT_REBOOT_SECONDS = 2.0
INTERRUPT_STAGES = ("interrupt", "uninstall-interrupt")
_SELECTOR = (
    "nodewright.io/managed-by=nodewright-operator,nodewright.io/stage in (" + ",".join(INTERRUPT_STAGES) + ")"
)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reboot_pending(pod: JSON) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    if pod.get("status", {}).get("phase") != "Pending":
        return False
    return any(
        c.get("type") == REBOOT_CONDITION and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions") or []
    )


def node_ready(node: JSON) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in node.get("status", {}).get("conditions") or []
    )


def reboot_seconds(node: JSON) -> float:
    raw = (node.get("metadata", {}).get("annotations") or {}).get(REBOOT_SECONDS_ANNOTATION)
    try:
        return max(0.0, float(raw)) if raw is not None else DEFAULT_REBOOT_SECONDS
    except ValueError:
        return DEFAULT_REBOOT_SECONDS


def completed_pod_status(pod: JSON) -> JSON:
    """The status a real kubelet reports once every init container exited 0 and pause runs."""
    now = _now()
    started = pod.get("status", {}).get("startTime") or now
    spec = pod.get("spec", {})
    return {
        "phase": "Running",
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
        ]
        + [
            {
                "type": REBOOT_CONDITION,
                "status": "False",
                "reason": "RebootCompleted",
                "message": "the node came back with a new bootID",
                "lastTransitionTime": now,
            }
        ],
        "initContainerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": True,
                "started": False,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": started,
                        "finishedAt": now,
                    }
                },
            }
            for c in spec.get("initContainers") or []
        ],
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for c in spec.get("containers") or []
        ],
    }


def _ready_condition(ready: bool) -> JSON:
    now = _now()
    if ready:
        reason, message = "KubeletReady", "kubelet is posting ready status"
    else:
        reason, message = "KubeletNotReady", "node is rebooting (simulated)"
    return {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


class Rebooter:
    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def handle(self, pod: JSON) -> None:
        """Start (at most once per pod) the reboot a pending pod asks for."""
        uid = pod["metadata"]["uid"]
        if not reboot_pending(pod) or uid in self._tasks:
            return
        task = asyncio.create_task(self._reboot(pod), name=f"reboot-{pod['metadata']['name']}")
        self._tasks[uid] = task
        task.add_done_callback(functools.partial(self._done, uid))

    def _done(self, uid: str, task: asyncio.Task[None]) -> None:
        self._tasks.pop(uid, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("reboot for pod uid %s failed: %r", uid, task.exception())

    async def _reboot(self, pod: JSON) -> None:
        meta = pod["metadata"]
        uid, node_name = meta["uid"], pod["spec"]["nodeName"]
        node_path = f"/api/v1/nodes/{node_name}"
        node = await self.client.get(node_path)
        annotations = node["metadata"].get("annotations") or {}
        already = annotations.get(REBOOT_OF_ANNOTATION) == uid
        if already and node_ready(node):
            log.info("node %s already rebooted for pod %s; finishing the pod", node_name, meta["name"])
        else:
            if not already:
                log.info("rebooting node %s for pod %s/%s", node_name, meta["namespace"], meta["name"])
                await self.client.merge_patch(
                    node_path, {"metadata": {"annotations": {REBOOT_OF_ANNOTATION: uid}}}
                )
                await self.client.strategic_patch(
                    node_path + "/status", {"status": {"conditions": [_ready_condition(False)]}}
                )
            if annotations.get(REBOOT_HANG_ANNOTATION, "").lower() == "true":
                log.info(
                    "node %s hangs in its reboot (%s=true); it stays NotReady",
                    node_name,
                    REBOOT_HANG_ANNOTATION,
                )
                return
            await asyncio.sleep(reboot_seconds(node))
            boot_id = str(uuid.uuid4())
            await self.client.strategic_patch(
                node_path + "/status",
                {"status": {"conditions": [_ready_condition(True)], "nodeInfo": {"bootID": boot_id}}},
            )
            log.info("node %s is back with bootID %s", node_name, boot_id)
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        try:
            await self.client.strategic_patch(path, {"status": completed_pod_status(pod)})
        except ApiError as err:
            if err.status != 404:  # deleted meanwhile: nothing left to finish
                raise

    async def run(self, ready_file: Path | None) -> None:
        pods_path = f"/api/v1/namespaces/{self.namespace}/pods"
        params = {"labelSelector": _SELECTOR}
        ready_written = False
        while True:
            try:
                listed = await self.client.list_all(pods_path, params=params)
                for pod in listed["items"]:
                    await self.handle(pod)
                if ready_file is not None and not ready_written:
                    await asyncio.to_thread(ready_file.write_text, "ready\n")
                    ready_written = True
                rv = listed["resourceVersion"]
                while True:
                    gone = False
                    async for event in self.client.watch(pods_path, resource_version=rv, params=params):
                        kind, obj = event.get("type"), event.get("object", {})
                        if kind == "ERROR":
                            log.info("watch error %s; relisting", obj.get("message", obj))
                            gone = True
                            break
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if kind in ("ADDED", "MODIFIED"):
                            await self.handle(obj)
                    if gone:
                        break
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the simulator must survive apiserver restarts
                log.warning("list/watch failed (%r); retrying in 1s", err)
                await asyncio.sleep(1)

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        for task in list(self._tasks.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.client.close()


async def main_async(args: argparse.Namespace) -> int:
    client = KubeClient(Path(args.kubeconfig), max_in_flight=16)
    rebooter = Rebooter(client, args.namespace)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = asyncio.create_task(rebooter.run(Path(args.ready_file) if args.ready_file else None))
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
    runner.cancel()
    stopper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    await rebooter.close()
    log.info("rebooter stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nodewright.sim.rebooter", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", default="nodewright-system")
    parser.add_argument("--ready-file", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
