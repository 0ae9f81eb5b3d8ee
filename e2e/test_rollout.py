"""Issue 7 acceptance: the rollout engine (compartments, budgets, batches) on the real control plane.

Each test creates its own fleet (`<test>-<unique>` nodes, selected by `sim.nodewright.io/fleet`) split
into groups by the label `e2e.nodewright.io/group`, a DeploymentPolicy with one compartment per group,
and a NodeWright with one fast package (1 s stages, no interrupt). The operator runs as a subprocess
(`e2e/operator_fixture.py`) and the invariant monitor (I1 budget cap, I2 batches, I7 stage order, I8
halted compartments, ...) watches every test.

Batches are observed on the nodes: the rollout controller writes an admission `nodewright.io/batch.<nw>`
= `{c, b, o, f, at}` on every node it lets start, and admissions stay after completion; a node watch
(`FleetTracker`) additionally records, in watch order, when each node was admitted and when it
completed, and the nodes in progress per compartment at every change.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    REPO,
    OperatorProcess,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    get_nodewright,
    nodes_of,
    nodewright_manifest,
    package,
    patch_nodewright,
    status_of,
    wait_statuses,
)
from nodewright.api import constants
from nodewright.api.models import NodeWright
from nodewright.api.nodestate import decode
from nodewright.cli import plan_cmd
from nodewright.plan.rollout import spec_fingerprint
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.demo import FleetTracker
from nodewright.sim.kubeapi import JSON, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

POLICY_PATH = "/apis/nodewright.io/v1alpha1/deploymentpolicies"
GROUP_LABEL = "e2e.nodewright.io/group"


# ----------------------------------------------------------------------------------------------------
# Building blocks


@dataclass(frozen=True)
class Group:
    """A compartment of the test policy and the nodes created for it."""

    name: str
    count: int
    budget: JSON
    strategy: JSON

    def ceiling(self) -> int:
        if "count" in self.budget:
            return int(self.budget["count"])
        return max(1, self.count * int(self.budget["percent"]) // 100)


def policy_manifest(name: str, groups: Sequence[Group]) -> JSON:
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DeploymentPolicy",
        "metadata": {"name": name},
        "spec": {
            "default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}},
            "compartments": [
                {
                    "name": g.name,
                    "selector": {"matchLabels": {GROUP_LABEL: g.name}},
                    "budget": g.budget,
                    "strategy": g.strategy,
                }
                for g in groups
            ],
        },
    }


@contextlib.asynccontextmanager
async def grouped_fleet(
    cluster: ControlPlane, prefix: str, groups: Sequence[Group]
) -> AsyncIterator[dict[str, list[str]]]:
    """Nodes `<prefix>-<index>`, consecutive index ranges per group; all deleted at the end."""
    members: dict[str, list[str]] = {}
    start = 0
    try:
        for g in groups:
            members[g.name] = await fleet.create_nodes(
                cluster.kubeconfig,
                count=g.count,
                name_prefix=prefix,
                start_index=start,
                labels_extra={GROUP_LABEL: g.name},
            )
            start += g.count
        yield members
    finally:
        await fleet.delete_nodes(cluster.kubeconfig, name_prefix=prefix)


@contextlib.asynccontextmanager
async def policy(kube: KubeClient, manifest: JSON) -> AsyncIterator[JSON]:
    created = await kube.create(POLICY_PATH, manifest)
    try:
        yield created
    finally:
        await kube.delete(f"{POLICY_PATH}/{manifest['metadata']['name']}")


@dataclass
class Observer:
    """A node watch (FleetTracker) plus, in watch order, each node's admissions and completions."""

    tracker: FleetTracker
    seq: int = 0
    admitted: dict[str, list[tuple[int, str, int, str]]] = field(default_factory=dict)
    """node -> [(watch sequence, compartment, batch, fingerprint)] for every new admission seen."""
    completed: dict[str, list[int]] = field(default_factory=dict)
    """node -> watch sequences at which its status label became `complete`."""
    task: asyncio.Task[None] | None = None

    def on_node(self, node: JSON, _now: float) -> None:
        self.seq += 1
        name = str(node["metadata"]["name"])
        text = (node["metadata"].get("annotations") or {}).get(
            f"nodewright.io/batch.{self.tracker.nodewright}"
        )
        if text:
            doc = json.loads(text)
            entry = (self.seq, str(doc["c"]), int(doc["b"]), str(doc["f"]))
            seen = self.admitted.setdefault(name, [])
            if not seen or seen[-1][1:] != entry[1:]:
                seen.append(entry)
        status = status_of(node, self.tracker.nodewright)
        previous = self.tracker.nodes.get(name)
        if status == "complete" and (previous is None or previous.status != "complete"):
            self.completed.setdefault(name, []).append(self.seq)


@contextlib.asynccontextmanager
async def observe(cluster: ControlPlane, prefix: str, nw: str) -> AsyncIterator[Observer]:
    tracker = FleetTracker(kubeconfig=cluster.kubeconfig, nodewright=nw)
    obs = Observer(tracker)
    tracker.on_node = obs.on_node
    obs.task = asyncio.create_task(tracker.run(label_selector=f"{fleet.FLEET_LABEL}={prefix}"))
    try:
        await asyncio.wait_for(tracker.synced.wait(), timeout=30)
        yield obs
    finally:
        obs.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await obs.task


def admission_of(node: JSON, nw: str) -> JSON | None:
    text = (node["metadata"].get("annotations") or {}).get(f"nodewright.io/batch.{nw}")
    return None if text is None else dict(json.loads(text))


def observed_batches(nodes: Sequence[JSON], nw: str, fingerprint: str) -> dict[str, dict[int, list[str]]]:
    """compartment -> batch -> sorted node names, from the admissions of `fingerprint` on the nodes."""
    out: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for node in nodes:
        adm = admission_of(node, nw)
        if adm is not None and adm["f"] == fingerprint:
            out[adm["c"]][int(adm["b"])].append(node["metadata"]["name"])
    return {c: {b: sorted(ns) for b, ns in sorted(bs.items())} for c, bs in sorted(out.items())}


async def run_plan_cli(cluster: ControlPlane, path: Path) -> JSON:
    """`nodewright plan -f <file> -o json` as a user runs it."""
    cmd = [
        sys.executable,
        "-m",
        "nodewright",
        "plan",
        "-f",
        str(path),
        "--kubeconfig",
        str(cluster.kubeconfig),
        "-o",
        "json",
    ]
    proc = await asyncio.to_thread(
        subprocess.run, cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, f"nodewright plan failed ({proc.returncode}):\n{proc.stderr}"
    doc: JSON = json.loads(proc.stdout)
    return doc


def predicted_batches(plan_doc: JSON) -> dict[str, dict[int, list[str]]]:
    return {
        c["name"]: {int(b["number"]): sorted(b["nodes"]) for b in c["batches"]}
        for c in sorted(plan_doc["compartments"], key=lambda c: str(c["name"]))
        if c["batches"]
    }


async def fingerprint_of(kube: KubeClient, nw: str) -> str:
    obj = await get_nodewright(kube, nw)
    assert obj is not None
    return spec_fingerprint(NodeWright.model_validate(obj))


async def scrape(op: OperatorProcess) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The operator's /metrics: sample name -> [(labels, value)]."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(f"http://127.0.0.1:{op.metrics_port}/metrics") as resp,
    ):
        assert resp.status == 200
        text = await resp.text()
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name].append((dict(s.labels), float(s.value)))
    return samples


def values(samples: Mapping[str, list[tuple[dict[str, str], float]]], name: str, **match: str) -> list[float]:
    return [v for labels, v in samples.get(name, []) if all(labels.get(k) == w for k, w in match.items())]


def assert_synchronous_batches(
    obs: Observer, batches: Mapping[str, Mapping[int, Sequence[str]]], fingerprint: str
) -> None:
    """No node of batch k+1 was admitted before every node of batch k had completed (watch order)."""

    def admitted_at(node: str, comp: str, batch: int) -> int:
        return min(s for s, c, b, f in obs.admitted.get(node, []) if (c, b, f) == (comp, batch, fingerprint))

    def completed_after(node: str, seq: int) -> int:
        return min((s for s in obs.completed.get(node, []) if s > seq), default=10**12)

    for comp, by_batch in batches.items():
        numbers = sorted(by_batch)
        for k, k_next in itertools.pairwise(numbers):
            done = max(completed_after(n, admitted_at(n, comp, k)) for n in by_batch[k])
            started = min(admitted_at(n, comp, k_next) for n in by_batch[k_next])
            assert done < started, (
                f"{comp}: batch {k_next} admitted (watch seq {started}) before batch {k} finished"
                f" (last completion at seq {done})"
            )


def fast_operator(factory: Any) -> OperatorProcess:
    """The operator with a higher client-side write rate (the default 50/s makes a 300-node run
    rate-limited: about 15 writes per node); the rollout semantics do not depend on it."""
    op: OperatorProcess = factory("--qps", "300", "--burst", "600")
    return op


async def wait_nodes(
    kube: KubeClient, prefix: str, nw: str, names: Sequence[str], want: str, *, within: float
) -> list[JSON]:
    """Wait until each of `names` has status `want` for `nw`."""
    wanted = set(names)

    async def probe() -> list[JSON] | None:
        nodes = [n for n in await nodes_of(kube, prefix) if n["metadata"]["name"] in wanted]
        return nodes if len(nodes) == len(wanted) and all(status_of(n, nw) == want for n in nodes) else None

    try:
        result: list[JSON] = await fleet.wait_for(probe, within=within, what=f"{len(wanted)} nodes {want}")
    except TimeoutError:
        nodes = [n for n in await nodes_of(kube, prefix) if n["metadata"]["name"] in wanted]
        raise TimeoutError(
            f"not all {want}: {sorted((n['metadata']['name'], status_of(n, nw)) for n in nodes)}"
        ) from None
    return result


async def delete_and_diagnose(kube: KubeClient, prefix: str, nw: str, *, within: float = 120) -> None:
    """`delete_nodewright`, and on timeout the state of the nodes that still carry the NodeWright."""
    try:
        await delete_nodewright(kube, nw, within=within)
    except TimeoutError as err:
        stuck = {
            n["metadata"]["name"]: (
                status_of(n, nw),
                (n["metadata"].get("annotations") or {}).get(f"nodewright.io/state.{nw}"),
                admission_of(n, nw),
            )
            for n in await nodes_of(kube, prefix)
            if status_of(n, nw) is not None
        }
        raise AssertionError(f"{err}; nodes still labelled: {json.dumps(stuck, indent=1)}") from None


async def condition(kube: KubeClient, nw: str, kind: str) -> JSON | None:
    obj = await get_nodewright(kube, nw)
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


# ----------------------------------------------------------------------------------------------------
# 1. Batch sequences of three strategies equal the planner's prediction (300 nodes)


async def test_batch_sequences_match_plan(
    cluster: ControlPlane,
    operator_factory: Any,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
    tmp_path: Path,
) -> None:
    prefix = nw = f"seq-{unique}"
    groups = [
        Group("fixed", 60, {"count": 5}, {"fixed": {"initialBatch": 5}}),
        Group("linear", 100, {"percent": 10}, {"linear": {"initialBatch": 1, "delta": 1}}),
        Group("exponential", 140, {"percent": 25}, {"exponential": {"initialBatch": 1, "growthFactor": 2}}),
    ]
    pol = policy_manifest(f"seq-{unique}", groups)
    manifest = nodewright_manifest(
        nw, fleet_prefix=prefix, packages={"tool": package(duration="1s")}, deploymentPolicy=f"seq-{unique}"
    )
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump_all([pol, manifest]))
    async with grouped_fleet(cluster, prefix, groups) as members, policy(kube, pol):
        fast_operator(operator_factory)
        plan_doc = await run_plan_cli(cluster, path)
        predicted = predicted_batches(plan_doc)
        # The prediction itself is what the policy says (3 compartments, every node exactly once).
        assert sorted(predicted) == sorted(g.name for g in groups), plan_doc
        for g in groups:
            planned = [n for batch in predicted[g.name].values() for n in batch]
            assert sorted(planned) == sorted(members[g.name]), g.name
        sizes = {c["name"]: c["batchSizes"] for c in plan_doc["compartments"]}
        assert sizes["fixed"] == [5] * 12, sizes
        assert sizes["linear"] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 10, 10, 10, 5], sizes
        assert sizes["exponential"] == [1, 2, 4, 8, 16, 32, 35, 35, 7], sizes

        async with observe(cluster, prefix, nw) as obs:
            started = time.monotonic()
            await create_nodewright(kube, manifest)
            nodes = await wait_statuses(kube, prefix, nw, "complete", within=300)
            elapsed = time.monotonic() - started
            await asyncio.sleep(0)  # let the watch deliver what it has
        fingerprint = await fingerprint_of(kube, nw)
        observed = observed_batches(nodes, nw, fingerprint)
        assert observed == predicted, {c: {b: len(ns) for b, ns in bs.items()} for c, bs in observed.items()}
        assert_synchronous_batches(obs, observed, fingerprint)
        for g in groups:
            assert obs.tracker.max_in_progress.get(g.name, 0) <= g.ceiling(), obs.tracker.max_in_progress
        # `nodewright plan` on the finished rollout predicts nothing more.
        after = await run_plan_cli(cluster, path)
        assert all(not c["batches"] for c in after["compartments"]), after["compartments"]
        print(f"\n[rollout] 300 nodes, 3 compartments complete in {elapsed:.0f}s")
        await delete_and_diagnose(kube, prefix, nw)


# ----------------------------------------------------------------------------------------------------
# 2. Failures halt exactly their compartment; a reset resumes it


async def test_failures_halt_only_their_compartment_until_reset(
    cluster: ControlPlane,
    operator_factory: Any,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
    tmp_path: Path,
) -> None:
    prefix = nw = f"halt-{unique}"
    groups = [
        Group("steady", 20, {"count": 4}, {"fixed": {"initialBatch": 4}}),
        Group(
            "canary",
            20,
            {"count": 3},
            {
                "linear": {
                    "initialBatch": 1,
                    "delta": 1,
                    "batchThreshold": 100,
                    "failureThreshold": 1,
                    "safetyLimit": 100,
                }
            },
        ),
        Group("bulk", 20, {"percent": 25}, {"exponential": {"initialBatch": 1, "growthFactor": 2}}),
    ]
    pol = policy_manifest(nw, groups)
    async with grouped_fleet(cluster, prefix, groups) as members, policy(kube, pol):
        op = fast_operator(operator_factory)
        # Which nodes batch 3 of `canary` will hold: make two of its three fail.
        probe_manifest = nodewright_manifest(
            nw, fleet_prefix=prefix, packages={"tool": package()}, deploymentPolicy=nw
        )
        path = tmp_path / "probe.yaml"
        path.write_text(yaml.safe_dump(probe_manifest))
        predicted = predicted_batches(await run_plan_cli(cluster, path))
        assert [len(predicted["canary"][b]) for b in (1, 2, 3)] == [1, 2, 3], predicted["canary"]
        failing = predicted["canary"][3][:2]
        admitted_before_halt = {n for b in (1, 2, 3) for n in predicted["canary"][b]}
        manifest = nodewright_manifest(
            nw,
            fleet_prefix=prefix,
            packages={"tool": package(env={"NODEWRIGHT_SIM_FAIL_NODES": ",".join(failing)})},
            deploymentPolicy=nw,
        )
        async with operator_fixture.PodCreations(kube, nw) as pods:
            await create_nodewright(kube, manifest)

            async def halted() -> JSON | None:
                cond = await condition(kube, nw, "Halted")
                return cond if cond is not None and cond.get("status") == "True" else None

            cond = await fleet.wait_for(halted, within=90, what="Halted condition")
            assert "'canary'" in cond["message"], cond
            assert "steady" not in cond["message"] and "bulk" not in cond["message"], cond
            for n in failing:
                assert n in cond["message"], cond
            # The other compartments finish; the halted one admits nobody new meanwhile.
            await wait_nodes(kube, prefix, nw, members["steady"] + members["bulk"], "complete", within=120)
            await wait_nodes(kube, prefix, nw, failing, "erroring", within=30)
            nodes = {n["metadata"]["name"]: n for n in await nodes_of(kube, prefix)}
            untouched = [n for n in members["canary"] if n not in admitted_before_halt]
            assert len(untouched) == 14
            for name in untouched:
                assert admission_of(nodes[name], nw) is None, name
                assert f"nodewright.io/state.{nw}" not in (nodes[name]["metadata"].get("annotations") or {})
            assert not {node for _, node, *_ in pods.created} & set(untouched)
            assert {admission_of(nodes[n], nw)["b"] for n in failing} == {3}  # type: ignore[index]

            obj = await get_nodewright(kube, nw)
            assert obj is not None
            canary = obj["status"]["compartmentStatuses"]["canary"]
            assert canary["batchState"]["shouldStop"] is True, canary
            assert canary["halted"] is True, canary
            assert not obj["status"]["compartmentStatuses"]["steady"].get("halted"), obj["status"]

            events = await kube.get(
                "/api/v1/namespaces/default/events",
                params={"fieldSelector": f"involvedObject.name={nw},reason=CompartmentHalted"},
            )
            assert events["items"], "no CompartmentHalted event"
            assert all(e["type"] == "Warning" for e in events["items"]), events["items"]
            assert any("'canary'" in e["message"] for e in events["items"]), events["items"]
            assert not any("'steady'" in e["message"] or "'bulk'" in e["message"] for e in events["items"])

            samples = await scrape(op)
            assert values(samples, "nodewright_rollout_halted", nodewright=nw, compartment="canary") == [1.0]
            for other in ("steady", "bulk"):
                assert values(samples, "nodewright_rollout_halted", nodewright=nw, compartment=other) == [0.0]

            # Reset: the compartment resumes; the broken nodes stay erroring, every other node completes.
            await patch_nodewright(
                kube, nw, {"metadata": {"annotations": {constants.ANNOTATION_RESET_BATCH: "true"}}}
            )
            healthy = [n for n in members["canary"] if n not in failing]
            await wait_nodes(kube, prefix, nw, healthy, "complete", within=120)

            async def resumed() -> bool:
                obj = await get_nodewright(kube, nw)
                annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
                cond = await condition(kube, nw, "Halted")
                return (
                    constants.ANNOTATION_RESET_BATCH not in annotations
                    and (cond or {}).get("status") == "False"
                )

            await fleet.wait_for(resumed, within=30, what="reset applied and Halted False")
            samples = await scrape(op)
            assert values(samples, "nodewright_rollout_halted", nodewright=nw, compartment="canary") == [0.0]
        await delete_and_diagnose(kube, prefix, nw)


# ----------------------------------------------------------------------------------------------------
# 3. A version bump mid-rollout rolls through the batches again


async def test_version_bump_mid_rollout_goes_through_batches(
    cluster: ControlPlane,
    operator_factory: Any,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix = nw = f"bump-{unique}"
    groups = [
        Group("fixed", 18, {"count": 3}, {"fixed": {"initialBatch": 3}}),
        Group("linear", 20, {"percent": 20}, {"linear": {"initialBatch": 1, "delta": 1}}),
        Group("exponential", 22, {"percent": 25}, {"exponential": {"initialBatch": 1, "growthFactor": 2}}),
    ]
    pol = policy_manifest(nw, groups)
    async with grouped_fleet(cluster, prefix, groups), policy(kube, pol):
        fast_operator(operator_factory)
        manifest = nodewright_manifest(
            nw, fleet_prefix=prefix, packages={"tool": package("1.0.0")}, deploymentPolicy=nw
        )
        async with observe(cluster, prefix, nw) as obs:
            await create_nodewright(kube, manifest)
            old = await fingerprint_of(kube, nw)

            async def midway() -> bool:
                statuses = [r.status for r in obs.tracker.nodes.values()]
                return statuses.count("complete") >= 15 and "in_progress" in statuses

            await fleet.wait_for(midway, within=90, interval=0.05, what="rollout midway")
            bump_seq = obs.seq
            in_flight = [n for n, r in obs.tracker.nodes.items() if r.status == "in_progress"]
            await patch_nodewright(kube, nw, {"spec": {"packages": {"tool": {"version": "2.0.0"}}}})
            new = await fingerprint_of(kube, nw)
            assert new != old
            obj = await get_nodewright(kube, nw)
            assert obj is not None
            nodes = await wait_statuses(
                kube, prefix, nw, "complete", within=180, generation=int(obj["metadata"]["generation"])
            )
            await invariants.sync()
        # Every node went through a batch of the new rollout; batches stayed within the ceilings.
        observed = observed_batches(nodes, nw, new)
        assert sum(len(ns) for bs in observed.values() for ns in bs.values()) == 60, observed
        for g in groups:
            sizes = [len(ns) for ns in observed[g.name].values()]
            assert len(sizes) >= 3, (g.name, sizes)
            assert max(sizes) <= g.ceiling(), (g.name, sizes)
            assert obs.tracker.max_in_progress.get(g.name, 0) <= g.ceiling(), obs.tracker.max_in_progress
        assert_synchronous_batches(obs, observed, new)
        # After the bump, the nodes then in flight finished under their old admission before starting
        # the new version, and nobody was admitted for the old spec once the new one was known.
        first_new = min(s for entries in obs.admitted.values() for s, _, _, f in entries if f == new)
        late_old = [
            (n, s)
            for n, entries in obs.admitted.items()
            for s, _, _, f in entries
            if f == old and s > first_new
        ]
        assert not late_old, late_old
        assert bump_seq < first_new
        assert in_flight, "the bump was expected while nodes were in progress"
        for node in in_flight:
            assert [f for _, _, _, f in obs.admitted[node]][-2:] == [old, new], obs.admitted[node]
        # A complete node has no stage left in progress (an abandoned entry of the old version would
        # keep the NodeWright's deletion from converging and the stage-age metric growing).
        leftovers = {
            n["metadata"]["name"]: [
                f"{e.name}:{e.version} {e.stage.value}" for e in st.packages if e.state.value != "complete"
            ]
            for n in nodes
            if (st := decode(n["metadata"]["annotations"][f"nodewright.io/state.{nw}"])) is not None
        }
        assert not {k: v for k, v in leftovers.items() if v}, leftovers
        await delete_and_diagnose(kube, prefix, nw)


# ----------------------------------------------------------------------------------------------------
# 4. kstatus: after a spec edit, "Ready and observedGeneration == generation" means the edit is done


async def wait_kstatus_ready(
    kube: KubeClient, nw: str, *, generation: int, since: str, within: float
) -> JSON:
    """What Argo CD, Flux and `kubectl wait --for=condition=Ready` wait for, seen through a watch from
    `since` (every status write after it, transient ones included): the first NodeWright object whose
    Ready condition is True and whose `status.observedGeneration` equals its `metadata.generation`
    (at least `generation`, the one the edit produced)."""
    path = "/apis/nodewright.io/v1alpha1/nodewrights"

    def ready(obj: JSON) -> bool:
        status = obj.get("status") or {}
        current = int(obj["metadata"].get("generation") or 0)
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        return (
            current >= generation
            and status.get("observedGeneration") == current
            and (conditions.get("Ready") or {}).get("status") == "True"
        )

    async def watch() -> JSON:
        rv = since
        while True:
            async for event in kube.watch(
                path, resource_version=rv, params={"fieldSelector": f"metadata.name={nw}"}
            ):
                obj = event["object"]
                assert event["type"] != "ERROR", f"watch ended: {obj}"  # a short test: no compaction
                rv = str(obj["metadata"].get("resourceVersion") or rv)
                if event["type"] in ("ADDED", "MODIFIED") and ready(obj):
                    return dict(obj)

    return await asyncio.wait_for(watch(), timeout=within)


async def test_ready_at_a_new_generation_waits_until_its_nodes_have_done_the_work(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """Issue 29 item 1: the first status written for a new generation used to carry observedGeneration N
    with Ready=True (the nodes' status labels still said `complete` from generation N-1) for 20-90 ms,
    so a kstatus client returned before the change had even started. The wait below sees every status
    write (a watch), so it catches such a transient status every time."""
    prefix = nw = f"kst-{unique}"
    async with fleet_of(cluster, prefix, 4) as names:
        manifest = nodewright_manifest(
            nw, fleet_prefix=prefix, packages={"tool": package("1.0.0")}, interruptionBudget={"count": 2}
        )
        created = await create_nodewright(kube, manifest)
        await wait_kstatus_ready(
            kube, nw, generation=1, since=str(created["metadata"]["resourceVersion"]), within=90
        )
        before = await get_nodewright(kube, nw)
        assert before is not None
        edited = await patch_nodewright(kube, nw, {"spec": {"packages": {"tool": {"version": "2.0.0"}}}})
        generation = int(edited["metadata"]["generation"])
        assert generation > int(before["metadata"]["generation"])
        done = await wait_kstatus_ready(
            kube, nw, generation=generation, since=str(before["metadata"]["resourceVersion"]), within=120
        )
        # The wait returned: every node has done generation N's work (package 2.0.0 complete), and
        # the status says so. (Before the fix it returned within milliseconds of the edit, while every
        # node still had 1.0.0 and no 2.0.0 pod had started.)
        nodes = {n["metadata"]["name"]: n for n in await nodes_of(kube, prefix)}
        assert sorted(nodes) == sorted(names)
        versions = {}
        for name, node in nodes.items():
            text = (node["metadata"].get("annotations") or {}).get(f"nodewright.io/state.{nw}")
            state = decode(text) if text is not None else None
            versions[name] = sorted(
                (e.version, e.state.value)
                for e in (state.packages if state is not None else ())
                if e.name == "tool"
            )
        assert all(("2.0.0", "complete") in v for v in versions.values()), (
            f"Ready=True at generation {generation} before the nodes did its work: {versions};"
            f" status {json.dumps(done.get('status'), indent=1)[:3000]}"
        )
        assert done["status"]["completeNodes"] == f"{len(names)}/{len(names)}", done["status"]
        await delete_and_diagnose(kube, prefix, nw)


# ----------------------------------------------------------------------------------------------------
# 5. `nodewright plan` taken at any moment of a real rollout predicts the rest of it


async def test_plan_taken_at_any_moment_of_a_rollout_predicts_the_rest_of_it(
    cluster: ControlPlane,
    operator_factory: Any,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    """Issue 29 item 4: mid-rollout, `nodewright plan` predicted the open batch again (exponential
    compartment: [7, 7, 7, 2] predicted where [3, 7, 7, 2] happened). Plans are taken back to back while
    the rollout runs (the command's own read and prediction, in process); each must predict exactly the
    admissions that follow the moment it read."""
    prefix = nw = f"mid-{unique}"
    groups = [Group("exp", 19, {"count": 7}, {"exponential": {"initialBatch": 3, "growthFactor": 3}})]
    pol = policy_manifest(nw, groups)
    manifest = nodewright_manifest(nw, fleet_prefix=prefix, packages={"tool": package()}, deploymentPolicy=nw)
    args = argparse.Namespace(
        name=nw,
        filename=None,
        policy=None,
        kubeconfig=str(cluster.kubeconfig),
        context=None,
        request_timeout=30.0,
    )
    async with grouped_fleet(cluster, prefix, groups), policy(kube, pol):
        fast_operator(operator_factory)
        await create_nodewright(kube, manifest)
        fingerprint = await fingerprint_of(kube, nw)
        taken: list[tuple[dict[str, tuple[str, int]], dict[str, dict[int, list[str]]], list[str]]] = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            inputs = await plan_cmd.gather(args)
            report = plan_cmd.build_report(
                inputs.nodewright,
                policy=inputs.policy,
                nodes=inputs.nodes,
                all_nodewrights=inputs.all_nodewrights,
                compartment_statuses=inputs.compartment_statuses,
                exists=inputs.exists,
            )
            seen = {
                str(n["metadata"]["name"]): (str(a["c"]), int(a["b"]))
                for n in inputs.nodes
                if (a := admission_of(n, nw)) is not None and a["f"] == fingerprint
            }
            predicted = {
                c.name: {b.number: sorted(b.nodes) for b in c.batches}
                for c in report.preview.compartments
                if c.batches
            }
            taken.append((seen, predicted, inputs.notes))
            if not predicted and all(status_of(n, nw) == "complete" for n in inputs.nodes):
                break
        nodes = await wait_statuses(kube, prefix, nw, "complete", within=60)
    final = observed_batches(nodes, nw, fingerprint)
    assert [len(final["exp"][b]) for b in sorted(final["exp"])] == [3, 7, 7, 2], final
    assert len(taken) >= 5, "the rollout ended before plans were taken along it"
    for index, (seen, predicted, notes) in enumerate(taken):
        future: dict[str, dict[int, list[str]]] = {}
        for comp, by_batch in final.items():
            for batch, members in by_batch.items():
                left = sorted(n for n in members if n not in seen)
                if left:
                    future.setdefault(comp, {})[batch] = left
        sizes = {c: {b: len(n) for b, n in bs.items()} for c, bs in predicted.items()}
        happened = {c: {b: len(n) for b, n in bs.items()} for c, bs in future.items()}
        assert predicted == future, (
            f"plan {index + 1} of {len(taken)} ({len(seen)} admitted when read; notes {notes}): predicted"
            f" {sizes}, then happened {happened}"
        )
    await delete_and_diagnose(kube, prefix, nw)
