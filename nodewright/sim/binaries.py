"""Where the control-plane binaries live.

`hack/controlplane/build.sh` builds kube-apiserver, kube-controller-manager, kubectl, etcd and kwok from
Go modules into a cache directory keyed by the versions in `hack/controlplane/versions.env`:
`${NODEWRIGHT_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-~/.cache}/nodewright/controlplane}/<CONTROLPLANE_VERSION>`.
This module finds that directory the same way (by reading `versions.env`, a small shell file of
`KEY=value` lines with `${VAR}` references), so Python and the build never disagree on the path.
A build that has not finished (no `.complete` marker, or a binary missing) is reported with the command
that fixes it instead of failing later with a confusing `FileNotFoundError` from `subprocess`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "kwok")
REAL_NODE_BINARIES = ("kubelet", "kube-scheduler")
_REPO_ROOT = Path(__file__).resolve().parents[2]
_VERSIONS_ENV = _REPO_ROOT / "hack" / "controlplane" / "versions.env"
_REALNODE_VERSIONS_ENV = _REPO_ROOT / "hack" / "realnode" / "versions.env"
_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


class BinariesMissingError(RuntimeError):
    """The control-plane build is absent or incomplete."""


@dataclass(frozen=True)
class ControlPlaneBinaries:
    """Paths of the built control-plane components."""

    dir: Path

    def path(self, name: str) -> Path:
        return self.dir / name


def parse_versions_env(text: str, *, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Evaluate the `KEY=value` lines of versions.env, expanding `$VAR`/`${VAR}` like the shell would.

    Only what the file uses is supported: plain or quoted values and variable references (earlier keys
    first, then the environment). Comments and blank lines are skipped.
    """
    env = dict(os.environ if environ is None else environ)
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _ASSIGNMENT.match(line)
        if match is None:
            continue
        key, value = match.group(1), match.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            quote, value = value[0], value[1:-1]
            if quote == "'":
                values[key] = value
                continue

        def expand(ref: re.Match[str]) -> str:
            name = ref.group(1) or ref.group(2)
            return values.get(name, env.get(name, ""))

        values[key] = _REFERENCE.sub(expand, value)
    return values


def cache_root(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("NODEWRIGHT_CONTROLPLANE_CACHE"):
        return Path(env["NODEWRIGHT_CONTROLPLANE_CACHE"]).expanduser()
    xdg = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "nodewright" / "controlplane"


def controlplane_version(versions_env: Path = _VERSIONS_ENV) -> str:
    values = parse_versions_env(versions_env.read_text(encoding="utf-8"), environ={})
    version = values.get("CONTROLPLANE_VERSION")
    if not version:
        raise BinariesMissingError(f"{versions_env} does not define CONTROLPLANE_VERSION")
    return version


def locate(*, versions_env: Path = _VERSIONS_ENV, require_complete: bool = True) -> ControlPlaneBinaries:
    """Return the binary directory, or raise with a message that says to run `make controlplane`."""
    directory = cache_root() / controlplane_version(versions_env)
    missing = [name for name in REQUIRED_BINARIES if not os.access(directory / name, os.X_OK)]
    if not (directory / "kwok-stages").is_dir():
        missing.append("kwok-stages/")
    if require_complete and not (directory / ".complete").exists():
        missing.append(".complete (build not finished)")
    if missing:
        raise BinariesMissingError(
            f"control-plane binaries not found in {directory} (missing: {', '.join(missing)}); "
            "run `make controlplane` (or `bash hack/controlplane/build.sh`) first"
        )
    return ControlPlaneBinaries(dir=directory)


def realnode_cache_root(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("NODEWRIGHT_REALNODE_CACHE"):
        return Path(env["NODEWRIGHT_REALNODE_CACHE"]).expanduser()
    xdg = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "nodewright" / "realnode"


def locate_realnode(*, binaries: ControlPlaneBinaries | None = None) -> Path:
    """The real nodes' base root directory of `hack/realnode/build.sh` (its `root/` and `pause`), with
    the kubelet and kube-scheduler of the control plane; raises with the command that builds them."""
    binaries = binaries or locate()
    missing = [name for name in REAL_NODE_BINARIES if not os.access(binaries.dir / name, os.X_OK)]
    if missing:
        raise BinariesMissingError(
            f"{' and '.join(missing)} not found in {binaries.dir}: run `make controlplane` "
            "(it builds them with the control plane) first"
        )
    values = parse_versions_env(_REALNODE_VERSIONS_ENV.read_text(encoding="utf-8"), environ={})
    directory = realnode_cache_root() / values["REALNODE_VERSION"] / controlplane_version()
    if not (directory / ".complete").exists():
        raise BinariesMissingError(
            f"the real nodes' base root is not built ({directory} missing); run `make realnode` "
            "(or `bash hack/realnode/build.sh`) first"
        )
    return directory
