"""Custom ``torch.autograd.Function``s: choose what to save, write the backward yourself.

Mirrors how PyTorch's own fused ops are declared (tools/autograd/derivatives.yaml): ``logsumexp``
saves ``self`` and ``result`` and its backward is ``grad * (self - result).exp()``
(FunctionsManual.cpp ``logsumexp_backward``); ``silu`` saves only ``self`` and recomputes the
sigmoid in ``silu_backward``. A composite of small ops instead saves each op's operands, e.g.
``x * torch.sigmoid(x)`` keeps ``x`` *and* ``sigmoid(x)``: twice the activation memory.

Every backward here is written in differentiable torch ops, so ``create_graph=True`` works through
it and ``torch.autograd.gradgradcheck`` passes (a backward that used ``torch.no_grad`` or
``.detach()`` inside would silently give wrong second derivatives; ``@once_differentiable`` makes
that an error instead).

Each Function comes with a validating wrapper (``logsumexp``, ``ste_round``, ``fused_silu``,
``fused_gelu``) and a ``naive_*`` composite of plain ops to compare saved bytes against (see
``probes.saved_tensor_bytes``).
"""
from __future__ import annotations

import math

import torch


def _check_float_tensor(x, arg: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{arg} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{arg} must have a floating point dtype, got {x.dtype}")


# --------------------------------------------------------------------------------------- logsumexp
class LogSumExp(torch.autograd.Function):
    """``log(sum(exp(x), dim))`` computed stably; saves ``x`` and the output, never ``exp(x)``.

    Forward: ``m = max(x, dim)``, ``out = m + log(sum(exp(x - m), dim))``: no overflow for large x.
    Backward: ``d out / d x = exp(x - out)`` (= softmax(x) along dim), rebuilt from what was saved.
    Saved: ``x`` (N elements) + ``out`` (N / x.shape[dim]); the ``exp(x - m)`` temporary (N) dies
    at the end of forward.
    """

    @staticmethod
    def forward(ctx, x, dim: int, keepdim: bool = False):
        if x.shape[dim] == 0:  # log(sum of nothing) = log(0) = -inf, like torch.logsumexp
            out = torch.full_like(x.sum(dim=dim, keepdim=True), -math.inf)
        else:
            m = x.amax(dim=dim, keepdim=True)  # (..., 1, ...)
            m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # rows of all -inf: avoid inf - inf
            out = m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))
        if not keepdim:
            out = out.squeeze(dim)
        ctx.dim, ctx.keepdim = dim, keepdim
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, out = ctx.saved_tensors
        if not ctx.keepdim:  # put the reduced dim back so grad and out broadcast against x
            grad_out, out = grad_out.unsqueeze(ctx.dim), out.unsqueeze(ctx.dim)
        return grad_out * torch.exp(x - out), None, None  # grads for (x, dim, keepdim)


def logsumexp(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    _check_float_tensor(x)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension to reduce over, got a 0-d tensor")
    if not -x.dim() <= dim < x.dim():
        raise IndexError(f"dim {dim} is out of range for a tensor of {x.dim()} dims")
    if not isinstance(keepdim, bool):
        raise TypeError(f"keepdim must be a bool, got {type(keepdim).__name__}")
    return LogSumExp.apply(x, dim % x.dim(), keepdim)


def naive_logsumexp(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """The same maths in plain ops: saves x (amax), max, ``exp(x - m)`` (N elements) and the sum."""
    m = x.amax(dim=dim, keepdim=True)
    out = m + (x - m).exp().sum(dim=dim, keepdim=True).log()
    return out if keepdim else out.squeeze(dim)


# ---------------------------------------------------------------------------- straight-through round
class StraightThroughRound(torch.autograd.Function):
    """``round(x)`` forward, identity backward: the straight-through estimator (quantization-aware
    training). The true derivative of round is 0 almost everywhere, so ``gradcheck`` *fails* on
    purpose: the backward is a chosen surrogate, not the derivative. Saves nothing.
    """

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out


def ste_round(x: torch.Tensor) -> torch.Tensor:
    _check_float_tensor(x)
    return StraightThroughRound.apply(x)


# --------------------------------------------------------------------------- fused SiLU and GeLU
class FusedSiLU(torch.autograd.Function):
    """``x * sigmoid(x)`` that saves only ``x`` and recomputes ``sigmoid(x)`` in backward.

    d/dx [x s(x)] = s + x s (1 - s) = s (1 + x (1 - s)). Recomputing s costs one exp per element,
    but the N-element ``sigmoid(x)`` is not kept from forward to backward: memory for compute.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)  # grad is off inside forward: the sigmoid temporary is freed

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)  # recomputed
        return grad_out * s * (1 + x * (1 - s))


class FusedGeLU(torch.autograd.Function):
    """Exact (erf) GeLU, ``x * Phi(x)``, saving only ``x``: d/dx = Phi(x) + x * phi(x)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 0.5 * (1 + torch.erf(x * (1 / math.sqrt(2))))

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        cdf = 0.5 * (1 + torch.erf(x * (1 / math.sqrt(2))))  # Phi(x), recomputed
        pdf = torch.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))  # phi(x)
        return grad_out * (cdf + x * pdf)


def fused_silu(x: torch.Tensor) -> torch.Tensor:
    _check_float_tensor(x)
    return FusedSiLU.apply(x)


def fused_gelu(x: torch.Tensor) -> torch.Tensor:
    _check_float_tensor(x)
    return FusedGeLU.apply(x)


def naive_silu(x: torch.Tensor) -> torch.Tensor:
    """Saves ``sigmoid(x)`` (SigmoidBackward0 keeps its result) and ``x`` (MulBackward0): 2N elements."""
    return x * torch.sigmoid(x)


def naive_gelu(x: torch.Tensor) -> torch.Tensor:
    """Saves ``x``, ``erf``'s input, ``1 + erf(...)``: 3N elements or more."""
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
