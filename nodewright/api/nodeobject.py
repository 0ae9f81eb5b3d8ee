"""Typed reads of a raw Node object (trimmed or full), the way every layer reads one.

Node objects stay plain dicts (the informer keeps thousands of them; see `kube.trim`), but every read
of one goes through a function here, which mypy can check and which reads a field one way only: labels
and annotations, Ready, the taints, the facts the node planner takes (`NodeFacts`), and this project's
own keys (status label, state, admission and timing annotations, node condition). A value of ours that
does not decode is reported as such (`try_node_state`, `try_node_admission`), never guessed at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nodewright.api import constants
from nodewright.api.admission import Admission, MalformedAdmission, admission_annotation, decode_admission
from nodewright.api.models import Status
from nodewright.api.nodestate import MalformedNodeState, NodeState, decode
from nodewright.api.timing import Timing, read_timing

JSON = dict[str, Any]
READY = "Ready"


def node_name(node: Mapping[str, Any]) -> str:
    return str(node["metadata"]["name"])


def node_labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    labels: Mapping[str, str] = (node.get("metadata") or {}).get("labels") or {}
    return labels


def node_annotations(node: Mapping[str, Any]) -> Mapping[str, str]:
    annotations: Mapping[str, str] = (node.get("metadata") or {}).get("annotations") or {}
    return annotations


def node_ready(node: Mapping[str, Any]) -> bool:
    """True if the (trimmed or full) node's Ready condition is True."""
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == READY:
            return bool(cond.get("status") == "True")
    return False


def node_unschedulable(node: Mapping[str, Any]) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    effect: str
    value: str | None = None

    def describe(self) -> str:
        """kubectl's `key=value:Effect` (`key:Effect` without a value)."""
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


def node_taints(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    return tuple(
        Taint(key=str(t.get("key") or ""), effect=str(t.get("effect") or ""), value=t.get("value"))
        for t in (node.get("spec") or {}).get("taints") or ()
    )


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the node planner reads of a node (`plan.node`)."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True
    boot_id: str = ""
    kernel: str = ""  # status.nodeInfo.kernelVersion
    os_image: str = ""  # status.nodeInfo.osImage


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    info = (node.get("status") or {}).get("nodeInfo") or {}
    return NodeFacts(
        name=node_name(node),
        labels=dict(node_labels(node)),
        taints=node_taints(node),
        unschedulable=node_unschedulable(node),
        ready=node_ready(node),
        boot_id=str(info.get("bootID") or ""),
        kernel=str(info.get("kernelVersion") or ""),
        os_image=str(info.get("osImage") or ""),
    )


def node_status(node: Mapping[str, Any], nodewright: str) -> Status | None:
    """The node's status label for `nodewright`; None when absent or not a known status."""
    value = node_labels(node).get(constants.status_label(nodewright))
    try:
        return Status(value) if value else None
    except ValueError:
        return None


def node_state(node: Mapping[str, Any], nodewright: str) -> NodeState | None:
    """The decoded state of `nodewright` on `node`; None when absent; raises MalformedNodeState."""
    text = node_annotations(node).get(constants.state_annotation(nodewright))
    if text is None:
        return None
    return decode(text)


def try_node_state(node: Mapping[str, Any], nodewright: str) -> tuple[NodeState | None, str | None]:
    """(state or None, why it does not decode or None)."""
    try:
        return node_state(node, nodewright), None
    except MalformedNodeState as exc:
        return None, str(exc)


def try_node_admission(node: Mapping[str, Any], nodewright: str) -> tuple[Admission | None, str | None]:
    """(admission or None, why the annotation does not decode or None)."""
    text = node_annotations(node).get(admission_annotation(nodewright))
    if text is None:
        return None, None
    try:
        return decode_admission(text), None
    except MalformedAdmission as exc:
        return None, str(exc)


def node_admission(node: Mapping[str, Any], nodewright: str) -> Admission | None:
    """The rollout's admission of `node` for `nodewright`; a malformed one counts as absent."""
    return try_node_admission(node, nodewright)[0]


def node_timing(node: Mapping[str, Any], nodewright: str) -> Timing:
    return read_timing(node_annotations(node), nodewright)


@dataclass(frozen=True, slots=True)
class NodeConditionView:
    """The node condition `nodewright.io/<nw>` as read: `reason` is the code, `message` for people."""

    status: str
    reason: str
    message: str


def node_condition(node: Mapping[str, Any], nodewright: str) -> NodeConditionView | None:
    kind = constants.node_condition_type(nodewright)
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return NodeConditionView(
                status=str(cond.get("status") or ""),
                reason=str(cond.get("reason") or ""),
                message=str(cond.get("message") or ""),
            )
    return None
