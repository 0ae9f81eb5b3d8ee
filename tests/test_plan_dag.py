"""dependsOn graph: cycle detection and a real frontier."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from nodewright.plan.dag import Graph


def test_frontier_does_not_wait_for_unrelated_roots() -> None:
    # a -> b (b depends on a); c is an unrelated slow root.
    g = Graph.build({"a": [], "b": ["a"], "c": []})
    assert g.frontier(set(), set()) == ["a", "c"]
    assert g.frontier({"a"}, {"c"}) == ["b"]  # the reference would make b wait for c


def test_frontier_excludes_complete_and_in_flight() -> None:
    g = Graph.build({"a": [], "b": ["a"], "c": ["a", "b"]})
    assert g.frontier({"a"}, set()) == ["b"]
    assert g.frontier({"a", "b"}, set()) == ["c"]
    assert g.frontier({"a", "b", "c"}, set()) == []


def test_serial() -> None:
    g = Graph.build({"a": [], "b": [], "c": []})
    assert g.frontier(set(), set(), serial=True) == ["a"]
    assert g.frontier(set(), {"a"}, serial=True) == []
    assert g.frontier({"a"}, set(), serial=True) == ["b"]


def test_cycle_path() -> None:
    g = Graph.build({"a": ["c"], "b": ["a"], "c": ["b"], "d": []})
    cycle = g.find_cycle()
    assert cycle is not None
    assert cycle[0] == cycle[-1]
    assert set(cycle) == {"a", "b", "c"}
    for child, parent in itertools.pairwise(cycle):
        assert parent in g.deps[child]
    assert Graph.build({"a": ["a"]}).find_cycle() == ["a", "a"]
    assert Graph.build({"a": [], "b": ["a"]}).find_cycle() is None


def test_missing() -> None:
    assert Graph.build({"a": ["zz"], "b": []}).missing() == {"a": ("zz",)}


@st.composite
def dags(draw: st.DrawFn) -> Graph:
    n = draw(st.integers(1, 8))
    names = [f"p{i}" for i in range(n)]
    # Edges only to lower indexes: acyclic by construction.
    return Graph.build(
        {names[i]: draw(st.lists(st.sampled_from(names[:i]), max_size=3)) if i else [] for i in range(n)}
    )


@given(dags(), st.data())
def test_frontier_is_exactly_the_ready_set(g: Graph, data: st.DataObject) -> None:
    names = sorted(g.deps)
    complete = set(data.draw(st.lists(st.sampled_from(names), unique=True)))
    flying = set(data.draw(st.lists(st.sampled_from(names), unique=True))) - complete
    front = g.frontier(complete, flying)
    assert front == sorted(front)
    for n in names:
        ready = n not in complete and n not in flying and all(d in complete for d in g.deps[n])
        assert (n in front) == ready  # starts as soon as its own deps complete, never before
    assert g.find_cycle() is None


@given(dags())
def test_walking_the_frontier_completes_every_package(g: Graph) -> None:
    complete: set[str] = set()
    order: list[str] = []
    while front := g.frontier(complete, set()):
        complete.add(front[0])
        order.append(front[0])
    assert complete == set(g.deps)
    for i, n in enumerate(order):
        assert set(g.deps[n]) <= set(order[:i])


@given(dags(), st.data())
def test_adding_a_back_edge_is_found(g: Graph, data: st.DataObject) -> None:
    names = sorted(g.deps)
    for child in names:
        if g.deps[child]:
            parent = g.deps[child][0]
            cyclic = Graph.build(
                {**{k: list(v) for k, v in g.deps.items()}, parent: [*g.deps[parent], child]}
            )
            cycle = cyclic.find_cycle()
            assert cycle is not None and cycle[0] == cycle[-1]
            return
