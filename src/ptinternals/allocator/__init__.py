"""The allocator chapter: the CUDA caching allocator, as a faithful Python model of c10/cuda/CUDACachingAllocator.cpp.

Modules (each names the C++ it mirrors):

    scaffold     what the exercises build on (importable while grading): the constants, block
                 states, Segment, the trace format, fragmenting_trace; with device.DeviceMemory
    config       PYTORCH_CUDA_ALLOC_CONF settings and parser, format_size (constants re-exported)
    sizes        (a) round_size, get_allocation_size, is_small
    policy       (b) find_best_fit (get_free_block), should_split
    segment_ops  (c) merge_free_neighbours (free_block), (d) release_cached_segments (empty_cache)
    stats        (d) Stat, DeviceStats, memory_stats() keys, memory_summary()
    block        Block, BlockPool (the std::set ordered by stream, size, address)
    device       DeviceMemory: the simulated cudaMalloc / cudaFree
    allocator    CachingAllocator (DeviceCachingAllocator) and OutOfMemoryError
    expandable   expandable segments: ExpandableSegment and the methods that map and unmap its pages
    snapshot     torch.cuda.memory._snapshot() format, out and back in (restore_segments)
    trace        the trace format, replay(), fits(), (f) predict_peak_reserved
    workloads    (e) fragmenting_trace + check_fragmentation_fix, fragmentation_numbers, synthetic and
                 random traces, trace_allocations (record a PyTorch function's allocations on the CPU)
    importer     recorded GPU device traces -> model traces
    recorder     GPU only: record_trace_on_gpu, compare_fidelity, replay_on_gpu, compare_replay
                 (``python -m ptinternals.allocator.recorder --out DIR`` runs the fidelity check)
    (its graded exercises live in ptinternals.checks.allocator: checkers, cases, likely causes)
"""

from .allocator import CachingAllocator, OutOfMemoryError
from .block import Block, BlockPool
from .config import (
    DEFAULT_CONFIG,
    SIZE_MAX,
    AllocatorConfig,
    GiB,
    KiB,
    MiB,
    format_size,
    kLargeBuffer,
    kMinBlockSize,
    kMinLargeAlloc,
    kRoundLarge,
    kSmallBuffer,
    kSmallSize,
    parse_alloc_conf,
    to_alloc_conf,
)
from .device import DeviceMemory
from .policy import find_best_fit, oversize_allows, should_split
from .segment_ops import merge_free_neighbours, release_cached_segments
from .sizes import get_allocation_size, is_small, round_size, roundup_power2_next_division
from .snapshot import RestoredState, make_snapshot, restore_segments
from .stats import DeviceStats, Stat, flatten_stats, memory_summary
from .trace import ReplayResult, fits, predict_peak_reserved, replay, validate_trace
from .workloads import (
    FRAGMENTATION_CAPACITY,
    check_fragmentation_fix,
    fragmenting_trace,
    random_trace,
    trace_allocations,
    training_step_trace,
)

__all__ = [
    "FRAGMENTATION_CAPACITY",
    "check_fragmentation_fix",
    "fragmenting_trace",
    "random_trace",
    "trace_allocations",
    "training_step_trace",
    "AllocatorConfig",
    "Block",
    "BlockPool",
    "CachingAllocator",
    "DEFAULT_CONFIG",
    "DeviceMemory",
    "DeviceStats",
    "GiB",
    "KiB",
    "MiB",
    "OutOfMemoryError",
    "ReplayResult",
    "RestoredState",
    "SIZE_MAX",
    "Stat",
    "find_best_fit",
    "fits",
    "flatten_stats",
    "format_size",
    "get_allocation_size",
    "is_small",
    "kLargeBuffer",
    "kMinBlockSize",
    "kMinLargeAlloc",
    "kRoundLarge",
    "kSmallBuffer",
    "kSmallSize",
    "make_snapshot",
    "memory_summary",
    "merge_free_neighbours",
    "oversize_allows",
    "parse_alloc_conf",
    "predict_peak_reserved",
    "release_cached_segments",
    "replay",
    "restore_segments",
    "round_size",
    "roundup_power2_next_division",
    "should_split",
    "to_alloc_conf",
    "validate_trace",
]
