"""Probes: measure what autograd keeps alive for backward, with ``saved_tensors_hooks``.

Every tensor that a node saves for its backward (``ctx.save_for_backward``, or the ``self_``/
``result_`` fields of a generated node like ``ExpBackward0``) goes through the *pack hook* of
``torch.autograd.graph.saved_tensors_hooks`` at the moment it is saved (torch/csrc/autograd/
saved_variable.cpp, ``SavedVariable::set_hooks_and_pack_data``). Recording what passes through
it tells exactly which tensors the graph holds until backward.

Bytes are counted per *storage*, each distinct storage once: ``mul`` saving ``x`` and ``exp``
saving a view of ``x`` keep one buffer alive, not two. No solution code lives here: the graders
use these probes on a student's Function in the sandbox.
"""
from __future__ import annotations

import torch


def _storage_key(t: torch.Tensor) -> tuple:
    storage = t.untyped_storage()
    return (t.device.type, t.device.index, storage.data_ptr(), storage.nbytes())


def saved_tensors_log(fn, *inputs, exclude=()) -> list:
    """Run ``fn(*inputs)`` and list every tensor saved for backward, in the order saved.

    Each entry is a dict of plain data: ``shape``, ``dtype`` (str), ``nbytes`` (the view's bytes),
    ``storage_nbytes``, ``new_storage`` (False when an earlier entry, or an ``exclude``d tensor such as
    a parameter, already holds the same storage). The graph is kept alive until the log is built.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    excluded = set()
    for t in exclude:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"exclude must hold tensors (e.g. model.parameters()), got {type(t).__name__}")
        excluded.add(_storage_key(t))
    packed: list = []  # holding the tensors keeps their storages alive, so addresses are not reused

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*inputs)
    log, seen = [], set(excluded)
    for t in packed:
        key = _storage_key(t)
        log.append({
            "shape": tuple(t.shape),
            "dtype": str(t.dtype).replace("torch.", ""),
            "nbytes": t.numel() * t.element_size(),
            "storage_nbytes": key[3],
            "new_storage": key not in seen,
        })
        seen.add(key)
    del out
    return log


def saved_tensor_bytes(fn, *inputs, exclude=()) -> int:
    """Bytes of the distinct storages that ``fn(*inputs)``'s graph saves for backward.

    ``exclude``: tensors whose storages are not counted (pass ``model.parameters()`` to count only
    activations). Example: ``saved_tensor_bytes(torch.exp, x)`` is ``x.numel() * 4`` for float32 x
    (``ExpBackward0`` saves its result).
    """
    log = saved_tensors_log(fn, *inputs, exclude=exclude)
    return sum(e["storage_nbytes"] for e in log if e["new_storage"])
