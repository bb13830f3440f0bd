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

Each Function comes with a validating wrapper (``logsumexp``, ``ste_round``, ``fake_quantize``,
``fused_silu``, ``fused_gelu``, ``fused_swiglu``) and a ``naive_*`` composite of plain ops to compare saved bytes against (see
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


class FakeQuantize(torch.autograd.Function):
    """Quantize then dequantize, with the *clipped* straight-through estimator of quantization-aware
    training: exactly ``torch.fake_quantize_per_tensor_affine`` (aten FakeQuantPerTensorAffine.cpp,
    ``fake_quantize_per_tensor_affine_cachemask``).

    Forward: ``q = round(x / scale) + zero_point`` (round half to even), clamped to
    ``[quant_min, quant_max]``, back to ``(q - zero_point) * scale``. Backward: the gradient passes
    straight through where ``q`` was in range and is 0 where it was clipped. Saved: only that mask,
    as bool (1 byte per element, where saving x would cost 4).
    """

    @staticmethod
    def forward(ctx, x, scale: float, zero_point: int, quant_min: int, quant_max: int):
        q = torch.round(x * (1.0 / scale)) + zero_point  # integers, stored as floats
        mask = (q >= quant_min) & (q <= quant_max)  # bool (N bytes): all backward needs
        ctx.save_for_backward(mask)
        return (q.clamp(quant_min, quant_max) - zero_point) * scale

    @staticmethod
    def backward(ctx, grad_out):
        (mask,) = ctx.saved_tensors
        return grad_out * mask, None, None, None, None


def fake_quantize(x: torch.Tensor, scale: float, zero_point: int, quant_min: int, quant_max: int) -> torch.Tensor:
    _check_float_tensor(x)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"scale must be a positive number, got {scale!r}")
    for name, v in (("zero_point", zero_point), ("quant_min", quant_min), ("quant_max", quant_max)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if not quant_min <= zero_point <= quant_max:
        raise ValueError(f"zero_point must lie in [quant_min, quant_max] = [{quant_min}, {quant_max}], got {zero_point}")
    return FakeQuantize.apply(x, float(scale), zero_point, quant_min, quant_max)


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


# ------------------------------------------------------------------------------------ fused SwiGLU
class FusedSwiGLU(torch.autograd.Function):
    """``silu(a) * b``, the gated unit of LLaMA-style MLPs, saving only ``a`` and ``b``.

    Composed of plain ops, ``F.silu(a) * b`` saves ``a`` (SiluBackward0), ``silu(a)`` and ``b``
    (MulBackward0): 3N elements; ``a * torch.sigmoid(a) * b`` saves 4N. Fused: 2N, and
    ``sigmoid(a)`` is recomputed in backward. With ``s = sigmoid(a)``:
    d/da = grad * b * s * (1 + a * (1 - s)),  d/db = grad * a * s.
    """

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * torch.sigmoid(a) * b

    @staticmethod
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        s = torch.sigmoid(a)  # recomputed
        return grad_out * b * s * (1 + a * (1 - s)), grad_out * a * s


def fused_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check_float_tensor(a, "a")
    _check_float_tensor(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    return FusedSwiGLU.apply(a, b)


def naive_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(a) * b
