"""`nodewright uninstall`: take NodeWright off a cluster and leave nothing of it behind (the Helm chart's
pre-delete hook runs it; docs/install.md).

What NodeWright leaves on a cluster, and how each piece goes:

1. **NodeWrights** carry the operator's finalizer, so once the operator is gone `kubectl delete nw` (and
   with it `kubectl delete crd`) would hang. Every NodeWright is deleted first; while the operator still
   runs it uninstalls the `uninstall.enabled` packages of a NodeWright being deleted, so
   `--wait-for-package-uninstall` gives it that long to finish and release them itself.
2. **The operator is stopped** (`--operator-deployment`: scaled to 0 through `deployments/scale`, then
   the command waits until none of its pods is left), so no reconcile writes behind the cleanup.
3. **Finalizers** of the NodeWrights still there are released (a merge patch with the resourceVersion
   it read; a conflict is re-read and retried). Only our finalizer is removed, never anyone else's.
4. **DeploymentPolicies** are deleted once no NodeWright refers to them (the webhook refuses earlier),
   and **DisruptionBudgets** with them: their status holds slots of NodeWrights that are gone now.
5. **Nodes**: every key the operator writes is removed -- labels `nodewright.io/status.<nw>`, annotations
   `nodewright.io/state.<nw>`, `timing.<nw>`, `batch.<nw>`, `auto-tainted` (and the reserved
   `cordoned-by`), conditions of type `nodewright.io/<nw>` (strategic merge `$patch: delete` on
   `nodes/status`, so the kubelet's conditions are untouched) and the runtime-required taint. The node is
   uncordoned only when a state annotation records that NodeWright cordoned it (`cd` in the node-state
   codec); someone else's cordon stays, and so does a cordon next to a state that cannot be decoded
   (reported: it cannot tell who cordoned). The label `nodewright.io/ignore` is the admin's, not ours,
   and stays. Taints are a list a merge patch replaces whole, so the patch carries the node's
   resourceVersion and a 409 re-reads the node.
6. **The operator namespace**: package pods and package ConfigMaps (label `nodewright.io/managed-by`),
   the pod-signing Secret, the webhook's certificate Secret and the leader-election Lease.

Events are left to expire (the API server deletes them after an hour). Package files stay on the hosts
unless the operator uninstalled them in step 1. Every request has a deadline (the client's); the whole
run has `--timeout`. The exit status is 0 when nothing of ours is left (a kept cordon is reported, not an
error), 1 when something could not be removed -- also when the API server cannot be reached (refused,
reset, a request past its deadline, after the client's retries): one line on stderr then, naming the
server and how far the run got -- and 2 for bad flags or a kubeconfig that does not load.
Progress goes to stdout, errors to stderr (`nodewright uninstall: error: ...`).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from nodewright.cli import flags, output
from nodewright.cli.flags import UsageError

if TYPE_CHECKING:
    from nodewright.kube.client import KubeClient

PROG = "nodewright uninstall"
SIGNING_SECRET: Final = "nodewright-operator-signing-key"  # controller.signing.SIGNING_SECRET_NAME
POLL_SECONDS: Final = 1.0

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration(text: str) -> float:
    """Seconds of a Go duration (`0s`, `90s`, `5m`, `1h30m`), the format Helm values use."""
    if text == "0":
        return 0.0
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: write e.g. 0s, 90s, 5m or 1h30m")
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "uninstall",
        help="remove NodeWright from the cluster: NodeWrights, finalizers, node keys and cordons, leftovers",
    )
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster config)")
    parser.add_argument(
        "--namespace", type=flags.dns_label, default="nodewright-system", help="the operator's namespace"
    )
    parser.add_argument(
        "--operator-deployment",
        type=flags.dns_subdomain,
        default=None,
        help="Deployment of the operator in --namespace: scaled to 0 before nodes are released",
    )
    parser.add_argument(
        "--lease-name", type=flags.dns_subdomain, default="nodewright-operator", help="leader-election Lease"
    )
    parser.add_argument(
        "--webhook-secret-name",
        type=flags.dns_subdomain,
        default="nodewright-webhook-tls",
        help="Secret with the webhook's CA and serving certificate",
    )
    parser.add_argument(
        "--runtime-required-taint",
        type=flags.taint,
        default="nodewright.io/runtime-required=true:NoSchedule",
        help="the operator's runtime-required taint (its key is removed from every node)",
    )
    parser.add_argument(
        "--wait-for-package-uninstall",
        type=go_duration,
        default=0.0,
        metavar="DURATION",
        help="how long the running operator may uninstall packages of the deleted NodeWrights first"
        " (default 0s: release at once)",
    )
    parser.add_argument(
        "--timeout", type=go_duration, default=300.0, metavar="DURATION", help="deadline of the whole run"
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would be removed; change nothing")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nodewright.cli.plugin.common import _configure_quiet_logging

    _configure_quiet_logging()  # the hook's log is its report: the client's debug lines would bury it
    return flags.run_against_cluster(PROG, args, _main)


async def _main(args: argparse.Namespace, config: Any) -> int:
    import aiohttp

    from nodewright.kube.client import KubeClient
    from nodewright.kube.resources import ApiError

    options = Options(
        namespace=args.namespace,
        operator_deployment=args.operator_deployment,
        lease_name=args.lease_name,
        webhook_secret=args.webhook_secret_name,
        taint_key=flags_taint_key(args.runtime_required_taint),
        wait_for_package_uninstall=args.wait_for_package_uninstall,
        dry_run=args.dry_run,
    )
    async with KubeClient(config, qps=20.0, burst=40, timeout=20.0) as client:
        report = Report()
        try:
            async with asyncio.timeout(args.timeout) as deadline:
                await Uninstaller(client, options, report).run()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            if not isinstance(exc, TimeoutError) or not deadline.expired():
                return unreachable(config.server, exc, changed=len(report.lines), dry_run=args.dry_run)
            report.problem(f"not finished within --timeout ({args.timeout:g}s)")
        except ApiError as exc:
            if exc.status in (401, 403):
                raise UsageError(
                    f"{exc.status} {exc.reason}: {flags.one_line(exc.message)}; the uninstall needs the RBAC"
                    " of helm/nodewright/templates/uninstall-hook.yaml"
                ) from None
            report.problem(f"API error: {exc}")
    output.say(report.summary(dry_run=args.dry_run))
    return 1 if report.problems else 0


def unreachable(server: str, exc: BaseException, *, changed: int, dry_run: bool) -> int:
    """One line on stderr for an API server that cannot be reached (after the client's retries); exit 1."""
    done = (
        "nothing was changed"
        if changed == 0 or dry_run
        else f"{changed} object(s) were changed before; run it again to finish (every step is idempotent)"
    )
    why = flags.one_line(exc) or type(exc).__name__
    print(
        f"{PROG}: cannot reach the API server {server} ({why}): {done}; check --kubeconfig and that the API"
        " server is up",
        file=sys.stderr,
        flush=True,
    )
    return 1


def flags_taint_key(taint: str) -> str:
    return taint.rpartition(":")[0].partition("=")[0]


# ----------------------------------------------------------------------------------------------------
# What to remove from a node (pure)

JSONDict = dict[str, Any]


@dataclass(frozen=True)
class NodeCleanup:
    """The writes that release one node; empty when nothing of ours is on it."""

    labels: tuple[str, ...] = ()
    annotations: tuple[str, ...] = ()
    conditions: tuple[str, ...] = ()
    taints: tuple[JSONDict, ...] | None = None  # the node's taints without ours; None: unchanged
    uncordon: bool = False
    kept_cordon: str | None = None  # why a cordon stays although a state of ours is on the node

    @property
    def empty(self) -> bool:
        writes = self.labels or self.annotations or self.conditions or self.uncordon
        return not writes and self.taints is None

    def metadata_patch(self, resource_version: str) -> JSONDict | None:
        """One merge patch for labels, annotations, taints and the cordon (None: nothing to patch)."""
        patch: JSONDict = {}
        metadata: JSONDict = {}
        if self.labels:
            metadata["labels"] = dict.fromkeys(self.labels)
        if self.annotations:
            metadata["annotations"] = dict.fromkeys(self.annotations)
        spec: JSONDict = {}
        if self.taints is not None:
            spec["taints"] = list(self.taints) or None
        if self.uncordon:
            spec["unschedulable"] = None  # omitempty, as `kubectl uncordon` leaves it
        if not metadata and not spec:
            return None
        if self.taints is not None:
            metadata["resourceVersion"] = resource_version  # the list is replaced whole
        if metadata:
            patch["metadata"] = metadata
        if spec:
            patch["spec"] = spec
        return patch

    def describe(self) -> str:
        parts = []
        if self.labels:
            parts.append(f"{len(self.labels)} label(s)")
        if self.annotations:
            parts.append(f"{len(self.annotations)} annotation(s)")
        if self.conditions:
            parts.append(f"{len(self.conditions)} condition(s)")
        if self.taints is not None:
            parts.append("the runtime-required taint")
        text = "removed " + ", ".join(parts) if parts else "nothing removed"
        if self.uncordon:
            text += "; uncordoned"
        return text


_OWNED_ANNOTATION_PREFIXES: Final = ("state.", "timing.", "batch.")
_OWNED_ANNOTATIONS: Final = ("auto-tainted", "cordoned-by")


def node_cleanup(node: Mapping[str, Any], *, taint_key: str) -> NodeCleanup:
    """What to remove from `node` so that nothing NodeWright wrote is left on it."""
    from nodewright.api import constants, nodestate

    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    spec = node.get("spec") or {}
    prefix = constants.PREFIX
    owned_labels = tuple(sorted(k for k in labels if k.startswith(constants.STATUS_LABEL_PREFIX)))
    owned_annotations = tuple(
        sorted(
            k
            for k in annotations
            if k.startswith(prefix)
            and (
                k.removeprefix(prefix).startswith(_OWNED_ANNOTATION_PREFIXES)
                or k.removeprefix(prefix) in _OWNED_ANNOTATIONS
            )
        )
    )
    conditions = tuple(
        sorted(
            str(c.get("type"))
            for c in (node.get("status") or {}).get("conditions") or ()
            if str(c.get("type") or "").startswith(constants.NODE_CONDITION_PREFIX)
        )
    )
    taints = spec.get("taints") or []
    kept_taints = tuple(t for t in taints if t.get("key") != taint_key)
    cordoned_by_us, unreadable = False, []
    for key in owned_annotations:
        if not key.startswith(constants.STATE_ANNOTATION_PREFIX):
            continue
        try:
            cordoned_by_us = nodestate.decode(annotations[key]).cordoned or cordoned_by_us
        except nodestate.MalformedNodeState:
            unreadable.append(key)
    unschedulable = bool(spec.get("unschedulable"))
    uncordon = unschedulable and cordoned_by_us
    kept = None
    if unschedulable and not cordoned_by_us and unreadable:
        kept = (
            f"cordon kept: {', '.join(unreadable)} cannot be decoded, so it is unknown whether NodeWright"
            " cordoned the node; uncordon it by hand if it did"
        )
    return NodeCleanup(
        labels=owned_labels,
        annotations=owned_annotations,
        conditions=conditions,
        taints=kept_taints if len(kept_taints) != len(taints) else None,
        uncordon=uncordon,
        kept_cordon=kept,
    )


# ----------------------------------------------------------------------------------------------------
# The run


@dataclass(frozen=True)
class Options:
    namespace: str
    operator_deployment: str | None = None
    lease_name: str = "nodewright-operator"
    webhook_secret: str = "nodewright-webhook-tls"
    taint_key: str = "nodewright.io/runtime-required"
    wait_for_package_uninstall: float = 0.0
    dry_run: bool = False
    # How long NodeWrights may take to disappear once our finalizer is gone (others' finalizers may hold
    # them, which is reported).
    gone_within: float = 30.0


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    emit: Callable[[str], None] = field(default=output.say)
    emit_error: Callable[[str], None] = field(
        default=lambda line: output.say(f"{PROG}: {line}", stream=sys.stderr)
    )

    def say(self, line: str) -> None:
        self.lines.append(line)
        self.emit(line)

    def note(self, line: str) -> None:
        self.notes.append(line)
        self.emit(f"note: {line}")

    def problem(self, line: str) -> None:
        self.problems.append(line)
        self.emit_error(f"error: {line}")

    def summary(self, *, dry_run: bool) -> str:
        what = "would change" if dry_run else "changed"
        head = f"uninstall {'(dry run) ' if dry_run else ''}{what} {len(self.lines)} object(s)"
        if self.problems:
            return f"{head}; {len(self.problems)} problem(s): " + "; ".join(self.problems)
        return f"{head}; nothing of NodeWright is left" + (
            f" ({len(self.notes)} note(s) above)" if self.notes else ""
        )


class Uninstaller:
    def __init__(self, client: KubeClient, options: Options, report: Report) -> None:
        self.client = client
        self.options = options
        self.report = report

    async def listed(self, resource: Any, **kwargs: Any) -> list[JSONDict]:
        """The objects of `resource`; none when the API server does not serve it (CRDs not installed)."""
        from nodewright.kube.resources import NotFound

        try:
            return (await self.client.list(resource, **kwargs)).items
        except NotFound:
            return []

    async def run(self) -> None:
        opts = self.options
        await self.delete_nodewrights()
        if opts.wait_for_package_uninstall > 0 and not opts.dry_run:
            await self.wait_for_nodewrights(opts.wait_for_package_uninstall)
        if opts.operator_deployment:
            await self.stop_operator(opts.operator_deployment)
        await self.release_finalizers()
        await self.delete_policies()
        await self.release_nodes()
        await self.delete_namespace_objects()

    # -- NodeWrights and policies ------------------------------------------------------------------

    async def delete_nodewrights(self) -> None:
        from nodewright.kube.resources import NODEWRIGHTS, NotFound

        for obj in await self.listed(NODEWRIGHTS):
            name = str(obj["metadata"]["name"])
            if obj["metadata"].get("deletionTimestamp"):
                continue
            if not self.options.dry_run:
                try:
                    await self.client.delete(NODEWRIGHTS, name)
                except NotFound:
                    continue
            self.report.say(f"NodeWright {name}: deleted")

    async def wait_for_nodewrights(self, seconds: float) -> None:
        from nodewright.kube.resources import NODEWRIGHTS

        deadline = time.monotonic() + seconds
        while True:
            left = [str(o["metadata"]["name"]) for o in await self.listed(NODEWRIGHTS)]
            if not left:
                return
            if time.monotonic() >= deadline:
                self.report.note(
                    f"{len(left)} NodeWright(s) not finished uninstalling packages within"
                    f" --wait-for-package-uninstall ({seconds:g}s): {', '.join(sorted(left)[:10])};"
                    " they are released as they are (package files stay on those hosts)"
                )
                return
            await asyncio.sleep(min(POLL_SECONDS * 5, max(0.0, deadline - time.monotonic())))

    async def stop_operator(self, deployment: str) -> None:
        from nodewright.kube.resources import PODS, NotFound, Resource

        deployments = Resource("apps", "v1", "deployments", True, "Deployment")
        namespace = self.options.namespace
        try:
            current = await self.client.get(deployments, deployment, namespace=namespace)
        except NotFound:
            self.report.note(f"Deployment {namespace}/{deployment} not found: no operator to stop")
            return
        match = ((current.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
        if not self.options.dry_run and (current.get("spec") or {}).get("replicas") != 0:
            await self.client.patch(
                deployments, deployment, {"spec": {"replicas": 0}}, namespace=namespace, subresource="scale"
            )
        self.report.say(f"Deployment {namespace}/{deployment}: scaled to 0 replicas")
        if self.options.dry_run or not selector:
            return
        while pods := (await self.client.list(PODS, namespace=namespace, label_selector=selector)).items:
            names = ", ".join(sorted(str(p["metadata"]["name"]) for p in pods)[:5])
            self.report.emit(f"waiting for {len(pods)} operator pod(s) to stop: {names}")
            await asyncio.sleep(POLL_SECONDS * 2)

    async def release_finalizers(self) -> None:
        from nodewright.api import constants
        from nodewright.kube.resources import NODEWRIGHTS, Conflict, NotFound

        for obj in await self.listed(NODEWRIGHTS):
            name = str(obj["metadata"]["name"])
            for _attempt in range(5):
                meta = obj["metadata"]
                finalizers = list(meta.get("finalizers") or [])
                if constants.FINALIZER not in finalizers:
                    break
                if self.options.dry_run:
                    self.report.say(f"NodeWright {name}: finalizer released")
                    break
                kept = [f for f in finalizers if f != constants.FINALIZER]
                patch = {"metadata": {"finalizers": kept or None, "resourceVersion": meta["resourceVersion"]}}
                try:
                    await self.client.patch(NODEWRIGHTS, name, patch)
                except NotFound:
                    break
                except Conflict:
                    try:
                        obj = await self.client.get(NODEWRIGHTS, name)
                    except NotFound:
                        break
                    continue
                self.report.say(f"NodeWright {name}: finalizer released")
                break
            else:
                self.report.problem(f"NodeWright {name}: finalizer not released (kept changing)")
        if self.options.dry_run:
            return
        deadline = time.monotonic() + self.options.gone_within
        while left := await self.listed(NODEWRIGHTS):
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(POLL_SECONDS)
        for obj in left:
            others = [f for f in obj["metadata"].get("finalizers") or [] if f != constants.FINALIZER]
            self.report.problem(
                f"NodeWright {obj['metadata']['name']} still exists"
                + (f" (finalizers of others: {', '.join(others)})" if others else "")
            )

    async def delete_policies(self) -> None:
        from nodewright.kube.resources import DEPLOYMENTPOLICIES, DISRUPTIONBUDGETS, ApiError, NotFound

        for resource, kind in (
            (DEPLOYMENTPOLICIES, "DeploymentPolicy"),
            (DISRUPTIONBUDGETS, "DisruptionBudget"),
        ):
            for obj in await self.listed(resource):
                name = str(obj["metadata"]["name"])
                if not self.options.dry_run:
                    try:
                        await self.client.delete(resource, name)
                    except NotFound:
                        continue
                    except ApiError as exc:
                        if exc.status in (401, 403):
                            raise
                        reason = flags.one_line(exc.message)
                        self.report.problem(f"{kind} {name}: not deleted: {reason}")
                        continue
                self.report.say(f"{kind} {name}: deleted")

    # -- nodes -------------------------------------------------------------------------------------

    async def release_nodes(self) -> None:
        from nodewright.kube.resources import NODES

        for node in (await self.client.list(NODES)).items:
            await self.release_node(node)

    async def release_node(self, node: JSONDict) -> None:
        from nodewright.kube.client import PatchType
        from nodewright.kube.resources import NODES, Conflict, NotFound

        name = str(node["metadata"]["name"])
        for _attempt in range(5):
            cleanup = node_cleanup(node, taint_key=self.options.taint_key)
            if cleanup.kept_cordon:
                self.report.note(f"node {name}: {cleanup.kept_cordon}")
            if cleanup.empty:
                return
            if self.options.dry_run:
                self.report.say(f"node {name}: {cleanup.describe()}")
                return
            try:
                if cleanup.conditions:
                    deletes = [{"type": t, "$patch": "delete"} for t in cleanup.conditions]
                    node = await self.client.patch(
                        NODES,
                        name,
                        {"status": {"conditions": deletes}},
                        patch_type=PatchType.STRATEGIC,
                        subresource="status",
                    )
                patch = cleanup.metadata_patch(str(node["metadata"].get("resourceVersion") or ""))
                if patch is not None:
                    await self.client.patch(NODES, name, patch, patch_type=PatchType.MERGE)
            except NotFound:
                return
            except Conflict:
                try:
                    node = await self.client.get(NODES, name)
                except NotFound:
                    return
                continue
            self.report.say(f"node {name}: {cleanup.describe()}")
            return
        self.report.problem(f"node {name}: not released (it kept changing)")

    # -- the operator namespace --------------------------------------------------------------------

    async def delete_namespace_objects(self) -> None:
        from nodewright.api import constants
        from nodewright.controller.configmaps import CONFIGMAPS
        from nodewright.kube.resources import LEASES, PODS, SECRETS, Resource

        namespace = self.options.namespace
        selector = f"{constants.POD_OWNER_LABEL}={constants.POD_OWNER_VALUE}"
        for resource, kind in ((PODS, "Pod"), (CONFIGMAPS, "ConfigMap")):
            for obj in (await self.client.list(resource, namespace=namespace, label_selector=selector)).items:
                await self._delete(resource, kind, str(obj["metadata"]["name"]))
        named: Iterable[tuple[Resource, str, str]] = (
            (SECRETS, "Secret", SIGNING_SECRET),
            (SECRETS, "Secret", self.options.webhook_secret),
            (LEASES, "Lease", self.options.lease_name),
        )
        for resource, kind, name in named:
            await self._delete(resource, kind, name)

    async def _delete(self, resource: Any, kind: str, name: str) -> None:
        from nodewright.kube.resources import ApiError, NotFound

        namespace = self.options.namespace
        try:
            if self.options.dry_run:
                await self.client.get(resource, name, namespace=namespace)
            else:
                await self.client.delete(resource, name, namespace=namespace)
        except NotFound:
            return
        except ApiError as exc:
            if not (self.options.dry_run and exc.status == 403):
                raise
            self.report.say(f"{kind} {namespace}/{name}: deleted if present (cannot read it: 403)")
            return
        self.report.say(f"{kind} {namespace}/{name}: deleted")
