"""Profile a training step the way torch.profiler is meant to be used, and name its top costs.

    report = profile_steps(step, wait=1, warmup=1, active=2)
    print(report.table)            # key_averages(), sorted by self time
    report.top(3)                  # [("aten::addmm", 1234.5), ...] microseconds over the active steps

What :func:`profile_steps` does (torch/profiler/profiler.py):

- ``schedule(wait, warmup, active)``: the profiler idles for ``wait`` steps (skip the first, slow
  iterations), records but discards ``warmup`` steps (its own start-up cost lands there), then
  records ``active`` steps; ``prof.step()`` after each iteration advances the schedule and names
  the ranges ``ProfilerStep#N``; ``on_trace_ready`` fires when the active steps end;
- ``activities``: CPU always, CUDA too on a GPU (kernels, copies, their launch events);
- ``record_function(name)`` ranges (``forward``, ``backward``, ``optimizer`` in :func:`capstone_step`)
  appear as ``user_annotation`` events, so the trace shows which phase each op belongs to;
- the trace is exported with ``prof.export_chrome_trace`` and read back by ``trace_analysis``,
  so the numbers here are the ones a person sees in Perfetto (https://ui.perfetto.dev).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from .trace_analysis import OpStats, op_stats, top_ops

PHASES = ("forward", "backward", "optimizer")


@dataclass
class ProfileReport:
    """What one profiled run produced; times in microseconds, summed over the active steps."""

    trace_path: str
    stats: dict[str, OpStats]
    table: str
    active_steps: int
    device: str

    def top(self, k: int = 3, *, by: str | None = None) -> list[tuple[str, float]]:
        """The ``k`` ATen ops (``aten::``) with the most self time: device time on a GPU, host time on the CPU."""
        by = by or ("device_self_us" if self.device == "cuda" else "self_us")
        aten = {name: s for name, s in self.stats.items() if name.startswith("aten::")}
        return [(name, getattr(s, by)) for name, s in top_ops(aten, k, by=by)]

    def phase_us(self) -> dict[str, float]:
        """Total host time of each ``record_function`` phase present in the trace."""
        return {p: self.stats[p].total_us for p in PHASES if p in self.stats}


def profile_steps(step: Callable[[], object], *, wait: int = 1, warmup: int = 1, active: int = 2,
                  device: str = "cpu", trace_path: str | None = None, record_shapes: bool = False,
                  profile_memory: bool = False, with_stack: bool = False, row_limit: int = 12) -> ProfileReport:
    """Run ``step()`` ``wait + warmup + active`` times under ``torch.profiler`` and analyse the trace."""
    if not callable(step):
        raise TypeError(f"step must be callable, got {type(step).__name__}")
    for name, v, lo in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    if trace_path is None:
        trace_path = os.path.join(tempfile.mkdtemp(prefix="ptprof-"), "trace.json")
    exported = []

    def on_ready(prof):
        prof.export_chrome_trace(trace_path)
        exported.append(trace_path)

    with profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                 on_trace_ready=on_ready, record_shapes=record_shapes, profile_memory=profile_memory,
                 with_stack=with_stack) as prof:
        for _ in range(wait + warmup + active):
            step()
            if device == "cuda":
                torch.cuda.synchronize()  # the step's kernels land inside its ProfilerStep range
            prof.step()
    if not exported:
        raise RuntimeError("the profiler's schedule never completed an active cycle")
    sort_by = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=row_limit)
    return ProfileReport(trace_path, op_stats(trace_path), table, active, device)


def capstone_parts(device: str = "cpu", *, batch_size: int = 8, n_layer: int = 2, seed: int = 0):
    """The capstone's training step ({{chapter gpt}}: ``ptinternals.gpt``, as ``gpt.train.train_step``
    runs it without AMP or DDP) cut into its three phases: ``(forward, backward, optimizer)``, callables
    sharing the model, its AdamW and a batch stream. Small sizes by default (a CPU demo)."""
    from ptinternals.gpt import GPT, get_batch, load_corpus, make_config
    from ptinternals.gpt.loop import make_optimizer

    torch.manual_seed(seed)
    _, train, _ = load_corpus()
    config = make_config("cpu", {"batch_size": batch_size, "n_layer": n_layer}).replace(
        vocab_size=int(train.max()) + 1, device=device)
    model = GPT(config).to(device)
    opt = make_optimizer(model, config, device)
    gen = torch.Generator().manual_seed(seed)
    state: dict = {}

    def forward():
        x, y = get_batch(train, config.batch_size, config.block_size, gen, device=device)
        _, state["loss"] = model(x, y)
        return state["loss"]

    def backward():
        state.pop("loss").backward()

    def optimizer():
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return forward, backward, optimizer


def with_ranges(forward, backward, optimizer):
    """One step that runs the three phases inside ``record_function`` ranges of their names."""
    def step():
        with record_function("forward"):
            loss = forward()
        with record_function("backward"):
            backward()
        with record_function("optimizer"):
            optimizer()
        return loss

    return step


def capstone_step(device: str = "cpu", **kwargs):
    """The capstone's step with ``forward``/``backward``/``optimizer`` ranges (see :func:`capstone_parts`)."""
    return with_ranges(*capstone_parts(device, **kwargs))


def capstone_costs(forward, backward, optimizer, trace_path: str) -> list[str]:
    """Profile four steps of the three phases (wait 1, warm-up 1, active 2) on the CPU, export the trace
    to ``trace_path`` and return the three ATen ops with the most self time in it."""
    for name, part in (("forward", forward), ("backward", backward), ("optimizer", optimizer)):
        if not callable(part):
            raise TypeError(f"{name} must be callable, got {type(part).__name__}")
    if not isinstance(trace_path, (str, os.PathLike)):
        raise TypeError(f"trace_path must be a path, got {type(trace_path).__name__}")
    report = profile_steps(with_ranges(forward, backward, optimizer), wait=1, warmup=1, active=2,
                           trace_path=trace_path)
    return [name for name, _ in report.top(3)]
