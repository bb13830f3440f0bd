"""Training figures for the capstone: the loss curve of a run, and throughput per variant.

- ``plot_loss_curve``: the training loss of every iteration (faint) and its moving average, the
  train/val losses of each evaluation (markers), optional horizontal baselines (e.g. what a bigram
  table scores), and a second x axis in tokens seen. A widening gap between train and val is
  over-fitting; a flat curve at ln(vocab) means nothing is learned.
- ``plot_tokens_per_second``: horizontal bars of tokens/s per variant (eager, the course's kernels,
  torch.compile...), labelled with the speed-up over the first bar.

Both take plain data (``ptinternals.gpt.loop.fit``'s history dict; a {name: tokens/s} dict) and
return a ``matplotlib.figure.Figure`` without showing it.
"""
from __future__ import annotations

import math

from matplotlib.figure import Figure


def _moving_average(values, window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_loss_curve(history: dict, *, tokens_per_iter: int | None = None, baselines: dict | None = None,
                    title: str | None = None, figsize: tuple[float, float] = (8.0, 4.0)) -> Figure:
    """The loss curve of a run from its history (keys iter, loss, eval_iter, train_loss, val_loss)."""
    if not isinstance(history, dict):
        raise TypeError(f"history must be a dict (loop.fit's history), got {type(history).__name__}")
    missing = [k for k in ("iter", "loss", "eval_iter", "train_loss", "val_loss") if k not in history]
    if missing:
        raise ValueError(f"history is missing {missing}")
    if len(history["iter"]) != len(history["loss"]):
        raise ValueError("history['iter'] and history['loss'] must have the same length")
    if tokens_per_iter is not None and (not isinstance(tokens_per_iter, int) or tokens_per_iter < 1):
        raise ValueError(f"tokens_per_iter must be an int >= 1 or None, got {tokens_per_iter!r}")
    fig = Figure(figsize=figsize)
    ax = fig.add_subplot(1, 1, 1)
    iters, losses = list(history["iter"]), list(history["loss"])
    if iters:
        ax.plot([i + 1 for i in iters], losses, color="#9ab8d8", linewidth=0.6, label="train loss (each step)")
        window = max(1, len(losses) // 40)
        ax.plot([i + 1 for i in iters], _moving_average(losses, window), color="#1f5a96", linewidth=1.6,
                label=f"train loss (moving average of {window})")
    if history["eval_iter"]:
        ax.plot(history["eval_iter"], history["train_loss"], "o", color="#1f5a96", markersize=4,
                label="train loss (evaluation)")
        ax.plot(history["eval_iter"], history["val_loss"], "s-", color="#d9534f", markersize=4, linewidth=1.2,
                label="validation loss")
        last = history["val_loss"][-1]
        ax.annotate(f"val {last:.3f}", (history["eval_iter"][-1], last), textcoords="offset points",
                    xytext=(-10, 8), ha="right", fontsize=9, color="#d9534f")
    for name, value in (baselines or {}).items():
        ax.axhline(value, color="0.45", linestyle=(0, (4, 3)), linewidth=0.9)
        ax.annotate(name, (0, value), xycoords=("axes fraction", "data"), textcoords="offset points",
                    xytext=(4, 3), fontsize=8, color="0.35")
    ax.set_xlabel("iteration")
    ax.set_ylabel("cross-entropy (nats per character)")
    ys = [v for v in losses + list(history["val_loss"]) if math.isfinite(v)]
    if ys:
        ax.set_ylim(max(0.0, min(ys) - 0.2), min(max(ys), 4.6) + 0.1)
    if tokens_per_iter:
        top = ax.secondary_xaxis("top", functions=(lambda i: i * tokens_per_iter / 1e6,
                                                   lambda m: m * 1e6 / tokens_per_iter))
        top.set_xlabel("tokens seen (millions)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title or "GPT on tiny-shakespeare")
    fig.tight_layout()
    return fig


def plot_tokens_per_second(rates: dict, *, title: str | None = None,
                           figsize: tuple[float, float] = (7.0, 2.8)) -> Figure:
    """Horizontal bars: tokens/s per variant, with the speed-up over the first variant."""
    if not isinstance(rates, dict) or not rates:
        raise ValueError("rates must be a non-empty dict {variant name: tokens per second}")
    for name, value in rates.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
            raise ValueError(f"rates[{name!r}] must be a number >= 0, got {value!r}")
    names, values = list(rates), [float(v) for v in rates.values()]
    base = values[0] or 1.0
    fig = Figure(figsize=figsize)
    ax = fig.add_subplot(1, 1, 1)
    bars = ax.barh(range(len(names)), [v / 1e3 for v in values], color="#3b75af")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    for bar, v in zip(bars, values):
        ax.annotate(f"{v / 1e3:.1f}k  ({v / base:.2f}x)", (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                    textcoords="offset points", xytext=(4, 0), va="center", fontsize=8)
    ax.set_xlabel("thousand tokens per second (forward + backward + optimizer step)")
    ax.set_xlim(0, max(values) / 1e3 * 1.35 or 1)
    ax.set_title(title or "training throughput")
    fig.tight_layout()
    return fig
