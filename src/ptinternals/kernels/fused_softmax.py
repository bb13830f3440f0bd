"""Row softmax, fused: one read and one write of the matrix (Triton tutorial 02, ``02-fused-softmax.py``).

``softmax(x)[i, j] = exp(x[i, j] - max_i) / sum_k exp(x[i, k] - max_i)``. Subtracting the row max
changes nothing mathematically and keeps ``exp`` from overflowing (fp32 ``exp`` overflows past 88.7).

Written with separate torch ops (max, subtract, exp, sum, divide: one kernel each) this reads M*N
elements 5 times and writes them 3 times. :func:`softmax_kernel` gives each program one row, keeps the row in
registers and does all of it there: read M*N elements, write M*N. That is the whole point of
*fusion* for a memory-bound op: the FLOPs were never the cost, the round trips to HBM were.

A row wider than one block (more than fits in registers) needs the *online* softmax (Milakov &
Gimelshein 2018, the same trick as flash attention): :func:`online_softmax_kernel` walks the row in
blocks keeping a running max ``m`` and a running sum ``l`` rescaled whenever ``m`` grows,
``l = l * exp(m_old - m_new) + sum(exp(x_block - m_new))``, then makes a second pass to write.
That reads the row twice and writes it once.

Strides and coalescing: the kernel reads element j of row i at ``i * in_row_stride + j *
in_col_stride``, so any layout works. Only a unit ``in_col_stride`` is *fast*: the 32 threads of a
warp then read 32 neighbouring elements, which the memory system merges ("coalesces") into a few
32-byte sectors, and Triton can emit 16-byte vector loads. A softmax over dim 0 of a row-major
matrix reads with ``in_col_stride = n_cols``: correct, but every lane touches its own sector, so
most of each sector fetched from HBM is wasted.

Torch's CUDA version is ``aten/src/ATen/native/cuda/SoftMax.cu`` (``cunn_SoftMaxForward`` and the
``persistent_softmax`` of ``PersistentSoftmax.cuh`` for rows up to 1024 wide).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import acc_dtype, check_block, check_tensor, next_power_of_2, num_warps_for

#: widest row kept whole in registers; wider rows use the online (multi-block) kernel
MAX_FUSED_BLOCK = 32768


@triton.jit
def softmax_kernel(
    out_ptr, in_ptr,                  # out: (n_rows, n_cols) contiguous; in: any strides
    n_cols,
    in_row_stride, in_col_stride,     # elements between x[i, j] and x[i+1, j] / x[i, j+1]
    out_row_stride,
    BLOCK_SIZE: tl.constexpr,         # next power of two >= n_cols: the whole row in one block
    ACC_DTYPE: tl.constexpr,          # tl.float32, or tl.float64 for fp64 input
):
    row = tl.program_id(0).to(tl.int64)                   # one program per row
    cols = tl.arange(0, BLOCK_SIZE)                       # (BLOCK_SIZE,)
    mask = cols < n_cols                                  # the row is usually narrower than the block
    # masked lanes read -inf: they lose the max and add exp(-inf) = 0 to the sum
    x = tl.load(in_ptr + row * in_row_stride + cols * in_col_stride, mask=mask, other=-float("inf"))
    x = x.to(ACC_DTYPE)                                   # fp32 math for fp16/bf16 (interpreter: no bf16)
    z = x - tl.max(x, axis=0)                             # (BLOCK_SIZE,), <= 0 on live lanes
    num = tl.exp(z)
    den = tl.sum(num, axis=0)                             # scalar
    tl.store(out_ptr + row * out_row_stride + cols, num / den, mask=mask)   # write n_cols elements


@triton.jit
def online_softmax_kernel(
    out_ptr, in_ptr, n_cols, in_row_stride, in_col_stride, out_row_stride,
    BLOCK_SIZE: tl.constexpr,         # < n_cols: the row is walked in ceil(n_cols / BLOCK_SIZE) blocks
    ACC_DTYPE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    in_row = in_ptr + row * in_row_stride
    out_row = out_ptr + row * out_row_stride
    # pass 1: running max m and running sum l of exp(x - m), rescaled when m grows
    m = tl.full((), -float("inf"), ACC_DTYPE)             # scalars carried through the loop
    l = tl.zeros((), ACC_DTYPE)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        x = tl.load(in_row + cols * in_col_stride, mask=cols < n_cols, other=-float("inf")).to(ACC_DTYPE)
        m_new = tl.maximum(m, tl.max(x, axis=0))          # first block has a live lane: m_new finite
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    # pass 2: read the row again, write exp(x - m) / l
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(in_row + cols * in_col_stride, mask=mask, other=-float("inf")).to(ACC_DTYPE)
        tl.store(out_row + cols, tl.exp(x - m) / l, mask=mask)


def softmax(x: torch.Tensor, dim: int = -1, *, block_size: int | None = None) -> torch.Tensor:
    """``torch.softmax(x, dim)`` by a Triton kernel, for any strides and any ``dim``.

    ``dim`` is moved last with ``movedim`` (a view: only strides change), the other dims collapse to
    rows (a view when they can, else a copy), and the kernel walks the row with ``in_col_stride`` -
    so a softmax over dim 0 of a contiguous matrix reads it in place, column by column.
    ``block_size`` (a power of two) forces the online kernel when it is smaller than the row.
    """
    check_tensor("x", x)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    nd = max(x.dim(), 1)
    if not -nd <= dim < nd:
        raise IndexError(f"dim {dim} is out of range for a tensor of {x.dim()} dimension(s)")
    if block_size is not None:
        check_block("block_size", block_size, minimum=16)
    if x.dim() == 0:
        return softmax(x.reshape(1), 0, block_size=block_size).reshape(())
    xt = x.movedim(dim, -1)                               # (..., n_cols), a view
    n_cols = xt.shape[-1]
    n_rows = math.prod(xt.shape[:-1])
    rows = xt.reshape(n_rows, n_cols)                     # (n_rows, n_cols): a view if possible
    out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows and n_cols:
        if block_size is None:
            block_size = min(max(16, next_power_of_2(n_cols)), MAX_FUSED_BLOCK)
        kernel = softmax_kernel if block_size >= n_cols else online_softmax_kernel
        kernel[(n_rows,)](out, rows, n_cols, rows.stride(0), rows.stride(1), out.stride(0),
                          BLOCK_SIZE=block_size, ACC_DTYPE=acc_dtype(x.dtype),
                          num_warps=num_warps_for(block_size))
    return out.view(xt.shape).movedim(-1, dim)
