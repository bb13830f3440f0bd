"""FX graphs and the joint graph's save/recompute cut, drawn with matplotlib (no graphviz).

Layout: data flows top to bottom. A node's layer is its *longest* distance from the graph's inputs
(so every edge points down); within a layer nodes are ordered by the mean position of their inputs
(barycenter heuristic) to keep crossings few. Boxes show the node's name and what it runs
(``torch.sin``, ``aten.mm``...); placeholders and the output are drawn as the graph's interface.

:func:`draw_partition` colours a joint forward-backward graph by what a partitioner decided: forward
ops, backward ops, the **saved** tensors (the min cut's edges, thick outline) and the forward ops the
backward **recomputes** (hatched).
"""
from __future__ import annotations

import torch
import torch.fx as fx
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Patch

__all__ = ["fx_nodes", "draw_fx_graph", "draw_partition"]

_COLORS = {"input": "#cfe3f7", "op": "#f3f0e0", "output": "#f7d9c4", "forward": "#dbe9f6",
           "backward": "#fbe3cf", "saved": "#c9ecc4", "tangent": "#f4cccc"}


def _short_target(node: fx.Node) -> str:
    if node.op == "placeholder":
        return "input"
    if node.op == "output":
        return "output"
    if node.op == "call_method":
        return f".{node.target}()"
    if node.op == "call_module":
        return f"{node.target}()"
    if node.op == "get_attr":
        return f"self.{node.target}"
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.overloadpacket.__name__}" if target.namespace == "aten" else str(target)
    return getattr(target, "__name__", str(target))


def fx_nodes(gm: fx.GraphModule | fx.Graph) -> list[dict]:
    """The graph as plain data: ``[{"id", "name", "label", "kind", "inputs": [ids]}]`` in graph order."""
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    if not isinstance(graph, fx.Graph):
        raise TypeError(f"gm must be a torch.fx.GraphModule or Graph, got {type(gm).__name__}")
    ids = {n: i for i, n in enumerate(graph.nodes)}
    out = []
    for n, i in ids.items():
        kind = "input" if n.op == "placeholder" else "output" if n.op == "output" else "op"
        label = n.name if n.op in ("placeholder", "output") else f"{n.name}\n{_short_target(n)}"
        out.append({"id": i, "name": n.name, "label": label, "kind": kind,
                    "inputs": sorted({ids[a] for a in n.all_input_nodes})})
    return out


def _layout(nodes: list[dict]) -> dict[int, tuple[float, int]]:
    layer: dict[int, int] = {}
    for n in nodes:                                   # graph order is topological
        layer[n["id"]] = 1 + max((layer[i] for i in n["inputs"]), default=-1)
    depth = max(layer.values(), default=0)
    pos: dict[int, tuple[float, int]] = {}
    for d in range(depth + 1):
        row = [n for n in nodes if layer[n["id"]] == d]

        def bary(n):
            xs = [pos[i][0] for i in n["inputs"] if i in pos]
            return sum(xs) / len(xs) if xs else 0.0
        row.sort(key=lambda n: (bary(n), n["id"]))
        for k, n in enumerate(row):
            pos[n["id"]] = (k - (len(row) - 1) / 2, d)
    return pos


def _draw(ax, nodes: list[dict], colors: dict[int, str], title: str | None,
          bold: set[int] = frozenset(), hatched: set[int] = frozenset()) -> None:
    pos = _layout(nodes)
    x_gap, y_gap = 2.4, 1.15
    ax.set_axis_off()
    for n in nodes:
        x2, y2 = pos[n["id"]]
        for i in n["inputs"]:
            x1, y1 = pos[i]
            long_edge = y2 - y1 > 1
            ax.annotate("", xy=(x2 * x_gap, -y2 * y_gap + 0.26), xytext=(x1 * x_gap, -y1 * y_gap - 0.26), zorder=2,
                        arrowprops=dict(arrowstyle="-|>", color="#999999" if long_edge else "#555555",
                                        lw=0.7 if long_edge else 0.9, shrinkA=0, shrinkB=0))
    for n in nodes:
        x, y = pos[n["id"]]
        lines = n["label"].split("\n")
        w = max(len(s) for s in lines) * 0.1 + 0.3
        h = 0.22 * len(lines) + 0.12
        ax.add_patch(FancyBboxPatch((x * x_gap - w / 2, -y * y_gap - h / 2), w, h, boxstyle="round,pad=0.04",
                                    facecolor=colors[n["id"]], edgecolor="#1b5e20" if n["id"] in bold else "#333333",
                                    lw=2.4 if n["id"] in bold else 0.8, hatch="///" if n["id"] in hatched else None,
                                    zorder=4))
        ax.text(x * x_gap, -y * y_gap, n["label"], ha="center", va="center", fontsize=7.5, family="monospace",
                zorder=5)
    xs = [p[0] * x_gap for p in pos.values()] or [0.0]
    depth = max((p[1] for p in pos.values()), default=0)
    ax.set_xlim(min(xs) - 1.6, max(xs) + 1.6)
    ax.set_ylim(-depth * y_gap - 0.7, 0.7)
    if title:
        ax.set_title(title, fontsize=10)


def _figure(nodes: list[dict]) -> tuple[Figure, object]:
    pos = _layout(nodes)
    depth = max((p[1] for p in pos.values()), default=0) + 1
    width = max((sum(1 for p in pos.values() if p[1] == d) for d in range(depth)), default=1)
    fig = Figure(figsize=(max(3.0, 2.2 * width + 0.6), max(2.0, 0.9 * depth + 0.8)))
    return fig, fig.add_subplot(1, 1, 1)


def _check_size(nodes: list[dict], max_nodes: int) -> None:
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
        raise ValueError(f"max_nodes must be a positive int, got {max_nodes!r}")
    if len(nodes) > max_nodes:
        raise ValueError(f"the graph has {len(nodes)} nodes, more than max_nodes={max_nodes} can draw readably")


def draw_fx_graph(gm: fx.GraphModule | fx.Graph, title: str | None = None, max_nodes: int = 60) -> Figure:
    """Draw an FX graph (e.g. one a :class:`~ptinternals.compile.backends.RecordingBackend` captured)."""
    nodes = fx_nodes(gm)
    _check_size(nodes, max_nodes)
    fig, ax = _figure(nodes)
    _draw(ax, nodes, {n["id"]: _COLORS[n["kind"]] for n in nodes}, title)
    fig.tight_layout()
    return fig


def draw_partition(joint: fx.GraphModule, num_fwd_outputs: int, saved: list[str], title: str | None = None,
                   max_nodes: int = 80) -> Figure:
    """Draw a joint graph with a partitioner's choice: forward (blue), backward (orange), saved
    tensors (green, thick outline), forward ops the backward recomputes (hatched)."""
    from ..compile.joint_graph import classify_nodes, is_tangent
    from ..compile.partition import extract_forward_backward

    info = classify_nodes(joint, num_fwd_outputs)
    part = extract_forward_backward(joint, num_fwd_outputs, list(saved))
    recomputed = set(part.recomputed)
    nodes = fx_nodes(joint)
    _check_size(nodes, max_nodes)
    by_name = {n.name: n for n in joint.graph.nodes}
    colors, bold, hatched = {}, set(), set()
    for d in nodes:
        node = by_name[d["name"]]
        if d["name"] in saved:
            colors[d["id"]] = _COLORS["saved"]
            bold.add(d["id"])
        elif is_tangent(node):
            colors[d["id"]] = _COLORS["tangent"]
        elif node.op == "output":
            colors[d["id"]] = _COLORS["output"]
        else:
            colors[d["id"]] = _COLORS["forward"] if node in info.required_fw else _COLORS["backward"]
        if d["name"] in recomputed:
            hatched.add(d["id"])
    fig, ax = _figure(nodes)
    _draw(ax, nodes, colors, title or f"saved {len(saved)} tensors, {part.saved_bytes:,} bytes; "
                                      f"{len(recomputed)} ops recomputed", bold, hatched)
    ax.legend(handles=[Patch(facecolor=_COLORS["forward"], edgecolor="#333333", label="forward"),
                       Patch(facecolor=_COLORS["backward"], edgecolor="#333333", label="backward"),
                       Patch(facecolor=_COLORS["saved"], edgecolor="#1b5e20", lw=2, label="saved"),
                       Patch(facecolor="white", edgecolor="#333333", hatch="///", label="recomputed"),
                       Patch(facecolor=_COLORS["tangent"], edgecolor="#333333", label="tangent")],
              loc="upper right", fontsize=7, frameon=False)
    fig.tight_layout()
    return fig
