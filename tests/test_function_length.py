"""The decision and wiring code stays in functions that read as one idea: none in `plan/` or
`controller/` is over 60 lines (docstring and comments included), so a new rule is a new function, not
another flag inside a long one."""

from __future__ import annotations

import ast
from pathlib import Path

import nodewright

LIMIT = 60
PACKAGES = ("plan", "controller")


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[str, int]]:
    """(name, lines) of every function or method of `source` longer than `limit` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


def test_no_function_in_plan_or_controller_is_over_60_lines() -> None:
    root = Path(nodewright.__file__).parent
    over = [
        f"{path.relative_to(root)}: {name} has {lines} lines"
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
        for name, lines in long_functions(path.read_text())
    ]
    assert not over, "split these (one idea per function):\n" + "\n".join(over)


def test_the_check_finds_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    assert long_functions(f"def f() -> None:\n{body}\n") == [("f", LIMIT + 1)]
    assert long_functions("async def g() -> None:\n    pass\n") == []
