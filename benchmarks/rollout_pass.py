"""CPU of one rollout pass at N nodes, mid-rollout, without a control plane.

    python -m benchmarks.rollout_pass --nodes 10000 [--passes 10] [--changed 40] [--profile]

A rollout pass reads every node the NodeWright selects, so at fleet scale its CPU is the operator's
largest single cost (docs/benchmarks.md, "The rollout pass at 10,000 nodes"). A full benchmark run
measures it only inside 30 minutes of everything else; this tool measures the pass alone, in seconds:
the real `RolloutReconciler` and API client against the in-process fake API server of the unit tests
(`tests.kubefake`), over the benchmark's nodes (`nodewright.sim.fleet.node_manifest`), NodeWright and
DeploymentPolicy (`benchmarks.run`). The first pass admits the first batches; before each measured pass,
up to `--changed` admitted nodes finish (status label and state annotation written, as the node
controller would), so every pass sees a few changed nodes among many unchanged ones, as in a rollout.

It prints the CPU seconds (process time) of each pass and their median; `--profile` adds cProfile's
top functions (the profiler roughly doubles the times). The fake API server runs in the same process,
so its handling of the pass's writes counts too. Compare two commits on the same machine, never a
number from another one.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import cProfile
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.run import COMPARTMENT_LABEL, Config, nodewright_manifest, policy_manifest
from nodewright.api import constants
from nodewright.api.admission import admission_annotation
from nodewright.api.nodestate import NodeState, PackageEntry, PackageStage, PackageState, encode
from nodewright.controller.rollout import RolloutReconciler
from nodewright.kube.client import KubeClient
from nodewright.kube.informer import Informer
from nodewright.kube.resources import NODES, NODEWRIGHTS, PODS
from nodewright.kube.trim import trim_node
from nodewright.sim.fleet import node_manifest
from tests.kubefake import FakeKube
from tests.test_controller_nodes import NS, make_runtime

NODES_C = ("api/v1", "", "nodes")
NODEWRIGHTS_C = ("apis/nodewright.io/v1alpha1", "", "nodewrights")
POLICIES_C = ("apis/nodewright.io/v1alpha1", "", "deploymentpolicies")


def _config(nodes: int) -> Config:
    return Config(
        nodes=nodes,
        packages=3,
        compartments=3,
        stage_seconds=2.0,
        budget_percent=10,
        smoke=False,
        out=Path("."),
        plot=False,
        kubeconfig=None,
        timeout_minutes=0,
        stall_minutes=0,
    )


def _finish(kube: FakeKube, name: str, done: NodeState, limit: int) -> list[dict[str, Any]]:
    """Up to `limit` admitted nodes, complete (what the node controller writes at the end of a run)."""
    status, state, admission = (
        constants.status_label(name),
        constants.state_annotation(name),
        admission_annotation(name),
    )
    finished: list[dict[str, Any]] = []
    for obj in kube.objects[NODES_C].values():
        meta = obj["metadata"]
        if admission not in (meta.get("annotations") or {}) or meta["labels"].get(status) == "complete":
            continue
        node = copy.deepcopy(obj)
        node["metadata"]["labels"][status] = "complete"
        node["metadata"].setdefault("annotations", {})[state] = encode(done)
        finished.append(node)
        if len(finished) >= limit:
            break
    return [kube.put(NODES_C, node) for node in finished]


async def measure(nodes: int, passes: int, changed: int, profile: cProfile.Profile | None) -> list[float]:
    cfg = _config(nodes)
    kube = await FakeKube().start()
    client = KubeClient(kube.config(), max_retries=0)
    rt = make_runtime(
        client,
        nodes=Informer(client, NODES, transform=trim_node),
        nodewrights=Informer(client, NODEWRIGHTS),
        pods=Informer(client, PODS, namespace=NS),
    )
    try:
        rt.policies.upsert(kube.put(POLICIES_C, policy_manifest(cfg)))
        nw = nodewright_manifest(cfg)
        nw["metadata"]["generation"] = 1
        rt.nodewrights.upsert(kube.put(NODEWRIGHTS_C, nw))
        for i in range(nodes):
            labels = {COMPARTMENT_LABEL: f"c{i % cfg.compartments}", "sim.nodewright.io/fleet": "bench"}
            rt.nodes.upsert(trim_node(kube.put(NODES_C, node_manifest(i, labels_extra=labels))))
        name = str(nw["metadata"]["name"])
        done = NodeState(
            packages=tuple(
                PackageEntry(name=p, version="1.0.0", stage=PackageStage.CONFIG, state=PackageState.COMPLETE)
                for p in sorted(nw["spec"]["packages"])
            ),
            generation=1,
        )
        reconciler = RolloutReconciler(rt)
        await reconciler.reconcile(name)  # admits the first batches: every node derived once
        seconds: list[float] = []
        for _ in range(passes):
            for node in _finish(kube, name, done, changed):
                rt.nodes.upsert(trim_node(node))
            started = time.process_time()
            if profile is not None:
                profile.enable()
            await reconciler.reconcile(name)
            if profile is not None:
                profile.disable()
            seconds.append(time.process_time() - started)
        return seconds
    finally:
        await rt.events.close(grace=0.1)
        await client.close()
        await kube.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=10)
    parser.add_argument("--changed", type=int, default=40, help="nodes that finish before each pass")
    parser.add_argument("--profile", action="store_true", help="cProfile's top functions as well")
    args = parser.parse_args()
    profile = cProfile.Profile() if args.profile else None
    seconds = asyncio.run(measure(args.nodes, args.passes, args.changed, profile))
    print("CPU seconds per pass:", " ".join(f"{s:.3f}" for s in seconds))
    print(f"median {statistics.median(seconds):.3f} s over {len(seconds)} passes at {args.nodes} nodes")
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
