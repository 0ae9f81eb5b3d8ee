"""Kubernetes' own rules for the embedded types (nodewright.api.k8svalidation), value by value.

The expectations are Kubernetes 1.36's verdicts (the e2e test `test_kubernetes_agrees_with_the_embedded_rules`
checks the same kinds of values against a real API server); the image grammar is distribution/reference's.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from nodewright.api import k8svalidation as k8s
from nodewright.api.images import IMAGE_NAME_FIND, IMAGE_REFERENCE_PATTERN, ImageReferenceError, parse_image


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("a", True),
        ("example.com/a", True),
        ("a.b-c_d", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("a" * 253 + "/b", True),
        ("a" * 254 + "/b", False),
        ("", False),
        ("/a", False),
        ("a/", False),
        ("a/b/c", False),
        ("a b", False),
        ("Example.com/a", False),
        ("-a", False),
        ("a-", False),
        ("é", False),
        ("a\n", False),
    ],
)
def test_qualified_name(value: str, ok: bool) -> None:
    assert (not k8s.qualified_name(value)) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("", True),
        ("a", True),
        ("a.b_c-d", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("-a", False),
        ("a b", False),
    ],
)
def test_label_value(value: str, ok: bool) -> None:
    assert (not k8s.label_value(value)) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("apply.sh", True),
        (".hidden", True),
        ("_-.", True),
        ("x" * 253, True),
        ("x" * 254, False),
        ("..", False),
        (".", False),
        ("..x", False),
        ("../etc/passwd", False),
        ("a/b", False),
        ("a b", False),
        ("", False),
        ("é", False),
        ("a\n", False),
    ],
)
def test_config_map_key(value: str, ok: bool) -> None:
    assert (not k8s.config_map_key(value)) is ok
    assert (re.fullmatch(k8s.CONFIG_MAP_KEY_RE, value) is not None and len(value) <= 253) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("A", True),
        ("my.env-name_1", True),
        ("_A", True),
        (".a", True),
        ("1ABC", False),
        ("A=B", False),
        ("A B", False),
        (".", False),
        ("..", False),
        ("..A", False),
        ("", False),
    ],
)
def test_env_var_name(value: str, ok: bool) -> None:
    assert (not k8s.env_var_name(value)) is ok


@pytest.mark.parametrize(
    ("toleration", "blamed"),
    [
        ({"key": "a", "operator": "Exists"}, set()),
        ({"operator": "Exists"}, set()),
        ({"key": "a", "value": "v"}, set()),
        ({"key": "a", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}, set()),
        ({"operator": "Exists", "value": "x"}, {"t.value"}),
        ({"key": "gpu vendor", "operator": "Exists"}, {"t.key"}),
        ({"operator": "Equal", "value": "x"}, {"t.operator"}),
        ({"key": "a", "value": "a b"}, {"t.value"}),
        ({"key": "a", "operator": "Exists", "tolerationSeconds": 5}, {"t.effect"}),
        ({"key": "a", "operator": "Exists", "effect": "Sometimes"}, {"t.effect"}),
        ({"key": "a", "operator": "Lt", "value": "5"}, {"t.operator"}),
    ],
)
def test_toleration(toleration: dict[str, Any], blamed: set[str]) -> None:
    assert {e.path for e in k8s.toleration(toleration, "t")} == blamed


@pytest.mark.parametrize(
    ("value_from", "blamed"),
    [
        ({"secretKeyRef": {"name": "s", "key": "k"}}, set()),
        ({"configMapKeyRef": {"name": "c.d", "key": ".k", "optional": True}}, set()),
        ({"fieldRef": {"fieldPath": "metadata.labels['app.kubernetes.io/name']"}}, set()),
        ({"fieldRef": {"fieldPath": "metadata.annotations['Example.com/A']", "apiVersion": "v1"}}, set()),
        ({"resourceFieldRef": {"resource": "requests.hugepages-2Mi", "divisor": "1Mi"}}, set()),
        ({"resourceFieldRef": {"resource": "limits.cpu", "divisor": 1}}, set()),
        ({}, {"v"}),
        ({"nope": {}}, {"v", "v.nope"}),
        ({"secretKeyRef": {"name": "s", "key": "k"}, "fieldRef": {"fieldPath": "spec.nodeName"}}, {"v"}),
        ({"secretKeyRef": {"name": "s"}}, {"v.secretKeyRef.key"}),
        (
            {"secretKeyRef": {"name": "My_Secret", "key": "../x"}},
            {"v.secretKeyRef.name", "v.secretKeyRef.key"},
        ),
        ({"secretKeyRef": {"name": "s", "key": "k", "optinal": True}}, {"v.secretKeyRef.optinal"}),
        ({"fieldRef": {"fieldPath": "status.phase"}}, {"v.fieldRef.fieldPath"}),
        ({"fieldRef": {"fieldPath": "spec.nodeName['x']"}}, {"v.fieldRef.fieldPath"}),
        ({"fieldRef": {"fieldPath": "spec.nodeName", "apiVersion": "v2"}}, {"v.fieldRef.apiVersion"}),
        ({"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1Ki"}}, {"v.resourceFieldRef.divisor"}),
        ({"resourceFieldRef": {"resource": "limits.gpu"}}, {"v.resourceFieldRef.resource"}),
        ({"fileKeyRef": {"key": "K", "volumeName": "v", "path": "p"}}, {"v", "v.fileKeyRef"}),
    ],
)
def test_value_from(value_from: dict[str, Any], blamed: set[str]) -> None:
    assert {e.path for e in k8s.value_from(value_from, "v")} == blamed


def test_value_and_value_from_are_exclusive() -> None:
    errors = k8s.env(
        [{"name": "T", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}], "env"
    )
    assert [e.path for e in errors] == ["env[0].valueFrom"]
    assert (
        k8s.env([{"name": "T", "value": "", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}], "e")
        == []
    )


def test_config_map_data_is_at_most_one_mebibyte() -> None:
    assert k8s.config_map_data({"a": "x" * k8s.CONFIG_MAP_DATA_MAX_BYTES}, "c") == []
    assert [
        e.path for e in k8s.config_map_data({"a": "x" * k8s.CONFIG_MAP_DATA_MAX_BYTES, "b": "y"}, "c")
    ] == ["c"]
    # Bytes, not characters: 'é' is two bytes in UTF-8.
    assert k8s.config_map_data({"a": "é" * (k8s.CONFIG_MAP_DATA_MAX_BYTES // 2 + 1)}, "c")


@pytest.mark.parametrize(
    ("selector", "blamed"),
    [
        ({"matchLabels": {"a": "b"}, "matchExpressions": [{"key": "a", "operator": "Exists"}]}, set()),
        ({"matchLabels": {"a b": "c"}}, {"s.matchLabels[a b]"}),
        ({"matchLabels": {"a": "b c"}}, {"s.matchLabels[a]"}),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]},
            {"s.matchExpressions[0].values"},
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["b"]}]},
            {"s.matchExpressions[0].values"},
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
            {"s.matchExpressions[0].operator"},
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["-x"]}]},
            {"s.matchExpressions[0].values[0]"},
        ),
    ],
)
def test_label_selector(selector: dict[str, Any], blamed: set[str]) -> None:
    assert {e.path for e in k8s.label_selector(selector, "s")} == blamed


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0", 0),
        ("90s", 90 * 10**9),
        ("1h30m", 5400 * 10**9),
        ("1.5h", 5400 * 10**9),
        ("10µs", 10_000),
        ("2562047h", 2562047 * 3600 * 10**9),
        ("2562048h", None),
        ("99999999999999999999h", None),
        ("10", None),
        ("1d", None),
        ("-5s", None),
        ("1h 30m", None),
    ],
)
def test_go_duration(text: str, ns: int | None) -> None:
    assert k8s.go_duration_ns(text) == ns


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("containerd", True),
        ("getty@tty1.service", True),
        ("a:b\\x2d.mount", True),
        ("a b", False),
        ("x;reboot", False),
    ],
)
def test_systemd_unit(value: str, ok: bool) -> None:
    assert (not k8s.systemd_unit(value)) is ok


@pytest.mark.parametrize(
    "ref",
    [
        "ubuntu",
        "library/ubuntu:22.04",
        "a.b",
        "registry:5000/x",
        "localhost:5000/team/x:1.2.3",
        "[::1]:5000/x",
        "ghcr.io/a/b:1@sha256:" + "a" * 64,
        "ghcr.io/a/b@sha512:" + "f" * 128,
        "A.b.C/x",
        "a--b/c__d",
        "ghcr.io/" + "a" * 247,
    ],
)
def test_image_references_kubernetes_pulls(ref: str) -> None:
    parsed = parse_image(ref)
    assert str(parsed) == ref
    assert re.search(IMAGE_REFERENCE_PATTERN, ref)


@pytest.mark.parametrize(
    "ref",
    [
        "BAD IMAGE",
        " ubuntu",
        "ubuntu\n",
        "ghcr.io/" + "a" * 248,
        "ghcr.io/Org/Drv",
        "Foo/bar",
        "my_registry.io/x",
        "reg:99999999/x",
        "x@sha256:1234",
        "x@md5:" + "a" * 32,
        "x@sha256:" + "A" * 64,
        "x:-tag",
        "x:" + "t" * 129,
        "a" * 64,
        "ghcr.io/drïver",
        "a___b",
    ],
)
def test_image_references_runtimes_refuse(ref: str) -> None:
    with pytest.raises(ImageReferenceError):
        parse_image(ref)


@given(st.text(alphabet="abAB09.:/@_-[]", max_size=40) | st.sampled_from(["a" * 64, "ghcr.io/" + "a" * 260]))
@example("[0]/0")  # brackets without a colon are no IPv6 literal: an invalid path (found by Hypothesis)
@example("[::1]:5000/x")
def test_image_parser_and_schema_pattern_agree(ref: str) -> None:
    """The schema's pattern plus its CEL name-length rule accept exactly what the parser accepts."""
    try:
        parsed = parse_image(ref)
    except ImageReferenceError:
        parsed = None
    name = re.match(IMAGE_NAME_FIND, ref)
    schema_ok = (
        re.search(IMAGE_REFERENCE_PATTERN, ref) is not None
        and (name is None or len(name.group(0)) <= 255)
        and re.fullmatch(r"[a-f0-9]{64}", ref) is None
    )
    assert (parsed is not None) == schema_ok, ref
    if parsed is not None and name is not None:
        assert name.group(0) == parsed.repository
