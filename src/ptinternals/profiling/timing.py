"""Timing GPU work correctly: warm-up, synchronisation, events, median and spread.

A CUDA call returns when the kernel is *queued*. So

    t0 = time.perf_counter(); y = f(x); t1 = time.perf_counter()      # naive_time_ms

measures the launch (a few microseconds), whatever the kernel costs, and a first call also pays
for module loading and autotuning. The correct recipe, which ``torch.utils.benchmark.Timer`` and
``triton.testing.do_bench`` both follow:

1. warm up (run ``fn`` a few times and throw the times away);
2. synchronise, so no earlier work is still running when the clock starts;
3. time on the device's clock: a CUDA event recorded before and after, ``end.synchronize()``,
   ``start.elapsed_time(end)``; or synchronise before reading the host clock;
4. repeat, and report the **median** (robust to a descheduled host or a stray kernel) with the
   **interquartile range** as the spread.

Every timer here takes a *backend*: an object with ``synchronize()``, ``Event(enable_timing=True)``
(with ``record()``, ``synchronize()``, ``elapsed_time(end)``) and ``perf_counter()``. The simulated
device (``async_device.SimulatedDevice``) is one; :func:`cuda_backend` and :func:`cpu_backend` are the
real ones. :func:`benchmark_torch` wraps ``torch.utils.benchmark.Timer`` for real runs.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable


@dataclass(frozen=True)
class TimingResult:
    """Milliseconds: ``median`` and ``iqr`` (75th - 25th percentile) of ``samples``; ``method`` says how."""

    median: float
    iqr: float
    samples: tuple[float, ...]
    method: str

    def __str__(self) -> str:
        return f"{self.median:.4f} ms (IQR {self.iqr:.4f} ms, {len(self.samples)} runs, {self.method})"


def quartiles(samples) -> tuple[float, float, float]:
    """(25th, 50th, 75th) percentiles with linear interpolation (numpy's default, ``statistics`` 'inclusive')."""
    xs = sorted(samples)
    if not xs:
        raise ValueError("samples must not be empty")
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def _check_counts(warmup, reps) -> None:
    for name, v, lo in (("warmup", warmup, 0), ("reps", reps, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")


def naive_time_ms(fn: Callable[[], object], backend) -> float:
    """The wrong way: host clock around one unsynchronised call (measures the launch)."""
    t0 = backend.perf_counter()
    fn()
    return (backend.perf_counter() - t0) * 1e3


def synced_time_ms(fn: Callable[[], object], backend, *, warmup: int = 3, reps: int = 10) -> TimingResult:
    """Host clock, synchronised before and after each run (includes launch and sync overheads)."""
    _check_counts(warmup, reps)
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        backend.synchronize()
        t0 = backend.perf_counter()
        fn()
        backend.synchronize()
        samples.append((backend.perf_counter() - t0) * 1e3)
    q1, med, q3 = quartiles(samples)
    return TimingResult(med, q3 - q1, tuple(samples), "host clock + synchronize")


def event_time_ms(fn: Callable[[], object], backend, *, warmup: int = 3, reps: int = 10) -> TimingResult:
    """The right way on a GPU: warm-up, sync, one pair of events per run, median and IQR."""
    _check_counts(warmup, reps)
    for _ in range(warmup):
        fn()
    backend.synchronize()
    pairs = []
    for _ in range(reps):
        start, end = backend.Event(enable_timing=True), backend.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    backend.synchronize()  # one wait at the end: the host keeps the queue full between runs
    samples = [s.elapsed_time(e) for s, e in pairs]
    q1, med, q3 = quartiles(samples)
    return TimingResult(med, q3 - q1, tuple(samples), "device events")


def time_gpu(fn: Callable[[], object], device, warmup: int = 3, reps: int = 10) -> tuple[float, float]:
    """``(median, IQR)`` in milliseconds of ``fn()``'s device time: :func:`event_time_ms` as a pair (the
    exercise's signature; ``device`` is a backend)."""
    result = event_time_ms(fn, device, warmup=warmup, reps=reps)
    return result.median, result.iqr


# ---- real backends ----------------------------------------------------------------------------------
class _HostEvent:
    """An 'event' on the host clock, for the CPU, where work is done when the call returns."""

    def __init__(self, enable_timing: bool = True):
        self.t: float | None = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "_HostEvent") -> float:
        if self.t is None or end.t is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return (end.t - self.t) * 1e3


def cpu_backend() -> SimpleNamespace:
    """The CPU as a backend: synchronous, host-clock events."""
    return SimpleNamespace(synchronize=lambda: None, Event=_HostEvent, perf_counter=time.perf_counter)


def cuda_backend() -> SimpleNamespace:
    """The current CUDA device as a backend (``torch.cuda.synchronize`` and ``torch.cuda.Event``)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("cuda_backend needs a CUDA device (torch.cuda.is_available() is False)")
    return SimpleNamespace(synchronize=torch.cuda.synchronize, Event=torch.cuda.Event, perf_counter=time.perf_counter)


def benchmark_torch(fn: Callable[[], object], *, min_run_time: float = 0.2, label: str = "fn") -> TimingResult:
    """Time ``fn`` with ``torch.utils.benchmark.Timer.blocked_autorange`` (it synchronises accelerators
    around each block itself, torch/utils/benchmark/utils/timer.py ``timer()``); per-run milliseconds."""
    from torch.utils import benchmark

    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not min_run_time > 0:
        raise ValueError(f"min_run_time must be > 0, got {min_run_time!r}")
    m = benchmark.Timer(stmt="fn()", globals={"fn": fn}, label=label).blocked_autorange(min_run_time=min_run_time)
    samples = tuple(t * 1e3 for t in m.times)
    q1, med, q3 = quartiles(samples)
    return TimingResult(m.median * 1e3, q3 - q1, samples, "torch.utils.benchmark.Timer")
