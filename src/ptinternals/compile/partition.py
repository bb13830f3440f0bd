"""Save or recompute: the min-cut partitioner of AOTAutograd, simplified
(torch/_functorch/partitioners.py ``min_cut_rematerialization_partition``, ``solve_min_cut``,
``default_partition``, ``_extract_fwd_bwd_modules``).

The backward needs some forward values (``sin`` needs ``cos(x)``: saved ``x`` or saved ``cos(x)``). The
**default partitioner** saves every forward value the backward reads, as eager autograd does. The
**min-cut partitioner** saves as few bytes as possible and recomputes the rest in the backward, where a
recomputed pointwise op is almost free (Inductor fuses it into the backward's kernels) while every
saved byte is written once and read once from memory. That is the activation-checkpointing trade-off,
solved per graph as a minimum cut:

- every node ``n`` becomes an edge ``n_in -> n_out`` whose capacity is the cost of saving ``n``;
- a data dependency ``a -> b`` becomes ``a_out -> b_in`` with infinite capacity;
- ``source -> n_in`` (infinite) for nodes that may not be recomputed: the primals (inputs are there
  anyway) and *banned* forward nodes - matmuls (compute intensive), random ops, ops outside torch's
  recomputable list, reductions whose output is 4x smaller than their inputs, nodes the backward must
  materialise anyway;
- for the nodes the backward must have: ``n_out -> sink`` when ``n`` does not depend on a tangent (its
  value must be *available*: saved or recomputable), ``n_in -> sink`` when it does (it is computed in
  the backward, from whatever its inputs are).

A finite cut separates the sink from the source: the cut ``n_in -> n_out`` edges are the tensors to
save, and everything on the sink side is (re)computed in the backward.

The cost of saving ``n``, as torch computes it (``get_node_weight``): its bytes, times ``1.1 ** d``
with ``d`` = its distance from the backward clamped to 1..100 (prefer saving values used late), times 2
if ``n`` is not *materialised* (all its users are fusible, so Inductor would never write it to memory
unless it is saved); 0 for a parameter (a "static" input that lives on anyway). A view cannot be banned.

**Simplified against torch** (``choose_saved_values_set`` with ``memory_budget=1``): no "used far apart" or "long fusible chain" bans (``ban_recompute_used_far_apart`` and
``ban_recompute_long_fusible_chains`` in ``torch._functorch.config``: :func:`torch_min_cut_config`
switches them off for comparisons), no activation memory budget, no symbolic sizes, RNG
functionalisation, collectives, mutations or activation-checkpointing tags. With those options off,
:func:`min_cut_saved` chooses exactly the tensors torch chooses, because both take the same canonical
cut (``maxflow``: the sink side is the set of nodes that can still reach the sink). With torch's
defaults the two heuristics rarely fire on small graphs: on 80 random programs of up to 8 ops
(torch 2.13) the saved sets were identical too; they matter for long chains in real models.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch.fx as fx

from .fx_cse import eliminate_common_subexpressions
from .joint_graph import (
    NodeInfo,
    backward_outputs,
    classify_nodes,
    dist_from_bw,
    is_primal,
    is_tangent,
    node_bytes,
    op_kind,
)
from .maxflow import FlowNetwork
from .save_costs import ban_reason, saving_cost

__all__ = ["Partition", "build_network", "min_cut_saved", "default_saved",
           "extract_forward_backward", "min_cut_partition", "default_partition", "torch_min_cut_config"]

INF = math.inf


@dataclass
class Partition:
    forward: fx.GraphModule                 # primals -> (*forward outputs, *saved)
    backward: fx.GraphModule                # (*saved, *tangents) -> gradients
    saved: list[str]                        # names of the saved nodes, in graph order
    saved_bytes: int

    @property
    def recomputed(self) -> list[str]:
        """Forward ops the backward runs again (a node name in both graphs, not a placeholder)."""
        fw = {n.name for n in self.forward.graph.nodes if n.op == "call_function"}
        return [n.name for n in self.backward.graph.nodes if n.op == "call_function" and n.name in fw]


def build_network(joint: fx.GraphModule, num_fwd_outputs: int, static_inputs=()) -> tuple[FlowNetwork, dict]:
    """The flow network of ``solve_min_cut`` and the reasons each banned node got: ``(network, banned)``."""
    info = classify_nodes(joint, num_fwd_outputs)
    dist = dist_from_bw(joint, info)
    static = frozenset(static_inputs)
    net, banned = FlowNetwork(), {}

    def ban(node: fx.Node, reason: str) -> None:
        if "view" in op_kind(node):
            return                                    # views are free to recompute: never banned
        banned[node.name] = reason
        net.add_edge("source", node.name + "_in", INF)

    for node in joint.graph.nodes:
        if node.op == "output":
            continue
        if node in info.required_bw:
            if node not in info.tangents_closure:     # e.g. a gradient that needs no tangent
                net.add_edge(node.name + "_out", "sink", INF)
            else:                                     # depends on a tangent: computed in backward
                net.add_edge(node.name + "_in", "sink", INF)
                continue
        if is_primal(node):
            ban(node, "primal input")
        reason = ban_reason(node, info)
        if reason is not None and info.is_required_fw(node):
            ban(node, reason)
        net.add_edge(node.name + "_in", node.name + "_out", saving_cost(node, dist[node], static))
        for user in node.users:
            net.add_edge(node.name + "_out", user.name + "_in", INF)
    return net, banned


def min_cut_saved(joint: fx.GraphModule, num_fwd_outputs: int, static_inputs=()) -> list[str]:
    """Names of the nodes the min-cut partitioner saves, in graph order.

    Run it on a graph without duplicate computations (:func:`min_cut_partition` first applies
    ``fx_cse.eliminate_common_subexpressions``, as torch does): a duplicate is a second copy of a value
    the cut would otherwise weigh only once.
    """
    info = classify_nodes(joint, num_fwd_outputs)
    if not info.required_bw:
        return default_saved(joint, num_fwd_outputs)   # nothing needs a gradient: as torch does
    net, _ = build_network(joint, num_fwd_outputs, static_inputs)
    cut = net.min_cut("source", "sink")
    names = {u[:-len("_in")] for u, v in cut.cut_edges}
    if any(not u.endswith("_in") or v != u[:-3] + "_out" for u, v in cut.cut_edges):
        raise RuntimeError(f"the cut crossed a dependency edge: {cut.cut_edges}")  # impossible: they are infinite
    return [n.name for n in joint.graph.nodes if n.name in names]


def _forward_nodes(joint: fx.GraphModule, info: NodeInfo) -> set[fx.Node]:
    """The default partitioner's forward: the ops AOTAutograd traced while running the forward
    (``meta["partitioner_tag"] == "is_forward"``, torch's "original placement of ops"), else - for a
    joint graph without tags - the nodes the forward outputs depend on."""
    tagged = [n for n in joint.graph.nodes if n.meta.get("partitioner_tag") == "is_forward"]
    if not tagged:
        return set(info.required_fw)
    last = tagged[-1]
    forward = set()
    for node in joint.graph.nodes:                    # everything up to the last forward op, but tangents
        if not is_tangent(node) and node.op != "output":
            forward.add(node)
        if node is last:
            break
    return forward


def default_saved(joint: fx.GraphModule, num_fwd_outputs: int) -> list[str]:
    """The default partitioner: every forward node the backward reads, in graph order."""
    info = classify_nodes(joint, num_fwd_outputs)
    forward = _forward_nodes(joint, info)
    grads = set(backward_outputs(joint, num_fwd_outputs))
    return [n.name for n in joint.graph.nodes
            if n in forward and (n in grads or any(u not in forward and u.op != "output" for u in n.users))]


def _extract(joint: fx.GraphModule, inputs: list[fx.Node], outputs: list, name: str) -> fx.GraphModule:
    """A new graph with ``inputs`` as placeholders computing ``outputs``: every other node it needs is
    copied (recomputed) from the joint graph (torch's ``_extract_graph_with_inputs_outputs``)."""
    graph, env = fx.Graph(), {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    needed: set[fx.Node] = set()
    stack = [o for o in outputs if isinstance(o, fx.Node)]
    while stack:
        node = stack.pop()
        if node in needed or node in env:
            continue
        if node.op == "placeholder":
            raise ValueError(f"{name} graph needs {node.name}, which is neither saved nor one of its inputs")
        needed.add(node)
        stack.extend(node.all_input_nodes)
    for node in joint.graph.nodes:
        if node in needed:
            env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(tuple(env[o] if isinstance(o, fx.Node) else o for o in outputs))
    graph.lint()
    return fx.GraphModule(joint, graph, class_name=name)


def extract_forward_backward(joint: fx.GraphModule, num_fwd_outputs: int, saved: list[str]) -> Partition:
    """Build the forward and backward graphs for a chosen saved set."""
    by_name = {n.name: n for n in joint.graph.nodes}
    unknown = [s for s in saved if s not in by_name]
    if unknown:
        raise ValueError(f"saved names {unknown} are not nodes of the joint graph")
    saved_nodes = [by_name[s] for s in saved]
    primals = [n for n in joint.graph.nodes if is_primal(n)]
    tangents = [n for n in joint.graph.nodes if is_tangent(n)]
    out = next(n for n in joint.graph.nodes if n.op == "output").args[0]
    flat: list = []
    fx.node.map_aggregate(out, flat.append)
    forward = _extract(joint, primals, flat[:num_fwd_outputs] + saved_nodes, "Forward")
    backward = _extract(joint, saved_nodes + tangents, flat[num_fwd_outputs:], "Backward")
    return Partition(forward, backward, list(saved), sum(node_bytes(n) for n in saved_nodes))


def min_cut_partition(joint: fx.GraphModule, num_fwd_outputs: int, static_inputs=()) -> Partition:
    """CSE, then the min cut, then the two graphs (names refer to the CSE'd joint graph, as in torch)."""
    joint = eliminate_common_subexpressions(joint)
    static = {n for n in joint.graph.nodes if n.name in {getattr(s, "name", s) for s in static_inputs}}
    return extract_forward_backward(joint, num_fwd_outputs, min_cut_saved(joint, num_fwd_outputs, static))


def default_partition(joint: fx.GraphModule, num_fwd_outputs: int) -> Partition:
    return extract_forward_backward(joint, num_fwd_outputs, default_saved(joint, num_fwd_outputs))


def torch_min_cut_config():
    """A context in which torch's min-cut uses only the rules above (two heuristic bans off)."""
    import torch._functorch.config as functorch_config

    options = {k: False for k in ("ban_recompute_used_far_apart", "ban_recompute_long_fusible_chains")
               if hasattr(functorch_config, k)}
    return functorch_config.patch(**options) if options else contextlib.nullcontext()
