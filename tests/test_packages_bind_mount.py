"""The bind-mount package (packages/bind-mount) on a scratch node root, through the agent, unprivileged.

Mount units (named as systemd names them) and their enablement, the /etc/fstab block next to the
node's own lines, changes of the mount list and of the method, the running mount table after a
simulated boot, and each check failing once its change is undone.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.packages_node import Node, node

UNITS = "/etc/systemd/system"
WANTS = "/etc/systemd/system/local-fs.target.wants"
CACHE_UNIT = r"var-lib-containerd\x2dcache.mount"
MODELS_UNIT = r"opt-models-llama\x2b3.mount"
MOUNTS = {
    "mounts": "# source target [options]\n/data/cache /var/lib/containerd-cache\n"
    "/data/models /opt/models/llama+3 ro,nofail\n"
}
NODE_FSTAB = "UUID=1234 / ext4 defaults 0 1\n/dev/sdb1 /data ext4 defaults 0 2\n"


@pytest.fixture
def host(tmp_path: Path) -> Node:
    host = node(tmp_path)
    host.write("/etc/fstab", NODE_FSTAB)
    return host


def test_mounts_become_enabled_systemd_units(host: Node) -> None:
    text = host.ok("apply", "bind-mount", MOUNTS)
    assert f"a service restart of {CACHE_UNIT} {MODELS_UNIT}, or a reboot" in text
    unit = host.read(f"{UNITS}/{MODELS_UNIT}")
    assert "What=/data/models\nWhere=/opt/models/llama+3\nType=none\nOptions=bind,ro,nofail\n" in unit
    assert "RequiresMountsFor=/data/models" in unit and "WantedBy=local-fs.target" in unit
    assert "Options=bind\n" in host.read(f"{UNITS}/{CACHE_UNIT}")
    assert host.path(f"{WANTS}/{CACHE_UNIT}").readlink() == Path(f"{UNITS}/{CACHE_UNIT}"), "a host path"
    for directory in ("/data/cache", "/var/lib/containerd-cache", "/data/models", "/opt/models/llama+3"):
        assert host.path(directory).is_dir()
    assert host.read("/etc/fstab") == NODE_FSTAB
    host.ok("apply-check", "bind-mount", MOUNTS)


@pytest.mark.parametrize(
    ("undo", "message"),
    [
        (lambda n: n.path(f"{WANTS}/{CACHE_UNIT}").unlink(), f"{CACHE_UNIT} is not enabled"),
        (lambda n: n.path(f"{UNITS}/{MODELS_UNIT}").unlink(), f"{UNITS}/{MODELS_UNIT} is missing"),
        (
            lambda n: n.write(
                f"{UNITS}/{CACHE_UNIT}", n.read(f"{UNITS}/{CACHE_UNIT}").replace("/data/", "/tmp/")
            ),
            f"{UNITS}/{CACHE_UNIT} differs from the configured mount of /data/cache",
        ),
        (lambda n: n.path("/var/lib/containerd-cache").rmdir(), "target directory /var/lib/containerd-cache"),
    ],
)
def test_config_check_fails_when_a_mount_is_undone(host: Node, undo: object, message: str) -> None:
    host.ok("config", "bind-mount", MOUNTS)
    host.ok("config-check", "bind-mount", MOUNTS)
    assert callable(undo)
    undo(host)
    assert message in host.fails("config-check", "bind-mount", MOUNTS)


def test_a_mount_taken_out_of_the_list_is_removed(host: Node) -> None:
    host.ok("config", "bind-mount", MOUNTS)
    fewer = {"mounts": "/data/cache /var/lib/containerd-cache\n"}
    text = host.ok("config", "bind-mount", fewer)
    assert f"removed {UNITS}/{MODELS_UNIT}" in text
    assert (
        not host.path(f"{UNITS}/{MODELS_UNIT}").exists() and not host.path(f"{WANTS}/{MODELS_UNIT}").exists()
    )
    host.ok("config-check", "bind-mount", fewer)
    assert "are not the configured ones" in host.fails("config-check", "bind-mount", MOUNTS)


def test_the_fstab_method_keeps_the_nodes_own_lines(host: Node) -> None:
    host.ok("config", "bind-mount", MOUNTS)
    fstab = {**MOUNTS, "method": "fstab\n"}
    host.ok("config", "bind-mount", fstab)
    assert not host.path(f"{UNITS}/{CACHE_UNIT}").exists(), "switching methods removes the units"
    text = host.read("/etc/fstab")
    assert text.startswith(NODE_FSTAB)
    assert "/data/models /opt/models/llama+3 none bind,ro,nofail 0 0\n" in text
    host.ok("config-check", "bind-mount", fstab)
    host.ok("config", "bind-mount", fstab)
    assert host.read("/etc/fstab") == text, "rewriting the block leaves the file as it was"
    host.write("/etc/fstab", text.replace("bind,ro,nofail", "bind"))
    assert "/etc/fstab does not hold the configured block" in host.fails("config-check", "bind-mount", fstab)
    host.ok("config", "bind-mount", MOUNTS)  # back to units: the block goes
    assert host.read("/etc/fstab") == NODE_FSTAB
    host.ok("config-check", "bind-mount", MOUNTS)


@pytest.mark.parametrize("method", ["systemd", "fstab"])
def test_post_interrupt_check_reads_the_mount_table_of_the_booted_node(host: Node, method: str) -> None:
    config = {**MOUNTS, "method": method}
    host.ok("config", "bind-mount", config)
    text = host.ok("post-interrupt-check", "bind-mount", config)
    assert "this root has no /proc/1/mountinfo: the running node's mounts are not compared" in text
    host.boot()
    host.ok("post-interrupt-check", "bind-mount", config)
    table = host.read("/proc/1/mountinfo")
    host.write(
        "/proc/1/mountinfo", "".join(line + "\n" for line in table.splitlines() if "llama" not in line)
    )
    text = host.fails("post-interrupt-check", "bind-mount", config)
    assert "/opt/models/llama+3 is not mounted on the running node" in text


@pytest.mark.parametrize(
    ("mounts", "message"),
    [
        ("data/cache /mnt/cache\n", "mounts line 1: source 'data/cache' must be an absolute path"),
        ("/data/cache\n", "mounts line 1: '/data/cache' has no target"),
        ("/data/a /mnt/a\n/data/b /mnt/../etc\n", "mounts line 2: target '/mnt/../etc' must be a normalized"),
        ("/data/a /mnt/a/\n", "target '/mnt/a/' must be a normalized path"),
        ("/data/a /proc/x\n", "target '/proc/x' is in a kernel file system"),
        ("/data/a /mnt/a\n/data/b /mnt/a\n", "mounts line 2: /mnt/a is a target twice"),
        ("/data/a /mnt/a ro\\,x\n", "options 'ro\\,x' may only use"),
        ("/data/a /mnt/$(id)\n", "target '/mnt/$(id)' may only use letters"),
        ("/data/a /mnt/a ro extra\n", "too many fields"),
        ("/data/a /data/a\n", "/data/a is mounted onto itself"),
        ("# nothing\n", "configMap key 'mounts' lists no mount"),
    ],
)
def test_bad_mount_lists_fail_before_anything_is_written(host: Node, mounts: str, message: str) -> None:
    assert message in host.fails("apply", "bind-mount", {"mounts": mounts})
    assert not host.path(UNITS).exists()


def test_a_bad_method_is_named(host: Node) -> None:
    text = host.fails("config", "bind-mount", {**MOUNTS, "method": "autofs"})
    assert "configMap key 'method' is 'autofs'; use systemd or fstab" in text


def test_uninstall_removes_units_links_and_block(host: Node) -> None:
    host.ok("config", "bind-mount", {**MOUNTS, "method": "fstab"})
    host.ok("config", "bind-mount", MOUNTS)
    host.ok("uninstall", "bind-mount", MOUNTS)
    assert host.read("/etc/fstab") == NODE_FSTAB
    assert list(host.path(WANTS).iterdir()) == [] and not list(host.path(UNITS).glob("*.mount"))
    host.ok("uninstall-check", "bind-mount", MOUNTS)
    host.path(f"{WANTS}/{CACHE_UNIT}").symlink_to(f"{UNITS}/{CACHE_UNIT}")
    assert f"points to the removed {UNITS}/{CACHE_UNIT}" in host.fails(
        "uninstall-check", "bind-mount", MOUNTS
    )


def test_uninstall_check_finds_a_unit_left_behind(host: Node) -> None:
    host.ok("config", "bind-mount", MOUNTS)
    unit = host.read(f"{UNITS}/{CACHE_UNIT}")
    host.ok("uninstall", "bind-mount", MOUNTS)
    host.write(f"{UNITS}/{CACHE_UNIT}", unit)
    assert f"{UNITS}/{CACHE_UNIT} is still there" in host.fails("uninstall-check", "bind-mount", MOUNTS)


ESCAPED = {
    "/var/lib/containerd-cache": r"var-lib-containerd\x2dcache.mount",
    "/opt/models/llama+3": r"opt-models-llama\x2b3.mount",
    "/.hidden/x": r"\x2ehidden-x.mount",
    "/a:b@c_d.e": r"a:b\x40c_d.e.mount",
}


def test_unit_names_are_systemds(tmp_path: Path) -> None:
    lib = Path(__file__).resolve().parents[1] / "packages" / "bind-mount" / "skyhook_dir" / "lib.sh"
    script = f'. "{lib}"; for p in "$@"; do unit_name "$p"; echo; done'
    result = subprocess.run(
        ["/bin/sh", "-c", script, "sh", *ESCAPED],
        capture_output=True,
        text=True,
        timeout=10,
        env={"SKYHOOK_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert result.stdout.splitlines() == list(ESCAPED.values())
    escape = shutil.which("systemd-escape")
    if escape is not None:  # where systemd is installed, it agrees
        names = subprocess.run(
            [escape, "--path", "--suffix=mount", *ESCAPED],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        assert names.stdout.split() == list(ESCAPED.values())
