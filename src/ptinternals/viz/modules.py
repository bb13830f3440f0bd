"""Figures for the modules chapter: the module tree, and hook calls on a timeline.

- ``describe_tree``/``draw_module_tree``: every module of a tree (a shared instance once, with its
  other names), its parameters (shape; frozen; tied to an earlier name; None slots), its buffers
  (dtype; persistent or not) and how many hooks of each kind it holds. What ``state_dict`` will save
  is what is drawn solid: non-persistent buffers and None slots are drawn faint.
- ``trace_hook_calls``/``draw_hook_timeline``: put a recording hook of each kind on every module, run
  one forward and one backward, and draw each module call as a span on its own row: from its forward
  pre-hook to its forward hook, then, in the backward half, from its backward pre-hook to its
  backward hook. Nesting shows as spans inside spans; the backward half is the forward mirrored.

Both work on ``torch.nn.Module`` and on ``ptinternals.modules.MiniModule`` trees: they read only the
attributes the two share (``_modules``, ``_parameters``, ``_buffers``, ``_non_persistent_buffers_set``,
the hook tables) and call only the public hook API.
"""
from __future__ import annotations

import warnings

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

__all__ = ["describe_tree", "draw_module_tree", "trace_hook_calls", "draw_hook_timeline"]

COLORS = {"param": "#2f6db5", "frozen": "#8a8a8a", "buffer": "#2e8b57", "faint": "#b9b9b9", "hook": "#d9822b",
          "box": "#f6f4ec", "edge": "#444444"}
PHASE_COLORS = {"forward": "#cfe3f7", "backward": "#f7d9c4"}
HOOK_KINDS = (("_forward_pre_hooks", "pre"), ("_forward_hooks", "fwd"), ("_backward_pre_hooks", "bwd-pre"),
              ("_backward_hooks", "bwd"))


def _check_module(model) -> None:
    for attr in ("_modules", "_parameters", "_buffers", "named_modules"):
        if not hasattr(model, attr):
            raise TypeError(f"model must be a torch.nn.Module or a MiniModule, got {type(model).__name__}")


def _shape(t) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ("," if t.dim() == 1 else "") + ")"


def describe_tree(model) -> list[dict]:
    """The tree as plain data, pre-order, one entry per module *instance*::

        {"path": "block", "cls": "Block", "depth": 1, "parent": 0, "aliases": ["again"],
         "params": [{"name": "proj", "shape": "(3, 3)", "frozen": False, "tied_to": None, "none": False}],
         "buffers": [{"name": "cache", "shape": "(3,)", "dtype": "float32", "persistent": False, "none": False}],
         "hooks": {"pre": 0, "fwd": 1, "bwd-pre": 0, "bwd": 0}}

    ``tied_to`` names where the same Parameter object was met first (in ``named_parameters`` order).
    """
    _check_module(model)
    first_name: dict = {}  # id(tensor) -> first full name
    nodes: list[dict] = []
    index: dict = {}  # id(module) -> position in nodes

    def visit(module, path: str, depth: int, parent):
        if id(module) in index:  # a shared instance: note the alias, do not walk it again
            nodes[index[id(module)]]["aliases"].append(path)
            return
        index[id(module)] = len(nodes)
        entry = {"path": path, "cls": type(module).__name__, "depth": depth, "parent": parent, "aliases": [],
                 "params": [], "buffers": [],
                 "hooks": {label: len(getattr(module, attr, {})) for attr, label in HOOK_KINDS}}
        nodes.append(entry)
        for name, p in module._parameters.items():
            full = f"{path}.{name}" if path else name
            if p is None:
                entry["params"].append({"name": name, "shape": "None", "frozen": False, "tied_to": None, "none": True})
                continue
            tied = first_name.setdefault(id(p), full)
            entry["params"].append({"name": name, "shape": _shape(p), "frozen": not p.requires_grad,
                                    "tied_to": None if tied == full else tied, "none": False})
        non_persistent = getattr(module, "_non_persistent_buffers_set", set())
        for name, b in module._buffers.items():
            entry["buffers"].append({"name": name, "shape": "None" if b is None else _shape(b),
                                     "dtype": "" if b is None else str(b.dtype).replace("torch.", ""),
                                     "persistent": name not in non_persistent, "none": b is None})
        me = index[id(module)]
        for name, child in module._modules.items():
            if child is not None:
                visit(child, f"{path}.{name}" if path else name, depth + 1, me)

    visit(model, "", 0, None)
    return nodes


def _lines(node: dict) -> list[tuple[str, str]]:
    """(text, color) lines of one module's box."""
    title = (node["path"] or "(root)") + ": " + node["cls"]
    if node["aliases"]:
        title += "   also as " + ", ".join(node["aliases"])
    lines = [(title, "#111111")]
    for p in node["params"]:
        if p["none"]:
            lines.append((f"  param {p['name']} = None", COLORS["faint"]))
        elif p["tied_to"]:
            lines.append((f"  param {p['name']} {p['shape']}  tied to {p['tied_to']}", COLORS["param"]))
        else:
            lines.append((f"  param {p['name']} {p['shape']}" + ("  frozen" if p["frozen"] else ""),
                          COLORS["frozen"] if p["frozen"] else COLORS["param"]))
    for b in node["buffers"]:
        text = f"  buffer {b['name']} {b['shape']} {b['dtype']}" + ("" if b["persistent"] else "  not saved")
        lines.append((text, COLORS["buffer"] if b["persistent"] and not b["none"] else COLORS["faint"]))
    hooks = "  ".join(f"{k}x{n}" for k, n in node["hooks"].items() if n)
    if hooks:
        lines.append(("  hooks: " + hooks, COLORS["hook"]))
    return lines


def draw_module_tree(model, title: str | None = None) -> Figure:
    """An indented tree of boxes, one per module instance, parent to child connectors."""
    nodes = describe_tree(model)
    line_h, indent, gap = 0.3, 0.6, 0.25
    boxes, y = [], 0.0
    for node in nodes:
        lines = _lines(node)
        h = line_h * len(lines) + 0.15
        w = max(len(text) for text, _ in lines) * 0.105 + 0.3
        boxes.append((node["depth"] * indent, y, w, h, lines))
        y -= h + gap
    width = max(x + w for x, _, w, _, _ in boxes) + 0.3
    fig = Figure(figsize=(max(4.0, width * 0.9), max(1.5, -y * 0.62)))
    ax = fig.subplots()
    ax.set_axis_off()
    for node, (x, top, w, h, lines) in zip(nodes, boxes):
        if node["parent"] is not None:  # elbow from the parent's left edge down to this box
            px, ptop, _, ph, _ = boxes[node["parent"]]
            ax.plot([px + 0.15, px + 0.15, x], [ptop - ph, top - h / 2, top - h / 2], color=COLORS["edge"], lw=0.8,
                    zorder=1)
        ax.add_patch(FancyBboxPatch((x, top - h), w, h, boxstyle="round,pad=0.02", facecolor=COLORS["box"],
                                    edgecolor=COLORS["edge"], lw=0.8, zorder=2))
        for k, (text, color) in enumerate(lines):
            ax.text(x + 0.1, top - 0.08 - (k + 0.5) * line_h, text, fontsize=8, family="monospace", color=color,
                    va="center", ha="left", zorder=3, weight="bold" if k == 0 else "normal")
    ax.set_xlim(-0.1, width)
    ax.set_ylim(y, 0.2)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def trace_hook_calls(model, *inputs, backward: bool = True) -> list[dict]:
    """Record every module hook call of one forward (and backward of ``output.sum()``).

    Returns ``[{"step": 0, "phase": "forward", "kind": "pre", "module": "block", "depth": 1}, ...]``;
    ``kind`` is ``pre``/``fwd`` (forward pre-hook / forward hook) or ``bwd-pre``/``bwd``. The tracing
    hooks are removed before returning (also when forward raises).
    """
    _check_module(model)
    if not isinstance(backward, bool):
        raise TypeError(f"backward must be a bool, got {backward!r}")
    events: list[dict] = []
    handles = []
    names = {id(m): (name, name.count(".") + 1 if name else 0) for name, m in model.named_modules()}

    def recorder(kind: str, phase: str):
        def hook(module, *args):
            name, depth = names.get(id(module), ("?", 0))
            events.append({"step": len(events), "phase": phase, "kind": kind, "module": name, "depth": depth})
        return hook

    try:
        for _, module in model.named_modules():
            handles.append(module.register_forward_pre_hook(recorder("pre", "forward")))
            handles.append(module.register_forward_hook(recorder("fwd", "forward")))
            if backward:
                handles.append(module.register_full_backward_pre_hook(recorder("bwd-pre", "backward")))
                handles.append(module.register_full_backward_hook(recorder("bwd", "backward")))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Full backward hook is firing ... no inputs require gradients"
            out = model(*inputs)
            if backward:
                if not getattr(out, "requires_grad", False):
                    raise ValueError("backward=True needs an output that requires grad (a tensor computed from "
                                     "parameters or inputs that require grad)")
                out.sum().backward()
    finally:
        for h in handles:
            h.remove()
    return events


def _spans(events: list[dict]) -> list[tuple]:
    """``(module, phase, start_step, end_step)`` per call: a pre-hook opens a span, the matching hook closes it."""
    open_: dict = {}
    spans = []
    for e in events:
        key = (e["module"], e["phase"])
        if e["kind"] in ("pre", "bwd-pre"):
            open_.setdefault(key, []).append(e["step"])
        elif open_.get(key):
            spans.append((e["module"], e["phase"], open_[key].pop(), e["step"]))
    for (module, phase), starts in open_.items():  # a pre-hook whose hook never fired
        spans.extend((module, phase, s, s) for s in starts)
    return spans


def draw_hook_timeline(events: list[dict], title: str | None = None) -> Figure:
    """One row per module (in order of first call), one bar per call from pre-hook to hook."""
    if not isinstance(events, list) or not events:
        raise ValueError("events must be a non-empty list (from trace_hook_calls)")
    for k, e in enumerate(events):
        if not isinstance(e, dict) or not {"step", "phase", "kind", "module"} <= set(e):
            raise TypeError(f"events[{k}] must be a dict with step, phase, kind and module, got {e!r:.80}")
    rows: list[str] = []
    for e in events:
        if e["module"] not in rows:
            rows.append(e["module"])
    n = len(events)
    fig = Figure(figsize=(min(14.0, max(5.0, 0.32 * n + 2.0)), 0.45 * len(rows) + 1.3))
    ax = fig.subplots()
    backward_start = next((e["step"] for e in events if e["phase"] == "backward"), None)
    if backward_start is not None:
        ax.axvspan(backward_start - 0.5, n - 0.5, color="#fbf1ea", zorder=0)
        ax.axvline(backward_start - 0.5, color="#999999", lw=0.8, ls="--", zorder=1)
        ax.text(backward_start - 0.3, -0.9, "backward", fontsize=8, color="#a0522d", va="bottom")
    ax.text(-0.3, -0.9, "forward", fontsize=8, color="#2f6db5", va="bottom")
    for module, phase, start, end in _spans(events):
        y = rows.index(module)
        ax.barh(y, end - start + 0.6, left=start - 0.3, height=0.55, color=PHASE_COLORS[phase],
                edgecolor="#555555", lw=0.7, zorder=2)
    markers = {"pre": ">", "fwd": "<", "bwd-pre": ">", "bwd": "<"}
    for e in events:
        ax.plot(e["step"], rows.index(e["module"]), marker=markers.get(e["kind"], "o"), color="#333333", ms=4,
                zorder=3)
    ax.set_yticks(range(len(rows)), [r or "(root)" for r in rows], fontsize=8, family="monospace")
    ax.set_ylim(len(rows) - 0.4, -1.0)
    ax.set_xlim(-0.8, n - 0.2)
    ax.set_xlabel("hook call number  (> pre-hook, < hook)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
