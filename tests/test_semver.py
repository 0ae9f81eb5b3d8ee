"""Semver 2.0 precedence with the reference's lenient forms."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodewright.api.semver import InvalidVersion, Version, compare, is_valid, parse

# semver.org §11: 1.0.0-alpha < 1.0.0-alpha.1 < 1.0.0-alpha.beta < 1.0.0-beta < 1.0.0-beta.2
#                 < 1.0.0-beta.11 < 1.0.0-rc.1 < 1.0.0
SPEC_ORDER = [
    "1.0.0-alpha",
    "1.0.0-alpha.1",
    "1.0.0-alpha.beta",
    "1.0.0-beta",
    "1.0.0-beta.2",
    "1.0.0-beta.11",
    "1.0.0-rc.1",
    "1.0.0",
    "1.0.1",
    "1.1.0",
    "2.0.0",
    "2.1.0",
    "2.1.1",
    "10.0.0",
]


def test_spec_vectors() -> None:
    for lower, higher in itertools.pairwise(SPEC_ORDER):
        assert compare(lower, higher) == -1, (lower, higher)
        assert compare(higher, lower) == 1


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("1.2", "1.2.0"),
        ("v1.2.3", "1.2.3"),
        ("1", "1.0.0"),
        ("1.0.0+build.1", "1.0.0+other"),
        ("1.0.0-rc.1+x", "1.0.0-rc.1"),
    ],
)
def test_equal_forms(a: str, b: str) -> None:
    assert compare(a, b) == 0
    assert parse(a) == parse(b)
    assert hash(parse(a)) == hash(parse(b))


@pytest.mark.parametrize(
    "text", ["", "a", "1.", "1.2.3.4", "01.2.3", "1.02.3", "1.2.3-", "1.2.3-01", "1.2-rc1", "1.2.3+", "v"]
)
def test_invalid(text: str) -> None:
    assert not is_valid(text)
    with pytest.raises(InvalidVersion):
        parse(text)


def test_numeric_lower_than_alphanumeric() -> None:
    assert compare("1.0.0-1", "1.0.0-a") == -1
    assert compare("1.0.0-9", "1.0.0-10") == -1  # numeric identifiers compare numerically
    assert compare("1.0.0-a9", "1.0.0-a10") == 1  # alphanumeric compare in ASCII order


def test_str_normalises() -> None:
    assert str(parse("v1.2")) == "1.2.0"
    assert str(parse("1.2.3-rc.1+b.2")) == "1.2.3-rc.1+b.2"


ident = st.one_of(
    st.integers(0, 30).map(str),
    st.from_regex(r"[a-zA-Z-][0-9a-zA-Z-]{0,3}", fullmatch=True),
)
versions = st.builds(
    Version,
    major=st.integers(0, 3),
    minor=st.integers(0, 3),
    patch=st.integers(0, 3),
    prerelease=st.lists(ident, max_size=3).map(tuple),
    build=st.lists(st.from_regex(r"[0-9a-z]{1,3}", fullmatch=True), max_size=2).map(tuple),
)


@given(versions)
def test_parse_str_round_trip(v: Version) -> None:
    assert parse(str(v)) == v


@given(versions, versions)
def test_antisymmetry_and_totality(a: Version, b: Version) -> None:
    assert (a < b) + (a == b) + (a > b) == 1
    assert compare(str(a), str(b)) == -compare(str(b), str(a))


@given(versions, versions, versions)
def test_transitivity(a: Version, b: Version, c: Version) -> None:
    if a <= b and b <= c:
        assert a <= c


@given(versions)
def test_prerelease_below_release(v: Version) -> None:
    release = Version(v.major, v.minor, v.patch)
    if v.prerelease:
        assert v < release
    else:
        assert v == release
