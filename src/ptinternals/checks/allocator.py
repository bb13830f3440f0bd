"""The allocator chapter's graded exercises: cases, expected answers, and likely causes of wrong ones.

Where the expected values come from. PyTorch has no CPU answer for any of these questions (on a
CPU build ``torch.cuda.memory_stats()`` is ``{}``), so the expected values come from the C++
constants of c10/cuda/CUDACachingAllocator.cpp and from this package's reference model of that
allocator (``ptinternals.allocator``), whose fidelity to the real allocator is tested on a GPU:
``tests/allocator/test_exercises.py`` has ``@pytest.mark.gpu`` tests that replay these exercises'
cases on the real allocator (``torch.cuda.memory_stats()``) and compare.

Every exercise is solved in plain Python (``forbid``: no torch, no numpy); the scaffolding the
student builds on is ``ptinternals.allocator.scaffold`` (constants, block states, ``Segment``,
the trace format, ``fragmenting_trace``) and ``ptinternals.allocator.device`` (``DeviceMemory``,
the simulated cudaMalloc), both importable while grading.
"""

from __future__ import annotations

from hypothesis import strategies as st

from ..allocator.config import AllocatorConfig, format_size, parse_alloc_conf
from ..allocator.policy import find_best_fit as ref_find_best_fit
from ..allocator.policy import should_split as ref_should_split
from ..allocator.scaffold import (
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
    FRAGMENTATION_CAPACITY,
    INACTIVE,
    SIZE_MAX,
    KiB,
    MiB,
    fragmenting_trace,
    kMinBlockSize,
    kMinLargeAlloc,
    kSmallSize,
)
from ..allocator.segment_ops import merge_free_neighbours as ref_merge
from ..allocator.segment_ops import release_cached_segments as ref_release
from ..allocator.sizes import get_allocation_size, is_small
from ..allocator.sizes import round_size as ref_round_size
from ..grading.cases import cases_from, draw
from ..grading.compare import describe, same_value
from ..grading.exercise import Case, Chapter, Exercise, Raises

PLAIN = ("torch", "numpy")  # every exercise of this chapter is plain Python
BASE = 0x7F0000000000  # where the simulated device maps its first segment



def _mib(n) -> str:
    return (
        f"{n} ({format_size(n)})"
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0
        else describe(n)
    )


def _tuples(x):
    """Lists inside a result become tuples (a list where a tuple was expected is fine)."""
    if isinstance(x, list):
        return [_tuples(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_tuples(v) for v in x)
    return x


# Request sizes where rounding and pools change: around 512 B, 1 MiB, 10 MiB, and plain random ones.
def _near(x: int, spread: int = 1024) -> st.SearchStrategy[int]:
    return st.integers(max(0, x - spread), x + spread)


REQUESTS = st.one_of(
    st.sampled_from(
        [1, 511, 512, 513, 1023, 1024, 4096, 1 * MiB, 1 * MiB + 1, 10 * MiB - 1, 10 * MiB, 10 * MiB + 1]
    ),
    st.integers(0, 4 * KiB),
    _near(1 * MiB),
    _near(10 * MiB),
    st.integers(0, 2 * MiB),
    st.integers(0, 256 * MiB),
)


# ---- allocator.round_size -----------------------------------------------------------------------------------------
class RoundSize(Exercise):
    """Expected: the reference ``round_size`` (c10's ``round_size`` and ``roundup_power2_next_division``);
    torch has no CPU answer. On a GPU, ``test_round_size_matches_the_real_allocator`` checks it."""

    id, entry, points = "allocator.round_size", "round_size", 1
    title = "size rounding: the block a request gets"
    forbid = PLAIN

    def visible_cases(self):
        return [
            Case((1,), label="1 byte: the smallest block is 512 B"),
            Case((512,), label="already a multiple of 512"),
            Case((513,), label="one byte more"),
            Case((1 * MiB + 1,), label="just over 1 MiB"),
            Case((0,), label="0 bytes: never reaches the allocator, but the C++ function says 512"),
            Case((1200 * KiB, 4), label="roundup_power2_divisions 4: 1.17 MiB -> the next quarter step"),
            Case((2000, 4), label="divisions apply only above 512 * divisions bytes"),
            Case((-1,), label="a negative size is a bug: raise ValueError"),
        ]

    def hidden_cases(self):
        def case(data, n):
            d = data(st.sampled_from([0, 0, 0, 1, 2, 4, 8, 16]))
            return Case((n,) if d == 0 and data(st.booleans()) else (n, d))

        return draw(cases_from(case, REQUESTS), 120)

    def expected(self, case):
        n, d = (case.args + (0,))[:2]
        if n < 0:
            return Raises(("ValueError",), "a negative request")
        return ref_round_size(n, AllocatorConfig(roundup_power2_divisions=(d,) * 16))

    def diagnose(self, case, got, expected):
        n, d = (case.args + (0,))[:2]
        if isinstance(expected, Raises):
            return "check the argument first: raise ValueError for nbytes < 0."
        if not isinstance(got, int):
            return None
        plain = max(kMinBlockSize, -(-n // kMinBlockSize) * kMinBlockSize)
        if n < kMinBlockSize and got != kMinBlockSize:
            return "requests below 512 B (kMinBlockSize) still get a 512 B block."
        if got == n // kMinBlockSize * kMinBlockSize and got < n:
            return "round UP, not down: a block must hold the whole request ((n + 511) // 512 * 512)."
        if got == expected + kMinBlockSize and n % kMinBlockSize == 0:
            return "a multiple of 512 is already rounded: ceil(n / 512) * 512, not n // 512 * 512 + 512."
        if d > 1 and expected == plain and got != plain:
            return "roundup_power2_divisions applies only when divisions > 1 and nbytes > 512 * divisions."
        if d > 1 and got == 1 << (n - 1).bit_length():
            return (
                "the divisions split [2^k, 2^(k+1)) into `divisions` equal steps: round up to the next step, "
                "not to the next power of two."
            )
        if d <= 1 and got != plain:
            return "with divisions 0 or 1 the rule is plain: at least 512, rounded up to a multiple of 512."
        return None


# ---- allocator.size_plan -----------------------------------------------------------------------------------------
class SizePlan(Exercise):
    """Expected: the reference ``round_size``/``is_small``/``get_allocation_size`` (c10's
    ``get_pool`` and ``get_allocation_size`` with their constants). On a GPU,
    ``test_size_plan_matches_the_real_allocator`` checks block and segment sizes."""

    id, entry, points = "allocator.size_plan", "size_plan", 1
    title = "small and large pools, and how big a segment to cudaMalloc"
    forbid = PLAIN

    def visible_cases(self):
        return [
            Case((1,), label="a tiny tensor: small pool, 2 MiB segment"),
            Case((1 * MiB,), label="exactly 1 MiB is still small"),
            Case((1 * MiB + 1,), label="just over 1 MiB: large pool, a shared 20 MiB segment"),
            Case((10 * MiB - 1,), label="rounds to exactly 10 MiB: its own segment"),
            Case((11 * MiB + 1,), label="11 MiB + 1: its own segment, rounded up to 2 MiB"),
            Case((100_000_000,), label="100 MB"),
        ]

    def hidden_cases(self):
        return [Case((n,)) for n in draw(REQUESTS, 100)]

    def expected(self, case):
        rounded = ref_round_size(case.args[0])
        return rounded, ("small" if is_small(rounded) else "large"), get_allocation_size(rounded)

    def compare(self, case, got, expected):
        return same_value(_tuples(got), expected)

    def diagnose(self, case, got, expected):
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            return "return a triple (block_size, pool, segment_size), e.g. (512, 'small', 2097152)."
        rounded, pool, segment = expected
        if got[0] != rounded:
            return "block_size is round_size(nbytes): use your round_size."
        if got[1] != pool:
            return (
                "the small pool takes rounded sizes up to AND including 1 MiB (kSmallSize); "
                "pools are 'small' and 'large'."
            )
        if pool == "small":
            return "small-pool blocks are carved out of 2 MiB segments (kSmallBuffer)."
        if rounded < kMinLargeAlloc:
            return "large requests below 10 MiB (kMinLargeAlloc) share 20 MiB segments (kLargeBuffer)."
        if rounded == kMinLargeAlloc:
            return "a request of exactly 10 MiB (kMinLargeAlloc) gets its own segment."
        return (
            "requests of 10 MiB or more get their own segment, rounded up to a multiple of 2 MiB "
            "(kRoundLarge)."
        )


# ---- allocator.find_best_fit -----------------------------------------------------------------------------------------
_BLOCK_SIZES = [
    512,
    1024,
    4096,
    65536,
    1 * MiB,
    1 * MiB + 512,
    2 * MiB,
    8 * MiB,
    20 * MiB,
    24 * MiB,
    40 * MiB,
    48 * MiB,
    64 * MiB,
]


@st.composite
def _free_blocks(draw_, max_blocks: int = 8):
    n = draw_(st.integers(0, max_blocks))
    slots = draw_(st.permutations(range(max_blocks)))[:n]  # unique addresses, in random order
    blocks = []
    for slot in slots:
        size = draw_(st.sampled_from(_BLOCK_SIZES) | st.integers(1, 2 * 64 * 2048).map(lambda k: k * 512))
        blocks.append((draw_(st.sampled_from([0, 0, 1, 2])), size, BASE + slot * 128 * MiB))
    return blocks


class FindBestFit(Exercise):
    """Expected: the reference ``find_best_fit`` (c10's ``get_free_block``: ``std::set`` ordered by
    (stream, size, address), ``lower_bound``, then the two ``max_split_size`` rules)."""

    id, entry, points = "allocator.find_best_fit", "find_best_fit", 2
    title = "best fit: which cached block serves a request"
    forbid = PLAIN

    def visible_cases(self):
        a, b, c = 0, 2 * MiB, 4 * MiB  # small addresses, to read the messages easily
        three = [(0, 8192, a), (0, 2048, b), (0, 4096, c)]
        return [
            Case((three, 2048, 0), label="an exact fit"),
            Case((three, 2560, 0), label="the smallest block that is big enough, not the first"),
            Case(([(1, 4096, a), (0, 8192, b)], 1024, 0), label="a block of another stream never qualifies"),
            Case(([(1, 4096, a)], 1024, 0), label="nothing on this stream: None (cudaMalloc a segment)"),
            Case(([(0, 4096, a), (0, 4096, b)], 4096, 0), label="a tie in size: the lowest address wins"),
            Case(([], 512, 0), label="an empty pool"),
            Case(
                ([(0, 40 * MiB, a)], 4 * MiB, 0),
                {"max_split_size": 32 * MiB},
                label="max_split_size 32 MiB: an oversize block never serves a smaller request",
            ),
            Case(
                ([(0, 40 * MiB, a)], 36 * MiB, 0),
                {"max_split_size": 32 * MiB},
                label="an oversize request may take an oversize block that wastes < 20 MiB",
            ),
            Case(
                ([(0, 64 * MiB, a)], 40 * MiB, 0),
                {"max_split_size": 32 * MiB},
                label="... but not one that wastes 20 MiB or more",
            ),
        ]

    def hidden_cases(self):
        def case(data, blocks):
            sizes = [b[1] for b in blocks] or [4096]
            size = data(
                st.sampled_from(sizes)
                | st.sampled_from(sizes).map(lambda s: s + 512)
                | st.sampled_from(sizes).map(lambda s: max(512, s - 512))
                | st.sampled_from(_BLOCK_SIZES)
            )
            stream = data(st.sampled_from([0, 0, 1, 2]))
            msplit = data(st.sampled_from([None, None, None, 20 * MiB, 32 * MiB, 48 * MiB]))
            return Case((blocks, size, stream), {} if msplit is None else {"max_split_size": msplit})

        return draw(cases_from(case, _free_blocks()), 150)

    def expected(self, case):
        blocks, size, stream = case.args
        return ref_find_best_fit(
            blocks, size, stream, max_split_size=case.kwargs.get("max_split_size", SIZE_MAX)
        )

    def compare(self, case, got, expected):
        return same_value(_tuples(got), expected)

    def diagnose(self, case, got, expected):
        blocks, size, stream = case.args
        msplit = case.kwargs.get("max_split_size", SIZE_MAX)
        got = _tuples(got)
        fitting = sorted(b for b in blocks if b[0] == stream and b[1] >= size)
        if isinstance(got, tuple) and len(got) == 3:
            if got[0] != stream:
                return (
                    "only free blocks of the requesting stream qualify: a block belongs to the "
                    "stream it was allocated on."
                )
            if got[1] < size:
                return "the block must be at least as big as the request."
            if expected is None and fitting and fitting[0][1] >= msplit and size < msplit:
                return (
                    "with max_split_size set, a block of max_split_size or more is 'oversize': it never "
                    "serves "
                    "a request below max_split_size (it would have to be split)."
                )
            if expected is None and fitting and size >= msplit:
                return (
                    "an oversize request may take an oversize block only if it wastes less than 20 MiB "
                    "(max_non_split_rounding_size, kLargeBuffer): block_size < size + 20 MiB."
                )
            first = next((tuple(b) for b in blocks if b[0] == stream and b[1] >= size), None)
            if isinstance(expected, tuple) and got == first and got[1] > expected[1]:
                return (
                    "best fit, not first fit: the SMALLEST block that is big enough (the pool is a set "
                    "sorted by "
                    "(stream, size, address)), whatever the order of the list."
                )
            if isinstance(expected, tuple) and got[1] > expected[1]:
                return (
                    "best fit: the SMALLEST block that is big enough (the pool is sorted by size), "
                    "not the first one."
                )
            if isinstance(expected, tuple) and got[1] == expected[1] and got[2] != expected[2]:
                return (
                    "among blocks of the same size, the one at the lowest address wins (the pool is "
                    "sorted by address next)."
                )
        if got is None and isinstance(expected, tuple):
            if expected[1] == size:
                return "a block of exactly the requested size fits (size >= request, not >)."
            return "a big enough block of this stream exists: return it."
        return None


# ---- allocator.should_split -----------------------------------------------------------------------------------------
class ShouldSplit(Exercise):
    """Expected: the reference ``should_split`` (c10's ``should_split`` with kMinBlockSize and
    kSmallSize)."""

    id, entry, points = "allocator.should_split", "should_split", 1
    title = "the split rule: does the unused tail become a block of its own?"
    forbid = PLAIN

    def visible_cases(self):
        return [
            Case((2 * MiB, 512, "small"), label="a 512 B tensor in a fresh 2 MiB small segment"),
            Case((1024, 512, "small"), label="small pool: a 512 B tail is worth keeping"),
            Case((1024, 1024, "small"), label="an exact fit leaves nothing"),
            Case(
                (20 * MiB, 19 * MiB, "large"),
                label="large pool: a tail of exactly 1 MiB stays inside the block",
            ),
            Case((20 * MiB, 19 * MiB - 512, "large"), label="a tail of 1 MiB + 512 B is split off"),
            Case((12 * MiB, 11 * MiB + 512, "large"), label="a tail of 512 KiB in a large block stays"),
            Case(
                (20 * MiB, 4 * MiB, "large"),
                {"max_split_size": 32 * MiB},
                label="below max_split_size: split",
            ),
            Case(
                (64 * MiB, 40 * MiB, "large"),
                {"max_split_size": 32 * MiB},
                label="an oversize request is never split",
            ),
        ]

    def hidden_cases(self):
        def case(data, pool):
            tail = data(
                st.sampled_from([0, 512, 1024, kSmallSize - 512, kSmallSize, kSmallSize + 512, 2 * MiB])
                | st.integers(0, 4096).map(lambda k: k * 512)
            )
            if pool == "small":
                size = data(st.integers(1, 2048).map(lambda k: k * 512))
                tail = min(tail, 2 * MiB - size)
            else:
                size = data(st.integers(2049, 64 * 2048).map(lambda k: k * 512))
            msplit = data(st.sampled_from([None, None, 20 * MiB, 32 * MiB]))
            return Case((size + tail, size, pool), {} if msplit is None else {"max_split_size": msplit})

        return draw(cases_from(case, st.sampled_from(["small", "large"])), 120)

    def expected(self, case):
        block_size, size, pool = case.args
        return ref_should_split(
            block_size, size, pool, max_split_size=case.kwargs.get("max_split_size", SIZE_MAX)
        )

    def diagnose(self, case, got, expected):
        block_size, size, pool = case.args
        tail = block_size - size
        msplit = case.kwargs.get("max_split_size", SIZE_MAX)
        if pool == "large" and got is True and expected is False:
            if size >= msplit:
                return "a request of max_split_size or more gets an oversize block, which is never split."
            if tail == kSmallSize:
                return (
                    "large blocks split only when the tail is MORE than 1 MiB (kSmallSize): exactly "
                    "1 MiB stays."
                )
            return (
                "large blocks split only when the tail is more than 1 MiB (kSmallSize); a smaller tail stays "
                "inside the allocation (wasted until the block is freed)."
            )
        if pool == "small" and got is False and expected is True:
            return "small-pool blocks split whenever the tail is at least 512 B (kMinBlockSize, >= not >)."
        if pool == "large" and got is False and expected is True:
            return (
                "a large block with a tail of more than 1 MiB is split (when the request is below "
                "max_split_size)."
            )
        if pool == "small" and got is True and expected is False:
            return "a tail smaller than 512 B cannot be a block: no split."
        return None


# ---- allocator.merge_free_neighbours -----------------------------------------------------------------------------------------
@st.composite
def _segment(draw_, min_blocks: int = 1, max_blocks: int = 6):
    """A segment as (address, size, state) blocks: no two neighbouring inactive blocks (free_block
    always merges them)."""
    n = draw_(st.integers(min_blocks, max_blocks))
    address = BASE + draw_(st.integers(0, 64)) * 2 * MiB
    blocks, previous = [], None
    for _ in range(n):
        size = draw_(
            st.sampled_from([512, 1024, 4096, 1 * MiB, 3 * MiB]) | st.integers(1, 8192).map(lambda k: k * 512)
        )
        choices = [ACTIVE_ALLOCATED, ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE] + (
            [] if previous == INACTIVE else [INACTIVE] * 2
        )
        state = draw_(st.sampled_from(choices))
        blocks.append((address, size, state))
        address += size
        previous = state
    return blocks


class MergeFreeNeighbours(Exercise):
    """Expected: the reference ``merge_free_neighbours`` (c10's ``free_block`` + ``try_merge_blocks``)."""

    id, entry, points = "allocator.merge_free_neighbours", "merge_free_neighbours", 2
    title = "free a block and coalesce it with its free neighbours"
    forbid = PLAIN

    def visible_cases(self):
        A, P, I = ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, INACTIVE
        s = 0  # a small address, to read the messages easily
        return [
            Case(
                ([(s, 1024, A), (s + 1024, 2048, A), (s + 3072, 1024, I)], 1),
                label="merge with the free block after",
            ),
            Case(
                ([(s, 1024, I), (s + 1024, 2048, A), (s + 3072, 1024, A)], 1),
                label="merge with the free block before: the merged block starts at ITS address",
            ),
            Case(
                ([(s, 1024, I), (s + 1024, 2048, A), (s + 3072, 1024, I)], 1),
                label="both neighbours free: one block",
            ),
            Case(
                ([(s, 1024, A), (s + 1024, 2048, A), (s + 3072, 1024, A)], 1),
                label="no free neighbour: nothing to merge",
            ),
            Case(
                ([(s, 1024, P), (s + 1024, 2048, A), (s + 3072, 1024, I)], 1),
                label="a pending-free neighbour is still in use on another stream: do not merge it",
            ),
            Case(([(s, 2 * MiB, A)], 0), label="a whole segment that becomes free"),
            Case(
                ([(s, 1024, A), (s + 1024, 2048, I)], 1),
                label="freeing a free block is a double free: ValueError",
            ),
        ]

    def hidden_cases(self):
        def case(data, blocks):
            return Case((blocks, data(st.integers(0, len(blocks) - 1))))

        return draw(cases_from(case, _segment()), 120)

    def expected(self, case):
        blocks, index = case.args
        if blocks[index][2] == INACTIVE:
            return Raises(("ValueError",), "the block is already free (a double free)")
        return ref_merge(blocks, index)

    def compare(self, case, got, expected):
        return same_value(_tuples(got), expected)

    def diagnose(self, case, got, expected):
        blocks, index = case.args
        if isinstance(expected, Raises):
            return "freeing an inactive block is a double free: raise ValueError."
        got = _tuples(got)
        if not isinstance(got, list):
            return None
        prev_free = index > 0 and blocks[index - 1][2] == INACTIVE
        next_free = index + 1 < len(blocks) and blocks[index + 1][2] == INACTIVE
        if len(got) == len(blocks) and prev_free and not next_free:
            return (
                "merge with the free block BEFORE it too (try_merge_blocks with prev, then next): the merged "
                "block starts at the previous block's address."
            )
        if len(got) == len(blocks) and (prev_free or next_free):
            return "no coalescing: the freed block must absorb its free (inactive) neighbours."
        if prev_free and next_free and len(got) == len(blocks) - 1:
            return "merge with BOTH neighbours when both are free."
        if prev_free and any(b[0] == blocks[index][0] and b[2] == INACTIVE for b in got):
            return (
                "when merging with the previous block, the merged block starts at the previous "
                "block's address."
            )
        if len(got) < len(expected):
            return (
                "only inactive neighbours merge: an allocated block is in use, and a pending-free block is "
                "still in use on another stream."
            )
        return None


# ---- allocator.release_cached_segments -----------------------------------------------------------------------------------------
def _snapshot_segments(trace) -> list:
    """The segments of the reference model after ``trace``, as lists of (address, size, state)."""
    from ..allocator.trace import replay

    r = replay(trace, 1 << 40)
    return [
        [(b["address"], b["size"], b["state"]) for b in seg["blocks"]]
        for seg in r.allocator.snapshot()["segments"]
    ]


class ReleaseCachedSegments(Exercise):
    """Expected: the reference ``release_cached_segments`` (c10's ``release_cached_blocks``:
    ``synchronize_and_free_events`` then ``release_block`` of every whole free segment), which the
    tests check against the model's ``empty_cache``."""

    id, entry, points = "allocator.release_cached_segments", "release_cached_segments", 1
    title = "empty_cache: which segments go back to the driver"
    forbid = PLAIN

    def visible_cases(self):
        A, P, I = ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, INACTIVE
        s, t = 0, 20 * MiB
        return [
            Case(([[(s, 2 * MiB, I)]],), label="one whole free segment: released"),
            Case(
                ([[(s, 1 * MiB, A), (s + 1 * MiB, 1 * MiB, I)]],),
                label="a segment with a live block stays, however much of it is free",
            ),
            Case(([[(s, 2 * MiB, P)]],), label="a pending free is waited for (synchronized), then released"),
            Case(
                ([[(s, 1 * MiB, I), (s + 1 * MiB, 1 * MiB, P)]],),
                label="after the wait, the blocks merge: released",
            ),
            Case(
                ([[(s, 20 * MiB, I)], [(t, 4 * MiB, A), (t + 4 * MiB, 16 * MiB, I)]],), label="two segments"
            ),
            Case(([],), label="nothing cached"),
        ]

    def hidden_cases(self):
        from ..allocator.workloads import random_trace

        synthetic = draw(st.lists(_segment(), max_size=5), 60)
        traced = [
            _snapshot_segments(random_trace(n, seed=seed, max_size=24 * MiB))
            for n, seed in draw(st.tuples(st.integers(0, 120), st.integers(0, 10**6)), 20)
        ]
        return [Case((segments,)) for segments in synthetic + traced]

    def expected(self, case):
        return ref_release(case.args[0])

    def compare(self, case, got, expected):
        got = _tuples(got)
        if not (isinstance(got, tuple) and len(got) == 2):
            return f"expected a pair (kept_segments, released_bytes)\n     got {describe(got)}"
        if got[1] != expected[1]:
            return f"released bytes: expected {_mib(expected[1])}, got {_mib(got[1])}"
        return same_value(got[0], expected[0])

    def diagnose(self, case, got, expected):
        segments = case.args[0]
        got = _tuples(got)
        if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], int)):
            return None
        pending = any(b[2] == ACTIVE_PENDING_FREE for seg in segments for b in seg)
        if got[1] > expected[1]:
            return (
                "cudaFree returns whole segments only: a segment goes back only when it is ONE inactive "
                "block; "
                "free blocks inside a segment with a live block stay reserved."
            )
        if got[1] < expected[1] and pending:
            return (
                "empty_cache first waits for every pending free (synchronize_and_free_events) and frees "
                "those "
                "blocks, merging them with free neighbours, before it looks for whole free segments."
            )
        if got[1] == expected[1] and pending:
            return (
                "pending frees become inactive (and merge with free neighbours) in the segments that "
                "are kept, too."
            )
        return None


# ---- allocator.stat -----------------------------------------------------------------------------------------
def _run_stat_ops(ops):
    from ..allocator.stats import Stat
    from .probes.allocator import drive_stat

    return drive_stat(Stat, ops)


_OP = st.one_of(
    st.tuples(st.just("increase"), st.integers(0, 1000)),
    st.tuples(st.just("decrease"), st.integers(0, 1000)),
    st.just(("reset_peak",)),
    st.just(("reset_accumulated",)),
)


class StatCounters(Exercise):
    """Expected: the reference ``Stat`` (c10's ``Stat`` with ``increase_stat``/``decrease_stat``,
    ``reset_peak_stats``, ``reset_accumulated_stats``), driven by the same probe."""

    id, entry, points = "allocator.stat", "Stat", 1
    title = "a statistic: current, peak, allocated and freed"
    forbid = PLAIN
    probe = "ptinternals.checks.probes.allocator:drive_stat"

    def visible_cases(self):
        return [
            Case(
                ([("increase", 100), ("increase", 50), ("decrease", 120), ("increase", 10)],),
                label="the peak remembers the high-water mark",
            ),
            Case(
                ([("increase", 80), ("decrease", 30), ("reset_peak",), ("increase", 5)],),
                label="reset_peak: the peak restarts from the current value",
            ),
            Case(
                (
                    [
                        ("increase", 8),
                        ("decrease", 3),
                        ("reset_accumulated",),
                        ("increase", 1),
                        ("decrease", 2),
                    ],
                ),
                label="reset_accumulated zeroes the running totals only",
            ),
            Case(
                ([("increase", 10), ("decrease", 20), ("decrease", 10)],),
                label="a decrease below zero is a bookkeeping bug: ValueError (and nothing changes)",
            ),
        ]

    def hidden_cases(self):
        return [Case((ops,)) for ops in draw(st.lists(_OP, max_size=14), 60)]

    def expected(self, case):
        return _run_stat_ops(case.args[0])

    def compare(self, case, got, expected):
        got = _tuples(got)
        if not isinstance(got, list) or len(got) != len(expected):
            return same_value(got, expected)
        ops = case.args[0]
        names = ("current", "peak", "allocated", "freed")
        for i, (g, e) in enumerate(zip(got, expected, strict=False)):
            if same_value(g, e) is not None:
                done = ", ".join(f"{o[0]}({', '.join(map(str, o[1:]))})" for o in ops[: i + 1])
                if e[0] == "raised":
                    return f"after op {i} ({done}): expected an exception (ValueError), got {describe(g)}"
                if g and g[0] == "raised":
                    return (
                        f"after op {i} ({done}): expected (current, peak, allocated, freed) = {e}, "
                        f"got {g[1]} raised"
                    )
                wrong = (
                    [n for n, a, b in zip(names, g, e, strict=False) if a != b]
                    if isinstance(g, tuple) and len(g) == 4
                    else names
                )
                return (
                    f"after op {i} ({done}):\n  expected (current, peak, allocated, freed) = {e}\n"
                    f"       got {describe(g)}\n  wrong: {', '.join(wrong)}"
                )
        return None

    def diagnose(self, case, got, expected):
        got = _tuples(got)
        ops = case.args[0]
        if not isinstance(got, list):
            return None
        for i, (g, e) in enumerate(zip(got, expected, strict=False)):
            if g == e:
                continue
            op = ops[i][0]
            if e[0] == "raised":
                return (
                    "decrease(amount) with amount > current must raise ValueError and leave the Stat "
                    "unchanged."
                )
            if not (isinstance(g, tuple) and len(g) == 4):
                return (
                    "after every operation the four attributes current, peak, allocated, freed must be ints."
                )
            if op == "reset_peak" and g[1] != e[1]:
                return (
                    "reset_peak sets the peak to the CURRENT value (not 0): what is live now is the "
                    "new baseline."
                )
            if op == "reset_accumulated" and g != e:
                return "reset_accumulated zeroes allocated and freed only; current and peak stay."
            if op == "decrease" and g[1] != e[1]:
                return "a decrease never lowers the peak: the peak is the highest current value seen."
            if op == "decrease" and g[2] != e[2]:
                return (
                    "decrease adds to freed, not to allocated (allocated is the running total of increases)."
                )
            if op == "increase" and g[1] != e[1]:
                return "after an increase, peak = max(peak, current)."
            return None
        return None


# ---- allocator.fix_fragmentation -----------------------------------------------------------------------------------------
def _fragmenting_variants():
    """Variants of the fragmenting workload that run out of memory on the 1 GiB GPU and that the
    usual fixes (preallocation, or allocating the long-lived tensors first) make fit."""
    from ..allocator.trace import fits

    out = []
    for steps, start, growth, extra in [
        (11, 64, 8, 2),
        (12, 48, 8, 2),
        (10, 80, 8, 2),
        (9, 96, 8, 4),
        (13, 64, 4, 2),
        (8, 96, 12, 2),
        (12, 64, 6, 1),
        (10, 72, 10, 3),
    ]:
        t = fragmenting_trace(steps, big_start=start * MiB, big_growth=growth * MiB, keep_extra=extra * MiB)
        if fits(t, FRAGMENTATION_CAPACITY):
            continue
        keeps = [e for e in t if e[0] == "alloc" and str(e[1]).startswith("keep")]
        if fits(keeps + [e for e in t if e not in keeps], FRAGMENTATION_CAPACITY):
            out.append(t)
    return out


class FixFragmentation(Exercise):
    """Expected: that the fixed trace does the original's work and fits on the 1 GiB GPU when the
    reference model replays it (``workloads.check_fragmentation_fix``) under the returned
    ``PYTORCH_CUDA_ALLOC_CONF``. Many fixes are right; the checker replays whichever you choose.
    On a GPU, ``tests/allocator/test_importer.py`` checks that the real allocator runs out of memory
    at the same event as the model."""

    id, entry, points = "allocator.fix_fragmentation", "fix_fragmentation", 2
    title = "diagnose a fragmenting trace and fix it"
    forbid = PLAIN
    timeout_s = 30.0

    def visible_cases(self):
        return [Case((fragmenting_trace(),), label="fragmenting_trace(): runs out of memory on a 1 GiB GPU")]

    def hidden_cases(self):
        return [
            Case((t,), label="a variant: other step count and sizes") for t in _fragmenting_variants()[1:]
        ]

    def expected(self, case):
        from ..allocator.trace import replay

        r = replay(case.args[0], FRAGMENTATION_CAPACITY)
        return {"fits": True, "original_oom_event": r.oom["event_index"] if r.oom else None}

    def _check(self, case, got):
        from ..allocator.workloads import check_fragmentation_fix

        got = _tuples(got)
        if not (isinstance(got, tuple) and len(got) == 2):
            return (
                None,
                f"expected a pair (fixed_trace, alloc_conf), e.g. (trace, '')\n     got {describe(got)}",
            )
        trace, conf = got
        if not isinstance(conf, str):
            return None, f"alloc_conf must be a str like '' or 'max_split_size_mb:64', got {describe(conf)}"
        try:
            config = parse_alloc_conf(conf)
        except NotImplementedError:
            return None, (
                "alloc_conf: expandable_segments is not modelled by the course's allocator (it maps "
                "segments in pages instead): fix the trace, or use max_split_size_mb"
            )
        except (ValueError, TypeError) as e:
            return None, f"alloc_conf {conf!r} is not a valid PYTORCH_CUDA_ALLOC_CONF: {e}"
        try:
            report = check_fragmentation_fix(
                list(trace) if isinstance(trace, (list, tuple)) else trace,
                original=case.args[0],
                config=config,
            )
        except (ValueError, TypeError) as e:
            return None, f"the fixed trace is not a valid trace: {e}"
        return report, None

    def compare(self, case, got, expected):
        report, problem = self._check(case, got)
        if problem:
            return problem
        lines = []
        if report["problems"]:
            lines.append(
                "expected the same work as the original trace, but: " + "; ".join(report["problems"][:3])
            )
        if not report["fits"]:
            lines.append(
                f"expected a trace that fits on the 1 GiB GPU, but it runs out of memory at event "
                f"{report['oom_event']} ({describe(list(got[0])[report['oom_event']])}):"
            )
            lines.append("  " + report["oom"].split(" If reserved")[0])
        return "\n".join(lines) or None

    def diagnose(self, case, got, expected):
        report, problem = self._check(case, got)
        if problem or report is None:
            return None
        original = case.args[0]
        trace, conf = _tuples(got)
        trace = [tuple(e) for e in trace]
        if report["problems"]:
            return (
                "keep every keep{k} tensor (same size, alive to the end), and give each step a scratch "
                "buffer "
                "at least as big as its scratch{k}: the program must still do its work."
            )
        if trace == original and not conf:
            return "you returned the trace unchanged with no allocator setting."
        extra_ec = sum(1 for e in trace if e[0] == "empty_cache")
        if extra_ec and report["oom_event"] is not None:
            return (
                "an empty_cache() at the failing point changes nothing: the OOM path already released every "
                "cached segment that was entirely free (release_cached_blocks). The space is stuck inside "
                "segments that each hold a kept tensor."
            )
        if conf:
            return (
                "with max_split_size_mb, blocks of that size or more are never split, so the kept "
                "tensors cannot "
                "pin a scratch segment; the scratch buffers must be oversize (max_split_size <= the smallest "
                "scratch size), and PyTorch's minimum is 20 MiB."
            )
        return (
            "look at the segment map at the OOM: each kept tensor was carved out of the previous step's "
            "freed "
            "scratch segment, and its free tail is too small for the next, bigger scratch buffer. Change the "
            "order of allocations, or reuse one preallocated scratch buffer."
        )


# ---- allocator.memory_timeline -----------------------------------------------------------------------------------------
def _replay_timeline(trace) -> list:
    from ..allocator.trace import replay

    r = replay(trace, 1 << 50)  # an ample GPU: the question is the peak, not an OOM
    return list(zip(r.allocated_bytes, r.active_bytes, r.reserved_bytes, strict=False))


def _recorded_training_step() -> list:
    """A real PyTorch training step (a small MLP with Adam), recorded on the CPU as allocator events."""
    import torch

    from ..allocator.workloads import trace_allocations

    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    x, y = torch.randn(192, 512, generator=g), torch.randint(0, 10, (192,), generator=g)

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return trace_allocations(step)


class MemoryTimeline(Exercise):
    """Expected: the reference model's replay (``trace.replay``) of the same trace: allocated,
    active and reserved bytes after each event. On a GPU,
    ``test_memory_timeline_cases_match_the_real_allocator`` replays the cases without record_stream on
    the real allocator and checks the reserved bytes."""

    id, entry, points = "allocator.memory_timeline", "memory_timeline", 3
    title = "your own caching allocator: predict peak reserved memory"
    forbid = PLAIN
    timeout_s = 40.0

    def visible_cases(self):
        from ..allocator.workloads import training_step_trace

        return [
            Case(
                ([("alloc", "a", 1000, 0), ("alloc", "b", 3000, 0), ("free", "a"), ("alloc", "c", 800, 0)],),
                label="small tensors share one 2 MiB segment; a freed block is reused",
            ),
            Case(
                (
                    [
                        ("alloc", "x", 4 * MiB, 0),
                        ("free", "x"),
                        ("alloc", "y", 3 * MiB, 0),
                        ("alloc", "z", 11 * MiB, 0),
                        ("free", "z"),
                        ("empty_cache",),
                    ],
                ),
                label="large pool: 20 MiB segments, an own segment, empty_cache",
            ),
            Case(
                (
                    [
                        ("alloc", "a", 0, 0),
                        ("alloc", "b", 1 * MiB, 1),
                        ("free", "b"),
                        ("alloc", "c", 1 * MiB, 0),
                    ],
                ),
                label="0 bytes allocate nothing; stream 1's free block cannot serve stream 0",
            ),
            Case(
                (
                    [
                        ("alloc", "x", 6 * MiB, 1),
                        ("record_stream", "x", 0),
                        ("free", "x"),
                        ("alloc", "y", 6 * MiB, 1),
                        ("sync", 0),
                        ("alloc", "z", 6 * MiB, 1),
                    ],
                ),
                label="record_stream: the block waits for stream 0",
            ),
            Case(
                ([("alloc", "x", 6 * MiB, 1), ("record_stream", "x", 0), ("free", "x"), ("empty_cache",)],),
                label="empty_cache waits for the pending free, then releases the segment",
            ),
            Case(
                (training_step_trace(steps=2, widths=(512, 1024, 256), batches=(64, 48)),),
                label="a small MLP training step with Adam and a side stream (synthetic)",
            ),
            Case(
                (_recorded_training_step(),),
                label="a real PyTorch MLP training step with Adam, recorded on the CPU",
            ),
        ]

    def hidden_cases(self):
        from ..allocator.workloads import random_trace, training_step_trace

        randoms = draw(
            st.builds(
                lambda n, seed, streams, max_size, ec, cross: random_trace(
                    n,
                    seed=seed,
                    streams=streams,
                    max_size=max_size,
                    empty_cache_every=ec,
                    cross_stream_uses=cross,
                ),
                st.integers(0, 250),
                st.integers(0, 10**6),
                st.sampled_from([(0,), (0, 1), (0, 3, 5)]),
                st.sampled_from([12 * MiB, 48 * MiB]),
                st.sampled_from([0, 0, 17, 60]),
                st.booleans(),
            ),
            30,
        )
        flushed = [
            random_trace(120, seed=seed, streams=(0, 1), empty_cache_every=13, max_size=24 * MiB)
            for seed in draw(st.integers(0, 10**6), 6)
        ]  # pending frees at every empty_cache
        trainings = draw(
            st.builds(
                lambda w, b, adam, side, steps: training_step_trace(
                    steps, widths=w, batches=b, adam=adam, side_stream=side
                ),
                st.sampled_from([(256, 512, 10), (1024, 4096, 1024), (300, 700, 300, 7), (2048, 2048)]),
                st.sampled_from([(32,), (256, 192, 320), (1, 17)]),
                st.booleans(),
                st.sampled_from([None, 7]),
                st.integers(1, 3),
            ),
            8,
        )
        return [Case((t,)) for t in randoms + flushed + trainings]

    def expected(self, case):
        return _replay_timeline(case.args[0])

    def compare(self, case, got, expected):
        got = _tuples(got)
        trace = case.args[0]
        if not isinstance(got, list):
            return (
                f"expected a list with one (allocated, active, reserved) triple per event\n     got "
                f"{describe(got)}"
            )
        if len(got) != len(expected):
            return f"expected one entry per event: {len(expected)} entries, got {len(got)}"
        for i, (g, e) in enumerate(zip(got, expected, strict=False)):
            if same_value(g, e) is None:
                continue
            lines = [f"first difference after event {i}: {trace[i]!r}"]
            for j in range(max(0, i - 3), i):
                lines.append(f"  (events before it: [{j}] {trace[j]!r})")
            if isinstance(g, tuple) and len(g) == 3:
                for name, a, b in zip(("allocated", "active", "reserved"), g, e, strict=False):
                    mark = "" if a == b else "   <- differs"
                    lines.append(f"  {name:9s} expected {_mib(b)}, got {_mib(a)}{mark}")
            else:
                lines.append(f"  expected (allocated, active, reserved) = {e}, got {describe(g)}")
            peak_e = max(x[2] for x in expected)
            try:
                peak_g = max(x[2] for x in got)
                lines.append(f"  peak reserved over the trace: expected {_mib(peak_e)}, got {_mib(peak_g)}")
            except Exception:
                pass
            return "\n".join(lines)
        return None

    def diagnose(self, case, got, expected):
        got = _tuples(got)
        trace = case.args[0]
        if not isinstance(got, list) or len(got) != len(expected):
            return (
                "append one (allocated, active, reserved) triple after EVERY event, markers and "
                "syncs included."
            )
        i = next((k for k, (g, e) in enumerate(zip(got, expected, strict=False)) if g != e), None)
        if i is None or not (isinstance(got[i], tuple) and len(got[i]) == 3):
            return None
        ev, g, e = trace[i], got[i], expected[i]
        before = expected[i - 1] if i else (0, 0, 0)
        kind = ev[0]
        if kind == "alloc" and ev[2] == 0:
            return (
                "a 0-byte tensor never reaches the allocator: no block, and no pending frees are processed."
            )
        if kind == "alloc":
            if g[0] - before[0] != e[0] - before[0]:
                return (
                    "the block handed out has the wrong size. Either its size (round_size; then should_split "
                    "decides whether the tail is split off: a large block keeps a tail of 1 MiB or "
                    "less, and it "
                    "counts as allocated), or the choice of block (best fit among free blocks that were "
                    "merged "
                    "with their free neighbours when they were freed)."
                )
            if g[2] > e[2]:
                return (
                    "a new segment was cudaMalloc'd although a cached block could serve this request: "
                    "search the "
                    "pool's inactive blocks of this stream (best fit), merge freed blocks with free "
                    "neighbours, "
                    "and return pending frees whose streams have synced before searching."
                )
            if g[2] < e[2]:
                return (
                    "you reused a cached block the allocator cannot use here: a block of another "
                    "stream, of the "
                    "other pool, or one still pending on another stream (record_stream) whose stream has not "
                    "synced."
                )
            if g[1] != e[1]:
                return (
                    "pending-free blocks return to the pool (active drops) at the start of the next "
                    "malloc after "
                    "their streams synced (process_events), not earlier and not later."
                )
        if kind == "free":
            if g[0] != e[0]:
                return "a free lowers allocated by the block's size (the rounded size, tail included)."
            return (
                "a block used on another stream (record_stream) stays active, pending, until that "
                "stream syncs; "
                "any other freed block is inactive at once."
            )
        if kind == "empty_cache":
            return (
                "empty_cache first frees every pending block (it synchronizes all streams), then "
                "cudaFrees the "
                "segments that are one inactive block, and only those."
            )
        if kind in ("sync", "record_stream", "step"):
            return f"a {kind!r} event changes no statistic by itself."
        return None


EXERCISES = [
    RoundSize(),
    SizePlan(),
    FindBestFit(),
    ShouldSplit(),
    MergeFreeNeighbours(),
    ReleaseCachedSegments(),
    StatCounters(),
    FixFragmentation(),
    MemoryTimeline(),
]
CHAPTER = Chapter("allocator", EXERCISES, sandbox_files=("allocator/scaffold.py", "allocator/device.py"))

__all__ = ["CHAPTER", "EXERCISES"]
