"""The kdump package (packages/kdump) on a scratch node root, through the agent, unprivileged.

The configuration files, the GRUB snippet's effect on the kernel command line (sourced by /bin/sh as
update-grub does, next to a distribution's own crashkernel= snippet), the read-back after a simulated
boot, the original defaults file kept and restored, and each check failing once its change is undone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.packages_node import Node, node

DEFAULTS = "/etc/default/kdump-tools"
BACKUP = "/etc/default/kdump-tools.nodewright-orig"
SNIPPET = "/etc/default/grub.d/zz-nodewright-kdump.cfg"
CONFIG = {"crashkernel": "512M\n"}
DISTRIBUTION_DEFAULTS = "# kdump-tools configuration\nUSE_KDUMP=0\n"


@pytest.fixture
def host(tmp_path: Path) -> Node:
    host = node(tmp_path)
    host.write(DEFAULTS, DISTRIBUTION_DEFAULTS)
    host.write(
        "/etc/default/grub", 'GRUB_CMDLINE_LINUX="console=ttyS0"\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
    )
    # What Ubuntu's kdump-tools package installs: its own reservation, read before ours.
    host.write(
        "/etc/default/grub.d/kdump-tools.cfg",
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT crashkernel=2G-4G:320M,4G-:512M"\n',
    )
    return host


def test_apply_writes_the_configuration_and_keeps_the_original(host: Node) -> None:
    text = host.ok("apply", "kdump", CONFIG)
    assert "kdump-tools is not installed here (only its configuration)" in text, "no apt-get off the node"
    assert host.read(BACKUP) == DISTRIBUTION_DEFAULTS
    defaults = host.read(DEFAULTS)
    assert defaults.startswith("# Written by the NodeWright kdump package")
    assert 'USE_KDUMP=1\nKDUMP_COREDIR="/var/crash"\nKDUMP_NUM_DUMPS=3\n' in defaults
    assert host.path("/var/crash").is_dir()
    host.ok("apply-check", "kdump", CONFIG)


def test_the_snippet_leaves_exactly_one_crashkernel_on_the_command_line(host: Node) -> None:
    host.ok("config", "kdump", CONFIG)
    assert host.grub_cmdline() == "console=ttyS0 quiet crashkernel=512M"
    host.path("/etc/default/grub").unlink()  # a node with grub.d snippets only
    assert host.grub_cmdline() == "crashkernel=512M"


@pytest.mark.parametrize(
    ("undo", "message"),
    [
        (
            lambda n: n.write(DEFAULTS, n.read(DEFAULTS).replace("USE_KDUMP=1", "USE_KDUMP=0")),
            f"{DEFAULTS} differs",
        ),
        (lambda n: n.path(SNIPPET).unlink(), f"{SNIPPET} is missing"),
        (lambda n: n.path("/var/crash").rmdir(), "the dump directory /var/crash is missing"),
    ],
)
def test_config_check_fails_when_the_change_is_undone(host: Node, undo: object, message: str) -> None:
    host.ok("config", "kdump", CONFIG)
    host.ok("config-check", "kdump", CONFIG)
    assert callable(undo)
    undo(host)
    assert message in host.fails("config-check", "kdump", CONFIG)


def test_post_interrupt_check_reads_the_reservation_back(host: Node) -> None:
    host.ok("config", "kdump", CONFIG)
    assert "proc/cmdline is missing" in host.fails("post-interrupt-check", "kdump", CONFIG)
    host.boot()
    text = host.ok("post-interrupt-check", "kdump", CONFIG)
    assert "this root has no /sys/kernel/kexec_crash_size: the reservation is not compared" in text
    host.write("/sys/kernel/kexec_crash_size", "536870912\n")
    host.write("/sys/kernel/kexec_crash_loaded", "1\n")
    host.ok("post-interrupt-check", "kdump", CONFIG)

    host.write("/sys/kernel/kexec_crash_loaded", "0\n")
    assert "the crash kernel is not loaded" in host.fails("post-interrupt-check", "kdump", CONFIG)
    host.write("/sys/kernel/kexec_crash_loaded", "1\n")
    host.write("/proc/cmdline", host.read("/proc/cmdline").replace("crashkernel=512M", "crashkernel=128M"))
    text = host.fails("post-interrupt-check", "kdump", CONFIG)
    assert "the running kernel has 'crashkernel=128M', not crashkernel=512M" in text


def test_a_new_size_needs_a_reboot_to_pass_the_read_back(host: Node) -> None:
    host.ok("config", "kdump", CONFIG)
    host.boot()
    bigger = {"crashkernel": "1G-64G:512M,64G-:1G"}
    host.ok("config", "kdump", bigger)
    host.ok("config-check", "kdump", bigger)
    assert "not crashkernel=1G-64G:512M,64G-:1G" in host.fails("post-interrupt-check", "kdump", bigger)
    host.boot()
    host.ok("post-interrupt-check", "kdump", bigger)


def test_a_whole_defaults_file_can_be_given(host: Node) -> None:
    given = 'USE_KDUMP=1\nKDUMP_COREDIR="/data/crash"\nKDUMP_COMPRESSION=lz4\n'
    config = {**CONFIG, "kdump-tools": given}
    host.ok("config", "kdump", config)
    assert host.read(DEFAULTS).endswith(given) and host.path("/data/crash").is_dir()
    host.ok("config-check", "kdump", config)
    text = host.fails("config", "kdump", {**config, "coredir": "/other"})
    assert "gives both 'kdump-tools' (the whole file) and 'coredir'" in text


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "expected config file configmaps/crashkernel is missing"),
        ({"crashkernel": "lots"}, "crashkernel 'lots' names no size such as 512M"),
        ({"crashkernel": "512M; reboot"}, "must be one word"),
        ({"crashkernel": "512M$(id)"}, "crashkernel '512M$(id)' may only use digits, letters"),
        ({**CONFIG, "coredir": "var/crash"}, "coredir 'var/crash' must be an absolute path"),
        ({**CONFIG, "coredir": "/var/../etc"}, "coredir '/var/../etc' must be a plain absolute directory"),
        ({**CONFIG, "num_dumps": "many"}, "num_dumps 'many' must be a whole number"),
        ({**CONFIG, "coredir": "/var/crash /etc"}, "configMap key 'coredir' must be one word"),
    ],
)
def test_bad_settings_fail_before_anything_is_written(
    host: Node, config: dict[str, str], message: str
) -> None:
    assert message in host.fails("apply", "kdump", config)
    assert host.read(DEFAULTS) == DISTRIBUTION_DEFAULTS and not host.path(SNIPPET).exists()


def test_uninstall_puts_the_original_back(host: Node) -> None:
    host.ok("apply", "kdump", CONFIG)
    host.ok("uninstall", "kdump", CONFIG)
    assert host.read(DEFAULTS) == DISTRIBUTION_DEFAULTS
    assert not host.path(SNIPPET).exists() and not host.path(BACKUP).exists()
    assert host.path("/var/crash").is_dir(), "crash dumps are data: never removed"
    host.ok("uninstall-check", "kdump", CONFIG)
    host.write(SNIPPET, "# left behind\n")
    assert f"{SNIPPET} is still there" in host.fails("uninstall-check", "kdump", CONFIG)


def test_uninstall_removes_a_defaults_file_it_created(tmp_path: Path) -> None:
    host = node(tmp_path)
    host.ok("apply", "kdump", CONFIG)
    host.ok("uninstall", "kdump", CONFIG)
    assert not host.path(DEFAULTS).exists()
    host.ok("uninstall-check", "kdump", CONFIG)
