"""Exercises (c) and (d): coalescing on free, what empty_cache releases, and Stat."""

import pytest

from ptinternals.allocator import Stat, merge_free_neighbours, release_cached_segments

A, P, I = "active_allocated", "active_pending_free", "inactive"


def test_merge_free_neighbours_cases():
    seg = [(0, 512, I), (512, 1024, A), (1536, 512, I)]
    assert merge_free_neighbours(seg, 1) == [(0, 2048, I)]  # both neighbours free: one block
    seg = [(0, 512, A), (512, 1024, A), (1536, 512, I)]
    assert merge_free_neighbours(seg, 1) == [(0, 512, A), (512, 1536, I)]  # merge with next only
    seg = [(0, 512, I), (512, 1024, A), (1536, 512, P)]
    assert merge_free_neighbours(seg, 1) == [(0, 1536, I), (1536, 512, P)]  # pending neighbour stays
    assert merge_free_neighbours([(0, 512, A)], 0) == [(0, 512, I)]


def test_merge_errors():
    with pytest.raises(ValueError, match="double free"):
        merge_free_neighbours([(0, 512, I)], 0)
    with pytest.raises(IndexError, match="index 3"):
        merge_free_neighbours([(0, 512, A)], 3)
    with pytest.raises(ValueError, match="tile"):
        merge_free_neighbours([(0, 512, A), (1024, 512, A)], 0)
    with pytest.raises(ValueError, match="state"):
        merge_free_neighbours([(0, 512, "free")], 0)
    with pytest.raises(ValueError, match="non-empty"):
        merge_free_neighbours([], 0)


def test_release_cached_segments():
    segs = [
        [(0, 2048, I)],  # a whole free segment: released
        [(4096, 512, A), (4608, 1536, I)],  # pinned by one live block: kept
        [(8192, 512, P), (8704, 1536, I)],  # pending: synchronized, merges, released
    ]
    kept, released = release_cached_segments(segs)
    assert released == 2048 + 2048
    assert kept == [[(4096, 512, A), (4608, 1536, I)]]


def test_stat_semantics():
    s = Stat()
    s.increase(10)
    s.increase(5)
    s.decrease(12)
    assert (s.current, s.peak, s.allocated, s.freed) == (3, 15, 15, 12)
    s.reset_peak()
    assert s.peak == 3
    s.reset_accumulated()
    assert (s.allocated, s.freed) == (0, 0)
    with pytest.raises(ValueError, match="negative"):
        s.decrease(4)
    with pytest.raises(ValueError, match="amount"):
        s.increase(-1)
