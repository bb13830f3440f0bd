"""Constants and settings of the CUDA caching allocator (what ``PYTORCH_CUDA_ALLOC_CONF`` sets).

Mirrors, from PyTorch's C++:

- the size constants of c10/core/AllocatorConfig.h (``kMinBlockSize``, ``kSmallSize``,
  ``kSmallBuffer``, ``kMinLargeAlloc``, ``kRoundLarge``) and c10/cuda/CUDACachingAllocator.cpp
  (``kLargeBuffer``);
- the option parser of c10/core/AllocatorConfig.cpp (``parseArgs``, ``parseMaxSplitSize``,
  ``parseRoundUpPower2Divisions``) and ``roundup_power2_divisions(size)``;
- ``format_size`` (the "20.00 MiB" in every OOM message).

Defaults are PyTorch's: no size limit on splitting (``max_split_size`` = SIZE_MAX), a 20 MiB
tolerance for handing an oversize block to a request (``max_non_split_rounding_size``), and no
power-of-two rounding (all 16 ``roundup_power2_divisions`` are 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .scaffold import (  # noqa: F401  (re-exported: the constants live in the scaffold, importable while grading)
    SIZE_MAX,
    GiB,
    KiB,
    MiB,
    kLargeBuffer,
    kMinBlockSize,
    kMinLargeAlloc,
    kRoundLarge,
    kSmallBuffer,
    kSmallSize,
)

# roundup_power2_divisions: 16 intervals [1 MiB, 2 MiB), [2 MiB, 4 MiB), ... [32 GiB, 64 GiB+)
kRoundUpPowerOfTwoIntervals = 16
_INTERVAL_START_LOG2 = 20  # log2(1 MiB)

_BLOCK_ORDERS = ("address", "segment_counter")


@dataclass(frozen=True)
class AllocatorConfig:
    """The native allocator's settings (c10 ``AcceleratorAllocatorConfig`` / ``CUDAAllocatorConfig``).

    - ``max_split_size``: blocks of this size or more are never split, and are handed only to
      requests of at least this size ("oversize" blocks). PyTorch: ``max_split_size_mb`` (>= 20).
    - ``max_non_split_rounding_size``: an oversize block may serve a request only if it wastes
      less than this (default 20 MiB). PyTorch: ``max_non_split_rounding_mb``.
    - ``roundup_power2_divisions``: 16 numbers, one per power-of-two interval starting at 1 MiB;
      0 or 1 means plain 512 B rounding. PyTorch: ``roundup_power2_divisions``.
    - ``block_order``: tie-break between free blocks of equal size. ``"address"`` is PyTorch up
      to 2.12 (``BlockComparatorSize``: stream, size, address); ``"segment_counter"`` is the
      allocation-order counter of pytorch/pytorch#183591 (stream, size, counter, address).
    - ``expandable_segments``: segments are reserved address ranges that grow by mapping pages
      (``expandable.py``), and the large pool splits off any tail of 512 B or more.
    """

    max_split_size: int = SIZE_MAX
    max_non_split_rounding_size: int = kLargeBuffer
    roundup_power2_divisions: tuple[int, ...] = field(default=(0,) * kRoundUpPowerOfTwoIntervals)
    expandable_segments: bool = False
    block_order: str = "address"

    def __post_init__(self) -> None:
        for name in ("max_split_size", "max_non_split_rounding_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int (bytes), got {type(v).__name__}")
            if v < kLargeBuffer:
                raise ValueError(
                    f"{name} must be >= {kLargeBuffer} bytes (20 MiB, PyTorch's minimum), got {v}"
                )
        divs = tuple(self.roundup_power2_divisions)
        if len(divs) != kRoundUpPowerOfTwoIntervals:
            raise ValueError(
                f"roundup_power2_divisions must have {kRoundUpPowerOfTwoIntervals} entries, got {len(divs)}"
            )
        for i, d in enumerate(divs):
            if isinstance(d, bool) or not isinstance(d, int) or d < 0 or (d & (d - 1)) != 0:
                raise ValueError(f"roundup_power2_divisions[{i}] must be 0 or a power of two, got {d!r}")
        object.__setattr__(self, "roundup_power2_divisions", divs)
        if not isinstance(self.expandable_segments, bool):
            raise TypeError(f"expandable_segments must be a bool, got {type(self.expandable_segments).__name__}")
        if self.block_order not in _BLOCK_ORDERS:
            raise ValueError(f"block_order must be one of {_BLOCK_ORDERS}, got {self.block_order!r}")

    def divisions_for(self, size: int) -> int:
        """``roundup_power2_divisions(size)``: the divisions of the power-of-two interval of ``size``."""
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"size must be a positive int, got {size!r}")
        index = size.bit_length() - 1 - _INTERVAL_START_LOG2  # floor(log2(size)) - log2(1 MiB)
        index = min(max(index, 0), kRoundUpPowerOfTwoIntervals - 1)
        return self.roundup_power2_divisions[index]

    def to_settings(self) -> dict:
        """The ``allocator_settings`` dict that ``torch.cuda.memory._snapshot()`` carries."""
        roundup = {str(1 << i): d for i, d in enumerate(self.roundup_power2_divisions)}
        return {
            "PYTORCH_CUDA_ALLOC_CONF": to_alloc_conf(self),
            "max_split_size": -1 if self.max_split_size == SIZE_MAX else self.max_split_size,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": self.expandable_segments,
            "roundup_power2_divisions": roundup,
        }


DEFAULT_CONFIG = AllocatorConfig()


def parse_alloc_conf(conf: str) -> AllocatorConfig:
    """Parse a ``PYTORCH_CUDA_ALLOC_CONF`` string, like c10's ``AllocatorConfig::parseArgs``.

    ``"max_split_size_mb:128,roundup_power2_divisions:[256:4,>:8]"`` -> AllocatorConfig. Options the
    model does not simulate (garbage_collection_threshold, pinned_*, release_lock_on_cudamalloc,
    large_segment_size_mb, backend:native) are accepted and ignored.
    """
    if not isinstance(conf, str):
        raise TypeError(f"conf must be a str, got {type(conf).__name__}")
    tokens: list[str] = []
    buf = ""
    for ch in conf:  # lexArgs: ',', ':', '[', ']' are tokens; spaces are dropped
        if ch in ",:[]":
            if buf:
                tokens.append(buf)
                buf = ""
            tokens.append(ch)
        elif not ch.isspace():
            buf += ch
    if buf:
        tokens.append(buf)

    def expect(i: int, tok: str) -> None:
        if i >= len(tokens) or tokens[i] != tok:
            raise ValueError(f"conf: expected {tok!r} at token {i} of {conf!r}")

    def value(i: int, key: str) -> str:
        if i >= len(tokens):
            raise ValueError(f"conf: expecting a value for {key} in {conf!r}")
        return tokens[i]

    kw: dict = {}
    divs = [0] * kRoundUpPowerOfTwoIntervals
    i = 0
    while i < len(tokens):
        key = tokens[i]
        expect(i + 1, ":")
        i += 2
        if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
            mb = int(value(i, key))
            if mb < kLargeBuffer // MiB:
                raise ValueError(f"conf: {key} too small, must be >= {kLargeBuffer // MiB}, got {mb}")
            kw["max_split_size" if key == "max_split_size_mb" else "max_non_split_rounding_size"] = mb * MiB
        elif key == "roundup_power2_divisions":
            if value(i, key) == "[":
                first, last_index = True, 0
                i += 1
                while i < len(tokens) and tokens[i] != "]":
                    interval = tokens[i]
                    expect(i + 1, ":")
                    d = int(value(i + 2, key))
                    if d != 0 and d & (d - 1):
                        raise ValueError(f"conf: divisions must be a power of 2 or 0, got {d}")
                    if interval == ">":  # from the last named interval to the end
                        divs[last_index:] = [d] * (len(divs) - last_index)
                    else:
                        mb = int(interval)
                        if mb <= 0 or mb & (mb - 1):
                            raise ValueError(f"conf: intervals must be powers of 2 (MiB), got {mb}")
                        idx = min(mb.bit_length() - 1, len(divs) - 1)
                        if first:  # the first value also covers every smaller interval
                            divs[:idx] = [d] * idx
                            first = False
                        divs[idx] = d
                        last_index = idx
                    i += 3
                    if i < len(tokens) and tokens[i] == ",":
                        i += 1
                expect(i, "]")
            else:
                d = int(value(i, key))
                if d <= 0 or d & (d - 1):
                    raise ValueError(f"conf: divisions must be a power of 2, got {d}")
                divs = [d] * kRoundUpPowerOfTwoIntervals
            kw["roundup_power2_divisions"] = tuple(divs)
        elif key == "expandable_segments":
            v = value(i, key)
            if v not in ("True", "False", "true", "false"):
                raise ValueError(f"conf: expandable_segments must be True or False, got {v!r}")
            kw["expandable_segments"] = v in ("True", "true")
        elif key in (
            "garbage_collection_threshold",
            "backend",
            "release_lock_on_cudamalloc",
            "pinned_use_cuda_host_register",
            "pinned_num_register_threads",
            "pinned_use_background_threads",
            "large_segment_size_mb",
        ):
            value(i, key)  # accepted, not simulated
        else:
            raise ValueError(f"conf: unrecognized CachingAllocator option: {key!r}")
        i += 1
        if i < len(tokens):
            expect(i, ",")
            i += 1
    return AllocatorConfig(**kw)


def to_alloc_conf(config: AllocatorConfig) -> str:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` string that :func:`parse_alloc_conf` maps back to ``config``."""
    parts = []
    if config.max_split_size != SIZE_MAX:
        parts.append(f"max_split_size_mb:{config.max_split_size // MiB}")
    if config.max_non_split_rounding_size != kLargeBuffer:
        parts.append(f"max_non_split_rounding_mb:{config.max_non_split_rounding_size // MiB}")
    if any(config.roundup_power2_divisions):
        items = ",".join(f"{1 << i}:{d}" for i, d in enumerate(config.roundup_power2_divisions))
        parts.append(f"roundup_power2_divisions:[{items}]")
    if config.expandable_segments:
        parts.append("expandable_segments:True")
    return ",".join(parts)


def format_size(size: int) -> str:
    """c10's ``format_size``: 1024 -> "1024 bytes", 1536 -> "1.50 KiB", 20 MiB -> "20.00 MiB"."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")
    if size <= 1024:
        return f"{size} bytes"
    if size <= MiB:
        return f"{size / 1024.0:.2f} KiB"
    if size <= GiB:
        return f"{size / MiB:.2f} MiB"
    return f"{size / GiB:.2f} GiB"
