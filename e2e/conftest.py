"""Session fixture: one real local control plane for the whole e2e run.

`cluster` starts etcd, kube-apiserver, kube-controller-manager, kwok and the rebooter in a fresh temporary
directory (under /dev/shm when available: etcd writes are then memory-speed) on free loopback ports, with
zero nodes and the operator namespace created, and tears everything down at the end of the session,
failing the run if any recorded process outlives the teardown. Tests share it, so each test creates its
own uniquely named objects and deletes them.

Set NODEWRIGHT_E2E_CLUSTER_DIR to the `--dir` of a cluster started with `nodewright sim up` to reuse it
(faster iteration); the fixture then neither starts nor stops anything.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

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
