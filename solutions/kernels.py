# %% [markdown]
# # {{title}}
#
# Every op you have called so far ended in a **kernel**: a function that runs on the device, once per
# *program* (a thread block on a GPU), over and over in parallel. `torch.softmax` on a CUDA tensor is
# `cunn_SoftMaxForward` in `aten/src/ATen/native/cuda/SoftMax.cu`; `a @ b` is a cuBLAS call made from
# `aten/src/ATen/native/cuda/Blas.cpp`. This chapter writes such kernels yourself, in
# [Triton](https://triton-lang.org): Python functions decorated with `@triton.jit` that Triton compiles
# to GPU code (`triton/compiler/compiler.py`: Python AST, Triton IR, LLVM IR, PTX, a cubin).
#
# Why write a kernel when PyTorch has them all? Two reasons, and this chapter is about both:
#
# * **Fusion.** A chain of torch ops reads and writes its intermediate tensors to memory between every
#   op. Most ops do so little arithmetic that this traffic *is* their cost. One kernel that does the
#   whole chain in registers moves each byte once.
# * **Control.** For the compute-heavy ops (matmul, attention) the question is how to cut the work
#   into tiles that keep the tensor cores fed. Flash attention, the reason long contexts fit in
#   memory, is exactly such a re-tiling, and it was written in Triton and CUDA, not in torch.
#
# Each kernel follows the same arc, the one of Triton's own tutorials: why it matters, the kernel,
# a check on an awkward shape, a benchmark against torch, and what the number means against the
# hardware's peak. At the end: the roofline that ties the numbers together, a kernel turned into a
# real PyTorch operator, and the Triton code that `torch.compile` writes for you.
#
# **How this notebook works.** Run the cells in order. Each exercise has an *answer cell* (replace
# `raise NotImplementedError()` with your code; keep the names) followed by a *check cell*. You write
# the `@triton.jit` kernel **and** the torch function that launches it. The grader runs your answer
# cells in a separate process, without the course's reference code, on many more cases than the
# visible ones (odd sizes, strided inputs, fp32, fp16 and, on a GPU, bf16; values near a dtype's largest,
# subnormals, inf and NaN where the op defines them), and compares with PyTorch. Like torch's ops, your
# functions must leave their inputs unchanged: the checks verify that no input was written.
# On a GPU it also times your kernel against torch's own op. Quiz answers are recorded in
# `kernels.answers.json` beside this notebook: *practice* questions check your answer at once and
# count no points; *graded* ones only record it (the last answer counts) and are scored when your
# notebook is graded.
#
# **No GPU? Everything still works.** Without CUDA, the setup cell sets `TRITON_INTERPRET=1` *before*
# Triton is imported. Triton then runs each kernel in its **interpreter** (`triton/runtime/interpreter.py`):
# every program of the grid runs one after another as numpy code, on CPU tensors. It is slow (keep
# sizes small), but it is the best debugger Triton has: `print(x)` inside a kernel prints the block,
# and `breakpoint()` stops in it. Two caveats. The interpreter computes bf16 wrongly, so bf16 is only
# checked on a GPU. And an out-of-bounds load or store is not an error there: it reads or writes
# whatever memory lies past your tensor, which can **kill this Jupyter kernel** ("Kernel died").
# The checks surround every tensor with guard bytes, so the classic mistake, a missing mask on the
# last block, is reported as a message instead; an access far outside a tensor (a wrong stride,
# offsets in bytes instead of elements) can still crash. If that happens: restart the kernel, fix the
# answer, and run the cells from the top. The grader's process may crash too; that costs only the
# exercise that crashed.

# %% [setup]
import math
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton is imported: kernels run on the CPU
    torch.set_num_threads(1)  # the interpreter runs thousands of tiny numpy/torch ops: threads only add overhead

import torch.nn.functional as F
import triton
import triton.language as tl

from ptinternals.grading import check
from ptinternals.quiz import quiz_progress, show_quiz

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)

# %% [markdown]
# The reference kernels of this chapter live in `ptinternals.kernels`; the demonstrations below use
# them (and torch), never your answers, so every cell runs before you have solved anything.

# %%
from ptinternals.device import describe
from ptinternals.benchmark import H200_BF16_DENSE_FLOPS, H200_HBM_BYTES_PER_S, Measurement, time_ms
from ptinternals.kernels import costs
from ptinternals import kernels as ref

print(describe(DEVICE))
BIG = DEVICE == "cuda"  # real sizes on a GPU; tiny ones in the interpreter


def bench(name, shape, dtype, cost, ours, theirs):
    """Time `ours` and torch's `theirs` on this device and say what the numbers mean."""
    kw = {} if BIG else {"warmup": 0, "reps": 1}
    ms, torch_ms = time_ms(ours, DEVICE, **kw), time_ms(theirs, DEVICE, **kw)
    m = Measurement("kernels", name, DEVICE, str(shape), str(dtype).replace("torch.", ""), ms,
                    cost.bytes_moved, cost.flops, torch_ms)
    floor_ms = max(cost.bytes_moved / H200_HBM_BYTES_PER_S, cost.flops / H200_BF16_DENSE_FLOPS) * 1e3
    bound = "memory" if cost.intensity < costs.ridge_point(costs.H200_PEAKS) else "compute"
    print(f"{name} {shape} {m.dtype}: Triton {ms:.3f} ms, torch {torch_ms:.3f} ms ({m.vs_torch:.2f}x torch)")
    print(f"  {cost.bytes_moved / 2**20:.3g} MiB moved, {cost.flops / 1e9:.3g} GFLOP: {cost.intensity:.2f} FLOP/byte, "
          f"{bound}-bound on an H200 (ridge at 206)")
    if BIG:
        print(f"  achieved {m.gbps:.0f} GB/s ({m.gbps * 1e9 / H200_HBM_BYTES_PER_S:.0%} of 4.8 TB/s) and "
              f"{m.tflops:.1f} TFLOP/s ({m.tflops * 1e12 / H200_BF16_DENSE_FLOPS:.1%} of 989); "
              f"the roofline allows {floor_ms:.3f} ms at best")
    else:
        print("  (the interpreter runs each program as numpy code: these milliseconds time Python, not a GPU)")
    return m


MEASURED = []  # for the roofline at the end

# %% [markdown]
# ## 1. The SPMD model: programs, blocks and masks
#
# A Triton kernel is written for **one program**. You launch it on a *grid*, e.g. `kernel[(4,)](...)`
# runs 4 copies; each asks `tl.program_id(0)` which one it is, and that is all that tells them apart
# (Single Program, Multiple Data). Inside, you work on **blocks**: `tl.arange(0, BLOCK)` is a vector
# of `BLOCK` offsets (a power of two, known at compile time: a `tl.constexpr`), and `tl.load` /
# `tl.store` take a *block of pointers*. A pointer is a tensor's address plus an offset counted in
# **elements** of its dtype, and the offset of element `i` of a strided 1-d tensor is `i * stride`:
# {{chapter strides}}'s `storage_offset + sum(index * stride)`, with the storage offset already folded into the
# pointer Triton receives (`tensor.data_ptr()`).
#
# Where the data lives decides what a kernel costs. On an H200: **HBM** (141 GB of HBM3e, 4.8 TB/s)
# holds your tensors; the **L2** cache (50 MB) is shared by all 132 SMs; each **SM** (streaming
# multiprocessor, which runs a few programs at a time) has up to 228 KB of **shared memory**/L1 and a
# register file of 256 KB spread over its threads. Every step inward is an order of magnitude faster
# and smaller. `tl.load` brings a block from HBM (through L2) into registers; Triton decides where a
# block lives in between (registers, or shared memory for `tl.dot` operands and pipelined loads), which is
# exactly the bookkeeping a CUDA programmer does by hand. Your job is choosing *what* each program loads,
# and how often.
#
# The block rarely divides the tensor. With n = 10 and BLOCK = 4, program 2 owns offsets 8..11, and
# 10 and 11 are past the end. A **mask** (`offsets < n`) turns those lanes off: masked loads return
# `other` (0 by default) and masked stores write nothing. The little kernel below writes each
# program's id into the elements it owns, so you can see the partition.

# %%
@triton.jit
def whose_element_kernel(out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)                    # which program am I?
    offsets = pid * BLOCK + tl.arange(0, BLOCK)    # the BLOCK elements this program owns
    mask = offsets < n                             # lanes past the end are switched off
    tl.store(out_ptr + offsets, pid, mask=mask)    # write my id (masked lanes write nothing)


n, BLOCK = 10, 4
owner = torch.full((n,), -1, dtype=torch.int32, device=DEVICE)
grid = (triton.cdiv(n, BLOCK),)                    # ceil(10 / 4) = 3 programs
whose_element_kernel[grid](owner, n, BLOCK=BLOCK)
print("grid", grid, "-> element i was written by program", owner.tolist())

# %% [markdown]
# ### {{exercise add}}: vector add
#
# Write `add_kernel` and `add(x, y)`: `x + y` for two 1-d tensors of the same length and dtype,
# **of any stride** (`x` may be `buffer[1::3]`), returning a new contiguous tensor. Each program adds
# one block of `BLOCK_SIZE` elements; the grid has `triton.cdiv(n, BLOCK_SIZE)` programs; the last
# block is masked. Element `i` of `x` is at `x_ptr + i * stride_x`. An empty input must work (a grid
# of 0 programs runs nothing). Allocate the output with `torch.empty`; the arithmetic must happen in
# the kernel (the checker records the torch ops your wrapper runs).

# %% [answer add]
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, stride_x, stride_y, BLOCK_SIZE: tl.constexpr):
    ### BEGIN SOLUTION
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)      # (BLOCK_SIZE,)
    mask = offsets < n_elements                                # the last block is usually partial
    x = tl.load(x_ptr + offsets * stride_x, mask=mask)         # read BLOCK_SIZE elements
    y = tl.load(y_ptr + offsets * stride_y, mask=mask)         # read BLOCK_SIZE elements
    tl.store(out_ptr + offsets, x + y, mask=mask)              # write BLOCK_SIZE elements
    ### END SOLUTION


def add(x, y):
    """x + y for 1-d tensors of equal length and dtype (any strides), computed by add_kernel."""
    ### BEGIN SOLUTION
    # twin: ptinternals.kernels.vector_add.add
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)   # contiguous
    n = x.numel()
    BLOCK_SIZE = 1024
    grid = (triton.cdiv(n, BLOCK_SIZE),)
    add_kernel[grid](x, y, out, n, x.stride(0), y.stride(0), BLOCK_SIZE=BLOCK_SIZE)
    return out
    ### END SOLUTION


# %% [tests add]
check("kernels.add", add)
### BEGIN HIDDEN TESTS
check("kernels.add", add, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# **What the number means.** An add reads 2n elements and writes n, and does n additions: at fp32
# that is 1 FLOP per 12 bytes. An H200 moves 4.8 TB/s from its HBM and computes 989 TFLOP/s in dense
# bf16 (the datasheet peaks, kept as named constants in `ptinternals.benchmark`), so it can afford
# ~206 FLOPs per byte before the arithmetic becomes the limit. The add is three orders of magnitude
# below that: its only cost is moving bytes, and a good add kernel is simply one that reaches HBM speed.
# That is also why torch's add is already as fast as it gets: the win from Triton comes from
# *fusing* several such ops into one pass, which is the next section.

# %%
n_add = (1 << 28) if BIG else 3000
x_add = torch.randn(n_add, device=DEVICE)
y_add = torch.randn(n_add, device=DEVICE)
assert torch.equal(ref.add(x_add, y_add), x_add + y_add)
MEASURED.append(bench("add", (n_add,), torch.float32, costs.add_cost(n_add, torch.float32),
                      lambda: ref.add(x_add, y_add), lambda: x_add + y_add))

# %% [quiz]
show_quiz("kernels", "q1", "q2")

# %% [markdown]
# ## 2. Fusion: a row softmax in one pass
#
# `softmax(x)[i, j] = exp(x[i, j] - m_i) / sum_k exp(x[i, k] - m_i)` with `m_i` the row max.
# Subtracting the max changes nothing mathematically and everything numerically: `exp` overflows
# fp32 past 88.7, and a logit of 100 is not unusual. Written as torch ops (`max`, `sub`, `exp`,
# `sum`, `div`) this is five kernels, each reading its input from HBM and writing its output back:
# about 5 reads and 3 writes of the whole matrix. One kernel that gives each program a whole row,
# keeps the row in registers and does all five steps there reads the matrix once and writes it once.
# For a memory-bound op, that is a 4x smaller bill.
#
# The details that make it right:
#
# * `BLOCK_SIZE = triton.next_power_of_2(n_cols)` so one block holds the row, masked past `n_cols`.
# * Masked lanes must not change the max or the sum: load them as `-inf` (`other=-float("inf")`),
#   since `exp(-inf) = 0`. The default `other=0` would add `exp(0 - m)` per masked lane.
# * Compute in fp32 (`.to(tl.float32)` right after the load), store in the output's dtype: the same
#   rule as torch's `opmath_type` (`aten/src/ATen/OpMathType.h`), and the only way bf16 works in the
#   interpreter.
# * Strides: element `(i, j)` is at `x_ptr + i * stride(0) + j * stride(1)`. Any layout is *correct*;
#   only `stride(1) == 1` is *fast*: the 32 threads of a warp then read 32 neighbouring elements, which
#   the memory system merges into a few 32-byte transactions (**coalescing**).
# * `num_warps` sets how many threads share a row: at 4096 columns, 8 warps (256 threads) hold 16
#   elements each. Too few warps leave bandwidth unused; too many waste registers on short rows.

# %% [markdown]
# ### {{exercise softmax}}: fused softmax
#
# Write `softmax_kernel` and `softmax(x)`: `torch.softmax(x, dim=-1)` for a 2-d `x` of any strides
# (rows up to a few thousand wide, so one block per row is enough), in the dtype of `x`. One program
# per row. The checks include rows of 1 element, widths that are not powers of two, values of a few
# hundred, and (on a GPU) a 4096 x 4096 bf16 benchmark that should run at least as fast as
# `torch.softmax`.

# %% [answer softmax]
@triton.jit
def softmax_kernel(out_ptr, x_ptr, n_cols, x_row_stride, x_col_stride, out_row_stride,
                   BLOCK_SIZE: tl.constexpr):
    ### BEGIN SOLUTION
    row = tl.program_id(0).to(tl.int64)                     # int64: row * stride may pass 2**31
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols * x_col_stride, mask=mask, other=-float("inf"))
    x = x.to(tl.float32)                                    # fp32 math for fp16/bf16 inputs
    z = x - tl.max(x, axis=0)                               # <= 0: exp cannot overflow
    num = tl.exp(z)
    den = tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_row_stride + cols, num / den, mask=mask)   # cast to out's dtype
    ### END SOLUTION


def softmax(x):
    """torch.softmax(x, -1) for a 2-d x of any strides, one program per row."""
    ### BEGIN SOLUTION
    # twin: ptinternals.kernels.fused_softmax.softmax
    n_rows, n_cols = x.shape
    out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    BLOCK_SIZE = max(triton.next_power_of_2(n_cols), 16)
    num_warps = 4 if BLOCK_SIZE <= 2048 else (8 if BLOCK_SIZE <= 8192 else 16)
    softmax_kernel[(n_rows,)](out, x, n_cols, x.stride(0), x.stride(1), out.stride(0),
                              BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)
    return out
    ### END SOLUTION


# %% [tests softmax]
check("kernels.softmax", softmax)
### BEGIN HIDDEN TESTS
check("kernels.softmax", softmax, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# The reference kernel on the course's awkward shape, 1823 x 781 (on the CPU a tenth of the rows:
# the interpreter runs one program per row), then against torch. Rows wider than one block need the
# *online* softmax, which walks the row in blocks with a running max and a rescaled running sum; it
# is `ref.fused_softmax.online_softmax_kernel`, and the same trick returns in flash attention.

# %%
rows = 1823 if BIG else 182
xs = torch.randn(rows, 781, device=DEVICE) * 10
print("max |error| vs torch.softmax at", tuple(xs.shape), ":", (ref.softmax(xs) - torch.softmax(xs, -1)).abs().max().item())
shape = (4096, 4096) if BIG else (16, 300)
xs = torch.randn(*shape, device=DEVICE, dtype=torch.float16 if BIG else torch.float32)
MEASURED.append(bench("softmax", shape, xs.dtype, costs.softmax_cost(*shape, xs.dtype),
                      lambda: ref.softmax(xs), lambda: torch.softmax(xs, -1)))

# %% [quiz]
show_quiz("kernels", "q3", "q4")

# %% [markdown]
# ## 3. Layer norm, forward and backward
#
# Layer norm normalizes each row of N features (`aten/src/ATen/native/cuda/layer_norm_kernel.cu`):
#
# ```
# mean = sum(x) / N        rstd = 1 / sqrt(sum((x - mean)^2) / N + eps)
# y    = (x - mean) * rstd * weight + bias
# ```
#
# Note the **biased** variance (divide by N, not N - 1): that is what `torch.nn.LayerNorm` computes,
# and a kernel that uses `torch.var`'s default (unbiased) is wrong by a factor of `sqrt(N / (N-1))`.
# Forward is a row reduction like softmax: one program per row, the row in registers. It also saves
# `mean` and `rstd` (one fp32 each per row) so backward need not recompute them, exactly as
# `torch.native_layer_norm` returns `(y, mean, rstd)`. One trap: masked lanes load 0, which adds
# nothing to the sum, but `x - mean` is `-mean` there; zero those lanes (`tl.where(mask, x - mean, 0.)`)
# before squaring.
#
# ### {{exercise layer_norm_forward}}: layer norm forward
#
# Write `layer_norm_forward(x, weight, bias, eps)` for a 2-d `x` (M, N) of any strides, returning
# `(y, mean, rstd)`: `y` like `x` (contiguous, same dtype), `mean` and `rstd` of shape `(M,)` in
# **float32** whatever the input dtype. `weight` and `bias` are contiguous, of shape `(N,)`.

# %% [answer layer_norm_forward]
@triton.jit
def layer_norm_fwd_kernel(x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr,
                          n_cols, x_row_stride, x_col_stride, y_row_stride, eps,
                          BLOCK_SIZE: tl.constexpr):
    ### BEGIN SOLUTION
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)                 # masked lanes would otherwise add mean^2
    var = tl.sum(xc * xc, axis=0) / n_cols             # biased, like torch
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * y_row_stride + cols, xc * rstd * w + b, mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    ### END SOLUTION


def layer_norm_forward(x, weight, bias, eps=1e-5):
    """(y, mean, rstd) of layer norm over the last dim of a 2-d x; mean and rstd are float32 (M,)."""
    ### BEGIN SOLUTION
    # twin: ptinternals.kernels.layernorm.layer_norm_forward
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    mean = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    BLOCK_SIZE = max(triton.next_power_of_2(n_cols), 16)
    num_warps = 4 if BLOCK_SIZE <= 2048 else (8 if BLOCK_SIZE <= 8192 else 16)
    layer_norm_fwd_kernel[(n_rows,)](x, y, weight, bias, mean, rstd, n_cols, x.stride(0), x.stride(1),
                                     y.stride(0), eps, BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)
    return y, mean, rstd
    ### END SOLUTION


# %% [tests layer_norm_forward]
check("kernels.layer_norm_forward", layer_norm_forward)
### BEGIN HIDDEN TESTS
check("kernels.layer_norm_forward", layer_norm_forward, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### Backward: a reduction across programs
#
# With `xhat = (x - mean) * rstd` and `wdy = weight * dy` (see `layer_norm_backward_cuda_template`):
#
# ```
# dx      = (wdy - (xhat * mean(xhat * wdy) + mean(wdy))) * rstd     # per row: fuses like forward
# dweight = sum over rows of dy * xhat       dbias = sum over rows of dy
# ```
#
# `dx` is row-local. `dweight` and `dbias` are sums over **all rows**, i.e. across programs, which
# share no registers. Summing with one atomic add per element per row would serialize millions of
# updates. The standard answer is a **two-stage reduction**: launch a fixed number P of programs
# (about two per SM on a GPU), each owning a run of consecutive rows; each computes those rows' `dx`
# and accumulates its share of `dweight`/`dbias` in registers, then writes one partial row into a
# `(P, N)` fp32 buffer. Stage 2 sums the P partial rows, column block by column block (a second small
# kernel, or `partial.sum(0)`). Triton's tutorial does stage 1 with locks and `tl.atomic_cas`;
# owning rows outright needs no lock and gives the same bits on every run.
#
# ### {{exercise layer_norm_backward}}: layer norm backward
#
# Write `layer_norm_backward(dy, x, weight, mean, rstd)` returning `(dx, dweight, dbias)`: `dx` like
# `x`, `dweight` and `dbias` in `weight`'s dtype. `x` and `dy` are 2-d (M, N) of any strides; `mean`
# and `rstd` are the float32 `(M,)` statistics of the forward pass. The arithmetic must be done by
# your kernels; the one torch op allowed is a final `.sum(0)` over the partial rows.

# %% [answer layer_norm_backward]
@triton.jit
def layer_norm_bwd_dx_kernel(dx_ptr, dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, partial_dw_ptr, partial_db_ptr,
                             n_rows, n_cols, rows_per_program,
                             x_row_stride, x_col_stride, dy_row_stride, dy_col_stride, dx_row_stride,
                             BLOCK_SIZE: tl.constexpr):
    ### BEGIN SOLUTION
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_SIZE,), tl.float32)               # this program's share of dweight
    db_acc = tl.zeros((BLOCK_SIZE,), tl.float32)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for row in range(row_start, row_end):
        x = tl.load(x_ptr + row * x_row_stride + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * dy_row_stride + cols * dy_col_stride, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / n_cols
        c2 = tl.sum(wdy, axis=0) / n_cols
        tl.store(dx_ptr + row * dx_row_stride + cols, (wdy - (xhat * c1 + c2)) * rstd, mask=mask)
        dw_acc += dy * xhat
        db_acc += dy
    tl.store(partial_dw_ptr + pid * n_cols + cols, dw_acc, mask=mask)   # stage 1: one partial row
    tl.store(partial_db_ptr + pid * n_cols + cols, db_acc, mask=mask)
    ### END SOLUTION


@triton.jit
def layer_norm_bwd_dwdb_kernel(partial_dw_ptr, partial_db_ptr, dw_ptr, db_ptr, n_partials, n_cols,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    ### BEGIN SOLUTION
    pid = tl.program_id(0)                                      # one program per BLOCK_N columns
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    dw = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    db = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for start in range(0, n_partials, BLOCK_M):                 # stage 2: walk down the P partial rows
        rows = start + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < n_partials) & (cols[None, :] < n_cols)
        offs = rows[:, None] * n_cols + cols[None, :]
        dw += tl.load(partial_dw_ptr + offs, mask=mask, other=0.0)
        db += tl.load(partial_db_ptr + offs, mask=mask, other=0.0)
    tl.store(dw_ptr + cols, tl.sum(dw, axis=0), mask=cols < n_cols)
    tl.store(db_ptr + cols, tl.sum(db, axis=0), mask=cols < n_cols)
    ### END SOLUTION


def layer_norm_backward(dy, x, weight, mean, rstd):
    """(dx, dweight, dbias) of layer norm, from the forward pass's float32 mean and rstd."""
    ### BEGIN SOLUTION
    # twin: ptinternals.kernels.layernorm.layer_norm_backward
    n_rows, n_cols = x.shape
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    dw = torch.empty(n_cols, dtype=weight.dtype, device=x.device)
    db = torch.empty(n_cols, dtype=weight.dtype, device=x.device)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 2
    n_programs = max(1, min(n_rows, 2 * sms))
    rows_per_program = max(1, triton.cdiv(n_rows, n_programs))      # M = 0: one program, no rows
    n_programs = max(1, triton.cdiv(n_rows, rows_per_program))
    partial_dw = torch.empty((n_programs, n_cols), dtype=torch.float32, device=x.device)  # P * N * 4 bytes
    partial_db = torch.empty((n_programs, n_cols), dtype=torch.float32, device=x.device)
    BLOCK_SIZE = max(triton.next_power_of_2(n_cols), 16)
    num_warps = 4 if BLOCK_SIZE <= 2048 else (8 if BLOCK_SIZE <= 8192 else 16)
    layer_norm_bwd_dx_kernel[(n_programs,)](
        dx, dy, x, weight, mean, rstd, partial_dw, partial_db, n_rows, n_cols, rows_per_program,
        x.stride(0), x.stride(1), dy.stride(0), dy.stride(1), dx.stride(0),
        BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)
    BLOCK_N = 128
    layer_norm_bwd_dwdb_kernel[(triton.cdiv(n_cols, BLOCK_N),)](
        partial_dw, partial_db, dw, db, n_programs, n_cols, BLOCK_M=32, BLOCK_N=BLOCK_N)
    return dx, dw, db
    ### END SOLUTION


# %% [tests layer_norm_backward]
check("kernels.layer_norm_backward", layer_norm_backward)
### BEGIN HIDDEN TESTS
check("kernels.layer_norm_backward", layer_norm_backward, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# The reference forward and backward on an awkward shape, checked against torch's autograd, and
# timed against `torch.native_layer_norm` / `native_layer_norm_backward`:

# %%
shape = (4096, 8192) if BIG else (24, 781)
dtype = torch.bfloat16 if BIG else torch.float32
xl = torch.randn(*shape, device=DEVICE, dtype=dtype)
wl, bl = torch.randn(shape[1], device=DEVICE, dtype=dtype), torch.randn(shape[1], device=DEVICE, dtype=dtype)
dyl = torch.randn_like(xl)
yl, mean_l, rstd_l = ref.layer_norm_forward(xl, wl, bl)
x_ag, w_ag, b_ag = (t.detach().float().requires_grad_() for t in (xl, wl, bl))
grads = torch.autograd.grad(F.layer_norm(x_ag, (shape[1],), w_ag, b_ag), (x_ag, w_ag, b_ag), dyl.float())
ours = ref.layer_norm_backward(dyl, xl, wl, mean_l, rstd_l)
print("max |error| of dx, dweight, dbias vs autograd:",
      [f"{(o.float() - g).abs().max().item():.2e}" for o, g in zip(ours, grads)])
MEASURED.append(bench("layer_norm_fwd", shape, dtype, costs.layer_norm_cost(*shape, dtype),
                      lambda: ref.layer_norm_forward(xl, wl, bl),
                      lambda: torch.native_layer_norm(xl, [shape[1]], wl, bl, 1e-5)))

# %% [quiz]
show_quiz("kernels", "q5")

# %% [markdown]
# ## 4. Matmul: tiles, `tl.dot` and the order of programs
#
# `C (M, N) = A (M, K) @ B (K, N)` does `2MNK` FLOPs on `MK + KN + MN` elements: at 4096^3 in fp16,
# 137 GFLOP over 96 MiB, about 1365 FLOP/byte, far right of the ridge. A matmul is **compute-bound**,
# and the job is keeping the tensor cores fed. The tool is the **tile**: program `(pid_m, pid_n)` owns
# a `BLOCK_M x BLOCK_N` tile of C and walks K in steps of `BLOCK_K`, loading a `(BLOCK_M, BLOCK_K)`
# tile of A and a `(BLOCK_K, BLOCK_N)` tile of B and doing `acc += tl.dot(a, b)` in fp32. Each loaded
# element is reused BLOCK_N (or BLOCK_M) times from registers and shared memory: bigger tiles, more
# reuse, until registers and shared memory run out. `tl.dot` maps to the tensor cores (`wgmma` on
# Hopper), which multiply in steps of 16 along K: a block's K dimension must be at least 16 (32 for
# 8-bit types; Triton pads small M and N). The interpreter happily multiplies 8 x 8 blocks; a GPU
# compile refuses.
#
# The ragged edges: the last K-step may be partial, so mask it (`offs_k < K - k * BLOCK_K`, with
# `other=0.0` so the padding adds nothing to the dot product); rows of A past M and columns of B past
# N can be wrapped with `% M` (`% N`) to stay in bounds, since they only feed C entries that the final,
# masked store discards.
#
# ### Which tile does program `pid` compute?
#
# The programs of a launch run roughly in `pid` order, about one wave of `#SMs x programs per SM` at a
# time (132 SMs on an H200). In **row-major** order a wave computes a row of C tiles: it reads one
# row-panel of A but *every* column-panel of B. **Grouped** order (`GROUP_SIZE_M`) walks
# `GROUP_SIZE_M` tile-rows together, down first, then across, so the programs in flight share a few
# panels of A *and* of B, which then come from L2 instead of HBM. Within a group of `group_size`
# tile-rows, consecutive pids go down a column of tiles: `pid_m` changes fastest.
#
# ### {{exercise grouped_tile_order}}: grouped order, in plain Python
#
# Write `grouped_tile_order(num_pid_m, num_pid_n, group_size_m)` returning the list of
# `(pid_m, pid_n)` that programs `0, 1, 2, ...` compute, in pid order. This is the index arithmetic
# you will put in the kernel of 7.6: with `num_pid_in_group = group_size_m * num_pid_n`, program
# `pid` is in group `pid // num_pid_in_group`, whose first tile-row is `group * group_size_m`; the last
# group may be shorter (`min(num_pid_m - first_pid_m, group_size_m)` rows).

# %% [answer grouped_tile_order]
def grouped_tile_order(num_pid_m, num_pid_n, group_size_m):
    """[(pid_m, pid_n) for pid in range(num_pid_m * num_pid_n)] in grouped order."""
    ### BEGIN SOLUTION
    # twin: ptinternals.kernels.blocked_matmul.grouped_tile_order
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
    ### END SOLUTION


# %% [tests grouped_tile_order]
check("kernels.grouped_tile_order", grouped_tile_order)
### BEGIN HIDDEN TESTS
check("kernels.grouped_tile_order", grouped_tile_order, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# How much does grouping save? Count the distinct panels of A and B that the first wave of programs
# reads (a stand-in for what must come from HBM rather than L2): an 8192 x 8192 C in 128 x 128 tiles
# is a 64 x 64 grid, and a wave is about 132 programs, one per SM.

# %%
from ptinternals.kernels.blocked_matmul import grouped_tile_order as ref_order, panels_touched

for g in (1, 4, 8, 16):
    order = ref_order(64, 64, g)
    print(f"GROUP_SIZE_M = {g:2d}: the first 132 programs read {panels_touched(order, 132):3d} panels "
          f"({len({m for m, _ in order[:132]}):2d} of A, {len({n for _, n in order[:132]}):2d} of B)")

# %% [markdown]
# ### `num_warps`, `num_stages` and autotuning
#
# Two launch options shape a compiled kernel. `num_warps` is the number of 32-thread warps per
# program (4 warps form one Hopper *warpgroup*, the unit that issues `wgmma`). `num_stages` is how
# many K-steps of A and B tiles are in flight in shared memory at once: Triton **software-pipelines**
# the loop, so the loads for step k+2 overlap the `tl.dot` of step k. Each stage costs
# `(BLOCK_M + BLOCK_N) * BLOCK_K * 2` bytes of shared memory in fp16 (48 KiB at 128x256x64), and an
# H200 SM gives one program at most 227 KiB. The best combination depends on the shape, so
# `@triton.autotune(configs=[triton.Config({...}, num_warps=..., num_stages=...), ...], key=["M", "N", "K"])`
# times every config on the first call for each new key and caches the winner
# (`triton/runtime/autotuner.py`). Timing needs a GPU: without one, keep a single config.
#
# Compiling for a GPU needs no GPU, though. `ptinternals.kernels.offline_compile` runs Triton's whole
# pipeline for `sm_90` (Hopper) and reads back what a config costs; here the reference matmul's first
# config, then `tl.dot` on 8 x 8 blocks (in a subprocess: the kernels must be defined with the
# interpreter off).

# %%
import subprocess
import sys
import textwrap

script = textwrap.dedent('''
    from triton.compiler import CompilationError
    from ptinternals.kernels import blocked_matmul as bm
    from ptinternals.kernels.offline_compile import compile_for_gpu
    mm = dict(a_ptr="*fp16", b_ptr="*fp16", c_ptr="*fp16", M=4096, N=4096, K=4096, stride_am=4096, stride_ak=1,
              stride_bk=4096, stride_bn=1, stride_cm=4096, stride_cn=1, INPUT_PRECISION=("c", "ieee"),
              UPCAST=("c", False))
    cfg = bm.GPU_CONFIGS[0]
    r = compile_for_gpu(bm.matmul_kernel, {**mm, **{k: ("c", v) for k, v in cfg.kwargs.items()}},
                        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    print(f"config {cfg.kwargs}, num_warps={cfg.num_warps}, num_stages={cfg.num_stages}:")
    print(f"  {r.shared_bytes / 1024:.0f} KiB shared memory, {r.registers} registers/thread, "
          f"{r.spill_bytes} bytes spilled, wgmma (SASS HGMMA) used: {r.uses_wgmma}")
    tiny = {"BLOCK_M": ("c", 8), "BLOCK_N": ("c", 8), "BLOCK_K": ("c", 8), "GROUP_SIZE_M": ("c", 1)}
    try:
        compile_for_gpu(bm.matmul_kernel, {**mm, **tiny}, num_warps=1, num_stages=1)
        print("tl.dot on 8 x 8 blocks compiled")
    except CompilationError as e:
        print("tl.dot on 8 x 8 blocks: CompilationError:", str(e).strip().splitlines()[-1][:150])
''')
proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                      env=dict(os.environ, TRITON_INTERPRET="0"))
print(proc.stdout or proc.stderr[-1500:])

# %% [markdown]
# ### {{exercise matmul}}: blocked matmul
#
# Write `matmul_kernel` and `matmul(a, b)`: `a @ b` for 2-d `a` (M, K) and `b` (K, N) of **any strides**
# (a transposed `b` is common: `x @ w.t()`), fp32, fp16 or bf16, returning a contiguous result in
# `a`'s dtype. Use a 1-d grid of `cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)` programs with the grouped order
# of 7.5, `tl.dot` with fp32 accumulation, and masks for the ragged edges; K may be 0 (C is then all
# zeros). For fp32 inputs `tl.dot` uses TF32 on a GPU by default (10-bit mantissas); the check allows
# for that. On a GPU the check also times 4096^3 fp16 and bf16 against cuBLAS (target: at least 0.9x),
# so autotune when `torch.cuda.is_available()`, and keep one config (32 x 32 x 32 works well) for the
# interpreter.

# %% [answer matmul]
# The autotuner's candidates (given; change them if you like): on a GPU several tile shapes, each
# timed on the first call for every new (M, N, K); in the interpreter one, since it cannot time.
def _mm_config(bm, bn, bk, group_m, stages, warps):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_SIZE_M": group_m},
                         num_stages=stages, num_warps=warps)


if torch.cuda.is_available():
    MATMUL_CONFIGS = [_mm_config(128, 256, 64, 8, 3, 8), _mm_config(256, 128, 64, 8, 3, 8),
                      _mm_config(128, 256, 64, 8, 4, 8), _mm_config(128, 128, 64, 8, 4, 8),
                      _mm_config(128, 128, 64, 8, 3, 4), _mm_config(128, 64, 64, 8, 4, 4),
                      _mm_config(64, 128, 64, 8, 4, 4), _mm_config(64, 64, 64, 8, 4, 4),
                      _mm_config(64, 32, 32, 8, 5, 2)]
else:
    MATMUL_CONFIGS = [_mm_config(32, 32, 32, 4, 1, 4)]


def _small_tiles_for_small_problems(configs, named_args, **kwargs):
    """Skip tiles much bigger than C: fewer configs to compile and time when M or N is small."""
    m, n = named_args["M"], named_args["N"]
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= max(64, m) and c.kwargs["BLOCK_N"] <= max(64, n)]
    return kept or configs[-1:]


@triton.autotune(configs=MATMUL_CONFIGS, key=["M", "N", "K"],
                 prune_configs_by={"early_config_prune": _small_tiles_for_small_problems})
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr):
    ### BEGIN SOLUTION
    pid = tl.program_id(axis=0)                            # grouped order, as in 7.5
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_SIZE_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M            # rows past M wrap: discarded later
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak   # (BLOCK_M, BLOCK_K)
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn   # (BLOCK_K, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K                                          # the last step may be partial
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)                                           # tensor cores, fp32 accumulate
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))
    ### END SOLUTION


def matmul(a, b):
    """a @ b for 2-d a (M, K), b (K, N) of any strides, fp32/fp16/bf16, accumulated in fp32."""
    ### BEGIN SOLUTION
    # twin: ptinternals.kernels.blocked_matmul.matmul
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                        c.stride(0), c.stride(1))
    return c
    ### END SOLUTION


# %% [tests matmul]
check("kernels.matmul", matmul)
### BEGIN HIDDEN TESTS
check("kernels.matmul", matmul, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# The reference matmul on an awkward shape (in fp32 it follows torch's choice: TF32 tensor cores only
# when `torch.backends.cuda.matmul.allow_tf32` is set, else full fp32), then autotuned against torch,
# i.e. cuBLAS. At 4096^3 the good configs reach
# about cuBLAS's TFLOP/s; at small sizes the fixed cost of a launch dominates.

# %%
m_, k_, n_ = (1823, 781, 1029) if BIG else (182, 78, 103)     # awkward: no dimension divides a block
a_odd = torch.randn(m_, k_, device=DEVICE)
b_odd = torch.randn(n_, k_, device=DEVICE).t()                 # a transposed operand, as in x @ w.t()
print(f"max |error| vs torch at ({m_}, {k_}) @ ({k_}, {n_}), b transposed:",
      (ref.matmul(a_odd, b_odd) - a_odd @ b_odd).abs().max().item())
shape = (4096, 4096, 4096) if BIG else (64, 48, 80)
dtype = torch.float16 if BIG else torch.float32
am = torch.randn(shape[0], shape[2], device=DEVICE, dtype=dtype)
bm_ = torch.randn(shape[2], shape[1], device=DEVICE, dtype=dtype)
MEASURED.append(bench("matmul", shape, dtype, costs.matmul_cost(*shape, dtype),
                      lambda: ref.matmul(am, bm_), lambda: am @ bm_))

# %% [quiz]
show_quiz("kernels", "q6", "q7")

# %% [markdown]
# ## 5. Flash attention: the online softmax, over tiles
#
# `O = softmax(Q K^T / sqrt(D)) V` for Q (B, H, Sq, D) and K, V (B, H, Sk, D). Done as torch ops, the
# score matrix `S = Q K^T` and the probabilities `P` are (Sq, Sk) per head, written to HBM and read
# back: at B = 4, H = 16, S = 4096 that is 2 GiB per tensor in fp16, for inputs of 32 MiB. Flash
# attention (Dao et al., FlashAttention-2) never materializes them. Program `(m-block, b*h)` keeps a
# `BLOCK_M x D` tile of Q in registers and streams K and V past it in `BLOCK_N`-row tiles, doing the
# row softmax **online**, like the multi-block softmax of section 2:
#
# ```
# s     = (q @ k^T) * scale                     # (BLOCK_M, BLOCK_N) scores of this key block
# m_new = max(m_i, rowmax(s))                   # running row max
# p     = exp(s - m_new)
# alpha = exp(m_i - m_new)                      # how much the old max was too small
# l_i   = l_i * alpha + rowsum(p)               # running sum, rescaled to the new max
# acc   = acc * alpha + p @ v                   # unnormalized output, rescaled the same way
# m_i   = m_new
# ...
# O = acc / l_i                                 # after the last key block
# ```
#
# Both `l_i` **and** `acc` must be rescaled by `alpha` whenever the max grows; forgetting either is the
# classic bug, and it only shows when a later key block holds a larger score than the earlier ones.
# The reference kernel (`ptinternals/kernels/attention.py`) adds the production details: `exp2` with
# `scale * log2(e)` folded into one multiply (`exp2` is the hardware instruction `exp` is built on),
# the log-sum-exp saved for backward, and for **causal** attention two loops: key blocks fully left of
# the diagonal need no mask, the few on it do, and blocks right of it are skipped, which halves the work.
# Causal here is top-left aligned, like `is_causal=True` in torch: query `i` sees keys `j <= i`.
#
# ### {{exercise flash_attention}}: flash attention forward
#
# Write `flash_attention(q, k, v, causal=False)` returning `O` like
# `F.scaled_dot_product_attention(q, k, v, is_causal=causal)` (scale `1/sqrt(D)`), in `q`'s dtype, for
# q (B, H, Sq, D) and k, v (B, H, Sk, D) of any strides, with D in {16, 32, 64} and sequence lengths
# that are not multiples of your blocks. Keys past Sk need a score of `-inf` (a masked load gives them
# 0, which is not the same). On a GPU the check times (4, 16, 4096, 64) bf16 against SDPA's
# FlashAttention-2 backend (target: at least 0.8x), causal and not.

# %% [answer flash_attention]
# The autotuner's candidates (given): 128-row Q tiles with 32-128-row K/V tiles on a GPU; one config
# for the interpreter. Every BLOCK_M is a multiple of BLOCK_N.
if torch.cuda.is_available():
    ATTN_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=s, num_warps=w)
                    for bm, bn, s, w in [(128, 64, 3, 4), (128, 64, 4, 4), (128, 128, 3, 8), (128, 64, 3, 8),
                                         (128, 128, 2, 8), (128, 32, 4, 4), (64, 64, 4, 4), (64, 32, 4, 4)]]
else:
    ATTN_CONFIGS = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_stages=1, num_warps=4)]


def _small_tiles_for_short_sequences(configs, named_args, **kwargs):
    """Skip 128-row Q tiles for short sequences: fewer configs to compile and time."""
    seq_q = kwargs.get("SEQ_Q", named_args.get("SEQ_Q", 0))
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= max(64, seq_q)]
    return kept or configs[-1:]


@triton.jit
def _attn_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_m, offs_d,
                lo, hi, seq_k, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key blocks lo, lo + BLOCK_N, ... < hi against one Q tile: update and return (acc, l_i, m_i).
    A helper you may use (or not): MASKED blocks need the Sk and causal masks, the others none."""
    ### BEGIN SOLUTION
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd   # K^T: (D, BLOCK_N)
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd   # V: (BLOCK_N, D)
        if MASKED:
            k = tl.load(k_ptrs, mask=offs_n[None, :] < seq_k, other=0.0)
            v = tl.load(v_ptrs, mask=offs_n[:, None] < seq_k, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        s = tl.dot(q, k) * qk_scale                                     # scores in log2 units
        if MASKED:
            valid = offs_n[None, :] < seq_k
            if CAUSAL:
                valid = valid & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(valid, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i
    ### END SOLUTION


@triton.autotune(configs=ATTN_CONFIGS, key=["SEQ_Q", "SEQ_K", "HEAD_DIM", "CAUSAL"],
                 prune_configs_by={"early_config_prune": _small_tiles_for_short_sequences})
@triton.jit
def attention_fwd_kernel(Q, K, V, O, sm_scale,
                         stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                         stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_om, stride_od,
                         H, SEQ_Q, SEQ_K, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    ### BEGIN SOLUTION
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_mask = offs_m < SEQ_Q
    q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=row_mask[:, None], other=0.0)
    k_base = K + off_b * stride_kb + off_h * stride_kh
    v_base = V + off_b * stride_vb + off_h * stride_vh
    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634            # log2(e): exp(x) = exp2(x * log2 e)
    seq_k_full = (SEQ_K // BLOCK_N) * BLOCK_N           # keys in whole, unmasked blocks
    if CAUSAL:
        hi_unmasked = tl.minimum((start_m * BLOCK_M) // BLOCK_N * BLOCK_N, seq_k_full)   # left of the diagonal
        hi = tl.minimum((start_m + 1) * BLOCK_M, SEQ_K)                                  # nothing right of it
    else:
        hi_unmasked = seq_k_full
        hi = SEQ_K
    acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                                offs_m, offs_d, 0, hi_unmasked, SEQ_K, qk_scale, False, CAUSAL, BLOCK_N)
    acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                                offs_m, offs_d, hi_unmasked, hi, SEQ_K, qk_scale, True, CAUSAL, BLOCK_N)
    o = acc / l_i[:, None]
    tl.store(O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             o.to(O.dtype.element_ty), mask=row_mask[:, None])
    ### END SOLUTION


def flash_attention(q, k, v, causal=False):
    """softmax(q k^T / sqrt(D)) v for (B, H, S, D) tensors, D in {16, 32, 64}; causal is top-left aligned."""
    ### BEGIN SOLUTION
    # twin: ptinternals.kernels.attention.flash_attention
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    o = torch.empty((B, H, Sq, D), dtype=q.dtype, device=q.device)
    grid = lambda meta: (triton.cdiv(Sq, meta["BLOCK_M"]), B * H)
    attention_fwd_kernel[grid](q, k, v, o, 1.0 / math.sqrt(D), *q.stride(), *k.stride(), *v.stride(), *o.stride(),
                               H, Sq, Sk, HEAD_DIM=D, CAUSAL=causal)
    return o
    ### END SOLUTION


# %% [tests flash_attention]
check("kernels.flash_attention", flash_attention)
### BEGIN HIDDEN TESTS
check("kernels.flash_attention", flash_attention, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# The reference kernel on sequences no block divides, then timed against SDPA (on a GPU pinned to
# its FlashAttention-2 backend), causal. On a GPU, fp32 inputs go through `tl.dot`'s default TF32,
# so expect errors around 1e-3 there; in the interpreter fp32 is exact to about 1e-6.

# %%
from torch.nn.attention import SDPBackend, sdpa_kernel

odd = (2, 8, 1000, 64) if BIG else (1, 2, 70, 32)              # 1000 and 70: no block divides them
qo, ko, vo = (torch.randn(*odd, device=DEVICE) for _ in range(3))
for causal in (False, True):
    err = (ref.flash_attention_forward(qo, ko, vo, causal)[0] - F.scaled_dot_product_attention(qo, ko, vo, is_causal=causal))
    print(f"{odd}, causal={causal}: max |error| vs SDPA {err.abs().max().item():.2e}")
shape = (4, 16, 4096, 64) if BIG else (1, 2, 64, 32)
dtype = torch.bfloat16 if BIG else torch.float32
qa, ka, va = (torch.randn(*shape, device=DEVICE, dtype=dtype) for _ in range(3))


def sdpa_causal():
    if BIG:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qa, ka, va, is_causal=True)
    return F.scaled_dot_product_attention(qa, ka, va, is_causal=True)


MEASURED.append(bench("attention_fwd", shape, dtype, costs.attention_cost(*shape[:3], shape[2], shape[3], dtype, True),
                      lambda: ref.flash_attention_forward(qa, ka, va, True), sdpa_causal))

# %% [quiz]
show_quiz("kernels", "q8", "q9")

# %% [markdown]
# ## 6. A kernel as a real PyTorch operator
#
# Your `layer_norm_forward` already runs, but to the rest of PyTorch it is an opaque Python function
# that launches something on raw pointers. `torch.compile` would trace into it and meet a Triton
# launch on fake tensors; autograd knows nothing about it. `torch.library.custom_op`
# (`torch/_library/custom_ops.py`) registers it as an **operator**, `torch.ops.kernels.layer_norm`, with
# what {{chapter autograd}} and {{chapter dispatch}} showed every op needs:
#
# * a **schema**, inferred from the type hints: `(Tensor x, Tensor weight, Tensor bias, float eps) ->
#   (Tensor, Tensor, Tensor)`; `mutates_args=()` promises no input is written;
# * a **fake** implementation (`register_fake`): output shapes, dtypes and strides without computing
#   anything. `FakeTensorMode`, `torch.compile` and AOTAutograd trace through it ({{chapter dispatch}});
# * an **autograd** formula (`register_autograd(backward, setup_context=...)`): `setup_context` saves
#   what backward needs ({{chapter autograd}}'s `ctx.save_for_backward`), `backward` returns one gradient per
#   input (`None` for `eps`). The backward must itself be traceable, so it calls a *second* custom op
#   wrapping your backward kernels, rather than launching them directly.
#
# `torch.library.opcheck` tests all of it against the real kernel: the schema (no hidden mutation or
# aliasing), fake against real outputs, the autograd registration, and AOTAutograd tracing with
# dynamic shapes. (`torch.library.triton_op` + `wrap_triton` would let Inductor see *inside* the
# kernel; on the CPU they fail opcheck and compile in torch 2.13, so this course uses `custom_op`.)
#
# ### {{exercise custom_op}}: `torch.ops.kernels.layer_norm`
#
# Complete the two custom ops below around your 7.3 and 7.4 functions. The fake of the forward
# returns `y` contiguous with `x`'s shape and dtype, and `mean`, `rstd` of shape `(M,)` in float32;
# the fake of the backward returns tensors shaped like `x`, `weight`, `weight`. The checks run
# `opcheck` (also on a transposed `x` and in fp16), compare gradients with autograd through
# `F.layer_norm`, trace the op with `torch.compile(fullgraph=True)`, and train a small model with it
# for a few steps: its losses must match the same model trained with `F.layer_norm`.

# %% [answer custom_op]
@torch.library.custom_op("kernels::layer_norm_backward", mutates_args=())
def layer_norm_backward_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                           rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ### BEGIN SOLUTION
    return layer_norm_backward(dy, x, weight, mean, rstd)
    ### END SOLUTION


@layer_norm_backward_op.register_fake
def _(dy, x, weight, mean, rstd):
    ### BEGIN SOLUTION
    return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape)
    ### END SOLUTION


@torch.library.custom_op("kernels::layer_norm", mutates_args=())
def layer_norm_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ### BEGIN SOLUTION
    # twin: ptinternals.kernels.custom_op.layer_norm_op
    return layer_norm_forward(x, weight, bias, eps)
    ### END SOLUTION


@layer_norm_op.register_fake
def _(x, weight, bias, eps):
    ### BEGIN SOLUTION
    m = x.shape[0]
    return (x.new_empty(x.shape), x.new_empty(m, dtype=torch.float32),
            x.new_empty(m, dtype=torch.float32))
    ### END SOLUTION


def setup_context(ctx, inputs, output):
    ### BEGIN SOLUTION
    x, weight, bias, eps = inputs
    y, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)        # 2 floats per row, not the normalized x
    ctx.mark_non_differentiable(mean, rstd)
    ### END SOLUTION


def backward(ctx, dy, dmean, drstd):
    ### BEGIN SOLUTION
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = layer_norm_backward_op(dy.contiguous(), x, weight, mean, rstd)
    return dx, dw, db, None                             # no gradient for eps
    ### END SOLUTION


layer_norm_op.register_autograd(backward, setup_context=setup_context)

# %% [tests custom_op]
check("kernels.custom_op", layer_norm_op)
### BEGIN HIDDEN TESTS
check("kernels.custom_op", layer_norm_op, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# The reference op, `torch.ops.ptinternals.triton_layer_norm`, in a model and in a compiled graph.
# With `backend="aot_eager"` AOTAutograd traces forward and backward (with fake tensors, through the
# fake implementations) and runs the captured graphs eagerly; in the printed forward graph the whole
# layer norm is a single node, one opaque operator.

# %%
from ptinternals.kernels.custom_op import TritonLayerNorm

model = torch.nn.Sequential(torch.nn.Linear(12, 24), TritonLayerNorm(24), torch.nn.ReLU(), torch.nn.Linear(24, 1))
model = model.to(DEVICE)
graphs = []


from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func


def show_graph(gm, example_inputs):
    graphs.append(gm.code)
    return make_boxed_func(gm.forward)


compiled = torch.compile(model, fullgraph=True,
                         backend=lambda gm, ex: aot_module_simplified(gm, ex, fw_compiler=show_graph))
xb = torch.randn(8, 12, device=DEVICE)
compiled(xb).sum().backward()
print("\n".join(line for line in graphs[0].splitlines() if "ptinternals" in line or "addmm" in line))
torch._dynamo.reset()

# %% [quiz]
show_quiz("kernels", "q10")

# %% [markdown]
# ## 7. The roofline: what the numbers mean
#
# Every kernel in this chapter has two numbers: the bytes it must move to and from HBM, and the FLOPs
# it must do (`ptinternals.kernels.costs` counts them; compulsory traffic only, each input read once).
# Their ratio, the **arithmetic intensity** in FLOP/byte, places it on the **roofline** (Williams,
# Waterman and Patterson, 2009): no kernel can exceed `min(peak FLOP/s, intensity x bandwidth)`. The
# ridge, where the two roofs meet, is at 989e12 / 4.8e12 = 206 FLOP/byte on an H200. Left of it
# (add, softmax, layer norm) a kernel is memory-bound and is judged in GB/s; the way to win is to move
# fewer bytes, which is what fusion does. Right of it (a large matmul, attention) it is compute-bound
# and judged in TFLOP/s; the way to win is tiling that keeps the tensor cores busy.
#
# On a GPU the plot shows this run's measurements (filled: Triton, hollow: torch). Without one, the
# interpreter's timings mean nothing, so each kernel is placed at its intensity *on* the H200's roof:
# the best any implementation could do at the GPU sizes. The vertical distance from a point up to the
# roof is what is left to gain.

# %%
from ptinternals.viz.kernels import roofline_figure

if BIG:
    points, title = MEASURED, None
else:
    gpu_sizes = [("add", (1 << 28,), torch.float32, costs.add_cost(1 << 28, torch.float32)),
                 ("softmax", (4096, 4096), torch.float16, costs.softmax_cost(4096, 4096, torch.float16)),
                 ("layer_norm_fwd", (4096, 8192), torch.bfloat16, costs.layer_norm_cost(4096, 8192, torch.bfloat16)),
                 ("matmul", (4096,) * 3, torch.float16, costs.matmul_cost(4096, 4096, 4096, torch.float16)),
                 ("attention_fwd", (4, 16, 4096, 64), torch.bfloat16,
                  costs.attention_cost(4, 16, 4096, 4096, 64, torch.bfloat16, True))]
    points = []
    for name, shp, dt, cost in gpu_sizes:
        best_s = max(cost.bytes_moved / H200_HBM_BYTES_PER_S, cost.flops / H200_BF16_DENSE_FLOPS)
        points.append(Measurement("kernels", name, "cuda", str(shp), str(dt).replace("torch.", ""), best_s * 1e3,
                                  cost.bytes_moved, cost.flops))
        print(f"{name:15s} {cost.intensity:9.2f} FLOP/byte -> at best {best_s * 1e3:8.3f} ms on an H200")
    title = "Where each kernel sits on the H200 roofline (ideal: the roof itself; run on a GPU to measure)"
roofline_figure(points, title=title)

# %% [markdown]
# ## 8. Reading the Triton that `torch.compile` writes
#
# Inductor, `torch.compile`'s default backend, lowers a captured graph to loops, fuses what it can, and
# on a GPU prints each fused group as a Triton kernel (`torch/_inductor/codegen/triton.py`; set
# `TORCH_LOGS=output_code` to see it for any program). Kernel names tell what kind of loop it is:
# `triton_poi_` pointwise, `triton_red_` a reduction that loops over blocks, `triton_per_` a
# *persistent* reduction whose whole row fits one block (like your softmax), `triton_tem_` a template
# such as a matmul; then `fused_` and the ops it fused. On the CPU Inductor normally writes C++; with
# `cpu_backend="triton"` it writes Triton for the CPU, which `ref.inductor.generated_triton_code` captures
# right after generation (this machine has no Triton CPU driver to run it with).
#
# Below: layer norm followed by GELU, which Inductor fuses into one persistent reduction. Look for
# what you wrote by hand in 7.3: `xoffset`/`xindex` are the rows this program owns (`tl.program_id(0)
# * XBLOCK`), `r0_index` the columns, `r0_mask` the ragged end of a row, the loads with `other=0.0`,
# the sums, `libdevice.rsqrt(var + eps)`, and the fused epilogue before the one store.

# %%
from ptinternals.kernels.inductor import generated_triton_code, triton_kernel_names, triton_kernel_source

x_ind = torch.randn(64, 100, device=DEVICE)
w_ind, b_ind = torch.randn(100, device=DEVICE), torch.randn(100, device=DEVICE)
code = "\n".join(generated_triton_code(lambda t, w, b: F.gelu(F.layer_norm(t, (100,), w, b)), x_ind, w_ind, b_ind))
names = triton_kernel_names(code)
print("kernels:", names)
print(triton_kernel_source(code, names[0]) if names else code[:3000])

# %% [markdown]
# ## Summary
#
# * A Triton kernel is one program over blocks; the grid runs many; masks guard the ragged edges;
#   pointers are base + offsets in elements, and strides make any layout addressable ({{chapter strides}}).
# * Memory-bound ops win by fusion: one read and one write of the data. Compute in fp32, store in
#   the output dtype; subtract the max before `exp`; masked lanes must not pollute reductions.
# * Reductions across programs need two stages (partial rows, then a sum), not one atomic per row.
# * Compute-bound ops win by tiling: `tl.dot` on tiles with K >= 16, fp32 accumulation, grouped
#   program order for L2 reuse, `num_warps`/`num_stages`/autotuning for the hardware.
# * Flash attention is the online softmax over K/V tiles: rescale both the running sum and the
#   accumulator whenever the max grows.
# * `torch.library.custom_op` + `register_fake` + `register_autograd` turn a kernel into an operator
#   that autograd, FakeTensor and `torch.compile` understand; `opcheck` proves it.
# * The roofline says which number to chase: GB/s left of the ridge, TFLOP/s right of it.
#
# Next: {{chapter compile}} shows how `torch.compile` writes kernels like these for you (and what it
# fuses), and {{chapter gpt}} puts the pieces together in a small GPT.
#
# ### Your quiz score so far
# Practice answers count no points; the grader scores your last answer to each graded question (recorded in
# `kernels.answers.json`).

# %% [quiz-grade]
quiz_progress("kernels")
