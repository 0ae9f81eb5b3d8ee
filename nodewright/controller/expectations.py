"""Package pods this process created or deleted that the pod informer has not reported yet.

The same idea as client-go's ReplicaSet expectations (see `PodExpectations`), plus the uids of the pods
this process created, which is what makes a drift-check pod ours (`controller.signing`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from nodewright.kube.resources import JSON
from nodewright.plan import podspec

POD_EXPECTATION_TTL: Final = 60.0
"""Seconds after which an unobserved expectation is dropped (a watch that lost the event relists)."""
OWN_POD_MEMORY: Final = 86_400.0
"""Seconds this process vouches for the uid of a pod it created. Bound pods carry their seal from the
binding on; the memory matters for pods created bound and never sealed (drift checks, which finish in
minutes). Entries normally go with the pod's delete event, so this only bounds what a missed event
leaves behind."""


class PodExpectations:
    """Package pods this process created or deleted that the pod informer has not reported yet.

    The same idea as client-go's ReplicaSet expectations: a state patch and a pod create are two
    events, and the node update often arrives first. Without this, the next reconcile sees the new
    state, no pod for it, and sends the create again (a 409) — or sends a second DELETE for a pod whose
    deletion is still on its way. Any watch event for a pod (add, update, delete) settles what we
    expected of it; the TTL only bounds memory when a watch restart swallowed that event.

    It also remembers the uid of every pod this process created (from the create response) and whether
    it was bound with its seal (see `PodSigner`): for a pod created bound and never sealed (drift
    checks), that uid is what makes the pod ours. Entries go when the pod is deleted, or after
    `OWN_POD_MEMORY` seconds.
    """

    def __init__(self, transform: Any = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._transform = transform or (lambda obj: obj)
        self._clock = clock
        self._created: dict[str, tuple[float, JSON]] = {}  # "<ns>/<name>" -> (when, trimmed pod)
        self._deleted: dict[str, float] = {}  # pod uid -> when the DELETE was accepted
        self._own: dict[str, tuple[float, bool]] = {}  # uid of a pod we created -> (when, seal written)
        self._pruned_at = self._clock()

    @staticmethod
    def _key(pod: JSON) -> str:
        meta = pod.get("metadata") or {}
        return f"{meta.get('namespace')}/{meta.get('name')}"

    def created(self, pod: JSON) -> None:
        """A create succeeded: `pod` is the API server's answer."""
        self._prune()
        now = self._clock()
        self._created[self._key(pod)] = (now, self._transform(pod))
        uid = (pod.get("metadata") or {}).get("uid")
        if uid:
            self._own[str(uid)] = (now, False)

    def sealed(self, pod: JSON) -> None:
        """The seal of a pod we created was written: `pod` is the API server's answer to that patch."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if uid in self._own:
            self._own[uid] = (self._own[uid][0], True)
        key = self._key(pod)
        if key in self._created:  # not observed yet: the sealed copy stands in for it
            self._created[key] = (self._created[key][0], self._transform(pod))

    def forget(self, pod: JSON) -> None:
        """A pod we created and deleted again at once (its binding was refused): expect nothing of it."""
        self._created.pop(self._key(pod), None)
        self._own.pop(str((pod.get("metadata") or {}).get("uid") or ""), None)

    def created_here(self, uid: str | None) -> bool:
        """Whether this process created the pod with this uid (and still remembers it)."""
        return uid is not None and uid in self._own

    def sealed_here(self, uid: str | None) -> bool:
        """A pod this process created and has bound with its seal (the watch may not show it yet)."""
        own = self._own.get(uid or "")
        return own is not None and own[1]

    def seal_pending(self, uid: str | None) -> bool:
        """A pod this process created whose seal has not been written yet."""
        own = self._own.get(uid or "")
        return own is not None and not own[1]

    def deleted(self, uid: str) -> None:
        self._prune()
        self._deleted[uid] = self._clock()

    def observed(self, pod: JSON) -> None:
        """A watch event for `pod`: the informer knows it now."""
        if self._created:
            self._created.pop(self._key(pod), None)
        if self._deleted and (meta := pod.get("metadata") or {}).get("deletionTimestamp"):
            self._deleted.pop(str(meta.get("uid")), None)

    def observed_delete(self, pod: JSON) -> None:
        self.observed(pod)
        uid = str((pod.get("metadata") or {}).get("uid"))
        self._deleted.pop(uid, None)
        self._own.pop(uid, None)

    def deletion_pending(self, uid: str | None) -> bool:
        return uid is not None and uid in self._deleted

    def pending_on(self, node: str, known: Iterable[JSON]) -> list[JSON]:
        """Pods created on `node` that `known` (the informer's pods there) does not list yet."""
        if not self._created:
            return []
        names = {self._key(p) for p in known}
        out = []
        for key, (_, pod) in self._created.items():
            if key not in names and podspec.pod_node(pod) == node:
                out.append(pod)
        return out

    def _prune(self) -> None:
        now = self._clock()
        if now - self._pruned_at < POD_EXPECTATION_TTL / 10:
            return
        self._pruned_at = now
        horizon = now - POD_EXPECTATION_TTL
        for key in [k for k, (at, _) in self._created.items() if at < horizon]:
            del self._created[key]
        for uid in [u for u, at in self._deleted.items() if at < horizon]:
            del self._deleted[uid]
        own_horizon = now - OWN_POD_MEMORY
        for uid in [u for u, (at, _) in self._own.items() if at < own_horizon]:
            del self._own[uid]
