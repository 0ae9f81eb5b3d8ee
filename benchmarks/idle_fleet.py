"""Idle memory of the operator on a complete fleet, without a full rollout.

`python -m benchmarks.run` measures idle memory after a complete rollout (`--idle-seconds`); at 1,000
nodes that is ~5 minutes of rollout on a quiet machine. This tool reaches the same state cheaply: on a
control plane where a small benchmark run completed (say 30 nodes, `--kubeconfig D/admin.kubeconfig`),
it adds nodes up to `--nodes`, each a copy of what the operator wrote on a complete node of its
compartment (the state and batch annotations, the status label, the node condition; the state's boot
ID is the new node's own), then starts fresh operators exactly as the benchmark's idle phase starts
them and reports their RSS and USS (median of the last 10 one-second samples).

    nodewright sim up --nodes 0 --dir D
    python -m benchmarks.run --nodes 30 --stage-seconds 0.5 --kubeconfig D/admin.kubeconfig \
        --out /tmp/b30 --no-plot --idle-seconds 0
    python -m benchmarks.idle_fleet --kubeconfig D/admin.kubeconfig --nodes 1000 --runs 2

The operator must find nothing to do on the grown fleet: the tool reports the node writes it made
(`writes`), which should be 0 once the fleet is complete.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from benchmarks import analysis, run
from nodewright.api import constants
from nodewright.sim.demo import NodeGroup, create_groups
from nodewright.sim.kubeapi import KubeClient

NW_PREFIX = "nodewright.io/"


async def _nodes(client: KubeClient) -> list[dict[str, Any]]:
    listed = await client.list_all("/api/v1/nodes", params={"labelSelector": run.FLEET_SELECTOR})
    return list(listed["items"])


def _template(node: dict[str, Any]) -> tuple[dict[str, str], dict[str, str], list[dict[str, Any]]]:
    meta = node["metadata"]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(NW_PREFIX)}
    labels = {k: v for k, v in meta["labels"].items() if k.startswith(NW_PREFIX)}
    conditions = [c for c in node["status"].get("conditions", []) if c["type"].startswith(NW_PREFIX)]
    return annotations, labels, conditions


async def grow(kubeconfig: Path, total: int) -> int:
    """Add complete nodes until the fleet has `total`; returns how many were added."""
    async with KubeClient(kubeconfig) as client:
        nodes = await _nodes(client)
        templates: dict[str, dict[str, Any]] = {}
        for node in nodes:
            templates.setdefault(node["metadata"]["labels"][run.COMPARTMENT_LABEL], node)
        if len(nodes) >= total:
            return 0
        compartments = sorted(templates)
        sizes = [
            total // len(compartments) + (i < total % len(compartments)) for i in range(len(compartments))
        ]
        have = {
            c: sum(1 for n in nodes if n["metadata"]["labels"][run.COMPARTMENT_LABEL] == c)
            for c in compartments
        }
        groups, start = [], len(nodes)
        for c, size in zip(compartments, sizes, strict=True):
            if size > have[c]:
                groups.append(NodeGroup(start, size - have[c], {run.COMPARTMENT_LABEL: c}))
                start += size - have[c]
        names = await create_groups(kubeconfig, groups, profile="mixed", name_prefix="bench")
        sem = asyncio.Semaphore(16)
        key = constants.state_annotation(run.NODEWRIGHT)

        async def complete(name: str) -> None:
            async with sem:
                node = await client.get(f"/api/v1/nodes/{name}")
                annotations, labels, conditions = _template(
                    templates[node["metadata"]["labels"][run.COMPARTMENT_LABEL]]
                )
                state = json.loads(annotations[key])
                state["bid"] = node["status"]["nodeInfo"]["bootID"]
                annotations[key] = json.dumps(state, sort_keys=True, separators=(",", ":"))
                await client.merge_patch(
                    f"/api/v1/nodes/{name}", {"metadata": {"annotations": annotations, "labels": labels}}
                )
                await client.strategic_patch(
                    f"/api/v1/nodes/{name}/status", {"status": {"conditions": conditions}}
                )

        await asyncio.gather(*(complete(n) for n in names))
        return len(names)


async def measure_once(kubeconfig: Path, seconds: float, log_dir: Path, index: int) -> dict[str, Any]:
    cfg = run.parse_args(["--idle-seconds", str(seconds), "--kubeconfig", str(kubeconfig)])
    operator = run._operator(cfg, kubeconfig, log_dir / f"operator-idle-{index}.log")
    await asyncio.to_thread(operator.start)
    rss: list[float] = []
    uss: list[float] = []
    try:
        proc = psutil.Process(operator.pid)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            info = proc.memory_full_info()
            rss.append(info.rss / 2**20)
            uss.append(info.uss / 2**20)
            await asyncio.sleep(1.0)
        metrics = analysis.parse_prometheus(operator.metrics_text() or "")
        writes = analysis.classify_writes(analysis.requests_table(metrics)).node_and_pod
    finally:
        operator.stop()
    return {
        "rss_mib": round(statistics.median(rss[-10:]), 1),
        "uss_mib": round(statistics.median(uss[-10:]), 1),
        "peak_rss_mib": round(max(rss), 1),
        "writes": writes,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.idle_fleet", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=1000, help="grow the complete fleet to this many nodes")
    parser.add_argument("--runs", type=int, default=1, help="fresh operators measured one after another")
    parser.add_argument("--seconds", type=float, default=40.0, help="how long each operator is sampled")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/nodewright-idle-fleet"))
    args = parser.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    added = asyncio.run(grow(args.kubeconfig, args.nodes))
    run.log(f"fleet: {added} complete nodes added")
    for i in range(args.runs):
        print(
            json.dumps(asyncio.run(measure_once(args.kubeconfig, args.seconds, args.log_dir, i))), flush=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
