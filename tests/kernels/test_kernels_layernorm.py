"""Layer norm forward and backward (the kernels chapter, exercises "layernorm forward/backward")."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ptinternals.kernels import layer_norm, layer_norm_backward, layer_norm_forward

from .kernels_testing import assert_close, make

DTYPES = [torch.float32, torch.float16, torch.float64]


def _reference(x, w, b, dy, eps=1e-5):
    """torch in fp64: y, and dx, dw, db by autograd."""
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    y = F.layer_norm(xd, (x.shape[-1],), wd, bd, eps)
    grads = torch.autograd.grad(y, (xd, wd, bd), dy.double())
    return y.detach(), grads


@settings(max_examples=10)
@given(rows=st.integers(0, 20), cols=st.integers(1, 200), dtype=st.sampled_from(DTYPES),
       layout=st.sampled_from(["contiguous", "transposed", "sliced"]))
def test_layer_norm_forward_and_backward_match_torch(rows, cols, dtype, layout):
    x = make((rows, cols), dtype, layout=layout, seed=rows + cols, scale=3.0)
    w, b = make((cols,), dtype, seed=1), make((cols,), dtype, seed=2)
    dy = make((rows, cols), dtype, seed=3)
    y, mean, rstd = layer_norm_forward(x, w, b)
    y_ref, (dx_ref, dw_ref, db_ref) = _reference(x, w, b, dy)
    assert_close(y, y_ref, dtype, "y", scale=4)
    assert_close(mean, x.double().mean(-1), dtype, "mean")
    xd = x.double()
    var = ((xd - xd.mean(-1, keepdim=True)) ** 2).mean(-1)          # biased, like layer norm
    assert_close(rstd, 1 / (var + 1e-5).sqrt(), dtype, "rstd", scale=4)
    dx, dw, db = layer_norm_backward(dy, x, w, mean, rstd)
    # dw and db sum over rows: their rounding error grows with the row count
    assert_close(dx, dx_ref, dtype, "dx", scale=8)
    assert_close(dw, dw_ref, dtype, "dweight", scale=8 + rows)
    assert_close(db, db_ref, dtype, "dbias", scale=8 + rows)


def test_layer_norm_matches_native_layer_norm_stats_3d():
    x = make((3, 5, 48), torch.float32, seed=7)
    w, b = make((48,), torch.float32, seed=8), make((48,), torch.float32, seed=9)
    y, mean, rstd = layer_norm_forward(x, w, b, 1e-3)
    y_t, mean_t, rstd_t = torch.native_layer_norm(x, [48], w, b, 1e-3)
    assert mean.shape == (3, 5) and rstd.shape == (3, 5)
    assert_close(y, y_t, torch.float32, "y")
    assert_close(mean, mean_t.reshape(3, 5), torch.float32, "mean")
    assert_close(rstd, rstd_t.reshape(3, 5), torch.float32, "rstd")


def test_autograd_function_and_determinism():
    x = make((40, 33), torch.float32, seed=11).requires_grad_()
    w = make((33,), torch.float32, seed=12).requires_grad_()
    b = make((33,), torch.float32, seed=13).requires_grad_()
    dy = make((40, 33), torch.float32, seed=14)
    g1 = torch.autograd.grad(layer_norm(x, w, b), (x, w, b), dy)
    g2 = torch.autograd.grad(layer_norm(x, w, b), (x, w, b), dy)
    for a, c in zip(g1, g2, strict=True):   # no atomics in the two-stage reduction: bitwise equal
        assert torch.equal(a, c)
    _, ref = _reference(x, w, b, dy)
    for name, got, want in zip(("dx", "dw", "db"), g1, ref, strict=True):
        assert_close(got, want, torch.float32, name, scale=10)


def test_rows_of_one_element():
    x, w, b = torch.randn(4, 1), torch.randn(1), torch.randn(1)
    y, _, _ = layer_norm_forward(x, w, b)
    assert_close(y, F.layer_norm(x, (1,), w, b), torch.float32, "N=1: x - mean = 0, y = b")


def _ln(rows=2, n=3, w=None, b=None, **kw):
    x = torch.randn(rows, n) if rows is not None else torch.tensor(1.0)
    return layer_norm_forward(x, torch.randn(n) if w is None else w, torch.randn(n) if b is None else b, **kw)


def _ln_bwd(dy_shape=(2, 3), mean=None):
    mean = torch.zeros(2) if mean is None else mean
    return layer_norm_backward(torch.randn(dy_shape), torch.randn(2, 3), torch.randn(3), mean, torch.ones(2))


@pytest.mark.parametrize("call, exc, match", [
    (lambda: _ln(w=torch.randn(4)), ValueError, "weight must have"),
    (lambda: _ln(b=torch.randn(3, 1)), ValueError, "bias must be 1-D"),
    (lambda: _ln(eps=-1.0), ValueError, "eps"),
    (lambda: _ln(n=20000), ValueError, "too wide"),
    (lambda: _ln(w=torch.randn(3).half()), TypeError, "dtype"),
    (lambda: _ln(rows=None, n=1), ValueError, "at least 1"),
    (lambda: _ln_bwd(dy_shape=(2, 4)), ValueError, "dy must have"),
    (lambda: _ln_bwd(mean=torch.zeros(3)), ValueError, "mean must have shape"),
    (lambda: _ln_bwd(mean=torch.zeros(2).half()), TypeError, "mean must have dtype"),
])
def test_layer_norm_rejects_bad_inputs(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1823, 781), (4096, 8192), (7, 1)])
def test_layer_norm_gpu(dtype, shape):
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True)
    b = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(shape, device="cuda", dtype=dtype)
    got = [layer_norm(x, w, b)] + list(torch.autograd.grad(layer_norm(x, w, b), (x, w, b), dy))
    xr, wr, br = (t.detach().float().requires_grad_() for t in (x, w, b))
    yr = F.layer_norm(xr, shape[-1:], wr, br)
    want = [yr] + list(torch.autograd.grad(yr, (xr, wr, br), dy.float()))
    for g, r in zip(got, want, strict=True):
        scale = r.abs().max().item() + 1
        atol = (3e-2 if dtype != torch.float32 else 1e-4) * scale
        torch.testing.assert_close(g.float(), r, atol=atol, rtol=0)
