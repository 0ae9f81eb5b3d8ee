"""What an undo does to each package, and when it refuses (`plan.wayback`)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodewright.plan.wayback import (
    GitOpsTool,
    Move,
    PackageChange,
    gitops_manager,
    uninstall_first_spec,
    way_back,
)


def pkg(version: str, **extra: Any) -> dict[str, Any]:
    return {"version": version, "image": "x/p", **extra}


GUARDED = {"uninstall": {"enabled": True}}


def test_each_package_move_and_what_stays_on_the_nodes() -> None:
    now = {
        "packages": {
            "up": pkg("1.0.0"),
            "down": pkg("2.0.0"),
            "guarded": pkg("2.0.0", **GUARDED),
            "added-now": pkg("1.0.0"),
            "added-guarded": pkg("1.0.0", **GUARDED),
            "same": pkg("1.0.0"),
            "config": pkg("1.0.0", configMap={"a": "2"}),
        },
        "revisionHistoryLimit": 3,
    }
    then = {
        "packages": {
            "up": pkg("1.1.0"),
            "down": pkg("1.10.0"),
            "guarded": pkg("1.0.0", **GUARDED),
            "same": pkg("1.0.0"),
            "config": pkg("1.0.0", configMap={"a": "1"}),
            "old": pkg("3.0.0"),
        }
    }
    way = way_back(now, then)
    assert {c.name: c for c in way.changes} == {
        "added-guarded": PackageChange("added-guarded", Move.REMOVED, "1.0.0", None, True, False),
        "added-now": PackageChange("added-now", Move.REMOVED, "1.0.0", None, False, True),
        "config": PackageChange("config", Move.CHANGED, "1.0.0", "1.0.0"),
        "down": PackageChange("down", Move.DOWNGRADE, "2.0.0", "1.10.0", False, True),
        "guarded": PackageChange("guarded", Move.DOWNGRADE, "2.0.0", "1.0.0", True, False),
        "old": PackageChange("old", Move.ADDED, None, "3.0.0"),
        "same": PackageChange("same", Move.UNCHANGED, "1.0.0", "1.0.0"),
        "up": PackageChange("up", Move.UPGRADE, "1.0.0", "1.1.0"),
    }
    assert [c.name for c in way.blocking] == ["added-guarded", "guarded"]
    assert (
        "its files and its node-state entry stay"
        in next(c for c in way.changes if c.name == "down").describe()
    )
    assert "stays on the nodes" in next(c for c in way.changes if c.name == "added-now").describe()


def test_the_first_step_asks_for_the_uninstall_of_the_blocking_packages_only() -> None:
    now = {"packages": {"guarded": pkg("2.0.0", **GUARDED), "down": pkg("2.0.0")}, "priority": 5}
    then = {"packages": {"guarded": pkg("1.0.0", **GUARDED), "down": pkg("1.0.0")}}
    first = uninstall_first_spec(now, way_back(now, then))
    assert first == {
        "packages": {
            "guarded": pkg("2.0.0", uninstall={"enabled": True, "apply": True}),
            "down": pkg("2.0.0"),
        },
        "priority": 5,
    }
    # Once it is asked for, the way back is no longer blocked here (the webhook judges whether the
    # uninstall completed); and nothing stays on the nodes.
    second = way_back(first, then)
    assert not second.blocking
    assert next(c for c in second.changes if c.name == "guarded").left_on_nodes is False


@given(
    now=st.dictionaries(st.sampled_from("abcd"), st.sampled_from(["1.0.0", "1.2.0", "2.0.0"])),
    then=st.dictionaries(st.sampled_from("abcd"), st.sampled_from(["1.0.0", "1.2.0", "2.0.0"])),
)
def test_every_package_of_either_spec_has_exactly_one_move(now: dict[str, str], then: dict[str, str]) -> None:
    way = way_back(
        {"packages": {k: pkg(v) for k, v in now.items()}}, {"packages": {k: pkg(v) for k, v in then.items()}}
    )
    assert [c.name for c in way.changes] == sorted({*now, *then})
    for change in way.changes:
        assert change.current == now.get(change.name) and change.target == then.get(change.name)
        assert not change.uninstall_first, "nothing is uninstall-enabled here"


def test_gitops_tools_are_found_by_their_labels_and_annotations() -> None:
    argo = gitops_manager({"labels": {"argocd.argoproj.io/instance": "gpu-stack"}})
    assert argo is not None and argo.tool is GitOpsTool.ARGO_CD
    refusal = argo.refusal("drivers")
    assert refusal.startswith(
        "NodeWright 'drivers' is managed by Argo CD (argocd.argoproj.io/instance=gpu-stack)"
    )
    assert "revert the change in git instead" in refusal and "--force" in refusal
    tracked = gitops_manager(
        {"annotations": {"argocd.argoproj.io/tracking-id": "app:nodewright.io/NodeWright:x"}}
    )
    assert tracked is not None and tracked.tool is GitOpsTool.ARGO_CD
    for key in ("kustomize.toolkit.fluxcd.io/name", "helm.toolkit.fluxcd.io/name"):
        flux = gitops_manager({"labels": {key: "infra"}})
        assert flux is not None and flux.tool is GitOpsTool.FLUX and flux.key == key
    assert (
        gitops_manager({"labels": {"app": "x"}, "annotations": {"argocd.argoproj.io/sync-wave": "1"}}) is None
    )
    assert gitops_manager({}) is None
