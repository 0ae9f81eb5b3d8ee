"""Issue 13, item 7: a replayed or forged package pod is never trusted (real control plane, real operator).

The attacker here has what a user with pod rights in the operator namespace has: it reads the
operator's apply pod, deletes it and creates another one with the same name and every label and
annotation copied (signature and seal included) -- running another image, or exactly the same spec --
or copies the pod to a node the NodeWright does not select. The operator must not count that pod, must
delete it and say so (Warning Events on the node and the NodeWright, `nodewright_untrusted_pods_total`),
and the stage must complete only through a pod the operator created itself.

Each stage of the package takes `STAGE_SECONDS` in the simulator; the forged pods are made to succeed
fast (`FAST_FORGED_STAGE` per stage under our pod's name, at once on another node), so an operator that
believed them would move on to the config stage within a second or two.

kwok, the simulator, acts on pods by name without a uid precondition (its status patches and its
deletes), which a kubelet does not: a forged pod that took our pod's name can have its queued status
land on our pod re-created under that name, or be deleted by a deletion kwok had queued for our pod.
The test keeps clear of both (see `FAST_FORGED_STAGE`, and the retry in the replacement test).

The fleet-safety monitor is not used: the attacker's pods are package pods that no batch admitted, on
purpose, and the monitor would rightly charge them to the operator.

`test_the_api_server_keeps_the_digest_of_our_pods` creates `podspec.build_pod` output directly and
checks that what kube-apiserver stores has the digest the signature was made over (the canonical form
of `plan.podspec.run_spec`), for the version of the control plane the tests run.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import time
from collections import defaultdict
from typing import Final

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e import operator_fixture
from e2e.operator_fixture import (
    AGENT_IMAGE,
    NAMESPACE,
    PAUSE_IMAGE,
    OperatorProcess,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    nodewright_manifest,
    package,
    package_pods,
    wait_statuses,
)
from nodewright.api.models import Interrupt, NodeWright
from nodewright.api.nodestate import PackageStage, decode
from nodewright.plan import podspec
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, ApiError, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

STAGE_SECONDS = 6
SEAL = "nodewright.io/seal"
SIGNATURE = "nodewright.io/signature"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
EVIL_IMAGE = "evil.example.com/cryptominer:6.6.6"


# ----------------------------------------------------------------------------------------------------
# Helpers


async def untrusted_counts(op: OperatorProcess) -> dict[str, float]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(f"http://127.0.0.1:{op.metrics_port}/metrics") as resp,
    ):
        assert resp.status == 200
        text = await resp.text()
    counts: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "nodewright_untrusted_pods_total":
                counts[sample.labels["reason"]] += sample.value
    return counts


async def untrusted_events(kube: KubeClient, pod_name: str) -> dict[str, str]:
    """involvedObject kind -> name of the UntrustedPackagePod Events that name `pod_name`."""
    listed = await kube.list_all(
        "/api/v1/namespaces/default/events", params={"fieldSelector": "reason=UntrustedPackagePod"}
    )
    return {
        e["involvedObject"]["kind"]: e["involvedObject"]["name"]
        for e in listed["items"]
        if pod_name in e.get("message", "") and e.get("type") == "Warning"
    }


async def sealed_apply_pod(kube: KubeClient, nw: str, *, not_uid: str = "") -> JSON:
    """The operator's apply pod, once its seal is written (and it is not the pod `not_uid`)."""

    async def probe() -> JSON | None:
        for pod in await package_pods(kube, nw):
            meta = pod["metadata"]
            if (
                meta["labels"]["nodewright.io/stage"] == "apply"
                and SEAL in (meta.get("annotations") or {})
                and meta["uid"] != not_uid
                and not meta.get("deletionTimestamp")
            ):
                return pod
        return None

    pod: JSON = await fleet.wait_for(probe, within=90, what=f"a sealed apply pod of {nw}")
    return pod


def forged_copy(pod: JSON, *, image: str | None, stage_duration: str | None) -> JSON:
    """Every label and annotation of `pod` (signature and seal too), its spec, optionally changed
    (`stage_duration`: how long the simulator plays each of its stages)."""
    meta = pod["metadata"]
    forged = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": dict(meta["labels"]),
            "annotations": dict(meta["annotations"]),
            "ownerReferences": copy.deepcopy(meta["ownerReferences"]),
        },
        "spec": copy.deepcopy(pod["spec"]),
    }
    for container in forged["spec"]["initContainers"]:
        if image is not None:
            container["image"] = image
        if stage_duration is not None:
            for env in container.get("env") or []:
                if env["name"] == "NODEWRIGHT_SIM_DURATION":
                    env["value"] = stage_duration
    return forged


FAST_FORGED_STAGE: Final = "1s"
"""How long a fast forged pod that took the name of ours runs each stage: far shorter than ours, but not
0 s. kwok patches pod status by name, without a uid precondition, and a 0 s job it had already taken
for the forged pod (deleted by the operator within milliseconds) could land on the operator's own pod
re-created under that name -- its status Succeeded 27 ms after its creation, a result no kubelet would
report for a pod it did not run (seen once). A delayed job is cancelled when kwok sees the deletion."""


async def replace_with(kube: KubeClient, nw: str, ours: JSON, *, image: str | None, fast: bool) -> JSON:
    """Delete the operator's pod and create the forged copy under its name (retry if the operator's
    own re-creation wins the name); `fast`: its stages take `FAST_FORGED_STAGE`."""
    for _ in range(5):
        name = ours["metadata"]["name"]
        await kube.delete(
            f"{PODS}/{name}",
            body={"gracePeriodSeconds": 0, "preconditions": {"uid": ours["metadata"]["uid"]}},
        )
        try:
            created: JSON = await kube.create(
                PODS, forged_copy(ours, image=image, stage_duration=FAST_FORGED_STAGE if fast else None)
            )
            return created
        except ApiError as err:
            if err.status != 409:
                raise
        ours = await sealed_apply_pod(kube, nw, not_uid=ours["metadata"]["uid"])
    raise AssertionError("the operator re-created its pod first five times in a row")


async def wait_gone(kube: KubeClient, name: str, uid: str, *, within: float) -> float:
    """Seconds until the pod with this uid no longer exists."""
    started = time.monotonic()

    async def gone() -> bool:
        try:
            current = await kube.get(f"{PODS}/{name}")
        except ApiError as err:
            if err.status == 404:
                return True
            raise
        return bool(current["metadata"]["uid"] != uid)

    await fleet.wait_for(gone, within=within, what=f"untrusted pod {name} ({uid}) deleted")
    return time.monotonic() - started


class PodLog:
    """Every pod of one NodeWright, as the watch reports it: uid -> (stage, images, created)."""

    def __init__(self, kube: KubeClient, nw: str) -> None:
        self.kube, self.nw = kube, nw
        self.pods: dict[str, tuple[str, tuple[str, ...], str]] = {}
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> PodLog:
        rv = await self._list()
        self._task = asyncio.create_task(self._run(rv))
        return self

    async def _list(self) -> str:
        listed = await self.kube.list_all(
            PODS, params={"labelSelector": f"nodewright.io/nodewright={self.nw}"}
        )
        for pod in listed["items"]:
            self._record(pod)
        return str(listed["resourceVersion"])

    def _record(self, pod: JSON) -> None:
        meta = pod["metadata"]
        images = tuple(c["image"] for c in pod["spec"].get("initContainers") or [])
        stage = meta["labels"]["nodewright.io/stage"]
        self.pods.setdefault(meta["uid"], (stage, images, meta["creationTimestamp"]))

    async def _run(self, rv: str) -> None:
        params = {"labelSelector": f"nodewright.io/nodewright={self.nw}"}
        while True:  # a watch ends after its timeout: resume from the last revision seen
            async for event in self.kube.watch(PODS, resource_version=rv, params=params):
                if event["type"] == "ERROR":  # 410 Gone: relist (the log only ever grows)
                    rv = await self._list()
                    break
                rv = event["object"]["metadata"].get("resourceVersion", rv)
                if event["type"] in ("ADDED", "MODIFIED"):
                    self._record(event["object"])

    def created(self, stage: str) -> list[tuple[str, tuple[str, ...], str]]:
        return sorted(
            ((uid, images, at) for uid, (s, images, at) in self.pods.items() if s == stage),
            key=lambda p: p[2],
        )

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task


def _ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# ----------------------------------------------------------------------------------------------------
# Scenarios


@pytest.mark.parametrize(
    ("attack", "image", "reason"),
    [
        ("another image", EVIL_IMAGE, "spec_mismatch"),
        ("exact replay", None, "replayed"),
    ],
)
async def test_a_recreated_apply_pod_is_deleted_and_never_counts(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    attack: str,
    image: str | None,
    reason: str,
) -> None:
    prefix = nw = f"trust-{'img' if image else 'rep'}-{unique}"
    async with fleet_of(cluster, prefix, 1) as [node], PodLog(kube, nw) as pods:
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw, fleet_prefix=prefix, packages={"tool": package(duration=f"{STAGE_SECONDS}s")}
            ),
        )
        ours = await sealed_apply_pod(kube, nw)
        genuine = tuple(c["image"] for c in ours["spec"]["initContainers"])
        forged_uids: set[str] = set()
        for _ in range(3):
            forged = await replace_with(kube, nw, ours, image=image, fast=image is not None)
            forged_uid, forged_name = forged["metadata"]["uid"], forged["metadata"]["name"]
            forged_uids.add(forged_uid)
            assert forged["metadata"]["annotations"][SIGNATURE] == ours["metadata"]["annotations"][SIGNATURE]

            took = await wait_gone(kube, forged_name, forged_uid, within=30)
            if sum((await untrusted_counts(operator)).values()) >= 1:
                break
            # Gone, but not deleted by the operator: it counts an untrusted pod before it deletes it.
            # kwok deletes pods by name, without a uid precondition, and a deletion it still had queued
            # for the pod we replaced can remove the forged pod that took the name (seen once in CI:
            # the forged pod gone 0.0 s after its creation, nothing in the operator's log). Forge again.
            print(f"[trust] {attack}: the forged pod was removed by the simulator; forging again")
            ours = await sealed_apply_pod(kube, nw, not_uid=forged_uid)
        else:
            raise AssertionError("three forged pods in a row were removed by another than the operator")
        print(f"[trust] {attack}: untrusted pod deleted {took:.1f}s after its creation")
        node_obj = await kube.get(f"/api/v1/nodes/{node}")
        state = decode(node_obj["metadata"]["annotations"][f"nodewright.io/state.{nw}"])
        entry = state.entry("tool", "1.0.0")
        assert entry is not None and entry.stage == PackageStage.APPLY, f"the forged pod counted: {state}"

        async def reported() -> dict[str, str] | None:
            events = await untrusted_events(kube, forged_name)
            return events if set(events) == {"Node", "NodeWright"} else None

        # Events are best effort, on their own write budget behind whatever this operator reports at
        # start: seen once 20 s late on a loaded CI machine. What the test guards is that they come.
        events = await fleet.wait_for(reported, within=60, what="UntrustedPackagePod events")
        assert events == {"Node": node, "NodeWright": nw}
        assert (await untrusted_counts(operator))[reason] >= 1

        [done] = await wait_statuses(kube, prefix, nw, "complete", within=120)
        # Only the operator's own pods ran the stages: the package completed only after an install pod
        # (apply, then config) with the genuine images, created after the forged one, had time to run
        # both its stages; no pod of another stage was needed.
        forged_at = pods.pods[forged_uid][2]
        successors = [
            (uid, at)
            for uid, imgs, at in pods.created("apply")
            if uid not in forged_uids and _ts(at) >= _ts(forged_at) and imgs == genuine
        ]
        assert successors, pods.pods
        assert pods.created("config") == [], pods.pods
        complete = decode(done["metadata"]["annotations"][f"nodewright.io/state.{nw}"]).entry("tool", "1.0.0")
        assert complete is not None and complete.updated, complete
        assert _ts(complete.updated) >= _ts(successors[0][1]) + 2 * STAGE_SECONDS - 2, (pods.pods, complete)
        # Every pod not forged here ran the genuine images (a forged pod the simulator removed before the
        # operator saw it is in the log too, and is not one of the operator's).
        foreign = [i for uid, i, _ in pods.created("apply") if uid not in forged_uids and i != genuine]
        assert foreign == [], pods.pods
        await delete_nodewright(kube, nw)


async def test_a_signature_copied_to_another_node_is_deleted_there(
    cluster: ControlPlane, operator: OperatorProcess, kube: KubeClient, unique: str
) -> None:
    prefix = nw = f"trust-node-{unique}"
    async with fleet_of(cluster, prefix, 2) as [selected, other]:
        manifest = nodewright_manifest(
            nw, fleet_prefix=prefix, packages={"tool": package(duration=f"{STAGE_SECONDS}s")}
        )
        manifest["spec"]["nodeSelectors"]["matchLabels"][fleet.INDEX_LABEL] = "0"
        await create_nodewright(kube, manifest)
        ours = await sealed_apply_pod(kube, nw)
        assert ours["spec"]["nodeName"] == selected
        copied = forged_copy(ours, image=None, stage_duration="0s")
        copied["metadata"]["name"] = f"{nw}-copied"
        copied["spec"]["nodeName"] = other
        created = await kube.create(PODS, copied)
        await wait_gone(kube, copied["metadata"]["name"], created["metadata"]["uid"], within=30)

        async def reported() -> dict[str, str] | None:
            events = await untrusted_events(kube, copied["metadata"]["name"])
            return events if set(events) == {"Node", "NodeWright"} else None

        assert await fleet.wait_for(reported, within=60, what="events") == {"Node": other, "NodeWright": nw}
        assert (await untrusted_counts(operator))["identity_mismatch"] >= 1
        other_node = await kube.get(f"/api/v1/nodes/{other}")
        assert f"nodewright.io/state.{nw}" not in (other_node["metadata"].get("annotations") or {})
        await wait_statuses(kube, prefix, nw, "complete", within=120, count=1)
        await delete_nodewright(kube, nw)


async def test_the_api_server_keeps_the_digest_of_our_pods(kube: KubeClient, unique: str) -> None:
    nw = NodeWright.model_validate(
        {
            "apiVersion": "nodewright.io/v1alpha1",
            "kind": "NodeWright",
            "metadata": {
                "name": f"digest-{unique}",
                "uid": "00000000-0000-0000-0000-000000000001",
                "generation": 2,
            },
            "spec": {
                "nodeSelectors": {"matchLabels": {"x": "y"}},
                "additionalTolerations": [
                    {"key": "gpu", "operator": "Equal", "value": "a", "effect": "NoSchedule"}
                ],
                "packages": {
                    "tool": {
                        "version": "1.2.3",
                        "image": "ghcr.io/example/tool",
                        "configMap": {"a.conf": "1"},
                        "gracefulShutdown": "45s",
                        "resources": {
                            "cpuRequest": "500m",
                            "cpuLimit": "1",
                            "memoryRequest": "64Mi",
                            "memoryLimit": "1024Mi",
                        },
                        "env": [
                            {"name": "A", "value": ""},
                            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        ],
                    }
                },
            },
        }
    )
    options = podspec.PodOptions(
        namespace=NAMESPACE, agent_image=AGENT_IMAGE, pause_image=PAUSE_IMAGE, node_metadata_configmap=True
    )
    pkg = nw.spec.packages["tool"]
    reboot = Interrupt.model_validate({"type": "reboot"})
    built = [
        podspec.build_pod(
            nw,
            pkg,
            package_name="tool",
            version="1.2.3",
            stage=stage,
            node=f"nowhere-{unique}",
            attempt=1,
            node_order=0,
            options=options,
            interrupt=reboot if stage == PackageStage.INTERRUPT else None,
        )
        for stage in (PackageStage.APPLY, PackageStage.INTERRUPT)
    ]
    for manifest in built:
        manifest["metadata"].pop("ownerReferences")  # no such NodeWright: the garbage collector would act
        manifest["metadata"]["labels"]["nodewright.io/managed-by"] = f"digest-probe-{unique}"  # not ours
        stored = await kube.create(PODS, manifest)
        try:
            assert stored["spec"] != manifest["spec"], "kube-apiserver fills in defaults"
            assert podspec.run_spec_changes(manifest, stored) == []
            assert podspec.run_digest(stored) == podspec.run_digest(manifest)
            # The operator's binding (uid precondition, seal annotation) places it: still the same digest.
            await kube.create(
                f"{PODS}/{manifest['metadata']['name']}/binding",
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {
                        "name": manifest["metadata"]["name"],
                        "uid": stored["metadata"]["uid"],
                        "annotations": {"nodewright.io/seal": "probe"},
                    },
                    "target": {"apiVersion": "v1", "kind": "Node", "name": f"nowhere-{unique}"},
                },
            )
            bound = await kube.get(f"{PODS}/{manifest['metadata']['name']}")
            assert bound["spec"]["nodeName"] == f"nowhere-{unique}"
            assert bound["metadata"]["annotations"]["nodewright.io/seal"] == "probe"
            assert podspec.run_digest(bound) == podspec.run_digest(manifest)
        finally:
            await kube.delete(f"{PODS}/{manifest['metadata']['name']}", body={"gracePeriodSeconds": 0})
    # A drift-check pod is created bound, with a deadline (activeDeadlineSeconds) that its signature binds.
    check = podspec.build_drift_check_pod(
        nw, [("tool", pkg, "1.2.3")], node=f"nowhere-{unique}", slot=1, options=options, basis="b/boot"
    )
    check["metadata"].pop("ownerReferences")
    check["metadata"]["labels"]["nodewright.io/managed-by"] = f"digest-probe-{unique}"
    stored = await kube.create(PODS, check)
    try:
        assert stored["spec"]["activeDeadlineSeconds"] == check["spec"]["activeDeadlineSeconds"] == 1800
        assert podspec.run_spec_changes(check, stored) == []
        assert podspec.run_digest(stored) == podspec.run_digest(check)
    finally:
        await kube.delete(f"{PODS}/{check['metadata']['name']}", body={"gracePeriodSeconds": 0})
