"""Blocks and block pools: the allocator's data structures.

Mirrors ``Block`` and ``BlockPool`` of c10/cuda/CUDACachingAllocator.cpp.

A *segment* is one cudaMalloc. It is tiled by *blocks*, chained by ``prev``/``next`` in address
order; a block that was never split has neither. A block is either allocated (handed to a
tensor), pending (freed, but waiting on stream events: ``event_count > 0``), or free and sitting
in its pool. A pool holds the free blocks of one size class (small: <= 1 MiB, large), sorted by
(stream, size, address) like ``std::set<Block*, BlockComparatorSize>``, so that a
``lower_bound`` is a best-fit search within one stream.

Expandable segments add *unmapped* blocks: address ranges of an ``ExpandableSegment`` with no
memory under them (``mapped`` False). They tile the segment like other blocks, but live in the
pool's ``unmapped`` set, ordered by (stream, address) like ``BlockComparatorAddress``.
"""

from __future__ import annotations

from bisect import bisect_left, insort


class Block:
    """A piece of a segment. ``ptr``/``size`` in bytes; ``stream`` is the allocation stream."""

    __slots__ = (
        "stream",
        "size",
        "ptr",
        "pool",
        "requested_size",
        "allocated",
        "prev",
        "next",
        "event_count",
        "stream_uses",
        "segment_counter",
        "handle",
        "mapped",
        "expandable_segment",
    )

    def __init__(self, stream: int, size: int, ptr: int, pool: "BlockPool", segment_counter: int) -> None:
        self.stream = stream
        self.size = size
        self.ptr = ptr
        self.pool = pool
        self.requested_size = 0  # the unrounded request of the last allocation of this block
        self.allocated = False
        self.prev: Block | None = None
        self.next: Block | None = None
        self.event_count = 0  # outstanding events of other streams (record_stream)
        self.stream_uses: set[int] = set()  # streams the block was used on besides its own
        self.segment_counter = segment_counter  # order of the cudaMalloc it came from
        self.handle = None  # the trace's allocation id while allocated (for replay and plots)
        self.mapped = True  # False: addresses of an expandable segment with no memory under them
        self.expandable_segment = None  # the ExpandableSegment this block lies in, if any

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def key(self) -> tuple:
        return self.pool.key(self)

    def splice(self, before: "Block | None", after: "Block | None") -> None:
        """Insert this block between ``before`` and ``after`` (``Block::splice``)."""
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after

    def __repr__(self) -> str:
        if not self.mapped:
            return f"Block(ptr={self.ptr:#x}, size={self.size}, stream={self.stream}, unmapped)"
        state = "allocated" if self.allocated else ("pending" if self.event_count else "free")
        return f"Block(ptr={self.ptr:#x}, size={self.size}, stream={self.stream}, {state})"


class BlockPool:
    """The free blocks of one size class, ordered like ``BlockComparatorSize``."""

    def __init__(self, is_small: bool, block_order: str = "address", pool_id: tuple = (0, 0)) -> None:
        self.is_small = is_small
        self.name = "small_pool" if is_small else "large_pool"  # its statistics' key
        self.pool_id = pool_id  # (0, 0): the default pools; else a private pool (CUDA graphs)
        self._by_counter = block_order == "segment_counter"
        self._keys: list[tuple] = []  # sorted (stream, size, [counter,] ptr)
        self._blocks: dict[tuple, Block] = {}
        self.unmapped = UnmappedBlocks()  # expandable segments' address ranges without memory

    def key(self, b: Block) -> tuple:
        if self._by_counter:
            return (b.stream, b.size, b.segment_counter, b.ptr)
        return (b.stream, b.size, b.ptr)

    def insert(self, b: Block) -> None:
        k = self.key(b)
        if k in self._blocks:
            raise AssertionError(f"{b} is already in the {self.name}")
        insort(self._keys, k)
        self._blocks[k] = b

    def remove(self, b: Block) -> None:
        k = self.key(b)
        i = bisect_left(self._keys, k)
        if i == len(self._keys) or self._keys[i] != k:
            raise AssertionError(f"{b} is not in the {self.name}")
        del self._keys[i]
        del self._blocks[k]

    def lower_bound(self, stream: int, size: int) -> int:
        """Index of the first free block >= (stream, size): ``blocks.lower_bound(&search_key)``."""
        return bisect_left(self._keys, (stream, size))

    def at(self, i: int) -> Block:
        return self._blocks[self._keys[i]]

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self):
        """Free blocks in pool order (stream, size, address)."""
        return (self._blocks[k] for k in list(self._keys))

    def __contains__(self, b: Block) -> bool:
        return self._blocks.get(self.key(b)) is b


class UnmappedBlocks:
    """The unmapped blocks of a pool, ordered by (stream, address): ``BlockPool::unmapped``."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, int]] = []
        self._blocks: dict[tuple[int, int], Block] = {}

    def add(self, b: Block) -> None:
        k = (b.stream, b.ptr)
        if k in self._blocks:
            raise AssertionError(f"{b} is already unmapped in its pool")
        insort(self._keys, k)
        self._blocks[k] = b

    def remove(self, b: Block) -> None:
        k = (b.stream, b.ptr)
        if self._blocks.get(k) is not b:
            raise AssertionError(f"{b} is not among its pool's unmapped blocks")
        del self._keys[bisect_left(self._keys, k)]
        del self._blocks[k]

    def of_stream(self, stream: int) -> list[Block]:
        """The unmapped blocks of ``stream``, lowest address first (``lower_bound`` of (stream, 0) on)."""
        i = bisect_left(self._keys, (stream, 0))
        out = []
        while i < len(self._keys) and self._keys[i][0] == stream:
            out.append(self._blocks[self._keys[i]])
            i += 1
        return out

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self):
        return (self._blocks[k] for k in list(self._keys))

    def __contains__(self, b: Block) -> bool:
        return self._blocks.get((b.stream, b.ptr)) is b
