"""The exercises' scaffold: mixins over ModuleState, trees filled through the dicts, behave like torch."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given

from ptinternals.modules import MiniModule, build_tree
from ptinternals.modules.call import Calling
from ptinternals.modules.conversion import Conversion
from ptinternals.modules.modes import Modes
from ptinternals.modules.registration import ModuleBase
from ptinternals.modules.scaffold import ModuleState, compose
from ptinternals.modules.state_dict import StateDict
from ptinternals.modules.traversal import Traversal
from ptinternals.viz.modules import trace_hook_calls

from .strategies import tree_specs


@given(tree_specs(max_nodes=4, dims=(1, 2)))
def test_mixins_over_module_state_match_torch(spec):
    cls = compose(Traversal, Conversion, StateDict, Calling, Modes, name="Student")
    student = build_tree(spec, cls, register=False)
    ref = build_tree(spec, torch.nn.Module)
    assert [n for n, _ in student[0].named_parameters()] == [n for n, _ in ref[0].named_parameters()]
    assert list(student[0].state_dict()) == list(ref[0].state_dict())
    x = torch.ones(2, spec["dim"], requires_grad=True)
    assert trace_hook_calls(student[0], x) == trace_hook_calls(ref[0], x)


@given(tree_specs(max_nodes=4))
def test_direct_fill_equals_registration(spec):
    a = build_tree(spec, MiniModule)
    b = build_tree(spec, MiniModule, register=False)
    for m, n in zip(a, b):
        assert list(m._parameters) == list(n._parameters) and list(m._buffers) == list(n._buffers)
        assert list(m._modules) == list(n._modules)
        assert m._non_persistent_buffers_set == n._non_persistent_buffers_set


def test_compose_adds_a_plain_call_only_when_needed():
    plain = compose(Traversal)
    assert "__call__" in vars(plain) and issubclass(plain, ModuleState)
    hooked = compose(Calling)
    assert "__call__" not in vars(hooked)
    registered = compose(ModuleBase, Traversal)  # the reference's Registration brings its own __init__
    m = registered()
    m.w = torch.nn.Parameter(torch.ones(1))
    assert [n for n, _ in m.named_parameters()] == ["w"]
    assert not issubclass(plain, torch.nn.Module)


def test_compose_and_build_errors():
    with pytest.raises(TypeError, match=r"mixins\[1\] must be a class"):
        compose(Traversal, 3)
    with pytest.raises(ValueError, match="name must be an identifier"):
        compose(Traversal, name="a b")
    with pytest.raises(TypeError, match="register must be a bool"):
        build_tree({"dim": 1, "params": [], "buffers": [], "nodes": [{"cls": "A"}]}, MiniModule, register=None)


def own_tensors(nodes) -> list:
    """(node, kind, name, dtype, values) of every slot, read from the dicts (no Traversal needed)."""
    return [(i, kind, name, None if t is None else (t.dtype, t.tolist()))
            for i, m in enumerate(nodes) for kind in ("_parameters", "_buffers")
            for name, t in getattr(m, kind).items()]


@given(tree_specs(max_nodes=4))
def test_each_reference_mixin_alone_is_an_exercise_twin(spec):
    """The exercises compose ONE student mixin with ModuleState: the reference mixins must work that way too."""
    ref = build_tree(spec, torch.nn.Module)
    conv = build_tree(spec, compose(Conversion), register=False)
    ref[0]._apply(lambda t: t * 2)
    conv[0]._apply(lambda t: t * 2)
    assert own_tensors(conv) == own_tensors(ref)
    ref = build_tree(spec, torch.nn.Module)
    state = build_tree(spec, compose(StateDict), register=False)
    ckpt = build_tree(spec, torch.nn.Module, seed=5)[0].state_dict()
    ref[0].load_state_dict(ckpt, assign=True)
    state[0].load_state_dict(ckpt, assign=True)
    assert own_tensors(state) == own_tensors(ref)
    assert all(type(t) is type(r) for m, n in zip(state, ref) for t, r in zip(m._parameters.values(),
                                                                             n._parameters.values()))


def test_reference_functional_call_works_on_torch_modules():
    from ptinternals.modules import functional_call

    lin = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    w, x = torch.zeros(2, 2), torch.ones(1, 2)
    assert torch.equal(functional_call(lin, {"1.weight": w}, (x,)), torch.func.functional_call(lin, {"1.weight": w}, (x,)))


def test_public_names_for_torch_privates():
    from ptinternals.modules.scaffold import has_compatible_shallow_copy_type, parse_to

    assert parse_to(torch.float64) == (None, torch.float64, False, None)
    assert parse_to("cpu", dtype=torch.float16, non_blocking=True)[:3] == (torch.device("cpu"), torch.float16, True)
    assert has_compatible_shallow_copy_type(torch.ones(2), torch.ones(3, dtype=torch.float64))
    assert not has_compatible_shallow_copy_type(torch.ones(2), torch.ones(2).to_sparse())
    with pytest.raises(TypeError, match="new must be a torch.Tensor, got int"):
        has_compatible_shallow_copy_type(torch.ones(1), 3)
    with pytest.raises(RuntimeError, match="nonsense"):
        parse_to("nonsense")
