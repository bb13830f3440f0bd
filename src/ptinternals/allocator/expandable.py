"""Expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``): segments that grow page by page.

Mirrors ``ExpandableSegment`` and the allocator methods that drive it in
c10/cuda/CUDACachingAllocator.cpp (see its Note [Expandable Segments]): ``find_expandable_block``,
``map_block``, ``try_allocate_expandable_block``, ``unmap_block`` and ``release_expandable_segment``.

Without it, every segment is one cudaMalloc, and a free tail at the end of a segment pinned by a live
tensor serves nothing bigger than itself: fragmentation. With it, the allocator reserves one virtual
address range per stream and pool, big enough for 1 1/8 times the GPU's memory
(``cuMemAddressReserve``), and maps physical memory under it in *pages* of the pool's segment size
(2 MiB for the small pool, 20 MiB for the large one; ``cuMemCreate`` + ``cuMemMap``) as requests
need it. A request that no free block fits maps pages at the lowest address where free and unmapped
space together are big enough, normally right after the last block: the new memory merges with the
free tail, so the tail is used instead of stranded. ``empty_cache`` (and the OOM retry) unmaps every
whole page under free blocks (``cuMemUnmap`` + ``cuMemRelease``) instead of cudaFreeing whole
segments, so memory in the middle of a segment goes back too.

What the statistics see (as in C++): a map adds to ``reserved_bytes`` and ``num_device_alloc`` but
not to the ``segment`` count, an unmap takes from ``reserved_bytes`` and adds to ``num_device_free``;
expandable blocks never count in ``inactive_split`` (their free pages can always be unmapped). A
snapshot shows one segment per contiguous mapped range, with ``is_expandable`` True, and the device
trace records ``segment_map`` and ``segment_unmap`` where cudaMalloc'd segments record
``segment_alloc`` and ``segment_free``.

Where the model simplifies: the large pool's page is always 20 MiB (``kLargeBuffer``; recent releases
read it from ``large_segment_size_mb``, whose default that is, and which the model parses but does not
vary); mapping does no IPC, peer access or stream synchronization (C++ synchronizes the stream before
unmapping); ``release_available_cached_blocks`` (``max_split_size_mb``) leaves expandable blocks alone
(C++ asserts they never reach ``release_block``); the setting is fixed per allocator, while torch lets a
program toggle it (``torch.cuda.memory._set_allocator_settings``) and then skips expandable blocks.
"""

from __future__ import annotations

from .block import Block, BlockPool
from .device import DeviceMemory
from .scaffold import kLargeBuffer, kSmallBuffer


class ExpandableSegment:
    """A reserved range of addresses, mapped in pages of ``segment_size`` bytes (``ExpandableSegment``)."""

    def __init__(self, device: DeviceMemory, stream: int, segment_size: int) -> None:
        self.device = device
        self.stream = stream
        self.segment_size = segment_size  # one page: 2 MiB (small pool) or 20 MiB (large pool)
        total = device.capacity  # cudaDeviceProp::totalGlobalMem
        self.max_handles = -(-(total + total // 8) // segment_size)  # address space for 1 1/8 of the GPU
        self.ptr = device.reserve(self.max_handles * segment_size)  # cuMemAddressReserve
        self.handles: list[bool] = []  # handles[i]: page i is mapped (trailing unmapped pages trimmed)

    def size(self) -> int:
        return self.max_handles * self.segment_size

    def map(self, ptr: int, size: int) -> tuple[int, int]:
        """Map the pages covering [ptr, ptr + size) (``ptr`` on a page boundary); returns the range mapped,
        which ends on a page boundary. A size of 0 means the device is out of memory (nothing is mapped)."""
        begin, end = self._left(ptr), self._right(ptr + size)
        if self.ptr + begin * self.segment_size != ptr:
            raise AssertionError(f"map at {ptr:#x}: not on a page boundary of the segment at {self.ptr:#x}")
        self.handles += [False] * (end - len(self.handles))
        for i in range(begin, end):
            if self.handles[i]:
                raise AssertionError(f"page {i} of the segment at {self.ptr:#x} is mapped twice")
            if not self.device.create(self.segment_size):  # cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY
                for j in range(begin, i):
                    self.handles[j] = False
                    self.device.release(self.segment_size)
                self._trim()
                return self._range(begin, begin)
            self.handles[i] = True
        return self._range(begin, end)

    def unmap(self, ptr: int, size: int) -> tuple[int, int]:
        """Unmap every whole page inside [ptr, ptr + size); returns the range unmapped (maybe empty)."""
        begin, end = self._right(ptr), self._left(ptr + size)
        if begin >= end:
            return ptr, 0
        for i in range(begin, end):
            self.handles[i] = False
            self.device.release(self.segment_size)  # cuMemUnmap + cuMemRelease
        self._trim()
        return self._range(begin, end)

    def release(self) -> None:
        """cuMemAddressFree of the whole range (every page unmapped already)."""
        if any(self.handles):
            raise AssertionError(f"release of the segment at {self.ptr:#x} while pages are mapped")
        self.device.release_reservation(self.ptr)

    def _left(self, p: int) -> int:  # segmentLeft: the page containing p
        return (p - self.ptr) // self.segment_size

    def _right(self, p: int) -> int:  # segmentRight: the first page boundary at or after p
        return -(-(p - self.ptr) // self.segment_size)

    def _range(self, begin: int, end: int) -> tuple[int, int]:
        return self.ptr + begin * self.segment_size, (end - begin) * self.segment_size

    def _trim(self) -> None:
        while self.handles and not self.handles[-1]:
            self.handles.pop()


def _allocatable(b: Block | None) -> bool:
    return b is not None and not b.allocated and b.event_count == 0 and not b.stream_uses


class ExpandableSegments:
    """The allocator methods of expandable segments (a mixin of ``CachingAllocator``)."""

    def _find_expandable_block(self, pool: BlockPool, size: int, stream: int) -> Block:
        """``find_expandable_block``: the lowest address of this stream's expandable segments where free
        and unmapped blocks together hold ``size`` bytes; else a new segment's unmapped range."""

        def has_room(b: Block | None) -> bool:
            room = 0
            while room < size and _allocatable(b):
                room += b.size
                b = b.next
            return room >= size

        for candidate in pool.unmapped.of_stream(stream):
            if _allocatable(candidate.prev):  # a free block just before the unmapped range
                candidate = candidate.prev
            if has_room(candidate):
                return candidate
        segment = ExpandableSegment(self.device, stream, kSmallBuffer if pool.is_small else kLargeBuffer)
        self.expandable_segments.append(segment)
        self._segment_counter += 1
        candidate = Block(stream, segment.size(), segment.ptr, pool, self._segment_counter)
        candidate.mapped = False
        candidate.expandable_segment = segment
        pool.unmapped.add(candidate)
        return candidate

    def _map_block(self, to_map: Block, size: int) -> bool:
        """``map_block``: map pages at the start of the unmapped ``to_map`` (at least ``size`` bytes) and
        merge them with free neighbours; False when the device has no memory left."""
        ptr, mapped = to_map.expandable_segment.map(to_map.ptr, size)
        if mapped == 0:
            return False
        pool = to_map.pool
        pool.unmapped.remove(to_map)
        to_map.mapped = True
        if mapped < to_map.size:  # to_map -> remaining (still unmapped) -> to_map.next
            remaining = Block(to_map.stream, to_map.size - mapped, to_map.ptr + mapped, pool, to_map.segment_counter)
            remaining.mapped = False
            remaining.expandable_segment = to_map.expandable_segment
            remaining.splice(to_map, to_map.next)
            pool.unmapped.add(remaining)
            to_map.size = mapped
        self._try_merge_blocks(to_map, to_map.prev, pool)
        self._try_merge_blocks(to_map, to_map.next, pool)
        pool.insert(to_map)
        self.total_allocated_memory += mapped
        self.stats.increase("reserved_bytes", pool.name, mapped)  # not "segment": no cudaMalloc happened
        self.stats.num_device_alloc += 1
        self._record("segment_map", ptr, mapped, to_map.stream)
        return True

    def _try_allocate_expandable_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """``try_allocate_expandable_block``: map as many pages as ``size`` needs; the free block that
        results (taken out of the pool) or None (out of memory)."""
        candidate = self._find_expandable_block(pool, size, stream)
        # candidate: unmapped -> (end), unmapped -> free -> ..., or free -> unmapped -> ...
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:  # free -> unmapped: map some of the unmapped, which merges
            following = candidate.next
            if not self._map_block(following, min(size - candidate.size, following.size)):
                return None
            candidate = following
        pool.remove(candidate)
        return candidate

    def _unmap_block(self, block: Block) -> None:
        """``unmap_block``: unmap the whole pages under a free block; the partial pages at its ends stay
        mapped as free blocks of their own."""
        segment = block.expandable_segment
        ptr, unmapped = segment.unmap(block.ptr, block.size)
        if unmapped == 0:
            return
        pool = block.pool
        pool.remove(block)
        before = ptr - block.ptr
        if before > 0:  # prev -> before_free -> block
            before_free = Block(block.stream, before, block.ptr, pool, block.segment_counter)
            before_free.expandable_segment = segment
            before_free.splice(block.prev, block)
            pool.insert(before_free)
        after = block.size - (before + unmapped)
        if after > 0:  # block -> after_free -> next
            after_free = Block(block.stream, after, ptr + unmapped, pool, block.segment_counter)
            after_free.expandable_segment = segment
            after_free.splice(block, block.next)
            pool.insert(after_free)
        block.ptr, block.size, block.mapped = ptr, unmapped, False
        self._try_merge_blocks(block, block.prev, pool)
        self._try_merge_blocks(block, block.next, pool)
        pool.unmapped.add(block)
        self.total_allocated_memory -= unmapped
        self.stats.decrease("reserved_bytes", pool.name, unmapped)
        self.stats.num_device_free += 1
        self._record("segment_unmap", ptr, unmapped, block.stream)

    def _release_expandable_segment(self, block: Block) -> None:
        """``release_expandable_segment``: a segment that is one unmapped block gives its addresses back."""
        segment = block.expandable_segment
        if block.mapped or block.size != segment.size():
            raise AssertionError(f"{block} does not cover its whole expandable segment")
        self.expandable_segments.remove(segment)
        block.pool.unmapped.remove(block)
        segment.release()
