"""Figures for the dispatch chapter (the dispatcher): the path of one op through its keys, and a key set's bits.

``draw_dispatch_path(steps)`` takes ``ptinternals.dispatch.explain_dispatch(...)`` output (or plain key
names) and stacks one box per kernel that ran, top to bottom, coloured by what the key is for, with the
key set each kernel was picked from. ``draw_key_set(ks)`` draws the 64-bit ``DispatchKeySet``: 16
backend bits on the right, functionality bits to their left, set bits filled - the highest filled
functionality bit is the kernel that runs next.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

CATEGORY_COLOURS = {
    "python": "#b39ddb",    # Python, PythonTLSSnapshot, PythonDispatcher, PreDispatch
    "autocast": "#81d4fa",
    "autograd": "#ffcc80",  # Autograd*, ADInplaceOrView
    "functionalize": "#f48fb1",
    "select": "#e0e0e0",    # BackendSelect and other redirecting fallbacks
    "backend": "#a5d6a7",   # CPU, CUDA, Meta, ...
}


def key_category(key: str) -> str:
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, got {type(key).__name__}")
    if key.startswith("Python") or key == "PreDispatch":
        return "python"
    if key.startswith("Autocast"):
        return "autocast"
    if key.startswith("Autograd") or key == "ADInplaceOrView":
        return "autograd"
    if key == "Functionalize":
        return "functionalize"
    if key in ("BackendSelect", "Conjugate", "Negative", "ZeroTensor", "Undefined"):
        return "select"
    return "backend"


def _steps(steps):
    out = []
    for i, s in enumerate(steps):
        if isinstance(s, str):
            out.append((s, "", "", ""))
        elif hasattr(s, "key"):
            out.append((s.key, s.kind, s.key_set, s.action))
        else:
            raise TypeError(f"steps[{i}] must be a key name or a DispatchStep, got {type(s).__name__}")
    if not out:
        raise ValueError("steps is empty: nothing ran")
    return out


def draw_dispatch_path(steps, title: str | None = None) -> Figure:
    """One box per kernel that ran (top = first), coloured by category, with key set and action."""
    rows = _steps(steps)
    n = len(rows)
    fig = Figure(figsize=(9.5, 0.95 * n + 0.9))
    ax = fig.add_subplot()
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.6, n)
    ax.axis("off")
    for i, (key, kind, ks, action) in enumerate(rows):
        y = n - 1 - i
        colour = CATEGORY_COLOURS[key_category(key)]
        ax.add_patch(FancyBboxPatch((0.1, y + 0.12), 2.6, 0.62, boxstyle="round,pad=0.02",
                                    facecolor=colour, edgecolor="black", linewidth=0.8))
        ax.text(1.4, y + 0.5, key, ha="center", va="center", fontsize=10, fontweight="bold")
        if kind:
            ax.text(1.4, y + 0.24, kind, ha="center", va="center", fontsize=7, style="italic")
        if action:
            ax.text(2.9, y + 0.56, action, ha="left", va="center", fontsize=8)
        if ks:
            ax.text(2.9, y + 0.28, ks, ha="left", va="center", fontsize=6.5, family="monospace",
                    color="#555555")
        if i < n - 1:
            ax.add_patch(FancyArrowPatch((1.4, y + 0.12), (1.4, y - 0.24), arrowstyle="-|>",
                                         mutation_scale=10, color="black", linewidth=0.8))
    handles = [FancyBboxPatch((0, 0), 1, 1, facecolor=c, edgecolor="black", label=name)
               for name, c in CATEGORY_COLOURS.items()]
    ax.legend(handles=handles, loc="lower right", fontsize=7, ncol=3, frameon=False)
    ax.set_title(title or "dispatch path (first kernel at the top)", fontsize=11)
    fig.tight_layout()
    return fig


def draw_key_set(ks, title: str | None = None) -> Figure:
    """The bits of a DispatchKeySet: backend bits (right) and functionality bits (left, priority rising
    to the left), set bits filled. ``ks`` is a ``ptinternals.dispatch.keys.DispatchKeySet``, a
    ``torch.DispatchKeySet`` or its string."""
    from ptinternals.dispatch.keys import BACKENDS, FUNCTIONALITY_KEYS, NUM_BACKENDS, DispatchKeySet

    if not isinstance(ks, DispatchKeySet):
        ks = DispatchKeySet.parse(str(ks))
    raw = ks.raw_repr()
    labels = list(BACKENDS) + list(FUNCTIONALITY_KEYS[1:])  # bit i -> label
    nbits = len(labels)
    fig = Figure(figsize=(14, 3.2))
    ax = fig.add_subplot()
    ax.set_xlim(-0.5, nbits - 0.5)
    ax.set_ylim(-0.2, 3.6)
    ax.axis("off")
    top = ks.highest_functionality_key()
    for bit, label in enumerate(labels):
        x = nbits - 1 - bit  # highest bit on the left
        on = bool(raw >> bit & 1)
        is_backend = bit < NUM_BACKENDS
        colour = ("#a5d6a7" if is_backend else "#ffcc80") if on else "white"
        edge = "red" if (not is_backend and label == top) else "black"
        ax.add_patch(FancyBboxPatch((x - 0.42, 0.1), 0.84, 0.6, boxstyle="square,pad=0", facecolor=colour,
                                    edgecolor=edge, linewidth=1.5 if edge == "red" else 0.5))
        ax.text(x, 0.78, label, rotation=90, ha="center", va="bottom", fontsize=6,
                fontweight="bold" if on else "normal", color="black" if on else "#888888")
    ax.text(nbits - 1 - (NUM_BACKENDS - 1) / 2, -0.1, "backend bits", ha="center", va="top", fontsize=8)
    ax.text((nbits - NUM_BACKENDS) / 2, -0.1, "functionality bits (priority rises to the left)",
            ha="center", va="top", fontsize=8)
    ax.set_title(title or f"{ks}  ->  next kernel: {ks.highest_priority_key()}", fontsize=9)
    fig.tight_layout()
    return fig
