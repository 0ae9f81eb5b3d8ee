"""The `interrupt` mode's payload: what to do to the node after a package's steps need it.

The operator merges the interrupts of the packages on a node into one and passes it as the last
argument: base64 of JSON `{"type": ..., "services": [...]}` in the agent's vocabulary. Each type maps to
the host commands the reference agent runs (chrooted into the host root):

| type | commands |
|---|---|
| `node_restart` | `reboot` |
| `service_restart` | `systemctl daemon-reload`, then `systemctl restart <service>` for each service |
| `restart_all_services` | `service procps force-reload` |
| `no_op` | none (only its completion flag is written) |
| `script_interrupt` | none (the package's own steps do the work) |

Each command runs at most once per resource id: its flag is written before it runs and removed again if
it fails, except for a reboot ended by SIGTERM, which is the reboot working. The operator gives every
attempt of an interrupt its own id (`<nodewright>-<uid>-<generation>-<run>_<pkg>_<version>`), so the
flag stops only a second run of the same attempt (its pod started again by the kubelet after the reboot).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Final

from nodewright.agent import safefile

NODE_RESTART: Final = "node_restart"
SERVICE_RESTART: Final = "service_restart"
RESTART_ALL_SERVICES: Final = "restart_all_services"
NO_OP: Final = "no_op"
SCRIPT_INTERRUPT: Final = "script_interrupt"
TYPES: Final = (NODE_RESTART, SERVICE_RESTART, RESTART_ALL_SERVICES, NO_OP, SCRIPT_INTERRUPT)


class InterruptError(ValueError):
    """The interrupt argument cannot be decoded or names an unknown interrupt."""


@dataclass(frozen=True)
class Interrupt:
    type: str
    services: tuple[str, ...] = ()
    ignored_fields: tuple[str, ...] = ()

    def commands(self) -> list[tuple[str, ...]]:
        if self.type == NODE_RESTART:
            return [("reboot",)]
        if self.type == SERVICE_RESTART:
            return [("systemctl", "daemon-reload"), *(("systemctl", "restart", s) for s in self.services)]
        if self.type == RESTART_ALL_SERVICES:
            return [("service", "procps", "force-reload")]
        return []

    def command_id(self, index: int) -> str:
        return f"{self.type}_{index}"


def decode(payload: str) -> Interrupt:
    """Decode the operator's base64 JSON interrupt; raises InterruptError saying what is wrong."""
    expected = 'base64 of JSON {"type": "<interrupt>", ...}'
    try:
        data = safefile.loads_json(base64.b64decode(payload.encode("ascii"), validate=True).decode("utf-8"))
    except (binascii.Error, UnicodeError, ValueError):
        raise InterruptError(f"the interrupt argument is not {expected}") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise InterruptError(f"the interrupt argument is not {expected}")
    kind = data["type"]
    if kind not in TYPES:
        raise InterruptError(f"unknown interrupt type {kind!r}; known types: {', '.join(TYPES)}")
    services: tuple[str, ...] = ()
    ignored = tuple(sorted(key for key in data if key not in ("type", "services")))
    if kind == SERVICE_RESTART:
        raw = data.get("services")
        if not isinstance(raw, list) or not raw or not all(isinstance(s, str) and s for s in raw):
            raise InterruptError(
                "a service_restart interrupt needs 'services': a non-empty list of unit names"
            )
        services = tuple(raw)
    elif "services" in data:
        ignored = tuple(sorted((*ignored, "services")))
    return Interrupt(type=kind, services=services, ignored_fields=ignored)


def encode(interrupt: Interrupt) -> str:
    """The payload `decode` reads (for tests and local runs)."""
    body: dict[str, object] = {"type": interrupt.type}
    if interrupt.type == SERVICE_RESTART:
        body["services"] = list(interrupt.services)
    return base64.b64encode(json.dumps(body).encode()).decode("ascii")
