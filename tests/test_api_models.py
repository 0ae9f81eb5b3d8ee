from __future__ import annotations

from decimal import Decimal

import pytest
from pydantic import ValidationError

from nodewright.api.images import ImageReferenceError, effective_image, parse_image
from nodewright.api.models import DeploymentPolicy, NodeWright, Strategy, policy_status
from nodewright.api.quantity import QuantityError, parse_quantity


@pytest.mark.parametrize(
    ("ref", "registry", "path", "tag", "digest"),
    [
        ("registry:5000/x", "registry:5000", "x", None, None),
        ("registry:5000/team/x:1.2.3", "registry:5000", "team/x", "1.2.3", None),
        ("ubuntu", None, "ubuntu", None, None),
        ("ubuntu:22.04", None, "ubuntu", "22.04", None),
        ("localhost/pkg", "localhost", "pkg", None, None),
        ("ghcr.io/a/b:1@sha256:" + "a" * 64, "ghcr.io", "a/b", "1", "sha256:" + "a" * 64),
    ],
)
def test_parse_image(ref: str, registry: str | None, path: str, tag: str | None, digest: str | None) -> None:
    parsed = parse_image(ref)
    assert (parsed.registry, parsed.path, parsed.tag, parsed.digest) == (registry, path, tag, digest)
    assert str(parsed) == ref


@pytest.mark.parametrize("ref", ["", "Upper/x", "x:bad tag", "x@md5:12", "reg:99999999/x"])
def test_parse_image_rejects(ref: str) -> None:
    with pytest.raises(ImageReferenceError):
        parse_image(ref)


def test_effective_image() -> None:
    assert effective_image("registry:5000/x", "1.0") == "registry:5000/x:1.0"
    assert effective_image("registry:5000/x:1.0", "1.0") == "registry:5000/x:1.0"
    digest = "sha256:" + "b" * 64
    assert effective_image("registry:5000/x", "1.0", digest) == f"registry:5000/x@{digest}"


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", Decimal("0.5")), ("1Gi", Decimal(2**30)), ("2e3", Decimal(2000)), ("1.5k", Decimal(1500))],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


def test_parse_quantity_rejects() -> None:
    with pytest.raises(QuantityError):
        parse_quantity("lots")


def _nw(**spec: object) -> dict[str, object]:
    return {"metadata": {"name": "n"}, "spec": spec}


def test_defaults_and_int_quantities() -> None:
    nw = NodeWright.model_validate(
        _nw(
            packages={
                "pk": {
                    "version": "1.0",
                    "image": "x",
                    "resources": {
                        "cpuRequest": 1,
                        "cpuLimit": 2,
                        "memoryRequest": "1Mi",
                        "memoryLimit": "1Mi",
                    },
                }
            }
        )
    )
    pkg = nw.spec.packages["pk"]
    assert (pkg.max_attempts, pkg.stage_timeout, nw.spec.priority) == (3, "30m", 200)
    assert pkg.resources is not None and pkg.resources.cpu_limit == "2"
    assert nw.spec.effective_drain().timeout == "10m"


def test_strict_scalars() -> None:
    with pytest.raises(ValidationError):
        NodeWright.model_validate(_nw(priority="5"))
    with pytest.raises(ValidationError):
        NodeWright.model_validate(_nw(serial="true"))


def test_nodewright_name_limit() -> None:
    NodeWright.model_validate({"metadata": {"name": "n" * 56}, "spec": {}})
    with pytest.raises(ValidationError, match=r"metadata\.name"):
        NodeWright.model_validate({"metadata": {"name": "n" * 57}, "spec": {}})


def test_strategy_kind_and_policy_status() -> None:
    assert Strategy.model_validate({"linear": {}}).kind() == "linear"
    dp = DeploymentPolicy.model_validate(
        {
            "metadata": {"name": "p", "generation": 4},
            "spec": {
                "default": {"budget": {"count": 1}, "strategy": {"exponential": {}}},
                "compartments": [{"name": "c", "selector": {}, "budget": {"percent": 5}}],
            },
        }
    )
    assert dp.spec.default.strategy.exponential is not None
    assert dp.spec.default.strategy.exponential.growth_factor == 2
    status = policy_status(dp)
    assert (status.observed_generation, status.default_strategy, status.compartment_count) == (
        4,
        "exponential",
        1,
    )
