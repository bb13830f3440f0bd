"""Edmonds-Karp and the canonical minimum cut against networkx (what torch's partitioner calls)."""
import math

import networkx as nx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.compile.maxflow import FlowNetwork, min_cut

# capacities with many ties (0, 1, 2) and infinite edges: the cases where "which min cut" matters
capacity = st.sampled_from([0, 1, 1, 2, 2, 3, 5, math.inf])


@st.composite
def networks(draw):
    n = draw(st.integers(2, 9))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), capacity), max_size=25))
    return n, [(u, v, c) for u, v, c in edges if u != v]


def build(n, edges):
    ours, theirs = FlowNetwork(), nx.DiGraph()
    for k in range(n):
        theirs.add_node(k)
        ours.nodes.setdefault(k)
    for u, v, c in edges:
        ours.add_edge(u, v, c)
        theirs.add_edge(u, v, capacity=c)      # both replace the capacity of a repeated edge
    return ours, theirs


@given(networks())
def test_min_cut_is_networkx_cut(net):
    n, edges = net
    ours, theirs = build(n, edges)
    s, t = 0, n - 1
    try:
        value, (source_side, sink_side) = nx.minimum_cut(theirs, s, t)
    except nx.NetworkXUnbounded:
        with pytest.raises(ValueError, match="infinite capacity"):
            ours.min_cut(s, t)
        return
    cut = ours.min_cut(s, t)
    assert cut.value == pytest.approx(value)
    assert cut.sink_side == set(sink_side)       # the same canonical partition, ties included
    assert cut.source_side == set(source_side)
    assert sum(ours.capacity[u][v] for u, v in cut.cut_edges) == pytest.approx(value)


def test_ties_take_the_cut_next_to_the_sink():
    # s -> a -> t with equal capacities: {s->a} and {a->t} are both minimal; networkx cuts a->t
    net = FlowNetwork()
    net.add_edge("s", "a", 1)
    net.add_edge("a", "t", 1)
    cut = net.min_cut("s", "t")
    assert cut.value == 1 and cut.cut_edges == [("a", "t")] and cut.sink_side == {"t"}


def test_disconnected_sink_costs_nothing_and_readding_an_edge_replaces_it():
    net = FlowNetwork()
    net.add_edge("s", "a", 3)
    net.add_edge("b", "t", 4)
    assert net.min_cut("s", "t").value == 0
    net.add_edge("a", "t", 7)
    net.add_edge("a", "t", 2)                   # replaced, not added
    assert net.min_cut("s", "t").value == 2


@pytest.mark.parametrize("args, error, words", [
    (("a", "b", -1), ValueError, ">= 0"),
    (("a", "b", float("nan")), ValueError, ">= 0"),
    (("a", "b", True), TypeError, "number"),
    (("a", "b", "3"), TypeError, "number"),
    (("a", "a", 1), ValueError, "self-loop"),
])
def test_bad_edges_are_refused(args, error, words):
    with pytest.raises(error, match=words):
        FlowNetwork().add_edge(*args)


def test_unknown_terminals_are_refused():
    net = FlowNetwork()
    net.add_edge("s", "t", 1)
    with pytest.raises(ValueError, match="sink 'x' not in the network"):
        net.min_cut("s", "x")
    with pytest.raises(ValueError, match="differ"):
        net.min_cut("s", "s")


def test_flow_must_be_cancelled_along_a_reverse_edge():
    # the shortest augmenting path s-a-b-t blocks both others; the second unit reroutes through b -> a
    edges = [("s", "a", 1), ("a", "b", 1), ("b", "t", 1), ("a", "x", 1), ("x", "y", 1), ("y", "t", 1),
             ("s", "w", 1), ("w", "z", 1), ("z", "b", 1)]
    net = FlowNetwork()
    for e in edges:
        net.add_edge(*e)
    assert net.min_cut("s", "t").value == 2 == min_cut(edges, "s", "t")[0]
    with pytest.raises(ValueError, match=r"edges\[0\] must be \(u, v, capacity\)"):
        min_cut([("s", "t")], "s", "t")
