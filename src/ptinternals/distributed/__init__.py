"""The distributed chapter, data parallelism: collectives, DDP, ZeRO and FSDP built from torch.distributed primitives.

Modules (each names the PyTorch source it mirrors):

- :mod:`.launch`     ``run_ranks``: spawn N ranks, run a function, never hang (names the stuck collective)
- :mod:`.ring`       ``ring_all_reduce`` from send/recv, its schedule and cost model
- :mod:`.buckets`    ``compute_bucket_assignment_by_size`` (reducer.cpp), ``assign_buckets`` (the rebuild)
- :mod:`.naive_ddp`  ``NaiveDDP``: one async all-reduce per parameter, fired by a grad hook
- :mod:`.ddp`        ``DistributedDataParallel``: buckets (one, then rebuilt), overlap, the end-of-backward
                     callback, ``no_sync``, ``find_unused_parameters``
- :mod:`.zero`       ``ZeroRedundancyAdamW``: ZeRO-1, optimizer state sharded, AdamW's per-parameter rules kept
- :mod:`.fsdp2`      ``fully_shard``: FSDP2, every parameter sharded on dim 0, the shards stay the parameters
- :mod:`.fsdp`       ``FullyShardedDataParallel``: FSDP1, one flat parameter per unit (history)
- :mod:`.train_ddp`  a torchrun script that trains with DDP and resumes from a checkpoint
"""
from .buckets import (
    DEFAULT_BUCKET_CAP_MB,
    DEFAULT_FIRST_BUCKET_BYTES,
    assign_buckets,
    compute_bucket_assignment_by_size,
)
from .ddp import Bucket, DistributedDataParallel
from .fsdp import FlatParamHandle, FullyShardedDataParallel
from .fsdp2 import FullyShardedSequential, MixedPrecisionPolicy, fully_shard
from .launch import (
    RankError,
    RankFailedError,
    RankTimeoutError,
    default_backend,
    find_free_port,
    rank_device,
    read_last_collective,
    run_ranks,
)
from .naive_ddp import NaiveDDP, broadcast_module_states
from .ring import chunk_bounds, ring_all_reduce, ring_bytes_sent_per_rank, ring_contributions, ring_schedule
from .zero import ZeroRedundancyAdamW, shard_bounds

__all__ = [
    "DEFAULT_BUCKET_CAP_MB", "DEFAULT_FIRST_BUCKET_BYTES", "assign_buckets", "compute_bucket_assignment_by_size",
    "Bucket", "DistributedDataParallel", "FlatParamHandle", "FullyShardedDataParallel",
    "FullyShardedSequential", "MixedPrecisionPolicy", "fully_shard",
    "RankError", "RankFailedError", "RankTimeoutError", "default_backend", "find_free_port", "rank_device",
    "read_last_collective", "run_ranks", "NaiveDDP", "broadcast_module_states",
    "chunk_bounds", "ring_all_reduce", "ring_bytes_sent_per_rank", "ring_contributions", "ring_schedule",
    "ZeroRedundancyAdamW", "shard_bounds",
]
