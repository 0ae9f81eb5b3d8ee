"""The simulated kubelet on the real control plane: pods of opted-in nodes really run, kwok plays the rest.

Each test makes its own opted-in node (label `sim.nodewright.io/real-packages=true`) and, where needed, a
normal one; images come from the simulator's directory registry (`<cluster dir>/registry/`) or map to our
agent. The assertions read what a kubelet leaves behind: files in the node's host root, container states
and exit codes in the pod status, `kubectl logs` through the API server (kwok's kubelet server reading the
files the simulated kubelet registered), processes that are gone after a deletion.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e import operator_fixture
from e2e.operator_fixture import (
    OperatorProcess,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    nodewright_manifest,
    wait_statuses,
)
from nodewright.api import constants
from nodewright.api.models import EnvVar, NodeWright, NodeWrightSpec, ObjectMeta, Package
from nodewright.api.nodestate import PackageStage
from nodewright.hostroot import boot
from nodewright.plan.podspec import PodOptions, build_pod
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane, process_running
from nodewright.sim.kubeapi import JSON, ApiError, KubeClient
from nodewright.sim.rebooter import REBOOT_SECONDS_ANNOTATION

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

NS = "default"
FIXTURE_IMAGE = "registry.local/sim-test/fixture:1"
PAUSE = {"name": "pause", "image": "registry.k8s.io/pause:3.10"}
HOST_VOLUME = {"name": "host", "hostPath": {"path": "/"}}
HOST_MOUNT = {"name": "host", "mountPath": "/host"}


@dataclass
class Nodes:
    real: str
    normal: str
    root: Path  # the opted-in node's host root


@pytest.fixture
async def client(cluster: ControlPlane) -> AsyncIterator[KubeClient]:
    async with KubeClient(cluster.kubeconfig) as c:
        yield c


@pytest.fixture
async def nodes(cluster: ControlPlane, client: KubeClient, unique: str) -> AsyncIterator[Nodes]:
    (cluster.dir / "registry" / "fixture").mkdir(parents=True, exist_ok=True)
    prefix = f"kubelet-{unique}"
    real, normal = await fleet.create_nodes(
        cluster.kubeconfig,
        count=2,
        name_prefix=prefix,
        real_packages=1,
        annotations_extra={REBOOT_SECONDS_ANNOTATION: "0.5"},
    )
    root = cluster.dir / "roots" / real
    await fleet.wait_for(lambda: _exists(root / boot.BOOT_ID_PATH), within=20, what=f"{real} booted")
    yield Nodes(real=real, normal=normal, root=root)
    for node in (real, normal):
        listed = await client.list_all("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"})
        for pod in listed["items"]:
            meta = pod["metadata"]
            await client.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body={"gracePeriodSeconds": 0}
            )
    await fleet.delete_nodes(cluster.kubeconfig, names=[real, normal])


async def _exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


def shell(name: str, script: str, **extra: Any) -> JSON:
    """A container running `script` with /bin/sh (Kubernetes expands `$(VAR)` first: `$$$$` is the shell's
    `$$`)."""
    return {
        "name": name,
        "image": FIXTURE_IMAGE,
        "command": ["/bin/sh", "-c", script],
        "volumeMounts": [HOST_MOUNT],
        **extra,
    }


def manifest(name: str, node: str, init: list[JSON], *, namespace: str = NS, **spec: Any) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "volumes": [HOST_VOLUME],
            "initContainers": init,
            "containers": [PAUSE],
            **spec,
        },
    }


async def create(client: KubeClient, pod: JSON) -> str:
    namespace = pod["metadata"]["namespace"]
    await client.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    return f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}"


async def bind(client: KubeClient, path: str, node: str) -> None:
    """Bind an unbound pod to `node` as the operator does (POST pods/<name>/binding): the operator's
    package pods are created unscheduled and start only once it binds them (docs/trust.md)."""
    pod = await client.get(path)
    meta = pod["metadata"]
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    await client.create(f"{path}/binding", binding)


async def wait_pod(
    client: KubeClient, path: str, check: Callable[[JSON], bool], what: str, within: float = 30
) -> JSON:
    async def probe() -> JSON | None:
        pod = await client.get(path)
        return pod if check(pod) else None

    result: JSON = await fleet.wait_for(probe, within=within, what=f"{path} {what}")
    return result


def phase_is(*phases: str) -> Callable[[JSON], bool]:
    return lambda pod: (pod.get("status") or {}).get("phase") in phases


def init_states(pod: JSON) -> dict[str, JSON]:
    return {s["name"]: s["state"] for s in pod["status"]["initContainerStatuses"]}


def running(pod: JSON, container: str) -> bool:
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    return any(s["name"] == container and "running" in s["state"] for s in statuses)


def waiting_reason(pod: JSON, container: str) -> str | None:
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    for status in statuses:
        if status["name"] == container:
            return (status["state"].get("waiting") or {}).get("reason")
    return None


def conditions(pod: JSON) -> dict[str, str]:
    return {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}


async def gone(client: KubeClient, path: str) -> bool:
    try:
        await client.get(path)
    except ApiError as err:
        return err.status == 404
    return False


async def test_init_containers_run_in_order_against_the_node_root(
    cluster: ControlPlane, client: KubeClient, nodes: Nodes, unique: str
) -> None:
    out = "/host/etc/sim-kubelet/out"
    first = shell("first", f"echo one; mkdir -p /host/etc/sim-kubelet && echo first > {out}")
    second = shell(
        "second",
        f'cat {out}; echo "second on $NODE ($GREETING)" >> {out}; echo to-stderr >&2',
        env=[
            {"name": "GREETING", "value": "hi"},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
    )
    path = await create(client, manifest(f"order-{unique}", nodes.real, [first, second]))
    pod = await wait_pod(client, path, phase_is("Running", "Failed"), "finished its init containers")
    assert pod["status"]["phase"] == "Running", pod["status"]
    assert (nodes.root / "etc/sim-kubelet/out").read_text() == f"first\nsecond on {nodes.real} (hi)\n"
    for state in init_states(pod).values():
        assert state["terminated"]["exitCode"] == 0 and state["terminated"]["reason"] == "Completed"
    assert pod["status"]["containerStatuses"][0]["state"].get("running")
    assert conditions(pod) == dict.fromkeys(
        ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"), "True"
    )
    assert pod["status"]["hostIP"] == "172.16.0.10" or pod["status"]["hostIP"].startswith("172.16.")
    assert pod["status"]["startTime"]
    logs = cluster.kubectl("logs", "-n", NS, f"order-{unique}", "-c", "second")
    assert logs.stdout.splitlines() == ["first", "to-stderr"]
    assert cluster.kubectl("logs", "-n", NS, f"order-{unique}", "-c", "first").stdout == "one\n"


async def test_a_failing_init_container_fails_the_pod_with_its_exit_code(
    cluster: ControlPlane, client: KubeClient, nodes: Nodes, unique: str
) -> None:
    init = [
        shell("ok", "true"),
        shell("breaks", "echo about to fail; exit 7"),
        shell("never", "touch /host/never-ran"),
    ]
    path = await create(client, manifest(f"fail-{unique}", nodes.real, init))
    pod = await wait_pod(client, path, phase_is("Failed", "Running"), "finished")
    assert pod["status"]["phase"] == "Failed"
    states = init_states(pod)
    assert states["ok"]["terminated"]["exitCode"] == 0
    assert (
        states["breaks"]["terminated"]["exitCode"] == 7
        and states["breaks"]["terminated"]["reason"] == "Error"
    )
    assert states["never"] == {"waiting": {"reason": "PodInitializing"}}
    assert not (nodes.root / "never-ran").exists()
    assert conditions(pod)["Initialized"] == "False"
    assert cluster.kubectl("logs", "-n", NS, f"fail-{unique}", "-c", "breaks").stdout == "about to fail\n"


async def test_an_unknown_image_is_a_pull_error_and_kwok_does_not_step_in(
    client: KubeClient, nodes: Nodes, unique: str
) -> None:
    pulled = {"name": "pull", "image": "registry.local/sim-test/not-there:1", "command": ["true"]}
    path = await create(client, manifest(f"pull-{unique}", nodes.real, [pulled]))
    pod = await wait_pod(
        client, path, lambda p: waiting_reason(p, "pull") == "ErrImagePull", "reported the pull"
    )
    waiting = init_states(pod)["pull"]["waiting"]
    assert waiting["reason"] == "ErrImagePull" and "not in the simulator's registries" in waiting["message"]
    pod = await wait_pod(
        client, path, lambda p: waiting_reason(p, "pull") == "ImagePullBackOff", "backed off"
    )
    assert pod["status"]["phase"] == "Pending"  # a kwok stage would have made it Running at once


async def test_deleting_a_running_pod_stops_its_process(
    client: KubeClient, nodes: Nodes, unique: str
) -> None:
    graceful = shell(
        "serve",
        "trap 'echo stopped > /host/tmp/graceful.term; exit 0' TERM; echo $$$$ > /host/tmp/graceful.pid; "
        "while true; do sleep 0.1; done",
    )
    stubborn = shell(
        "serve", "trap '' TERM; echo $$$$ > /host/tmp/stubborn.pid; while true; do sleep 0.1; done"
    )
    (nodes.root / "tmp").mkdir(exist_ok=True)
    paths = {
        "graceful": await create(client, manifest(f"graceful-{unique}", nodes.real, [graceful])),
        "stubborn": await create(
            client, manifest(f"stubborn-{unique}", nodes.real, [stubborn], terminationGracePeriodSeconds=1)
        ),
    }
    pids = {}
    for which, path in paths.items():
        pidfile = nodes.root / "tmp" / f"{which}.pid"
        await fleet.wait_for(lambda f=pidfile: _exists(f), within=20, what=f"{which} started")
        pod = await wait_pod(client, path, lambda p: running(p, "serve"), "running")
        assert pod["status"]["phase"] == "Pending"
        pids[which] = int(pidfile.read_text())
        assert process_running(pids[which])
    for path in paths.values():
        await client.delete(path)
    for which, path in paths.items():
        await fleet.wait_for(lambda p=path: gone(client, p), within=20, what=f"{which} pod deleted")
        assert not process_running(pids[which]), f"{which}: pid {pids[which]} still runs"
    assert (nodes.root / "tmp" / "graceful.term").read_text() == "stopped\n"  # SIGTERM first
    assert not (nodes.root / "tmp" / "stubborn.term").exists()


async def test_a_container_takes_what_it_left_running_and_deadlines_stop_pods(
    client: KubeClient, nodes: Nodes, unique: str
) -> None:
    (nodes.root / "tmp").mkdir(exist_ok=True)
    daemon = shell("daemon", "setsid sleep 300 & echo $$! > /host/tmp/daemon.pid")
    path = await create(client, manifest(f"daemon-{unique}", nodes.real, [daemon]))
    await wait_pod(client, path, phase_is("Running"), "done")
    leftover = int((nodes.root / "tmp/daemon.pid").read_text())
    await fleet.wait_for(lambda: _not_running(leftover), within=10, what="the leftover process killed")
    slow = await create(
        client,
        manifest(f"deadline-{unique}", nodes.real, [shell("slow", "sleep 300")], activeDeadlineSeconds=2),
    )
    pod = await wait_pod(client, slow, phase_is("Failed"), "stopped at its deadline", within=30)
    assert pod["status"]["reason"] == "DeadlineExceeded"
    terminated = init_states(pod)["slow"]["terminated"]
    assert terminated["exitCode"] == 143 and "activeDeadlineSeconds" in terminated["message"]


async def _not_running(pid: int) -> bool:
    return not process_running(pid)


async def test_a_pod_on_a_normal_node_is_still_played_by_kwok(
    cluster: ControlPlane, client: KubeClient, nodes: Nodes, unique: str
) -> None:
    marker = f"/host/kwok-{unique}"
    path = await create(
        client, manifest(f"kwok-{unique}", nodes.normal, [shell("would-write", f"touch {marker}")])
    )
    pod = await wait_pod(client, path, phase_is("Running"), "played by kwok", within=20)
    assert init_states(pod)["would-write"]["terminated"]["exitCode"] == 0
    assert not (cluster.dir / "roots" / nodes.normal).exists()  # nothing ran for it
    package = fleet.package_pod_manifest(name=f"pkg-{unique}", node=nodes.normal, namespace=cluster.namespace)
    package_path = await create(client, package)
    played = await wait_pod(client, package_path, phase_is("Running"), "played by kwok's package stages")
    assert all(s["terminated"]["exitCode"] == 0 for s in init_states(played).values())


async def test_simulated_workloads_on_a_real_node_are_played_as_kwok_plays_them(
    cluster: ControlPlane, client: KubeClient, nodes: Nodes, unique: str
) -> None:
    """Training jobs of the simulator on an opted-in node: Running at once, then Succeeded at their end
    (so a protected job finishes and a drain can go on), not run as images nobody has."""
    job = await fleet.create_workloads(
        cluster.kubeconfig, nodes=[nodes.real], job=f"train-{unique}", run_for="3s", protected=True
    )
    [name] = job.pods
    path = f"/api/v1/namespaces/{job.namespace}/pods/{name}"
    running = await wait_pod(client, path, phase_is("Running"), "the workload running", within=20)
    assert all(c["ready"] for c in running["status"]["containerStatuses"])
    done = await wait_pod(client, path, phase_is("Succeeded"), "the workload finished", within=30)
    assert all(c["state"]["terminated"]["exitCode"] == 0 for c in done["status"]["containerStatuses"])


async def test_a_kubelet_restart_resumes_and_reports_lost_processes(
    cluster: ControlPlane, client: KubeClient, nodes: Nodes, unique: str
) -> None:
    runs = "/host/tmp/done.runs"
    (nodes.root / "tmp").mkdir(exist_ok=True)
    done = await create(
        client, manifest(f"done-{unique}", nodes.real, [shell("once", f"echo run >> {runs}")])
    )
    failed = await create(client, manifest(f"failed-{unique}", nodes.real, [shell("fails", "exit 3")]))
    busy = await create(
        client,
        manifest(f"busy-{unique}", nodes.real, [shell("long", "echo $$$$ > /host/tmp/long.pid; sleep 60")]),
    )
    await wait_pod(client, done, phase_is("Running"), "done")
    await wait_pod(client, failed, phase_is("Failed"), "failed")
    await wait_pod(client, busy, lambda p: running(p, "long"), "busy")
    await fleet.wait_for(lambda: _exists(nodes.root / "tmp/long.pid"), within=10, what="long started")
    long_pid = int((nodes.root / "tmp/long.pid").read_text())
    await asyncio.to_thread(cluster.kill_component, "kubelet")
    assert not process_running(long_pid)  # container processes die with the kubelet's process group
    await asyncio.to_thread(cluster.start_component, "kubelet")
    lost = await wait_pod(client, busy, phase_is("Failed"), "reported lost")
    terminated = init_states(lost)["long"]["terminated"]
    assert terminated["exitCode"] == 137 and terminated["reason"] == "ContainerStatusUnknown"
    assert "restarted" in terminated["message"]
    assert (await client.get(done))["status"]["phase"] == "Running"
    assert (await client.get(failed))["status"]["phase"] == "Failed"
    assert (nodes.root / "tmp/done.runs").read_text() == "run\n"  # not run again
    await client.delete(done)  # the restarted kubelet still owns the pods it adopted
    await fleet.wait_for(lambda: gone(client, done), within=20, what="done deleted")


def interrupt_pod(name: str, node: str, namespace: str, container: JSON) -> JSON:
    pod = manifest(name, node, [container], namespace=namespace)
    pod["metadata"]["labels"] = {
        constants.POD_OWNER_LABEL: constants.POD_OWNER_VALUE,
        constants.POD_LABEL_STAGE: "interrupt",
        constants.POD_LABEL_NODE: node,
    }
    pod["metadata"]["annotations"] = {constants.POD_ANNOTATION_INTERRUPT: json.dumps({"type": "reboot"})}
    return pod


async def boot_id(client: KubeClient, node: str) -> str:
    return str((await client.get(f"/api/v1/nodes/{node}"))["status"]["nodeInfo"]["bootID"])


@pytest.mark.parametrize("how", ["reboot command", "agent interrupt"])
async def test_a_reboot_interrupt_goes_through_the_rebooter(
    cluster: ControlPlane, client: KubeClient, nodes: Nodes, unique: str, how: str
) -> None:
    before = await boot_id(client, nodes.real)
    if how == "reboot command":
        container = shell("interrupt", "echo going down; reboot; echo never reached")
    else:
        payload = base64.b64encode(json.dumps({"type": "node_restart"}).encode()).decode()
        container = {
            "name": "interrupt",
            "image": "ghcr.io/nvidia/skyhook/agent:6.4.1",
            "args": ["interrupt", "/root", "/var/lib/skyhook/sim/pkg-1.0.0-uid-1", payload],
            "env": [
                {"name": "SKYHOOK_ROOT_DIR", "value": "/var/lib/skyhook/sim"},
                {"name": "SKYHOOK_LOG_DIR", "value": "/var/log/skyhook/sim"},
                {"name": "SKYHOOK_RESOURCE_ID", "value": f"sim-uid-{unique}-1_pkg_1.0.0"},
            ],
            "volumeMounts": [{"name": "host", "mountPath": "/root"}],
        }
    path = await create(client, interrupt_pod(f"reboot-{unique}", nodes.real, cluster.namespace, container))
    pod = await wait_pod(client, path, phase_is("Running", "Failed"), "rebooted and finished", within=40)
    assert pod["status"]["phase"] == "Running", pod["status"]
    after = await boot_id(client, nodes.real)
    assert after != before
    node = await client.get(f"/api/v1/nodes/{nodes.real}")
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
    await fleet.wait_for(
        lambda: _boot_id_is(nodes.root, after), within=10, what="the host root booted with the new bootID"
    )
    if how == "agent interrupt":
        requested = (nodes.root / "var/lib/skyhook/sim/interrupts/requested.jsonl").read_text()
        assert json.loads(requested.splitlines()[-1])["command"] == ["reboot"]
    else:
        assert "reboot" in (nodes.root / "var/log/nodewright-sim/commands.log").read_text()


async def _boot_id_is(root: Path, expected: str) -> bool:
    return boot.recorded_boot_id(root) == expected


async def test_an_operator_package_pod_runs_the_agent_against_the_node_root(
    cluster: ControlPlane, client: KubeClient, nodes: Nodes, unique: str
) -> None:
    name = f"hello-{unique}-pkg"
    package_dir = cluster.dir / "registry" / name / "1.0.0"
    write_package(package_dir, name)
    package = Package(
        version="1.0.0",
        image=f"ghcr.io/example/{name}",
        env=[EnvVar(name="GREETING", value="hello")],
        config_map={"message.txt": "from the configmap"},
    )
    nw = NodeWright(
        metadata=ObjectMeta(name=f"nw-{unique}", uid=f"uid-{unique}", generation=1),
        spec=NodeWrightSpec(packages={name: package}),
    )
    options = PodOptions(namespace=NS, agent_image="ghcr.io/nvidia/skyhook/agent:6.4.1")
    pod = build_pod(
        nw, package, package_name=name, version="1.0.0", stage=PackageStage.APPLY, node=nodes.real,
        attempt=1, node_order=0, options=options,
    )  # fmt: skip
    configmap = pod["spec"]["volumes"][-1]["configMap"]["name"]
    await client.create(
        f"/api/v1/namespaces/{NS}/configmaps",
        {"metadata": {"name": configmap}, "data": {"message.txt": "from the configmap"}},
    )
    try:
        assert "nodeName" not in pod["spec"], "package pods are created unbound"
        # Its owner is a NodeWright this test never creates: kube-controller-manager's garbage
        # collector would delete the pod (an owner uid that does not exist) before it ran.
        pod["metadata"].pop("ownerReferences", None)
        path = await create(client, pod)
        await bind(client, path, nodes.real)
        done = await wait_pod(client, path, phase_is("Running", "Failed"), "ran the package", within=60)
        logs = {
            c["name"]: cluster.kubectl(
                "logs", "-n", NS, pod["metadata"]["name"], "-c", c["name"], check=False
            ).stdout
            for c in pod["spec"]["initContainers"]
        }
        assert done["status"]["phase"] == "Running", (done["status"], logs)
        written = nodes.root / "etc" / name / "greeting"
        assert written.read_text() == "hello from the configmap\n"
        history = json.loads((nodes.root / f"var/lib/skyhook/nw-{unique}/history/{name}.json").read_text())
        assert history["current-version"] == "1.0.0"
        assert "apply" in logs[f"{name}-apply"]
        # One pod per transition: the same pod went on to config (a mode this package has no steps for).
        assert [c["name"] for c in done["spec"]["initContainers"]][-2:] == [
            f"{name}-config",
            f"{name}-configcheck",
        ]
        assert all(
            (s.get("state") or {}).get("terminated", {}).get("exitCode") == 0
            for s in done["status"]["initContainerStatuses"]
        ), done["status"]
    finally:
        await client.delete(f"/api/v1/namespaces/{NS}/configmaps/{configmap}")


def write_package(directory: Path, name: str) -> None:
    """A package in the reference format whose apply step writes through NODEWRIGHT_HOST_ROOT."""
    steps = directory / "skyhook_dir"
    steps.mkdir(parents=True)
    target = f'"${{NODEWRIGHT_HOST_ROOT%/}}/etc/{name}/greeting"'
    (steps / "apply.sh").write_text(
        "#!/bin/sh\nset -eu\n"
        f'mkdir -p "${{NODEWRIGHT_HOST_ROOT%/}}/etc/{name}"\n'
        f'echo "$GREETING $(cat "$SKYHOOK_DIR/configmaps/message.txt")" > {target}\n'
    )
    (steps / "apply_check.sh").write_text(f"#!/bin/sh\nset -eu\ntest -s {target}\n")
    for script in steps.iterdir():
        os.chmod(script, 0o755)

    config = {
        "schema_version": "v1",
        "package_name": name,
        "package_version": "1.0.0",
        "expected_config_files": ["message.txt"],
        "modes": {
            "apply": [_step("apply", "apply.sh")],
            "apply-check": [_step("apply_check", "apply_check.sh")],
        },
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))


async def test_an_operator_rollout_with_a_reboot_runs_the_package_for_real(
    cluster: ControlPlane, operator: OperatorProcess, kube: KubeClient, unique: str
) -> None:
    """NodeWright -> operator -> package pods -> our agent -> the node roots, a reboot through the
    rebooter, a post-interrupt check that reads the value back from the rebooted node."""
    name = f"swap-{unique}-tune"
    write_sysctl_package(cluster.dir / "registry" / name, name)
    prefix = nw = f"real-{unique}"
    annotations = {REBOOT_SECONDS_ANNOTATION: "0.5"}
    async with fleet_of(cluster, prefix, 2, real_packages=2, annotations_extra=annotations) as names:
        boot_ids = {n: await boot_id(kube, n) for n in names}
        package = {
            "version": "1.0.0",
            "image": f"ghcr.io/example/{name}",
            "interrupt": {"type": "reboot"},
            "env": [{"name": "SWAPPINESS", "value": "17"}],
        }
        await create_nodewright(kube, nodewright_manifest(nw, fleet_prefix=prefix, packages={name: package}))
        await wait_statuses(kube, prefix, nw, "complete", within=180)
        for node in names:
            root = cluster.dir / "roots" / node
            assert (root / f"etc/sysctl.d/90-{name}.conf").read_text() == "vm.swappiness = 17\n"
            rebooted = await boot_id(kube, node)
            assert rebooted != boot_ids[node] and boot.recorded_boot_id(root) == rebooted
            assert (root / "proc/sys/vm/swappiness").read_text() == "17\n"  # loaded at boot
            history = json.loads((root / f"var/lib/skyhook/{nw}/history/{name}.json").read_text())
            assert history["current-version"] == "1.0.0"
        await delete_nodewright(kube, nw)


def write_sysctl_package(directory: Path, name: str) -> None:
    """apply persists a sysctl, apply-check reads the file, post-interrupt-check reads the running value
    (which only a boot loads), uninstall removes the file."""
    conf = f'"${{NODEWRIGHT_HOST_ROOT%/}}/etc/sysctl.d/90-{name}.conf"'
    scripts = {
        "apply.sh": (
            f'mkdir -p "${{NODEWRIGHT_HOST_ROOT%/}}/etc/sysctl.d"\n'
            f'echo "vm.swappiness = $SWAPPINESS" > {conf}\n'
        ),
        "apply_check.sh": f'grep -qx "vm.swappiness = $SWAPPINESS" {conf}\n',
        "post_interrupt.sh": "echo rebooted\n",
        "post_interrupt_check.sh": 'test "$(sysctl -n vm.swappiness)" = "$SWAPPINESS"\n',
        "uninstall.sh": f"rm -f {conf}\n",
        "uninstall_check.sh": f"test ! -e {conf}\n",
    }
    steps_dir = directory / "skyhook_dir"
    steps_dir.mkdir(parents=True)
    for script, body in scripts.items():
        (steps_dir / script).write_text("#!/bin/sh\nset -eu\n" + body)
        os.chmod(steps_dir / script, 0o755)
    modes = {
        mode: [_step(script.removesuffix(".sh"), script)]
        for mode, script in (
            ("apply", "apply.sh"),
            ("apply-check", "apply_check.sh"),
            ("post-interrupt", "post_interrupt.sh"),
            ("post-interrupt-check", "post_interrupt_check.sh"),
            ("uninstall", "uninstall.sh"),
            ("uninstall-check", "uninstall_check.sh"),
        )
    }
    config = {
        "schema_version": "v1",
        "package_name": name,
        "package_version": "1.0.0",
        "expected_config_files": [],
        "modes": modes,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def _step(name: str, script: str) -> JSON:
    """A step with every field the reference schema requires."""
    return {
        "name": name,
        "path": script,
        "arguments": [],
        "returncodes": [0],
        "on_host": True,
        "idempotence": False,
        "upgrade_step": False,
        "env": {},
    }
