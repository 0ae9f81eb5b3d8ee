"""Merging the interrupts of packages that reach their interrupt on a node at the same time.

Anchor §2.6: one interrupt pod per node runs the strongest interrupt among the packages ready for one:
`reboot` > `restartAllServices` > `service` > `noop`. Service interrupts merge their unit lists (union,
sorted, unique). The "carrier" is the first package by name holding the winning interrupt type; it
runs the interrupt pod. The other packages are marked `skipped` and are completed when the carrier's
interrupt completes (a reboot covers a service restart, etc.).

The agent inside the package image expects the interrupt as base64 JSON in its own vocabulary
(`node_restart`, `restart_all_services`, `service_restart`, `no_op`); `agent_payload` builds it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nodewright.api.models import Interrupt, InterruptType

# Lower is stronger.
PRIORITY: dict[InterruptType, int] = {
    InterruptType.REBOOT: 0,
    InterruptType.RESTART_ALL_SERVICES: 1,
    InterruptType.SERVICE: 2,
    InterruptType.NOOP: 3,
}
AGENT_TYPE: dict[InterruptType, str] = {
    InterruptType.REBOOT: "node_restart",
    InterruptType.RESTART_ALL_SERVICES: "restart_all_services",
    InterruptType.SERVICE: "service_restart",
    InterruptType.NOOP: "no_op",
}


def merge_interrupts(interrupts: Iterable[Interrupt]) -> Interrupt | None:
    """The strongest interrupt; service lists of service interrupts are unioned. None for no input."""
    items = list(interrupts)
    if not items:
        return None
    best = min(PRIORITY[i.type] for i in items)
    winner_type = next(t for t, p in PRIORITY.items() if p == best)
    if winner_type == InterruptType.SERVICE:
        services = sorted({s for i in items if i.type == InterruptType.SERVICE for s in i.services or []})
        return Interrupt(type=InterruptType.SERVICE, services=services)
    return Interrupt(type=winner_type)


@dataclass(frozen=True, slots=True)
class MergedInterrupt:
    interrupt: Interrupt
    carrier: str
    skipped: tuple[str, ...]  # every other package covered by the carrier's pod, sorted


def merge_for_node(candidates: Mapping[str, Interrupt]) -> MergedInterrupt | None:
    """Merge the interrupts of the packages (name -> interrupt) ready for an interrupt on one node."""
    merged = merge_interrupts(candidates[n] for n in sorted(candidates))
    if merged is None:
        return None
    carrier = next(n for n in sorted(candidates) if candidates[n].type == merged.type)
    return MergedInterrupt(
        interrupt=merged, carrier=carrier, skipped=tuple(n for n in sorted(candidates) if n != carrier)
    )


def interrupt_json(interrupt: Interrupt) -> str:
    """`{"type": ..., "services": [...]}` in CRD vocabulary (the pod annotation)."""
    return json.dumps(
        {"type": interrupt.type.value, "services": sorted(interrupt.services or [])},
        sort_keys=True,
        separators=(",", ":"),
    )


def agent_payload(interrupt: Interrupt) -> str:
    """Base64 JSON of the interrupt in the agent's format (last argument of the `interrupt` mode)."""
    body: dict[str, object] = {"type": AGENT_TYPE[interrupt.type]}
    if interrupt.type == InterruptType.SERVICE:
        body["services"] = sorted(interrupt.services or [])
    return base64.b64encode(json.dumps(body, sort_keys=True).encode()).decode()
