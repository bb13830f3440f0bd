"""The two kernels under GradScaler: the inf/NaN check + unscale, and the scale update.

``torch.amp.GradScaler`` keeps its state in two 0-dim tensors on the gradients' device, so that a
training step never waits for the GPU (no ``.item()``): ``scale`` (float32) and ``growth_tracker``
(int32, the number of consecutive good steps). Two ATen kernels read and write them:

``_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)``
    for every gradient element: if it is inf or NaN write ``found_inf = 1.0``; then multiply it by
    ``inv_scale`` in the "op math" type (float32 for fp16/bf16 gradients) and store it back in place.
    The multiply happens even when an inf was found: the step will be skipped anyway.

``_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval)``
    if found_inf:  scale *= backoff_factor ; growth_tracker = 0             (the step was skipped)
    else:          growth_tracker += 1
                   if growth_tracker == growth_interval:
                       scale *= growth_factor (only if the result is finite in fp32); growth_tracker = 0

The factors are doubles; ``scale * factor`` is computed in double and rounded to float32 on store.
With the defaults (2.0, 0.5) every product is exact, so the scale stays a power of two.

Mirrors aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp and aten/src/ATen/native/cuda/AmpKernels.cu.
``update_scale`` is the same rule on plain Python numbers (the chapter's exercise); the ``*_`` tensor
versions are what ``ptinternals.amp.grad_scaler.GradScaler`` calls.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .formats import round_to_format


def _to_fp32(x: float) -> float:
    """Round a Python float (double) to the nearest float32 value (ties to even), overflowing to +-inf
    like C++'s ``static_cast<float>``: the chapter's own encoder, in plain Python."""
    return round_to_format(x, "fp32")


def _check_factors(growth_factor: float, backoff_factor: float, growth_interval: int) -> None:
    for name, v in (("growth_factor", growth_factor), ("backoff_factor", backoff_factor)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise TypeError(f"{name} must be a finite float, got {v!r}")
    if isinstance(growth_interval, bool) or not isinstance(growth_interval, int):
        raise TypeError(f"growth_interval must be an int, got {type(growth_interval).__name__}")


def update_scale(
    scale: float,
    growth_tracker: int,
    found_inf: bool,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
) -> tuple[float, int]:
    """One ``_amp_update_scale_`` on Python numbers: returns ``(new_scale, new_growth_tracker)``.

    ``scale`` is a float32 value (the result is rounded to float32 too); ``found_inf`` says whether
    this iteration's gradients held an inf or NaN.
    """
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float, got {type(scale).__name__}")
    if isinstance(growth_tracker, bool) or not isinstance(growth_tracker, int):
        raise TypeError(f"growth_tracker must be an int, got {type(growth_tracker).__name__}")
    if growth_tracker < 0:
        raise ValueError(f"growth_tracker must be >= 0, got {growth_tracker}")
    _check_factors(growth_factor, backoff_factor, growth_interval)
    scale = _to_fp32(float(scale))
    if found_inf:
        return _to_fp32(scale * backoff_factor), 0  # skipped step: back off, restart the count
    successful = growth_tracker + 1  # this step succeeded
    if successful == growth_interval:
        new_scale = _to_fp32(scale * growth_factor)
        # do not grow the scale past float32's range to inf
        return (new_scale if math.isfinite(new_scale) else scale), 0
    return scale, successful


def amp_update_scale_(
    scale: torch.Tensor,
    growth_tracker: torch.Tensor,
    found_inf: torch.Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
) -> torch.Tensor:
    """In-place tensor version of ``update_scale`` (no host sync): updates ``scale`` and ``growth_tracker``.

    scale: 0-dim float32; growth_tracker: 0-dim int32; found_inf: 0-dim float32 (> 0 means skipped).
    """
    for name, t, dt in (
        ("scale", scale, torch.float32),
        ("growth_tracker", growth_tracker, torch.int32),
        ("found_inf", found_inf, torch.float32),
    ):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.numel() != 1 or t.dtype != dt:
            raise ValueError(f"{name} must be a 1-element {dt} tensor, got shape {tuple(t.shape)} {t.dtype}")
    _check_factors(growth_factor, backoff_factor, growth_interval)
    found = found_inf != 0
    # scale (float) * factor (double), computed in double and rounded to float on store: like the C++
    backed_off = (scale.double() * backoff_factor).float()
    successful = growth_tracker + 1
    grow_now = (~found) & (successful == growth_interval)
    grown = (scale.double() * growth_factor).float()
    grown = torch.where(torch.isfinite(grown), grown, scale)
    new_scale = torch.where(found, backed_off, torch.where(grow_now, grown, scale))
    new_tracker = torch.where(found | grow_now, torch.zeros_like(successful), successful)
    scale.copy_(new_scale)
    growth_tracker.copy_(new_tracker)
    return scale


@torch.no_grad()
def amp_foreach_non_finite_check_and_unscale_(
    grads: Sequence[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor
) -> None:
    """Multiply each of ``grads`` by ``inv_scale`` in place; set ``found_inf`` to 1.0 if any is inf/NaN.

    ``found_inf`` is not zeroed here (the caller pre-zeroes it), so one flag can collect several
    calls. Reduced-precision grads (fp16/bf16) are multiplied in float32 and rounded back once.
    """
    if not isinstance(found_inf, torch.Tensor) or found_inf.numel() != 1 or found_inf.dtype != torch.float32:
        raise ValueError("found_inf must be a 1-element float32 tensor")
    if not isinstance(inv_scale, torch.Tensor) or inv_scale.numel() != 1 or inv_scale.dtype != torch.float32:
        raise ValueError("inv_scale must be a 1-element float32 tensor")
    for i, g in enumerate(grads):
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"grads[{i}] must be a tensor, got {type(g).__name__}")
        if not g.is_floating_point():
            raise TypeError(f"grads[{i}] must be a floating-point tensor, got {g.dtype}")
        if g.layout != torch.strided:
            raise ValueError(f"grads[{i}] must be a strided (dense) tensor, got layout {g.layout}")
        opmath = torch.float64 if g.dtype == torch.float64 else torch.float32
        val = g.to(opmath)
        if val.numel():
            non_finite = ~torch.isfinite(val).all()
            found_inf.copy_(torch.where(non_finite, torch.ones_like(found_inf), found_inf))
        # val * inv_scale in op math, rounded back to the gradient's dtype once; inv_scale == 1 keeps val
        g.copy_(torch.where(inv_scale == 1.0, val, val * inv_scale).to(g.dtype))
