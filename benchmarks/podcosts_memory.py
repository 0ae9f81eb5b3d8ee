"""Memory of the count-only pod cache of idle nodes first (`controller.podcosts`).

10,000 nodes x 8 pods (3 DaemonSet pods, 3 ReplicaSet pods, a Job pod and a StatefulSet pod with its
per-pod `statefulset.kubernetes.io/pod-name` label on every node), each decoded from JSON as from the
wire (fresh strings), reduced by the cache's transform (`_reduce`, as the reflector applies it page by
page) and stored by `PodCosts.replace`. Reported: the bytes the cache still holds (tracemalloc), in
total and per pod. No timing: memory only.

Run: `python -m benchmarks.podcosts_memory [--nodes 10000] [--pods-per-node 8]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import tracemalloc
from typing import Any, cast

from nodewright.controller.podcosts import PodCosts, _reduce
from nodewright.kube.client import KubeClient

KINDS = (
    "DaemonSet",
    "DaemonSet",
    "DaemonSet",
    "ReplicaSet",
    "ReplicaSet",
    "Job",
    "ReplicaSet",
    "StatefulSet",
)


def raw_pod(node: int, slot: int) -> dict[str, Any]:
    kind = KINDS[slot % len(KINDS)]
    name = f"{'dcgm-exporter' if kind == 'DaemonSet' else 'trainer-llm-pretrain'}-{node:05d}-{slot}-x7k2q"
    labels = {
        "app.kubernetes.io/name": "trainer",
        "app.kubernetes.io/instance": f"llm-{slot}",
        "pod-template-hash": f"{node % 50:07d}",
        "team": "a",
    }
    if kind == "StatefulSet":
        labels["statefulset.kubernetes.io/pod-name"] = name  # unique per pod: nothing to share
    doc = {
        "metadata": {
            "name": name,
            "namespace": "gpu-operator" if kind == "DaemonSet" else "ml-team-a",
            "uid": f"0b5c{node:08d}-{slot:04d}-4a7e-9d1c-3f2b6a8e9c0d",
            "resourceVersion": str(10_000_000 + node * 8 + slot),
            "labels": labels,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": "o", "controller": True}],
        },
        "spec": {"nodeName": f"gpu-node-{node:05d}", "containers": [{"name": "c", "image": "nvcr.io/x:1"}]},
        "status": {"phase": "Running"},
    }
    return cast(dict[str, Any], json.loads(json.dumps(doc)))


def measure(nodes: int, per_node: int) -> tuple[int, int]:
    """(bytes held, pods kept) by a cache that listed `nodes` x `per_node` pods."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    cache = PodCosts(cast(KubeClient, None))  # never started: fed the list directly
    cache.replace([_reduce(raw_pod(n, s)) for n in range(nodes) for s in range(per_node)], "1")
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used, cache.pods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods-per-node", type=int, default=8)
    args = parser.parse_args()
    used, kept = measure(args.nodes, args.pods_per_node)
    total = args.nodes * args.pods_per_node
    print(
        f"{total} pods on {args.nodes} nodes ({kept} kept): {used / 2**20:.1f} MiB held,"
        f" {used / max(1, total):.0f} B per pod"
    )


if __name__ == "__main__":
    main()
