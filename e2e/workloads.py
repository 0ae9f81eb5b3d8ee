"""Training jobs under PodDisruptionBudgets that behave like real ones while the operator drains nodes.

Nothing recreates evicted pods in the simulator (no StatefulSet controller runs), so with
`maxUnavailable: 1` the disruption controller would allow exactly one eviction ever: it expects
`replicas` pods and one is gone for good. A real training job is rescheduled or shrinks; shrinking
`replicas` to the live pods gives the next node its PDB slot once the evicted pod is gone, which keeps
the one-slot-at-a-time behaviour a drain must respect.

`shrink_with_evictions(kube, job)` does that forever (run it as a task); `shrinking(kube, *jobs)` runs it
for several jobs for the length of a `async with` block. Both ride out API-server restarts: a failed
call is retried on the next round instead of ending the loop (a stopped shrinker would wedge every
later drain behind the PDB, which would look like an operator bug).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

import aiohttp

from nodewright.sim import fleet
from nodewright.sim.kubeapi import ApiError, KubeClient

SHRINK_INTERVAL = 0.5


async def _shrink_once(kube: KubeClient, job: fleet.TrainingJob, touches: itertools.count[int]) -> None:
    path = f"/apis/apps/v1/namespaces/{job.namespace}/{fleet.OWNER_PLURAL}/{job.name}"
    listed = await kube.list_all(
        f"/api/v1/namespaces/{job.namespace}/pods",
        params={"labelSelector": f"{fleet.WORKLOAD_JOB_LABEL}={job.name}"},
    )
    live = len(listed["items"])
    rs = await kube.get(path)
    if rs["spec"].get("replicas") != live:
        await kube.merge_patch(path, {"spec": {"replicas": live}})
    if job.pdb:
        await _recount_budget(kube, job, live, touches)


async def _recount_budget(
    kube: KubeClient, job: fleet.TrainingJob, live: int, touches: itertools.count[int]
) -> None:
    """Touch the job's PDB until the disruption controller expects `live` pods.

    The disruption controller recomputes a budget on pod and PDB events, not on edits of the owner, and
    reads the owner's replicas from its own informer cache. A touch it handles before that cache has the
    new replicas (right after a kube-apiserver restart its watches lag) leaves `expectedPods` at the old
    count, and no event comes to correct it: the budget allows no eviction again and every later drain of
    the job waits forever. So the touch is repeated, with a fresh value (an equal one is no event), while
    the status says otherwise.
    """
    pdb_path = f"/apis/policy/v1/namespaces/{job.namespace}/poddisruptionbudgets/{job.pdb}"
    pdb = await kube.get(pdb_path)
    if (pdb.get("status") or {}).get("expectedPods") == live:
        return
    touch = f"{live}.{next(touches)}"
    await kube.merge_patch(pdb_path, {"metadata": {"annotations": {"e2e.nodewright.io/replicas": touch}}})


async def shrink_with_evictions(kube: KubeClient, job: fleet.TrainingJob) -> None:
    """Keep the job's owner's replicas equal to its live pods, like a job that shrinks on eviction."""
    touches = itertools.count()
    while True:
        with contextlib.suppress(ApiError, aiohttp.ClientError, TimeoutError, ConnectionError, ValueError):
            await _shrink_once(kube, job, touches)
        await asyncio.sleep(SHRINK_INTERVAL)


@contextlib.asynccontextmanager
async def shrinking(kube: KubeClient, *jobs: fleet.TrainingJob) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(shrink_with_evictions(kube, job)) for job in jobs]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
