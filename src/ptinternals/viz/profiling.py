"""Profiling figures: a trace as host and device rows, and the simulated overlap timeline.

- ``plot_trace_timeline``: a Chrome/Perfetto trace (``prof.export_chrome_trace``) drawn the way
  Perfetto shows it: one band per host thread, with nested ops stacked one lane per depth, and one
  row per device stream (kernels, copies, memsets). The book renders a real CPU trace; the GPU check
  renders a CUDA one, where the gaps between kernels are the time the GPU waited for the host.
- ``plot_simulated_timeline``: a ``SimulatedDevice`` after a run: the host's launch calls on one row,
  each stream's kernels and copies on its own row; overlap (or the lack of it) is visible at a glance.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ptinternals.profiling.trace_analysis import DEVICE_CATEGORIES, build_tree, complete_events, load_trace

COLORS = {
    "user_annotation": "#9bbbd9", "cpu_op": "#3b75af", "cuda_runtime": "#f2a03d", "cuda_driver": "#f2a03d",
    "python_function": "#c7c7c7", "kernel": "#5aa469", "gpu_memcpy": "#d9534f", "gpu_memset": "#b07aa1",
    # simulated device
    "host": "#9bbbd9", "launch": "#f2a03d", "h2d": "#d9534f", "d2h": "#b07aa1", "event": "#333333",
    "wait": "#dddddd",
}
LABELS = {
    "user_annotation": "record_function range", "cpu_op": "ATen op (host)", "cuda_runtime": "CUDA runtime call",
    "python_function": "Python frame", "kernel": "kernel", "gpu_memcpy": "copy", "gpu_memset": "memset",
    "host": "host: Python work", "launch": "host: launch / copy call", "wait": "host: waiting for the device",
    "h2d": "host-to-device copy", "d2h": "device-to-host copy",
}


def _depths(events) -> dict[int, int]:
    depth = {}
    for e in sorted(events, key=lambda ev: (ev.ts, -ev.end)):
        depth[id(e)] = 0 if e.parent is None else depth[id(e.parent)] + 1
    return depth


def plot_trace_timeline(trace, *, max_depth: int = 4, window: tuple[float, float] | None = None,
                        title: str | None = None, width: float = 9.0, label_min_frac: float = 0.06) -> Figure:
    """Host threads (nested ops, one lane per depth) and device streams of a trace, on one time axis.

    ``window``: (start, end) in microseconds from the first event, to zoom in. Ops narrower than
    ``label_min_frac`` of the window get no text."""
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
        raise ValueError(f"max_depth must be an int >= 1, got {max_depth!r}")
    data = load_trace(trace)
    host_cats = ("user_annotation", "cpu_op", "cuda_runtime", "cuda_driver")
    host = complete_events(data, host_cats)
    device = complete_events(data, DEVICE_CATEGORIES)
    if not host and not device:
        raise ValueError("the trace has no host ops and no device activity to draw")
    build_tree(host)
    depth = _depths(host)
    t0 = min(e.ts for e in host + device)
    lo, hi = window if window is not None else (0.0, max(e.end for e in host + device) - t0)
    if not hi > lo:
        raise ValueError(f"window must have end > start, got {window}")
    rows: list[tuple[str, list, int | None]] = []  # (label, events, lane depth or None)
    for thread in sorted({(e.pid, e.tid) for e in host}, key=str):
        evs = [e for e in host if (e.pid, e.tid) == thread]
        lanes = min(max_depth, 1 + max(depth[id(e)] for e in evs))
        for d in range(lanes):
            rows.append((f"host {thread[1]}" if d == 0 else "", [e for e in evs if depth[id(e)] == d], d))
    for stream in sorted({(e.pid, e.tid) for e in device}, key=str):
        rows.append((f"GPU stream {stream[1]}", [e for e in device if (e.pid, e.tid) == stream], None))
    fig = Figure(figsize=(width, 1.1 + 0.3 * len(rows)))
    ax = fig.add_subplot(1, 1, 1)
    used = set()
    span = hi - lo
    for i, (label, evs, _) in enumerate(rows):
        y = len(rows) - 1 - i
        for e in evs:
            s, f = e.ts - t0, e.end - t0
            if f < lo or s > hi:
                continue
            used.add(e.cat)
            ax.barh(y, max(f - s, span * 1e-4), left=s, height=0.8, color=COLORS.get(e.cat, "#888888"),
                    edgecolor="white", linewidth=0.3)
            if (min(f, hi) - max(s, lo)) > label_min_frac * span:
                name = e.name.replace("aten::", "")
                ax.text(max(s, lo) + span * 0.004, y, name[:28], va="center", ha="left", fontsize=6, color="white",
                        clip_on=True)
        ax.text(-0.01, y, label, transform=ax.get_yaxis_transform(), ha="right", va="center", fontsize=7)
    ax.set_xlim(lo, hi)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_yticks([])
    ax.set_xlabel("microseconds since the first event")
    handles = [Patch(color=COLORS[c], label=LABELS.get(c, c)) for c in COLORS if c in used]
    if handles:
        fig.legend(handles=handles, loc="lower center", fontsize=7, frameon=False, ncol=min(4, len(handles)))
    ax.set_title(title or "profiler trace: host rows (nesting = call depth) and device streams", fontsize=10)
    ax.spines[["top", "right", "left"]].set_visible(False)
    fig.tight_layout(rect=(0, 0.35 / fig.get_figheight(), 1, 1))
    return fig


def plot_simulated_timeline(device, *, title: str | None = None, width: float = 9.0,
                            until: float | None = None) -> Figure:
    """The host's calls and each stream's work on a ``SimulatedDevice`` (microseconds)."""
    records = [r for r in device.records if r.kind != "event"]
    if not records:
        raise ValueError("the simulated device has run nothing yet")
    streams = sorted({r.stream for r in records if r.stream >= 0})
    rows = ["host"] + [f"stream {s}" + (" (default)" if s == 0 else "") for s in streams]
    fig = Figure(figsize=(width, 1.2 + 0.45 * len(rows)))
    ax = fig.add_subplot(1, 1, 1)
    end = until if until is not None else max(max(r.end for r in records), device.host_time)
    used = set()
    for r in records:
        y_host = len(rows) - 1
        if r.stream < 0:  # host-only records: Python work and waits
            ax.barh(y_host, r.end - r.start, left=r.start, height=0.6, color=COLORS[r.kind], edgecolor="white",
                    linewidth=0.3, hatch="//" if r.kind == "wait" else None)
            used.add(r.kind)
            continue
        if r.launch_end > r.launch_start:
            ax.barh(y_host, r.launch_end - r.launch_start, left=r.launch_start, height=0.6, color=COLORS["launch"],
                    edgecolor="white", linewidth=0.3)
            used.add("launch")
        kind = "kernel" if r.kind == "kernel" else r.kind
        y = len(rows) - 2 - streams.index(r.stream)
        if r.end > r.start:
            ax.barh(y, r.end - r.start, left=r.start, height=0.6, color=COLORS[kind], edgecolor="white", linewidth=0.3)
            used.add(kind)
            if (r.end - r.start) > 0.05 * end:
                ax.text(r.start + 0.005 * end, y, r.name[:22], va="center", ha="left", fontsize=6, color="white",
                        clip_on=True)
    for i, label in enumerate(rows):
        ax.text(-0.01, len(rows) - 1 - i, label, transform=ax.get_yaxis_transform(), ha="right", va="center",
                fontsize=8)
    ax.set_xlim(0, end)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_yticks([])
    ax.set_xlabel("microseconds (simulated)")
    handles = [Patch(color=COLORS[c], label=LABELS.get(c, c))
               for c in ("host", "launch", "wait", "kernel", "h2d", "d2h") if c in used]
    if handles:
        fig.legend(handles=handles, loc="lower center", fontsize=7, frameon=False, ncol=min(3, len(handles)))
    ax.set_title(title or "simulated device: host calls and stream work", fontsize=10)
    ax.spines[["top", "right", "left"]].set_visible(False)
    fig.tight_layout(rect=(0, 0.5 / fig.get_figheight(), 1, 1))
    return fig
