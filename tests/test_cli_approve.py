"""`nodewright approve`: which gates it approves, and the annotation format the planner reads."""

from __future__ import annotations

from nodewright.cli.main import build_parser
from nodewright.cli.plugin.approve_verbs import gates_to_approve
from nodewright.plan.rollout import format_approvals, parse_approvals


def test_gates_come_from_awaiting_approval_in_the_status() -> None:
    status: dict[str, object] = {
        "compartmentStatuses": {
            "canary": {"awaitingApproval": 1},
            "zone-a": {"matched": 3},
            "zone-b": {"awaitingApproval": 2},
        }
    }
    assert gates_to_approve(status, None) == {"canary": 1, "zone-b": 2}
    assert gates_to_approve(status, ["zone-b"]) == {"zone-b": 2}
    assert gates_to_approve({}, None) == {}


def test_annotation_round_trip_ignores_unreadable_entries() -> None:
    approvals = {"zone-b": 2, "canary": 1}
    assert format_approvals(approvals) == "canary=1,zone-b=2"
    assert parse_approvals(format_approvals(approvals)) == approvals
    assert parse_approvals("canary=x, =3,zone-a=4,junk") == {"zone-a": 4}
    assert parse_approvals(None) == {}


def test_approve_is_a_command() -> None:
    args = build_parser().parse_args(["approve", "gpu-drivers", "--compartment", "canary"])
    assert args.nodewright == "gpu-drivers" and args.compartment == ["canary"]
