"""Pictures for the distributed chapter (data parallelism): the ring all-reduce, DDP's overlap, FSDP's memory.

- :func:`plot_ring_all_reduce`: one row per step, each rank's N chunks coloured by how many ranks'
  data they already sum, the chunk each rank sends at the next step outlined.
- :func:`plot_ddp_timeline`: from ``DistributedDataParallel.timeline``, when each gradient became
  ready, when each bucket's all-reduce was launched and finished, and where backward ended.
- :func:`plot_fsdp_memory`: live full-parameter bytes over FSDP's all-gathers and reshards.

Every function returns a ``matplotlib.figure.Figure`` and never calls ``plt.show()``.
"""
from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle


def plot_ring_all_reduce(world_size: int = 4) -> Figure:
    """The 2(N-1) steps of a ring all-reduce of N chunks over N ranks."""
    from ptinternals.distributed.ring import ring_contributions, ring_schedule

    if not isinstance(world_size, int) or isinstance(world_size, bool):
        raise TypeError(f"world_size must be an int, got {type(world_size).__name__}")
    if not 2 <= world_size <= 8:
        raise ValueError(f"world_size must be in [2, 8] for a readable picture, got {world_size}")
    n = world_size
    states, steps = ring_contributions(n), ring_schedule(n)
    letters = "abcdefgh"  # rank r's data is letter r: chunk 2 of rank 1's tensor is "b2"
    gap, rows = 1.0, len(states)
    fig = Figure(figsize=(2.5 + 0.6 * (n * n + gap * (n - 1)), 0.6 * rows + 1.2))
    ax = fig.add_subplot(1, 1, 1)
    cmap = matplotlib.colormaps["Blues"]
    row_titles = []
    for k, state in enumerate(states):
        y = rows - 1 - k
        for r in range(n):
            x0 = r * (n + gap)
            for c in range(n):
                have = state[r][c]
                ax.add_patch(Rectangle((x0 + c, y), 0.95, 0.8, facecolor=cmap(0.15 + 0.7 * len(have) / n),
                                       edgecolor="black", linewidth=0.5))
                label = "+".join(f"{letters[s]}{c}" for s in sorted(have)) if len(have) < n else f"Σ{c}"
                ax.text(x0 + c + 0.475, y + 0.4, label, ha="center", va="center",
                        fontsize=7 if len(have) < 3 else 6, color="white" if len(have) == n else "black")
            if k < len(steps):  # outline what this rank sends next
                c = steps[k]["send"][r]
                ax.add_patch(Rectangle((x0 + c, y), 0.95, 0.8, fill=False, edgecolor="crimson", linewidth=2))
        if k == 0:
            row_titles.append("start")
        else:
            st = steps[k - 1]
            row_titles.append(f"after {st['phase']} {st['step'] + 1}")
    for r in range(n):
        ax.text(r * (n + gap) + n / 2, rows + 0.1, f"rank {r}", ha="center", va="bottom", fontsize=9,
                fontweight="bold")
        if r < n - 1:
            ax.add_patch(FancyArrowPatch((r * (n + gap) + n, rows + 0.3), ((r + 1) * (n + gap), rows + 0.3),
                                         arrowstyle="->", mutation_scale=10, color="crimson"))
    ax.set_xlim(-0.2, n * (n + gap) - gap + 0.2)
    ax.set_ylim(-0.3, rows + 0.8)
    ax.set_yticks([rows - 1 - k + 0.4 for k in range(rows)])
    ax.set_yticklabels(row_titles, fontsize=8)
    ax.set_xticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(left=False)
    ax.set_title(f"Ring all-reduce over {n} ranks. Red outline: the chunk each rank sends to its right\n"
                 f"neighbour next (rank {n - 1} sends to rank 0). Darker: more ranks summed in.", fontsize=9)
    fig.tight_layout()
    return fig


def plot_ddp_timeline(timeline, title: str = "DDP: bucket all-reduces overlap backward") -> Figure:
    """Draw ``DistributedDataParallel.timeline`` ((event, seconds, index) tuples of one iteration)."""
    if not isinstance(timeline, (list, tuple)) or not timeline:
        raise ValueError("timeline must be a non-empty list of (event, time, index) tuples")
    for i, ev in enumerate(timeline):
        if not (isinstance(ev, (list, tuple)) and len(ev) == 3 and isinstance(ev[0], str)):
            raise ValueError(f"timeline[{i}] must be an (event: str, time: float, index: int) tuple, "
                             f"got {ev!r}")
    t0 = min(t for _, t, _ in timeline)
    ms = lambda t: (t - t0) * 1e3  # noqa: E731
    ready = [(ms(t), i) for e, t, i in timeline if e == "grad_ready"]
    launch = {i: ms(t) for e, t, i in timeline if e == "bucket_launch"}
    done = {i: ms(t) for e, t, i in timeline if e == "bucket_done"}
    bwd_end = [ms(t) for e, t, _ in timeline if e == "backward_end"]
    fwd = [ms(t) for e, t, _ in timeline if e in ("forward_start", "forward_end")]
    end_all = max(ms(t) for _, t, _ in timeline)
    buckets = sorted(launch)
    fig = Figure(figsize=(11, 1.6 + 0.45 * (len(buckets) + 1)))
    ax = fig.add_subplot(1, 1, 1)
    if len(fwd) == 2:
        ax.barh(0, fwd[1] - fwd[0], left=fwd[0], height=0.5, color="tab:gray", alpha=0.6, label="forward")
    if ready:
        start = fwd[1] if len(fwd) == 2 else min(t for t, _ in ready)
        stop = bwd_end[0] if bwd_end else max(t for t, _ in ready)
        ax.barh(0, stop - start, left=start, height=0.5, color="tab:orange", alpha=0.6,
                label="loss + backward")
        ax.plot([t for t, _ in ready], [0] * len(ready), "k|", markersize=14, label="a .grad is ready")
    for row, b in enumerate(buckets, start=1):
        finish = done.get(b, end_all)
        ax.barh(row, max(finish - launch[b], 1e-3), left=launch[b], height=0.5, color="tab:blue",
                label="bucket all-reduce (launch -> done)" if row == 1 else None)
    for t in bwd_end:
        ax.axvline(t, color="crimson", linestyle="--", label="backward ends")
    ax.set_yticks(range(len(buckets) + 1))
    ax.set_yticklabels(["compute"] + [f"bucket {b}" for b in buckets])
    ax.invert_yaxis()
    ax.set_xlabel("time since forward started (ms)")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(left=0.0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    fig.tight_layout()
    return fig


def plot_fsdp_memory(memory_events, unsharded_bytes: int | None = None) -> Figure:
    """Live full-parameter bytes after each FSDP all-gather / reshard.

    ``memory_events`` is ``fsdp2.MemoryLog.events`` (or FSDP1's ``FullyShardedDataParallel.memory_events``):
    (what happened, live bytes).
    """
    if not isinstance(memory_events, (list, tuple)) or not memory_events:
        raise ValueError("memory_events must be a non-empty list of (what, live_bytes) tuples")
    for i, ev in enumerate(memory_events):
        if not (isinstance(ev, (list, tuple)) and len(ev) == 2 and isinstance(ev[1], int)):
            raise ValueError(f"memory_events[{i}] must be a (what: str, live_bytes: int) tuple, got {ev!r}")
    fig = Figure(figsize=(9, 3.5))
    ax = fig.add_subplot(1, 1, 1)
    ys = [b for _, b in memory_events]
    ax.step(range(len(ys)), ys, where="post", color="tab:blue", label="full parameters alive (bytes)")
    if unsharded_bytes is not None:
        ax.axhline(unsharded_bytes, color="crimson", linestyle="--", label="whole model, unsharded")
    ax.set_xticks(range(len(ys)))
    ax.set_xticklabels([w for w, _ in memory_events], rotation=60, ha="right", fontsize=6)
    ax.set_ylabel("bytes")
    ax.set_title("FSDP: parameters are gathered per unit and freed after use", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
