"""Which storage cells a view touches: the strides chapter's picture.

Top: the flat storage, one cell per element, coloured by the row of the view that reads it (grey:
never read; a number in the corner: read several times, i.e. stride 0). Bottom: the view as a grid
whose cells show the storage index each element reads. Works for torch tensors and for
``ptinternals``-style ``(shape, strides, offset)`` triples.
"""
from __future__ import annotations

from collections import Counter
from itertools import product

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle


def _layout_of(view):
    if hasattr(view, "stride") and callable(view.stride):  # a torch.Tensor
        storage_len = view.untyped_storage().nbytes() // view.element_size()
        return tuple(view.shape), tuple(view.stride()), view.storage_offset(), storage_len
    if hasattr(view, "strides") and hasattr(view, "storage"):  # a StridedTensor
        return view.shape, view.strides, view.offset, len(view.storage)
    raise TypeError(f"draw_view needs a torch.Tensor or a StridedTensor, got {type(view).__name__}")


def draw_view(view, title: str | None = None, storage_len: int | None = None, max_cells: int = 64) -> Figure:
    """Draw ``view`` over its storage. 0-d and 1-d views show as one row; n-d as rows x last dim."""
    shape, strides, offset, n_storage = _layout_of(view)
    n_storage = storage_len or n_storage
    if n_storage > max_cells:
        raise ValueError(f"storage of {n_storage} elements is too long to draw (max_cells={max_cells})")
    rows_shape = shape[:-1] if len(shape) > 1 else ()
    cols = shape[-1] if shape else 1
    rows = list(product(*(range(s) for s in rows_shape)))
    positions = {}  # (row, col) -> storage index
    for r, prefix in enumerate(rows):
        for c in range(cols):
            idx = prefix + ((c,) if shape else ())
            positions[(r, c)] = offset + sum(i * s for i, s in zip(idx, strides))
    reads = Counter(positions.values())
    cmap = _palette(max(len(rows), 1))

    fig = Figure(figsize=(max(6, 0.42 * n_storage + 1), 1.6 + 0.45 * max(len(rows), 1)))
    ax = fig.add_subplot(1, 1, 1)
    ax.set_axis_off()
    top = len(rows) + 1.6
    ax.text(-0.2, top + 0.5, "storage", ha="right", va="center", fontsize=9)
    row_of = {}
    for (r, _c), p in positions.items():
        row_of.setdefault(p, r)
    for p in range(n_storage):
        colour = cmap[row_of[p]] if p in row_of else "#eeeeee"
        ax.add_patch(Rectangle((p, top), 1, 1, facecolor=colour, edgecolor="black", lw=0.6))
        ax.text(p + 0.5, top + 0.5, str(p), ha="center", va="center", fontsize=8)
        if reads.get(p, 0) > 1:
            ax.text(p + 0.95, top + 0.95, f"x{reads[p]}", ha="right", va="top", fontsize=6, color="darkred")
    ax.text(-0.2, len(rows) / 2 if rows else 0.5, "view", ha="right", va="center", fontsize=9)
    for (r, c), p in positions.items():
        y = len(rows) - 1 - r
        ax.add_patch(Rectangle((c, y), 1, 1, facecolor=cmap[r], edgecolor="black", lw=0.6))
        ax.text(c + 0.5, y + 0.5, str(p), ha="center", va="center", fontsize=8)
    ax.set_xlim(-1.5, max(n_storage, cols) + 0.5)
    ax.set_ylim(-0.3, top + 1.4)
    ax.set_aspect("equal")
    ax.set_title(title or f"shape {tuple(shape)}  strides {tuple(strides)}  offset {offset}", fontsize=10)
    return fig


def _palette(n: int) -> list[str]:
    base = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5", "#bc80bd", "#ccebc5"]
    return [base[i % len(base)] for i in range(n)]
