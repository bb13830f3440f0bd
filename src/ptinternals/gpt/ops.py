"""The kernels chapter's Triton kernels as PyTorch operators the GPT can call: the ``kernels`` switch.

Each kernel becomes an opaque, registered operator (``torch.library.custom_op``, the pattern of
``ptinternals.kernels.custom_op``): a schema, a fake implementation (shapes only, so FakeTensorMode
and ``torch.compile`` can trace through it) and an autograd formula. To the rest of PyTorch, and to
this course's DDP, checkpointing and autocast, they are ops like ``aten::layer_norm``.

=================================  ===========================================================
``ptinternals::triton_layer_norm``  layer norm, forward + the two-stage backward (defined in
                                    ``ptinternals.kernels.custom_op``)
``ptinternals_gpt::flash_attention`` causal flash attention; backward by the dK/dV and dQ kernels,
                                    rebuilding P from the saved row log-sum-exp
``ptinternals_gpt::softmax``        the fused row softmax (one program per row); its backward
                                    ``dx = y * (dy - sum(dy * y))`` in plain torch
=================================  ===========================================================

On a machine without CUDA the kernels run in the Triton interpreter (slow: use tiny models), and
bf16 inputs work because every kernel upcasts to fp32 right after loading. Attention dropout is
not part of the flash kernel: with ``kernels`` containing "flash" the attention weights are not
dropped (residual dropout still is), as in FlashAttention builds without dropout support.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import common as _common  # noqa: F401  (sets TRITON_INTERPRET before triton on a CPU machine)
from ..kernels.attention import flash_attention_forward
from ..kernels.attention_backward import flash_attention_backward
from ..kernels.custom_op import layer_norm_op
from ..kernels.fused_softmax import softmax as triton_softmax

NAMESPACE = "ptinternals_gpt"


# ---------------------------------------------------------------------------------- layer norm
def layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float = 1e-5) -> Tensor:
    """``F.layer_norm(x, (C,), weight, bias, eps)`` through ``torch.ops.ptinternals.triton_layer_norm``.

    The op wants a bias and one dtype: a missing bias is a zero vector (its gradient is dropped), and
    the parameters are cast to x's dtype (a no-op in fp32; under autocast the residual stream that
    feeds every layer norm is fp32 anyway).
    """
    if bias is None:
        bias = torch.zeros_like(weight)
    return layer_norm_op(x, weight.to(x.dtype), bias.to(x.dtype), float(eps))[0]


# ----------------------------------------------------------------------------- flash attention
@torch.library.custom_op(f"{NAMESPACE}::flash_attention_backward", mutates_args=())
def flash_attention_backward_op(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                                causal: bool, sm_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = flash_attention_backward(do, q, k, v, o, lse, causal, sm_scale)
    return dq, dk, dv


@flash_attention_backward_op.register_fake
def _(do, q, k, v, o, lse, causal, sm_scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@torch.library.custom_op(f"{NAMESPACE}::flash_attention", mutates_args=())
def flash_attention_op(q: Tensor, k: Tensor, v: Tensor, causal: bool, sm_scale: float) -> tuple[Tensor, Tensor]:
    """(o, lse): o (B, H, Sq, D) like q, contiguous; lse (B, H, Sq) fp32."""
    o, lse = flash_attention_forward(q, k, v, causal, sm_scale)
    return o, lse


@flash_attention_op.register_fake
def _(q, k, v, causal, sm_scale):
    B, H, Sq, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, H, Sq), dtype=torch.float32)


def _flash_setup_context(ctx, inputs, output):
    q, k, v, causal, sm_scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)  # O(S) extra: the row log-sum-exp, not the (S, S) probabilities
    ctx.causal, ctx.sm_scale = causal, sm_scale
    ctx.mark_non_differentiable(lse)


def _flash_backward(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = flash_attention_backward_op(do.contiguous(), q, k, v, o, lse, ctx.causal, ctx.sm_scale)
    return dq, dk, dv, None, None


flash_attention_op.register_autograd(_flash_backward, setup_context=_flash_setup_context)


def flash_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = True, sm_scale: float | None = None) -> Tensor:
    """Differentiable flash attention on (B, H, S, D) tensors: ``F.scaled_dot_product_attention``."""
    scale = float(sm_scale) if sm_scale is not None else q.shape[-1] ** -0.5
    return flash_attention_op(q, k, v, causal, scale)[0]


# ------------------------------------------------------------------------------------- softmax
@torch.library.custom_op(f"{NAMESPACE}::softmax", mutates_args=())
def softmax_op(x: Tensor) -> Tensor:
    """Softmax over the last dim by the fused Triton kernel; -inf entries (a causal mask) give 0."""
    return triton_softmax(x, -1).contiguous()


@softmax_op.register_fake
def _(x):
    return x.new_empty(x.shape)


def _softmax_setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)  # backward needs only y = softmax(x): S * S floats per head


def _softmax_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return y * (dy - (dy * y).sum(dim=-1, keepdim=True))  # the softmax Jacobian-vector product


softmax_op.register_autograd(_softmax_backward, setup_context=_softmax_setup_context)


def softmax(x: Tensor) -> Tensor:
    """Differentiable softmax over the last dimension through ``torch.ops.ptinternals_gpt.softmax``."""
    return softmax_op(x)
