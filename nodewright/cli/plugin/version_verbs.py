"""`version`: the plugin's version and the versions of the operator and webhook running in the cluster.

Before filing a bug or upgrading, an SRE needs both: a plugin newer than the operator may show fields
the operator does not write yet. The client version is the installed `nodewright` distribution's. The
server side is read from the Deployments the Helm chart creates in the operator namespace (`-n`, label
`app.kubernetes.io/name=nodewright`, one per `app.kubernetes.io/component`: operator, webhook): the
chart's `app.kubernetes.io/version` label (its appVersion), else the tag of the container image (what
an image override actually runs), with the image and ready/desired replicas beside it. During an
upgrade the replicas say whether the new version has rolled out yet.

`--client` prints the client version only and needs no cluster. Without a NodeWright Deployment in the
namespace the client version is still printed, and the exit status is 3 (not found) with a line naming
the namespace searched. RBAC: `list` on `deployments` in the operator namespace (the chart's viewer
role grants it).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Final

from nodewright.cli.plugin import common

JSON = dict[str, Any]
APP_SELECTOR: Final = "app.kubernetes.io/name=nodewright"
COMPONENTS: Final = ("operator", "webhook")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = common.verb_parser(
        subparsers,
        "version",
        help="the plugin's version and the operator's and webhook's in the cluster",
        description="Print the client (plugin) version and the versions of the NodeWright operator and\n"
        "webhook Deployments in the operator namespace (their app.kubernetes.io/version label, else\n"
        "their image tag).",
        examples=[
            "kubectl nodewright version",
            "kubectl nodewright version --client",
            "kubectl nodewright version -n platform-nodewright -o json",
        ],
    )
    parser.add_argument("--client", action="store_true", help="the client version only (no cluster access)")
    common.add_output_flag(parser, ("table", "json", "yaml"))
    common.add_cluster_flags(parser)
    parser.set_defaults(func=run, prog=parser.prog)


def client_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nodewright")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def image_tag(image: str) -> str:
    """The tag of an image reference (`repo:tag`, `repo:tag@sha256:...`); the short digest without one."""
    name, _, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        return last.split(":", 1)[1]
    return digest[:19] if digest else "latest"


def describe_deployment(deployment: JSON) -> JSON:
    """What `version` reports about one Deployment of the chart."""
    meta = deployment.get("metadata") or {}
    labels = meta.get("labels") or {}
    containers = ((deployment.get("spec") or {}).get("template") or {}).get("spec", {}).get(
        "containers"
    ) or []
    image = str(containers[0].get("image") or "") if containers else ""
    status = deployment.get("status") or {}
    return {
        "version": str(labels.get("app.kubernetes.io/version") or (image_tag(image) if image else "unknown")),
        "deployment": f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        "image": image,
        "replicas": int((deployment.get("spec") or {}).get("replicas", 1) or 0),
        "readyReplicas": int(status.get("readyReplicas") or 0),
    }


def render(doc: JSON) -> str:
    lines = [f"Client Version: {doc['clientVersion']}"]
    for component in COMPONENTS:
        found = doc.get(component)
        if found is None:
            continue
        lines.append(
            f"{component.capitalize()} Version: {found['version']} (deployment {found['deployment']},"
            f" {found['readyReplicas']}/{found['replicas']} ready, image {found['image']})"
        )
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    if args.client:
        doc: JSON = {"clientVersion": client_version()}
        common.emit(args, doc, lambda _wide: render(doc))
        return common.OK
    return common.run(args, _run)


async def _run(session: common.Session) -> int:
    from nodewright.kube.resources import Resource

    deployments = Resource("apps", "v1", "deployments", True, "Deployment")
    listed = await session.client.list(deployments, namespace=session.namespace, label_selector=APP_SELECTOR)
    doc: JSON = {"clientVersion": client_version()}
    for deployment in sorted(listed.items, key=lambda d: str(d["metadata"].get("name"))):
        component = ((deployment.get("metadata") or {}).get("labels") or {}).get(
            "app.kubernetes.io/component"
        )
        if component in COMPONENTS and component not in doc:
            doc[component] = describe_deployment(deployment)
    common.emit(session.args, doc, lambda _wide: render(doc))
    if "operator" not in doc:
        print(
            f"{common.prog_of(session.args)}: no NodeWright operator Deployment in namespace"
            f" {session.namespace!r} (label {APP_SELECTOR}); pass -n with the namespace it was installed in",
            file=sys.stderr,
            flush=True,
        )
        return common.NOT_FOUND
    return common.OK
