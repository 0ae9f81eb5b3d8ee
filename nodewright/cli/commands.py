"""The list of subcommand modules of the `nodewright` command."""

from __future__ import annotations

from types import ModuleType

from nodewright.cli import demo_cmd, operator_cmd, package_cmd, plan_cmd, sim_cmd, uninstall_cmd, webhook_cmd

MODULES: tuple[ModuleType, ...] = (
    operator_cmd,
    plan_cmd,
    demo_cmd,
    sim_cmd,
    webhook_cmd,
    package_cmd,
    uninstall_cmd,
)
