"""The agent under hostile input, as a package pod runs it (its own process): one clear line, the
documented exit code, nothing run, no hang and no memory exhaustion.

What a package or a node can hand the agent: a config.json that is a FIFO (once blocked forever), a
symlink to /dev/zero (once read until memory ran out), JSON nested 100,000 levels deep (once a
RecursionError traceback), a step script that is a symlink out of the package (once run, and made
executable, wherever it pointed), a FIFO as the host's /etc/environment or as a history file, a deep
interrupt payload, and settings too large to mean anything (once a crash of the first step, exit 1).
The subprocess timeout and memory limit of `HostRoot.run_process` only stop a run that misbehaves; the
assertions are on what the agent says and does.
"""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from tests.agent_fixtures.hostroot import HostRoot, step


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    host = HostRoot(root=tmp_path / "root")
    host.script("apply.sh", 'echo ran >> "$NODEWRIGHT_HOST_ROOT/runs"')
    host.script("apply_check.sh", 'test -f "$NODEWRIGHT_HOST_ROOT/runs"')
    host.config({"apply": [step("apply.sh")], "apply-check": [step("apply_check.sh")]})
    return host


def _agent_lines(text: str, kind: str) -> list[str]:
    """The agent's `ERROR:`/`WARNING:` lines without their time stamps."""
    return [line.split(" [agent] ", 1)[1] for line in text.splitlines() if f" [agent] {kind}: " in line]


def _only_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert "Traceback" not in err
    return lines[0].split(" [agent] ", 1)[1]


def _replace_config(host: HostRoot, make: str) -> Path:
    config = host.package_dir / "config.json"
    config.unlink()
    if make == "fifo":
        os.mkfifo(config)
    elif make == "zero":
        config.symlink_to("/dev/zero")
    else:
        config.write_text("[" * 100_000 + "]" * 100_000)
    return config


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        ("fifo", "a FIFO, not a regular file; only regular files are read"),
        (
            "zero",
            "a symlink to '/dev/zero', a character device, not a regular file; only regular files are read",
        ),
        (
            "deep",
            "nested deeper than the 32-level limit of arrays and objects (schema v1 needs 5); not decoded",
        ),
    ],
)
def test_an_unusable_config_json_is_one_line_and_exit_1(host: HostRoot, make: str, reason: str) -> None:
    config = _replace_config(host, make)
    result = host.run_process("apply")
    assert result.code == 1
    assert _only_line(result.err) == f"ERROR: {config}: {reason}"
    assert not host.path("/runs").exists()


def test_a_step_leaving_the_package_is_refused_and_its_target_left_alone(
    host: HostRoot, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.sh"
    outside.write_text('#!/bin/sh\necho escaped > "$NODEWRIGHT_HOST_ROOT/escaped"\n')
    outside.chmod(0o644)
    script = host.package_dir / "skyhook_dir" / "apply.sh"
    script.unlink()
    script.symlink_to(outside)
    result = host.run_process("apply")
    assert result.code == 1
    assert _only_line(result.err) == (
        f"ERROR: {host.package_dir}/config.json: modes.apply[0].path: step 'apply.sh': skyhook_dir/apply.sh "
        f"leads out of the package through the symlink skyhook_dir/apply.sh -> '{outside}'; ship the script "
        "in the package (a relative symlink that stays inside the package is fine)"
    )
    assert not host.path("/escaped").exists() and not host.path("/runs").exists()
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644, (
        "the agent made a file outside the package executable"
    )


def test_a_step_climbing_out_with_a_relative_symlink_is_refused(host: HostRoot) -> None:
    script = host.package_dir / "skyhook_dir" / "apply.sh"
    script.unlink()
    script.symlink_to("../../../../../../../bin/true")
    result = host.run_process("apply")
    assert result.code == 1
    assert "through the symlink skyhook_dir/apply.sh -> '../../../../../../../bin/true'" in _only_line(
        result.err
    )


def test_a_relative_symlink_inside_the_package_runs(host: HostRoot) -> None:
    steps = host.package_dir / "skyhook_dir"
    (steps / "lib").mkdir()
    (steps / "apply.sh").rename(steps / "lib" / "apply-real.sh")
    (steps / "apply.sh").symlink_to("lib/apply-real.sh")
    result = host.run_process("apply")
    assert result.code == 0, result.text
    assert host.path("/runs").read_text() == "ran\n"


def test_a_fifo_as_the_hosts_environment_file_is_skipped_with_a_warning(host: HostRoot) -> None:
    environment = host.path("/etc/environment")
    environment.parent.mkdir(parents=True)
    os.mkfifo(environment)
    result = host.run_process("apply")
    assert result.code == 0, result.text
    assert _agent_lines(result.err, "WARNING") == [
        f"WARNING: the host's /etc/environment is not used: {environment}: a FIFO, not a regular file; "
        "only regular files are read"
    ]
    assert host.path("/runs").read_text() == "ran\n"


def test_a_fifo_as_the_history_file_is_moved_aside(host: HostRoot) -> None:
    history = host.state_dir / "history" / "demo.json"
    history.parent.mkdir(parents=True)
    os.mkfifo(history)
    assert host.run_process("apply").code == 0
    result = host.run_process("apply-check")
    assert result.code == 0, result.text
    assert "history file" in result.err and "moved it to" in result.err
    assert stat.S_ISFIFO(Path(f"{history}.backup").lstat().st_mode)
    assert host.history()["current-version"] == "1.0.0"


def test_a_deeply_nested_interrupt_payload_is_one_line_and_exit_1(host: HostRoot) -> None:
    payload = base64.b64encode(("[" * 40_000 + "]" * 40_000).encode()).decode()
    result = host.run_process("interrupt", payload)
    assert result.code == 1
    assert (
        _only_line(result.err)
        == 'ERROR: the interrupt argument is not base64 of JSON {"type": "<interrupt>", ...}'
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NODEWRIGHT_AGENT_BUFFER_LIMIT", "a whole number of bytes from 1 to 1048576"),
        ("SKYHOOK_AGENT_BUFFER_LIMIT", "a whole number of bytes from 1 to 1048576"),
        ("NODEWRIGHT_AGENT_LOG_LIMIT", "a whole number of bytes from 65536 to 1073741824"),
        ("NODEWRIGHT_AGENT_STOP_TIMEOUT", "a number of seconds greater than 0 and at most 3600"),
    ],
)
def test_a_setting_too_large_to_mean_anything_is_exit_2_naming_it(
    host: HostRoot, name: str, expected: str
) -> None:
    result = host.run_process("apply", env=host.env(**{name: "99999999999999999999"}))
    assert result.code == 2
    assert _only_line(result.err) == f"ERROR: {name}='99999999999999999999': expected {expected}"
    assert not host.path("/runs").exists()


# ----------------------------------------------------------------------------------------------------
# A chatty step: what is kept of its output


LIMIT = 64 * 1024
CHATTY = """\
i=0
while [ $i -lt 20000 ]; do echo "line $i of a chatty step"; i=$((i + 1)); done
echo "the last line says why"
echo "an error line" >&2
exit 3
"""


def test_a_chatty_steps_log_keeps_the_tail_under_the_limit_with_a_marker(host: HostRoot) -> None:
    host.script("apply.sh", CHATTY)
    result = host.run_process("apply", env=host.env(NODEWRIGHT_AGENT_LOG_LIMIT=str(LIMIT)))
    assert result.code == 1
    (log,) = host.log_dir.glob("apply.sh-*.log")
    data = log.read_bytes()
    first, rest = data.split(b"\n", 1)
    assert len(rest) <= LIMIT, "the kept log is the limit plus one marker line"
    assert data.rstrip().endswith(b"[out] the last line says why")
    marker = first.decode().split(" [agent] ", 1)[1]
    written = sum(
        len(f"2025-01-31T12:00:00.000000+00:00 [out] line {i} of a chatty step\n") for i in range(20000)
    )
    dropped, lines = _dropped(marker, "stdout log truncated: ")
    kept_lines = rest.count(b"\n")
    assert lines + kept_lines == 20001, "every line is either kept or counted as dropped"
    assert dropped + len(rest) == written + len(
        "2025-01-31T12:00:00.000000+00:00 [out] the last line says why\n"
    )
    assert marker.endswith("of this step's output dropped before this line; the log keeps the last 64 KiB "
                           "(NODEWRIGHT_AGENT_LOG_LIMIT)")  # fmt: skip
    kept = [line.split(" [out] ", 1)[1] for line in rest.decode().splitlines()]
    first_kept = 20000 - (len(kept) - 1)
    assert kept == [f"line {i} of a chatty step" for i in range(first_kept, 20000)] + [
        "the last line says why"
    ]
    (err,) = host.log_dir.glob("apply.sh-*.err")
    assert err.read_text().endswith("[err] an error line\n") and "truncated" not in err.read_text()


def test_a_chatty_steps_container_log_is_capped_and_ends_with_its_last_lines(host: HostRoot) -> None:
    host.script("apply.sh", CHATTY)
    result = host.run_process("apply", env=host.env(NODEWRIGHT_AGENT_LOG_LIMIT=str(LIMIT)))
    step_lines = [line for line in result.out.splitlines() if " [out] " in line]
    assert sum(len(line) + 1 for line in step_lines) <= LIMIT
    assert step_lines[-1].endswith("[out] the last line says why")
    markers = [line.split(" [agent] ", 1)[1] for line in result.out.splitlines() if " echo " in line]
    assert markers[0] == (
        "stdout echo paused after 32 KiB of this step's output (NODEWRIGHT_AGENT_LOG_LIMIT); the last 32 KiB "
        "follow when the step ends"
    )
    dropped, lines = _dropped(markers[1], "stdout echo resumed: ")
    assert lines + len(step_lines) == 20001
    assert dropped > 0 and markers[1].endswith("follow (NODEWRIGHT_AGENT_LOG_LIMIT)")
    assert "apply step apply.sh FAILED: exit 3" in result.out and "the last line says why" in result.out


def _dropped(marker: str, prefix: str) -> tuple[int, int]:
    """`<bytes> bytes (<lines> lines)` after `prefix` in a marker line."""
    assert marker.startswith(prefix), marker
    words = marker[len(prefix) :].split()
    assert words[1] == "bytes" and words[3] == "lines)", marker
    return int(words[0]), int(words[2].lstrip("("))


def test_the_history_file_and_config_json_keep_their_format(host: HostRoot) -> None:
    """The safe readers read what the agent and package authors write (no change of format)."""
    assert host.run_process("apply").code == 0
    assert host.run_process("apply-check").code == 0
    history = json.loads((host.state_dir / "history" / "demo.json").read_text())
    assert history["current-version"] == "1.0.0" and len(history["history"]) == 1


def test_a_fifo_in_root_dir_is_one_line_and_exit_1(host: HostRoot) -> None:
    overlay = host.package_dir / "root_dir" / "etc"
    overlay.mkdir(parents=True)
    os.mkfifo(overlay / "pipe")
    result = host.run_process("apply")
    assert result.code == 1
    assert _only_line(result.err) == (
        f"ERROR: root_dir may hold files, directories and symlinks only: {overlay / 'pipe'}"
    )
    assert not host.path("/runs").exists()
