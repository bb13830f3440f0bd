"""Exercise (b): best fit within a stream and the split rule, against the C++ rules."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.allocator import MiB, find_best_fit, oversize_allows, should_split


def test_best_fit_crafted():
    blocks = [(0, 8 * MiB, 300), (0, 4 * MiB, 200), (1, 2 * MiB, 100), (0, 4 * MiB, 100)]
    assert find_best_fit(blocks, 3 * MiB, 0) == (0, 4 * MiB, 100)  # smallest, then lowest address
    assert find_best_fit(blocks, 5 * MiB, 0) == (0, 8 * MiB, 300)
    assert find_best_fit(blocks, 9 * MiB, 0) is None  # nothing big enough on stream 0
    assert find_best_fit(blocks, 3 * MiB, 1) is None  # stream 1 has only a 2 MiB block
    assert find_best_fit(blocks, 1 * MiB, 1) == (1, 2 * MiB, 100)
    assert find_best_fit([], 512, 0) is None


def test_oversize_rules():
    big = 200 * MiB
    # a small request may not take an oversize block
    assert find_best_fit([(0, big, 0)], 10 * MiB, 0, max_split_size=100 * MiB) is None
    # a big request may take it if it wastes < 20 MiB (max_non_split_rounding_size)
    assert find_best_fit([(0, big, 0)], 190 * MiB, 0, max_split_size=100 * MiB) == (0, big, 0)
    assert find_best_fit([(0, big, 0)], 180 * MiB, 0, max_split_size=100 * MiB) is None
    assert find_best_fit(
        [(0, big, 0)], 180 * MiB, 0, max_split_size=100 * MiB, max_non_split_rounding_size=40 * MiB
    ) == (0, big, 0)
    # only the best-fit candidate is checked: a bigger, allowed block is not searched for
    assert find_best_fit(
        [(0, 120 * MiB, 0), (0, 300 * MiB, 1 << 30)], 101 * MiB, 0, max_split_size=100 * MiB
    ) == (0, 120 * MiB, 0)
    assert oversize_allows(50 * MiB, 10 * MiB) is True  # no max_split_size: everything allowed


@pytest.mark.parametrize(
    "block, req, pool, expected",
    [
        (2 * MiB, 2 * MiB - 512, "small", True),  # small pool: remainder >= 512 B splits
        (2 * MiB, 2 * MiB - 511, "small", False),
        (20 * MiB, 19 * MiB, "large", False),  # large pool: remainder == 1 MiB does not split
        (20 * MiB, 19 * MiB - 512, "large", True),  # remainder > 1 MiB splits
        (20 * MiB, 20 * MiB, "large", False),
    ],
)
def test_should_split_crafted(block, req, pool, expected):
    assert should_split(block, req, pool) is expected


def test_should_split_respects_max_split_size():
    assert should_split(200 * MiB, 50 * MiB, "large", max_split_size=100 * MiB) is True
    assert should_split(200 * MiB, 150 * MiB, "large", max_split_size=100 * MiB) is False
    assert should_split(200 * MiB, 199 * MiB + 512, "large", expandable_segments=True) is True


blocks_st = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.integers(1, 64).map(lambda k: k * MiB // 4),
        st.integers(0, 1 << 20).map(lambda a: a * 512),
    ),
    max_size=30,
    unique_by=lambda b: b[2],
)


@given(
    blocks_st, st.integers(1, 20 * MiB), st.integers(0, 2), st.sampled_from([2**64 - 1, 20 * MiB, 32 * MiB])
)
def test_best_fit_matches_brute_force(blocks, size, stream, max_split):
    got = find_best_fit(blocks, size, stream, max_split_size=max_split)
    fitting = sorted(b for b in blocks if b[0] == stream and b[1] >= size)
    if not fitting or not oversize_allows(fitting[0][1], size, max_split_size=max_split):
        assert got is None
    else:
        assert got == fitting[0]


@pytest.mark.parametrize(
    "call, exc, word",
    [
        (lambda: find_best_fit([(0, 1, 2)], 0, 0), ValueError, "size"),
        (lambda: find_best_fit([(0, 1)], 512, 0), TypeError, "free_blocks"),
        (lambda: find_best_fit([(0, 1, 2)], 512, -1), ValueError, "stream"),
        (lambda: should_split(512, 1024, "small"), ValueError, "requested"),
        (lambda: should_split(1024, 512, "medium"), ValueError, "pool"),
        (lambda: should_split(1024.0, 512, "small"), TypeError, "block_size"),
    ],
)
def test_invalid_inputs(call, exc, word):
    with pytest.raises(exc, match=word):
        call()
