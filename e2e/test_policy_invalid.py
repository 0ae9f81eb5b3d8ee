"""Issue 29 item 2 on the real control plane: blackout days that do not exist.

- The CRD alone (no webhook registered) refuses `2026-02-30` with the field path and what to write, and
  the API server refuses a status time that does not exist (`format: date-time`).
- A DeploymentPolicy stored before this rule existed still reaches the operator: the test stores one the
  way it happened, under the previous CRD (the same schema without the calendar rule), then puts the
  current CRD back -- the API server does not re-validate stored objects. The NodeWright using it gets
  the `PolicyInvalid` condition and a Warning Event naming the policy, the field and the remedy, and no
  node starts; another NodeWright with a valid policy completes meanwhile; `kubectl nodewright status`,
  `why`, `policy show` and `nodewright plan` answer with a clear line and their documented exit codes
  instead of a traceback; fixing the policy resumes the rollout.
"""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import operator_fixture
from e2e.invariants import InvariantMonitor
from e2e.operator_fixture import (
    REPO,
    create_nodewright,
    delete_nodewright,
    get_nodewright,
    nodes_of,
    nodewright_manifest,
    package,
    wait_statuses,
)
from e2e.test_plugin import plugin
from nodewright.api import crdgen
from nodewright.sim import fleet
from nodewright.sim.controlplane import ControlPlane
from nodewright.sim.kubeapi import JSON, ApiError, KubeClient
from nodewright.webhook import configs

crds = operator_fixture.crds
kube = operator_fixture.kube
operator = operator_fixture.operator
operator_factory = operator_fixture.operator_factory

POLICIES = "/apis/nodewright.io/v1alpha1/deploymentpolicies"
NODEWRIGHTS = "/apis/nodewright.io/v1alpha1/nodewrights"
BUDGETS = "/apis/nodewright.io/v1alpha1/disruptionbudgets"
FIELD = "spec.maintenance.blackouts[0].start"


def policy(name: str, start: str, end: str = "2026-03-02") -> JSON:
    return {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DeploymentPolicy",
        "metadata": {"name": name},
        "spec": {
            "default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}},
            "maintenance": {"blackouts": [{"start": start, "end": end, "reason": "freeze"}]},
        },
    }


def _dry_run(cluster: ControlPlane, doc: JSON) -> tuple[int, str]:
    try:
        cluster.api("POST", f"{POLICIES}?dryRun=All", doc)
    except ApiError as err:
        return err.status, str(json.loads(err.body or "{}").get("message"))
    return 201, ""


def _without_calendar_rule(schema: Any) -> Any:
    """The DeploymentPolicy schema of the previous release: blackout days checked for shape only."""
    if isinstance(schema, dict):
        rules = schema.get("x-kubernetes-validations") or []
        kept = [r for r in rules if "02-29" not in r.get("rule", "")]
        out = {k: _without_calendar_rule(v) for k, v in schema.items() if k != "x-kubernetes-validations"}
        if kept:
            out["x-kubernetes-validations"] = kept
        elif len(kept) != len(rules):
            out["pattern"] = r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"
        return out
    if isinstance(schema, list):
        return [_without_calendar_rule(v) for v in schema]
    return schema


def _apply_crd(cluster: ControlPlane, crd: JSON) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(crd))
    cluster.wait_established(f"crd/{crd['metadata']['name']}")


def _until(cluster: ControlPlane, doc: JSON, *, accepted: bool) -> None:
    """A CRD update takes effect asynchronously: poll until a dry run gets the verdict wanted."""
    deadline = time.monotonic() + 60
    while (_dry_run(cluster, doc)[0] < 300) is not accepted:
        assert time.monotonic() < deadline, f"the CRD never {'accepted' if accepted else 'refused'} it"
        time.sleep(0.2)


@pytest.fixture
def stored_before_the_rule(cluster: ControlPlane, crds: None) -> Iterator[Any]:
    """Store policies under the previous CRD (returns a function that does), then restore the current one."""
    current = crdgen.deploymentpolicy_crd()
    probe = policy("probe-old-crd", "2026-02-30")

    def store(doc: JSON) -> None:
        _apply_crd(cluster, _without_calendar_rule(copy.deepcopy(current)))
        _until(cluster, probe, accepted=True)
        try:
            cluster.api("POST", POLICIES, doc)
        finally:
            _apply_crd(cluster, current)
            _until(cluster, probe, accepted=False)

    try:
        yield store
    finally:
        _apply_crd(cluster, current)
        _until(cluster, probe, accepted=False)


def test_the_crd_alone_refuses_a_day_that_does_not_exist(cluster: ControlPlane, crds: None) -> None:
    hooks = cluster.kubectl("get", "validatingwebhookconfigurations", "-o", "name").stdout
    if configs.VALIDATING_NAME in hooks:
        pytest.skip("a NodeWright webhook is registered in this cluster; the schema cannot be seen alone")
    for start, end, field in [
        ("2026-02-30", "2026-03-02", FIELD),
        ("2027-02-01", "2027-02-29", "spec.maintenance.blackouts[0].end"),
    ]:
        code, message = _dry_run(cluster, policy("bad-day", start, end))
        assert code == 422, message
        assert f"{field}: Invalid value" in message, message
        assert "must be a day of the calendar written YYYY-MM-DD" in message, message
    assert _dry_run(cluster, policy("leap-day", "2028-02-29", "2028-03-01"))[0] == 201


async def test_a_stored_impossible_day_blocks_only_its_users_and_every_verb_says_why(
    cluster: ControlPlane,
    operator: Any,
    kube: KubeClient,
    unique: str,
    invariants: InvariantMonitor,
    stored_before_the_rule: Any,
) -> None:
    frozen, fine = f"frozen-{unique}", f"fine-{unique}"
    stuck, moving = f"stuck-{unique}", f"moving-{unique}"
    stored_before_the_rule(policy(frozen, "2026-02-30"))
    await kube.create(POLICIES, policy(fine, "2026-02-28"))
    names = await fleet.create_nodes(cluster.kubeconfig, count=2, name_prefix=stuck)
    await fleet.create_nodes(cluster.kubeconfig, count=2, name_prefix=moving)
    try:
        await create_nodewright(
            kube,
            nodewright_manifest(
                stuck, fleet_prefix=stuck, packages={"tool": package()}, deploymentPolicy=frozen
            ),
        )
        await create_nodewright(
            kube,
            nodewright_manifest(
                moving, fleet_prefix=moving, packages={"tool": package()}, deploymentPolicy=fine
            ),
        )

        async def invalid_condition() -> JSON | None:
            obj = await get_nodewright(kube, stuck) or {}
            conditions = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
            found = conditions.get("PolicyInvalid")
            return found if found is not None and found["status"] == "True" else None

        condition = await fleet.wait_for(invalid_condition, within=60, what="PolicyInvalid on the NodeWright")
        message = condition["message"]
        assert condition["reason"] == "DeploymentPolicyInvalid"
        for words in (f"DeploymentPolicy '{frozen}' is invalid", FIELD, "February 2026 has 28 days",
                      f"kubectl edit deploymentpolicy {frozen}"):  # fmt: skip
            assert words in message, message
        status = (await get_nodewright(kube, stuck) or {})["status"]
        assert status["status"] == "blocked"

        async def warning() -> JSON | None:
            listed = await kube.list_all(
                "/api/v1/namespaces/default/events",
                params={"fieldSelector": f"involvedObject.name={stuck},reason=PolicyInvalid"},
            )
            return next(iter(listed["items"]), None)

        event = await fleet.wait_for(warning, within=30, what="the PolicyInvalid Event")
        assert event["type"] == "Warning" and frozen in event["message"] and FIELD in event["message"]

        # The rest of the fleet keeps progressing while the invalid policy blocks its users.
        await wait_statuses(kube, moving, moving, "complete", within=120)
        assert not any(f"nodewright.io/batch.{stuck}" in (n["metadata"].get("annotations") or {})
                       for n in await nodes_of(kube, stuck))  # fmt: skip

        await _verbs_say_why(cluster, stuck=stuck, frozen=frozen, node=names[0])

        # Fixed: the rollout resumes.
        await kube.merge_patch(
            f"{POLICIES}/{frozen}",
            {"spec": {"maintenance": {"blackouts": [{"start": "2026-02-28", "end": "2026-03-02"}]}}},
        )
        await wait_statuses(kube, stuck, stuck, "complete", within=120)
    finally:
        for nw in (stuck, moving):
            await delete_nodewright(kube, nw)
        for name in (frozen, fine):
            await kube.delete(f"{POLICIES}/{name}")
        for prefix in (stuck, moving):
            await fleet.delete_nodes(cluster.kubeconfig, name_prefix=prefix)


async def _verbs_say_why(cluster: ControlPlane, *, stuck: str, frozen: str, node: str) -> None:
    """Each verb used to exit 1 with `ValueError('day is out of range for month')` and a traceback."""
    done = await plugin(cluster, "status", stuck)
    assert f"DeploymentPolicy '{frozen}' is invalid: {FIELD}" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr
    doc = json.loads((await plugin(cluster, "why", node, stuck, "--events", "0", "-o", "json")).stdout)
    [answer] = doc["answers"]
    assert answer["reason"] == "PolicyInvalid" and FIELD in answer["summary"], answer
    shown = await plugin(cluster, "policy", "show", frozen, expect=3)
    assert shown.stdout == "" and len(shown.stderr.splitlines()) == 1, shown.stderr
    assert FIELD in shown.stderr and "February 2026 has 28 days" in shown.stderr
    planned = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "nodewright", "plan", stuck, "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True, text=True, timeout=120, check=False, cwd=Path(REPO),
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    assert f"DeploymentPolicy '{frozen}' is invalid: {FIELD}" in planned.stdout, planned.stdout
    assert "Traceback" not in planned.stderr


async def test_a_status_time_that_does_not_exist_is_refused(
    kube: KubeClient, crds: None, unique: str
) -> None:
    """`format: date-time` on the status times the operator reads back (a soak's `settledAt`, a
    DisruptionBudget's slot and queue times): the API server refuses one that does not exist, so an edit
    of a status by hand cannot make every pass fail."""
    name = f"times-{unique}"
    budget = {
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "DisruptionBudget",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {"pool": name}}, "budget": {"count": 1}},
    }
    await create_nodewright(kube, nodewright_manifest(name, fleet_prefix=name, packages={"tool": package()}))
    await kube.create(BUDGETS, budget)
    bad = "2026-02-30T00:00:00Z"
    try:
        for path, status, field in [
            (f"{NODEWRIGHTS}/{name}/status",
             {"compartmentStatuses": {"__default__": {"batchState": {"settledAt": bad}}}}, "settledAt"),
            (f"{BUDGETS}/{name}/status", {"waiting": {"some-nw": bad}}, "waiting"),
            (f"{BUDGETS}/{name}/status", {"slots": {"node-1": {"some-nw": bad}}}, "slots"),
        ]:  # fmt: skip
            with pytest.raises(ApiError) as refused:
                await kube.merge_patch(path, {"status": status})
            assert refused.value.status == 422 and field in refused.value.body, refused.value.body
    finally:
        await kube.delete(f"{NODEWRIGHTS}/{name}")
        await kube.delete(f"{BUDGETS}/{name}")
