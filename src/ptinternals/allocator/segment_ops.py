"""Exercises (c) and (d): freeing a block with coalescing, and what ``empty_cache`` can give back.

A segment (one cudaMalloc) is tiled by blocks, in address order, each ``(address, size, state)``
with the state names of ``torch.cuda.memory._snapshot()``:

    "active_allocated"     handed out to a tensor
    "active_pending_free"  freed by the program, but still in use by another stream (record_stream)
    "inactive"             free, cached for reuse

Mirrors c10/cuda/CUDACachingAllocator.cpp:

- ``free_block`` + ``try_merge_blocks``: a block that becomes free absorbs its free neighbours
  (only "inactive" ones: allocated or pending neighbours stay separate), so a segment never holds
  two adjacent free blocks.
- ``release_cached_blocks`` (what ``torch.cuda.empty_cache()`` runs): wait for every pending
  stream event (``synchronize_and_free_events``), then cudaFree every segment that is a single
  free block. A segment with any live block stays, however much of it is free: that memory is
  "reserved but unallocated" and no call returns it.

The allocator itself does this on linked blocks (``allocator.py``); these are the same rules on
plain lists, one function per exercise.
"""

from __future__ import annotations

BlockTuple = tuple[int, int, str]  # (address, size, state)
STATES = ("active_allocated", "active_pending_free", "inactive")


def _check_segment(blocks: object, name: str = "blocks") -> list[BlockTuple]:
    if not isinstance(blocks, (list, tuple)) or len(blocks) == 0:
        raise ValueError(f"{name} must be a non-empty list of (address, size, state), got {blocks!r}")
    out: list[BlockTuple] = []
    for i, b in enumerate(blocks):
        if not (isinstance(b, (tuple, list)) and len(b) == 3):
            raise TypeError(f"{name}[{i}] must be an (address, size, state) tuple, got {b!r}")
        addr, size, state = b
        for what, v, lo in (("address", addr, 0), ("size", size, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(
                    f"{name}[{i}].{what} must be a {'positive' if lo else 'non-negative'} int, got {v!r}"
                )
        if state not in STATES:
            raise ValueError(f"{name}[{i}].state must be one of {STATES}, got {state!r}")
        if out and out[-1][0] + out[-1][1] != addr:
            raise ValueError(
                f"{name}[{i}] starts at {addr} but {name}[{i - 1}] ends at {out[-1][0] + out[-1][1]}: "
                "blocks must tile the segment in address order"
            )
        out.append((addr, size, state))
    return out


def merge_free_neighbours(blocks: list[BlockTuple], index: int) -> list[BlockTuple]:
    """Free ``blocks[index]`` (``free_block``) and return the segment's new block list.

    The freed block becomes "inactive" and absorbs an "inactive" predecessor and/or successor
    (``try_merge_blocks`` with prev, then next); the merged block starts at the lowest address.
    ``blocks[index]`` must be "active_allocated" or "active_pending_free" (whose events are done).
    """
    segment = _check_segment(blocks)
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"index must be an int, got {type(index).__name__}")
    if not 0 <= index < len(segment):
        raise IndexError(f"index {index} out of range for a segment of {len(segment)} blocks")
    addr, size, state = segment[index]
    if state == "inactive":
        raise ValueError(f"blocks[{index}] is already inactive (double free)")
    lo, hi = index, index
    if index > 0 and segment[index - 1][2] == "inactive":  # merge with prev: take its address
        lo = index - 1
        addr, size = segment[lo][0], size + segment[lo][1]
    if index + 1 < len(segment) and segment[index + 1][2] == "inactive":  # merge with next
        hi = index + 1
        size += segment[hi][1]
    return segment[:lo] + [(addr, size, "inactive")] + segment[hi + 1 :]


def release_cached_segments(segments: list[list[BlockTuple]]) -> tuple[list[list[BlockTuple]], int]:
    """What ``empty_cache`` keeps and frees: returns ``(kept_segments, released_bytes)``.

    First every "active_pending_free" block is freed (``synchronize_and_free_events``, merging as in
    :func:`merge_free_neighbours`), then every segment that is one "inactive" block is released.
    """
    if not isinstance(segments, (list, tuple)):
        raise TypeError(f"segments must be a list of segments, got {type(segments).__name__}")
    kept: list[list[BlockTuple]] = []
    released = 0
    for s, blocks in enumerate(segments):
        seg = _check_segment(blocks, name=f"segments[{s}]")
        i = 0
        while i < len(seg):
            if seg[i][2] == "active_pending_free":
                before = len(seg)
                seg = merge_free_neighbours(seg, i)
                i -= before - len(seg)  # merged with prev: the freed block moved left
                i = max(i, 0)
            else:
                i += 1
        if len(seg) == 1 and seg[0][2] == "inactive":
            released += seg[0][1]
        else:
            kept.append(seg)
    return kept, released
