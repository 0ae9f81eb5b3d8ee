"""The operator as a subprocess against the e2e control plane (`python -m nodewright operator`).

`OperatorProcess` starts the real command line (no in-process shortcuts: flags, signal handling, the
Manager and the informers all run as in production), waits for `/readyz`, captures the log to a file
and prints its tail when a test fails. `kill()` sends SIGKILL (the "operator killed mid-rollout"
scenario: no orderly shutdown, no Lease release), `restart()` starts it again with the same flags.
Without `leader_election` it runs with `--no-leader-elect`; with a `LeaderElection` it competes for
that Lease (`readyz()` then says whether it leads, and under which identity).

Fixtures:
- `crds` (session): installs `manifests/crds/` once with server-side apply and waits until they are
  Established;
- `operator` (function): one operator per test, stopped (SIGTERM, then SIGKILL) at teardown. Tests that
  need other flags (e.g. a short `--reboot-timeout`) use `operator_factory`.

Tests delete their NodeWrights before the operator stops, so the finalizer is released by a running
operator (see `delete_nodewright`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodewright.api.nodestate import decode
from nodewright.plan import podspec
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane, free_port
from nodewright.sim.kubeapi import JSON, ApiError, KubeClient

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "nodewright-system"
NW_PATH = "/apis/nodewright.io/v1alpha1/nodewrights"
AGENT_IMAGE = "ghcr.io/nvidia/skyhook/agent:6.4.1"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


@dataclass(frozen=True)
class LeaderElection:
    """The Lease replicas compete for, and its timing (the operator's flags of the same names)."""

    lease_name: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def args(self) -> list[str]:
        return [
            "--leader-elect",
            f"--lease-name={self.lease_name}",
            f"--lease-duration={self.lease_duration}",
            f"--renew-deadline={self.renew_deadline}",
            f"--retry-period={self.retry_period}",
        ]


class OperatorProcess:
    def __init__(
        self,
        cluster: ControlPlane,
        log_dir: Path,
        *,
        extra_args: Sequence[str] = (),
        leader_election: LeaderElection | None = None,
    ) -> None:
        self.cluster = cluster
        self.log_path = log_dir / f"operator-{os.getpid()}-{time.monotonic_ns()}.log"
        self.extra_args = list(extra_args)
        self.leader_election = leader_election
        self.proc: subprocess.Popen[bytes] | None = None
        self.health_port = 0
        self.metrics_port = 0
        self.starts = 0

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "nodewright",
            "operator",
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            "--namespace",
            NAMESPACE,
            *(self.leader_election.args() if self.leader_election else ["--no-leader-elect"]),
            "--health-probe-bind-address",
            f"127.0.0.1:{self.health_port}",
            "--metrics-bind-address",
            f"127.0.0.1:{self.metrics_port}",
            "--agent-image",
            AGENT_IMAGE,
            "--pause-image",
            PAUSE_IMAGE,
            "--log-format",
            "json",
            *self.extra_args,
        ]

    def start(self, *, within: float = 60.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "operator already running"
        self.health_port, self.metrics_port = free_port(), free_port()
        log = self.log_path.open("ab")
        log.write(f"\n===== start {self.starts + 1}: {' '.join(self.command())}\n".encode())
        log.flush()
        # Unbuffered: a SIGKILLed operator's last log lines are the ones a failing test needs.
        self.proc = subprocess.Popen(
            self.command(),
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        self.starts += 1
        self.wait_ready(within=within)

    def wait_ready(self, *, within: float) -> None:
        deadline = time.monotonic() + within
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"operator not ready within {within}s:\n{self.tail()}")

    def readyz(self) -> dict[str, Any] | None:
        """The /readyz body (`ready`, `leader`, `identity`, ...), or None when the process does not answer."""
        if not self.running:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as resp:
                body: dict[str, Any] = json.loads(resp.read())
        except urllib.error.HTTPError as err:  # 503 while not ready: the body says why
            body = json.loads(err.read() or b"{}")
        except (OSError, ValueError):
            return None
        return body

    def kill(self) -> None:
        """SIGKILL: no orderly shutdown (what a node failure or OOM kill does to the operator)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, *, timeout: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        self.kill()
        self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no operator log)"
        return "\n".join(text.splitlines()[-lines:])

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


# ----------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="session")
def crds(cluster: ControlPlane) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "manifests" / "crds"))
    cluster.wait_established("-f", str(REPO / "manifests" / "crds"))


def started_operators(build: Callable[..., OperatorProcess]) -> Iterator[Callable[..., OperatorProcess]]:
    """Fixture body: yields a factory that builds and starts operators; stops them all afterwards."""
    started: list[OperatorProcess] = []

    def make(*args: str) -> OperatorProcess:
        op = build(*args)
        started.append(op)
        op.start()
        return op

    yield make
    for op in started:
        op.stop()
        # pytest shows captured teardown output only for failing tests: the tail costs nothing otherwise.
        print(f"\n----- operator log tail ({op.log_path}) -----\n{op.tail(120)}")


@pytest.fixture
def operator_factory(
    cluster: ControlPlane, crds: None, tmp_path: Path
) -> Iterator[Callable[..., OperatorProcess]]:
    yield from started_operators(
        lambda *extra_args: OperatorProcess(cluster, tmp_path, extra_args=extra_args)
    )


@pytest.fixture
def operator(operator_factory: Callable[..., OperatorProcess]) -> OperatorProcess:
    return operator_factory()


@pytest.fixture
async def kube(cluster: ControlPlane) -> AsyncIterator[KubeClient]:
    async with KubeClient(cluster.kubeconfig) as client:
        yield client


# ----------------------------------------------------------------------------------------------------
# Helpers for scenarios


def package(
    version: str = "1.0.0",
    *,
    image: str = "ghcr.io/example/pkg",
    duration: str = "1s",
    env: dict[str, str] | None = None,
    **fields: Any,
) -> JSON:
    """A package spec whose simulated stages take `duration`."""
    variables = {"NODEWRIGHT_SIM_DURATION": duration, **(env or {})}
    return {
        "version": version,
        "image": image,
        "env": [{"name": k, "value": v} for k, v in variables.items()],
        **fields,
    }


def nodewright_manifest(
    name: str,
    *,
    fleet_prefix: str,
    packages: dict[str, JSON],
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> JSON:
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "nodeSelectors": {"matchLabels": {fleet.FLEET_LABEL: fleet_prefix}},
            "packages": packages,
            **spec,
        },
    }


async def create_nodewright(kube: KubeClient, manifest: JSON) -> JSON:
    return await kube.create(NW_PATH, manifest)


async def patch_nodewright(kube: KubeClient, name: str, patch: JSON) -> JSON:
    return await kube.merge_patch(f"{NW_PATH}/{name}", patch)


async def get_nodewright(kube: KubeClient, name: str) -> JSON | None:
    try:
        return await kube.get(f"{NW_PATH}/{name}")
    except ApiError as err:
        if err.status == 404:
            return None
        raise


async def delete_nodewright(kube: KubeClient, name: str, *, within: float = 60.0) -> None:
    """Delete and wait until it is gone (the running operator releases the finalizer)."""
    await kube.delete(f"{NW_PATH}/{name}")

    async def gone() -> bool:
        return await get_nodewright(kube, name) is None

    await fleet.wait_for(gone, within=within, what=f"NodeWright {name} deleted")


async def nodes_of(kube: KubeClient, prefix: str) -> list[JSON]:
    listed = await kube.list_all("/api/v1/nodes", params={"labelSelector": f"{fleet.FLEET_LABEL}={prefix}"})
    items: list[JSON] = listed["items"]
    return items


def status_of(node: JSON, nw: str) -> str | None:
    labels = node["metadata"].get("labels") or {}
    value = labels.get(f"nodewright.io/status.{nw}")
    return str(value) if value is not None else None


def condition_of(node: JSON, nw: str) -> JSON | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == f"nodewright.io/{nw}":
            return dict(cond)
    return None


async def wait_statuses(
    kube: KubeClient,
    prefix: str,
    nw: str,
    want: str,
    *,
    within: float = 90.0,
    count: int | None = None,
    generation: int | None = None,
) -> list[JSON]:
    """Wait until every node of the fleet (or `count` of them) has status `want` for `nw`.

    With `generation`, a node counts only once its state records that NodeWright generation as
    completed (the status label alone may still be the one from before a spec change).
    """

    def at_generation(node: JSON) -> bool:
        if generation is None:
            return True
        text = (node["metadata"].get("annotations") or {}).get(f"nodewright.io/state.{nw}")
        return text is not None and (decode(text).generation or 0) >= generation

    async def probe() -> list[JSON] | None:
        nodes = await nodes_of(kube, prefix)
        # The condition lives on nodes/status (a second write after the label): wait for both.
        matching = [
            n
            for n in nodes
            if status_of(n, nw) == want
            and at_generation(n)
            and (want != "complete" or (condition_of(n, nw) or {}).get("status") == "True")
        ]
        enough = len(matching) >= count if count is not None else (nodes and len(matching) == len(nodes))
        return nodes if enough else None

    try:
        result: list[JSON] = await fleet.wait_for(probe, within=within, what=f"{nw} {want} on {prefix}")
    except TimeoutError:
        nodes = await nodes_of(kube, prefix)
        summary = {
            n["metadata"]["name"]: (status_of(n, nw), (condition_of(n, nw) or {}).get("message"))
            for n in nodes
        }
        raise TimeoutError(f"{nw} not {want} on all of {prefix}: {summary}") from None
    return result


async def package_pods(kube: KubeClient, nw: str) -> list[JSON]:
    listed = await kube.list_all(
        f"/api/v1/namespaces/{NAMESPACE}/pods", params={"labelSelector": f"nodewright.io/nodewright={nw}"}
    )
    items: list[JSON] = listed["items"]
    return items


@contextlib.asynccontextmanager
async def fleet_of(cluster: ControlPlane, prefix: str, count: int, **kwargs: Any) -> AsyncIterator[list[str]]:
    names = await fleet.create_nodes(cluster.kubeconfig, count=count, name_prefix=prefix, **kwargs)
    try:
        yield names
    finally:
        await fleet.delete_nodes(cluster.kubeconfig, name_prefix=prefix)


class PodCreations:
    """Counts package pod creations of one NodeWright through a pod watch (ADDED events)."""

    def __init__(self, kube: KubeClient, nw: str) -> None:
        self.kube, self.nw = kube, nw
        self.created: list[tuple[str, str, str, str, str]] = []  # (name, node, package, stage, attempt)
        self.created_at: dict[str, str] = {}  # pod name -> creationTimestamp
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> PodCreations:
        listed = await self.kube.list_all(
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            params={"labelSelector": f"nodewright.io/nodewright={self.nw}"},
        )
        rv = str(listed["resourceVersion"])
        self._task = asyncio.create_task(self._run(rv))
        return self

    async def _run(self, rv: str) -> None:
        seen: set[str] = set()
        while True:
            async for event in self.kube.watch(
                f"/api/v1/namespaces/{NAMESPACE}/pods",
                resource_version=rv,
                params={"labelSelector": f"nodewright.io/nodewright={self.nw}"},
            ):
                obj = event["object"]
                if event["type"] == "ERROR":
                    listed = await self.kube.list_all(
                        f"/api/v1/namespaces/{NAMESPACE}/pods",
                        params={"labelSelector": f"nodewright.io/nodewright={self.nw}"},
                    )
                    rv = str(listed["resourceVersion"])
                    break
                rv = obj.get("metadata", {}).get("resourceVersion", rv)
                if event["type"] != "ADDED" or obj["metadata"]["uid"] in seen:
                    continue
                seen.add(obj["metadata"]["uid"])
                self.created_at[obj["metadata"]["name"]] = obj["metadata"]["creationTimestamp"]
                labels = obj["metadata"]["labels"]
                self.created.append(
                    (
                        obj["metadata"]["name"],
                        podspec.pod_node(obj),
                        labels["nodewright.io/package"],
                        labels["nodewright.io/stage"],
                        obj["metadata"]["annotations"]["nodewright.io/attempt"],
                    )
                )

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
