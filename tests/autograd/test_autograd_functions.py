"""Custom autograd Functions: gradcheck, gradgradcheck, against torch's ops, and saved bytes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF
from hypothesis import given
from hypothesis import strategies as st
from torch.autograd import gradcheck, gradgradcheck

from ptinternals.autograd import functions as fns
from ptinternals.autograd.saved_tensors import saved_tensor_bytes, saved_tensors_log

from .autograd_helpers import make_tensor


def leaf(shape, seed=0, nc=False, dtype=torch.float64):
    return make_tensor(shape, seed, dtype=dtype, non_contiguous=nc).requires_grad_(True)


@st.composite
def shape_and_dim(draw, allow_zero=True):
    sizes = st.sampled_from([0, 1, 2, 3, 5, 7] if allow_zero else [1, 2, 3, 5, 7])
    shape = tuple(draw(st.lists(sizes, min_size=1, max_size=3)))
    return shape, draw(st.integers(-len(shape), len(shape) - 1)), draw(st.booleans())


@given(case=shape_and_dim(), seed=st.integers(0, 2**16), nc=st.booleans())
def test_logsumexp_matches_torch(case, seed, nc):
    shape, dim, keepdim = case
    x = leaf(shape, seed, nc) * 30  # large values: the naive log(sum(exp)) would overflow in float32
    x = x.detach().float().requires_grad_(True)
    ours = fns.logsumexp(x, dim, keepdim)
    theirs = torch.logsumexp(x, dim, keepdim)
    torch.testing.assert_close(ours, theirs)
    g = make_tensor(tuple(theirs.shape), seed + 1, dtype=torch.float32)
    torch.testing.assert_close(torch.autograd.grad(ours, x, g)[0], torch.autograd.grad(theirs, x, g)[0])


def test_logsumexp_handles_infinities_like_torch():
    x = torch.tensor([[-float("inf"), -float("inf")], [0.0, -float("inf")], [1000.0, 1000.0]])
    torch.testing.assert_close(fns.logsumexp(x, 1), torch.logsumexp(x, 1))


@pytest.mark.parametrize("shape,dim,keepdim", [((5,), 0, False), ((3, 4), 1, False), ((3, 4), 0, True),
                                               ((2, 3, 4), -2, False), ((1, 1), 1, True)])
def test_logsumexp_gradcheck_and_gradgradcheck(shape, dim, keepdim):
    x = leaf(shape)
    assert gradcheck(lambda t: fns.logsumexp(t, dim, keepdim), (x,))
    assert gradgradcheck(lambda t: fns.logsumexp(t, dim, keepdim), (x,))


@pytest.mark.parametrize("name", ["fused_silu", "fused_gelu"])
@pytest.mark.parametrize("shape,nc", [((7,), False), ((3, 5), True), ((1,), False), ((2, 3, 4), True)])
def test_fused_activations_gradcheck_and_gradgradcheck(name, shape, nc):
    fn = getattr(fns, name)
    x = leaf(shape, 1, nc)
    assert gradcheck(fn, (x,))
    assert gradgradcheck(fn, (x,))


@pytest.mark.parametrize("ours,theirs", [(fns.fused_silu, TF.silu), (fns.fused_gelu, TF.gelu)])
@given(shape=st.lists(st.sampled_from([0, 1, 2, 3, 5]), max_size=3).map(tuple), seed=st.integers(0, 2**16))
def test_fused_activations_match_torch(ours, theirs, shape, seed):
    x = leaf(shape, seed)
    g = make_tensor(shape, seed + 1)
    torch.testing.assert_close(ours(x), theirs(x))
    torch.testing.assert_close(torch.autograd.grad(ours(x), x, g)[0], torch.autograd.grad(theirs(x), x, g)[0])


def test_straight_through_round():
    x = leaf((4, 3), 2) * 3
    x = x.detach().requires_grad_(True)
    y = fns.ste_round(x)
    torch.testing.assert_close(y, torch.round(x))
    g = make_tensor((4, 3), 3)
    torch.testing.assert_close(torch.autograd.grad(y, x, g)[0], g)  # identity: the surrogate gradient
    # The true derivative of round is 0 almost everywhere: gradcheck must *reject* the surrogate.
    assert not gradcheck(fns.ste_round, (x,), raise_exception=False)
    assert gradgradcheck(fns.ste_round, (x,))  # the backward itself (identity) is differentiable


# ---------------------------------------------------------------------------------- saved bytes
def test_probe_counts_each_storage_once():
    x = leaf((64, 32), dtype=torch.float32)
    assert saved_tensor_bytes(torch.exp, x) == 64 * 32 * 4  # ExpBackward0 saves its result
    assert saved_tensor_bytes(lambda t: t * t, x) == 64 * 32 * 4  # x saved twice, one storage
    assert saved_tensor_bytes(lambda t: t + t, x) == 0  # AddBackward0 saves no tensor
    w = leaf((32, 16), dtype=torch.float32)
    assert saved_tensor_bytes(lambda t: t @ w, x, exclude=[w]) == 64 * 32 * 4
    log = saved_tensors_log(lambda t: t * t, x)
    assert [e["new_storage"] for e in log] == [True, False] and log[0]["shape"] == (64, 32)


@pytest.mark.parametrize("shape,dim", [((64, 100), 1), ((33, 7, 5), 1), ((1000,), 0)])
def test_logsumexp_saves_less_than_naive_and_as_much_as_torch(shape, dim):
    x = leaf(shape, dtype=torch.float32)
    ours = saved_tensor_bytes(fns.logsumexp, x, dim)
    naive = saved_tensor_bytes(fns.naive_logsumexp, x, dim)
    assert ours < naive, f"LogSumExp saved {ours} bytes, naive {naive}: it must not save exp(x)"
    assert ours == saved_tensor_bytes(torch.logsumexp, x, dim)


@pytest.mark.parametrize("ours,naive,theirs", [(fns.fused_silu, fns.naive_silu, TF.silu),
                                               (fns.fused_gelu, fns.naive_gelu, TF.gelu)])
def test_fused_activation_saves_only_its_input(ours, naive, theirs):
    x = leaf((128, 96), dtype=torch.float32)
    b_ours, b_naive = saved_tensor_bytes(ours, x), saved_tensor_bytes(naive, x)
    assert b_ours == x.numel() * 4 < b_naive
    assert b_ours == saved_tensor_bytes(theirs, x)


# ------------------------------------------------------------------------------------- errors
def test_function_input_errors():
    x = leaf((3, 4))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fns.logsumexp([1.0, 2.0], 0)
    with pytest.raises(TypeError, match="floating point"):
        fns.fused_silu(torch.ones(3, dtype=torch.int64))
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        fns.logsumexp(x, 2)
    with pytest.raises(TypeError, match="dim must be an int"):
        fns.logsumexp(x, (0, 1))
    with pytest.raises(ValueError, match="0-d"):
        fns.logsumexp(torch.tensor(1.0), 0)
    with pytest.raises(TypeError, match="fn must be callable"):
        saved_tensor_bytes(3, x)
    with pytest.raises(TypeError, match="exclude must hold tensors"):
        saved_tensor_bytes(torch.exp, x, exclude=[1])


# ------------------------------------------------------------------- fake quantize and SwiGLU
@given(shape=st.lists(st.sampled_from([0, 1, 2, 3, 7]), max_size=3).map(tuple), seed=st.integers(0, 2**16),
       qparams=st.sampled_from([(0.5, 0, -4, 3), (0.1, 3, 0, 15), (0.25, -2, -8, 7), (1.0, 0, -128, 127)]),
       nc=st.booleans())
def test_fake_quantize_matches_torch(shape, seed, qparams, nc):
    scale, zp, qmin, qmax = qparams
    x = (make_tensor(shape, seed, dtype=torch.float32, non_contiguous=nc) * 3).requires_grad_(True)
    ours = fns.fake_quantize(x, scale, zp, qmin, qmax)
    theirs = torch.fake_quantize_per_tensor_affine(x, scale, zp, qmin, qmax)
    torch.testing.assert_close(ours, theirs)
    g = make_tensor(shape, seed + 1, dtype=torch.float32)
    torch.testing.assert_close(torch.autograd.grad(ours, x, g)[0], torch.autograd.grad(theirs, x, g)[0])
    # Saves what torch saves: the bool mask, 1 byte per element.
    assert saved_tensor_bytes(fns.fake_quantize, x, scale, zp, qmin, qmax) == x.numel()


def test_fake_quantize_input_errors():
    x = leaf((3,), dtype=torch.float32)
    with pytest.raises(ValueError, match="scale must be a positive"):
        fns.fake_quantize(x, 0.0, 0, -4, 3)
    with pytest.raises(TypeError, match="zero_point must be an int"):
        fns.fake_quantize(x, 0.5, 0.5, -4, 3)
    with pytest.raises(ValueError, match="zero_point must lie"):
        fns.fake_quantize(x, 0.5, 9, -4, 3)


@pytest.mark.parametrize("shape,nc", [((7,), False), ((3, 5), True), ((1,), False), ((2, 3, 4), True)])
def test_fused_swiglu_gradcheck_gradgradcheck_and_bytes(shape, nc):
    a, b = leaf(shape, 1, nc), leaf(shape, 2)
    assert gradcheck(fns.fused_swiglu, (a, b))
    assert gradgradcheck(fns.fused_swiglu, (a, b))
    torch.testing.assert_close(fns.fused_swiglu(a, b), TF.silu(a) * b)
    a32, b32 = leaf((64, 48), dtype=torch.float32), leaf((64, 48), 1, dtype=torch.float32)
    fused, naive = saved_tensor_bytes(fns.fused_swiglu, a32, b32), saved_tensor_bytes(fns.naive_swiglu, a32, b32)
    assert fused == 2 * a32.numel() * 4 and naive == 3 * a32.numel() * 4
    with pytest.raises(ValueError, match="same shape"):
        fns.fused_swiglu(a32, b32[:1])
