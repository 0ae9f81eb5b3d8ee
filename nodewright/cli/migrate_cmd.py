"""`nodewright migrate`: take a cluster over from the reference operator (Skyhook) without re-running
finished work and without leaking its cordons (docs/migration.md).

It reads the reference objects (`skyhooks` and `deploymentpolicies` of `skyhook.nvidia.com`), the nodes
and the reference's per-package ConfigMaps, translates them (nodewright.plan.migration, pure) and prints
the plan: objects to create, node states to write, cordons and taints handed over, and everything that
does not translate one to one. Nothing is written without `--apply`.

`--apply` refuses while the reference operator could still act: a Deployment running its image (or
named after it) with replicas, or reference package pods still running on nodes. Two operators
writing node state and cordons at once is exactly the race a migration must not have. It also refuses
while an object cannot be translated, and while fields would be dropped unless
`--allow-dropped-fields` says that is intended.

Order of the writes, so that our operator (running or not) never acts on a half-migrated cluster:
1. DeploymentPolicies (our admission webhook requires a referenced policy to exist).
2. Node states, each node in one merge patch that carries the resourceVersion it was computed from (a
   409 re-reads the node and computes again): `nodewright.io/state.<nw>`, the taint hand-over, the
   ignore label. No NodeWright exists yet, so nothing plans these nodes.
3. NodeWrights, paused or disabled when the Skyhook was. Our operator's first plan of a node already
   sees its migrated state; and its own state writes carry resourceVersion preconditions, so even a
   plan made from a stale cache cannot overwrite a migrated state.
A re-run is idempotent: objects it created (annotation `nodewright.io/migrated-from`) are left alone
(edited since or not), a node state already there is never overwritten (the operator may have moved
on), and an object of ours of the same name that migrate did not create is an error naming it.

Exit status: 0 plan printed or applied, 1 refused, a write failed or the API server unreachable, 2 bad
flags or kubeconfig. The plan goes to stdout, every error to stderr (`nodewright migrate: error: ...`).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from nodewright.cli import flags, output
from nodewright.cli.flags import UsageError

if TYPE_CHECKING:
    from nodewright.api.models import NodeWright
    from nodewright.kube.client import KubeClient
    from nodewright.plan.migration import NodeExtras, NodeTranslation, ObjectTranslation, TaintSpec

PROG = "nodewright migrate"
JSONDict = dict[str, Any]
_OPERATOR_HINT: Final = re.compile(r"skyhook[^/]*operator|skyhook/operator|operator[^/]*skyhook")

REMOVAL_STEPS: Final = """\
Removing the reference operator (after `nodewright migrate --apply` succeeded):
  1. keep it stopped: kubectl -n <its namespace> scale deployment <its deployment> --replicas=0
  2. drop its webhooks (they refuse every Skyhook write while it is down):
       kubectl delete validatingwebhookconfiguration skyhook-operator-validating-webhook
       kubectl delete mutatingwebhookconfiguration skyhook-operator-mutating-webhook
  3. release its finalizer and delete its objects (their pods and ConfigMaps go with them):
       kubectl get skyhooks -o name | xargs -r -I{} kubectl patch {} --type=merge \\
         -p '{"metadata":{"finalizers":null}}'
       kubectl delete skyhooks --all; kubectl delete deploymentpolicies.skyhook.nvidia.com --all
  4. helm uninstall <its release> (or delete its namespace), then
       kubectl delete crd skyhooks.skyhook.nvidia.com deploymentpolicies.skyhook.nvidia.com
The reference's node annotations, labels and conditions (skyhook.nvidia.com/...) are left in place:
NodeWright never reads them after the migration; docs/migration.md shows how to remove them."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "migrate",
        help="take over from the reference operator (Skyhook): objects, node states, cordons (dry run)",
    )
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster config)")
    parser.add_argument("--apply", action="store_true", help="write the plan (default: only print it)")
    parser.add_argument(
        "--allow-dropped-fields",
        action="store_true",
        help="apply although fields NodeWright does not know would be dropped (they are listed)",
    )
    parser.add_argument(
        "--runtime-required-taint",
        type=flags.taint,
        default="nodewright.io/runtime-required=true:NoSchedule",
        help="our operator's runtime-required taint (replaces the reference's on migrated nodes)",
    )
    parser.add_argument(
        "--reference-runtime-taint",
        type=flags.taint,
        default="skyhook.nvidia.com=runtime-required:NoSchedule",
        help="the reference operator's RUNTIME_REQUIRED_TAINT",
    )
    parser.add_argument(
        "--timeout", type=flags.float_above(0.0), default=300.0, metavar="SECONDS", help="deadline of the run"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return flags.run_against_cluster(PROG, args, _main)


async def _main(args: argparse.Namespace, config: Any) -> int:
    import aiohttp

    from nodewright.kube.client import KubeClient
    from nodewright.kube.resources import ApiError
    from nodewright.plan.migration import TaintSpec

    options = Options(
        apply=args.apply,
        allow_dropped=args.allow_dropped_fields,
        our_taint=TaintSpec.parse(args.runtime_required_taint),
        reference_taint=TaintSpec.parse(args.reference_runtime_taint),
    )
    async with KubeClient(config, qps=20.0, burst=40, timeout=20.0) as client:
        migrator = Migrator(client, options)
        try:
            async with asyncio.timeout(args.timeout):
                return await migrator.run()
        except TimeoutError:
            migrator.error(
                f"timed out (--timeout {args.timeout:g}s, or an API request's deadline); run it again to"
                " continue: every step is idempotent"
            )
        except aiohttp.ClientError as exc:
            migrator.error(f"cannot reach the API server: {flags.one_line(exc)}; check --kubeconfig")
        except ApiError as exc:
            if exc.status in (401, 403):
                raise UsageError(
                    f"{exc.status} {exc.reason}: {flags.one_line(exc.message)}; migrate needs to read"
                    " skyhooks, nodes, deployments, pods and configmaps and to write nodes, nodewrights"
                    " and deploymentpolicies"
                ) from None
            migrator.error(f"API error: {flags.one_line(exc)}")
    return 1


# ----------------------------------------------------------------------------------------------------
# The run


@dataclass(frozen=True)
class Options:
    apply: bool
    allow_dropped: bool
    our_taint: TaintSpec
    reference_taint: TaintSpec


@dataclass(frozen=True)
class Migrated:
    """A Skyhook that translated, with what its node states need."""

    source: JSONDict
    translation: ObjectTranslation
    model: NodeWright
    applied_configs: Mapping[str, Mapping[str, str]]
    config_updates: Mapping[str, Sequence[str]]


@dataclass
class NodeWrite:
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[JSONDict] | None = None
    lines: list[str] = field(default_factory=list)

    def patch(self, resource_version: str) -> JSONDict | None:
        if not self.annotations and not self.labels and self.taints is None:
            return None
        meta: JSONDict = {"resourceVersion": resource_version}
        if self.annotations:
            meta["annotations"] = self.annotations
        if self.labels:
            meta["labels"] = self.labels
        patch: JSONDict = {"metadata": meta}
        if self.taints is not None:
            patch["spec"] = {"taints": self.taints}
        return patch


def _reference(plural: str) -> Any:
    from nodewright.kube.resources import Resource
    from nodewright.plan.migration import REFERENCE_GROUP

    kind = "Skyhook" if plural == "skyhooks" else "DeploymentPolicy"
    return Resource(REFERENCE_GROUP, "v1alpha1", plural, False, kind)


class Migrator:
    def __init__(self, client: KubeClient, options: Options) -> None:
        self.client = client
        self.options = options
        self.problems: list[str] = []

    def say(self, line: str) -> None:
        output.say(line)

    def error(self, line: str) -> None:
        """A problem: on stderr (the plan stays on stdout), and the run's exit status becomes 1."""
        self.problems.append(line)
        output.say(f"{PROG}: error: {line}", stream=sys.stderr)

    async def listed(self, resource: Any, **kwargs: Any) -> list[JSONDict]:
        from nodewright.kube.resources import NotFound

        try:
            return (await self.client.list(resource, **kwargs)).items
        except NotFound:
            return []

    # -- reading -------------------------------------------------------------------------------------

    async def blockers(self) -> list[str]:
        """Why the reference operator may still act: a running Deployment of it, or its pods."""
        from nodewright.kube.resources import PODS, ApiError, Resource

        out = []
        deployments = Resource("apps", "v1", "deployments", True, "Deployment")
        try:
            for dep in await self.listed(deployments):
                meta, spec = dep["metadata"], dep.get("spec") or {}
                containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
                images = [str(c.get("image") or "") for c in containers]
                name = str(meta.get("name") or "")
                if not (_OPERATOR_HINT.search(name.lower()) or any(_OPERATOR_HINT.search(i) for i in images)):
                    continue
                replicas = spec.get("replicas", 1)
                running = (dep.get("status") or {}).get("replicas") or 0
                if replicas or running:
                    out.append(
                        f"Deployment {meta.get('namespace')}/{name} of the reference operator has"
                        f" {max(int(replicas or 0), int(running))} replica(s): scale it to 0 first"
                        f" (kubectl -n {meta.get('namespace')} scale deployment {name} --replicas=0)"
                    )
        except ApiError as exc:
            if exc.status != 403:
                raise
            self.say("note: cannot list Deployments (403): make sure the reference operator is stopped")
        pods = await self.listed(PODS, label_selector="skyhook.nvidia.com/name")
        live = [
            p
            for p in pods
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and not p["metadata"].get("deletionTimestamp")
        ]
        if live:
            names = ", ".join(
                sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in live)[:5]
            )
            out.append(
                f"{len(live)} reference package pod(s) still exist ({names}): with the reference operator"
                " stopped, delete them once their work is over (their nodes restart that stage under"
                " NodeWright)"
            )
        return out

    async def applied_configs(self) -> dict[str, dict[str, dict[str, str]]]:
        """skyhook -> name|version -> the data of the reference's per-package ConfigMap."""
        from nodewright.controller.configmaps import CONFIGMAPS
        from nodewright.kube.resources import ApiError

        out: dict[str, dict[str, dict[str, str]]] = {}
        try:
            items = await self.listed(CONFIGMAPS, label_selector="skyhook.nvidia.com/name")
        except ApiError as exc:
            if exc.status != 403:
                raise
            self.say(
                "note: cannot list ConfigMaps (403): complete packages are taken to run the spec's configMap"
            )
            return out
        for cm in items:
            meta = cm["metadata"]
            ann = meta.get("annotations") or {}
            skyhook = (meta.get("labels") or {}).get("skyhook.nvidia.com/name")
            name = ann.get("skyhook.nvidia.com/Package.Name")
            version = ann.get("skyhook.nvidia.com/Package.Version")
            if skyhook and name and version:
                data = {str(k): str(v) for k, v in (cm.get("data") or {}).items()}
                out.setdefault(skyhook, {})[f"{name}|{version}"] = data
        return out

    # -- planning --------------------------------------------------------------------------------------

    def node_write(
        self, node: JSONDict, migrated: Sequence[Migrated]
    ) -> tuple[NodeWrite, list[NodeTranslation]]:
        from nodewright.api import constants, nodestate
        from nodewright.plan.migration import status_key, translate_node_extras, translate_node_state

        meta = node["metadata"]
        name = str(meta["name"])
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        labels: Mapping[str, str] = meta.get("labels") or {}
        unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
        write = NodeWrite()
        translations = []
        for m in migrated:
            t = translate_node_state(
                node=name,
                skyhook=m.translation.name,
                nodewright=m.model,
                annotations=annotations,
                unschedulable=unschedulable,
                applied_configs=m.applied_configs,
                config_updates=m.config_updates,
                reference_status=labels.get(status_key(m.translation.name)),
            )
            if t.state is None and not t.findings:
                continue
            translations.append(t)
            write.lines.append(f"node {name}: {describe_node(t)}")
            if t.state is None:
                continue
            key = constants.state_annotation(m.model.metadata.name)
            encoded = nodestate.encode(t.state)
            existing = annotations.get(key)
            if existing is None:
                write.annotations[key] = encoded
            elif existing != encoded:
                write.lines.append(
                    f"node {name}: {key} already set (by an earlier migration or the operator): left as is"
                )
        extras: NodeExtras = translate_node_extras(
            labels=labels,
            annotations=annotations,
            taints=(node.get("spec") or {}).get("taints") or [],
            runtime_required=[m.model for m in migrated if m.model.spec.runtime_required],
            reference_taint=self.options.reference_taint,
            our_taint=self.options.our_taint,
        )
        if extras.taints is not None:
            write.taints = list(extras.taints)
            write.lines.append(
                f"node {name}: runtime-required taint {self.options.reference_taint.key} handed over"
                f" (replaced by {self.options.our_taint.key})"
            )
        write.annotations.update(dict(extras.annotations))
        write.labels.update(dict(extras.labels))
        if extras.labels:
            write.lines.append(f"node {name}: ignore label carried over ({constants.LABEL_IGNORE}=true)")
        write.lines.extend(f"node {name}: {f}" for f in extras.findings)
        return write, translations

    async def run(self) -> int:
        from nodewright.api.models import NodeWright
        from nodewright.kube.resources import NODES
        from nodewright.plan.migration import translate_policy, translate_skyhook

        opts = self.options
        skyhooks = await self.listed(_reference("skyhooks"))
        policies = await self.listed(_reference("deploymentpolicies"))
        if not skyhooks and not policies:
            self.say("no reference objects (skyhooks.skyhook.nvidia.com) found: nothing to migrate")
            return 0
        blockers = await self.blockers()
        configs = await self.applied_configs()
        policy_translations = [translate_policy(p) for p in sorted(policies, key=_name)]
        known_policies = {t.name for t in policy_translations}
        translations: list[tuple[JSONDict, ObjectTranslation]] = []
        for obj in sorted(skyhooks, key=_name):
            t = translate_skyhook(obj)
            ref = (obj.get("spec") or {}).get("deploymentPolicy")
            if t.ok and ref and ref not in known_policies:
                t = _with_invalid(t, "spec.deploymentPolicy", f"DeploymentPolicy {ref!r} does not exist")
            translations.append((obj, t))
        migrated = [
            Migrated(
                source=obj,
                translation=t,
                model=NodeWright.model_validate(t.manifest),
                applied_configs=configs.get(t.name, {}),
                config_updates=_config_updates(obj),
            )
            for obj, t in translations
            if t.ok and t.manifest is not None
        ]

        self.say(f"Plan{'' if opts.apply else ' (dry run: nothing is written; --apply writes it)'}:")
        for t in policy_translations:
            self.print_object(t, "DeploymentPolicy")
        for _obj, t in translations:
            self.print_object(t, "NodeWright")
        nodes = await self.listed(NODES)
        writes: dict[str, NodeWrite] = {}
        for node in sorted(nodes, key=_name):
            write, _ = self.node_write(node, migrated)
            for line in write.lines:
                self.say(f"  {line}")
            if write.patch("") is not None:
                writes[_name(node)] = write
        self.say(f"  {len(writes)} node(s) to write")
        for line in blockers:
            self.say(f"warning: {line}")

        invalid = [t for _o, t in translations if not t.ok] + [t for t in policy_translations if not t.ok]
        dropped = [t for _o, t in translations if t.dropped] + [t for t in policy_translations if t.dropped]
        if not opts.apply:
            if blockers or invalid or (dropped and not opts.allow_dropped):
                self.say("--apply would refuse: see the warnings and invalid/dropped findings above")
            self.say("")
            self.say(REMOVAL_STEPS)
            return 0
        if blockers:
            self.error("refusing --apply while the reference operator may still act (warnings above)")
            return 1
        if invalid:
            names = ", ".join(f"{t.kind} {t.name}" for t in invalid)
            self.error(
                f"refusing --apply: {names} cannot be translated (invalid findings above); fix them first"
            )
            return 1
        if dropped and not opts.allow_dropped:
            names = ", ".join(f"{t.kind} {t.name}" for t in dropped)
            self.error(
                f"refusing --apply: fields of {names} would be dropped (listed above); pass"
                " --allow-dropped-fields if that is intended"
            )
            return 1
        if not await self.preflight(policy_translations, [m.translation for m in migrated]):
            return 1
        for t in policy_translations:
            await self.ensure_object(t)
        for node in sorted(nodes, key=_name):
            await self.write_node(node, migrated)
        if self.problems:
            self.error("node states not all written; NodeWrights not created: fix the errors and run again")
            return 1
        for m in migrated:
            await self.ensure_object(m.translation)
        if self.problems:
            return 1
        self.say(
            f"migrated {len(migrated)} Skyhook(s), {len(policy_translations)} DeploymentPolicy(ies),"
            f" {len(writes)} node(s)"
        )
        self.say("")
        self.say(REMOVAL_STEPS)
        return 0

    def print_object(self, t: ObjectTranslation, ours: str) -> None:
        if t.ok:
            paused = ""
            annotations = ((t.manifest or {}).get("metadata") or {}).get("annotations") or {}
            if annotations.get("nodewright.io/pause") == "true":
                paused = " (paused, as the Skyhook is)"
            elif annotations.get("nodewright.io/disable") == "true":
                paused = " (disabled, as the Skyhook is)"
            self.say(f"  {t.kind} {t.name} -> {ours} {t.name}{paused}")
        else:
            self.say(f"  {t.kind} {t.name}: cannot be translated")
        for f in t.findings:
            self.say(f"    {t.kind} {t.name}: {f}")

    # -- writing ---------------------------------------------------------------------------------------

    def _ours(self, t: ObjectTranslation) -> Any:
        from nodewright.kube.resources import DEPLOYMENTPOLICIES, NODEWRIGHTS

        return NODEWRIGHTS if t.kind == "Skyhook" else DEPLOYMENTPOLICIES

    async def _existing(self, t: ObjectTranslation) -> JSONDict | None:
        from nodewright.kube.resources import NotFound

        try:
            return await self.client.get(self._ours(t), t.name)
        except NotFound:
            return None

    async def preflight(
        self, policies: Sequence[ObjectTranslation], skyhooks: Sequence[ObjectTranslation]
    ) -> bool:
        """Objects of ours already there must be this migration's own, with the same spec."""
        from nodewright.plan.migration import MIGRATED_FROM, same_spec

        ok = True
        for t in [*policies, *skyhooks]:
            assert t.manifest is not None
            stored = await self._existing(t)
            if stored is None:
                continue
            ours = "NodeWright" if t.kind == "Skyhook" else "DeploymentPolicy"
            origin = (stored["metadata"].get("annotations") or {}).get(MIGRATED_FROM)
            if origin != f"{t.kind}/{t.name}":
                self.error(
                    f"{ours} {t.name} already exists and was not created by migrate from {t.kind} {t.name}:"
                    " delete or rename it, then run again"
                )
                ok = False
            elif not same_spec(t.kind, stored, t.manifest):
                # Migrated before and edited since (e.g. a version bump): ours is the truth now.
                self.say(f"note: {ours} {t.name} was migrated before and has changed since: left as is")
        return ok

    async def ensure_object(self, t: ObjectTranslation) -> None:
        from nodewright.kube.resources import ApiError, Conflict

        ours = "NodeWright" if t.kind == "Skyhook" else "DeploymentPolicy"
        if await self._existing(t) is not None:
            self.say(f"{ours} {t.name}: exists (created by an earlier migrate), unchanged")
            return
        assert t.manifest is not None
        try:
            await self.client.create(self._ours(t), t.manifest)
        except Conflict as exc:
            if not exc.already_exists:
                raise
            self.say(f"{ours} {t.name}: exists, unchanged")
            return
        except ApiError as exc:
            if exc.status in (401, 403) or exc.status >= 500:
                raise
            self.error(f"{ours} {t.name}: not created: {flags.one_line(exc.message)}")
            return
        self.say(f"{ours} {t.name}: created")

    async def write_node(self, node: JSONDict, migrated: Sequence[Migrated]) -> None:
        from nodewright.kube.resources import NODES, Conflict, NotFound

        name = _name(node)
        for _attempt in range(5):
            write, _ = self.node_write(node, migrated)
            patch = write.patch(str(node["metadata"].get("resourceVersion") or ""))
            if patch is None:
                return
            try:
                await self.client.patch(NODES, name, patch)
            except NotFound:
                self.say(f"node {name}: gone, skipped")
                return
            except Conflict:
                try:
                    node = await self.client.get(NODES, name)
                except NotFound:
                    return
                continue
            self.say(f"node {name}: written")
            return
        self.error(f"node {name}: not written (it kept changing); run migrate again")


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _config_updates(obj: Mapping[str, Any]) -> dict[str, list[str]]:
    raw = (obj.get("status") or {}).get("configUpdates") or {}
    if not isinstance(raw, dict):
        return {}
    return {str(k): [str(x) for x in v] for k, v in raw.items() if isinstance(v, list)}


def _with_invalid(t: ObjectTranslation, path: str, message: str) -> ObjectTranslation:
    from dataclasses import replace

    from nodewright.plan.migration import Finding

    return replace(
        t, findings=(*t.findings, Finding("invalid", path, f"{message}: create it (or fix the name)"))
    )


def describe_node(t: NodeTranslation) -> str:
    parts = [f"Skyhook {t.skyhook}:"]
    if t.complete:
        parts.append(f"complete {', '.join(t.complete)};")
    if t.restarted:
        parts.append(f"restart {'; '.join(t.restarted)};")
    if t.markers:
        parts.append(f"kept as markers {', '.join(t.markers)};")
    if t.uninstalled:
        parts.append(f"uninstalled {', '.join(t.uninstalled)};")
    if t.cordon_handed_over:
        parts.append("cordon handed over;")
    parts.extend(f"{f};" for f in t.findings)
    return " ".join(parts).rstrip(";")
