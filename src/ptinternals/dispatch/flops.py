"""A FLOP counter built on TorchDispatchMode: count what the ATen kernels really compute.

Mirrors ``torch/utils/flop_counter.py`` (``FlopCounterMode``, ``mm_flop``, ``conv_flop_count``,
``conv_backward_flop``, ``sdpa_flop_count``, ``sdpa_backward_flop_count``). Why a dispatch mode: by the
time an op reaches the Python key, autograd has already run and CompositeImplicitAutograd ops
(``matmul``, ``linear``, ``scaled_dot_product_attention``) have decomposed into the kernels that do the
work (``mm``/``bmm``/``addmm``, ``_scaled_dot_product_flash_attention_for_cpu``) - and the backward
pass's kernels come through the same door.

Convention (as FlopCounterMode): one multiply-add = 2 FLOPs; bias adds, softmax and elementwise ops
are not counted; causal masking is not discounted.

The gap this module closes: FlopCounterMode has no formula for the CPU fused attention kernels
``aten._scaled_dot_product_flash_attention_for_cpu`` and its ``_backward``, so on a CPU it counts an
attention layer's QK^T and PV matmuls as 0. Here they share the formulas of the CUDA kernels.
"""
from __future__ import annotations

from collections import defaultdict
from math import prod

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


def mm_flops(a_shape, b_shape) -> int:
    """(m, k) @ (k, n): m*n dot products of length k = 2*m*n*k FLOPs."""
    (m, k), (k2, n) = a_shape, b_shape
    if k != k2:
        raise ValueError(f"mm: inner dimensions differ, a_shape={tuple(a_shape)} b_shape={tuple(b_shape)}")
    return 2 * m * n * k


def bmm_flops(a_shape, b_shape) -> int:
    """(b, m, k) @ (b, k, n) = 2*b*m*n*k FLOPs."""
    (b, m, k), (b2, k2, n) = a_shape, b_shape
    if b != b2 or k != k2:
        raise ValueError(f"bmm: shapes do not match, a_shape={tuple(a_shape)} b_shape={tuple(b_shape)}")
    return 2 * b * m * n * k


def conv_flops(x_shape, w_shape, out_shape, transposed: bool = False) -> int:
    """Every output point (input point, when transposed) takes a dot product over c_in/groups * kernel.

    ``w_shape`` is (c_out, c_in/groups, *kernel) for a convolution; FlopCounterMode's formula
    ``prod(spatial) * prod(kernel) * batch * c_out * c_in * 2`` with c_in read from the weight."""
    batch = x_shape[0]
    spatial = (x_shape if transposed else out_shape)[2:]
    c_out, c_in, *kernel = w_shape
    return 2 * prod(spatial) * prod(kernel) * batch * c_out * c_in


def conv_backward_flops(grad_out_shape, x_shape, w_shape, transposed, output_mask, grad_input_shape,
                        grad_weight_shape) -> int:
    """grad_input is a transposed conv of grad_out with the weight; grad_weight a conv of the input with
    grad_out (batch and channel dims swapped). ``output_mask`` says which of the two were wanted."""
    def t(shape):  # swap dims 0 and 1
        return [shape[1], shape[0], *shape[2:]]

    flops = 0
    if output_mask[0]:
        flops += conv_flops(grad_out_shape, w_shape, grad_input_shape, transposed=not transposed)
    if output_mask[1]:
        if transposed:
            flops += conv_flops(t(grad_out_shape), t(x_shape), t(grad_weight_shape))
        else:
            flops += conv_flops(t(x_shape), t(grad_out_shape), t(grad_weight_shape))
    return flops


def sdpa_flops(q_shape, k_shape, v_shape) -> int:
    """softmax(Q K^T) V with Q (b, h, s_q, d), K (b, h_kv, s_k, d), V (b, h_kv, s_k, d_v): two bmms,
    QK^T = 2*b*h*s_q*s_k*d and PV = 2*b*h*s_q*s_k*d_v (GQA: h is the query heads)."""
    b, h, s_q, d = q_shape
    _, h_kv, s_k, d_k = k_shape
    d_v = v_shape[-1]
    if d != d_k or h % h_kv != 0:
        raise ValueError(f"sdpa: incompatible shapes q={tuple(q_shape)} k={tuple(k_shape)} "
                         f"v={tuple(v_shape)}")
    return bmm_flops((b * h, s_q, d), (b * h, d, s_k)) + bmm_flops((b * h, s_q, s_k), (b * h, s_k, d_v))


def sdpa_backward_flops(grad_out_shape, q_shape, k_shape, v_shape) -> int:
    """Recompute QK^T, then dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: five bmms."""
    b, h, s_q, d = q_shape
    s_k, d_v = k_shape[2], v_shape[-1]
    bh = b * h
    return (bmm_flops((bh, s_q, d), (bh, d, s_k)) + bmm_flops((bh, s_q, d_v), (bh, d_v, s_k))
            + bmm_flops((bh, s_k, s_q), (bh, s_q, d_v)) + bmm_flops((bh, s_q, s_k), (bh, s_k, d))
            + bmm_flops((bh, d, s_q), (bh, s_q, s_k)))


def _shape(x):
    return tuple(x.shape) if isinstance(x, torch.Tensor) else x


# overload packet -> f(args, kwargs, out) -> FLOPs. The args are the ATen schema's, in order.
def _conv(args, kwargs, out):
    x, w, _bias, _stride, _padding, _dilation, transposed = args[:7]
    return conv_flops(_shape(x), _shape(w), _shape(out), bool(transposed))


def _conv_backward(args, kwargs, out):
    grad_out, x, w = args[:3]
    transposed, output_mask = args[7], args[10]
    gi, gw = out[0], out[1]
    return conv_backward_flops(_shape(grad_out), _shape(x), _shape(w), bool(transposed), output_mask,
                               _shape(gi) if gi is not None else None, _shape(gw) if gw is not None else None)


FLOP_FORMULAS = {
    aten.mm: lambda a, kw, out: mm_flops(_shape(a[0]), _shape(a[1])),
    aten.addmm: lambda a, kw, out: mm_flops(_shape(a[1]), _shape(a[2])),
    aten.bmm: lambda a, kw, out: bmm_flops(_shape(a[0]), _shape(a[1])),
    aten.baddbmm: lambda a, kw, out: bmm_flops(_shape(a[1]), _shape(a[2])),
    aten.convolution: _conv,
    aten._convolution: _conv,
    aten.convolution_backward: _conv_backward,
}
_SDPA_FORWARD = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
for _name in _SDPA_FORWARD:
    if hasattr(aten, _name):
        FLOP_FORMULAS[getattr(aten, _name)] = lambda a, kw, out: sdpa_flops(
            _shape(a[0]), _shape(a[1]), _shape(a[2]))
    if hasattr(aten, _name + "_backward"):
        FLOP_FORMULAS[getattr(aten, _name + "_backward")] = lambda a, kw, out: sdpa_backward_flops(
            _shape(a[0]), _shape(a[1]), _shape(a[2]), _shape(a[3]))

# Queries about metadata, which FlopCounterMode leaves to the default handling.
_METADATA_OPS = {aten.size.default, aten.stride.default, aten.numel.default, aten.dim.default,
                 aten.is_contiguous.default, aten.storage_offset.default, aten.sym_size.default,
                 aten.sym_stride.default, aten.sym_numel.default, aten.sym_storage_offset.default}


class FlopCounter(TorchDispatchMode):
    """Count FLOPs of every ATen op that runs inside ``with FlopCounter() as fc:``.

    ``fc.total`` is the sum, ``fc.by_op`` maps an overload packet name (``"aten.mm"``) to its FLOPs.
    Ops without a formula are first offered to their decomposition (``OpOverload.decompose``: what a
    CompositeImplicitAutograd op would have become had autograd run, e.g. under inference_mode) and
    otherwise counted as 0.
    """

    def __init__(self):
        super().__init__()
        self.by_op: dict[str, int] = defaultdict(int)

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA_OPS:
            return NotImplemented
        packet = func._overloadpacket
        if packet not in FLOP_FORMULAS and func is not torch.ops.prim.device.default:
            with self:  # e.g. aten.matmul under inference_mode -> mm/bmm
                r = func.decompose(*args, **kwargs)
                if r is not NotImplemented:
                    return r
        out = func(*args, **kwargs)
        if packet in FLOP_FORMULAS:
            self.by_op[str(packet)] += int(FLOP_FORMULAS[packet](args, kwargs, out))
        return out


def count_flops(fn, *args, **kwargs) -> tuple[object, int]:
    """Run ``fn(*args, **kwargs)`` under a FlopCounter; return (its result, total FLOPs)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    with FlopCounter() as fc:
        out = fn(*args, **kwargs)
    return out, fc.total
