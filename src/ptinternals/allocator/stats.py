"""Exercise (d): the allocator's statistics, under the key names of ``torch.cuda.memory_stats()``.

Mirrors c10 ``Stat`` / ``DeviceStats`` (c10/core/CachingDeviceAllocator.h, ``increase_stat`` and
``decrease_stat`` in CUDACachingAllocator.cpp), the dict built by ``THCPModule_memoryStats``
(torch/csrc/cuda/Module.cpp), its flattening in ``torch.cuda.memory_stats`` and the table of
``torch.cuda.memory_summary``.

Each ``Stat`` keeps four numbers: ``current``; ``peak`` (max of current since the last
``reset_peak``); ``allocated`` and ``freed`` (running totals of increases and decreases, so that
``allocated - freed == current`` after a reset of both). Each byte/count metric exists three times:
"all", "small_pool" (blocks <= 1 MiB) and "large_pool".

    allocated_bytes       bytes of blocks handed out (rounded sizes)       memory_allocated()
    reserved_bytes        bytes of all segments (cudaMalloc'd)              memory_reserved()
    active_bytes          allocated + freed-but-pending (record_stream)
    inactive_split_bytes  free bytes inside split segments: cached, but empty_cache cannot free them
    requested_bytes       bytes the program asked for (before rounding)
"""

from __future__ import annotations

import collections

STAT_TYPES = ("all", "small_pool", "large_pool")
STAT_ARRAYS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)


class Stat:
    """One statistic: ``current``, ``peak``, ``allocated`` (total increases), ``freed`` (total decreases)."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self.allocated = 0
        self.freed = 0

    def increase(self, amount: int) -> None:
        """``increase_stat``: current += amount, peak = max(peak, current), allocated += amount."""
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            raise ValueError(f"amount must be a non-negative int, got {amount!r}")
        self.current += amount
        self.peak = max(self.peak, self.current)
        self.allocated += amount

    def decrease(self, amount: int) -> None:
        """``decrease_stat``: current -= amount, freed += amount (current may not go negative)."""
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            raise ValueError(f"amount must be a non-negative int, got {amount!r}")
        if amount > self.current:
            raise ValueError(f"decrease by {amount} would make current negative (current={self.current})")
        self.current -= amount
        self.freed += amount

    def reset_peak(self) -> None:
        self.peak = self.current

    def reset_accumulated(self) -> None:
        self.allocated = 0
        self.freed = 0

    def as_dict(self) -> dict:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated, "freed": self.freed}

    def __repr__(self) -> str:
        return (
            f"Stat(current={self.current}, peak={self.peak}, allocated={self.allocated}, freed={self.freed})"
        )


class DeviceStats:
    """All counters of one device (``DeviceStats``); arrays are dicts keyed by "all", "small_pool",
    "large_pool"."""

    def __init__(self, max_split_size: int) -> None:
        for name in STAT_ARRAYS:
            setattr(self, name, {t: Stat() for t in STAT_TYPES})
        self.num_alloc_retries = 0  # cudaMalloc failures that led to a cache flush and retry
        self.num_ooms = 0  # OutOfMemoryErrors raised
        self.num_sync_all_streams = 0  # synchronize_and_free_events() calls
        self.num_device_alloc = 0  # cudaMalloc calls that succeeded
        self.num_device_free = 0  # cudaFree calls
        self.oversize_allocations = Stat()  # blocks >= max_split_size handed out
        self.oversize_segments = Stat()  # segments >= max_split_size
        # int64_t(size_t max) is -1 in C++: memory_stats()["max_split_size"] == -1 means "no limit"
        self.max_split_size = -1 if max_split_size >= 2**63 else max_split_size

    def increase(self, array: str, pool: str, amount: int) -> None:
        """``for_each_selected_stat_type``: update "all" and the block's pool ("small_pool"/"large_pool")."""
        stats = getattr(self, array)
        stats["all"].increase(amount)
        stats[pool].increase(amount)

    def decrease(self, array: str, pool: str, amount: int) -> None:
        stats = getattr(self, array)
        stats["all"].decrease(amount)
        stats[pool].decrease(amount)

    def reset_peak(self) -> None:
        """``resetPeakStats`` (torch.cuda.reset_peak_memory_stats)."""
        for name in STAT_ARRAYS:
            for s in getattr(self, name).values():
                s.reset_peak()
        self.oversize_allocations.reset_peak()
        self.oversize_segments.reset_peak()

    def reset_accumulated(self) -> None:
        """``resetAccumulatedStats`` (torch.cuda.reset_accumulated_memory_stats)."""
        for name in STAT_ARRAYS:
            for s in getattr(self, name).values():
                s.reset_accumulated()
        self.oversize_allocations.reset_accumulated()
        self.oversize_segments.reset_accumulated()
        self.num_alloc_retries = self.num_ooms = self.num_sync_all_streams = 0
        self.num_device_alloc = self.num_device_free = 0

    def as_nested_dict(self) -> dict:
        """``torch.cuda.memory_stats_as_nested_dict()``."""
        d: dict = {
            "num_alloc_retries": self.num_alloc_retries,
            "num_ooms": self.num_ooms,
            "max_split_size": self.max_split_size,
            "num_sync_all_streams": self.num_sync_all_streams,
            "num_device_alloc": self.num_device_alloc,
            "num_device_free": self.num_device_free,
        }
        for name in STAT_ARRAYS:
            d[name] = {t: s.as_dict() for t, s in getattr(self, name).items()}
        d["oversize_allocations"] = self.oversize_allocations.as_dict()
        d["oversize_segments"] = self.oversize_segments.as_dict()
        return d

    def memory_stats(self) -> "collections.OrderedDict[str, int]":
        """``torch.cuda.memory_stats()``: flat, sorted keys such as "reserved_bytes.all.peak"."""
        return flatten_stats(self.as_nested_dict())


def flatten_stats(nested: dict) -> "collections.OrderedDict[str, int]":
    """The flattening of ``torch.cuda.memory_stats`` ("a" -> {"b": 1} becomes "a.b": 1), sorted."""
    if not isinstance(nested, dict):
        raise TypeError(f"nested must be a dict, got {type(nested).__name__}")
    result: list = []

    def add(prefix: str, obj: object) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                key = "_".join(str(p) for p in k) if isinstance(k, tuple) else str(k)
                add(f"{prefix}.{key}" if prefix else key, v)
        else:
            result.append((prefix, obj))

    add("", nested)
    result.sort()
    return collections.OrderedDict(result)


def memory_summary(stats: dict, device: int = 0, abbreviated: bool = False) -> str:
    """The table of ``torch.cuda.memory_summary()``, from a flat ``memory_stats()`` dict.

    Transcribed from torch/cuda/memory.py so that the model's numbers print exactly like a GPU's.
    """
    if not isinstance(stats, dict):
        raise TypeError(f"stats must be a memory_stats() dict, got {type(stats).__name__}")
    missing = [k for k in ("num_ooms", "num_alloc_retries", "reserved_bytes.all.current") if k not in stats]
    if missing:
        raise ValueError(f"stats is missing keys {missing}: pass the flat dict of memory_stats()")

    def _format_size(sz: int, pref_sz: float) -> str:
        prefixes = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"]
        prefix = prefixes[0]
        for new_prefix in prefixes[1:]:
            if pref_sz < 768 * 1024:
                break
            prefix = new_prefix
            sz //= 1024
            pref_sz /= 1024
        return f"{sz:6d} {prefix}"

    def _format_count(cnt: int, pref_cnt: float) -> str:
        prefixes = [" ", "K", "M"]
        prefix = prefixes[0]
        for new_prefix in prefixes[1:]:
            if pref_cnt < 750 * 1000:
                break
            prefix = new_prefix
            cnt //= 1000
            pref_cnt /= 1000
        return f"{cnt:7d} {prefix} "

    metrics = [
        ("allocated_bytes", "Allocated memory", _format_size),
        ("active_bytes", "Active memory", _format_size),
        ("requested_bytes", "Requested memory", _format_size),
        ("reserved_bytes", "GPU reserved memory", _format_size),
        ("inactive_split_bytes", "Non-releasable memory", _format_size),
        ("allocation", "Allocations", _format_count),
        ("active", "Active allocs", _format_count),
        ("segment", "GPU reserved segments", _format_count),
        ("inactive_split", "Non-releasable allocs", _format_count),
    ]
    lines = [
        "=" * 75,
        " {_:16} PyTorch CUDA memory summary, device ID {device:<17d} ",
        "-" * 75,
        "  {_:9} CUDA OOMs: {num_ooms:<12d} | {_:6} cudaMalloc retries: {num_alloc_retries:<8d}  ",
        "=" * 75,
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ",
    ]
    for key, name, fmt in metrics:
        lines.append("-" * 75)
        subs = [("all", name)]
        if not abbreviated:
            subs += [("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
        pref = None
        for sub, sub_name in subs:
            p = f"{key}.{sub}."
            vals = [stats[p + m] for m in ("current", "peak", "allocated", "freed")]
            pref = pref or vals
            cells = " | ".join(fmt(v, pv) for v, pv in zip(vals, pref, strict=True))
            lines.append(f" {sub_name:<21} | {cells} ")
    for key, name in (
        ("oversize_allocations", "Oversize allocations"),
        ("oversize_segments", "Oversize GPU segments"),
    ):
        lines.append("-" * 75)
        vals = [stats[f"{key}.{m}"] for m in ("current", "peak", "allocated", "freed")]
        cells = " | ".join(_format_count(v, v) for v in vals)
        lines.append(f" {name:<21} | {cells} ")
    lines.append("=" * 75)
    fmt_dict = {"_": "", "device": device}
    for k, v in stats.items():
        fmt_dict[k.replace(".", "-")] = v
    return "|" + "|\n|".join(lines).format(**fmt_dict) + "|\n"
