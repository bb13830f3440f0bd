"""viz.autograd: the walk gives torch's node names and edges; drawings are Figures, for both engines."""
from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure

from ptinternals.autograd import Variable
from ptinternals.viz.autograd import draw_graph, draw_graphs, layout, walk_graph


def build(make):
    x, w, b = make((4, 3)), make((3, 5)), make((5,))
    h = (x @ w + b).relu()
    return (h * h).mean() + (w * 2.0).sum()


def torch_make(shape):
    return torch.randn(shape, requires_grad=True)


def mini_make(shape):
    return Variable(torch.randn(shape), requires_grad=True)


def test_walk_graph_of_torch_graph():
    nodes = walk_graph(build(torch_make))
    names = [n["name"] for n in nodes]
    assert names[0] == "AddBackward0" and nodes[0]["kind"] == "root"
    assert {"MmBackward0", "ReluBackward0", "MeanBackward0", "AccumulateGrad"} <= set(names)
    leaf_labels = sorted(n["label"] for n in nodes if n["kind"] == "leaf")
    assert leaf_labels == ["AccumulateGrad\n(3, 5)", "AccumulateGrad\n(4, 3)", "AccumulateGrad\n(5,)"]
    mul = next(n for n in nodes if n["name"] == "MulBackward0" and len(n["next"]) == 2)
    assert mul["next"][0] == mul["next"][1]  # h * h: two edges to the same node


def test_walk_graph_same_for_both_engines():
    assert walk_graph(build(mini_make)) == walk_graph(build(torch_make))


def test_layout_puts_every_consumer_above_its_inputs():
    nodes = walk_graph(build(torch_make))
    pos = layout(nodes)
    for n in nodes:
        for j, _ in n["next"]:
            assert pos[j][1] > pos[n["id"]][1]
    assert len(set(pos.values())) == len(nodes)  # no two boxes on the same spot


def test_draw_returns_figures():
    fig = draw_graph(build(torch_make), title="torch")
    assert isinstance(fig, Figure)
    fig2 = draw_graphs([("torch", build(torch_make)), ("mini engine", build(mini_make))])
    assert isinstance(fig2, Figure) and len(fig2.axes) == 2
    x = Variable(torch.randn(3), requires_grad=True)
    assert isinstance(draw_graph((x * 2.0).sum().grad_fn), Figure)  # a node works as the root too


def test_draw_input_errors():
    with pytest.raises(ValueError, match="no grad_fn"):
        draw_graph(torch.randn(3, requires_grad=True))
    with pytest.raises(TypeError, match="root must be"):
        draw_graph([1, 2])
    with pytest.raises(TypeError, match="list of \\(title, root\\) pairs"):
        draw_graphs([])
    with pytest.raises(TypeError, match="pair"):
        draw_graphs([build(torch_make)])
    with pytest.raises(ValueError, match="max_nodes"):
        draw_graph(build(torch_make), max_nodes=3)
    with pytest.raises(ValueError, match="max_nodes must be a positive int"):
        draw_graph(build(torch_make), max_nodes=0)
