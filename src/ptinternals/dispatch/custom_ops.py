"""A custom operator, ``ptinternals::fused_bias_gelu``, registered the way PyTorch wants it.

``torch/_library/custom_ops.py`` (``torch.library.custom_op``) turns a Python function into a real
dispatcher operator: it infers the schema ``(Tensor x, Tensor bias) -> Tensor`` from the type hints and
registers our function at ``CompositeExplicitAutograd`` (no device named), which the dispatch table
shows as the "default backend kernel" of CPU, CUDA and every other backend.
Three more registrations make it a first-class citizen:

- ``register_fake``: the shape/dtype rule, run on FakeTensors/meta tensors - what ``torch.compile`` and
  FakeTensorMode call instead of the kernel (registered at the Meta key). It must allocate the output
  and compute nothing;
- ``register_autograd``: ``setup_context`` saves what backward needs, ``backward`` returns one gradient
  per input. It is registered at the ``Autograd`` alias ("autograd kernel" at AutogradCPU, AutogradCUDA...),
  so the op is a single node in the autograd graph;
- ``torch.library.opcheck`` then tests the schema, the fake kernel against the real one, the autograd
  registration and the behaviour under FakeTensorMode / functionalization / ``torch.compile``.

``torch.compile(fullgraph=True)`` keeps the op as one opaque node: Dynamo traces through the call
without a graph break because the fake kernel gives it the output's metadata.

The op: ``gelu(x + bias)`` with the exact (erf) GELU, bias broadcast over the last dimension;
its derivative ``d/dz gelu(z) = Phi(z) + z * phi(z)``.

Re-registration: ``custom_op`` replaces an existing definition of the same name (it destroys the old
``Library`` fragment), so re-running a notebook cell is safe; ``define_fused_bias_gelu(namespace=...)``
defines the same op under another namespace, e.g. for a student's attempt beside the reference.
"""
from __future__ import annotations

import math

import torch

NAMESPACE = "ptinternals"
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _check(x: torch.Tensor, bias: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(bias, torch.Tensor):
        raise TypeError("x and bias must be tensors")
    if bias.dim() != 1 or x.dim() < 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"bias must have shape (x.shape[-1],) = ({x.shape[-1] if x.dim() else '?'},), "
                         f"got {tuple(bias.shape)}")
    if x.dtype != bias.dtype or x.device != bias.device:
        raise ValueError(f"x and bias must share dtype and device, got {x.dtype}/{x.device} and "
                         f"{bias.dtype}/{bias.device}")
    if not x.is_floating_point():
        raise TypeError(f"x must be floating point, got {x.dtype}")


def gelu_reference(z: torch.Tensor) -> torch.Tensor:
    """0.5 * z * (1 + erf(z / sqrt 2)), computed in float32 for low-precision inputs."""
    zf = z.float() if z.dtype in (torch.float16, torch.bfloat16) else z
    return (0.5 * zf * (1.0 + torch.erf(zf * _INV_SQRT2))).to(z.dtype)


def gelu_grad(z: torch.Tensor) -> torch.Tensor:
    """Phi(z) + z * phi(z): the exact GELU's derivative."""
    zf = z.float() if z.dtype in (torch.float16, torch.bfloat16) else z
    cdf = 0.5 * (1.0 + torch.erf(zf * _INV_SQRT2))
    pdf = torch.exp(-0.5 * zf * zf) * _INV_SQRT_2PI
    return (cdf + zf * pdf).to(z.dtype)


def define_fused_bias_gelu(namespace: str = NAMESPACE):
    """Define (or redefine) ``<namespace>::fused_bias_gelu`` with fake and autograd registrations."""
    if not isinstance(namespace, str) or not namespace.isidentifier():
        raise ValueError(f"namespace must be an identifier, got {namespace!r}")

    @torch.library.custom_op(f"{namespace}::fused_bias_gelu", mutates_args=())
    def fused_bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        _check(x, bias)
        # one pass over x: read x [.., N] and bias [N], write out [.., N] (a fused kernel's traffic)
        return gelu_reference(x + bias)

    @fused_bias_gelu.register_fake
    def _(x, bias):
        _check(x, bias)  # shape rules only; the data is not there
        return torch.empty_like(x)

    def setup_context(ctx, inputs, output):
        x, bias = inputs
        ctx.save_for_backward(x, bias)  # recompute z = x + bias in backward rather than save it

    def backward(ctx, grad_out):
        x, bias = ctx.saved_tensors
        grad_z = grad_out * gelu_grad(x + bias)
        grad_bias = grad_z.reshape(-1, grad_z.shape[-1]).sum(0) if grad_z.dim() > 1 else grad_z
        return grad_z, grad_bias

    fused_bias_gelu.register_autograd(backward, setup_context=setup_context)
    return fused_bias_gelu


fused_bias_gelu = define_fused_bias_gelu()  # torch.ops.ptinternals.fused_bias_gelu
