"""Exercise (a): round_size, get_allocation_size, is_small, against the C++ rules."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.allocator import (
    AllocatorConfig,
    MiB,
    get_allocation_size,
    is_small,
    parse_alloc_conf,
    round_size,
    roundup_power2_next_division,
)


@pytest.mark.parametrize(
    "nbytes, expected",
    [
        (0, 512),
        (1, 512),
        (511, 512),
        (512, 512),
        (513, 1024),
        (1000, 1024),
        (1 * MiB, 1 * MiB),
        (1 * MiB + 1, 1 * MiB + 512),
        (10 * MiB + 1, 10 * MiB + 512),
    ],
)
def test_round_size_crafted(nbytes, expected):
    assert round_size(nbytes) == expected


@given(st.integers(min_value=0, max_value=1 << 40))
def test_round_size_is_smallest_multiple_of_512(n):
    r = round_size(n)
    assert r % 512 == 0 and r >= max(n, 512) and r - max(n, 1) < 512


@pytest.mark.parametrize(
    "rounded, segment",
    [
        (512, 2 * MiB),
        (1 * MiB, 2 * MiB),  # small pool: 2 MiB segments
        (1 * MiB + 512, 20 * MiB),
        (10 * MiB - 512, 20 * MiB),  # 1-10 MiB: 20 MiB segments
        (10 * MiB, 10 * MiB),
        (10 * MiB + 512, 12 * MiB),
        (100 * MiB + 1, 102 * MiB),  # rounded to 2 MiB
    ],
)
def test_get_allocation_size_crafted(rounded, segment):
    assert get_allocation_size(rounded) == segment


@given(st.integers(min_value=1, max_value=1 << 40))
def test_allocation_size_covers_request(n):
    r = round_size(n)
    seg = get_allocation_size(r)
    assert seg >= r and seg % (2 * MiB) == 0
    assert is_small(r) == (r <= 1 * MiB)


def test_roundup_power2_next_division_example_from_source():
    # the worked example in the C++ comment: 1200 with 4 divisions -> 1280
    assert roundup_power2_next_division(1200, 4) == 1280
    assert roundup_power2_next_division(1024, 4) == 1024
    assert roundup_power2_next_division(1280, 4) == 1280


def test_round_size_with_power2_divisions():
    cfg = AllocatorConfig(roundup_power2_divisions=(4,) * 16)
    # 1200 B <= 512 * 4 -> plain 512 rounding
    assert round_size(1200, cfg) == 1536
    # 5 MiB + 1 lies in [4 MiB, 8 MiB): steps of 1 MiB -> 6 MiB
    assert round_size(5 * MiB + 1, cfg) == 6 * MiB
    # interval-specific: only sizes >= 256 MiB get 4 divisions (and the C++ '>' fill quirk)
    cfg2 = parse_alloc_conf("roundup_power2_divisions:[256:4,512:2]")
    assert cfg2.divisions_for(300 * MiB) == 4 and cfg2.divisions_for(600 * MiB) == 2
    assert cfg2.divisions_for(1 * MiB) == 4  # the first value also fills the smaller intervals
    assert round_size(300 * MiB, cfg2) == 320 * MiB


@given(st.integers(min_value=1, max_value=1 << 36), st.sampled_from([2, 4, 8, 16]))
def test_roundup_power2_division_properties(size, divisions):
    r = roundup_power2_next_division(size, divisions)
    assert r >= size
    lo = 1 << (size.bit_length() - 1)
    if size != lo:
        step = max(lo // divisions, 1)
        assert (r - lo) % step == 0 and r - size < step


@pytest.mark.parametrize(
    "bad, exc", [(-1, ValueError), (1.5, TypeError), (True, TypeError), ("1", TypeError)]
)
def test_invalid_sizes_raise(bad, exc):
    with pytest.raises(exc, match="nbytes"):
        round_size(bad)
    with pytest.raises((ValueError, TypeError), match="rounded"):
        get_allocation_size(bad if bad != -1 else 0)
    with pytest.raises((ValueError, TypeError), match="rounded"):
        is_small(bad if bad != -1 else 0)


def test_roundup_invalid_divisions():
    with pytest.raises(ValueError, match="divisions"):
        roundup_power2_next_division(1000, 3)
    with pytest.raises(ValueError, match="divisions"):
        roundup_power2_next_division(1000, 1)
