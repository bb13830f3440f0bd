# %% [markdown]
# # {{title}}
#
# Every CUDA tensor's storage lives in GPU memory that someone asked the driver for. Asking is
# expensive: `cudaMalloc` takes from microseconds to milliseconds, and `cudaFree` waits until every
# kernel queued on the device has finished. A training step creates and destroys hundreds of
# tensors, so PyTorch never calls the driver per tensor. Its **caching allocator**
# (`c10/cuda/CUDACachingAllocator.cpp`, class `DeviceCachingAllocator`) asks for big **segments**,
# carves tensors out of them as **blocks**, and keeps freed blocks cached for the next tensor of a
# similar size.
#
# That design explains numbers you meet every day: why `nvidia-smi` shows more memory than your
# tensors use, why `torch.cuda.memory_reserved()` "only grows", and why a GPU can run out of memory
# while hundreds of megabytes are free. In this chapter you will rebuild the allocator piece by
# piece (size rounding, pools, best fit, splitting, coalescing, streams, `empty_cache`,
# statistics), fix a program that runs out of memory through fragmentation, and finally assemble
# your pieces into an allocator that predicts the peak reserved memory of a training step.
#
# **No GPU needed.** The chapter runs on a CPU: the course ships a faithful Python model of the
# allocator (`ptinternals.allocator`) that replays allocation *traces* over a simulated device and
# reports the same statistics as `torch.cuda.memory_stats()`. Cells marked *GPU* run the real
# allocator when a CUDA device is present and say so when it is not.
#
# **How this notebook works.** Run the cells in order. Each exercise has an *answer cell* (replace
# `raise NotImplementedError()` with your code) followed by a *check cell* that gives instant
# feedback. Only the code inside answer cells is graded; define any helper you need inside the same
# answer cell. Later exercises may call your earlier answers ({{exercise memory_timeline}} uses all
# of them). The grader runs your code in a separate process without the course's reference model,
# on many more cases than the visible ones. Every exercise is plain Python: no torch, no numpy. Quiz
# answers are recorded in `allocator.answers.json` beside this notebook: *practice* questions check
# your answer at once and count no points; *graded* ones only record it (the last answer counts) and
# are scored when your notebook is graded.

# %% [setup]
import torch

from ptinternals.allocator.scaffold import FRAGMENTATION_CAPACITY, GiB, KiB, MiB, fragmenting_trace
from ptinternals.grading import check
from ptinternals.quiz import quiz_progress, show_quiz
from ptinternals.viz.allocator import plot_memory_timeline, plot_segment_map

HAS_CUDA = torch.cuda.is_available()
torch.manual_seed(0)

# %% [markdown]
# The demonstrations use the course's reference model. It is not available while your answers are
# graded, so your answers cannot call it.

# %%
from IPython.display import display
from torch.cuda import _memory_viz

from ptinternals.allocator import CachingAllocator, format_size, memory_summary, replay
from ptinternals.allocator.workloads import trace_allocations, training_step_trace

print("CUDA device:", torch.cuda.get_device_name(0) if HAS_CUDA else "none (CPU only: GPU cells will say so)")

# %% [markdown]
# ## 1. Why a caching allocator
#
# Let us count. The cell below runs three training steps of a small MLP with Adam **on the CPU**
# and records every tensor storage they create and destroy, as a *trace* of allocator events
# (`("alloc", id, nbytes, stream)`, `("free", id)`, ...; the format is described in
# `ptinternals.allocator.scaffold`). On a GPU the same program makes the same tensor allocations.
# Replaying the trace in the model tells us how many `cudaMalloc` calls the caching allocator
# needs for them.

# %%
mlp = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
adam = torch.optim.Adam(mlp.parameters(), lr=1e-3)
inputs, labels = torch.randn(192, 512), torch.randint(0, 10, (192,))  # a batch: 192 x 512 fp32 = 384 KiB


def three_steps():
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(mlp(inputs), labels)
        loss.backward()
        adam.step()
        adam.zero_grad(set_to_none=True)


mlp_trace = trace_allocations(three_steps)
mlp_replay = replay(mlp_trace)  # the model allocator, on a simulated 80 GiB GPU
stats = mlp_replay.allocator.memory_stats()
print("first events:", mlp_trace[:4])
print(f"tensor allocations: {stats['allocation.all.allocated']}, cudaMalloc calls: {stats['num_device_alloc']}, "
      f"cudaFree calls: {stats['num_device_free']}")
print(f"peak allocated {format_size(mlp_replay.peak_allocated)}, peak reserved {format_size(mlp_replay.peak_reserved)}")

# %% [markdown]
# A few segments serve every tensor of every step, and nothing is ever given back to the driver.
# On a GPU you can time the difference (*GPU* cell):

# %%
if HAS_CUDA:
    import time

    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # no cached blocks: the next allocation must cudaMalloc
    before = torch.cuda.memory_stats().get("num_device_alloc", 0)
    t0 = time.perf_counter()
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    fresh_us = 1e6 * (time.perf_counter() - t0)
    del x  # the block goes back to the cache, not to the driver
    t0 = time.perf_counter()
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")  # served from the cache
    torch.cuda.synchronize()
    cached_us = 1e6 * (time.perf_counter() - t0)
    del x
    after = torch.cuda.memory_stats().get("num_device_alloc", 0)
    print(f"GPU: 256 MiB with cudaMalloc: {fresh_us:.0f} us; from the cache: {cached_us:.0f} us; "
          f"cudaMalloc calls: {after - before}")
else:
    print("CPU only: no CUDA device here. On a GPU this cell times an allocation that calls cudaMalloc "
          "against one served from the cache (typically hundreds of us against a few us).")

# %% [markdown]
# ## 2. Allocated versus reserved
#
# Two numbers describe the allocator's memory:
#
# * `torch.cuda.memory_allocated()`: bytes in blocks handed out to tensors (statistic
#   `allocated_bytes`);
# * `torch.cuda.memory_reserved()`: bytes of all segments obtained with `cudaMalloc`, used or
#   cached (`reserved_bytes`). This is what other processes (and `nvidia-smi`, apart from the CUDA
#   context) see as taken.
#
# In the model: one 3 MiB tensor gets a 20 MiB segment (you will see why in section 3), and
# deleting it frees the block but keeps the segment.

# %%
alloc = CachingAllocator(8 * GiB)  # a model allocator over a simulated 8 GiB GPU
block = alloc.malloc(3 * MiB)  # torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
print(f"after malloc: allocated {format_size(alloc.memory_allocated())}, reserved {format_size(alloc.memory_reserved())}")
alloc.free(block)  # the tensor dies
print(f"after free:   allocated {format_size(alloc.memory_allocated())}, reserved {format_size(alloc.memory_reserved())}")

# %% [markdown]
# Reserved memory "only grows": the allocator gives segments back to the driver only when you call
# `torch.cuda.empty_cache()`, or when a `cudaMalloc` fails and it flushes its cache to retry. (One
# setting adds a third occasion: with `PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8` and a
# cap set by `torch.cuda.set_per_process_memory_fraction`, a `malloc` that needs a new segment first
# frees the cached segments unused the longest whenever reserved memory is above 80% of the cap. It
# is off by default, and the course's model does not simulate it.) The timeline of the three MLP
# steps shows it: allocated memory rises and falls with every step, and reserved memory is a
# staircase that never comes down.

# %%
plot_memory_timeline(mlp_replay, title="three MLP training steps, replayed in the model")

# %% [markdown]
# *GPU*: the same two numbers from the real allocator.

# %%
if HAS_CUDA:
    base_a, base_r = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    print("GPU after empty(3 MiB): allocated +", format_size(torch.cuda.memory_allocated() - base_a),
          "| reserved +", format_size(torch.cuda.memory_reserved() - base_r))
    del x
    print("GPU after del:          allocated +", format_size(torch.cuda.memory_allocated() - base_a),
          "| reserved +", format_size(torch.cuda.memory_reserved() - base_r))
else:
    print("CPU only: on a GPU this cell shows allocated going back to 0 and reserved staying at 20 MiB.")

# %% [quiz]
show_quiz("allocator", "q1")

# %% [markdown]
# ## 3. Size rounding, pools and segments
#
# A request of `nbytes` goes through three decisions (`DeviceCachingAllocator::malloc`):
#
# 1. **Round** it (`round_size`): at least 512 B (`kMinBlockSize`), and a multiple of 512 B. The
#    block handed out has this size, and `memory_allocated()` counts it, not your request.
# 2. **Pick a pool** (`get_pool`): rounded sizes up to and including 1 MiB (`kSmallSize`) are
#    *small* and live in the small pool; the rest are *large*. The two pools never share blocks,
#    so a swarm of tiny tensors cannot chop up the segments big tensors need.
# 3. If no cached block fits, **cudaMalloc a segment** of `get_allocation_size(rounded)` bytes:
#    small requests share 2 MiB segments (`kSmallBuffer`); large ones below 10 MiB
#    (`kMinLargeAlloc`) share 20 MiB segments (`kLargeBuffer`); 10 MiB or more get a segment of
#    their own, rounded up to a multiple of 2 MiB (`kRoundLarge`).
#
# | request | block (rounded) | pool | segment if nothing is cached |
# |---|---|---|---|
# | 1 B | 512 B | small | 2 MiB |
# | 1 MiB | 1 MiB | small | 2 MiB |
# | 1 MiB + 1 B | 1 MiB + 512 B | large | 20 MiB |
# | 11 MiB + 1 B | 11 MiB + 512 B | large | 12 MiB |
#
# One setting changes step 1: `PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:N` rounds sizes
# above `512 * N` bytes up to one of N equal steps between two powers of two, so that many slightly
# different sizes (varying sequence lengths) map to a few block sizes that reuse each other's
# blocks. With 4 divisions, the steps between 1 MiB and 2 MiB are 1, 1.25, 1.5 and 1.75 MiB: a
# request of 1.1 MiB gets 1.25 MiB. A size that is a power of two stays as it is.
#
# ### {{exercise round_size}}: size rounding
#
# Write `round_size(nbytes, divisions=0)` returning the block size for a request, as c10's
# `round_size` does. `divisions` is the `roundup_power2_divisions` setting for this size (0 or 1:
# none; otherwise a power of two). Raise `ValueError` for a negative `nbytes`. (A request of 0
# bytes never reaches the allocator: PyTorch gives an empty tensor no memory at all. The C++
# function still answers 512, and so should yours.)

# %% [answer round_size]
from ptinternals.allocator.scaffold import kMinBlockSize


def round_size(nbytes, divisions=0):
    """The block size for a request of `nbytes` bytes (c10's round_size)."""
    ### BEGIN SOLUTION
    # twin: ptinternals.allocator.sizes.round_request
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if nbytes < kMinBlockSize:
        return kMinBlockSize
    if divisions > 1 and nbytes > kMinBlockSize * divisions:
        power2_floor = 1 << (nbytes.bit_length() - 1)  # a power of two is its own floor: on a step already
        step = power2_floor // divisions  # [2^k, 2^(k+1)) in `divisions` equal steps
        return -(-nbytes // step) * step
    return -(-nbytes // kMinBlockSize) * kMinBlockSize
    ### END SOLUTION


# %% [tests round_size]
check("allocator.round_size", round_size)
### BEGIN HIDDEN TESTS
check("allocator.round_size", round_size, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise size_plan}}: pools and segment sizes
#
# Write `size_plan(nbytes)` returning the triple `(block_size, pool, segment_size)`: the rounded
# block size (use your `round_size`, without divisions), the pool (`"small"` or `"large"`) and the
# number of bytes to `cudaMalloc` if no cached block fits. The answer cell imports the constants
# from the scaffold under their C++ names: `kSmallSize`, `kSmallBuffer`, `kMinLargeAlloc`,
# `kLargeBuffer`, `kRoundLarge`. (Each answer cell imports what it uses: the grader runs answer
# cells, not the demonstrations.)

# %% [answer size_plan]
from ptinternals.allocator.scaffold import kLargeBuffer, kMinLargeAlloc, kRoundLarge, kSmallBuffer, kSmallSize


def size_plan(nbytes):
    """(block_size, pool, segment_size) for a request of `nbytes` bytes."""
    ### BEGIN SOLUTION
    # twin: ptinternals.allocator.sizes.size_plan
    rounded = round_size(nbytes)
    if rounded <= kSmallSize:
        return rounded, "small", kSmallBuffer
    if rounded < kMinLargeAlloc:
        return rounded, "large", kLargeBuffer
    return rounded, "large", -(-rounded // kRoundLarge) * kRoundLarge
    ### END SOLUTION


# %% [tests size_plan]
check("allocator.size_plan", size_plan)
### BEGIN HIDDEN TESTS
check("allocator.size_plan", size_plan, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("allocator", "q2", "q3")

# %% [markdown]
# ## 4. Segments and blocks: best fit and splitting
#
# A **segment** is one `cudaMalloc`. It is tiled by **blocks**, each allocated to a tensor or
# free. Every free block sits in its pool, a `std::set` ordered by `(stream, size, address)`
# (`BlockComparatorSize`). To serve a request, `get_free_block` does one `lower_bound` for
# `(stream, rounded size)`: it lands on the **smallest free block of the same stream that is big
# enough**, and on the lowest address among equal sizes. That is *best fit*. If there is none, the
# allocator `cudaMalloc`s a new segment, which starts as one free block of the segment's size.
#
# The chosen block is usually bigger than the request. `should_split` decides whether its unused
# tail becomes a free block of its own:
#
# * small pool: when the tail is at least 512 B;
# * large pool: when the tail is **more than** 1 MiB (`kSmallSize`). A smaller tail stays inside
#   the block, counted as allocated and wasted until the block is freed. (Splitting off tails that
#   small would litter the large pool with slivers that can only serve small requests, which go to
#   the other pool anyway.)
#
# Here are the segments after a few allocations of different sizes (segment map: one bar per
# segment, one coloured piece per block).

# %%
alloc = CachingAllocator(8 * GiB)
blocks = {name: alloc.malloc(n) for name, n in
          [("a", 300 * KiB), ("b", 700 * KiB), ("c", 3 * MiB), ("d", 5 * MiB), ("e", 11 * MiB + 1)]}
for name, b in blocks.items():
    print(f"{name}: block {format_size(b.size):>10} at {b.ptr:#x} in the {b.pool.name}")
plot_segment_map(alloc)

# %% [markdown]
# `a` and `b` share a 2 MiB small segment, whose free tail (red) waits for the next small request.
# `c` and `d` share a 20 MiB large segment. On an empty cache `e` (11 MiB + 512 B) would get a
# 12 MiB segment of its own, but the 20 MiB segment's free 12 MiB tail is big enough, so best fit
# takes it; the leftover (1 MiB - 512 B) is not more than 1 MiB, so it is not split off: `e`'s
# block is the whole 12 MiB, and `memory_allocated()` counts all of it.
#
# **`max_split_size_mb`.** Splitting big blocks for small requests is how fragmentation starts
# (section 10). With `PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:M`, blocks of `M` MiB or more are
# *oversize*: they are never split, they never serve a request smaller than `M` MiB, and they serve
# a request of at least `M` MiB only if they waste less than 20 MiB
# (`max_non_split_rounding_mb`, default 20). C++ checks these rules on the best-fit candidate
# only; a bigger block would fail them too.
#
# ### {{exercise find_best_fit}}: best fit
#
# Write `find_best_fit(free_blocks, size, stream, max_split_size=SIZE_MAX)`. `free_blocks` is a
# list of the pool's free blocks as `(stream, size, address)` tuples, in any order; `size` is a
# rounded request. Return the tuple of the block `get_free_block` picks, or `None`. With the
# default `max_split_size` (`SIZE_MAX`: no limit) the oversize rules never apply. Leave the list
# you are given as it is (sort a copy if you sort).

# %% [answer find_best_fit]
from ptinternals.allocator.scaffold import SIZE_MAX, kLargeBuffer


def find_best_fit(free_blocks, size, stream, max_split_size=SIZE_MAX):
    """The (stream, size, address) free block that serves a rounded request, or None."""
    ### BEGIN SOLUTION
    # twin: ptinternals.allocator.policy.find_best_fit
    best = None
    for block in free_blocks:
        b_stream, b_size, b_address = block
        if b_stream != stream or b_size < size:
            continue
        if best is None or (b_size, b_address) < (best[1], best[2]):
            best = tuple(block)
    if best is None:
        return None
    if size < max_split_size and best[1] >= max_split_size:  # oversize blocks serve oversize requests only
        return None
    if size >= max_split_size and best[1] >= size + kLargeBuffer:  # ... and waste less than 20 MiB
        return None
    return best
    ### END SOLUTION


# %% [tests find_best_fit]
check("allocator.find_best_fit", find_best_fit)
### BEGIN HIDDEN TESTS
check("allocator.find_best_fit", find_best_fit, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise should_split}}: the split rule
#
# Write `should_split(block_size, size, pool, max_split_size=SIZE_MAX)`: whether the tail
# `block_size - size` of the chosen block is split off (`pool` is `"small"` or `"large"`, `size`
# is the rounded request). In the large pool, a request of `max_split_size` or more is never split.
# A request bigger than its block is a bug in the caller: raise `ValueError`.

# %% [answer should_split]
from ptinternals.allocator.scaffold import SIZE_MAX, kMinBlockSize, kSmallSize


def should_split(block_size, size, pool, max_split_size=SIZE_MAX):
    """True when the unused tail of the chosen block becomes a free block of its own."""
    ### BEGIN SOLUTION
    # twin: ptinternals.allocator.policy.should_split
    if size > block_size:
        raise ValueError(f"size ({size}) must be <= block_size ({block_size})")
    remaining = block_size - size
    if pool == "small":
        return remaining >= kMinBlockSize
    return size < max_split_size and remaining > kSmallSize
    ### END SOLUTION


# %% [tests should_split]
check("allocator.should_split", should_split)
### BEGIN HIDDEN TESTS
check("allocator.should_split", should_split, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("allocator", "q4")

# %% [markdown]
# ## 5. Freeing and coalescing
#
# When a tensor dies, its block goes back to its pool (`free_block`). Before that it absorbs its
# neighbours in the segment if they are free (`try_merge_blocks`, with the previous block, then
# the next), so a segment never holds two free blocks side by side: freeing everything always
# rebuilds one free block the size of the segment. Without this **coalescing**, a segment carved
# into small blocks could never serve a big request again.
#
# Below, three tensors fill a 20 MiB segment; freeing the middle one leaves a hole, and freeing
# the first merges the hole and the first block into one 8 MiB free block.

# %%
alloc = CachingAllocator(8 * GiB)
x, y, z = alloc.malloc(4 * MiB), alloc.malloc(4 * MiB), alloc.malloc(4 * MiB)
alloc.free(y)
before = alloc.snapshot()
alloc.free(x)
for title, snap in [("after freeing y (the middle block)", before), ("after freeing x too", alloc.snapshot())]:
    print(f"{title:36s}", [(format_size(b["size"]), b["state"]) for b in snap["segments"][0]["blocks"]])
plot_segment_map(alloc, title="x and the hole merged; z and the tail remain")

# %% [markdown]
# A block is in one of three states, named as in `torch.cuda.memory._snapshot()`:
# `"active_allocated"` (a tensor uses it), `"active_pending_free"` (freed by the program but still
# in use on another stream, see section 6) and `"inactive"` (free, cached). Only **inactive**
# neighbours merge.
#
# ### {{exercise merge_free_neighbours}}: free with coalescing
#
# Write `merge_free_neighbours(blocks, index)`. `blocks` is one segment's blocks as
# `(address, size, state)` tuples in address order; free `blocks[index]` (allocated, or pending
# whose wait is over) and return the segment's new block list: the freed block becomes inactive
# and absorbs an inactive block just before it and/or just after it. Freeing a block that is
# already inactive is a double free: raise `ValueError`; an index outside the list (negative ones
# included) raises `IndexError`. Do not modify the list you are given.

# %% [answer merge_free_neighbours]
from ptinternals.allocator.scaffold import INACTIVE


def merge_free_neighbours(blocks, index):
    """Free blocks[index] and merge it with inactive neighbours; return the new block list."""
    ### BEGIN SOLUTION
    # twin: ptinternals.allocator.segment_ops.merge_free_neighbours
    if index < 0:  # Python would read blocks[-1] as the last block
        raise IndexError(f"index {index} is negative")
    address, size, state = blocks[index]  # an index past the end raises IndexError here
    if state == INACTIVE:
        raise ValueError(f"blocks[{index}] is already free (double free)")
    first, last = index, index
    if index > 0 and blocks[index - 1][2] == INACTIVE:  # merge with the previous block: start at its address
        first = index - 1
        address = blocks[first][0]
        size += blocks[first][1]
    if index + 1 < len(blocks) and blocks[index + 1][2] == INACTIVE:  # merge with the next block
        last = index + 1
        size += blocks[last][1]
    return list(blocks[:first]) + [(address, size, INACTIVE)] + list(blocks[last + 1:])
    ### END SOLUTION


# %% [tests merge_free_neighbours]
check("allocator.merge_free_neighbours", merge_free_neighbours)
### BEGIN HIDDEN TESTS
check("allocator.merge_free_neighbours", merge_free_neighbours, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. Streams: per-stream pools and `record_stream`
#
# CUDA work is queued on **streams**, and the allocator is asynchronous: when Python frees a
# tensor, kernels that read it may still be queued. That is safe as long as the next user of the
# block works on the **same stream**: the stream runs its kernels in order, so the new tensor's
# kernels start after the old one's finished. The allocator therefore gives every block the stream
# it was allocated on and reuses it only for requests on that stream (the `stream` in
# `(stream, size, address)`). Each stream effectively has its own pool: a block freed by a side
# stream is invisible to the default stream.
#
# If a tensor allocated on stream A is also used on stream B, tell the allocator with
# `tensor.record_stream(B)`. When the tensor dies, the allocator records a CUDA event on B
# (`insert_events`) and keeps the block **pending** (`"active_pending_free"`): it stays out of the
# pool, counted in `active_bytes` but not in `allocated_bytes`, until the event has completed. The
# allocator checks its events at the start of every `malloc` (`process_events`) and when the cache
# is emptied (which synchronizes every event). In the model, streams are ints, and `sync(s)` says
# "stream s has finished its queued work".

# %%
def show(when):
    st = alloc.memory_stats()
    print(f"{when:22s} allocated {format_size(st['allocated_bytes.all.current']):>9}, "
          f"active {format_size(st['active_bytes.all.current']):>9}, segments {alloc.num_segments()}")


alloc = CachingAllocator(8 * GiB)
side = 7  # a side stream, e.g. the one that copies the next batch to the GPU
batch = alloc.malloc(6 * MiB, stream=side)  # allocated on the side stream...
alloc.record_stream(batch, 0)  # ...and used by the default stream's kernels
alloc.free(batch)  # the Python tensor dies; stream 0 may still be reading it
show("after free:")  # the block is pending: active, but not allocated
again = alloc.malloc(6 * MiB, stream=side)  # cannot reuse the pending block: carved from the free tail
show("after a new 6 MiB:")
print("  the new block reused the pending one:", again.ptr == batch.ptr)
display(plot_segment_map(alloc, title="the pending block (orange) waits for stream 0"))
alloc.sync(0)  # stream 0 finished its work: the event is complete...
third = alloc.malloc(512, stream=0)  # ...and the next malloc returns the pending block to the pool
show("after sync + malloc:")  # 6 MiB less active; the 512 B (stream 0, small pool) got its own segment

# %% [markdown]
# *GPU*: a block freed on a side stream is reused by that stream, not by the default stream.

# %%
if HAS_CUDA:
    side_stream = torch.cuda.Stream()
    with torch.cuda.stream(side_stream):
        a = torch.empty(6 * MiB, dtype=torch.uint8, device="cuda")
    ptr = a.data_ptr()
    del a
    b = torch.empty(6 * MiB, dtype=torch.uint8, device="cuda")  # default stream
    with torch.cuda.stream(side_stream):
        c = torch.empty(6 * MiB, dtype=torch.uint8, device="cuda")
    print("GPU: the default stream reused the side stream's block:", b.data_ptr() == ptr,
          "| the side stream reused it:", c.data_ptr() == ptr)
    del b, c
else:
    print("CPU only: on a GPU this cell shows the default stream NOT reusing a block freed by a side stream, "
          "and the side stream reusing it.")

# %% [quiz]
show_quiz("allocator", "q5", "q6")

# %% [markdown]
# ## 7. `empty_cache`, and what it does not do
#
# `torch.cuda.empty_cache()` runs `release_cached_blocks`: it waits for every pending stream event
# (`synchronize_and_free_events`: pending blocks become free and merge), then `cudaFree`s every
# segment that is **one inactive block**, and only those. It is also what a failing `cudaMalloc`
# does before its retry. What it does not do:
#
# * it frees no tensor: `memory_allocated()` is unchanged;
# * it cannot return the free part of a segment that still holds a live block (`cudaFree` takes
#   whole segments): that memory, `inactive_split_bytes` in the statistics ("non-releasable
#   memory" in `memory_summary()`), stays reserved;
# * it does not defragment anything, and the next allocations pay for `cudaMalloc` again.
#
# It is useful to give memory back to *other* processes, or to make `nvidia-smi` agree with
# `memory_allocated()`; inside one training loop it only makes things slower.

# %%
alloc = CachingAllocator(8 * GiB)
keep = alloc.malloc(2 * MiB)  # lives on; pins its 20 MiB segment
temp = [alloc.malloc(4 * MiB), alloc.malloc(16 * MiB), alloc.malloc(300 * KiB)]
for t in temp:
    alloc.free(t)
print(f"before empty_cache: reserved {format_size(alloc.memory_reserved())}, segments {alloc.num_segments()}")
alloc.empty_cache()
stats = alloc.memory_stats()
print(f"after empty_cache:  reserved {format_size(alloc.memory_reserved())}, segments {alloc.num_segments()}, "
      f"non-releasable {format_size(stats['inactive_split_bytes.all.current'])}")

# %% [markdown]
# ### {{exercise release_cached_segments}}: which segments `empty_cache` returns
#
# Write `release_cached_segments(segments)`: `segments` is a list of segments, each a list of
# `(address, size, state)` blocks. Return `(kept_segments, released_bytes)`: first free every
# `"active_pending_free"` block (merging, with your `merge_free_neighbours`), then release every
# segment that is a single inactive block; `kept_segments` lists the others (after the merges), in
# their original order. Leave `segments` as it is: build new lists.

# %% [answer release_cached_segments]
from ptinternals.allocator.scaffold import ACTIVE_PENDING_FREE, INACTIVE


def release_cached_segments(segments):
    """(kept_segments, released_bytes) of empty_cache over `segments`."""
    ### BEGIN SOLUTION
    # twin: ptinternals.allocator.segment_ops.release_cached_segments
    kept, released = [], 0
    for blocks in segments:
        blocks = list(blocks)
        i = 0
        while i < len(blocks):  # synchronize_and_free_events: every pending block is freed
            if blocks[i][2] == ACTIVE_PENDING_FREE:
                blocks = merge_free_neighbours(blocks, i)
                i = 0
            else:
                i += 1
        if len(blocks) == 1 and blocks[0][2] == INACTIVE:  # a whole free segment: cudaFree
            released += blocks[0][1]
        else:
            kept.append(blocks)
    return kept, released
    ### END SOLUTION


# %% [tests release_cached_segments]
check("allocator.release_cached_segments", release_cached_segments)
### BEGIN HIDDEN TESTS
check("allocator.release_cached_segments", release_cached_segments, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("allocator", "q7")

# %% [markdown]
# ## 8. Reading the statistics: `memory_stats()` and `memory_summary()`
#
# Every statistic of the allocator is a `Stat` (c10/core/CachingDeviceAllocator.h) with four
# numbers: `current`; `peak`, the highest `current` since the last `reset_peak_memory_stats()`;
# and two running totals, `allocated` (sum of all increases) and `freed` (sum of all decreases).
# `torch.cuda.memory_stats()` flattens them into keys `"<stat>.<pool>.<field>"`, with pool `all`,
# `small_pool` or `large_pool`:
#
# | stat | counts | shortcut |
# |---|---|---|
# | `allocated_bytes` | blocks handed out to tensors (rounded sizes) | `memory_allocated()`, `max_memory_allocated()` |
# | `reserved_bytes` | all segments | `memory_reserved()`, `max_memory_reserved()` |
# | `active_bytes` | allocated + pending-free blocks | |
# | `inactive_split_bytes` | free blocks inside segments with a live block: non-releasable | |
# | `requested_bytes` | what the program asked for, before rounding | |
# | `allocation`, `segment`, `active`, `inactive_split` | the same, counting blocks or segments | |
#
# plus counters such as `num_alloc_retries` (a cudaMalloc failed and the cache was flushed: a sign
# of memory pressure) and `num_ooms`. `memory_summary()` prints them as a table. Here is the model's
# table for the three MLP steps, in exactly the format of `torch.cuda.memory_summary()`.

# %%
stats = mlp_replay.allocator.memory_stats()
print({k: stats[k] for k in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                             "reserved_bytes.all.peak", "requested_bytes.all.peak", "num_alloc_retries")})
print(memory_summary(stats, abbreviated=True))

# %% [markdown]
# ### {{exercise stat}}: a statistic
#
# Write the class `Stat` with attributes `current`, `peak`, `allocated` and `freed` (all 0 at
# first) and methods `increase(amount)`, `decrease(amount)`, `reset_peak()` (the peak restarts from
# `current`, like `torch.cuda.reset_peak_memory_stats()`) and `reset_accumulated()` (the running
# totals restart from 0, like `torch.cuda.reset_accumulated_memory_stats()`). A decrease below zero
# is a bookkeeping bug: raise `ValueError` and change nothing.

# %% [answer stat]
class Stat:
    """One allocator statistic: current, peak, allocated (total increases), freed (total decreases)."""

    def __init__(self):
        ### BEGIN SOLUTION
        # twin: ptinternals.allocator.stats.Stat
        self.current = 0
        self.peak = 0
        self.allocated = 0
        self.freed = 0
        ### END SOLUTION

    def increase(self, amount):
        ### BEGIN SOLUTION
        self.current += amount
        self.allocated += amount
        self.peak = max(self.peak, self.current)
        ### END SOLUTION

    def decrease(self, amount):
        ### BEGIN SOLUTION
        if amount > self.current:
            raise ValueError(f"cannot decrease by {amount}: current is {self.current}")
        self.current -= amount
        self.freed += amount
        ### END SOLUTION

    def reset_peak(self):
        ### BEGIN SOLUTION
        self.peak = self.current
        ### END SOLUTION

    def reset_accumulated(self):
        ### BEGIN SOLUTION
        self.allocated = 0
        self.freed = 0
        ### END SOLUTION


# %% [tests stat]
check("allocator.stat", Stat)
### BEGIN HIDDEN TESTS
check("allocator.stat", Stat, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("allocator", "q11")

# %% [markdown]
# *GPU*: the real table.

# %%
if HAS_CUDA:
    print(torch.cuda.memory_summary(abbreviated=True))
else:
    print("CPU only: torch.cuda.memory_stats() is {} on a CPU build; on a GPU this cell prints the real table.")

# %% [markdown]
# ## 9. Memory snapshots and the memory_viz viewer
#
# Statistics say *how much*; a **snapshot** says *where*. On a GPU,
# `torch.cuda.memory._record_memory_history(max_entries=100000)` starts recording every allocator
# event (with Python stack traces), and `torch.cuda.memory._snapshot()` returns a dict with every
# segment and its blocks (`"segments"`) and the recorded events (`"device_traces"`).
# `torch.cuda.memory._dump_snapshot("snap.pickle")` writes it to a file that the viewer at
# https://pytorch.org/memory_viz draws (drag the file in), and `torch.cuda._memory_viz` turns it
# into text or into the same viewer as a standalone HTML page.
#
# The model writes the same format, so the same tools read it. Here is `_memory_viz.segsum`, a text
# summary with one line per large segment (one character per "page" of the segment: a letter when
# one block fills the page, a digit when it is partly used, a space when it is free) and the
# totals, for the three MLP steps. `trace_plot` builds the interactive timeline viewer as an HTML page (save it and open it
# in a browser with internet access: it loads the viewer's JavaScript from a CDN).

# %%
mlp_snapshot = mlp_replay.allocator.snapshot()  # the real torch.cuda.memory._snapshot() format
print(_memory_viz.segsum(mlp_snapshot).split("Legend")[0])
html = _memory_viz.trace_plot(mlp_snapshot)
print(f"trace_plot: a {len(html) // 1024} KiB HTML page of {len(mlp_snapshot['device_traces'][0])} events; "
      "save it with open('trace.html', 'w').write(html)")

# %% [markdown]
# *GPU*: record the real allocator's history while the MLP trains for one step.

# %%
if HAS_CUDA:
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    mlp_gpu = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    opt_gpu = torch.optim.Adam(mlp_gpu.parameters(), lr=1e-3)
    loss = torch.nn.functional.cross_entropy(mlp_gpu(inputs.cuda()), labels.cuda())
    loss.backward()
    opt_gpu.step()
    gpu_snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    print(_memory_viz.segsum(gpu_snapshot).split("Legend")[0])
    del mlp_gpu, opt_gpu, loss
else:
    print("CPU only: _record_memory_history and _snapshot need a CUDA device (they raise on a CPU build).")

# %% [markdown]
# ## 10. Fragmentation: out of memory with memory to spare
#
# `fragmenting_trace()` (in the scaffold) is a loop whose step `k` allocates a scratch buffer of
# `64 + 8k` MiB, then a result of half that size plus 2 MiB that is kept to the end, then frees the
# scratch buffer. Its live tensors never need more than about three quarters of a 1 GiB GPU, yet
# on such a GPU it runs out of memory:

# %%
frag = fragmenting_trace()
print(frag[:8], "...")
print("peak allocated on an ample GPU:", format_size(replay(frag, 4 * GiB).peak_allocated))
frag_replay = replay(frag, FRAGMENTATION_CAPACITY)
print(f"OOM at event {frag_replay.oom['event_index']}: {frag[frag_replay.oom['event_index']]}")
print(frag_replay.oom["message"].split(" If reserved")[0])

# %%
plot_memory_timeline(frag_replay, capacity=FRAGMENTATION_CAPACITY, title="fragmenting_trace() on a 1 GiB GPU")

# %%
plot_segment_map(frag_replay.allocator, title="the segments at the OOM")

# %%
print(_memory_viz.segsum(frag_replay.allocator.snapshot()).split("Legend")[0])  # the same, as memory_viz sees it

# %% [markdown]
# Read the segment map. Each step's scratch segment, once freed, is the only free block big enough
# for that step's kept tensor, so best fit puts the kept tensor there and splits the segment: the
# red tail is free but stuck in a segment that `cudaFree` cannot return while the kept tensor
# lives. The next scratch buffer is bigger than every tail, so it needs a new segment. Each step
# reserves a whole scratch buffer more while keeping only half of one. At the OOM, 320 MiB are
# reserved but unallocated, the OOM path has already run `release_cached_blocks` (the equivalent
# of `empty_cache()`) and freed nothing, because no segment is entirely free.
#
# **An OOM diagnosis order.** When `torch.OutOfMemoryError` comes, read its numbers in this order:
#
# 1. **Allocated** ("X is allocated by PyTorch") against the GPU's capacity: if live tensors alone
#    nearly fill it, the program needs less memory (smaller batch, activation checkpointing, mixed
#    precision) or has a leak (tensors kept alive by a list, a closure, `loss` accumulated with its
#    graph). `torch.cuda.memory_snapshot()` and the viewer show who holds them.
# 2. **Reserved but unallocated** ("Y is reserved by PyTorch but unallocated"): if it is large, the
#    cache holds memory that cannot serve this request: fragmentation. Look at the segment map
#    (snapshot) for big free tails in segments pinned by long-lived tensors.
# 3. **Free on the GPU** that is not reserved by PyTorch: another process or the CUDA context holds
#    it (`torch.cuda.mem_get_info()`, `nvidia-smi`).
#
# **Fixes for fragmentation**, all visible in this trace:
#
# * allocate the long-lived tensors first, or **preallocate** one scratch buffer of the largest
#   size and reuse it (the usual fix for workspaces whose size varies);
# * `max_split_size_mb`: with blocks of at least that size never split, a freed scratch segment
#   cannot be carved up for a kept tensor (it must be oversize, so the setting must be at most the
#   smallest scratch size);
# * `expandable_segments:True` (PyTorch 2.1+): segments are reserved as virtual address ranges and
#   grown page by page, so a new scratch buffer extends the segment, merging with its free tail,
#   instead of needing a new contiguous segment; `empty_cache` unmaps free pages anywhere in a
#   segment. The model simulates it: the section after this exercise shows this trace fixed by it,
#   which is why this exercise asks you for one of the other fixes.
#
# ### {{exercise fix_fragmentation}}: fix the fragmenting trace
#
# Write `fix_fragmentation(trace)` that takes a trace built by `fragmenting_trace(...)` (the
# visible check uses the default one; the hidden checks use variants with other step counts and
# sizes on the same 1 GiB GPU) and returns `(fixed_trace, alloc_conf)`: a trace that does the same
# work, and a `PYTORCH_CUDA_ALLOC_CONF` string (`""` for none, or e.g. `"max_split_size_mb:64"`; not
# `expandable_segments`, which the next section is about). "The same work" means: every `keep{k}` is
# allocated with its original size on its original stream and stays alive to the end, and every
# scratch buffer of the original has a scratch buffer (an id starting with `"scratch"`) at least as
# big, on the same stream, somewhere in your trace. The checker replays your trace in the
# model on the 1 GiB GPU: it must not run out of memory.

# %% [answer fix_fragmentation]
def fix_fragmentation(trace):
    """(fixed_trace, alloc_conf): the same work as `trace`, without running out of memory on 1 GiB."""
    ### BEGIN SOLUTION
    # twin: ptinternals.allocator.workloads.fix_with_workspace
    scratch_sizes = [e[2] for e in trace if e[0] == "alloc" and str(e[1]).startswith("scratch")]
    fixed = [("alloc", "scratch", max(scratch_sizes), 0)]  # one workspace, big enough for every step
    for event in trace:
        if event[0] in ("alloc", "free") and str(event[1]).startswith("scratch"):
            continue  # every step reuses the workspace instead
        fixed.append(event)
    fixed.append(("free", "scratch"))
    return fixed, ""
    ### END SOLUTION


# %% [tests fix_fragmentation]
check("allocator.fix_fragmentation", fix_fragmentation)
### BEGIN HIDDEN TESTS
check("allocator.fix_fragmentation", fix_fragmentation, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Your fix, replayed by the reference model on the 1 GiB GPU (once {{exercise fix_fragmentation}} is
# implemented):

# %%
from ptinternals.allocator import parse_alloc_conf

try:
    fixed_trace, alloc_conf = fix_fragmentation(frag)
except NotImplementedError:
    print("implement {{exercise fix_fragmentation}} to see your fix replayed")
else:
    fixed_replay = replay(fixed_trace, FRAGMENTATION_CAPACITY, config=parse_alloc_conf(alloc_conf))
    print(f"PYTORCH_CUDA_ALLOC_CONF={alloc_conf!r}: OOM {'at event ' + str(fixed_replay.oom['event_index']) if fixed_replay.oom else 'none'}; "
          f"peak reserved {format_size(fixed_replay.peak_reserved)} (the original: OOM at event {frag_replay.oom['event_index']})")
    display(plot_memory_timeline(fixed_replay, capacity=FRAGMENTATION_CAPACITY, title="your fix on a 1 GiB GPU"))

# %% [markdown]
# ### Expandable segments
#
# The OOM message itself suggests a fix: `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`. With it,
# the allocator no longer `cudaMalloc`s one segment per request. It reserves one range of *virtual
# addresses* per stream and pool, big enough for 1 1/8 times the GPU's memory
# (`cuMemAddressReserve`: addresses, no memory), and puts physical memory under it in **pages**
# (`cuMemCreate` + `cuMemMap`): 2 MiB pages for the small pool, 20 MiB for the large one. The free
# blocks of the segment are searched by best fit as before. When none fits, instead of a new segment
# it maps more pages at the lowest address where free and unmapped space together are big enough:
# normally right after the last block, so the new pages **merge with the free tail** and the tail is
# used, not stranded (`try_allocate_expandable_block` in `CUDACachingAllocator.cpp`).
#
# Three rules change with it:
#
# * **Splitting.** In the large pool any tail of at least 512 B is split off (`should_split`), as in
#   the small pool: a tail is no longer stuck in a segment of its own, it sits next to the unmapped
#   addresses the segment grows into.
# * **Releasing.** `empty_cache` (and the OOM retry) unmaps every whole page under a free block,
#   anywhere in the segment (`unmap_block`), instead of freeing only segments that are entirely free.
#   A free gap between two live tensors goes back to the driver too, in whole pages.
# * **Bookkeeping.** A mapped page adds to `reserved_bytes` but not to the `segment` count of
#   `memory_stats()`; a snapshot shows one segment per contiguous mapped range, with
#   `"is_expandable": True`; the device trace records `segment_map` and `segment_unmap` where
#   cudaMalloc'd segments record `segment_alloc` and `segment_free`.
#
# The course's model implements it (`ptinternals.allocator.expandable`; its docstring lists where it
# simplifies, e.g. no IPC). Here is `fragmenting_trace()` on the same 1 GiB GPU, replayed with and
# without it. The numbers are taken at the OOM when there is one, else at the end: reserved and
# allocated memory, segments as a snapshot lists them, and the largest cached free block (the
# biggest request the cache can serve without asking the driver).

# %%
from ptinternals.allocator.workloads import fragmentation_numbers

expandable = parse_alloc_conf("expandable_segments:True")
for setting, config in [("(default)", None), ("expandable_segments:True", expandable)]:
    n = fragmentation_numbers(frag, FRAGMENTATION_CAPACITY, config=config)
    oom = f"OOM at event {n['oom_event']}" if n["oom_event"] is not None else "no OOM"
    print(f"{setting:26s} {oom:16s} reserved {format_size(n['reserved']):>10}, allocated "
          f"{format_size(n['allocated']):>10}, segments {n['segments']:2d}, largest free block "
          f"{format_size(n['largest_free']):>10}")
grown = replay(frag, FRAGMENTATION_CAPACITY, config=expandable)
actions = [e["action"] for e in grown.allocator.snapshot()["device_traces"][0]]
print("device trace:", {a: actions.count(a) for a in ("segment_alloc", "segment_map", "segment_unmap")})
plot_segment_map(grown.allocator, title="fragmenting_trace() with expandable segments: one segment")

# %% [markdown]
# Without it, the kept tensors pin eleven segments and the largest free block (54 MiB) is smaller
# than the next request; with it, everything lives in one segment that grew page by page, and the
# freed scratch space is one free block that the next, bigger scratch buffer extends by mapping a
# few more pages. The price: mapping is slower than `cudaMalloc` at first, and memory allocated this
# way cannot be shared with other processes through CUDA IPC (a DataLoader worker's CUDA tensors).
# *GPU*: `autograder/gpu_check.sh` records real training steps with expandable segments on and
# checks that the model reproduces the real allocator's reserved memory and segments step by step.

# %% [quiz]
show_quiz("allocator", "q8", "q9", "q10", "q12")

# %% [markdown]
# ## 11. Predicting peak memory: your own caching allocator
#
# You now have every piece of `DeviceCachingAllocator::malloc` and `free`. Put them together.
#
# ### {{exercise memory_timeline}}: replay a trace in your allocator
#
# Write `memory_timeline(trace)` that runs a trace (the format of section 1, described in the
# scaffold's docstring) through your own caching allocator on an ample GPU, and returns one triple
# `(allocated_bytes, active_bytes, reserved_bytes)` after **every** event. Its peak reserved value
# is what `torch.cuda.max_memory_reserved()` would report. The rules, all from this chapter:
#
# * `("alloc", id, nbytes, stream)`: 0 bytes allocate nothing and do nothing else (nor does their
#   `free`). Otherwise,
#   first return the pending blocks whose streams have all synced to their pools (they become
#   inactive and merge), then `size_plan`; `find_best_fit` among the inactive blocks of the same
#   pool (as `(stream, size, address)`); if there is none, `cudaMalloc` a segment with
#   `DeviceMemory.malloc(segment_size)` (it returns the address; use one `DeviceMemory()` per
#   replay, so that your addresses are the model's) whose one inactive block is then the chosen
#   block; then `should_split` decides whether the tail becomes its own inactive block. The
#   block's size (tail included when not split) counts as allocated and active.
# * `("free", id)`: allocated drops by the block's size. A block used on another stream
#   (`record_stream` to a stream other than its own) becomes pending (still active) until each of
#   those streams syncs; any other block becomes inactive at once, with `merge_free_neighbours`.
# * `("record_stream", id, s)`: the block is also used on stream `s`.
# * `("sync", s)`: stream `s` finished its queued work: pending blocks freed *before* this event
#   no longer wait for `s` (they return at the next `malloc`).
# * `("empty_cache",)`: every pending block is freed (the wait is forced), then every segment that
#   is one inactive block is released (`DeviceMemory.free(address)`): `release_cached_segments`.
# * `("step", k)`: a marker; nothing changes.
#
# The scaffold's `Segment(stream, pool, blocks)` can hold a segment: its blocks are the
# `(address, size, state)` lists your functions already use. This is the chapter's main exercise:
# 3 points.

# %% [answer memory_timeline]
from ptinternals.allocator.scaffold import ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, INACTIVE, DeviceMemory, Segment


def memory_timeline(trace):
    """[(allocated_bytes, active_bytes, reserved_bytes) after each event of `trace`]."""
    ### BEGIN SOLUTION
    # twin: ptinternals.allocator.trace.memory_timeline
    device = DeviceMemory()
    segments = []  # every live Segment, in the order they were cudaMalloc'd
    where = {}  # id -> (Segment, address) of its block; None for a 0-byte tensor
    uses = {}  # address of an allocated block -> the other streams it was used on
    waiting = {}  # address of a pending-free block -> (Segment, streams that have not synced yet)
    allocated = active = reserved = 0
    timeline = []

    def block_index(segment, address):
        return next(i for i, b in enumerate(segment.blocks) if b[0] == address)

    def free_block(segment, address):  # back to the pool, merged with inactive neighbours
        nonlocal active
        i = block_index(segment, address)
        active -= segment.blocks[i][1]
        segment.blocks = merge_free_neighbours(segment.blocks, i)

    def process_events(everything=False):  # pending frees whose streams have all synced
        for address, (segment, streams) in list(waiting.items()):
            if everything or not streams:
                del waiting[address]
                free_block(segment, address)

    for event in trace:
        kind = event[0]
        if kind == "alloc":
            _, ident, nbytes, stream = event
            if nbytes == 0:  # never reaches the allocator
                where[ident] = None
            else:
                process_events()
                rounded, pool, segment_size = size_plan(nbytes)
                free = [(s.stream, size, address) for s in segments if s.pool == pool
                        for address, size, state in s.blocks if state == INACTIVE]
                best = find_best_fit(free, rounded, stream)
                if best is None:  # cudaMalloc a new segment: one inactive block
                    address = device.malloc(segment_size)
                    segment = Segment(stream, pool, [(address, segment_size, INACTIVE)])
                    segments.append(segment)
                    reserved += segment_size
                    block_size = segment_size
                else:
                    _, block_size, address = best
                    segment = next(s for s in segments if any(b[0] == address for b in s.blocks))
                i = block_index(segment, address)
                if should_split(block_size, rounded, pool):
                    pieces = [(address, rounded, ACTIVE_ALLOCATED), (address + rounded, block_size - rounded, INACTIVE)]
                else:  # the tail stays inside the block
                    rounded = block_size
                    pieces = [(address, block_size, ACTIVE_ALLOCATED)]
                segment.blocks[i:i + 1] = pieces
                allocated += rounded
                active += rounded
                where[ident] = (segment, address)
                uses[address] = set()
        elif kind == "free":
            spot = where.pop(event[1])
            if spot is not None:
                segment, address = spot
                i = block_index(segment, address)
                allocated -= segment.blocks[i][1]
                streams = uses.pop(address)
                if streams:  # used on other streams: pending until they sync
                    segment.blocks[i] = (address, segment.blocks[i][1], ACTIVE_PENDING_FREE)
                    waiting[address] = (segment, streams)
                else:
                    free_block(segment, address)
        elif kind == "record_stream":
            spot = where[event[1]]
            if spot is not None and event[2] != spot[0].stream:
                uses[spot[1]].add(event[2])
        elif kind == "sync":
            for _, streams in waiting.values():
                streams.discard(event[1])
        elif kind == "empty_cache":
            process_events(everything=True)
            for segment in list(segments):
                if len(segment.blocks) == 1 and segment.blocks[0][2] == INACTIVE:
                    device.free(segment.address)
                    reserved -= segment.total_size
                    segments.remove(segment)
        timeline.append((allocated, active, reserved))
    return timeline
    ### END SOLUTION


# %% [tests memory_timeline]
check("allocator.memory_timeline", memory_timeline)
### BEGIN HIDDEN TESTS
check("allocator.memory_timeline", memory_timeline, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### Predicting the peak of a training step
#
# With `memory_timeline`, the peak reserved memory of a program is `max` of the third column: you
# can tell whether a training step fits on a GPU before you have the GPU. The trace must contain
# every allocation the step makes: on a GPU, record it with `_record_memory_history` (section 9);
# on a CPU, `trace_allocations` sees the same tensors but not the library workspaces (cuBLAS,
# cuDNN) that a GPU also allocates through the caching allocator, so it gives a lower bound.
# Here is the synthetic trace of a bigger MLP (widths 1024-4096-4096-1024, batches of 256, 192 and
# 320 rows, Adam, a side stream that copies each batch in), predicted with your allocator and with
# the reference model.

# %%
def predict_peak_reserved(trace):
    """Peak reserved bytes of `trace`, by your memory_timeline ({{exercise memory_timeline}})."""
    return max((r for _, _, r in memory_timeline(trace)), default=0)


big_step = training_step_trace(steps=3)
reference_peak = replay(big_step).peak_reserved
try:
    print(f"your prediction: {format_size(predict_peak_reserved(big_step))}; "
          f"the reference model: {format_size(reference_peak)}")
except NotImplementedError:
    print(f"implement {{exercise memory_timeline}} to see your prediction; the reference model predicts {format_size(reference_peak)}")
display(plot_memory_timeline(replay(big_step), title="3 steps of a 1024-4096-4096-1024 MLP with Adam (fp32)"))

# %% [markdown]
# *GPU*: train the small MLP of section 1 for two steps on the GPU while recording the allocator's
# history (`ptinternals.allocator.recorder.record_trace_on_gpu`), turn the history into a trace
# (`ptinternals.allocator.importer`), and compare the predicted peak with the real
# `torch.cuda.max_memory_reserved()`. Your allocator starts empty, so the comparison is exact in a
# fresh kernel, where no earlier tensor holds GPU memory.

# %%
if HAS_CUDA:
    from ptinternals.allocator.importer import trace_from_device_trace
    from ptinternals.allocator.recorder import record_trace_on_gpu

    def mlp_step(step, state):  # a workload: called once per step; `state` persists across steps
        if "model" not in state:
            state["model"] = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                                 torch.nn.Linear(1024, 10)).to(state["device"])
            state["opt"] = torch.optim.Adam(state["model"].parameters(), lr=1e-3)
        x, y = inputs.to(state["device"]), labels.to(state["device"])
        torch.nn.functional.cross_entropy(state["model"](x), y).backward()
        state["opt"].step()
        state["opt"].zero_grad(set_to_none=True)

    torch.cuda.empty_cache()
    recording = record_trace_on_gpu(mlp_step, steps=2)
    imported = trace_from_device_trace(recording["device_trace"], initial_segments=recording["initial_segments"])
    real_peak = recording["steps"][-1]["peak_reserved"]
    print(f"GPU: {len(imported.trace)} events; real peak reserved {format_size(real_peak)}; "
          f"reference model {format_size(imported.replay().peak_reserved)}")
    if recording["initial_segments"]:
        print("(the GPU already held segments when recording started: restart the kernel for your prediction)")
    else:
        try:
            print(f"your prediction: {format_size(predict_peak_reserved(imported.trace))}")
        except NotImplementedError:
            print("implement {{exercise memory_timeline}} to compare your prediction")
else:
    print("CPU only: on a GPU this cell records two real training steps and compares your predicted peak with "
          "torch.cuda.max_memory_reserved().")

# %% [markdown]
# ## Summary
#
# * PyTorch `cudaMalloc`s big segments and carves tensors out of them as blocks; freed blocks stay
#   cached. `memory_allocated()` counts blocks in use, `memory_reserved()` counts segments, and
#   reserved memory only shrinks on `empty_cache()` or an OOM retry (or, when you set it,
#   `garbage_collection_threshold` under a memory fraction).
# * Requests round up to 512 B; blocks of at most 1 MiB live in the small pool (2 MiB segments),
#   others in the large pool (20 MiB segments below 10 MiB, own segments above).
# * Best fit picks the smallest free block of the same stream; small blocks split off tails of
#   512 B or more, large blocks only tails of more than 1 MiB; freed blocks merge with free
#   neighbours.
# * A block belongs to its stream; `record_stream` keeps a block pending until the other stream's
#   work is done.
# * `empty_cache` returns only segments that are entirely free; it frees no tensor and fixes no
#   fragmentation.
# * Fragmentation is free memory stuck in segments pinned by live blocks. Diagnose an OOM by
#   allocated, then reserved-but-unallocated, then memory outside PyTorch; fix fragmentation by
#   allocation order, preallocation, `max_split_size_mb` or `expandable_segments`, which grows one
#   segment per stream by mapping pages, so free tails are used instead of stranded.
# * `memory_stats()`, `memory_summary()`, snapshots and the memory_viz viewer show all of it.
#
# Next: {{chapter amp}} halves the bytes per activation with mixed precision, and shows what the
# allocator sees when it does.
#
# ### Your quiz score so far
# Practice answers count no points; the grader scores your last answer to each graded question (recorded in
# `allocator.answers.json`).

# %% [quiz-grade]
quiz_progress("allocator")
