"""The list of subcommand modules of the `nodewright` command."""

from __future__ import annotations

from types import ModuleType

MODULES: tuple[ModuleType, ...] = ()
