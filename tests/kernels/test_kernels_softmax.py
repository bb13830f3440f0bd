"""Fused and online softmax (the kernels chapter, exercise "softmax"): vs torch on awkward shapes and strides."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ptinternals.kernels import softmax

from .kernels_testing import assert_close, make

DTYPES = [torch.float32, torch.float16, torch.float64]


@settings(max_examples=12)
@given(rows=st.integers(0, 24), cols=st.integers(0, 300), dtype=st.sampled_from(DTYPES),
       layout=st.sampled_from(["contiguous", "transposed", "sliced"]))
def test_softmax_matches_torch(rows, cols, dtype, layout):
    x = make((rows, cols), dtype, layout=layout, scale=4.0)
    got = softmax(x)
    assert got.dtype == dtype and got.shape == x.shape
    assert_close(got, torch.softmax(x.double(), -1), dtype, f"softmax {layout}")


@settings(max_examples=8)
@given(rows=st.integers(1, 6), cols=st.integers(1, 300), block=st.sampled_from([16, 32, 64]),
       dtype=st.sampled_from(DTYPES))
def test_online_softmax_walks_blocks(rows, cols, block, dtype):
    x = make((rows, cols), dtype, scale=10.0, seed=cols)
    assert_close(softmax(x, block_size=block), torch.softmax(x.double(), -1), dtype, f"online block {block}")


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_softmax_any_dim_of_3d(dim):
    x = make((4, 6, 9), torch.float32, seed=dim + 10)
    assert_close(softmax(x, dim), torch.softmax(x, dim), torch.float32, f"dim {dim}")


def test_softmax_subtracts_the_max_so_large_inputs_do_not_overflow():
    x = torch.tensor([[1000.0, 1001.0, 999.0], [-1000.0, -1001.0, -999.0]])
    got = softmax(x)
    assert torch.isfinite(got).all(), "exp(1000) overflows fp32: subtract the row max first"
    assert_close(got, torch.softmax(x, -1), torch.float32)
    assert_close(softmax(x, block_size=16), torch.softmax(x, -1), torch.float32)


def test_softmax_minus_inf_entries_get_zero():
    x = torch.tensor([[0.0, -float("inf"), 1.0], [-float("inf"), 2.0, -float("inf")]])
    assert_close(softmax(x), torch.softmax(x, -1), torch.float32)


def test_softmax_scalar_and_size_one():
    assert softmax(torch.tensor(3.0)).item() == 1.0
    assert softmax(torch.randn(4, 1)).eq(1).all()


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(dim=2), IndexError, "out of range"),
    (dict(dim=1.0), TypeError, "dim must be an int"),
    (dict(block_size=48), ValueError, "block_size"),
])
def test_softmax_rejects_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        softmax(torch.randn(3, 4), **kwargs)


def test_softmax_rejects_integer_tensor():
    with pytest.raises(TypeError, match="dtype"):
        softmax(torch.ones(3, 4, dtype=torch.int64))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1823, 781), (64, 32768), (3, 70000)])
def test_softmax_gpu(dtype, shape):
    x = torch.randn(shape, device="cuda", dtype=dtype) * 3
    atol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(softmax(x), torch.softmax(x.float(), -1).to(dtype), atol=atol, rtol=0)
    want_t = torch.softmax(x.float().t(), 0).to(dtype)
    torch.testing.assert_close(softmax(x.t(), 0), want_t, atol=atol, rtol=0)
