"""Flash attention, backward (FlashAttention-2, Algorithm 2; Triton tutorial 06's ``_attn_bwd``).

With scores S = Q K^T * scale, P = softmax(S) and O = P V, the gradients are::

    dV = P^T dO                      dP = dO V^T
    dS = P * (dP - delta)            delta_i = sum_j P_ij dP_ij = sum_d dO_id O_id  (rowsum(dO * O))
    dQ = dS K * scale                dK = dS^T Q * scale

P is never stored: each kernel rebuilds a tile of it from Q, K and the saved row log-sum-exp,
``P_ij = exp(S_ij - lse_i)`` - one exp per entry, no max or sum needed. Three launches:

1. :func:`attention_bwd_preprocess_kernel`: ``delta = rowsum(dO * O)``, (B, H, Sq) fp32.
2. :func:`attention_bwd_dkdv_kernel`: one program per BLOCK_N keys holds K, V, dK, dV in registers
   and streams every Q block past them (only those at or below the diagonal when causal).
3. :func:`attention_bwd_dq_kernel`: one program per BLOCK_M queries holds Q, dO, dQ and streams the
   K/V blocks (only those left of or on the diagonal when causal).

Splitting dK/dV from dQ means every output tile has exactly one writer: no atomics, deterministic
(FlashAttention-2's own kernel accumulates dQ with atomic adds instead). The price is computing
S and P twice. Every tile is masked (ragged ends and the causal diagonal) with ``tl.where`` before
it is used: correct for any Sq, Sk and D, simpler than the forward's two-stage loop, and a little
slower on full tiles. torch: ``aten/src/ATen/native/transformers/cuda/flash_attn/flash_bwd_kernel.h``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention import LOG2E, check_attention_inputs
from .common import INTERPRET, cdiv, check_same, check_tensor, next_power_of_2


@triton.jit
def attention_bwd_preprocess_kernel(
    O, DO, DELTA,                       # O, dO (B, H, Sq, D) any strides; DELTA (B, H, Sq) f32
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    H, SEQ_Q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    off_bh = tl.program_id(1)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < SEQ_Q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om
                + offs_d[None, :] * stride_od, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :] * stride_dod, mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + off_bh.to(tl.int64) * SEQ_Q + offs_m, tl.sum(o * do, axis=1), mask=offs_m < SEQ_Q)


@triton.jit
def _load_rows(base, offs_rows, n_rows, stride_row, offs_d, stride_d,
               HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr):
    """A (rows, BLOCK_D) tile; rows >= n_rows and dims >= HEAD_DIM read as 0."""
    mask = (offs_rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM)
    t = tl.load(base + offs_rows[:, None] * stride_row + offs_d[None, :] * stride_d, mask=mask, other=0.0)
    if UPCAST:
        t = t.to(tl.float32)
    return t


@triton.jit
def attention_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale,
    stride_qb, stride_qh, stride_qm, stride_qd,      # also dO's strides (the wrapper makes dO like q)
    stride_kb, stride_kh, stride_kn, stride_kd,      # also V's, dK's and dV's
    H, SEQ_Q, SEQ_K,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    start_n = tl.program_id(0) * BLOCK_N              # this program's BLOCK_N keys
    off_bh = tl.program_id(1)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    q_off = off_b * stride_qb + off_h * stride_qh
    k_off = off_b * stride_kb + off_h * stride_kh
    row_off = off_bh.to(tl.int64) * SEQ_Q             # into LSE and DELTA (B, H, Sq)

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    # (BLOCK_N, BLOCK_D) tiles, held for the whole loop
    k = _load_rows(K + k_off, offs_n, SEQ_K, stride_kn, offs_d, stride_kd, HEAD_DIM, UPCAST)
    v = _load_rows(V + k_off, offs_n, SEQ_K, stride_kn, offs_d, stride_kd, HEAD_DIM, UPCAST)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E

    lo = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0        # earlier queries see none of these keys
    for start_m in range(lo, SEQ_Q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = _load_rows(Q + q_off, offs_m, SEQ_Q, stride_qm, offs_d, stride_qd, HEAD_DIM, UPCAST)  # (BM, D)
        do = _load_rows(DO + q_off, offs_m, SEQ_Q, stride_qm, offs_d, stride_qd, HEAD_DIM, UPCAST)
        lse2 = tl.load(LSE + row_off + offs_m, mask=offs_m < SEQ_Q, other=0.0) * LOG2E
        delta = tl.load(DELTA + row_off + offs_m, mask=offs_m < SEQ_Q, other=0.0)
        valid = (offs_n[:, None] < SEQ_K) & (offs_m[None, :] < SEQ_Q)          # (BLOCK_N, BLOCK_M)
        if CAUSAL:
            valid = valid & (offs_n[:, None] <= offs_m[None, :])
        s_t = tl.dot(k, tl.trans(q)) * qk_scale                                  # S^T tile, log2 units
        p_t = tl.where(valid, tl.exp2(s_t - lse2[None, :]), 0.0)                # P^T, rebuilt from lse
        dv = tl.dot(p_t.to(do.dtype), do, dv)                                    # dV += P^T dO
        dp_t = tl.dot(v, tl.trans(do))                                           # dP^T = V dO^T
        ds_t = p_t * (dp_t - delta[None, :])                                     # dS^T
        dk = tl.dot(ds_t.to(q.dtype), q, dk)                                     # dK += dS^T Q
    dk = dk * sm_scale
    mask = (offs_n[:, None] < SEQ_K) & (offs_d[None, :] < HEAD_DIM)
    out = offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
    tl.store(DK + k_off + out, dk.to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + k_off + out, dv.to(DV.dtype.element_ty), mask=mask)


@triton.jit
def attention_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, sm_scale,
    stride_qb, stride_qh, stride_qm, stride_qd,      # also dO's and dQ's
    stride_kb, stride_kh, stride_kn, stride_kd,      # also V's
    H, SEQ_Q, SEQ_K,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M              # this program's BLOCK_M queries
    off_bh = tl.program_id(1)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    q_off = off_b * stride_qb + off_h * stride_qh
    k_off = off_b * stride_kb + off_h * stride_kh
    row_off = off_bh.to(tl.int64) * SEQ_Q

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_rows(Q + q_off, offs_m, SEQ_Q, stride_qm, offs_d, stride_qd, HEAD_DIM, UPCAST)    # (BLOCK_M, D)
    do = _load_rows(DO + q_off, offs_m, SEQ_Q, stride_qm, offs_d, stride_qd, HEAD_DIM, UPCAST)
    lse2 = tl.load(LSE + row_off + offs_m, mask=offs_m < SEQ_Q, other=0.0) * LOG2E
    delta = tl.load(DELTA + row_off + offs_m, mask=offs_m < SEQ_Q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E

    hi = tl.minimum(start_m + BLOCK_M, SEQ_K) if CAUSAL else SEQ_K   # keys right of the diagonal: none
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(K + k_off, offs_n, SEQ_K, stride_kn, offs_d, stride_kd, HEAD_DIM, UPCAST)  # (BN, D)
        v = _load_rows(V + k_off, offs_n, SEQ_K, stride_kn, offs_d, stride_kd, HEAD_DIM, UPCAST)
        valid = (offs_m[:, None] < SEQ_Q) & (offs_n[None, :] < SEQ_K)          # (BLOCK_M, BLOCK_N)
        if CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None])
        s = tl.dot(q, tl.trans(k)) * qk_scale
        p = tl.where(valid, tl.exp2(s - lse2[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))                                             # dP = dO V^T
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)                                       # dQ += dS K
    dq = dq * sm_scale
    mask = (offs_m[:, None] < SEQ_Q) & (offs_d[None, :] < HEAD_DIM)
    tl.store(DQ + q_off + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
             dq.to(DQ.dtype.element_ty), mask=mask)


def _bwd_launch_config(device: torch.device, head_dim: int):
    """Block sizes (BLOCK_M, BLOCK_N) of the two kernels, warps and pipeline stages.

    On a GPU: 128 keys held per dK/dV program against 32-query steps (and the mirror image for dQ),
    as in Triton tutorial 06, with 8 warps: compiled offline for sm_90 at D = 64 and 128 this uses
    wgmma with no register spills (4 warps spill at D = 64). In the interpreter: 32 x 32 tiles.
    """
    if device.type != "cuda" or INTERPRET:
        return dict(dkdv=(32, 32), dq=(32, 32), num_warps=4, num_stages=1)
    return dict(dkdv=(32, 128), dq=(128, 32), num_warps=8, num_stages=4 if head_dim <= 64 else 3)


def flash_attention_backward(do, q, k, v, o, lse, causal: bool = False, sm_scale: float | None = None):
    """Gradients ``(dq, dk, dv)`` of :func:`~ptinternals.kernels.attention.flash_attention_forward`.

    ``o`` and ``lse`` are what forward returned. Outputs are contiguous, in q's dtype.
    """
    scale = check_attention_inputs(q, k, v, sm_scale)
    check_tensor("do", do, ndim=4)
    check_tensor("o", o, ndim=4)
    check_tensor("lse", lse, dtypes=(torch.float32,), ndim=3)
    check_same(("q", "do", "o"), (q, do, o))
    check_same(("q", "lse"), (q, lse), dtype=False)
    if do.shape != q.shape or o.shape != q.shape:
        raise ValueError(f"do and o must have q's shape {tuple(q.shape)}, "
                         f"got {tuple(do.shape)} and {tuple(o.shape)}")
    if lse.shape != q.shape[:3]:
        raise ValueError(f"lse must have shape (B, H, Sq) = {tuple(q.shape[:3])}, got {tuple(lse.shape)}")
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    q, k, v, do = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous()   # one stride set per side
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if B * H * Sq == 0 or Sk == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    block_d = max(16, next_power_of_2(D))
    cfg = _bwd_launch_config(q.device, D)
    delta = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    attention_bwd_preprocess_kernel[(cdiv(Sq, 64), B * H)](
        o, do, delta, *o.stride(), *do.stride(), H, Sq, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=64)
    lse = lse.contiguous()
    common = dict(HEAD_DIM=D, BLOCK_D=block_d, CAUSAL=causal, UPCAST=INTERPRET,
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    bm, bn = cfg["dkdv"]
    attention_bwd_dkdv_kernel[(cdiv(Sk, bn), B * H)](
        q, k, v, do, lse, delta, dk, dv, scale, *q.stride(), *k.stride(), H, Sq, Sk,
        BLOCK_M=bm, BLOCK_N=bn, **common)
    bm, bn = cfg["dq"]
    attention_bwd_dq_kernel[(cdiv(Sq, bm), B * H)](
        q, k, v, do, lse, delta, dq, scale, *q.stride(), *k.stride(), H, Sq, Sk,
        BLOCK_M=bm, BLOCK_N=bn, **common)
    return dq, dk, dv
