"""What the agent remembers on the node between runs: step flags, check results, history, interrupts.

Everything lives under `<root_mount><ROOT_DIR>` (default `/etc/skyhook`), in the reference agent's
layout, so a node moved from the reference agent to ours keeps its state:

- `flags/START`: touched by every stage run.
- `flags/<pkg>/<ver>/<step path>_<marker>`: a non-check step succeeded. The marker is the base64 of
  the step's arguments and return codes as written in config.json (`['a', 'b']_[0]`), so a step run
  with other arguments is a different step. The operator's copy directory changes with every
  NodeWright generation; the flag deliberately does not depend on it.
- `flags/check_results` and `flags/<mode>_ALL_CHECKED`: the last check run's results (one line per
  check: `<path> <failed>`, `True` meaning failed) and the all-passed marker, shared by all packages
  as in the reference; we also write `flags/<pkg>/<ver>/<mode>_check_results` and
  `flags/<pkg>/<ver>/<mode>_ALL_CHECKED`, which belong to one package and whose marker is removed when
  that mode's checks fail.
- `history/<pkg>.json`: `{"current-version": "1.2.0", "history": [{"version": ..., "time": ...}]}`,
  newest first, written after a successful apply-check, upgrade-check (the new version) or
  uninstall-check (`"uninstalled"`). An unreadable file (not JSON, not a regular file, over 16 MiB or
  nested too deeply) is moved to `<file>.backup`.
- `interrupts/flags/<resource id>/<interrupt>_<n>.complete`: interrupt command n already ran under this
  resource id (`no_op.complete` for a no-op). The operator gives each interrupt attempt its own id.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from nodewright.agent import hostfs, safefile
from nodewright.agent.config import PackageConfig, Step

UNKNOWN_VERSION: Final = "unknown"
UNINSTALLED: Final = "uninstalled"
_NAME_MAX: Final = 255
#: A history entry is ~70 bytes; a file larger than this is not one the agent wrote.
MAX_HISTORY_BYTES: Final = 16 * 1024 * 1024


@dataclass(frozen=True)
class CheckResult:
    step: Step
    passed: bool


class HostState:
    """The agent's files under `<root><root_dir>`; `clock` gives the (UTC) time written into them."""

    def __init__(
        self, root: str, root_dir: str, *, clock: Callable[[], datetime], warn: Callable[[str], None]
    ) -> None:
        self.base = hostfs.in_root(root, root_dir)
        self.flags_dir = os.path.join(self.base, "flags")
        self.history_dir = os.path.join(self.base, "history")
        self._clock = clock
        self._warn = warn

    # Step flags ---------------------------------------------------------------------------------

    def mark_start(self) -> None:
        _touch(os.path.join(self.flags_dir, "START"))

    def package_flags_dir(self, config: PackageConfig) -> str:
        return os.path.join(self.flags_dir, config.package_name, config.package_version)

    def step_flag(self, config: PackageConfig, step: Step) -> str:
        marker = flag_marker(step)
        name = f"{step.path}_{marker}"
        if any(len(part.encode()) > _NAME_MAX for part in name.split("/")):
            # The reference agent fails on such a name; a digest of the same text keeps it unique.
            name = f"{step.path}_sha256-{hashlib.sha256(marker.encode()).hexdigest()}"
        return os.path.join(self.package_flags_dir(config), name)

    def write_step_flag(self, path: str, step: Step) -> None:
        hostfs.write_atomic(
            path, f"last_run: {self._clock().isoformat()}\nstep_always_runs: {step.idempotence}"
        )

    def remove_step_flags(self, config: PackageConfig) -> None:
        for steps in config.modes.values():
            for step in steps:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.step_flag(config, step))

    # Checks -------------------------------------------------------------------------------------

    def record_checks(self, config: PackageConfig, mode: str, results: Sequence[CheckResult]) -> bool:
        """Write the results of `mode`'s checks; True when all passed."""
        text = "\n".join(f"{r.step.path} {not r.passed}" for r in results)
        all_passed = all(r.passed for r in results)
        package_dir = self.package_flags_dir(config)
        hostfs.write_atomic(os.path.join(self.flags_dir, "check_results"), text)
        hostfs.write_atomic(os.path.join(package_dir, f"{mode}_check_results"), text)
        package_marker = os.path.join(package_dir, f"{mode}_ALL_CHECKED")
        if all_passed:
            _touch(os.path.join(self.flags_dir, f"{mode}_ALL_CHECKED"))
            _touch(package_marker)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(package_marker)
        return all_passed

    # History ------------------------------------------------------------------------------------

    def history_file(self, package: str) -> str:
        return os.path.join(self.history_dir, f"{package}.json")

    def installed_version(self, package: str) -> str:
        """The version the history file names; `unknown` before the first install."""
        current = self._read_history(package).get("current-version")
        return current if isinstance(current, str) and current else UNKNOWN_VERSION

    def record_version(self, package: str, version: str) -> None:
        history = self._read_history(package)
        entries = history.get("history")
        entries = list(entries) if isinstance(entries, list) else []
        entries.insert(0, {"version": version, "time": self._clock().isoformat()})
        body = {"current-version": version, "history": entries}
        hostfs.write_atomic(self.history_file(package), json.dumps(body, indent=2) + "\n")

    def _read_history(self, package: str) -> dict[str, object]:
        path = self.history_file(package)
        try:
            data = safefile.loads_json(safefile.read_text(path, limit=MAX_HISTORY_BYTES))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, safefile.Refused):
            data = None
        if isinstance(data, dict) and isinstance(data.get("history", []), list):
            return data
        os.replace(path, f"{path}.backup")
        self._warn(f"history file {path} was unreadable; moved it to {path}.backup and started a new one")
        return {}

    # Interrupts ---------------------------------------------------------------------------------

    def interrupt_flag(self, resource_id: str, interrupt_id: str) -> str:
        return os.path.join(self.base, "interrupts", "flags", resource_id, f"{interrupt_id}.complete")

    def write_interrupt_flag(self, path: str) -> None:
        hostfs.write_atomic(path, str(self._clock().timestamp()))


def flag_marker(step: Step) -> str:
    """The reference agent's flag marker: base64 of `<arguments list>_<returncodes list>` (Python repr)."""
    text = f"{list(step.arguments)!r}_{list(step.returncodes)!r}"
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _touch(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a", encoding="utf-8"):
        pass
