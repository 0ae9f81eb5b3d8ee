"""Interrupt merging across packages, agent payloads, and config-change interrupts."""

from __future__ import annotations

import base64
import json

from hypothesis import given
from hypothesis import strategies as st

from nodewright.api.models import Interrupt, InterruptType, Package
from nodewright.plan.configdiff import config_hashes, config_interrupt, diff
from nodewright.plan.interrupts import PRIORITY, agent_payload, merge_for_node, merge_interrupts

R = Interrupt(type=InterruptType.REBOOT)
ALL = Interrupt(type=InterruptType.RESTART_ALL_SERVICES)
NOOP = Interrupt(type=InterruptType.NOOP)


def svc(*names: str) -> Interrupt:
    return Interrupt(type=InterruptType.SERVICE, services=list(names))


def test_reboot_wins_and_carrier_is_first_by_name() -> None:
    merged = merge_for_node({"pc": R, "pa": svc("x"), "pb": R})
    assert merged is not None
    assert merged.interrupt.type == InterruptType.REBOOT
    assert merged.carrier == "pb"
    assert merged.skipped == ("pa", "pc")


def test_services_merge_sorted_unique() -> None:
    merged = merge_for_node({"pb": svc("kubelet", "containerd"), "pa": svc("containerd", "a"), "pc": NOOP})
    assert merged is not None
    assert merged.interrupt == svc("a", "containerd", "kubelet")
    assert merged.carrier == "pa"


def test_order_of_strength() -> None:
    assert merge_interrupts([NOOP, svc("x")]) == svc("x")
    assert merge_interrupts([svc("x"), ALL]) == ALL
    assert merge_interrupts([ALL, R]) == R
    assert merge_interrupts([]) is None
    assert merge_for_node({}) is None


def test_agent_payload_vocabulary() -> None:
    def decoded(i: Interrupt) -> dict[str, object]:
        return json.loads(base64.b64decode(agent_payload(i)))  # type: ignore[no-any-return]

    assert decoded(R) == {"type": "node_restart"}
    assert decoded(ALL) == {"type": "restart_all_services"}
    assert decoded(NOOP) == {"type": "no_op"}
    assert decoded(svc("b", "a")) == {"type": "service_restart", "services": ["a", "b"]}


interrupts = st.one_of(
    st.just(R),
    st.just(ALL),
    st.just(NOOP),
    st.lists(st.sampled_from(["a", "b", "c"]), max_size=3).map(lambda s: svc(*s)),
)


@given(st.dictionaries(st.from_regex(r"p[a-e]", fullmatch=True), interrupts, min_size=1))
def test_merge_properties(candidates: dict[str, Interrupt]) -> None:
    merged = merge_for_node(candidates)
    assert merged is not None
    strongest = min(PRIORITY[i.type] for i in candidates.values())
    assert PRIORITY[merged.interrupt.type] == strongest
    assert candidates[merged.carrier].type == merged.interrupt.type
    assert merged.carrier == min(n for n, i in candidates.items() if i.type == merged.interrupt.type)
    assert set(merged.skipped) | {merged.carrier} == set(candidates)
    if merged.interrupt.type == InterruptType.SERVICE:
        want = sorted(
            {s for i in candidates.values() if i.type == InterruptType.SERVICE for s in i.services or []}
        )
        assert merged.interrupt.services == want
    # Merging is order-independent.
    assert merge_for_node(dict(reversed(list(candidates.items())))) == merged


# -- config changes ------------------------------------------------------------------------------------


def test_diff_detects_added_changed_removed() -> None:
    old = config_hashes({"a": "1", "b": "2", "c": "3"})
    new = config_hashes({"a": "1", "b": "20", "d": "4"})
    d = diff(old, new)
    assert d.added == ("d",)
    assert d.changed == ("b",)
    assert d.removed == ("c",)
    assert d.keys == ("b", "c", "d")
    assert not diff(new, new)


@given(
    st.dictionaries(st.text(max_size=4), st.text(max_size=4)),
    st.dictionaries(st.text(max_size=4), st.text(max_size=4)),
)
def test_diff_property(a: dict[str, str], b: dict[str, str]) -> None:
    d = diff(config_hashes(a), config_hashes(b))
    assert set(d.added) == set(b) - set(a)
    assert set(d.removed) == set(a) - set(b)
    assert set(d.changed) == {k for k in set(a) & set(b) if a[k] != b[k]}
    assert bool(d) == (a != b)


def test_config_interrupt_globs() -> None:
    pkg = Package(
        version="1.0.0",
        image="x",
        config_map={"a.conf": "1", "b.sh": "2", "c.sh": "3"},
        config_interrupts={"*.conf": R, "b.sh": svc("s1"), "c.*": svc("s2")},
    )
    assert config_interrupt(pkg, ("a.conf",)) == R
    assert config_interrupt(pkg, ("b.sh", "c.sh")) == svc("s1", "s2")
    assert config_interrupt(pkg, ("zz",)) is None
    assert config_interrupt(pkg, ()) is None
