"""SIGTERM (the kubelet stopping a package pod): the running step is stopped, the run reports failure.

The agent runs as a real child process (`python -m nodewright.agent`) so the signal arrives as it does in
a pod. Package pods share the host's PID namespace, so a step left running would outlive the pod: the
agent forwards SIGTERM to the step's process group and SIGKILLs it after NODEWRIGHT_AGENT_STOP_TIMEOUT.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodewright.agent.runner import StopRequest
from tests.agent_fixtures.hostroot import HostRoot, step

REPO = Path(__file__).resolve().parents[1]


def _start(host: HostRoot, mode: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "nodewright.agent", mode, str(host.root), host.copy_dir],
        cwd=REPO,
        env=host.env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for(path: Path, process: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        if process.poll() is not None:
            pytest.fail(f"agent exited early with {process.returncode}: {process.communicate()[0]}")
        time.sleep(0.05)
    pytest.fail(f"the step never wrote {path}")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    return HostRoot(root=tmp_path / "root")


def test_sigterm_stops_the_running_step_and_reports_failure(host: HostRoot) -> None:
    host.script("slow.sh", 'echo $$ > "$NODEWRIGHT_HOST_ROOT/step.pid"; exec sleep 60')
    host.script("after.sh", 'touch "$NODEWRIGHT_HOST_ROOT/after-ran"')
    host.script("check.sh", "true")
    host.config({"apply": [step("slow.sh"), step("after.sh")], "apply-check": [step("check.sh")]})
    agent = _start(host, "apply")
    pid = _wait_for(host.path("/step.pid"), agent)
    agent.send_signal(signal.SIGTERM)
    output, _ = agent.communicate(timeout=60)
    assert agent.returncode == 143, output
    assert "stopped by signal 15 before apply finished: reporting failure" in output
    assert _gone(pid), "the step must not outlive the agent"
    assert not host.path("/after-ran").exists()
    assert host.flags() == [], "an interrupted step is not marked done"


def test_a_step_ignoring_sigterm_is_killed_after_the_stop_timeout(host: HostRoot) -> None:
    host.script(
        "stubborn.sh",
        "trap '' TERM\necho $$ > \"$NODEWRIGHT_HOST_ROOT/step.pid\"\nwhile true; do sleep 0.2; done",
    )
    host.script("stubborn_check.sh", "true")
    host.config({"config": [step("stubborn.sh")], "config-check": [step("stubborn_check.sh")]})
    agent = _start(host, "config", NODEWRIGHT_AGENT_STOP_TIMEOUT="0.5")
    pid = _wait_for(host.path("/step.pid"), agent)
    agent.send_signal(signal.SIGTERM)
    output, _ = agent.communicate(timeout=60)
    assert agent.returncode == 143, output
    assert _gone(pid)


def test_sigterm_during_checks_fails_the_check_run(host: HostRoot) -> None:
    host.script("apply.sh", "true")
    host.script("apply_check.sh", 'echo $$ > "$NODEWRIGHT_HOST_ROOT/step.pid"; exec sleep 60')
    host.config({"apply": [step("apply.sh")], "apply-check": [step("apply_check.sh")]})
    agent = _start(host, "apply-check")
    _wait_for(host.path("/step.pid"), agent)
    agent.send_signal(signal.SIGINT)
    output, _ = agent.communicate(timeout=60)
    assert agent.returncode == 130, output
    assert not (host.state_dir / "history" / "demo.json").exists()


def test_signal_handlers_are_installed_for_the_run_and_restored_after() -> None:
    before = signal.getsignal(signal.SIGTERM)
    stop = StopRequest()
    with stop.handling_signals():
        assert signal.getsignal(signal.SIGTERM) is not before
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.01)
    assert stop.requested and stop.signal_number == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before
