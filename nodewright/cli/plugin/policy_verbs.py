"""`policy show DP` and `policy reset NW [--compartment C]`: DeploymentPolicies and batch state.

- `show` prints the policy's compartments (selector, budget, strategy) and, for every NodeWright that
  uses it, the nodes each compartment matches and its ceiling (the planner's own compartment
  assignment: the safest compartment wins where selectors overlap).
- `reset` asks the operator to reset a NodeWright's batch state through the annotation
  `nodewright.io/reset-batch-state`: `true` resets every compartment, a comma-separated list of
  compartment names only those. Counters and a halt are cleared, the batch number is kept (admissions
  record it), and the operator removes the annotation once applied -- the status is never edited
  behind the operator's back.
"""

from __future__ import annotations

import argparse
from typing import Any

from nodewright.api import constants
from nodewright.cli.plugin import common

JSON = dict[str, Any]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    policy = subparsers.add_parser(
        "policy", help="DeploymentPolicies: show compartments and ceilings, reset batch state"
    )
    policy.set_defaults(func=common.show_help(policy))
    verbs = policy.add_subparsers(dest="policy_command", metavar="COMMAND")

    show = common.verb_parser(
        verbs,
        "show",
        help="compartments, budgets, strategies; per NodeWright the nodes matched and ceilings",
        description=__doc__.split("\n\n")[1] if __doc__ else "",
        examples=[
            "kubectl nodewright policy show gpu-rollout",
            "kubectl nodewright policy show gpu-rollout -o json",
        ],
    )
    show.add_argument("policy", help="the DeploymentPolicy")
    common.add_output_flag(show)
    common.add_cluster_flags(show)
    show.set_defaults(func=lambda a: common.run(a, _show), prog=show.prog)

    reset = common.verb_parser(
        verbs,
        "reset",
        help="reset a NodeWright's batch state (all compartments, or some)",
        description=__doc__.split("\n\n")[1] if __doc__ else "",
        examples=[
            "kubectl nodewright policy reset gpu-drivers -y",
            "kubectl nodewright policy reset gpu-drivers --compartment canary -y -o json",
        ],
    )
    reset.add_argument("nodewright", help="the NodeWright whose batch state is reset")
    reset.add_argument(
        "--compartment", action="append", default=[], help="only this compartment (repeatable)"
    )
    common.add_write_flags(reset, confirm=True)
    common.add_output_flag(reset, ("table", "json", "yaml"))
    common.add_cluster_flags(reset)
    reset.set_defaults(func=lambda a: common.run(a, _reset), prog=reset.prog)


async def _show(session: common.Session) -> int:
    from nodewright.cli.plugin.cluster import read_state
    from nodewright.plan.policy import Compartments, NodeRef, resolve_compartments
    from nodewright.plan.rollout_input import matches_nodewright

    args = session.args
    state = await read_state(session.client)
    policy = state.policies.get(args.policy)
    if policy is None:
        invalid = state.invalid_policies.get(args.policy)
        if invalid is not None:
            raise common.NotFoundError(invalid.message)
        raise common.NotFoundError(f"DeploymentPolicy {args.policy!r} not found")
    users = sorted(n for n, m in state.nodewrights.items() if m.spec.deployment_policy == args.policy)
    per_nw: dict[str, Compartments] = {}
    for name in users:
        model = state.nodewrights[name]
        refs = [
            NodeRef(str(n["metadata"]["name"]), (n["metadata"].get("labels") or {}))
            for n in state.nodes
            if matches_nodewright(model, n)
        ]
        resolved = resolve_compartments(model, policy=policy, nodes=refs)
        if isinstance(resolved, Compartments):
            per_nw[name] = resolved
    any_resolved = next(iter(per_nw.values()), None)
    compartments: list[JSON] = []
    names = [c.name for c in policy.spec.compartments or []] + ["__default__"]
    for cname in names:
        spec_doc: JSON = {}
        if cname == "__default__":
            spec_doc = policy.spec.default.to_json_dict()
        else:
            spec_doc = next(c.to_json_dict() for c in policy.spec.compartments or [] if c.name == cname)
        described: JSON = {}
        if any_resolved is not None and cname in any_resolved.specs:
            spec = any_resolved.specs[cname]
            described = {
                "budgetText": spec.budget.describe(),
                "strategyText": spec.strategy.describe() if spec.strategy else "none (batch = ceiling)",
            }
        compartments.append(
            {
                "name": cname,
                "spec": spec_doc,
                **described,
                "nodewrights": {
                    nw: {"matched": len(r.members.get(cname, ())), "ceiling": r.ceiling(cname)}
                    for nw, r in per_nw.items()
                    if cname in r.specs
                },
            }
        )
    doc = {"policy": args.policy, "usedBy": users, "compartments": compartments}

    def render(wide: bool) -> str:
        rows = []
        for c in compartments:
            spec = c["spec"]
            selector = spec.get("selector")
            per = "; ".join(
                f"{nw}: {v['matched']} matched, ceiling {v['ceiling']}" for nw, v in c["nodewrights"].items()
            )
            rows.append(
                [
                    c["name"],
                    c.get("budgetText") or spec.get("budget"),
                    c.get("strategyText") or spec.get("strategy") or "none",
                    per or "-",
                    *([selector] if wide else []),
                ]
            )
        headers = ["compartment", "budget", "strategy", "nodewrights", *(["selector"] if wide else [])]
        head = f"DeploymentPolicy {args.policy}: used by {', '.join(users) or 'no NodeWright'}\n"
        return head + common.table(headers, rows)

    common.emit(args, doc, render)
    return common.OK


async def _reset(session: common.Session) -> int:
    from nodewright.cli.plugin.cluster import read_state
    from nodewright.cli.plugin.explain import analyse
    from nodewright.kube.resources import NODEWRIGHTS

    args = session.args
    state = await read_state(session.client)
    analysis = analyse(state, args.nodewright)
    known = sorted(analysis.plan.compartments)
    unknown = [c for c in args.compartment if c not in known]
    if unknown:
        raise common.NotFoundError(
            f"NodeWright {args.nodewright!r} has no compartment {', '.join(unknown)}"
            f" (compartments: {', '.join(known)})"
        )
    chosen = sorted(set(args.compartment)) or known
    halted = [h.compartment for h in analysis.plan.halts if h.compartment in chosen]
    value = ",".join(chosen) if args.compartment else "true"
    common.confirm(
        args,
        f"reset the batch state of {args.nodewright} in {', '.join(chosen)}"
        + (f" (resumes halted {', '.join(halted)})" if halted else "")
        + "?",
    )
    await session.patch(
        NODEWRIGHTS, args.nodewright, {"metadata": {"annotations": {constants.ANNOTATION_RESET_BATCH: value}}}
    )
    common.write_result(
        args,
        action="reset-batch-state",
        kind="NodeWright",
        name=args.nodewright,
        changed=True,
        detail=f"batch state reset requested for {', '.join(chosen)}"
        + (f"; halted compartments resume: {', '.join(halted)}" if halted else ""),
        extra={"compartments": chosen, "halted": halted},
    )
    return common.OK
