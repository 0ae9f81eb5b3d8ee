"""`approve`: open the approval gate (`pauseAfterBatch`) of a compartment that waits for a person.

A compartment whose DeploymentPolicy lists batch `k` in `pauseAfterBatch` stops after batch `k` has
settled: its nodes wait with reason `AwaitingApproval`, and the NodeWright status shows
`compartmentStatuses.<c>.awaitingApproval: k`. `approve` reads that number and writes it to the
annotation `nodewright.io/approve` (`<compartment>=<batch>`, comma-separated for several). The rollout
controller records the approval in the batch state (`approvedBatch`) and removes it from the
annotation, so an approval opens exactly the gate it names, never a later one. Without
`--compartment`, every compartment waiting for approval is approved.

The canary workflow: `pauseAfterBatch: [1]` with `initialBatch: 1`, watch the first node, approve,
and the strategy speeds up.
"""

from __future__ import annotations

import argparse

from nodewright.cli.plugin import common
from nodewright.plan.rollout import APPROVE_ANNOTATION, format_approvals, parse_approvals


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = common.verb_parser(
        subparsers,
        "approve",
        help="let a compartment waiting at a pauseAfterBatch gate open its next batch",
        description="Approve the batch a compartment waits at (status awaitingApproval).\n\n"
        f"Writes annotation {APPROVE_ANNOTATION}=<compartment>=<batch>; the operator consumes it.",
        examples=[
            "kubectl nodewright approve gpu-drivers",
            "kubectl nodewright approve gpu-drivers --compartment zone-a",
        ],
    )
    parser.add_argument("nodewright", help="the NodeWright")
    parser.add_argument(
        "--compartment", action="append", default=None, help="only this compartment (repeatable)"
    )
    common.add_write_flags(parser, confirm=False)
    common.add_output_flag(parser, ("table", "json", "yaml"))
    common.add_cluster_flags(parser)
    parser.set_defaults(func=run, prog=parser.prog)


def run(args: argparse.Namespace) -> int:
    return common.run(args, _run)


def gates_to_approve(status: dict[str, object], wanted: list[str] | None) -> dict[str, int]:
    """compartment -> batch awaiting approval, from a NodeWright status (restricted to `wanted`)."""
    compartments = status.get("compartmentStatuses") or {}
    assert isinstance(compartments, dict)
    out: dict[str, int] = {}
    for name, entry in compartments.items():
        batch = entry.get("awaitingApproval") if isinstance(entry, dict) else None
        if isinstance(batch, int) and (wanted is None or name in wanted):
            out[str(name)] = batch
    return out


def unknown_compartments(wanted: list[str] | None, known: set[str]) -> list[str]:
    """The names in `--compartment` that are not compartments of the NodeWright (typos)."""
    return sorted({name for name in wanted or () if name not in known})


async def known_compartments(session: common.Session, obj: dict[str, object]) -> set[str]:
    """Compartments of a NodeWright: those of its DeploymentPolicy (and the default one), and any its
    status reports (a policy edited since still has them there until the operator's next pass)."""
    from nodewright.api.constants import DEFAULT_COMPARTMENT
    from nodewright.kube.resources import DEPLOYMENTPOLICIES, NotFound

    status = obj.get("status")
    compartments = (status.get("compartmentStatuses") if isinstance(status, dict) else None) or {}
    known = {DEFAULT_COMPARTMENT, *(str(name) for name in compartments)}
    spec = obj.get("spec")
    policy_name = spec.get("deploymentPolicy") if isinstance(spec, dict) else None
    if policy_name:
        try:
            policy = await session.client.get(DEPLOYMENTPOLICIES, str(policy_name))
        except NotFound:
            return known
        for entry in (policy.get("spec") or {}).get("compartments") or []:
            if isinstance(entry, dict) and entry.get("name"):
                known.add(str(entry["name"]))
    return known


async def _run(session: common.Session) -> int:
    from nodewright.kube.resources import NODEWRIGHTS, NotFound

    args = session.args
    try:
        obj = await session.client.get(NODEWRIGHTS, args.nodewright)
    except NotFound:
        raise common.NotFoundError(f"NodeWright {args.nodewright!r} not found") from None
    if args.compartment:
        known = await known_compartments(session, obj)
        if typos := unknown_compartments(args.compartment, known):
            raise common.NotFoundError(
                f"NodeWright {args.nodewright!r} has no compartment {', '.join(map(repr, typos))}"
                f" (its compartments: {', '.join(sorted(known))})"
            )
    gates = gates_to_approve(obj.get("status") or {}, args.compartment)
    if not gates:
        where = f" in {', '.join(args.compartment)}" if args.compartment else ""
        common.write_result(
            args,
            action="approve",
            kind="NodeWright",
            name=args.nodewright,
            changed=False,
            detail=f"no compartment{where} waits for approval",
        )
        return common.OK
    meta = obj.get("metadata") or {}
    approvals = parse_approvals((meta.get("annotations") or {}).get(APPROVE_ANNOTATION))
    approvals.update(gates)
    body = {
        "metadata": {
            "annotations": {APPROVE_ANNOTATION: format_approvals(approvals)},
            "resourceVersion": meta.get("resourceVersion"),
        }
    }
    await session.patch(NODEWRIGHTS, args.nodewright, body)
    done = ", ".join(f"{c} after batch {b}" for c, b in sorted(gates.items()))
    common.write_result(
        args,
        action="approve",
        kind="NodeWright",
        name=args.nodewright,
        changed=True,
        detail=f"approved {done}",
        extra={"approved": gates},
    )
    return common.OK
