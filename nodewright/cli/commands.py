"""The list of subcommand modules of the `nodewright` command."""

from __future__ import annotations

from types import ModuleType

from nodewright.cli import webhook_cmd

MODULES: tuple[ModuleType, ...] = (webhook_cmd,)
