"""Which ATen ops make the host wait for a CUDA device: the rule table behind the sync detector.

CUDA runs asynchronously: the host enqueues kernels on a stream and moves on. It waits only when it
needs a *value* that the device has not produced yet. In PyTorch that happens in two C++ helpers,
``c10::cuda::memcpy_and_sync`` (a copy followed by ``cudaStreamSynchronize``) and
``c10::cuda::stream_synchronize`` (c10/cuda/CUDAFunctions.h). Both call ``warn_or_error_on_sync()``
first, which is what ``torch.cuda.set_sync_debug_mode("warn")`` reports. The kernels below are the
ones that reach those helpers, each with the reason the host needs the value:

=========================  ==========================================================================
op (overload packet)       why the host waits (the CUDA source that syncs)
=========================  ==========================================================================
_local_scalar_dense        ``.item()``, ``bool()``, ``int()``, ``float()``, ``if t:``: the scalar is copied
                           to the host (native/cuda/CUDAScalar.cu, ``memcpy_and_sync``)
nonzero                    the output's length is the count of nonzeros (native/cuda/Nonzero.cu);
                           ``nonzero_static(size=)`` exists to avoid exactly this
index (bool/uint8 index)   a mask index becomes ``nonzero()`` (native/IndexingUtils.h ``expandTensors``)
index_put_ (bool index)    the same, unless the value is one host scalar: then ``masked_fill_``
                           (native/TensorAdvancedIndexingUtils.h ``canDispatchToMaskedFill``)
index / index_put_         an index tensor on the *host* is copied to the device from pageable
  (host index tensor)      memory (``memcpy_and_sync``)
masked_select              output length = number of selected elements
_unique2, _unique,         output length = number of distinct values (native/cuda/Unique.cu)
unique_dim, unique_(dim_)
consecutive
repeat_interleave          without ``output_size``: output length = ``repeats.sum()``, read back
  (Tensor repeats)         (native/Repeat.h)
bincount                   the number of bins is ``input.max() + 1`` (native/cuda/SummaryOps.cu)
histc (min == max)         the range is read from the data with ``min()``/``max()``
equal, allclose            the result is a Python bool
copy_, _to_copy            across host and device with ``non_blocking=False`` (native/cuda/Copy.cu):
  (real CUDA tensors)      on a CPU build these are handled one level up, in ``host_boundary``
=========================  ==========================================================================

The list follows torch's own test of the feature (``test_sync_warning`` in test/test_torch.py:
``x[mask] = 1.0``, ``x[ind] = y``, ``x[ind]``, ``one_hot(ind, num_classes=n)``, ``randperm``,
``repeat_interleave(..., output_size=)`` and ``torch.any`` must *not* sync; ``x[mask] = y``,
``x[ind_cpu]``, ``x.nonzero()``, ``if y:``, ``one_hot(ind)`` and ``repeat_interleave(x, repeats)`` must).
``set_sync_debug_mode`` itself is "experimental and does not catch everything" (torch/cuda/__init__.py);
the GPU check (``bench/bench_profiling.py``) compares this table with it on real programs.

Simplification: the rules read an op's arguments as the dispatcher passes them (``OpOverload`` +
args); "on the device" is a callable (``Placement.on_device`` on a CPU build, ``t.is_cuda`` on a GPU).
"""
from __future__ import annotations

from typing import Callable

import torch

from .scaffold import REASONS, bind_arguments  # noqa: F401 - re-exported: the rule table's vocabulary

OnDevice = Callable[[object], bool]

_UNIQUE_OPS = {"_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive"}
_MASK_DTYPES = (torch.bool, torch.uint8)


def _is_mask(index: object) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in _MASK_DTYPES


def can_dispatch_to_masked_fill(self_on_device: bool, indices, value, accumulate: bool, on_device: OnDevice) -> bool:
    """``canDispatchToMaskedFill``: one mask index (others None), same device as self, one host scalar value."""
    if accumulate or not isinstance(value, torch.Tensor) or value.numel() != 1 or on_device(value):
        return False
    masks = [i for i in indices if i is not None]
    return len(masks) == 1 and _is_mask(masks[0]) and on_device(masks[0]) == self_on_device


def sync_reason(func, args: tuple, kwargs: dict | None, on_device: OnDevice) -> str | None:
    """The id of the reason (a key of ``REASONS``) why ``func(*args, **kwargs)`` makes the host wait
    on a CUDA device, or None when it does not. ``on_device(t)`` says whether tensor ``t`` is on the device."""
    name = func.overloadpacket.__name__
    if name in ("copy_", "_to_copy"):
        return _real_copy_reason(name, bind_arguments(func, args, kwargs))
    a = bind_arguments(func, args, kwargs)
    if name == "repeat_interleave":  # .Tensor(repeats) / .self_Tensor(self, repeats) / .self_int(self, int)
        repeats = a["repeats"]
        if isinstance(repeats, torch.Tensor) and on_device(repeats) and a.get("output_size") is None:
            return "repeat_interleave"
        return None
    if not on_device(a.get("self")):
        return None  # a host op: nothing to wait for
    if name == "_local_scalar_dense":
        return "scalar_read"
    if name == "nonzero":
        return "nonzero"
    if name == "index":
        indices = [i for i in a["indices"] if i is not None]
        if any(_is_mask(i) for i in indices):
            return "bool_mask_index"
        if any(isinstance(i, torch.Tensor) and not on_device(i) for i in indices):
            return "host_index"
        return None
    if name in ("index_put_", "index_put", "_index_put_impl_"):
        indices = list(a["indices"])
        defined = [i for i in indices if i is not None]
        if any(isinstance(i, torch.Tensor) and not _is_mask(i) and not on_device(i) for i in defined):
            return "host_index"
        if any(_is_mask(i) for i in defined):
            if can_dispatch_to_masked_fill(True, indices, a["values"], bool(a["accumulate"]), on_device):
                return None
            return "bool_mask_index"
        return None
    if name == "masked_select":
        return "masked_select"
    if name in _UNIQUE_OPS:
        return "unique"
    if name == "bincount":
        return "bincount"
    if name == "histc":
        return "histc_range" if a["min"] == a["max"] else None
    if name in ("equal", "allclose"):
        return "bool_result"
    return None


def _real_copy_reason(name: str, a: dict) -> str | None:
    """Copies between real CUDA and CPU tensors (a CPU build never gets here with a CUDA tensor)."""
    if name == "copy_":
        dst, src = a["self"], a["src"]
        if not (isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor)) or a["non_blocking"]:
            return None
        if dst.is_cuda and not src.is_cuda:
            return "host_to_device"
        if src.is_cuda and not dst.is_cuda:
            return "device_to_host"
        return None
    src, device = a["self"], a["device"]
    if device is None or a["non_blocking"] or not isinstance(src, torch.Tensor):
        return None
    target_cuda = torch.device(device).type == "cuda"
    if src.is_cuda and not target_cuda:
        return "device_to_host"
    if target_cuda and not src.is_cuda:
        return "host_to_device"
    return None
