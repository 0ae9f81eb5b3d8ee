"""The observability defects of issue 16, one test each (Events and their one list: test_obs_events.py,
test_obs_recorder.py; the drain condition reason and message: test_plan_node.py; the attempts kept on
completion: test_plan_stages.py).

- the `strategy` metric label was cut to `fixed(initial=1,`;
- traces had no spans for cordon, protected pods, drain and uncordon;
- nodes held by a full budget read `NotYetInBatch` once their batch was open, never `BudgetFull`;
  protected- and PDB-blocked nodes were in no waiting count;
- a NodeWright waiting behind a paused one showed no reason;
- no Event when the rollout was paused or disabled, a batch finished, a halted compartment resumed, or
  a deletion waited on a paused NodeWright;
- old per-version package ConfigMaps were never deleted;
- `policy reset --compartment`: the reset annotation takes compartment names.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nodewright.api import constants
from nodewright.api.admission import Admission
from nodewright.api.models import CompartmentStatus, DeploymentPolicy, NodeWright, Status
from nodewright.api.reasons import condition_reason
from nodewright.api.timing import Timing
from nodewright.controller import rollout as rollout_mod
from nodewright.controller.configmaps import PackageConfigMaps
from nodewright.controller.logstore import MAX_STORE_CHARS, KeptLog, bounded_data, kept_logs, store_name
from nodewright.observability.metrics import CompartmentSnapshot, strategy_label
from nodewright.observability.tracing import gate_spans
from nodewright.plan import rollout_input
from nodewright.plan.rollout import RolloutNode, plan_rollout, spec_fingerprint
from tests.test_controller_nodes import nw_obj
from tests.test_controller_rollout_passes import NW_C, _Env, _node, env

T0 = datetime(2026, 1, 1, tzinfo=UTC)
_ = env  # the fixture, used by name below


def test_the_strategy_label_is_the_kind_only() -> None:
    assert strategy_label("fixed(initial=1, stop after 2 failed)") == "fixed"
    assert strategy_label("exponential(initial=1, x2)") == "exponential"
    assert strategy_label("linear(initial=2, +1)") == "linear"
    assert strategy_label("none (batch = ceiling)") == "none"
    assert strategy_label("something else") == "unknown"
    assert CompartmentSnapshot(name="c", strategy="fixed(initial=1,").strategy == "fixed"


def test_gate_spans_for_cordon_protected_pods_drain_and_uncordon() -> None:
    now = T0 + timedelta(minutes=10)
    before = Timing(
        cordoned_at=T0, protected_since=T0 + timedelta(minutes=1), draining_since=T0 + timedelta(minutes=3)
    )
    spans = gate_spans(before, Timing(cordoned_at=T0), now=now, cordoned=False, uncordoned=False)
    assert [(s.stage, s.started_at, s.finished_at, s.error) for s in spans] == [
        ("wait", T0 + timedelta(minutes=1), now, None),
        ("drain", T0 + timedelta(minutes=3), now, None),
    ]
    skipped = gate_spans(
        Timing(draining_since=T0), Timing(), now=now, cordoned=False, uncordoned=True, drain_skipped=True
    )
    assert [s.stage for s in skipped] == ["drain", "uncordon"] and skipped[0].error is not None
    assert [
        s.stage
        for s in gate_spans(Timing(), Timing(cordoned_at=now), now=now, cordoned=True, uncordoned=False)
    ] == ["cordon"]
    assert gate_spans(before, before, now=now, cordoned=False, uncordoned=False) == [], "nothing ended"


def _policy(budget: int, initial: int) -> DeploymentPolicy:
    return DeploymentPolicy.model_validate(
        {
            "metadata": {"name": "pol"},
            "spec": {
                "default": {"budget": {"count": budget}, "strategy": {"fixed": {"initialBatch": initial}}}
            },
        }
    )


def test_budget_full_is_reported_while_the_batch_is_open() -> None:
    nw = NodeWright.model_validate(nw_obj(deploymentPolicy="pol"))
    fp = spec_fingerprint(nw)
    nodes = [RolloutNode(f"n{i}", {}, f"2026-01-01T00:00:0{i}Z", Status.WAITING, True) for i in range(4)]
    first = plan_rollout(
        nw,
        policy=_policy(1, 3),
        nodes=nodes,
        compartment_statuses={},
        fingerprint=fp,
        now="2026-01-01T00:00:10Z",
    )
    assert [a.node for a in first.admissions] == ["n0"]
    assert first.waiting_counts == {"BudgetFull": 2, "NotYetInBatch": 1}
    # The next pass: n0 is admitted and running; the batch is open. The two the strategy wanted are
    # still held by the budget (they used to read NotYetInBatch from here on).
    admitted = Admission("__default__", 1, 0, fp, "2026-01-01T00:00:10Z")
    nodes[0] = RolloutNode("n0", {}, None, Status.IN_PROGRESS, True, admission=admitted)
    again = plan_rollout(
        nw,
        policy=_policy(1, 3),
        nodes=nodes,
        compartment_statuses=first.compartment_statuses,
        fingerprint=fp,
        now="2026-01-01T00:00:20Z",
    )
    assert again.admissions == () and again.waiting_counts == {"BudgetFull": 2, "NotYetInBatch": 1}
    # With a free slot the open batch is what they wait for.
    roomy = plan_rollout(
        nw,
        policy=_policy(3, 1),
        nodes=nodes,
        compartment_statuses=first.compartment_statuses,
        fingerprint=fp,
        now="2026-01-01T00:00:20Z",
    )
    assert roomy.waiting_counts == {"NotYetInBatch": 3}


def test_protected_and_pdb_blocked_nodes_are_counted() -> None:
    def view(
        name: str, reason: str, message: str = "", status: Status = Status.IN_PROGRESS, refused: bool = False
    ) -> Any:
        node = {
            "metadata": {"name": name},
            "status": {"conditions": [{"type": "nodewright.io/nw", "reason": reason, "message": message}]},
        }
        condition = condition_reason(reason)
        return rollout_mod._NodeView(node=node, status=status, condition=condition, evictions_refused=refused)

    plan = plan_rollout(
        NodeWright.model_validate(nw_obj()),
        policy=None,
        nodes=[],
        compartment_statuses={},
        fingerprint="f",
        now="2026-01-01T00:00:00Z",
    )
    views = [
        view("a", "WaitingForProtectedPods"),
        view(
            "b", "Draining", "draining: 1 pod(s) left (ns/p) (eviction blocked: ns/p: PDB web)", refused=True
        ),
        view("c", "DrainTimeout", "draining: drain timeout 5m exceeded (policy wait); 1 pod(s) left (ns/q)"),
        view("d", "Draining", "draining: 2 pod(s) left (ns/x, ns/y)"),  # evictions going through: not held
        view(
            "e", "DrainTimeout", "released", status=Status.BLOCKED
        ),  # skip policy: released, counted elsewhere
    ]
    assert rollout_mod.waiting_counts(plan, views) == {"DrainBlocked": 2, "ProtectedPods": 1}


def test_reset_annotation_takes_compartments() -> None:
    assert rollout_input.parse_reset_annotation("true") == (True, frozenset())
    assert rollout_input.parse_reset_annotation(" zone-a, canary ") == (
        False,
        frozenset({"zone-a", "canary"}),
    )
    assert rollout_input.parse_reset_annotation("") == (False, frozenset())
    halted = CompartmentStatus.model_validate(
        {
            "matched": 3,
            "ceiling": 1,
            "batchState": {"currentBatch": 4, "consecutiveFailures": 2, "shouldStop": True},
        }
    )
    reset = rollout_input.reset_compartments({"a": halted, "b": halted}, frozenset({"a", "zzz"}))
    assert reset["a"].batch_state is not None and not reset["a"].batch_state.should_stop
    assert reset["a"].batch_state.current_batch == 4 and reset["a"].batch_state.consecutive_failures == 0
    assert reset["b"] == halted


def test_the_log_store_is_bounded_and_named_per_nodewright_and_node() -> None:
    assert store_name("nw", "node-1") == "nw.logs.node-1"
    long = store_name("nw", "n" * 300)
    assert len(long) <= 253 and long.startswith("nw.logs.")
    entries: dict[str, str] = {}
    for i in range(100):
        kept = KeptLog(
            "p",
            "1.0.0",
            f"s{i}",
            "failed" if i % 2 else "succeeded",
            "pod",
            1,
            "c",
            1,
            "Error",
            f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z",
            "x" * 8000,
        )
        entries = bounded_data(entries, kept)
        assert sum(len(k) + len(v) for k, v in entries.items()) <= MAX_STORE_CHARS
        assert kept.key in entries, "the newest entry is always kept"
    read = kept_logs({"data": {**entries, "junk": "{not json"}})
    assert read and all(e.log == "x" * 8000 for e in read) and read == sorted(read, key=lambda e: e.at)
    assert sum(e.outcome == "failed" for e in read) > sum(e.outcome == "succeeded" for e in read)


class _Lister:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.deleted: list[str] = []
        self.selector = ""

    async def list(self, _resource: Any, *, namespace: str, label_selector: str) -> Any:
        self.selector = label_selector

        class Listed:
            items = self.items

        return Listed()

    async def delete(self, _resource: Any, name: str, **_kw: Any) -> dict[str, Any]:
        self.deleted.append(name)
        return {}


async def test_old_package_configmaps_are_pruned() -> None:
    def cm(name: str, uid: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "uid": f"cm-{name}", "ownerReferences": [{"uid": uid}]}}

    client = _Lister(
        [cm("nw-tool-1.0.0", "nw-uid"), cm("nw-tool-1.1.0", "nw-uid"), cm("nw-tool-0.9.0", "other")]
    )
    store = PackageConfigMaps(client, namespace="ns")  # type: ignore[arg-type]
    nw = NodeWright.model_validate(nw_obj())
    assert await store.prune(nw, keep={"nw-tool-1.1.0"})
    assert client.deleted == ["nw-tool-1.0.0"], "the spec version and another NodeWright's stay"
    assert client.selector == f"{constants.POD_LABEL_NODEWRIGHT}=nw,{constants.POD_LABEL_PACKAGE}"


# ----------------------------------------------------------------------------------------------------
# Through the rollout controller (real client against the in-memory API server)


def _events(env: _Env) -> list[dict[str, Any]]:
    return list(env.kube.objects.get(("api/v1", "default", "events"), {}).values())


async def _pass(env: _Env) -> None:
    await env.reconciler.reconcile("nw")
    async with asyncio.timeout(5):
        await env.rt.events.flush()


async def test_paused_predecessor_condition_and_pause_events(env: _Env) -> None:
    for name in ("n0", "n1"):
        env.put_node(_node(name))
    first = nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}}, priority=1)
    first["metadata"].update(name="first", uid="first-uid", annotations={constants.ANNOTATION_PAUSE: "true"})
    env.put_nodewright(first)
    env.put_nodewright(nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}}, priority=2))
    await _pass(env)
    status = (env.kube.get(NW_C, "nw") or {})["status"]
    [cond] = [c for c in status["conditions"] if c["type"] == "WaitingForNodeWright"]
    assert cond["status"] == "True" and cond["reason"] == "PredecessorPaused", cond
    assert "'first'" in cond["message"] and "paused" in cond["message"]
    assert status["waitingReasons"] == {"WaitingForPriority": 2}
    await env.reconciler.reconcile("first")
    async with asyncio.timeout(5):
        await env.rt.events.flush()
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in _events(env)}
    assert ("first", "RolloutPaused") in reasons, reasons


async def test_deleting_a_paused_nodewright_records_deletion_blocked(env: _Env) -> None:
    env.put_node(_node("n0"))
    obj = nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}})
    obj["metadata"].update(
        annotations={constants.ANNOTATION_PAUSE: "true"},
        finalizers=[constants.FINALIZER],
        deletionTimestamp="2026-01-01T00:00:00Z",
    )
    env.put_nodewright(obj)
    await _pass(env)
    blocked = [e for e in _events(env) if e["reason"] == "DeletionBlocked"]
    assert len(blocked) == 1 and "Resume it" in blocked[0]["message"]
    await _pass(env)
    assert len([e for e in _events(env) if e["reason"] == "DeletionBlocked"]) == 1, "said once"


@pytest.mark.parametrize("value", ["__default__", "true"])
async def test_policy_reset_of_a_compartment_resumes_it_and_is_consumed(env: _Env, value: str) -> None:
    env.put_node(_node("n0"))
    obj = nw_obj(nodeSelectors={"matchLabels": {"pool": "a"}})
    obj["metadata"]["annotations"] = {constants.ANNOTATION_RESET_BATCH: value}
    obj["status"] = {
        "compartmentStatuses": {
            "__default__": {
                "matched": 1,
                "ceiling": 1,
                "batchState": {"currentBatch": 3, "consecutiveFailures": 2, "shouldStop": True},
            }
        }
    }
    env.put_nodewright(obj)
    env.reconciler._halted["nw"] = frozenset({"__default__"})
    await _pass(env)
    stored = env.kube.get(NW_C, "nw") or {}
    state = stored["status"]["compartmentStatuses"]["__default__"]["batchState"]
    assert not state.get("shouldStop") and not state.get("consecutiveFailures")
    assert constants.ANNOTATION_RESET_BATCH not in (stored["metadata"].get("annotations") or {})
    assert "CompartmentResumed" in {e["reason"] for e in _events(env)}


def test_a_reboot_is_reported_as_node_rebooted_once() -> None:
    """The reference's `Reboot` reason was undocumented here and the reboot itself had no Event: the
    plan now says `NodeRebooted` when the new boot id is seen (mapped to the catalogue, also on the
    NodeWright)."""
    from nodewright.observability import events as catalogue
    from nodewright.plan.node import Event
    from tests.planfake import FakeNode
    from tests.test_plan_node import reboot_nw

    node = FakeNode(reboot_nw())
    node.run()
    rebooted = [
        a for p in node.plans for a in p.actions if isinstance(a, Event) and a.reason == "NodeRebooted"
    ]
    assert len(rebooted) == 1 and node.reboots == 1
    reason = rebooted[0].reason
    assert reason is catalogue.EventReason.NODE_REBOOTED and catalogue.info(reason).also_on_nodewright
