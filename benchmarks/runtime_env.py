"""The operator's runtime dependencies alone, as the image ships them, for the benchmark to run it in.

The development venv also holds the test and lint tools, and some of them change what the operator
process loads: structlog imports `rich` (and with it `pygments`) for pretty tracebacks whenever it is
installed (here it is, as import-linter's dependency), and the OpenTelemetry SDK imports `psutil`
(installed for the benchmark's own sampler) for its process resource detector. The operator image has
neither (`pip install .`, Dockerfile; `hack/images/build.py`), so measured in the venv the operator
would carry about 4 MiB it never carries in a cluster.

`build(target)` makes a directory of symbolic links, file by file, to the installed files of the
project's runtime dependencies (`[project].dependencies` of pyproject.toml, followed through each
distribution's own requirements, markers evaluated for this interpreter), `.dist-info` included
(OpenTelemetry finds its context implementation through entry points). Run with `python -S` and this
directory and the repository on `PYTHONPATH`, the operator imports exactly what the image would give
it, at the versions this venv pinned. Nothing is downloaded or copied.

`compile_bytecode(trees, prefix)` then does what the image build does (`compileall -o 2` under
`-X no_debug_ranges`, Dockerfile; `hack/images/build.py`): the `.opt-2.pyc` files `python -OO` reads,
here under a pycache prefix of their own (`PYTHONPYCACHEPREFIX`), so nothing is written into the
repository or the venv. Without them an operator compiles every module from source as it starts
whenever no bytecode can be written (`PYTHONDONTWRITEBYTECODE`, as in the image): the compiler's
scratch memory is freed, but not all of it goes back to the kernel: on a 1,000-node fleet an idle
operator compiled from source measured 65.8 MiB, precompiled 65.4 MiB (docs/benchmarks.md).
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


class RuntimeEnvError(RuntimeError):
    """A runtime dependency is not installed in this environment (run `make venv`)."""


def project_requirements(pyproject: Path = PYPROJECT) -> list[Requirement]:
    with pyproject.open("rb") as f:
        return [Requirement(line) for line in tomllib.load(f)["project"]["dependencies"]]


def _applies(requirement: Requirement, extras: Iterable[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in (*extras, ""))


def closure(requirements: Iterable[Requirement]) -> list[metadata.Distribution]:
    """The installed distributions the requirements need, transitively, each once."""
    found: dict[str, metadata.Distribution] = {}
    pending: list[tuple[Requirement, tuple[str, ...]]] = [(r, ()) for r in requirements]
    while pending:
        requirement, parent_extras = pending.pop()
        if not _applies(requirement, parent_extras):
            continue
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError as exc:
            raise RuntimeEnvError(f"runtime dependency {requirement} is not installed (make venv)") from exc
        found[name] = dist
        extras = tuple(requirement.extras)
        pending.extend((Requirement(r), extras) for r in dist.requires or ())
    return sorted(found.values(), key=lambda d: canonicalize_name(d.metadata["Name"]))


def build(target: Path, requirements: Iterable[Requirement] | None = None) -> list[str]:
    """Fill `target` (emptied first) with links to the runtime distributions' files; returns their
    `name==version` list."""
    dists = closure(project_requirements() if requirements is None else requirements)
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for dist in dists:
        for file in dist.files or ():
            if file.parts[0] == ".." or file.parts[0].startswith("__editable__"):
                continue  # console scripts under bin/, editable-install hooks
            source = Path(str(dist.locate_file(file)))
            if not source.exists():
                continue
            link = target / file
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(source)
    return [f"{d.metadata['Name']}=={d.version}" for d in dists]


def compile_bytecode(trees: Iterable[Path], prefix: Path) -> None:
    """Byte-compile `trees` as the image build does for `python -OO -X no_debug_ranges`, into the
    pycache `prefix` (give the operator `PYTHONPYCACHEPREFIX=prefix`). Files already compiled from the
    same source are kept, so only the first run (or a changed file) pays the compile."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(prefix)}
    subprocess.run(
        [
            sys.executable,
            "-X",
            "no_debug_ranges",
            "-m",
            "compileall",
            "-q",
            "-j0",
            "-o",
            "2",
            *map(str, trees),
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
