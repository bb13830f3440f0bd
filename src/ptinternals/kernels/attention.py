"""Flash attention, forward (Dao et al. 2022, FlashAttention-2; Triton tutorial ``06-fused-attention.py``).

``O = softmax(Q K^T * sm_scale) V`` for Q (B, H, Sq, D), K and V (B, H, Sk, D). Done naively this
writes the (Sq, Sk) score matrix S and the probabilities P to HBM: at B=4, H=16, S=4096 that is
2 GiB of fp16 per tensor, written and read back, for work whose inputs and output are 32 MiB each.

Flash attention never materializes S. Program (m-block, b*h) keeps a BLOCK_M x D tile of Q in
registers and streams K and V past it in BLOCK_N-row tiles, doing the row softmax *online* (as in
``fused_softmax.online_softmax_kernel``): a running row max ``m_i``, a running sum ``l_i`` of
exp(s - m_i), and an unnormalized output ``acc``; whenever ``m_i`` grows, ``l_i`` and ``acc`` are
rescaled by ``alpha = exp(m_old - m_new)``. At the end ``O = acc / l_i``, and the row's
log-sum-exp ``lse = m_i + log(l_i)`` is saved: backward rebuilds P from it without a second softmax.
HBM traffic is Q, K, V, O (times Sq/BLOCK_M re-reads of K and V, mostly from L2); FLOPs are
4*B*H*Sq*Sk*D (two matmuls), halved when causal: compute-bound.

Details that matter:
- ``exp2`` instead of ``exp``: the scale ``sm_scale * log2(e)`` is folded into one multiply, and
  exp2 is the hardware instruction (MUFU.EX2) that ``exp`` is built on.
- causal (top-left aligned, like ``is_causal=True`` in torch): key blocks fully left of the
  diagonal need no mask, so the loop runs in two stages, unmasked blocks first, then the few blocks
  on the diagonal or at the ragged end of Sk with the mask. Blocks right of the diagonal are skipped,
  which is where causal saves half the work. Needs BLOCK_M to be a multiple of BLOCK_N.
- Sq, Sk need not be multiples of the blocks: rows past Sq load zeros and are not stored; columns
  past Sk get score -inf. D may be any of 1..128: it is padded to a power of two >= 16 (``tl.dot``'s
  minimum on a GPU) with masked loads, zeros adding nothing to the dot products.
- dtypes: fp16/bf16 run both matmuls on the tensor cores with fp32 accumulation; fp32 inputs go
  through ``tl.dot``'s default TF32 on a GPU (about 3 decimal digits per product), as most fast
  attention kernels do. fp64 is not supported.

torch's version is ``aten/src/ATen/native/transformers/cuda/flash_attn/`` (FlashAttention-2), reached
through ``scaled_dot_product_attention`` with ``SDPBackend.FLASH_ATTENTION``. Backward is in
``attention_backward.py``.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import DOT_DTYPES, INTERPRET, autotune, cdiv, check_same, check_tensor, next_power_of_2

# Globals a kernel reads must be tl.constexpr (compile-time constants).
LOG2E = tl.constexpr(1.4426950408889634)   # exp(x) = exp2(x * log2(e))
LN2 = tl.constexpr(0.6931471805599453)     # log(x) = log2(x) * ln(2)
MAX_HEAD_DIM = 128


def _config(bm, bn, stages, warps):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=stages, num_warps=warps)


# Hopper: 128-row Q tiles (one or two warpgroups), 64-128-row K/V tiles, 2-4 pipeline stages.
# Every config has BLOCK_M % BLOCK_N == 0 (the causal stage split needs it).
FWD_GPU_CONFIGS = [
    _config(128, 64, 3, 4),
    _config(128, 64, 4, 4),
    _config(128, 128, 3, 8),
    _config(128, 64, 3, 8),
    _config(128, 128, 2, 8),
    _config(128, 32, 4, 4),
    _config(64, 64, 4, 4),
    _config(64, 32, 4, 4),
]
FWD_CPU_CONFIG = _config(32, 32, 1, 4)


def _prune_fwd_configs(configs, named_args, **kwargs):
    """Drop configs that spill registers: at D > 64 a 128-row tile needs 8 warps (offline sm_90
    compile: 128x64 with 4 warps at D = 128 spills ~50 registers to local memory)."""
    head_dim = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM", 64))
    kept = [c for c in configs if not (head_dim > 64 and c.kwargs["BLOCK_M"] == 128 and c.num_warps == 4)]
    return kept or configs


@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i, q,                  # (BLOCK_M, BLOCK_D) f32, (BLOCK_M,) f32, (BLOCK_M,) f32, Q tile
    k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_d, lo, hi, seq_k, qk_scale,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    d_mask = offs_d < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd   # K^T (BLOCK_D, BLOCK_N)
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd   # V (BLOCK_N, BLOCK_D)
        if MASKED:                     # the ragged end of Sk (and the padded head dim)
            k = tl.load(k_ptrs, mask=(offs_n[None, :] < seq_k) & d_mask[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=(offs_n[:, None] < seq_k) & d_mask[None, :], other=0.0)
        elif HEAD_DIM == BLOCK_D:      # full tiles: no mask at all, the fastest loads
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        else:
            k = tl.load(k_ptrs, mask=d_mask[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=d_mask[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, k) * qk_scale                                  # (BLOCK_M, BLOCK_N) scores, log2 units
        if MASKED:
            valid = offs_n[None, :] < seq_k
            if CAUSAL:
                valid = valid & (offs_n[None, :] <= offs_m[:, None])   # key index <= query index
            s = tl.where(valid, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))                   # running row max
        p = tl.exp2(s - m_new[:, None])                              # (BLOCK_M, BLOCK_N), in [0, 1]
        alpha = tl.exp2(m_i - m_new)                                 # rescales what was summed so far
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)                          # fp16/bf16 P @ V, fp32 accumulate
        m_i = m_new
    return acc, l_i, m_i


@autotune(FWD_GPU_CONFIGS, FWD_CPU_CONFIG, key=["SEQ_Q", "SEQ_K", "HEAD_DIM", "CAUSAL"],
          prune_configs_by={"early_config_prune": _prune_fwd_configs})
@triton.jit
def flash_attention_fwd_kernel(
    Q, K, V, O, LSE,                   # Q, O (B, H, Sq, D); K, V (B, H, Sk, D); LSE (B, H, Sq) f32
    sm_scale,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, SEQ_Q, SEQ_K,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0)                         # which BLOCK_M rows of queries
    off_bh = tl.program_id(1)                          # which (batch, head)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    k_base = K + off_b * stride_kb + off_h * stride_kh
    v_base = V + off_b * stride_vb + off_h * stride_vh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_mask = offs_m < SEQ_Q
    d_mask = offs_d < HEAD_DIM
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=row_mask[:, None] & d_mask[None, :], other=0.0)       # (BLOCK_M, BLOCK_D), read once
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E                         # scores in log2 units: exp(s) = exp2(s * log2 e)

    # stage 1: key blocks that need no mask; stage 2: the diagonal / ragged-end blocks, masked
    seq_k_full = (SEQ_K // BLOCK_N) * BLOCK_N           # keys in whole BLOCK_N tiles
    if CAUSAL:
        hi_unmasked = tl.minimum(start_m * BLOCK_M, seq_k_full)       # keys left of this Q block
        hi = tl.minimum((start_m + 1) * BLOCK_M, SEQ_K)               # nothing right of the diagonal
    else:
        hi_unmasked = seq_k_full
        hi = SEQ_K
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base,
                                    stride_kn, stride_kd, stride_vn, stride_vd,
                                    offs_m, offs_d, 0, hi_unmasked, SEQ_K, qk_scale,
                                    False, CAUSAL, UPCAST, HEAD_DIM, BLOCK_D, BLOCK_N)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base,
                                    stride_kn, stride_kd, stride_vn, stride_vd,
                                    offs_m, offs_d, hi_unmasked, hi, SEQ_K, qk_scale,
                                    True, CAUSAL, UPCAST, HEAD_DIM, BLOCK_D, BLOCK_N)

    o = acc / l_i[:, None]
    lse = (m_i + tl.log2(l_i)) * LN2                    # natural-log logsumexp of each score row
    o_base = O + off_b * stride_ob + off_h * stride_oh
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             o.to(O.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])
    tl.store(LSE + off_bh.to(tl.int64) * SEQ_Q + offs_m, lse, mask=row_mask)


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale) -> float:
    """Validate (B, H, S, D) q, k, v and return the softmax scale (default 1/sqrt(D))."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, dtypes=DOT_DTYPES, ndim=4)
    check_same(("q", "k", "v"), (q, k, v))
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (B, H, Sk, D), "
                         f"got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q (B, H, Sq, D) and k (B, H, Sk, D) must agree on B, H and D, "
                         f"got {tuple(q.shape)} and {tuple(k.shape)}")
    d = q.shape[3]
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head dim q.shape[3] must be in 1..{MAX_HEAD_DIM}, got {d}")
    if sm_scale is None:
        return 1.0 / math.sqrt(d)
    if not isinstance(sm_scale, (int, float)) or isinstance(sm_scale, bool) or not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale must be a finite float, got {sm_scale!r}")
    return float(sm_scale)


def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                            sm_scale: float | None = None):
    """Attention forward: returns ``(o, lse)``, o like q (contiguous), lse (B, H, Sq) fp32.

    Same result as ``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)``;
    ``lse[b, h, i] = logsumexp_j(q_i . k_j * sm_scale)`` over the keys row i sees.
    """
    scale = check_attention_inputs(q, k, v, sm_scale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    o = torch.empty((B, H, Sq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    if B * H * Sq == 0:
        return o, lse
    if Sk == 0:                          # no keys: torch returns zeros
        return o.zero_(), lse.fill_(-float("inf"))
    grid = lambda meta: (cdiv(Sq, meta["BLOCK_M"]), B * H)
    flash_attention_fwd_kernel[grid](
        q, k, v, o, lse, scale,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, Sq, Sk,
        HEAD_DIM=D, BLOCK_D=max(16, next_power_of_2(D)), CAUSAL=causal, UPCAST=INTERPRET)
    return o, lse


class FlashAttentionFunction(torch.autograd.Function):
    """Forward by the Triton kernel above; backward by the Triton kernels of ``attention_backward``."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale):
        o, lse = flash_attention_forward(q, k, v, causal, sm_scale)
        ctx.save_for_backward(q, k, v, o, lse)          # O(S) extra memory: lse, not the (Sq, Sk) P
        ctx.causal, ctx.sm_scale = causal, sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        from .attention_backward import flash_attention_backward

        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(do, q, k, v, o, lse, ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    sm_scale: float | None = None) -> torch.Tensor:
    """Differentiable flash attention: ``F.scaled_dot_product_attention`` for (B, H, S, D) inputs."""
    return FlashAttentionFunction.apply(q, k, v, causal, sm_scale)
