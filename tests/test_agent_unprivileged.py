"""Not root, the agent runs steps without chroot by default, as the simulated kubelet runs it.

Run as root (CI), this test drops to the `nobody` user for the agent process, so the default is decided
by the real effective uid rather than by NODEWRIGHT_AGENT_CHROOT. The agent runs from a copy of
nodewright/agent that user can read, against a host-root directory it owns.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_fixtures.hostroot import COPY_DIR, HostRoot, step

AGENT = Path(__file__).resolve().parents[1] / "nodewright" / "agent"
NOBODY = 65534


def _runs_as_nobody(python: str) -> bool:
    try:
        probe = subprocess.run(
            [python, "-S", "-c", "pass"], user=NOBODY, group=NOBODY, extra_groups=[], timeout=30, check=False
        )
    except OSError:
        return False
    return probe.returncode == 0


@pytest.fixture
def workspace() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("switching to an unprivileged user needs root; the tests run unprivileged already")
    directory = Path(tempfile.mkdtemp(prefix="nodewright-agent-"))
    try:
        directory.chmod(0o755)
        yield directory
    finally:
        shutil.rmtree(directory)


def test_as_a_normal_user_steps_run_without_chroot(workspace: Path) -> None:
    python = next(
        (p for p in (os.path.realpath(sys.executable), "/usr/bin/python3") if _runs_as_nobody(p)), None
    )
    if python is None:
        pytest.skip("no Python interpreter on this machine can be run by the nobody user")
    image = workspace / "image"
    shutil.copytree(AGENT, image / "nodewright" / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    host = HostRoot(root=workspace / "root")
    host.script(
        "apply.sh", 'id -u > "$NODEWRIGHT_HOST_ROOT/applied-by"; pwd >> "$NODEWRIGHT_HOST_ROOT/applied-by"'
    )
    host.script("apply_check.sh", "true")
    host.config({"apply": [step("apply.sh")], "apply-check": [step("apply_check.sh")]})
    for path in [host.root, *host.root.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    env = host.env()
    del env["NODEWRIGHT_AGENT_CHROOT"]

    def agent(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [python, "-S", "-m", "nodewright.agent", "apply", str(host.root), COPY_DIR],
            cwd=image,
            env={**env, **extra},
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
        )

    result = agent()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no chroot (unprivileged mode)" in result.stdout
    assert host.path("/applied-by").read_text().split() == [str(NOBODY), str(host.root)]
    refused = agent(NODEWRIGHT_AGENT_CHROOT="true")
    assert refused.returncode == 2
    assert "NODEWRIGHT_AGENT_CHROOT=true needs root" in refused.stderr
