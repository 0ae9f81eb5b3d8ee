"""`package status|logs|rerun`: packages on the cluster (beside the authoring commands init, validate,
run and build of `nodewright.cli.package_cmd`, which share the `package` command).

- `status NW [PKG]`: nodes per version, stage and state (from the state annotations), and the failing
  nodes with their errors.
- `logs NW PKG --node N [--stage S] [--previous]`: the live pod's stage containers when the pod still
  exists; otherwise -- and always with `--previous` -- the log tail the operator kept of the stage's
  last failed attempt (`controller.logstore`: one ConfigMap per NodeWright and node in the operator
  namespace), so the failing step's output is there after the pod is gone.
- `rerun NW PKG [--nodes a,b]`: removes the package's entries from those nodes' state (each write
  guarded by the node's resourceVersion), so the package runs again from its first stage when the node
  is admitted -- through a batch, within the budget, like any other start of work; nodes where a pod of
  the package still runs are refused (exit 4). The plugin never creates package pods itself.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from typing import Any

from nodewright.api import constants
from nodewright.cli.plugin import common

JSON = dict[str, Any]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from nodewright.cli import package_cmd

    package_cmd.register(subparsers)
    parser = subparsers.choices["package"]
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))

    status = common.verb_parser(
        verbs,
        "status",
        help="nodes per version/stage/state of a NodeWright's packages, and the failing nodes",
        description="Per package version and stage: node counts by state; the nodes erroring and why.",
        examples=[
            "kubectl nodewright package status gpu-drivers",
            "kubectl nodewright package status gpu-drivers nvidia -o json",
        ],
    )
    status.add_argument("nodewright", help="the NodeWright")
    status.add_argument("package", nargs="?", help="one package (default: all)")
    common.add_output_flag(status)
    common.add_cluster_flags(status)
    status.set_defaults(func=lambda a: common.run(a, _status), prog=status.prog)

    logs = common.verb_parser(
        verbs,
        "logs",
        help="a package stage's output on a node, also after its pod is gone",
        description=__doc__.split("\n\n")[1] if __doc__ else "",
        examples=[
            "kubectl nodewright package logs gpu-drivers nvidia --node gpu-node-0007",
            "kubectl nodewright package logs gpu-drivers nvidia --node gpu-node-0007 --stage apply"
            " --previous",
        ],
    )
    logs.add_argument("nodewright", help="the NodeWright")
    logs.add_argument("package", help="the package")
    logs.add_argument("--node", required=True, help="the node")
    logs.add_argument(
        "--stage", default=None, help="one stage (apply, config, interrupt, post-interrupt, ...)"
    )
    logs.add_argument("--previous", action="store_true", help="the kept log of the last failed attempt")
    logs.add_argument("--tail", type=int, default=200, help="lines of a live pod's log (default 200)")
    common.add_output_flag(logs, ("table", "json", "yaml"))
    common.add_cluster_flags(logs)
    logs.set_defaults(func=lambda a: common.run(a, _logs), prog=logs.prog)

    rerun = common.verb_parser(
        verbs,
        "rerun",
        help="run a package again on nodes, through the batches",
        description=__doc__.split("\n\n")[1] if __doc__ else "",
        examples=[
            "kubectl nodewright package rerun gpu-drivers nvidia --nodes gpu-node-0007,gpu-node-0008 -y",
        ],
    )
    rerun.add_argument("nodewright", help="the NodeWright")
    rerun.add_argument("package", help="the package")
    rerun.add_argument(
        "--nodes", default=None, help="comma-separated nodes (default: every node with the package)"
    )
    common.add_write_flags(rerun, confirm=True)
    common.add_output_flag(rerun, ("table", "json", "yaml"))
    common.add_cluster_flags(rerun)
    rerun.set_defaults(func=lambda a: common.run(a, _rerun), prog=rerun.prog)


async def _status(session: common.Session) -> int:
    from nodewright.api.nodeobject import try_node_state
    from nodewright.cli.plugin.cluster import read_state
    from nodewright.plan.rollout_input import matches_nodewright

    args = session.args
    state = await read_state(session.client)
    model = state.nodewright(args.nodewright)
    if args.package and args.package not in model.spec.packages:
        raise common.NotFoundError(f"NodeWright {args.nodewright!r} has no package {args.package!r}")
    counts: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    failing: list[JSON] = []
    untouched = 0
    for node in state.nodes:
        if not matches_nodewright(model, node):
            continue
        node_state, error = try_node_state(node, args.nodewright)
        name = str(node["metadata"]["name"])
        if error is not None:
            failing.append({"node": name, "package": None, "version": None, "stage": None, "error": error})
            continue
        entries = [
            e
            for e in (node_state.packages if node_state else ())
            if not args.package or e.name == args.package
        ]
        if not entries:
            untouched += 1
        for e in entries:
            counts[(e.name, e.version)][f"{e.stage.value}/{e.state.value}"] += 1
            if e.state.value == "erroring":
                failing.append(
                    {
                        "node": name,
                        "package": e.name,
                        "version": e.version,
                        "stage": e.stage.value,
                        "error": e.error,
                        "attempts": e.attempts,
                    }
                )
    packages: list[JSON] = [
        {
            "package": pkg,
            "version": version,
            "specVersion": model.spec.packages[pkg].version if pkg in model.spec.packages else None,
            "counts": dict(sorted(c.items())),
            "nodes": sum(c.values()),
        }
        for (pkg, version), c in sorted(counts.items())
    ]
    doc = {"nodewright": args.nodewright, "packages": packages, "notStarted": untouched, "failing": failing}

    def render(wide: bool) -> str:
        rows = [
            [
                p["package"],
                p["version"] + ("" if p["version"] == p["specVersion"] else " (not in spec)"),
                p["nodes"],
                ", ".join(f"{k} {v}" for k, v in p["counts"].items()),
            ]
            for p in packages
        ]
        text = (
            common.table(["package", "version", "nodes", "stage/state"], rows)
            if rows
            else "no package entries yet\n"
        )
        text += f"nodes without an entry yet: {untouched}\n"
        if failing:
            text += "failing nodes:\n"
            for f in failing[: None if wide else 10]:
                what = f"{f['package']}:{f['version']} {f['stage']}" if f["package"] else "state unreadable"
                text += f"  {f['node']}: {what}: {f['error'][: None if wide else 160]}\n"
        return text

    common.emit(args, doc, render)
    return common.OK


def _pod_sort_key(pod: JSON) -> tuple[str, int]:
    meta = pod.get("metadata") or {}
    attempt = (meta.get("annotations") or {}).get(constants.POD_ANNOTATION_ATTEMPT) or "0"
    return str(meta.get("creationTimestamp") or ""), int(attempt) if attempt.isdigit() else 0


async def _logs(session: common.Session) -> int:
    from urllib.parse import quote

    from nodewright.cli.plugin.cluster import package_pods
    from nodewright.controller.configmaps import CONFIGMAPS
    from nodewright.controller.logstore import kept_logs, stage_containers, store_name
    from nodewright.kube.resources import ApiError, NotFound

    args = session.args
    ns = session.namespace
    entries: list[JSON] = []
    source = "kept"
    if not args.previous:
        pods = [
            p
            for p in await package_pods(session.client, ns, nodewright=args.nodewright, node=args.node)
            if (p["metadata"].get("labels") or {}).get(constants.POD_LABEL_PACKAGE) == args.package
            and (
                args.stage is None
                or (p["metadata"].get("labels") or {}).get(constants.POD_LABEL_STAGE) == args.stage
            )
        ]
        if pods:
            pod = max(pods, key=_pod_sort_key)
            meta = pod["metadata"]
            source = "pod"
            for container in stage_containers(pod, args.package):
                path = f"/api/v1/namespaces/{quote(ns, safe='')}/pods/{quote(str(meta['name']), safe='')}/log"
                try:
                    text = await session.client.get_text(
                        path,
                        params={"container": container, "tailLines": str(args.tail)},
                        timeout=args.request_timeout,
                    )
                except ApiError as exc:
                    text = f"(no log: {exc.message})"
                entries.append(
                    {
                        "pod": meta["name"],
                        "container": container,
                        "stage": (meta.get("labels") or {}).get(constants.POD_LABEL_STAGE),
                        "attempt": (meta.get("annotations") or {}).get(constants.POD_ANNOTATION_ATTEMPT),
                        "outcome": "running"
                        if (pod.get("status") or {}).get("phase") in ("Pending", "Running")
                        else str((pod.get("status") or {}).get("phase")),
                        "log": text,
                    }
                )
    if not entries:
        source = "kept"
        try:
            cm = await session.client.get(CONFIGMAPS, store_name(args.nodewright, args.node), namespace=ns)
        except NotFound:
            cm = None
        for kept in kept_logs(cm):
            if kept.package != args.package or (args.stage and kept.stage != args.stage):
                continue
            entries.append(
                {
                    "pod": kept.pod,
                    "container": kept.container,
                    "stage": kept.stage,
                    "version": kept.version,
                    "attempt": kept.attempt,
                    "outcome": kept.outcome,
                    "exitCode": kept.exit_code,
                    "reason": kept.reason,
                    "at": kept.at,
                    "message": kept.message,
                    "image": kept.image or None,
                    "log": kept.log,
                }
            )
        if not entries:
            where = f"stage {args.stage} of " if args.stage else ""
            raise common.NotFoundError(
                f"no pod and no kept log for {where}package {args.package!r} of {args.nodewright!r} on node"
                f" {args.node!r} (the operator keeps the last failed attempt of each stage)"
            )
    doc = {
        "nodewright": args.nodewright,
        "package": args.package,
        "node": args.node,
        "source": source,
        "entries": entries,
    }

    def render(_wide: bool) -> str:
        parts = []
        for e in entries:
            if source == "pod":
                head = (
                    f"==> pod {e['pod']} container {e['container']} (stage {e['stage']},"
                    f" attempt {e['attempt']}, {e['outcome']}) <=="
                )
            else:
                code = f", exit code {e['exitCode']}" if e.get("exitCode") is not None else ""
                code += f", {e['reason']}" if e.get("reason") else ""
                image = f", image {e['image']}" if e.get("image") else ""
                head = (
                    f"==> kept log: {e['stage']} {e['outcome']} at {e['at']} (version {e['version']}, attempt"
                    f" {e['attempt']}, pod {e['pod']}, container {e['container']}{image}{code}; the pod is"
                    " gone) <=="
                )
            # No log: a pull error (no container ran) or a simulated pod; the message says why.
            body = e["log"] or f"(no log lines) {e.get('message') or 'no message either'}"
            parts.append(head + "\n" + body.rstrip("\n"))
        return "\n".join(parts) + "\n"

    common.emit(args, doc, render)
    return common.OK


async def _rerun(session: common.Session) -> int:
    from dataclasses import replace

    from nodewright.api.nodestate import MalformedNodeState, decode, encode
    from nodewright.cli.plugin.cluster import read_state
    from nodewright.cli.plugin.node_verbs import _guarded_patch, _running_pods

    args = session.args
    state = await read_state(session.client)
    model = state.nodewright(args.nodewright)
    if args.package not in model.spec.packages:
        raise common.NotFoundError(f"NodeWright {args.nodewright!r} has no package {args.package!r}")
    key = constants.state_annotation(args.nodewright)
    wanted = [n.strip() for n in args.nodes.split(",") if n.strip()] if args.nodes else None
    nodes = [state.node(n) for n in wanted] if wanted else state.nodes
    plans: list[tuple[JSON, str]] = []
    results: list[JSON] = []
    for node in nodes:
        name = str(node["metadata"]["name"])
        text = (node["metadata"].get("annotations") or {}).get(key)
        try:
            node_state = decode(text) if text else None
        except MalformedNodeState as exc:
            results.append({"node": name, "result": "refused", "why": f"state unreadable: {exc}"})
            continue
        if node_state is None or not node_state.entries_for(args.package):
            if wanted:
                results.append(
                    {
                        "node": name,
                        "result": "skipped",
                        "why": "no entry of the package (it runs when admitted)",
                    }
                )
            continue
        kept = tuple(e for e in node_state.packages if e.name != args.package)
        plans.append((node, encode(replace(node_state, packages=kept))))
    if not plans and not results:
        raise common.NotFoundError(f"no node has an entry of package {args.package!r} of {args.nodewright!r}")
    if plans:
        common.confirm(args, f"re-run package {args.package} of {args.nodewright} on {len(plans)} node(s)?")
    for node, new_text in plans:
        name = str(node["metadata"]["name"])
        running = await _running_pods(session, args.nodewright, name, args.package)
        if running:
            results.append(
                {"node": name, "result": "refused", "why": f"pod(s) still running: {', '.join(running[:3])}"}
            )
            continue
        try:
            await _guarded_patch(session, node, {"metadata": {"annotations": {key: new_text}}})
        except common.Refused as exc:
            results.append({"node": name, "result": "refused", "why": str(exc)})
            continue
        results.append(
            {
                "node": name,
                "result": "rerun",
                "why": "entries removed: it runs again when the node is admitted",
            }
        )
    refused = [r for r in results if r["result"] == "refused"]
    doc = {
        "nodewright": args.nodewright,
        "package": args.package,
        "dryRun": session.dry_run,
        "nodes": results,
    }
    common.emit(
        args,
        doc,
        lambda _w: common.table(
            ["node", "result", "why"], [[r["node"], r["result"], r["why"]] for r in results]
        ),
    )
    if refused:
        print(f"{common.prog_of(args)}: {len(refused)} node(s) refused", file=sys.stderr)
        return common.REFUSED
    return common.OK
