"""Dead code elimination on an FX graph (torch/fx/graph.py ``Graph.eliminate_dead_code``,
torch/fx/node.py ``Node.is_impure``).

A node is **dead** when nothing uses its value and running it changes nothing else. Walking the graph
backwards (users before producers), each dead node is erased at once, which can make its inputs dead
in turn: one reverse pass removes whole dead chains.

What "changes nothing else" means is the whole difficulty. These nodes are *impure* and are kept:

- placeholders and the output (the graph's interface);
- an ATen operator whose schema mutates an argument (``aten.add_``, ``aten.copy_``: a ``Tensor(a!)``
  in the schema), or one torch lists as side-effectful (``torch._assert``, profiler ranges...);
- random operators (``aten.rand``, ``aten.dropout``...: tagged ``nondeterministic_seeded``), because
  removing one changes the generator's state and so every later random number;
- a ``call_module`` whose module sets ``_is_impure``;
- *unlike torch*: a ``call_method`` whose name is an in-place method (``x.add_(1)``, ``y.copy_(x)``).
  ``symbolic_trace`` records ``x.add_(1)`` as ``call_method add_`` with no users, and torch's pass,
  which only inspects ``call_function`` targets, erases it - changing the program. Here it stays.
"""
from __future__ import annotations

import torch
import torch.fx as fx

__all__ = ["is_impure", "eliminate_dead_code"]


def _is_inplace_method(name: str) -> bool:
    return name.endswith("_") and not name.endswith("__")


def _is_mutating_op(target) -> bool:
    op = target
    if isinstance(op, torch._ops.OpOverloadPacket):
        op = getattr(op, "default", None)
    if isinstance(op, torch._ops.OpOverload):
        return op._schema.is_mutable
    return False


# torch-level random functions, as ``symbolic_trace`` and Dynamo record them (torch/_library/utils.py
# keeps the same list as _RANDOM_FUNCTIONS); dropout draws a mask, so it consumes random numbers too
_RANDOM_FUNCTIONS = {
    torch.rand, torch.randn, torch.randint, torch.randperm, torch.rand_like, torch.randn_like,
    torch.randint_like, torch.normal, torch.poisson, torch.bernoulli, torch.multinomial, torch.dropout,
    torch.nn.functional.dropout, torch.nn.functional.dropout1d, torch.nn.functional.dropout2d,
    torch.nn.functional.alpha_dropout,
}


def _is_random(target) -> bool:
    op = target.default if isinstance(target, torch._ops.OpOverloadPacket) and hasattr(target, "default") else target
    if isinstance(op, torch._ops.OpOverload):
        return torch.Tag.nondeterministic_seeded in op.tags
    try:
        return target in _RANDOM_FUNCTIONS
    except TypeError:                                  # an unhashable target
        return False


def _side_effectful_functions() -> set:
    from torch.fx.node import _side_effectful_functions  # torch's own list (asserts, profiler ranges)

    return _side_effectful_functions


def is_impure(node: fx.Node) -> bool:
    """Must ``node`` stay even when nothing uses its value?"""
    if not isinstance(node, fx.Node):
        raise TypeError(f"node must be a torch.fx.Node, got {type(node).__name__}")
    if node.op in ("placeholder", "output"):
        return True
    if node.op == "call_function":
        return (node.target in _side_effectful_functions() or _is_mutating_op(node.target)
                or _is_random(node.target))
    if node.op == "call_method":
        return _is_inplace_method(str(node.target))
    if node.op == "call_module":
        owner = node.graph.owning_module
        module = owner.get_submodule(node.target) if owner is not None else None
        return bool(getattr(module, "_is_impure", False))
    return False                                       # get_attr: reading an attribute has no effect


def eliminate_dead_code(gm: fx.GraphModule | fx.Graph) -> list[str]:
    """Erase dead nodes in one reverse pass; return their names in the order they were erased.

    A ``GraphModule`` is recompiled afterwards, so its ``code`` and ``forward`` reflect the change.
    """
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    if not isinstance(graph, fx.Graph):
        raise TypeError(f"gm must be a torch.fx.GraphModule or Graph, got {type(gm).__name__}")
    graph.lint()                                       # a reverse pass needs topological order
    removed = []
    for node in reversed(list(graph.nodes)):
        if len(node.users) == 0 and not is_impure(node):
            removed.append(node.name)
            graph.erase_node(node)                     # its inputs lose a user: they may die next
    if isinstance(gm, fx.GraphModule):
        gm.recompile()
    return removed
