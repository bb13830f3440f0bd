"""The joint forward-backward graph and what the partitioner knows about its nodes
(torch/_functorch/partitioners.py: ``classify_nodes``, ``_size_of``, ``get_default_op_list``).

AOTAutograd traces forward *and* backward into one ATen-level FX graph, the **joint graph**:
placeholders ``primals_1..k`` (the forward's inputs) and ``tangents_1..m`` (the gradients flowing in
from the loss, one per differentiable forward output), and one output tuple: the forward's outputs
first (``num_fwd_outputs`` of them), then one gradient per primal (``None`` for an input that needs
none). A *partitioner* cuts it into a forward graph, which returns the forward outputs plus the
**saved** tensors, and a backward graph, which takes the saved tensors and the tangents.

This module classifies the nodes, as torch does:

- ``required_fw``: nodes needed to compute the forward's outputs from the primals;
- ``tangents_closure``: nodes that depend on a tangent (they can only run in backward);
- ``required_bw``: the tangents' closure plus the backward's output nodes;

and gives the quantities the min-cut weighs (:func:`node_bytes`, :func:`dist_from_bw`) and the op
categories it uses (:data:`OP_KINDS`), taken from torch's own lists so the two agree.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

__all__ = ["NodeInfo", "classify_nodes", "node_bytes", "dist_from_bw", "op_kind", "is_primal", "is_tangent",
           "alias_root", "forward_outputs", "backward_outputs"]

aten = torch.ops.aten


def is_primal(node: fx.Node) -> bool:
    return node.op == "placeholder" and "tangents" not in str(node.target)


def is_tangent(node: fx.Node) -> bool:
    return node.op == "placeholder" and "tangents" in str(node.target)


def _output_node(gm: fx.GraphModule) -> fx.Node:
    return next(n for n in gm.graph.nodes if n.op == "output")


def _flat_outputs(gm: fx.GraphModule) -> list:
    out = _output_node(gm).args[0]
    flat: list = []
    fx.node.map_aggregate(out, flat.append)
    return flat


def forward_outputs(gm: fx.GraphModule, num_fwd_outputs: int) -> list[fx.Node]:
    return [n for n in _flat_outputs(gm)[:num_fwd_outputs] if isinstance(n, fx.Node)]


def backward_outputs(gm: fx.GraphModule, num_fwd_outputs: int) -> list[fx.Node]:
    return [n for n in _flat_outputs(gm)[num_fwd_outputs:] if isinstance(n, fx.Node)]


@dataclass
class NodeInfo:
    primals: list[fx.Node]
    tangents: list[fx.Node]
    required_fw: set[fx.Node]
    required_bw: set[fx.Node]
    tangents_closure: set[fx.Node]
    fw_order: dict[fx.Node, int]                       # position among the required_fw nodes

    def is_required_fw(self, node: fx.Node) -> bool:
        return node in self.required_fw


def classify_nodes(joint: fx.GraphModule, num_fwd_outputs: int) -> NodeInfo:
    """Which nodes the forward needs, which depend on a tangent, which the backward must produce."""
    if not isinstance(joint, fx.GraphModule):
        raise TypeError(f"joint must be a torch.fx.GraphModule, got {type(joint).__name__}")
    n_out = len(_flat_outputs(joint))
    if isinstance(num_fwd_outputs, bool) or not isinstance(num_fwd_outputs, int) or not 0 <= num_fwd_outputs <= n_out:
        raise ValueError(f"num_fwd_outputs must be an int in 0..{n_out} (the joint graph's outputs), "
                         f"got {num_fwd_outputs!r}")
    nodes = list(joint.graph.nodes)
    primals = [n for n in nodes if is_primal(n)]
    tangents = [n for n in nodes if is_tangent(n)]
    closure: set[fx.Node] = set()
    for node in nodes:                                 # topological order: users come later
        if is_tangent(node) or node in closure:
            closure.add(node)
            closure.update(u for u in node.users if u.op != "output")
    required_bw = set(closure) | {o for o in backward_outputs(joint, num_fwd_outputs) if o.op != "output"}
    required_fw: set[fx.Node] = set()
    stack = list(forward_outputs(joint, num_fwd_outputs))
    while stack:                                       # ancestors of the forward outputs
        node = stack.pop()
        if node in required_fw or is_tangent(node):
            continue
        required_fw.add(node)
        stack.extend(node.all_input_nodes)
    required_fw.update(primals)                         # every primal is a forward input
    fw_order = {n: i for i, n in enumerate(n for n in nodes if n in required_fw)}
    return NodeInfo(primals, tangents, required_fw, required_bw, closure, fw_order)


def node_bytes(node: fx.Node) -> int:
    """Bytes of the value a node produces, from its ``meta["val"]`` (torch's ``_size_of``).

    numel x itemsize of each tensor (a tuple's elements summed; a SymInt counts 1 byte). Views count
    their full size too: the partitioner does not know that saving a view keeps its base alive.
    """
    val = node.meta.get("val", node.meta.get("example_value"))
    if val is None and "tensor_meta" in node.meta:
        tm = node.meta["tensor_meta"]
        numel = 1
        for s in tm.shape:
            numel *= int(s)
        return numel * tm.dtype.itemsize

    def nbytes(v) -> int:
        return int(v.numel()) * v.dtype.itemsize if isinstance(v, torch.Tensor) else 0

    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return 1
    if isinstance(val, torch.Tensor):
        return nbytes(val)
    if isinstance(val, (list, tuple)):
        return sum(nbytes(v) for v in val)
    if val is None and node.op in ("get_attr", "output"):
        return 0
    raise ValueError(f"node {node.name} has no 'val' metadata: trace the joint graph with AOTAutograd "
                     "(or make_fx with fake tensors) so every node records its value")


def dist_from_bw(joint: fx.GraphModule, info: NodeInfo) -> dict[fx.Node, int]:
    """How many forward steps a node is from the backward: 0 for a node outside the forward, else
    1 + the smallest distance among its users (torch sets 1e9 for forward nodes no user reaches)."""
    dist: dict[fx.Node, int] = {}
    for node in reversed(list(joint.graph.nodes)):
        if node.op == "output":
            dist[node] = int(1e9)
        elif not info.is_required_fw(node):
            dist[node] = 0
        else:
            dist[node] = min([int(1e9)] + [dist[u] + 1 for u in node.users])
    return dist


def _aten_packet(node: fx.Node):
    """The op overload packet a node calls (aten.mul for aten.mul.Tensor), or its target otherwise."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket
    return target


def _torch_op_types():
    from torch._functorch.partitioners import get_default_op_list  # torch's own categories

    return get_default_op_list()


_KINDS_CACHE: dict = {}


def op_kind(node: fx.Node) -> set[str]:
    """The categories of the op a node calls, from torch's lists: any of ``"view"``, ``"recomputable"``,
    ``"fusible"``, ``"compute_intensive"``, ``"random"`` (empty for placeholders and unknown ops)."""
    if node.op != "call_function":
        return set()
    if not _KINDS_CACHE:
        t = _torch_op_types()
        _KINDS_CACHE.update(view=t.view_ops, recomputable=t.recomputable_ops, fusible=t.fusible_ops,
                            compute_intensive=t.compute_intensive_ops, random=t.random_ops)
    packet = _aten_packet(node)
    if packet is operator.getitem:
        return {"recomputable", "fusible"}
    kinds = set()
    for kind, ops in _KINDS_CACHE.items():
        try:
            if packet in ops:
                kinds.add(kind)
        except TypeError:
            pass
    return kinds


_ALIAS_OPS = {aten.t, aten.view, aten._unsafe_view, aten.alias, aten.detach, aten.transpose, aten.permute,
              aten.expand, aten.slice, aten.select, aten.squeeze, aten.unsqueeze, aten.as_strided}


def alias_root(node: fx.Node) -> fx.Node:
    """Follow view-like ops (``t``, ``view``, ``detach``, ``permute``...) back to the tensor that owns the
    storage. Saving ``t(add)`` keeps exactly ``add``'s bytes alive, so comparisons of saved sets are
    made on roots."""
    while node.op == "call_function" and _aten_packet(node) in _ALIAS_OPS and node.args \
            and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node
