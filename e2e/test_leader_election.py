"""Two operator processes with leader election on the real control plane: exactly one leads; when the
leader is SIGKILLed the other takes over within the lease duration; a clean SIGTERM releases at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodewright.sim.controlplane import ControlPlane, free_port
from nodewright.sim.kubeapi import ApiError

LEASE_DURATION = 15.0
RETRY_PERIOD = 2.0


@dataclass
class Operator:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def readyz(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as resp:
                body: dict[str, Any] = json.loads(resp.read())
                return body
        except urllib.error.HTTPError as err:
            body = json.loads(err.read() or b"{}")
            return body
        except (OSError, ValueError):
            return None

    def leading(self) -> bool:
        status = self.readyz()
        return bool(status and status.get("leader"))

    def identity(self) -> str | None:
        status = self.readyz()
        return None if status is None else status.get("identity")


def _launch(cluster: ControlPlane, lease: str, log: Path) -> Operator:
    port = free_port()
    args = [
        "operator",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--namespace={cluster.namespace}",
        "--leader-elect",
        f"--lease-name={lease}",
        f"--health-probe-bind-address=127.0.0.1:{port}",
        "--metrics-bind-address=0",
        "--log-level=info",
        "--drain-timeout=5",
    ]
    out = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nodewright", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return Operator(proc, port, log)


def _wait(predicate: Any, *, within: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > within:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - start


def _holder(cluster: ControlPlane, lease: str) -> str | None:
    try:
        obj = cluster.api(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{cluster.namespace}/leases/{lease}"
        )
    except ApiError:
        return None
    holder: str | None = obj.get("spec", {}).get("holderIdentity")
    return holder


CRDS = Path(__file__).resolve().parent.parent / "manifests" / "crds"


def _install_crds(cluster: ControlPlane) -> None:
    """The operator's informers need its CRDs (cluster-wide and shared by tests: left installed)."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    cluster.wait_established("-f", str(CRDS))


@pytest.fixture
def operators(cluster: ControlPlane, unique: str, tmp_path: Path) -> Iterator[tuple[str, list[Operator]]]:
    _install_crds(cluster)
    lease = f"nw-e2e-{unique}"
    started = [_launch(cluster, lease, tmp_path / f"op{i}.log") for i in range(2)]
    try:
        yield lease, started
    finally:
        for op in started:
            if op.proc.poll() is None:
                op.proc.kill()
            op.proc.wait(timeout=30)
        cluster.kubectl("-n", cluster.namespace, "delete", "lease", lease, "--ignore-not-found", check=False)


def _exactly_one_leader(ops: list[Operator]) -> Operator:
    leaders = [op for op in ops if op.leading()]
    assert len(leaders) == 1, f"leaders: {[op.port for op in leaders]}"
    return leaders[0]


def _logs(ops: list[Operator]) -> str:
    return "\n".join(f"--- {op.log.name}\n{op.log.read_text()[-3000:]}" for op in ops)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_leader_and_takeover_after_sigkill(
    cluster: ControlPlane, operators: tuple[str, list[Operator]]
) -> None:
    lease, ops = operators
    try:
        _wait(lambda: all((op.readyz() or {}).get("ready") for op in ops), within=90, what="both ready")
        _wait(lambda: any(op.leading() for op in ops), within=30, what="a leader")
        # Watch for a while: never two leaders, and the Lease names the one that says it leads.
        for _ in range(20):
            leader = _exactly_one_leader(ops)
            assert _holder(cluster, lease) == leader.identity()
            time.sleep(0.25)
        standby = next(op for op in ops if op is not leader)
        assert standby.readyz() == {**(standby.readyz() or {}), "ready": True, "leader": False}

        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait(timeout=10)
        took = _wait(standby.leading, within=LEASE_DURATION + 2 * RETRY_PERIOD + 5, what="takeover")
        print(f"\n[e2e] standby took over {took:.1f}s after the leader was killed")
        # Not before the lease could have expired (monotonic expiry on the standby's clock)...
        assert took >= LEASE_DURATION - RETRY_PERIOD - 1.0
        # ...and within the lease duration plus one (jittered) retry period.
        assert took <= LEASE_DURATION + 1.2 * RETRY_PERIOD + 2.0
        assert _holder(cluster, lease) == standby.identity()
    except AssertionError:
        print(_logs(ops))
        raise


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_releases_lease_for_fast_handover(
    cluster: ControlPlane, operators: tuple[str, list[Operator]]
) -> None:
    lease, ops = operators
    try:
        _wait(lambda: any(op.leading() for op in ops), within=90, what="a leader")
        leader = _exactly_one_leader(ops)
        standby = next(op for op in ops if op is not leader)
        leader.proc.send_signal(signal.SIGTERM)
        assert leader.proc.wait(timeout=30) == 0  # orderly shutdown
        took = _wait(standby.leading, within=10, what="handover after release")
        assert took <= 1.2 * RETRY_PERIOD + 2.0  # no need to wait out the lease
        assert _holder(cluster, lease) == standby.identity()
        assert "released the lease" in leader.log.read_text()
    except AssertionError:
        print(_logs(ops))
        raise
