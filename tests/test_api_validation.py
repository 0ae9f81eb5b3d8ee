from __future__ import annotations

from typing import Any

import pytest

from nodewright.api import semver
from nodewright.api.validation import (
    ValidationResult,
    canonical_selector,
    find_cycles,
    package_name_patch,
    render_path,
    strategy_defaults_patch,
    validate_deploymentpolicy,
    validate_disruptionbudget,
    validate_nodewright,
)
from tests.api_corpus import convert_reference, invalid_cases, normalize_path, sample_documents

# Policies defined by the samples themselves (a sample NodeWright may reference one of them).
EXISTING_POLICIES = {
    doc["metadata"]["name"]
    for reference in (False, True)
    for _, doc in sample_documents(reference=reference)
    if doc.get("kind") == "DeploymentPolicy"
}


def _validate(doc: dict[str, Any]) -> ValidationResult:
    if doc["kind"] == "NodeWright":
        return validate_nodewright(doc, policy_exists=lambda n: n in EXISTING_POLICIES)
    if doc["kind"] == "DisruptionBudget":
        return validate_disruptionbudget(doc)
    return validate_deploymentpolicy(doc)


def test_corpus_is_large_enough() -> None:
    assert len(invalid_cases()) >= 40


@pytest.mark.parametrize(("name", "expect", "doc"), invalid_cases(), ids=[c[0] for c in invalid_cases()])
def test_invalid_manifest_rejected_naming_the_field(name: str, expect: str, doc: dict[str, Any]) -> None:
    result = _validate(doc)
    assert result.errors, f"{name} was accepted"
    paths = [normalize_path(e.path) for e in result.errors]
    assert any(p.startswith(normalize_path(expect)) for p in paths), (name, [str(e) for e in result.errors])


@pytest.mark.parametrize(
    ("name", "doc"), sample_documents(reference=False), ids=lambda x: x if isinstance(x, str) else ""
)
def test_samples_accepted(name: str, doc: dict[str, Any]) -> None:
    assert _validate(doc).errors == [], name


@pytest.mark.parametrize(
    ("name", "doc"), sample_documents(reference=True), ids=lambda x: x if isinstance(x, str) else ""
)
def test_reference_manifests_accepted_after_changing_apiversion_and_kind(
    name: str, doc: dict[str, Any]
) -> None:
    assert doc["apiVersion"] == "skyhook.nvidia.com/v1alpha1"
    assert _validate(convert_reference(doc)).errors == [], name


def _nw(packages: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "nw"}, "spec": {"packages": packages, **spec}}


def test_all_problems_reported_at_once() -> None:
    doc = _nw(
        {
            "aa": {"version": "x", "image": "Bad/Image", "dependsOn": {"zz": "1.0"}},
            "bb": {"version": "1.0", "image": "ok", "uninstall": {"apply": True}},
        },
        interruptionBudget={"count": 1},
        deploymentPolicy="p",
    )
    paths = {normalize_path(e.path) for e in validate_nodewright(doc).errors}
    assert {
        "spec.packages.aa.version",
        "spec.packages.aa.image",
        "spec.packages.aa.dependsOn.zz",
        "spec.packages.bb.uninstall.apply",
        "spec.interruptionBudget",
    } <= paths


def test_cycle_is_named() -> None:
    doc = _nw(
        {
            "aa": {"version": "1.0", "image": "x", "dependsOn": {"bb": "1.0"}},
            "bb": {"version": "1.0", "image": "x", "dependsOn": {"cc": "1.0"}},
            "cc": {"version": "1.0", "image": "x", "dependsOn": {"aa": "1.0"}},
        }
    )
    messages = [e.message for e in validate_nodewright(doc).errors]
    assert any("aa -> bb -> cc -> aa" in m for m in messages), messages


def test_find_cycles_each_once() -> None:
    assert find_cycles({"a": ["b"], "b": ["a", "c"], "c": ["c"], "d": []}) == [["a", "b", "a"], ["c", "c"]]
    assert find_cycles({"a": ["b"], "b": []}) == []


def test_config_interrupt_globs() -> None:
    pkg = {"version": "1.0", "image": "x", "configMap": {"a.sh": "", "b.conf": ""}}
    ok = _nw({"pk": {**pkg, "configInterrupts": {"*.sh": {"type": "noop"}, "b.conf": {"type": "noop"}}}})
    assert validate_nodewright(ok).errors == []
    bad = _nw({"pk": {**pkg, "configInterrupts": {"c.conf": {"type": "noop"}}}})
    assert [e.path for e in validate_nodewright(bad).errors] == ["spec.packages[pk].configInterrupts[c.conf]"]


def test_update_refuses_removal_until_uninstalled() -> None:
    old = _nw({"pk": {"version": "1.0", "image": "x", "uninstall": {"enabled": True}}})
    new = _nw({})
    present = validate_nodewright(new, old=old, presence=lambda nw, p: True)
    assert [e.path for e in present.errors] == ["spec.packages[pk]"]
    gone = validate_nodewright(new, old=old, presence=lambda nw, p: False)
    assert gone.errors == []


def test_update_downgrade_needs_apply_and_absence() -> None:
    old = _nw({"pk": {"version": "2.0", "image": "x", "uninstall": {"enabled": True, "apply": True}}})
    new = _nw({"pk": {"version": "1.0", "image": "x", "uninstall": {"enabled": True}}})
    assert validate_nodewright(new, old=old, presence=lambda nw, p: True).errors
    result = validate_nodewright(new, old=old, presence=lambda nw, p: False)
    assert result.errors == []
    assert any("uninstall cancelled" in w for w in result.warnings)
    upgrade = _nw({"pk": {"version": "3.0", "image": "x", "uninstall": {"enabled": True}}})
    assert validate_nodewright(upgrade, old=old, presence=lambda nw, p: True).errors == []


def test_warnings_for_risky_specs() -> None:
    result = validate_nodewright(
        _nw({"pk": {"version": "1.0", "image": "x", "interrupt": {"type": "reboot"}}})
    )
    assert result.errors == []
    text = " ".join(result.warnings)
    assert "all selected nodes may be disrupted at once" in text
    assert "podNonInterruptLabels" in text


def test_selectors_compared_semantically() -> None:
    a = {"matchLabels": {"zone": "a"}}
    b = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    assert canonical_selector(a) == canonical_selector(b)
    assert canonical_selector(a) != canonical_selector({"matchLabels": {"zone": "b"}})


def test_render_path() -> None:
    assert render_path(["spec", "packages", "a", "dependsOn", "b"]) == "spec.packages[a].dependsOn[b]"
    assert render_path(["spec", "compartments", 0, "name"]) == "spec.compartments[0].name"


def test_mutations() -> None:
    doc = _nw({"aa": {"version": "1.0", "image": "x"}, "bb": {"name": "bb", "version": "1.0", "image": "x"}})
    assert package_name_patch(doc) == [{"op": "add", "path": "/spec/packages/aa/name", "value": "aa"}]
    dp = {"spec": {"default": {"strategy": {"linear": {"delta": 3}}}}}
    ops = {o["path"]: o["value"] for o in strategy_defaults_patch(dp)}
    assert ops == {
        "/spec/default/strategy/linear/initialBatch": 1,
        "/spec/default/strategy/linear/batchThreshold": 100,
        "/spec/default/strategy/linear/safetyLimit": 50,
    }


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ("1.0.0", "1.0", 0),
        ("1.2.3-rc1", "1.2.3", -1),
        ("1.10.0", "1.9.0", 1),
        ("1.0.0-rc.2", "1.0.0-rc.10", -1),
    ],
)
def test_semver_compare(a: str, b: str, want: int) -> None:
    assert semver.compare(a, b) == want


@pytest.mark.parametrize("text", ["1", "1.2", "1.2.3", "1.2.3-rc1", "1.2.3+b.1", "570.124.6"])
def test_semver_valid(text: str) -> None:
    assert semver.is_semver(text)


@pytest.mark.parametrize("text", ["v1.2.3", "01.2", "1.2-rc1", "", "1.2.3.4", "latest"])
def test_semver_invalid(text: str) -> None:
    assert not semver.is_semver(text)


def test_a_disruption_budget_names_the_field_of_each_problem() -> None:
    doc = {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DisruptionBudget",
        "metadata": {"name": "Pool_A"},
        "spec": {
            "nodeSelector": {"matchExpressions": [{"key": "bad key", "operator": "In", "values": ["a"]}]},
            "budget": {"count": 1, "percent": 10},
        },
    }
    paths = [normalize_path(e.path) for e in validate_disruptionbudget(doc).errors]
    for want in ("metadata.name", "spec.nodeSelector.matchExpressions", "spec.budget"):
        assert any(p.startswith(want) for p in paths), (want, paths)
    assert validate_disruptionbudget("x").errors
    empty = {**doc, "metadata": {"name": "all"}, "spec": {"nodeSelector": {}, "budget": {"percent": 10}}}
    result = validate_disruptionbudget(empty)
    assert result.errors == [] and any("every node" in w for w in result.warnings)
