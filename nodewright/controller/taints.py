"""Runtime-required taints: new capacity stays unschedulable until its required setup is complete.

A NodeWright with `runtimeRequired: true` keeps its nodes tainted (operator flag
`--runtime-required-taint`, default `nodewright.io/runtime-required=true:NoSchedule`) until *every*
runtime-required NodeWright that targets the node is complete on that node for its current spec (the
status label corrected by the state annotation, `plan.rollout.complete_for_spec`: a label still saying
`complete` from before a spec edit does not count); then the taint is removed from that node alone.
With `autoTaintNewNodes`, matched nodes that NodeWright has never touched (no `nodewright.io/`
annotation at all) get the taint, so a node that joins the cluster is not schedulable before it is
configured (taint at kubelet registration is still the race-free way; this is the net).

The reference's trap: a paused or disabled runtime-required NodeWright that is incomplete keeps its
nodes tainted forever, silently. Here the taint stays (removing it would let workloads land on
unconfigured nodes), but the NodeWright reports `RuntimeTaintHeld` with the number of nodes it holds
and the first few of their names (`plan.status.runtime_taint_condition`).

Taints are a list in `spec.taints`; a JSON merge patch replaces the whole list, so every write carries
the resourceVersion it was computed from and a concurrent change makes it fail with 409 (retried by
the work queue with fresh data) instead of dropping someone else's taint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from nodewright.api import constants
from nodewright.api.admission import ADMISSION_ANNOTATION_PREFIX
from nodewright.api.models import NodeWright
from nodewright.api.nodeobject import node_annotations
from nodewright.controller.options import parse_taint
from nodewright.controller.runtime import Runtime
from nodewright.kube.resources import JSON, NODES
from nodewright.plan.node import is_disabled, is_paused
from nodewright.plan.rollout_input import matches_nodewright
from nodewright.plan.sequencing import CompletionMemo

log = structlog.get_logger("nodewright.taints")


@dataclass(frozen=True, slots=True)
class TaintReport:
    removed: int = 0
    added: int = 0
    held_while_inactive: tuple[str, ...] = ()  # nodes kept tainted while this NodeWright is paused/disabled


def _has_taint(node: JSON, key: str, effect: str) -> bool:
    taints = (node.get("spec") or {}).get("taints") or ()
    return any(t.get("key") == key and t.get("effect") == effect for t in taints)


def _never_touched(node: JSON) -> bool:
    """No NodeWright has done anything here (an admission alone is only a decision, not work)."""
    return not any(
        k.startswith(constants.PREFIX) and not k.startswith(ADMISSION_ANNOTATION_PREFIX)
        for k in node_annotations(node)
    )


async def _set_taints(
    rt: Runtime, node: JSON, taints: list[JSON], annotations: dict[str, str | None]
) -> None:
    meta = node["metadata"]
    patch: JSON = {
        "metadata": {"resourceVersion": meta["resourceVersion"]},
        "spec": {"taints": taints or None},
    }
    if annotations:
        patch["metadata"]["annotations"] = annotations
    written = await rt.client.patch(NODES, meta["name"], patch)
    rt.node_view.record(written)


async def reconcile_runtime_taints(
    rt: Runtime,
    nodewright: NodeWright,
    matched: Sequence[JSON],
    *,
    all_names: Sequence[str],
    completion: CompletionMemo,
) -> TaintReport:
    """Remove the taint where every runtime-required NodeWright targeting the node is complete for its
    current spec (`completion`, the rule ordering and the status use), taint untouched new nodes."""
    if not nodewright.spec.runtime_required:
        return TaintReport()
    key, value, effect = parse_taint(rt.options.runtime_required_taint)
    required = []
    for other in all_names:
        _, model, _ = rt.nodewright(other)
        if model is not None and model.spec.runtime_required:
            required.append(model)
    inactive = is_paused(nodewright) or is_disabled(nodewright)
    removed = added = 0
    held: list[str] = []
    for node in matched:
        node_name = str(node["metadata"]["name"])
        tainted = _has_taint(node, key, effect)
        targeting = [m for m in required if matches_nodewright(m, node)]
        if tainted and all(completion.complete_on(m, node) for m in targeting):
            remaining = [
                t
                for t in (node.get("spec") or {}).get("taints") or ()
                if not (t.get("key") == key and t.get("effect") == effect)
            ]
            await _set_taints(rt, node, remaining, {constants.AUTO_TAINT_ANNOTATION: None})
            removed += 1
            log.info("runtime-required taint removed", node=node_name)
            continue
        if tainted and inactive and not completion.complete_on(nodewright, node):
            held.append(node_name)
        if (
            not tainted
            and nodewright.spec.auto_taint_new_nodes
            and _never_touched(node)
            and not completion.complete_on(nodewright, node)
        ):
            taint: JSON = {"key": key, "effect": effect}
            if value is not None:
                taint["value"] = value
            current = list((node.get("spec") or {}).get("taints") or ())
            await _set_taints(rt, node, [*current, taint], {constants.AUTO_TAINT_ANNOTATION: "true"})
            added += 1
            log.info("new node auto-tainted", node=node_name, taint=rt.options.runtime_required_taint)
    return TaintReport(removed=removed, added=added, held_while_inactive=tuple(held))
