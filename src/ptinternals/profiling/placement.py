"""Where a tensor lives, as the host-device boundary sees it: on the device, or on the host (pinned or not).

On a GPU machine the answer is ``tensor.is_cuda`` and ``tensor.is_pinned()``. On a CPU-only build
there is no CUDA tensor at all, so the sync detector *emulates* one (``host_boundary``): a program
written for CUDA runs on CPU tensors, and this module remembers which of them stand for device
tensors and which for pinned host buffers.

The record is kept per **storage**, not per Python tensor object: views, ``param.data = t`` and
in-place ops share their input's storage, so they inherit its placement for free (the same reason
the caching allocator of {{chapter allocator}} tracks blocks, not tensors). Each storage key is
``untyped_storage()._cdata`` (the address of the C++ ``StorageImpl``); a ``weakref.finalize`` on the
storage's Python object drops the key when the storage dies, so a new storage that reuses the
address starts on the host again (``dispatch.modes.MemoryTracker`` relies on the same lifetime
rule: the Python storage object lives exactly as long as its StorageImpl is referenced from Python).
"""
from __future__ import annotations

import weakref

import torch

DEVICE = "device"
PINNED = "pinned"


def _storage_key(t: torch.Tensor) -> tuple[int, object]:
    s = t.untyped_storage()
    return s._cdata, s


class Placement:
    """Which storages are (emulated) device memory and which are pinned host memory."""

    def __init__(self) -> None:
        self._kind: dict[int, str] = {}  # StorageImpl address -> DEVICE or PINNED

    def _mark(self, t: torch.Tensor, kind: str) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"t must be a torch.Tensor, got {type(t).__name__}")
        if t.is_cuda or t.device.type == "meta":
            return  # a real CUDA tensor needs no emulation; meta tensors have no memory
        key, storage = _storage_key(t)
        if key not in self._kind:
            weakref.finalize(storage, self._kind.pop, key, None)
        self._kind[key] = kind

    def mark_device(self, t: torch.Tensor) -> None:
        """Record that ``t``'s storage stands for device memory."""
        self._mark(t, DEVICE)

    def mark_pinned(self, t: torch.Tensor) -> None:
        """Record that ``t``'s storage stands for page-locked (pinned) host memory."""
        self._mark(t, PINNED)

    def on_device(self, t: object) -> bool:
        """True for a real CUDA tensor or an emulated one; False for host tensors and non-tensors."""
        if not isinstance(t, torch.Tensor):
            return False
        if t.is_cuda:
            return True
        if t.device.type == "meta":
            return False
        return self._kind.get(t.untyped_storage()._cdata) == DEVICE

    def is_pinned(self, t: torch.Tensor) -> bool:
        """True for page-locked host memory (real, or emulated by ``pin_memory()`` on a CPU build)."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"t must be a torch.Tensor, got {type(t).__name__}")
        if t.is_cuda or t.device.type == "meta":
            return False
        if self._kind.get(t.untyped_storage()._cdata) == PINNED:
            return True
        return bool(torch.cuda.is_available() and t.is_pinned())

    def __len__(self) -> int:
        return len(self._kind)
