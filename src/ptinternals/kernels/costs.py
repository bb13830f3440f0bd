"""Bytes and FLOPs of each kernel: the two numbers that place it on the roofline.

The roofline model (Williams, Waterman & Patterson 2009): a kernel doing F FLOPs while moving B
bytes to and from HBM has *arithmetic intensity* I = F / B. On a device with bandwidth W bytes/s and
compute peak P FLOP/s it cannot run faster than ``min(P, I * W)`` FLOP/s. The *ridge point*
``P / W`` separates the two regimes: on an H200, 989e12 / 4.8e12 = 206 FLOP/byte (dense bf16).

- left of the ridge (add, softmax, layer norm: 0.2-5 FLOP/byte) a kernel is **memory-bound**: its
  score is GB/s against W, and the way to win is to move fewer bytes (fusion);
- right of it (a large matmul: ~1365 FLOP/byte at 4096^3 fp16; attention) it is **compute-bound**:
  its score is TFLOP/s against P, and the way to win is to keep the tensor cores busy (tiling).

Counting conventions (state them, since every counter differs): bytes are the *compulsory* HBM
traffic, each input read once and each output written once (what a perfect cache would leave);
re-reads from L2 are not counted. FLOPs count a multiply-add as 2, and ``exp``, ``max``, a
division each as 1. torch's ``FlopCounterMode`` (torch/utils/flop_counter.py) counts only the matmuls:
2*M*N*K, and 4*B*H*Sq*Sk*D for attention forward, which match the numbers here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..benchmark import H200_BF16_DENSE_FLOPS, H200_HBM_BYTES_PER_S, Measurement, Peaks

#: the datasheet ceilings of the GPU this course targets, as a ``Peaks`` for the roofline plot
H200_PEAKS = Peaks(bytes_per_s=H200_HBM_BYTES_PER_S, flops=H200_BF16_DENSE_FLOPS,
                   how="H200 SXM datasheet: 4.8 TB/s HBM3e, 989 TFLOP/s dense bf16")


@dataclass(frozen=True)
class KernelCost:
    """Compulsory HBM bytes and FLOPs of one kernel call."""

    bytes_moved: int
    flops: int

    @property
    def intensity(self) -> float:
        """FLOP per byte (arithmetic intensity)."""
        return self.flops / self.bytes_moved if self.bytes_moved else float("inf")


def _size(dtype: torch.dtype) -> int:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    return torch.empty((), dtype=dtype).element_size()


def _check_dims(**dims: int) -> None:
    for name, v in dims.items():
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")


def add_cost(n: int, dtype: torch.dtype) -> KernelCost:
    """out = x + y: read 2n, write n elements; n FLOPs."""
    _check_dims(n=n)
    return KernelCost(bytes_moved=3 * n * _size(dtype), flops=n)


def softmax_cost(n_rows: int, n_cols: int, dtype: torch.dtype) -> KernelCost:
    """Fused row softmax: read and write M*N; per element max, subtract, exp, sum, divide (5 FLOPs)."""
    _check_dims(n_rows=n_rows, n_cols=n_cols)
    mn = n_rows * n_cols
    return KernelCost(bytes_moved=2 * mn * _size(dtype), flops=5 * mn)


def layer_norm_cost(n_rows: int, n_cols: int, dtype: torch.dtype, backward: bool = False) -> KernelCost:
    """Layer norm over rows of N.

    forward: read x, write y (M*N each), read w and b (N each), write mean and rstd (M fp32 each);
    per element sum, subtract, square-and-add, scale, multiply by w, add b: 7 FLOPs.
    backward: read x and dy, write dx (M*N each), read w, mean and rstd, write dw and db;
    per element xhat (2), w*dy (1), two row sums (3), dx (4), dw and db accumulation (3): 13 FLOPs.
    """
    _check_dims(n_rows=n_rows, n_cols=n_cols)
    s, mn = _size(dtype), n_rows * n_cols
    if backward:
        return KernelCost(bytes_moved=3 * mn * s + 3 * n_cols * s + 2 * n_rows * 4, flops=13 * mn)
    return KernelCost(bytes_moved=2 * mn * s + 2 * n_cols * s + 2 * n_rows * 4, flops=7 * mn)


def matmul_cost(m: int, n: int, k: int, dtype: torch.dtype) -> KernelCost:
    """C = A @ B: read M*K + K*N, write M*N elements; 2*M*N*K FLOPs (one multiply-add = 2)."""
    _check_dims(m=m, n=n, k=k)
    return KernelCost(bytes_moved=(m * k + k * n + m * n) * _size(dtype), flops=2 * m * n * k)


def visible_pairs(seq_q: int, seq_k: int, causal: bool) -> int:
    """How many (query, key) pairs attention computes: Sq*Sk, or with a top-left causal mask
    sum over queries i of min(i + 1, Sk) - about half when Sq = Sk."""
    _check_dims(seq_q=seq_q, seq_k=seq_k)
    if not causal:
        return seq_q * seq_k
    full = max(0, seq_q - seq_k)                  # queries i >= Sk see all Sk keys
    diag = min(seq_q, seq_k)                      # queries 0..diag-1 see i + 1 keys
    return diag * (diag + 1) // 2 + full * seq_k


def attention_cost(batch: int, heads: int, seq_q: int, seq_k: int, head_dim: int, dtype: torch.dtype,
                   causal: bool = False, backward: bool = False) -> KernelCost:
    """Flash attention. forward: S = QK^T and O = PV, 2 * 2 * D FLOPs per visible pair; read q, k, v,
    write o and lse. backward: 5 matmuls of the same size (recomputing S counted once, as
    FlashAttention-2 counts it): 2.5x forward; read q, k, v, o, do, lse, write dq, dk, dv."""
    _check_dims(batch=batch, heads=heads, seq_q=seq_q, seq_k=seq_k, head_dim=head_dim)
    s, bh = _size(dtype), batch * heads
    pairs = bh * visible_pairs(seq_q, seq_k, causal)
    q_bytes, kv_bytes = bh * seq_q * head_dim * s, bh * seq_k * head_dim * s
    if backward:
        return KernelCost(bytes_moved=3 * q_bytes + 4 * kv_bytes + bh * seq_q * 4,
                          flops=10 * pairs * head_dim)
    return KernelCost(bytes_moved=2 * q_bytes + 2 * kv_bytes + bh * seq_q * 4, flops=4 * pairs * head_dim)


def ridge_point(peaks: Peaks) -> float:
    """FLOP per byte where the bandwidth roof meets the compute roof (206 on an H200)."""
    return peaks.flops / peaks.bytes_per_s


def attainable_flops(intensity: float, peaks: Peaks) -> float:
    """The roofline: the best FLOP/s any kernel of this intensity can reach on ``peaks``."""
    if not intensity >= 0:
        raise ValueError(f"intensity must be >= 0, got {intensity}")
    return min(peaks.flops, intensity * peaks.bytes_per_s)


def roofline_fractions(m: Measurement, peaks: Peaks) -> dict:
    """Where a measurement stands against ``peaks``: its intensity, which roof binds it, and the
    fraction of that roof it reached (bandwidth for memory-bound, FLOP/s for compute-bound)."""
    if not m.bytes_moved or not m.flops:
        raise ValueError(f"measurement {m.name!r} needs both bytes_moved and flops for a roofline position")
    intensity = m.flops / m.bytes_moved
    achieved = m.flops / (m.ms * 1e-3)
    memory_bound = intensity < ridge_point(peaks)
    return {
        "intensity": intensity,
        "bound": "memory" if memory_bound else "compute",
        "frac_bw": (m.bytes_moved / (m.ms * 1e-3)) / peaks.bytes_per_s,
        "frac_flops": achieved / peaks.flops,
        "frac_roof": achieved / attainable_flops(intensity, peaks),
    }


def format_report(measurements: list[Measurement], peaks: Peaks | None = None) -> str:
    """A plain-text table: time, GB/s, TFLOP/s, fraction of the H200's roof and of the measured
    roof, and speed relative to torch in the same run (>1 = faster than torch)."""
    head = f"{'kernel':<22}{'shape':<24}{'dtype':<9}{'ms':>9}{'GB/s':>9}{'TFLOP/s':>9}" \
           f"{'H200 roof':>10}{'meas roof':>10}{'vs torch':>9}"
    lines = [head, "-" * len(head)]
    for m in measurements:
        h200 = roofline_fractions(m, H200_PEAKS)["frac_roof"] if m.bytes_moved and m.flops else None
        meas = roofline_fractions(m, peaks)["frac_roof"] if peaks and m.bytes_moved and m.flops else None
        cell = lambda v, f: f"{v:{f}}" if v is not None else "-"
        lines.append(f"{m.name:<22}{m.shape:<24}{m.dtype:<9}{m.ms:>9.3f}{cell(m.gbps, '9.1f'):>9}"
                     f"{cell(m.tflops, '9.2f'):>9}{cell(h200, '10.1%'):>10}{cell(meas, '10.1%'):>10}"
                     f"{cell(m.vs_torch, '9.2f'):>9}")
    return "\n".join(lines)
