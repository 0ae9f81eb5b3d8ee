"""What `kubectl nodewright undo` does to each package, and when it must not write at all.

An undo writes an earlier spec back through the API, so everything that applies to a change applies to
the way back: admission (the webhook's rules), a new spec fingerprint and therefore batches, budgets and
gates (`docs/rollout.md`), and the stage machine's rules for what a package change means on a node
(`docs/stages.md`, "What starts a run"). Per package, from the current spec to the revision's
(`way_back`):

- upgrade (the revision has a higher version): an `upgrade` run, like any upgrade;
- downgrade without `uninstall.enabled`: the lower version's `apply` runs again on every node that
  has the higher one complete; the higher entry stays in the node state (its files may stay on the
  host: nothing uninstalls them). A node where the higher version failed keeps the lower one as it was
  recorded complete, with the failed entry beside it (`package rerun` applies it again there);
- downgrade or removal of a package with `uninstall.enabled` (and `uninstall.apply` not set): the
  webhook refuses it while the package is installed on any node. Undo says so before writing and
  offers the two steps (`uninstall_first_spec`): first the current spec with `uninstall.apply: true` on
  those packages (their uninstall rolls out through batches), then the undo once it completed;
- removal without `uninstall.enabled`: nothing runs; the package stays on the nodes (its entry too),
  as for any package taken out of a spec;
- added (the revision has a package the current spec lacks): installed through batches;
- changed (same version, other settings: config, env, interrupts...): a config run or a replaced pod,
  as for any such edit.

GitOps: a NodeWright that Argo CD or Flux manages is reverted by their next sync, so `gitops_manager`
finds the tool from its labels and annotations (Argo CD: label `argocd.argoproj.io/instance` or
annotation `argocd.argoproj.io/tracking-id`; Flux: label `kustomize.toolkit.fluxcd.io/name` or
`helm.toolkit.fluxcd.io/name`) and undo refuses unless forced, saying to revert in git.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from nodewright.api import semver

JSON = Mapping[str, Any]


class Move(StrEnum):
    UNCHANGED = "unchanged"
    UPGRADE = "upgrade"
    DOWNGRADE = "downgrade"
    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"


@dataclass(frozen=True, slots=True)
class PackageChange:
    """One package on the way back. `uninstall_first`: the webhook refuses the move until the package
    is uninstalled; `left_on_nodes`: what the current version put on the hosts stays there."""

    name: str
    move: Move
    current: str | None
    target: str | None
    uninstall_first: bool = False
    left_on_nodes: bool = False

    def describe(self) -> str:
        name = self.name
        if self.move is Move.UPGRADE:
            return f"{name}: {self.current} -> {self.target}: upgrade"
        if self.move is Move.ADDED:
            return f"{name}: installed at {self.target}"
        if self.move is Move.CHANGED:
            return f"{name}: {self.current}: settings change (config, env, interrupts...)"
        if self.move is Move.DOWNGRADE and self.uninstall_first:
            return f"{name}: {self.current} -> {self.target}: needs {self.current} uninstalled first"
        if self.move is Move.DOWNGRADE and not self.left_on_nodes:
            return f"{name}: {self.current} -> {self.target}: downgrade (after {self.current}'s uninstall)"
        if self.move is Move.DOWNGRADE:
            return (
                f"{name}: {self.current} -> {self.target}: downgrade: {self.target} is applied again where"
                f" {self.current} is complete; {self.current} has no uninstall, so its files and its"
                " node-state entry stay"
            )
        if self.uninstall_first:
            return f"{name}: {self.current} removed: needs uninstalling first"
        if self.move is Move.REMOVED and self.left_on_nodes:
            return f"{name}: {self.current} removed from the spec: no uninstall, it stays on the nodes"
        if self.move is Move.REMOVED:
            return f"{name}: {self.current} removed from the spec (its uninstall was asked for)"
        return f"{name}: {self.current}: unchanged"


@dataclass(frozen=True, slots=True)
class WayBack:
    changes: tuple[PackageChange, ...]

    @property
    def blocking(self) -> tuple[PackageChange, ...]:
        """Packages the webhook refuses to downgrade or remove while they are installed."""
        return tuple(c for c in self.changes if c.uninstall_first)

    @property
    def moved(self) -> tuple[PackageChange, ...]:
        return tuple(c for c in self.changes if c.move is not Move.UNCHANGED)


def _packages(spec: JSON) -> dict[str, JSON]:
    packages = spec.get("packages")
    if not isinstance(packages, Mapping):
        return {}
    return {str(k): v for k, v in packages.items() if isinstance(v, Mapping)}


def _uninstall(pkg: JSON) -> tuple[bool, bool]:
    """(`uninstall.enabled`, `uninstall.apply`) of a package."""
    uninstall = pkg.get("uninstall")
    if not isinstance(uninstall, Mapping):
        return False, False
    return uninstall.get("enabled") is True, uninstall.get("apply") is True


def _compare(a: str, b: str) -> int:
    try:
        return semver.compare(a, b)
    except semver.InvalidVersion:
        return (a > b) - (a < b)


def _change(name: str, now: JSON | None, then: JSON | None) -> PackageChange:
    current = str(now.get("version")) if now is not None else None
    target = str(then.get("version")) if then is not None else None
    if now is None:
        return PackageChange(name, Move.ADDED, None, target)
    # With uninstall.enabled the webhook refuses a downgrade or removal while the package is installed
    # anywhere, unless its uninstall is asked for (then it judges whether it completed).
    enabled, applied = _uninstall(now)
    if then is None or current is None or target is None:
        return PackageChange(name, Move.REMOVED, current, None, enabled and not applied, not enabled)
    order = _compare(target, current)
    if order > 0:
        return PackageChange(name, Move.UPGRADE, current, target)
    if order < 0:
        return PackageChange(name, Move.DOWNGRADE, current, target, enabled and not applied, not enabled)
    move = Move.UNCHANGED if dict(now) == dict(then) else Move.CHANGED
    return PackageChange(name, move, current, target)


def way_back(current_spec: JSON, target_spec: JSON) -> WayBack:
    """Per package (sorted by name), what writing `target_spec` over `current_spec` does."""
    now, then = _packages(current_spec), _packages(target_spec)
    return WayBack(tuple(_change(name, now.get(name), then.get(name)) for name in sorted({*now, *then})))


def uninstall_first_spec(current_spec: JSON, way: WayBack) -> dict[str, Any]:
    """The first of two steps: the current spec with `uninstall.apply: true` on the packages the way
    back would downgrade or remove while the webhook refuses it (`WayBack.blocking`)."""
    spec = dict(current_spec)
    packages = dict(_packages(current_spec))
    for change in way.blocking:
        pkg = dict(packages[change.name])
        pkg["uninstall"] = {**dict(pkg.get("uninstall") or {}), "enabled": True, "apply": True}
        packages[change.name] = pkg
    spec["packages"] = packages
    return spec


# ----------------------------------------------------------------------------------------------------
# GitOps


class GitOpsTool(StrEnum):
    ARGO_CD = "Argo CD"
    FLUX = "Flux"


_MARKERS: tuple[tuple[GitOpsTool, str, str], ...] = (
    (GitOpsTool.ARGO_CD, "labels", "argocd.argoproj.io/instance"),
    (GitOpsTool.ARGO_CD, "annotations", "argocd.argoproj.io/tracking-id"),
    (GitOpsTool.FLUX, "labels", "kustomize.toolkit.fluxcd.io/name"),
    (GitOpsTool.FLUX, "labels", "helm.toolkit.fluxcd.io/name"),
)


@dataclass(frozen=True, slots=True)
class GitOps:
    """The tool that manages the object, and the label or annotation that says so."""

    tool: GitOpsTool
    key: str
    value: str

    def refusal(self, nodewright: str) -> str:
        return (
            f"NodeWright {nodewright!r} is managed by {self.tool} ({self.key}={self.value}): an undo here"
            f" would be reverted by its next sync -- revert the change in git instead (or pass --force to"
            " undo here anyway)"
        )


def gitops_manager(metadata: JSON) -> GitOps | None:
    """The GitOps tool managing an object, from its metadata (None: none found)."""
    for tool, where, key in _MARKERS:
        values = metadata.get(where)
        if isinstance(values, Mapping) and key in values:
            return GitOps(tool, key, str(values[key]))
    return None
