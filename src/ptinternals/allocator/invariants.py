"""The allocator's bookkeeping invariants, checked by the property tests after every operation.

1. Segments tile exactly: consecutive blocks of a segment touch (ptr + size == next.ptr), are
   linked both ways, share a stream and a pool.
2. No two adjacent free blocks: ``free_block`` always merges.
3. No byte is lost: allocated + pending + cached free == reserved == the device's used bytes.
4. A free block is in its pool and not in ``active_blocks``; allocated and pending blocks are the
   reverse.
5. The statistics agree with the blocks (allocated, active, inactive_split bytes, segment count).
6. Expandable segments: mapped and unmapped blocks tile each reserved range, an unmapped block sits in
   its pool's ``unmapped`` set, and the mapped pages are exactly the memory of its mapped blocks.
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
    cudamallocd = [seg for seg in segments if seg[0].expandable_segment is None]
    assert len(cudamallocd) == a.num_segments(), f"{len(cudamallocd)} segments, stat says {a.num_segments()}"
    _check_expandable(a)
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
                if b.is_split() and b.expandable_segment is None:
                    inactive_split += b.size
    stats = a.stats
    assert allocated == a.memory_allocated(), f"allocated {allocated} != stat {a.memory_allocated()}"
    assert allocated + pending + cached == reserved, "bytes lost: allocated + pending + cached != reserved"
    assert allocated + pending == stats.active_bytes["all"].current, "active_bytes mismatch"
    assert inactive_split == stats.inactive_split_bytes["all"].current, "inactive_split_bytes mismatch"
    n_free = sum(1 for seg in segments for b in seg if not b.allocated and b.event_count == 0)
    pools = [a.small_blocks, a.large_blocks, *a.private_pools.values()]
    assert sum(len(p) for p in pools) == n_free, "pool size mismatch"


def _check_expandable(a) -> None:
    everything = [b for p in (a.small_blocks, a.large_blocks) for b in list(p) + list(p.unmapped)]
    everything += list(a.active_blocks)
    for es in a.expandable_segments:
        head = next(b for b in everything if b.expandable_segment is es and b.prev is None)
        pool = head.pool
        b, end, mapped = head, es.ptr, 0
        assert head.ptr == es.ptr, f"the first block of the expandable segment at {es.ptr:#x} starts at {head.ptr:#x}"
        while b is not None:
            assert b.ptr == end and b.expandable_segment is es, f"expandable segment not tiled at {b}"
            assert b.pool is pool and (b in pool.unmapped) == (not b.mapped), f"{b} misplaced (mapped: {b.mapped})"
            mapped += b.size if b.mapped else 0
            end, b = b.ptr + b.size, b.next
        assert end == es.ptr + es.size(), f"the expandable segment at {es.ptr:#x} ends at {end:#x}"
        assert mapped == sum(es.handles) * es.segment_size, f"{mapped} bytes of blocks mapped, pages say otherwise"
