"""Shared strategies and helpers for the autograd chapter's tests."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from ptinternals.autograd import Variable

SIZES = st.sampled_from([1, 1, 2, 3, 5])
SIZES_WITH_ZERO = st.sampled_from([0, 1, 1, 2, 3, 5])


@st.composite
def broadcast_shapes(draw, n: int = 2, min_dims: int = 0, max_dims: int = 3, allow_zero: bool = True):
    """``n`` shapes that broadcast together: each drops some leading dims of a base shape and sets
    some dims to 1. Returns ``(base, [shape_1, ..., shape_n])`` where base is the broadcast result
    only if no operand keeps every dim; callers use torch.broadcast_shapes for the true result."""
    sizes = SIZES_WITH_ZERO if allow_zero else SIZES
    base = tuple(draw(st.lists(sizes, min_size=min_dims, max_size=max_dims)))
    shapes = []
    for _ in range(n):
        drop = draw(st.integers(0, len(base)))
        shape = [1 if draw(st.booleans()) and draw(st.booleans()) else s for s in base[drop:]]
        shapes.append(tuple(shape))
    return base, shapes


def make_tensor(shape, seed: int, dtype=torch.float64, non_contiguous: bool = False) -> torch.Tensor:
    """Random values; ``non_contiguous`` builds the same shape as a transposed (or strided) view."""
    g = torch.Generator().manual_seed(seed)
    if non_contiguous and len(shape) >= 2:
        t = torch.randn(tuple(reversed(shape)), generator=g, dtype=dtype).transpose(0, -1)
        if len(shape) > 2:
            t = torch.randn(*shape[:-2], shape[-1], shape[-2], generator=g, dtype=dtype).transpose(-1, -2)
        return t
    if non_contiguous and len(shape) == 1:
        return torch.randn(shape[0] * 2, generator=g, dtype=dtype)[::2]
    return torch.randn(shape, generator=g, dtype=dtype)


def as_tensor(g):
    """A gradient from either engine as a plain tensor (None stays None)."""
    if g is None:
        return None
    return g.data if isinstance(g, Variable) else g.detach()


def assert_grads_close(ours, theirs, shapes=None, msg: str = ""):
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        a, b = as_tensor(a), as_tensor(b)
        if a is None or b is None:
            shape = shapes[i] if shapes is not None else (a if a is not None else b).shape
            a = torch.zeros(shape, dtype=torch.float64) if a is None else a
            b = torch.zeros(shape, dtype=torch.float64) if b is None else b
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9, equal_nan=True,
                                   msg=lambda m, i=i: f"{msg} grad {i}: {m}")
