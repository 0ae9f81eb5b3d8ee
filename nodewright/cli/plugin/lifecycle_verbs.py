"""`pause`, `resume`, `disable`, `enable`: the NodeWright annotations that stop and start a rollout.

- pause (`nodewright.io/pause=true`): no node is admitted or started; pods running keep running and are
  recorded, cordons are kept (the rollout is frozen in place). Visible as status `paused`, condition
  `Paused`, the `RolloutPaused` Event and `why` on every waiting node.
- disable (`nodewright.io/disable=true`): nodes are left alone; once its pods have finished a node's
  cordon is released, so a disabled NodeWright holds no node out of service.
- resume / enable remove the annotation. Deleting a paused or disabled NodeWright waits (condition and
  Event `DeletionBlocked`) until it is resumed or enabled.

One JSON merge patch of `metadata.annotations` (idempotent: pausing a paused NodeWright changes
nothing and says so).
"""

from __future__ import annotations

import argparse

from nodewright.api import constants
from nodewright.cli.plugin import common

VERBS = {
    "pause": (
        constants.ANNOTATION_PAUSE,
        "true",
        "paused",
        "stop admitting nodes (running work continues, cordons kept)",
    ),
    "resume": (constants.ANNOTATION_PAUSE, None, "resumed", "undo pause: nodes are admitted again"),
    "disable": (
        constants.ANNOTATION_DISABLE,
        "true",
        "disabled",
        "leave every node alone (cordons released once its pods finish)",
    ),
    "enable": (constants.ANNOTATION_DISABLE, None, "enabled", "undo disable"),
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for verb, (annotation, value, _done, help_text) in VERBS.items():
        parser = common.verb_parser(
            subparsers,
            verb,
            help=help_text,
            description=f"{help_text.capitalize()}.\n\n"
            + (f"Sets annotation {annotation}={value}." if value else f"Removes annotation {annotation}."),
            examples=[
                f"kubectl nodewright {verb} gpu-drivers",
                f"kubectl nodewright {verb} gpu-drivers --dry-run=server -o json",
            ],
        )
        parser.add_argument("nodewright", help="the NodeWright")
        common.add_write_flags(parser, confirm=False)
        common.add_output_flag(parser, ("table", "json", "yaml"))
        common.add_cluster_flags(parser)
        parser.set_defaults(func=run, verb=verb, prog=parser.prog)


def run(args: argparse.Namespace) -> int:
    return common.run(args, _run)


async def _run(session: common.Session) -> int:
    from nodewright.kube.resources import NODEWRIGHTS, NotFound

    args = session.args
    annotation, value, done, _ = VERBS[args.verb]
    try:
        obj = await session.client.get(NODEWRIGHTS, args.nodewright)
    except NotFound:
        raise common.NotFoundError(f"NodeWright {args.nodewright!r} not found") from None
    current = (obj.get("metadata", {}).get("annotations") or {}).get(annotation)
    is_set = current is not None and current.lower() in ("true", "1", "yes")
    if is_set == (value is not None):
        common.write_result(
            args,
            action=args.verb,
            kind="NodeWright",
            name=args.nodewright,
            changed=False,
            detail=f"already {done}",
        )
        return common.OK
    await session.patch(NODEWRIGHTS, args.nodewright, {"metadata": {"annotations": {annotation: value}}})
    common.write_result(
        args, action=args.verb, kind="NodeWright", name=args.nodewright, changed=True, detail=done
    )
    return common.OK
