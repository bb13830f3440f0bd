"""The allocator's state in the format of ``torch.cuda.memory._snapshot()``, and back.

Mirrors ``DeviceCachingAllocator::snapshot`` (c10/cuda/CUDACachingAllocator.cpp) and the dict built
by ``THCPModule_memorySnapshot`` (torch/csrc/cuda/Module.cpp)::

    {"segments": [{"device", "address", "total_size", "allocated_size", "active_size",
                   "requested_size", "stream", "segment_type": "small"|"large",
                   "segment_pool_id": head.pool.pool_id, "is_expandable", "frames",
                   "blocks": [{"address", "size", "requested_size", "frames",
                               "state": "active_allocated"|"active_pending_free"|"inactive"}]}],
     "device_traces": [[{"action", "addr", "size", "stream", "time_us", "frames"}, ...]],
     "allocator_settings": {...}}

so that the tools of ``torch.cuda._memory_viz`` (``segsum``, ``trace``, ``trace_plot``,
``segment_plot``, ``segments``, ``memory``) read the model's state like a GPU's; the HTML files of
``trace_plot``/``segment_plot`` open in the memory_viz viewer (https://pytorch.org/memory_viz).

``restore_segments`` goes the other way, rebuilding the blocks of a real snapshot inside a model
allocator the way ``setSegmentStateToCheckpoint`` does it (allocate every block of a segment in
order, splitting as it goes, then free the ones that were not live).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .allocator import CachingAllocator
from .block import Block, BlockPool

PENDING_STREAM_BASE = 1 << 62  # stream ids for "some other stream" standing in for unknown events


def _block_state(b: Block) -> str:
    if b.allocated:
        return "active_allocated"
    if b.event_count > 0 or b.stream_uses:
        return "active_pending_free"
    return "inactive"


def make_snapshot(allocator: CachingAllocator) -> dict:
    """``torch.cuda.memory._snapshot()`` of the model (segments sorted by address)."""
    if not isinstance(allocator, CachingAllocator):
        raise TypeError(f"allocator must be a CachingAllocator, got {type(allocator).__name__}")
    segments = []
    for seg in allocator.segments():
        head = seg[0]
        info = {
            "device": allocator.device_index,
            "address": head.ptr,
            "total_size": 0,
            "allocated_size": 0,
            "active_size": 0,
            "requested_size": 0,
            "stream": head.stream,
            "segment_type": "small" if head.pool.is_small else "large",
            "segment_pool_id": head.pool.pool_id,
            "is_expandable": head.expandable_segment is not None,
            "frames": [],
            "blocks": [],
        }
        for b in seg:
            state = _block_state(b)
            info["blocks"].append(
                {
                    "address": b.ptr,
                    "size": b.size,
                    "requested_size": b.requested_size,
                    "state": state,
                    "frames": [],
                }
            )
            info["total_size"] += b.size
            if state == "active_allocated":
                info["allocated_size"] += b.size
            if state != "inactive":
                info["active_size"] += b.size
                info["requested_size"] += b.requested_size
        segments.append(info)
    traces: list[list[dict]] = [[] for _ in range(allocator.device_index + 1)]
    traces[allocator.device_index] = [dict(e) for e in allocator.device_trace]
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": allocator.config.to_settings(),
    }


@dataclass
class RestoredState:
    """What ``restore_segments`` rebuilt: live blocks by address, and pending blocks' stand-in streams."""

    live: dict[int, Block] = field(default_factory=dict)  # address -> allocated Block
    pending: dict[int, int] = field(default_factory=dict)  # address -> stream whose sync frees it


def restore_segments(allocator: CachingAllocator, segments: list[dict], *, device: int = 0) -> RestoredState:
    """Rebuild the segments of a real snapshot inside an empty model allocator.

    Each segment is cudaMalloc'd at its recorded address, then its blocks are allocated in address
    order (splitting the remainder each time), then the blocks that were not live are freed (they
    merge back). Blocks "active_pending_free" are freed after a ``record_stream`` on a stand-in
    stream (``RestoredState.pending``): ``sync`` that stream to let them go. Statistics are then
    reset (peaks and totals), so that they count from the restored state, like a
    ``torch.cuda.reset_peak_memory_stats()`` at the moment of the snapshot.
    """
    if not isinstance(allocator, CachingAllocator):
        raise TypeError(f"allocator must be a CachingAllocator, got {type(allocator).__name__}")
    if not isinstance(segments, (list, tuple)):
        raise TypeError(f"segments must be a list of snapshot segments, got {type(segments).__name__}")
    if allocator.num_segments() or allocator.active_blocks:
        raise ValueError("restore_segments needs an empty allocator (no segments yet)")
    restored = RestoredState()
    recording, allocator.record_history = allocator.record_history, False
    try:
        for n, seg in enumerate(segments):
            if not isinstance(seg, dict) or "address" not in seg:
                raise ValueError(
                    f"segments[{n}] has no 'address': not a torch.cuda.memory._snapshot() segment"
                )
        mine = [s for s in segments if s.get("device", device) == device]
        for n, seg in enumerate(sorted(mine, key=lambda s: s["address"])):
            _restore_one(allocator, seg, n, restored)
    finally:
        allocator.record_history = recording
    allocator.reset_peak_stats()
    allocator.reset_accumulated_stats()
    return restored


def _restore_one(allocator: CachingAllocator, seg: dict, n: int, restored: RestoredState) -> None:
    for key in ("address", "total_size", "stream", "segment_type", "blocks"):
        if key not in seg:
            raise ValueError(f"segments[{n}] has no {key!r}: not a torch.cuda.memory._snapshot() segment")
    if seg.get("is_expandable"):
        raise NotImplementedError(
            f"segments[{n}] is an expandable segment, which the model does not simulate"
        )
    blocks = seg["blocks"]
    if sum(b["size"] for b in blocks) != seg["total_size"]:
        raise ValueError(f"segments[{n}]: block sizes do not add up to total_size {seg['total_size']}")
    small = seg["segment_type"] == "small"
    pool_id = tuple(seg.get("segment_pool_id") or (0, 0))
    if pool_id == (0, 0):
        pool = allocator.small_blocks if small else allocator.large_blocks
    else:  # a CUDA-graph pool: kept aside, counted in reserved memory, never searched
        key = (*pool_id, small)
        if key not in allocator.private_pools:
            allocator.private_pools[key] = BlockPool(small, allocator.config.block_order, pool_id)
        pool = allocator.private_pools[key]
    address, stream = seg["address"], seg["stream"]
    allocator.device.malloc_at(address, seg["total_size"])
    curr = allocator._new_segment(pool, address, seg["total_size"], stream)
    pool.insert(curr)
    made = []
    for i, b in enumerate(blocks):
        pool.remove(curr)
        split = curr.size - b["size"] > 0
        requested = b.get("requested_size") or b["size"]
        blk = allocator._alloc_found_block(curr, b["size"], requested, stream, split)
        if "address" in b and b["address"] != blk.ptr:
            raise ValueError(
                f"segments[{n}].blocks[{i}] is at {b['address']:#x}, the model put it at {blk.ptr:#x}"
            )
        made.append((blk, b["state"]))
        curr = blk.next
    for blk, state in made:
        if state == "active_allocated":
            restored.live[blk.ptr] = blk
        elif state == "active_pending_free":
            other = PENDING_STREAM_BASE + len(restored.pending)
            allocator.record_stream(blk, other)
            allocator.free(blk)
            restored.pending[blk.ptr] = other
        elif state == "inactive":
            allocator.free(blk)
        else:
            raise ValueError(f"segments[{n}]: unknown block state {state!r}")
