"""Vector add (the kernels chapter, exercise "add"): vs torch, masked tails, strides, errors."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ptinternals.kernels import add

from .kernels_testing import assert_close, make


@settings(max_examples=12)
@given(n=st.integers(0, 3000), dtype=st.sampled_from([torch.float32, torch.float16, torch.float64]),
       step=st.integers(1, 3))
def test_add_matches_torch_strided_1d(n, dtype, step):
    x, y = make((n * step,), dtype, seed=1)[::step], make((n * step,), dtype, seed=2)[::step]
    got = add(x, y)
    assert got.is_contiguous() and got.dtype == dtype
    assert_close(got, x + y, dtype, "add")


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_add_nd_layouts(layout):
    x, y = make((37, 29), torch.float32, layout=layout, seed=3), make((37, 29), torch.float32, seed=4)
    assert_close(add(x, y), x + y, torch.float32, f"add {layout}")


@pytest.mark.parametrize("block_size", [16, 128, 4096])
def test_add_block_sizes_mask_the_tail(block_size):
    x, y = torch.randn(1823), torch.randn(1823)        # 1823 is a multiple of no block size
    assert_close(add(x, y, block_size=block_size), x + y, torch.float32, f"block {block_size}")


def test_add_size_one_and_scalar_shapes():
    assert_close(add(torch.ones(1), torch.ones(1)), torch.full((1,), 2.0), torch.float32)
    assert add(torch.tensor(1.0), torch.tensor(2.0)).item() == 3.0


@pytest.mark.parametrize("args, exc, match", [
    (lambda: (torch.ones(3), torch.ones(4)), ValueError, "same shape"),
    (lambda: (torch.ones(3), torch.ones(3, dtype=torch.float64)), TypeError, "dtype"),
    (lambda: (torch.ones(3).int(), torch.ones(3).int()), TypeError, "x must have dtype"),
    (lambda: ([1.0], torch.ones(1)), TypeError, "x must be a torch.Tensor"),
    (lambda: (torch.ones(3, device="meta"),) * 2, ValueError, "CUDA device or the CPU"),
])
def test_add_rejects_bad_inputs(args, exc, match):
    with pytest.raises(exc, match=match):
        add(*args())


@pytest.mark.parametrize("block_size", [0, 24, 8])
def test_add_rejects_bad_block_size(block_size):
    with pytest.raises(ValueError, match="block_size"):
        add(torch.ones(3), torch.ones(3), block_size=block_size)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_add_gpu(dtype):
    x = torch.randn(1 << 20 | 7, device="cuda", dtype=dtype)
    y = torch.randn_like(x)
    torch.testing.assert_close(add(x, y), x + y)
    torch.testing.assert_close(add(x[::2], y[::2]), x[::2] + y[::2])
