"""A faithful Python model of PyTorch's CUDA caching allocator (one device).

Mirrors ``DeviceCachingAllocator`` in c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.11), method by
method: ``malloc`` (``get_free_block`` -> ``alloc_block`` -> ``release_available_cached_blocks`` ->
``release_cached_blocks`` -> OOM), ``alloc_found_block`` (splitting), ``free`` / ``free_block`` /
``try_merge_blocks`` (coalescing), ``recordStream`` / ``insert_events`` / ``process_events``
(per-stream reuse), ``emptyCache`` / ``release_blocks`` / ``release_block``, and the statistics of
``torch.cuda.memory_stats()``; with ``expandable_segments`` the segments that grow by mapping pages
(``expandable.py``). Not modelled: CUDA-graph private pools, the garbage-collection threshold (which
frees cached segments before a cudaMalloc once reserved memory passes a fraction of
``set_per_process_memory_fraction``), free-memory callbacks.

Why it exists: cudaMalloc and cudaFree are slow and synchronize the device, so PyTorch asks the
driver for big *segments* once and carves tensors out of them itself. Freed blocks stay cached
(reserved) for the next tensor of a similar size on the same stream; reserved memory therefore only
grows until ``empty_cache()`` -- or an allocation that would otherwise fail -- gives whole free
segments back.

Streams are ints (like ``cudaStream_t`` values; 0 is the default stream). GPU work is not
simulated, so stream events are explicit: ``record_stream(block, s)`` marks a block as used on
stream ``s``; when it is freed, the allocator records an event on ``s`` and keeps the block out of
its pool; ``sync(s)`` says that stream ``s`` has finished its work so far (every event recorded on
it is complete); the block returns to the pool at the next ``malloc`` (``process_events``) or
``empty_cache`` (``synchronize_and_free_events``), as in C++.
"""

from __future__ import annotations

from collections import deque

from .block import Block, BlockPool
from .config import DEFAULT_CONFIG, SIZE_MAX, AllocatorConfig, GiB, format_size
from .device import DeviceMemory
from .expandable import ExpandableSegments
from .policy import oversize_allows
from .policy import should_split as _should_split
from .sizes import get_allocation_size, is_small, round_size
from .stats import DeviceStats

_DOCS_URL = "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables"


class OutOfMemoryError(RuntimeError):
    """``torch.OutOfMemoryError`` of the model; the numbers are attributes as well as in the text."""

    def __init__(
        self,
        message: str,
        *,
        alloc_size: int,
        device_total: int,
        device_free: int,
        allocated_bytes: int,
        reserved_bytes: int,
    ) -> None:
        super().__init__(message)
        self.alloc_size = alloc_size  # the segment size that could not be cudaMalloc'd
        self.device_total = device_total
        self.device_free = device_free
        self.allocated_bytes = allocated_bytes
        self.reserved_bytes = reserved_bytes


def _check_stream(stream: object, name: str = "stream") -> int:
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError(
            f"{name} must be an int (a cudaStream_t value, 0 = default stream), got {type(stream).__name__}"
        )
    if stream < 0:
        raise ValueError(f"{name} must be >= 0, got {stream}")
    return stream


class CachingAllocator(ExpandableSegments):
    """``DeviceCachingAllocator`` for one simulated GPU.

    ``capacity``: device memory in bytes (or pass ``device=DeviceMemory(...)``). ``config``: the
    ``PYTORCH_CUDA_ALLOC_CONF`` settings. ``memory_fraction``: like
    ``torch.cuda.set_per_process_memory_fraction`` (segments may not exceed fraction * capacity).
    """

    def __init__(
        self,
        capacity: int | None = None,
        *,
        config: AllocatorConfig | None = None,
        device: DeviceMemory | None = None,
        device_index: int = 0,
        memory_fraction: float | None = None,
        record_history: bool = True,
    ) -> None:
        if config is not None and not isinstance(config, AllocatorConfig):
            raise TypeError(f"config must be an AllocatorConfig, got {type(config).__name__}")
        if device is not None and capacity is not None:
            raise ValueError("pass either capacity or device, not both")
        if device is not None and not isinstance(device, DeviceMemory):
            raise TypeError(f"device must be a DeviceMemory, got {type(device).__name__}")
        self.config = config or DEFAULT_CONFIG
        self.device = device or DeviceMemory(80 * GiB if capacity is None else capacity)
        self.device_index = device_index
        self.small_blocks = BlockPool(True, self.config.block_order)
        self.large_blocks = BlockPool(False, self.config.block_order)
        self.active_blocks: set[Block] = set()  # allocated, or freed but waiting on events
        # private pools (CUDA graphs) are not simulated; restore_segments keeps their segments here
        # so that they count in reserved memory, but no allocation ever searches them
        self.private_pools: dict[tuple, BlockPool] = {}
        self.stats = DeviceStats(self.config.max_split_size)
        self.total_allocated_memory = 0  # bytes of all segments (== reserved_bytes.all.current)
        self.expandable_segments: list = []  # every live ExpandableSegment (expandable_segments:True)
        self.allowed_memory_maximum: int | None = None
        if memory_fraction is not None:
            self.set_memory_fraction(memory_fraction)
        self.cuda_events: dict[int, deque[tuple[int, Block]]] = {}  # stream -> (event seq, block)
        self._event_seq: dict[int, int] = {}  # events recorded so far per stream
        self._synced_upto: dict[int, int] = {}  # events known complete per stream
        self._segment_counter = 0
        self.record_history = record_history
        self.device_trace: list[dict] = []  # torch.cuda.memory._snapshot()["device_traces"][i]
        self._time = 0

    # ------------------------------------------------------------------------------------------
    # public API: what a tensor's creation and destruction call
    # ------------------------------------------------------------------------------------------
    def malloc(self, size: int, stream: int = 0) -> Block | None:
        """Allocate ``size`` bytes for use on ``stream``; returns the Block (None for 0 bytes).

        Raises OutOfMemoryError like ``torch.OutOfMemoryError`` when even a full cache flush does
        not make room.
        """
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"size must be an int (bytes), got {type(size).__name__}")
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        _check_stream(stream)
        if size == 0:  # NativeCachingAllocator::allocate(0) returns a null pointer: no block
            return None
        self.process_events()
        orig_size = size
        size = round_size(orig_size, self.config)
        pool = self.small_blocks if is_small(size) else self.large_blocks  # get_pool
        alloc_size = get_allocation_size(size)

        block = self._get_free_block(pool, size, stream)
        if block is None:
            block = (
                self._alloc_block(pool, size, alloc_size, stream, is_retry=False)
                or (
                    self._release_available_cached_blocks(pool, size, stream)
                    and self._alloc_block(pool, size, alloc_size, stream, is_retry=False)
                )
                or (
                    self._release_cached_blocks()
                    and self._alloc_block(pool, size, alloc_size, stream, is_retry=True)
                )
            )
        if not block:
            self._raise_oom(size, alloc_size, stream)
        split = _should_split(
            block.size,
            size,
            "small" if pool.is_small else "large",
            max_split_size=self.config.max_split_size,
            expandable_segments=self.config.expandable_segments,
        )
        return self._alloc_found_block(block, size, orig_size, stream, split)

    def free(self, block: Block | None) -> None:
        """Give a block back (the tensor's storage died). Pending if it was used on other streams."""
        if block is None:  # a 0-byte allocation
            return
        self._check_block(block, "block")
        if not block.allocated:
            raise ValueError(f"free of {block}, which is not allocated (double free?)")
        block.allocated = False
        pool = block.pool.name
        self.stats.decrease("allocation", pool, 1)
        self.stats.decrease("allocated_bytes", pool, block.size)
        self._record("free_requested", block.ptr, block.requested_size, block.stream)
        if block.size >= self.config.max_split_size:
            self.stats.oversize_allocations.decrease(1)
        if block.stream_uses:
            self._insert_events(block)
        else:
            self._free_block(block)

    def record_stream(self, block: Block | None, stream: int) -> None:
        """``Tensor.record_stream(s)``: the block is in use on ``stream`` too; delay its reuse."""
        _check_stream(stream)
        if block is None:
            return
        self._check_block(block, "block")
        if not block.allocated:
            raise ValueError(f"record_stream on {block}, which is not allocated")
        if stream == block.stream:  # uses on the allocation stream need no synchronization
            return
        block.stream_uses.add(stream)

    def sync(self, stream: int) -> None:
        """Stream ``stream`` has finished the work queued so far: all its recorded events are complete."""
        _check_stream(stream)
        self._synced_upto[stream] = self._event_seq.get(stream, 0)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: cudaFree every segment that is entirely free."""
        self._release_cached_blocks()

    def set_memory_fraction(self, fraction: float) -> None:
        """``torch.cuda.set_per_process_memory_fraction``: cap the allocator at fraction * capacity."""
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
            raise ValueError(f"fraction must be a number in [0, 1], got {fraction!r}")
        self.allowed_memory_maximum = int(float(fraction) * float(self.device.capacity))

    # -- statistics ----------------------------------------------------------------------------
    def memory_stats(self) -> dict:
        """``torch.cuda.memory_stats()``: flat dict, e.g. ``["reserved_bytes.all.peak"]``."""
        return self.stats.memory_stats()

    def memory_allocated(self) -> int:
        return self.stats.allocated_bytes["all"].current

    def memory_reserved(self) -> int:
        return self.stats.reserved_bytes["all"].current

    def max_memory_allocated(self) -> int:
        return self.stats.allocated_bytes["all"].peak

    def max_memory_reserved(self) -> int:
        return self.stats.reserved_bytes["all"].peak

    def num_segments(self) -> int:
        return self.stats.segment["all"].current

    def reset_peak_stats(self) -> None:
        self.stats.reset_peak()

    def reset_accumulated_stats(self) -> None:
        self.stats.reset_accumulated()

    def snapshot(self) -> dict:
        """``torch.cuda.memory._snapshot()``: segments with blocks, device_traces, allocator_settings."""
        from .snapshot import make_snapshot

        return make_snapshot(self)

    def segments(self) -> list[list[Block]]:
        """Every segment as its list of blocks in address order, segments sorted by address. An expandable
        segment shows as one segment per contiguous mapped range, as in ``snapshot()``."""
        blocks = list(self.small_blocks) + list(self.large_blocks) + list(self.active_blocks)
        for pool in self.private_pools.values():
            blocks += list(pool)
        heads = sorted((b for b in blocks if b.prev is None or not b.prev.mapped), key=lambda b: b.ptr)
        out = []
        for head in heads:
            seg, b = [], head
            while b is not None and b.mapped:
                seg.append(b)
                b = b.next
            out.append(seg)
        return out

    # ------------------------------------------------------------------------------------------
    # the C++ private methods
    # ------------------------------------------------------------------------------------------
    def _get_free_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """``get_free_block``: best fit on the same stream, subject to the oversize rules."""
        i = pool.lower_bound(stream, size)
        if i == len(pool):
            return None
        block = pool.at(i)
        if block.stream != stream:
            return None
        if block.expandable_segment is not None:
            # best fit counts an expandable block by the size it can grow to (plus the unmapped range
            # after it): among big-enough blocks, take one that could grow less, if there is one
            def growable(b: Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

            while (block.expandable_segment is not None and i + 1 < len(pool) and pool.at(i + 1).stream == stream
                   and growable(pool.at(i + 1)) < growable(block)):
                i += 1
                block = pool.at(i)
        if not oversize_allows(
            block.size,
            size,
            max_split_size=self.config.max_split_size,
            max_non_split_rounding_size=self.config.max_non_split_rounding_size,
        ):
            return None
        pool.remove(block)
        return block

    def _alloc_block(
        self, pool: BlockPool, size: int, alloc_size: int, stream: int, *, is_retry: bool
    ) -> Block | None:
        """``alloc_block``: cudaMalloc a new segment of ``alloc_size`` bytes."""
        if is_retry:
            self.stats.num_alloc_retries += 1
        if (
            self.allowed_memory_maximum is not None
            and self.total_allocated_memory + alloc_size > self.allowed_memory_maximum
        ):
            return None
        if self.config.expandable_segments:  # map pages in an expandable segment instead of cudaMalloc
            return self._try_allocate_expandable_block(pool, size, stream)
        ptr = self.device.malloc(alloc_size)
        if ptr is None:  # cudaErrorMemoryAllocation
            return None
        return self._new_segment(pool, ptr, alloc_size, stream)

    def _new_segment(self, pool: BlockPool, ptr: int, alloc_size: int, stream: int) -> Block:
        """The bookkeeping after a successful cudaMalloc: one unsplit block covering the segment."""
        self.total_allocated_memory += alloc_size
        self._segment_counter += 1
        block = Block(stream, alloc_size, ptr, pool, self._segment_counter)
        self.stats.increase("segment", pool.name, 1)
        self.stats.increase("reserved_bytes", pool.name, alloc_size)
        if alloc_size >= self.config.max_split_size:
            self.stats.oversize_segments.increase(1)
        self.stats.num_device_alloc += 1
        self._record("segment_alloc", ptr, alloc_size, stream)
        return block

    def _alloc_found_block(self, block: Block, size: int, orig_size: int, stream: int, split: bool) -> Block:
        """``alloc_found_block``: hand out ``block``, splitting its tail off if ``split``."""
        pool = block.pool
        already_split = block.is_split()
        if split:
            remaining = block  # keeps the tail [ptr + size, ptr + old size)
            block = Block(stream, size, remaining.ptr, pool, remaining.segment_counter)
            block.expandable_segment = remaining.expandable_segment
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.ptr += size
            remaining.size -= size
            pool.insert(remaining)
            if block.expandable_segment is not None:  # expandable blocks never count as inactive_split
                pass
            elif already_split:  # an inactive split block shrinks by `size`
                self.stats.decrease("inactive_split_bytes", pool.name, block.size)
            else:  # a new inactive split block (the tail) appears
                self.stats.increase("inactive_split_bytes", pool.name, remaining.size)
                self.stats.increase("inactive_split", pool.name, 1)
        elif already_split and block.expandable_segment is None:  # an inactive split block becomes active whole
            self.stats.decrease("inactive_split_bytes", pool.name, block.size)
            self.stats.decrease("inactive_split", pool.name, 1)
        block.allocated = True
        block.requested_size = orig_size
        self._record("alloc", block.ptr, orig_size, block.stream)
        self.active_blocks.add(block)
        self.stats.increase("allocation", pool.name, 1)
        self.stats.increase("allocated_bytes", pool.name, block.size)
        self.stats.increase("active", pool.name, 1)
        self.stats.increase("active_bytes", pool.name, block.size)
        self.stats.increase("requested_bytes", pool.name, orig_size)
        if block.size >= self.config.max_split_size:
            self.stats.oversize_allocations.increase(1)
        return block

    def _free_block(self, block: Block) -> None:
        """``free_block``: put a block back in its pool, merging it with free neighbours."""
        self._record("free_completed", block.ptr, block.requested_size, block.stream)
        block.handle = None
        original_size, requested_size = block.size, block.requested_size
        pool = block.pool
        net_blocks = net_bytes = 0
        for candidate in (block.prev, block.next):
            subsumed = self._try_merge_blocks(block, candidate, pool)
            if subsumed > 0:
                net_blocks -= 1
                net_bytes -= subsumed
        self.active_blocks.discard(block)
        pool.insert(block)
        if block.is_split():
            net_blocks += 1
            net_bytes += block.size
        for name, delta in (("inactive_split", net_blocks), ("inactive_split_bytes", net_bytes)):
            if block.expandable_segment is not None:  # (its free pages can always be unmapped)
                break
            if delta > 0:
                self.stats.increase(name, pool.name, delta)
            elif delta < 0:
                self.stats.decrease(name, pool.name, -delta)
        self.stats.decrease("active", pool.name, 1)
        self.stats.decrease("active_bytes", pool.name, original_size)
        self.stats.decrease("requested_bytes", pool.name, requested_size)

    def _try_merge_blocks(self, dst: Block, src: Block | None, pool: BlockPool) -> int:
        """``try_merge_blocks``: absorb ``src`` into ``dst`` if it is free; returns bytes absorbed."""
        if src is None or src.allocated or src.event_count > 0 or src.stream_uses or src.mapped != dst.mapped:
            return 0
        if src.mapped:  # src is free, so it sits in the pool under its current key
            pool.remove(src)
        else:
            pool.unmapped.remove(src)
        if dst.prev is src:  # [src dst]
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:  # [dst src]
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _release_available_cached_blocks(self, pool: BlockPool, size: int, stream: int) -> bool:
        """``release_available_cached_blocks``: free oversize cached blocks, just enough for ``size``."""
        max_split = self.config.max_split_size
        if max_split == SIZE_MAX or self.config.expandable_segments:  # (expandable: see expandable.py)
            return False
        key_size = max(size, max_split)
        i = pool.lower_bound(stream, key_size)
        if i == len(pool) or pool.at(i).stream != stream:
            # no single block is large enough: free oversize blocks, largest first
            if i == 0:
                return False
            total_released = 0
            i -= 1  # the largest block of this stream (if any)
            while total_released < key_size:
                cur = pool.at(i)
                if cur.size < max_split or cur.stream != stream:
                    break
                total_released += cur.size
                self._release_block(cur)
                if i == 0:
                    break
                i -= 1
            if total_released < key_size:
                return False
        else:
            self._release_block(pool.at(i))
        return True

    def _release_cached_blocks(self) -> bool:
        """``release_cached_blocks``: wait for all events, then cudaFree every whole free segment."""
        self._synchronize_and_free_events()
        for pool in (self.large_blocks, self.small_blocks):  # release_blocks
            to_unmap = []
            for block in pool:  # iterates over a copy in (stream, size, address) order
                if block.expandable_segment is not None:
                    to_unmap.append(block)
                elif block.prev is None and block.next is None:
                    self._release_block(block)
            for block in to_unmap:  # unmap the whole pages under every free expandable block
                self._unmap_block(block)
                if block.prev is None and block.next is None:
                    self._release_expandable_segment(block)
        return True

    def _release_block(self, block: Block) -> None:
        """``release_block``: cudaFree a segment that is one free block."""
        assert not block.is_split() and not block.allocated, (
            f"release of {block}, which is not a whole free segment"
        )
        self.stats.num_device_free += 1
        self._record("segment_free", block.ptr, block.size, block.stream)
        self.device.free(block.ptr)
        self.total_allocated_memory -= block.size
        pool = block.pool
        self.stats.decrease("segment", pool.name, 1)
        self.stats.decrease("reserved_bytes", pool.name, block.size)
        if block.size >= self.config.max_split_size:
            self.stats.oversize_segments.decrease(1)
        pool.remove(block)

    # -- streams and events ----------------------------------------------------------------------
    def _insert_events(self, block: Block) -> None:
        """``insert_events``: record one event per stream the block was used on."""
        streams, block.stream_uses = sorted(block.stream_uses), set()
        for s in streams:
            seq = self._event_seq.get(s, 0) + 1
            self._event_seq[s] = seq
            block.event_count += 1
            self.cuda_events.setdefault(s, deque()).append((seq, block))

    def process_events(self) -> None:
        """``process_events``: return blocks whose events have all completed (start of each malloc)."""
        for s in list(self.cuda_events):
            queue = self.cuda_events[s]
            done = self._synced_upto.get(s, 0)
            while queue and queue[0][0] <= done:  # cudaEventQuery == cudaSuccess
                _, block = queue.popleft()
                block.event_count -= 1
                if block.event_count == 0:
                    self._free_block(block)
            if not queue:
                del self.cuda_events[s]

    def _synchronize_and_free_events(self) -> None:
        """``synchronize_and_free_events``: cudaEventSynchronize every outstanding event."""
        self.stats.num_sync_all_streams += 1
        for s, queue in list(self.cuda_events.items()):
            for _, block in queue:
                block.event_count -= 1
                if block.event_count == 0:
                    self._free_block(block)
            self._synced_upto[s] = self._event_seq.get(s, 0)
        self.cuda_events.clear()

    # -- OOM ---------------------------------------------------------------------------------------
    def _raise_oom(self, size: int, alloc_size: int, stream: int) -> None:
        device_free, device_total = self.device.free_bytes, self.device.capacity
        self._record("oom", device_free, size, stream)
        self.stats.num_ooms += 1
        allocated = self.memory_allocated()
        reserved = self.memory_reserved()
        allowed_info = ""
        if self.allowed_memory_maximum is not None:
            allowed_info = f"{format_size(self.allowed_memory_maximum)} allowed; "
        message = (
            f"CUDA out of memory. Tried to allocate {format_size(alloc_size)}. "
            f"GPU {self.device_index} has a total capacity of {format_size(device_total)} "
            f"of which {format_size(device_free)} is free. {allowed_info}"
            f"Of the allocated memory {format_size(allocated)} is allocated by PyTorch, "
            f"and {format_size(reserved - allocated)} is reserved by PyTorch but unallocated. "
            "If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
            f"See documentation for Memory Management  ({_DOCS_URL})"
        )
        raise OutOfMemoryError(
            message,
            alloc_size=alloc_size,
            device_total=device_total,
            device_free=device_free,
            allocated_bytes=allocated,
            reserved_bytes=reserved,
        )

    # -- bookkeeping -------------------------------------------------------------------------------
    def _record(self, action: str, addr: int, size: int, stream: int) -> None:
        """``record_trace``: one entry of ``device_traces`` in the real snapshot format."""
        self._time += 1
        if not self.record_history:
            return
        entry = {"action": action, "size": size, "stream": stream, "time_us": self._time, "frames": []}
        entry["device_free" if action == "oom" else "addr"] = addr
        self.device_trace.append(entry)

    def _check_block(self, block: object, name: str) -> None:
        if not isinstance(block, Block):
            raise TypeError(f"{name} must be a Block returned by malloc, got {type(block).__name__}")
        pools = (self.small_blocks, self.large_blocks, *self.private_pools.values())
        if not any(block.pool is p for p in pools):
            raise ValueError(f"{name} {block} belongs to another allocator")

    def check_invariants(self) -> None:
        """Assert that the bookkeeping is consistent (see ``invariants.check_invariants``)."""
        from .invariants import check_invariants

        check_invariants(self)
