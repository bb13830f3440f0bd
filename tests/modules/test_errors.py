"""Bad input to the reference's public functions gets a clear error naming the argument."""
from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

import ptinternals.modules as mini
from ptinternals.modules import BatchNorm1d, Dropout, Linear, MiniModule, ModuleList, Sequential, build_tree


@pytest.mark.parametrize("call, error, words", [
    (lambda: MiniModule(3), TypeError, "takes 1 positional argument"),
    (lambda: MiniModule(bias=True), TypeError, "unexpected keyword argument 'bias'"),
    (lambda: MiniModule().register_buffer(1, None), TypeError, "buffer name should be a string"),
    (lambda: MiniModule().register_buffer("a.b", None), KeyError, 'contain "."'),
    (lambda: MiniModule().register_buffer("x", [1.0]), TypeError, "cannot assign 'list' object to buffer 'x'"),
    (lambda: MiniModule().register_parameter("w", torch.ones(1)), TypeError, "torch.nn.Parameter or None required"),
    (lambda: MiniModule().register_parameter("", None), KeyError, "empty string"),
    (lambda: MiniModule().add_module("c", 3), TypeError, "int is not a Module subclass"),
    (lambda: MiniModule().register_forward_hook(3), TypeError, "hook must be callable"),
    (lambda: MiniModule().register_forward_hook(print, prepend=1), TypeError, "prepend must be a bool"),
    (lambda: MiniModule().register_full_backward_hook(print, prepend="yes"), TypeError, "prepend must be a bool"),
    (lambda: MiniModule().train(1), ValueError, "training mode is expected to be boolean"),
    (lambda: MiniModule().requires_grad_(1), TypeError, "requires_grad must be a bool"),
    (lambda: MiniModule().zero_grad(set_to_none=None), TypeError, "set_to_none must be a bool"),
    (lambda: MiniModule().load_state_dict([1]), TypeError, "Expected state_dict to be dict-like"),
    (lambda: MiniModule().load_state_dict({}, strict="no"), TypeError, "strict must be a bool"),
    (lambda: MiniModule().state_dict({}), TypeError, "keyword arguments only"),
    (lambda: MiniModule().state_dict(prefix=3), TypeError, "prefix must be a str"),
    (lambda: list(MiniModule().named_parameters(prefix=None)), TypeError, "prefix must be a str"),
    (lambda: list(MiniModule().named_modules(remove_duplicate="x")), TypeError, "remove_duplicate must be a bool"),
    (lambda: MiniModule().apply(3), TypeError, "fn must be callable"),
    (lambda: MiniModule()._apply(None), TypeError, "fn must be callable"),
    (lambda: MiniModule().to(torch.int64), TypeError, "only accepts floating point or complex"),
    (lambda: MiniModule().get_submodule(3), TypeError, "target must be a str"),
    (lambda: MiniModule()(torch.ones(1)), NotImplementedError, 'missing the required "forward" function'),
    (lambda: mini.register_module_forward_pre_hook(None), TypeError, "hook must be callable"),
    (lambda: mini.register_module_forward_hook(print, always_call="yes"), TypeError, "always_call must be a bool"),
    (lambda: mini.RemovableHandle({}), TypeError, "hooks_dict must be an OrderedDict, got dict"),
    (lambda: mini.RemovableHandle(OrderedDict(), extra_dict=3), TypeError, "extra_dict must be an OrderedDict or a list"),
    (lambda: mini.functional_call(MiniModule(), 3), ValueError, "Expected parameter_and_buffer_dicts"),
    (lambda: mini.functional_call(MiniModule(), {}, strict=1), TypeError, "strict must be a bool"),
    (lambda: mini.functional_call(3, {}), TypeError, "module must be a MiniModule or a torch.nn.Module, got int"),
    (lambda: mini.functional_call(MiniModule(), {3: torch.ones(1)}), TypeError, "keys must be str"),
    (lambda: Linear(-1, 2), ValueError, "in_features must be an int >= 0, got -1"),
    (lambda: Linear(2, 2.5), ValueError, "out_features must be an int >= 0, got 2.5"),
    (lambda: BatchNorm1d(0), ValueError, "num_features must be an int >= 1, got 0"),
    (lambda: Dropout(1.5), ValueError, "between 0 and 1, but got 1.5"),
    (lambda: Sequential(Linear(1, 1))[3], IndexError, "index 3 is out of range"),
    (lambda: ModuleList([Linear(1, 1)])["a"], TypeError, "index must be an int"),
    (lambda: ModuleList(3), TypeError, "should be called with an iterable"),
    (lambda: build_tree([], MiniModule), TypeError, "spec must be a dict"),
    (lambda: build_tree({"dim": 1, "params": [], "buffers": []}, MiniModule), ValueError, "missing the key 'nodes'"),
    (lambda: build_tree({"dim": -1, "params": [], "buffers": [], "nodes": [{"cls": "A"}]}, MiniModule), ValueError,
     "spec['dim'] must be an int >= 0, got -1"),
    (lambda: build_tree({"dim": 2, "params": [{"shape": [3], "requires_grad": True}], "buffers": [],
                         "nodes": [{"cls": "A"}]}, MiniModule), ValueError, "spec['params'][0]"),
    (lambda: build_tree({"dim": 1, "params": [], "buffers": [], "nodes": [{"cls": "A", "children": [["c", 1]]}]},
                        MiniModule), ValueError, "spec['nodes'][0]['children'][0][1] must be None or an index in [0, 1)"),
    (lambda: build_tree({"dim": 1, "params": [], "buffers": [], "nodes": [{"cls": "A", "children": [["c", 1]]},
                                                                        {"cls": "B", "children": [["d", 0]]}]},
                        MiniModule), ValueError, "cycle (0 -> 1 -> 0)"),
    (lambda: build_tree({"dim": 1, "params": [], "buffers": [], "nodes": [{"cls": "A"}]}, "MiniModule"), TypeError,
     "base must be a class"),
    (lambda: build_tree({"dim": 1, "params": [], "buffers": [], "nodes": [{"cls": "A"}]}, MiniModule, seed=1.5),
     TypeError, "seed must be an int"),
])
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)
