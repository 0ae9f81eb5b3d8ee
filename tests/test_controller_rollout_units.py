"""Unit tests of the rollout pass's pure helpers (merge patches, availability, blocking)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodewright.api import constants
from nodewright.api.models import NodeWright
from nodewright.api.nodestate import NodeState, encode
from nodewright.api.reasons import Activity
from nodewright.controller.budgets import merge_patch
from nodewright.plan.rollout_input import NodeContext, blocked, node_context, unavailable

NOW = datetime(2026, 1, 1, tzinfo=UTC)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=12,
)


def _apply(target: Any, patch: Any) -> Any:
    """RFC 7386 merge-patch application (the API server's semantics)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _apply(result.get(key), value)
    return result


def _no_nulls(value: Any) -> bool:
    if isinstance(value, dict):
        return all(v is not None and _no_nulls(v) for v in value.values())
    return True


@given(old=st.dictionaries(st.text(max_size=4), json_values, max_size=5), new=json_values)
def test_merge_patch_turns_old_into_new(old: dict[str, Any], new: Any) -> None:
    if not isinstance(new, dict) or not _no_nulls(new):
        return
    patch = merge_patch(old, new)
    if patch is None:
        assert old == new
    else:
        assert _apply(old, patch) == new


def _node(
    *, unschedulable: bool = False, ready: bool = True, annotations: dict[str, str] | None = None
) -> Any:
    return {
        "metadata": {"name": "n1", "labels": {}, "annotations": annotations or {}},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def _ctx(names: list[str], inactive: dict[str, Activity] | None = None) -> NodeContext:
    return node_context(_nodewright(), now=NOW, all_nodewrights=names, inactive=inactive)


def unavailable_reason(node: Any, *, own: NodeState | None, names: list[str], **kw: Any) -> str | None:
    """The description of `unavailable` (what people read; the code is the record's type)."""
    found = unavailable(_ctx(names, **kw), node, own=own)
    return found.describe() if found is not None else None


def test_unavailable_reasons() -> None:
    assert unavailable_reason(_node(), own=None, names=["a"]) is None
    assert unavailable_reason(_node(unschedulable=True), own=None, names=["a"]) == (
        "cordoned by someone else"
    )
    assert unavailable_reason(_node(ready=False), own=None, names=["a"]) == "NotReady"
    ours = NodeState(cordoned=True)
    assert unavailable_reason(_node(unschedulable=True), own=ours, names=["a"]) is None
    other = _node(unschedulable=True, annotations={constants.state_annotation("b"): encode(ours)})
    assert unavailable_reason(other, own=None, names=["a", "b"]) == "cordoned by NodeWright 'b'"
    paused = unavailable_reason(other, own=None, names=["a", "b"], inactive={"b": Activity.PAUSED})
    assert paused is not None and "'b', which is paused" in paused and "until resumed" in paused
    disabled = unavailable_reason(other, own=None, names=["a", "b"], inactive={"b": Activity.DISABLED})
    assert disabled is not None and "'b', which is disabled" in disabled


def _nodewright(tolerations: list[dict[str, str]] | None = None) -> NodeWright:
    spec: dict[str, Any] = {"packages": {"pkg": {"version": "1.0.0", "image": "r/p"}}}
    if tolerations:
        spec["additionalTolerations"] = tolerations
    return NodeWright.model_validate(
        {"apiVersion": constants.API_VERSION, "kind": "NodeWright", "metadata": {"name": "nw"}, "spec": spec}
    )


def blocked_reason(nodewright: NodeWright, node: Any, *, runtime_taint_key: str) -> str | None:
    found = blocked(node_context(nodewright, now=NOW, runtime_taint_key=runtime_taint_key), node)
    return found.describe() if found is not None else None


def test_blocked_reasons() -> None:
    node = _node()
    assert blocked_reason(_nodewright(), node, runtime_taint_key="rt") is None
    node["metadata"]["labels"][constants.LABEL_IGNORE] = "true"
    assert "ignore" in (blocked_reason(_nodewright(), node, runtime_taint_key="rt") or "")
    tainted = _node()
    tainted["spec"]["taints"] = [{"key": "gpu", "value": "broken", "effect": "NoExecute"}]
    assert "gpu=broken:NoExecute" in (blocked_reason(_nodewright(), tainted, runtime_taint_key="rt") or "")
    tolerant = _nodewright([{"key": "gpu", "operator": "Exists"}])
    assert blocked_reason(tolerant, tainted, runtime_taint_key="rt") is None
