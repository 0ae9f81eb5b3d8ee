"""The benchmark's runtime-only environment: the operator's dependencies, and none of the dev tools."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from benchmarks import runtime_env


def names(requirements: list[Requirement]) -> set[str]:
    return {d.metadata["Name"].lower().replace("_", "-") for d in runtime_env.closure(requirements)}


def test_the_closure_follows_requirements_and_leaves_out_the_dev_tools() -> None:
    found = names(runtime_env.project_requirements())
    assert {"aiohttp", "pydantic", "pydantic-core", "structlog", "multidict", "opentelemetry-sdk"} <= found
    # Installed here for tests, lint and the benchmark's sampler, never in the image.
    assert not found & {"rich", "pygments", "psutil", "hypothesis", "pytest", "import-linter", "mypy"}


def test_markers_are_evaluated_for_this_interpreter() -> None:
    assert names([Requirement('pydantic; python_version < "3"')]) == set()
    assert "pydantic" in names([Requirement('pydantic; python_version >= "3"')])


def test_a_missing_distribution_names_itself() -> None:
    with pytest.raises(runtime_env.RuntimeEnvError, match="no-such-distribution-here"):
        runtime_env.closure([Requirement("no-such-distribution-here>=1")])


def test_python_s_on_the_links_imports_the_operator_without_the_dev_tools(tmp_path: Path) -> None:
    target = tmp_path / "runtime"
    (target / "stale").mkdir(parents=True)
    listed = runtime_env.build(target)
    assert any(d.startswith("aiohttp==") for d in listed) and not (target / "stale").exists()
    probe = (
        "import sys, nodewright.controller.operator\n"
        "print(sorted(m for m in ('rich', 'psutil', 'hypothesis') if m in sys.modules))\n"
        "import opentelemetry.context; opentelemetry.context.get_current()\n"  # found by entry point
    )
    env = {"PYTHONPATH": f"{target}:{runtime_env.PYPROJECT.parent}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-S", "-c", probe], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_bytecode_is_compiled_for_python_oo_under_the_prefix_only(tmp_path: Path) -> None:
    tree, prefix = tmp_path / "tree", tmp_path / "pycache"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "mod.py").write_text('"""Docstring."""\nX = 1\n')
    runtime_env.compile_bytecode([tree], prefix)
    assert not list(tree.rglob("*.pyc"))  # nothing written into the tree itself
    compiled = [p.name for p in prefix.rglob("*.pyc")]
    assert compiled == ["mod.cpython-{}{}.opt-2.pyc".format(*sys.version_info[:2])]
