"""The revision history on the API (`controller.revisions`): ControllerRevisions created, renumbered and
deleted as `plan.revisions` decides, once per generation, owned by their NodeWright; failures retried.

Real client and HTTP against `FakeKube`."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest

from nodewright.api import constants
from nodewright.controller.revisions import RevisionKeeper
from nodewright.kube.client import KubeClient
from nodewright.plan import revisions as rv
from tests.kubefake import FakeKube

NS = "nodewright-system"
REVS = ("apis/apps/v1", NS, "controllerrevisions")


def nodewright(
    version: str, generation: int, *, limit: int = 10, manager: str = "kubectl-edit"
) -> dict[str, Any]:
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "NodeWright",
        "metadata": {
            "name": "nw",
            "uid": "nw-uid",
            "generation": generation,
            "managedFields": [
                {
                    "manager": manager,
                    "operation": "Update",
                    "time": f"2026-01-0{generation}T00:00:00Z",
                    "fieldsV1": {"f:spec": {"f:packages": {}}},
                }
            ],
        },
        "spec": {
            "packages": {"tune": {"name": "tune", "version": version, "image": "x/tune"}},
            "revisionHistoryLimit": limit,
        },
    }


@pytest.fixture
async def env() -> AsyncIterator[tuple[FakeKube, RevisionKeeper]]:
    kube = await FakeKube().start()
    client = KubeClient(kube.config(), max_retries=0)
    try:
        yield kube, RevisionKeeper(client, namespace=NS)
    finally:
        await client.close()
        await kube.stop()


def stored(kube: FakeKube) -> list[dict[str, Any]]:
    return sorted(kube.objects.get(REVS, {}).values(), key=lambda o: o["revision"])


async def test_each_new_spec_is_recorded_once_and_a_spec_that_comes_back_is_renumbered(
    env: tuple[FakeKube, RevisionKeeper],
) -> None:
    kube, keeper = env
    history = await keeper.observe(nodewright("1.0.0", 1))
    assert [r.number for r in history] == [1]
    (first,) = stored(kube)
    meta = first["metadata"]
    assert meta["name"] == f"nw-{rv.spec_hash(nodewright('1.0.0', 1)['spec'])[:10]}"
    assert meta["labels"] == {
        constants.POD_OWNER_LABEL: constants.POD_OWNER_VALUE,
        "nodewright.io/nodewright": "nw",
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "nodewright.io/v1alpha1",
            "kind": "NodeWright",
            "name": "nw",
            "uid": "nw-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert meta["annotations"] == {
        rv.GENERATION_ANNOTATION: "1",
        rv.CHANGED_BY_ANNOTATION: "kubectl-edit",
        rv.CHANGE_OPERATION_ANNOTATION: "Update",
        rv.CHANGED_AT_ANNOTATION: "2026-01-01T00:00:00Z",
    }
    assert first["data"] == {
        "spec": {"packages": {"tune": {"name": "tune", "version": "1.0.0", "image": "x/tune"}}}
    }

    lists = kube.count("GET", "controllerrevisions")
    await keeper.observe(nodewright("1.0.0", 1))
    assert kube.count("GET", "controllerrevisions") == lists, "a generation already recorded costs nothing"

    await keeper.observe(nodewright("2.0.0", 2))
    back = await keeper.observe(nodewright("1.0.0", 3, manager="kubectl-nodewright"))
    assert [(r.number, r.packages) for r in back] == [(2, "tune:2.0.0"), (3, "tune:1.0.0")]
    objects = stored(kube)
    assert len(objects) == 2 and objects[-1]["metadata"]["name"] == meta["name"], "renumbered, not copied"
    assert objects[-1]["metadata"]["annotations"][rv.CHANGED_BY_ANNOTATION] == "kubectl-nodewright"
    assert objects[-1]["metadata"]["annotations"][rv.GENERATION_ANNOTATION] == "3"


async def test_old_revisions_beyond_the_limit_are_deleted(env: tuple[FakeKube, RevisionKeeper]) -> None:
    kube, keeper = env
    for generation, version in enumerate(["1.0.0", "1.1.0", "1.2.0"], start=1):
        await keeper.observe(nodewright(version, generation))
    await keeper.observe(nodewright("1.3.0", 4, limit=1))
    assert [o["revision"] for o in stored(kube)] == [3, 4]


async def test_a_refused_sync_keeps_the_last_history_and_is_tried_again(
    env: tuple[FakeKube, RevisionKeeper],
) -> None:
    kube, keeper = env
    await keeper.observe(nodewright("1.0.0", 1))
    kube.fail(
        "POST", "controllerrevisions", 403, body={"kind": "Status", "reason": "Forbidden", "message": "no"}
    )
    history = await keeper.observe(nodewright("2.0.0", 2))
    assert [r.packages for r in history] == ["tune:1.0.0"] and len(stored(kube)) == 1
    history = await keeper.observe(nodewright("2.0.0", 2))
    assert [r.packages for r in history] == ["tune:1.0.0", "tune:2.0.0"]


async def test_a_leftover_of_an_earlier_nodewright_of_the_same_name_is_left_alone(
    env: tuple[FakeKube, RevisionKeeper],
) -> None:
    kube, keeper = env
    await keeper.observe(nodewright("1.0.0", 1))
    (leftover,) = stored(kube)
    leftover = copy.deepcopy(leftover)
    leftover["metadata"]["ownerReferences"][0]["uid"] = "gone-uid"
    kube.put(REVS, leftover)  # the NodeWright was deleted and created again before the GC ran
    keeper.forget("nw")
    recreated = nodewright("1.0.0", 1)
    recreated["metadata"]["uid"] = "new-uid"
    history = await keeper.observe(recreated)
    assert [r.name for r in history] == [f"{leftover['metadata']['name']}-1"]
    assert len(stored(kube)) == 2
