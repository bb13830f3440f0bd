"""A Triton kernel as a real PyTorch operator: ``torch.library.custom_op`` (the Python custom-op API,
``torch/_library/custom_ops.py``; tutorial "Python Custom Operators").

``layernorm.LayerNormFunction`` already trains, but to PyTorch it is a Python function:
``torch.compile`` would have to trace into ``layer_norm_forward`` and meet a Triton launch on raw
pointers it cannot reason about. A *custom op* is an opaque, registered operator,
``torch.ops.ptinternals.triton_layer_norm``, with everything the rest of PyTorch needs to know:

- a **schema**, inferred from the type hints: ``(Tensor x, Tensor weight, Tensor bias, float eps)
  -> (Tensor, Tensor, Tensor)``, ``mutates_args=()`` promising it writes none of its inputs;
- a **fake** (meta) implementation (``register_fake``): output shapes, dtypes and strides without
  running anything, which is how ``FakeTensorMode``, ``torch.compile`` and AOTAutograd trace it;
- an **autograd** formula (``register_autograd``): ``setup_context`` saves what backward needs and
  ``backward`` calls a second custom op, so the backward is opaque and traceable too.

``torch.library.opcheck`` tests all three against the real kernel (schema, fake vs real outputs,
autograd registration, AOTAutograd with dynamic shapes). ``torch.library.triton_op`` + ``wrap_triton``
would let Inductor see inside the kernel, but fail opcheck and compile on the CPU (torch 2.13),
so this chapter uses ``custom_op``, which works on both devices.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .layernorm import layer_norm_backward, layer_norm_forward

NAMESPACE = "ptinternals"


def _stat_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def define_triton_layer_norm(namespace: str = NAMESPACE):
    """Define (or redefine) ``<namespace>::triton_layer_norm`` and its backward op; return both.

    ``custom_op`` replaces an existing definition of the same name, so re-running is safe, and
    another ``namespace`` puts a second copy (a student's, say) beside the reference.
    """
    if not isinstance(namespace, str) or not namespace.isidentifier():
        raise ValueError(f"namespace must be an identifier, got {namespace!r}")

    # --- backward op: (dx, dweight, dbias) by the two-stage kernels of ``layernorm`` -----------
    @torch.library.custom_op(f"{namespace}::triton_layer_norm_backward", mutates_args=())
    def layer_norm_backward_op(dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor,
                               rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        dx, dw, db = layer_norm_backward(dy, x, weight, mean, rstd)
        return dx, dw, db

    @layer_norm_backward_op.register_fake
    def _(dy, x, weight, mean, rstd):
        return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape)

    # --- forward op: (y, mean, rstd) by ``layernorm.layer_norm_fwd_kernel`` -------------------
    @torch.library.custom_op(f"{namespace}::triton_layer_norm", mutates_args=())
    def layer_norm_op(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
        y, mean, rstd = layer_norm_forward(x, weight, bias, eps)
        return y, mean, rstd

    @layer_norm_op.register_fake
    def _(x, weight, bias, eps):
        # the real kernel's output shapes, dtypes and (contiguous) strides, and no data
        stats = x.shape[:-1]
        return x.new_empty(x.shape), x.new_empty(stats, dtype=_stat_dtype(x)), \
            x.new_empty(stats, dtype=_stat_dtype(x))

    # --- autograd: connect the two -------------------------------------------------------------
    def setup_context(ctx, inputs, output):
        x, weight, bias, eps = inputs
        y, mean, rstd = output
        ctx.save_for_backward(x, weight, mean, rstd)   # 2 floats per row, not the normalized x
        ctx.mark_non_differentiable(mean, rstd)

    def backward(ctx, dy, _dmean, _drstd):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_backward_op(dy.contiguous(), x, weight, mean, rstd)
        return dx, dw, db, None                         # no gradient for eps

    layer_norm_op.register_autograd(backward, setup_context=setup_context)
    return layer_norm_op, layer_norm_backward_op


# torch.ops.ptinternals.triton_layer_norm and torch.ops.ptinternals.triton_layer_norm_backward
layer_norm_op, layer_norm_backward_op = define_triton_layer_norm()


def triton_layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """``F.layer_norm(x, (x.shape[-1],), weight, bias, eps)`` through the custom op (output only)."""
    return layer_norm_op(x, weight, bias, eps)[0]


class TritonLayerNorm(nn.Module):
    """A drop-in ``nn.LayerNorm(normalized_shape: int)`` whose forward is the custom op."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        if type(normalized_shape) is not int or normalized_shape < 1:
            raise ValueError(f"normalized_shape must be an int >= 1 (the last dim), got {normalized_shape!r}")
        self.normalized_shape = normalized_shape
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(normalized_shape, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(normalized_shape, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return triton_layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"
