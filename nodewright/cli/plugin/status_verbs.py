"""`status [NW]`: the roll-up of one or every NodeWright -- compartments, batches, slots, halts.

Numbers come from the rollout planner run on the cluster as it is (`explain.analyse`), the same
pass the operator makes, so they agree with what the operator does next rather than with a status
written a moment ago; the persisted status supplies what only the operator knows (conditions).
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from nodewright.cli.plugin import common
from nodewright.cli.plugin.explain import Analysis, explain_all, names_text

JSON = dict[str, Any]
BUSY = frozenset({"Complete", "InProgress", "AdmittedNow", "Rebooting", "Draining", "FinishingOlderSpec"})
"""Reasons of nodes doing something (or done): not counted as waiting."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = common.verb_parser(
        subparsers,
        "status",
        help="roll-up of NodeWrights: compartments, batches, slots, halts",
        description="Status of one NodeWright (compartments, batches, slots, halts, why nodes wait), or all.",
        examples=["kubectl nodewright status", "kubectl nodewright status gpu-drivers -o json"],
    )
    parser.add_argument("nodewright", nargs="?", help="one NodeWright (default: all)")
    common.add_output_flag(parser)
    common.add_cluster_flags(parser)
    parser.set_defaults(func=run, prog=parser.prog)


def run(args: argparse.Namespace) -> int:
    return common.run(args, _run)


def status_doc(analysis: Analysis) -> JSON:
    """Everything `status` shows about one NodeWright (also the model of `watch`)."""
    explanations = explain_all(analysis)
    counts = Counter(e.rollout.status.value for e in analysis.entries.values())
    waiting: Counter[str] = Counter()
    for exp in explanations.values():
        if exp.reason not in BUSY:
            waiting[exp.reason] += 1
    compartments = []
    for name, cplan in analysis.plan.compartments.items():
        ours, others = analysis.slot_holders(name)
        state = cplan.status.batch_state
        compartments.append(
            {
                "name": name,
                "strategy": cplan.strategy,
                "budget": cplan.budget,
                "matched": cplan.status.matched,
                "ceiling": cplan.status.ceiling,
                "inProgress": cplan.status.in_progress,
                "slotsUsed": len(ours) + len(others),
                "usedByOthers": cplan.used_by_others,
                "completed": cplan.status.completed,
                "progressPercent": cplan.status.progress_percent,
                "currentBatch": state.current_batch if state else 0,
                "consecutiveFailures": state.consecutive_failures if state else 0,
                "halted": cplan.halt is not None,
                "message": cplan.message,
            }
        )
    status = analysis.model.status
    conditions = [
        {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message}
        for c in (status.conditions or [] if status is not None else [])
    ]
    return {
        "name": analysis.name,
        "status": (status.status.value if status is not None and status.status is not None else "unknown"),
        "paused": analysis.paused,
        "disabled": analysis.disabled,
        "policy": analysis.plan.policy_name,
        "policyNotFound": analysis.plan.policy_not_found is not None,
        "policyInvalid": invalid.message if (invalid := analysis.plan.policy_invalid) is not None else None,
        "matched": len(analysis.entries),
        "nodes": dict(sorted(counts.items())),
        "waiting": dict(sorted(waiting.items())),
        "compartments": compartments,
        "halts": [
            {
                "compartment": h.compartment,
                "reason": h.reason,
                "failingNodes": list(h.failing_nodes),
                "failingCount": h.failing_count,
                "message": h.message,
            }
            for h in analysis.plan.halts
        ],
        "conditions": conditions,
        "blocked": [
            {"node": e.node, "reason": e.reason, "summary": e.summary}
            for e in explanations.values()
            if e.reason
            not in ("Complete", "InProgress", "AdmittedNow", "NotYetInBatch", "BudgetFull", "Paused")
        ][:20],
    }


def render_one(doc: JSON, *, wide: bool) -> str:
    flags = [f for f, on in (("paused", doc["paused"]), ("disabled", doc["disabled"])) if on]
    nodes = ", ".join(f"{k} {v}" for k, v in doc["nodes"].items()) or "none"
    lines = [
        f"NodeWright {doc['name']}: {doc['status']}{' (' + ', '.join(flags) + ')' if flags else ''}"
        f"   policy {doc['policy'] or 'legacy'}{' (NOT FOUND)' if doc['policyNotFound'] else ''}",
        f"nodes: {doc['matched']} matched; {nodes}",
    ]
    if doc.get("policyInvalid"):
        lines.insert(1, doc["policyInvalid"])
    if doc["waiting"]:
        lines.append("waiting: " + ", ".join(f"{k} {v}" for k, v in doc["waiting"].items()))
    rows = [
        [
            c["name"],
            c["matched"],
            f"{c['slotsUsed']}/{c['ceiling']}",
            c["inProgress"],
            c["completed"],
            f"{c['progressPercent']}%",
            c["currentBatch"],
            "yes" if c["halted"] else "",
            *([c["strategy"], c["budget"], c["message"]] if wide else []),
        ]
        for c in doc["compartments"]
    ]
    headers = ["compartment", "matched", "slots", "in-progress", "complete", "progress", "batch", "halted"]
    if wide:
        headers += ["strategy", "budget", "message"]
    lines.append("")
    lines.append(common.table(headers, rows).rstrip("\n"))
    lines.extend(f"HALTED {halt['compartment']}: {halt['message']}" for halt in doc["halts"])
    if doc["blocked"]:
        lines += ["", "nodes that need attention:"]
        lines.extend(f"  {item['node']}: {item['summary']}" for item in doc["blocked"][: 20 if wide else 8])
    if wide:
        lines.extend(
            f"condition {c['type']}={c['status']} {c['reason']}: {c['message']}"
            for c in doc["conditions"]
            if c["status"] == "True" or c["type"] == "Ready"
        )
    return "\n".join(lines) + "\n"


def render_many(docs: list[JSON], *, wide: bool) -> str:
    rows = []
    for d in docs:
        nodes = d["nodes"]
        halted = [h["compartment"] for h in d["halts"]]
        rows.append(
            [
                d["name"],
                d["status"] + (" (paused)" if d["paused"] else "") + (" (disabled)" if d["disabled"] else ""),
                f"{nodes.get('complete', 0)}/{d['matched']}",
                nodes.get("in_progress", 0),
                nodes.get("erroring", 0),
                nodes.get("blocked", 0),
                names_text(halted) if halted else "",
                *([", ".join(f"{k} {v}" for k, v in d["waiting"].items())] if wide else []),
            ]
        )
    headers = ["name", "status", "complete", "in-progress", "erroring", "blocked", "halted"]
    if wide:
        headers.append("waiting")
    return common.table(headers, rows)


async def _run(session: common.Session) -> int:
    from nodewright.cli.plugin.cluster import read_state
    from nodewright.cli.plugin.explain import analyse

    args = session.args
    state = await read_state(session.client)
    if args.nodewright:
        doc = status_doc(analyse(state, args.nodewright))
        common.emit(args, doc, lambda wide: render_one(doc, wide=wide))
        return common.OK
    docs = [status_doc(analyse(state, name)) for name in sorted(state.nodewrights)]
    invalid = [{"name": n, "status": "invalid", "error": e} for n, e in sorted(state.invalid.items())]
    common.emit(
        args,
        {"nodewrights": docs, "invalid": invalid},
        lambda wide: (
            render_many(docs, wide=wide)
            + "".join(f"{i['name']}: invalid, left alone by the operator: {i['error']}\n" for i in invalid)
        ),
    )
    return common.OK
