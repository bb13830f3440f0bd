"""The model allocator against hand-computed expectations from the C++ rules, and torch's formats."""

import pytest
import torch

from ptinternals.allocator import (
    AllocatorConfig,
    CachingAllocator,
    GiB,
    MiB,
    OutOfMemoryError,
    format_size,
    memory_summary,
)


def fresh(capacity=4 * GiB, **kw):
    return CachingAllocator(capacity, **kw)


def test_just_over_1mib_gets_a_20mib_segment():
    a = fresh()
    b = a.malloc(1 * MiB + 1)
    assert b.size == 1 * MiB + 512
    assert a.memory_reserved() == 20 * MiB and a.num_segments() == 1
    assert a.memory_stats()["segment.large_pool.current"] == 1
    assert a.memory_stats()["inactive_split_bytes.all.current"] == 20 * MiB - b.size  # split tail


def test_just_over_10mib_rounds_segment_to_12mib():
    a = fresh()
    b = a.malloc(10 * MiB + 1)
    assert b.size == 10 * MiB + 512 and a.memory_reserved() == 12 * MiB
    # remainder 2 MiB - 512 > 1 MiB: split
    assert a.memory_stats()["inactive_split.all.current"] == 1


def test_large_pool_does_not_split_small_remainders():
    a = fresh()
    b = a.malloc(19 * MiB + 512 * 1024)  # segment 20 MiB, remainder 0.5 MiB <= 1 MiB: no split
    assert b.size == 20 * MiB and a.memory_allocated() == 20 * MiB
    assert a.memory_stats()["requested_bytes.all.current"] == 19 * MiB + 512 * 1024


def test_small_pool_splits_at_512_bytes():
    a = fresh()
    x = a.malloc(1 * MiB)  # 1 MiB request: small pool, 2 MiB segment
    assert a.memory_stats()["reserved_bytes.small_pool.current"] == 2 * MiB
    y = a.malloc(1 * MiB - 512)  # fits the 1 MiB tail; tail 512 B >= 512: split again
    z = a.malloc(1)  # the last 512 B
    assert a.num_segments() == 1 and (x.ptr, y.ptr, z.ptr) == (x.ptr, x.ptr + MiB, x.ptr + 2 * MiB - 512)
    a.check_invariants()


def test_free_coalesces_and_empty_cache_releases_whole_segments():
    a = fresh()
    x, y, z = a.malloc(3 * MiB), a.malloc(3 * MiB), a.malloc(3 * MiB)  # one 20 MiB segment
    big = a.malloc(30 * MiB)  # its own segment
    a.free(y)
    assert a.memory_stats()["inactive_split.all.current"] == 2  # y's hole and the tail
    a.free(x)
    a.free(z)  # everything merges back into one 20 MiB block
    assert a.memory_stats()["inactive_split.all.current"] == 0
    a.empty_cache()
    assert a.memory_reserved() == 30 * MiB and a.num_segments() == 1  # big is still allocated
    a.free(big)
    assert a.memory_reserved() == 30 * MiB  # reserved "only grows": freeing keeps the cache
    a.empty_cache()
    assert a.memory_reserved() == 0 and a.device.used == 0


def test_empty_cache_does_not_release_pinned_segments():
    a = fresh()
    keep = a.malloc(2 * MiB)
    tmp = a.malloc(10 * MiB)  # same 20 MiB segment
    a.free(tmp)
    a.empty_cache()
    assert a.memory_reserved() == 20 * MiB  # 18 MiB free but pinned by `keep`
    assert a.memory_stats()["inactive_split_bytes.all.current"] == 18 * MiB
    a.free(keep)


def test_blocks_are_per_stream_and_record_stream_delays_reuse():
    a = fresh()
    x = a.malloc(4 * MiB, stream=0)
    ptr = x.ptr
    a.free(x)
    y = a.malloc(4 * MiB, stream=1)  # stream 1 cannot reuse stream 0's cached block
    assert a.num_segments() == 2 and y.ptr != ptr
    z = a.malloc(4 * MiB, stream=0)  # stream 0 reuses it
    assert z.ptr == ptr
    a.record_stream(z, 1)  # z is also used on stream 1
    a.free(z)
    assert a.memory_stats()["active_bytes.all.current"] == y.size + z.size  # pending counts as active
    w = a.malloc(4 * MiB, stream=0)  # event on stream 1 not complete: z's block is not reusable
    assert w.ptr != ptr
    a.sync(1)  # stream 1 finished its work
    assert a.snapshot()["segments"][0]["blocks"][0]["state"] == "active_pending_free"
    v = a.malloc(4 * MiB, stream=0)  # process_events returns z's block first, then best fit finds it
    assert v.ptr == ptr
    a.check_invariants()


def test_empty_cache_synchronizes_pending_frees():
    a = fresh()
    x = a.malloc(30 * MiB)
    a.record_stream(x, 5)
    a.free(x)
    a.empty_cache()
    assert a.memory_reserved() == 0 and a.memory_stats()["num_sync_all_streams"] == 1


def test_oom_retry_frees_cached_segments_then_succeeds():
    a = fresh(capacity=100 * MiB)
    x = a.malloc(60 * MiB)
    a.free(x)  # 60 MiB cached
    y = a.malloc(70 * MiB)  # cudaMalloc fails; release_cached_blocks; retry succeeds
    stats = a.memory_stats()
    assert stats["num_alloc_retries"] == 1 and stats["num_ooms"] == 0
    assert a.memory_reserved() == 70 * MiB and y.size == 70 * MiB
    trace = [e["action"] for e in a.device_trace]
    assert trace[-3:] == ["segment_free", "segment_alloc", "alloc"]


def test_oom_message_numbers():
    a = fresh(capacity=100 * MiB)
    keep = a.malloc(2 * MiB)  # pins a 20 MiB segment (18 MiB reserved but unallocated)
    big = a.malloc(60 * MiB)
    with pytest.raises(OutOfMemoryError) as info:
        a.malloc(30 * MiB)
    e = info.value
    msg = str(e)
    assert msg.startswith(
        "CUDA out of memory. Tried to allocate 30.00 MiB. GPU 0 has a total capacity of "
        "100.00 MiB of which 20.00 MiB is free. Of the allocated memory 62.00 MiB is "
        "allocated by PyTorch, and 18.00 MiB is reserved by PyTorch but unallocated."
    )
    assert (e.alloc_size, e.allocated_bytes, e.reserved_bytes, e.device_free) == (
        30 * MiB,
        62 * MiB,
        80 * MiB,
        20 * MiB,
    )
    stats = a.memory_stats()
    assert stats["num_ooms"] == 1 and stats["num_alloc_retries"] == 1
    assert a.device_trace[-1]["action"] == "oom" and a.device_trace[-1]["device_free"] == 20 * MiB
    a.free(keep)
    a.free(big)
    a.check_invariants()


def test_oom_message_tries_to_allocate_the_segment_size():
    a = fresh(capacity=10 * MiB)
    with pytest.raises(OutOfMemoryError, match="Tried to allocate 20.00 MiB"):
        a.malloc(1 * MiB + 1)  # needs a 20 MiB segment


def test_memory_fraction_message():
    a = fresh(capacity=1 * GiB, memory_fraction=0.1)
    with pytest.raises(OutOfMemoryError, match=r"is free\. 102\.40 MiB allowed; "):
        a.malloc(200 * MiB)


def test_max_split_size_oversize_blocks():
    cfg = AllocatorConfig(max_split_size=100 * MiB)
    a = fresh(capacity=1 * GiB, config=cfg)
    big = a.malloc(150 * MiB)
    assert a.memory_stats()["oversize_segments.current"] == 1
    assert a.memory_stats()["oversize_allocations.current"] == 1
    a.free(big)
    small = a.malloc(10 * MiB)  # may not take the cached 150 MiB block: new segment
    assert a.num_segments() == 2
    again = a.malloc(140 * MiB)  # 150 < 140 + 20: the cached oversize block is reused, unsplit
    assert again.size == 150 * MiB and a.num_segments() == 2
    a.free(again)
    a.free(small)
    assert a.memory_stats()["max_split_size"] == 100 * MiB


def test_release_available_cached_blocks_frees_only_enough():
    cfg = AllocatorConfig(max_split_size=40 * MiB)
    a = fresh(capacity=300 * MiB, config=cfg)
    blocks = [a.malloc(s * MiB) for s in (50, 60, 70, 80)]  # 260 MiB, all oversize
    for b in blocks:
        a.free(b)
    a.malloc(100 * MiB)  # needs 100 MiB: frees the largest cached blocks (80, 70) only
    assert sorted(s["total_size"] // MiB for s in a.snapshot()["segments"]) == [50, 60, 100]
    assert a.memory_stats()["num_alloc_retries"] == 0


def test_zero_bytes_and_double_free():
    a = fresh()
    assert a.malloc(0) is None and a.memory_reserved() == 0
    a.free(None)
    b = a.malloc(100)
    a.free(b)
    with pytest.raises(ValueError, match="double free"):
        a.free(b)
    with pytest.raises(TypeError, match="size"):
        a.malloc(1.5)
    with pytest.raises(ValueError, match="size"):
        a.malloc(-1)
    with pytest.raises(TypeError, match="stream"):
        a.malloc(10, stream="s")
    with pytest.raises(ValueError, match="another allocator"):
        fresh().free(a.malloc(10))
    with pytest.raises(TypeError, match="Block"):
        a.free(123)


def test_stats_keys_match_torch_memory_summary(monkeypatch):
    """torch's own memory_summary() renders the model's memory_stats() and matches ours."""
    a = fresh()
    blocks = [a.malloc(n) for n in (100, 3 * MiB, 50 * MiB, 700 * 1024)]
    a.free(blocks[1])
    stats = a.memory_stats()
    monkeypatch.setattr(torch.cuda.memory, "memory_stats", lambda device=None: stats)
    monkeypatch.setattr(torch.cuda.memory, "_get_device_index", lambda device, optional=False: 0)
    expected = torch.cuda.memory.memory_summary()
    assert memory_summary(stats) == expected
    assert memory_summary(stats, abbreviated=True) == torch.cuda.memory.memory_summary(abbreviated=True)
    for b in (blocks[0], blocks[2], blocks[3]):
        a.free(b)


def test_stats_consistency():
    a = fresh()
    xs = [a.malloc(s) for s in (10, 2 * MiB, 30 * MiB)]
    for x in xs:
        a.free(x)
    stats = a.memory_stats()
    for key in (
        "allocated_bytes",
        "reserved_bytes",
        "active_bytes",
        "allocation",
        "segment",
        "requested_bytes",
    ):
        for pool in ("all", "small_pool", "large_pool"):
            p = f"{key}.{pool}."
            assert stats[p + "current"] <= stats[p + "peak"]
            assert stats[p + "allocated"] - stats[p + "freed"] == stats[p + "current"]
    assert stats["allocated_bytes.all.peak"] == 512 + 2 * MiB + 30 * MiB
    assert stats["max_split_size"] == -1  # unlimited, as torch reports it
    a.reset_peak_stats()
    assert a.max_memory_allocated() == 0
    a.reset_accumulated_stats()
    assert a.memory_stats()["allocation.all.allocated"] == 0


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 bytes"),
        (1024, "1024 bytes"),
        (1025, "1.00 KiB"),
        (20 * MiB, "20.00 MiB"),
        (MiB + 1, "1.00 MiB"),
        (3 * GiB, "3.00 GiB"),
    ],
)
def test_format_size(n, text):
    assert format_size(n) == text


def test_constructor_errors():
    with pytest.raises(ValueError, match="either capacity or device"):
        from ptinternals.allocator import DeviceMemory

        CachingAllocator(10, device=DeviceMemory(10))
    with pytest.raises(TypeError, match="config"):
        CachingAllocator(10, config={"max_split_size": 1})
    with pytest.raises(ValueError, match="max_split_size"):
        AllocatorConfig(max_split_size=10 * MiB)
    with pytest.raises(TypeError, match="expandable_segments"):
        AllocatorConfig(expandable_segments="yes")
    with pytest.raises(ValueError, match="fraction"):
        fresh(memory_fraction=1.5)
