"""What saving a forward value costs, and which values may not be recomputed: the cost model of
AOTAutograd's min-cut partitioner (torch/_functorch/partitioners.py ``solve_min_cut``:
``is_fusible``, ``is_materialized``, ``is_materialized_backwards``, ``should_ban_recomputation``,
``get_node_weight``).

The cut itself (``partition``) only needs two numbers per node: what saving it costs, and whether it is
banned from being recomputed. Both follow torch:

- cost = bytes x 1.1 ^ clamp(distance from the backward, 1, 100), doubled when the value would not be
  *materialised* otherwise (every user is fusible with it, so Inductor would keep it in registers);
  0 for a static input (a parameter lives anyway); infinite for a non-tensor;
- banned: ops outside torch's recomputable list (matmuls and other compute-intensive ops, random
  ops), values the backward must materialise anyway, and reductions whose output is 4x smaller than
  their inputs (cheap to save, expensive to redo). Views are never banned.

Imports only torch and ``joint_graph``: shipped to the grading sandbox as scaffolding for the exercise
that builds the network.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx

from .joint_graph import NodeInfo, node_bytes, op_kind

__all__ = ["is_fusible", "is_materialized", "is_materialized_backwards", "ban_reason", "saving_cost"]

INF = math.inf


def is_fusible(a: fx.Node, b: fx.Node) -> bool:
    if b.op == "call_function" and getattr(b.target, "overloadpacket", None) is torch.ops.aten.cat:
        return True                                   # "memory fusion" into a cat
    return "fusible" in op_kind(a) and "fusible" in op_kind(b)


def is_materialized(node: fx.Node) -> bool:
    return node.op == "placeholder" or not all(is_fusible(node, u) for u in node.users)


def is_materialized_backwards(node: fx.Node, info: NodeInfo) -> bool:
    """Some backward user (through views) cannot fuse with it: the backward writes it out anyway."""
    if "view" in op_kind(node):
        return False
    seen, todo = set(), [node]
    while todo:
        cur = todo.pop()
        for user in cur.users:
            if not info.is_required_fw(user) and not is_fusible(cur, user):
                return True
            if "view" in op_kind(user) and user not in seen:
                seen.add(user)
                todo.append(user)
    return False


def ban_reason(node: fx.Node, info: NodeInfo) -> str | None:
    """Why a forward node may not be recomputed in the backward (torch's should_ban_recomputation)."""
    if node.op != "call_function":
        return None
    kinds = op_kind(node)
    if "view" in kinds or node.target is operator.getitem:
        return None
    if "recomputable" not in kinds:
        return "compute intensive" if "compute_intensive" in kinds else \
               "random" if "random" in kinds else "not in the recomputable list"
    if is_materialized_backwards(node, info):
        return "materialized in backward"
    inputs = sum(node_bytes(a) for a in node.args if isinstance(a, fx.Node))
    if node_bytes(node) * 4 < inputs:
        return "reduction (output 4x smaller than inputs)"
    return None


def saving_cost(node: fx.Node, dist: int, static_inputs: frozenset = frozenset()) -> float:
    """torch's ``get_node_weight``: bytes x 1.1^clamp(dist, 1, 100) (x2 if not materialised); 0 for static inputs."""
    if node in static_inputs:
        return 0
    val = node.meta.get("val")
    if val is not None and not isinstance(val, (torch.Tensor, torch.SymInt)):
        return INF                                    # a tuple or other non-tensor cannot be saved
    weight = int(node_bytes(node) * (1.1 ** max(min(dist, 100), 1)))
    return weight if is_materialized(node) else weight * 2
