"""`kubectl nodewright watch` in a real terminal (issue 16): tmux runs it full-screen while a rollout goes
on; the pane is captured and must show the NodeWright, a bar per compartment with done/matched counts,
the slots against the ceiling, and -- once the rollout is complete -- a full bar and the complete count.

tmux comes from Debian (`.ci/run` installs it when missing); the server runs on its own socket and is
killed by that socket at the end.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    OperatorProcess,
    create_nodewright,
    delete_nodewright,
    fleet_of,
    nodewright_manifest,
    package,
    wait_statuses,
)
from e2e.test_plugin import PLUGIN
from nodewright.cli.plugin.view import EMPTY, FULL
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import KubeClient

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory


def tmux(socket: str, *args: str) -> str:
    done = subprocess.run(
        ["tmux", "-L", socket, *args], capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout


async def test_watch_draws_bars_and_counts_in_a_terminal(
    cluster: ControlPlane,
    operator: OperatorProcess,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
) -> None:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed (.ci/run installs it: apt-get install tmux)")
    prefix = nw = f"tw-{unique}"
    socket = f"nodewright-e2e-{unique}"
    async with fleet_of(cluster, prefix, 4):
        await create_nodewright(
            kube,
            nodewright_manifest(
                nw,
                fleet_prefix=prefix,
                packages={"tool": package(duration="3s")},
                interruptionBudget={"count": 2},
            ),
        )
        command = f"{PLUGIN} watch {nw} --kubeconfig {cluster.kubeconfig} --interval 1"
        await asyncio.to_thread(
            tmux,
            socket,
            "new-session",
            "-d",
            "-s",
            "watch",
            "-x",
            "150",
            "-y",
            "40",
            "-e",
            "LANG=C.UTF-8",
            command,
        )
        try:

            async def pane() -> str:
                return await asyncio.to_thread(tmux, socket, "capture-pane", "-p", "-t", "watch")

            async def drawn() -> str | None:
                text = await pane()
                return text if nw in text and "/4" in text and "slots" in text else None

            text = await fleet.wait_for(drawn, within=60, interval=0.5, what="the watch screen")
            assert "kubectl nodewright watch" in text.splitlines()[0], text
            bar_lines = [line for line in text.splitlines() if "__default__" in line]
            assert bar_lines and (FULL in bar_lines[0] or EMPTY in bar_lines[0]), text
            assert "/2" in bar_lines[0], text  # slots in use against the ceiling of 2

            await wait_statuses(kube, prefix, nw, "complete", within=120)

            async def finished() -> str | None:
                text = await pane()
                line = next((ln for ln in text.splitlines() if "__default__" in ln), "")
                return text if "4/4" in line and FULL * 10 in line and EMPTY not in line else None

            text = await fleet.wait_for(finished, within=30, interval=0.5, what="the full bar")
            assert f"{nw}: complete" in text, text
        finally:
            await asyncio.to_thread(
                subprocess.run, ["tmux", "-L", socket, "kill-server"], capture_output=True, check=False
            )
        await delete_nodewright(kube, nw, within=90)
        invariants.expect_cleanup(nw)
