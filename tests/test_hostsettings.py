"""Host settings two packages would fight over (`nodewright.api.hostsettings`), found before a node sees
them: by `nodewright package validate -f` and as admission warnings (`nodewright.webhook.conflicts`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from nodewright.api import hostsettings
from nodewright.api.hostsettings import SettingKind, package_settings, selector_intersection
from nodewright.webhook.server import Handlers, LookupError_

JSON = dict[str, Any]
REPO = Path(__file__).resolve().parent.parent


def nodewright(name: str, packages: dict[str, JSON], selector: JSON | None = None) -> JSON:
    spec: JSON = {
        "packages": {k: {"version": "1.0.0", "image": f"ghcr.io/x/{k}", **v} for k, v in packages.items()}
    }
    if selector is not None:
        spec["nodeSelectors"] = selector
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": name},
        "spec": spec,
    }


def sysctls(text: str, key: str = "sysctl.conf") -> JSON:
    return {"configMap": {key: text}}


TUNING = {
    "configMap": {"accelerator": "hopper", "workload": "training", "overrides": "sysctl vm.swappiness 1\n"}
}


# ----------------------------------------------------------------------------------------------------
# Reading ConfigMaps


def test_the_recognised_formats_are_read_as_sysctl_d_grub_and_tuning_read_them() -> None:
    found = package_settings(
        {
            "sysctl.conf": "# comment\n; other comment\nvm.swappiness = 10\n-net/core/rmem_max=268435456\n"
            "net.ipv4.tcp_rmem = 4096\t131072   268435456\n",
            "90-gpu-sysctl.conf": "kernel.numa_balancing=0\n",
            "grub.conf": "iommu.passthrough=1 pcie-aspm=off\n# hugepages=9\nnosmt\n",
            "run.sh": "vm.swappiness = 99\n",  # the package's own business: not read
        }
    )
    assert {(s.kind, s.key, s.value, s.source) for s in found.settings} == {
        (SettingKind.SYSCTL, "vm.swappiness", "10", "sysctl.conf"),
        (SettingKind.SYSCTL, "net.core.rmem_max", "268435456", "sysctl.conf"),
        (SettingKind.SYSCTL, "net.ipv4.tcp_rmem", "4096 131072 268435456", "sysctl.conf"),
        (SettingKind.SYSCTL, "kernel.numa_balancing", "0", "90-gpu-sysctl.conf"),
        (SettingKind.KERNEL_PARAMETER, "iommu.passthrough", "1", "grub.conf"),
        (SettingKind.KERNEL_PARAMETER, "pcie_aspm", "off", "grub.conf"),
        (SettingKind.KERNEL_PARAMETER, "nosmt", "", "grub.conf"),
    }
    assert found.problems == ()
    tuning = package_settings(
        {
            "accelerator": "hopper",
            "overrides": "sysctl vm.swappiness 5\ngrub init_on_alloc -\n"
            "sysctl vm.max_map_count !\npower cpu_boost 1\n",
        }
    )
    assert {(s.kind, s.key, s.value) for s in tuning.settings} == {
        (SettingKind.SYSCTL, "vm.swappiness", "5"),
        (SettingKind.KERNEL_PARAMETER, "init_on_alloc", ""),
    }
    assert package_settings({"overrides": "sysctl vm.swappiness 5\n"}).settings == (), (
        "only beside accelerator"
    )


def test_lines_that_do_not_parse_are_problems_not_settings() -> None:
    found = package_settings({"sysctl.conf": "vm.swappiness 10\nok.key=1\n", "grub.conf": "a=1 =bad\n"})
    assert [s.key for s in found.settings] == ["a", "ok.key"] or {s.key for s in found.settings} == {
        "a",
        "ok.key",
    }
    assert found.problems == ("grub.conf line 1: '=bad' is not a kernel parameter",
                              "sysctl.conf line 1: 'vm.swappiness 10' is not `key = value`")  # fmt: skip


def test_within_a_package_the_last_value_counts() -> None:
    found = package_settings({"sysctl.conf": "vm.swappiness=10\nvm.swappiness=1\n"})
    assert [(s.key, s.value) for s in found.settings] == [("vm.swappiness", "1")]


# ----------------------------------------------------------------------------------------------------
# Conflicts


def test_two_packages_of_one_nodewright_that_disagree_are_named_both() -> None:
    nw = nodewright(
        "gpu", {"sysctls": sysctls("vm.swappiness = 10\nvm.max_map_count=1048576\n"), "tuning": TUNING}
    )
    (conflict,) = hostsettings.conflicts_within(nw)
    text = conflict.describe()
    assert text.startswith(
        "sysctl vm.swappiness: package 'sysctls' of NodeWright 'gpu' sets 10 (configMap key"
    )
    assert "package 'tuning' of NodeWright 'gpu' sets 1 (configMap key overrides)" in text
    agreeing = nodewright(
        "gpu",
        {"a": sysctls("net.ipv4.tcp_rmem = 4096 131072"), "b": sysctls("net.ipv4.tcp_rmem=4096  131072")},
    )
    assert hostsettings.conflicts_within(agreeing) == []


values = st.sampled_from(["0", "1", "10", "4096 131072"])
keys = st.sampled_from(["vm.swappiness", "kernel.numa_balancing", "net.core.rmem_max"])
packages = st.dictionaries(
    st.sampled_from(["a", "b", "c"]), st.dictionaries(keys, values, max_size=3), max_size=3
)


def _nw(name: str, table: dict[str, dict[str, str]]) -> JSON:
    return nodewright(
        name, {p: sysctls("".join(f"{k} = {v}\n" for k, v in kv.items())) for p, kv in table.items()}
    )


@given(packages, packages)
def test_conflicts_between_two_nodewrights_are_exactly_the_keys_they_set_differently(
    left: dict[str, dict[str, str]], right: dict[str, dict[str, str]]
) -> None:
    ours, theirs = _nw("ours", left), _nw("theirs", right)
    found = hostsettings.conflicts_between(ours, theirs)
    expected = {
        (key, a, b)
        for a, kv_a in left.items()
        for b, kv_b in right.items()
        for key in kv_a.keys() & kv_b.keys()
        if kv_a[key] != kv_b[key]
    }
    assert {(c.key, c.first.package, c.second.package) for c in found} == expected
    assert len(hostsettings.conflicts_between(theirs, ours)) == len(found)
    assert all(c.first.nodewright == "ours" and c.second.nodewright == "theirs" for c in found)


@given(packages)
def test_a_nodewright_never_conflicts_with_a_copy_of_itself_package_by_package(
    table: dict[str, dict[str, str]],
) -> None:
    same = dict(table)
    assert all(
        c.first.package != c.second.package
        for c in hostsettings.conflicts_between(_nw("a", table), _nw("b", same))
    )


def test_selector_intersection_is_the_label_selector_of_nodes_both_select() -> None:
    gpu = {"matchLabels": {"pool": "gpu"}}
    assert selector_intersection(gpu, {"matchLabels": {"pool": "cpu"}}) is None
    assert selector_intersection({}, {}) == ""
    assert selector_intersection(gpu, {}) == "pool=gpu"
    both = selector_intersection(
        {"matchLabels": {"zone": "a", "pool": "gpu"}},
        {"matchExpressions": [{"key": "gpu.product", "operator": "In", "values": ["H100", "H200"]},
                              {"key": "cordoned", "operator": "DoesNotExist"},
                              {"key": "x", "operator": "Exists"},
                              {"key": "os", "operator": "NotIn", "values": ["win"]}]},
    )  # fmt: skip
    assert both == "pool=gpu,zone=a,gpu.product in (H100,H200),!cordoned,x,os notin (win)"


# ----------------------------------------------------------------------------------------------------
# Admission


class PeerFacts:
    def __init__(self, others: list[JSON], *, nodes: bool = True, fail: bool = False) -> None:
        self.others, self.nodes, self.fail = others, nodes, fail
        self.selectors: list[str] = []

    async def policy_exists(self, name: str) -> bool:
        return True

    async def nodewrights_using_policy(self, name: str) -> list[str]:
        return []

    async def package_present(self, nodewright: str, package: str) -> bool:
        return False

    async def nodewrights(self) -> list[JSON]:
        if self.fail:
            raise LookupError_("LIST nodewrights: HTTP 503")
        return self.others

    async def selects_any_node(self, label_selector: str) -> bool:
        self.selectors.append(label_selector)
        return self.nodes


def review(obj: JSON, *, operation: str = "CREATE", old: JSON | None = None) -> JSON:
    request: JSON = {"uid": "u", "operation": operation, "object": obj, "name": obj["metadata"]["name"]}
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


async def test_admission_warns_naming_both_packages_and_never_denies() -> None:
    gpu = {"matchLabels": {"pool": "gpu"}}
    theirs = nodewright("kernel", {"sysctls": sysctls("vm.swappiness=10\n")}, gpu)
    ours = nodewright(
        "tune",
        {"tuning": TUNING},
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]},
    )
    facts = PeerFacts([theirs, ours])
    answer = (await Handlers(facts).validate_nodewright(review(ours)))["response"]
    assert answer["allowed"] is True
    (warning,) = [w for w in answer.get("warnings", []) if "vm.swappiness" in w]
    assert warning.startswith("spec.packages[tuning].configMap[overrides]: sysctl vm.swappiness:")
    assert "package 'tuning' of NodeWright 'tune' sets 1" in warning
    assert "package 'sysctls' of NodeWright 'kernel' sets 10" in warning
    assert "(NodeWright 'kernel' selects some of the same nodes)" in warning
    assert facts.selectors == ["pool=gpu,pool in (gpu)"], (
        "one question to the API server, with both selectors"
    )
    # No node selected by both: nothing to warn about.
    quiet = (await Handlers(PeerFacts([theirs], nodes=False)).validate_nodewright(review(ours)))["response"]
    assert not [w for w in quiet.get("warnings", []) if "swappiness" in w]
    # Selectors that cannot meet are not even asked about.
    apart = PeerFacts(
        [nodewright("k2", {"s": sysctls("vm.swappiness=10\n")}, {"matchLabels": {"pool": "cpu"}})]
    )
    await Handlers(apart).validate_nodewright(review(nodewright("t2", {"tuning": TUNING}, gpu)))
    assert apart.selectors == []
    # A lookup that fails is a warning too, and still no denial.
    failed = (await Handlers(PeerFacts([], fail=True)).validate_nodewright(review(ours)))["response"]
    assert failed["allowed"] is True
    assert any("could not check other NodeWrights" in w and "HTTP 503" in w for w in failed["warnings"])


async def test_admission_warns_within_one_nodewright_and_not_on_metadata_only_updates() -> None:
    nw = nodewright("gpu", {"sysctls": sysctls("vm.swappiness = 10\n"), "tuning": TUNING})
    answer = (await Handlers(PeerFacts([])).validate_nodewright(review(nw)))["response"]
    assert answer["allowed"] is True
    assert any(
        w.startswith("spec.packages[sysctls].configMap[sysctl.conf]: sysctl vm.swappiness")
        for w in answer["warnings"]
    )
    paused = {**nw, "metadata": {"name": "gpu", "annotations": {"nodewright.io/pause": "true"}}}
    again = (await Handlers(PeerFacts([])).validate_nodewright(review(paused, operation="UPDATE", old=nw)))[
        "response"
    ]
    assert not [w for w in again.get("warnings", []) if "swappiness" in w]


# ----------------------------------------------------------------------------------------------------
# nodewright package validate -f


def validate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodewright", "package", "validate", *args],
        capture_output=True, text=True, check=False, timeout=60, cwd=REPO,
    )  # fmt: skip


def test_package_validate_reports_conflicting_settings_in_manifests(tmp_path: Path) -> None:
    gpu = {"matchLabels": {"pool": "gpu"}}
    one = tmp_path / "one.yaml"
    one.write_text(
        yaml.safe_dump(nodewright("gpu", {"sysctls": sysctls("vm.swappiness = 10\n"), "tuning": TUNING}, gpu))
    )
    done = validate("-f", str(one))
    assert done.returncode == 1, done
    assert "error: sysctl vm.swappiness: package 'sysctls' of NodeWright 'gpu' sets 10" in done.stderr
    # Two NodeWrights in one file: the same selector always meets (error), overlapping ones may (warning).
    two = tmp_path / "two.yaml"
    docs = [
        nodewright("kernel", {"sysctls": sysctls("vm.swappiness = 10\n")}, gpu),
        nodewright("same", {"tuning": TUNING}, gpu),
        nodewright("zone", {"tuning": TUNING}, {"matchLabels": {"zone": "a"}}),
        nodewright("apart", {"tuning": TUNING}, {"matchLabels": {"pool": "cpu"}}),
    ]
    two.write_text(yaml.safe_dump_all(docs))
    done = validate("-f", str(two))
    assert done.returncode == 1, done
    assert "NodeWright 'same' sets 1" in done.stderr and "-- both select the same nodes" in done.stderr
    assert "-- if any node is among nodes matching 'pool=gpu,zone=a'" in done.stderr
    assert "'apart'" not in done.stderr, "its selector meets neither NodeWright it disagrees with"
    fine = tmp_path / "fine.yaml"
    fine.write_text(
        yaml.safe_dump(nodewright("gpu", {"sysctls": sysctls("vm.swappiness = 1\n"), "tuning": TUNING}, gpu))
    )
    done = validate(str(REPO / "packages" / "tuning"), "-f", str(fine))
    assert done.returncode == 0, done.stderr
    assert "1 NodeWright(s), no conflicting host settings" in done.stdout
    assert validate().returncode == 2
