"""Package and interrupt pod manifests (compatible with reference package images)."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodewright.agent.settings import parse_resource_id
from nodewright.api import constants
from nodewright.api.models import (
    EnvVar,
    EnvVarSource,
    Interrupt,
    InterruptType,
    NodeWright,
    NodeWrightSpec,
    ObjectMeta,
    Package,
    Resources,
    Toleration,
)
from nodewright.api.nodestate import PackageStage
from nodewright.plan.podspec import (
    PodOptions,
    build_pod,
    image_reference,
    interrupt_run,
    label_value,
    package_configmap_name,
    parse_duration_seconds,
    pod_name,
    pod_node,
    resource_id,
    safe_name,
    spec_hash,
    transition_modes,
    transition_stages,
)

OPTS = PodOptions(namespace="nw-system", agent_image="agent:1", pause_image="pause:3")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def nodewright(**pkg: Any) -> NodeWright:
    package = Package(version="1.2.3", image="registry:5000/org/pkg", **pkg)
    return NodeWright(
        metadata=ObjectMeta(name="gpu-stack", uid="uid-1", generation=4),
        spec=NodeWrightSpec(
            packages={"driver": package},
            additional_tolerations=[Toleration(key="gpu", operator="Exists")],
        ),
    )


def build(nw: NodeWright, stage: PackageStage = PackageStage.APPLY, **kw: Any) -> dict[str, Any]:
    return build_pod(
        nw,
        nw.spec.packages["driver"],
        package_name="driver",
        version="1.2.3",
        stage=stage,
        node="node-a",
        attempt=kw.pop("attempt", 1),
        node_order=7,
        options=OPTS,
        **kw,
    )


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_image_reference() -> None:
    assert image_reference("registry:5000/x", "1.0.0") == "registry:5000/x:1.0.0"
    assert image_reference("registry:5000/x:2.0", "1.0.0") == "registry:5000/x:2.0"
    assert image_reference("ghcr.io/x", "1.0.0+b1") == "ghcr.io/x:1.0.0_b1"
    assert image_reference("ghcr.io/x@sha256:" + "a" * 64, "1") == "ghcr.io/x@sha256:" + "a" * 64
    assert (
        image_reference("registry:5000/x:2.0", "1", "sha256:" + "b" * 64)
        == "registry:5000/x@sha256:" + "b" * 64
    )
    assert image_reference("x", "1", "sha256:" + "b" * 64) == "x@sha256:" + "b" * 64


def test_package_pod() -> None:
    nw = nodewright(
        config_map={"apply.sh": "echo"},
        env=[
            EnvVar(name="A", value="1"),
            EnvVar(
                name="S", value_from=EnvVarSource.model_validate({"secretKeyRef": {"name": "s", "key": "k"}})
            ),
            EnvVar(name="SKYHOOK_NODE_ORDER", value="99"),
        ],
        resources=Resources(
            cpu_request="100m", cpu_limit="200m", memory_request="64Mi", memory_limit="128Mi"
        ),
        graceful_shutdown="1m30s",
    )
    pod = build(nw)
    spec = pod["spec"]
    assert "nodeName" not in spec and spec["schedulerName"] == constants.POD_SCHEDULER_NAME, "bound later"
    assert pod["metadata"]["annotations"][constants.POD_ANNOTATION_NODE] == "node-a"
    assert pod_node(pod) == "node-a" and spec["restartPolicy"] == "Never"
    assert spec["hostPID"] and spec["hostNetwork"]
    # No ServiceAccount token on the host: found on real nodes, where the admission plugin mounts one.
    assert spec["automountServiceAccountToken"] is False
    assert spec["terminationGracePeriodSeconds"] == 90
    init = spec["initContainers"]
    # One pod per transition: the install runs apply and config, each with its check, in one pod; the
    # containers, args and environment are the reference's (one payload copy, then the agent modes).
    assert [c["name"] for c in init] == [
        "driver-init",
        "driver-apply",
        "driver-applycheck",
        "driver-config",
        "driver-configcheck",
    ]
    assert init[0]["image"] == "registry:5000/org/pkg:1.2.3"
    copy_dir = "/var/lib/skyhook/gpu-stack/driver-1.2.3-uid-1-4"
    assert init[0]["env"] == [{"name": "SKYHOOK_DIR", "value": copy_dir}]
    assert [c["args"] for c in init[1:]] == [
        [mode, "/root", copy_dir] for mode in ("apply", "apply-check", "config", "config-check")
    ]
    assert all(c["env"] == init[1]["env"] and c["image"] == init[1]["image"] for c in init[1:])
    env = env_of(init[1])
    assert env["SKYHOOK_NODE_ORDER"] == "7" and env["NODEWRIGHT_NODE_ORDER"] == "7"  # package cannot override
    assert env["COPY_RESOLV"] == "false"
    assert env["SKYHOOK_RESOURCE_ID"] == "gpu-stack-uid-1-4_driver_1.2.3"
    assert env["SKYHOOK_LOG_DIR"] == "/var/log/skyhook/gpu-stack"
    assert env["A"] == "1" and env["S"] == {"secretKeyRef": {"name": "s", "key": "k"}}
    assert all(c["securityContext"] == {"privileged": True} for c in init)
    assert all(c["resources"]["limits"] == {"cpu": "200m", "memory": "128Mi"} for c in init)
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["root-mount"]["hostPath"] == {"path": "/"}
    assert vols["driver-configmap"]["configMap"]["name"] == "gpu-stack-driver-1.2.3"
    mounts = {m["mountPath"]: m for m in init[0]["volumeMounts"]}
    assert mounts["/root"]["mountPropagation"] == "HostToContainer"
    assert "/skyhook-package/configmaps" in mounts
    tol_keys = [t.get("key") for t in spec["tolerations"]]
    assert tol_keys == [
        "node.kubernetes.io/unschedulable",
        constants.DEFAULT_RUNTIME_REQUIRED_TAINT_KEY,
        "gpu",
    ]
    assert "kwok.x-k8s.io/node" not in tol_keys
    meta = pod["metadata"]
    assert meta["namespace"] == "nw-system"
    assert meta["labels"][constants.POD_OWNER_LABEL] == constants.POD_OWNER_VALUE
    assert meta["labels"][constants.POD_LABEL_STAGE] == "apply"
    assert meta["annotations"][constants.POD_ANNOTATION_ATTEMPT] == "1"
    assert meta["ownerReferences"][0]["uid"] == "uid-1" and meta["ownerReferences"][0]["controller"]
    assert len(meta["name"]) <= 63 and DNS_LABEL.match(meta["name"])
    assert spec["containers"][0]["image"] == "pause:3"


def test_each_transition_is_one_pod_up_to_the_next_interrupt() -> None:
    nw = nodewright(interrupt=Interrupt(type=InterruptType.REBOOT))
    expected = {
        PackageStage.APPLY: ["apply", "apply-check", "config", "config-check"],
        PackageStage.UPGRADE: ["upgrade", "upgrade-check", "config", "config-check"],
        PackageStage.CONFIG: ["config", "config-check"],
        PackageStage.POST_INTERRUPT: ["post-interrupt", "post-interrupt-check"],
        PackageStage.UNINSTALL: ["uninstall", "uninstall-check"],
    }
    for stage, modes in expected.items():
        pod = build(nw, stage)
        assert [c["args"][0] for c in pod["spec"]["initContainers"][1:]] == modes, stage
        assert list(transition_modes(stage)) == modes
        assert [s.value for s in transition_stages(stage)] == modes[::2]
        assert pod["metadata"]["labels"][constants.POD_LABEL_STAGE] == stage.value  # the first stage
        assert [c["name"] for c in pod["spec"]["containers"]] == ["pause"]


def test_interrupt_pod() -> None:
    nw = nodewright(interrupt=Interrupt(type=InterruptType.SERVICE, services=["b", "a"]))
    merged = Interrupt(type=InterruptType.SERVICE, services=["a", "b", "c"])
    pod = build(nw, PackageStage.INTERRUPT, interrupt=merged)
    init = pod["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["interrupt"]
    args = init[0]["args"]
    assert args[:2] == ["interrupt", "/root"]
    assert json.loads(base64.b64decode(args[3])) == {"type": "service_restart", "services": ["a", "b", "c"]}
    ann = json.loads(pod["metadata"]["annotations"][constants.POD_ANNOTATION_INTERRUPT])
    assert ann == {"type": "service", "services": ["a", "b", "c"]}
    assert init[0]["resources"]["limits"] == {"cpu": "500m", "memory": "64Mi"}


def test_each_interrupt_attempt_has_its_own_resource_id_in_the_reference_agent_format() -> None:
    # The agent keys its interrupt flags by the resource id: a run of an interrupt must not inherit the
    # flags of an earlier run in the same generation (a drift repair, a retry), or its reboot is skipped.
    nw = nodewright(interrupt=Interrupt(type=InterruptType.REBOOT))
    reboot = Interrupt(type=InterruptType.REBOOT)
    run = interrupt_run("2025-01-31T12:00:00Z", 1)
    assert run == "20250131T120000Z.1"
    first = build(nw, PackageStage.INTERRUPT, interrupt=reboot, run=run)
    again = build(nw, PackageStage.INTERRUPT, interrupt=reboot, run=run)
    retry = build(
        nw, PackageStage.INTERRUPT, interrupt=reboot, attempt=2, run=interrupt_run("2025-01-31T12:06:00Z", 2)
    )
    rid = env_of(first["spec"]["initContainers"][0])["SKYHOOK_RESOURCE_ID"]
    assert rid == "gpu-stack-uid-1-4-20250131T120000Z.1_driver_1.2.3"
    assert env_of(first["spec"]["initContainers"][0])["NODEWRIGHT_RESOURCE_ID"] == rid
    assert first == again, "the same attempt made again is the same pod: the agent's flag holds"
    assert env_of(retry["spec"]["initContainers"][0])["SKYHOOK_RESOURCE_ID"] != rid
    assert (
        first["metadata"]["name"]
        != build(nw, PackageStage.INTERRUPT, interrupt=reboot, run="x.1")["metadata"]["name"]
    )
    # The reference agent splits on "_" into exactly three parts; ours splits the same way.
    owner, package, version = rid.split("_")
    assert (package, version) == ("driver", "1.2.3") and owner.startswith("gpu-stack-uid-1-4-")
    parsed = parse_resource_id(rid)
    assert (parsed.package, parsed.version) == ("driver", "1.2.3")
    # Stage pods keep the generation's id, and an interrupt without a run (an older state) does too.
    assert (
        env_of(build(nw)["spec"]["initContainers"][1])["SKYHOOK_RESOURCE_ID"]
        == "gpu-stack-uid-1-4_driver_1.2.3"
    )
    plain = build(nw, PackageStage.INTERRUPT, interrupt=reboot)
    assert (
        env_of(plain["spec"]["initContainers"][0])["SKYHOOK_RESOURCE_ID"] == "gpu-stack-uid-1-4_driver_1.2.3"
    )
    assert resource_id(nw, "driver", "1.2.3", run) == rid


def test_every_container_that_can_fail_carries_its_log_tail_in_its_status() -> None:
    """`FallbackToLogsOnError`: the reason for a failure comes with the status that reports it."""
    nw = nodewright(interrupt=Interrupt(type=InterruptType.REBOOT))
    pods = [build(nw, stage) for stage in (PackageStage.APPLY, PackageStage.UPGRADE, PackageStage.UNINSTALL)]
    pods.append(build(nw, PackageStage.INTERRUPT, interrupt=Interrupt(type=InterruptType.REBOOT)))
    for pod in pods:
        init = pod["spec"]["initContainers"]
        assert init and all(c["terminationMessagePolicy"] == "FallbackToLogsOnError" for c in init), init
        assert all("terminationMessagePolicy" not in c for c in pod["spec"]["containers"])  # pause


def test_spec_hash_tracks_what_matters() -> None:
    base = nodewright(config_map={"a": "1"})
    pkg = base.spec.packages["driver"]

    def h(nw: NodeWright) -> str:
        return spec_hash(
            nw,
            nw.spec.packages["driver"],
            package_name="driver",
            version="1.2.3",
            stage=PackageStage.CONFIG,
            interrupt=None,
            options=OPTS,
        )

    same = base.model_copy(update={"metadata": ObjectMeta(name="gpu-stack", uid="uid-1", generation=9)})
    assert h(same) == h(base)  # a new generation alone does not replace running pods
    for change in (
        {"config_map": {"a": "2"}},
        {"image": "other"},
        {"env": [EnvVar(name="X", value="y")]},
        {"agent_image_override": "agent:2"},
    ):
        changed = base.model_copy(
            update={
                "spec": base.spec.model_copy(update={"packages": {"driver": pkg.model_copy(update=change)}})
            }
        )
        assert h(changed) != h(base), change


def test_names() -> None:
    long_node = "n" * 200 + ".example.com"
    name = pod_name("nw", "pkg", "1.0.0", PackageStage.POST_INTERRUPT, long_node, 3, "abc")
    assert len(name) <= 63 and DNS_LABEL.match(name)
    assert name != pod_name("nw", "pkg", "1.0.0", PackageStage.POST_INTERRUPT, long_node, 4, "abc")
    assert name == pod_name("nw", "pkg", "1.0.0", PackageStage.POST_INTERRUPT, long_node, 3, "abc")
    assert len(label_value(long_node)) <= 63
    assert label_value("1.0.0+b.1") == "1.0.0_b.1"
    assert package_configmap_name("NW", "pkg", "1.0.0+B") == "nw-pkg-1.0.0-b"
    assert parse_duration_seconds("1h30m") == 5400 and parse_duration_seconds("0") == 0
    assert parse_duration_seconds("1.5s") == 1.5


@given(st.text(min_size=1, max_size=300))
def test_label_values_are_valid(text: str) -> None:
    value = label_value(text)
    assert len(value) <= 63
    assert re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?", value)


@given(st.lists(st.text(min_size=0, max_size=80), min_size=1, max_size=5))
def test_safe_names(parts: list[str]) -> None:
    name = safe_name(*parts)
    assert len(name) <= 63 and DNS_LABEL.match(name)
