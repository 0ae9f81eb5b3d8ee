"""Session fixture: one real local control plane for the whole e2e run.

`cluster` starts etcd, kube-apiserver, kube-controller-manager, kwok and the rebooter in a fresh temporary
directory (under /dev/shm when available: etcd writes are then memory-speed) on free loopback ports, with
zero nodes and the operator namespace created, and tears everything down at the end of the session,
failing the run if any recorded process outlives the teardown. Tests share it, so each test creates its
own uniquely named objects and deletes them.

Set NODEWRIGHT_E2E_CLUSTER_DIR to the `--dir` of a cluster started with `nodewright sim up` to reuse it
(faster iteration); the fixture then neither starts nor stops anything.

`invariants` (function-scoped, requested by rollout tests; not autouse) runs the fleet-safety
`InvariantMonitor` (e2e/invariants.py, docs/invariants.md) beside the test and fails it at teardown on any
breach, or when the monitor itself failed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from e2e.invariants import InvariantMonitor, MonitorFailure
from nodewright.sim.binaries import BinariesMissingError, locate
from nodewright.sim.controlplane import ControlPlane, process_running


def _scratch_root() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


@pytest.fixture(scope="session")
def cluster() -> Iterator[ControlPlane]:
    reuse = os.environ.get("NODEWRIGHT_E2E_CLUSTER_DIR")
    if reuse:
        yield ControlPlane.load(Path(reuse))
        return
    try:
        bins = locate()
    except BinariesMissingError as err:
        pytest.fail(str(err))
    root = Path(tempfile.mkdtemp(prefix="nodewright-e2e-", dir=_scratch_root()))
    plane = ControlPlane.create(root / "cp", bins=bins)
    try:
        seconds = plane.up()
        print(f"\n[e2e] control plane up in {seconds:.1f}s at {plane.server} ({plane.dir})")
        yield plane
    finally:
        recorded = [(c.pid, c.start_ticks) for c in plane.components.values() if c.pid is not None]
        plane.down()
        shutil.rmtree(root, ignore_errors=True)
        survivors = [pid for pid, ticks in recorded if process_running(pid, ticks)]
        assert not survivors, f"control-plane processes still running after teardown: {survivors}"


@pytest.fixture
def unique() -> str:
    """A short unique suffix for object names (the session cluster is shared by all tests)."""
    return uuid.uuid4().hex[:6]


@pytest.fixture
async def invariants(cluster: ControlPlane) -> AsyncIterator[InvariantMonitor]:
    """The invariant monitor, started (baseline listed) before the test body runs.

    At teardown: `final_check()` (sync with the cluster, end-state checks), then the test fails with the
    monitor's report on any breach or monitor failure. Tests call `expect_uncordon`, `expect_cleanup`,
    `allow_deletion`/`allow_workload_deletion` for what they do by hand.
    """
    monitor = InvariantMonitor(cluster.kubeconfig, namespace=cluster.namespace)
    try:
        await monitor.start()
    except MonitorFailure as err:
        pytest.fail(f"invariant monitor could not start: {err}", pytrace=False)
    try:
        yield monitor
        await monitor.final_check()
    finally:
        await monitor.stop()
    if monitor.failures or monitor.breaches:
        pytest.fail(monitor.report(), pytrace=False)
