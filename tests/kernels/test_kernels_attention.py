"""Flash attention forward and backward (the kernels chapter, exercise "flash-attention forward")."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ptinternals.kernels import flash_attention, flash_attention_backward, flash_attention_forward
from ptinternals.kernels.attention import FWD_CPU_CONFIG, FWD_GPU_CONFIGS

from .kernels_testing import DEVICE, assert_close


def _qkv(b, h, sq, sk, d, dtype, seed=0, layout="contiguous"):
    g = torch.Generator().manual_seed(seed)
    if layout == "bshd":   # (B, S, H, D) memory viewed as (B, H, S, D): the layout after a qkv projection
        mk = lambda s: torch.randn(b, s, h, d, generator=g, device="cpu").to(DEVICE, dtype).transpose(1, 2)
    else:
        mk = lambda s: torch.randn(b, h, s, d, generator=g, device="cpu").to(DEVICE, dtype)
    return mk(sq), mk(sk), mk(sk)


def _reference(q, k, v, causal, scale=None):
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    return qd, kd, vd, F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, scale=scale)


@settings(max_examples=8)
@given(b=st.integers(1, 2), h=st.integers(1, 2), sq=st.integers(1, 80), sk=st.integers(1, 80),
       d=st.sampled_from([8, 16, 24, 64]), causal=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float16]), layout=st.sampled_from(["contiguous", "bshd"]))
def test_flash_attention_forward_and_backward_match_sdpa(b, h, sq, sk, d, causal, dtype, layout):
    q, k, v = _qkv(b, h, sq, sk, d, dtype, seed=sq * 100 + sk, layout=layout)
    qd, kd, vd, o_ref = _reference(q, k, v, causal)
    o, lse = flash_attention_forward(q, k, v, causal)
    assert o.shape == q.shape and o.dtype == dtype and lse.shape == (b, h, sq)
    tf32 = 100 if DEVICE == "cuda" and dtype == torch.float32 else 1   # tl.dot on fp32: TF32 on a GPU
    assert_close(o, o_ref, dtype, f"o (causal={causal})", scale=4 * tf32)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1), device="cpu").to(DEVICE, dtype)
    grads_ref = torch.autograd.grad(o_ref, (qd, kd, vd), do.double())
    grads = flash_attention_backward(do, q, k, v, o, lse, causal)
    for name, got, want in zip(("dq", "dk", "dv"), grads, grads_ref, strict=True):
        assert_close(got, want, dtype, f"{name} (causal={causal})", scale=8 * tf32)


@pytest.mark.parametrize("causal", [False, True])
def test_lse_is_the_logsumexp_of_the_visible_scores(causal):
    q, k, v = _qkv(1, 2, 37, 45, 16, torch.float32, seed=3)
    _, lse = flash_attention_forward(q, k, v, causal)
    tf32 = 100 if DEVICE == "cuda" else 1
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(16)
    if causal:   # top-left aligned: query i sees keys 0..i
        s = s.masked_fill(torch.ones(37, 45, dtype=torch.bool).triu(1), -float("inf"))
    assert_close(lse, torch.logsumexp(s, -1), torch.float32, "lse", scale=tf32)


def test_autograd_function_with_custom_scale():
    q, k, v = (t.requires_grad_() for t in _qkv(2, 2, 50, 50, 32, torch.float32, seed=5))
    o = flash_attention(q, k, v, causal=True, sm_scale=0.3)
    qd, kd, vd, o_ref = _reference(q, k, v, True, scale=0.3)
    tf32 = 100 if DEVICE == "cuda" else 1
    assert_close(o, o_ref, torch.float32, "o", scale=tf32)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    grads_ref = torch.autograd.grad(o_ref, (qd, kd, vd), do.double())
    for name, got, want in zip("qkv", grads, grads_ref, strict=True):
        assert_close(got, want, torch.float32, f"d{name}", scale=4 * tf32)


def test_empty_sequences():
    q, k, v = _qkv(1, 1, 5, 0, 16, torch.float32)
    o, lse = flash_attention_forward(q, k, v)
    assert (o == 0).all() and torch.isneginf(lse).all()       # no keys: zeros, like torch
    q, k, v = _qkv(1, 1, 0, 5, 16, torch.float32)
    assert flash_attention_forward(q, k, v)[0].shape == (1, 1, 0, 16)


def test_configs_suit_the_causal_split():
    for cfg in FWD_GPU_CONFIGS + [FWD_CPU_CONFIG]:
        bm, bn = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"]
        assert bm % bn == 0, f"BLOCK_M={bm} must be a multiple of BLOCK_N={bn} for the two-stage causal loop"
        assert min(bm, bn) >= 16, "tl.dot needs blocks >= 16 on a GPU"


@pytest.mark.parametrize("call, exc, match", [
    (lambda: flash_attention_forward(*_qkv(1, 1, 4, 4, 16, torch.float32)[:2], torch.randn(1, 1, 5, 16)),
     ValueError, "k and v must have the same shape"),
    (lambda: flash_attention_forward(torch.randn(1, 4, 16), torch.randn(1, 4, 16), torch.randn(1, 4, 16)),
     ValueError, "q must be 4-D"),
    (lambda: flash_attention_forward(*_qkv(1, 1, 4, 4, 160, torch.float32)), ValueError, "head dim"),
    (lambda: flash_attention_forward(torch.randn(1, 2, 4, 16), torch.randn(1, 1, 4, 16),
                                     torch.randn(1, 1, 4, 16)), ValueError, "agree on B, H and D"),
    (lambda: flash_attention_forward(*_qkv(1, 1, 4, 4, 16, torch.float64)), TypeError, "dtype"),
    (lambda: flash_attention_forward(*_qkv(1, 1, 4, 4, 16, torch.float32), causal=1), TypeError, "causal"),
    (lambda: flash_attention_forward(*_qkv(1, 1, 4, 4, 16, torch.float32), sm_scale=float("nan")),
     ValueError, "sm_scale"),
])
def test_attention_rejects_bad_inputs(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, h, sq, sk, d", [(2, 3, 1000, 1000, 64), (1, 2, 333, 777, 128),
                                             (2, 2, 257, 129, 16), (1, 1, 100, 100, 80)])
def test_flash_attention_gpu(dtype, causal, b, h, sq, sk, d):
    q = torch.randn(b, h, sq, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(b, h, sk, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(b, h, sk, d, device="cuda", dtype=dtype, requires_grad=True)
    o = flash_attention(q, k, v, causal)
    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    o_ref = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
    torch.testing.assert_close(o.float(), o_ref, atol=2e-2, rtol=0)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    grads_ref = torch.autograd.grad(o_ref, (qr, kr, vr), do.float())
    for got, want in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got.float(), want, atol=5e-2 * (want.abs().max().item() + 1), rtol=0)
