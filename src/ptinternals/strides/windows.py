"""Strides doing real work: sliding windows and im2col as zero-copy views (``torch.as_strided``).

A convolution can be written as one matmul over *patches*. Materialising the patches (im2col, as
``torch.nn.functional.unfold`` does) costs ``kh*kw`` times the input's memory; with strides the
patches are a view that costs nothing until a kernel reads it.
"""
from __future__ import annotations

import torch

from . import meta


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` are views of the same storage (no copy between them)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def sliding_windows(x: torch.Tensor, size: int, step: int = 1, dim: int = -1) -> torch.Tensor:
    """Windows of ``size`` elements every ``step`` along ``dim``, as a view (same as ``x.unfold``).

    Shape: ``x.shape`` with dim ``dim`` replaced by the window count, plus a trailing dim of ``size``.
    Works for any strides of ``x`` (non-contiguous inputs included): the arithmetic is on strides.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    shape, strides = meta.unfold_meta(tuple(x.shape), tuple(x.stride()), dim, size, step)
    return x.as_strided(shape, strides, x.storage_offset())


def im2col(x: torch.Tensor, kernel_size: tuple[int, int], stride: int = 1) -> torch.Tensor:
    """Patches of an image ``x`` of shape ``(C, H, W)`` as a view of shape ``(C, kh, kw, H_out, W_out)``.

    ``out[c, i, j, y, x] = x[c, y*stride + i, x*stride + j]``: the two window dims step by the
    input's own strides, the two output-position dims by ``stride`` times them. Valid padding only.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"im2col expects a (C, H, W) tensor, got {x.dim()} dims with shape {tuple(x.shape)}")
    kh, kw = kernel_size
    c, h, w = x.shape
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if not (1 <= kh <= h and 1 <= kw <= w):
        raise ValueError(f"kernel {kh}x{kw} must fit inside the {h}x{w} image")
    sc, sh, sw = x.stride()
    h_out, w_out = (h - kh) // stride + 1, (w - kw) // stride + 1
    return x.as_strided((c, kh, kw, h_out, w_out), (sc, sh, sw, sh * stride, sw * stride), x.storage_offset())


def conv2d_via_im2col(x: torch.Tensor, weight: torch.Tensor, stride: int = 1) -> torch.Tensor:
    """A single-image valid convolution as one ``einsum`` over the zero-copy patches.

    x: (C, H, W); weight: (O, C, kh, kw) -> (O, H_out, W_out). Equals ``F.conv2d`` (no padding).
    """
    patches = im2col(x, tuple(weight.shape[-2:]), stride)  # (C, kh, kw, Ho, Wo), a view
    return torch.einsum("ocij,cijyx->oyx", weight, patches)
