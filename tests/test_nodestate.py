"""Codec of the node state annotation: round trip, determinism, and strict rejection of bad input."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodewright.api.nodestate import (
    Admission,
    MalformedNodeState,
    NodeState,
    PackageEntry,
    PackageStage,
    PackageState,
    decode,
    encode,
    truncate_error,
)

names = st.from_regex(r"[a-z][-a-z0-9]{0,10}[a-z]", fullmatch=True)
versions = st.from_regex(r"[0-9]{1,2}\.[0-9]{1,2}\.[0-9]{1,2}(-rc[0-9])?", fullmatch=True)
stamps = st.builds(
    lambda d, h, m, s: f"2025-01-{d:02d}T{h:02d}:{m:02d}:{s:02d}Z",
    st.integers(1, 28),
    st.integers(0, 23),
    st.integers(0, 59),
    st.integers(0, 59),
)
hexes = st.from_regex(r"[0-9a-f]{8}", fullmatch=True)
texts = st.text(max_size=40)

entries = st.builds(
    PackageEntry,
    name=names,
    version=versions,
    stage=st.sampled_from(PackageStage),
    state=st.sampled_from(PackageState),
    attempts=st.integers(0, 10),
    started=st.none() | stamps,
    updated=st.none() | stamps,
    image=st.sampled_from(["", "ghcr.io/x/p:1.0.0", "registry:5000/p@sha256:" + "a" * 64]),
    config=st.dictionaries(st.text(min_size=1, max_size=12), hexes, max_size=4).map(
        lambda d: tuple(sorted(d.items()))
    ),
    changed=st.lists(st.text(min_size=1, max_size=8), max_size=3, unique=True).map(
        lambda k: tuple(sorted(k))
    ),
    error=texts,
    retry_at=st.none() | stamps,
    spec_hash=st.sampled_from(["", "0123456789abcdef"]),
    pull_error_since=st.none() | stamps,
    suspended=st.booleans(),
)

states = st.builds(
    NodeState,
    packages=st.lists(entries, max_size=5, unique_by=lambda e: e.key).map(tuple),
    admission=st.none()
    | st.builds(
        Admission,
        compartment=st.text(min_size=1, max_size=10),
        batch=st.integers(0, 50),
        order=st.integers(0, 10_000),
        at=stamps,
    ),
    cordoned=st.booleans(),
    boot_id=st.none() | st.text(min_size=1, max_size=36),
    interrupt_at=st.none() | stamps,
    generation=st.none() | st.integers(0, 10**6),
)


@given(states)
def test_round_trip(state: NodeState) -> None:
    text = encode(state)
    assert decode(text) == state
    assert encode(decode(text)) == text  # deterministic / canonical


@given(states)
def test_encoding_is_compact_sorted_json(state: NodeState) -> None:
    text = encode(state)
    assert json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False) == text


def test_construction_order_does_not_matter() -> None:
    a = PackageEntry(name="pa", version="1.0.0", stage=PackageStage.APPLY, state=PackageState.PENDING)
    b = PackageEntry(name="pb", version="1.0.0", stage=PackageStage.APPLY, state=PackageState.PENDING)
    assert encode(NodeState(packages=(a, b))) == encode(NodeState(packages=(b, a)))


def test_old_and_new_versions_coexist() -> None:
    old = PackageEntry(name="pa", version="2.0.0", stage=PackageStage.CONFIG, state=PackageState.COMPLETE)
    new = PackageEntry(name="pa", version="1.0.0", stage=PackageStage.APPLY, state=PackageState.PENDING)
    state = decode(encode(NodeState(packages=(old, new))))
    assert {e.version for e in state.entries_for("pa")} == {"1.0.0", "2.0.0"}


def test_duplicates_rejected() -> None:
    a = PackageEntry(name="pa", version="1.0.0", stage=PackageStage.APPLY, state=PackageState.PENDING)
    with pytest.raises(ValueError):
        NodeState(packages=(a, a))


def test_size_budget_for_a_typical_node() -> None:
    pkgs = tuple(
        PackageEntry(
            name=f"package-{i}",
            version="1.2.3",
            stage=PackageStage.POST_INTERRUPT,
            state=PackageState.COMPLETE,
            started="2025-01-01T00:00:00Z",
            updated="2025-01-01T00:10:00Z",
            image=f"ghcr.io/org/package-{i}:1.2.3",
            config=tuple((f"file{k}.sh", "deadbeef") for k in range(5)),
        )
        for i in range(20)
    )
    text = encode(
        NodeState(packages=pkgs, admission=Admission("gpu", 3, 17, "2025-01-01T00:00:00Z"), generation=4)
    )
    assert len(text) < 8 * 1024  # 20 packages with 5 config keys each stay far below the 256 KiB budget


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "not valid JSON"),
        ("{", "not valid JSON"),
        ("[]", "expected an object"),
        ('{"p":{}}', "missing field(s) ['v']"),
        ('{"v":2,"p":{}}', "schema version 2"),
        ('{"v":true,"p":{}}', "expected an integer"),
        ('{"v":1,"p":[]}', "expected an object"),
        ('{"v":1,"p":{},"zz":1}', "unknown field"),
        ('{"v":1,"p":{"pa":{"s":"apply","t":"pending"}}}', "<name>|<version>"),
        ('{"v":1,"p":{"pa|1":{"s":"bogus","t":"pending"}}}', "unknown value 'bogus'"),
        ('{"v":1,"p":{"pa|1":{"s":"apply"}}}', "missing field(s) ['t']"),
        ('{"v":1,"p":{"pa|1":{"s":"apply","t":"pending","n":-1}}}', "must be >= 0"),
        ('{"v":1,"p":{"pa|1":{"s":"apply","t":"pending","n":"1"}}}', "expected an integer"),
        ('{"v":1,"p":{"pa|1":{"s":"apply","t":"pending","b":"yesterday"}}}', "RFC3339"),
        ('{"v":1,"p":{"pa|1":{"s":"apply","t":"pending","c":{"k":"XYZ"}}}}', "hex hash"),
        ('{"v":1,"p":{"pa|1":{"s":"apply","t":"pending","k":"a"}}}', "expected a list"),
        ('{"v":1,"p":{},"a":{"c":"x","b":1,"o":1}}', "missing field(s) ['at']"),
        ('{"v":1,"p":{},"cd":"true"}', "expected a boolean"),
        ('{"v":1,"p":{},"g":1.5}', "expected an integer"),
    ],
)
def test_malformed(text: str, fragment: str) -> None:
    with pytest.raises(MalformedNodeState) as err:
        decode(text)
    assert fragment in str(err.value)


@given(st.text(max_size=50))
def test_arbitrary_text_never_crashes_other_than_malformed(text: str) -> None:
    with contextlib.suppress(MalformedNodeState):
        decode(text)


def test_error_truncation() -> None:
    assert truncate_error("x" * 10) == "x" * 10
    assert len(truncate_error("x" * 5000)) == 512
