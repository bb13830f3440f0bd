# %% [markdown]
# # {{title}}
#
# A PyTorch tensor is two things: a flat buffer of bytes (its **storage**) and a little metadata that
# says how to read that buffer as an n-dimensional array: **sizes**, **strides** and a **storage
# offset**. Almost every "shape" operation you use daily (`view`, `transpose`, `permute`, `expand`,
# slicing, `unfold`) only writes new metadata over the *same* storage. Knowing this tells you when an
# operation is free, when it silently copies, and why `view` sometimes refuses.
#
# By the end of this chapter you will have re-implemented the metadata algorithms PyTorch runs in
# C++ (`c10::TensorImpl`, ATen's `computeStride`), and used strides for real work: sliding windows
# and the im2col trick behind convolution, with zero copies.
#
# **How this notebook works.** Run the cells in order. Each exercise has an *answer cell* (replace
# `raise NotImplementedError()` with your code) followed by a *check cell* that gives instant
# feedback. Only the code inside answer cells is graded; define any helper you need inside the same
# answer cell. The grader runs your code in a separate process, without the course's reference
# implementation, on many more cases than the visible ones, and compares with real PyTorch. Quiz
# answers are recorded in `strides.answers.json` beside this notebook: *practice* questions check your
# answer at once and count no points; *graded* ones only record it (the last answer counts) and are
# scored when your notebook is graded.

# %% [setup]
import torch
import torch.nn.functional as F

from ptinternals.grading import check
from ptinternals.quiz import quiz_progress, show_quiz
from ptinternals.viz.strides import draw_view

torch.manual_seed(0)

# %% [markdown]
# ## 1. Storage: the flat buffer underneath
#
# `torch.arange(12.)` allocates 12 float32 values, 48 bytes, in one contiguous block. The tensor
# object points into it.

# %%
x = torch.arange(12.0)
s = x.untyped_storage()
print("bytes in storage:", s.nbytes(), "| element size:", x.element_size(), "| storage offset:", x.storage_offset())
print("address of the storage:", s.data_ptr(), "| address of x's first element:", x.data_ptr())

# %% [markdown]
# A **view** is a new tensor object over the same storage. `y = x.view(3, 4)` allocates nothing: it
# records sizes `(3, 4)` and strides `(4, 1)`, and points at the same bytes. Writing through the
# view writes into `x`.

# %%
y = x.view(3, 4)
print("same storage:", y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())
print("y._base is x:", y._base is x)
y[1, 2] = 100.0
print("x after writing y[1, 2]:", x)

# %% [markdown]
# ## 2. Sizes and strides
#
# The **stride** of a dimension is how many *elements* (not bytes) you move in storage to go one
# step along that dimension. Element `(i, j)` of `y` lives at storage position
# `storage_offset + i * stride[0] + j * stride[1]`. For a freshly allocated ("contiguous",
# row-major) tensor the last dimension moves fastest: `stride[k]` is the product of the sizes after
# `k`.
#
# The picture below shows the storage (top) and the view (bottom); each cell of the view shows the
# storage index it reads.

# %%
print("sizes", tuple(y.shape), "strides", y.stride())
draw_view(y)

# %% [markdown]
# ### {{exercise contiguous_strides}}: the strides of a fresh tensor
#
# Write `contiguous_strides(shape)` returning the strides (a tuple of ints) that `torch.empty(shape)`
# gets. Use plain Python: no torch. One PyTorch detail to match: a dimension of size 0 counts as
# size 1 in the running product, so `torch.empty(3, 0, 2).stride() == (2, 2, 1)`.

# %% [answer contiguous_strides]
def contiguous_strides(shape):
    """Row-major strides for `shape`, e.g. (2, 3, 4) -> (12, 4, 1)."""
    ### BEGIN SOLUTION
    # twin: ptinternals.strides.meta.contiguous_strides
    strides = []
    running = 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))
    ### END SOLUTION


# %% [tests contiguous_strides]
check("strides.contiguous_strides", contiguous_strides)
### BEGIN HIDDEN TESTS
check("strides.contiguous_strides", contiguous_strides, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise storage_index}}: where an element lives
#
# Write `storage_index(index, shape, strides, storage_offset)` returning the position in storage of
# element `index` (a tuple with one int per dimension). Negative indices count from the end, as in
# Python. An index outside its dimension must raise `IndexError`: reading past a view's edge would
# silently read another element, which is exactly the bug this check exists to prevent. So must an
# index with more or fewer entries than the view has dimensions (`x[i, j, k]` on a 2-d tensor raises).

# %% [answer storage_index]
def storage_index(index, shape, strides, storage_offset):
    """Storage position of element `index` of the view (shape, strides, storage_offset)."""
    ### BEGIN SOLUTION
    # twin: ptinternals.strides.meta.storage_index
    if len(index) != len(shape):
        raise IndexError(f"index {index} has {len(index)} entries for {len(shape)} dims")
    position = storage_offset
    for dim, (i, size, stride) in enumerate(zip(index, shape, strides)):
        if not -size <= i < size:
            raise IndexError(f"index {i} is out of bounds for dim {dim} with size {size}")
        position += (i % size) * stride
    return position
    ### END SOLUTION


# %% [tests storage_index]
check("strides.storage_index", storage_index)
### BEGIN HIDDEN TESTS
check("strides.storage_index", storage_index, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("strides", "q6")

# %% [markdown]
# ## 3. Transposes, permutes and contiguity
#
# `y.t()` swaps the two strides. Nothing moves in memory, so it is free, but walking the result row
# by row now jumps through storage: the tensor is **not contiguous**.

# %%
yt = y.t()
print("yt strides", yt.stride(), "| contiguous:", yt.is_contiguous(), "| same storage:",
      yt.untyped_storage().data_ptr() == y.untyped_storage().data_ptr())
draw_view(yt)

# %% [markdown]
# PyTorch calls a tensor contiguous when its strides are exactly the row-major strides of its shape,
# with two relaxations that matter in practice (`TensorImpl::compute_contiguous`):
#
# * a dimension of **size 1** is skipped: its stride is never used to reach another element, so it
#   may hold any value (`unsqueeze` and slicing produce such strides all the time);
# * a tensor with **no elements** is contiguous.
#
# ### {{exercise is_contiguous}}: PyTorch's contiguity rule
#
# Write `is_contiguous(shape, strides)` returning `True` or `False` exactly as
# `tensor.is_contiguous()` would. Plain Python only.

# %% [answer is_contiguous]
def is_contiguous(shape, strides):
    """True when (shape, strides) is row-major, skipping size-1 dims; empty tensors are contiguous."""
    ### BEGIN SOLUTION
    # twin: ptinternals.strides.meta.is_contiguous
    for size in shape:
        if size == 0:
            return True
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True
    ### END SOLUTION


# %% [tests is_contiguous]
check("strides.is_contiguous", is_contiguous)
### BEGIN HIDDEN TESTS
check("strides.is_contiguous", is_contiguous, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### Memory formats
#
# The same logical NCHW image can be stored with channels fastest ("channels last", NHWC in memory),
# which convolution kernels on GPUs often prefer. The shape does not change; the strides do.

# %%
img = torch.randn(2, 3, 4, 5)
cl = img.to(memory_format=torch.channels_last)
print("shape", tuple(cl.shape), "| NCHW strides", img.stride(), "| channels_last strides", cl.stride())
print("is_contiguous():", cl.is_contiguous(), "| channels_last contiguous:",
      cl.is_contiguous(memory_format=torch.channels_last))

# %% [quiz]
show_quiz("strides", "q1", "q2", "q8")

# %% [markdown]
# ## 4. Views versus copies, and how to tell
#
# Three tools tell a view from a copy:
#
# * `t.untyped_storage().data_ptr()`: views share it (`t.data_ptr()` is the address of the first
#   *element*, which a slice may move, so compare storages, not `data_ptr()`);
# * `t._base`: a view remembers the tensor it was made from;
# * `t._version`: a counter shared by a tensor and all its views, bumped by every in-place write.
#   Autograd records it when it saves a tensor for backward and complains if it changed.

# %%
a = torch.zeros(4, 6)
b = a[1:, ::2]  # rows 1.., every other column: a view
c = b.clone()  # a copy
for name, t in [("b", b), ("c", c)]:
    print(f"{name}: shares a's storage: {t.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()}, "
          f"_base is a: {t._base is a}, storage_offset {t.storage_offset()}, strides {t.stride()}")
print("version before:", a._version, b._version)
b.add_(1)  # writes through the view
print("version after: ", a._version, b._version, "| a.sum() =", a.sum().item())

# %% [markdown]
# ### `view` and the strides it can (and cannot) produce
#
# `view(new_shape)` never copies. It must find strides that make the new shape read the same
# elements in the same order. ATen's `computeStride` (aten/src/ATen/TensorUtils.cpp) does it like
# this: split the old dimensions into **chunks** of dimensions that are contiguous with each other
# (`stride[d] == stride[d+1] * size[d+1]`; size-1 dims never break a chunk). Inside a chunk the
# elements are one evenly strided run, so the chunk can be re-cut into any sizes with the same
# product. A new dimension may never straddle two chunks. Walk both shapes from the innermost
# dimension outwards:
#
# 1. grow the current chunk of old dims until it ends;
# 2. hand out new dims (innermost first, also taking any size-1 new dims) while they fit in the
#    chunk, giving each the stride `chunk_base_stride * (elements of the chunk covered so far)`;
# 3. if the new dims cover exactly the chunk's elements, start the next chunk; otherwise no view
#    exists.
#
# When no view exists, `reshape` falls back to a copy, and `.contiguous()` always copies a
# non-contiguous tensor. That copy is the hidden cost:

# %%
import time

big = torch.randn(2048, 2048)
for label, fn in [("view (free)", lambda: big.view(-1)), ("t().contiguous() (copies 16 MiB)", lambda: big.t().contiguous()),
                  ("t().reshape(-1) (must copy)", lambda: big.t().reshape(-1))]:
    t0 = time.perf_counter()
    for _ in range(5):
        fn()
    print(f"{label:34s} {1e3 * (time.perf_counter() - t0) / 5:7.3f} ms")

# %% [markdown]
# ### {{exercise view_strides}}: `view`'s stride computation
#
# Write `view_strides(shape, strides, new_shape)`: the strides a view of shape `new_shape` needs, or
# `None` when no view exists (where `tensor.view` raises). `new_shape` has the same number of
# elements and no `-1`. Special cases: a tensor with no elements can be viewed as any shape with no
# elements (use `contiguous_strides(new_shape)`), and a 0-dim tensor as any all-ones shape
# (strides all 1). Plain Python only. This is the chapter's main exercise: 3 points.

# %% [answer view_strides]
def view_strides(shape, strides, new_shape):
    """Strides for viewing (shape, strides) as new_shape, or None (ATen's computeStride)."""
    ### BEGIN SOLUTION
    # twin: ptinternals.strides.meta.view_strides
    if len(shape) == 0:
        return tuple(1 for _ in new_shape)
    numel = 1
    for size in shape:
        numel *= size
    if numel == 0:
        return tuple(strides) if tuple(new_shape) == tuple(shape) else contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride = strides[-1]
    tensor_numel = 1
    view_numel = 1
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[tensor_d]
        chunk_ends = tensor_d == 0 or (
            shape[tensor_d - 1] != 1 and strides[tensor_d - 1] != tensor_numel * chunk_base_stride
        )
        if chunk_ends:
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = strides[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(new_strides)
    ### END SOLUTION


# %% [tests view_strides]
check("strides.view_strides", view_strides)
### BEGIN HIDDEN TESTS
check("strides.view_strides", view_strides, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("strides", "q4", "q5", "q9", "q10")

# %% [markdown]
# ## 5. Broadcasting is stride 0
#
# `expand` makes a size-1 dimension (or a new leading one) look `n` long by giving it stride 0:
# every index along it reads the same element. Broadcasting in `a + b` does this implicitly, which
# is why adding a bias vector to a matrix costs no memory for the bias. Writing in place into such a
# tensor is refused: several of its elements are one memory cell.

# %%
col = torch.arange(3.0).view(3, 1)
wide = col.expand(3, 4)
print("expanded strides", wide.stride())
draw_view(wide)

# %%
try:
    wide.add_(1)
except RuntimeError as e:
    print("RuntimeError:", str(e).split(".")[0])

# %% [markdown]
# ### {{exercise expand_strides}}: broadcasting with stride 0
#
# Write `expand_strides(shape, strides, target)` returning `(new_shape, new_strides)` as
# `tensor.expand(target)` would, and raising `ValueError` when the shapes do not broadcast (a size
# that is not 1 can only "expand" to itself). Align the dimensions from the right; new leading
# dimensions and grown size-1 dimensions get stride 0. (Strides of size-1 dimensions are never
# used, so the checker accepts any value for them.) Plain Python only.

# %% [answer expand_strides]
def expand_strides(shape, strides, target):
    """(shape, strides) of `tensor.expand(target)`; ValueError if they do not broadcast."""
    ### BEGIN SOLUTION
    # twin: ptinternals.strides.meta.expand_meta
    if len(target) < len(shape):
        raise ValueError(f"cannot expand {len(shape)} dims to {len(target)}")
    lead = len(target) - len(shape)
    new_shape, new_strides = [], []
    for d, size in enumerate(target):
        if d < lead:
            new_shape.append(size)
            new_strides.append(0)
            continue
        old_size, old_stride = shape[d - lead], strides[d - lead]
        if size == old_size:
            new_shape.append(size)
            new_strides.append(old_stride)
        elif old_size == 1:
            new_shape.append(size)
            new_strides.append(0)
        else:
            raise ValueError(f"size {old_size} of dim {d - lead} cannot expand to {size}")
    return tuple(new_shape), tuple(new_strides)
    ### END SOLUTION


# %% [tests expand_strides]
check("strides.expand_strides", expand_strides)
### BEGIN HIDDEN TESTS
check("strides.expand_strides", expand_strides, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("strides", "q3", "q7")

# %% [markdown]
# ## 6. Slicing: narrow, select and steps
#
# `x[:, a:b:c]` keeps the dimension, moves the storage offset by `a * stride`, multiplies the
# stride by the step `c`, and shrinks the size to the number of elements picked. `x.select(d, i)`
# (that is, `x[:, i]`) removes the dimension and moves the offset by `i * stride`.

# %%
m = torch.arange(24.0).view(4, 6)
sl = m[1:, 1:5:2]
print("shape", tuple(sl.shape), "strides", sl.stride(), "offset", sl.storage_offset())
draw_view(sl)

# %% [markdown]
# ### {{exercise slice_view}}: slicing with steps
#
# Write `slice_view(shape, strides, offset, dim, start, stop, step)` returning
# `(new_shape, new_strides, new_offset)` for `x[..., start:stop:step, ...]` on dimension `dim`, with
# Python's slice rules: `start`/`stop` may be `None` or negative, and out-of-range bounds are
# clamped (`slice(start, stop, step).indices(size)` does exactly that). `step` is positive. Plain
# Python only. (The offset of an empty result is not checked.)

# %% [answer slice_view]
def slice_view(shape, strides, offset, dim, start, stop, step):
    """(shape, strides, offset) of x[..., start:stop:step, ...] on dimension `dim`."""
    ### BEGIN SOLUTION
    # twin: ptinternals.strides.meta.slice_meta
    size = shape[dim]
    start, stop, step = slice(start, stop, step).indices(size)
    length = max(0, (stop - start + step - 1) // step)
    new_shape = list(shape)
    new_strides = list(strides)
    new_shape[dim] = length
    new_strides[dim] = strides[dim] * step
    return tuple(new_shape), tuple(new_strides), offset + start * strides[dim]
    ### END SOLUTION


# %% [tests slice_view]
check("strides.slice_view", slice_view)
### BEGIN HIDDEN TESTS
check("strides.slice_view", slice_view, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 7. Strides for real work: sliding windows and im2col
#
# `x.unfold(dim, size, step)` turns a dimension into overlapping windows *without copying*: the
# window-count dimension steps by `step * stride` and a new last dimension of length `size` steps by
# the old stride. Overlapping windows mean several view elements read the same storage cell.

# %%
sig = torch.arange(8.0)
win = sig.unfold(0, 3, 2)
print(win, "strides", win.stride())
draw_view(win)

# %% [markdown]
# ### {{exercise sliding_windows}}: sliding windows as a zero-copy view
#
# Write `sliding_windows(x, size, step)`: windows of `size` elements every `step` along the **last**
# dimension of `x` (any number of dimensions, any strides, any storage offset), with the same result
# as `x.unfold(-1, size, step)`. Build it with `torch.as_strided(x, shape, strides, offset)` (or
# `x.as_strided(...)`) only: no `unfold`, no copies. The checker verifies that the result shares
# `x`'s storage.

# %% [answer sliding_windows]
def sliding_windows(x, size, step):
    """Windows along the last dim of x, as a view: same as x.unfold(-1, size, step)."""
    ### BEGIN SOLUTION
    # twin: ptinternals.strides.windows.sliding_windows
    *lead, n = x.shape
    *lead_strides, s = x.stride()
    count = (n - size) // step + 1
    return x.as_strided((*lead, count, size), (*lead_strides, s * step, s), x.storage_offset())
    ### END SOLUTION


# %% [tests sliding_windows]
check("strides.sliding_windows", sliding_windows)
### BEGIN HIDDEN TESTS
check("strides.sliding_windows", sliding_windows, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### Convolution as a matrix product
#
# A convolution multiplies every `kh x kw` patch of the image by the kernel. **im2col** lays the
# patches out as a matrix so the whole convolution is one matmul. `F.unfold` materialises that
# matrix, `kh * kw` times the image's memory. With strides, the patches are a 5-d view of the image:
# `patches[c, i, j, y, x] = image[c, y*stride + i, x*stride + j]`.
#
# ### {{exercise im2col}}: im2col as a view
#
# Write `im2col(x, kernel_size, stride)` for an image `x` of shape `(C, H, W)` (any strides: it may
# be a channels-last image) returning the view of shape `(C, kh, kw, H_out, W_out)` with
# `H_out = (H - kh) // stride + 1` (and the same for W). Use `as_strided` only.

# %% [answer im2col]
def im2col(x, kernel_size, stride):
    """Patches of x (C, H, W) as a (C, kh, kw, H_out, W_out) view."""
    ### BEGIN SOLUTION
    # twin: ptinternals.strides.windows.im2col
    kh, kw = kernel_size
    c, h, w = x.shape
    sc, sh, sw = x.stride()
    h_out = (h - kh) // stride + 1
    w_out = (w - kw) // stride + 1
    return x.as_strided((c, kh, kw, h_out, w_out), (sc, sh, sw, sh * stride, sw * stride), x.storage_offset())
    ### END SOLUTION


# %% [tests im2col]
check("strides.im2col", im2col)
### BEGIN HIDDEN TESTS
check("strides.im2col", im2col, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# With the patches as a view, a convolution is one `einsum` over them, and it matches `F.conv2d`.
# (This demo uses PyTorch's `unfold` so that it runs before you solve {{exercise im2col}}; swap in your
# `im2col` once it passes.)

# %%
image = torch.randn(3, 9, 11)
kernel = torch.randn(4, 3, 3, 3)
patches = image.unfold(1, 3, 1).unfold(2, 3, 1).permute(0, 3, 4, 1, 2)  # (C, kh, kw, Ho, Wo), a view
ours = torch.einsum("ocij,cijyx->oyx", kernel, patches)
print("matches F.conv2d:", torch.allclose(ours, F.conv2d(image[None], kernel)[0], atol=1e-5),
      "| patches share the image's storage:", patches.untyped_storage().data_ptr() == image.untyped_storage().data_ptr())

# %% [markdown]
# ## Summary
#
# * A tensor is storage plus `(sizes, strides, storage_offset)`; views change only the metadata.
# * Contiguous means row-major strides, ignoring size-1 dims; empty tensors are contiguous.
# * `view` succeeds exactly when `computeStride` finds strides; `reshape` and `.contiguous()` copy
#   otherwise, and that copy costs time and memory.
# * Broadcasting is stride 0; in-place writes into overlapping memory are refused.
# * `as_strided` turns strides into a tool: windows and im2col patches cost nothing until read.
#
# Next: {{chapter autograd}} uses the `_version` counter you met here to see how autograd catches in-place
# changes to tensors it saved.
#
# ### Your quiz score so far
# Practice answers count no points; the grader scores your last answer to each graded question (recorded in
# `strides.answers.json`).

# %% [quiz-grade]
quiz_progress("strides")
