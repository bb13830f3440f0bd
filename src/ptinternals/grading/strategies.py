"""Hypothesis strategies for awkward tensors, shared by the tests and the hidden graders.

Everything a metadata bug hides behind: size-0 and size-1 dims, non-power-of-two sizes, and
non-contiguous layouts (permuted, sliced with steps, expanded with stride 0, offset into storage).
A *layout* is ``(shape, strides, offset)`` that real torch can build with ``as_strided`` over a
large enough storage, so expected values always come from torch itself.
"""
from __future__ import annotations

from hypothesis import strategies as st

# Sizes biased to the cases that break code: 0, 1, small primes, non-powers of two.
SIZES = st.sampled_from([0, 1, 1, 2, 3, 4, 5, 7])
NONZERO_SIZES = st.sampled_from([1, 1, 2, 3, 4, 5, 7])


def shapes(min_dims: int = 0, max_dims: int = 4, allow_zero: bool = True) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(SIZES if allow_zero else NONZERO_SIZES, min_size=min_dims, max_size=max_dims).map(tuple)


def contiguous_strides(shape):
    strides, running = [], 1
    for s in reversed(shape):
        strides.append(running)
        running *= max(s, 1)
    return tuple(reversed(strides))


@st.composite
def layouts(draw, min_dims: int = 0, max_dims: int = 4, allow_zero: bool = True, allow_overlap: bool = True):
    """A ``(shape, strides, offset)`` reachable by real view ops from a contiguous tensor.

    Built the way real code builds them: start contiguous, then permute, slice with steps, and (when
    ``allow_overlap``) expand size-1 dims to stride 0.
    """
    shape = list(draw(shapes(min_dims, max_dims, allow_zero)))
    # Start from a bigger contiguous parent so slicing has room: each dim gets extra slack.
    slack = [draw(st.sampled_from([0, 0, 1, 2])) for _ in shape]
    steps = [draw(st.sampled_from([1, 1, 1, 2, 3])) for _ in shape]
    parent = [s * k + extra for s, k, extra in zip(shape, steps, slack)]
    strides = list(contiguous_strides(parent))
    offset = 0
    for d in range(len(shape)):
        start = draw(st.integers(0, slack[d])) if shape[d] else 0
        offset += start * strides[d]
        strides[d] *= steps[d]
    if shape:
        order = draw(st.permutations(range(len(shape))))
        shape = [shape[i] for i in order]
        strides = [strides[i] for i in order]
    if allow_overlap:
        for d in range(len(shape)):
            if shape[d] == 1 and draw(st.booleans()):
                shape[d] = draw(st.sampled_from([2, 3]))
                strides[d] = 0  # expanded: every index reads the same element
    if any(s == 0 for s in shape):
        offset = 0 if draw(st.booleans()) else offset
    return tuple(shape), tuple(strides), offset


def factorizations(n: int, max_dims: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes with exactly ``n`` elements (size-1 dims sprinkled in; sometimes one ``-1``)."""

    @st.composite
    def build(draw):
        if n == 0:  # any shape with a zero in it
            dims = list(draw(shapes(1, max_dims, allow_zero=True)))
            dims[draw(st.integers(0, len(dims) - 1))] = 0
            return tuple(dims)
        dims, rest = [], n
        for _ in range(draw(st.integers(0, max_dims - 1))):
            d = draw(st.sampled_from([d for d in range(1, rest + 1) if rest % d == 0]))
            dims.append(d)
            rest //= d
        dims.append(rest)
        if draw(st.booleans()):
            dims.insert(draw(st.integers(0, len(dims))), 1)
        shape = tuple(draw(st.permutations(dims)))
        if draw(st.integers(0, 4)) == 0:  # occasionally ask for -1 inference
            i = draw(st.integers(0, len(shape) - 1))
            shape = shape[:i] + (-1,) + shape[i + 1 :]
        return shape

    return build()
