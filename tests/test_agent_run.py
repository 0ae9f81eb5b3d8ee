"""Agent runs against real temporary host roots, unprivileged (no chroot): every rule of a stage run.

Each test lays out a package in a host-root directory as a package pod leaves it, runs
`nodewright.agent.main` and inspects what changed in the root: files the steps wrote, flags, check
results, history and logs. Scripts find the root through NODEWRIGHT_HOST_ROOT (unprivileged mode).
"""

from __future__ import annotations

import base64
import io
import json
import os
from pathlib import Path

import pytest

from nodewright.agent import engine, main
from nodewright.agent.cli import parse_invocation
from tests.agent_fixtures.hostroot import COPY_DIR, HostRoot, step

PROBE = """\
out="$NODEWRIGHT_HOST_ROOT/probe/${PROBE_NAME:-probe}"
mkdir -p "$(dirname "$out")"
{ echo "cwd=$(pwd)"; echo "args=$*"; env | sort; } > "$out"
"""


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    return HostRoot(root=tmp_path / "root")


def _probe(host: HostRoot, name: str = "probe") -> dict[str, str]:
    lines = host.path(f"/probe/{name}").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def _simple(host: HostRoot, **apply_fields: object) -> None:
    host.script("apply.sh", PROBE + 'echo run >> "$NODEWRIGHT_HOST_ROOT/runs"')
    host.script("apply_check.sh", 'test -f "$NODEWRIGHT_HOST_ROOT/runs"')
    host.config({"apply": [step("apply.sh", **apply_fields)], "apply-check": [step("apply_check.sh")]})


def _runs(host: HostRoot) -> int:
    path = host.path("/runs")
    return len(path.read_text().splitlines()) if path.exists() else 0


# ----------------------------------------------------------------------------------------------------
# Invocation


def test_help_and_usage_errors() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(["--help"], environ={}, stdout=out) == 0
    assert (
        "usage: python -m nodewright.agent <mode> <root_mount> <copy_dir> [interrupt_b64]" in out.getvalue()
    )
    assert "NODEWRIGHT_AGENT_CHROOT" in out.getvalue()
    assert main(["apply"], environ={}, stderr=err) == 2
    assert "expected 2 to 4 arguments, got 1" in err.getvalue()
    assert main(["apply", "/", "relative/dir"], environ={}, stderr=err) == 2
    assert "copy_dir 'relative/dir' must be an absolute path on the host" in err.getvalue()


def test_legacy_argument_forms() -> None:
    assert parse_invocation(["apply", "/var/lib/x"]) == engine.Invocation("apply", "/root", "/var/lib/x")
    assert parse_invocation(["interrupt", "/var/lib/x", "e30="]) == engine.Invocation(
        "interrupt", "/root", "/var/lib/x", "e30="
    )
    assert parse_invocation(["apply", "/mnt/root/", "//var/lib//x/"]) == engine.Invocation(
        "apply", "/mnt/root", "/var/lib/x"
    )
    assert parse_invocation(["interrupt", "/r", "/c", "e30="]).interrupt == "e30="


def test_unknown_mode_succeeds_with_a_warning_and_touches_nothing(host: HostRoot) -> None:
    result = host.run("reticulate")
    assert result.code == 0
    assert "this agent does not know mode 'reticulate'" in result.err
    assert not host.root.exists()


def test_root_mount_must_exist(host: HostRoot) -> None:
    result = host.run("apply")
    assert result.code == 2 and f"root mount {host.root} is not a directory" in result.err


def test_bad_settings_are_named(host: HostRoot) -> None:
    host.root.mkdir()
    result = host.run("apply", env=host.env(SKYHOOK_AGENT_BUFFER_LIMIT="lots"))
    assert result.code == 2
    assert (
        "SKYHOOK_AGENT_BUFFER_LIMIT='lots': expected a whole number of bytes from 1 to 1048576" in result.err
    )


# ----------------------------------------------------------------------------------------------------
# Package directory, config, overlay, expected config files


def test_missing_package_and_payload_is_a_clear_error(host: HostRoot, tmp_path: Path) -> None:
    host.root.mkdir()
    result = host.run("apply", env=host.env(SKYHOOK_DATA_DIR=str(tmp_path / "nothing")))
    assert result.code == 1
    assert f"package directory {COPY_DIR} not found under {host.root}" in result.err


def test_legacy_payload_is_copied_when_the_package_directory_is_missing(
    host: HostRoot, tmp_path: Path
) -> None:
    payload = HostRoot(root=tmp_path / "image", copy_dir="/skyhook-package")
    payload.script("apply.sh", 'echo legacy > "$NODEWRIGHT_HOST_ROOT/legacy"')
    payload.script("apply_check.sh", "true")
    payload.config({"apply": [step("apply.sh")], "apply-check": [step("apply_check.sh")]})
    host.root.mkdir()
    result = host.run("apply", env=host.env(SKYHOOK_DATA_DIR=str(payload.package_dir)))
    assert result.code == 0, result.text
    assert (host.package_dir / "config.json").exists()
    assert host.path("/legacy").read_text() == "legacy\n"


def test_an_invalid_config_runs_nothing_and_reports_every_problem(host: HostRoot) -> None:
    _simple(host)
    data = json.loads((host.package_dir / "config.json").read_text())
    data["package_version"] = "one"
    data["modes"]["apply"][0]["returncodes"] = "0"
    (host.package_dir / "config.json").write_text(json.dumps(data))
    result = host.run("apply")
    assert result.code == 1
    assert "config.json: 2 problems:" in result.err
    assert "package_version: 'one' is not a full semantic version" in result.err
    assert (
        'modes.apply[0].returncodes: expected a non-empty list of exit codes such as [0], got "0"'
        in result.err
    )
    assert _runs(host) == 0


def test_config_warnings_are_printed(host: HostRoot) -> None:
    host.script("apply.sh", "true")
    host.script("verify.sh", "true")
    host.config({"apply": [step("apply.sh")], "apply-check": [step("verify.sh")]})
    result = host.run("apply")
    assert result.code == 0
    assert "WARNING: config.json: modes.apply[0].path: no check step runs 'apply_check.sh'" in result.err


def test_root_dir_is_laid_over_the_host_except_on_uninstall(host: HostRoot) -> None:
    _simple(host)
    host.overlay_file("/etc/demo/settings.conf", "a=1\n")
    assert host.run("apply").code == 0
    assert host.path("/etc/demo/settings.conf").read_text() == "a=1\n"
    host.path("/etc/demo/settings.conf").unlink()
    host.script("uninstall.sh", "true")
    host.script("uninstall_check.sh", "true")
    config = json.loads((host.package_dir / "config.json").read_text())
    config["modes"].update(
        uninstall=[step("uninstall.sh")], **{"uninstall-check": [step("uninstall_check.sh")]}
    )
    (host.package_dir / "config.json").write_text(json.dumps(config))
    assert host.run("uninstall").code == 0
    assert host.run("uninstall-check").code == 0
    assert not host.path("/etc/demo/settings.conf").exists()
    assert host.run("apply-check").code == 0
    assert host.path("/etc/demo/settings.conf").exists(), "check modes lay root_dir too, as the reference"


def test_expected_config_files_must_be_in_configmaps(host: HostRoot) -> None:
    host.script("apply.sh", 'echo run >> "$NODEWRIGHT_HOST_ROOT/runs"')
    host.script("apply_check.sh", "true")
    host.script("uninstall.sh", "true")
    host.script("uninstall_check.sh", "true")
    host.config(
        {
            "apply": [step("apply.sh")],
            "apply-check": [step("apply_check.sh")],
            "uninstall": [step("uninstall.sh")],
            "uninstall-check": [step("uninstall_check.sh")],
        },
        expected_config_files=["a.conf", "b.conf"],
    )
    host.configmap("a.conf", "x")
    result = host.run("apply")
    assert result.code == 1
    assert (
        "expected config file configmaps/b.conf is missing: add 'b.conf' to the package's configMap"
        in result.err
    )
    assert "a.conf" not in result.err
    assert _runs(host) == 0
    assert host.run("uninstall").code == 0, "uninstall does not need the configMap"
    host.configmap("b.conf", "y")
    assert host.run("apply").code == 0 and _runs(host) == 1


def test_copy_resolv_copies_the_containers_resolv_conf(
    host: HostRoot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 192.0.2.53\n")
    monkeypatch.setattr(engine, "CONTAINER_RESOLV", str(resolv))
    _simple(host)
    assert host.run("apply", env=host.env(COPY_RESOLV="true")).code == 0
    assert host.path("/etc/resolv.conf").read_text() == "nameserver 192.0.2.53\n"
    monkeypatch.setattr(engine, "CONTAINER_RESOLV", str(tmp_path / "missing"))
    result = host.run("apply", env=host.env(COPY_RESOLV="true"))
    assert result.code == 0 and "this container has no" in result.err


# ----------------------------------------------------------------------------------------------------
# Step execution: environment, arguments, return codes


def test_step_environment_and_working_directory(host: HostRoot) -> None:
    host.script("apply.sh", PROBE)
    host.script("apply_check.sh", "true")
    host.config(
        {
            "apply": [step("apply.sh", env={"PROBE_NAME": "apply", "FROM_STEP": "step", "SHARED": "step"})],
            "apply-check": [step("apply_check.sh")],
        }
    )
    host.path("/etc").mkdir(parents=True)
    host.path("/etc/environment").write_text('FROM_HOST="host"\nSHARED=host\n')
    env = host.env(FROM_CONTAINER="container", SHARED="container", SKYHOOK_NODE_ORDER="4")
    assert host.run("apply", env=env).code == 0
    seen = _probe(host, "apply")
    package = f"{host.root}{COPY_DIR}"
    assert seen["cwd"] == str(host.root)
    assert (
        seen["FROM_CONTAINER"] == "container" and seen["FROM_HOST"] == "host" and seen["FROM_STEP"] == "step"
    )
    assert seen["SHARED"] == "step", "container env < host /etc/environment < step env"
    assert seen["STEP_ROOT"] == f"{package}/skyhook_dir"
    assert seen["SKYHOOK_DIR"] == seen["NODEWRIGHT_DIR"] == package
    assert seen["NODEWRIGHT_HOST_ROOT"] == str(host.root)
    assert seen["SKYHOOK_RESOURCE_ID"] == seen["NODEWRIGHT_RESOURCE_ID"] == "nw-uid-1_demo_1.0.0"
    assert seen["NODEWRIGHT_NODE_ORDER"] == "4"
    assert "CURRENT_VERSION" not in seen and "PREVIOUS_VERSION" not in seen


def test_env_arguments_are_substituted_from_the_container_environment(host: HostRoot) -> None:
    host.script("apply.sh", PROBE)
    host.script("apply_check.sh", "true")
    host.config(
        {
            "apply": [step("apply.sh", arguments=["--node", "env:NODE_NAME", "env:ZONE"])],
            "apply-check": [step("apply_check.sh")],
        }
    )
    assert host.run("apply", env=host.env(NODE_NAME="gpu-7", ZONE="a")).code == 0
    assert _probe(host)["args"] == "--node gpu-7 a"


def test_a_missing_env_argument_fails_the_step_before_it_runs(host: HostRoot) -> None:
    _simple(host, arguments=["env:NODE_NAME", "env:ZONE"])
    result = host.run("apply")
    assert result.code == 1
    assert "environment variable(s) NODE_NAME, ZONE not set" in result.err
    assert _runs(host) == 0 and host.flags() == []


def test_return_codes_decide_success_and_the_first_failure_stops_the_mode(host: HostRoot) -> None:
    host.script("three.sh", 'echo three >> "$NODEWRIGHT_HOST_ROOT/runs"; exit 3')
    host.script("one.sh", 'echo one >> "$NODEWRIGHT_HOST_ROOT/runs"; exit 1')
    host.script("never.sh", 'echo never >> "$NODEWRIGHT_HOST_ROOT/runs"')
    host.script("check.sh", "true")
    host.config(
        {
            "apply": [step("three.sh", returncodes=[0, 3]), step("one.sh"), step("never.sh")],
            "apply-check": [step("check.sh")],
        }
    )
    result = host.run("apply")
    assert result.code == 1
    assert host.path("/runs").read_text() == "three\none\n"
    assert "apply step three.sh succeeded: exit 3 (success: 0, 3)" in result.out
    assert "apply step one.sh FAILED: exit 1 (success: 0)" in result.out
    assert len(host.flags()) == 1 and host.flags()[0].startswith("three.sh_")


def test_a_step_that_cannot_start_fails_with_a_shell_exit_code(host: HostRoot) -> None:
    host.script("apply_check.sh", "true")
    host.package_dir.joinpath("skyhook_dir", "apply.sh").write_text("no shebang, not a program\n")
    host.config({"apply": [step("apply.sh")], "apply-check": [step("apply_check.sh")]})
    result = host.run("apply")
    assert result.code == 1
    assert "exit 126" in result.out and "cannot run" in result.err


def test_output_is_streamed_with_timestamps_to_the_container_log(host: HostRoot) -> None:
    host.script("apply.sh", "echo to-out; echo to-err >&2")
    host.script("apply_check.sh", "true")
    host.config({"apply": [step("apply.sh")], "apply-check": [step("apply_check.sh")]})
    result = host.run("apply")
    assert result.code == 0
    out_line = next(line for line in result.out.splitlines() if line.endswith("to-out"))
    err_line = next(line for line in result.err.splitlines() if line.endswith("to-err"))
    assert " [out] to-out" in out_line and " [err] to-err" in err_line
    assert out_line.split(" ", 1)[0].endswith("+00:00")


def test_a_daemon_holding_the_output_pipe_does_not_hang_the_agent(host: HostRoot) -> None:
    host.script("apply.sh", 'sleep 60 & echo $! > "$NODEWRIGHT_HOST_ROOT/daemon.pid"; echo started')
    host.script("apply_check.sh", "true")
    host.config({"apply": [step("apply.sh")], "apply-check": [step("apply_check.sh")]})
    try:
        result = host.run("apply")
        assert result.code == 0 and "[out] started" in result.out
    finally:
        pid_file = host.path("/daemon.pid")
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), 9)


# ----------------------------------------------------------------------------------------------------
# Idempotence flags


def test_apply_steps_are_skipped_once_their_flag_exists(host: HostRoot) -> None:
    _simple(host, arguments=["a", "b"], returncodes=[0])
    assert host.run("apply").code == 0
    marker = base64.b64encode(b"['a', 'b']_[0]").decode()
    assert host.flags() == [f"apply.sh_{marker}"]
    flag = (host.state_dir / "flags" / "demo" / "1.0.0" / f"apply.sh_{marker}").read_text()
    assert flag.startswith("last_run: ") and flag.endswith("step_always_runs: False")
    second = host.run("apply")
    assert second.code == 0 and "apply.sh: skipped" in second.out
    assert _runs(host) == 1
    assert (host.state_dir / "flags" / "START").exists()


def test_the_flag_belongs_to_the_arguments_and_return_codes(host: HostRoot) -> None:
    _simple(host, arguments=["a"])
    assert host.run("apply").code == 0
    _simple(host, arguments=["b"])
    assert host.run("apply").code == 0
    _simple(host, arguments=["b"], returncodes=[0, 1])
    assert host.run("apply").code == 0
    assert _runs(host) == 3 and len(host.flags()) == 3


def test_idempotence_true_means_the_step_always_runs(host: HostRoot) -> None:
    _simple(host, idempotence=True)
    for _ in range(3):
        assert host.run("apply").code == 0
    assert _runs(host) == 3
    assert host.flags()[0].startswith("apply.sh_")


def test_overlay_always_run_step_runs_flagged_steps(host: HostRoot) -> None:
    _simple(host)
    assert host.run("apply").code == 0
    result = host.run("apply", env=host.env(OVERLAY_ALWAYS_RUN_STEP="true"))
    assert result.code == 0 and "OVERLAY_ALWAYS_RUN_STEP is set: running it again" in result.err
    assert _runs(host) == 2


@pytest.mark.parametrize(("mode", "runs_again"), [("config", True), ("post-interrupt", False)])
def test_config_steps_always_run_post_interrupt_steps_are_flagged(
    host: HostRoot, mode: str, runs_again: bool
) -> None:
    host.script("work.sh", 'echo run >> "$NODEWRIGHT_HOST_ROOT/runs"')
    host.script("work_check.sh", "true")
    host.config({mode: [step("work.sh")], f"{mode}-check": [step("work_check.sh")]})
    assert host.run(mode).code == 0
    assert host.run(mode).code == 0
    assert _runs(host) == (2 if runs_again else 1)


def test_a_failed_step_leaves_no_flag_and_runs_again(host: HostRoot) -> None:
    host.script("apply.sh", 'echo run >> "$NODEWRIGHT_HOST_ROOT/runs"; test -f "$NODEWRIGHT_HOST_ROOT/ok"')
    host.script("apply_check.sh", "true")
    host.config({"apply": [step("apply.sh")], "apply-check": [step("apply_check.sh")]})
    assert host.run("apply").code == 1 and host.flags() == []
    host.path("/ok").write_text("")
    assert host.run("apply").code == 0 and _runs(host) == 2


# ----------------------------------------------------------------------------------------------------
# Checks and history


def test_a_failed_step_repeats_its_last_output_in_the_failure_lines(host: HostRoot) -> None:
    """The operator shows the tail of the log: the reason must be there, not only the agent's summary."""
    host.script("apply.sh", "true")
    host.script(
        "apply_check.sh", "echo checking; echo 'net.core.rmem_max is 212992, want 268435456' >&2; exit 1"
    )
    host.config({"apply": [step("apply.sh")], "apply-check": [step("apply_check.sh")]})
    result = host.run("apply-check")
    assert result.code == 1
    last = [line for line in (result.out + result.err).splitlines() if line.strip()][-1]
    assert "apply_check.sh (checking / net.core.rmem_max is 212992, want 268435456)" in last, last
    host.script("apply.sh", "echo 'no such device: eth9' >&2; exit 3")
    failed = host.run("apply")
    assert failed.code == 1 and "last output: no such device: eth9" in failed.out + failed.err


def test_all_checks_run_and_any_failure_fails_the_mode(host: HostRoot) -> None:
    host.script("apply.sh", "true")
    host.script("apply_check.sh", 'echo a >> "$NODEWRIGHT_HOST_ROOT/checks"; exit 1')
    host.script("second_check.sh", 'echo b >> "$NODEWRIGHT_HOST_ROOT/checks"')
    host.config(
        {"apply": [step("apply.sh")], "apply-check": [step("apply_check.sh"), step("second_check.sh")]}
    )
    result = host.run("apply-check")
    assert result.code == 1 and "1 of 2 apply-check steps failed: apply_check.sh" in result.err
    assert host.path("/checks").read_text() == "a\nb\n"
    flags = host.state_dir / "flags"
    assert (flags / "check_results").read_text() == "apply_check.sh True\nsecond_check.sh False"
    assert (flags / "demo" / "1.0.0" / "apply-check_check_results").read_text() == (
        flags / "check_results"
    ).read_text()
    assert not (flags / "apply-check_ALL_CHECKED").exists()
    assert not (host.state_dir / "history" / "demo.json").exists(), "a failed check records no version"
    host.script("apply_check.sh", "true")
    assert host.run("apply-check").code == 0
    assert (flags / "apply-check_ALL_CHECKED").exists()
    assert (flags / "demo" / "1.0.0" / "apply-check_ALL_CHECKED").exists()
    host.script("apply_check.sh", "false")
    assert host.run("apply-check").code == 1
    assert not (flags / "demo" / "1.0.0" / "apply-check_ALL_CHECKED").exists(), "ours is removed on failure"


def test_check_steps_never_write_flags(host: HostRoot) -> None:
    _simple(host)
    assert host.run("apply-check").code == 1, "nothing applied yet"
    assert host.flags() == ["apply-check_check_results"]


def test_a_mode_without_steps_is_a_noop_with_a_warning(host: HostRoot) -> None:
    _simple(host)
    result = host.run("config")
    assert result.code == 0 and "demo has no config steps: nothing to do" in result.err
    result = host.run("config-check")
    assert result.code == 0 and not (host.state_dir / "flags" / "check_results").exists()


def test_history_records_installs_upgrades_and_uninstalls(tmp_path: Path) -> None:
    root = tmp_path / "root"
    v1 = HostRoot(root=root, copy_dir="/var/lib/skyhook/nw/demo-1.0.0-u-1")
    v2 = HostRoot(root=root, copy_dir="/var/lib/skyhook/nw/demo-2.0.0-u-2", version="2.0.0")
    for host in (v1, v2):
        host.script("apply.sh", "true")
        host.script("apply_check.sh", "true")
        host.script("upgrade.sh", PROBE)
        host.script("upgrade_check.sh", PROBE)
        host.script("uninstall.sh", "true")
        host.script("uninstall_check.sh", "true")
        host.config(
            {
                "apply": [step("apply.sh")],
                "apply-check": [step("apply_check.sh")],
                "upgrade": [step("upgrade.sh", upgrade_step=True, env={"PROBE_NAME": "upgrade"})],
                "upgrade-check": [step("upgrade_check.sh", env={"PROBE_NAME": "upgrade-check"})],
                "uninstall": [step("uninstall.sh")],
                "uninstall-check": [step("uninstall_check.sh")],
            }
        )
    assert v1.run("apply").code == 0 and v1.run("apply-check").code == 0
    history = v1.history()
    assert history["current-version"] == "1.0.0" and [h["version"] for h in history["history"]] == ["1.0.0"]
    assert v2.run("upgrade").code == 0
    upgrade = _probe(v2, "upgrade")
    assert upgrade["args"] == "1.0.0 2.0.0", "an upgrade_step gets [previous, current]"
    assert (upgrade["PREVIOUS_VERSION"], upgrade["CURRENT_VERSION"]) == ("1.0.0", "2.0.0")
    assert v2.run("upgrade-check").code == 0
    check = _probe(v2, "upgrade-check")
    assert check["args"] == "" and (check["PREVIOUS_VERSION"], check["CURRENT_VERSION"]) == ("1.0.0", "2.0.0")
    assert v2.history()["current-version"] == "2.0.0"
    assert v2.run("uninstall").code == 0
    assert v2.flags() != []
    assert v2.run("uninstall-check").code == 0
    history = v2.history()
    assert history["current-version"] == "uninstalled"
    assert [h["version"] for h in history["history"]] == ["uninstalled", "2.0.0", "1.0.0"]
    assert all(h["time"].endswith("+00:00") for h in history["history"])
    assert [f for f in v2.flags() if "_check_results" not in f and "ALL_CHECKED" not in f] == []


def test_the_first_upgrade_sees_previous_version_unknown(host: HostRoot) -> None:
    host.script("upgrade.sh", PROBE)
    host.script("upgrade_check.sh", "true")
    host.config(
        {"upgrade": [step("upgrade.sh", upgrade_step=True)], "upgrade-check": [step("upgrade_check.sh")]}
    )
    assert host.run("upgrade").code == 0
    assert _probe(host)["args"] == "unknown 1.0.0"


def test_a_corrupt_history_file_is_moved_aside(host: HostRoot) -> None:
    _simple(host)
    history = host.state_dir / "history" / "demo.json"
    history.parent.mkdir(parents=True)
    history.write_text("{not json")
    assert host.run("apply").code == 0
    result = host.run("apply-check")
    assert result.code == 0 and "was unreadable; moved it to" in result.err
    assert history.with_name("demo.json.backup").read_text() == "{not json"
    assert host.history()["current-version"] == "1.0.0"


# ----------------------------------------------------------------------------------------------------
# Logs


def test_step_logs_are_kept_on_the_host_five_deep(host: HostRoot) -> None:
    host.script("config.sh", "echo out-line; echo err-line >&2")
    host.script("config_check.sh", "true")
    host.config({"config": [step("config.sh")], "config-check": [step("config_check.sh")]})
    for _ in range(7):
        assert host.run("config").code == 0
    logs = sorted(p.name for p in host.log_dir.iterdir())
    assert (
        len([n for n in logs if n.endswith(".log")]) == 5
        and len([n for n in logs if n.endswith(".err")]) == 5
    )
    newest = host.log_dir / logs[-1]
    assert newest.name.endswith(".log")
    assert newest.read_text().rstrip().endswith("[out] out-line")
    assert newest.with_suffix(".err").read_text().rstrip().endswith("[err] err-line")


def test_write_logs_false_keeps_no_files(host: HostRoot) -> None:
    _simple(host)
    result = host.run("apply", env=host.env(SKYHOOK_AGENT_WRITE_LOGS="false"))
    assert result.code == 0 and not host.log_dir.exists()
    assert "logs off" in result.out


def test_log_directory_follows_the_setting(host: HostRoot) -> None:
    _simple(host)
    assert host.run("apply", env=host.env(NODEWRIGHT_LOG_DIR="/var/log/nodewright/nw")).code == 0
    assert list(host.path("/var/log/nodewright/nw/demo/1.0.0").glob("apply.sh-*.log"))
    assert host.run("apply-check", env=host.env(SKYHOOK_ROOT_DIR="/etc/other")).code == 0
    assert host.path("/etc/other/history/demo.json").exists()


def test_buffer_limit_splits_long_lines(host: HostRoot) -> None:
    host.script("config.sh", "printf 'abcdefghijklmnopqrstuvwxyz\\n'")
    host.script("config_check.sh", "true")
    host.config({"config": [step("config.sh")], "config-check": [step("config_check.sh")]})
    assert host.run("config", env=host.env(SKYHOOK_AGENT_BUFFER_LIMIT="10")).code == 0
    (log,) = host.log_dir.glob("config.sh-*.log")
    assert [line.split("] ", 1)[1] for line in log.read_text().splitlines()] == [
        "abcdefghij",
        "klmnopqrst",
        "uvwxyz",
    ]
