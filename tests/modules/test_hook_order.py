"""The pure-Python hook-order prediction equals what torch does on the same chain of modules."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.checks.modules import chain_trees
from ptinternals.modules import MiniModule, build_tree
from ptinternals.modules.hook_order import chain_tree_to_spec, predict_hook_order
from ptinternals.viz.modules import trace_hook_calls


def torch_events(tree, input_requires_grad: bool, base=torch.nn.Module):
    root = build_tree(chain_tree_to_spec(tree), base)[0]
    x = torch.ones(3, 2, requires_grad=input_requires_grad)
    out_requires_grad = root(x).requires_grad
    events = trace_hook_calls(root, x, backward=out_requires_grad)
    return [(e["kind"], e["module"]) for e in events]


@given(chain_trees(), st.booleans())
def test_prediction_matches_torch(tree, input_requires_grad):
    assert predict_hook_order(tree, input_requires_grad) == torch_events(tree, input_requires_grad)


@given(chain_trees(max_modules=4), st.booleans())
def test_reference_module_gives_the_same_order(tree, input_requires_grad):
    assert torch_events(tree, input_requires_grad, MiniModule) == torch_events(tree, input_requires_grad)


def test_a_frozen_prefix_gets_no_backward_hooks():
    tree = {"name": "net", "param": None, "children": [
        {"name": "stem", "param": "frozen", "children": []},
        {"name": "head", "param": "trainable", "children": []}]}
    events = predict_hook_order(tree, input_requires_grad=False)
    assert events[6:] == [("bwd-pre", ""), ("bwd", ""), ("bwd-pre", "head"), ("bwd", "head")]
    assert ("bwd-pre", "stem") not in events  # its output never required grad


@pytest.mark.parametrize("bad, words", [
    ({"name": "a.b"}, "tree['name']"),
    ({"name": "net", "param": "yes"}, "tree['param']"),
    ({"name": "net", "children": [{"same_as": ""}]}, "not an ancestor"),
    ({"name": "net", "children": [{"name": "a"}, {"name": "a"}]}, "repeats 'a'"),
    ({"name": "net", "children": {}}, "must be a list"),
])
def test_bad_trees_are_named(bad, words):
    with pytest.raises((ValueError, TypeError), match=words.replace("[", r"\[").replace("]", r"\]")):
        predict_hook_order(bad, True)
