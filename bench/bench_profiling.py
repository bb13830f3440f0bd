"""Benchmarks and GPU checks for the profiling chapter: the host-device boundary measured.

- ``sync_detector``: every statement of ``sync_programs.STATEMENTS`` and a few generated programs run
  under ``torch.cuda.set_sync_debug_mode("warn")`` (CUDA) and under the detector; ``extra`` holds the
  agreement (statements where the warnings' lines equal the detector's) and the disagreeing code. On
  the CPU the detector runs emulated and is compared with the statements' expected syncs.
- ``trace_vs_key_averages``: a profiled training step's exported trace analysed by
  ``trace_analysis.op_stats`` against ``prof.key_averages()`` (host times; on CUDA also device times),
  plus the top kernels, the GPU's busy fraction and its idle gaps.
- ``timing_matmul``: one matmul timed naively (host clock, no sync), with synchronisation, with CUDA
  events and with ``torch.utils.benchmark``: ``ms`` is the event median, ``torch_ms`` torch's Timer.
- ``overlap_<loop>`` (CUDA only): blocking pageable copies, async pinned copies, and a prefetching side
  stream, measured per step next to ``overlap.predict_step_us`` fed with the measured pieces.
- ``item_per_step``: a small training loop with and without ``loss.item()`` every step.
- ``train_fast_vs_hidden_syncs`` (CUDA only): the training loop with hidden syncs and its fix (the
  exercise ``train_fast``), per step, with the warnings of ``set_sync_debug_mode`` counted.

On the CPU (``ctx.small``) sizes are tiny and the numbers only show that the code runs.
"""
from __future__ import annotations

import os
import tempfile
import time

import torch

from ptinternals.benchmark import Measurement, time_ms
from ptinternals.profiling.sync_programs import SETUP, STATEMENTS, SyncProgram, detected_lines, make_program
from ptinternals.profiling.timing import (
    benchmark_torch,
    cpu_backend,
    cuda_backend,
    event_time_ms,
    naive_time_ms,
    synced_time_ms,
)
from ptinternals.profiling.trace_analysis import (
    compare_with_key_averages,
    gpu_idle_gaps,
    gpu_utilization,
    keys_inside_steps,
    op_stats,
    top_kernels,
    top_ops,
)


def _sync_detector(device: str) -> Measurement:
    t0 = time.perf_counter()
    programs = [SyncProgram(f"<statement-{i}>", "\n".join(SETUP + (s.code,)) + "\n",
                            tuple((len(SETUP) + 1, r) for r in s.reasons)) for i, s in enumerate(STATEMENTS)]
    programs += [make_program(seed, 10) for seed in range(4)]
    disagree = []
    for p in programs:
        detected = [line for line, _ in detected_lines(p, emulate=(device != "cuda"))]
        if device == "cuda":
            from ptinternals.profiling.sync_programs import real_sync_lines

            truth = real_sync_lines(p)
        else:
            truth = [line for line, _ in p.expected]
        if truth != detected:
            code = p.source.splitlines()[-1] if p.name.startswith("<statement") else p.name
            disagree.append({"program": code, "torch": truth, "detector": detected})
    ms = (time.perf_counter() - t0) * 1e3
    return Measurement(suite="profiling", name="sync_detector", device=device, shape=f"{len(programs)} programs",
                       dtype="-", ms=ms, extra={"programs": len(programs), "agree": len(programs) - len(disagree),
                                                "disagree": disagree,
                                                "truth": "set_sync_debug_mode" if device == "cuda" else "expected table"})


def _trace(device: str, small: bool, out_dir) -> Measurement:
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    d, h = (64, 128) if small else (2048, 8192)
    model = torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, d)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32 if small else 512, d, device=device)

    def step():
        with record_function("forward"):
            loss = model(x).square().mean()
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)

    path = os.path.join(tempfile.mkdtemp(prefix="ptprof-bench-"), "trace.json")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(4):
            step()
            if device == "cuda":
                torch.cuda.synchronize()
            prof.step()
    t0 = time.perf_counter()
    stats = op_stats(path)
    ms = (time.perf_counter() - t0) * 1e3
    problems = compare_with_key_averages(stats, prof.key_averages(), keys=keys_inside_steps(path),
                                         device=(device == "cuda"))
    gaps = gpu_idle_gaps(path)
    by = "device_self_us" if device == "cuda" else "self_us"
    aten = {k: v for k, v in stats.items() if k.startswith("aten::")}
    extra = {"events_analysed": sum(s.count for s in stats.values()), "problems": problems[:10],
             "n_problems": len(problems), "top_ops": [(k, getattr(v, by)) for k, v in top_ops(aten, 3, by=by)],
             "top_kernels": top_kernels(path, 3), "gpu_utilization": gpu_utilization(path),
             "idle_gaps": len(gaps), "idle_us": sum(b - a for a, b in gaps)}
    if device == "cuda" and out_dir is not None:  # the book's figure, from a real CUDA trace
        from ptinternals.viz.profiling import plot_trace_timeline

        os.makedirs(out_dir, exist_ok=True)
        figure = os.path.join(out_dir, "profiling_cuda_trace.png")
        plot_trace_timeline(path, title="a CUDA training step: host ops and the GPU streams").savefig(figure, dpi=120)
        extra["figure"] = figure
    return Measurement(suite="profiling", name="trace_vs_key_averages", device=device, shape=f"d={d} h={h}",
                       dtype="float32", ms=ms, extra=extra)


def _timing(device: str, small: bool) -> Measurement:
    n = 256 if small else 8192
    a = torch.randn(n, n, device=device)
    fn = lambda: a @ a
    backend = cuda_backend() if device == "cuda" else cpu_backend()
    events = event_time_ms(fn, backend, warmup=3, reps=10)
    synced = synced_time_ms(fn, backend, warmup=1, reps=10)
    backend.synchronize()
    naive = naive_time_ms(fn, backend)
    backend.synchronize()
    ref = benchmark_torch(fn, min_run_time=0.1 if small else 0.5)
    return Measurement(suite="profiling", name="timing_matmul", device=device, shape=f"{n}x{n}", dtype="float32",
                       ms=events.median, flops=2 * n**3, torch_ms=ref.median,
                       extra={"naive_ms": naive, "synced_ms": synced.median, "event_iqr_ms": events.iqr,
                              "torch_timer_iqr_ms": ref.iqr})


def _item_per_step(device: str, small: bool) -> list[Measurement]:
    d = 64 if small else 1024
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d) for _ in range(8)]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(16, d, device=device)
    out = []
    for with_item in (False, True):
        def steps(k=20, with_item=with_item):
            total = torch.zeros((), device=device)
            for _ in range(k):
                loss = model(x).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if with_item:
                    float(loss.item())
                else:
                    total += loss.detach()
            return total

        ms = time_ms(steps, device, warmup=1, reps=3) / 20
        out.append(Measurement(suite="profiling", name=f"train_step_{'item' if with_item else 'no_item'}",
                               device=device, shape=f"8 x Linear({d}) batch 16", dtype="float32", ms=ms,
                               flops=3 * 2 * 8 * 16 * d * d, extra={"syncs_per_step": int(with_item)}))
    return out


def _train_loops(small: bool) -> Measurement:
    """CUDA only: the chapter's training loop with hidden syncs next to its fix (exercise train_fast):
    ``ms`` per step of the fix, ``torch_ms`` per step of the original, syncs counted by set_sync_debug_mode."""
    import warnings

    from ptinternals.profiling.scaffold import make_batches, make_model
    from ptinternals.profiling.training_loops import train_with_hidden_syncs, train_without_syncs

    steps, batch = (20, 64) if small else (200, 1024)
    batches = make_batches(0, steps, batch, pin=True)
    ms, syncs = {}, {}
    for loop in (train_with_hidden_syncs, train_without_syncs):
        model = make_model(0, "cuda")
        loop(model, batches[:2])                                     # warm-up
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            t0 = time.perf_counter()
            try:
                loop(model, batches)
                torch.cuda.synchronize()
            finally:
                torch.cuda.set_sync_debug_mode(0)
            ms[loop.__name__] = (time.perf_counter() - t0) * 1e3 / steps
        syncs[loop.__name__] = sum("synchroniz" in str(w.message) for w in caught)
    return Measurement(suite="profiling", name="train_fast_vs_hidden_syncs", device="cuda",
                       shape=f"{steps} steps of batch {batch}", dtype="float32", ms=ms["train_without_syncs"],
                       torch_ms=ms["train_with_hidden_syncs"],
                       extra={"syncs_hidden": syncs["train_with_hidden_syncs"], "syncs_fixed": syncs["train_without_syncs"],
                              "note": "torch_ms is the original loop: vs_torch is the fix's speed-up"})


def _overlap(small: bool) -> list[Measurement]:
    from ptinternals.profiling.cuda_overlap import measure_overlap

    r = measure_overlap(batch_bytes=(32 << 20) if small else (256 << 20), compute_ms=5.0 if small else 20.0)
    out = []
    for loop in ("blocking", "async", "prefetch"):
        out.append(Measurement(suite="profiling", name=f"overlap_{loop}", device="cuda",
                               shape=f"{r['batch_bytes'] >> 20} MiB batch, {r['matmuls_per_step']} matmuls",
                               dtype="float32", ms=r[f"{loop}_ms"], bytes_moved=r["batch_bytes"],
                               extra={"predicted_ms": r[f"{loop}_predicted_ms"], "copy_pinned_ms": r["copy_pinned_ms"],
                                      "copy_pageable_ms": r["copy_pageable_ms"], "compute_ms": r["compute_ms"]}))
    return out


def run(ctx) -> list[Measurement]:
    device = getattr(ctx, "device", "cpu")
    small = getattr(ctx, "small", True)
    out = [_sync_detector(device), _trace(device, small, getattr(ctx, "out_dir", None)), _timing(device, small)]
    out += _item_per_step(device, small)
    if device == "cuda":
        out += _overlap(small)
        out.append(_train_loops(small))
    return out


if __name__ == "__main__":
    import json
    from types import SimpleNamespace

    from ptinternals.device import pick_device

    dev = pick_device()
    for m in run(SimpleNamespace(device=dev, small=dev != "cuda", peaks=None)):
        print(json.dumps(m.to_dict(), default=str))
