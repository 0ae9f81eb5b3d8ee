"""The drift part of `nodewright demo`: a tuned value changed by hand is found, reported and repaired.

After the rollout, the demo changes one sysctl the `tuning` package manages (`net.core.rmem_max`) on two
of the nodes whose package pods really run, in their node roots, as someone with a root shell would. It
then turns drift detection on (`spec.driftDetection: {interval: 1m, action: report}`): the operator's
drift-check pods run the package's read-only checks on complete nodes, find the two, label them
`drifted` with the failing check's output in the node condition, and `nodewright consistency` shows the
skew. Then the action becomes `reapply`: the two go through the deployment policy's batches like any
change (cordon, drain, apply, config, reboot, checks, uncordon) and the value is read back from their
roots. Nothing else in the fleet is touched: the checks need no cordon, drain or budget slot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodewright.api import constants

SYSCTL = "net.core.rmem_max"
HAND_VALUE = "212992"  # the kernel's default: what a node that lost the tuning would show
NW_PATH = "/apis/nodewright.io/v1alpha1/nodewrights"


@dataclass(frozen=True, slots=True)
class DriftOutcome:
    ok: bool
    message: str = ""


def sysctl_path(root: Path, key: str = SYSCTL) -> Path:
    return root / "proc" / "sys" / key.replace(".", "/")


def break_value(roots: Sequence[Path]) -> dict[str, str]:
    """Overwrite the managed sysctl on each root; the tuned value per node."""
    tuned: dict[str, str] = {}
    for root in roots:
        path = sysctl_path(root)
        tuned[root.name] = path.read_text().strip() if path.exists() else ""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(HAND_VALUE + "\n")
    return tuned


async def _wait(probe: Callable[[], Any], *, within: float, every: float = 2.0) -> tuple[Any, float]:
    """Await `probe()` until it returns something truthy; (that value, seconds) or (None, seconds)."""
    started = time.monotonic()
    while True:
        found = await probe()
        if found:
            return found, time.monotonic() - started
        if time.monotonic() - started > within:
            return None, time.monotonic() - started
        await asyncio.sleep(every)


def _condition_message(node: Any, nodewright: str) -> str:
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == constants.node_condition_type(nodewright):
            return str(cond.get("message") or "")
    return ""


async def drift_story(
    kubeconfig: Path, roots: Sequence[Path], *, nodewright: str, say: Callable[[str], None], within: float
) -> DriftOutcome:
    from nodewright.cli.consistency_cmd import consistency_report, render
    from nodewright.sim.kubeapi import KubeClient

    if len(roots) < 1:
        return DriftOutcome(True, "skipped: no node runs its package pods for real")
    names = [r.name for r in roots]
    label = constants.status_label(nodewright)
    say(f"\ndrift: {SYSCTL} set back to {HAND_VALUE} by hand on {', '.join(names)} (in their node roots)")
    tuned = break_value(roots)
    async with KubeClient(kubeconfig) as client:
        await client.merge_patch(
            f"{NW_PATH}/{nodewright}",
            {"spec": {"driftDetection": {"enabled": True, "interval": "1m", "action": "report"}}},
        )
        say("  driftDetection on (interval 1m, action report): read-only checks on every complete node")

        async def statuses() -> dict[str, Any]:
            return {n: await client.get(f"/api/v1/nodes/{n}") for n in names}

        async def all_drifted() -> dict[str, Any] | None:
            nodes = await statuses()
            drifted = all((n["metadata"].get("labels") or {}).get(label) == "drifted" for n in nodes.values())
            return nodes if drifted else None

        nodes, took = await _wait(all_drifted, within=within)
        if nodes is None:
            return DriftOutcome(False, f"the changed nodes were not labelled drifted within {within:.0f}s")
        first = nodes[names[0]]
        cordoned = [n for n, obj in nodes.items() if (obj.get("spec") or {}).get("unschedulable")]
        say(f"  {len(names)} node(s) labelled drifted after {took:.0f}s, none cordoned ({len(cordoned)})")
        say(f"  condition on {names[0]}: {_condition_message(first, nodewright)[:300]}")
        nw_obj = await client.get(f"{NW_PATH}/{nodewright}")
        fleet = (await client.list_all("/api/v1/nodes"))["items"]
        report = consistency_report([nw_obj], fleet)
        skewed = [line for line in render(report).splitlines() if "SKEW" in line or "drift" in line.lower()]
        say("  nodewright consistency: " + ("; ".join(s.strip() for s in skewed[:3]) or "uniform"))

        await client.merge_patch(
            f"{NW_PATH}/{nodewright}", {"spec": {"driftDetection": {"action": "reapply"}}}
        )
        say("  action reapply: the drifted nodes are repaired through the policy's batches and budgets")

        async def repaired() -> bool:
            nodes = await statuses()
            done = all((n["metadata"].get("labels") or {}).get(label) == "complete" for n in nodes.values())
            back = all(sysctl_path(r).read_text().strip() == tuned[r.name] for r in roots)
            return done and back

        ok, took = await _wait(repaired, within=within * 2)
        if not ok:
            return DriftOutcome(False, f"the drifted nodes were not repaired within {within * 2:.0f}s")
        values = ", ".join(f"{r.name} {sysctl_path(r).read_text().strip()}" for r in roots)
        say(f"  repaired in {took:.0f}s (apply, config, reboot, checks); {SYSCTL} read back: {values}")
    return DriftOutcome(True)
