"""Unit tests of the simulator's pure parts (no cluster): versions.env parsing, the fleet's Node and
package-pod manifests, and the kwok stage data file.

The package-pod outcome rule (which of pull-error / fail / reboot / succeed a pod gets) is a jq program
kept once in the stage file under the `x-package-kind` anchor. kwok evaluates it with gojq; when a `jq`
binary is installed the rule is also run here against pods built by `package_pod_manifest`, so the
precedence documented in docs/simulator.md is checked without starting kwok (skipped without jq).
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import uuid
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodewright.sim import fleet
from nodewright.sim.binaries import cache_root, controlplane_version, parse_versions_env
from nodewright.sim.controlplane import unestablished, write_kwok_stages

STAGE_FILE = "data/kwok_stages.yaml"
EXPECTED_STAGES = {
    "sim-node-initialize",
    "sim-pod-delete",
    "sim-workload-start",
    "sim-workload-succeed",
    "sim-workload-fail",
    "sim-package-start",
    "sim-package-reboot-handoff",
    "sim-package-succeed",
    "sim-package-fail",
    "sim-package-image-pull-error",
    "sim-package-image-pull-backoff",
}


def _stage_source() -> str:
    return resources.files("nodewright.sim").joinpath(STAGE_FILE).read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------------------
# versions.env


def test_parse_versions_env_expands_like_the_shell() -> None:
    text = """
# comment
K8S=v1.2.3
export ETCD="v3.${MINOR}"
QUOTED='no ${K8S} expansion'
BOTH=k8s-${K8S}_etcd-$ETCD
MISSING=x${NOPE}y
not an assignment
"""
    values = parse_versions_env(text, environ={"MINOR": "6"})
    assert values == {
        "K8S": "v1.2.3",
        "ETCD": "v3.6",
        "QUOTED": "no ${K8S} expansion",
        "BOTH": "k8s-v1.2.3_etcd-v3.6",
        "MISSING": "xy",
    }


def test_parse_versions_env_prefers_earlier_keys_over_environment() -> None:
    assert parse_versions_env("A=1\nB=$A", environ={"A": "env"}) == {"A": "1", "B": "1"}
    assert parse_versions_env("B=$A", environ={"A": "env"}) == {"B": "env"}


def test_repository_versions_env_names_every_component() -> None:
    version = controlplane_version()
    assert version.startswith("k8s-v") and "_etcd-v" in version and "_kwok-v" in version
    assert "$" not in version


def test_cache_root_precedence(tmp_path: Path) -> None:
    assert cache_root({"NODEWRIGHT_CONTROLPLANE_CACHE": str(tmp_path)}) == tmp_path
    assert cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "nodewright" / "controlplane"


# ----------------------------------------------------------------------------------------------------
# Nodes


def test_node_manifest_looks_like_a_gpu_node() -> None:
    node = fleet.node_manifest(7, profile="h100", name_prefix="gpu")
    meta, status = node["metadata"], node["status"]
    assert meta["name"] == "gpu-00007"
    labels = meta["labels"]
    assert len(labels) >= 60
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels[fleet.FLEET_LABEL] == "gpu" and labels[fleet.INDEX_LABEL] == "7"
    assert labels["topology.kubernetes.io/zone"] == "zone-b"  # 7 % 3 == 1
    assert labels[fleet.RACK_LABEL] == "rack-0000"
    assert labels["kubernetes.io/hostname"] == "gpu-00007"
    assert all(len(k.split("/")[-1]) <= 63 and len(v) <= 63 for k, v in labels.items())
    assert meta["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert status["capacity"]["nvidia.com/gpu"] == "8" and status["allocatable"]["nvidia.com/gpu"] == "8"
    ready = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    assert {"type": "InternalIP", "address": "172.16.0.17"} in status["addresses"]
    assert node["spec"]["podCIDR"] == "10.64.7.0/24"
    assert "taints" not in node["spec"]
    info = status["nodeInfo"]
    assert info["kernelVersion"] == labels["feature.node.kubernetes.io/kernel-version.full"]
    uuid.UUID(info["bootID"])  # a valid UUID


def test_node_manifest_is_deterministic_except_boot_id() -> None:
    a = fleet.node_manifest(42, profile="mixed")
    b = fleet.node_manifest(42, profile="mixed")
    assert a["status"]["nodeInfo"]["bootID"] != b["status"]["nodeInfo"]["bootID"]
    for doc in (a, b):
        del doc["status"]["nodeInfo"]["bootID"]
        for cond in doc["status"]["conditions"]:
            del cond["lastHeartbeatTime"], cond["lastTransitionTime"]
    assert a == b
    assert fleet.node_manifest(1)["status"]["nodeInfo"]["machineID"] != a["status"]["nodeInfo"]["machineID"]


def test_zones_profiles_and_pod_cidrs_by_index() -> None:
    zones = [fleet.node_manifest(i)["metadata"]["labels"]["topology.kubernetes.io/zone"] for i in range(6)]
    assert zones == ["zone-a", "zone-b", "zone-c"] * 2
    products = [
        fleet.node_manifest(i, profile="mixed")["metadata"]["labels"]["nvidia.com/gpu.product"]
        for i in range(8)
    ]
    assert [p == "NVIDIA-B200" for p in products] == [i % 4 == 3 for i in range(8)]
    b200 = fleet.node_manifest(0, profile="b200")
    assert b200["metadata"]["labels"]["feature.node.kubernetes.io/system-os_release.VERSION_ID"] == "24.04"
    assert b200["status"]["nodeInfo"]["containerRuntimeVersion"] == "containerd://2.0.2"
    cidrs = [ipaddress.ip_network(fleet.node_manifest(i)["spec"]["podCIDR"]) for i in (0, 1, 255, 300)]
    assert len(set(cidrs)) == 4 and all(n.prefixlen == 24 for n in cidrs)
    with pytest.raises(ValueError, match="unknown profile"):
        fleet.node_manifest(0, profile="a100")


def test_node_manifest_extras_and_taint() -> None:
    node = fleet.node_manifest(
        0, labels_extra={"team": "x", fleet.POOL_LABEL: "custom"}, annotations_extra={"a": "b"}, taint=True
    )
    assert node["metadata"]["labels"]["team"] == "x"
    assert node["metadata"]["labels"][fleet.POOL_LABEL] == "custom"
    assert node["metadata"]["annotations"]["a"] == "b"
    assert node["spec"]["taints"] == [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]


# ----------------------------------------------------------------------------------------------------
# Package pods


def test_package_pod_manifest_shape() -> None:
    pod = fleet.package_pod_manifest(
        name="p1",
        node="gpu-00001",
        package="driver",
        version="2.0.0",
        stage="interrupt",
        nodewright="gpu",
        attempt=3,
        env={"NODEWRIGHT_SIM_DURATION": "1s"},
        interrupt={"type": "reboot"},
    )
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["namespace"] == "nodewright-system"
    assert meta["labels"] == {
        "nodewright.io/managed-by": "nodewright-operator",
        "nodewright.io/nodewright": "gpu",
        "nodewright.io/package": "driver",
        "nodewright.io/version": "2.0.0",
        "nodewright.io/stage": "interrupt",
        "nodewright.io/node": "gpu-00001",
    }
    assert meta["annotations"]["nodewright.io/attempt"] == "3"
    assert json.loads(meta["annotations"]["nodewright.io/interrupt"]) == {"type": "reboot"}
    assert spec["nodeName"] == "gpu-00001" and spec["restartPolicy"] == "Never"
    assert [c["name"] for c in spec["initContainers"]] == [
        "driver-init",
        "driver-interrupt",
        "driver-interruptcheck",
    ]
    assert "env" not in spec["initContainers"][0]
    for agent in spec["initContainers"][1:]:
        assert agent["env"] == [{"name": "NODEWRIGHT_SIM_DURATION", "value": "1s"}]
    assert [c["name"] for c in spec["containers"]] == ["pause"]
    plain = fleet.package_pod_manifest(name="p2", node="n")
    assert "nodewright.io/interrupt" not in plain["metadata"]["annotations"]


# ----------------------------------------------------------------------------------------------------
# kwok stages


def test_stage_file_parses_with_the_expected_stages() -> None:
    doc = yaml.safe_load(_stage_source())
    stages = doc["stages"]
    names = [s["metadata"]["name"] for s in stages]
    assert set(names) == EXPECTED_STAGES and len(names) == len(set(names))
    for stage in stages:
        assert stage["apiVersion"] == "kwok.x-k8s.io/v1alpha1" and stage["kind"] == "Stage"
        assert stage["spec"]["resourceRef"]["kind"] in ("Node", "Pod")
    package = [s for s in stages if s["metadata"]["name"].startswith("sim-package-")]
    for stage in package:
        assert stage["spec"]["selector"]["matchLabels"] == {"nodewright.io/managed-by": "nodewright-operator"}
    workload = [s for s in stages if s["metadata"]["name"].startswith("sim-workload-")]
    for stage in workload:
        keys = {e["key"]: e for e in stage["spec"]["selector"]["matchExpressions"]}
        owner = keys['.metadata.labels["nodewright.io/managed-by"]']
        assert owner["operator"] == "NotIn" and owner["values"] == ["nodewright-operator"]


def test_outcome_rule_is_written_once_and_documented() -> None:
    source = _stage_source()
    assert source.count("x-package-kind: &package-kind") == 1
    doc = yaml.safe_load(source)
    rule = doc["x-package-kind"]
    for outcome in ("pull-error", "fail", "reboot", "succeed"):
        assert f'"{outcome}"' in rule
    # Every outcome the rule produces is consumed by exactly the stages that handle it.
    consumers: dict[str, set[str]] = {}
    for stage in doc["stages"]:
        for expr in stage["spec"]["selector"].get("matchExpressions", []):
            if expr["key"] == rule:
                for value in expr["values"]:
                    consumers.setdefault(value, set()).add(stage["metadata"]["name"])
    assert consumers == {
        "succeed": {"sim-package-start", "sim-package-succeed"},
        "fail": {"sim-package-start", "sim-package-fail"},
        "reboot": {"sim-package-start", "sim-package-reboot-handoff"},
        "pull-error": {"sim-package-image-pull-error"},
    }


def test_rendered_stages_are_one_document_each_with_templates_defined(tmp_path: Path) -> None:
    out = write_kwok_stages(tmp_path / "stages.yaml")
    docs = [d for d in yaml.safe_load_all(out.read_text(encoding="utf-8")) if d]
    config = [d for d in docs if d["kind"] == "KwokConfiguration"]
    assert len(config) == 1 and config[0]["options"]["podPlayStageParallelism"] > 4
    docs = [d for d in docs if d["kind"] == "Stage"]
    assert {d["metadata"]["name"] for d in docs} == EXPECTED_STAGES
    for d in docs:
        template = d["spec"].get("next", {}).get("statusTemplate", "")
        if "{{ template " in template:
            assert '{{ define "ips" }}' in template
        text = json.dumps(d)
        assert "*package-kind" not in text and "x-template-defines" not in text


JQ = shutil.which("jq")


def _outcome(pod: dict[str, Any]) -> str:
    assert JQ is not None
    rule = yaml.safe_load(_stage_source())["x-package-kind"]
    done = subprocess.run(
        [JQ, "-r", rule], input=json.dumps(pod), capture_output=True, text=True, check=True, timeout=10
    )
    return done.stdout.strip()


@pytest.mark.skipif(JQ is None, reason="jq not installed")
@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, "succeed"),
        ({"env": {"NODEWRIGHT_SIM_FAIL": "Always"}}, "fail"),
        ({"env": {"NODEWRIGHT_SIM_FAIL_NODES": "a, n1 ,b"}}, "fail"),
        ({"env": {"NODEWRIGHT_SIM_FAIL_NODES": "a,b"}}, "succeed"),
        ({"env": {"NODEWRIGHT_SIM_FAIL_ATTEMPTS": "2"}, "attempt": 2}, "fail"),
        ({"env": {"NODEWRIGHT_SIM_FAIL_ATTEMPTS": "2"}, "attempt": 3}, "succeed"),
        ({"env": {"NODEWRIGHT_SIM_FAIL": "always", "NODEWRIGHT_SIM_FAIL_STAGES": "config"}}, "succeed"),
        ({"env": {"NODEWRIGHT_SIM_FAIL": "always", "NODEWRIGHT_SIM_FAIL_STAGES": "apply, config"}}, "fail"),
        ({"stage": "interrupt", "interrupt": {"type": "reboot"}}, "reboot"),
        ({"stage": "uninstall-interrupt", "interrupt": {"type": "reboot"}}, "reboot"),
        ({"stage": "interrupt", "interrupt": {"type": "service"}}, "succeed"),
        ({"stage": "apply", "interrupt": {"type": "reboot"}}, "succeed"),
        # Precedence: image pull error, then failure, then reboot.
        (
            {"stage": "interrupt", "interrupt": {"type": "reboot"}, "env": {"NODEWRIGHT_SIM_FAIL": "always"}},
            "fail",
        ),
        ({"env": {"NODEWRIGHT_SIM_IMAGE_PULL_ERROR": "TRUE", "NODEWRIGHT_SIM_FAIL": "always"}}, "pull-error"),
        ({"package_image": "registry.local/sim-pull-error:1"}, "pull-error"),
    ],
)
def test_outcome_rule_with_jq(kwargs: dict[str, Any], expected: str) -> None:
    pod = fleet.package_pod_manifest(name="p", node="n1", **kwargs)
    assert _outcome(pod) == expected


INSTALL = ("apply", "config")


@pytest.mark.skipif(JQ is None, reason="jq not installed")
@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        # FAIL_STAGES names stages the pod runs: an install pod runs apply and config.
        ({"env": {"NODEWRIGHT_SIM_FAIL": "always", "NODEWRIGHT_SIM_FAIL_STAGES": "config"}}, "fail"),
        ({"env": {"NODEWRIGHT_SIM_FAIL": "always", "NODEWRIGHT_SIM_FAIL_STAGES": "upgrade"}}, "succeed"),
        ({"env": {"NODEWRIGHT_SIM_FAIL_ATTEMPTS": "1", "NODEWRIGHT_SIM_FAIL_STAGES": "config"}}, "fail"),
        (
            {
                "env": {"NODEWRIGHT_SIM_FAIL_ATTEMPTS": "1", "NODEWRIGHT_SIM_FAIL_STAGES": "config"},
                "attempt": 2,
            },
            "succeed",
        ),
    ],
)
def test_outcome_rule_reads_the_stages_a_pod_runs(kwargs: dict[str, Any], expected: str) -> None:
    pod = fleet.package_pod_manifest(name="p", node="n1", stages=INSTALL, **kwargs)
    assert _outcome(pod) == expected


def _duration(pod: dict[str, Any]) -> str:
    assert JQ is not None
    rule = yaml.safe_load(_stage_source())["x-package-duration"]
    done = subprocess.run(
        [JQ, "-r", rule], input=json.dumps(pod), capture_output=True, text=True, check=True, timeout=10
    )
    return done.stdout.strip()


@pytest.mark.skipif(JQ is None, reason="jq not installed")
@pytest.mark.parametrize(
    ("duration", "stages", "expected"),
    [
        ("2s", INSTALL, "4s"),  # NODEWRIGHT_SIM_DURATION per stage: an install pod takes twice as long
        ("500ms", INSTALL, "1s"),
        ("1m30s", ("upgrade", "config"), "180s"),
        ("2s", ("post-interrupt",), "2s"),
        (None, INSTALL, "4s"),  # the default, 2 s, per stage
        ("soon", INSTALL, "soon"),  # no Go duration: left to kwok, which falls back to its 2 s
    ],
)
def test_a_package_pod_runs_the_duration_once_per_stage(
    duration: str | None, stages: tuple[str, ...], expected: str
) -> None:
    env = {"NODEWRIGHT_SIM_DURATION": duration} if duration is not None else {}
    pod = fleet.package_pod_manifest(name="p", node="n1", stages=stages, env=env)
    assert _duration(pod) == expected


def _crd(name: str, conditions: list[dict[str, str]] | None) -> dict[str, object]:
    status = {} if conditions is None else {"conditions": conditions}
    return {"kind": "CustomResourceDefinition", "metadata": {"name": name}, "status": status}


def test_a_crd_without_conditions_yet_is_not_established() -> None:
    # The moment kubectl wait trips over (kubernetes/kubernetes#66439): created, no conditions written.
    listing = {
        "kind": "List",
        "items": [
            _crd("a.x", None),
            _crd("b.x", [{"type": "NamesAccepted", "status": "True"}]),
            _crd("c.x", [{"type": "Established", "status": "False"}]),
            _crd("d.x", [{"type": "Established", "status": "True"}]),
        ],
    }
    assert unestablished(listing) == ["a.x", "b.x", "c.x"]


def test_one_established_crd_answered_alone_is_ready() -> None:
    assert unestablished(_crd("d.x", [{"type": "Established", "status": "True"}])) == []
    assert unestablished(_crd("a.x", None)) == ["a.x"]
