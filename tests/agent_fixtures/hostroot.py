"""A temporary host root with one package in its copy directory, and a way to run the agent on it.

`HostRoot` lays out what a package pod leaves on a node before the agent runs: the package payload
(config.json, skyhook_dir/ scripts, optional root_dir/ and configmaps/) under `<root><copy_dir>`.
`run` calls `nodewright.agent.main` in-process with a small environment, unprivileged (no chroot)
unless the test asks otherwise, and returns the exit code with what the agent printed; `run_process`
runs it as its own process, for inputs that could block or exhaust it.
"""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodewright.agent import main

COPY_DIR = "/var/lib/skyhook/nw/demo-1.0.0-uid-1"
MEMORY_LIMIT = 1 << 30
FILE_SIZE_LIMIT = 256 << 20
RESOURCE_ID = "nw-uid-1_demo_1.0.0"


def limit_resources() -> None:
    """In a child process before exec, as a safety net: at most `MEMORY_LIMIT` of address space and
    files of at most `FILE_SIZE_LIMIT` (an endless read or copy ends the process, not the machine)."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


@dataclass(frozen=True)
class AgentRun:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def step(path: str, **fields: Any) -> dict[str, Any]:
    """A schema v1 step object with every required field; keyword arguments override."""
    body: dict[str, Any] = {
        "name": path.replace("/", "_"),
        "path": path,
        "arguments": [],
        "returncodes": [0],
        "on_host": True,
        "idempotence": False,
        "upgrade_step": False,
    }
    body.update(fields)
    return body


@dataclass
class HostRoot:
    root: Path
    copy_dir: str = COPY_DIR
    package: str = "demo"
    version: str = "1.0.0"
    base_env: dict[str, str] = field(default_factory=dict)

    @property
    def package_dir(self) -> Path:
        return self.root / self.copy_dir.lstrip("/")

    @property
    def state_dir(self) -> Path:
        return self.root / "etc" / "skyhook"

    @property
    def log_dir(self) -> Path:
        return self.root / "var" / "log" / "skyhook" / self.package / self.version

    def path(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    def script(self, name: str, body: str) -> None:
        """A /bin/sh step script under skyhook_dir/, left non-executable (the agent sets +x)."""
        target = self.package_dir / "skyhook_dir" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("#!/bin/sh\n" + body + "\n")
        target.chmod(0o644)

    def config(
        self,
        modes: Mapping[str, Sequence[dict[str, Any]]],
        *,
        expected_config_files: Sequence[str] = (),
        **extra: Any,
    ) -> None:
        body: dict[str, Any] = {
            "schema_version": "v1",
            "package_name": self.package,
            "package_version": self.version,
            "expected_config_files": list(expected_config_files),
            "modes": {name: list(steps) for name, steps in modes.items()},
        }
        body.update(extra)
        self.package_dir.mkdir(parents=True, exist_ok=True)
        (self.package_dir / "config.json").write_text(json.dumps(body, indent=2))

    def configmap(self, name: str, text: str) -> None:
        target = self.package_dir / "configmaps" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def overlay_file(self, host_path: str, text: str) -> None:
        target = self.package_dir / "root_dir" / host_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "NODEWRIGHT_AGENT_CHROOT": "false",
            "COPY_RESOLV": "false",
            "SKYHOOK_RESOURCE_ID": RESOURCE_ID,
        }
        env.update(self.base_env)
        env.update(extra)
        return env

    def run(self, mode: str, *extra_args: str, env: Mapping[str, str] | None = None) -> AgentRun:
        out, err = io.StringIO(), io.StringIO()
        code = main(
            [mode, str(self.root), self.copy_dir, *extra_args],
            environ=self.env() if env is None else env,
            stdout=out,
            stderr=err,
        )
        return AgentRun(code=code, out=out.getvalue(), err=err.getvalue())

    def run_process(
        self, mode: str, *extra_args: str, env: Mapping[str, str] | None = None, timeout: float = 60
    ) -> AgentRun:
        """The agent as a package pod runs it: `python -m nodewright.agent`, a process of its own.

        For hostile inputs that once made the agent block or eat memory: `timeout` and the limits of
        `limit_resources` are safety nets that end such a run, never what a test asserts."""
        result = subprocess.run(
            [sys.executable, "-m", "nodewright.agent", mode, str(self.root), self.copy_dir, *extra_args],
            env=dict(self.env() if env is None else env),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            preexec_fn=limit_resources,
            check=False,
        )
        return AgentRun(code=result.returncode, out=result.stdout, err=result.stderr)

    def flags(self) -> list[str]:
        directory = self.state_dir / "flags" / self.package / self.version
        if not directory.exists():
            return []
        return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())

    def history(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state_dir / "history" / f"{self.package}.json").read_text())
        return data
