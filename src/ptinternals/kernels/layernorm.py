"""Layer normalization, forward and backward (Triton tutorial 05, ``05-layer-norm.py``).

Forward, per row x of N features (aten/src/ATen/native/cuda/layer_norm_kernel.cu,
``vectorized_layer_norm_kernel``)::

    mean = sum(x) / N            rstd = 1 / sqrt(sum((x - mean)^2) / N + eps)
    y    = (x - mean) * rstd * w + b

One program per row keeps the row in registers: read M*N, write M*N (+ 2M floats of mean/rstd,
saved for backward so it need not recompute them).

Backward, with xhat = (x - mean) * rstd and wdy = w * dy (``layer_norm_backward_cuda_template``)::

    dx = (wdy - (xhat * mean(xhat * wdy) + mean(wdy))) * rstd      # per row: fuses like forward
    dw = sum over rows of dy * xhat        db = sum over rows of dy  # per *column*: a reduction
                                                                     # across all M programs
dx is row-local, but dw and db sum across rows, i.e. across programs, which cannot share registers.
The usual answer is a *two-stage reduction*: stage 1 (:func:`layer_norm_bwd_dx_kernel`) runs a
fixed number of programs P (about 2 per SM on a GPU), each owning a contiguous run of rows,
accumulating its share of dw/db in registers and writing one partial row to a (P, N) fp32 buffer;
stage 2 (:func:`layer_norm_bwd_dwdb_kernel`) sums those P partial rows column block by column block.
The tutorial does stage 1 with a lock per group of rows and ``tl.atomic_cas``; owning rows outright
needs no lock and gives the same dw/db on every run (deterministic).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import (
    acc_dtype,
    cdiv,
    check_same,
    check_tensor,
    multiprocessor_count,
    next_power_of_2,
    num_warps_for,
)


@triton.jit
def layer_norm_fwd_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr,       # x: (M, N) any strides; y: (M, N) contiguous; w, b: (N,)
    mean_ptr, rstd_ptr,               # (M,) in ACC_DTYPE, saved for backward
    n_cols, x_row_stride, x_col_stride, y_row_stride, eps,
    BLOCK_SIZE: tl.constexpr,         # next power of two >= N
    ACC_DTYPE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols * x_col_stride, mask=mask, other=0.0).to(ACC_DTYPE)
    mean = tl.sum(x, axis=0) / n_cols                 # masked lanes read 0: they add nothing
    xc = tl.where(mask, x - mean, 0.0)                # ...but x - mean would be -mean there
    var = tl.sum(xc * xc, axis=0) / n_cols            # biased variance, like torch
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC_DTYPE)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(ACC_DTYPE)
    tl.store(y_ptr + row * y_row_stride + cols, xc * rstd * w + b, mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def layer_norm_bwd_dx_kernel(
    dx_ptr, dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr,
    partial_dw_ptr, partial_db_ptr,   # (P, N) ACC_DTYPE: one row of partial sums per program
    n_rows, n_cols, rows_per_program,
    x_row_stride, x_col_stride, dy_row_stride, dy_col_stride, dx_row_stride,
    BLOCK_SIZE: tl.constexpr,
    ACC_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC_DTYPE)   # read once, used for every row
    dw_acc = tl.zeros((BLOCK_SIZE,), ACC_DTYPE)                      # this program's share of dw
    db_acc = tl.zeros((BLOCK_SIZE,), ACC_DTYPE)
    row_start = pid.to(tl.int64) * rows_per_program                  # int64: row * stride may pass 2**31
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for row in range(row_start, row_end):
        x = tl.load(x_ptr + row * x_row_stride + cols * x_col_stride, mask=mask, other=0.0).to(ACC_DTYPE)
        dy = tl.load(dy_ptr + row * dy_row_stride + cols * dy_col_stride, mask=mask, other=0.0).to(ACC_DTYPE)
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        wdy = w * dy                                                 # 0 on masked lanes
        c1 = tl.sum(xhat * wdy, axis=0) / n_cols
        c2 = tl.sum(wdy, axis=0) / n_cols
        dx = (wdy - (xhat * c1 + c2)) * rstd
        tl.store(dx_ptr + row * dx_row_stride + cols, dx, mask=mask)
        dw_acc += dy * xhat
        db_acc += dy
    tl.store(partial_dw_ptr + pid * n_cols + cols, dw_acc, mask=mask)   # stage 1 of the reduction
    tl.store(partial_db_ptr + pid * n_cols + cols, db_acc, mask=mask)


@triton.jit
def layer_norm_bwd_dwdb_kernel(
    partial_dw_ptr, partial_db_ptr,   # (P, N) ACC_DTYPE
    dw_ptr, db_ptr,                   # (N,) in the weight's dtype
    n_partials, n_cols,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ACC_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)                                        # one program per BLOCK_N columns
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    dw = tl.zeros((BLOCK_M, BLOCK_N), ACC_DTYPE)
    db = tl.zeros((BLOCK_M, BLOCK_N), ACC_DTYPE)
    for start in range(0, n_partials, BLOCK_M):                  # stage 2: walk down the P rows
        rows = start + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < n_partials) & (cols[None, :] < n_cols)
        offs = rows[:, None] * n_cols + cols[None, :]
        dw += tl.load(partial_dw_ptr + offs, mask=mask, other=0.0)
        db += tl.load(partial_db_ptr + offs, mask=mask, other=0.0)
    tl.store(dw_ptr + cols, tl.sum(dw, axis=0), mask=cols < n_cols)
    tl.store(db_ptr + cols, tl.sum(db, axis=0), mask=cols < n_cols)


def _block_size(x: torch.Tensor) -> int:
    """The whole row in one block, capped at 64 KB of elements per row (the tutorial's limit)."""
    n = x.shape[-1]
    block = next_power_of_2(max(n, 1))
    if block > 65536 // x.element_size():
        raise ValueError(f"x.shape[-1] = {n} is too wide: rows up to {65536 // x.element_size()} "
                         f"{str(x.dtype).replace('torch.', '')} elements fit in one block")
    return max(block, 16)


def _check_params(x: torch.Tensor, weight: torch.Tensor, name_w: str = "weight") -> None:
    check_tensor("x", x, min_ndim=1)
    check_tensor(name_w, weight, ndim=1)
    check_same(("x", name_w), (x, weight))
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(f"{name_w} must have x.shape[-1] = {x.shape[-1]} elements, got {weight.shape[0]}")


def layer_norm_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5):
    """Normalize over the last dim of ``x`` (any leading shape, any strides).

    Returns ``(y, mean, rstd)``: y like x (contiguous), mean and rstd of shape ``x.shape[:-1]`` in
    fp32 (fp64 for fp64 input), as ``torch.native_layer_norm`` returns them.
    """
    _check_params(x, weight)
    _check_params(x, bias, "bias")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"eps must be a float >= 0, got {eps!r}")
    n_cols = x.shape[-1]
    block = _block_size(x)
    n_rows = math.prod(x.shape[:-1])
    rows = x.reshape(n_rows, n_cols)                          # (M, N): a view when possible
    stat_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    mean = torch.empty(n_rows, dtype=stat_dtype, device=x.device)
    rstd = torch.empty(n_rows, dtype=stat_dtype, device=x.device)
    if n_rows and n_cols:
        w, b = weight.contiguous(), bias.contiguous()         # (N,): no-op unless strided
        layer_norm_fwd_kernel[(n_rows,)](
            rows, y, w, b, mean, rstd, n_cols, rows.stride(0), rows.stride(1), y.stride(0), float(eps),
            BLOCK_SIZE=block, ACC_DTYPE=acc_dtype(x.dtype), num_warps=num_warps_for(block))
    elif n_rows:                                              # N = 0: torch gives NaN statistics
        mean.fill_(float("nan"))
        rstd.fill_(float("nan"))
    return y.view(x.shape), mean.view(x.shape[:-1]), rstd.view(x.shape[:-1])


def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                        mean: torch.Tensor, rstd: torch.Tensor):
    """Gradients of :func:`layer_norm_forward`: returns ``(dx, dweight, dbias)``.

    ``mean`` and ``rstd`` are the ones forward saved (shape ``x.shape[:-1]``).
    """
    _check_params(x, weight)
    check_tensor("dy", dy)
    check_same(("x", "dy"), (x, dy))
    if dy.shape != x.shape:
        raise ValueError(f"dy must have x's shape {tuple(x.shape)}, got {tuple(dy.shape)}")
    for name, t in (("mean", mean), ("rstd", rstd)):
        check_tensor(name, t, dtypes=(torch.float32, torch.float64))
        check_same(("x", name), (x, t), dtype=False)
        if t.shape != x.shape[:-1]:
            raise ValueError(f"{name} must have shape x.shape[:-1] = {tuple(x.shape[:-1])}, "
                             f"got {tuple(t.shape)}")
    n_cols = x.shape[-1]
    block = _block_size(x)
    n_rows = math.prod(x.shape[:-1])
    rows, dy_rows = x.reshape(n_rows, n_cols), dy.reshape(n_rows, n_cols)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    mean, rstd = mean.reshape(-1).to(acc).contiguous(), rstd.reshape(-1).to(acc).contiguous()
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    dw = torch.zeros(n_cols, dtype=weight.dtype, device=x.device)
    db = torch.zeros(n_cols, dtype=weight.dtype, device=x.device)
    if n_rows == 0 or n_cols == 0:
        return dx.view(x.shape), dw, db
    # stage 1: P programs, each owning rows_per_program consecutive rows
    n_programs = min(n_rows, 2 * multiprocessor_count(x.device))
    rows_per_program = cdiv(n_rows, n_programs)
    n_programs = cdiv(n_rows, rows_per_program)
    partial_dw = torch.empty((n_programs, n_cols), dtype=acc, device=x.device)   # P * N * 4 bytes
    partial_db = torch.empty((n_programs, n_cols), dtype=acc, device=x.device)
    layer_norm_bwd_dx_kernel[(n_programs,)](
        dx, dy_rows, rows, weight.contiguous(), mean, rstd, partial_dw, partial_db,
        n_rows, n_cols, rows_per_program,
        rows.stride(0), rows.stride(1), dy_rows.stride(0), dy_rows.stride(1), dx.stride(0),
        BLOCK_SIZE=block, ACC_DTYPE=acc_dtype(x.dtype), num_warps=num_warps_for(block))
    # stage 2: sum the P partial rows, BLOCK_N columns per program
    block_m, block_n = 32, 128
    layer_norm_bwd_dwdb_kernel[(cdiv(n_cols, block_n),)](
        partial_dw, partial_db, dw, db, n_programs, n_cols,
        BLOCK_M=block_m, BLOCK_N=block_n, ACC_DTYPE=acc_dtype(x.dtype), num_warps=4)
    return dx.view(x.shape), dw, db


class LayerNormFunction(torch.autograd.Function):
    """Forward saves (x, weight, mean, rstd); backward runs the two-stage kernels."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = layer_norm_forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_backward(dy, x, weight, mean, rstd)
        return dx, dw, db, None


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``torch.nn.functional.layer_norm(x, (N,), weight, bias, eps)`` with Triton forward and backward."""
    return LayerNormFunction.apply(x, weight, bias, eps)
