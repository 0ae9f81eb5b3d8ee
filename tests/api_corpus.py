"""Shared helpers for the API manifest corpora (tests/data/invalid, manifests/samples)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
INVALID_DIR = ROOT / "tests" / "data" / "invalid"
SAMPLES_DIR = ROOT / "manifests" / "samples"


def normalize_path(text: str) -> str:
    """`spec.packages[drv].dependsOn[x]` and `spec.packages.drv.dependsOn.x` compare equal."""
    return re.sub(r"\[([^\]]*)\]", r".\1", text)


def invalid_cases() -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for path in sorted(INVALID_DIR.glob("*.yaml")):
        text = path.read_text()
        match = re.search(r"^# expect-field: (.+)$", text, re.M)
        assert match, f"{path} lacks an '# expect-field:' comment"
        out.append((path.stem, match.group(1).strip(), yaml.safe_load(text)))
    return out


def sample_documents(*, reference: bool) -> list[tuple[str, dict[str, Any]]]:
    base = SAMPLES_DIR / "reference" if reference else SAMPLES_DIR
    return [
        (f"{path.name}:{doc['metadata']['name']}", doc)
        for path in sorted(base.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def convert_reference(doc: dict[str, Any]) -> dict[str, Any]:
    """Change only apiVersion and kind, as the issue promises users."""
    out = dict(doc)
    out["apiVersion"] = "nodewright.io/v1alpha1"
    out["kind"] = "NodeWright" if doc["kind"] == "Skyhook" else doc["kind"]
    return out
