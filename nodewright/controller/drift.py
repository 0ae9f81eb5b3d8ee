"""The node controller's side of drift detection: the schedule's memory and the fleet-wide rate cap.

The decisions are pure (`plan.drift`, `plan.node`); what they need from the process lives here:

- **Checked slots.** The last check slot this process saw checked for each (NodeWright, node). Nothing is
  persisted: a slot a process sees for the first time counts as checked, so after a restart the next
  checks come at each node's next slot, spread over the interval as before, instead of all at once. A
  check the host asks for (a reboot outside our interrupt, a kernel or OS image change) does not wait
  for a slot: the planner sees it from the node.
- **The cap.** At most `limit` drift-check pods exist in the operator's namespace at a time, across all
  NodeWrights (counted from the pod cache, plus the creations not yet seen by the watch), so checking
  a large fleet never loads the API server or the nodes much: a due node without a free place waits a few
  seconds and tries again.

A check costs two writes when nothing drifted (the pod's create and delete; drift-check pods are not
sealed, see `controller.trust`), plus the node's state write when a result changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from nodewright.controller.trust import is_drift_check
from nodewright.kube.resources import JSON

DEFAULT_LIMIT: Final = 4
PENDING_TTL: Final = 60.0  # seconds a creation is counted before the watch shows the pod


@dataclass
class DriftScheduler:
    limit: int = DEFAULT_LIMIT
    clock: Callable[[], float] = time.monotonic
    _checked: dict[str, int] = field(default_factory=dict)
    _pending: dict[str, float] = field(default_factory=dict)  # pod name -> when created here

    def due(self, key: str, slot: int) -> bool:
        """Whether `slot` still needs a check for `key` (the first slot seen counts as checked)."""
        last = self._checked.setdefault(key, slot)
        return slot > last

    def checked(self, key: str, slot: int) -> None:
        self._checked[key] = max(slot, self._checked.get(key, slot))

    def forget(self, key: str) -> None:
        self._checked.pop(key, None)

    def started(self, pod_name: str) -> None:
        self._pending[pod_name] = self.clock()

    def may_start(self, pods: Iterable[JSON]) -> bool:
        """A free place: drift-check pods that exist (or were just created here) stay under the limit."""
        now = self.clock()
        live = {str((p.get("metadata") or {}).get("name")) for p in pods if is_drift_check(p)}
        for name, since in list(self._pending.items()):
            if name in live or now - since > PENDING_TTL:
                del self._pending[name]
        return len(live) + len(self._pending) < self.limit

    def describe(self) -> dict[str, Any]:
        return {"limit": self.limit, "tracked": len(self._checked), "pending": len(self._pending)}
