"""`nodewright consistency [NAME] [-o table|json]`: is the fleet uniform? The report before a large job.

Training jobs run at the speed of their slowest node: a node with another driver, another kernel, or a
socket-buffer sysctl that drifted makes a "bottleneck node" nobody can find afterwards. This command reads
(GET/LIST only) the nodes and the NodeWrights and prints:

- per NodeWright and package, how the selected nodes are distributed over (version, configuration digest,
  state), where `drifted` is a node whose last drift check failed (driftDetection) and `-` a node the
  package is not on;
- the node facts that matter for uniformity, from node info and GPU feature discovery labels: kernel, OS
  image, container runtime, GPU product, driver and CUDA versions;

with every dimension that has more than one value marked as skew (`SKEW`), so a uniform fleet prints
"uniform" and a mixed one says exactly where it differs and on how many nodes. Everything is computed by
the pure `consistency_report`, from the objects as listed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodewright.api import constants
from nodewright.api.nodestate import MalformedNodeState, decode
from nodewright.cli import flags
from nodewright.cli.plugin import common

JSON = dict[str, Any]
MAX_VALUES = 10
GFD = "nvidia.com/"

NODE_FACTS: tuple[tuple[str, str], ...] = (
    ("kernel", "nodeInfo.kernelVersion"),
    ("os image", "nodeInfo.osImage"),
    ("container runtime", "nodeInfo.containerRuntimeVersion"),
    ("kubelet", "nodeInfo.kubeletVersion"),
    ("gpu product", f"label:{GFD}gpu.product"),
    ("gpu count", f"label:{GFD}gpu.count"),
    ("driver", f"label:{GFD}cuda.driver-version.full"),
    ("cuda runtime", f"label:{GFD}cuda.runtime-version.full"),
)


@dataclass(frozen=True, slots=True)
class Distribution:
    """One dimension of the fleet: value -> node count (most common first), and a few example nodes of
    every value but the most common."""

    name: str
    counts: tuple[tuple[str, int], ...]
    examples: Mapping[str, tuple[str, ...]]

    @property
    def skewed(self) -> bool:
        return len(self.counts) > 1

    def to_json(self) -> JSON:
        return {
            "name": self.name,
            "skew": self.skewed,
            "values": [
                {"value": v, "nodes": n, "examples": list(self.examples.get(v, ()))} for v, n in self.counts
            ],
        }


def _distribution(name: str, values: Mapping[str, str]) -> Distribution:
    counter = Counter(values.values())
    ordered = tuple(sorted(counter.items(), key=lambda item: (-item[1], item[0])))[:MAX_VALUES]
    examples: dict[str, tuple[str, ...]] = {}
    for value, _ in ordered[1:]:
        examples[value] = tuple(sorted(n for n, v in values.items() if v == value)[:3])
    return Distribution(name=name, counts=ordered, examples=examples)


def _fact(node: Mapping[str, Any], path: str) -> str:
    meta = node.get("metadata") or {}
    if path.startswith("label:"):
        return str((meta.get("labels") or {}).get(path.removeprefix("label:"), "-"))
    info = ((node.get("status") or {}).get("nodeInfo")) or {}
    return str(info.get(path.removeprefix("nodeInfo."), "-"))


def _selected(nodewright: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    from nodewright.api.models import NodeWright
    from nodewright.plan.selectors import matches

    model = NodeWright.model_validate(nodewright)
    return [
        n for n in nodes if matches(model.spec.node_selectors, (n.get("metadata") or {}).get("labels") or {})
    ]


def package_distributions(
    nodewright: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]
) -> list[Distribution]:
    """Per package of `nodewright`: (version, config digest, state) over its selected nodes."""
    from nodewright.plan.configdiff import config_digest

    name = str(nodewright["metadata"]["name"])
    key = constants.state_annotation(name)
    packages = sorted((nodewright.get("spec") or {}).get("packages") or {})
    per_package: dict[str, dict[str, str]] = {p: {} for p in packages}
    for node in _selected(nodewright, nodes):
        node_name = str(node["metadata"]["name"])
        text = ((node.get("metadata") or {}).get("annotations") or {}).get(key)
        try:
            state = decode(text) if text else None
        except MalformedNodeState:
            state = None
            for package in packages:
                per_package[package][node_name] = "unreadable state"
            continue
        for package in packages:
            entries = state.entries_for(package) if state is not None else ()
            if not entries:
                per_package[package][node_name] = "-"
                continue
            entry = max(entries, key=lambda e: e.updated or "")
            digest = config_digest(entry.config_map)[:8] if entry.config else "none"
            status = "drifted" if entry.drifted else entry.state.value
            per_package[package][node_name] = f"{entry.version} config {digest} {status}"
    return [_distribution(f"{name}/{package}", values) for package, values in per_package.items()]


def fact_distributions(nodes: Sequence[Mapping[str, Any]]) -> list[Distribution]:
    return [
        _distribution(label, {str(n["metadata"]["name"]): _fact(n, path) for n in nodes})
        for label, path in NODE_FACTS
    ]


@dataclass(frozen=True, slots=True)
class ConsistencyReport:
    nodes: int
    packages: tuple[Distribution, ...]
    facts: tuple[Distribution, ...]

    @property
    def uniform(self) -> bool:
        return not any(d.skewed for d in (*self.packages, *self.facts))

    def to_json(self) -> JSON:
        return {
            "nodes": self.nodes,
            "uniform": self.uniform,
            "packages": [d.to_json() for d in self.packages],
            "nodeFacts": [d.to_json() for d in self.facts],
        }


def consistency_report(
    nodewrights: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]]
) -> ConsistencyReport:
    """The report over `nodes` (the NodeWrights' selected nodes, or all nodes when none is given)."""
    selected: dict[str, Mapping[str, Any]] = {}
    for nw in nodewrights:
        for node in _selected(nw, nodes):
            selected[str(node["metadata"]["name"])] = node
    scope = list(selected.values()) if nodewrights else list(nodes)
    packages = tuple(d for nw in nodewrights for d in package_distributions(nw, nodes))
    return ConsistencyReport(nodes=len(scope), packages=packages, facts=tuple(fact_distributions(scope)))


def render(report: ConsistencyReport) -> str:
    lines = [f"{report.nodes} nodes: {'uniform' if report.uniform else 'NOT uniform (SKEW below)'}"]
    for title, group in (("PACKAGE", report.packages), ("NODE FACT", report.facts)):
        if not group:
            continue
        lines.append("")
        lines.append(f"{title:<28} {'NODES':>6}  VALUE")
        for dist in group:
            mark = "  SKEW" if dist.skewed else ""
            for index, (value, count) in enumerate(dist.counts):
                label = dist.name if index == 0 else ""
                examples = dist.examples.get(value)
                where = f"  (e.g. {', '.join(examples)})" if examples else ""
                lines.append(f"{label:<28} {count:>6}  {value}{where}{mark if index == 0 else ''}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------


async def _gather(session: common.Session) -> tuple[list[JSON], list[JSON]]:
    from nodewright.kube.resources import NODES, NODEWRIGHTS, NotFound

    client, name = session.client, session.args.name
    nodes = (await client.list(NODES)).items
    if not name:
        return (await client.list(NODEWRIGHTS)).items, nodes
    try:
        return [await client.get(NODEWRIGHTS, name)], nodes
    except NotFound:
        raise common.NotFoundError(
            f"NodeWright {name!r} not found (kubectl get nodewrights lists them)"
        ) from None


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "consistency",
        help="how uniform the fleet is: package versions, configs, drift, kernels, drivers (skew marked)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument(
        "name", nargs="?", type=flags.nodewright_name, help="one NodeWright (default: all, and their nodes)"
    )
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    common.add_cluster_flags(parser)  # kubectl's flags: --kubeconfig, --context, --request-timeout
    parser.set_defaults(func=run, prog=parser.prog)


def run(args: argparse.Namespace) -> int:
    """Exit codes as every plugin verb's (docs/plugin.md): 2 bad kubeconfig, 3 unknown NodeWright."""
    return common.run(args, _report)


async def _report(session: common.Session) -> int:
    nodewrights, nodes = await _gather(session)
    report = consistency_report(nodewrights, nodes)
    if session.args.output == "json":
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        sys.stdout.write(render(report))
    sys.stdout.flush()
    return common.OK
