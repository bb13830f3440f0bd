"""Comparisons whose failure messages teach: what was expected, what came back, where they first differ.

Each function returns ``None`` when the values agree and otherwise a short multi-line description of
the first difference. Raising (and the hint about the likely cause) is the checker's job, so these
stay reusable by every chapter.
"""
from __future__ import annotations

import math

from ._runtime import Raised, TensorInfo, Unsupported


def describe(x, limit: int = 160) -> str:
    """A short, readable rendering of a value for a message."""
    try:
        import torch
    except Exception:  # pragma: no cover
        torch = None
    if isinstance(x, TensorInfo):
        return f"tensor of shape {x.shape}, stride {x.stride}, dtype {x.dtype}"
    if torch is not None and isinstance(x, torch.Tensor):
        return f"tensor of shape {tuple(x.shape)}, stride {tuple(x.stride())}, dtype {str(x.dtype).replace('torch.', '')}"
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def same_value(got, expected) -> str | None:
    """Exact equality for plain data (ints, tuples, lists, None, bools, strings).

    Containers are compared element by element, so the message names the first differing position.
    A list where a tuple was expected is accepted (the *values* are what the exercise is about).
    """
    if isinstance(got, (Raised, Unsupported)):
        return f"expected {describe(expected)}\n     got {describe(got)}"
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)):
            return f"expected a sequence {describe(expected)}\n     got {describe(got)} (type {type(got).__name__})"
        if len(got) != len(expected):
            return f"expected {len(expected)} entries {describe(expected)}\n     got {len(got)} entries {describe(got)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            inner = same_value(g, e)
            if inner is not None:
                return f"first difference at position {i}: expected {describe(e)}, got {describe(g)}\n" \
                       f"  expected {describe(expected)}\n       got {describe(got)}"
        return None
    if isinstance(expected, bool) or expected is None:
        return None if got is expected else f"expected {describe(expected)}\n     got {describe(got)}"
    if isinstance(expected, int):
        if isinstance(got, bool) or not isinstance(got, int) or got != expected:
            return f"expected {describe(expected)}\n     got {describe(got)}"
        return None
    if isinstance(expected, float):
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return f"expected {describe(expected)}\n     got {describe(got)}"
        if math.isnan(expected) and math.isnan(got):
            return None
        return None if math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9) else f"expected {expected!r}\n     got {got!r}"
    return None if got == expected else f"expected {describe(expected)}\n     got {describe(got)}"


def _index_of(flat_index: int, shape) -> tuple[int, ...]:
    idx = []
    for s in reversed(shape):
        idx.append(flat_index % s if s else 0)
        flat_index //= max(s, 1)
    return tuple(reversed(idx))


def close_tensors(got, expected, *, rtol: float | None = None, atol: float | None = None, check_dtype: bool = True) -> str | None:
    """Compare a returned tensor (``TensorInfo`` or ``torch.Tensor``) with the expected one.

    Checks shape, then dtype, then values (``torch.testing.assert_close`` tolerances by default),
    and reports the first mismatching index, the number of mismatches and the largest error.
    """
    import torch

    if isinstance(got, (Raised, Unsupported)) or got is None:
        return f"expected a tensor of shape {tuple(expected.shape)}\n     got {describe(got)}"
    values = got.values if isinstance(got, TensorInfo) else got
    if not isinstance(values, torch.Tensor):
        return f"expected a tensor of shape {tuple(expected.shape)}, got {describe(got)} (type {type(got).__name__})"
    values = values.detach().cpu()
    expected = expected.detach().cpu()
    if tuple(values.shape) != tuple(expected.shape):
        return f"wrong shape: expected {tuple(expected.shape)}, got {tuple(values.shape)}"
    if check_dtype and values.dtype != expected.dtype:
        return f"wrong dtype: expected {str(expected.dtype).replace('torch.', '')}, got {str(values.dtype).replace('torch.', '')}"
    if values.numel() == 0:
        return None
    if values.device.type == "meta":
        return "got a meta tensor (no values)"
    e = expected.to(torch.float64) if expected.is_floating_point() else expected
    g = values.to(e.dtype)
    if expected.is_floating_point():
        default_rtol, default_atol = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
                                      torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}.get(expected.dtype, (1e-5, 1e-8))
        rtol = default_rtol if rtol is None else rtol
        atol = default_atol if atol is None else atol
        bad = ~(torch.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True))
    else:
        bad = g != e
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None
    flat = int(bad.flatten().nonzero()[0])
    idx = _index_of(flat, tuple(expected.shape))
    ev, gv = e.flatten()[flat].item(), g.flatten()[flat].item()
    msg = (f"{n_bad} of {expected.numel()} elements differ; first at index {idx}: expected {ev!r}, got {gv!r}")
    if expected.is_floating_point():
        finite = torch.isfinite(g) & torch.isfinite(e)
        if bool(finite.any()):
            err = (g - e).abs()[finite].max().item()
            msg += f"\n  largest |error| {err:.3g} (rtol={rtol:g}, atol={atol:g})"
        if bool((~torch.isfinite(g) & torch.isfinite(e)).any()):
            msg += "\n  your result has inf/nan where the expected one is finite"
    return msg
