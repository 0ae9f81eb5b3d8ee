"""The Argo CD health scripts (helm/nodewright/files/argocd/*.lua) run by a real Lua 5.1 interpreter, the
Lua version of Argo CD's gopher-lua, over status fixtures shaped like what the operator writes.

The interpreter comes from Debian's lua5.1 package, unpacked into the cache by hack/debian/fetch.sh (no
install). Argo CD runs a health script with the object as the global `obj` (JSON objects become tables,
null becomes nil) and reads `status` and `message` from the table it returns; the harness does the same.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "helm" / "nodewright" / "files" / "argocd"


@cache
def lua() -> tuple[str, dict[str, str]]:
    done = subprocess.run(
        ["bash", str(ROOT / "hack" / "debian" / "fetch.sh"), "lua", "lua5.1", "liblua5.1-0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"hack/debian/fetch.sh lua failed:\n{done.stderr[-2000:]}"
    root = Path(done.stdout.strip().splitlines()[-1])
    libdir = root / "usr" / "lib" / f"{platform.machine()}-linux-gnu"
    env = {**os.environ, "LD_LIBRARY_PATH": str(libdir)}
    return str(root / "usr" / "bin" / "lua5.1"), env


def lua_literal(value: Any) -> str:
    """A Lua table constructor for JSON-shaped data (what gopher-lua builds from the object)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid Lua escapes for this data
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{json.dumps(k)}] = {lua_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def health(script: str, obj: dict[str, Any]) -> tuple[str, str]:
    program = (
        f"obj = {lua_literal(obj)}\n"
        f"local function health()\n{(SCRIPTS / script).read_text()}\nend\n"
        "local hs = health()\n"
        'io.write(hs.status, "\\n", hs.message or "")\n'
    )
    binary, env = lua()
    done = subprocess.run([binary, "-"], input=program, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    status, _, message = done.stdout.partition("\n")
    return status, message


def condition(kind: str, status: str, message: str = "", reason: str = "R") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def nodewright(
    *, generation: int = 2, observed: int | None = 2, rollup: str | None = "complete", **extra: Any
) -> dict[str, Any]:
    annotations = extra.pop("annotations", {})
    conditions = extra.pop("conditions", None)
    if conditions is None:
        ready = "True" if rollup == "complete" else "False"
        conditions = [
            condition("Ready", ready, "3/3 nodes complete"),
            condition("Stalled", "False"),
            condition("Halted", "False"),
        ]
    status: dict[str, Any] = {"conditions": conditions, **extra}
    if observed is not None:
        status["observedGeneration"] = observed
    if rollup is not None:
        status["status"] = rollup
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": "tuning", "generation": generation, "annotations": annotations},
        "status": status,
    }


@pytest.mark.parametrize(
    ("obj", "want", "says"),
    [
        (nodewright(), "Healthy", "3/3 nodes complete"),
        (nodewright(rollup="in_progress"), "Progressing", "3/3"),
        (nodewright(rollup="waiting"), "Progressing", ""),
        (nodewright(observed=1), "Progressing", "generation 2"),
        (nodewright(observed=None, rollup=None, conditions=[]), "Progressing", "generation 2"),
        ({"metadata": {"name": "new", "generation": 1}}, "Progressing", "generation 1"),
        (nodewright(rollup="erroring"), "Degraded", "3/3"),
        (nodewright(rollup="blocked"), "Degraded", ""),
        (
            nodewright(
                rollup="in_progress",
                conditions=[
                    condition("Halted", "True", "compartment zone-a halted"),
                    condition("Stalled", "True"),
                ],
            ),
            "Degraded",
            "compartment zone-a halted",
        ),
        (
            nodewright(rollup="blocked", conditions=[condition("Stalled", "True", "policy p not found")]),
            "Degraded",
            "policy p not found",
        ),
        (nodewright(rollup="paused", annotations={"nodewright.io/pause": "true"}), "Suspended", "paused"),
        (nodewright(rollup="in_progress", conditions=[condition("Paused", "True")]), "Suspended", "paused"),
        (
            nodewright(rollup="disabled", annotations={"nodewright.io/disable": "true"}),
            "Suspended",
            "disabled",
        ),
        (
            {
                **nodewright(),
                "metadata": {"name": "x", "generation": 2, "deletionTimestamp": "2026-01-01T00:00:00Z"},
            },
            "Progressing",
            "deleted",
        ),
        # Complete by the roll-up but Ready not (yet) true: not healthy before the conditions agree.
        (nodewright(conditions=[condition("Ready", "False", "2/3 nodes complete")]), "Progressing", "2/3"),
    ],
)
def test_nodewright_health(obj: dict[str, Any], want: str, says: str) -> None:
    status, message = health("nodewright.lua", obj)
    assert (status, says in message) == (want, True), message


def policy(generation: int = 3, observed: int | None = 3) -> dict[str, Any]:
    status: dict[str, Any] = {"defaultStrategy": "fixed", "compartmentCount": 2}
    if observed is not None:
        status["observedGeneration"] = observed
    return {"kind": "DeploymentPolicy", "metadata": {"name": "p", "generation": generation}, "status": status}


@pytest.mark.parametrize(
    ("obj", "want", "says"),
    [
        (policy(), "Healthy", "2 compartment(s)"),
        (policy(observed=2), "Progressing", "generation 3"),
        (policy(observed=None), "Progressing", "read the policy"),
        ({"kind": "DeploymentPolicy", "metadata": {"name": "p", "generation": 1}}, "Progressing", ""),
    ],
)
def test_deploymentpolicy_health(obj: dict[str, Any], want: str, says: str) -> None:
    status, message = health("deploymentpolicy.lua", obj)
    assert (status, says in message) == (want, True), message


def test_the_harness_really_runs_lua() -> None:
    binary, env = lua()
    done = subprocess.run([binary, "-v"], capture_output=True, text=True, env=env, check=False)
    assert "Lua 5.1" in done.stdout + done.stderr
