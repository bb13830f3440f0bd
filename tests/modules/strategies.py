"""Hypothesis strategies for module trees (specs for ``ptinternals.modules.build_tree``) and helpers.

The trees deliberately include the boundary classes: D = 0 (empty tensors) and D = 1 (size-1), tied
parameters (one Parameter under two names, in one module or in two), frozen (requires_grad=False)
and None parameters, persistent, non-persistent, None and int64 buffers, a module instance shared
under two names, empty modules, and child names "0", "1" (as containers use).
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from ptinternals.modules import MiniModule, build_tree

NAMES = ["weight", "bias", "scale", "proj", "gamma", "mean", "steps", "cache", "0", "1", "w", "b", "layers", "head"]


@st.composite
def tree_specs(draw, max_nodes: int = 5, max_params: int = 5, max_buffers: int = 3, dims=(0, 1, 2, 3)):
    dim = draw(st.sampled_from(dims))
    params = [{"shape": draw(st.sampled_from([[dim, dim], [dim], []])), "requires_grad": draw(st.booleans())}
              for _ in range(draw(st.integers(0, max_params)))]
    buffers = [{"shape": draw(st.sampled_from([[dim], []])), "dtype": draw(st.sampled_from(["float32", "int64"]))}
               for _ in range(draw(st.integers(0, max_buffers)))]
    n_nodes = draw(st.integers(1, max_nodes))
    entries = [{"params": [], "buffers": [], "children": []} for _ in range(n_nodes)]
    # every node below the root hangs from an earlier one: the tree is connected
    for n in range(1, n_nodes):
        entries[draw(st.integers(0, n - 1))]["children"].append(n)
    for _ in range(draw(st.integers(0, 2))):  # extra edges: a shared module instance
        if n_nodes >= 2:
            child = draw(st.integers(1, n_nodes - 1))
            entries[draw(st.integers(0, child - 1))]["children"].append(child)
    for i in range(len(params)):  # each parameter lives somewhere, sometimes twice (tied)
        for _ in range(draw(st.sampled_from([1, 1, 1, 2]))):
            entries[draw(st.integers(0, n_nodes - 1))]["params"].append(i)
    for i in range(len(buffers)):
        entries[draw(st.integers(0, n_nodes - 1))]["buffers"].append((i, draw(st.booleans())))
    for _ in range(draw(st.integers(0, 2))):  # None slots
        kind = draw(st.sampled_from(["params", "buffers", "children"]))
        entries[draw(st.integers(0, n_nodes - 1))][kind].append(None if kind != "buffers" else (None, True))
    nodes = []
    for n, e in enumerate(entries):
        count = len(e["params"]) + len(e["buffers"]) + len(e["children"])
        names = draw(st.permutations(NAMES + [f"m{k}" for k in range(count)]))[:count]
        names = list(names)
        node = {"cls": draw(st.sampled_from(["Block", "Layer", "Net"])) if n else "Root",
                "params": [[names.pop(), i] for i in e["params"]],
                "buffers": [[names.pop(), i, p] for i, p in e["buffers"]],
                "children": [[names.pop(), c] for c in e["children"]]}
        for kind in ("params", "buffers", "children"):  # registration order is part of the contract
            node[kind] = draw(st.permutations(node[kind]))
        nodes.append(node)
    return {"dim": dim, "params": params, "buffers": buffers, "nodes": nodes}


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
