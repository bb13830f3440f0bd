"""How DDP groups gradients into buckets (pure function, no process group needed).

Mirrors ``compute_bucket_assignment_by_size`` in torch/csrc/distributed/c10d/reducer.cpp (exposed
as ``torch.distributed._compute_bucket_assignment_by_size``):

- tensors are visited in the order given; each goes into the open bucket of its (dtype, device) key
  (a bucket's flat buffer has one dtype and lives on one device);
- a bucket is closed as soon as its size reaches (>=) the current limit, so a bucket may overshoot
  its limit by one tensor; a tensor bigger than the limit gets a bucket of its own;
- limits are used in sequence per key: DDP passes ``[1 MiB, bucket_cap]``, so the first bucket of
  each key is small and all later ones use the cap (the last limit repeats);
- the buckets are returned sorted by the smallest tensor index they hold.

DDP calls it twice (torch/nn/parallel/distributed.py ``_ddp_init_helper``, reducer.cpp
``rebuild_buckets``): at construction over the parameters in *registration* order, the bucket list
then reversed (gradients arrive roughly last layer first), with the single limit ``sys.maxsize``
unless ``find_unused_parameters`` (so the first iteration has one bucket); and after the first
backward over the parameters in the order their gradients actually became ready, with the limits
``[first_bucket_bytes_cap, bucket_bytes_cap]``, so the small first bucket holds the gradients that
arrive first and its all-reduce starts early. :func:`assign_buckets` is that second call for one
dtype and device (the chapter's exercise).
"""
from __future__ import annotations

from typing import Hashable, Sequence

DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024  # dist._DEFAULT_FIRST_BUCKET_BYTES
DEFAULT_BUCKET_CAP_MB = 25  # DistributedDataParallel(bucket_cap_mb=25)


def compute_bucket_assignment_by_size(
    tensor_bytes: Sequence[int],
    bucket_size_limits: Sequence[int],
    keys: Sequence[Hashable] | None = None,
) -> list[list[int]]:
    """Group tensor indices into buckets; ``tensor_bytes[i]`` is numel * element_size of tensor i.

    ``keys[i]`` (default: all equal) is the (dtype, device) of tensor i: tensors with different keys
    never share a bucket. Returns lists of indices, sorted by each bucket's smallest index.
    """
    if isinstance(tensor_bytes, (str, bytes)) or not isinstance(tensor_bytes, Sequence):
        raise TypeError(f"tensor_bytes must be a sequence of ints, got {type(tensor_bytes).__name__}")
    for i, b in enumerate(tensor_bytes):
        if not isinstance(b, int) or isinstance(b, bool) or b < 0:
            raise ValueError(f"tensor_bytes[{i}] must be an int >= 0, got {b!r}")
    if isinstance(bucket_size_limits, (str, bytes)) or not isinstance(bucket_size_limits, Sequence):
        raise TypeError(f"bucket_size_limits must be a sequence of ints, "
                        f"got {type(bucket_size_limits).__name__}")
    if len(bucket_size_limits) == 0:
        raise ValueError("bucket_size_limits must not be empty")
    for i, b in enumerate(bucket_size_limits):
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise ValueError(f"bucket_size_limits[{i}] must be an int >= 1, got {b!r}")
    if keys is None:
        keys = [None] * len(tensor_bytes)
    elif len(keys) != len(tensor_bytes):
        raise ValueError(f"keys must have one entry per tensor: len(keys)={len(keys)}, "
                         f"len(tensor_bytes)={len(tensor_bytes)}")

    result: list[list[int]] = []
    open_buckets: dict = {}  # key -> (indices, bytes so far)
    limit_index: dict = {}  # key -> which entry of bucket_size_limits applies to its open bucket
    for i, (nbytes, key) in enumerate(zip(tensor_bytes, keys, strict=True)):
        indices, size = open_buckets.get(key, ([], 0))
        indices.append(i)
        size += nbytes
        li = limit_index.setdefault(key, 0)
        if size >= bucket_size_limits[li]:
            result.append(indices)  # close it (it may overshoot by this last tensor)
            open_buckets[key] = ([], 0)
            limit_index[key] = min(li + 1, len(bucket_size_limits) - 1)
        else:
            open_buckets[key] = (indices, size)
    result.extend(indices for indices, _ in open_buckets.values() if indices)
    result.sort(key=min)
    return result


def assign_buckets(tensor_bytes: Sequence[int], bucket_cap_bytes: int, first_bucket_cap_bytes: int) -> list[list[int]]:
    """DDP's rebuilt buckets for tensors of one dtype and device, given in the order their gradients became
    ready: close a bucket as soon as it reaches its limit, ``first_bucket_cap_bytes`` for the first bucket and
    ``bucket_cap_bytes`` for every later one (``Reducer::rebuild_buckets``: limits [first, cap])."""
    for name, v in (("bucket_cap_bytes", bucket_cap_bytes), ("first_bucket_cap_bytes", first_bucket_cap_bytes)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    return compute_bucket_assignment_by_size(tensor_bytes, [first_bucket_cap_bytes, bucket_cap_bytes])
