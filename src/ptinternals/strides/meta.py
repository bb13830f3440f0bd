"""Tensor metadata algebra: sizes, strides and storage offsets, with no data at all.

Every view operation in PyTorch is metadata arithmetic: it takes ``(sizes, strides, storage_offset)``
and returns new ones over the *same* storage. This module holds those algorithms as pure functions on
tuples of ints, so each can be read (and re-implemented) on its own:

==========================  =====================================================================
function                    mirrors (PyTorch source)
==========================  =====================================================================
``contiguous_strides``      ``c10::contiguous_strides`` / ``TensorImpl::empty_tensor_restride``
``storage_index``           ``TensorAccessor`` indexing: ``offset + sum(i_k * stride_k)``
``is_contiguous``           ``c10::TensorImpl::compute_contiguous`` (size-1 dims are skipped)
``infer_size``              ``at::infer_size`` (the ``-1`` in ``view(-1, 4)``)
``view_strides``            ``at::detail::computeStride`` (aten/src/ATen/TensorUtils.cpp)
``permute_meta``            ``at::native::permute``
``broadcast_shapes``        ``at::infer_size`` for two shapes / ``torch.broadcast_shapes``
``expand_meta``             ``at::inferExpandGeometry`` (aten/src/ATen/ExpandUtils.cpp)
``slice_meta``              ``at::native::slice`` (clamping like Python slices)
``select_meta``             ``at::native::select``
``unfold_meta``             ``at::native::unfold``
==========================  =====================================================================

Conventions: a *shape* is a tuple of non-negative ints, *strides* a tuple of ints of the same length
(in elements, not bytes), an *offset* a non-negative int. Invalid input raises ``ValueError`` (or
``IndexError`` for an index out of range) with a message that names the problem.
"""
from __future__ import annotations

from typing import Sequence

Shape = tuple[int, ...]


# --------------------------------------------------------------------------------------------
# validation helpers (shared by every function below)
# --------------------------------------------------------------------------------------------
def _as_int(x, what: str) -> int:
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise TypeError(f"{what} must be an int, got {type(x).__name__} {x!r}")
    return x.__index__()


def check_shape(shape: Sequence[int], name: str = "shape", allow_minus_one: bool = False) -> Shape:
    """Return ``shape`` as a tuple of ints, or raise naming the first bad entry."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ints, got {type(shape).__name__} {shape!r}")
    out = tuple(_as_int(s, f"{name}[{i}]") for i, s in enumerate(shape))
    for i, s in enumerate(out):
        if s < 0 and not (allow_minus_one and s == -1):
            raise ValueError(f"{name}[{i}] must be >= 0, got {s} (in {name}={out})")
    return out


def check_strides(strides: Sequence[int], shape: Shape, name: str = "strides") -> Shape:
    """Strides must be ints, one per dimension. (Negative strides do not exist in PyTorch.)"""
    if isinstance(strides, (str, bytes)) or not hasattr(strides, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ints, got {type(strides).__name__} {strides!r}")
    out = tuple(_as_int(s, f"{name}[{i}]") for i, s in enumerate(strides))
    if len(out) != len(shape):
        raise ValueError(f"{name} has {len(out)} entries but shape {shape} has {len(shape)} dims")
    for i, s in enumerate(out):
        if s < 0:
            raise ValueError(f"{name}[{i}] must be >= 0 (PyTorch has no negative strides), got {s}")
    return out


def _wrap_dim(dim: int, ndim: int, name: str = "dim") -> int:
    """``dim`` may be negative, like Python indexing: -1 is the last dimension."""
    dim = _as_int(dim, name)
    lo, hi = (-ndim, ndim - 1) if ndim > 0 else (-1, 0)
    if not lo <= dim <= hi:
        raise IndexError(f"{name} {dim} out of range for a tensor with {ndim} dims (expected {lo}..{hi})")
    return dim % ndim if ndim > 0 else 0


def numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# --------------------------------------------------------------------------------------------
# layout of a fresh tensor
# --------------------------------------------------------------------------------------------
def contiguous_strides(shape: Sequence[int]) -> Shape:
    """Row-major ("C-contiguous") strides for ``shape``: the last dim moves fastest.

    ``stride[k] = prod(shape[k+1:])``, with one PyTorch detail: a size-0 dim counts as size 1 in the
    product, so ``torch.empty(3, 0, 2).stride() == (2, 2, 1)`` rather than ``(0, 2, 1)``.
    """
    shape = check_shape(shape)
    strides = [0] * len(shape)
    running = 1
    for k in range(len(shape) - 1, -1, -1):  # walk from the innermost dim outwards
        strides[k] = running
        running *= max(shape[k], 1)
    return tuple(strides)


def channels_last_strides(shape: Sequence[int]) -> Shape:
    """Strides of ``memory_format=torch.channels_last`` for a 4-D NCHW shape: C moves fastest.

    Mirrors ``c10::get_channels_last_strides_2d``: order of increasing stride is C, W, H, N.
    """
    shape = check_shape(shape)
    if len(shape) != 4:
        raise ValueError(f"channels_last needs a 4-D (N, C, H, W) shape, got {len(shape)} dims: {shape}")
    n, c, h, w = shape  # no max(size, 1) here, unlike contiguous_strides: torch does not clamp
    return (h * w * c, 1, w * c, c)


def storage_index(index: Sequence[int], shape: Sequence[int], strides: Sequence[int], storage_offset: int = 0) -> int:
    """Where element ``index`` lives in the flat storage: ``storage_offset + sum(index[k] * strides[k])``.

    Indices may be negative (Python style); out-of-range indices raise ``IndexError``.
    """
    shape = check_shape(shape)
    strides = check_strides(strides, shape)
    storage_offset = _as_int(storage_offset, "storage_offset")
    if storage_offset < 0:
        raise ValueError(f"storage_offset must be >= 0, got {storage_offset}")
    index = tuple(_as_int(i, f"index[{k}]") for k, i in enumerate(index))
    if len(index) != len(shape):
        raise IndexError(f"index {index} has {len(index)} entries but the tensor has {len(shape)} dims {shape}")
    pos = storage_offset
    for k, (i, size, stride) in enumerate(zip(index, shape, strides)):
        if not -size <= i < size:
            raise IndexError(f"index {i} is out of bounds for dim {k} with size {size}")
        pos += (i % size) * stride
    return pos


# --------------------------------------------------------------------------------------------
# contiguity
# --------------------------------------------------------------------------------------------
def is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """PyTorch's rule (``TensorImpl::compute_contiguous``).

    A tensor with no elements is contiguous. Otherwise walk from the last dim to the first, skipping
    dims of size 1 (their stride is never used to reach another element, so any value is fine), and
    require ``stride == product of the sizes to its right``.
    """
    shape = check_shape(shape)
    strides = check_strides(strides, shape)
    if numel(shape) == 0:
        return True
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def is_channels_last(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """True when a 4-D tensor is laid out as NHWC (``is_contiguous(memory_format=channels_last)``)."""
    shape = check_shape(shape)
    strides = check_strides(strides, shape)
    if len(shape) != 4:
        return False
    expected = 1  # note: unlike is_contiguous, no shortcut for empty tensors (compute_channels_last_contiguous_2d)
    for d in (1, 3, 2, 0):  # C, W, H, N: innermost first
        if shape[d] == 1:
            continue
        if strides[d] != expected:
            return False
        expected *= shape[d]
    return True


# --------------------------------------------------------------------------------------------
# view: the heart of the chapter
# --------------------------------------------------------------------------------------------
def infer_size(new_shape: Sequence[int], total: int) -> Shape:
    """Resolve a single ``-1`` in ``new_shape`` so the element count equals ``total`` (``at::infer_size``)."""
    new_shape = check_shape(new_shape, "new shape", allow_minus_one=True)
    total = _as_int(total, "numel")
    minus = [i for i, s in enumerate(new_shape) if s == -1]
    if len(minus) > 1:
        raise ValueError(f"only one dimension can be inferred (-1), got {new_shape}")
    known = numel(s for s in new_shape if s != -1)
    if minus:
        if known == 0:
            raise ValueError(f"cannot infer the -1 in {new_shape}: the other sizes multiply to 0")
        if total % known:
            raise ValueError(f"shape {new_shape} is invalid for input of size {total}")
        out = list(new_shape)
        out[minus[0]] = total // known
        return tuple(out)
    if known != total:
        raise ValueError(f"shape {new_shape} is invalid for input of size {total}")
    return new_shape


def view_strides(shape: Sequence[int], strides: Sequence[int], new_shape: Sequence[int]) -> Shape | None:
    """Strides that let ``new_shape`` view the same memory, or ``None`` when no view exists.

    This is ``at::detail::computeStride`` (aten/src/ATen/TensorUtils.cpp). Idea: split the old dims
    into *chunks* of dims that are contiguous with each other (``stride[d] == stride[d+1] *
    size[d+1]``). Memory inside a chunk is one evenly-strided run, so it can be re-cut into any
    sizes; a new dim may never straddle two chunks. Size-1 old dims never break a chunk. ``-1`` in
    ``new_shape`` is resolved first (``infer_size``).
    """
    shape = check_shape(shape)
    strides = check_strides(strides, shape)
    total = numel(shape)
    new_shape = infer_size(new_shape, total)

    if not shape:  # a 0-dim tensor (one element) views as any all-ones shape, strides 1
        return (1,) * len(new_shape)
    if total == 0:  # no elements: keep the strides if the shape is unchanged, else as if contiguous
        return strides if new_shape == shape else contiguous_strides(new_shape)

    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    # The chunk being walked ends at old dim `tensor_d`; `chunk_base_stride` is its innermost stride.
    chunk_base_stride = strides[-1]
    tensor_numel = 1  # elements in the current chunk of old dims
    view_numel = 1  # elements covered so far by new dims inside this chunk
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[tensor_d]
        # A chunk ends at the outermost dim, or where the next-outer dim is not contiguous with this
        # one. Size-1 dims never end a chunk: their stride is irrelevant.
        chunk_ends = tensor_d == 0 or (
            shape[tensor_d - 1] != 1 and strides[tensor_d - 1] != tensor_numel * chunk_base_stride
        )
        if chunk_ends:
            # Cut the chunk into new dims, innermost first, until they cover its elements.
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None  # a new dim would straddle two chunks: no view possible
            if tensor_d > 0:
                chunk_base_stride = strides[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(new_strides)


def explain_view_failure(shape: Sequence[int], strides: Sequence[int], new_shape: Sequence[int]) -> str:
    """A sentence saying why ``view`` is impossible, naming the contiguous chunks of the old dims."""
    shape = check_shape(shape)
    strides = check_strides(strides, shape)
    chunks, current = [], [len(shape) - 1] if shape else []
    for d in range(len(shape) - 2, -1, -1):
        inner = current[0]
        run = numel(shape[inner : current[-1] + 1])
        if shape[d] == 1 or strides[d] == strides[current[-1]] * run:
            current.insert(0, d)
        else:
            chunks.insert(0, current)
            current = [d]
    if current:
        chunks.insert(0, current)
    described = ", ".join(f"dims {c[0]}..{c[-1]} (sizes {tuple(shape[i] for i in c)})" for c in chunks)
    return (
        f"view of shape {tuple(shape)} with strides {tuple(strides)} as {tuple(new_shape)} is impossible: "
        f"memory is {len(chunks)} evenly-strided chunk(s): {described}; every new dim must fit inside "
        f"one chunk. Use .reshape() (which copies here) or .contiguous().view(...)."
    )


# --------------------------------------------------------------------------------------------
# other views
# --------------------------------------------------------------------------------------------
def permute_meta(shape: Sequence[int], strides: Sequence[int], dims: Sequence[int]) -> tuple[Shape, Shape]:
    """Reorder dims: ``new_shape[i] = shape[dims[i]]``, same for strides. No data moves."""
    shape = check_shape(shape)
    strides = check_strides(strides, shape)
    dims = tuple(_wrap_dim(d, len(shape), f"dims[{i}]") for i, d in enumerate(dims))
    if len(dims) != len(shape):
        raise ValueError(f"permute needs {len(shape)} dims, got {len(dims)}: {dims}")
    if sorted(dims) != list(range(len(shape))):
        raise ValueError(f"dims {dims} must be a permutation of 0..{len(shape) - 1} (a dim repeats or is missing)")
    return tuple(shape[d] for d in dims), tuple(strides[d] for d in dims)


def transpose_meta(shape: Sequence[int], strides: Sequence[int], dim0: int, dim1: int) -> tuple[Shape, Shape]:
    """Swap two dims (``Tensor.transpose``), a special case of ``permute_meta``."""
    shape = check_shape(shape)
    d0, d1 = _wrap_dim(dim0, len(shape), "dim0"), _wrap_dim(dim1, len(shape), "dim1")
    order = list(range(len(shape)))
    order[d0], order[d1] = order[d1], order[d0]
    return permute_meta(shape, strides, order)


def broadcast_shapes(*shapes: Sequence[int]) -> Shape:
    """The shape two or more tensors broadcast to (NumPy rules, aligned from the right)."""
    shapes = [check_shape(s, f"shapes[{i}]") for i, s in enumerate(shapes)]
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for s in shapes:
        for i, size in enumerate(s):
            d = ndim - len(s) + i
            if out[d] == 1:
                out[d] = size
            elif size != 1 and size != out[d]:
                raise ValueError(f"shapes {tuple(tuple(x) for x in shapes)} do not broadcast: dim {d} has sizes {out[d]} and {size}")
    return tuple(out)


def expand_meta(shape: Sequence[int], strides: Sequence[int], new_shape: Sequence[int]) -> tuple[Shape, Shape]:
    """Broadcast without copying: stride 0 repeats an element (``at::inferExpandGeometry``).

    Walks the dims right to left, aligned at the right. A size-1 dim expanded to ``n`` gets stride 0;
    ``-1`` keeps a size. A new leading dim gets stride 0 when its size is not 1; a new size-1 leading
    dim gets the stride it would have had contiguously (``size[i+1] * stride[i+1]``), exactly as
    ATen does (for a 0-dim input that is 0).
    """
    shape = check_shape(shape)
    strides = check_strides(strides, shape)
    new_shape = check_shape(new_shape, "new shape", allow_minus_one=True)
    ndim = len(new_shape)
    if ndim < len(shape):
        raise ValueError(f"expand: the number of sizes ({ndim}) must be >= the number of dims ({len(shape)})")
    out_shape, out_strides = [0] * ndim, [0] * ndim
    for i in range(ndim - 1, -1, -1):
        dim = len(shape) - (ndim - i)  # the old dim aligned with new dim i (negative: a new dim)
        target = new_shape[i]
        if dim >= 0:
            size, stride = shape[dim], strides[dim]
        else:
            if target == -1:
                raise ValueError(f"expand: -1 is not allowed for a new leading dim (dim {i})")
            size, stride = 1, (out_shape[i + 1] * out_strides[i + 1] if i + 1 < ndim else 0)
        if target == -1:
            target = size
        if size != target:
            if size != 1:
                raise ValueError(
                    f"expand: size {size} of dim {dim} can only expand to itself (or from size 1), got {target}"
                )
            size, stride = target, 0
        out_shape[i], out_strides[i] = size, stride
    return tuple(out_shape), tuple(out_strides)


def slice_meta(
    shape: Sequence[int], strides: Sequence[int], offset: int, dim: int, start: int | None, stop: int | None, step: int = 1
) -> tuple[Shape, Shape, int]:
    """``x[..., start:stop:step, ...]`` on one dim: returns ``(shape, strides, offset)``.

    Python slice semantics (negative bounds count from the end, out-of-range bounds clamp), step > 0
    (PyTorch has no negative steps). Mirrors ``at::native::slice``.
    """
    shape = check_shape(shape)
    strides = check_strides(strides, shape)
    offset = _as_int(offset, "offset")
    if not shape:
        raise IndexError("slice: cannot slice a 0-dim tensor")
    d = _wrap_dim(dim, len(shape))
    step = _as_int(step, "step")
    if step <= 0:
        raise ValueError(f"slice step must be positive (PyTorch has no negative strides), got {step}")
    start, stop, _ = slice(start, stop, step).indices(shape[d])
    length = max(0, (stop - start + step - 1) // step)
    new_shape, new_strides = list(shape), list(strides)
    new_shape[d] = length
    new_strides[d] = strides[d] * step
    new_offset = offset + (start * strides[d] if length > 0 else 0)
    return tuple(new_shape), tuple(new_strides), new_offset


def narrow_meta(
    shape: Sequence[int], strides: Sequence[int], offset: int, dim: int, start: int, length: int
) -> tuple[Shape, Shape, int]:
    """``Tensor.narrow(dim, start, length)``: a slice that must fit (no clamping)."""
    shape = check_shape(shape)
    if not shape:
        raise IndexError("narrow: cannot narrow a 0-dim tensor")
    d = _wrap_dim(dim, len(shape))
    start, length = _as_int(start, "start"), _as_int(length, "length")
    if start < 0:
        start += shape[d]
    if length < 0 or not 0 <= start <= shape[d] - length:
        raise IndexError(f"narrow: start ({start}) + length ({length}) exceeds dim {d} of size {shape[d]}")
    return slice_meta(shape, strides, offset, d, start, start + length, 1)


def select_meta(shape: Sequence[int], strides: Sequence[int], offset: int, dim: int, index: int) -> tuple[Shape, Shape, int]:
    """``x.select(dim, index)`` (``x[:, i]``): drop the dim, move the offset."""
    shape = check_shape(shape)
    strides = check_strides(strides, shape)
    if not shape:
        raise IndexError("select: cannot select from a 0-dim tensor")
    d = _wrap_dim(dim, len(shape))
    index = _as_int(index, "index")
    if not -shape[d] <= index < shape[d]:
        raise IndexError(f"select: index {index} is out of bounds for dim {d} with size {shape[d]}")
    index %= shape[d]
    new_shape = shape[:d] + shape[d + 1 :]
    new_strides = strides[:d] + strides[d + 1 :]
    return new_shape, new_strides, _as_int(offset, "offset") + index * strides[d]


def unfold_meta(shape: Sequence[int], strides: Sequence[int], dim: int, size: int, step: int) -> tuple[Shape, Shape]:
    """Sliding windows (``Tensor.unfold``): dim ``dim`` becomes the window *count* (stride ``step *
    stride``) and a new last dim of length ``size`` walks inside a window (the old stride)."""
    shape = check_shape(shape)
    strides = check_strides(strides, shape)
    size, step = _as_int(size, "size"), _as_int(step, "step")
    if step <= 0:
        raise ValueError(f"unfold step must be > 0, got {step}")
    if not shape:  # a 0-dim tensor unfolds as if it were 1-D of length 1
        shape, strides, d = (1,), (1,), 0
    else:
        d = _wrap_dim(dim, len(shape))
    if size < 0 or size > shape[d]:
        raise ValueError(f"unfold: window size {size} must be between 0 and the size of dim {d} ({shape[d]})")
    count = (shape[d] - size) // step + 1
    new_shape = shape[:d] + (count,) + shape[d + 1 :] + (size,)
    new_strides = strides[:d] + (strides[d] * step,) + strides[d + 1 :] + (strides[d],)
    return new_shape, new_strides


def storage_extent(shape: Sequence[int], strides: Sequence[int], offset: int = 0) -> int:
    """Storage elements a view needs: ``1 + offset + sum((size-1) * stride)`` (0 if it has no elements).

    This is the bound ``as_strided`` checks (``at::native::checkInBoundsForStorage``).
    """
    shape = check_shape(shape)
    strides = check_strides(strides, shape)
    if numel(shape) == 0:
        return 0
    return 1 + _as_int(offset, "offset") + sum((s - 1) * st for s, st in zip(shape, strides))
