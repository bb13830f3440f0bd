"""What the allocator chapter's exercises build on: the allocator's constants, block states, a segment type, the
trace format and the fragmenting workload. No allocator logic lives here.

This module is importable while grading (``Chapter.sandbox_files``), together with
``ptinternals.allocator.device`` (the simulated ``cudaMalloc``/``cudaFree``, re-exported below). It
imports nothing from the rest of the package.

Constants (c10/core/AllocatorConfig.h and c10/cuda/CUDACachingAllocator.cpp)::

    kMinBlockSize  = 512 B     every request is rounded up to a multiple of this
    kSmallSize     = 1 MiB     requests of at most this size are "small" (small pool)
    kSmallBuffer   = 2 MiB     small-pool segments are this big
    kMinLargeAlloc = 10 MiB    large requests below this share 20 MiB segments ...
    kLargeBuffer   = 20 MiB    ... of this size (also the default max_non_split_rounding_size)
    kRoundLarge    = 2 MiB     requests of 10 MiB or more get their own segment, rounded up to this
    SIZE_MAX       = 2**64 - 1 "no limit" (the default max_split_size)

Block states, as ``torch.cuda.memory._snapshot()`` names them::

    "active_allocated"     handed out to a tensor
    "active_pending_free"  freed by the program, but still in use on another stream (record_stream)
    "inactive"             free, cached for reuse

A segment's blocks are ``(address, size, state)`` tuples in address order; a pool's free blocks, as
the best-fit search sees them, are ``(stream, size, address)`` tuples.

Traces (what a program asks of the allocator), one event per tuple::

    ("alloc", id, nbytes, stream)     a tensor's storage of nbytes is created on stream
    ("free", id)                      ... and dies
    ("record_stream", id, stream)     Tensor.record_stream(stream): it is used on that stream too
    ("sync", stream)                  that stream has finished all work queued so far
    ("empty_cache",)                  torch.cuda.empty_cache()
    ("step", k)                       a marker: the end of training step k (changes nothing)

Streams are ints (0 is the default stream); ids are unique among live allocations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .device import DeviceMemory

KiB = 1024
MiB = 1024 * 1024
GiB = 1024 * MiB

kMinBlockSize = 512  # every request is rounded up to a multiple of 512 B
kSmallSize = 1 * MiB  # requests <= 1 MiB go to the small pool
kSmallBuffer = 2 * MiB  # ... which is carved out of 2 MiB segments
kMinLargeAlloc = 10 * MiB  # requests in (1 MiB, 10 MiB) get a 20 MiB segment
kLargeBuffer = 20 * MiB  # the size of that shared segment
kRoundLarge = 2 * MiB  # requests >= 10 MiB get a segment rounded up to 2 MiB

SIZE_MAX = 2**64 - 1  # std::numeric_limits<size_t>::max(): "no limit"

ACTIVE_ALLOCATED = "active_allocated"
ACTIVE_PENDING_FREE = "active_pending_free"
INACTIVE = "inactive"
BLOCK_STATES = (ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, INACTIVE)

EVENT_KINDS = ("alloc", "free", "record_stream", "sync", "empty_cache", "step")


@dataclass
class Segment:
    """One cudaMalloc'd segment: the stream it was allocated for, its pool, and its blocks.

    ``pool`` is "small" or "large"; ``blocks`` is a list of ``(address, size, state)`` tuples that
    tile the segment in address order. Every block of a segment belongs to the segment's stream.
    """

    stream: int
    pool: str
    blocks: list = field(default_factory=list)

    @property
    def address(self) -> int:
        return self.blocks[0][0]

    @property
    def total_size(self) -> int:
        return sum(size for _, size, _ in self.blocks)


# ---- exercise allocator.fix_fragmentation: a workload that fragments ---------------------------------------------------
FRAGMENTATION_CAPACITY = 1 * GiB  # the GPU the fragmenting trace runs out of memory on


def fragmenting_trace(
    steps: int = 11, *, big_start: int = 64 * MiB, big_growth: int = 8 * MiB, keep_extra: int = 2 * MiB
) -> list[tuple]:
    """Interleaved short-lived buffers and long-lived tensors, both growing: a trace that fragments.

    Step k allocates a scratch buffer ``scratch{k}`` of ``s_k = big_start + k * big_growth`` bytes,
    then a tensor ``keep{k}`` of ``s_k / 2 + keep_extra`` bytes that lives to the end (a cached
    result), then frees the scratch buffer. With the defaults, on a 1 GiB GPU, it runs out of
    memory while less than two thirds of the GPU holds live tensors.
    """
    for name, v, lo in (
        ("steps", steps, 1),
        ("big_start", big_start, 1),
        ("big_growth", big_growth, 0),
        ("keep_extra", keep_extra, 0),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be a {'positive' if lo else 'non-negative'} int, got {v!r}")
    trace: list[tuple] = []
    for k in range(steps):
        scratch = big_start + k * big_growth
        trace.append(("alloc", f"scratch{k}", scratch, 0))
        trace.append(("alloc", f"keep{k}", scratch // 2 + keep_extra, 0))
        trace.append(("free", f"scratch{k}"))
        trace.append(("step", k))
    return trace


__all__ = [
    "ACTIVE_ALLOCATED",
    "ACTIVE_PENDING_FREE",
    "BLOCK_STATES",
    "DeviceMemory",
    "EVENT_KINDS",
    "FRAGMENTATION_CAPACITY",
    "GiB",
    "INACTIVE",
    "KiB",
    "MiB",
    "SIZE_MAX",
    "Segment",
    "fragmenting_trace",
    "kLargeBuffer",
    "kMinBlockSize",
    "kMinLargeAlloc",
    "kRoundLarge",
    "kSmallBuffer",
    "kSmallSize",
]
