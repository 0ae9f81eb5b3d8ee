"""Drift detection: when a complete node is checked again, and what a check's result means. Pure.

A NodeWright with `driftDetection` keeps verifying the nodes where it is complete, with the packages' own
read-only check modes (apply-check, config-check, and post-interrupt-check for packages with an
interrupt: it reads the running values back). The node controller runs one drift-check pod per
(NodeWright, node) per check, covering every checked package; it needs no cordon, no drain and no
interrupt. This module decides, without I/O and with time passed in:

- **When a node is due.** Time is cut into slots of the interval, shifted per node by a fixed offset
  derived from (NodeWright, node) names, so the checks of a fleet spread evenly over the interval and a
  restart of the operator does not make every node due at once: a node is checked once per slot; the
  first slot an operator process sees for a node counts as already checked. A node is also due at once
  when the host changed under us: a new bootID that no interrupt of ours explains, or a new kernel or
  OS image in the node's info (`recheck_reason`).
- **The rate cap.** The controller holds a fleet-wide cap of check pods in flight (`--drift-checks`);
  a due node without a free slot waits and is retried shortly (`DUE_RETRY`).
- **What counts as drift.** A check pod whose first failing container is `<pkg>-<mode>check` means
  that package drifted, with that check's log tail as the reason; the packages checked before it are
  clean, the ones after it unchecked (their previous result stands). A pod that could not run its
  checks (image pull error, deadline) says nothing about drift: it is a check `error`.
- **A deadline.** A check pod holds back the node's stage pods while it exists, so it has one
  (`activeDeadlineSeconds`: the packages' stage timeouts, `podspec.drift_check_deadline`); the kubelet
  ends it then, and the operator deletes one still there `CHECK_GRACE` later (`check_expires`).
- **Which results count.** A check pod carries its basis (`check_basis`): the last completed run of
  each package it checks and the node's bootID when it was created. Its result counts only while that
  basis still holds: a check that started before a run of a checked package (a repair, a config change)
  or that ran across a reboot (the kubelet starts its containers again, on a host that changed under
  them) is void; it is removed and the node is checked again (`void_reason`).
- **Repair admission** (`action: reapply`): a drifted package is work to do; the node goes back through
  the rollout (fresh admission, budget, batch) and re-runs the package's apply and config, and its
  interrupt if it has one (`plan.node`); a repair that fails counts as a failure of its batch.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final

from nodewright.api.models import DriftAction, DriftDetection, NodeWright, Package
from nodewright.api.nodestate import NodeState, PackageEntry, PackageState
from nodewright.plan.podspec import (
    DRIFT_CHECK_MODES,
    drift_check_container,
    drift_check_deadline,
    parse_duration_seconds,
)

MIN_INTERVAL: Final = 10.0
"""Seconds: shorter intervals are raised to this (a check pod takes seconds to run)."""
DUE_RETRY: Final = 5.0
"""Seconds before a due node without a free check slot is looked at again."""
CHECK_GRACE: Final = 60.0
"""Seconds past a check pod's deadline, counted from its creation, before the operator deletes it. The
kubelet counts `activeDeadlineSeconds` from when it picked the pod up and ends the pod itself; this
catches the check it could not end (a kubelet down or cut off from the API server) and pods created
without a deadline by an older operator version."""


@dataclass(frozen=True, slots=True)
class DriftSettings:
    interval: float  # seconds
    action: DriftAction


def settings_for(nw: NodeWright, package: str) -> DriftSettings | None:
    """The package's effective drift settings (the package's own override, else the NodeWright's), or
    None when it is not checked."""
    pkg = nw.spec.packages.get(package)
    chosen: DriftDetection | None = None
    if pkg is not None and pkg.drift_detection is not None:
        chosen = pkg.drift_detection
    elif nw.spec.drift_detection is not None:
        chosen = nw.spec.drift_detection
    if chosen is None or not chosen.enabled:
        return None
    interval = max(MIN_INTERVAL, parse_duration_seconds(chosen.interval))
    return DriftSettings(interval=interval, action=chosen.action)


def checked_packages(nw: NodeWright) -> dict[str, DriftSettings]:
    """Every package of the spec that is checked, with its settings (sorted by name)."""
    out: dict[str, DriftSettings] = {}
    for name in sorted(nw.spec.packages):
        found = settings_for(nw, name)
        if found is not None:
            out[name] = found
    return out


def node_interval(nw: NodeWright) -> float | None:
    """One pod checks every package of a node, so the node is checked at the shortest interval."""
    intervals = [s.interval for s in checked_packages(nw).values()]
    return min(intervals) if intervals else None


def reapplies(nw: NodeWright, package: str) -> bool:
    found = settings_for(nw, package)
    return found is not None and found.action is DriftAction.REAPPLY


def offset(nodewright: str, node: str, interval: float) -> float:
    """This node's fixed place in the interval (stable across operator restarts and hosts)."""
    digest = hashlib.sha256(f"{nodewright}/{node}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return fraction * interval


def slot(now: float, *, nodewright: str, node: str, interval: float) -> int:
    """The check slot `now` (seconds since the epoch) falls in, for this node."""
    return math.floor((now - offset(nodewright, node, interval)) / interval)


def seconds_to_next_slot(now: float, *, nodewright: str, node: str, interval: float) -> float:
    start_of_next = (slot(now, nodewright=nodewright, node=node, interval=interval) + 1) * interval
    return max(0.0, start_of_next + offset(nodewright, node, interval) - now)


def recheck_reason(state: NodeState, *, boot_id: str, kernel: str, os_image: str) -> str | None:
    """Why the host changed under us since it was last known: checked now, whatever the schedule."""
    if state.interrupt_at is None and state.boot_id and boot_id and boot_id != state.boot_id:
        return f"the node rebooted outside an interrupt of ours (bootID {state.boot_id} -> {boot_id})"
    if state.kernel and kernel and kernel != state.kernel:
        return f"the kernel changed ({state.kernel} -> {kernel})"
    if state.os_image and os_image and os_image != state.os_image:
        return f"the OS image changed ({state.os_image} -> {os_image})"
    return None


def check_plan(nw: NodeWright, state: NodeState) -> list[tuple[str, Package, str]]:
    """(package, spec, installed version) for every checked package complete on the node."""
    out = []
    for name in checked_packages(nw):
        pkg = nw.spec.packages[name]
        entry = state.entry(name, pkg.version)
        if entry is not None and entry.state is PackageState.COMPLETE:
            out.append((name, pkg, entry.version))
    return out


def check_expires(nw: NodeWright, *, created: datetime, deadline: float | None) -> datetime:
    """When the operator deletes a drift-check pod that is still there: `CHECK_GRACE` after its deadline
    (`deadline`, its `activeDeadlineSeconds`; for a pod built without one, the deadline a check of the
    NodeWright's checked packages gets now), counted from its creation. A check pod holds back the
    node's stage pods while it exists, so a hung one must not hold them forever; it counts as an
    `error` of the check (no verdict on drift)."""
    if not deadline:
        deadline = drift_check_deadline(nw.spec.packages[name] for name in checked_packages(nw))
    return created + timedelta(seconds=deadline + CHECK_GRACE)


@dataclass(frozen=True, slots=True)
class CheckBasis:
    """What a check started now is made against (`check_basis`); a check pod carries it in the
    annotation `nodewright.io/drift-basis` as `<runs>/<bootID>`."""

    runs: str  # digest of the last completed run of each package the check covers
    boot_id: str  # the node's bootID ("" when the node reports none)

    def encode(self) -> str:
        return f"{self.runs}/{self.boot_id}"

    @staticmethod
    def parse(text: str) -> CheckBasis | None:
        runs, sep, boot_id = text.partition("/")
        return CheckBasis(runs, boot_id) if sep and runs else None


class VoidCheck(StrEnum):
    """Why a finished check's result does not count (`void_reason`)."""

    NO_BASIS = "the check pod carries no basis"
    REBOOTED = "it ran across a reboot of the node"
    RAN_AGAIN = "a package it checked ran again since it started"


def check_basis(nw: NodeWright, state: NodeState, *, boot_id: str) -> CheckBasis:
    """The basis of a check started now: for each package it checks, the stamps of its last completed
    run (the entry's stage, start and completion times and applied config; a drift mark is not part
    of it), and the node's bootID. Clock-free: values are compared, never times."""
    parts: list[object] = []
    for name, _, version in check_plan(nw, state):
        entry = state.entry(name, version)
        assert entry is not None  # check_plan lists complete entries only
        parts.append((name, version, entry.stage.value, entry.started, entry.updated, entry.config))
    return CheckBasis(runs=hashlib.sha256(repr(parts).encode()).hexdigest()[:16], boot_id=boot_id)


def void_reason(pod_basis: str, nw: NodeWright, state: NodeState, *, boot_id: str) -> VoidCheck | None:
    """Why a finished check pod's result does not count (None: it counts). It counts only when the
    node is still what the check was made against: the same boot (a check the kubelet ran again after a
    reboot, or that a reboot cut short, read a host that changed under it) and no run of a package it
    checked since it started (a check created before a repair must not judge the repaired node)."""
    basis = CheckBasis.parse(pod_basis)
    if basis is None:
        return VoidCheck.NO_BASIS
    now = check_basis(nw, state, boot_id=boot_id)
    if basis.boot_id != now.boot_id:
        return VoidCheck.REBOOTED
    if basis.runs != now.runs:
        return VoidCheck.RAN_AGAIN
    return None


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    """What one finished drift-check pod says. `drifted` maps package -> reason; `clean` are the
    packages whose checks passed; `error` says the checks could not run (no verdict)."""

    drifted: Mapping[str, str]
    clean: frozenset[str]
    error: str = ""

    @property
    def result(self) -> str:
        """The metric label of the check: drifted, clean or error."""
        if self.error:
            return "error"
        return "drifted" if self.drifted else "clean"


def read_outcome(
    checked: Sequence[tuple[str, Package, str]],
    *,
    succeeded: bool,
    failed_container: str | None,
    message: str,
) -> CheckOutcome:
    """Interpret a finished check pod over the packages it checked, in the order it checked them."""
    names = [name for name, _, _ in checked]
    if succeeded:
        return CheckOutcome(drifted={}, clean=frozenset(names))
    for index, (name, package, _) in enumerate(checked):
        modes = DRIFT_CHECK_MODES + (("post-interrupt-check",) if package.interrupt is not None else ())
        containers = {drift_check_container(name, mode): mode for mode in modes}
        if failed_container in containers:
            mode = containers[failed_container]
            reason = f"{mode} failed: {message}" if message else f"{mode} failed"
            return CheckOutcome(drifted={name: reason}, clean=frozenset(names[:index]))
        if failed_container == f"{name}-init":
            return CheckOutcome(drifted={}, clean=frozenset(names[:index]), error=message or "copy failed")
    return CheckOutcome(drifted={}, clean=frozenset(), error=message or "the check pod failed")


def apply_outcome(state: NodeState, outcome: CheckOutcome, nw: NodeWright) -> NodeState:
    """The state after a check: drifted packages carry the reason, clean ones lose theirs."""
    new = state
    for entry in state.packages:
        pkg = nw.spec.packages.get(entry.name)
        if pkg is None or entry.version != pkg.version or entry.state is not PackageState.COMPLETE:
            continue
        if entry.name in outcome.drifted:
            reason = outcome.drifted[entry.name][:500]
            if entry.drifted != reason:
                new = new.with_entry(_with_drift(entry, reason))
        elif entry.name in outcome.clean and entry.drifted:
            new = new.with_entry(_with_drift(entry, ""))
    return new


def drifted_entries(state: NodeState, nw: NodeWright) -> list[PackageEntry]:
    """In-spec complete entries whose last check found drift."""
    out = []
    for entry in state.packages:
        pkg = nw.spec.packages.get(entry.name)
        if pkg is not None and entry.version == pkg.version and entry.drifted:
            out.append(entry)
    return out


def describe(entries: Iterable[PackageEntry]) -> str:
    return "; ".join(f"{e.name}:{e.version} drifted: {e.drifted}" for e in entries)


def _with_drift(entry: PackageEntry, reason: str) -> PackageEntry:
    return replace(entry, drifted=reason)
