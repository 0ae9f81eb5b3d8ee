"""Admission warnings for host settings two packages would fight over (`nodewright.api.hostsettings`).

On CREATE, and on an UPDATE that changes the spec, of a NodeWright the validating webhook accepts:

- two of its packages set one sysctl or kernel parameter to different values: a warning per pair;
- a package of another NodeWright sets one of its keys to another value, and some node is selected by
  both: a warning per pair, naming both NodeWrights and packages. Whether a node is selected by both is
  asked of the API server with the two selectors' intersection as a label selector and `limit=1` -- one
  small answer per NodeWright that disagrees, never a list of the fleet -- and only for NodeWrights
  whose packages disagree. Selectors that cannot meet (one label, two values) are not asked about.

Warnings, never denials: the packages may be meant to run one after the other (a tuning change handed
from one NodeWright to another), and only the person applying the spec knows. kubectl prints each
warning. A lookup that fails or takes too long (the whole check is bounded well inside the webhook's
timeout) is itself a warning saying what could not be checked; it never blocks the write.

Facts come from `PeerFacts`, implemented by the webhook's `KubeFacts`; facts without it (tests) get the
within-NodeWright check only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final, Protocol, runtime_checkable

from nodewright.api import hostsettings

CHECK_DEADLINE_S: Final = 4.0
MAX_WARNINGS: Final = 20


@runtime_checkable
class PeerFacts(Protocol):
    """Cluster lookups for the cross-NodeWright check (each raises `LookupError_` on failure)."""

    async def nodewrights(self) -> list[dict[str, Any]]: ...

    async def selects_any_node(self, label_selector: str) -> bool: ...


def _spec_changed(obj: Any, old: Mapping[str, Any] | None) -> bool:
    return old is None or not isinstance(obj, Mapping) or obj.get("spec") != old.get("spec")


def _warning(conflict: hostsettings.Conflict) -> str:
    return (
        f"spec.packages[{conflict.first.package}].configMap[{conflict.first.source}]: {conflict.describe()}"
    )


async def host_setting_warnings(obj: Any, old: Mapping[str, Any] | None, facts: object) -> list[str]:
    """The warnings for `obj` (an accepted NodeWright; `old` on UPDATE), at most `MAX_WARNINGS`."""
    if not isinstance(obj, Mapping) or not _spec_changed(obj, old):
        return []
    warnings = [_warning(c) for c in hostsettings.conflicts_within(obj)]
    if isinstance(facts, PeerFacts) and hostsettings.writers(obj):
        try:
            async with asyncio.timeout(CHECK_DEADLINE_S):
                warnings += await _across(obj, facts)
        except TimeoutError:
            warnings.append(
                "spec.packages: other NodeWrights were not all checked for conflicting host settings within"
                f" {CHECK_DEADLINE_S:g}s; `nodewright package validate -f` checks manifests offline"
            )
        except Exception as exc:  # any lookup failure (API, transport) is a warning, never a denial
            warnings.append(
                f"spec.packages: could not check other NodeWrights for conflicting host settings ({exc})"
            )
    if len(warnings) > MAX_WARNINGS:
        warnings = [
            *warnings[:MAX_WARNINGS],
            f"... and {len(warnings) - MAX_WARNINGS} more host-setting conflicts",
        ]
    return warnings


async def _across(model: Mapping[str, Any], facts: PeerFacts) -> list[str]:
    warnings: list[str] = []
    ours = hostsettings.nodewright_name(model)
    for other in await facts.nodewrights():
        name = hostsettings.nodewright_name(other)
        if name == ours or (other.get("metadata") or {}).get("deletionTimestamp"):
            continue  # itself (an UPDATE), or one being deleted: it installs nothing any more
        found = hostsettings.conflicts_between(model, other)
        if not found:
            continue
        selector = hostsettings.selector_intersection(
            hostsettings.node_selector(model), hostsettings.node_selector(other)
        )
        if selector is None or not await facts.selects_any_node(selector):
            continue
        warnings += [_warning(c) + f" (NodeWright {name!r} selects some of the same nodes)" for c in found]
    return warnings
