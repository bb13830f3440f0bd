"""Exercise (b): which cached block serves a request (best fit) and whether the leftover is split off.

Mirrors c10/cuda/CUDACachingAllocator.cpp:

- ``get_free_block``: a pool is a ``std::set`` of free blocks ordered by (stream, size, address)
  (``BlockComparatorSize``). ``lower_bound((stream, size))`` lands on the smallest block of the
  requesting stream that is big enough -- best fit, lowest address on ties. Two rules guard
  "oversize" blocks (>= ``max_split_size``): they never serve small requests, and serve big
  ones only if they waste less than ``max_non_split_rounding_size`` (20 MiB by default).
- ``should_split``: whether the unused tail of the chosen block becomes a free block of its own.
  Small pool: when the tail is >= 512 B. Large pool: when the tail is > 1 MiB (kSmallSize) and the
  request is below ``max_split_size``; a smaller tail stays inside the allocation (it is wasted
  until the block is freed, and shows up as allocated_bytes > requested_bytes).

Blocks here are plain ``(stream, size, address)`` tuples so the functions can be graded alone.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

from .config import SIZE_MAX, kLargeBuffer, kMinBlockSize, kSmallSize

FreeBlock = tuple[int, int, int]  # (stream, size, address)


def _check_int(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def oversize_allows(
    block_size: int,
    size: int,
    *,
    max_split_size: int = SIZE_MAX,
    max_non_split_rounding_size: int = kLargeBuffer,
) -> bool:
    """The two ``max_split_size`` rules of ``get_free_block`` for the best-fit candidate.

    - "Do not return an oversized block for a large request": a request below max_split_size
      may not take a block of max_split_size or more (it would be split, and oversize blocks
      are never split).
    - "Allow oversized block size to be rounded up but within a limit": a request of at least
      max_split_size may take a block only if block_size < size + max_non_split_rounding_size.
    """
    if size < max_split_size and block_size >= max_split_size:
        return False
    if size >= max_split_size and block_size >= size + max_non_split_rounding_size:
        return False
    return True


def find_best_fit(
    free_blocks: Iterable[FreeBlock],
    size: int,
    stream: int,
    *,
    max_split_size: int = SIZE_MAX,
    max_non_split_rounding_size: int = kLargeBuffer,
) -> FreeBlock | None:
    """The free block ``get_free_block`` picks for a rounded request, or None (-> cudaMalloc).

    ``free_blocks``: the pool's free blocks as ``(stream, size, address)``, in any order.
    Only blocks of the same ``stream`` qualify; among them the smallest with size >= ``size``
    (lowest address on ties) is the candidate, and the candidate alone is checked against the
    oversize rules: if it fails, the answer is None even if a bigger block would pass (like C++).
    """
    _check_int("size", size, minimum=1)
    _check_int("stream", stream, minimum=0)
    keys = []
    for i, b in enumerate(free_blocks):
        if not (isinstance(b, tuple) and len(b) == 3):
            raise TypeError(f"free_blocks[{i}] must be a (stream, size, address) tuple, got {b!r}")
        for name, v in zip(("stream", "size", "address"), b, strict=True):
            _check_int(f"free_blocks[{i}].{name}", v, minimum=0 if name != "size" else 1)
        keys.append(b)
    keys.sort()
    i = bisect_left(keys, (stream, size))  # std::set::lower_bound(search_key)
    if i == len(keys) or keys[i][0] != stream:
        return None
    candidate = keys[i]
    if not oversize_allows(
        candidate[1],
        size,
        max_split_size=max_split_size,
        max_non_split_rounding_size=max_non_split_rounding_size,
    ):
        return None
    return candidate


def should_split(
    block_size: int,
    requested: int,
    pool: str,
    *,
    max_split_size: int = SIZE_MAX,
    expandable_segments: bool = False,
) -> bool:
    """Whether the tail ``block_size - requested`` is split off as its own free block.

    ``requested`` is the rounded request; ``pool`` is "small" or "large". Mirrors ``should_split``.
    """
    _check_int("block_size", block_size, minimum=1)
    _check_int("requested", requested, minimum=1)
    if requested > block_size:
        raise ValueError(f"requested ({requested}) must be <= block_size ({block_size})")
    if pool not in ("small", "large"):
        raise ValueError(f"pool must be 'small' or 'large', got {pool!r}")
    remaining = block_size - requested
    if pool == "small" or expandable_segments:
        return remaining >= kMinBlockSize
    return requested < max_split_size and remaining > kSmallSize
