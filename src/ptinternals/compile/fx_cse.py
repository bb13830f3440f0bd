"""Common subexpression elimination on a functional FX graph (torch/_functorch/compile_utils.py
``fx_graph_cse``), the pass AOTAutograd runs on the joint graph before partitioning.

Two nodes that call the same op on the same inputs compute the same value, so the second can reuse
the first. The joint graph is full of such duplicates: the forward computes ``cos(x)`` and the
derivative of ``sin`` computes it again; ``t(w)`` appears once per use. Walking the graph in order,
each node's *key* is ``(target, args, kwargs)`` with every argument node replaced by the node that
already represents it; the first node with a key is kept, later ones are mapped to it.

Never merged (they are copied as they are):

- placeholders, the output, ``get_attr``;
- random ops (two ``rand_like`` calls are two different draws) and ``aten.empty`` (its contents are
  undefined, and it fuses into its user anyway);
- ops that mutate an argument (a functional graph has none; they would need torch's mutation regions);
- nodes whose value shares storage with a graph output: in eager mode those are separate tensors that
  happen to hold the same numbers, and merging them would make two outputs alias each other.

Constants are compared with their type (``x * 1`` and ``x * 1.0`` differ: their results' dtypes can).
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten

from .fx_dce import _is_mutating_op, _is_random

__all__ = ["eliminate_common_subexpressions"]


def _storage(node: fx.Node):
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    try:
        from torch.multiprocessing.reductions import StorageWeakRef

        return StorageWeakRef(val.untyped_storage())
    except (NotImplementedError, RuntimeError):
        return None


def _key(node: fx.Node, env: dict) -> tuple:
    def substitute(values) -> tuple:
        flat, spec = tree_flatten(values)
        out = []
        for v in flat:
            v = env.get(v, v) if isinstance(v, fx.Node) else v
            out.append((v, type(v)))                 # 1 and 1.0 hash equal but are different constants
        return tuple(out), str(spec)

    return (node.target, substitute(node.args), substitute(node.kwargs))


def eliminate_common_subexpressions(gm: fx.GraphModule) -> fx.GraphModule:
    """A new GraphModule with duplicate computations merged (node names of the kept nodes preserved)."""
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"gm must be a torch.fx.GraphModule, got {type(gm).__name__}")
    output = next(n for n in gm.graph.nodes if n.op == "output")
    output_storages = {s for s in (_storage(n) for n in output.all_input_nodes) if s is not None}
    new_graph, env, seen = fx.Graph(), {}, {}
    for node in gm.graph.nodes:
        keep_as_is = (node.op in ("placeholder", "output", "get_attr")
                      or _is_random(node.target) or _is_mutating_op(node.target)
                      or getattr(node.target, "overloadpacket", None) is torch.ops.aten.empty
                      or (_storage(node) is not None and _storage(node) in output_storages))
        if not keep_as_is:
            key = _key(node, env)
            try:
                if key in seen:
                    env[node] = seen[key]            # the same op on the same inputs: reuse it
                    continue
            except TypeError:                        # an unhashable constant: never merged
                key = None
        env[node] = new_graph.node_copy(node, env.__getitem__)
        if not keep_as_is and key is not None:
            seen[key] = env[node]
    new_graph.lint()
    return fx.GraphModule(gm, new_graph, class_name=type(gm).__name__)
