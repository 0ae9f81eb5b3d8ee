"""The simulated kubelet's pure parts: image mapping, environment, volumes and path mapping, container
states, phase and next steps, resuming from a reported status; and its host-side helpers (CRI logs,
process trees, the command stand-ins, the simulated boot, pulling OCI image layouts)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodewright.api.models import EnvVar, NodeWright, NodeWrightSpec, ObjectMeta, Package
from nodewright.api.nodestate import PackageStage
from nodewright.hostroot import boot, hostshims
from nodewright.packaging import layout, oci, scaffold
from nodewright.plan.podspec import PAYLOAD_DIR, PodOptions, build_pod
from nodewright.sim import binaries, controlplane, kubelet, kubelet_host, kubelet_spec
from nodewright.sim.kubelet_spec import (
    ContainerConfigError,
    ImageKind,
    ImageNotFound,
    Mount,
    PodFacts,
    container_env,
    container_mounts,
    expand,
    map_paths,
    parse_image,
    process_spec,
    resolve_image,
    volume_sources,
)
from nodewright.sim.kubelet_status import (
    ContainerRecord,
    Restart,
    Start,
    initial_records,
    next_actions,
    pod_phase,
    pod_status,
    records_from_status,
    restart_delay,
)

NOW = "2026-01-01T10:00:00Z"
LATER = "2026-01-01T10:00:05Z"
JSON = dict[str, Any]


def pod(
    *,
    init: int = 2,
    main: tuple[str, ...] = ("pause",),
    policy: str = "Never",
    status: JSON | None = None,
) -> JSON:
    spec: JSON = {
        "nodeName": "n1",
        "restartPolicy": policy,
        "initContainers": [{"name": f"init-{i}", "image": "registry.local/pkg:1"} for i in range(init)],
        "containers": [
            {"name": name, "image": "registry.k8s.io/pause:3.10" if name == "pause" else "reg/app:1"}
            for name in main
        ],
    }
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "x"}},
        "spec": spec,
        "status": status or {},
    }


def status_of(p: JSON, records: list[ContainerRecord], **kw: Any) -> JSON:
    return pod_status(
        p, records, now=kw.pop("now", NOW), start_time=NOW, host_ip="10.0.0.1", pod_ip="10.0.0.1", **kw
    )


def conditions(status: JSON) -> dict[str, JSON]:
    return {c["type"]: c for c in status["conditions"]}


# ----------------------------------------------------------------------------------------------------
# Images


@pytest.mark.parametrize(
    ("reference", "registry", "repository", "tag", "digest"),
    [
        ("ghcr.io/nvidia/skyhook/agent:6.4.1", "ghcr.io", "nvidia/skyhook/agent", "6.4.1", ""),
        ("registry:5000/org/pkg:1.2.3", "registry:5000", "org/pkg", "1.2.3", ""),
        ("localhost/pkg", "localhost", "pkg", "", ""),
        ("org/pkg@sha256:abc", "", "org/pkg", "", "sha256:abc"),
        ("pause:3.10", "", "pause", "3.10", ""),
        ("registry:5000/pkg", "registry:5000", "pkg", "", ""),
    ],
)
def test_image_references_split_like_the_runtime(
    reference: str, registry: str, repository: str, tag: str, digest: str
) -> None:
    ref = parse_image(reference)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repository, tag, digest)


def test_agent_images_run_our_agent_and_pause_is_not_run(tmp_path: Path) -> None:
    def resolve(ref: str, agents: tuple[str, ...] = ()) -> kubelet_spec.ResolvedImage:
        return resolve_image(ref, agent_images=agents, registries=[tmp_path], is_dir=Path.is_dir)

    assert resolve("ghcr.io/nvidia/skyhook/agent:6.4.1").kind is ImageKind.AGENT
    assert resolve("registry.local/nodewright/agent:0.1.0").kind is ImageKind.AGENT
    assert (
        resolve("my.registry/custom-runner:2", agents=("my.registry/custom-runner",)).kind is ImageKind.AGENT
    )
    assert (
        resolve("my.registry/custom-runner:2", agents=("my.registry/custom-runner:2",)).kind
        is ImageKind.AGENT
    )
    assert resolve("registry.k8s.io/pause:3.10").kind is ImageKind.PAUSE


def test_package_images_map_to_directories_tag_first(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    (first / "tuning").mkdir(parents=True)
    (second / "tuning" / "1.1.0").mkdir(parents=True)
    registries = [first, second]

    def resolve(ref: str) -> Path | None:
        return resolve_image(ref, agent_images=(), registries=registries, is_dir=Path.is_dir).directory

    assert resolve("ghcr.io/org/tuning:1.0.0") == first / "tuning"
    (first / "tuning" / "1.1.0").mkdir()
    assert resolve("ghcr.io/org/tuning:1.1.0") == first / "tuning" / "1.1.0"
    with pytest.raises(ImageNotFound, match=r"kdump.*looked for"):
        resolve("ghcr.io/org/kdump:1.0.0")


def _layout_of(tmp_path: Path, name: str, version: str, output: Path) -> Path:
    """A package built by `nodewright package build` (on scratch) into the OCI layout `output`."""
    package = tmp_path / f"src-{name}-{version}"
    scaffold.create(name, package)
    config = json.loads((package / "config.json").read_text())
    (package / "config.json").write_text(json.dumps({**config, "package_version": version}))
    output.parent.mkdir(parents=True, exist_ok=True)
    oci.build(package, base="scratch", output=output)
    return package


def test_oci_layouts_in_a_registry_are_pulled_as_their_payload(tmp_path: Path) -> None:
    """`nodewright package build -o <registry>/<name>` is an image the simulated kubelet runs: the tag
    picks the image, the payload at /skyhook-package is unpacked once per manifest digest."""
    registry, store = tmp_path / "registry", tmp_path / "store"
    package = _layout_of(tmp_path, "probe", "0.1.0", registry / "probe")

    def pull(reference: str) -> Path:
        image = resolve_image(
            reference,
            agent_images=(),
            registries=[registry],
            is_dir=Path.is_dir,
            is_layout=kubelet._is_layout,
        )
        assert image.kind is ImageKind.LAYOUT and image.directory is not None and image.ref is not None
        assert image.directory.parent == registry or image.directory.name == image.ref.tag
        pulled = kubelet.pull_layout(store, image)
        assert pulled.kind is ImageKind.DIRECTORY and pulled.directory is not None
        return pulled.directory

    payload = pull("registry.example.com/packages/probe:0.1.0")
    expected = {e.relative for e in layout.payload_entries(package)}
    assert {str(p.relative_to(payload)) for p in payload.rglob("*")} == expected
    assert (payload / "config.json").read_bytes() == (package / "config.json").read_bytes()
    assert os.access(payload / "skyhook_dir" / "apply.sh", os.X_OK), "modes as built"
    assert [p.name for p in store.iterdir()] == [payload.name], "one unpacked copy per manifest digest"
    assert pull("registry.example.com/packages/probe:0.1.0") == payload

    index = json.loads((registry / "probe" / "index.json").read_text())
    digest = index["manifests"][0]["digest"]
    assert pull(f"registry.example.com/packages/probe:0.1.0@{digest}") == payload
    with pytest.raises(oci.BuildError, match=r"no image named '0\.2\.0' in .*probe \(names: 0\.1\.0\)"):
        pull("registry.example.com/packages/probe:0.2.0")
    with pytest.raises(oci.BuildError, match=r"no image with the digest sha256:0+"):
        pull(f"registry.example.com/packages/probe@sha256:{'0' * 64}")

    # <registry>/<name>/<tag>/ first, as for payload directories; a rebuilt layout is a new pull.
    _layout_of(tmp_path, "probe", "0.2.0", registry / "probe" / "0.2.0")
    newer = pull("registry.example.com/packages/probe:0.2.0")
    assert newer != payload and '"0.2.0"' in (newer / "config.json").read_text()


def test_a_layout_whose_payload_would_leave_its_directory_is_refused(tmp_path: Path) -> None:
    registry, store = tmp_path / "registry", tmp_path / "store"
    _layout_of(tmp_path, "probe", "0.1.0", registry / "probe")
    blobs = registry / "probe" / "blobs" / "sha256"
    index = json.loads((registry / "probe" / "index.json").read_text())
    manifest_path = blobs / index["manifests"][0]["digest"].removeprefix("sha256:")
    manifest = json.loads(manifest_path.read_bytes())
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        link = tarfile.TarInfo("skyhook-package/escape")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc"
        tar.addfile(link)
        data = b"owned\n"
        entry = tarfile.TarInfo("skyhook-package/escape/passwd")
        entry.size = len(data)
        tar.addfile(entry, io.BytesIO(data))
    layer = raw.getvalue()
    digest = f"sha256:{hashlib.sha256(layer).hexdigest()}"
    (blobs / digest.removeprefix("sha256:")).write_bytes(layer)
    manifest["layers"].append({"mediaType": oci.MEDIA_LAYER_GZIP, "digest": digest, "size": len(layer)})
    config_path = blobs / manifest["config"]["digest"].removeprefix("sha256:")
    config = json.loads(config_path.read_bytes())
    config["rootfs"]["diff_ids"].append(digest)  # the check counts them; the value is not verified here
    config_bytes = oci.canonical_json(config)
    config_digest = f"sha256:{hashlib.sha256(config_bytes).hexdigest()}"
    (blobs / config_digest.removeprefix("sha256:")).write_bytes(config_bytes)
    manifest["config"] = {**manifest["config"], "digest": config_digest, "size": len(config_bytes)}
    manifest_bytes = oci.canonical_json(manifest)
    manifest_digest = f"sha256:{hashlib.sha256(manifest_bytes).hexdigest()}"
    (blobs / manifest_digest.removeprefix("sha256:")).write_bytes(manifest_bytes)
    index["manifests"][0].update(digest=manifest_digest, size=len(manifest_bytes))
    (registry / "probe" / "index.json").write_bytes(oci.canonical_json(index))

    image = resolve_image(
        "probe:0.1.0",
        agent_images=(),
        registries=[registry],
        is_dir=Path.is_dir,
        is_layout=kubelet._is_layout,
    )
    with pytest.raises(
        oci.BuildError, match="'skyhook-package/escape/passwd' goes through a symlink; refused"
    ):
        kubelet.pull_layout(store, image)
    assert not (store / manifest_digest.removeprefix("sha256:")).exists()
    assert list(store.iterdir()) == [], "a failed pull leaves nothing behind"


def test_repository_packages_are_the_last_registry(tmp_path: Path) -> None:
    config = kubelet.KubeletConfig(directory=tmp_path, image_dirs=(tmp_path / "extra",))
    assert config.registries == (tmp_path / "registry", tmp_path / "extra", kubelet.REPO_PACKAGES)
    assert Path(kubelet.__file__).resolve().parents[2] / "packages" == kubelet.REPO_PACKAGES


# ----------------------------------------------------------------------------------------------------
# Environment


def test_dollar_paren_expansion_follows_kubernetes() -> None:
    values = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)", values.get) == "1-two"
    assert expand("$$(A) $(MISSING) $A $", values.get) == "$(A) $(MISSING) $A $"
    assert expand("$(A", values.get) == "$(A"
    assert expand("${SKYHOOK_DIR}", values.get) == "${SKYHOOK_DIR}"  # shell syntax is left to the shell


def facts(p: JSON | None = None) -> PodFacts:
    p = p or {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "labels": {"tier": "gpu"},
            "annotations": {"a/b": "c"},
        },
        "spec": {"nodeName": "n1", "serviceAccountName": "sa"},
    }
    return PodFacts(
        pod=p, host_ip="172.16.0.10", pod_ip="10.64.0.2", node_allocatable={"cpu": "60", "memory": "1Gi"}
    )


CONFIGMAP = {"metadata": {"name": "cm"}, "data": {"greeting": "hello", "bad-name!": "x", "path": "/etc"}}
SECRET = {"metadata": {"name": "sec"}, "data": {"token": base64.b64encode(b"s3cret").decode()}}
OBJECTS: dict[kubelet_spec.ObjectKey, JSON | None] = {
    ("ConfigMap", "cm"): CONFIGMAP,
    ("Secret", "sec"): SECRET,
}


def test_env_is_built_like_the_kubelet_does() -> None:
    container = {
        "name": "c",
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}, {"secretRef": {"name": "sec"}}],
        "env": [
            {"name": "PLAIN", "value": "v"},
            {"name": "REF", "value": "$(PLAIN)-$(CM_greeting)-$(LATER)"},
            {"name": "LATER", "value": "x"},
            {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "greeting"}}},
            {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "TIER", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['tier']"}}},
            {"name": "ANN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['a/b']"}}},
            {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {
                "name": "GONE",
                "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k", "optional": True}},
            },
        ],
    }
    env = container_env(container, facts(), OBJECTS)
    assert env["CM_greeting"] == "hello" and "CM_bad-name!" not in env
    assert env["token"] == "s3cret"
    assert env["REF"] == "v-hello-$(LATER)"  # only variables defined before are expanded
    assert env["FROM_CM"] == "hello" and env["FROM_SECRET"] == "s3cret"
    assert (env["NODE"], env["TIER"], env["ANN"], env["HOST"], env["UID"]) == (
        "n1",
        "gpu",
        "c",
        "172.16.0.10",
        "u1",
    )
    assert "GONE" not in env


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k"}}},
            'configmap "nope" not found',
        ),
        (
            {"name": "X", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}},
            'secret "nope" not found',
        ),
        (
            {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "missing"}}},
            "couldn't find key missing in ConfigMap ns/cm",
        ),
        ({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.weird"}}}, "unsupported fieldRef"),
    ],
)
def test_missing_references_are_create_container_config_errors(entry: JSON, message: str) -> None:
    with pytest.raises(ContainerConfigError, match=message) as caught:
        container_env({"name": "c", "env": [entry]}, facts(), OBJECTS)
    assert caught.value.reason == "CreateContainerConfigError"


def test_resource_field_refs_use_limits_then_node_allocatable() -> None:
    container = {
        "name": "c",
        "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "250m"}},
        "env": [
            {
                "name": "MEM_MI",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
            },
            {
                "name": "CPU_REQ",
                "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}},
            },
            {"name": "CPU_LIM", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        ],
    }
    env = container_env(container, facts(), {})
    assert (env["MEM_MI"], env["CPU_REQ"], env["CPU_LIM"]) == ("64", "250", "60")


# ----------------------------------------------------------------------------------------------------
# Volumes, mounts and path mapping


def test_volume_kinds_and_the_unsupported_ones() -> None:
    p = {
        "spec": {
            "volumes": [
                {"name": "root", "hostPath": {"path": "/"}},
                {
                    "name": "cm",
                    "configMap": {
                        "name": "cm",
                        "items": [{"key": "greeting", "path": "sub/g", "mode": 0o600}],
                    },
                },
                {"name": "sec", "secret": {"secretName": "sec", "defaultMode": 0o400}},
                {"name": "scratch", "emptyDir": {}},
            ]
        }
    }
    sources = volume_sources(p)
    assert sources["root"] == kubelet_spec.HostPathVolume(path="/", type="")
    files = kubelet_spec.object_volume_files(sources["cm"], CONFIGMAP, volume_name="cm")  # type: ignore[arg-type]
    assert files == {"sub/g": (b"hello", 0o600)}
    secret_files = kubelet_spec.object_volume_files(sources["sec"], SECRET, volume_name="sec")  # type: ignore[arg-type]
    assert secret_files == {"token": (b"s3cret", 0o400)}
    with pytest.raises(ContainerConfigError, match='configmap "cm" not found'):
        kubelet_spec.object_volume_files(sources["cm"], None, volume_name="cm")  # type: ignore[arg-type]
    with pytest.raises(ContainerConfigError, match=r"supports hostPath.*not csi"):
        volume_sources({"spec": {"volumes": [{"name": "x", "csi": {"driver": "d"}}]}})


def test_path_mapping_rewrites_whole_components_only() -> None:
    mounts = [
        Mount("/skyhook-package/configmaps", "/sim/cm"),
        Mount("/skyhook-package", "/sim/img"),
        Mount("/root", "/sim/roots/n1"),
    ]
    assert (
        map_paths("cp -r /skyhook-package/* /root/${SKYHOOK_DIR}", mounts)
        == "cp -r /sim/img/* /sim/roots/n1/${SKYHOOK_DIR}"
    )
    assert map_paths("/skyhook-package/configmaps/a", mounts) == "/sim/cm/a"
    assert map_paths("/root", mounts) == "/sim/roots/n1"
    assert (
        map_paths("X=/root:/rooted /usr/root '/root/x'", mounts)
        == "X=/sim/roots/n1:/rooted /usr/root '/sim/roots/n1/x'"
    )
    assert map_paths("/var/lib/skyhook/x", mounts) == "/var/lib/skyhook/x"


def operator_pod(stage: PackageStage = PackageStage.APPLY) -> JSON:
    package = Package(
        version="1.2.3",
        image="ghcr.io/org/tuning",
        env=[EnvVar(name="MODE", value="training")],
        config_map={"intent.json": "{}"},
    )
    nw = NodeWright(
        metadata=ObjectMeta(name="tune", uid="uid-1", generation=2),
        spec=NodeWrightSpec(packages={"tuning": package}),
    )
    options = PodOptions(namespace="nodewright-system", agent_image="ghcr.io/nvidia/skyhook/agent:6.4.1")
    return build_pod(
        nw,
        package,
        package_name="tuning",
        version="1.2.3",
        stage=stage,
        node="n1",
        attempt=1,
        node_order=0,
        options=options,
    )


def test_the_operators_package_pod_lands_in_the_node_root(tmp_path: Path) -> None:
    manifest = operator_pod()
    volumes = volume_sources(manifest)
    registry = tmp_path / "registry"
    (registry / "tuning").mkdir(parents=True)
    node_root = str(tmp_path / "roots" / "n1")
    # An install pod runs apply and config: the payload copy, then each stage and its check.
    containers = manifest["spec"]["initContainers"]
    assert [c["name"] for c in containers] == [
        "tuning-init",
        "tuning-apply",
        "tuning-applycheck",
        "tuning-config",
        "tuning-configcheck",
    ]
    specs = []
    for container in containers:
        image = resolve_image(container["image"], agent_images=(), registries=[registry], is_dir=Path.is_dir)
        view = (
            str(tmp_path / "pod" / "images" / container["name"])
            if image.kind is ImageKind.DIRECTORY
            else None
        )
        mounts = container_mounts(
            container,
            volumes,
            node_root=node_root,
            volume_dir=lambda v: str(tmp_path / "pod" / "volumes" / v),
            payload_view=view,
        )
        env = container_env(container, PodFacts(pod=manifest, host_ip="h", pod_ip="h"), {})
        specs.append(
            (
                image,
                mounts,
                process_spec(
                    container,
                    image=image,
                    env=env,
                    mounts=mounts.mounts,
                    agent_command=("py", "-m", "nodewright.agent"),
                ),
            )
        )
    (copy_image, copy_mounts, copy_spec), (_, step_mounts, step_spec), (_, _, check_spec) = specs[:3]
    (_, _, config_spec), (_, _, config_check_spec) = specs[3:]
    assert copy_image.kind is ImageKind.DIRECTORY and copy_image.directory == registry / "tuning"
    script = copy_spec.argv[2]
    assert copy_spec.argv[:2] == ("/bin/sh", "-c")
    assert f"cp -rf {tmp_path}/pod/images/tuning-init/* {node_root}/${{SKYHOOK_DIR}}" in script
    assert copy_spec.env["SKYHOOK_DIR"].startswith("/var/lib/skyhook/tune/")  # a host path: not mapped
    # The package's configMap volume sits inside the payload: it is placed into the payload copy.
    assert copy_mounts.nested == (
        kubelet_spec.NestedMount("configmaps", f"{tmp_path}/pod/volumes/tuning-configmap", copy=True),
    )
    copy_dir = copy_spec.env["SKYHOOK_DIR"]
    assert step_spec.argv == ("py", "-m", "nodewright.agent", "apply", node_root, copy_dir)
    assert check_spec.argv == ("py", "-m", "nodewright.agent", "apply-check", node_root, copy_dir)
    assert config_spec.argv == ("py", "-m", "nodewright.agent", "config", node_root, copy_dir)
    assert config_check_spec.argv == ("py", "-m", "nodewright.agent", "config-check", node_root, copy_dir)
    assert step_spec.env["MODE"] == "training" and step_spec.env["SKYHOOK_RESOURCE_ID"].startswith(
        "tune-uid-1-2_"
    )
    assert (
        Mount(PAYLOAD_DIR + "/configmaps", f"{tmp_path}/pod/volumes/tuning-configmap") in step_mounts.mounts
    )


def test_a_container_without_command_needs_an_entrypoint() -> None:
    image = kubelet_spec.ResolvedImage(ImageKind.DIRECTORY, Path("/x"))
    with pytest.raises(ContainerConfigError, match="set command") as caught:
        process_spec(
            {"name": "c", "image": "reg/x:1", "args": ["a"]},
            image=image,
            env={},
            mounts=[],
            agent_command=("a",),
        )
    assert caught.value.reason == "CreateContainerError"
    spec = process_spec(
        {"name": "c", "command": ["echo", "$(X)"], "args": ["$(Y)", "$$(X)"], "workingDir": "/root/w"},
        image=image,
        env={"X": "1", "Y": "/root/y"},
        mounts=[Mount("/root", "/r")],
        agent_command=("a",),
    )
    assert spec.argv == ("echo", "1", "/r/y", "$(X)") and spec.cwd == "/r/w" and spec.env["Y"] == "/r/y"


def test_mount_errors_name_the_container() -> None:
    with pytest.raises(ContainerConfigError, match="'c': volumeMount 'v' names no volume"):
        container_mounts(
            {"name": "c", "volumeMounts": [{"name": "v", "mountPath": "/x"}]},
            {},
            node_root="/r",
            volume_dir=str,
            payload_view=None,
        )


# ----------------------------------------------------------------------------------------------------
# Status and phase


def test_a_fresh_pod_is_pending_with_every_container_waiting() -> None:
    p = pod()
    status = status_of(p, initial_records(p, virtual=frozenset({"pause"})))
    assert status["phase"] == "Pending"
    assert [s["state"] for s in status["initContainerStatuses"]] == [
        {"waiting": {"reason": "PodInitializing"}}
    ] * 2
    cond = conditions(status)
    assert (
        cond["Initialized"]["status"] == "False"
        and cond["Initialized"]["reason"] == "ContainersNotInitialized"
    )
    assert cond["Initialized"]["message"] == "containers with incomplete status: [init-0 init-1]"
    assert cond["PodScheduled"]["status"] == "True" and cond["PodReadyToStartContainers"]["status"] == "True"
    assert status["podIP"] == status["hostIP"] == "10.0.0.1" and status["startTime"] == NOW


def test_init_containers_then_pause_make_the_pod_running_and_ready() -> None:
    p = pod()
    records = initial_records(p, virtual=frozenset({"pause"}))
    assert next_actions("Never", records) == [Start(0)]
    records[0] = records[0].started(NOW, "sim://a")
    assert next_actions("Never", records) == []  # the next init container waits for this one
    running = status_of(p, records)["initContainerStatuses"][0]
    assert running["state"] == {"running": {"startedAt": NOW}} and running["started"] and not running["ready"]
    records[0] = records[0].exited(0, LATER)
    assert next_actions("Never", records) == [Start(1)]
    records[1] = records[1].started(LATER, "sim://b").exited(0, LATER)
    assert next_actions("Never", records) == [Start(2)]
    records[2] = records[2].started(LATER, "sim://c")
    status = status_of(p, records, now=LATER)
    assert status["phase"] == "Running"
    assert {c["type"]: c["status"] for c in status["conditions"]} == dict.fromkeys(
        ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"), "True"
    )
    done = status["initContainerStatuses"][0]
    assert (
        done["state"]["terminated"]["exitCode"] == 0 and done["state"]["terminated"]["reason"] == "Completed"
    )
    assert done["ready"] and not done["started"] and done["containerID"] == "sim://a"
    assert status["containerStatuses"][0]["ready"] and status["containerStatuses"][0]["started"]


def test_a_failing_init_container_fails_the_pod_under_restart_policy_never() -> None:
    p = pod(init=3)
    records = initial_records(p, virtual=frozenset({"pause"}))
    records[0] = records[0].started(NOW, "a").exited(0, NOW)
    records[1] = records[1].started(NOW, "b").exited(3, LATER, message="boom")
    status = status_of(p, records, now=LATER)
    assert status["phase"] == "Failed" and next_actions("Never", records) == []
    states = [s["state"] for s in status["initContainerStatuses"]]
    assert states[1]["terminated"]["exitCode"] == 3 and states[1]["terminated"]["reason"] == "Error"
    assert states[1]["terminated"]["message"] == "boom" and states[2] == {
        "waiting": {"reason": "PodInitializing"}
    }
    cond = conditions(status)
    assert cond["Ready"]["reason"] == "PodFailed" and cond["PodReadyToStartContainers"]["status"] == "False"


def test_on_failure_restarts_a_failed_init_container_with_back_off() -> None:
    p = pod(policy="OnFailure")
    records = initial_records(p, virtual=frozenset({"pause"}))
    records[0] = records[0].started(NOW, "a").exited(1, NOW)
    assert pod_phase("OnFailure", records) == "Pending"
    assert next_actions("OnFailure", records) == [Restart(0, 10.0)]
    records[0] = records[0].restarting()
    entry = status_of(p, records)["initContainerStatuses"][0]
    assert entry["restartCount"] == 1 and entry["state"] == {"waiting": {"reason": "CrashLoopBackOff"}}
    assert entry["lastState"]["terminated"]["exitCode"] == 1
    assert next_actions("OnFailure", records) == [Start(0)]
    assert [restart_delay(n) for n in range(7)] == [10, 20, 40, 80, 160, 300, 300]


@pytest.mark.parametrize(
    ("policy", "codes", "phase", "restarts"),
    [
        ("Never", (0, 0), "Succeeded", []),
        ("Never", (0, 2), "Failed", []),
        ("OnFailure", (0, 0), "Succeeded", []),
        ("OnFailure", (0, 2), "Running", [1]),
        ("Always", (0, 0), "Running", [0, 1]),
    ],
)
def test_main_containers_end_the_pod_by_restart_policy(
    policy: str, codes: tuple[int, int], phase: str, restarts: list[int]
) -> None:
    p = pod(init=0, main=("a", "b"), policy=policy)
    records = initial_records(p)
    assert next_actions(policy, records) == [Start(0), Start(1)]
    records = [r.started(NOW, r.name).exited(code, LATER) for r, code in zip(records, codes, strict=True)]
    assert pod_phase(policy, records) == phase
    assert [a.index for a in next_actions(policy, records) if isinstance(a, Restart)] == restarts


def test_transition_times_only_change_with_the_status() -> None:
    p = pod()
    records = initial_records(p, virtual=frozenset({"pause"}))
    first = status_of(p, records)
    records[0] = records[0].started(LATER, "a")
    second = status_of(p, records, now=LATER, previous_conditions=first["conditions"])
    assert conditions(second)["Initialized"]["lastTransitionTime"] == NOW
    third = status_of(p, records, now=LATER, deadline_exceeded=True, previous_conditions=second["conditions"])
    assert third["phase"] == "Failed" and third["reason"] == "DeadlineExceeded"
    assert conditions(third)["PodReadyToStartContainers"]["lastTransitionTime"] == LATER


def test_resuming_after_a_kubelet_restart_reports_lost_containers() -> None:
    reported: JSON = {
        "startTime": NOW,
        "initContainerStatuses": [
            {
                "name": "init-0",
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
            },
            {"name": "init-1", "restartCount": 0, "state": {"running": {"startedAt": NOW}}},
        ],
        "containerStatuses": [{"name": "pause", "state": {"waiting": {"reason": "PodInitializing"}}}],
    }
    p = pod(status=reported)
    records = records_from_status(p, now=LATER, virtual=frozenset({"pause"}), lost_message="gone")
    assert records[0].succeeded
    assert records[1].terminated is not None and records[1].terminated.exit_code == 137
    assert (
        records[1].terminated.reason == "ContainerStatusUnknown" and records[1].terminated.started_at == NOW
    )
    assert pod_phase("Never", records) == "Failed"
    finished = {
        **reported,
        "initContainerStatuses": [
            {**reported["initContainerStatuses"][0], "name": n} for n in ("init-0", "init-1")
        ],
    }
    finished["containerStatuses"] = [{"name": "pause", "state": {"running": {"startedAt": LATER}}}]
    again = records_from_status(
        pod(status=finished), now=LATER, virtual=frozenset({"pause"}), lost_message="gone"
    )
    assert pod_phase("Never", again) == "Running" and next_actions("Never", again) == []  # pause runs on


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=6))
def test_init_containers_run_strictly_in_order_and_the_first_failure_decides(codes: list[int]) -> None:
    p = pod(init=len(codes))
    records = initial_records(p, virtual=frozenset({"pause"}))
    started: list[int] = []
    while True:
        actions = next_actions("Never", records)
        if not actions:
            break
        assert len(actions) == 1 and isinstance(actions[0], Start)
        index = actions[0].index
        if index == len(codes):  # pause
            records[index] = records[index].started(NOW, "pause")
            continue
        assert index == len(started)  # strictly one after another
        started.append(index)
        records[index] = records[index].started(NOW, str(index)).exited(codes[index], LATER)
    first_failure = next((i for i, c in enumerate(codes) if c), None)
    phase = pod_phase("Never", records)
    if first_failure is None:
        assert phase == "Running" and started == list(range(len(codes)))
    else:
        assert phase == "Failed" and started == list(range(first_failure + 1))
        status = status_of(p, records)
        assert (
            status["initContainerStatuses"][first_failure]["state"]["terminated"]["exitCode"]
            == codes[first_failure]
        )


# ----------------------------------------------------------------------------------------------------
# Host side


def test_cri_logs_are_line_framed_with_partial_pieces(tmp_path: Path) -> None:
    log = kubelet_host.CriLog(tmp_path / "c" / "0.log")
    log.write("stdout", b"hello\nwor")
    log.write("stderr", b"oops\n")
    log.write("stdout", b"ld\n" + b"x" * (kubelet_host.CRI_MAX_LINE + 5))
    log.close()
    text = (tmp_path / "c" / "0.log").read_text()
    lines = text.splitlines()
    assert lines[0].split(" ", 3)[1:] == ["stdout", "F", "hello"]
    assert [line.split(" ")[2] for line in lines] == ["F", "F", "F", "P", "F"]
    assert kubelet_host.parse_cri_log(text) == [
        ("stdout", "hello"),
        ("stderr", "oops"),
        ("stdout", "world"),
        ("stdout", "x" * (kubelet_host.CRI_MAX_LINE + 5)),
    ]
    assert log.tail().endswith("x" * 10)


def test_kill_tree_reaches_grandchildren() -> None:
    proc = subprocess.Popen(["/bin/sh", "-c", "sleep 60 & sleep 60 & wait"])
    try:
        deadline = time.monotonic() + 5
        while len(kubelet_host.descendants(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        children = kubelet_host.descendants(proc.pid)
        assert len(children) == 2
        kubelet_host.kill_tree(proc.pid)
        assert proc.wait(timeout=5) == -signal.SIGKILL
        deadline = time.monotonic() + 5
        while any(controlplane.process_running(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any(controlplane.process_running(c) for c in children)
    finally:
        proc.kill()
        proc.wait()


def _command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text(errors="replace").strip()
    except OSError:  # it exited meanwhile
        return ""


def test_kill_marked_reaches_processes_in_their_own_session() -> None:
    marker = f"test-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, kubelet.CONTAINER_MARKER: marker}
    proc = subprocess.Popen(["/bin/sh", "-c", "setsid sleep 60 & wait"], env=env)

    def marked_sleep() -> list[int]:
        # Counting marked processes is not enough: the shell's fork is marked before it has become
        # `sleep` (and `setsid` may fork once more), so wait for the `sleep` itself.
        return [
            pid
            for pid in kubelet_host.processes_with_env(kubelet.CONTAINER_MARKER, marker)
            if pid != proc.pid and _command_name(pid) == "sleep"
        ]

    try:
        deadline = time.monotonic() + 5
        while not marked_sleep():
            assert time.monotonic() < deadline, "the marked sleep did not start"
            time.sleep(0.02)
        [sleeper] = marked_sleep()
        assert os.getsid(sleeper) != os.getsid(proc.pid)  # the case: a process in a session of its own
        assert proc.pid in kubelet_host.processes_with_env(kubelet.CONTAINER_MARKER, marker)
        assert kubelet_host.kill_marked(kubelet.CONTAINER_MARKER, marker) >= 2
        assert proc.wait(timeout=5) == -signal.SIGKILL
        deadline = time.monotonic() + 5
        while kubelet_host.processes_with_env(kubelet.CONTAINER_MARKER, marker):
            assert time.monotonic() < deadline, "a marked process survived"
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait()


def node(tmp_path: Path) -> hostshims.Node:
    return hostshims.Node(tmp_path / "root", tmp_path / "state")


def run_sysctl(n: hostshims.Node, *args: str) -> tuple[int, list[str], list[str]]:
    out: list[str] = []
    err: list[str] = []
    return hostshims.sysctl(n, args, out.append, err.append), out, err


def test_sysctl_stand_in_acts_on_the_node_root(tmp_path: Path) -> None:
    n = node(tmp_path)
    assert run_sysctl(n, "-w", "vm.swappiness=10") == (0, ["vm.swappiness = 10"], [])
    assert (n.root / "proc/sys/vm/swappiness").read_text() == "10\n"
    assert run_sysctl(n, "-n", "vm.swappiness") == (0, ["10"], [])
    code, _, err = run_sysctl(n, "kernel.unknown")
    assert code == 255 and "cannot stat /proc/sys/kernel/unknown" in err[0]
    assert run_sysctl(n, "-e", "kernel.unknown")[0] == 0
    (n.root / "etc/sysctl.d").mkdir(parents=True)
    (n.root / "usr/lib/sysctl.d").mkdir(parents=True)
    (n.root / "etc/sysctl.d/50-a.conf").write_text("# c\nvm.swappiness = 1\n; c\n-net.core.somaxconn=4096\n")
    (n.root / "usr/lib/sysctl.d/50-a.conf").write_text("vm.swappiness = 99\n")  # shadowed by /etc
    (n.root / "usr/lib/sysctl.d/60-b.conf").write_text("vm.swappiness = 2\n")
    (n.root / "etc/sysctl.conf").write_text("kernel.pid_max = 65536\n")
    assert run_sysctl(n, "--system", "-q")[0] == 0
    assert [run_sysctl(n, "-n", k)[1] for k in ("vm.swappiness", "net.core.somaxconn", "kernel.pid_max")] == [
        ["2"],
        ["4096"],
        ["65536"],
    ]
    (n.root / "etc/extra.conf").write_text("vm.dirty_ratio = 5\n")
    assert run_sysctl(n, "-q", "-p", "/etc/extra.conf")[0] == 0
    assert run_sysctl(n, "-q", "-p", str(n.root / "etc/extra.conf"))[0] == 0  # already inside the root
    assert run_sysctl(n, "-n", "vm.dirty_ratio")[1] == ["5"]
    assert run_sysctl(n, "-p", "/etc/missing.conf")[0] == 255


def test_module_and_service_stand_ins(tmp_path: Path) -> None:
    n = node(tmp_path)
    assert hostshims.main("modprobe", ["nvidia-peermem"], root=str(n.root), state=str(n.state)) == 0
    assert hostshims.main("modprobe", ["br_netfilter"], root=str(n.root), state=str(n.state)) == 0
    assert hostshims.loaded_modules(n) == ["nvidia_peermem", "br_netfilter"]
    assert hostshims.main("rmmod", ["nvidia_peermem"], root=str(n.root), state=str(n.state)) == 0
    assert hostshims.loaded_modules(n) == ["br_netfilter"]
    (n.root / "etc/sysctl.d").mkdir(parents=True)
    (n.root / "etc/sysctl.d/99.conf").write_text("vm.swappiness = 7\n")
    assert hostshims.main("service", ["procps", "force-reload"], root=str(n.root), state=str(n.state)) == 0
    assert hostshims.read_key(n, "vm.swappiness") == "7"
    log = (n.root / hostshims.COMMANDS_LOG).read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in log] == [
        "modprobe nvidia-peermem",
        "modprobe br_netfilter",
        "rmmod nvidia_peermem",
        "service procps force-reload",
    ]


def test_reboot_stand_in_requests_a_reboot_and_blocks(tmp_path: Path) -> None:
    n = node(tmp_path)
    bin_dir = tmp_path / "bin"
    hostshims.install(
        bin_dir, python=sys.executable, source_root=str(kubelet.SOURCE_ROOT), root=n.root, state=n.state
    )
    assert sorted(p.name for p in bin_dir.iterdir()) == sorted(hostshims.PROGRAMS)
    assert os.access(bin_dir / "reboot", os.X_OK)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    assert (
        subprocess.run(["systemctl", "is-active", "x"], env=env, capture_output=True, text=True).stdout
        == "active\n"
    )
    proc = subprocess.Popen(["/bin/sh", "-c", "reboot"], env=env, stdout=subprocess.PIPE)
    try:
        request = n.state / hostshims.REBOOT_REQUEST_FILE
        deadline = time.monotonic() + 10
        while not request.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert request.read_text() == "reboot \n"
        assert proc.poll() is None  # a machine going down does not return
    finally:
        kubelet_host.kill_tree(proc.pid)
        proc.wait()


def test_boot_loads_persistent_settings_and_forgets_runtime_ones(tmp_path: Path) -> None:
    root = tmp_path / "root"
    n = hostshims.Node(root, root)
    node_json: JSON = {
        "metadata": {"name": "n1"},
        "status": {
            "nodeInfo": {
                "bootID": "b-1",
                "kernelVersion": "5.15.0-1063-nvidia",
                "osImage": "Ubuntu 22.04.4 LTS",
            }
        },
    }
    kubelet_host.boot_node(root, node_json)
    assert boot.recorded_boot_id(root) == "b-1"
    assert (root / "etc/hostname").read_text() == "n1\n"
    assert 'VERSION_ID="22.04"' in (root / "etc/os-release").read_text()
    hostshims.write_key(n, "vm.swappiness", "60")  # runtime only
    (root / "etc/sysctl.d").mkdir(parents=True)
    (root / "etc/sysctl.d/90-tune.conf").write_text("vm.max_map_count = 262144\n")
    (root / "etc/default/grub.d").mkdir(parents=True)
    (root / "etc/default/grub").write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n')
    (root / "etc/default/grub.d/50-tune.cfg").write_text(
        'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=pt"\n'
    )
    (root / "etc/modules-load.d").mkdir(parents=True)
    (root / "etc/modules-load.d/gpu.conf").write_text("# gpu\nnvidia-peermem\n")
    node_json["status"]["nodeInfo"]["bootID"] = "b-2"
    kubelet_host.boot_node(root, node_json)
    assert boot.recorded_boot_id(root) == "b-2"
    assert hostshims.read_key(n, "vm.swappiness") is None
    assert hostshims.read_key(n, "vm.max_map_count") == "262144"
    assert (
        root / "proc/cmdline"
    ).read_text() == "BOOT_IMAGE=/boot/vmlinuz-5.15.0-1063-nvidia root=/dev/sda1 ro iommu=pt quiet\n"
    assert hostshims.loaded_modules(n) == ["nvidia_peermem"]


def test_simulator_directories_must_not_need_shell_quoting(tmp_path: Path) -> None:
    kubelet_spec.check_safe_directory(tmp_path / "sim-1.d_x+y")
    with pytest.raises(ValueError, match="characters that shell commands would split"):
        kubelet_spec.check_safe_directory(tmp_path / "with space")
    with pytest.raises(controlplane.ControlPlaneError, match="shell commands"):
        controlplane.ControlPlane.create(tmp_path / "a b", bins=binaries.ControlPlaneBinaries(tmp_path))


def test_kwok_leaves_opted_in_nodes_to_the_kubelet(tmp_path: Path) -> None:
    plane = controlplane.ControlPlane(
        dir=tmp_path,
        bin_dir=tmp_path,
        ports=dict.fromkeys(("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kwok"), 1),
        components={},
    )
    kwok = plane._command("kwok").argv
    assert "--manage-nodes-with-label-selector=sim.nodewright.io/real-packages!=true" in kwok
    assert "--enable-crds=Logs" in kwok
    apiserver = plane._command("kube-apiserver").argv
    assert any(a.startswith("--kubelet-preferred-address-types=InternalDNS,") for a in apiserver)
    argv = plane._command("kubelet", image_dirs=[tmp_path / "reg"], agent_images=["my/agent-x:1"]).argv
    assert f"--dir={tmp_path}" in argv and "--kwok-port=1" in argv
    assert f"--image-dir={tmp_path / 'reg'}" in argv and "--agent-image=my/agent-x:1" in argv
    assert controlplane.KWOK_CONFIGURATION["options"]["enableDebuggingHandlers"] is True
