"""Autograd graphs, drawn from ``grad_fn.next_functions``: the autograd chapter's picture.

The same walk serves a real PyTorch graph (``loss.grad_fn``: ``MulBackward0``, ``AccumulateGrad``...)
and the mini engine's (``ptinternals.autograd``), because both expose ``name()`` and
``next_functions`` (torch/csrc/autograd/python_cpp_function.cpp) and an ``AccumulateGrad`` with a
``.variable``. Layout: layered top to bottom, the root (the loss's ``grad_fn``) on top; a node's
layer is its *longest* distance from the root, so every arrow points down, in the direction the
gradient flows and the order the engine may run the nodes. Within a layer, nodes are ordered by the
mean position of their consumers (barycenter heuristic) to keep crossings few.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

_PREFIX = "torch::autograd::"
_COLORS = {"op": "#f3f0e0", "leaf": "#cfe3f7", "root": "#f7d9c4"}


def _start_node(root):
    """The node to start from: ``root.grad_fn`` for a tensor/Variable, else ``root`` itself."""
    if hasattr(root, "next_functions"):
        return root
    if hasattr(root, "grad_fn") and hasattr(root, "requires_grad"):
        if root.grad_fn is None:
            raise ValueError("root has no grad_fn (a leaf, or computed without grad): there is no graph to "
                             "draw")
        return root.grad_fn
    raise TypeError(f"root must be a tensor, a Variable or a grad_fn node, got {type(root).__name__}")


def walk_graph(root) -> list:
    """The graph as plain data, breadth first from the root.

    ``[{"id": 0, "name": "SumBackward0", "label": "SumBackward0", "kind": "root", "next": [(1, 0)]}, ...]``
    ``next`` holds ``(id, input_nr)`` per non-None entry of ``next_functions``, in order; an
    ``AccumulateGrad`` node's label adds its leaf's shape, e.g. ``"AccumulateGrad\\n(3, 4)"``.
    """
    start = _start_node(root)
    ids = {start: 0}
    order = [start]
    nodes = []
    i = 0
    while i < len(order):
        fn = order[i]
        name = fn.name().replace(_PREFIX, "")
        label = name
        kind = "root" if i == 0 else "op"
        if hasattr(fn, "variable"):  # AccumulateGrad: show the leaf it fills
            label = f"{name}\n{tuple(fn.variable.shape)}"
            kind = "leaf"
        nxt = []
        for next_fn, input_nr in fn.next_functions:
            if next_fn is None:
                continue
            if next_fn not in ids:
                ids[next_fn] = len(order)
                order.append(next_fn)
            nxt.append((ids[next_fn], int(input_nr)))
        nodes.append({"id": i, "name": name, "label": label, "kind": kind, "next": nxt})
        i += 1
    return nodes


def layout(nodes: list) -> dict:
    """``{id: (x, layer)}``: layer = longest path from the root; x from the barycenter ordering."""
    indegree = {n["id"]: 0 for n in nodes}
    for n in nodes:
        for j, _ in n["next"]:
            indegree[j] += 1
    layer = {0: 0}
    ready = [0]
    by_id = {n["id"]: n for n in nodes}
    while ready:  # Kahn's order: a node is placed after all its consumers
        i = ready.pop()
        for j, _ in by_id[i]["next"]:
            layer[j] = max(layer.get(j, 0), layer[i] + 1)
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    parents: dict = {n["id"]: [] for n in nodes}
    for n in nodes:
        for j, _ in n["next"]:
            parents[j].append(n["id"])
    pos: dict = {}
    for depth in range(max(layer.values()) + 1):
        row = [i for i in sorted(layer) if layer[i] == depth]
        def bary(i):
            xs = [pos[p][0] for p in parents[i] if p in pos]
            return sum(xs) / len(xs) if xs else 0.0
        row.sort(key=lambda i: (bary(i), i))
        for k, i in enumerate(row):
            pos[i] = (k - (len(row) - 1) / 2, depth)
    return pos


def _draw_on(ax, nodes: list, title: str | None) -> None:
    pos = layout(nodes)
    x_gap, y_gap = 2.6, 1.25
    ax.set_axis_off()
    for n in nodes:
        x, y = pos[n["id"]]
        targets: dict = {}  # next node -> positions k in next_functions (x * x gives two edges to one node)
        for k, (j, _input_nr) in enumerate(n["next"]):
            targets.setdefault(j, []).append(k)
        for j, ks in targets.items():
            x2, y2 = pos[j]
            start = (x * x_gap, -y * y_gap - 0.28)
            end = (x2 * x_gap, -y2 * y_gap + 0.28)
            long_edge = y2 - y > 1  # skips layers: drawn lighter, and under the boxes it passes
            ax.annotate("", xy=end, xytext=start, zorder=2,
                        arrowprops=dict(arrowstyle="-|>", color="#999999" if long_edge else "#555555",
                                        lw=0.7 if long_edge else 0.9, shrinkA=0, shrinkB=0))
            if len(n["next"]) > 1:  # label the edge with its index k in next_functions
                t = 0.3 if len(targets) > 1 else 0.5
                ax.text(start[0] + (end[0] - start[0]) * t, start[1] + (end[1] - start[1]) * t,
                        ",".join(map(str, ks)), fontsize=6.5, color="#555555", ha="center", va="center",
                        zorder=3, bbox=dict(boxstyle="round,pad=0.1", facecolor="white", edgecolor="none"))
    for n in nodes:
        x, y = pos[n["id"]]
        lines = n["label"].split("\n")
        w = max(len(s) for s in lines) * 0.105 + 0.3
        h = 0.24 * len(lines) + 0.12
        box = FancyBboxPatch((x * x_gap - w / 2, -y * y_gap - h / 2), w, h, boxstyle="round,pad=0.04",
                             facecolor=_COLORS[n["kind"]], edgecolor="#333333",
                             lw=1.2 if n["kind"] == "root" else 0.8, zorder=4)
        ax.add_patch(box)
        ax.text(x * x_gap, -y * y_gap, n["label"], ha="center", va="center", fontsize=8, family="monospace",
                zorder=5)
    xs = [p[0] * x_gap for p in pos.values()]
    depth = max(p[1] for p in pos.values())
    ax.set_xlim(min(xs) - 1.6, max(xs) + 1.6)
    ax.set_ylim(-depth * y_gap - 0.7, 0.7)
    if title:
        ax.set_title(title, fontsize=10)


def draw_graph(root, title: str | None = None, max_nodes: int = 60) -> Figure:
    """Draw the graph behind ``root`` (a tensor/Variable with a grad_fn, or a grad_fn node)."""
    return draw_graphs([(title, root)], max_nodes=max_nodes)


def draw_graphs(graphs, max_nodes: int = 60) -> Figure:
    """Side by side, e.g. ``[("torch", loss), ("mini engine", my_loss)]``: same walk, same layout."""
    if not isinstance(graphs, (list, tuple)) or not graphs:
        raise TypeError("graphs must be a non-empty list of (title, root) pairs")
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
        raise ValueError(f"max_nodes must be a positive int, got {max_nodes!r}")
    walked = []
    for item in graphs:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise TypeError(f"each entry of graphs must be a (title, root) pair, got {item!r:.60}")
        nodes = walk_graph(item[1])
        if len(nodes) > max_nodes:
            raise ValueError(f"graph {item[0]!r} has {len(nodes)} nodes, more than max_nodes={max_nodes} "
                             "can draw readably")
        walked.append((item[0], nodes))
    widths, depths = [], []
    for _, nodes in walked:
        pos = layout(nodes)
        depths.append(max(p[1] for p in pos.values()) + 1)
        widths.append(max(sum(1 for p in pos.values() if p[1] == d) for d in range(depths[-1])))
    fig = Figure(figsize=(sum(max(2.6, 2.3 * w) for w in widths) + 0.5, max(2.0, 0.95 * max(depths) + 0.6)))
    axes = fig.subplots(1, len(walked), squeeze=False, width_ratios=[max(1, w) for w in widths])[0]
    for ax, (title, nodes) in zip(axes, walked, strict=True):
        _draw_on(ax, nodes, title)
    fig.tight_layout()
    return fig
