"""A training step's timeline: host-to-device copies, compute, side streams, and what overlaps.

Each step the host prepares a batch (``host_us`` of Python: the data loader), copies it to the device
(``batch_bytes``), and launches the step's kernels (``compute_us``). Three loops, as people write them:

``"blocking"``  ``x = batch.to("cuda")``: a copy then a stream sync (``non_blocking=False``). The
                host waits for the copy, which waits for the previous step's kernels (same stream).
``"async"``     ``x = batch.to("cuda", non_blocking=True)`` on the current stream: the host runs
                ahead; on the device the copy still queues behind the previous step's kernels.
                From **pageable** memory the host first stages the bytes (it blocks for that part).
``"prefetch"``  a side stream copies batch i+1 while batch i computes (NVIDIA apex's
                ``data_prefetcher``): ``with torch.cuda.stream(s): nxt = batch.to(dev, non_blocking=True)``,
                then ``current_stream().wait_stream(s)`` and ``nxt.record_stream(current_stream())``.

``item=True`` adds ``loss.item()`` at the end of each step (a device-to-host read: the host waits for
the step's kernels, so it cannot prepare the next batch meanwhile).

:func:`simulate_training` runs a loop on the simulated device (``async_device``) and measures the
steady-state step time; :func:`predict_step_us` is the closed form, exact when launches cost nothing
(``launch_overhead_us=0``), with X = copy time at the memory's bandwidth, C = compute, H = host:

================  ==================================  =================================
loop              step time                           with ``item=True``
================  ==================================  =================================
blocking          X + max(H, C)                       X + C + H
async, pinned     max(H, X + C)                       H + X + C
async, pageable   max(H + X_pageable, X_pinned + C)   H + X_pageable + X_pinned + C
prefetch          max(H', X_pinned, C)                max(H' + C, X_pinned)
================  ==================================  =================================

where H' = H for pinned memory and H + X_pageable for pageable memory (the host stages the bytes).
Without ``record_stream`` the prefetch loop frees each batch while the compute stream may still read
it, and the next copy can land in the same block: ``SimulatedDevice.races`` records it (the hazard
{{chapter allocator}} describes for blocks used on a second stream).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from .async_device import SimulatedDevice

LOOPS = ("blocking", "async", "prefetch")


@dataclass(frozen=True)
class StepCosts:
    """What one step costs: bytes copied in, device compute (split into ``n_kernels``), host Python."""

    batch_bytes: int
    compute_us: float
    host_us: float = 0.0
    n_kernels: int = 1

    def __post_init__(self):
        if isinstance(self.batch_bytes, bool) or not isinstance(self.batch_bytes, int) or self.batch_bytes < 0:
            raise ValueError(f"batch_bytes must be an int >= 0, got {self.batch_bytes!r}")
        for name in ("compute_us", "host_us"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {v!r}")
        if isinstance(self.n_kernels, bool) or not isinstance(self.n_kernels, int) or self.n_kernels < 1:
            raise ValueError(f"n_kernels must be an int >= 1, got {self.n_kernels!r}")


@dataclass
class TrainingTimeline:
    """The device after the run, each step's compute end (device clock) and the steady step time."""

    device: SimulatedDevice
    step_ends: list[float] = field(default_factory=list)

    @property
    def steady_step_us(self) -> float:
        """Median interval between consecutive steps' ends, leaving out the last step (a prefetch loop
        has no next batch to load there, so its last step is shorter)."""
        if len(self.step_ends) < 3:
            raise ValueError("need at least 3 steps to measure a steady step time")
        ends = self.step_ends[:-1]
        return statistics.median(b - a for a, b in zip(ends, ends[1:]))

    @property
    def total_us(self) -> float:
        return self.step_ends[-1] if self.step_ends else 0.0


def _check_loop(loop: str) -> None:
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {LOOPS}, got {loop!r}")


def simulate_training(costs: StepCosts, steps: int, loop: str, *, pinned: bool = True, item: bool = False,
                      record_stream: bool = True, device: SimulatedDevice | None = None) -> TrainingTimeline:
    """Run ``steps`` training steps of ``loop`` on a simulated device (a fresh zero-overhead one by default)."""
    _check_loop(loop)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    dev = device or SimulatedDevice(launch_overhead_us=0.0)
    compute = dev.current_stream
    kernel_us = costs.compute_us / costs.n_kernels
    out = TrainingTimeline(dev)

    def run_kernels(buf, i):
        rec = None
        for k in range(costs.n_kernels):
            rec = dev.launch(f"step{i}.kernel{k}", kernel_us, reads=[buf])
        out.step_ends.append(rec.end)
        if item:  # loss.item(): 4 bytes back, blocking
            dev.copy(0, "d2h", pinned=False, non_blocking=False, name=f"step{i}.loss.item")  # the wait is the cost

    if loop in ("blocking", "async"):
        for i in range(steps):
            dev.host_work(costs.host_us)
            buf = dev.alloc(costs.batch_bytes)
            dev.copy(costs.batch_bytes, "h2d", pinned=pinned, non_blocking=(loop == "async"), buffer=buf,
                     name=f"step{i}.batch")
            run_kernels(buf, i)
            dev.free(buf)
        return out

    side = dev.Stream()

    def load(i):
        dev.host_work(costs.host_us)
        buf = dev.alloc(costs.batch_bytes, side)
        dev.copy(costs.batch_bytes, "h2d", pinned=pinned, non_blocking=True, stream=side, buffer=buf,
                 name=f"step{i}.batch")
        ready = dev.Event()
        ready.record(side)
        return buf, ready

    nxt = load(0)
    for i in range(steps):
        buf, ready = nxt
        compute.wait_event(ready)
        if record_stream:
            buf.record_stream(compute)
        if i + 1 < steps:
            nxt = load(i + 1)
        run_kernels(buf, i)
        dev.free(buf)
    return out


def train_prefetch(device: SimulatedDevice, batches: list[int], compute_us: float, host_us: float) -> None:
    """The prefetching loop, one kernel per step: batch ``i+1`` (``batches[i+1]`` bytes, pinned) is copied
    on a side stream while step ``i`` computes. Names: copies ``batch{i}``, kernels ``step{i}``.

    The order of each step is the one apex's ``data_prefetcher`` uses: the compute stream waits for the
    batch's event (the host does not), the batch's block is recorded on the compute stream (so the
    allocator cannot hand it to the next copy while step ``i`` still reads it), the next batch is loaded
    and its copy queued, and only then is step ``i`` launched, so the copy overlaps the compute."""
    if not isinstance(batches, (list, tuple)):
        raise TypeError(f"batches must be a list of batch sizes in bytes, got {type(batches).__name__}")
    for i, nbytes in enumerate(batches):
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"batches[{i}] must be an int >= 0 (bytes), got {nbytes!r}")
    for name, v in (("compute_us", compute_us), ("host_us", host_us)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {v!r}")
    side = device.Stream()
    compute = device.current_stream

    def load(i: int):
        device.host_work(host_us)
        buf = device.alloc(batches[i], side)
        device.copy(batches[i], "h2d", pinned=True, non_blocking=True, stream=side, buffer=buf, name=f"batch{i}")
        ready = device.Event()
        ready.record(side)                      # marks the end of the copy on the side stream
        return buf, ready

    if not batches:
        return
    nxt = load(0)
    for i in range(len(batches)):
        buf, ready = nxt
        compute.wait_event(ready)
        buf.record_stream(compute)
        if i + 1 < len(batches):
            nxt = load(i + 1)
        device.launch(f"step{i}", compute_us, reads=[buf])
        device.free(buf)


def predict_step_us(copy_pinned_us: float, copy_pageable_us: float, compute_us: float, host_us: float, loop: str,
                    pinned: bool = True, item: bool = False) -> float:
    """Steady-state step time of ``loop`` when launches are free (see the module's table)."""
    _check_loop(loop)
    for name, v in (("copy_pinned_us", copy_pinned_us), ("copy_pageable_us", copy_pageable_us),
                    ("compute_us", compute_us), ("host_us", host_us)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {v!r}")
    xp, xg, c, h = copy_pinned_us, copy_pageable_us, compute_us, host_us
    if loop == "blocking":
        x = xp if pinned else xg
        return x + c + h if item else x + max(h, c)
    if loop == "async":
        if pinned:
            return h + xp + c if item else max(h, xp + c)
        return h + xg + xp + c if item else max(h + xg, xp + c)
    host = h if pinned else h + xg        # the host's own time per step (pageable: it stages the bytes)
    if item:  # copy i+1 starts with compute i; the host then waits for compute i before loading batch i+2
        return max(host + c, xp)
    return max(host, xp, c)
