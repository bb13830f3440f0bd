"""Property tests: random alloc/free/record_stream/sync/empty_cache sequences keep the allocator sound,
and the exercise functions (plain-data versions of the rules) agree with the allocator at every step."""

from hypothesis import given
from hypothesis import strategies as st

from ptinternals.allocator import (
    AllocatorConfig,
    CachingAllocator,
    MiB,
    OutOfMemoryError,
    find_best_fit,
    merge_free_neighbours,
    release_cached_segments,
    round_size,
)

sizes = st.one_of(
    st.integers(0, 1 * MiB),  # small pool
    st.integers(1 * MiB + 1, 10 * MiB),  # 20 MiB segments
    st.integers(10 * MiB, 64 * MiB),  # own segments
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), sizes, st.integers(0, 2)),
        st.tuples(st.just("free"), st.integers(0, 1000)),
        st.tuples(st.just("record_stream"), st.integers(0, 1000), st.integers(0, 2)),
        st.tuples(st.just("sync"), st.integers(0, 2)),
        st.tuples(st.just("empty_cache")),
    ),
    min_size=1,
    max_size=60,
)
configs = st.sampled_from(
    [
        AllocatorConfig(),
        AllocatorConfig(max_split_size=40 * MiB),
        AllocatorConfig(block_order="segment_counter"),
    ]
)


def segment_tuples(seg_dict):
    return [(b["address"], b["size"], b["state"]) for b in seg_dict["blocks"]]


def check_stats(a):
    stats = a.memory_stats()
    for k, v in stats.items():
        if k.endswith(".current"):
            base = k[: -len("current")]
            assert v <= stats[base + "peak"], k
            assert stats[base + "allocated"] - stats[base + "freed"] == v, k
            assert v >= 0, k


@given(ops, configs, st.sampled_from([256 * MiB, 1 << 40]))
def test_random_sequences_keep_invariants(sequence, config, capacity):
    a = CachingAllocator(capacity, config=config)
    live = []
    for op in sequence:
        kind = op[0]
        if kind == "alloc":
            _, n, stream = op
            a.process_events()  # what malloc does first; lets us predict its choice
            pool = a.small_blocks if round_size(n) <= MiB else a.large_blocks
            expect = None
            if n and config.block_order == "address":
                expect = find_best_fit(
                    [(b.stream, b.size, b.ptr) for b in pool],
                    round_size(n),
                    stream,
                    max_split_size=config.max_split_size,
                )
            try:
                b = a.malloc(n, stream)
            except OutOfMemoryError as e:
                assert e.reserved_bytes == a.memory_reserved() and e.alloc_size > e.device_free
                b = None
            else:
                if expect is not None:
                    assert b.ptr == expect[2], "malloc did not take the best-fit block"
            if b is not None:
                live.append(b)
        elif kind == "free" and live:
            b = live.pop(op[1] % len(live))
            plain = not b.stream_uses
            if plain:
                before = next(
                    s
                    for s in a.snapshot()["segments"]
                    if s["address"] <= b.ptr < s["address"] + s["total_size"]
                )
                idx = [blk["address"] for blk in before["blocks"]].index(b.ptr)
                expected = merge_free_neighbours(segment_tuples(before), idx)
            a.free(b)
            if plain:
                after = next(s for s in a.snapshot()["segments"] if s["address"] == before["address"])
                assert segment_tuples(after) == expected
        elif kind == "record_stream" and live:
            a.record_stream(live[op[1] % len(live)], op[2])
        elif kind == "sync":
            a.sync(op[1])
        elif kind == "empty_cache":
            before = [segment_tuples(s) for s in a.snapshot()["segments"]]
            kept, released = release_cached_segments(before)
            reserved = a.memory_reserved()
            a.empty_cache()
            assert [segment_tuples(s) for s in a.snapshot()["segments"]] == kept
            assert a.memory_reserved() == reserved - released
        a.check_invariants()
        check_stats(a)
        segs = a.snapshot()["segments"]  # segments never overlap on the device
        for s, t in zip(segs, segs[1:], strict=False):
            assert s["address"] + s["total_size"] <= t["address"]
    for b in live:  # freeing everything and emptying the cache returns every byte
        a.free(b)
    a.empty_cache()
    assert a.memory_reserved() == 0 and a.memory_allocated() == 0 and a.device.used == 0
    a.check_invariants()


def test_invariants_catch_corruption():
    import pytest

    a = CachingAllocator(1 << 30)
    b = a.malloc(3 * MiB)
    a.check_invariants()
    b.size += 512  # a block that overlaps its neighbour
    with pytest.raises(AssertionError, match="mismatch|tiled"):
        a.check_invariants()
