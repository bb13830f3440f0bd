"""The chapter's figures: a captured FX graph and a joint graph with its save/recompute cut."""
import pytest
import torch
import torch.fx as fx
from matplotlib.figure import Figure

from ptinternals.compile.aot_capture import capture_aot
from ptinternals.compile.fx_cse import eliminate_common_subexpressions
from ptinternals.viz.compile import draw_fx_graph, draw_partition, fx_nodes


def f(x, w):
    return (x.sin() * w).relu().sum()


def test_fx_graph_as_data_and_drawn():
    gm = fx.symbolic_trace(f)
    nodes = fx_nodes(gm)
    assert [n["kind"] for n in nodes] == ["input", "input", "op", "op", "op", "op", "output"]
    assert nodes[3]["inputs"] == [1, 2] and nodes[2]["label"] == "sin\n.sin()"
    assert isinstance(draw_fx_graph(gm, "f"), Figure)
    assert isinstance(draw_fx_graph(fx.symbolic_trace(lambda x: x)), Figure)   # no ops at all
    with pytest.raises(ValueError, match="more than max_nodes=3"):
        draw_fx_graph(gm, max_nodes=3)
    with pytest.raises(TypeError, match="GraphModule or Graph"):
        fx_nodes(f)


def test_partition_drawn():
    cap = capture_aot(f, torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True))
    joint = eliminate_common_subexpressions(cap.joint)
    fig = draw_partition(joint, cap.num_fwd_outputs, cap.saved)
    assert isinstance(fig, Figure) and "saved" in fig.axes[0].get_title()
