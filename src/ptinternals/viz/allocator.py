"""Allocator figures for the allocator chapter: a memory timeline and a segment map.

- ``plot_memory_timeline``: allocated vs reserved bytes after every event of a replay (or of a
  real GPU run), with step markers, the device capacity and the OOM point. The gap between the
  two curves is memory the caching allocator holds but no tensor uses.
- ``plot_segment_map``: every segment (one cudaMalloc) as a bar tiled by its blocks, coloured by
  state: allocated, pending free (waiting on another stream), inactive inside a split segment
  (cached, but empty_cache cannot return it) and inactive whole segments (empty_cache frees these).

Both take the model's objects or the real ones: a ``ReplayResult`` / dict of series, and a
``torch.cuda.memory._snapshot()`` dict (or a model ``CachingAllocator``).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

_MiB = 1024 * 1024
COLORS = {
    "active_allocated": "#3b75af",
    "active_pending_free": "#f2a03d",
    "inactive_split": "#d9534f",
    "inactive": "#d0d0d0",
}
LABELS = {
    "active_allocated": "allocated",
    "active_pending_free": "pending free (other stream)",
    "inactive_split": "free, in a split segment (not releasable)",
    "inactive": "free segment (empty_cache releases it)",
}


def _unit(max_bytes: float) -> tuple[float, str]:
    return (1024**3, "GiB") if max_bytes >= 4 * 1024**3 else (_MiB, "MiB")


def plot_memory_timeline(
    result,
    *,
    capacity: int | None = None,
    title: str | None = None,
    figsize: tuple[float, float] = (8.0, 3.6),
) -> Figure:
    """Allocated vs reserved memory over the events of a replay.

    ``result``: a ``ReplayResult`` or a dict with lists "reserved_bytes" and "allocated_bytes"
    (optionally "steps" as a list of {"event_index": i} and "oom" as {"event_index": i}).
    """
    get = (
        (lambda k, d=None: result.get(k, d))
        if isinstance(result, dict)
        else (lambda k, d=None: getattr(result, k, d))
    )
    reserved, allocated = get("reserved_bytes"), get("allocated_bytes")
    if reserved is None or allocated is None:
        raise TypeError("result must be a ReplayResult or a dict with 'reserved_bytes' and 'allocated_bytes'")
    if len(reserved) != len(allocated):
        raise ValueError(
            f"reserved_bytes ({len(reserved)}) and allocated_bytes ({len(allocated)}) differ in length"
        )
    top = max([*reserved, *allocated, capacity or 0, 1])
    scale, unit = _unit(top)
    x = list(range(len(reserved)))
    fig = Figure(figsize=figsize)
    ax = fig.add_subplot(1, 1, 1)
    r = [v / scale for v in reserved]
    a = [v / scale for v in allocated]
    ax.fill_between(x, r, step="post", color="#f4c7a1", alpha=0.6, label="reserved (segments)")
    ax.step(x, r, where="post", color="#c96a1b", lw=1.4)
    ax.step(x, a, where="post", color=COLORS["active_allocated"], lw=1.4, label="allocated (tensors)")
    for s in get("steps", []) or []:
        ax.axvline(s["event_index"], color="#999999", lw=0.6, ls=":")
    if capacity:
        ax.axhline(
            capacity / scale, color="black", lw=1.0, ls="--", label=f"capacity {capacity / scale:.0f} {unit}"
        )
    oom = get("oom")
    if oom:
        ax.axvline(oom["event_index"], color="#b00020", lw=1.5, label=f"OOM at event {oom['event_index']}")
    ax.set_xlabel("event")
    ax.set_ylabel(unit)
    ax.set_xlim(0, max(len(x), 1))
    ax.set_ylim(0, top / scale * 1.08)
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    ax.set_title(title or "memory_allocated() vs memory_reserved()", fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def _segments_of(obj) -> list[dict]:
    if hasattr(obj, "snapshot") and callable(obj.snapshot):
        obj = obj.snapshot()
    if isinstance(obj, dict):
        obj = obj.get("segments")
    if not isinstance(obj, list):
        raise TypeError("expected a snapshot dict, a list of snapshot segments, or a CachingAllocator")
    return obj


def plot_segment_map(
    snapshot, *, scale: str = "bytes", max_segments: int = 40, title: str | None = None, width: float = 8.0
) -> Figure:
    """One bar per segment (sorted by address), tiled by its blocks and coloured by block state.

    ``scale="bytes"`` draws bars to a common byte scale (big segments look big);
    ``scale="fraction"`` stretches every segment to full width (to see inside small ones).
    """
    if scale not in ("bytes", "fraction"):
        raise ValueError(f"scale must be 'bytes' or 'fraction', got {scale!r}")
    if isinstance(max_segments, bool) or not isinstance(max_segments, int) or max_segments < 1:
        raise ValueError(f"max_segments must be a positive int, got {max_segments!r}")
    segments = sorted(_segments_of(snapshot), key=lambda s: s["address"])
    shown = segments[:max_segments]
    n = max(len(shown), 1)
    height = 1.3 + 0.32 * n  # inches: title + legend + one row per segment
    fig = Figure(figsize=(width, height))
    ax = fig.add_subplot(1, 1, 1)
    biggest = max([s["total_size"] for s in shown] + [1])
    unit_scale, unit = _unit(biggest)
    used = set()
    for row, seg in enumerate(shown):
        y = n - 1 - row
        split = len(seg["blocks"]) > 1
        offset = 0
        for b in seg["blocks"]:
            state = b["state"]
            if state == "inactive" and split:
                state = "inactive_split"
            used.add(state)
            if scale == "bytes":
                left, w = offset / unit_scale, b["size"] / unit_scale
            else:
                left, w = offset / seg["total_size"], b["size"] / seg["total_size"]
            ax.barh(y, w, left=left, height=0.72, color=COLORS[state], edgecolor="white", linewidth=0.6)
            offset += b["size"]
        kind = seg.get("segment_type", "?")
        stream = seg.get("stream", 0)
        label = f"{seg['total_size'] / _MiB:.0f} MiB {kind}" + (f" s{stream % 1000}" if stream else "")
        ax.text(-0.01, y, label, transform=ax.get_yaxis_transform(), ha="right", va="center", fontsize=7)
    ax.set_yticks([])
    ax.set_xlabel(unit if scale == "bytes" else "fraction of segment")
    if scale == "bytes":
        ax.set_xlim(0, biggest / unit_scale * 1.02)
    else:
        ax.set_xlim(0, 1)
    ax.set_ylim(-0.6, n - 0.4)
    order = ["active_allocated", "active_pending_free", "inactive_split", "inactive"]
    handles = [Patch(color=COLORS[s], label=LABELS[s]) for s in order if s in used]
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=7, frameon=False)
    more = f" (first {len(shown)} of {len(segments)})" if len(segments) > len(shown) else ""
    reserved = sum(s["total_size"] for s in segments)
    allocated = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated")
    noun = "segment" if len(segments) == 1 else "segments"
    ax.set_title(
        title
        or f"{len(segments)} {noun}{more}: {reserved / _MiB:.0f} MiB reserved, "
        f"{allocated / _MiB:.0f} MiB allocated",
        fontsize=10,
    )
    ax.spines[["top", "right", "left"]].set_visible(False)
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1))  # leave 0.45 in at the bottom for the legend
    return fig
