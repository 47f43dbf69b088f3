"""StepGraph gives networkx's answers, in networkx's order, on random step graphs."""

from __future__ import annotations

import random

import networkx as nx
import pytest

from saga.composition.dag import StepGraph


def random_graphs(seed: int, acyclic: bool) -> tuple[StepGraph, nx.DiGraph]:
    rng = random.Random(seed)
    ids = [f"s{i}" for i in range(rng.randint(1, 25))]
    rng.shuffle(ids)
    ours, theirs = StepGraph(), nx.DiGraph()
    for node in ids:
        ours.add_node(node, step=node)
        theirs.add_node(node, step=node)
    for _ in range(rng.randint(0, 60)):
        a, b = rng.sample(ids, 2) if len(ids) > 1 else (ids[0], ids[0])
        if a == b or (acyclic and ids.index(a) > ids.index(b)):
            continue
        ours.add_edge(a, b)
        theirs.add_edge(a, b)
    return ours, theirs


@pytest.mark.parametrize("seed", range(60))
def test_an_acyclic_graph_reads_as_networkx_reads_it(seed: int) -> None:
    ours, theirs = random_graphs(seed, acyclic=True)
    assert list(ours) == list(theirs) and ours.edges == list(theirs.edges)
    assert ours.nodes == dict(theirs.nodes(data=True))
    assert not ours.has_cycle()
    position = {n: i for i, n in enumerate(reversed(list(theirs)))}

    def key(node: str) -> str:
        return f"{position[node]:08d}"

    assert ours.topological_order(key) == list(nx.lexicographical_topological_sort(theirs,
                                                                                    key=key))
    assert [sorted(g) for g in ours.generations()] == \
        [sorted(g) for g in nx.topological_generations(theirs)]
    for node in theirs:
        assert ours.ancestors(node) == nx.ancestors(theirs, node)
        assert list(ours.predecessors(node)) == list(theirs.predecessors(node))
        assert list(ours.successors(node)) == list(theirs.successors(node))
    assert list(ours.to_networkx().edges) == list(theirs.edges)


@pytest.mark.parametrize("seed", range(60))
def test_a_cycle_is_found_and_named_as_networkx_names_it(seed: int) -> None:
    ours, theirs = random_graphs(seed, acyclic=False)
    try:
        cycle = nx.find_cycle(theirs)
    except nx.NetworkXNoCycle:
        assert not ours.has_cycle()
    else:
        assert ours.has_cycle() and ours.find_cycle() == cycle
