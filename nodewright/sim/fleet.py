"""The simulated GPU fleet: kwok-managed Nodes that look like real GPU nodes, and "training job" workloads.

Nodes carry the annotation `kwok.x-k8s.io/node: fake` (so kwok manages their pods) and are created with a
complete status, as a kubelet registers itself: Ready condition, addresses, capacity/allocatable
including `nvidia.com/gpu`, and `status.nodeInfo` with a random bootID. kube-apiserver keeps the status
sent on create, so one POST per node is the whole cost (kwok's node stage only touches nodes without a
Ready condition). Labels follow what GPU Feature Discovery and Node Feature Discovery publish
(~60 per node), plus topology (zone from the index: zone-a/b/c round-robin), a node pool and a rack.
Every node also gets a per-node `spec.podCIDR`, which kwok uses for pod IPs (no shared pool to exhaust).

No `kwok.x-k8s.io/node=fake:NoSchedule` taint is added by default: real GPU nodes do not have it, pods
bound by `spec.nodeName` ignore NoSchedule anyway, and an unexpected taint would skew any logic in the
operator that compares node taints with package tolerations. Pass `taint=True` to add it.

`real_packages=K` labels the first K nodes created `sim.nodewright.io/real-packages=true`: kwok leaves those
nodes and their pods alone and the simulated kubelet (`nodewright.sim.kubelet`) runs their pods for real.

Workloads are bare pods bound by `nodeName` owned by a StatefulSet that no controller reconciles
(kube-controller-manager never runs the statefulset controller; with real nodes it runs the replicaset
controller for the chart's Deployments, so a ReplicaSet owner would re-create evicted pods). The owner is
what makes every PodDisruptionBudget form work: the disruption controller resolves a pod's controllerRef
to find the expected pod count for `maxUnavailable` and percentage `minAvailable`; with bare pods only an
integer `minAvailable` works (the others fail safe to zero disruptions allowed). kwok runs the pods:
Running and Ready at once, then Succeeded after `sim.nodewright.io/run-for` / at
`sim.nodewright.io/finish-at`, or Failed with `sim.nodewright.io/result: fail`; without them they run
forever. See docs/simulator.md.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodewright.sim.kubeapi import JSON, ApiError, KubeClient
from nodewright.sim.kubelet_spec import REAL_PACKAGES_LABEL

FLEET_LABEL = "sim.nodewright.io/fleet"
INDEX_LABEL = "sim.nodewright.io/index"
POOL_LABEL = "sim.nodewright.io/node-pool"
RACK_LABEL = "sim.nodewright.io/rack"
ZONES = ("zone-a", "zone-b", "zone-c")
REGION = "sim-region-1"
NODES_PER_RACK = 8
DEFAULT_CONCURRENCY = 48
# The training jobs' owner: a StatefulSet, because no StatefulSet controller runs in the simulator, even
# with real nodes (whose chart needs the ReplicaSet controller, which would re-create evicted pods).
OWNER_KIND = "StatefulSet"
OWNER_PLURAL = "statefulsets"

WORKLOAD_APP_LABEL = "app"
WORKLOAD_APP_VALUE = "training"
WORKLOAD_JOB_LABEL = "sim.nodewright.io/job"
PROTECTED_LABEL = "sim.nodewright.io/protected"
RUN_FOR_ANNOTATION = "sim.nodewright.io/run-for"
FINISH_AT_ANNOTATION = "sim.nodewright.io/finish-at"
RESULT_ANNOTATION = "sim.nodewright.io/result"


@dataclass(frozen=True)
class GpuProfile:
    """What a GPU node model looks like to GFD/NFD and the kubelet."""

    name: str
    product: str
    family: str
    gpu_count: int
    gpu_memory_mib: int
    compute: tuple[int, int]
    driver: tuple[int, int, int]
    cuda: tuple[int, int]
    machine: str
    instance_type: str
    cpu: int
    memory: str
    kernel: tuple[int, int, int, str]
    os_version: str
    os_image: str
    containerd: str = "1.7.24"


PROFILES: dict[str, GpuProfile] = {
    "h100": GpuProfile(
        name="h100",
        product="NVIDIA-H100-80GB-HBM3",
        family="hopper",
        gpu_count=8,
        gpu_memory_mib=81559,
        compute=(9, 0),
        driver=(550, 127, 8),
        cuda=(12, 4),
        machine="DGX-H100",
        instance_type="gpu-8x-h100-80gb",
        cpu=224,
        memory="2063937Mi",
        kernel=(5, 15, 0, "1063-nvidia"),
        os_version="22.04",
        os_image="Ubuntu 22.04.4 LTS",
    ),
    "b200": GpuProfile(
        name="b200",
        product="NVIDIA-B200",
        family="blackwell",
        gpu_count=8,
        gpu_memory_mib=183359,
        compute=(10, 0),
        driver=(570, 124, 6),
        cuda=(12, 8),
        machine="DGX-B200",
        instance_type="gpu-8x-b200-180gb",
        cpu=224,
        memory="4127874Mi",
        kernel=(6, 8, 0, "1015-nvidia"),
        os_version="24.04",
        os_image="Ubuntu 24.04.1 LTS",
        containerd="2.0.2",
    ),
}
PROFILE_CHOICES = ("h100", "b200", "mixed")


def profile_for(profile: str, index: int) -> GpuProfile:
    """The model of node `index`: `mixed` makes every fourth node a B200, the rest H100 (deterministic)."""
    if profile == "mixed":
        return PROFILES["b200"] if index % 4 == 3 else PROFILES["h100"]
    try:
        return PROFILES[profile]
    except KeyError:
        raise ValueError(
            f"unknown profile {profile!r}; expected one of {', '.join(PROFILE_CHOICES)}"
        ) from None


def zone_for(index: int) -> str:
    return ZONES[index % len(ZONES)]


def node_name(name_prefix: str, index: int) -> str:
    return f"{name_prefix}-{index:05d}"


def node_labels(name: str, index: int, *, profile: str, fleet: str) -> dict[str, str]:
    """The labels of the fleet's node `index` (GFD, NFD, topology), e.g. for a real node joining the fleet."""
    return _labels(name, index, profile_for(profile, index), fleet)


def _labels(name: str, index: int, p: GpuProfile, fleet: str) -> dict[str, str]:
    kmaj, kmin, krev, kextra = p.kernel
    dmaj, dmin, drev = p.driver
    os_major, os_minor = p.os_version.split(".")
    gfd = "nvidia.com/"
    nfd = "feature.node.kubernetes.io/"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": p.instance_type,
        "topology.kubernetes.io/zone": zone_for(index),
        "topology.kubernetes.io/region": REGION,
        "type": "kwok",
        FLEET_LABEL: fleet,
        INDEX_LABEL: str(index),
        POOL_LABEL: f"{p.name}-pool",
        RACK_LABEL: f"rack-{index // NODES_PER_RACK:04d}",
        gfd + "gpu.present": "true",
        gfd + "gpu.product": p.product,
        gfd + "gpu.count": str(p.gpu_count),
        gfd + "gpu.memory": str(p.gpu_memory_mib),
        gfd + "gpu.family": p.family,
        gfd + "gpu.machine": p.machine,
        gfd + "gpu.compute.major": str(p.compute[0]),
        gfd + "gpu.compute.minor": str(p.compute[1]),
        gfd + "gpu.replicas": "1",
        gfd + "gpu.sharing-strategy": "none",
        gfd + "gpu.mode": "compute",
        gfd + "mig.capable": "true",
        gfd + "mig.strategy": "single",
        gfd + "mps.capable": "false",
        gfd + "cuda.driver.major": str(dmaj),
        gfd + "cuda.driver.minor": str(dmin),
        gfd + "cuda.driver.rev": f"{drev:02d}",
        gfd + "cuda.driver-version.full": f"{dmaj}.{dmin}.{drev:02d}",
        gfd + "cuda.driver-version.major": str(dmaj),
        gfd + "cuda.driver-version.minor": str(dmin),
        gfd + "cuda.driver-version.revision": f"{drev:02d}",
        gfd + "cuda.runtime.major": str(p.cuda[0]),
        gfd + "cuda.runtime.minor": str(p.cuda[1]),
        gfd + "cuda.runtime-version.full": f"{p.cuda[0]}.{p.cuda[1]}",
        gfd + "cuda.runtime-version.major": str(p.cuda[0]),
        gfd + "cuda.runtime-version.minor": str(p.cuda[1]),
        gfd + "gfd.timestamp": "1732838400",
        gfd + "gpu.deploy.container-toolkit": "true",
        gfd + "gpu.deploy.dcgm": "true",
        gfd + "gpu.deploy.dcgm-exporter": "true",
        gfd + "gpu.deploy.device-plugin": "true",
        gfd + "gpu.deploy.driver": "pre-installed",
        gfd + "gpu.deploy.gpu-feature-discovery": "true",
        gfd + "gpu.deploy.node-status-exporter": "true",
        gfd + "gpu.deploy.operator-validator": "true",
        nfd + "kernel-version.full": f"{kmaj}.{kmin}.{krev}-{kextra}",
        nfd + "kernel-version.major": str(kmaj),
        nfd + "kernel-version.minor": str(kmin),
        nfd + "kernel-version.revision": str(krev),
        nfd + "system-os_release.ID": "ubuntu",
        nfd + "system-os_release.VERSION_ID": p.os_version,
        nfd + "system-os_release.VERSION_ID.major": os_major,
        nfd + "system-os_release.VERSION_ID.minor": os_minor,
        nfd + "cpu-model.vendor_id": "Intel",
        nfd + "cpu-model.family": "6",
        nfd + "cpu-model.id": "143",
        nfd + "cpu-cpuid.AVX512F": "true",
        nfd + "cpu-cpuid.AMXBF16": "true",
        nfd + "cpu-hardware_multithreading": "true",
        nfd + "pci-10de.present": "true",
        nfd + "pci-15b3.present": "true",
        nfd + "rdma.capable": "true",
        nfd + "rdma.available": "true",
        nfd + "storage-nonrotationaldisk": "true",
        nfd + "memory-numa": "true",
        nfd + "network-sriov.capable": "true",
    }
    return labels


def node_manifest(
    index: int,
    *,
    profile: str = "h100",
    name_prefix: str = "gpu-node",
    labels_extra: Mapping[str, str] | None = None,
    annotations_extra: Mapping[str, str] | None = None,
    taint: bool = False,
    real_packages: bool = False,
) -> JSON:
    """The Node object (with status) for fleet member `index`; deterministic except bootID.
    `real_packages`: the simulated kubelet runs this node's pods for real (kwok does not play them)."""
    p = profile_for(profile, index)
    name = node_name(name_prefix, index)
    labels = _labels(name, index, p, name_prefix)
    labels.update(labels_extra or {})
    if real_packages:
        labels[REAL_PACKAGES_LABEL] = "true"
    # 172.16.0.0/12 holds a million node addresses; 10.64.0.0/10 a /24 pod range for 16k nodes.
    internal_ip = str(ipaddress.IPv4Address("172.16.0.10") + index)
    pod_cidr = f"{ipaddress.IPv4Address('10.64.0.0') + index * 256}/24"
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    resources = {
        "cpu": str(p.cpu),
        "memory": p.memory,
        "ephemeral-storage": "3750Gi",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "pods": "110",
        "nvidia.com/gpu": str(p.gpu_count),
    }
    allocatable = dict(resources, cpu=str(p.cpu - 4), memory=f"{int(p.memory[:-2]) - 16384}Mi")
    conditions = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    kmaj, kmin, krev, kextra = p.kernel
    spec: JSON = {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]}
    if taint:
        spec["taints"] = [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
                **(annotations_extra or {}),
            },
        },
        "spec": spec,
        "status": {
            "capacity": resources,
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "reason": r,
                    "message": m,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
                for t, s, r, m in conditions
            ],
            "addresses": [
                {"type": "InternalIP", "address": internal_ip},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": str(uuid.uuid4()),
                "containerRuntimeVersion": f"containerd://{p.containerd}",
                "kernelVersion": f"{kmaj}.{kmin}.{krev}-{kextra}",
                "kubeProxyVersion": "",
                "kubeletVersion": "v1.36.3",
                "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, f"machine.{name}").hex,
                "operatingSystem": "linux",
                "osImage": p.os_image,
                "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"system.{name}")).upper(),
            },
        },
    }


async def _bounded(coros: Iterable[Any], concurrency: int) -> list[Any]:
    """Run awaitables with at most `concurrency` in flight; results in input order."""
    sem = asyncio.Semaphore(concurrency)

    async def one(coro: Any) -> Any:
        async with sem:
            return await coro

    return list(await asyncio.gather(*(one(c) for c in coros)))


async def create_nodes(
    kubeconfig: Path,
    *,
    count: int,
    profile: str = "h100",
    name_prefix: str = "gpu-node",
    labels_extra: Mapping[str, str] | None = None,
    annotations_extra: Mapping[str, str] | None = None,
    start_index: int = 0,
    taint: bool = False,
    real_packages: int = 0,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> list[str]:
    """Create `count` GPU nodes `<prefix>-<index:05d>` (index from `start_index`); returns their names.
    The first `real_packages` of them have their pods run for real by the simulated kubelet.

    Existing nodes of the same name are left as they are (409 is not an error), so a partly created
    fleet can be completed by calling again.
    """
    if not 0 <= real_packages <= count:
        raise ValueError(f"real_packages must be between 0 and count ({count}), got {real_packages}")
    manifests = [
        node_manifest(
            i,
            profile=profile,
            name_prefix=name_prefix,
            labels_extra=labels_extra,
            annotations_extra=annotations_extra,
            taint=taint,
            real_packages=i - start_index < real_packages,
        )
        for i in range(start_index, start_index + count)
    ]
    async with KubeClient(kubeconfig, max_in_flight=concurrency) as client:
        await _bounded((client.create_or_exists("/api/v1/nodes", m) for m in manifests), concurrency)
    return [m["metadata"]["name"] for m in manifests]


async def delete_nodes(
    kubeconfig: Path,
    *,
    names: Sequence[str] | None = None,
    name_prefix: str | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> int:
    """Delete the named nodes, or every node of the fleet `name_prefix`; returns how many were deleted."""
    async with KubeClient(kubeconfig, max_in_flight=concurrency) as client:
        if names is None:
            if name_prefix is None:
                raise ValueError("delete_nodes needs names or name_prefix")
            listed = await client.list_all(
                "/api/v1/nodes", params={"labelSelector": f"{FLEET_LABEL}={name_prefix}"}
            )
            names = [n["metadata"]["name"] for n in listed["items"]]
        await _bounded((client.delete(f"/api/v1/nodes/{n}") for n in names), concurrency)
    return len(names)


@dataclass
class TrainingJob:
    """What `create_workloads` made: the pods (one per listed node and slot), the owner and the PDB."""

    namespace: str
    name: str
    pods: list[str] = field(default_factory=list)
    pdb: str | None = None
    selector: dict[str, str] = field(default_factory=dict)


def _pdb_value(value: int | str) -> int | str:
    return value if isinstance(value, int) or not value.isdigit() else int(value)


async def create_workloads(
    kubeconfig: Path,
    *,
    nodes: Sequence[str],
    job: str = "train",
    namespace: str = "sim-workloads",
    pods_per_node: int = 1,
    gpus_per_pod: int = 8,
    run_for: str | None = None,
    finish_at: dt.datetime | str | None = None,
    result: str | None = None,
    protected: bool = False,
    protected_label: tuple[str, str] = (PROTECTED_LABEL, "true"),
    min_available: int | str | None = None,
    max_unavailable: int | str | None = None,
    labels_extra: Mapping[str, str] | None = None,
    annotations_extra: Mapping[str, str] | None = None,
    image: str = "nvcr.io/nvidia/pytorch:24.12-py3",
    concurrency: int = DEFAULT_CONCURRENCY,
) -> TrainingJob:
    """Create one "training job": pods bound to `nodes` (`<job>-<node>-<slot>`), optionally with a PDB.

    - `run_for` (Go duration, e.g. "30s") or `finish_at` (datetime or RFC3339): the pods Succeed then
      (or Fail with `result="fail"`); neither set: they run until deleted.
    - `protected`: adds the non-interrupt label (`protected_label`, default sim.nodewright.io/protected=true).
    - `min_available` / `max_unavailable`: a PodDisruptionBudget `<job>` selecting the job's pods.
    The namespace is created if missing. Pods are owned by an unreconciled StatefulSet `<job>` whose
    replicas equal the pod count (see the module docstring); deleting it garbage-collects the pods.
    """
    if min_available is not None and max_unavailable is not None:
        raise ValueError("a PodDisruptionBudget takes min_available or max_unavailable, not both")
    selector = {WORKLOAD_APP_LABEL: WORKLOAD_APP_VALUE, WORKLOAD_JOB_LABEL: job}
    labels = dict(selector)
    if protected:
        labels[protected_label[0]] = protected_label[1]
    labels.update(labels_extra or {})
    annotations: dict[str, str] = dict(annotations_extra or {})
    if run_for is not None:
        annotations[RUN_FOR_ANNOTATION] = run_for
    if finish_at is not None:
        annotations[FINISH_AT_ANNOTATION] = (
            finish_at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            if isinstance(finish_at, dt.datetime)
            else finish_at
        )
    if result is not None:
        annotations[RESULT_ANNOTATION] = result
    container = {
        "name": "trainer",
        "image": image,
        "command": ["torchrun", "train.py"],
        "resources": {"limits": {"nvidia.com/gpu": str(gpus_per_pod)}},
    }
    pod_names = [f"{job}-{n}-{slot}" for n in nodes for slot in range(pods_per_node)]
    out = TrainingJob(namespace=namespace, name=job, selector=selector)
    ns_base = f"/api/v1/namespaces/{namespace}"
    async with KubeClient(kubeconfig, max_in_flight=concurrency) as client:
        await client.create_or_exists("/api/v1/namespaces", {"metadata": {"name": namespace}})
        owner = await client.create(
            f"/apis/apps/v1/namespaces/{namespace}/{OWNER_PLURAL}",
            {
                "metadata": {
                    "name": job,
                    "labels": selector,
                    "annotations": {"sim.nodewright.io/unreconciled": "true"},
                },
                "spec": {
                    "replicas": len(pod_names),
                    "selector": {"matchLabels": selector},
                    "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
                },
            },
        )
        owner_ref = {
            "apiVersion": "apps/v1",
            "kind": OWNER_KIND,
            "name": job,
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        if min_available is not None or max_unavailable is not None:
            pdb_spec: JSON = {"selector": {"matchLabels": selector}}
            if min_available is not None:
                pdb_spec["minAvailable"] = _pdb_value(min_available)
            else:
                assert max_unavailable is not None
                pdb_spec["maxUnavailable"] = _pdb_value(max_unavailable)
            await client.create(
                f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
                {"metadata": {"name": job, "labels": selector}, "spec": pdb_spec},
            )
            out.pdb = job

        def pod(node: str, name: str) -> JSON:
            return {
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": annotations,
                    "ownerReferences": [owner_ref],
                },
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                },
            }

        await _bounded(
            (
                client.create(f"{ns_base}/pods", pod(n, f"{job}-{n}-{slot}"))
                for n in nodes
                for slot in range(pods_per_node)
            ),
            concurrency,
        )
    out.pods = pod_names
    return out


async def delete_workloads(kubeconfig: Path, job: TrainingJob) -> None:
    """Delete a job's PDB, owner and pods (pods explicitly: the garbage collector is asynchronous)."""
    base = f"/api/v1/namespaces/{job.namespace}"
    async with KubeClient(kubeconfig) as client:
        if job.pdb:
            await client.delete(f"/apis/policy/v1/namespaces/{job.namespace}/poddisruptionbudgets/{job.pdb}")
        await client.delete(f"/apis/apps/v1/namespaces/{job.namespace}/{OWNER_PLURAL}/{job.name}")
        await _bounded((client.delete(f"{base}/pods/{p}") for p in job.pods), DEFAULT_CONCURRENCY)


async def create_demo_workloads(kubeconfig: Path, nodes: Sequence[str]) -> list[TrainingJob]:
    """Workloads for `sim up --workloads`: one job per rack (8 nodes) on every other rack, running forever,
    each with a PDB `minAvailable: <pods - 1>`; every third job carries the non-interrupt label."""
    racks = [list(nodes[i : i + NODES_PER_RACK]) for i in range(0, len(nodes), NODES_PER_RACK)]
    jobs = [
        create_workloads(
            kubeconfig,
            nodes=rack,
            job=f"train-rack-{r:04d}",
            protected=(r // 2) % 3 == 0,
            min_available=max(0, len(rack) - 1),
            concurrency=8,
        )
        for r, rack in enumerate(racks)
        if r % 2 == 0
    ]
    # Several jobs at once (each with its own few connections): one job alone is latency-bound.
    return await _bounded(jobs, 8)


async def wait_for(
    predicate: Any,
    *,
    within: float,
    interval: float = 0.2,
    what: str = "condition",
) -> Any:
    """Poll an async predicate until it returns a truthy value (returned) or `within` seconds pass."""
    deadline = time.monotonic() + within
    last: Any = None
    while True:
        try:
            last = await predicate()
        except ApiError as err:
            last = err
        if last and not isinstance(last, ApiError):
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within}s waiting for {what} (last: {last!r})")
        await asyncio.sleep(interval)


def package_pod_manifest(
    *,
    name: str,
    node: str,
    package: str = "pkg",
    version: str = "1.0.0",
    stage: str = "apply",
    nodewright: str = "sim",
    attempt: int = 1,
    env: Mapping[str, str] | None = None,
    interrupt: Mapping[str, Any] | None = None,
    package_image: str = "registry.local/packages/pkg:1.0.0",
    agent_image: str = "registry.local/nodewright/agent:0.1.0",
    namespace: str = "nodewright-system",
    stages: Sequence[str] | None = None,
) -> JSON:
    """A pod shaped like the operator's package pods (labels, annotations, init containers, pause).

    For simulator tests and demos; the operator builds its own pods. `env` is what an admin puts in the
    package's `env` (e.g. NODEWRIGHT_SIM_* knobs); it lands on the agent init containers. `stages` are
    the stages the pod runs, each a `<package>-<stage>` and `<package>-<stage>check` container (default:
    `stage` alone; the operator's install pod runs `("apply", "config")`).
    """
    agent_env = [{"name": k, "value": v} for k, v in (env or {}).items()]
    agents = [
        {"name": f"{package}-{name}", "image": agent_image, "env": agent_env}
        for one in (stages or (stage,))
        for name in (one, f"{one}check")
    ]
    annotations = {"nodewright.io/attempt": str(attempt)}
    if interrupt is not None:
        annotations["nodewright.io/interrupt"] = json.dumps(dict(interrupt), separators=(",", ":"))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "nodewright.io/managed-by": "nodewright-operator",
                "nodewright.io/nodewright": nodewright,
                "nodewright.io/package": package,
                "nodewright.io/version": version,
                "nodewright.io/stage": stage,
                "nodewright.io/node": node,
            },
            "annotations": annotations,
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "initContainers": [{"name": f"{package}-init", "image": package_image}, *agents],
            "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
