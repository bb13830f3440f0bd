"""Roofline plots for the kernels chapter: arithmetic intensity against achieved FLOP/s.

Axes are log-log. The roof is ``min(peak_flops, intensity * bandwidth)``: a sloped bandwidth line
meeting a flat compute line at the ridge point. Each kernel is one point (filled: ours; hollow, same
colour: torch's op timed in the same run, at the same intensity since it does the same work), so the
distance from a point up to the roof is what is left to gain. The H200's datasheet roof is drawn
dashed; a measured roof (``ptinternals.benchmark.measure_peaks``) solid when given.
"""
from __future__ import annotations

from typing import Iterable

import matplotlib
from matplotlib.figure import Figure

from ..benchmark import Measurement, Peaks
from ..kernels.costs import H200_PEAKS, ridge_point


def _draw_roof(ax, peaks: Peaks, x_lo: float, x_hi: float, style: str, label: str, text_dy: int) -> None:
    ridge = ridge_point(peaks)
    xs = [x_lo, ridge, max(x_hi, ridge * 1.01)]
    ys = [x_lo * peaks.bytes_per_s, peaks.flops, peaks.flops]
    ax.plot(xs, ys, style, color="0.25", linewidth=1.6, label=label)
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, peaks.flops), textcoords="offset points",
                xytext=(4, text_dy), fontsize=8, color="0.25")


def roofline_figure(measurements: Iterable[Measurement], peaks: Peaks | None = None, *,
                    show_h200: bool = True, title: str | None = None) -> Figure:
    """One point per measurement (needs ``bytes_moved`` and ``flops``), under the roofs.

    ``peaks``: the ceilings measured in this run (solid roof); ``show_h200``: also the H200's
    datasheet roof (dashed). Returns a matplotlib Figure; nothing is shown.
    """
    ms = list(measurements)
    for m in ms:
        if not isinstance(m, Measurement):
            raise TypeError(f"measurements must be Measurement objects, got {type(m).__name__}")
        if not m.bytes_moved or not m.flops or not m.ms > 0:
            raise ValueError(f"measurement {m.name!r} needs bytes_moved, flops and ms > 0 to be placed")
    if peaks is not None and not isinstance(peaks, Peaks):
        raise TypeError(f"peaks must be a Peaks or None, got {type(peaks).__name__}")
    if peaks is None and not show_h200:
        raise ValueError("nothing to draw a roof from: pass peaks or keep show_h200=True")

    fig = Figure(figsize=(7.5, 5.0), layout="constrained")
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    intensities = [m.flops / m.bytes_moved for m in ms]
    roofs = ([H200_PEAKS] if show_h200 else []) + ([peaks] if peaks is not None else [])
    x_lo = min(intensities + [ridge_point(r) for r in roofs]) / 4
    x_hi = max(intensities + [ridge_point(r) for r in roofs]) * 4
    if show_h200:
        _draw_roof(ax, H200_PEAKS, x_lo, x_hi, "--", "H200 datasheet roof", text_dy=5)
    if peaks is not None:
        _draw_roof(ax, peaks, x_lo, x_hi, "-", f"measured roof ({peaks.how})", text_dy=-14)

    palette = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (m, x) in enumerate(zip(ms, intensities, strict=True)):
        color = palette[i % len(palette)]
        y = m.flops / (m.ms * 1e-3)
        label = f"{m.name} {m.dtype}"
        ax.scatter([x], [y], color=color, s=40, zorder=3, label=label)
        if m.torch_ms:
            ax.scatter([x], [m.flops / (m.torch_ms * 1e-3)], facecolors="none", edgecolors=color,
                       s=60, zorder=3)
        ax.annotate(m.name, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlim(x_lo, x_hi)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of HBM traffic)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(title or f"Roofline: {len(ms)} kernel(s) on {ms[0].device if ms else '?'}"
                 " (filled: Triton, hollow: torch)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower right")
    return fig
