"""Timing and roofline arithmetic shared by every benchmark (bench/ and the kernels chapter).

Numbers mean something only against a ceiling (STYLE.md 12): each measurement carries the bytes it
moved and the FLOPs it did, so it can be reported as GB/s or TFLOP/s, as a fraction of the device's
measured peak, and as a ratio to torch's own op timed in the same run.

On CUDA, timing uses ``triton.testing.do_bench`` (warm-up, L2 flush, median); without a GPU it falls
back to a median of ``time.perf_counter`` runs, and results are labelled "cpu".
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

# Datasheet peaks of the H200 SXM (named constants: STYLE.md 4). Runs also *measure* a ceiling.
H200_HBM_BYTES_PER_S = 4.8e12
H200_BF16_DENSE_FLOPS = 989e12


@dataclass
class Measurement:
    """One timed operation. ``ms`` is the median; ``torch_ms`` is torch's own op in the same run."""

    suite: str
    name: str
    device: str
    shape: str
    dtype: str
    ms: float
    bytes_moved: int | None = None
    flops: int | None = None
    torch_ms: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def gbps(self) -> float | None:
        return None if not self.bytes_moved else self.bytes_moved / (self.ms * 1e-3) / 1e9

    @property
    def tflops(self) -> float | None:
        return None if not self.flops else self.flops / (self.ms * 1e-3) / 1e12

    @property
    def vs_torch(self) -> float | None:
        """Speed relative to torch: >1 means faster than torch (torch_ms / ms)."""
        return None if not self.torch_ms else self.torch_ms / self.ms

    def to_dict(self, peaks: "Peaks | None" = None) -> dict:
        d = asdict(self)
        d.update(gbps=self.gbps, tflops=self.tflops, vs_torch=self.vs_torch)
        if peaks is not None:
            d["frac_peak_bw"] = None if self.gbps is None else self.gbps * 1e9 / peaks.bytes_per_s
            d["frac_peak_flops"] = None if self.tflops is None else self.tflops * 1e12 / peaks.flops
        return d


@dataclass
class Peaks:
    """Ceilings measured in this run: device-to-device copy bandwidth and a large matmul."""

    bytes_per_s: float
    flops: float
    how: str


def time_ms(fn: Callable[[], object], device: str, *, warmup: int = 3, reps: int = 10) -> float:
    """Median milliseconds of ``fn()`` on ``device`` (do_bench on CUDA, perf_counter on CPU)."""
    if reps < 1 or warmup < 0:
        raise ValueError(f"need reps >= 1 and warmup >= 0, got reps={reps}, warmup={warmup}")
    if device == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return float(statistics.median(samples))


def measure_peaks(device: str, *, small: bool = False) -> Peaks:
    """Measure the copy bandwidth and the bf16 (GPU) / fp32 (CPU) matmul rate of this device."""
    import torch

    if device == "cuda":
        n_bytes = (1 << 28) if small else (1 << 31)  # 256 MiB / 2 GiB buffers
        n_mm = 4096 if small else 8192
        dtype = torch.bfloat16
    else:
        n_bytes, n_mm, dtype = 1 << 24, 512, torch.float32
    src = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device)
    bw = 2 * n_bytes / (ms * 1e-3)  # read + write
    a = torch.randn(n_mm, n_mm, device=device, dtype=dtype)
    b = torch.randn(n_mm, n_mm, device=device, dtype=dtype)
    ms_mm = time_ms(lambda: a @ b, device)
    flops = 2 * n_mm**3 / (ms_mm * 1e-3)
    how = f"copy of {n_bytes >> 20} MiB; {n_mm}^3 {str(dtype).replace('torch.', '')} matmul"
    return Peaks(bytes_per_s=bw, flops=flops, how=how)
