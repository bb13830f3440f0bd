"""The allocator's bookkeeping invariants, checked by the property tests after every operation.

1. Segments tile exactly: consecutive blocks of a segment touch (ptr + size == next.ptr), are
   linked both ways, share a stream and a pool.
2. No two adjacent free blocks: ``free_block`` always merges.
3. No byte is lost: allocated + pending + cached free == reserved == the device's used bytes.
4. A free block is in its pool and not in ``active_blocks``; allocated and pending blocks are the
   reverse.
5. The statistics agree with the blocks (allocated, active, inactive_split bytes, segment count).
"""

from __future__ import annotations


def _free(b) -> bool:
    return not b.allocated and b.event_count == 0 and not b.stream_uses


def check_invariants(a) -> None:
    """Raise AssertionError, naming the broken invariant, if ``a`` (a CachingAllocator) is inconsistent."""
    segments = a.segments()
    reserved = sum(sum(b.size for b in seg) for seg in segments)
    assert reserved == a.total_allocated_memory == a.memory_reserved() == a.device.used, (
        f"reserved mismatch: segments {reserved}, total {a.total_allocated_memory}, "
        f"stat {a.memory_reserved()}, device {a.device.used}"
    )
    assert len(segments) == a.num_segments(), f"{len(segments)} segments, stat says {a.num_segments()}"
    allocated = cached = pending = inactive_split = 0
    for seg in segments:
        for x, y in zip(seg, seg[1:], strict=False):
            assert x.ptr + x.size == y.ptr and x.next is y and y.prev is x, f"segment not tiled at {x} | {y}"
            assert x.stream == y.stream and x.pool is y.pool, "blocks of one segment differ in stream/pool"
            assert not (_free(x) and _free(y)), f"two adjacent free blocks {x} | {y} were not merged"
        for b in seg:
            in_pool = b in b.pool
            if b.allocated:
                allocated += b.size
                assert not in_pool and b in a.active_blocks, f"allocated {b} misplaced"
            elif b.event_count > 0:
                pending += b.size
                assert not in_pool and b in a.active_blocks, f"pending {b} misplaced"
            else:
                cached += b.size
                assert in_pool and b not in a.active_blocks, f"free {b} not in its pool"
                if b.is_split():
                    inactive_split += b.size
    stats = a.stats
    assert allocated == a.memory_allocated(), f"allocated {allocated} != stat {a.memory_allocated()}"
    assert allocated + pending + cached == reserved, "bytes lost: allocated + pending + cached != reserved"
    assert allocated + pending == stats.active_bytes["all"].current, "active_bytes mismatch"
    assert inactive_split == stats.inactive_split_bytes["all"].current, "inactive_split_bytes mismatch"
    n_free = sum(1 for seg in segments for b in seg if not b.allocated and b.event_count == 0)
    pools = [a.small_blocks, a.large_blocks, *a.private_pools.values()]
    assert sum(len(p) for p in pools) == n_free, "pool size mismatch"
