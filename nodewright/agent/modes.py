"""The agent's modes: the stages the operator runs in a package pod and the check that follows each.

A package pod runs the agent twice per stage: `<stage>` does the work and `<stage>-check` verifies it
(the operator reads the two init containers' exit codes). `interrupt` has no check: the operator
confirms a reboot by the node's new bootID and runs `post-interrupt`/`post-interrupt-check` afterwards.
Mode names are the reference agent's, spelled exactly as the operator passes them.
"""

from __future__ import annotations

from typing import Final

APPLY: Final = "apply"
APPLY_CHECK: Final = "apply-check"
CONFIG: Final = "config"
CONFIG_CHECK: Final = "config-check"
UPGRADE: Final = "upgrade"
UPGRADE_CHECK: Final = "upgrade-check"
UNINSTALL: Final = "uninstall"
UNINSTALL_CHECK: Final = "uninstall-check"
POST_INTERRUPT: Final = "post-interrupt"
POST_INTERRUPT_CHECK: Final = "post-interrupt-check"
INTERRUPT: Final = "interrupt"

#: Each mode that changes the node, with the check mode that verifies it.
CHECK_OF: Final[dict[str, str]] = {
    APPLY: APPLY_CHECK,
    CONFIG: CONFIG_CHECK,
    UPGRADE: UPGRADE_CHECK,
    UNINSTALL: UNINSTALL_CHECK,
    POST_INTERRUPT: POST_INTERRUPT_CHECK,
}
WORK_MODES: Final = tuple(CHECK_OF)
CHECK_MODES: Final = tuple(CHECK_OF.values())
ALL_MODES: Final = (*WORK_MODES, *CHECK_MODES, INTERRUPT)

#: Modes whose steps run even when their flag exists: their purpose is to run again on every change.
ALWAYS_RUN_MODES: Final = frozenset({CONFIG, UPGRADE, UNINSTALL})
#: Modes that get CURRENT_VERSION and PREVIOUS_VERSION (and whose upgrade steps get them as arguments).
UPGRADE_MODES: Final = frozenset({UPGRADE, UPGRADE_CHECK})
#: Modes that must not touch the host beyond their steps: no root_dir overlay, no config-file check.
UNINSTALL_MODES: Final = frozenset({UNINSTALL, UNINSTALL_CHECK})
#: Check modes whose success records the installed version in the package's history file.
HISTORY_MODES: Final = frozenset({APPLY_CHECK, UPGRADE_CHECK, UNINSTALL_CHECK})


def is_check(mode: str) -> bool:
    return mode in CHECK_MODES
