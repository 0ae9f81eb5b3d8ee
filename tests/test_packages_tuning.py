"""The tuning package (packages/tuning) on a scratch node root, through the agent, unprivileged.

Each test applies an intent, then undoes part of the change behind the package's back and proves that
the matching check fails: the files (apply/config-check) and the values read back from the running
node after a simulated boot (post-interrupt-check).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.packages_node import PACKAGES, Node, node

SYSCTL = "/etc/sysctl.d/90-nodewright-tuning.conf"
GRUB = "/etc/default/grub.d/90-nodewright-tuning.cfg"
POWER = "/etc/tmpfiles.d/90-nodewright-tuning.conf"
HOPPER_TRAINING = {"accelerator": "hopper\n", "workload": "training\n"}


@pytest.fixture
def host(tmp_path: Path) -> Node:
    return node(tmp_path)


def _settings(text: str) -> dict[str, str]:
    return {
        key.strip(): value.strip()
        for key, _, value in (line.partition("=") for line in text.splitlines())
        if key and not key.startswith("#")
    }


def test_an_intent_becomes_sysctl_grub_and_power_files(host: Node) -> None:
    text = host.ok("apply", "tuning", HOPPER_TRAINING)
    assert "accelerator=hopper workload=training: 11 sysctl settings, 3 kernel parameters" in text
    sysctl = _settings(host.read(SYSCTL))
    assert sysctl["net.ipv4.tcp_rmem"] == "4096 131072 268435456"
    assert sysctl["vm.swappiness"] == "10"  # the training row
    assert sysctl["kernel.numa_balancing"] == "0"  # the hopper row
    assert "net.core.somaxconn" not in sysctl  # an inference row
    grub = host.read(GRUB)
    assert (
        'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu.passthrough=1 pcie_aspm=off init_on_alloc=0"' in grub
    )
    assert "w /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor - - - - performance" in host.read(
        POWER
    )
    assert "the node's root is" in text and "not regenerated" in text, "update-grub only on the node itself"
    host.ok("apply-check", "tuning", HOPPER_TRAINING)


def test_rerunning_changes_nothing(host: Node) -> None:
    host.ok("apply", "tuning", HOPPER_TRAINING)
    stamps = {f: host.path(f).stat().st_mtime_ns for f in (SYSCTL, GRUB, POWER)}
    text = host.ok("config", "tuning", HOPPER_TRAINING)
    assert text.count("unchanged: ") == 3 and "changed:" not in text.replace("unchanged:", "")
    assert stamps == {f: host.path(f).stat().st_mtime_ns for f in (SYSCTL, GRUB, POWER)}
    host.ok("config-check", "tuning", HOPPER_TRAINING)


@pytest.mark.parametrize(
    ("undo", "message"),
    [
        (lambda n: n.path(SYSCTL).unlink(), f"{SYSCTL} is missing"),
        (lambda n: n.write(GRUB, n.read(GRUB).replace("pcie_aspm=off ", "")), f"{GRUB} differs"),
        (lambda n: n.write(POWER, n.read(POWER).replace("performance", "powersave")), f"{POWER} differs"),
    ],
)
def test_config_check_fails_when_a_file_is_changed_by_hand(host: Node, undo: object, message: str) -> None:
    host.ok("config", "tuning", HOPPER_TRAINING)
    assert callable(undo)
    undo(host)
    text = host.fails("config-check", "tuning", HOPPER_TRAINING)
    assert message in text


def test_post_interrupt_check_reads_the_values_back_from_the_booted_node(host: Node) -> None:
    host.write("/etc/default/grub", 'GRUB_CMDLINE_LINUX=""\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    for cpu in (0, 1):
        host.write(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", "powersave\n")
    host.ok("config", "tuning", HOPPER_TRAINING)
    before = host.fails("post-interrupt-check", "tuning", HOPPER_TRAINING)
    assert "proc/cmdline is missing" in before  # not rebooted yet

    host.boot()
    assert "\t" in host.read("/proc/sys/net/ipv4/tcp_rmem"), "procfs prints several fields tab-separated"
    assert "iommu.passthrough=1 pcie_aspm=off init_on_alloc=0 quiet" in host.read("/proc/cmdline")
    text = host.ok("post-interrupt-check", "tuning", HOPPER_TRAINING)
    assert "the running node has every value of accelerator=hopper workload=training" in text

    host.write("/proc/sys/vm/swappiness", "60\n")  # someone ran sysctl -w behind the package's back
    host.write("/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "schedutil\n")
    host.write("/proc/cmdline", host.read("/proc/cmdline").replace("pcie_aspm=off", "pcie_aspm=force"))
    host.path("/proc/sys/net/core/rmem_max").unlink()
    text = host.fails("post-interrupt-check", "tuning", HOPPER_TRAINING)
    assert "sysctl vm.swappiness is '60' on the running node, not '10'" in text
    assert "power cpu_governor is 'schedutil' in" in text and "cpu1/cpufreq/scaling_governor" in text
    assert "kernel parameter pcie_aspm=off is not in effect (the command line has 'pcie_aspm=force'" in text
    assert "sysctl net.core.rmem_max:" in text and "does not exist" in text


def test_a_value_only_set_at_runtime_does_not_survive_the_boot(host: Node) -> None:
    host.ok("config", "tuning", HOPPER_TRAINING)
    host.boot()
    host.ok("post-interrupt-check", "tuning", HOPPER_TRAINING)
    host.path(SYSCTL).write_text(host.read(SYSCTL).replace("vm.swappiness = 10", "vm.swappiness = 30"))
    host.boot()
    text = host.fails("post-interrupt-check", "tuning", HOPPER_TRAINING)
    assert f"{SYSCTL} differs" in text and "sysctl vm.swappiness is '30'" in text


def test_a_new_intent_rewrites_the_files_and_drops_what_no_longer_applies(host: Node) -> None:
    host.ok("config", "tuning", HOPPER_TRAINING)
    generic_inference = {"accelerator": "generic", "workload": "inference"}
    text = host.ok("config", "tuning", generic_inference)
    assert f"removed {GRUB}" in text, "generic has no kernel parameters"
    sysctl = _settings(host.read(SYSCTL))
    assert sysctl["net.core.somaxconn"] == "65535" and sysctl["vm.swappiness"] == "1"
    assert "net.ipv4.tcp_rmem" not in sysctl and "kernel.numa_balancing" not in sysctl
    assert "cpu_boost" not in host.read(POWER) and "cpufreq/boost - - - - 1" in host.read(POWER)
    host.ok("config-check", "tuning", generic_inference)
    text = host.fails("config-check", "tuning", HOPPER_TRAINING)
    assert f"{GRUB} is missing" in text


def test_overrides_replace_and_remove_table_entries(host: Node) -> None:
    config = {
        **HOPPER_TRAINING,
        "overrides": "# local changes\nsysctl vm.swappiness 5\ngrub pcie_aspm !\ngrub nosoftlockup -\n",
    }
    host.ok("config", "tuning", config)
    assert _settings(host.read(SYSCTL))["vm.swappiness"] == "5"
    assert 'iommu.passthrough=1 init_on_alloc=0 nosoftlockup"' in host.read(GRUB)
    host.ok("config-check", "tuning", config)
    host.boot()
    host.ok("post-interrupt-check", "tuning", config)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"accelerator": "ampere", "workload": "training"}, "'accelerator' is 'ampere'; use one of: hopper"),
        ({"accelerator": "hopper", "workload": "training inference"}, "'workload' is 'training inference'"),
        (
            {**HOPPER_TRAINING, "overrides": "sysctl vm.x $(reboot)\n"},
            "overrides line 1: the value '$(reboot)'",
        ),
        ({**HOPPER_TRAINING, "overrides": "sysctl ../../etc/x 1\n"}, "sysctl key '../../etc/x' must be"),
        ({**HOPPER_TRAINING, "overrides": 'grub quiet"; reboot; " -\n'}, "kernel parameter 'quiet\";'"),
        ({**HOPPER_TRAINING, "overrides": "power cpu_turbo 1\n"}, "unknown power setting 'cpu_turbo'"),
        ({**HOPPER_TRAINING, "overrides": "module nvidia 1\n"}, "kind 'module' is not sysctl, grub or power"),
    ],
)
def test_bad_intents_fail_before_anything_is_written(
    host: Node, config: dict[str, str], message: str
) -> None:
    text = host.fails("apply", "tuning", config)
    assert message in text
    assert not host.path(SYSCTL).exists() and not host.path(GRUB).exists()


def test_a_missing_intent_key_is_named_by_the_agent(host: Node) -> None:
    text = host.fails("apply", "tuning", {"accelerator": "hopper"})
    assert "expected config file configmaps/workload is missing" in text


def test_uninstall_removes_the_files_and_its_check_sees_leftovers(host: Node) -> None:
    host.ok("config", "tuning", HOPPER_TRAINING)
    text = host.ok("uninstall", "tuning", HOPPER_TRAINING)
    assert "keeps the current values until the next reboot" in text
    for path in (SYSCTL, GRUB, POWER):
        assert not host.path(path).exists()
    host.ok("uninstall-check", "tuning", HOPPER_TRAINING)
    host.write(GRUB, "GRUB_CMDLINE_LINUX=x\n")
    assert f"{GRUB} is still there" in host.fails("uninstall-check", "tuning", HOPPER_TRAINING)


def test_the_readme_documents_every_row_of_the_table() -> None:
    readme = (PACKAGES / "tuning" / "README.md").read_text()
    rows = [
        line.split(None, 5)
        for line in (PACKAGES / "tuning" / "skyhook_dir" / "tuning.table").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert len(rows) > 25
    assert {row[0] for row in rows} == {"*", "aws", "gcp", "azure", "oci"}, "every cloud has its rows"
    for cloud, accelerator, workload, kind, key, value in rows:
        cells = [f"`{re.escape(cell)}`" for cell in (cloud, accelerator, workload)] + [
            kind,
            f"`{re.escape(key)}`",
        ]
        pattern = r"\|\s*" + r"\s*\|\s*".join([*cells, f"`{re.escape(value)}`"]) + r"\s*\|\s*\S"
        assert re.search(pattern, readme), (
            f"README.md has no table row (with a reason) for {cloud} {accelerator} {workload} {kind} {key}"
        )
