"""`history` and `undo`: a NodeWright's earlier specs, and going back to one through the API.

The operator keeps every accepted spec of a NodeWright as a revision (`apps/v1` ControllerRevisions in
its namespace, owned by the NodeWright, `spec.revisionHistoryLimit` of them besides the current one;
`plan.revisions`, `controller.revisions`). `history NW` lists them: number, when and by whom the spec
was changed (the field manager the API server recorded), the NodeWright generation, the packages, and
which one is current; `--revision N` prints that revision's spec.

`undo NW [--to-revision N]` writes the revision's spec back (default: the one before the current spec,
like `kubectl rollout undo`): an update of the NodeWright as read, with only `spec` replaced
(`revisionHistoryLimit` kept) and its resourceVersion as precondition, so a NodeWright changed since
it was read is not overwritten (exit 4, nothing written). It goes through admission like any edit, and
the operator rolls it out like any change -- batches, budgets, gates, a canary first (a spec that comes
back gets batches of its own: `plan.rollout_epoch`). What happens to each package is printed first
(`plan.wayback`): upgrades, downgrades (the lower version applied again; a higher version without
uninstall stays on the hosts), packages added or removed.

Refusals (exit 4, one line, nothing written): a NodeWright managed by Argo CD or Flux (revert in git;
`--force` undoes here anyway); a way back that downgrades or removes a package with
`uninstall.enabled` that the webhook refuses while it is installed (`--uninstall-first` writes the
first of two steps: the current spec with `uninstall.apply: true` on those packages; once that
completed, the same undo without the flag); an answer of admission refusing the spec (422). Exit 3
when the NodeWright or the revision does not exist or there is no earlier revision; exit 0 when the
revision is the current spec already.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from nodewright.cli.plugin import common

if TYPE_CHECKING:
    from nodewright.plan.revisions import Revision
    from nodewright.plan.wayback import WayBack

JSON = dict[str, Any]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    history = common.verb_parser(
        subparsers,
        "history",
        help="the revisions (earlier specs) of a NodeWright the operator keeps",
        description="List the revisions of a NodeWright: number, when and by whom the spec was changed,"
        " generation, packages, and the current one.\n\nThe operator records every accepted spec"
        " (spec.revisionHistoryLimit earlier ones are kept).",
        examples=[
            "kubectl nodewright history gpu-drivers",
            "kubectl nodewright history gpu-drivers --revision 3 -o yaml",
        ],
    )
    history.add_argument("nodewright", help="the NodeWright")
    history.add_argument("--revision", type=int, default=None, help="show this revision's spec")
    common.add_output_flag(history)
    common.add_cluster_flags(history)
    history.set_defaults(func=run, verb="history", prog=history.prog)

    undo = common.verb_parser(
        subparsers,
        "undo",
        help="roll a NodeWright back to an earlier revision, through batches and budgets",
        description="Write an earlier revision's spec back (default: the one before the current spec).\n\n"
        "The change goes through admission and rolls out like any other: batches, budgets, gates.",
        examples=[
            "kubectl nodewright undo gpu-drivers",
            "kubectl nodewright undo gpu-drivers --to-revision 3 --dry-run=server",
        ],
    )
    undo.add_argument("nodewright", help="the NodeWright")
    undo.add_argument("--to-revision", type=int, default=None, help="the revision to go back to")
    undo.add_argument(
        "--force", action="store_true", help="undo even when Argo CD or Flux manages the NodeWright"
    )
    undo.add_argument(
        "--uninstall-first",
        action="store_true",
        help="when the way back downgrades or removes an uninstall-enabled package: uninstall it first",
    )
    common.add_write_flags(undo, confirm=True)
    common.add_output_flag(undo, ("table", "json", "yaml"))
    common.add_cluster_flags(undo)
    undo.set_defaults(func=run, verb="undo", prog=undo.prog)


def run(args: argparse.Namespace) -> int:
    return common.run(args, _history if args.verb == "history" else _undo)


async def read(session: common.Session, name: str) -> tuple[JSON, list[Revision]]:
    """The NodeWright as stored and its revisions (oldest first)."""
    from nodewright.kube.resources import CONTROLLERREVISIONS, NODEWRIGHTS, NotFound
    from nodewright.plan.revisions import parse_revision, revision_selector

    try:
        obj = await session.client.get(NODEWRIGHTS, name)
    except NotFound:
        raise common.NotFoundError(f"NodeWright {name!r} not found") from None
    uid = str((obj.get("metadata") or {}).get("uid") or "")
    listed = await session.client.list(
        CONTROLLERREVISIONS, namespace=session.namespace, label_selector=revision_selector(name)
    )
    revisions = [r for item in listed.items if (r := parse_revision(item, owner_uid=uid)) is not None]
    return obj, sorted(revisions, key=lambda r: r.number)


# ----------------------------------------------------------------------------------------------------
# history


def history_document(name: str, obj: JSON, revisions: list[Revision]) -> JSON:
    from nodewright.plan.revisions import current_revision, spec_hash

    current = current_revision(revisions, current_hash=spec_hash(obj.get("spec") or {}))
    return {
        "nodewright": name,
        "generation": (obj.get("metadata") or {}).get("generation"),
        "current": current.number if current is not None else None,
        "revisions": [
            {
                "revision": r.number,
                "name": r.name,
                "current": current is not None and r.number == current.number,
                "generation": r.generation,
                "changedBy": r.change.manager if r.change else None,
                "operation": r.change.operation if r.change else None,
                "changedAt": r.change.time if r.change else None,
                "packages": r.packages,
            }
            for r in revisions
        ],
    }


def render_history(doc: JSON, wide: bool) -> str:
    rows = [
        [
            f"{r['revision']}{' *' if r['current'] else ''}",
            r["changedAt"] or "",
            (f"{r['changedBy']} ({r['operation']})" if r["operation"] else r["changedBy"]) or "unknown",
            r["generation"] if r["generation"] is not None else "",
            r["packages"],
            *([r["name"]] if wide else []),
        ]
        for r in doc["revisions"]
    ]
    headers = ["revision", "changed", "by", "generation", "packages", *(["object"] if wide else [])]
    text = common.table(headers, rows) if rows else f"NodeWright {doc['nodewright']!r} has no revisions\n"
    if doc["current"] is None:
        text += (
            f"the current spec (generation {doc['generation']}) is not recorded yet: the operator records"
            " it when it sees it\n"
        )
    return text


async def _history(session: common.Session) -> int:
    args = session.args
    obj, revisions = await read(session, args.nodewright)
    if args.revision is not None:
        wanted = next((r for r in revisions if r.number == args.revision), None)
        if wanted is None:
            have = ", ".join(str(r.number) for r in revisions) or "none"
            raise common.NotFoundError(
                f"NodeWright {args.nodewright!r} has no revision {args.revision} (revisions: {have})"
            )
        doc = {"revision": wanted.number, "name": wanted.name, "spec": dict(wanted.spec)}
        common.emit(args, doc, lambda _wide: _yaml({"spec": dict(wanted.spec)}))
        return common.OK
    doc = history_document(args.nodewright, obj, revisions)
    common.emit(args, doc, lambda wide: render_history(doc, wide))
    return common.OK


def _yaml(doc: JSON) -> str:
    import yaml

    return str(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))


# ----------------------------------------------------------------------------------------------------
# undo


def refuse_gitops(obj: JSON, name: str, *, force: bool) -> None:
    from nodewright.plan.wayback import gitops_manager

    managed = gitops_manager(obj.get("metadata") or {})
    if managed is not None and not force:
        raise common.Refused(managed.refusal(name))


def target_of(name: str, obj: JSON, revisions: list[Revision], to_revision: int | None) -> Revision | None:
    """The revision to write back; None when it is the current spec already (nothing to do)."""
    from nodewright.plan.revisions import UndoProblem, UndoRefusal, spec_hash, undo_target

    target = undo_target(
        name, revisions, current_hash=spec_hash(obj.get("spec") or {}), to_revision=to_revision
    )
    if isinstance(target, UndoRefusal):
        if target.problem is UndoProblem.CURRENT:
            return None
        raise common.NotFoundError(target.message)
    return target


def blocked_message(name: str, target: Revision, way: WayBack) -> str:
    what = "; ".join(c.describe() for c in way.blocking)
    return (
        f"undo of NodeWright {name!r} to revision {target.number} refused: {what} -- the webhook refuses"
        " that while the package is installed on any node. Run `kubectl nodewright undo"
        f" {name} --to-revision {target.number} --uninstall-first` to uninstall it first (through batches),"
        " then the same command without --uninstall-first once the NodeWright is complete"
    )


def new_object(obj: JSON, spec: JSON) -> JSON:
    """The NodeWright to PUT: as read (metadata and its resourceVersion kept), `spec` replaced, the
    current `revisionHistoryLimit` kept; managedFields and status left to the API server."""
    from nodewright.plan.revisions import LIMIT_FIELD

    body = {k: v for k, v in obj.items() if k != "status"}
    body["metadata"] = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    current = obj.get("spec") or {}
    body["spec"] = {**spec, **({LIMIT_FIELD: current[LIMIT_FIELD]} if LIMIT_FIELD in current else {})}
    return body


async def write(session: common.Session, body: JSON) -> None:
    """PUT honouring `--dry-run`; a conflict or an admission refusal is a refusal (exit 4)."""
    from nodewright.kube.resources import NODEWRIGHTS, ApiError, Conflict

    if session.dry_run == "client":
        return
    params = {"fieldManager": common.FIELD_MANAGER}
    if session.dry_run == "server":
        params["dryRun"] = "All"
    name = str(body["metadata"]["name"])
    try:
        await session.client.request(
            "PUT", NODEWRIGHTS.item_path(name), resource=NODEWRIGHTS.label, body=body, params=params
        )
    except Conflict:
        raise common.Refused(
            f"NodeWright {name!r} changed since it was read: nothing written; run the undo again"
        ) from None
    except ApiError as exc:
        if exc.status not in (400, 422):
            raise
        raise common.Refused(f"the API server refused the way back: {exc.message}") from None


async def _undo(session: common.Session) -> int:
    from nodewright.plan.wayback import uninstall_first_spec, way_back

    args = session.args
    name = args.nodewright
    obj, revisions = await read(session, name)
    refuse_gitops(obj, name, force=args.force)
    target = target_of(name, obj, revisions, args.to_revision)
    if target is None:
        common.write_result(
            args,
            action="undo",
            kind="NodeWright",
            name=name,
            changed=False,
            detail=f"is at revision {args.to_revision} already: nothing to undo",
        )
        return common.OK
    way = way_back(obj.get("spec") or {}, target.spec)
    if way.blocking and not args.uninstall_first:
        raise common.Refused(blocked_message(name, target, way))
    first_step = bool(way.blocking)
    spec = uninstall_first_spec(obj.get("spec") or {}, way) if first_step else dict(target.spec)
    changes = "; ".join(c.describe() for c in (way.blocking if first_step else way.moved)) or "no package"
    question = (
        f"uninstall {', '.join(c.name for c in way.blocking)} of NodeWright {name!r} (step 1 of the undo to"
        f" revision {target.number})?"
        if first_step
        else f"undo NodeWright {name!r} to revision {target.number} ({changes})?"
    )
    common.confirm(args, question)
    await write(session, new_object(obj, spec))
    detail = (
        f"step 1 of 2: uninstall of {', '.join(c.name for c in way.blocking)} rolls out now; once the"
        f" NodeWright is complete, run `kubectl nodewright undo {name} --to-revision {target.number}`"
        if first_step
        else f"undone to revision {target.number} ({target.packages}): {changes}; it rolls out through"
        " batches"
    )
    common.write_result(
        args,
        action="undo",
        kind="NodeWright",
        name=name,
        changed=True,
        detail=detail,
        extra={
            "revision": target.number,
            "step": "uninstall-first" if first_step else "undo",
            "changes": [
                {"package": c.name, "move": c.move.value, "from": c.current, "to": c.target}
                for c in way.changes
            ],
        },
    )
    return common.OK
