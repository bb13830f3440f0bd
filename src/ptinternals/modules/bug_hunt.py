"""Reference answers of the bug hunt: ``FixedNet`` and a checkpoint loader that cannot fail silently.

``BrokenNet`` (in :mod:`.scaffold`) has the three module bugs that cost the most debugging time,
because nothing raises:

1. ``self.blocks = [nn.Linear(...)]``: a Python list is an ordinary attribute, so ``__setattr__``
   registers nothing. The blocks' weights are not in ``parameters()`` (an optimizer built from it
   never trains them), not in ``state_dict()`` (never saved), not moved by ``.to()``.
   Fix: ``nn.ModuleList``, whose children are named ``"0"``, ``"1"``... (keys ``blocks.0.weight``).
2. ``self.mask = torch.tril(...)``: a plain tensor attribute, invisible to ``.to()`` (on a GPU the
   forward fails with a device mismatch) and to ``state_dict()``. It is derived data, so it should be
   a buffer that is moved but not saved: ``register_buffer("mask", ..., persistent=False)``.
3. ``block.forward(x)``: skips ``_call_impl``, so every hook on the blocks is silently skipped
   (profilers, activation capture, FSDP's all-gather). Fix: ``block(x)``.

``load_checkpoint`` mirrors how people load checkpoints saved from a wrapper: ``DataParallel``/DDP
save every key under ``module.``, ``torch.compile``'s ``OptimizedModule`` under ``_orig_mod.``. It
strips those prefixes with torch's own rule (``consume_prefix_in_state_dict_if_present`` in
torch/nn/modules/utils.py, ``_metadata`` included), and then loads **strictly**: the usual fix,
``strict=False``, "loads" a checkpoint whose every key is wrong without a word.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import torch
from torch import nn

__all__ = ["FixedNet", "load_checkpoint", "WRAPPER_PREFIXES"]

WRAPPER_PREFIXES = ("module.", "_orig_mod.")


class FixedNet(nn.Module):
    """``BrokenNet`` with its three bugs fixed; same constructor, same arithmetic, same parameter names."""

    def __init__(self, dim: int, depth: int, max_len: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.register_buffer("mask", torch.tril(torch.ones(max_len, max_len)), persistent=False)
        self.register_buffer("scale", torch.tensor(dim ** -0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        scores = (x @ x.transpose(1, 2)) * self.scale  # (B, T, T)
        weights = scores.masked_fill(self.mask[:T, :T] == 0, float("-inf")).softmax(-1)
        x = weights @ x
        for block in self.blocks:
            x = x + block(x).relu()  # through __call__: hooks run
        return self.norm(x)


def _strip(state_dict: OrderedDict, prefix: str) -> None:
    """torch's ``consume_prefix_in_state_dict_if_present``, written out (keys and ``_metadata``)."""
    for key in list(state_dict):
        if key.startswith(prefix):
            state_dict[key[len(prefix):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        for key in list(metadata):
            if key and (key == prefix.rstrip(".") or key.startswith(prefix)):
                metadata[key[len(prefix):]] = metadata.pop(key)


def load_checkpoint(model, checkpoint):
    """Load ``checkpoint`` into ``model`` strictly, after removing wrapper prefixes.

    Candidates: the checkpoint, then the checkpoint with one more wrapper prefix removed, for as long as
    every key starts with one of ``WRAPPER_PREFIXES`` (``_orig_mod.module.0.weight`` -> ``module.0.weight``
    -> ``0.weight``). The candidate whose keys match the model's own ``state_dict`` keys best is loaded,
    the least stripped one on a tie (a child may really be called ``module``). The caller's checkpoint
    is not modified. Returns ``load_state_dict``'s result; raises its RuntimeError when keys still do
    not match or shapes differ.
    """
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f"checkpoint must be a mapping (a state_dict), got {type(checkpoint).__name__}")
    if not callable(getattr(model, "load_state_dict", None)):
        raise TypeError(f"model must be a module with load_state_dict, got {type(model).__name__}")
    sd = OrderedDict(checkpoint)  # a copy: the caller's checkpoint stays as it was
    metadata = getattr(checkpoint, "_metadata", None)
    if metadata is not None:
        sd._metadata = OrderedDict(metadata)
    own_keys = set(model.state_dict().keys())
    candidates = [sd]
    while candidates[-1]:
        prefix = next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in candidates[-1])), None)
        if prefix is None:
            break
        nxt = OrderedDict(candidates[-1])
        if metadata is not None:
            nxt._metadata = OrderedDict(candidates[-1]._metadata)
        _strip(nxt, prefix)
        candidates.append(nxt)
    best = max(candidates, key=lambda c: sum(k in own_keys for k in c))  # max keeps the first on a tie
    return model.load_state_dict(best, strict=True)
