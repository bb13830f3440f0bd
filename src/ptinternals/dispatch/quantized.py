"""An int8 weight-only quantised tensor as a wrapper subclass (``torch.Tensor._make_wrapper_subclass``).

The pattern of ``torchao`` (``AffineQuantizedTensor``) and of PyTorch's own subclass tests
(``torch/testing/_internal/two_tensor.py``): the outer tensor is metadata only - shape, dtype (the
*logical* float dtype) and device, no storage of its own; its key set gets the Python key, so every
ATen op on it lands in ``__torch_dispatch__``, below autograd. Inside live the real tensors:

    int_data : int8   [out, in]        1 byte per element
    scale    : float32 [out] or []      per-channel (axis 0) or per-tensor
    value    = int_data * scale         (symmetric: zero point 0, codes in [-127, 127])

A few ops run natively: metadata ops (detach, t, transpose, view for per-tensor) rewrap the int8 data
without touching it; ``mm``/``addmm`` with a quantised right operand dequantise *in the kernel*:
``x @ (q * s) = (x @ q) * s`` when s is per column, so the fp weight is never materialised. Every
other op falls back to dequantising its QuantizedTensor arguments and running the plain op.

Autograd never sees the int8 data: a frozen quantised weight (requires_grad=False) inside an
``nn.Linear`` lets the input, bias and other layers train - forward, backward and optimiser step.
``__tensor_flatten__``/``__tensor_unflatten__`` make it traceable by ``torch.compile``.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

aten = torch.ops.aten
QMAX = 127  # symmetric int8: codes in [-127, 127]; -128 unused so that negation is exact


class QuantizedTensor(torch.Tensor):
    int_data: torch.Tensor
    scale: torch.Tensor
    axis: int | None

    @staticmethod
    def __new__(cls, int_data: torch.Tensor, scale: torch.Tensor, axis: int | None = None,
                dtype: torch.dtype = torch.float32):
        if not isinstance(int_data, torch.Tensor) or int_data.dtype != torch.int8:
            got = getattr(int_data, "dtype", type(int_data).__name__)
            raise TypeError(f"int_data must be an int8 tensor, got {got}")
        if not isinstance(scale, torch.Tensor) or not scale.is_floating_point():
            raise TypeError("scale must be a floating-point tensor")
        if axis is None:
            if scale.numel() != 1:
                raise ValueError(f"per-tensor scale must have one element, got shape {tuple(scale.shape)}")
        else:
            if not isinstance(axis, int) or not 0 <= axis < int_data.dim():
                raise IndexError(f"axis must be in [0, {int_data.dim()}), got {axis!r}")
            if tuple(scale.shape) != (int_data.shape[axis],):
                raise ValueError(f"per-channel scale must have shape ({int_data.shape[axis]},), "
                                 f"got {tuple(scale.shape)}")
        if not dtype.is_floating_point:
            raise TypeError(f"dtype (the logical dtype) must be floating point, got {dtype}")
        return torch.Tensor._make_wrapper_subclass(cls, int_data.shape, dtype=dtype, device=int_data.device,
                                                   requires_grad=False)

    def __init__(self, int_data, scale, axis=None, dtype=torch.float32):
        self.int_data, self.scale, self.axis = int_data, scale, axis

    # --- quantise / dequantise ------------------------------------------------------------------------
    @classmethod
    def quantize(cls, w: torch.Tensor, axis: int | None = 0) -> "QuantizedTensor":
        """Symmetric int8: scale = max|w| / 127 per channel along ``axis`` (or per tensor if None)."""
        if not isinstance(w, torch.Tensor) or not w.is_floating_point():
            raise TypeError("w must be a floating-point tensor")
        if axis is not None and not (isinstance(axis, int) and 0 <= axis < w.dim()):
            raise IndexError(f"axis must be None or in [0, {w.dim()}), got {axis!r}")
        w = w.detach()
        if axis is None:
            amax = w.abs().amax().float()
        else:
            dims = [d for d in range(w.dim()) if d != axis]
            amax = w.abs().amax(dim=dims).float() if dims else w.abs().float()
        scale = (amax / QMAX).clamp_min(torch.finfo(torch.float32).tiny)  # an all-zero row keeps scale > 0
        q = torch.round(w.float() / _broadcast(scale, axis, w.dim())).clamp(-QMAX, QMAX).to(torch.int8)
        return cls(q, scale, axis, w.dtype)

    def dequantize(self) -> torch.Tensor:
        # int8 [..] -> logical dtype: 1 byte in, 2-4 bytes out per element
        scale = _broadcast(self.scale, self.axis, self.int_data.dim())
        return (self.int_data.to(torch.float32) * scale).to(self.dtype)

    def __repr__(self) -> str:
        kind = "per-tensor" if self.axis is None else f"per-channel(axis={self.axis})"
        return f"QuantizedTensor(shape={tuple(self.shape)}, int8, {kind}, dtype={self.dtype})"

    # --- torch.compile support -----------------------------------------------------------------------
    def __tensor_flatten__(self):
        return ["int_data", "scale"], (self.axis, self.dtype)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        axis, dtype = meta
        return QuantizedTensor(inner["int_data"], inner["scale"], axis, dtype)

    __torch_function__ = torch._C._disabled_torch_function_impl  # no Python-level interception

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _NATIVE:
            out = _NATIVE[func](*args, **kwargs)
            if out is not NotImplemented:
                return out
        if func._schema.is_mutable and any(isinstance(a, QuantizedTensor) for a in args):
            raise NotImplementedError(f"QuantizedTensor does not support in-place op {func}")
        # fallback: dequantise every QuantizedTensor argument, run the plain op
        deq = lambda x: x.dequantize() if isinstance(x, QuantizedTensor) else x  # noqa: E731
        return func(*tree_map(deq, args), **tree_map(deq, kwargs))


class Int8Tensor(QuantizedTensor):
    """The chapter exercise's int8 weight: a ``QuantizedTensor`` with one scale per OUTPUT row (axis 0),
    made as ``Int8Tensor(int_data, scale)`` with the logical dtype of ``scale``.

    ``quantize`` differs from ``QuantizedTensor.quantize`` in one place: an all-zero row keeps scale 0
    (max|w| / 127, as ``torch.quantize_per_channel`` is asked for) instead of the smallest normal float,
    and its codes are 0; so a row of subnormal weights is quantised with its own, subnormal, scale."""

    @staticmethod
    def __new__(cls, int_data: torch.Tensor, scale: torch.Tensor, axis: int | None = 0,
                dtype: torch.dtype | None = None):
        return QuantizedTensor.__new__(cls, int_data, scale, axis, scale.dtype if dtype is None else dtype)

    def __init__(self, int_data, scale, axis=0, dtype=None):
        super().__init__(int_data, scale, axis, dtype)

    @classmethod
    def quantize(cls, w: torch.Tensor) -> "Int8Tensor":
        """scale = max|w[row]| / 127 per row; codes = round(w / scale) (half to even) in [-127, 127]."""
        if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.dim() != 2:
            raise TypeError(f"w must be a 2-d floating-point tensor, got {getattr(w, 'shape', type(w).__name__)}")
        w = w.detach()
        scale = w.abs().amax(dim=1) / QMAX                                   # (out,)
        divisor = torch.where(scale > 0, scale, torch.ones_like(scale))      # 0 / 1 = 0 for an all-zero row
        q = torch.round(w / divisor[:, None]).clamp(-QMAX, QMAX).to(torch.int8)
        return cls(q, scale)


def _broadcast(scale: torch.Tensor, axis: int | None, ndim: int) -> torch.Tensor:
    """Reshape a per-channel scale [C] to broadcast along ``axis`` of an ``ndim`` tensor."""
    if axis is None:
        return scale.reshape(())
    shape = [1] * ndim
    shape[axis] = -1
    return scale.reshape(shape)


def _rewrap(qt: QuantizedTensor, int_data: torch.Tensor, axis) -> QuantizedTensor:
    return type(qt)(int_data, qt.scale, axis, qt.dtype)  # a subclass (Int8Tensor) stays itself


def _detach(qt, *a, **k):
    return _rewrap(qt, qt.int_data, qt.axis)


def _t(qt):
    if qt.dim() != 2:
        return NotImplemented
    return _rewrap(qt, qt.int_data.t(), None if qt.axis is None else 1 - qt.axis)


def _transpose(qt, dim0, dim1):
    d0, d1 = dim0 % qt.dim(), dim1 % qt.dim()
    axis = qt.axis
    if axis is not None:
        axis = d1 if axis == d0 else d0 if axis == d1 else axis
    return _rewrap(qt, qt.int_data.transpose(d0, d1), axis)


def _view(qt, size):
    if qt.axis is not None:  # a view could merge the channel dim: dequantise instead
        return NotImplemented
    return _rewrap(qt, qt.int_data.view(size), None)


def _mm_dequant_in_kernel(x: torch.Tensor, qt: QuantizedTensor) -> torch.Tensor:
    """x [m, k] @ W [k, n] with W = q * s: (x @ q) * s when s is per column (axis 1) or per tensor."""
    if qt.axis == 0:  # a scale per *row* of the right operand cannot be pulled out of the sum over k
        return x @ qt.dequantize()
    # [m, k] @ [k, n]: the int8 codes are converted for the GEMM - a real kernel does this tile by tile
    # in registers; here the converted copy is a temporary, freed after the call - then one multiply by
    # the per-column scale [n] on the [m, n] output instead of k*n multiplies on the weight
    out = x @ qt.int_data.to(x.dtype)
    return out * _broadcast(qt.scale, None if qt.axis is None else 1, 2).to(x.dtype)


def _mm(a, b):
    if isinstance(b, QuantizedTensor) and not isinstance(a, QuantizedTensor):
        return _mm_dequant_in_kernel(a, b)
    return NotImplemented


def _addmm(bias, a, b, *, beta=1, alpha=1):
    if isinstance(b, QuantizedTensor) and not isinstance(a, QuantizedTensor) \
            and not isinstance(bias, QuantizedTensor):
        return beta * bias + alpha * _mm_dequant_in_kernel(a, b)
    return NotImplemented


_NATIVE = {
    aten.detach.default: _detach,
    aten.alias.default: _detach,
    aten.t.default: _t,
    aten.transpose.int: _transpose,
    aten.view.default: _view,
    aten.mm.default: _mm,
    aten.addmm.default: _addmm,
}


def quantize_linear_weights(module: torch.nn.Module, axis: int = 0) -> int:
    """Replace every ``nn.Linear.weight`` in ``module`` by a frozen per-channel QuantizedTensor
    parameter; returns how many were replaced. Biases and other parameters stay trainable."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    n = 0
    for m in module.modules():
        if isinstance(m, torch.nn.Linear) and not isinstance(m.weight, QuantizedTensor):
            m.weight = torch.nn.Parameter(QuantizedTensor.quantize(m.weight, axis=axis), requires_grad=False)
            n += 1
    return n
