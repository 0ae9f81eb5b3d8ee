"""The dependsOn graph of a NodeWright's packages, evaluated per node.

Reference behaviour (anchor §2.7, §11.6): a level-wise walk in which children wait for *unrelated*
incomplete roots, and no cycle detection (a cycle silently never runs). Here:

- `find_cycle` returns one cycle as a path (`[a, b, c, a]`) so validation and status can name it.
- `frontier` is a real frontier: a package may start as soon as all of ITS OWN dependencies are complete
  on the node, independently of other branches. Order is deterministic (by name).
- `serial: true` means at most one package active on the node at a time: the frontier then yields a
  package only when nothing is in flight, and only the first one.

Dependencies on packages that are not in the spec are treated as never complete (the webhook rejects
such specs; the planner reports the package as blocked rather than guessing).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Graph:
    # package -> the packages it depends on (sorted, deduplicated)
    deps: Mapping[str, tuple[str, ...]]

    @classmethod
    def build(cls, edges: Mapping[str, Iterable[str]]) -> Graph:
        return cls(deps={name: tuple(sorted(set(d))) for name, d in edges.items()})

    def missing(self) -> dict[str, tuple[str, ...]]:
        """Dependencies that name packages not in the graph, per package."""
        out = {n: tuple(d for d in ds if d not in self.deps) for n, ds in self.deps.items()}
        return {n: ds for n, ds in out.items() if ds}

    def find_cycle(self) -> list[str] | None:
        """One dependency cycle as a closed path, or None. Deterministic (visits names in order)."""
        white, grey, black = 0, 1, 2
        colour = dict.fromkeys(self.deps, white)
        for root in sorted(self.deps):
            if colour[root] != white:
                continue
            # Iterative DFS keeps deep chains from hitting the recursion limit.
            stack: list[tuple[str, int]] = [(root, 0)]
            path: list[str] = [root]
            colour[root] = grey
            while stack:
                node, idx = stack[-1]
                children = [d for d in self.deps[node] if d in self.deps]
                if idx < len(children):
                    stack[-1] = (node, idx + 1)
                    child = children[idx]
                    if colour[child] == grey:
                        return [*path[path.index(child) :], child]
                    if colour[child] == white:
                        colour[child] = grey
                        stack.append((child, 0))
                        path.append(child)
                else:
                    colour[node] = black
                    stack.pop()
                    path.pop()
        return None

    def ready(self, name: str, complete: set[str] | frozenset[str]) -> bool:
        return all(d in complete for d in self.deps.get(name, ()))

    def frontier(
        self,
        complete: set[str] | frozenset[str],
        in_flight: set[str] | frozenset[str],
        *,
        serial: bool = False,
    ) -> list[str]:
        """Packages that may start now: not complete, not in flight, all own dependencies complete."""
        if serial and in_flight:
            return []
        out = [
            n
            for n in sorted(self.deps)
            if n not in complete and n not in in_flight and self.ready(n, complete)
        ]
        return out[:1] if serial else out
