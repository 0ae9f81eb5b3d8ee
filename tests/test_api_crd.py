from __future__ import annotations

from typing import Any

from nodewright.api import crdgen


def test_committed_crds_are_current() -> None:
    stale = crdgen.stale_files()
    assert not stale, "CRD YAML is stale; run `make generate`:\n" + "\n".join(stale.values())


def _walk(schema: dict[str, Any], path: str, problems: list[str], *, root: bool = False) -> None:
    if "$ref" in schema or "anyOf" in schema or "oneOf" in schema or "nullable" in schema:
        problems.append(f"{path}: non-structural keyword")
    if "type" not in schema and not schema.get("x-kubernetes-int-or-string"):
        problems.append(f"{path}: no type")
    # List items and map values (paths ending in "[]") inherit the property's description.
    if not root and "description" not in schema and not path.endswith((".metadata", "]")):
        problems.append(f"{path}: no description")
    # Nothing is preserved unpruned: valueFrom is typed (core/v1 EnvVarSource), so a typo is not stored.
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{path}: preserve-unknown-fields")
    unbounded = schema.get("type") == "string" and "enum" not in schema and "maxLength" not in schema
    exempt = path.endswith(("apiVersion", "kind", "lastTransitionTime")) or ".status." in path
    if unbounded and not exempt:
        problems.append(f"{path}: string without maxLength (CEL cost estimation needs it)")
    for name, prop in (schema.get("properties") or {}).items():
        _walk(prop, f"{path}.{name}", problems)
    if isinstance(schema.get("items"), dict):
        _walk(schema["items"], f"{path}[]", problems)
    if isinstance(schema.get("additionalProperties"), dict):
        _walk(schema["additionalProperties"], f"{path}[]", problems)


def test_schemas_are_structural_and_documented() -> None:
    for crd in (crdgen.nodewright_crd(), crdgen.deploymentpolicy_crd()):
        problems: list[str] = []
        _walk(
            crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
            crd["spec"]["names"]["kind"],
            problems,
            root=True,
        )
        assert problems == []


def test_printer_columns_and_names() -> None:
    nw = crdgen.nodewright_crd()["spec"]
    cols = [c["name"] for c in nw["versions"][0]["additionalPrinterColumns"] if c.get("priority", 0) == 0]
    assert cols == ["Status", "Ready", "In-Progress", "Erroring", "Packages", "Policy", "Age"]
    assert nw["names"]["shortNames"] == ["nw"] and nw["scope"] == "Cluster"
    dp = crdgen.deploymentpolicy_crd()["spec"]
    assert [c["name"] for c in dp["versions"][0]["additionalPrinterColumns"]] == [
        "Compartments",
        "Default Strategy",
        "Age",
    ]
    assert dp["names"]["shortNames"] == ["dp"]
    assert nw["versions"][0]["subresources"] == {"status": {}}


def test_conditions_are_a_list_map() -> None:
    status = crdgen.nodewright_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "status"
    ]
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_check_mode_reports_stale(tmp_path: Any) -> None:
    assert set(crdgen.stale_files((tmp_path,))) == {tmp_path / n for n in crdgen.rendered_files()}
    crdgen.write((tmp_path,))
    assert crdgen.stale_files((tmp_path,)) == {}
