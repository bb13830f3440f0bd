"""Blocked matmul with grouped ordering (the kernels chapter, exercise "matmul")."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ptinternals.kernels import matmul
from ptinternals.kernels.blocked_matmul import CPU_CONFIG, GPU_CONFIGS, grouped_tile_order, panels_touched
from ptinternals.kernels.offline_compile import SM90_MAX_SHARED

from .kernels_testing import make


def _check(got, a, b):
    want = a.double() @ b.double()
    # fp32 accumulation over K terms: the error grows like sqrt(K) ulps of the output dtype
    eps = {torch.float32: 1e-6, torch.float16: 1e-3}[a.dtype]
    tol = eps * 4 * (a.shape[1] ** 0.5 + 1) * (want.abs().max().item() + 1)
    err = (got.double() - want).abs().max().item() if got.numel() else 0.0
    assert got.shape == want.shape and got.dtype == a.dtype
    assert err <= tol, f"max |error| {err:.3g} > {tol:.3g} for {tuple(a.shape)} @ {tuple(b.shape)} {a.dtype}"


@settings(max_examples=12)
@given(m=st.integers(1, 100), n=st.integers(1, 100), k=st.integers(1, 100),
       dtype=st.sampled_from([torch.float32, torch.float16]),
       la=st.sampled_from(["contiguous", "transposed", "sliced"]),
       lb=st.sampled_from(["contiguous", "transposed"]))
def test_matmul_matches_torch(m, n, k, dtype, la, lb):
    a, b = make((m, k), dtype, layout=la, seed=m), make((k, n), dtype, layout=lb, seed=n)
    _check(matmul(a, b), a, b)


def test_matmul_awkward_sizes_scaled_down():
    a, b = make((182, 95), torch.float16, seed=1), make((95, 78), torch.float16, seed=2)   # 1823x781 / 10
    _check(matmul(a, b), a, b)


@pytest.mark.parametrize("m, n, k", [(0, 3, 4), (3, 0, 4), (3, 4, 0)])
def test_matmul_empty(m, n, k):
    c = matmul(torch.randn(m, k), torch.randn(k, n))
    assert c.shape == (m, n) and (c == 0).all()


def test_grouped_order_is_a_permutation_that_reuses_panels():
    for gm in (1, 2, 3, 8):
        order = grouped_tile_order(7, 5, gm)
        assert sorted(order) == [(i, j) for i in range(7) for j in range(5)]
    assert grouped_tile_order(4, 4, 1)[:4] == [(0, 0), (0, 1), (0, 2), (0, 3)]          # row-major
    assert grouped_tile_order(4, 4, 2)[:4] == [(0, 0), (1, 0), (0, 1), (1, 1)]          # down, then across
    assert panels_touched(grouped_tile_order(9, 9, 3), 9) < panels_touched(grouped_tile_order(9, 9, 1), 9)
    assert grouped_tile_order(0, 5, 2) == grouped_tile_order(5, 0, 2) == []                 # an empty C


@pytest.mark.parametrize("args, exc, match", [((3, 3, 0), ValueError, "group_size_m must be >= 1, got 0"),
                                              ((-1, 3, 2), ValueError, "num_pid_m must be >= 0, got -1"),
                                              ((3, 2.0, 2), TypeError, "num_pid_n must be an int")])
def test_grouped_tile_order_rejects_bad_input(args, exc, match):
    with pytest.raises(exc, match=match):
        grouped_tile_order(*args)


def test_configs_fit_the_hardware():
    for cfg in GPU_CONFIGS + [CPU_CONFIG]:
        kw = cfg.kwargs
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            assert kw[name] >= 16 and kw[name] & (kw[name] - 1) == 0, \
                f"{name}={kw[name]}: tl.dot needs powers of 2 >= 16"
    for cfg in GPU_CONFIGS:
        kw = cfg.kwargs
        smem = (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"] * 2 * cfg.num_stages   # fp16 tiles x stages
        assert smem <= SM90_MAX_SHARED, f"{kw} x {cfg.num_stages} stages needs {smem} B of shared memory"


@pytest.mark.parametrize("call, exc, match", [
    (lambda: matmul(torch.randn(3, 4), torch.randn(5, 6)), ValueError, "K dimension"),
    (lambda: matmul(torch.randn(3), torch.randn(3, 2)), ValueError, "a must be 2-D"),
    (lambda: matmul(torch.randn(3, 4).double(), torch.randn(4, 2).double()), TypeError, "dtype"),
    (lambda: matmul(torch.randn(3, 4), torch.randn(4, 2).half()), TypeError, "dtype"),
    (lambda: matmul(torch.ones(3, 4).int(), torch.ones(4, 2).int()), TypeError, "dtype"),
])
def test_matmul_rejects_bad_inputs(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m, n, k", [(1823, 781, 555), (512, 512, 512), (1, 4096, 17)])
def test_matmul_gpu(dtype, m, n, k):
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(n, k, device="cuda", dtype=dtype).t()       # a transposed B: strides, no copy
    ref = a.float() @ b.float()
    torch.testing.assert_close(matmul(a, b).float(), ref, atol=0.05 * k ** 0.5, rtol=1e-2)
