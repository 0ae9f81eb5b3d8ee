"""The tuning package's cloud rows and its Container-Optimized OS mode, on scratch node roots.

Cloud: the optional `cloud` key adds the table's rows for that cloud (replacing or removing general rows)
and every run prints what the intent writes. COS: a root whose /etc/os-release says ID=cos stands for a
GKE node; its /proc/sys and sysfs files stand for the running kernel (there is no simulated boot on COS:
the package writes the running values itself). Each check is shown failing once its change is undone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.packages_node import Node, node

SYSCTL = "/etc/sysctl.d/90-nodewright-tuning.conf"
GRUB = "/etc/default/grub.d/90-nodewright-tuning.cfg"
POWER = "/etc/tmpfiles.d/90-nodewright-tuning.conf"
HOPPER_TRAINING = {"accelerator": "hopper\n", "workload": "training\n"}
APPLIED = "/var/lib/nodewright-tuning/cos-applied"
ORIGINAL = "/var/lib/nodewright-tuning/cos-original"
# What a COS kernel has before tuning (the keys of every intent, with the kernel's defaults).
COS_DEFAULTS = {
    "vm/max_map_count": "65530",
    "net/ipv4/conf/all/arp_announce": "0",
    "net/ipv4/conf/all/arp_ignore": "0",
    "kernel/numa_balancing": "1",
    "net/core/rmem_max": "212992",
    "net/core/wmem_max": "212992",
    "net/ipv4/tcp_rmem": "4096\t131072\t6291456",
    "net/ipv4/tcp_wmem": "4096\t16384\t4194304",
    "net/core/netdev_max_backlog": "1000",
    "net/ipv4/tcp_mtu_probing": "0",
    "vm/swappiness": "60",
    "net/core/somaxconn": "4096",
    "net/ipv4/tcp_max_syn_backlog": "1024",
    "net/ipv4/ip_local_port_range": "32768\t60999",
}


@pytest.fixture
def host(tmp_path: Path) -> Node:
    return node(tmp_path)


def _settings(text: str) -> dict[str, str]:
    return {
        key.strip(): value.strip()
        for key, _, value in (line.partition("=") for line in text.splitlines())
        if key and not key.startswith("#")
    }


# ----------------------------------------------------------------------------------------------------
# cloud


def test_without_a_cloud_the_files_are_what_they_were_before_clouds_existed(host: Node) -> None:
    host.ok("config", "tuning", HOPPER_TRAINING)
    first = host.read(SYSCTL).splitlines()[0]
    assert first == (
        "# Written by the NodeWright tuning package for accelerator=hopper workload=training; "
        "removed on uninstall."
    )
    assert "nvme_core" not in host.read(GRUB)
    host.ok("config-check", "tuning", {**HOPPER_TRAINING, "cloud": "on-prem\n"})


def test_aws_adds_the_ebs_timeout_and_the_run_shows_what_the_intent_writes(host: Node) -> None:
    config = {**HOPPER_TRAINING, "cloud": "aws\n"}
    text = host.ok("apply", "tuning", config)
    assert (
        "intent: accelerator=hopper workload=training cloud=aws: 11 sysctl settings, 4 kernel parameters"
        in text
    )
    for shown in (
        "tuning:   sysctl vm.max_map_count = 1048576",
        "tuning:   sysctl net.ipv4.tcp_rmem = 4096 131072 268435456",
        "tuning:   kernel parameter nvme_core.io_timeout=4294967295",
        "tuning:   power cpu_governor = performance (/sys/devices/system/cpu/cpu[0-9]*/cpufreq/"
        "scaling_governor)",
    ):
        assert shown in text
    assert host.read(GRUB).endswith('init_on_alloc=0 nvme_core.io_timeout=4294967295"\n')
    assert "cloud=aws" in host.read(SYSCTL).splitlines()[0]
    host.ok("apply-check", "tuning", config)
    text = host.fails("config-check", "tuning", HOPPER_TRAINING)  # the intent without the cloud
    assert f"{GRUB} differs from what accelerator=hopper workload=training gives" in text

    host.write("/etc/default/grub", 'GRUB_CMDLINE_LINUX=""\n')
    host.boot()
    host.ok("post-interrupt-check", "tuning", config)
    host.write("/proc/cmdline", host.read("/proc/cmdline").replace("nvme_core.io_timeout=4294967295", ""))
    text = host.fails("post-interrupt-check", "tuning", config)
    assert "kernel parameter nvme_core.io_timeout=4294967295 is not in effect" in text


def test_a_cloud_row_removes_what_its_machines_do_not_have(host: Node) -> None:
    inference = {"accelerator": "generic\n", "workload": "inference\n"}
    host.ok("config", "tuning", inference)
    assert "cpufreq/boost" in host.read(POWER)
    text = host.ok("config", "tuning", {**inference, "cloud": "gcp"})
    assert f"removed {POWER}" in text, "Compute Engine VMs have no cpufreq: no power settings"
    assert "0 power settings" in text
    host.ok("config-check", "tuning", {**inference, "cloud": "gcp"})
    host.write(POWER, "w /sys/devices/system/cpu/cpufreq/boost - - - - 1\n")
    text = host.fails("config-check", "tuning", {**inference, "cloud": "gcp"})
    assert f"{POWER} exists but the intent has nothing of its kind" in text


def test_oci_loosens_reverse_path_filtering_and_it_is_read_back(host: Node) -> None:
    config = {"accelerator": "generic", "workload": "training", "cloud": "oci"}
    host.ok("config", "tuning", config)
    assert _settings(host.read(SYSCTL))["net.ipv4.conf.all.rp_filter"] == "2"
    host.boot()
    host.ok("post-interrupt-check", "tuning", config)
    host.write("/proc/sys/net/ipv4/conf/all/rp_filter", "1\n")
    text = host.fails("post-interrupt-check", "tuning", config)
    assert "sysctl net.ipv4.conf.all.rp_filter is '1' on the running node, not '2'" in text


def test_an_unknown_cloud_is_refused_before_anything_is_written(host: Node) -> None:
    text = host.fails("apply", "tuning", {**HOPPER_TRAINING, "cloud": "ibm"})
    assert "configMap key 'cloud' is 'ibm'; use one of: on-prem aws gcp azure oci" in text
    assert not host.path(SYSCTL).exists()


# ----------------------------------------------------------------------------------------------------
# Container-Optimized OS


def cos(host: Node) -> Node:
    """A GKE node's root: COS's os-release and a running kernel with its default values."""
    host.write("/etc/os-release", 'NAME="Container-Optimized OS"\nID=cos\nVERSION_ID=117\n')
    boot_cos(host)
    return host


def boot_cos(host: Node) -> None:
    """What a COS reboot does to the running values: the kernel's defaults, /etc empty again."""
    for key, value in COS_DEFAULTS.items():
        host.write(f"/proc/sys/{key}", value + "\n")
    for cpu in (0, 1):
        host.write(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", "powersave\n")


def running(host: Node, key: str) -> str:
    return " ".join(host.read("/proc/sys/" + key.replace(".", "/")).split())


def test_cos_writes_the_running_values_and_leaves_the_kernel_parameters_out(host: Node) -> None:
    cos(host)
    text = host.ok("apply", "tuning", HOPPER_TRAINING)
    assert "intent: accelerator=hopper workload=training cloud=gcp" in text, "COS means Google Cloud"
    assert (
        "not on Container-Optimized OS: kernel parameters iommu.passthrough=1 pcie_aspm=off init_on_alloc=0"
        in text
    )
    assert "set sysctl vm.swappiness = 10 (was '60')" in text
    assert "applied to the running node" in text
    assert running(host, "net.ipv4.tcp_rmem") == "4096 131072 268435456"
    assert running(host, "kernel.numa_balancing") == "0"
    for path in (SYSCTL, GRUB, POWER):
        assert not host.path(path).exists(), "nothing in /etc: COS resets it at every boot"
    assert "sysctl vm.swappiness 60" in host.read(ORIGINAL).splitlines()
    assert "sysctl net.ipv4.tcp_rmem 4096 131072 6291456" in host.read(ORIGINAL).splitlines()
    for mode in ("apply-check", "config-check", "post-interrupt-check"):
        assert "the running node has every value of" in host.ok(mode, "tuning", HOPPER_TRAINING)
    for mode in ("config", "upgrade"):
        text = host.ok(mode, "tuning", HOPPER_TRAINING)
        assert "unchanged: sysctl vm.swappiness = 10" in text and "set sysctl" not in text
    host.ok("upgrade-check", "tuning", HOPPER_TRAINING)


@pytest.mark.parametrize(
    ("undo", "message"),
    [
        (
            lambda n: n.write("/proc/sys/vm/swappiness", "60\n"),
            "sysctl vm.swappiness is '60' on the running node",
        ),
        (
            lambda n: n.write("/proc/sys/net/ipv4/tcp_wmem", "4096\t16384\t4194304\n"),
            "sysctl net.ipv4.tcp_wmem is '4096 16384 4194304' on the running node, "
            "not '4096 65536 268435456'",
        ),
        (
            lambda n: n.write("/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "powersave\n"),
            "power cpu_governor is 'powersave' in",
        ),
        (lambda n: n.path(APPLIED).unlink(), f"{APPLIED} is missing"),
        (boot_cos, "sysctl vm.max_map_count is '65530' on the running node"),
    ],
)
def test_cos_checks_fail_when_a_value_is_undone(host: Node, undo: object, message: str) -> None:
    config = {**HOPPER_TRAINING, "overrides": "power cpu_governor performance\n"}  # gcp drops the table's
    cos(host)
    host.ok("config", "tuning", config)
    host.ok("config-check", "tuning", config)
    assert callable(undo)
    undo(host)
    text = host.fails("config-check", "tuning", config)
    assert message in text
    assert "give the NodeWright driftDetection with action: reapply" in text or "is missing" in text
    host.ok("config", "tuning", config)  # what drift detection's reapply runs
    host.ok("config-check", "tuning", config)


def test_cos_refuses_what_it_cannot_do_before_changing_anything(host: Node) -> None:
    cos(host)
    text = host.fails(
        "apply", "tuning", {**HOPPER_TRAINING, "overrides": "grub nosoftlockup -\nsysctl vm.swappiness 5\n"}
    )
    assert "Container-Optimized OS boots a fixed kernel command line" in text
    assert "the overrides ask for kernel parameters it cannot set (nosoftlockup)" in text
    assert running(host, "vm.swappiness") == "60" and not host.path(ORIGINAL).exists()
    text = host.fails("apply", "tuning", {**HOPPER_TRAINING, "cloud": "aws"})
    assert "runs Container-Optimized OS, Google's node image, but the configMap says cloud=aws" in text
    host.path("/proc/sys/net/core/somaxconn").unlink()
    text = host.fails("apply", "tuning", {"accelerator": "generic", "workload": "inference"})
    assert (
        "this kernel has no sysctl net.core.somaxconn (no file under /proc/sys): nothing was changed" in text
    )
    assert running(host, "vm.swappiness") == "60"
    # Taking a kernel parameter out of the intent is how a user says "I know": it is not refused.
    host.ok("apply", "tuning", {**HOPPER_TRAINING, "overrides": "grub pcie_aspm !\n"})


def test_cos_config_change_gives_back_what_leaves_the_intent_and_uninstall_restores_everything(
    host: Node,
) -> None:
    cos(host)
    host.ok("config", "tuning", HOPPER_TRAINING)
    text = host.ok("config", "tuning", {"accelerator": "generic", "workload": "inference"})
    assert "restored sysctl net.core.rmem_max = 212992 (no longer in the intent)" in text
    assert "restored sysctl kernel.numa_balancing = 1" in text
    assert running(host, "net.core.rmem_max") == "212992" and running(host, "vm.swappiness") == "1"
    host.ok("config-check", "tuning", {"accelerator": "generic", "workload": "inference"})

    text = host.ok("uninstall", "tuning", {"accelerator": "generic", "workload": "inference"})
    assert "restored sysctl vm.swappiness = 60" in text
    for key, value in COS_DEFAULTS.items():
        assert " ".join(host.read(f"/proc/sys/{key}").split()) == " ".join(value.split()), key
    assert not host.path("/var/lib/nodewright-tuning").exists()
    host.ok("uninstall-check", "tuning", {})
    host.write(APPLIED, "# left behind\n")
    assert "/var/lib/nodewright-tuning is still there" in host.fails("uninstall-check", "tuning", {})
