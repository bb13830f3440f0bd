"""Pattern replacement on an FX graph (torch/fx/subgraph_rewriter.py, torch/fx/passes/utils/matcher_utils.py).

A *pattern* is a small graph, written as a Python function and traced; its placeholders are
wildcards. Matching walks **backwards** from the pattern's returned node (the *anchor*): a tensor has
one producer but many consumers, so walking against the data flow is deterministic. Two nodes match
when they have the same ``op`` and ``target`` and their arguments match pairwise: a pattern node
recursively, a pattern placeholder binds whatever sits there (a node or a constant; the same
placeholder must bind the same thing everywhere), and any other constant must be equal and of the same
type (``x * 2`` does not match ``a * 2.0``). As in torch's matcher the binding is one-to-one: two
pattern nodes never bind the same graph node (so ``x + y`` does not match ``a + a``).

A match is only *replaceable* if it is self-contained: every matched node except the anchor must be
used only inside the match (if ``add`` in ``gelu(add(x, b))`` also feeds something else, fusing
would have to compute it twice, so it is skipped). Matches are taken greedily in graph order and may
not overlap. The replacement graph is copied in before the anchor's first user, the anchor's uses
are redirected to it, and the matched nodes are erased, newest first.

Simplified against torch: one anchor per pattern (torch also matches multi-output patterns by
backtracking over several anchors), no ``ignore_literals``/``node_name_match`` options.
A ``match_filter`` plays the role of torch's ``match_filters`` and of Inductor's ``extra_check``: a
rewrite is often valid only for some shapes or dtypes, which a real pass must check (see
:func:`fuse_bias_gelu`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx

__all__ = ["Match", "pattern_graph", "find_matches", "replace_pattern", "fuse_add_gelu", "fuse_bias_gelu"]


@dataclass
class Match:
    anchor: fx.Node                                   # the graph node matched by the pattern's output
    nodes: dict[fx.Node, Any] = field(default_factory=dict)   # pattern node -> graph node (or constant)
    placeholders: list[Any] = field(default_factory=list)    # what each pattern input bound, in order

    def internal_nodes(self) -> list[fx.Node]:
        return [g for p, g in self.nodes.items() if p.op not in ("placeholder", "output")]


def pattern_graph(pattern: Callable | fx.GraphModule | fx.Graph) -> fx.Graph:
    """The graph of a pattern: traced with ``torch.fx.symbolic_trace`` when given a function."""
    if isinstance(pattern, fx.GraphModule):
        return pattern.graph
    if isinstance(pattern, fx.Graph):
        return pattern
    if callable(pattern):
        return fx.symbolic_trace(pattern).graph
    raise TypeError(f"pattern must be a function, GraphModule or Graph, got {type(pattern).__name__}")


def _anchor(graph: fx.Graph, what: str) -> fx.Node:
    outputs = [n for n in graph.nodes if n.op == "output"]
    result = outputs[0].args[0] if outputs else None
    if isinstance(result, (tuple, list)) and len(result) == 1:
        result = result[0]
    if not isinstance(result, fx.Node):
        raise ValueError(f"{what} must return exactly one traced value (one anchor), got {result!r}")
    if result.op == "placeholder":
        raise ValueError(f"{what} returns one of its inputs: there is nothing to match")
    return result


def _match_value(p: Any, g: Any, m: dict, used: set) -> bool:
    """Does pattern value ``p`` (a node, a constant or a list of them) match graph value ``g``?"""
    if isinstance(p, fx.Node):
        if p in m:                                    # already bound: must be the same thing
            return m[p] is g if isinstance(g, fx.Node) else (not isinstance(m[p], fx.Node) and
                                                             type(m[p]) is type(g) and m[p] == g)
        if p.op == "placeholder":                     # a wildcard: binds a node or a constant
            if isinstance(g, fx.Node):
                if g in used:
                    return False
                used.add(g)
            m[p] = g
            return True
        if not isinstance(g, fx.Node) or g in used:
            return False
        return _match_node(p, g, m, used)
    if isinstance(p, (list, tuple)):
        return (isinstance(g, (list, tuple)) and len(p) == len(g)
                and all(_match_value(a, b, m, used) for a, b in zip(p, g)))
    return not isinstance(g, fx.Node) and type(p) is type(g) and p == g


def _match_node(p: fx.Node, g: fx.Node, m: dict, used: set) -> bool:
    if p.op != g.op or p.target != g.target:
        return False
    if len(p.args) != len(g.args) or list(p.kwargs) != list(g.kwargs):
        return False
    m[p] = g
    used.add(g)
    return (all(_match_value(a, b, m, used) for a, b in zip(p.args, g.args))
            and all(_match_value(p.kwargs[k], g.kwargs[k], m, used) for k in p.kwargs))


def _self_contained(match: Match) -> bool:
    inside = set(match.internal_nodes())
    for node in inside:
        if node is match.anchor:
            continue                                  # the anchor's value leaves the match
        if any(user not in inside for user in node.users):
            return False
    return True


def find_matches(gm: fx.GraphModule | fx.Graph, pattern, match_filter: Callable[[Match], bool] | None = None
                 ) -> list[Match]:
    """Non-overlapping, self-contained matches of ``pattern`` in graph order (earliest anchor first)."""
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    if not isinstance(graph, fx.Graph):
        raise TypeError(f"gm must be a GraphModule or Graph, got {type(gm).__name__}")
    pgraph = pattern_graph(pattern)
    anchor = _anchor(pgraph, "pattern")
    pattern_inputs = [n for n in pgraph.nodes if n.op == "placeholder"]
    taken: set[fx.Node] = set()
    matches = []
    for node in graph.nodes:
        m: dict = {}
        if not _match_node(anchor, node, m, set()):
            continue
        match = Match(anchor=node, nodes=m, placeholders=[m.get(p) for p in pattern_inputs])
        if any(p not in m for p in pattern_inputs):
            continue                                  # an input the pattern never reads: nothing binds it
        if not _self_contained(match) or taken.intersection(match.internal_nodes()):
            continue
        if match_filter is not None and not match_filter(match):
            continue
        taken.update(match.internal_nodes())
        matches.append(match)
    return matches


def replace_pattern(gm: fx.GraphModule, pattern, replacement,
                    match_filter: Callable[[Match], bool] | None = None) -> list[Match]:
    """Replace every match of ``pattern`` in ``gm`` by ``replacement`` (same inputs, in the same order).

    Returns the matches replaced; ``gm`` is changed in place and recompiled. Mirrors
    ``torch.fx.subgraph_rewriter.replace_pattern`` for single-output patterns.
    """
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"gm must be a torch.fx.GraphModule, got {type(gm).__name__}")
    pgraph = pattern_graph(pattern)
    rgraph = pattern_graph(replacement)
    n_in = sum(1 for n in pgraph.nodes if n.op == "placeholder")
    r_inputs = [n for n in rgraph.nodes if n.op == "placeholder"]
    if len(r_inputs) != n_in:
        raise ValueError(f"replacement takes {len(r_inputs)} inputs but the pattern has {n_in}")
    if not any(n.op == "output" for n in rgraph.nodes):
        raise ValueError("replacement graph has no output")
    graph = gm.graph
    matches = find_matches(gm, pgraph, match_filter)
    replaced: dict[fx.Node, fx.Node] = {}             # anchors already replaced -> their replacement
    position = {node: i for i, node in enumerate(graph.nodes)}
    for match in matches:
        env = {r: replaced.get(v, v) if isinstance(v, fx.Node) else v
               for r, v in zip(r_inputs, match.placeholders)}
        users = match.anchor.users
        insert_at = next((n for n in graph.nodes if n in users), match.anchor.next)
        with graph.inserting_before(insert_at):
            new_out = graph.graph_copy(rgraph, env)
        if isinstance(new_out, (tuple, list)):
            new_out = new_out[0]
        match.anchor.replace_all_uses_with(new_out)
        replaced[match.anchor] = new_out
        for node in sorted(match.internal_nodes(), key=position.__getitem__, reverse=True):
            graph.erase_node(node)                    # users before producers
    graph.lint()
    gm.recompile()
    return matches


# --- the chapter's fusion: gelu(x + bias) -> one custom op ------------------------------------------

def _bias_gelu_pattern(x, bias):
    return torch.nn.functional.gelu(x + bias)


def fuse_add_gelu(gm: fx.GraphModule, fused_op: Callable) -> int:
    """Replace every self-contained ``F.gelu(a + b)`` by ``fused_op(a, b)``; return how many (no shape
    check: ``fused_op`` must broadcast like ``+``). The exercise's entry; same result as torch's
    ``subgraph_rewriter.replace_pattern`` with the same pattern."""
    if not callable(fused_op):
        raise TypeError(f"fused_op must be callable, got {type(fused_op).__name__}")
    rgraph = fx.Graph()
    a, b = rgraph.placeholder("a"), rgraph.placeholder("b")
    rgraph.output(rgraph.call_function(fused_op, (a, b)))
    return len(replace_pattern(gm, _bias_gelu_pattern, rgraph))


def _value(node: Any):
    """The example value (FakeTensor) or tensor metadata a tracer left on a node, if any."""
    if not isinstance(node, fx.Node):
        return None
    for key in ("example_value", "val", "tensor_meta"):
        if key in node.meta:
            return node.meta[key]
    return None


def _bias_fits(match: Match) -> bool:
    """The fused op wants bias of shape (x.shape[-1],), same dtype, x floating: check the metadata."""
    x, bias = (_value(v) for v in match.placeholders)
    if x is None or bias is None:
        return False                                  # no shapes recorded: fusing would be a guess
    return (len(bias.shape) == 1 and len(x.shape) >= 1 and bias.shape[0] == x.shape[-1]
            and x.dtype == bias.dtype and x.dtype.is_floating_point)


def fuse_bias_gelu(gm: fx.GraphModule) -> int:
    """Replace ``F.gelu(x + bias)`` by ``torch.ops.ptinternals.fused_bias_gelu(x, bias)``; return how many.

    The op is the dispatcher chapter's custom op (``ptinternals.dispatch.custom_ops``): one kernel,
    one pass over ``x``, with a fake kernel so the graph can still be compiled. Only matches whose
    shapes the tracer recorded and that fit the op (bias 1-D over the last dim) are fused.
    """
    from ..dispatch.custom_ops import fused_bias_gelu  # noqa: F401  (registers the op on import)

    rgraph = fx.Graph()                               # built by hand: one call of the op's default overload
    x, bias = rgraph.placeholder("x"), rgraph.placeholder("bias")
    rgraph.output(rgraph.call_function(torch.ops.ptinternals.fused_bias_gelu.default, (x, bias)))
    return len(replace_pattern(gm, _bias_gelu_pattern, rgraph, match_filter=_bias_fits))
