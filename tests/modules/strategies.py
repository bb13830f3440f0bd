"""Hypothesis strategies for module trees (specs for ``ptinternals.modules.build_tree``) and helpers.

The trees deliberately include the boundary classes: D = 0 (empty tensors) and D = 1 (size-1), tied
parameters (one Parameter under two names, in one module or in two), frozen (requires_grad=False)
and None parameters, persistent, non-persistent, None and int64 buffers, a module instance shared
under two names, empty modules, and child names "0", "1" (as containers use).
"""
from __future__ import annotations

import torch

from ptinternals.checks.modules import tree_specs  # noqa: F401 (the checkers' strategy: one source of trees)
from ptinternals.modules import MiniModule, build_tree


def both(spec: dict, seed: int = 0, dtype=torch.float32):
    """The same tree on real torch and on the reference: ``(torch_nodes, mini_nodes)``."""
    return build_tree(spec, torch.nn.Module, seed, dtype), build_tree(spec, MiniModule, seed, dtype)


def outcome(fn):
    """``("ok", value)`` or ``("raised", type name, message)``: errors compared as data."""
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - any error is part of the behaviour under comparison
        return ("raised", type(e).__name__, str(e))


def index_of(nodes) -> dict:
    """``{id(module): node index}`` (a shared module keeps its first index)."""
    out: dict = {}
    for i, m in enumerate(nodes):
        out.setdefault(id(m), i)
    return out
