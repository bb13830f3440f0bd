"""The overlap loops of ``overlap`` on a real GPU: measured step times next to the closed form.

GPU only (the GPU check runs it, ``bench/bench_profiling.py``). Each step copies a host batch of
``batch_bytes`` to the device and runs a chain of matmuls sized to take about ``compute_ms``:

- ``blocking``: ``batch.to("cuda")`` from pageable memory (a copy, then a stream sync);
- ``async``: ``batch.to("cuda", non_blocking=True)`` from pinned memory, on the current stream;
- ``prefetch``: the copy of batch i+1 on a side stream while batch i computes, with
  ``wait_stream`` and ``record_stream`` (NVIDIA apex's data_prefetcher).

Copy and compute times are measured alone first (CUDA events, medians), so the prediction of
:func:`ptinternals.profiling.overlap.predict_step_us` uses this machine's numbers.
"""
from __future__ import annotations

import statistics

import torch

from .overlap import predict_step_us


def _median_ms(fn, reps: int = 10) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure_overlap(batch_bytes: int = 256 << 20, compute_ms: float = 20.0, steps: int = 12) -> dict:
    """Measured and predicted step times (ms) of the three loops, plus the measured pieces."""
    if not torch.cuda.is_available():
        raise RuntimeError("measure_overlap needs a CUDA device")
    n = batch_bytes // 4
    pageable = [torch.randn(n) for _ in range(2)]                     # fp32 host batches
    pinned = [t.pin_memory() for t in pageable]
    w = torch.randn(4096, 4096, device="cuda")
    x0 = torch.randn(4096, 4096, device="cuda")
    one_mm = _median_ms(lambda: x0 @ w)
    n_mm = max(1, round(compute_ms / one_mm))

    def compute(batch):
        y = x0
        for _ in range(n_mm):
            y = y @ w
        return y.sum() + batch[0]                                     # reads the batch

    pieces = {
        "copy_pinned_ms": _median_ms(lambda: pinned[0].to("cuda", non_blocking=True)),
        "copy_pageable_ms": _median_ms(lambda: pageable[0].to("cuda")),
        "compute_ms": _median_ms(lambda: compute(torch.zeros(1, device="cuda"))),
    }

    def run(loop: str) -> float:
        torch.cuda.synchronize()
        ends = []
        if loop in ("blocking", "async"):
            for i in range(steps):
                src = pageable[i % 2] if loop == "blocking" else pinned[i % 2]
                batch = src.to("cuda", non_blocking=(loop == "async"))
                compute(batch)
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                ends.append(ev)
        else:
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                nxt = pinned[0].to("cuda", non_blocking=True)
            for i in range(steps):
                torch.cuda.current_stream().wait_stream(side)
                batch = nxt
                batch.record_stream(torch.cuda.current_stream())
                if i + 1 < steps:
                    with torch.cuda.stream(side):
                        nxt = pinned[(i + 1) % 2].to("cuda", non_blocking=True)
                compute(batch)
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                ends.append(ev)
        torch.cuda.synchronize()
        gaps = [a.elapsed_time(b) for a, b in zip(ends[:-1], ends[1:-1])]
        return statistics.median(gaps)

    out = dict(pieces, batch_bytes=batch_bytes, matmuls_per_step=n_mm)
    for loop in ("blocking", "async", "prefetch"):
        measured = run(loop)
        # predict_step_us is linear in its times, so milliseconds in give milliseconds out
        predicted = predict_step_us(pieces["copy_pinned_ms"], pieces["copy_pageable_ms"], pieces["compute_ms"], 0.0,
                                    loop, pinned=(loop != "blocking"))
        out[f"{loop}_ms"] = measured
        out[f"{loop}_predicted_ms"] = predicted
    return out
