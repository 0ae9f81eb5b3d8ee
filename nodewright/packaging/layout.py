"""The package image contract and the names the operator gives a package on a node.

Image contract (anchor §2.12-§2.13, unchanged from the reference so public images keep working):

- the image holds the package payload at `/skyhook-package`: `config.json`, `skyhook_dir/` (step
  scripts), optionally `root_dir/` (laid over the host root) and anything the steps read;
- the package pod's first init container runs `/bin/sh -c 'mkdir -p <root>/<copy dir> && cp -rf
  /skyhook-package/* <root>/<copy dir>'` in the package image, so an image that goes to a real node needs
  `/bin/sh`, `mkdir` and `cp` (a busybox base is enough). `-f`: a later pod of the same run (a retry, the
  post-interrupt pod) copies onto the first one's files, and a ConfigMap volume's files are symlinks
  (`..data`), which busybox's `cp -r` refuses to replace;
- the package's ConfigMap, when the NodeWright gives it one, is mounted at `/skyhook-package/configmaps`,
  hiding whatever the image has there.

The payload of a package directory is everything in it except hidden entries (`.git`, `.dockerignore`,
editor files), `__pycache__` directories and `*.pyc` files: the same files the reference's
`COPY . /skyhook-package` puts into an image, and what the simulated kubelet serves for
`packages/<name>`. `nodewright package build` and `nodewright package run` both use `payload_entries`.

Names on the node, as `nodewright.plan.podspec` builds them (tests keep the two equal): the copy
directory `/var/lib/skyhook/<nodewright>/<package>-<version>-<uid>-<generation>`, the agent's state
directory `/var/lib/skyhook/<nodewright>`, logs under `/var/log/skyhook/<nodewright>` and the resource id
`<nodewright>-<uid>-<generation>_<package>_<version>`. A local run uses the NodeWright name `local`.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

PAYLOAD_DIR: Final = "/skyhook-package"
CONFIG_FILE: Final = "config.json"
STEP_DIR: Final = "skyhook_dir"
ROOT_OVERLAY_DIR: Final = "root_dir"
CONFIGMAP_DIR: Final = "configmaps"
DOCKERFILE: Final = "Dockerfile"
README: Final = "README.md"

#: Keys of `spec.packages` in a NodeWright (`nodewright.api.models.PACKAGE_NAME_PATTERN`).
PACKAGE_NAME: Final = re.compile(r"^[a-z][-a-z0-9]{0,41}[a-z]$")
COPY_DIR_ROOT: Final = "/var/lib/skyhook"
LOG_ROOT: Final = "/var/log/skyhook"
LOCAL_NODEWRIGHT: Final = "local"

EntryKind = Literal["dir", "file", "symlink"]


class PayloadError(Exception):
    """The package directory holds something an image layer or a copy cannot carry (at `path`)."""

    def __init__(self, message: str, *, path: Path) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True, slots=True)
class PayloadEntry:
    relative: str  # POSIX path inside the payload, e.g. "skyhook_dir/apply.sh"
    path: Path
    kind: EntryKind
    executable: bool = False
    link_target: str = ""


def excluded(name: str) -> bool:
    """Entries that never belong in a package image: hidden files, Python caches."""
    return name.startswith(".") or name == "__pycache__" or name.endswith(".pyc")


def payload_entries(package_dir: Path) -> list[PayloadEntry]:
    """Every payload entry below `package_dir`, parents before children, in a stable order.

    Walked with an explicit stack (a directory per level), so a hostile tree thousands of levels deep
    is listed, not a RecursionError.
    """
    entries: list[PayloadEntry] = []
    levels = [iter(_children(package_dir, ""))]
    while levels:
        entry = next(levels[-1], None)
        if entry is None:
            levels.pop()
            continue
        entries.append(entry)
        if entry.kind == "dir":
            levels.append(iter(_children(entry.path, f"{entry.relative}/")))
    return entries


def _children(directory: Path, prefix: str) -> list[PayloadEntry]:
    with os.scandir(directory) as scan:
        children = sorted(scan, key=lambda entry: entry.name)
    return [
        _entry(Path(child.path), f"{prefix}{child.name}") for child in children if not excluded(child.name)
    ]


def _entry(path: Path, relative: str) -> PayloadEntry:
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return PayloadEntry(relative, path, "symlink", link_target=os.readlink(path))
    if stat.S_ISDIR(info.st_mode):
        return PayloadEntry(relative, path, "dir")
    if stat.S_ISREG(info.st_mode):
        return PayloadEntry(relative, path, "file", executable=bool(info.st_mode & stat.S_IXUSR))
    raise PayloadError(
        f"{path}: not a regular file, directory or symlink (a device, FIFO or socket cannot be "
        "part of a package image); remove it from the package directory",
        path=path,
    )


@dataclass(frozen=True, slots=True)
class Identity:
    """Who "owns" a package run: the NodeWright name, uid and generation the operator would use."""

    nodewright: str = LOCAL_NODEWRIGHT
    uid: str = "local"
    generation: int = 1

    def copy_dir(self, package: str, version: str) -> str:
        return f"{COPY_DIR_ROOT}/{self.nodewright}/{package}-{version}-{self.uid}-{self.generation}"

    def resource_id(self, package: str, version: str, run: str = "") -> str:
        """The agent's resource id; an interrupt adds its `run` (no `_`), as the operator's interrupt pods
        do, so each interrupt run gets its own interrupt flags."""
        owner = f"{self.nodewright}-{self.uid}-{self.generation}"
        return f"{owner}-{run}_{package}_{version}" if run else f"{owner}_{package}_{version}"

    @property
    def state_dir(self) -> str:
        return f"{COPY_DIR_ROOT}/{self.nodewright}"

    @property
    def log_dir(self) -> str:
        return f"{LOG_ROOT}/{self.nodewright}"
