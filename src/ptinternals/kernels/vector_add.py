"""Vector add: the SPMD model in ten lines (Triton tutorial 01, ``01-vector-add.py``).

A Triton kernel is one *program*; the launch grid runs many copies of it, each knowing only its
``tl.program_id``. Program ``pid`` owns elements ``[pid * BLOCK_SIZE, (pid + 1) * BLOCK_SIZE)``: it
builds that block of offsets with ``tl.arange``, turns offsets into addresses with the strides (the
same ``storage_offset + sum(index * stride)`` as the strides chapter), and masks the lanes that fall past the
end, because the last block is usually partial (n = 1823 with BLOCK_SIZE = 1024: program 1 has 799
live lanes and 225 past the end). Without the mask those lanes read and write past the allocation.

Cost: read 2n elements, write n; n FLOPs. At 2 bytes per fp16 element that is 1 FLOP per 6 bytes =
0.17 FLOP/byte, far left of the H200's ridge point (~206 FLOP/byte): memory-bound, so the best a
kernel can do is move bytes at HBM speed, which is what torch's ``add`` already does
(aten/src/ATen/native/cuda/BinaryOpsKernel.cu via ``gpu_kernel``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import acc_dtype, cdiv, check_block, check_same, check_tensor


@triton.jit
def add_kernel(
    x_ptr, y_ptr, out_ptr,       # pointers to the first element of each tensor
    n_elements,                  # int: how many elements in all
    stride_x, stride_y,          # elements between consecutive x[i] (1 when contiguous)
    BLOCK_SIZE: tl.constexpr,    # elements per program, a power of two known at compile time
    ACC_DTYPE: tl.constexpr,     # tl.float32 (fp64 for fp64 inputs): fp16/bf16 add in fp32, like torch
):
    pid = tl.program_id(axis=0)                             # which block this program owns
    # int64 so that pid * BLOCK_SIZE * stride cannot overflow for tensors over 2**31 elements
    offsets = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)  # (BLOCK_SIZE,)
    mask = offsets < n_elements                             # False on the lanes past the end
    x = tl.load(x_ptr + offsets * stride_x, mask=mask).to(ACC_DTYPE)   # read BLOCK_SIZE elements
    y = tl.load(y_ptr + offsets * stride_y, mask=mask).to(ACC_DTYPE)   # read BLOCK_SIZE elements
    tl.store(out_ptr + offsets, x + y, mask=mask)           # write BLOCK_SIZE; store casts to out's dtype


def _as_vector(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view of ``t`` with a single stride when one exists (the strides chapter: ``view`` vs ``reshape``)."""
    if t.dim() == 1:
        return t                                             # any stride, e.g. x[::3]
    try:
        return t.view(-1)                                    # no copy: dims collapse to one stride
    except RuntimeError:
        return t.reshape(-1)                                 # a copy: no single stride walks t


def add(x: torch.Tensor, y: torch.Tensor, *, block_size: int = 1024) -> torch.Tensor:
    """``x + y`` for two tensors of the same shape and dtype, computed by :func:`add_kernel`.

    1-D inputs of any stride are read in place (``stride_x``/``stride_y``); N-D inputs are read in
    place when their dims collapse to one stride, else copied first. The result is contiguous.
    """
    check_tensor("x", x)
    check_tensor("y", y)
    check_same(("x", "y"), (x, y))
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape (no broadcasting), "
                         f"got {tuple(x.shape)} and {tuple(y.shape)}")
    check_block("block_size", block_size, minimum=16)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)   # contiguous
    n = x.numel()
    if n == 0:
        return out
    xv, yv = _as_vector(x), _as_vector(y)
    grid = (cdiv(n, block_size),)                                # one program per block
    add_kernel[grid](xv, yv, out, n, xv.stride(0), yv.stride(0), BLOCK_SIZE=block_size,
                     ACC_DTYPE=acc_dtype(x.dtype),
                     num_warps=4 if block_size <= 1024 else 8)
    return out
