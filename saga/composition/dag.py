"""The dependency graph of a step-list plan, without networkx.

Importing networkx takes longer than the rest of a short ``saga run``, and a step-list
plan needs only a little of it: its steps, their dependencies, a topological order,
ancestors, generations and whether there is a cycle. :class:`StepGraph` answers those
with the same results and in the same order as ``networkx.DiGraph`` (nodes in insertion
order; edges by source in node order, then in insertion order), and hands a real
networkx graph to what needs more (:meth:`StepGraph.to_networkx`: the critical path, the
exact cycle a definition error names).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from saga.lazy import lazy

if TYPE_CHECKING:
    import networkx as nx
else:
    nx = lazy("networkx")

__all__ = ["StepGraph"]


class StepGraph:
    """A directed graph of step ids, read like a ``networkx.DiGraph``: ``nodes[id]`` is a
    node's attribute dict, ``edges`` its (source, target) pairs, ``id in graph``."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self._succ: dict[str, dict[str, None]] = {}
        self._pred: dict[str, dict[str, None]] = {}

    def add_node(self, node: str, **attrs: Any) -> None:
        """Add a node (again: only update its attributes)."""
        if node not in self.nodes:
            self.nodes[node], self._succ[node], self._pred[node] = {}, {}, {}
        self.nodes[node].update(attrs)

    def add_edge(self, source: str, target: str) -> None:
        """Add the edge source -> target, and either node if it is new."""
        self.add_node(source)
        self.add_node(target)
        self._succ[source][target] = None
        self._pred[target][source] = None

    def add_edges_from(self, edges: Iterable[tuple[str, str]]) -> None:
        """Add each (source, target) edge."""
        for source, target in edges:
            self.add_edge(source, target)

    def __contains__(self, node: object) -> bool:
        return node in self.nodes

    def __iter__(self) -> Iterator[str]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def edges(self) -> list[tuple[str, str]]:
        """(source, target) pairs, by source in node order."""
        return [(u, v) for u, targets in self._succ.items() for v in targets]

    def predecessors(self, node: str) -> Iterator[str]:
        """The nodes with an edge to ``node``."""
        return iter(self._pred[node])

    def successors(self, node: str) -> Iterator[str]:
        """The nodes ``node`` has an edge to."""
        return iter(self._succ[node])

    def ancestors(self, node: str) -> set[str]:
        """Every node from which ``node`` can be reached (``networkx.ancestors``)."""
        seen: set[str] = set()
        todo = list(self._pred[node])
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo.extend(self._pred[current])
        seen.discard(node)
        return seen

    def has_cycle(self) -> bool:
        """Whether some node can reach itself."""
        indegree = {n: len(p) for n, p in self._pred.items()}
        ready = [n for n, d in indegree.items() if d == 0]
        done = 0
        while ready:
            done += 1
            for child in self._succ[ready.pop()]:
                indegree[child] -= 1
                if indegree[child] == 0:
                    ready.append(child)
        return done < len(self.nodes)

    def find_cycle(self) -> list[tuple[str, str]]:
        """The cycle ``networkx.find_cycle`` reports (the same edges, so the same error
        message); only called when :meth:`has_cycle` said there is one."""
        return list(nx.find_cycle(self.to_networkx()))

    def topological_order(self, key: Callable[[str], Any]) -> list[str]:
        """``networkx.lexicographical_topological_sort``: among the nodes whose
        dependencies are done, the one with the least ``key`` first. The graph is acyclic."""
        position = {n: i for i, n in enumerate(self.nodes)}
        indegree = {n: len(p) for n, p in self._pred.items() if p}
        ready = [(key(n), position[n], n) for n, p in self._pred.items() if not p]
        heapq.heapify(ready)
        order = []
        while ready:
            node = heapq.heappop(ready)[2]
            for child in self._succ[node]:
                indegree[child] -= 1
                if indegree[child] == 0:
                    heapq.heappush(ready, (key(child), position[child], child))
                    del indegree[child]
            order.append(node)
        return order

    def generations(self) -> list[list[str]]:
        """``networkx.topological_generations``: the sources, then the nodes whose
        dependencies are all in earlier generations, and so on. The graph is acyclic."""
        indegree = {n: len(p) for n, p in self._pred.items()}
        current = [n for n, d in indegree.items() if d == 0]
        out = []
        while current:
            out.append(current)
            following = []
            for node in current:
                for child in self._succ[node]:
                    indegree[child] -= 1
                    if indegree[child] == 0:
                        following.append(child)
            current = following
        return out

    def to_networkx(self) -> nx.DiGraph:
        """The same graph as a ``networkx.DiGraph`` (same node and edge order)."""
        graph = nx.DiGraph()
        for node, attrs in self.nodes.items():
            graph.add_node(node, **attrs)
        graph.add_edges_from(self.edges)
        return graph
