"""Backward formulas on plain tensors (how a grader calls them) against torch.autograd."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.autograd import formulas as F

from .autograd_helpers import assert_grads_close, broadcast_shapes, make_tensor


def torch_grads(fn, inputs, grad_out):
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, grad_out, allow_unused=True), out


@given(broadcast_shapes(n=2, max_dims=4), st.integers(0, 2**16))
def test_unbroadcast_equals_sum_to_size(case, seed):
    base, (shape, _) = case
    grad = make_tensor(base, seed)
    torch.testing.assert_close(F.unbroadcast(grad, shape), grad.sum_to_size(shape) if shape else grad.sum())


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@given(case=broadcast_shapes(n=2), seed=st.integers(0, 2**16), nc=st.booleans())
def test_binary_formulas_match_torch(op, case, seed, nc):
    _, (sa, sb) = case
    a, b = make_tensor(sa, seed, non_contiguous=nc), make_tensor(sb, seed + 1)
    if op == "div":
        b = b.abs() + 0.5  # keep away from 0
    fn = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[op]
    (ga, gb), out = torch_grads(fn, [a, b], make_tensor(torch.broadcast_shapes(sa, sb), seed + 2))
    grad = make_tensor(out.shape, seed + 2)
    args = (grad, sa, sb) if op in ("add", "sub") else (grad, a, b)
    ours = F.BACKWARD_FORMULAS[op](*args)
    assert isinstance(ours, tuple) and len(ours) == 2
    assert ours[0].shape == a.shape and ours[1].shape == b.shape, "formulas must unbroadcast to input shapes"
    assert_grads_close(ours, (ga, gb), msg=op)


UNARY = {
    "exp": (torch.exp, lambda x, out: (out,)),
    "log": (torch.log, lambda x, out: (x,)),
    "tanh": (torch.tanh, lambda x, out: (out,)),
    "sigmoid": (torch.sigmoid, lambda x, out: (out,)),
    "relu": (torch.relu, lambda x, out: (out,)),
    "neg": (torch.neg, lambda x, out: ()),
}


@pytest.mark.parametrize("op", sorted(UNARY))
@given(shape=st.lists(st.sampled_from([0, 1, 2, 3, 5]), max_size=3).map(tuple), seed=st.integers(0, 2**16))
def test_unary_formulas_match_torch(op, shape, seed):
    fn, saved = UNARY[op]
    x = make_tensor(shape, seed)
    if op == "log":
        x = x.abs() + 0.1
    (gx,), out = torch_grads(fn, [x], make_tensor(shape, seed + 1))
    ours = F.BACKWARD_FORMULAS[op](make_tensor(shape, seed + 1), *saved(x, out.detach()))
    assert_grads_close(ours, (gx,), msg=op)


@pytest.mark.parametrize("exponent", [0, 1, 2, 3, -1, 0.5, 2.5])
def test_pow_formula_matches_torch(exponent):
    x = make_tensor((3, 4), 0).abs() + 0.1
    (gx,), _ = torch_grads(lambda t: t ** exponent, [x], make_tensor((3, 4), 1))
    assert_grads_close(F.pow_backward(make_tensor((3, 4), 1), x, exponent), (gx,), msg=f"pow {exponent}")


@st.composite
def reductions(draw):
    shape = tuple(draw(st.lists(st.sampled_from([0, 1, 2, 3, 5]), min_size=1, max_size=4)))
    some_dims = st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True, max_size=len(shape))
    dims = draw(st.one_of(st.none(), some_dims))
    return shape, (tuple(sorted(dims)) if dims is not None else None), draw(st.booleans())


@pytest.mark.parametrize("op", ["sum", "mean"])
@given(case=reductions(), seed=st.integers(0, 2**16))
def test_reduction_formulas_match_torch(op, case, seed):
    shape, dims, keepdim = case
    x = make_tensor(shape, seed)
    if dims is None:
        fn = (lambda t: getattr(t, op)()) if not keepdim else None
        if fn is None:  # torch has no keepdim without dim: reduce every dim explicitly
            fn = lambda t: getattr(t, op)(dim=tuple(range(len(shape))), keepdim=True)  # noqa: E731
    else:
        fn = lambda t: getattr(t, op)(dim=dims, keepdim=keepdim)  # noqa: E731
    (gx,), out = torch_grads(fn, [x], make_tensor(fn(x).shape, seed + 1))
    ours = F.BACKWARD_FORMULAS[op](make_tensor(out.shape, seed + 1), shape, dims, keepdim)
    assert_grads_close(ours, (gx,), msg=f"{op} dims={dims} keepdim={keepdim}")


MATMUL_SHAPES = [
    ((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((2, 3), (3, 5)), ((1, 1), (1, 1)), ((7, 3), (3, 1)),
    ((4, 2, 3), (3, 5)), ((2, 3), (4, 3, 5)), ((4, 1, 2, 3), (5, 3, 2)), ((3,), (2, 3, 4)),
    ((2, 0, 3), (3, 4)), ((2, 3, 0), (0, 4)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul_formula_matches_torch(sa, sb):
    a, b = make_tensor(sa, 0), make_tensor(sb, 1)
    (ga, gb), out = torch_grads(torch.matmul, [a, b], make_tensor(torch.matmul(a, b).shape, 2))
    assert_grads_close(F.matmul_backward(make_tensor(out.shape, 2), a, b), (ga, gb), msg=f"matmul {sa}@{sb}")


def test_shape_formulas_match_torch():
    x, y = make_tensor((2, 3, 4), 0), make_tensor((3, 1), 0)
    cases = [
        (x, lambda t: t.reshape(4, 6), lambda g: F.reshape_backward(g, (2, 3, 4))),
        (x, lambda t: t.transpose(0, 2), lambda g: F.transpose_backward(g, 0, 2)),
        (y, lambda t: t.expand(2, 3, 4), lambda g: F.expand_backward(g, (3, 1))),
        (y, lambda t: t.clone(), F.clone_backward),
    ]
    for inp, fn, ours in cases:
        (gx,), out = torch_grads(fn, [inp], make_tensor(fn(inp).shape, 1))
        assert_grads_close(ours(make_tensor(out.shape, 1)), (gx,))


def test_unbroadcast_rejects_bad_arguments():
    g = torch.ones(2, 3)
    with pytest.raises(ValueError, match="not broadcastable"):
        F.unbroadcast(g, (4,))
    with pytest.raises(ValueError, match="not broadcastable"):
        F.unbroadcast(g, (1, 2, 3))
    with pytest.raises(TypeError, match="grad must be"):
        F.unbroadcast([1.0, 2.0], (2,))
    with pytest.raises(TypeError, match="shape must be"):
        F.unbroadcast(g, 3)


def test_use_formulas_validates_and_restores():
    original = F.BACKWARD_FORMULAS["mul"]
    with pytest.raises(ValueError, match="unknown op names"):
        F.use_formulas({"matmull": original})
    with pytest.raises(TypeError, match="must be callable"):
        F.use_formulas({"mul": 3})
    with pytest.raises(TypeError, match="dict"):
        F.use_formulas([("mul", original)])
    with F.use_formulas({"mul": F.add_backward}):
        assert F.BACKWARD_FORMULAS["mul"] is F.add_backward
    assert F.BACKWARD_FORMULAS["mul"] is original
