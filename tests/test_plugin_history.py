"""`kubectl nodewright history` and `undo` as users run them (`python -m nodewright ...` in a
subprocess against `tests.kubefake`): what they print, what they write, and every refusal with its
exit code (docs/plugin.md)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nodewright.plan import revisions as rv
from tests.kubefake import FakeKube
from tests.test_cli_conventions import NODEWRIGHTS_C, cli
from tests.test_cli_operator import write_kubeconfig

NS = "nodewright-system"
REVS_C = ("apis/apps/v1", NS, "controllerrevisions")


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    server = await FakeKube().start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def kubeconfig(tmp_path: Path, kube: FakeKube) -> str:
    return str(write_kubeconfig(tmp_path / "kubeconfig", kube.url))


def spec(version: str, **pkg: Any) -> dict[str, Any]:
    return {"packages": {"tune": {"name": "tune", "version": version, "image": "x/tune", **pkg}}}


def seed(
    kube: FakeKube, *versions: str, current: str | None = None, pkg: Any = None, **metadata: Any
) -> dict[str, Any]:
    """A NodeWright at `current` (default: the last version) with one revision per version; `pkg`: more
    fields of the package in every spec."""
    current = current or versions[-1]
    obj = kube.put(
        NODEWRIGHTS_C,
        {
            "apiVersion": "nodewright.io/v1alpha1",
            "kind": "NodeWright",
            "metadata": {
                "name": "nw",
                "generation": len(versions),
                "labels": {"team": "gpu"},
                "managedFields": [
                    {"manager": "kubectl-edit", "operation": "Update", "fieldsV1": {"f:spec": {}}}
                ],
                **metadata,
            },
            "spec": {**spec(current, **(pkg or {})), "revisionHistoryLimit": 4},
            "status": {"status": "blocked"},
        },
    )
    uid = obj["metadata"]["uid"]
    for number, version in enumerate(versions, start=1):
        kube.put(
            REVS_C,
            {
                "apiVersion": "apps/v1",
                "kind": "ControllerRevision",
                "metadata": {
                    "name": f"nw-{version}",
                    "labels": {
                        "nodewright.io/managed-by": "nodewright-operator",
                        "nodewright.io/nodewright": "nw",
                    },
                    "annotations": {
                        rv.GENERATION_ANNOTATION: str(number),
                        rv.CHANGED_BY_ANNOTATION: "kubectl-client-side-apply",
                        rv.CHANGE_OPERATION_ANNOTATION: "Update",
                        rv.CHANGED_AT_ANNOTATION: f"2026-01-0{number}T00:00:00Z",
                    },
                    "ownerReferences": [{"uid": uid, "kind": "NodeWright", "name": "nw"}],
                },
                "data": {"spec": spec(version, **(pkg or {}))},
                "revision": number,
            },
        )
    return obj


def puts(kube: FakeKube) -> list[dict[str, Any]]:
    return [r.body for r in kube.requests if r.method == "PUT" and "nodewrights" in r.path]


async def test_history_lists_the_revisions_and_marks_the_current_one(kube: FakeKube, kubeconfig: str) -> None:
    seed(kube, "1.0.0", "2.0.0")
    ran = await cli("history", "nw", "--kubeconfig", kubeconfig)
    assert ran.code == 0, ran
    lines = ran.out.splitlines()
    assert lines[0].split() == ["REVISION", "CHANGED", "BY", "GENERATION", "PACKAGES"]
    assert lines[1].split() == [
        "1",
        "2026-01-01T00:00:00Z",
        "kubectl-client-side-apply",
        "(Update)",
        "1",
        "tune:1.0.0",
    ]
    assert lines[2].split()[:2] == ["2", "*"] and lines[2].endswith("tune:2.0.0")
    doc = json.loads((await cli("history", "nw", "-o", "json", "--kubeconfig", kubeconfig)).out)
    assert doc["current"] == 2 and [r["revision"] for r in doc["revisions"]] == [1, 2]
    one = await cli("history", "nw", "--revision", "1", "--kubeconfig", kubeconfig)
    assert one.code == 0 and "version: 1.0.0" in one.out, one
    missing = await cli("history", "nw", "--revision", "9", "--kubeconfig", kubeconfig)
    assert missing.code == 3 and "has no revision 9 (revisions: 1, 2)" in missing.one_line_error()


async def test_history_says_when_the_current_spec_is_not_recorded_yet(
    kube: FakeKube, kubeconfig: str
) -> None:
    seed(kube, "1.0.0", current="3.0.0")
    ran = await cli("history", "nw", "--kubeconfig", kubeconfig)
    assert ran.code == 0 and "is not recorded yet" in ran.out, ran


async def test_undo_writes_the_previous_revision_back_as_an_update_of_the_spec(
    kube: FakeKube, kubeconfig: str
) -> None:
    before = seed(kube, "1.0.0", "2.0.0")
    ran = await cli("undo", "nw", "-y", "--kubeconfig", kubeconfig)
    assert ran.code == 0, ran
    assert ran.out.startswith(
        "nodewright/nw undone to revision 1 (tune:1.0.0): tune: 2.0.0 -> 1.0.0: downgrade"
    )
    (body,) = puts(kube)
    assert body["spec"] == {**spec("1.0.0"), "revisionHistoryLimit": 4}, "only the spec, the limit kept"
    assert body["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert body["metadata"]["labels"] == {"team": "gpu"} and "managedFields" not in body["metadata"]
    assert "status" not in body
    assert [r.query.get("fieldManager") for r in kube.requests if r.method == "PUT"] == ["kubectl-nodewright"]
    # At revision 1 now (the operator renumbers it; here the spec is what counts): nothing to undo to 1.
    again = await cli("undo", "nw", "--to-revision", "1", "-y", "--kubeconfig", kubeconfig)
    assert again.code == 0 and "nothing to undo" in again.out, again


async def test_undo_asks_first_and_dry_runs_write_nothing(kube: FakeKube, kubeconfig: str) -> None:
    seed(kube, "1.0.0", "2.0.0")
    ran = await cli("undo", "nw", "--kubeconfig", kubeconfig)
    assert ran.code == 4 and "not confirmed: pass -y" in ran.one_line_error(), ran
    client = await cli("undo", "nw", "--dry-run", "-o", "json", "--kubeconfig", kubeconfig)
    assert client.code == 0 and json.loads(client.out)["revision"] == 1, client
    assert puts(kube) == []
    server = await cli("undo", "nw", "--dry-run=server", "--kubeconfig", kubeconfig)
    assert server.code == 0, server
    assert [r.query.get("dryRun") for r in kube.requests if r.method == "PUT"] == ["All"]


async def test_undo_refuses_a_nodewright_that_gitops_manages_unless_forced(
    kube: FakeKube, kubeconfig: str
) -> None:
    seed(
        kube,
        "1.0.0",
        "2.0.0",
        annotations={"argocd.argoproj.io/tracking-id": "gpu:nodewright.io/NodeWright:nw"},
    )
    ran = await cli("undo", "nw", "-y", "--kubeconfig", kubeconfig)
    assert ran.code == 4, ran
    err = ran.one_line_error()
    assert "managed by Argo CD" in err and "revert the change in git instead" in err and "--force" in err
    assert puts(kube) == []
    forced = await cli("undo", "nw", "-y", "--force", "--kubeconfig", kubeconfig)
    assert forced.code == 0 and len(puts(kube)) == 1, forced


async def test_an_uninstall_enabled_downgrade_is_refused_or_done_in_two_steps(
    kube: FakeKube, kubeconfig: str
) -> None:
    seed(kube, "1.0.0", "2.0.0", pkg={"uninstall": {"enabled": True}})
    ran = await cli("undo", "nw", "-y", "--kubeconfig", kubeconfig)
    assert ran.code == 4 and puts(kube) == [], ran
    err = ran.one_line_error()
    assert "needs 2.0.0 uninstalled first" in err
    assert "kubectl nodewright undo nw --to-revision 1 --uninstall-first" in err
    step = await cli("undo", "nw", "-y", "--uninstall-first", "--kubeconfig", kubeconfig)
    assert step.code == 0 and "step 1 of 2" in step.out, step
    (body,) = puts(kube)
    assert body["spec"]["packages"]["tune"]["version"] == "2.0.0"
    assert body["spec"]["packages"]["tune"]["uninstall"] == {"enabled": True, "apply": True}


@pytest.mark.parametrize(
    ("status", "reason", "code", "says"),
    [
        (409, "Conflict", 4, "changed since it was read: nothing written"),
        (422, "Invalid", 4, "the API server refused the way back: * spec.packages[tune]: refused"),
        (403, "Forbidden", 1, "check RBAC"),
    ],
)
async def test_undo_failures_are_one_line_with_their_exit_code(
    kube: FakeKube, kubeconfig: str, status: int, reason: str, code: int, says: str
) -> None:
    seed(kube, "1.0.0", "2.0.0")
    message = "* spec.packages[tune]: refused" if status == 422 else reason
    kube.fail("PUT", "nodewrights", status, body={"kind": "Status", "reason": reason, "message": message})
    ran = await cli("undo", "nw", "-y", "--kubeconfig", kubeconfig)
    assert ran.code == code and says in ran.one_line_error(), ran


async def test_nothing_to_go_back_to_is_not_found(kube: FakeKube, kubeconfig: str, tmp_path: Path) -> None:
    ran = await cli("undo", "nope", "-y", "--kubeconfig", kubeconfig)
    assert ran.code == 3 and "'nope' not found" in ran.one_line_error()
    seed(kube, "1.0.0")
    ran = await cli("undo", "nw", "-y", "--kubeconfig", kubeconfig)
    assert ran.code == 3 and "no revision before the current spec" in ran.one_line_error(), ran
    ran = await cli("undo", "nw", "--to-revision", "5", "-y", "--kubeconfig", kubeconfig)
    assert ran.code == 3 and "has no revision 5 (revisions: 1)" in ran.one_line_error(), ran
