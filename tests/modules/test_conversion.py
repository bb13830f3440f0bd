"""``_apply``/``to``: identities, gradients, buffers and optimizers behave as with torch.nn.Module."""
from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.modules import Linear, MiniModule, Sequential, build_tree, example_spec

from .strategies import both, outcome, tree_specs

CONVERSIONS = {
    "to_f64": lambda m: m.to(torch.float64),
    "to_kw_f16": lambda m: m.to(dtype=torch.float16),
    "to_tensor_f64": lambda m: m.to(torch.zeros(1, dtype=torch.float64)),
    "to_cpu": lambda m: m.to("cpu"),
    "double": lambda m: m.double(),
    "half": lambda m: m.half(),
    "bfloat16": lambda m: m.bfloat16(),
    "float": lambda m: m.float(),
    "type_f64": lambda m: m.type(torch.float64),
    "cpu": lambda m: m.cpu(),
}


@contextlib.contextmanager
def future_flags(overwrite: bool = False, swap: bool = False):
    old = (torch.__future__.get_overwrite_module_params_on_conversion(),
           torch.__future__.get_swap_module_params_on_conversion())
    torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    torch.__future__.set_swap_module_params_on_conversion(swap)
    try:
        yield
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(old[0])
        torch.__future__.set_swap_module_params_on_conversion(old[1])


def state(root) -> list:
    """Per named tensor (duplicates kept): dtype, grad dtype, requires_grad."""
    out = []
    for name, t in [*root.named_parameters(remove_duplicate=False), *root.named_buffers(remove_duplicate=False)]:
        out.append((name, t.dtype, None if t.grad is None else t.grad.dtype, t.requires_grad, t.tolist()))
    return out


def identities(root) -> list:
    return [t for _, t in [*root.named_parameters(remove_duplicate=False), *root.named_buffers(remove_duplicate=False)]]


def same_object(before, after) -> list:
    return [a is b for a, b in zip(before, after)]


@given(tree_specs(), st.sampled_from(sorted(CONVERSIONS)), st.sampled_from(["default", "overwrite", "swap"]))
def test_conversion_matches_torch(spec, conversion, flags):
    tn, mn = both(spec)
    x = torch.ones(2, spec["dim"], requires_grad=True)
    for nodes in (tn, mn):  # some gradients exist (frozen parameters keep None)
        nodes[0](x).sum().backward()
    ids_t, ids_m = identities(tn[0]), identities(mn[0])  # the objects stay alive in these lists
    grads_t = [p.grad for p in tn[0].parameters()]
    grads_m = [p.grad for p in mn[0].parameters()]
    with future_flags(overwrite=flags == "overwrite", swap=flags == "swap"):
        got_t = outcome(lambda: CONVERSIONS[conversion](tn[0]) is tn[0])
        got_m = outcome(lambda: CONVERSIONS[conversion](mn[0]) is mn[0])
    assert got_m == got_t
    assert state(mn[0]) == state(tn[0])
    assert same_object(ids_m, identities(mn[0])) == same_object(ids_t, identities(tn[0]))
    # gradients: same object kept or not, as torch does
    assert [a is b.grad for a, b in zip(grads_m, mn[0].parameters())] == \
        [a is b.grad for a, b in zip(grads_t, tn[0].parameters())]
    # tied parameters stay tied, a shared module stays shared
    assert [n for n, _ in mn[0].named_parameters()] == [n for n, _ in tn[0].named_parameters()]


@given(st.sampled_from([torch.float64, torch.float16, torch.bfloat16]), st.integers(0, 3))
def test_optimizer_built_before_to_still_steps_the_model(dtype, seed):
    def run(nodes):
        model = nodes[0]
        opt = torch.optim.SGD(model.parameters(), lr=0.5)  # built BEFORE the conversion
        model.to(dtype)
        model(torch.ones(2, 3, dtype=dtype)).sum().backward()
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        moved = [not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters())]
        return moved, [p.detach().clone() for p in model.parameters()]

    tn, mn = both(example_spec(), seed)
    moved_t, after_t = run(tn)
    moved_m, after_m = run(mn)
    assert moved_m == moved_t and any(moved_m)  # the trainable parameters really moved
    assert all(torch.equal(a, b) for a, b in zip(after_t, after_m))


def test_overwrite_flag_orphans_the_optimizer():
    with future_flags(overwrite=True):
        model = Sequential(Linear(3, 2))
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        model.double()
        assert opt.param_groups[0]["params"][0] is not model[0].weight  # the optimizer holds the old tensor


def test_plain_attribute_is_not_moved_and_int_buffers_keep_dtype():
    nodes = build_tree(example_spec(), MiniModule)
    nodes[0].lookup = torch.ones(2)
    nodes[0].to(torch.float64)
    assert nodes[0].lookup.dtype == torch.float32
    assert nodes[2].steps.dtype == torch.int64 and nodes[2].running_mean.dtype == torch.float64
    nodes[0].type(torch.float32)  # type() casts every tensor, ints included, like torch
    assert nodes[2].steps.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_to_refuses_integer_dtypes_like_torch(dtype):
    assert outcome(lambda: MiniModule().to(dtype)) == outcome(lambda: torch.nn.Module().to(dtype))


def test_buffers_are_replaced_parameters_are_not():
    nodes = build_tree(example_spec(), MiniModule)
    block = nodes[2]
    p, b = block.proj, block.running_mean
    block.to(torch.float64)
    assert block.proj is p and block.running_mean is not b
