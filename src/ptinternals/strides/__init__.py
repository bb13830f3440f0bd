"""The strides chapter, "Storage, strides and views": the reference implementation.

- :mod:`.meta`: the metadata algorithms as pure functions on tuples (contiguous strides, storage
  index, contiguity, ``view``'s computeStride, permute, expand, slicing, unfold).
- :mod:`.tensor`: ``StridedTensor``, a tensor from first principles over a flat ``Storage``.
- :mod:`.windows`: zero-copy sliding windows and im2col with ``torch.as_strided``.
"""
from .meta import (
    broadcast_shapes,
    channels_last_strides,
    contiguous_strides,
    expand_meta,
    explain_view_failure,
    infer_size,
    is_channels_last,
    is_contiguous,
    narrow_meta,
    permute_meta,
    select_meta,
    slice_meta,
    storage_extent,
    storage_index,
    transpose_meta,
    unfold_meta,
    view_strides,
)
from .tensor import Storage, StridedTensor
from .windows import conv2d_via_im2col, im2col, shares_storage, sliding_windows

__all__ = [
    "Storage", "StridedTensor", "broadcast_shapes", "channels_last_strides", "contiguous_strides",
    "conv2d_via_im2col", "expand_meta", "explain_view_failure", "im2col", "infer_size", "is_channels_last",
    "is_contiguous", "narrow_meta", "permute_meta", "select_meta", "shares_storage", "slice_meta",
    "sliding_windows", "storage_extent", "storage_index", "transpose_meta", "unfold_meta", "view_strides",
]
