"""The Krew manifest `krew/nodewright.yaml` (a krew-release-bot template) renders into a manifest Krew
accepts: the fields and rules of krew-index's validation (name, semver version with `v`, a short
description, one platform per os/arch selector with an https URI, a sha256 and the `kubectl-nodewright`
binary), and its assets are the ones `krew/build.sh` builds.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "krew" / "nodewright.yaml"
ADD_URI = re.compile(r'\{\{ addURIAndSha "([^"]+)" \.TagName \}\}')


def render(tag: str) -> dict[str, object]:
    """What krew-release-bot does: the tag substituted, each asset's URI and sha256 written out."""
    text = TEMPLATE.read_text()

    def asset(match: re.Match[str]) -> str:
        uri = match.group(1).replace("{{ .TagName }}", tag)
        return f"uri: {uri}\n    sha256: {'ab' * 32}"

    text = ADD_URI.sub(asset, text).replace("{{ .TagName }}", tag)
    doc = yaml.safe_load(text)
    assert isinstance(doc, dict)
    return doc


def test_the_rendered_manifest_follows_krews_rules() -> None:
    doc = render("v0.1.0")
    assert doc["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2" and doc["kind"] == "Plugin"
    assert doc["metadata"] == {"name": "nodewright"}
    spec = doc["spec"]
    assert isinstance(spec, dict)
    assert re.fullmatch(r"v\d+\.\d+\.\d+", spec["version"])
    assert 0 < len(spec["shortDescription"]) <= 50 and spec["homepage"].startswith("https://")
    seen = set()
    for platform in spec["platforms"]:
        labels = platform["selector"]["matchLabels"]
        key = (labels["os"], labels["arch"])
        assert key not in seen
        seen.add(key)
        assert platform["uri"] == (
            f"https://github.com/nodewright/nodewright/releases/download/v0.1.0/"
            f"kubectl-nodewright_{labels['os']}_{labels['arch']}.tar.gz"
        )
        assert re.fullmatch(r"[0-9a-f]{64}", platform["sha256"]) and platform["bin"] == "kubectl-nodewright"
    assert ("linux", "amd64") in seen


def test_the_build_script_makes_the_assets_the_manifest_names() -> None:
    script = (REPO / "krew" / "build.sh").read_text()
    assert 'asset="$out/kubectl-nodewright_${os}_${arch}.tar.gz"' in script
    for os_arch in ("linux/amd64", "linux/arm64", "darwin/arm64"):
        assert f"{os_arch})" in script
    assert "from nodewright.cli.plugin import main" in script
    from nodewright.cli import plugin

    assert callable(plugin.main)
