"""`make lint`'s unused-code check: functions, methods and classes of `nodewright/` that nothing refers to.

Vulture reads `nodewright/`, `tests/`, `e2e/`, `benchmarks/` and `hack/` (a function only tests use is
still used: it is there for them) and reports the definitions under `nodewright/` no name refers to.
`ALLOWED` lists the ones called from outside Python's view, each with why.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vulture import Vulture

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("nodewright", "tests", "e2e", "benchmarks", "hack")
KINDS = frozenset({"function", "method", "class", "property"})
ALLOWED = {
    "_check_cel_rules": "a pydantic model validator (called by pydantic)",
    "complete_main": "the kubectl_complete-nodewright entry point (pyproject.toml [project.scripts])",
    "__call__": "a Protocol's call signature",
    "_receive_metrics": "OpenTelemetry's MetricReader hook",
    "writable": "the io.RawIOBase protocol",
    "readable": "the io.RawIOBase protocol",
}


def unused() -> list[str]:
    scan = Vulture(verbose=False)
    scan.scavenge([str(ROOT / p) for p in PATHS], exclude=[str(ROOT / "hack" / "controlplane")])
    return [
        f"{Path(item.filename).relative_to(ROOT)}:{item.first_lineno}: unused {item.typ} {item.name!r}"
        for item in scan.get_unused_code(min_confidence=60)
        if item.typ in KINDS
        and Path(item.filename).resolve().is_relative_to(ROOT / "nodewright")
        and item.name not in ALLOWED
    ]


def main() -> int:
    found = unused()
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} definition(s) referenced nowhere: remove them, or say in ALLOWED why they stay")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
