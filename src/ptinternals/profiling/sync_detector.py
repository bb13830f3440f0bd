"""Find every place a program makes the host wait for the GPU: a TorchDispatchMode over ATen ops.

    with SyncDetector() as det:          # on a CPU build, a program written for CUDA runs emulated
        train_step(model, batch)
    for e in det.events: print(e)        # aten._local_scalar_dense.default  scalar_read  at train.py:41 (torch.Tensor.item)

:class:`SyncDetector` is the recorder of ``sync_recorder`` (both interception layers, the CUDA
emulation, ``torch.cuda.synchronize``) judged by the rule table of ``sync_rules``.

What this mirrors: ``torch.cuda.set_sync_debug_mode("warn")`` (torch/cuda/__init__.py) makes
``c10::cuda::warn_or_error_on_sync`` warn from inside ``memcpy_and_sync``/``stream_synchronize``
(c10/cuda/CUDAFunctions.h). That needs a GPU; this detector names the same ops from the ATen op
stream, so it also runs on a CPU build, and says *why* each one waits.
"""
from __future__ import annotations

from .scaffold import REASONS
from .sync_recorder import SyncEvent, SyncRecorder
from .sync_rules import sync_reason


class SyncDetector(SyncRecorder):
    """Record every op of a program that makes the host wait for a CUDA device.

    ``emulate``: run CUDA programs on CPU tensors (default: when CUDA is unavailable). With a real
    GPU (``emulate=False``) the detector only watches; compare with ``torch.cuda.set_sync_debug_mode``.
    ``rule``: the ATen-level judge, ``sync_rules.sync_reason`` by default (an exercise plugs its own in).
    """

    def __init__(self, emulate: bool | None = None, rule=None):
        super().__init__(sync_reason if rule is None else rule, emulate)


def find_syncs(fn, *args, emulate: bool | None = None, **kwargs) -> list[SyncEvent]:
    """Run ``fn(*args, **kwargs)`` under a :class:`SyncDetector` and return its events."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    with SyncDetector(emulate=emulate) as det:
        fn(*args, **kwargs)
    return det.events


__all__ = ["REASONS", "SyncDetector", "SyncEvent", "find_syncs"]
