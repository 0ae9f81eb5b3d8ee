"""`make demo` tells the safety story (issue 16): protected pods waited for by name and for how long,
evictions honoured and refused by PodDisruptionBudgets (from the operator's Events, series counts
included), the budget checks, and the picture of in-progress nodes against the ceilings."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from nodewright.cli import demo_cmd
from nodewright.sim.demo import FleetTracker


def _node(
    name: str, reason: str | None, message: str = "", *, status: str = "in_progress", batch: int = 1
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if reason:
        conditions.append({"type": "nodewright.io/kernel-tuning", "reason": reason, "message": message})
    return {
        "metadata": {
            "name": name,
            "labels": {"nodewright.io/status.kernel-tuning": status},
            "annotations": {
                "nodewright.io/batch.kernel-tuning": f'{{"c":"zone-a","b":{batch},"o":0,"f":"x","at":"t"}}'
            },
        },
        "spec": {},
        "status": {"conditions": conditions, "nodeInfo": {"bootID": "b"}},
    }


def test_the_tracker_times_protected_waits_and_batch_starts() -> None:
    tracker = FleetTracker(Path("/nonexistent"), "kernel-tuning")
    t0 = time.monotonic()
    msg = "tuning:1.0 apply pending; waiting for protected pods: "
    msg += "sim-workloads/train-0-a, sim-workloads/train-0-b"
    tracker._update(_node("n0", "WaitingForProtectedPods", msg), t0)
    tracker._update(_node("n0", "WaitingForProtectedPods", msg), t0 + 5)
    tracker._update(_node("n0", "Draining", "draining"), t0 + 42)
    tracker._update(_node("n1", "InProgress", batch=2), t0 + 50)
    [(node, wait)] = tracker.protected_waits()
    assert node == "n0" and wait.pods == ("sim-workloads/train-0-a", "sim-workloads/train-0-b")
    assert wait.until is not None and round(wait.until - wait.since) == 42
    assert set(tracker.batch_starts) == {("zone-a", 1), ("zone-a", 2)}


def test_evictions_are_summed_from_the_event_series() -> None:
    related = {"related": {"kind": "NodeWright", "name": "kernel-tuning"}}
    other = {"related": {"kind": "NodeWright", "name": "other"}}
    events = [
        {"reason": "NodeDraining", "count": 3, "message": "Evicting 2 pod(s) for [kernel-tuning]", **related},
        {"reason": "NodeDraining", "count": 1, "message": "Evicting 5 pod(s) for [other]", **other},
        {
            **related,
            "reason": "NodeDrainBlocked",
            "count": 4,
            "message": "Drain for [kernel-tuning] blocked by sim-workloads/p: Cannot evict pod as it would"
            " violate the pod's disruption budget.; The disruption budget train-rack-0002 needs 7",
        },
    ]
    found = demo_cmd.evictions_from(events, "kernel-tuning")
    assert (found.evicted, found.refused, found.budgets) == (6, 4, ("train-rack-0002",))


def test_safety_lines_and_the_picture(tmp_path: Path) -> None:
    tracker = FleetTracker(Path("/nonexistent"), "kernel-tuning")
    t0 = time.monotonic()
    for i in range(3):
        tracker._update(_node(f"n{i}", "InProgress", batch=i + 1), t0 + i)
        tracker._update(_node(f"n{i}", None, status="complete", batch=i + 1), t0 + i + 0.5)
    lines = demo_cmd.safety_lines(
        tracker, demo_cmd.Evictions(evicted=2, refused=1, budgets=("pdb-a",)), over=[]
    )
    text = "\n".join(lines)
    assert "training pods waited for: none" in text
    assert "2 pod(s) evicted" in text and "1 eviction attempt(s) refused by a PDB" in text and "pdb-a" in text
    assert "invariant breaches: 0" in text
    broken = demo_cmd.safety_lines(tracker, demo_cmd.Evictions(), over=["zone-a (3 > 2)"])
    assert "invariant breaches: 1 (in progress above the ceiling in zone-a (3 > 2))" in "\n".join(broken)
    nw = {"status": {"compartmentStatuses": {"zone-a": {"ceiling": 1, "matched": 3}}}}
    path = tmp_path / "demo.png"
    assert demo_cmd._picture(tracker, nw, path) == str(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
