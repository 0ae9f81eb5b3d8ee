"""The agent stays self-contained: Python 3.9 syntax and APIs, standard library only, runnable alone.

The agent image holds a slim Python and nodewright/agent, nothing else (images/agent/Dockerfile), and
package images may bring older interpreters, so these tests read the agent's source: every module
parses as Python 3.9, postpones annotations (`X | None` must never be evaluated on 3.9), imports only
the standard library or the agent itself, and uses no API newer than 3.9. The last tests run the agent
from a copy of nodewright/agent alone, with site-packages disabled, as the image does.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent_fixtures.hostroot import COPY_DIR, HostRoot, step

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "nodewright" / "agent"
SOURCES = sorted(AGENT.glob("*.py"))
NEWER_THAN_39_TYPING = {
    "TypeAlias",
    "ParamSpec",
    "Concatenate",
    "TypeGuard",
    "Self",
    "Never",
    "LiteralString",
    "assert_never",
    "assert_type",
    "reveal_type",
    "Required",
    "NotRequired",
    "Unpack",
    "TypeVarTuple",
    "dataclass_transform",
    "override",
}
NEWER_THAN_39_MODULES = {"tomllib"}
NEWER_THAN_39_KEYWORDS = {("zip", "strict"), ("dataclass", "slots"), ("dataclass", "kw_only")}
NEWER_THAN_39_ATTRIBUTES = {
    ("datetime", "UTC"),
    ("itertools", "pairwise"),
    ("contextlib", "chdir"),
    ("asyncio", "TaskGroup"),
    ("asyncio", "timeout"),
}
TYPE_NAMES = {
    "int",
    "str",
    "float",
    "bytes",
    "bool",
    "list",
    "dict",
    "tuple",
    "set",
    "frozenset",
    "type",
    "object",
}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path), feature_version=(3, 9))


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _annotation_nodes(tree: ast.Module) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        annotations: list[ast.expr | None] = []
        if isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotations.append(node.returns)
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
            annotations.extend(a.annotation for a in every)
        for annotation in annotations:
            if annotation is not None:
                inside.update(id(n) for n in ast.walk(annotation))
    return inside


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_parses_as_python_39_and_postpones_annotations(path: Path) -> None:
    tree = _tree(path)
    assert ast.get_docstring(tree), f"{path.name}: every module explains what it handles"
    imports = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    assert any(alias.name == "annotations" for n in imports for alias in n.names), (
        f"{path.name}: add `from __future__ import annotations` (annotations must not run on 3.9)"
    )
    assert not any(isinstance(n, ast.Match) for n in ast.walk(tree)), f"{path.name}: `match` needs 3.10"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_imports_only_the_standard_library_and_the_agent(path: Path) -> None:
    for node in ast.walk(_tree(path)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if name.startswith("nodewright."):
                assert name == "nodewright.agent" or name.startswith("nodewright.agent."), (
                    f"{path.name}: {name}"
                )
            else:
                assert top in sys.stdlib_module_names, f"{path.name}: {name} is not in the standard library"
                assert top not in NEWER_THAN_39_MODULES, f"{path.name}: {name} needs Python > 3.9"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_uses_no_api_newer_than_python_39(path: Path) -> None:
    tree = _tree(path)
    annotations = _annotation_nodes(tree)
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                assert (_call_name(node), keyword.arg) not in NEWER_THAN_39_KEYWORDS, (
                    f"{where}: {keyword.arg}="
                )
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            used = (node.value.id, node.attr)
            assert used not in NEWER_THAN_39_ATTRIBUTES, f"{where}: {'.'.join(used)} needs Python > 3.9"
        if isinstance(node, ast.ImportFrom) and node.module in ("typing", "typing_extensions"):
            newer = {alias.name for alias in node.names} & NEWER_THAN_39_TYPING
            assert not newer, f"{where}: typing.{newer} needs Python > 3.9"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and id(node) not in annotations:
            for side in (node.left, node.right):
                is_type = (isinstance(side, ast.Name) and side.id in TYPE_NAMES) or (
                    isinstance(side, ast.Constant) and side.value is None
                )
                assert not is_type, f"{where}: a `X | Y` type evaluated at run time needs Python 3.10"


def _isolated_copy(tmp_path: Path) -> Path:
    target = tmp_path / "image" / "nodewright" / "agent"
    shutil.copytree(AGENT, target, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "image"


def test_runs_from_a_copy_of_the_agent_alone(tmp_path: Path) -> None:
    image = _isolated_copy(tmp_path)
    probe = (
        "import sys, nodewright.agent as a; print(a.__file__); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('nodewright', 'tests')))"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", probe], cwd=image, capture_output=True, text=True, timeout=60, check=True
    )
    module_file, modules = result.stdout.splitlines()
    assert module_file == str(image / "nodewright" / "agent" / "__init__.py")
    assert all(m == "nodewright" or m.startswith("nodewright.agent") for m in eval(modules))


def test_a_package_runs_under_the_isolated_agent(tmp_path: Path) -> None:
    image = _isolated_copy(tmp_path)
    host = HostRoot(root=tmp_path / "root")
    host.script("apply.sh", 'echo "$1" > "$NODEWRIGHT_HOST_ROOT/applied"')
    host.script("apply_check.sh", 'test -f "$NODEWRIGHT_HOST_ROOT/applied"')
    host.config({"apply": [step("apply.sh", arguments=["ok"])], "apply-check": [step("apply_check.sh")]})
    for mode in ("apply", "apply-check"):
        result = subprocess.run(
            [sys.executable, "-S", "-m", "nodewright.agent", mode, str(host.root), COPY_DIR],
            cwd=image,
            env=host.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr
    assert host.path("/applied").read_text() == "ok\n"
    assert host.history()["current-version"] == "1.0.0"


def test_the_image_copies_the_agent_and_runs_it_as_entrypoint() -> None:
    dockerfile = (REPO / "images" / "agent" / "Dockerfile").read_text()
    assert "COPY nodewright/agent/ /opt/nodewright-agent/nodewright/agent/" in dockerfile
    assert "PYTHONPATH=/opt/nodewright-agent" in dockerfile
    assert 'ENTRYPOINT ["python", "-m", "nodewright.agent"]' in dockerfile
    assert "USER 0:0" in dockerfile
