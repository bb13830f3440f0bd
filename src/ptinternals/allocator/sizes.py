"""Exercise (a): how big a block a request gets, which pool it lives in, and how big a segment to cudaMalloc.

Mirrors c10/cuda/CUDACachingAllocator.cpp (``round_size``, ``roundup_power2_next_division``,
``get_allocation_size``, ``get_pool``), whose constants live in c10/core/AllocatorConfig.h.

    request (bytes) --round_size--> block size --is_small?--> pool --get_allocation_size--> segment
    1                               512                       small                          2 MiB
    1 MiB                           1 MiB                     small                          2 MiB
    1 MiB + 1                       1 MiB + 512               large                          20 MiB
    10 MiB + 1                      10 MiB + 512              large                          12 MiB

Reference solutions for the student exercise; pure functions of plain ints.
"""

from __future__ import annotations

from .config import (
    DEFAULT_CONFIG,
    AllocatorConfig,
    kLargeBuffer,
    kMinBlockSize,
    kMinLargeAlloc,
    kRoundLarge,
    kSmallBuffer,
    kSmallSize,
)


def _check_size(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (bytes), got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """Round ``size`` up to the next of ``divisions`` equal steps between two powers of two.

    1200 with 4 divisions: the steps between 1024 and 2048 are 1024, 1280, 1536, 1792 -> 1280.
    A power of two is returned unchanged. Mirrors ``roundup_power2_next_division``.
    """
    _check_size("size", size, minimum=1)
    _check_size("divisions", divisions, minimum=2)
    if divisions & (divisions - 1):
        raise ValueError(f"divisions must be a power of two, got {divisions}")
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)  # power2_floor / divisions
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def round_size(nbytes: int, config: AllocatorConfig | None = None) -> int:
    """The block size the allocator hands out for a request of ``nbytes`` (``round_size``).

    At least 512 B, a multiple of 512 B; with ``roundup_power2_divisions`` set for the request's
    interval (and the request bigger than 512 * divisions), rounded to a power-of-two division.
    A request of 0 bytes never reaches the allocator (PyTorch returns a null pointer), but
    ``round_size(0)`` is 512 like the C++.
    """
    _check_size("nbytes", nbytes, minimum=0)
    config = config or DEFAULT_CONFIG
    if nbytes < kMinBlockSize:
        return kMinBlockSize
    divisions = config.divisions_for(nbytes)
    if divisions > 1 and nbytes > kMinBlockSize * divisions:
        return roundup_power2_next_division(nbytes, divisions)
    return kMinBlockSize * ((nbytes + kMinBlockSize - 1) // kMinBlockSize)


def round_request(nbytes: int, divisions: int = 0) -> int:
    """:func:`round_size` with one ``roundup_power2_divisions`` value for every size interval.

    The exercise's signature (``round_size(nbytes, divisions=0)``): ``divisions`` 0 or 1 means plain
    512 B rounding, otherwise a power of two, as ``roundup_power2_divisions:N`` sets for all sizes.
    """
    _check_size("divisions", divisions, minimum=0)
    return round_size(nbytes, AllocatorConfig(roundup_power2_divisions=(divisions,) * 16))


def size_plan(nbytes: int) -> tuple[int, str, int]:
    """``(block_size, pool, segment_size)`` of a request: :func:`round_size`, ``get_pool`` and
    :func:`get_allocation_size` in one call (the segment is what cudaMalloc gets when no cached
    block fits). ``size_plan(1) == (512, "small", 2 MiB)``."""
    rounded = round_size(nbytes)
    return rounded, ("small" if is_small(rounded) else "large"), get_allocation_size(rounded)


def is_small(rounded: int) -> bool:
    """Whether a rounded size belongs to the small pool (``get_pool``: size <= kSmallSize = 1 MiB)."""
    _check_size("rounded", rounded, minimum=1)
    return rounded <= kSmallSize


def get_allocation_size(rounded: int) -> int:
    """How many bytes to cudaMalloc when no cached block fits a (rounded) request.

    Small requests (<= 1 MiB) share 2 MiB segments; 1-10 MiB requests share 20 MiB segments;
    larger ones get their own segment rounded up to 2 MiB. Mirrors ``get_allocation_size``.
    """
    _check_size("rounded", rounded, minimum=1)
    if rounded <= kSmallSize:
        return kSmallBuffer
    if rounded < kMinLargeAlloc:
        return kLargeBuffer
    return kRoundLarge * ((rounded + kRoundLarge - 1) // kRoundLarge)
