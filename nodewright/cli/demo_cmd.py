"""`nodewright demo` (what `make demo` runs): a real batched rollout on a simulated GPU fleet.

1. A fresh simulated control plane in `--dir` (default `.sim/demo`; one already running there is
   stopped first) — the binaries come from `make controlplane`.
2. Real nodes when the machine allows it (root and `make realnode`; `nodewright.cli.demo_real`): the
   `--real-nodes` (default 2) first canaries are real kubelets with containerd in boxes, so the rollout
   starts on nodes that really reboot; otherwise one line says why and every node is simulated.
   `--nodes` GPU nodes (default 240) in two zones; a few in each zone are labelled canaries
   (`demo.nodewright.io/canary=true`). Training jobs with PodDisruptionBudgets on every other rack of 8
   nodes; every third job is protected by `podNonInterruptLabels`. They finish within about two
   minutes, so drains first wait for PDBs and protected pods, then go through.
3. CRDs installed, the operator started as a child process, `manifests/samples/demo-policy.yaml` applied.
4. `nodewright plan` for `manifests/samples/demo-kernel-tuning.yaml` printed (the prediction), then the
   NodeWright applied.
5. Progress every 2 s until the NodeWright is complete -- the screen of `kubectl nodewright watch`
   (per-compartment bars, slots against the ceiling, nodes that need a look with the planner's reason,
   recent Events) -- then a summary that tells the safety story: duration, batches per compartment
   against the plan, the most nodes in progress at once against each ceiling, the training pods waited
   for (by name, and how long), the evictions that honoured PodDisruptionBudgets and the ones a PDB
   refused (from the operator's Events), the safety checks (budget never exceeded, every node back in
   service), reboots, erroring nodes -- and a picture (`<dir>/demo-rollout.png`: nodes in progress per
   compartment over time against the ceilings, batch starts marked), named at the end.
6. Drift (unless `--no-drift`, `nodewright.cli.demo_drift`): a tuned sysctl is changed by hand on two
   really-run nodes; drift detection is turned on, finds and reports them (label, condition,
   `nodewright consistency`), then repairs them through the batches, and the value is read back.
   Everything is stopped unless `--keep`.

Fails with exit code 1 and the tail of the operator log if the operator dies, the rollout makes no
progress for `--stall-minutes`, or `--timeout` passes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodewright.cli import flags

DEFAULT_DIR = Path(".sim") / "demo"
NODEWRIGHT = "kernel-tuning"
AGENT_IMAGE = "registry.local/nodewright/agent:sim"
PAUSE_IMAGE = "registry.local/pause:sim"
CANARY_LABEL = "demo.nodewright.io/canary"
ZONE_LABEL = "topology.kubernetes.io/zone"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo", help="simulated GPU fleet + operator + a real rollout, to completion"
    )
    parser.add_argument(
        "--nodes", type=flags.int_at_least(2), default=240, help="simulated GPU nodes (default 240)"
    )
    parser.add_argument(
        "--canaries", type=flags.non_negative_int, default=8, help="canary nodes, half per zone (default 8)"
    )
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help=f"cluster state directory ({DEFAULT_DIR})"
    )
    parser.add_argument("--keep", action="store_true", help="leave the cluster and operator running")
    parser.add_argument(
        "--timeout", type=flags.positive_float, default=20.0, help="minutes before giving up (default 20)"
    )
    parser.add_argument(
        "--stall-minutes",
        type=flags.positive_float,
        default=4.0,
        help="fail when no node changes for this long (default 4)",
    )
    parser.add_argument(
        "--real-packages",
        type=flags.non_negative_int,
        default=None,
        help="canary nodes whose package pods really run the tuning package against a node root"
        " (default: every canary)",
    )
    parser.add_argument(
        "--real-nodes",
        type=flags.int_at_least(0, at_most=4),
        default=2,
        help="canaries that are real nodes (kubelet + containerd in a box) when the machine allows it "
        "(root, make realnode; default 2, 0 for none)",
    )
    parser.add_argument("--no-workloads", action="store_true", help="skip the training jobs and PDBs")
    parser.add_argument(
        "--no-drift",
        action="store_true",
        help="skip the drift part (a tuned value changed by hand on two nodes, reported, then repaired)",
    )
    parser.set_defaults(func=run)


# ----------------------------------------------------------------------------------------------------
# Pure helpers (unit-tested)


def fleet_layout(nodes: int, canaries: int, real: int = 0) -> list[tuple[int, int, dict[str, str], int]]:
    """(start, count, labels, real) ranges: zone-a then zone-b, the first canaries/2 of each zone
    canaries; `real` of the canaries (spread over both zones, zone-a first) run their pods for real."""
    half = (nodes + 1) // 2
    zones = [("zone-a", 0, half), ("zone-b", half, nodes - half)]
    per_zone = [canaries - canaries // 2, canaries // 2]
    real = min(real, canaries)
    real_per_zone = [real - real // 2, real // 2]
    out: list[tuple[int, int, dict[str, str], int]] = []
    for (zone, start, count), canary, real_here in zip(zones, per_zone, real_per_zone, strict=True):
        canary = min(canary, count)
        if canary:
            out.append((start, canary, {ZONE_LABEL: zone, CANARY_LABEL: "true"}, min(real_here, canary)))
        if count - canary:
            out.append((start + canary, count - canary, {ZONE_LABEL: zone}, 0))
    return out


def batch_comparison(
    predicted: Mapping[str, Sequence[int]], observed: Mapping[str, Mapping[int, int]]
) -> list[tuple[str, list[int], list[int], bool]]:
    """Per compartment: predicted sizes, observed sizes (by batch number), whether they agree."""
    rows = []
    for name in sorted(set(predicted) | set(observed)):
        pred = list(predicted.get(name, ()))
        obs = [observed[name][b] for b in sorted(observed.get(name, {}))]
        if not pred and not obs:
            continue
        rows.append((name, pred, obs, pred == obs))
    return rows


def sizes_text(sizes: Sequence[int], limit: int = 14) -> str:
    if not sizes:
        return "-"
    text = ",".join(str(s) for s in sizes[:limit])
    return text + (f",… ({len(sizes)})" if len(sizes) > limit else "")


# ----------------------------------------------------------------------------------------------------
# The run


@dataclass
class Outcome:
    ok: bool
    message: str = ""


def run(args: argparse.Namespace) -> int:
    from nodewright.cli import demo_real
    from nodewright.sim import binaries
    from nodewright.sim.controlplane import ControlPlane, ControlPlaneError
    from nodewright.sim.demo import DemoError

    real_nodes = args.real_nodes
    if real_nodes and (reason := demo_real.unavailable()) is not None:
        say(f"real nodes: off, every node is simulated ({flags.one_line(reason)})")
        real_nodes = 0
    try:
        with contextlib.suppress(ControlPlaneError):
            old = ControlPlane.load(args.dir)
            if old.running_pids():
                print(f"stopping the demo cluster still running in {args.dir}", file=sys.stderr)
            old.down()
        plane = ControlPlane.create(args.dir, real_nodes=real_nodes)
    except OSError as exc:
        return flags.fail("nodewright demo", f"--dir {args.dir}: cannot create it: {exc.strerror or exc}")
    except (binaries.BinariesMissingError, ControlPlaneError) as exc:
        print(f"demo: {flags.one_line(exc)}", file=sys.stderr)
        return 1
    try:
        say(f"starting a local control plane in {plane.dir} …")
        seconds = plane.up()
        say(f"control plane up in {seconds:.1f}s ({plane.server})")
    except (binaries.BinariesMissingError, ControlPlaneError, OSError) as exc:
        print(f"demo: {flags.one_line(exc)}", file=sys.stderr)
        return 1
    operator = None
    code = 1
    try:
        outcome, operator = asyncio.run(_demo(args, plane))
        code = 0 if outcome.ok else 1
        if not outcome.ok:
            print(f"\ndemo FAILED: {outcome.message}", file=sys.stderr)
    except DemoError as exc:
        print(f"\ndemo FAILED: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        code = 130
    finally:
        if args.keep and code == 0:
            say("")
            say(f"kept running. kubeconfig: {plane.kubeconfig}")
            say(f"  export KUBECONFIG={plane.kubeconfig}; alias kubectl={plane.bin_dir / 'kubectl'}")
            say("  kubectl get nodewrights,deploymentpolicies")
            say(f"  kubectl get nodes -L nodewright.io/status.{NODEWRIGHT}")
            say(f"  python -m nodewright.cli.plan_cmd plan {NODEWRIGHT} --kubeconfig {plane.kubeconfig}")
            if operator is not None:
                say(f"  operator: pid {operator.pid}, log {operator.log_path}")
                say(f"  metrics: curl http://127.0.0.1:{operator.metrics_port}/metrics")
            say(f"  stop it all: nodewright sim down --dir {args.dir} (and kill the operator pid)")
        else:
            if operator is not None:
                operator.stop()
            plane.down(remove=not args.keep)
    return code


def say(text: str) -> None:
    print(text, flush=True)


async def _demo(args: argparse.Namespace, plane: Any) -> tuple[Outcome, Any]:
    from nodewright.cli import demo_real
    from nodewright.sim.demo import (
        SAMPLES_DIR,
        NodeGroup,
        OperatorProcess,
        create_groups,
        install_crds,
        kubectl_apply,
    )

    kubeconfig: Path = plane.kubeconfig
    started = time.monotonic()
    if plane.real_nodes:
        real_names = await asyncio.to_thread(
            demo_real.prepare,
            plane,
            canary_label=CANARY_LABEL,
            agent_image=AGENT_IMAGE,
            pause_image=PAUSE_IMAGE,
        )
        say(
            f"real nodes: {', '.join(real_names)}: kubelet and containerd in a box each, canaries,"
            f" pulling the agent and the tuning package from the registry {plane.registry}"
            f" ({time.monotonic() - started:.1f}s)"
        )
    canaries = min(args.canaries, args.nodes)
    real = canaries if args.real_packages is None else min(args.real_packages, canaries)
    layout = fleet_layout(args.nodes, canaries, real)
    names = await create_groups(
        kubeconfig, [NodeGroup(s, c, labels, real_packages=r) for s, c, labels, r in layout]
    )
    say(
        f"created {len(names)} GPU nodes: zone-a/zone-b, {canaries} canaries, {real} of them running"
        f" their package pods for real against a node root ({time.monotonic() - started:.1f}s)"
    )
    if not args.no_workloads:
        jobs = await _workloads(kubeconfig, names)
        say(f"created {len(jobs)} training jobs with PodDisruptionBudgets (every third protected)")
    install_crds(plane.bin_dir, kubeconfig)
    policy_path = SAMPLES_DIR / "demo-policy.yaml"
    nw_path = SAMPLES_DIR / "demo-kernel-tuning.yaml"
    kubectl_apply(plane.bin_dir, kubeconfig, paths=[policy_path])
    operator = OperatorProcess(
        kubeconfig=kubeconfig,
        log_path=plane.dir / "logs" / "operator.log",
        namespace=plane.namespace,
        extra_args=[f"--agent-image={AGENT_IMAGE}", f"--pause-image={PAUSE_IMAGE}"],
    )
    operator.start()
    say(f"operator running (pid {operator.pid}, log {operator.log_path})")

    predicted = await _plan(kubeconfig, nw_path)
    kubectl_apply(plane.bin_dir, kubeconfig, paths=[nw_path])
    say(f"applied NodeWright {NODEWRIGHT} ({nw_path.relative_to(SAMPLES_DIR.parents[1])})\n")
    outcome, tracker, nw_obj, elapsed = await _follow(args, kubeconfig, operator)
    evictions = await _evictions(kubeconfig)
    _summary(tracker, nw_obj, predicted, elapsed, evictions)
    _read_back(plane.dir / "roots")
    for node in plane.real_node_names[:1]:
        say(f"  read back from the real node {node} (its running kernel values, after its reboot):")
        for line in demo_real.read_back(plane, node):
            say(line)
    say(f"\npicture: {_picture(tracker, nw_obj, plane.dir / 'demo-rollout.png')}")
    if outcome.ok and not args.no_drift:
        outcome = await _drift(plane, operator)
    return outcome, operator


async def _drift(plane: Any, operator: Any) -> Outcome:
    from nodewright.cli.demo_drift import drift_story

    roots_dir = plane.dir / "roots"
    roots = sorted(p for p in roots_dir.iterdir() if p.is_dir())[:2] if roots_dir.is_dir() else []
    result = await drift_story(plane.kubeconfig, roots, nodewright=NODEWRIGHT, say=say, within=240.0)
    if result.ok:
        return Outcome(True)
    return Outcome(False, f"drift: {result.message}\n{operator.tail()}")


async def _workloads(kubeconfig: Path, names: Sequence[str]) -> list[Any]:
    from nodewright.sim import fleet

    now = dt.datetime.now(dt.UTC)
    racks = [list(names[i : i + fleet.NODES_PER_RACK]) for i in range(0, len(names), fleet.NODES_PER_RACK)]
    jobs = [
        fleet.create_workloads(
            kubeconfig,
            nodes=rack,
            job=f"train-rack-{r:04d}",
            protected=(r // 2) % 3 == 0,
            min_available=max(0, len(rack) - 1),
            finish_at=now + dt.timedelta(seconds=50 + 10 * ((r // 2) % 6)),
            concurrency=8,
        )
        for r, rack in enumerate(racks)
        if r % 2 == 0
    ]
    sem = asyncio.Semaphore(6)

    async def one(coro: Any) -> Any:
        async with sem:
            return await coro

    return list(await asyncio.gather(*(one(j) for j in jobs)))


async def _plan(kubeconfig: Path, nw_path: Path) -> dict[str, list[int]]:
    from nodewright.cli import plan_cmd

    ns = argparse.Namespace(filename=nw_path, policy=None, kubeconfig=str(kubeconfig), name=None)
    inputs = await plan_cmd.gather(ns)
    report = plan_cmd.build_report(
        inputs.nodewright,
        policy=inputs.policy,
        nodes=inputs.nodes,
        all_nodewrights=inputs.all_nodewrights,
        compartment_statuses=inputs.compartment_statuses,
        exists=inputs.exists,
    )
    say("nodewright plan -f manifests/samples/demo-kernel-tuning.yaml:")
    say("\n".join(f"  {line}" if line else "" for line in plan_cmd.render(report).rstrip("\n").split("\n")))
    say("")
    return {c.name: list(c.sizes) for c in report.preview.compartments if c.sizes}


async def _follow(
    args: argparse.Namespace, kubeconfig: Path, operator: Any
) -> tuple[Outcome, Any, Any, float]:
    from nodewright.cli.plugin.common import open_client
    from nodewright.cli.plugin.view import screen
    from nodewright.cli.plugin.watch_verbs import frame
    from nodewright.kube.resources import ApiError
    from nodewright.sim.demo import FleetTracker, Screen, get_nodewright
    from nodewright.sim.kubeapi import KubeClient

    tracker = FleetTracker(kubeconfig, NODEWRIGHT)
    watcher = asyncio.create_task(tracker.run())
    display = Screen()
    started = time.monotonic()
    nw_obj: Any = None
    outcome = Outcome(False, "not finished")
    flags = argparse.Namespace(kubeconfig=str(kubeconfig), context=None, request_timeout=30.0)
    try:
        await asyncio.wait_for(tracker.synced.wait(), 60)
        tracker.last_change = time.monotonic()
        async with KubeClient(kubeconfig) as client, open_client(flags) as plugin_client:
            while True:
                if watcher.done():
                    watcher.result()  # re-raises the watch failure
                with contextlib.suppress(ApiError, OSError, TimeoutError):
                    nw_obj = await get_nodewright(client, NODEWRIGHT)
                    docs, news = await frame(plugin_client, NODEWRIGHT, events=4)
                    now = time.monotonic()
                    lines = screen(docs, events=news, elapsed=now - started, title="make demo", width=118)
                    display.show(lines)
                now = time.monotonic()
                status = ((nw_obj or {}).get("status") or {}).get("status")
                counts = tracker.status_counts()
                if status == "complete" and counts.get("complete", 0) == len(tracker.nodes):
                    outcome = Outcome(True)
                    break
                if not operator.alive():
                    outcome = Outcome(False, operator.death_message())
                    break
                if now - tracker.last_change > args.stall_minutes * 60:
                    outcome = Outcome(
                        False,
                        f"no node changed for {args.stall_minutes:g} min (status {status}, nodes {counts})\n"
                        + operator.tail(),
                    )
                    break
                if now - started > args.timeout * 60:
                    outcome = Outcome(False, f"not complete after {args.timeout:g} min\n" + operator.tail())
                    break
                await asyncio.sleep(2.0)
    finally:
        display.release()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    return outcome, tracker, nw_obj, time.monotonic() - started


@dataclass
class Evictions:
    """What the operator's Events say about the drains of the demo's NodeWright."""

    evicted: int = 0
    refused: int = 0
    budgets: tuple[str, ...] = ()


EVICTING = re.compile(r"Evicting (\d+) pod\(s\)")
BUDGET = re.compile(r"disruption budget ([a-z0-9][-a-z0-9.]*)")


def evictions_from(events: Sequence[Mapping[str, Any]], nodewright: str) -> Evictions:
    """Sum the NodeDraining (accepted evictions) and NodeDrainBlocked (refused) series of `nodewright`."""
    out = Evictions()
    budgets: set[str] = set()
    for event in events:
        message = str(event.get("message") or "")
        if (event.get("related") or {}).get("name") != nodewright:
            continue  # node Events name their NodeWright in the related object
        count = int(event.get("count") or 1)
        if event.get("reason") == "NodeDraining" and (found := EVICTING.search(message)):
            out.evicted += int(found.group(1)) * count
        elif event.get("reason") == "NodeDrainBlocked":
            out.refused += count
            budgets.update(BUDGET.findall(message))
    out.budgets = tuple(sorted(budgets))
    return out


async def _evictions(kubeconfig: Path) -> Evictions:
    from nodewright.sim.kubeapi import ApiError, KubeClient

    found: list[Any] = []
    async with KubeClient(kubeconfig) as client:
        for reason in ("NodeDraining", "NodeDrainBlocked"):
            selector = f"reason={reason},source=nodewright-operator"
            with contextlib.suppress(ApiError, OSError, TimeoutError):
                listed = await client.list_all(
                    "/api/v1/namespaces/default/events", params={"fieldSelector": selector}
                )
                found += listed["items"]
    return evictions_from(found, NODEWRIGHT)


READ_BACK = ("net.core.rmem_max", "net.ipv4.tcp_rmem", "kernel.numa_balancing", "vm.max_map_count")


def read_back(root: Path) -> list[str]:
    """What the tuning package left on one node root: sysctls as the running (rebooted) node reports
    them, and the kernel command line it booted with."""
    lines = []
    for key in READ_BACK:
        path = root / "proc" / "sys" / key.replace(".", "/")
        value = path.read_text().strip() if path.exists() else "(not set)"
        lines.append(f"    sysctl {key} = {value}")
    cmdline = root / "proc" / "cmdline"
    if cmdline.exists():
        lines.append(f"    /proc/cmdline: {cmdline.read_text().strip()}")
    return lines


def _read_back(roots: Path) -> None:
    """Show one really-run node's tuned values, read back from its root after its reboot."""
    nodes = sorted(p for p in roots.iterdir() if p.is_dir()) if roots.is_dir() else []
    if not nodes:
        return
    say(f"  read back from {nodes[0].name}'s root ({nodes[0]}), after its reboot:")
    for line in read_back(nodes[0]):
        say(line)


def _summary(
    tracker: Any, nw_obj: Any, predicted: Mapping[str, Sequence[int]], elapsed: float, evictions: Evictions
) -> None:
    from nodewright.sim.demo import compartment_statuses

    comps = compartment_statuses(nw_obj)
    fingerprint = ((nw_obj or {}).get("status") or {}).get("rolloutFingerprint") or None
    observed = tracker.batches(fingerprint)
    counts = tracker.status_counts()
    say("")
    minutes, seconds = divmod(int(elapsed), 60)
    say(
        f"summary: {NODEWRIGHT} on {len(tracker.nodes)} nodes in {minutes}m{seconds:02d}s,"
        f" {tracker.reboots()} reboots (bootID changes), node statuses {dict(sorted(counts.items()))}"
    )
    say(
        f"  {'COMPARTMENT':<12} {'NODES':>5} {'CEILING':>7} {'PEAK IN PROGRESS':>16}"
        "  BATCHES (observed)  PLAN"
    )
    mismatches = 0
    over: list[str] = []
    for name, pred, obs, same in batch_comparison(predicted, observed):
        comp = comps.get(name, {})
        ceiling = int(comp.get("ceiling", 0))
        peak = tracker.max_in_progress.get(name, 0)
        if peak > ceiling:
            over.append(f"{name} ({peak} > {ceiling})")
        verdict = "= plan" if same else "DIFFERS, plan " + sizes_text(pred)
        say(
            f"  {name:<12} {int(comp.get('matched', sum(obs))):>5} {ceiling:>7}"
            f" {f'{peak} of {ceiling}':>16}  "
            f"{len(obs)}: {sizes_text(obs):<24} {verdict}"
        )
        mismatches += 0 if same else 1
    if mismatches:
        say(
            f"  note: {mismatches} compartment(s) batched differently from the `nodewright plan` prediction"
            " (which assumes every node succeeds)"
        )
    for line in safety_lines(tracker, evictions, over):
        say(line)
    erroring = sorted(n for n, r in tracker.nodes.items() if r.status == "erroring")
    if erroring:
        say(f"  erroring nodes ({len(erroring)}): {', '.join(erroring[:10])}")


def safety_lines(tracker: Any, evictions: Evictions, over: Sequence[str]) -> list[str]:
    """What was protected, and the checks that nothing unsafe happened."""
    lines = ["  what was protected:"]
    waits = tracker.protected_waits()
    if waits:
        longest = []
        for node, wait in waits[:4]:
            seconds = (wait.until or time.monotonic()) - wait.since
            longest.append(f"{node} {seconds:.0f}s for {', '.join(wait.pods[:2]) or 'protected pods'}")
        lines.append(
            f"    training pods waited for (podNonInterruptLabels): {len(waits)} node(s) held until their"
            f" protected pods finished; longest: {'; '.join(longest)}"
        )
    else:
        lines.append("    training pods waited for: none (no protected pod ran on a node when it was due)")
    refused = f", {', '.join(evictions.budgets[:4])}" if evictions.budgets else ""
    lines.append(
        f"    evictions: {evictions.evicted} pod(s) evicted through the Eviction API, honouring their"
        f" PodDisruptionBudgets; {evictions.refused} eviction attempt(s) refused by a PDB and retried"
        f" later{' (' + refused.lstrip(', ') + ')' if refused else ''}"
    )
    cordoned = sorted(n for n, r in tracker.nodes.items() if r.unschedulable)
    breaches = len(over) + (1 if cordoned else 0)
    detail = "; ".join(
        [*(f"in progress above the ceiling in {o}" for o in over)]
        + ([f"{len(cordoned)} node(s) still cordoned: {', '.join(cordoned[:5])}"] if cordoned else [])
    )
    lines.append(
        f"    invariant breaches: {breaches}"
        + (
            f" ({detail})"
            if detail
            else " (in progress never above a ceiling at any observed change; every node back in service)"
        )
    )
    return lines


def _picture(tracker: Any, nw_obj: Any, path: Path) -> str:
    """In-progress nodes per compartment over time against the ceilings, batch starts marked."""
    from nodewright.sim.demo import compartment_statuses

    try:
        import matplotlib
    except ImportError:
        return "not drawn (matplotlib is not installed: make venv installs it)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = compartment_statuses(nw_obj)
    series = tracker.samples
    names = sorted({c for _, counts in series for c in counts})
    fig, ax = plt.subplots(figsize=(11, 5))
    for i, name in enumerate(names):
        color = f"C{i}"
        ax.step(
            [t for t, _ in series],
            [c.get(name, 0) for _, c in series],
            where="post",
            color=color,
            label=f"{name} in progress",
        )
        ceiling = int((comps.get(name) or {}).get("ceiling", 0))
        if ceiling:
            ax.axhline(ceiling, color=color, linestyle="--", linewidth=1, label=f"{name} ceiling {ceiling}")
        for (comp, batch), at in sorted(tracker.batch_starts.items()):
            if comp == name:
                ax.axvline(at, color=color, linestyle=":", linewidth=0.8, alpha=0.6)
                ax.annotate(
                    str(batch),
                    (at, ceiling or 1),
                    color=color,
                    fontsize=7,
                    xytext=(2, 2),
                    textcoords="offset points",
                )
    ax.set_title(f"{NODEWRIGHT}: nodes in progress per compartment (dashed: ceiling; dotted: batch starts)")
    ax.set_xlabel("seconds since the demo started following the rollout")
    ax.set_ylabel("nodes in progress")
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


if __name__ == "__main__":  # `python -m nodewright.cli.demo_cmd demo ...` until it is registered
    from nodewright.cli.main import main

    sys.exit(main())
