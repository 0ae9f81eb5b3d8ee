"""`why NODE [NW]`: why a node is waiting (or what it is doing), the way the operator decides it.

The answer is computed (see `explain`): an untouched waiting node carries no label or condition, so
nothing on the node says why it waits. For each NodeWright selecting the node (or the one named): one
line -- not in a batch yet (batch k of n in compartment c), budget full (and who holds the slots),
halted, waiting for an earlier NodeWright (paused or not), paused, disabled, blocked (taint, ignore
label, a skipped drain), unavailable (NotReady, cordoned by someone else), policy missing, state
unreadable -- or, for an admitted node, what holds it at its gate: protected pods by name, the
PodDisruptionBudget refusing an eviction (pod and PDB), the drain timeout and its policy, a reboot, a
stage running, attempts exhausted. Then the detail lines and the last Events about the node.
"""

from __future__ import annotations

import argparse
from typing import Any

from nodewright.cli.plugin import common

JSON = dict[str, Any]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = common.verb_parser(
        subparsers,
        "why",
        help="why a node is waiting, computed like the operator",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else "",
        examples=[
            "kubectl nodewright why gpu-node-0007",
            "kubectl nodewright why gpu-node-0007 gpu-drivers -o json",
        ],
    )
    parser.add_argument("node", help="the node")
    parser.add_argument(
        "nodewright", nargs="?", help="one NodeWright (default: every one selecting the node)"
    )
    parser.add_argument(
        "--events", type=int, default=3, metavar="N", help="recent Events to show (default 3)"
    )
    common.add_output_flag(parser)
    common.add_cluster_flags(parser)
    parser.set_defaults(func=run, prog=parser.prog)


def run(args: argparse.Namespace) -> int:
    return common.run(args, _run)


async def explain_node(session: common.Session, state: Any, node: str, names: list[str]) -> list[JSON]:
    """The explanations of `node` for each of `names` (with the drain facts read where they help)."""
    from nodewright.cli.plugin.cluster import disruption_budgets, node_pods
    from nodewright.cli.plugin.explain import (
        analyse,
        drain_report,
        explain,
        needs_drain_facts,
        protect_selector,
    )

    out: list[JSON] = []
    pods: list[JSON] | None = None
    budgets: list[JSON] | None = None
    for name in names:
        analysis = analyse(state, name)
        report = None
        if needs_drain_facts(analysis, node):
            if pods is None:
                pods = await node_pods(session.client, node)
                budgets = await disruption_budgets(
                    session.client, {str(p["metadata"].get("namespace")) for p in pods}
                )
            report = drain_report(pods, budgets or [], protect=protect_selector(analysis))
        out.append(explain(analysis, node, drain=report).to_json())
    return out


async def _run(session: common.Session) -> int:
    from nodewright.cli.plugin.cluster import read_state, recent_events
    from nodewright.plan.rollout_input import matches_nodewright

    args = session.args
    state = await read_state(session.client)
    node = state.node(args.node)
    if args.nodewright:
        state.nodewright(args.nodewright)
        names = [args.nodewright]
    else:
        names = [n for n, m in sorted(state.nodewrights.items()) if matches_nodewright(m, node)]
    answers = await explain_node(session, state, args.node, names)
    events: list[JSON] = []
    if args.events > 0:
        for event in await recent_events(session.client, kind="Node", name=args.node, limit=args.events * 4):
            message = str(event.get("message") or "")
            # Node Events name the NodeWright they are for in their `related` object.
            if not args.nodewright or (event.get("related") or {}).get("name") == args.nodewright:
                events.append(
                    {
                        "reason": event.get("reason"),
                        "type": event.get("type"),
                        "count": event.get("count", 1),
                        "lastTimestamp": event.get("lastTimestamp"),
                        "message": message,
                    }
                )
        events = events[-args.events :]
    doc = {"node": args.node, "answers": answers, "events": events}

    def render(wide: bool) -> str:
        if not answers:
            return f"no NodeWright selects node {args.node}\n"
        lines = []
        for a in answers:
            lines.append(f"{a['node']} / {a['nodewright']}: {a['reason']}: {a['summary']}")
            lines.extend(f"  {d}" for d in a["details"])
            if wide:
                lines.append(
                    f"  (status {a['status']}, phase {a['phase']}, compartment {a['compartment']},"
                    f" batch {a['batch']}, stage {a['stage'] or '-'}, attempts {a['attempts']})"
                )
        if events:
            lines.append("recent events:")
            lines.extend(
                f"  {e['lastTimestamp']}  {e['type']:<7} {e['reason']:<18} x{e['count']} {e['message']}"
                for e in events
            )
        return "\n".join(lines) + "\n"

    common.emit(args, doc, render)
    return common.OK
