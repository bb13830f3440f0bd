"""Bit layouts and dynamic ranges of floating-point formats (the amp chapter, mixed precision).

``draw_bit_layout(value)`` draws one row per format: the value rounded into that format, its sign,
exponent and mantissa bits as coloured cells, and what the bits mean. ``draw_dynamic_range()``
draws each format's range on a log2 axis (subnormals, normals, max), optionally with a histogram of
gradient magnitudes on top: the picture of why fp16 gradients underflow and bf16 ones do not.
Matplotlib only; every function returns a Figure and never calls ``plt.show()``.
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ptinternals.amp.formats import decode, encode, fields, get_format

SIGN_COLOR, EXP_COLOR, MANT_COLOR = "#e8a0a0", "#9cc3e6", "#a8d8a0"
DEFAULT_FORMATS = ("fp32", "tf32", "bf16", "fp16", "fp8_e4m3fn", "fp8_e5m2")


def _fmt_value(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.8g}"


def draw_bit_layout(value: float, formats=DEFAULT_FORMATS) -> Figure:
    """One row per format: the bits of ``value`` rounded (ties to even) into that format."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"value must be a float, got {type(value).__name__}")
    if isinstance(formats, str) or not formats:
        raise ValueError("formats must be a non-empty list of format names, e.g. ['fp32', 'bf16']")
    fmts = [get_format(f) for f in formats]
    width = max(f.bits for f in fmts)
    fig = Figure(figsize=(0.32 * width + 5.5, 0.75 * len(fmts) + 0.9))
    ax = fig.add_subplot(1, 1, 1)
    for row, f in enumerate(fmts):
        y = len(fmts) - 1 - row
        bits = encode(value, f)
        sign, exponent, mantissa, kind = fields(bits, f)
        pattern = format(bits, f"0{f.bits}b")
        for i, ch in enumerate(pattern):
            color = SIGN_COLOR if i == 0 else EXP_COLOR if i <= f.exponent_bits else MANT_COLOR
            ax.add_patch(Rectangle((i, y), 0.95, 0.8, facecolor=color, edgecolor="black", linewidth=0.5))
            ax.text(i + 0.47, y + 0.4, ch, ha="center", va="center", fontsize=8, family="monospace")
        ax.text(-0.4, y + 0.4, f.name, ha="right", va="center", fontsize=9, weight="bold")
        stored = decode(bits, f)
        if kind == "normal":
            meaning = f"(-1)^{sign} x 1.{mantissa:0{f.mantissa_bits}b}b x 2^({exponent}-{f.bias})"
        elif kind == "subnormal":
            meaning = f"(-1)^{sign} x 0.{mantissa:0{f.mantissa_bits}b}b x 2^({1 - f.bias})"
        else:
            meaning = kind
        err = (
            ""
            if math.isnan(stored) or math.isinf(stored) or value == 0
            else f"  rel.err {abs(stored - value) / abs(value):.1e}"
        )
        ax.text(
            width + 0.6,
            y + 0.4,
            f"= {_fmt_value(stored)}  [{kind}]  {meaning}{err}",
            ha="left",
            va="center",
            fontsize=8,
        )
    ax.set_xlim(-3.2, width + 22)
    ax.set_ylim(-0.3, len(fmts))
    ax.axis("off")
    ax.set_title(f"bits of {value!r}: sign (red), exponent (blue), mantissa (green)", fontsize=10)
    return fig


def draw_dynamic_range(
    formats=("fp32", "bf16", "fp16", "fp8_e4m3fn", "fp8_e5m2"), values=None, values_label: str = "|values|"
) -> Figure:
    """Each format's positive range on a log2 axis; ``values`` (e.g. gradients) as a histogram above.

    Light bar: subnormals (smallest subnormal .. smallest normal); dark bar: normals (.. max finite).
    """
    if isinstance(formats, str) or not formats:
        raise ValueError("formats must be a non-empty list of format names")
    fmts = [get_format(f) for f in formats]
    rows = 2 if values is not None else 1
    fig = Figure(figsize=(9, 0.55 * len(fmts) + (2.2 if values is not None else 0.8)))
    if rows == 2:
        axes = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, max(1.0, 0.5 * len(fmts))]})
    else:
        axes = [fig.add_subplot(1, 1, 1)]
    ax = axes[-1]
    for row, f in enumerate(fmts):
        y = len(fmts) - 1 - row
        lo, mid, hi = (math.log2(f.smallest_subnormal), math.log2(f.smallest_normal), math.log2(f.max_finite))
        ax.barh(y, mid - lo, left=lo, height=0.6, color="#c9d7ee", edgecolor="black", linewidth=0.5)
        ax.barh(y, hi - mid, left=mid, height=0.6, color="#4a78b8", edgecolor="black", linewidth=0.5)
        ax.text(hi + 1, y, f"{f.name}: 2^{lo:.0f} .. {f.max_finite:.3g}", va="center", fontsize=8)
    ax.set_yticks(range(len(fmts)), [f.name for f in reversed(fmts)])
    ax.set_xlabel("log2(|x|)")
    ax.set_xlim(-155, 185)
    if values is not None:
        import torch

        v = torch.as_tensor(values).detach().float().abs().flatten()
        v = v[(v > 0) & torch.isfinite(v)]
        hist_ax = axes[0]
        if v.numel():
            hist_ax.hist(torch.log2(v).numpy(), bins=80, color="#888888")
        n_zero = int((torch.as_tensor(values).flatten() == 0).sum())
        hist_ax.set_ylabel("count")
        hist_ax.set_title(f"{values_label} (log2); exact zeros: {n_zero}", fontsize=9)
        for f in fmts:
            if f.name == "fp16":
                hist_ax.axvline(math.log2(f.smallest_subnormal), color="red", linestyle="--", linewidth=1)
                hist_ax.text(
                    math.log2(f.smallest_subnormal) + 1,
                    hist_ax.get_ylim()[1] * 0.85,
                    "fp16 underflows left of here",
                    color="red",
                    fontsize=8,
                )
    fig.tight_layout()
    return fig
