"""Shared helpers for the kernels chapter's tests (a unique module name: tests/ has no packages).

The tests run where Triton runs: on CUDA (compiled kernels) when there is a GPU, else on the CPU
through the interpreter. ``conftest.py`` here makes ``DEVICE`` torch's default device, so plain
``torch.randn(...)`` in a test lands there; seeded inputs are drawn on the CPU and moved.
"""
from __future__ import annotations

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Kernels compute in fp32 (fp64 for fp64) and round once on store, so the error budget is about one
# rounding of the output dtype plus fp32 accumulation noise.
TOL = {
    torch.float64: dict(atol=1e-10, rtol=1e-10),
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str = "",
                 scale: float = 1.0):
    """Compare in fp64; on failure name the first bad index, expected vs got."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != expected {tuple(want.shape)}"
    tol = TOL[dtype]
    g, w = got.detach().double().cpu(), want.detach().double().cpu()
    bad = ~torch.isclose(g, w, atol=tol["atol"] * scale, rtol=tol["rtol"] * scale, equal_nan=True)
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.numel()} elements differ; first at {idx}: "
                             f"expected {w[idx].item():.6g}, got {g[idx].item():.6g} ({dtype})")


def make(shape, dtype, *, layout: str = "contiguous", seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    """A random tensor of ``shape`` in one of three layouts: contiguous, transposed (last two dims
    swapped in memory) or sliced (rows of a wider buffer, so stride(-2) > shape[-1])."""
    g = torch.Generator().manual_seed(seed)
    if layout == "contiguous" or len(shape) < 2:
        return (torch.randn(shape, generator=g, dtype=torch.float64, device="cpu") * scale).to(DEVICE, dtype)
    if layout == "transposed":
        t = torch.randn(*shape[:-2], shape[-1], shape[-2], generator=g, dtype=torch.float64, device="cpu")
        return (t * scale).to(DEVICE, dtype).transpose(-1, -2)
    if layout == "sliced":
        t = torch.randn(*shape[:-1], shape[-1] + 5, generator=g, dtype=torch.float64, device="cpu")
        return (t * scale).to(DEVICE, dtype)[..., 2:2 + shape[-1]]
    raise ValueError(layout)
