"""A simulated GPU memory: what ``cudaMalloc`` / ``cudaFree`` / ``cudaMemGetInfo`` do, as far as the
caching allocator can tell.

The caching allocator sees the driver only through three calls: cudaMalloc(size) either returns an
address or fails with cudaErrorMemoryAllocation; cudaFree(ptr) gives the bytes back;
cudaMemGetInfo() reports (free, total) for the OOM message. Physical memory is mapped in pages, so
cudaMalloc succeeds whenever enough bytes are free in total -- the driver has no external
fragmentation that matters here; fragmentation lives in the caching allocator's segments.

Addresses come from a virtual address range with first-fit reuse (a freed range is handed out
again, as the real driver tends to do). To replay a trace recorded on a real GPU with the real
addresses (the allocator breaks ties between equal-size free blocks by address), pass
``address_oracle``: the (address, size) of each recorded cudaMalloc, handed out in order per size.

The exercises of the allocator chapter use it too (it is importable while grading, see ``scaffold``), so a
student's allocator gets exactly the addresses the reference model gets.

Expandable segments use the driver's virtual memory API instead of cudaMalloc: ``reserve``
(cuMemAddressReserve: an address range, no memory), ``create``/``release`` (cuMemCreate/cuMemRelease:
physical memory, which cuMemMap puts under the range) and ``release_reservation`` (cuMemAddressFree).
A reserved range takes addresses but no bytes; ``used`` counts physical memory only.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict, deque
from collections.abc import Iterable

MiB = 1024 * 1024  # (defined here too: this module is importable while grading, without config)
GiB = 1024 * MiB

DEFAULT_BASE_ADDRESS = 0x7F0000000000  # where CUDA tends to map device memory on x86-64 Linux
_ALIGNMENT = 2 * MiB  # cudaMalloc'd segments start on 2 MiB boundaries here


class DeviceMemory:
    """One GPU's memory as the driver sees it: ``capacity`` bytes, of which ``non_pytorch_bytes``
    (CUDA context, other processes) are never available to the allocator."""

    def __init__(
        self,
        capacity: int = 80 * GiB,
        *,
        non_pytorch_bytes: int = 0,
        base_address: int = DEFAULT_BASE_ADDRESS,
        address_oracle: Iterable[tuple[int, int]] | None = None,
        reservation_oracle: Iterable[int] | None = None,
    ) -> None:
        for name, v, lo in (
            ("capacity", capacity, 1),
            ("non_pytorch_bytes", non_pytorch_bytes, 0),
            ("base_address", base_address, 0),
        ):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
            if v < lo:
                raise ValueError(f"{name} must be >= {lo}, got {v}")
        if non_pytorch_bytes > capacity:
            raise ValueError(f"non_pytorch_bytes ({non_pytorch_bytes}) exceeds capacity ({capacity})")
        self.capacity = capacity
        self.non_pytorch_bytes = non_pytorch_bytes
        self.used = 0  # bytes held by live segments
        self.base_address = base_address
        self._live: dict[int, int] = {}  # address -> size of each live segment
        self._starts: list[int] = []  # sorted addresses of live segments (for first fit)
        self._oracle: dict[int, deque[int]] = defaultdict(deque)
        self.oracle_misses: list[tuple[int, int]] = []  # (size, address) handed out off-oracle
        if address_oracle is not None:
            for addr, size in address_oracle:
                self._oracle[size].append(addr)
        self._reservations: set[int] = set()  # addresses of live cuMemAddressReserve ranges
        self._reservation_oracle = list(reservation_oracle or ())  # recorded addresses inside reservations

    # -- what cudaMemGetInfo reports -------------------------------------------------------
    @property
    def free_bytes(self) -> int:
        return self.capacity - self.non_pytorch_bytes - self.used

    # -- cudaMalloc / cudaFree -------------------------------------------------------------
    def malloc(self, size: int) -> int | None:
        """cudaMalloc: an address, or None for cudaErrorMemoryAllocation."""
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"size must be a positive int, got {size!r}")
        if size > self.free_bytes:
            return None
        addr = None
        queue = self._oracle.get(size)
        while queue:
            cand = queue.popleft()
            if self._is_free_range(cand, size):
                addr = cand
                break
        if addr is None:
            addr = self._first_fit(size)
            if self._oracle:
                self.oracle_misses.append((size, addr))
        self._take(addr, size)
        return addr

    def malloc_at(self, address: int, size: int) -> int:
        """cudaMalloc that must return ``address`` (to rebuild a recorded state); raises if impossible."""
        if size > self.free_bytes:
            raise ValueError(f"cannot map {size} bytes at {address:#x}: only {self.free_bytes} bytes free")
        if not self._is_free_range(address, size):
            raise ValueError(f"address range [{address:#x}, {address + size:#x}) overlaps a live segment")
        self._take(address, size)
        return address

    def free(self, address: int) -> int:
        """cudaFree; returns the bytes given back."""
        size = self._live.get(address) if address not in self._reservations else None
        if size is None:
            raise ValueError(f"cudaFree of {address:#x}, which is not a live segment")
        self._drop(address)
        self.used -= size
        return size

    # -- the virtual memory API of expandable segments ---------------------------------------
    def reserve(self, size: int) -> int:
        """cuMemAddressReserve: a range of ``size`` addresses and no memory; returns its start.

        With a ``reservation_oracle`` (addresses recorded on a GPU, e.g. those of its segment_map
        events), the first recorded address whose range is free is used, so a replay maps where the
        GPU mapped.
        """
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"size must be a positive int, got {size!r}")
        addr = next((a for a in self._reservation_oracle if self._is_free_range(a, size)), None)
        if addr is None:
            addr = self._first_fit(size)
        self._take(addr, size, physical=False)
        self._reservations.add(addr)
        return addr

    def release_reservation(self, address: int) -> None:
        """cuMemAddressFree: give a reserved range back (its memory must be released first)."""
        if address not in self._reservations:
            raise ValueError(f"cuMemAddressFree of {address:#x}, which is not a reserved range")
        self._reservations.discard(address)
        self._drop(address)

    def create(self, size: int) -> bool:
        """cuMemCreate: ``size`` bytes of physical memory, or False (CUDA_ERROR_OUT_OF_MEMORY)."""
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"size must be a positive int, got {size!r}")
        if size > self.free_bytes:
            return False
        self.used += size
        return True

    def release(self, size: int) -> None:
        """cuMemRelease: physical memory from ``create`` goes back to the driver."""
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= self.used:
            raise ValueError(f"size must be a positive int <= the {self.used} bytes in use, got {size!r}")
        self.used -= size

    # -- address space ---------------------------------------------------------------------
    def _take(self, addr: int, size: int, *, physical: bool = True) -> None:
        self._live[addr] = size
        insort(self._starts, addr)
        if physical:
            self.used += size

    def _drop(self, addr: int) -> None:
        del self._live[addr]
        del self._starts[bisect_left(self._starts, addr)]

    def _is_free_range(self, addr: int, size: int) -> bool:
        i = bisect_left(self._starts, addr)
        if i < len(self._starts) and self._starts[i] < addr + size:
            return False
        if i > 0:
            prev = self._starts[i - 1]
            if prev + self._live[prev] > addr:
                return False
        return True

    def _first_fit(self, size: int) -> int:
        cursor = self.base_address
        for start in self._starts:
            if start >= cursor + size:
                break
            cursor = max(cursor, start + self._live[start])
            cursor = -(-cursor // _ALIGNMENT) * _ALIGNMENT
        return cursor
