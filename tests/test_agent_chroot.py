"""The agent as root, each step chrooted into a host root that holds a static busybox shell.

This is how the agent runs in a privileged package pod: the host's `/` is the root mount, every step is
a helper process that chroots into it and execs the step, and the package's scripts use plain host
paths. The root here is a directory with Debian's busybox-static (fetched by hack/busybox/fetch.sh into
~/.cache/nodewright/busybox/) and a few of its applets, nothing else; the package is a public-format
package (tests/agent_fixtures/public-package: schema v1 with every step field, an upgrade step,
idempotence false and true, an expected config file, a root_dir overlay), copied where the package
pod's init container would copy it. Only a chosen set of applets is linked: busybox's own `reboot`
would signal this machine's init, so the root gets a harmless `reboot` script of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from nodewright.agent.interrupts import Interrupt, encode
from tests.agent_fixtures.hostroot import HostRoot

REPO = Path(__file__).resolve().parents[1]
PUBLIC_PACKAGE = Path(__file__).parent / "agent_fixtures" / "public-package"
APPLETS = (
    "sh", "cat", "cmp", "cp", "echo", "env", "grep", "kill", "ls", "mkdir", "pwd", "rm", "sleep",
    "test", "touch", "true", "false",
)  # fmt: skip
RESOURCE_ID = "public-7f3c-1_public-demo_1.0.0"


@pytest.fixture(scope="module")
def busybox() -> Path:
    if os.geteuid() != 0:
        pytest.skip("chroot(2) needs root: run the tests as root (CI does) to exercise chrooted steps")
    result = subprocess.run(
        ["bash", str(REPO / "hack" / "busybox" / "fetch.sh")], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"hack/busybox/fetch.sh failed:\n{result.stderr}"
    return Path(result.stdout.strip().splitlines()[-1])


def _host_root(root: Path, busybox: Path) -> None:
    (root / "bin").mkdir(parents=True)
    (root / "sbin").mkdir()
    (root / "etc").mkdir()
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    (root / "etc" / "environment").write_text('PATH="/sbin:/bin"\n')


def _package(root: Path, version: str) -> HostRoot:
    host = HostRoot(
        root=root,
        copy_dir=f"/var/lib/skyhook/public/public-demo-{version}-7f3c-1",
        package="public-demo",
        version=version,
    )
    shutil.copytree(PUBLIC_PACKAGE, host.package_dir)
    config = json.loads((host.package_dir / "config.json").read_text())
    config["package_version"] = version
    (host.package_dir / "config.json").write_text(json.dumps(config))
    host.configmap("demo.conf", "threads=8\n")
    host.base_env.update(
        NODEWRIGHT_AGENT_CHROOT="true",
        NODE_NAME="gpu-node-3",
        SKYHOOK_RESOURCE_ID=f"public-7f3c-1_public-demo_{version}",
        SKYHOOK_LOG_DIR="/var/log/skyhook/public",
    )
    return host


def _ok(host: HostRoot, mode: str, *args: str) -> str:
    result = host.run(mode, *args)
    assert result.code == 0, result.text
    return result.text


def test_a_public_format_package_runs_every_mode_chrooted(tmp_path: Path, busybox: Path) -> None:
    root = tmp_path / "host"
    _host_root(root, busybox)
    v1 = _package(root, "1.0.0")
    demo = root / "etc" / "public-demo"

    text = _ok(v1, "apply")
    assert "chroot per step" in text and "[out] installed for gpu-node-3" in text
    seen = dict(line.split("=", 1) for line in (demo / "install.env").read_text().splitlines())
    assert seen["args"] == "gpu-node-3 --level 3" and seen["color"] == "blue"
    assert seen["cwd"] == v1.copy_dir, "steps run in the copy dir, a host path inside the chroot"
    assert seen["step_root"] == f"{v1.copy_dir}/skyhook_dir" and seen["skyhook_dir"] == v1.copy_dir
    assert seen["path"] == "/sbin:/bin", "the host's /etc/environment overrides the container's PATH"
    assert sorted((demo / "root-listing").read_text().split()) == ["bin", "etc", "sbin", "var"]
    assert not Path("/etc/public-demo").exists(), "nothing escaped the chroot"
    assert (demo / "static.conf").read_text() == "static=1\n", "root_dir/ laid over the host"
    assert os.access(v1.package_dir / "skyhook_dir" / "install.sh", os.X_OK), "the agent made it executable"

    _ok(v1, "apply")  # install is flagged (idempotence false): skipped; tune always runs
    assert (demo / "tune.count").read_text() == "tuned\ntuned\n"
    assert len([f for f in v1.flags() if f.startswith("install.sh_")]) == 1
    _ok(v1, "apply-check")
    assert v1.history()["current-version"] == "1.0.0"

    _ok(v1, "config")
    _ok(v1, "config-check")
    assert (demo / "demo.conf").read_text() == "threads=8\n"
    (demo / "demo.conf").write_text("threads=1\n")
    result = v1.run("config-check")
    assert result.code == 1 and "1 of 1 config-check steps failed: configure_check" in result.err

    _ok(v1, "post-interrupt")
    _ok(v1, "post-interrupt-check")
    assert (demo / "post-interrupt").read_text() == "after-reboot\n"

    v2 = _package(root, "1.1.0")
    _ok(v2, "upgrade")
    assert (
        demo / "upgrade.log"
    ).read_text() == "from=1.0.0 to=1.1.0 env_from=1.0.0 env_to=1.1.0 color=green\n"
    _ok(v2, "upgrade-check")
    assert v2.history()["current-version"] == "1.1.0"

    _ok(v2, "uninstall")
    _ok(v2, "uninstall-check")
    assert not demo.exists()
    history = v2.history()
    assert history["current-version"] == "uninstalled"
    assert [h["version"] for h in history["history"]] == ["uninstalled", "1.1.0", "1.0.0"]
    assert [f for f in v2.flags() if "_check_results" not in f and "ALL_CHECKED" not in f] == []
    logs = root / "var" / "log" / "skyhook" / "public" / "public-demo" / "1.0.0"
    assert len(list(logs.glob("install.sh-*.log"))) == 1 and len(list(logs.glob("tune.sh-*.log"))) == 2


def test_a_missing_step_inside_the_root_fails_with_127(tmp_path: Path, busybox: Path) -> None:
    root = tmp_path / "host"
    _host_root(root, busybox)
    host = _package(root, "1.0.0")
    (root / "bin" / "sh").unlink()  # the scripts' interpreter is missing on this host
    result = host.run("apply")
    assert result.code == 1
    assert "exit 127" in result.out and "cannot run" in result.err


def test_interrupt_commands_run_chrooted_once_per_resource_id(tmp_path: Path, busybox: Path) -> None:
    root = tmp_path / "host"
    _host_root(root, busybox)
    host = _package(root, "1.0.0")
    calls = root / "var" / "log" / "systemctl.calls"
    systemctl = root / "sbin" / "systemctl"
    systemctl.write_text(
        '#!/bin/sh\necho "$*" >> /var/log/systemctl.calls\n'
        'if [ "$2" = broken.service ] && [ ! -e /etc/fixed ]; then exit 5; fi\n'
    )
    systemctl.chmod(0o755)
    payload = encode(Interrupt(type="service_restart", services=("good.service", "broken.service")))
    flags = root / "etc" / "skyhook" / "interrupts" / "flags" / RESOURCE_ID

    result = host.run("interrupt", payload)
    assert (
        result.code == 1 and "interrupt command systemctl restart broken.service failed: exit 5" in result.err
    )
    assert calls.read_text().splitlines() == [
        "daemon-reload",
        "restart good.service",
        "restart broken.service",
    ]
    assert sorted(p.name for p in flags.iterdir()) == [
        "service_restart_0.complete",
        "service_restart_1.complete",
    ]

    (root / "etc" / "fixed").write_text("")
    _ok(host, "interrupt", payload)
    assert calls.read_text().splitlines()[3:] == ["restart broken.service"], "only the failed command re-ran"
    _ok(host, "interrupt", payload)
    assert len(calls.read_text().splitlines()) == 4
    interrupt_logs = root / "var" / "log" / "skyhook" / "public" / "public-demo" / "1.0.0" / "interrupts"
    assert sorted({p.name.split("-")[0] for p in interrupt_logs.iterdir()}) == [
        "service_restart_0",
        "service_restart_1",
        "service_restart_2",
    ]


def test_a_reboot_ended_by_sigterm_keeps_its_flag(tmp_path: Path, busybox: Path) -> None:
    root = tmp_path / "host"
    _host_root(root, busybox)
    host = _package(root, "1.0.0")
    reboot = root / "sbin" / "reboot"
    reboot.write_text("#!/bin/sh\necho rebooting >> /var/reboots\nkill -TERM $$\n")
    reboot.chmod(0o755)
    payload = encode(Interrupt(type="node_restart"))
    result = host.run("interrupt", payload)
    assert result.code == 1, "the pod reports failure; the operator confirms the reboot by the bootID"
    flag = root / "etc" / "skyhook" / "interrupts" / "flags" / RESOURCE_ID / "node_restart_0.complete"
    assert flag.exists(), "the reboot happened: it must not run again after the node comes back"
    _ok(host, "interrupt", payload)
    assert (root / "var" / "reboots").read_text() == "rebooting\n"


def test_a_missing_interrupt_command_fails_and_can_be_retried(tmp_path: Path, busybox: Path) -> None:
    root = tmp_path / "host"
    _host_root(root, busybox)
    host = _package(root, "1.0.0")
    result = host.run("interrupt", encode(Interrupt(type="restart_all_services")))
    assert result.code == 1 and "failed: exit 127" in result.err
    assert not list((root / "etc" / "skyhook" / "interrupts" / "flags" / RESOURCE_ID).iterdir())
