"""viz/modules.py: the tree description and the hook trace are the same for torch and the reference; figures draw."""
from __future__ import annotations

import io

import pytest
import torch
from matplotlib.figure import Figure

from ptinternals.modules import MiniModule, build_tree, example_spec
from ptinternals.viz.modules import describe_tree, draw_hook_timeline, draw_module_tree, trace_hook_calls


def trees():
    return build_tree(example_spec(), torch.nn.Module), build_tree(example_spec(), MiniModule)


def test_describe_tree_same_for_both_worlds():
    tn, mn = trees()
    tn[2].register_forward_hook(lambda *a: None)
    mn[2].register_forward_hook(lambda *a: None)
    got = describe_tree(mn[0])
    assert got == describe_tree(tn[0])
    assert [n["path"] for n in got] == ["", "embed", "block", "empty", "head"]
    block = got[2]
    assert block["aliases"] == ["again"] and block["hooks"] == {"pre": 0, "fwd": 1, "bwd-pre": 0, "bwd": 0}
    assert [b["persistent"] for b in block["buffers"]] == [True, True, False]
    assert got[4]["params"][0]["tied_to"] == "embed.weight"
    assert got[1]["params"][1]["none"] and block["params"][2]["frozen"]


@pytest.mark.parametrize("x_requires_grad", [True, False])
def test_trace_same_for_both_worlds_and_hooks_removed(x_requires_grad):
    tn, mn = trees()
    x = torch.ones(2, 3, requires_grad=x_requires_grad)
    got_t = trace_hook_calls(tn[0], x)
    got_m = trace_hook_calls(mn[0], x)
    assert got_m == got_t
    assert [e["kind"] for e in got_m[:2]] == ["pre", "pre"] and got_m[-1]["kind"] == "bwd"
    assert sum(e["phase"] == "forward" for e in got_m) == 12  # 6 calls (the shared block twice), 2 hooks each
    assert all(not m._forward_hooks and not m._backward_hooks for m in mn)
    forward_only = trace_hook_calls(mn[0], x, backward=False)
    assert {e["phase"] for e in forward_only} == {"forward"}


def test_figures_draw():
    tn, mn = trees()
    for nodes in (tn, mn):
        fig = draw_module_tree(nodes[0], title="tree")
        assert isinstance(fig, Figure)
        fig.savefig(io.BytesIO(), format="png")
        events = trace_hook_calls(nodes[0], torch.ones(2, 3, requires_grad=True))
        fig = draw_hook_timeline(events, title="hooks")
        assert isinstance(fig, Figure)
        labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        assert labels == ["(root)", "embed", "block", "empty", "head"]
        fig.savefig(io.BytesIO(), format="png")


def test_bad_input():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module or a MiniModule"):
        describe_tree(3)
    with pytest.raises(ValueError, match="non-empty list"):
        draw_hook_timeline([])
    with pytest.raises(TypeError, match=r"events\[0\]"):
        draw_hook_timeline([{"step": 0}])
    with pytest.raises(TypeError, match="backward must be a bool"):
        trace_hook_calls(MiniModule(), torch.ones(1), backward=1)
    frozen = build_tree({"dim": 1, "params": [{"shape": [1], "requires_grad": False}], "buffers": [],
                         "nodes": [{"cls": "A", "params": [["w", 0]]}]}, MiniModule)[0]
    with pytest.raises(ValueError, match="needs an output that requires grad"):
        trace_hook_calls(frozen, torch.ones(1, 1))
    assert not frozen._forward_hooks  # removed even after the error
