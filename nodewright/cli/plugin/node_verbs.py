"""`node list|status|ignore|unignore|reset|retry`: the nodes of a NodeWright, and targeted recovery.

Recovery goes through the normal admission and never around the budget:

- **retry** removes the node's admission annotation `nodewright.io/batch.<nw>`. The rollout re-admits
  the node in a later batch, within its compartment's ceiling (it waits `BudgetFull` while the slots
  are taken; `why` says so), and then every erroring package of the NodeWright on the node starts a
  fresh series of attempts (each erroring entry records the admission it gave up under, and the new
  one differs). `--package P` retries P only: it is refused when other packages are erroring on the
  node too, since the fresh admission restarts them all.
- **reset** deletes the state annotation `nodewright.io/state.<nw>` (and the node controller's timing
  annotation): the node starts over through a batch. A state that says this NodeWright cordoned the node
  is the only record of that cordon, so a reset of such a node is refused unless `--uncordon` is given,
  which uncordons it in the same write (it is cordoned again when re-admitted). `--package P` removes
  only P's entries from the state (decoded and re-encoded with `nodewright.api.nodestate`), keeping
  the rest, the cordon record included.
- Both refuse while a package pod of the NodeWright (of P, with `--package`) still runs on the node,
  and every write carries the node's resourceVersion: if the node changed since it was read (the
  operator wrote meanwhile), the API server refuses it and nothing changes (exit 4; run again).
- **ignore / unignore** set or remove the label `nodewright.io/ignore=true`: the operator starts nothing
  on an ignored node (status `blocked`), for every NodeWright.

The plugin never creates package pods: only the operator's signed pods may change a node's state
(docs/trust.md).
"""

from __future__ import annotations

import argparse
from typing import Any

from nodewright.api import constants
from nodewright.cli.plugin import common

JSON = dict[str, Any]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    node = subparsers.add_parser(
        "node", help="nodes of a NodeWright: list, status, ignore, unignore, reset, retry"
    )
    node.set_defaults(func=common.show_help(node))
    verbs = node.add_subparsers(dest="node_command", metavar="COMMAND")

    lst = common.verb_parser(
        verbs,
        "list",
        help="per node: status, stage, attempts, compartment, batch, why waiting",
        description="The nodes of one or every NodeWright, with what the rollout planner says about each.",
        examples=[
            "kubectl nodewright node list gpu-drivers",
            "kubectl nodewright node list -l topology.kubernetes.io/zone=zone-a -o wide",
        ],
    )
    lst.add_argument("nodewright", nargs="?", help="one NodeWright (default: all)")
    lst.add_argument("-l", "--selector", default=None, help="label selector restricting the nodes shown")
    common.add_output_flag(lst)
    common.add_cluster_flags(lst)
    lst.set_defaults(func=lambda a: common.run(a, _list), prog=lst.prog)

    status = common.verb_parser(
        verbs,
        "status",
        help="every NodeWright's packages, stages and attempts on one node",
        description="Every NodeWright's activity on a node: status, packages, cordon, admission, why.",
        examples=["kubectl nodewright node status gpu-node-0007 -o json"],
    )
    status.add_argument("node", help="the node")
    common.add_output_flag(status)
    common.add_cluster_flags(status)
    status.set_defaults(func=lambda a: common.run(a, _status), prog=status.prog)

    for verb, value in (("ignore", "true"), ("unignore", None)):
        p = common.verb_parser(
            verbs,
            verb,
            help=("exclude the node from every NodeWright" if value else "undo ignore"),
            description=(
                f"Sets label {constants.LABEL_IGNORE}=true"
                if value
                else f"Removes label {constants.LABEL_IGNORE}"
            )
            + ": the operator starts nothing on an ignored node.",
            examples=[f"kubectl nodewright node {verb} gpu-node-0007"],
        )
        p.add_argument("node", help="the node")
        common.add_write_flags(p, confirm=False)
        common.add_output_flag(p, ("table", "json", "yaml"))
        common.add_cluster_flags(p)
        p.set_defaults(func=lambda a: common.run(a, _ignore), label_value=value, verb=verb, prog=p.prog)

    reset = common.verb_parser(
        verbs,
        "reset",
        help="start the node over through a batch (delete its state, or one package's entries)",
        description=__doc__.split("\n\n")[1] if __doc__ else "",
        examples=[
            "kubectl nodewright node reset gpu-node-0007 gpu-drivers -y",
            "kubectl nodewright node reset gpu-node-0007 gpu-drivers --package nvidia-driver -y",
            "kubectl nodewright node reset gpu-node-0007 gpu-drivers --uncordon --dry-run=server",
        ],
    )
    reset.add_argument("node", help="the node")
    reset.add_argument(
        "nodewright", nargs="?", help="the NodeWright (default: the only one with state there)"
    )
    reset.add_argument("--package", default=None, help="reset only this package's entries")
    reset.add_argument(
        "--uncordon",
        action="store_true",
        help="uncordon the node if this NodeWright's state says it cordoned it",
    )
    common.add_write_flags(reset, confirm=True)
    common.add_output_flag(reset, ("table", "json", "yaml"))
    common.add_cluster_flags(reset)
    reset.set_defaults(func=lambda a: common.run(a, _reset), prog=reset.prog)

    retry = common.verb_parser(
        verbs,
        "retry",
        help="re-admit an erroring node through a later batch (within the budget)",
        description=__doc__.split("\n\n")[1] if __doc__ else "",
        examples=[
            "kubectl nodewright node retry gpu-node-0007 gpu-drivers -y",
            "kubectl nodewright node retry gpu-node-0007 --package nvidia-driver -y -o json",
        ],
    )
    retry.add_argument("node", help="the node")
    retry.add_argument("nodewright", nargs="?", help="the NodeWright (default: the only one erroring there)")
    retry.add_argument(
        "--package", default=None, help="retry only this package (refused if others are erroring)"
    )
    common.add_write_flags(retry, confirm=True)
    common.add_output_flag(retry, ("table", "json", "yaml"))
    common.add_cluster_flags(retry)
    retry.set_defaults(func=lambda a: common.run(a, _retry), prog=retry.prog)


# ----------------------------------------------------------------------------------------------------
# Reads


async def _list(session: common.Session) -> int:
    from nodewright.cli.plugin.cluster import read_state
    from nodewright.cli.plugin.explain import analyse, explain
    from nodewright.kube.resources import NODES

    args = session.args
    state = await read_state(session.client)
    shown: set[str] | None = None
    if args.selector:
        listed = await session.client.list(NODES, label_selector=args.selector)
        shown = {str(n["metadata"]["name"]) for n in listed.items}
    names = [args.nodewright] if args.nodewright else sorted(state.nodewrights)
    rows: list[JSON] = []
    for name in names:
        analysis = analyse(state, name)
        for node in sorted(analysis.entries):
            if shown is not None and node not in shown:
                continue
            exp = explain(analysis, node)
            rows.append(exp.to_json())

    def render(wide: bool) -> str:
        headers = ["node", "nodewright", "status", "stage", "attempts", "compartment", "batch", "why"]
        body = [
            [
                r["node"],
                r["nodewright"],
                r["status"],
                r["stage"] or "-",
                r["attempts"] or "",
                r["compartment"] or "",
                r["batch"] or "",
                r["reason"] + (f": {r['summary']}" if wide else ""),
            ]
            for r in rows
        ]
        return common.table(headers, body) if rows else "no nodes\n"

    common.emit(args, {"nodes": rows}, render)
    return common.OK


async def _status(session: common.Session) -> int:
    from nodewright.cli.plugin.cluster import read_state
    from nodewright.cli.plugin.why_verbs import explain_node
    from nodewright.plan.rollout_input import matches_nodewright

    args = session.args
    state = await read_state(session.client)
    node = state.node(args.node)
    annotations = node["metadata"].get("annotations") or {}
    involved = sorted(
        n
        for n, m in state.nodewrights.items()
        if matches_nodewright(m, node) or constants.state_annotation(n) in annotations
    )
    answers = {a["nodewright"]: a for a in await explain_node(session, state, args.node, involved)}
    doc = {
        "node": args.node,
        "unschedulable": bool((node.get("spec") or {}).get("unschedulable")),
        "ignored": (node["metadata"].get("labels") or {}).get(constants.LABEL_IGNORE) == "true",
        "nodewrights": [
            _node_nodewright_doc(node, name, state.nodewrights[name], answers.get(name)) for name in involved
        ],
    }
    common.emit(args, doc, lambda wide: _render_node_status(doc, wide))
    return common.OK


def _node_nodewright_doc(node: JSON, name: str, model: Any, why: JSON | None) -> JSON:
    """What one NodeWright holds on the node: selection, status label, admission, packages, why."""
    from nodewright.api.nodeobject import node_admission, try_node_state
    from nodewright.plan.rollout_input import matches_nodewright

    node_state, error = try_node_state(node, name)
    admission = node_admission(node, name)
    return {
        "nodewright": name,
        "selected": matches_nodewright(model, node),
        "status": (node["metadata"].get("labels") or {}).get(constants.status_label(name)),
        "stateError": error,
        "cordonedByThis": bool(node_state and node_state.cordoned),
        "admission": (
            {
                "compartment": admission.compartment,
                "batch": admission.batch,
                "order": admission.order,
                "consumed": admission.consumed,
                "at": admission.at,
            }
            if admission
            else None
        ),
        "packages": [
            {
                "package": e.name,
                "version": e.version,
                "stage": e.stage.value,
                "state": e.state.value,
                "attempts": e.attempts,
                "error": e.error,
                "image": e.image,
            }
            for e in (node_state.packages if node_state else ())
        ],
        "why": why,
    }


def _render_node_status(doc: JSON, wide: bool) -> str:
    lines = [
        f"node {doc['node']}: {'cordoned' if doc['unschedulable'] else 'schedulable'}"
        + (", ignored" if doc["ignored"] else "")
    ]
    if not doc["nodewrights"]:
        lines.append("no NodeWright selects this node or has state on it")
    for d in doc["nodewrights"]:
        lines.append("")
        lines.extend(_render_node_nodewright(d, wide))
    return "\n".join(lines) + "\n"


def _render_node_nodewright(d: JSON, wide: bool) -> list[str]:
    adm = d["admission"]
    lines = [
        f"{d['nodewright']}: {d['status'] or 'waiting (untouched)'}"
        + ("" if d["selected"] else " (no longer selected)")
        + (", cordoned by it" if d["cordonedByThis"] else "")
        + (
            f", admitted batch {adm['batch']} of {adm['compartment']}"
            + (" (used)" if adm["consumed"] else "")
            if adm
            else ""
        )
    ]
    if d["stateError"]:
        lines.append(f"  state unreadable: {d['stateError']}")
    if d["why"]:
        lines.append(f"  why: {d['why']['reason']}: {d['why']['summary']}")
    if d["packages"]:
        headers = [
            "package",
            "version",
            "stage",
            "state",
            "attempts",
            *(["image", "error"] if wide else ["error"]),
        ]
        rows = [
            [
                p["package"],
                p["version"],
                p["stage"],
                p["state"],
                p["attempts"],
                *([p["image"]] if wide else []),
                (p["error"] or "")[: None if wide else 80],
            ]
            for p in d["packages"]
        ]
        lines.extend("  " + line for line in common.table(headers, rows).rstrip("\n").split("\n"))
    return lines


# ----------------------------------------------------------------------------------------------------
# Writes


async def _read_node(session: common.Session, name: str) -> JSON:
    from nodewright.kube.resources import NODES, NotFound

    try:
        return await session.client.get(NODES, name)
    except NotFound:
        raise common.NotFoundError(f"node {name!r} not found") from None


def _pick_nodewright(node: JSON, given: str | None, *, wanted: str) -> str:
    """The NodeWright a node verb acts on: given, or the only one with state on the node."""
    if given:
        return given
    annotations = node["metadata"].get("annotations") or {}
    names = sorted(
        k[len(constants.STATE_ANNOTATION_PREFIX) :]
        for k in annotations
        if k.startswith(constants.STATE_ANNOTATION_PREFIX)
    )
    if len(names) == 1:
        return str(names[0])
    found = ", ".join(names) if names else "none"
    raise common.UsageProblem(
        f"name the NodeWright to {wanted} on node {node['metadata']['name']!r} (state of: {found})"
    )


async def _running_pods(
    session: common.Session, nodewright: str, node: str, package: str | None
) -> list[str]:
    from nodewright.cli.plugin.cluster import package_pods
    from nodewright.plan import drain as drain_mod

    pods = await package_pods(session.client, session.namespace, nodewright=nodewright, node=node)
    running = []
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        if package is not None and labels.get(constants.POD_LABEL_PACKAGE) != package:
            continue
        statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
        finished = bool(statuses) and all((s.get("state") or {}).get("terminated") for s in statuses)
        if not drain_mod.is_finished(pod) and not finished:
            running.append(str(pod["metadata"]["name"]))
    return running


async def _guarded_patch(session: common.Session, node: JSON, body: JSON) -> None:
    """A node merge patch that applies only to the node as read (resourceVersion precondition)."""
    from nodewright.kube.resources import NODES, Conflict

    meta = body.setdefault("metadata", {})
    meta["resourceVersion"] = node["metadata"]["resourceVersion"]
    try:
        await session.patch(NODES, str(node["metadata"]["name"]), body)
    except Conflict:
        raise common.Refused(
            f"node {node['metadata']['name']!r} changed since it was read (the operator wrote meanwhile);"
            " nothing changed: run the command again"
        ) from None


async def _ignore(session: common.Session) -> int:
    from nodewright.kube.resources import NODES

    args = session.args
    node = await _read_node(session, args.node)
    current = (node["metadata"].get("labels") or {}).get(constants.LABEL_IGNORE)
    if (current == "true") == (args.label_value is not None):
        common.write_result(
            args, action=args.verb, kind="Node", name=args.node, changed=False, detail=f"already {args.verb}d"
        )
        return common.OK
    await session.patch(
        NODES, args.node, {"metadata": {"labels": {constants.LABEL_IGNORE: args.label_value}}}
    )
    common.write_result(
        args, action=args.verb, kind="Node", name=args.node, changed=True, detail=f"{args.verb}d"
    )
    return common.OK


async def _reset(session: common.Session) -> int:
    from nodewright.api.nodestate import MalformedNodeState, decode, encode

    args = session.args
    node = await _read_node(session, args.node)
    nw = _pick_nodewright(node, args.nodewright, wanted="reset")
    annotations = node["metadata"].get("annotations") or {}
    key = constants.state_annotation(nw)
    text = annotations.get(key)
    if text is None:
        raise common.NotFoundError(f"node {args.node!r} has no state of NodeWright {nw!r} (nothing to reset)")
    running = await _running_pods(session, nw, args.node, args.package)
    if running:
        raise common.Refused(
            f"package pod(s) of {nw!r} still run on {args.node!r}: {', '.join(running[:5])}; wait until they"
            " finish (pause the NodeWright to start nothing new meanwhile)"
        )
    try:
        state = decode(text)
    except MalformedNodeState as exc:
        state = None
        if args.package:
            raise common.Refused(
                f"the state of {nw!r} on {args.node!r} cannot be read ({exc}); reset it whole"
            ) from None
    timing_key = f"{constants.PREFIX}timing.{nw}"
    body: JSON = {"metadata": {"annotations": {}}}
    uncordon = False
    if args.package:
        assert state is not None
        kept = tuple(e for e in state.packages if e.name != args.package)
        if len(kept) == len(state.packages):
            raise common.NotFoundError(
                f"no entry of package {args.package!r} in the state of {nw!r} on {args.node!r}"
            )
        from dataclasses import replace

        new_text = encode(replace(state, packages=kept))
        body["metadata"]["annotations"][key] = new_text
        what = (
            f"package {args.package} of {nw} reset (its entries removed; it runs again when the node is"
            " admitted)"
        )
    else:
        cordoned = state is not None and state.cordoned
        if cordoned and not args.uncordon:
            raise common.Refused(
                f"the state of {nw!r} says it cordoned {args.node!r}; after a reset that cordon is no"
                " longer known as its own. Pass --uncordon to uncordon the node in the same write (it is"
                " cordoned again when"
                " re-admitted), or uncordon it yourself afterwards"
            )
        body["metadata"]["annotations"][key] = None
        if timing_key in annotations:
            body["metadata"]["annotations"][timing_key] = None
        if cordoned:
            body["spec"] = {"unschedulable": False}
            uncordon = True
        what = f"{nw} reset: the node starts over through a batch" + (" (uncordoned)" if uncordon else "")
    common.confirm(
        args, f"reset {'package ' + args.package + ' of ' if args.package else ''}{nw} on node {args.node}?"
    )
    await _guarded_patch(session, node, body)
    common.write_result(
        args,
        action="reset",
        kind="Node",
        name=args.node,
        changed=True,
        detail=what,
        extra={"nodewright": nw, "package": args.package, "uncordoned": uncordon},
    )
    return common.OK


async def _retry(session: common.Session) -> int:
    from nodewright.api.admission import admission_annotation
    from nodewright.api.nodestate import MalformedNodeState, PackageState, decode

    args = session.args
    node = await _read_node(session, args.node)
    annotations = node["metadata"].get("annotations") or {}
    nw = args.nodewright
    if not nw:
        erroring = [
            k[len(constants.STATE_ANNOTATION_PREFIX) :]
            for k, v in annotations.items()
            if k.startswith(constants.STATE_ANNOTATION_PREFIX) and '"erroring"' in v
        ]
        nw = erroring[0] if len(erroring) == 1 else _pick_nodewright(node, None, wanted="retry")
    text = annotations.get(constants.state_annotation(nw))
    if text is None:
        raise common.NotFoundError(f"node {args.node!r} has no state of NodeWright {nw!r} (nothing to retry)")
    try:
        state = decode(text)
    except MalformedNodeState as exc:
        raise common.Refused(
            f"the state of {nw!r} on {args.node!r} cannot be read ({exc}): reset it instead"
        ) from None
    erroring = sorted({e.name for e in state.packages if e.state is PackageState.ERRORING})
    if not erroring:
        raise common.Refused(f"nothing of {nw!r} is erroring on {args.node!r}: there is nothing to retry")
    if args.package:
        if args.package not in erroring:
            raise common.NotFoundError(
                f"package {args.package!r} of {nw!r} is not erroring on {args.node!r}"
                f" (erroring: {', '.join(erroring)})"
            )
        others = [p for p in erroring if p != args.package]
        if others:
            raise common.Refused(
                f"{', '.join(others)} {'is' if len(others) == 1 else 'are'} erroring on {args.node!r} too,"
                " and a fresh admission retries every erroring package: retry without --package, or reset"
                f" {others[0]} first"
            )
    key = admission_annotation(nw)
    if key not in annotations:
        common.write_result(
            args,
            action="retry",
            kind="Node",
            name=args.node,
            changed=False,
            detail="already waiting to be re-admitted through a batch",
            extra={"nodewright": nw, "packages": erroring},
        )
        return common.OK
    common.confirm(args, f"retry {', '.join(erroring)} of {nw} on node {args.node} through a later batch?")
    await _guarded_patch(session, node, {"metadata": {"annotations": {key: None}}})
    common.write_result(
        args,
        action="retry",
        kind="Node",
        name=args.node,
        changed=True,
        detail=f"admission of {nw} removed: re-admitted in a later batch within the budget, then"
        f" {', '.join(erroring)} restart",
        extra={"nodewright": nw, "packages": erroring},
    )
    return common.OK
