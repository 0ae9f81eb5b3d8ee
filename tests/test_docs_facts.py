"""Facts the docs state that the code defines: names and limits a reader copies into a command or an
alert must be the ones the code uses. (Image sizes need a build: tests/test_images.py checks those.)

- Every backticked `nodewright-...` name in docs/ (Secrets, Leases, webhook configurations,
  dashboards, the category) exists in the code, the chart or the manifests: a renamed object cannot
  leave a stale name behind (docs/operations.md once named a signing Secret that never existed).
- The Secrets the docs name are the Secrets the code reads.
- The kept-log limits docs/plugin.md states are the log store's constants.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from nodewright.controller import logstore
from nodewright.controller.signing import SIGNING_SECRET_NAME

ROOT = Path(__file__).resolve().parent.parent
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
NAME = re.compile(r"`(nodewright-[a-z0-9][-a-z0-9.]*[a-z0-9])`")


@cache
def sources() -> str:
    """The text of everything that defines names: code, chart, manifests."""
    suffixes = (".py", ".yaml", ".yml", ".tpl", ".json", ".txt")
    paths = [p for folder in ("nodewright", "helm", "manifests") for p in sorted((ROOT / folder).rglob("*"))]
    return "\n".join(p.read_text(errors="replace") for p in paths if p.is_file() and p.suffix in suffixes)


def flat(path: Path) -> str:
    return " ".join(path.read_text().split())


def test_every_object_name_in_the_docs_exists_in_the_code_or_the_chart() -> None:
    stale = [
        f"{path.relative_to(ROOT)}: `{name}`"
        for path in DOCS
        for name in sorted(set(NAME.findall(path.read_text())))
        if name not in sources()
    ]
    assert stale == [], f"names no code, chart or manifest defines: {stale}"


def test_the_secrets_the_docs_name_are_the_ones_the_code_reads() -> None:
    webhook_default = re.search(r"secretName: (\S+)", (ROOT / "helm/nodewright/values.yaml").read_text())
    assert webhook_default is not None
    real = {SIGNING_SECRET_NAME, webhook_default.group(1)}
    for path in DOCS:
        text = flat(path)
        for match in re.finditer(r"Secret `(nodewright-[-a-z0-9]+)`", text):
            assert match.group(1) in real, (
                f"{path.relative_to(ROOT)}: Secret `{match.group(1)}` is not one of {real}"
            )
    assert f"`{SIGNING_SECRET_NAME}`" in flat(ROOT / "docs" / "operations.md")


def test_the_kept_log_limits_in_the_plugin_docs_are_the_log_stores() -> None:
    text = flat(ROOT / "docs" / "plugin.md")
    stated = re.search(r"\(last (\d+) lines, at most (\d+) KiB\)", text)
    assert stated is not None, "docs/plugin.md no longer states the kept log tail"
    assert int(stated.group(1)) == logstore.LOG_TAIL_LINES
    assert int(stated.group(2)) * 1024 == logstore.MAX_LOG_CHARS
    store = re.search(r"at most (\d+) KiB \(oldest entries dropped first", text)
    assert store is not None and int(store.group(1)) * 1024 == logstore.MAX_STORE_CHARS
