"""The webhook reads package presence on nodes with the operator's own node-state codec."""

from __future__ import annotations

import pytest

from nodewright.api.nodestate import NodeState, PackageEntry, PackageStage, PackageState, encode
from nodewright.webhook.facts import packages_in_state
from nodewright.webhook.server import LookupError_


def test_every_entry_counts_as_present() -> None:
    state = NodeState(
        packages=(
            PackageEntry("driver", "2.0.0", PackageStage.APPLY, PackageState.COMPLETE),
            PackageEntry("driver", "1.0.0", PackageStage.CONFIG, PackageState.COMPLETE),
            PackageEntry("agent", "1.0.0", PackageStage.UNINSTALL, PackageState.IN_PROGRESS),
        )
    )
    assert packages_in_state(encode(state)) == {"driver", "agent"}
    assert packages_in_state(encode(NodeState())) == set()


def test_unparsable_state_is_a_lookup_failure() -> None:
    with pytest.raises(LookupError_, match="cannot be parsed"):
        packages_in_state('{"v": 99}')
