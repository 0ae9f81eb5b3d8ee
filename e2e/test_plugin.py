"""`kubectl nodewright` on the real control plane (issue 16): every verb, its `-o json` parsed.

The plugin runs as users run it: the console script `kubectl-nodewright` (and once through kubectl's
own plugin discovery), as a subprocess against the session's control plane, while the operator (a
subprocess too) rolls out on a simulated fleet. This module: lifecycle verbs, status, node list and
status, ignore/unignore, policy show/reset, dry runs, `kubectl get/describe/edit` with the singular,
plural and short names (the category used to shadow the singular name), and the attempt count kept
on complete entries. The other `test_plugin_*` modules cover `why` for each reason, drains, kept logs
with retries, and `watch` in a terminal.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    OperatorProcess,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    get_nodewright,
    nodes_of,
    nodewright_manifest,
    package,
    status_of,
    wait_statuses,
)
from nodewright.api.nodestate import decode
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

PLUGIN = Path(sys.executable).with_name("kubectl-nodewright")
POLICIES = "/apis/nodewright.io/v1alpha1/deploymentpolicies"


def run_plugin(
    cluster: ControlPlane, *args: str, expect: int = 0, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`kubectl-nodewright ARGS --kubeconfig <cluster>`; asserts the exit code."""
    done = subprocess.run(
        [str(PLUGIN), *args, "--kubeconfig", str(cluster.kubeconfig), "--request-timeout", "20"],
        capture_output=True,
        text=True,
        timeout=120,
        input=stdin,
        check=False,
    )
    assert done.returncode == expect, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


async def plugin(cluster: ControlPlane, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_plugin, cluster, *args, expect=expect)


async def plugin_json(cluster: ControlPlane, *args: str, expect: int = 0) -> Any:
    done = await plugin(cluster, *args, "-o", "json", expect=expect)
    return json.loads(done.stdout)


async def complete(cluster: ControlPlane, *words: str) -> list[str]:
    """What shell completion offers for `words` (the last one partial), asking the cluster for names."""
    done = await asyncio.to_thread(
        subprocess.run,
        [str(PLUGIN), "__complete", "--kubeconfig", str(cluster.kubeconfig), *words],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.split()


async def why(cluster: ControlPlane, node: str, nw: str) -> JSON:
    doc = await plugin_json(cluster, "why", node, nw, "--events", "0")
    [answer] = doc["answers"]
    assert answer["node"] == node and answer["nodewright"] == nw
    return dict(answer)


async def create_policy(kube: KubeClient, name: str, default: JSON, **spec: Any) -> None:
    await kube.create(
        POLICIES,
        {
            "apiVersion": "nodewright.io/v1alpha1",
            "kind": "DeploymentPolicy",
            "metadata": {"name": name},
            "spec": {"default": default, **spec},
        },
    )


async def wait_plugin(
    cluster: ControlPlane, args: tuple[str, ...], test: Any, *, within: float, what: str
) -> Any:
    """Poll a `-o json` verb until `test(doc)` holds; returns the doc."""

    async def probe() -> Any:
        doc = await plugin_json(cluster, *args)
        return doc if test(doc) else None

    return await fleet.wait_for(probe, within=within, interval=0.5, what=what)


async def test_lifecycle_status_nodes_policy_and_kubectl_names(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    prefix = nw = f"pl-{unique}"
    policy = f"{nw}-pol"
    await create_policy(kube, policy, {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}})
    async with fleet_of(cluster, prefix, 6) as names:
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw,
                fleet_prefix=prefix,
                packages={
                    "tool": package(
                        duration="4s",
                        env={"NODEWRIGHT_SIM_FAIL_ATTEMPTS": "1", "NODEWRIGHT_SIM_FAIL_STAGES": "config"},
                        maxAttempts=2,
                    )
                },
                annotations={"nodewright.io/pause": "true"},
                deploymentPolicy=policy,
            ),
        )
        # kubectl: singular, plural, short and full names all address the object (the category
        # `nodewright-all` no longer shadows the singular name), and the category lists both kinds.
        for form in ("nodewright", "nodewrights", "nw", "nodewright.nodewright.io"):
            got = cluster.kubectl("get", form, nw, "-o", "name").stdout.strip()
            assert got == f"nodewright.nodewright.io/{nw}", (form, got)
            assert f"Name:         {nw}" in cluster.kubectl("describe", form, nw).stdout
        for form in ("deploymentpolicy", "deploymentpolicies", "dp"):
            got = cluster.kubectl("get", form, policy, "-o", "name").stdout.strip()
            assert got == f"deploymentpolicy.nodewright.io/{policy}", (form, got)
        listed = cluster.kubectl("get", "nodewright-all", "-o", "name").stdout.split()
        assert (
            f"nodewright.nodewright.io/{nw}" in listed
            and f"deploymentpolicy.nodewright.io/{policy}" in listed
        )
        editor = Path(cluster.dir) / f"edit-{unique}.sh"
        editor.write_text(
            '#!/bin/sh\nsed -i "s/^  name: \\(.*\\)$/  name: \\1\\n  labels: {edited: \\"yes\\"}/" "$1"\n'
        )
        editor.chmod(0o755)
        for form in ("nodewright", "nodewrights", "nw"):
            env = {**os.environ, "KUBE_EDITOR": str(editor)}
            await asyncio.to_thread(
                subprocess.run,
                [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "edit", form, nw],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            labels = ((await get_nodewright(kube, nw)) or {})["metadata"].get("labels") or {}
            assert labels.get("edited") == "yes", (form, labels)
            await kube.merge_patch(
                f"/apis/nodewright.io/v1alpha1/nodewrights/{nw}", {"metadata": {"labels": None}}
            )

        # Paused: every node says so, the roll-up too.
        doc = await wait_plugin(
            cluster, ("status", nw), lambda d: d["status"] == "paused", within=30, what="paused status"
        )
        assert doc["paused"] and doc["matched"] == 6
        answer = await why(cluster, names[0], nw)
        assert answer["reason"] == "Paused" and "resume" in " ".join(answer["details"])

        # A server-side dry run validates and changes nothing; resume is idempotent.
        dry = await plugin_json(cluster, "resume", nw, "--dry-run=server")
        assert dry["changed"] and dry["dryRun"] == "server"
        annotations = ((await get_nodewright(kube, nw)) or {})["metadata"]["annotations"]
        assert annotations.get("nodewright.io/pause") == "true"
        client_dry = await plugin(cluster, "resume", nw, "--dry-run=client")
        assert "dry run: client" in client_dry.stdout
        done = await plugin_json(cluster, "resume", nw)
        assert done == {**done, "action": "resume", "changed": True, "dryRun": "none"}
        again = await plugin_json(cluster, "resume", nw)
        assert again["changed"] is False
        missing = await plugin(cluster, "pause", f"nope-{unique}", expect=3)
        assert "not found" in missing.stderr

        # Running: slots against the ceiling; waiting nodes are told which batch takes them.
        status = await wait_plugin(
            cluster,
            ("status", nw),
            lambda d: d["nodes"].get("in_progress", 0) > 0,
            within=60,
            what="nodes in progress",
        )
        [comp] = status["compartments"]
        assert comp["name"] == "__default__" and comp["ceiling"] == 2 and comp["slotsUsed"] <= 2
        listed_nodes = (await plugin_json(cluster, "node", "list", nw))["nodes"]
        assert sorted(r["node"] for r in listed_nodes) == sorted(names)
        later = [r for r in listed_nodes if r["reason"] == "NotYetInBatch"]
        assert later, listed_nodes
        assert all(r["predictedBatch"] and r["lastBatch"] == 3 for r in later), later
        running = [r for r in listed_nodes if r["reason"] in ("InProgress", "AdmittedNow")]
        assert running and all(r["compartment"] == "__default__" for r in running), listed_nodes
        selected = await plugin_json(cluster, "node", "list", nw, "-l", f"kubernetes.io/hostname={names[0]}")
        assert [r["node"] for r in selected["nodes"]] == [names[0]]

        # ignore / unignore a waiting node.
        target = later[-1]["node"]
        ignored = await plugin_json(cluster, "node", "ignore", target)
        assert ignored["changed"]
        answer = await fleet.wait_for(
            lambda: _reason_is(cluster, target, nw, "Blocked"), within=30, what="ignored node blocked"
        )
        assert "nodewright.io/ignore" in answer["summary"]
        await plugin_json(cluster, "node", "unignore", target)

        # policy show: compartments, matched nodes and the ceiling per NodeWright.
        shown = await plugin_json(cluster, "policy", "show", policy)
        assert shown["usedBy"] == [nw]
        [default] = shown["compartments"]
        assert default["nodewrights"][nw] == {"matched": 6, "ceiling": 2}
        assert default["budgetText"] == "count 2" and default["strategyText"].startswith("fixed(")
        # plan keeps working under the plugin; completion asks the cluster for names.
        planned = await plugin_json(cluster, "plan", nw)
        [pcomp] = planned["compartments"]
        assert planned["exists"] and pcomp["name"] == "__default__" and pcomp["ceiling"] == 2
        assert set(names) <= set(await complete(cluster, "why", prefix[:-1]))
        assert nw in await complete(cluster, "status", nw[:4])
        assert await complete(cluster, "node", "re") == ["reset", "retry"]
        reset = await plugin_json(cluster, "policy", "reset", nw, "-y")
        assert reset["compartments"] == ["__default__"]

        async def reset_consumed() -> bool:
            obj = await get_nodewright(kube, nw) or {}
            return "nodewright.io/reset-batch-state" not in (obj["metadata"].get("annotations") or {})

        await fleet.wait_for(reset_consumed, within=30, what="reset annotation consumed by the operator")
        await plugin(cluster, "policy", "reset", nw, "--compartment", "nope", "-y", expect=3)
        await plugin(cluster, "policy", "reset", nw, expect=4)  # not confirmed without a terminal

        # disable / enable, through kubectl's own plugin discovery once.
        # kubectl keeps its own flags (--kubeconfig) and passes the rest: the plugin reads $KUBECONFIG.
        path_env = {
            **os.environ,
            "PATH": f"{PLUGIN.parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "KUBECONFIG": str(cluster.kubeconfig),
        }
        via_kubectl = await asyncio.to_thread(
            subprocess.run,
            [str(cluster.bin_dir / "kubectl"), "nodewright", "disable", nw, "-o", "json"],
            env=path_env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert json.loads(via_kubectl.stdout)["action"] == "disable"
        await wait_plugin(cluster, ("status", nw), lambda d: d["disabled"], within=30, what="disabled")
        await plugin_json(cluster, "enable", nw)

        await wait_statuses(kube, prefix, nw, "complete", within=180)
        # The first config attempt fails everywhere (NODEWRIGHT_SIM_FAIL_ATTEMPTS=1): the complete
        # entries keep the attempts of their last stage (they used to drop to 0); `node status` shows them.
        node_doc = await plugin_json(cluster, "node", "status", names[0])
        [mine] = [d for d in node_doc["nodewrights"] if d["nodewright"] == nw]
        [entry] = mine["packages"]
        assert entry["state"] == "complete" and entry["stage"] == "config" and entry["attempts"] == 2, entry
        for node in await nodes_of(kube, prefix):
            state = decode(node["metadata"]["annotations"][f"nodewright.io/state.{nw}"])
            assert all(e.attempts == 2 for e in state.packages), state
            assert status_of(node, nw) == "complete"
        final = await plugin_json(cluster, "status")
        [row] = [d for d in final["nodewrights"] if d["name"] == nw]
        assert row["nodes"] == {"complete": 6}
        await delete_nodewright(kube, nw, within=90)
        invariants.expect_cleanup(nw)
    await kube.delete(f"{POLICIES}/{policy}")


async def _reason_is(cluster: ControlPlane, node: str, nw: str, reason: str) -> JSON | None:
    answer = await why(cluster, node, nw)
    return answer if answer["reason"] == reason else None
