"""`nodewright consistency`: the distribution of packages and node facts over a fleet, skew marked."""

from __future__ import annotations

from typing import Any

from nodewright.api import constants
from nodewright.api.nodestate import NodeState, PackageEntry, PackageStage, PackageState, encode
from nodewright.cli.consistency_cmd import consistency_report, render


def nodewright() -> dict[str, Any]:
    return {
        "apiVersion": constants.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": "tune"},
        "spec": {
            "nodeSelectors": {"matchLabels": {"pool": "gpu"}},
            "packages": {"tuning": {"version": "1.0.0", "image": "ghcr.io/x/tuning"}},
        },
    }


def node(
    name: str, *, version: str = "1.0.0", drifted: str = "", driver: str = "550.127.08"
) -> dict[str, Any]:
    entry = PackageEntry("tuning", "1.0.0", PackageStage.CONFIG, PackageState.COMPLETE, drifted=drifted)
    return {
        "metadata": {
            "name": name,
            "labels": {"pool": "gpu", "nvidia.com/cuda.driver-version.full": driver},
            "annotations": {constants.state_annotation("tune"): encode(NodeState(packages=(entry,)))},
        },
        "status": {"nodeInfo": {"kernelVersion": "5.15.0-1063-nvidia", "osImage": "Ubuntu 22.04.4 LTS"}},
    }


def test_a_uniform_fleet_says_so() -> None:
    report = consistency_report([nodewright()], [node(f"n{i}") for i in range(4)])
    assert report.uniform and report.nodes == 4
    assert "4 nodes: uniform" in render(report)


def test_skew_is_marked_with_counts_and_examples() -> None:
    nodes = [
        node("n0"),
        node("n1"),
        node("n2", drifted="config-check failed"),
        node("n3", driver="570.124.06"),
    ]
    nodes.append({"metadata": {"name": "other", "labels": {"pool": "cpu"}}, "status": {}})
    report = consistency_report([nodewright()], nodes)
    assert not report.uniform and report.nodes == 4, "only the NodeWright's nodes"
    [package] = report.packages
    assert package.skewed and dict(package.counts) == {
        "1.0.0 config none complete": 3,
        "1.0.0 config none drifted": 1,
    }
    assert package.examples["1.0.0 config none drifted"] == ("n2",)
    driver = next(d for d in report.facts if d.name == "driver")
    assert dict(driver.counts) == {"550.127.08": 3, "570.124.06": 1}
    text = render(report)
    assert "NOT uniform" in text and "SKEW" in text and "e.g. n3" in text
    doc = report.to_json()
    assert doc["uniform"] is False and doc["packages"][0]["skew"] is True
