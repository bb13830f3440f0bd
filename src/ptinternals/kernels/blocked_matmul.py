"""Blocked matrix multiply with grouped program order (Triton tutorial 03, ``03-matrix-multiplication.py``).

C (M, N) = A (M, K) @ B (K, N). Program (pid_m, pid_n) owns the BLOCK_M x BLOCK_N tile of C and
walks K in steps of BLOCK_K: load a (BLOCK_M, BLOCK_K) tile of A and a (BLOCK_K, BLOCK_N) tile of B,
``acc += tl.dot(a, b)`` on the tensor cores (fp16/bf16 in, fp32 accumulate), and write the tile once.

Why tiles: each element of A is reused N times and each of B M times. A tile of C reads
BLOCK_M*K + K*BLOCK_N elements to do 2*BLOCK_M*BLOCK_N*K FLOPs, so intensity grows with the tile:
128x256 tiles make a 4096^3 fp16 matmul do about 85 FLOP per byte read from L2, and the whole
product does 2*M*N*K = 137 GFLOP over 3 * 32 MiB of HBM traffic (~1365 FLOP/byte): compute-bound,
right of the H200's ridge (~206). The job is keeping the tensor cores fed.

Grouped ordering (``GROUP_SIZE_M``): programs run roughly in pid order. Row-major order would walk a
whole row of C tiles, touching one row-panel of A but *every* column-panel of B, before any reuse.
Instead pids go down GROUP_SIZE_M tile-rows first, then across, so the programs in flight at once
share a few panels of A and of B and find them in L2 (the tutorial measures >10% on A100).

``num_warps`` sets threads per program (4 warps = one Hopper warpgroup issuing ``wgmma``);
``num_stages`` sets how many K-steps of A and B tiles are in flight in shared memory (software
pipelining: loads for step k+2 overlap the dot of step k). The autotuner picks among configs per
(M, N, K). torch's own path is cuBLAS (aten/src/ATen/native/cuda/Blas.cpp, ``addmm_out_cuda_impl``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import DOT_DTYPES, INTERPRET, autotune, cdiv, check_same, check_tensor


def _config(bm, bn, bk, group_m, stages, warps):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_SIZE_M": group_m},
                         num_stages=stages, num_warps=warps)


# Hopper (H100/H200): shared memory per stage is (BLOCK_M + BLOCK_N) * BLOCK_K * 2 bytes for fp16,
# 48 KiB for 128x256x64, so 3-4 stages fit in the 227 KiB an SM gives one block.
GPU_CONFIGS = [
    _config(128, 256, 64, 8, 3, 8),
    _config(256, 128, 64, 8, 3, 8),
    _config(128, 256, 64, 8, 4, 8),
    _config(128, 128, 64, 8, 4, 8),
    _config(128, 128, 64, 8, 3, 4),
    _config(128, 64, 64, 8, 4, 4),
    _config(64, 128, 64, 8, 4, 4),
    _config(64, 64, 64, 8, 4, 4),       # small or skinny problems
    _config(64, 32, 32, 8, 5, 2),
]
# The interpreter: one config, blocks big enough that few programs run (each is a numpy loop).
CPU_CONFIG = _config(32, 32, 32, 4, 1, 4)


@autotune(GPU_CONFIGS, CPU_CONFIG, key=["M", "N", "K", "INPUT_PRECISION"])
@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,            # A (M, K): any strides, e.g. a transposed view
    stride_bk, stride_bn,            # B (K, N)
    stride_cm, stride_cn,            # C (M, N)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,   # "ieee" or "tf32" for fp32 inputs (ignored for fp16/bf16)
    UPCAST: tl.constexpr,            # interpreter: compute in fp32 (it has no bf16)
):
    # -- which tile of C: grouped ordering -------------------------------------------------------
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n           # programs per group of GROUP_SIZE_M tile-rows
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)   # the last group may be short
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)    # down the group's rows first
    pid_n = (pid % num_pid_in_group) // group_size_m                   # then across

    # -- pointers to the first K-step's tiles ----------------------------------------------------
    # Rows of A past M (cols of B past N) wrap around with % instead of being masked: they load
    # real, in-bounds data that only feeds C entries the final masked store throws away.
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M           # (BLOCK_M,)
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N           # (BLOCK_N,)
    offs_k = tl.arange(0, BLOCK_K)                                    # (BLOCK_K,)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak   # (BLOCK_M, BLOCK_K)
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn   # (BLOCK_K, BLOCK_N)

    # -- walk K: read a (BLOCK_M, BLOCK_K) and a (BLOCK_K, BLOCK_N) tile, accumulate in fp32 ------
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K                                      # the last step may be partial:
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)  # zeros add nothing to the dot
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # -- write the tile, masking rows >= M and cols >= N -----------------------------------------
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def grouped_tile_order(num_pid_m: int, num_pid_n: int, group_size_m: int) -> list[tuple[int, int]]:
    """The (pid_m, pid_n) tile each program id computes, in pid order: the kernel's index math in Python.

    ``grouped_tile_order(4, 4, 1)`` is row-major; with ``group_size_m=2`` pids 0..7 cover the first
    two tile-rows column by column: (0,0) (1,0) (0,1) (1,1) (0,2) ... An empty C (no tile-rows or no
    tile-columns) has no programs: ``[]``.
    """
    for name, v, least in (("num_pid_m", num_pid_m, 0), ("num_pid_n", num_pid_n, 0), ("group_size_m", group_size_m, 1)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if v < least:
            raise ValueError(f"{name} must be >= {least}, got {v}")
    order = []
    num_pid_in_group = group_size_m * num_pid_n
    for pid in range(num_pid_m * num_pid_n):
        group_id = pid // num_pid_in_group
        first_pid_m = group_id * group_size_m
        group_size = min(num_pid_m - first_pid_m, group_size_m)
        pid_m = first_pid_m + (pid % num_pid_in_group) % group_size
        pid_n = (pid % num_pid_in_group) // group_size
        order.append((pid_m, pid_n))
    return order


def panels_touched(order: list[tuple[int, int]], window: int) -> int:
    """Distinct row-panels of A plus column-panels of B read by the first ``window`` programs.

    A stand-in for L2 traffic when about ``window`` programs run at once (132 SMs x 1-2 each on an
    H200): 9 tiles in row-major order on a 9-wide grid touch 1 + 9 = 10 panels; grouped 3 x 3 they
    touch 3 + 3 = 6, for the same 9 tiles of C.
    """
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {window!r}")
    first = order[:window]
    return len({m for m, _ in first}) + len({n for _, n in first})


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for 2-D fp16/bf16/fp32 tensors of any strides, accumulated in fp32.

    fp32 inputs use TF32 tensor cores exactly when torch would (``torch.backends.cuda.matmul.
    allow_tf32``), else full-precision fp32 ("ieee"). The result is contiguous, in a's dtype.
    """
    check_tensor("a", a, dtypes=DOT_DTYPES, ndim=2)
    check_tensor("b", b, dtypes=DOT_DTYPES, ndim=2)
    check_same(("a", "b"), (a, b))
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a.shape[1] must equal b.shape[0] (the K dimension), "
                         f"got a {tuple(a.shape)} and b {tuple(b.shape)}")
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()
    tf32 = a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    grid = lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),)   # 1-D: grouping reorders it
    matmul_kernel[grid](
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        INPUT_PRECISION="tf32" if tf32 else "ieee", UPCAST=INTERPRET)
    return c
