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

Hidden cases draw each exercise's boundary classes deliberately (``boundary_classes``): every size
threshold at equality and one step either side, exact ties, bad input, ints past CPython's small-int
cache (real stream handles are pointers) and strings that are equal but not the same object (as the
sandbox decodes them), so that ``is`` cannot pass for ``==``.
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
    GiB,
    KiB,
    MiB,
    fragmenting_trace,
    kLargeBuffer,
    kMinBlockSize,
    kMinLargeAlloc,
    kRoundLarge,
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
KEEPING_INPUTS = "ptinternals.checks.probes.allocator:call_keeping_inputs"
STREAM_HANDLE = 0x55D3C0A1B2C0  # a cudaStream_t as a real program sees it: a pointer, far past 256


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


# The literals a solution compares with. ``_fresh`` makes an equal str that is another object, as the
# sandbox's decoder does: ``x is "alloc"`` fails on it where ``x == "alloc"`` holds.
_LITERALS = {s: s for s in ("alloc", "free", "record_stream", "sync", "empty_cache", "step", "small", "large",
                            ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, INACTIVE)}


def _fresh(s: str) -> str:
    return "".join(list(s))  # str.join builds a new object


def _is_fresh(s) -> bool:
    return isinstance(s, str) and s in _LITERALS and s is not _LITERALS[s]


def _large(x) -> bool:
    """An int past CPython's small-int cache (-5..256), where ``a is b`` stops meaning ``a == b``."""
    return isinstance(x, int) and abs(x) > 256


def _fresh_states(blocks):
    return [(a, n, _fresh(state)) for a, n, state in blocks]


def _keeping(got):
    """(result, inputs after the call) from the ``call_keeping_inputs`` probe; (got, None) otherwise."""
    if isinstance(got, dict) and "out" in got:
        return got["out"], got.get("inputs")
    return got, None


def _inputs_problem(case, inputs, names) -> str | None:
    """What the call changed in its inputs (a function that must leave them as they are)."""
    if inputs is None:
        return None
    for name, before, after in zip(names, case.args, inputs, strict=False):
        if after != before:
            return (f"your function modified its argument `{name}` (it must leave it as it is)\n"
                    f"  before the call: {describe(before)}\n   after the call: {describe(after)}")
    return None


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


def _plain(n: int) -> int:
    return max(kMinBlockSize, -(-n // kMinBlockSize) * kMinBlockSize)


def _step(n: int, d: int) -> int:
    """The width of one of ``d`` equal steps between the powers of two around ``n``."""
    return (1 << (n.bit_length() - 1)) // d


def _on_steps(n: int, d: int) -> int | None:
    """``n`` rounded up to one of ``d`` equal steps between powers of two, threshold or not (None: no step)."""
    step = _step(n, d) if n > 0 and d > 0 else 0
    return -(-n // step) * step if step else None


def _divided(n: int, d: int) -> bool:
    """Whether ``roundup_power2_divisions`` applies: divisions > 1 and nbytes > 512 * divisions."""
    return d > 1 and n > kMinBlockSize * d


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

    boundary_classes = {
        "0 bytes": lambda c, e: c.args[0] == 0,
        "a negative request (ValueError)": lambda c, e: c.args[0] < 0,
        "511 B (one below the 512 B minimum)": lambda c, e: c.args[0] == kMinBlockSize - 1,
        "512 B (the minimum itself)": lambda c, e: c.args[0] == kMinBlockSize,
        "513 B (one above the minimum)": lambda c, e: c.args[0] == kMinBlockSize + 1,
        "a multiple of 512 above 512 (an exact tie: stays)": lambda c, e: (
            c.args[0] > kMinBlockSize and c.args[0] % kMinBlockSize == 0 and not _divided(*(c.args + (0,))[:2])),
        "one byte past a multiple of 512": lambda c, e: c.args[0] > kMinBlockSize and c.args[0] % kMinBlockSize == 1,
        "divisions 1 where steps would round differently (1 is not > 1)": lambda c, e: (
            len(c.args) == 2 and c.args[1] == 1 and _on_steps(c.args[0], 1) != _plain(c.args[0])),
        "nbytes == 512 * divisions (the threshold)": lambda c, e: (
            len(c.args) == 2 and c.args[1] > 1 and c.args[0] == kMinBlockSize * c.args[1]),
        "nbytes == 512 * divisions + 1": lambda c, e: (
            len(c.args) == 2 and c.args[1] > 1 and c.args[0] == kMinBlockSize * c.args[1] + 1),
        "nbytes == 512 * divisions - 1": lambda c, e: (
            len(c.args) == 2 and c.args[1] > 1 and c.args[0] == kMinBlockSize * c.args[1] - 1),
        "below 512 * divisions, where steps would round differently (they must not apply)": lambda c, e: (
            len(c.args) == 2 and c.args[1] > 1 and kMinBlockSize < c.args[0] <= kMinBlockSize * c.args[1]
            and _on_steps(*c.args) != _plain(c.args[0])),
        "a power of two above the threshold (stays)": lambda c, e: (
            len(c.args) == 2 and _divided(*c.args) and c.args[0] & (c.args[0] - 1) == 0),
        "exactly on a step that is not a power of two (an exact tie: stays)": lambda c, e: (
            len(c.args) == 2 and _divided(*c.args) and c.args[0] & (c.args[0] - 1) != 0
            and c.args[0] % _step(*c.args) == 0),
        "one byte past a step": lambda c, e: len(c.args) == 2 and _divided(*c.args) and c.args[0] % _step(*c.args) == 1,
        "one byte before a step": lambda c, e: (
            len(c.args) == 2 and _divided(*c.args) and (c.args[0] + 1) % _step(*c.args) == 0),
        "a request above 4 GiB (past 32 bits)": lambda c, e: c.args[0] >= 1 << 32,
    }

    def hidden_cases(self):
        def case(data, n):
            d = data(st.sampled_from([0, 0, 0, 1, 2, 4, 8, 16]))
            return Case((n,) if d == 0 and data(st.booleans()) else (n, d))

        deliberate = [(0,), (-1,), (-4096, 4), (511,), (512,), (513,), (1023,), (1024,), (1025,), (4 * MiB + 512,),
                      (1200 * KiB, 1), (1500, 1), (3 * MiB + 1, 0), (1100, 4), (4200, 16)]
        for d in (2, 4, 8, 16):  # the divisions threshold 512 * d at equality and one byte either side
            deliberate += [(kMinBlockSize * d - 1, d), (kMinBlockSize * d, d), (kMinBlockSize * d + 1, d)]
        deliberate += [(1 * MiB, 4), (1 * MiB - 1, 4), (1 * MiB + 1, 4), (1280 * KiB, 4), (1280 * KiB + 1, 4),
                       (1280 * KiB - 1, 4), (3 * MiB, 2), (3 * MiB + 1, 2), (3 * MiB - 1, 2), (5 * GiB + 1,),
                       (5 * GiB + 1, 8), ((1 << 40) + 3, 16), (1 << 40, 16)]
        return [Case(args) for args in deliberate] + draw(cases_from(case, REQUESTS), 100)

    def expected(self, case):
        n, d = (case.args + (0,))[:2]
        if n < 0:
            return Raises(("ValueError",), "a negative request")
        return ref_round_size(n, AllocatorConfig(roundup_power2_divisions=(d,) * 16))

    def diagnose(self, case, got, expected):
        n, d = (case.args + (0,))[:2]
        if isinstance(expected, Raises):
            return "check the argument first: raise ValueError for nbytes < 0."
        if isinstance(got, bool) or not isinstance(got, int):
            return None
        if n < kMinBlockSize:
            return "requests below 512 B (kMinBlockSize) still get a 512 B block."
        if not _divided(n, d):  # the plain rule: a multiple of 512
            if got < n and got == n // kMinBlockSize * kMinBlockSize:
                return "round UP, not down: a block must hold the whole request ((n + 511) // 512 * 512)."
            if n % kMinBlockSize == 0 and got == n + kMinBlockSize:
                return "a multiple of 512 is already rounded: ceil(n / 512) * 512, not n // 512 * 512 + 512."
            if d > 1 and got == _on_steps(n, d):
                return "roundup_power2_divisions applies only when divisions > 1 and nbytes > 512 * divisions."
            if d == 1 and got == _on_steps(n, 1):
                return "divisions 0 and 1 both mean plain 512 B rounding: the steps apply when divisions > 1."
            return None
        if got == _plain(n):
            return ("with divisions > 1 and nbytes > 512 * divisions, round up to one of `divisions` equal steps "
                    "between two powers of two, not to a multiple of 512.")
        if got == 1 << (n - 1).bit_length():
            return (
                "the divisions split [2^k, 2^(k+1)) into `divisions` equal steps: round up to the next step, "
                "not to the next power of two."
            )
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

    @staticmethod
    def _rounded(case) -> int:
        return ref_round_size(case.args[0]) if case.args[0] >= 0 else -1

    boundary_classes = {
        "0 bytes (a 512 B block)": lambda c, e: c.args[0] == 0,
        "a negative request (ValueError)": lambda c, e: c.args[0] < 0,
        "a block of exactly 1 MiB (the last small size)": lambda c, e: SizePlan._rounded(c) == kSmallSize,
        "a block of 1 MiB - 512 B": lambda c, e: SizePlan._rounded(c) == kSmallSize - kMinBlockSize,
        "a block of 1 MiB + 512 B (the first large size)": lambda c, e: SizePlan._rounded(c) == kSmallSize + kMinBlockSize,
        "a block of exactly 10 MiB (its own segment)": lambda c, e: SizePlan._rounded(c) == kMinLargeAlloc,
        "a block of 10 MiB - 512 B (the last shared 20 MiB segment)": lambda c, e: (
            SizePlan._rounded(c) == kMinLargeAlloc - kMinBlockSize),
        "a block of 10 MiB + 512 B": lambda c, e: SizePlan._rounded(c) == kMinLargeAlloc + kMinBlockSize,
        "an own segment exactly as big as the block (a multiple of 2 MiB)": lambda c, e: (
            SizePlan._rounded(c) >= kMinLargeAlloc and SizePlan._rounded(c) % kRoundLarge == 0),
        "an own segment 512 B past a multiple of 2 MiB": lambda c, e: (
            SizePlan._rounded(c) >= kMinLargeAlloc and SizePlan._rounded(c) % kRoundLarge == kMinBlockSize),
        "an own segment 512 B short of a multiple of 2 MiB": lambda c, e: (
            SizePlan._rounded(c) >= kMinLargeAlloc and SizePlan._rounded(c) % kRoundLarge == kRoundLarge - kMinBlockSize),
        "a request of exactly 20 MiB (kLargeBuffer is not a threshold)": lambda c, e: c.args[0] == kLargeBuffer,
        "a request above 4 GiB (past 32 bits)": lambda c, e: c.args[0] >= 1 << 32,
    }

    def hidden_cases(self):
        deliberate = [0, -1, 1, 511, 512, 513, 1 * MiB - 1, 1 * MiB, 1 * MiB + 1, 1 * MiB - 512, 1 * MiB - 513,
                      10 * MiB - 513, 10 * MiB - 512, 10 * MiB - 1, 10 * MiB, 10 * MiB + 1, 12 * MiB, 12 * MiB + 1,
                      12 * MiB - 511, 14 * MiB - 512, 20 * MiB, 20 * MiB + 1, 5 * GiB + 1]
        return [Case((n,)) for n in deliberate + draw(REQUESTS, 90)]

    def expected(self, case):
        if case.args[0] < 0:
            return Raises(("ValueError",), "a negative request")
        rounded = ref_round_size(case.args[0])
        return rounded, ("small" if is_small(rounded) else "large"), get_allocation_size(rounded)

    def compare(self, case, got, expected):
        return same_value(_tuples(got), expected)

    def diagnose(self, case, got, expected):
        if isinstance(expected, Raises):
            return "a negative request must raise ValueError (your round_size does)."
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            return "return a triple (block_size, pool, segment_size), e.g. (512, 'small', 2097152)."
        rounded, pool, segment = expected
        if got[0] != rounded:
            return "block_size is round_size(nbytes), not the request itself." if got[0] == case.args[0] else None
        if got[1] != pool:
            if rounded == kSmallSize and got[1] == "large":
                return "the small pool takes rounded sizes up to AND including 1 MiB (kSmallSize)."
            return None
        if pool == "small":
            return "small-pool blocks are carved out of 2 MiB segments (kSmallBuffer)."
        if rounded < kMinLargeAlloc:
            return "large requests below 10 MiB (kMinLargeAlloc) share 20 MiB segments (kLargeBuffer)."
        if rounded == kMinLargeAlloc and got[2] == kLargeBuffer:
            return "a request of exactly 10 MiB (kMinLargeAlloc) gets its own segment."
        if got[2] == kLargeBuffer:
            return "requests of 10 MiB or more get their own segment, not a shared 20 MiB one."
        if got[2] == rounded:
            return "an own segment is rounded up to a multiple of 2 MiB (kRoundLarge)."
        return None


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


def _best(blocks, size, stream, msplit=SIZE_MAX, *, strict=False, highest=False):
    """What a variant of best fit returns: ``strict`` excludes exact fits, ``highest`` breaks ties by the
    highest address. (The reference answers the right question; these answer a mistaken one.)"""
    fits = [b for b in blocks if b[0] == stream and (b[1] > size if strict else b[1] >= size)]
    if not fits:
        return None
    best = min(fits, key=lambda b: (b[1], -b[2] if highest else b[2]))
    if size < msplit <= best[1] or (size >= msplit and best[1] >= size + kLargeBuffer):
        return None
    return tuple(best)


def _first(blocks, size, stream, msplit=SIZE_MAX):
    """First fit: the first block of the list that is big enough, then the oversize rules."""
    first = next((tuple(b) for b in blocks if b[0] == stream and b[1] >= size), None)
    if first is None or size < msplit <= first[1] or (size >= msplit and first[1] >= size + kLargeBuffer):
        return None
    return first


class FindBestFit(Exercise):
    """Expected: the reference ``find_best_fit`` (c10's ``get_free_block``: ``std::set`` ordered by
    (stream, size, address), ``lower_bound``, then the two ``max_split_size`` rules)."""

    id, entry, points = "allocator.find_best_fit", "find_best_fit", 2
    title = "best fit: which cached block serves a request"
    forbid = PLAIN
    probe = KEEPING_INPUTS

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

    boundary_classes = {
        "an empty pool": lambda c, e: c.args[0] == [],
        "one free block": lambda c, e: len(c.args[0]) == 1,
        "an exact fit": lambda c, e: isinstance(e, tuple) and e[1] == c.args[1],
        "a block one step (512 B) too small": lambda c, e: any(
            b[0] == c.args[2] and b[1] == c.args[1] - kMinBlockSize for b in c.args[0]),
        "a tie in size on the stream, the lower address listed last": lambda c, e: isinstance(e, tuple) and any(
            b[0] == e[0] and b[1] == e[1] and b[2] > e[2] for b in c.args[0][:c.args[0].index(e)]),
        "a smaller fitting block on another stream": lambda c, e: isinstance(e, tuple) and any(
            b[0] != c.args[2] and c.args[1] <= b[1] < e[1] for b in c.args[0]),
        "an unsorted list (sorting it in place would show)": lambda c, e: list(c.args[0]) != sorted(c.args[0]),
        "stream handles past 256 (real cudaStream_t values)": lambda c, e: _large(c.args[2]),
        "request == max_split_size, block == max_split_size": lambda c, e: (
            c.args[1] == c.kwargs.get("max_split_size") and isinstance(e, tuple) and e[1] == c.args[1]),
        "request one step below max_split_size, best block == max_split_size (None)": lambda c, e: (
            c.args[1] == c.kwargs.get("max_split_size", 0) - kMinBlockSize and e is None
            and _best(c.args[0], *c.args[1:])[1] == c.kwargs["max_split_size"]),
        "request below max_split_size, best block one step below it": lambda c, e: (
            c.args[1] < c.kwargs.get("max_split_size", 0) and isinstance(e, tuple)
            and e[1] == c.kwargs["max_split_size"] - kMinBlockSize),
        "an oversize block == request + 20 MiB exactly (None)": lambda c, e: (
            "max_split_size" in c.kwargs and e is None and c.args[1] >= c.kwargs["max_split_size"]
            and _best(c.args[0], *c.args[1:])[1] == c.args[1] + kLargeBuffer),
        "an oversize block == request + 20 MiB - 512 B (taken)": lambda c, e: (
            "max_split_size" in c.kwargs and isinstance(e, tuple) and c.args[1] >= c.kwargs["max_split_size"]
            and e[1] == c.args[1] + kLargeBuffer - kMinBlockSize),
        "request == max_split_size, block == request + 20 MiB (None)": lambda c, e: (
            c.args[1] == c.kwargs.get("max_split_size") and e is None
            and _best(c.args[0], *c.args[1:])[1] == c.args[1] + kLargeBuffer),
    }

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

        a, h = BASE, STREAM_HANDLE
        m32 = {"max_split_size": 32 * MiB}
        deliberate = [
            Case(([], 4096, 0)),
            Case(([(0, 4096, a)], 4096, 0)),
            Case(([(0, 4096, a + 4 * MiB), (1, 4096, a), (0, 4096, a + 2 * MiB)], 4096, 0)),
            Case(([(1, 8192, a), (0, 1024, a + 2 * MiB), (1, 4096, a + 4 * MiB), (0, 8192, a + 6 * MiB)], 2048, 0)),
            Case(([(0, 3584, a), (0, 8192, a + 2 * MiB)], 4096, 0)),
            Case(([(h + 8, 4096, a), (h, 8192, a + 2 * MiB), (h, 6144, a + 4 * MiB)], 4096, h)),
            Case(([(h, 6 * MiB, a + 4 * MiB), (h, 6 * MiB, a)], 6 * MiB, h)),
            Case(([(0, 32 * MiB, a)], 32 * MiB, 0), m32),  # request == max_split_size == block
            Case(([(0, 32 * MiB, a)], 32 * MiB - 512, 0), m32),  # one step below: the oversize block is barred
            Case(([(0, 32 * MiB - 512, a)], 4 * MiB, 0), m32),  # a block one step below max_split_size: taken
            Case(([(0, 52 * MiB, a)], 32 * MiB, 0), m32),  # request == max_split_size, block == request + 20 MiB
            Case(([(0, 60 * MiB, a)], 40 * MiB, 0), m32),  # block == request + 20 MiB: None
            Case(([(0, 60 * MiB - 512, a)], 40 * MiB, 0), m32),  # 512 B less waste: taken
            Case(([(0, 52 * MiB - 512, a), (0, 100 * MiB, a + 128 * MiB)], 32 * MiB, 0), m32),
        ]
        return deliberate + draw(cases_from(case, _free_blocks()), 130)

    def expected(self, case):
        blocks, size, stream = case.args
        return ref_find_best_fit(
            blocks, size, stream, max_split_size=case.kwargs.get("max_split_size", SIZE_MAX)
        )

    def compare(self, case, got, expected):
        out, inputs = _keeping(got)
        return same_value(_tuples(out), expected) or _inputs_problem(case, inputs, ("free_blocks",))

    def diagnose(self, case, got, expected):
        blocks, size, stream = case.args
        msplit = case.kwargs.get("max_split_size", SIZE_MAX)
        got, inputs = _keeping(got)
        got = _tuples(got)
        if got == expected:  # right answer, wrong manners: the list was modified
            if inputs is not None and sorted(inputs[0]) == sorted(blocks):
                return "sort a copy (sorted(free_blocks)): list.sort() reorders the caller's list."
            return None
        if isinstance(got, tuple) and len(got) == 3 and got[0] != stream:
            return "only free blocks of the requesting stream qualify: a block belongs to the stream it was allocated on."
        if isinstance(got, tuple) and len(got) == 3 and got[1] < size:
            return "the block must be at least as big as the request."
        # The answer each known mistake gives on this case; a hint only when exactly one of them matches.
        mistakes = [
            (_best(blocks, size, stream, msplit, strict=True), "a block of exactly the requested size fits "
             "(size >= request, not >)."),
            (_best(blocks, size, stream, msplit, highest=True), "among blocks of the same size, the one at the "
             "lowest address wins (the pool is sorted by address next)."),
            (_first(blocks, size, stream, msplit), "best fit, not first fit: the SMALLEST block that is big "
             "enough (the pool is a set sorted by (stream, size, address)), whatever the order of the list."),
        ]
        if expected is None and msplit != SIZE_MAX:
            mistakes.append((_best(blocks, size, stream), (
                "with max_split_size set, a block of max_split_size or more is 'oversize': it never serves a "
                "request below max_split_size (it would have to be split)." if size < msplit else
                "an oversize request may take an oversize block only if it wastes less than 20 MiB "
                "(max_non_split_rounding_size, kLargeBuffer): block_size < size + 20 MiB.")))
        matching = {hint for answer, hint in mistakes if answer == got}
        return matching.pop() if len(matching) == 1 else None


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
            Case((1024, 1536, "small"), label="a request bigger than its block: ValueError"),
        ]

    boundary_classes = {
        "small pool, tail 0 (an exact fit)": lambda c, e: c.args[2] == "small" and c.args[0] == c.args[1],
        "small pool, tail exactly 512 B": lambda c, e: c.args[2] == "small" and c.args[0] - c.args[1] == kMinBlockSize,
        "small pool, tail 1 KiB": lambda c, e: c.args[2] == "small" and c.args[0] - c.args[1] == 2 * kMinBlockSize,
        "large pool, tail 1 MiB - 512 B": lambda c, e: (
            c.args[2] == "large" and c.args[0] - c.args[1] == kSmallSize - kMinBlockSize),
        "large pool, tail exactly 1 MiB": lambda c, e: c.args[2] == "large" and c.args[0] - c.args[1] == kSmallSize,
        "large pool, tail 1 MiB + 512 B": lambda c, e: (
            c.args[2] == "large" and c.args[0] - c.args[1] == kSmallSize + kMinBlockSize and not c.kwargs),
        "request == max_split_size, big tail": lambda c, e: (
            c.args[1] == c.kwargs.get("max_split_size") and c.args[0] - c.args[1] > kSmallSize),
        "request one step below max_split_size, big tail": lambda c, e: (
            c.args[1] == c.kwargs.get("max_split_size", 0) - kMinBlockSize and c.args[0] - c.args[1] > kSmallSize),
        "a request bigger than its block (ValueError)": lambda c, e: c.args[1] > c.args[0],
        "pool names that are equal strings, not the same objects": lambda c, e: _is_fresh(c.args[2]),
        "the smallest block: 512 B": lambda c, e: c.args[0] == kMinBlockSize,
    }

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

        small, large, m32 = _fresh("small"), _fresh("large"), {"max_split_size": 32 * MiB}
        deliberate = [
            Case((512, 512, small)), Case((1024, 512, small)), Case((1536, 512, small)), Case((2 * MiB, 2 * MiB, small)),
            Case((2 * MiB, 2 * MiB - 512, "small")),
            Case((12 * MiB, 11 * MiB + 512, large)), Case((12 * MiB, 11 * MiB, large)),
            Case((12 * MiB, 11 * MiB - 512, large)),
            Case((40 * MiB, 32 * MiB, "large"), m32), Case((40 * MiB, 32 * MiB - 512, "large"), m32),
            Case((24 * MiB, 22 * MiB, "large"), {"max_split_size": 20 * MiB}),
            Case((512, 1024, "small")), Case((20 * MiB, 20 * MiB + 512, large)),
        ]
        return deliberate + draw(cases_from(case, st.sampled_from(["small", "large"])), 100)

    def expected(self, case):
        block_size, size, pool = case.args
        if size > block_size:
            return Raises(("ValueError",), "the request does not fit in the block")
        return ref_should_split(
            block_size, size, pool, max_split_size=case.kwargs.get("max_split_size", SIZE_MAX)
        )

    def diagnose(self, case, got, expected):
        block_size, size, pool = case.args
        tail = block_size - size
        msplit = case.kwargs.get("max_split_size", SIZE_MAX)
        if isinstance(expected, Raises):
            return "a request bigger than its block is the caller's bug: raise ValueError when size > block_size."
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
            if tail == kMinBlockSize:
                return "small-pool blocks split whenever the tail is at least 512 B (kMinBlockSize, >= not >)."
            if tail <= kSmallSize:
                return "the small pool splits off any tail of at least 512 B: the 1 MiB rule is the large pool's."
        if pool == "large" and got is False and expected is True and size == msplit - kMinBlockSize:
            return "only requests of max_split_size or MORE are never split: this one is below it."
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


def _many_blocks(n: int, *, pending_every: int = 0) -> list:
    """A small segment cut into ``n`` 512 B blocks (a 2 MiB segment holds up to 4096): allocated, with every
    ``pending_every``-th one pending, and no two neighbouring free blocks."""
    blocks = []
    for k in range(n):
        state = ACTIVE_PENDING_FREE if pending_every and k % pending_every == pending_every - 1 else ACTIVE_ALLOCATED
        blocks.append((BASE + k * kMinBlockSize, kMinBlockSize, state))
    return blocks


class MergeFreeNeighbours(Exercise):
    """Expected: the reference ``merge_free_neighbours`` (c10's ``free_block`` + ``try_merge_blocks``)."""

    id, entry, points = "allocator.merge_free_neighbours", "merge_free_neighbours", 2
    title = "free a block and coalesce it with its free neighbours"
    forbid = PLAIN
    probe = KEEPING_INPUTS

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
            Case(([(s, 1024, A), (s + 1024, 2048, A)], 2), label="an index past the end: IndexError"),
        ]

    boundary_classes = {
        "one block (a whole segment)": lambda c, e: len(c.args[0]) == 1 and 0 <= c.args[1] < 1,
        "the first block, its next neighbour free": lambda c, e: c.args[1] == 0 and len(c.args[0]) > 1
        and c.args[0][1][2] == INACTIVE,
        "the last block, its previous neighbour free": lambda c, e: c.args[1] == len(c.args[0]) - 1 > 0
        and c.args[0][-2][2] == INACTIVE,
        "both neighbours free": lambda c, e: 0 < c.args[1] < len(c.args[0]) - 1
        and c.args[0][c.args[1] - 1][2] == c.args[0][c.args[1] + 1][2] == INACTIVE,
        "both neighbours pending": lambda c, e: 0 < c.args[1] < len(c.args[0]) - 1
        and c.args[0][c.args[1] - 1][2] == c.args[0][c.args[1] + 1][2] == ACTIVE_PENDING_FREE,
        "freeing a pending block": lambda c, e: 0 <= c.args[1] < len(c.args[0])
        and c.args[0][c.args[1]][2] == ACTIVE_PENDING_FREE,
        "a double free (ValueError)": lambda c, e: 0 <= c.args[1] < len(c.args[0]) and c.args[0][c.args[1]][2] == INACTIVE,
        "index -1 (IndexError, not the last block)": lambda c, e: c.args[1] == -1,
        "index == len(blocks) (IndexError)": lambda c, e: c.args[1] == len(c.args[0]),
        "more than 256 blocks, the last one freed": lambda c, e: c.args[1] == len(c.args[0]) - 1 > 256,
        "states that are equal strings, not the same objects": lambda c, e: any(_is_fresh(b[2]) for b in c.args[0]),
    }

    def hidden_cases(self):
        def case(data, blocks):
            return Case((blocks, data(st.integers(0, len(blocks) - 1))))

        A, P, I = ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, INACTIVE
        a = BASE
        many = _many_blocks(300)
        many[-2] = (many[-2][0], many[-2][1], I)
        deliberate = [
            Case(([(a, 2 * MiB, A)], 0)),
            Case(([(a, 1024, A), (a + 1024, 4096, I)], 0)),
            Case(([(a, 1024, I), (a + 1024, 4096, A)], 1)),
            Case(([(a, 1024, I), (a + 1024, 4096, A), (a + 5120, 512, I), (a + 5632, 512, A)], 1)),
            Case(([(a, 1024, P), (a + 1024, 4096, A), (a + 5120, 512, P)], 1)),
            Case(([(a, 1024, I), (a + 1024, 4096, P), (a + 5120, 512, I)], 1)),
            Case(([(a, 1024, A), (a + 1024, 4096, I)], 1)),
            Case(([(a, 1024, A), (a + 1024, 4096, I)], -1)),
            Case(([(a, 1024, I), (a + 1024, 4096, A)], -1)),
            Case(([(a, 1024, A), (a + 1024, 4096, A)], 2)),
            Case((many, 299)),
            Case((_fresh_states([(a, 1024, I), (a + 1024, 4096, A), (a + 5120, 512, I)]), 1)),
            Case((_fresh_states([(a, 1024, A), (a + 1024, 4096, I)]), 1)),
        ]
        return deliberate + draw(cases_from(case, _segment()), 110)

    def expected(self, case):
        blocks, index = case.args
        if not 0 <= index < len(blocks):
            return Raises(("IndexError",), "the index is outside the list")
        if blocks[index][2] == INACTIVE:
            return Raises(("ValueError",), "the block is already free (a double free)")
        return ref_merge(blocks, index)

    def compare(self, case, got, expected):
        out, inputs = _keeping(got)
        return same_value(_tuples(out), expected) or _inputs_problem(case, inputs, ("blocks",))

    def diagnose(self, case, got, expected):
        blocks, index = case.args
        if isinstance(expected, Raises):
            if "IndexError" in expected.types:
                return ("an index outside 0 <= index < len(blocks) must raise IndexError (Python would read "
                        "blocks[-1] as the last block).")
            return "freeing an inactive block is a double free: raise ValueError."
        got, inputs = _keeping(got)
        got = _tuples(got)
        if got == expected:
            return "build a new list: the caller's list of blocks must stay as it was." if inputs else None
        if not isinstance(got, list):
            return None
        address, size, _ = blocks[index]
        prev = blocks[index - 1] if index > 0 else None
        nxt = blocks[index + 1] if index + 1 < len(blocks) else None
        free = INACTIVE
        mistakes = []
        if nxt is not None and nxt[2] == free:  # (with only the block before free, "no merge" is the next mistake's)
            mistakes.append((blocks[:index] + [(address, size, free)] + blocks[index + 1:],
                             "no coalescing: the freed block must absorb its free (inactive) neighbours."))
        if prev is not None and prev[2] == free:
            merged_next = nxt is not None and nxt[2] == free
            tail = blocks[index + 2:] if merged_next else blocks[index + 1:]
            mistakes += [
                (blocks[:index] + [(address, size + (nxt[1] if merged_next else 0), free)] + tail,
                 "merge with the free block BEFORE it too (try_merge_blocks with prev, then next): the merged "
                 "block starts at the previous block's address."),
                (blocks[:index - 1] + [(address, prev[1] + size + (nxt[1] if merged_next else 0), free)] + tail,
                 "when merging with the previous block, the merged block starts at the previous block's address."),
            ]
        if (prev is not None and prev[2] == ACTIVE_PENDING_FREE) or (nxt is not None and nxt[2] == ACTIVE_PENDING_FREE):
            lo = index - 1 if prev is not None and prev[2] != ACTIVE_ALLOCATED else index
            hi = index + 1 if nxt is not None and nxt[2] != ACTIVE_ALLOCATED else index
            mistakes.append((blocks[:lo] + [(blocks[lo][0], sum(b[1] for b in blocks[lo:hi + 1]), free)]
                              + blocks[hi + 1:],
                              "only inactive neighbours merge: a pending-free block is still in use on another "
                              "stream (record_stream) until its events complete."))
        matching = {hint for answer, hint in mistakes if answer == got}
        return matching.pop() if len(matching) == 1 else None


# ---- allocator.release_cached_segments -----------------------------------------------------------------------------------------
def _snapshot_segments(trace) -> list:
    """The segments of the reference model after ``trace``, as lists of (address, size, state)."""
    from ..allocator.trace import replay

    r = replay(trace, 1 << 40)
    return [
        [(b["address"], b["size"], b["state"]) for b in seg["blocks"]]
        for seg in r.allocator.snapshot()["segments"]
    ]


def _release_variant(segments, *, wait: bool = True, merge: bool = True, release_first: bool = False):
    """``release_cached_segments`` with one known mistake: not waiting for pending frees, freeing them
    without merging, or looking for whole free segments before the wait."""
    kept, released = [], 0
    for blocks in segments:
        blocks = list(blocks)
        whole = len(blocks) == 1 and blocks[0][2] == INACTIVE
        if release_first and whole:
            released += blocks[0][1]
            continue
        if wait:
            while any(b[2] == ACTIVE_PENDING_FREE for b in blocks):
                i = next(k for k, b in enumerate(blocks) if b[2] == ACTIVE_PENDING_FREE)
                blocks = ref_merge(blocks, i) if merge else blocks[:i] + [(*blocks[i][:2], INACTIVE)] + blocks[i + 1:]
        if not release_first and len(blocks) == 1 and blocks[0][2] == INACTIVE:
            released += blocks[0][1]
        else:
            kept.append(blocks)
    return kept, released


class ReleaseCachedSegments(Exercise):
    """Expected: the reference ``release_cached_segments`` (c10's ``release_cached_blocks``:
    ``synchronize_and_free_events`` then ``release_block`` of every whole free segment), which the
    tests check against the model's ``empty_cache``."""

    id, entry, points = "allocator.release_cached_segments", "release_cached_segments", 1
    withheld_from_students = ("diagnose",)  # its wrong variants (_release_variant) merge with the reference's ref_merge
    title = "empty_cache: which segments go back to the driver"
    forbid = PLAIN
    probe = KEEPING_INPUTS

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

    boundary_classes = {
        "nothing cached": lambda c, e: c.args[0] == [],
        "a whole free segment": lambda c, e: any(len(b) == 1 and b[0][2] == INACTIVE for b in c.args[0]),
        "a whole segment pending: waited for, then released": lambda c, e: any(
            len(b) == 1 and b[0][2] == ACTIVE_PENDING_FREE for b in c.args[0]),
        "pending blocks that merge into a whole free segment": lambda c, e: any(
            len(b) > 1 and all(x[2] != ACTIVE_ALLOCATED for x in b) and any(x[2] == ACTIVE_PENDING_FREE for x in b)
            for b in c.args[0]),
        "a pending block kept inside a segment with a live block": lambda c, e: any(
            any(x[2] == ACTIVE_ALLOCATED for x in b) and any(x[2] == ACTIVE_PENDING_FREE for x in b)
            for b in c.args[0]),
        "a segment with a live block and a free tail (kept)": lambda c, e: any(
            b[0][2] == ACTIVE_ALLOCATED and b[-1][2] == INACTIVE for b in c.args[0]),
        "a segment of more than 256 blocks with pending ones": lambda c, e: any(
            len(b) > 256 and any(x[2] == ACTIVE_PENDING_FREE for x in b) for b in c.args[0]),
        "states that are equal strings, not the same objects": lambda c, e: any(
            _is_fresh(x[2]) for b in c.args[0] for x in b),
        "segments from a real replay": lambda c, e: any(len(b) > 3 for b in c.args[0]),
    }

    def hidden_cases(self):
        from ..allocator.workloads import random_trace

        A, P, I = ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, INACTIVE
        a, b = BASE, BASE + 20 * MiB
        deliberate = [
            [],
            [[(a, 2 * MiB, P)]],
            [[(a, 1 * MiB, P), (a + 1 * MiB, 512 * KiB, I), (a + 1536 * KiB, 512 * KiB, P)]],
            [[(a, 1 * MiB, P), (a + 1 * MiB, 1 * MiB, P)], [(b, 20 * MiB, I)]],
            [[(a, 1 * MiB, A), (a + 1 * MiB, 512 * KiB, P), (a + 1536 * KiB, 512 * KiB, I)]],
            [_many_blocks(300, pending_every=7)],
            [_many_blocks(300, pending_every=1)],
            [_fresh_states([(a, 1 * MiB, I), (a + 1 * MiB, 1 * MiB, P)]), _fresh_states([(b, 20 * MiB, I)])],
        ]
        synthetic = draw(st.lists(_segment(), max_size=5), 50)
        traced = [
            _snapshot_segments(random_trace(n, seed=seed, max_size=24 * MiB))
            for n, seed in draw(st.tuples(st.integers(0, 120), st.integers(0, 10**6)), 20)
        ]
        return [Case((segments,)) for segments in deliberate + synthetic + traced]

    def expected(self, case):
        return ref_release(case.args[0])

    def compare(self, case, got, expected):
        out, inputs = _keeping(got)
        out = _tuples(out)
        if not (isinstance(out, tuple) and len(out) == 2):
            return f"expected a pair (kept_segments, released_bytes)\n     got {describe(out)}"
        if out[1] != expected[1]:
            return f"released bytes: expected {_mib(expected[1])}, got {_mib(out[1])}"
        return same_value(out[0], expected[0]) or _inputs_problem(case, inputs, ("segments",))

    def diagnose(self, case, got, expected):
        segments = case.args[0]
        got, inputs = _keeping(got)
        got = _tuples(got)
        if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], int)):
            return None
        if got == expected:
            return "build new lists: the caller's segments must stay as they were." if inputs else None
        mistakes = [
            (_release_variant(segments, wait=False), "empty_cache first waits for every pending free "
             "(synchronize_and_free_events) and frees those blocks before it looks for whole free segments."),
            (_release_variant(segments, merge=False), "a pending block that is freed merges with its free "
             "neighbours (merge_free_neighbours), like any other free: otherwise its segment never becomes one "
             "free block."),
            (_release_variant(segments, release_first=True), "wait for the pending frees first, then look for "
             "whole free segments: a segment may become entirely free by the wait."),
        ]
        matching = {hint for answer, hint in mistakes if _tuples(answer) == got}
        if len(matching) == 1:
            return matching.pop()
        if got[1] > expected[1] and not matching:
            kept_live = [b for b in expected[0] if any(x[2] == ACTIVE_ALLOCATED for x in b)]
            if kept_live and got[1] - expected[1] <= sum(x[1] for b in kept_live for x in b if x[2] == INACTIVE):
                return ("cudaFree returns whole segments only: a segment goes back only when it is ONE inactive "
                        "block; free blocks inside a segment with a live block stay reserved.")
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


def _stat_before(expected, i) -> tuple:
    """(current, peak, allocated, freed) before op ``i`` of a Stat run (a refused op changes nothing)."""
    return next((r for r in reversed(expected[:i]) if r[0] != "raised"), (0, 0, 0, 0))


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

    boundary_classes = {
        "no operation at all": lambda c, e: c.args[0] == [],
        "one operation": lambda c, e: len(c.args[0]) == 1,
        "a decrease of exactly current (down to 0: allowed)": lambda c, e: any(
            op[0] == "decrease" and op[1] > 0 and op[1] == _stat_before(e, i)[0] for i, op in enumerate(c.args[0])),
        "a decrease of current + 1 (ValueError)": lambda c, e: any(
            op[0] == "decrease" and op[1] == _stat_before(e, i)[0] + 1 for i, op in enumerate(c.args[0])),
        "an increase and a decrease of 0": lambda c, e: ("increase", 0) in c.args[0] and ("decrease", 0) in c.args[0],
        "reset_peak while current == peak": lambda c, e: any(
            op[0] == "reset_peak" and i and _stat_before(e, i)[0] == _stat_before(e, i)[1]
            for i, op in enumerate(c.args[0])),
        "reset_peak below the peak, then an increase that stays below the old peak": lambda c, e: any(
            op[0] == "reset_peak" and nxt[0] == "increase"
            and _stat_before(e, i)[0] < _stat_before(e, i + 2)[0] < _stat_before(e, i)[1]
            for i, (op, nxt) in enumerate(zip(c.args[0], c.args[0][1:], strict=False))),
        "a reset before any increase": lambda c, e: bool(c.args[0]) and c.args[0][0][0].startswith("reset"),
        "amounts past 256": lambda c, e: any(len(op) > 1 and _large(op[1]) for op in c.args[0]),
        "an operation after a refused decrease": lambda c, e: any(r[0] == "raised" for r in e[:-1]),
    }

    def hidden_cases(self):
        deliberate = [
            [],
            [("decrease", 0)],
            [("reset_peak",), ("increase", 7)],
            [("increase", 5), ("decrease", 5), ("decrease", 0), ("increase", 0)],
            [("increase", 5), ("decrease", 6), ("increase", 1)],
            [("increase", 300), ("increase", 300), ("decrease", 300), ("reset_peak",), ("increase", 100)],
            [("increase", 10), ("reset_peak",), ("reset_accumulated",), ("decrease", 10), ("decrease", 1)],
            [("reset_accumulated",), ("increase", 1000), ("decrease", 999), ("reset_peak",), ("increase", 998)],
        ]
        return [Case((ops,)) for ops in deliberate + draw(st.lists(_OP, max_size=14), 50)]

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
            if op == "reset_peak" and g[1] != e[1] and g[1] == 0:
                return (
                    "reset_peak sets the peak to the CURRENT value (not 0): what is live now is the "
                    "new baseline."
                )
            if op == "reset_accumulated" and (g[0], g[1]) != (e[0], e[1]):
                return "reset_accumulated zeroes allocated and freed only; current and peak stay."
            if op == "decrease" and g[1] < e[1]:
                return "a decrease never lowers the peak: the peak is the highest current value seen."
            if op == "decrease" and g[2] == e[2] - ops[i][1] and g[3] == e[3] - ops[i][1]:
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


def _variant_params(trace) -> tuple[int, int, int, int]:
    """(steps, first scratch size, scratch growth per step, first kept size) of a fragmenting trace."""
    allocs = [e for e in trace if e[0] == "alloc"]
    scratch = [e[2] for e in allocs if str(e[1]).startswith("scratch")]
    keeps = [e[2] for e in allocs if str(e[1]).startswith("keep")]
    return len(scratch), scratch[0], (scratch[1] - scratch[0]) if len(scratch) > 1 else 0, keeps[0]


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
    # The check replays the answer through the reference allocator (many fixes are right), so the student
    # edition cannot judge it: its check says so, and the grader judges it.
    withheld_from_students = ("compare", "diagnose")

    def visible_cases(self):
        return [Case((fragmenting_trace(),), label="fragmenting_trace(): runs out of memory on a 1 GiB GPU")]

    boundary_classes = {
        "the fewest steps (8)": lambda c, e: _variant_params(c.args[0])[0] == 8,
        "the most steps (13)": lambda c, e: _variant_params(c.args[0])[0] == 13,
        "scratch buffers that grow by only 4 MiB a step": lambda c, e: _variant_params(c.args[0])[2] == 4 * MiB,
        "a first scratch buffer below 64 MiB": lambda c, e: _variant_params(c.args[0])[1] < 64 * MiB,
        "kept tensors that are not a multiple of 2 MiB": lambda c, e: _variant_params(c.args[0])[3] % (2 * MiB) != 0,
        "event kinds that are equal strings, not the same objects": lambda c, e: any(
            _is_fresh(ev[0]) for ev in c.args[0]),
    }

    def hidden_cases(self):
        variants = _fragmenting_variants()[1:]
        fresh = [tuple([_fresh(e[0]), *e[1:]]) for e in variants[0]]
        return ([Case((t,), label="a variant: other step count and sizes") for t in variants]
                + [Case((fresh,), label="a variant whose strings arrive as new objects, as the sandbox decodes them")])

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
        except (ValueError, TypeError) as e:
            return None, f"alloc_conf {conf!r} is not a valid PYTORCH_CUDA_ALLOC_CONF: {e}"
        if config.expandable_segments:
            return None, ("alloc_conf: expandable_segments:True does fix this trace (the cell after this exercise "
                          "shows it), but this exercise asks for a fix of the allocations themselves or with "
                          "max_split_size_mb: leave expandable_segments out")
        try:
            report = check_fragmentation_fix(
                list(trace) if isinstance(trace, (list, tuple)) else trace,
                original=case.args[0],
                config=config,
            )
        except (ValueError, TypeError) as e:
            return None, f"the fixed trace is not a valid trace: {e}"
        return (report, config), None

    def compare(self, case, got, expected):
        checked, problem = self._check(case, got)
        if problem:
            return problem
        report, _ = checked
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
        checked, problem = self._check(case, got)
        if problem or checked is None:
            return None
        report, config = checked
        original = [tuple(e) for e in case.args[0]]
        trace, conf = _tuples(got)
        trace = [tuple(e) for e in trace]
        if report["problems"]:
            if all("stay live" in p for p in report["problems"]):
                return "every keep{k} is a result the program keeps: it must stay alive to the end (no free)."
            if all("no scratch buffer" in p for p in report["problems"]):
                return ("every step needs its scratch memory: give each scratch{k} of the original a scratch buffer "
                        "at least as big, on the same stream.")
            return None
        if trace == original and not conf:
            return "you returned the trace unchanged with no allocator setting."
        if [e for e in trace if e[0] != "empty_cache"] == original and not conf and report["oom_event"] is not None:
            return (
                "an empty_cache() changes nothing here: the OOM path already released every cached segment "
                "that was entirely free (release_cached_blocks). The space is stuck inside segments that each "
                "hold a kept tensor."
            )
        scratch = [e[2] for e in original if e[0] == "alloc" and str(e[1]).startswith("scratch")]
        if trace == original and config.max_split_size > ref_round_size(min(scratch)):
            return (
                "with max_split_size_mb, blocks of that size or more are never split, so the kept tensors cannot "
                "pin a scratch segment; the scratch buffers must be oversize (max_split_size <= the smallest "
                "scratch size), and PyTorch's minimum is 20 MiB."
            )
        oom = report["oom_numbers"]
        if oom is None:
            return None
        if oom["allocated_bytes"] + oom["alloc_size"] > FRAGMENTATION_CAPACITY:
            return ("the live tensors alone do not fit at the OOM (allocated + this request > 1 GiB): something "
                    "stays allocated that the original frees.")
        if oom["reserved_bytes"] - oom["allocated_bytes"] >= oom["alloc_size"]:
            return (
                "at the OOM, more memory is reserved but unallocated than the request needs: fragmentation. Look "
                "at the segment map: each kept tensor is carved out of a freed scratch segment, and its free tail "
                "is too small for the next, bigger scratch buffer. Change the order of allocations, or reuse one "
                "preallocated scratch buffer."
            )
        return None


# ---- allocator.memory_timeline -----------------------------------------------------------------------------------------
def _replay_timeline(trace, allocator=None) -> list:
    from ..allocator.trace import replay

    if allocator is None:
        r = replay(trace, 1 << 50)  # an ample GPU: the question is the peak, not an OOM
    else:
        r = replay(trace, allocator=allocator)
    return list(zip(r.allocated_bytes, r.active_bytes, r.reserved_bytes, strict=False))


def _mistaken_models():
    """The reference model with one known mistake each (a subclass overriding one method), and the
    likely cause to name when a student's timeline matches that model's up to the first difference."""
    from ..allocator.allocator import CachingAllocator

    class NoMerge(CachingAllocator):  # a freed block becomes free where it is, never merged
        def _try_merge_blocks(self, dst, src, pool):
            return 0

    class IgnoresStreams(CachingAllocator):  # best fit over the free blocks of every stream
        def _get_free_block(self, pool, size, stream):
            fitting = [b for b in pool if b.size >= size]
            block = min(fitting, key=lambda b: (b.size, b.ptr), default=None)
            if block is not None:
                pool.remove(block)
            return block

    class IgnoresRecordStream(CachingAllocator):  # a block used on another stream is freed at once
        def record_stream(self, block, stream):
            return None

    class EmptyCacheDoesNotWait(CachingAllocator):  # empty_cache frees only the pending blocks already done
        def empty_cache(self):
            self.process_events()
            for pool in (self.large_blocks, self.small_blocks):
                for block in pool:
                    if block.prev is None and block.next is None:
                        self._release_block(block)

    class FreesPendingAtSync(CachingAllocator):  # pending blocks return at the sync, not at the next malloc
        def sync(self, stream):
            super().sync(stream)
            self.process_events()

    return [
        (NoMerge, "a freed block must merge with its free (inactive) neighbours (merge_free_neighbours): "
                  "without coalescing, a segment cut into pieces never serves a big request again."),
        (IgnoresStreams, "a cached block serves only requests of the stream it was allocated on: best fit "
                         "among the free blocks of the requesting stream, never a block of another stream."),
        (IgnoresRecordStream, "a block used on another stream (record_stream) stays pending, and active, "
                              "after its free until that stream syncs: it cannot be reused before."),
        (EmptyCacheDoesNotWait, "empty_cache first frees every pending block (it synchronizes every stream), "
                                "then cudaFrees the segments that are one inactive block."),
        (FreesPendingAtSync, "a 'sync' event changes no statistic by itself: pending blocks return to the pool "
                             "at the start of the next malloc (process_events), not at the sync."),
    ]


def _observing_model():
    """The reference model, noting the boundary classes a replay passes through."""
    from ..allocator.allocator import CachingAllocator

    class Observed(CachingAllocator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.facts: set[str] = set()
            self._freeing = ""

        def _get_free_block(self, pool, size, stream):
            block = super()._get_free_block(pool, size, stream)
            if block is not None:
                if block.size == size:
                    self.facts.add("exact fit")
                if any(b.stream == stream and b.size == block.size for b in pool):
                    self.facts.add("tie")
            return block

        def _alloc_found_block(self, block, size, orig_size, stream, split):
            tail, large = block.size - size, not block.pool.is_small
            if large and tail in (kSmallSize - kMinBlockSize, kSmallSize, kSmallSize + kMinBlockSize):
                self.facts.add(f"large tail {tail}")
            if not large and split and tail == kMinBlockSize:
                self.facts.add("small tail 512")
            if size in (kMinLargeAlloc - kMinBlockSize, kMinLargeAlloc):
                self.facts.add(f"block {size}")
            return super()._alloc_found_block(block, size, orig_size, stream, split)

        def _free_block(self, block):
            def free(b):
                return b is not None and not b.allocated and b.event_count == 0 and not b.stream_uses

            if free(block.prev) and free(block.next):
                self.facts.add("merge both")
            if self._freeing:
                self.facts.add(self._freeing)
            super()._free_block(block)

        def process_events(self):
            self._freeing = "pending returned at a malloc"
            try:
                super().process_events()
            finally:
                self._freeing = ""

        def _synchronize_and_free_events(self):
            self._freeing = "pending freed by empty_cache"
            try:
                super()._synchronize_and_free_events()
            finally:
                self._freeing = ""

        def empty_cache(self):
            super().empty_cache()
            if any(len(seg) > 1 for seg in self.segments()):
                self.facts.add("empty_cache keeps a split segment")

    return Observed


_FACTS: dict[int, tuple] = {}


def _timeline_facts(trace) -> set[str]:
    """What a replay of ``trace`` goes through (for ``MemoryTimeline.boundary_classes``), memoized."""
    from ..allocator.trace import replay

    key = id(trace)
    if key not in _FACTS or _FACTS[key][0] is not trace:
        model = _observing_model()(1 << 50)
        replay(trace, allocator=model)
        _FACTS[key] = (trace, model.facts)
    return _FACTS[key][1]


def _own_stream_record(trace) -> bool:
    """A record_stream on the stream the block was allocated on (which changes nothing)."""
    streams = {}
    for e in trace:
        if e[0] == "alloc":
            streams[e[1]] = e[3]
        elif e[0] == "record_stream" and streams.get(e[1]) == e[2]:
            return True
    return False


def _tail_tie_trace(first: int, second: int) -> list[tuple]:
    """Two segments whose split-off tails have the same size (2 MiB - 512 B); a 1.25 MiB request takes the
    one at the lower address (the first segment's), and empty_cache then releases the second segment."""
    return [("alloc", "p", first, 0), ("alloc", "q", second, 0), ("alloc", "m", 1280 * KiB, 0),
            ("free", "p"), ("free", "q"), ("empty_cache",)]


def _deliberate_traces() -> list[list[tuple]]:
    h = STREAM_HANDLE
    every_kind = [("alloc", "x", 6 * MiB, 1), ("record_stream", "x", 0), ("free", "x"), ("alloc", "y", 6 * MiB, 1),
                  ("sync", 0), ("alloc", "z", 700, 0), ("step", 0), ("free", "y"), ("empty_cache",)]
    return [
        [],
        [("alloc", "a", 512, 0)],
        [("alloc", "z", 0, 0), ("alloc", "a", 100, 0), ("free", "z"), ("free", "a"), ("alloc", "a", 3 * MiB, 0)],
        [("alloc", "a", 1 * MiB, 0), ("alloc", "b", 1 * MiB - 512, 0), ("alloc", "c", 1 * MiB + 1, 0)],
        [("alloc", "a", 19 * MiB, 0), ("alloc", "b", 19 * MiB - 512, 0), ("alloc", "c", 19 * MiB + 512, 0)],
        [("alloc", "a", 10 * MiB, 0), ("alloc", "b", 10 * MiB - 512, 0), ("alloc", "c", 10 * MiB + 1, 0)],
        [("alloc", "p", 4 * MiB, 0), ("alloc", "q", 16 * MiB, 0), ("free", "p"), ("alloc", "r", 4 * MiB, 0),
         ("free", "r"), ("free", "q"), ("empty_cache",)],
        [("alloc", "a", 4 * MiB, 0), ("alloc", "b", 4 * MiB, 0), ("alloc", "c", 4 * MiB, 0), ("alloc", "d", 4 * MiB, 0),
         ("free", "a"), ("free", "c"), ("free", "b"), ("alloc", "e", 8 * MiB, 0), ("empty_cache",)],
        _tail_tie_trace(18 * MiB + 512, 10 * MiB + 512),  # the lower-address tail belongs to the bigger block
        _tail_tie_trace(18 * MiB + 512, 40 * MiB + 512),  # ... to the smaller block
        [("alloc", "x", 6 * MiB, h), ("record_stream", "x", h), ("free", "x"), ("alloc", "y", 6 * MiB, h),
         ("alloc", "w", 6 * MiB, h + 8), ("record_stream", "w", h), ("free", "w"), ("sync", h + 8),
         ("alloc", "v", 512, h), ("sync", h), ("alloc", "u", 512, h)],
        [("alloc", "k", 2 * MiB, 0), ("alloc", "t", 12 * MiB, 0), ("alloc", "s", 300 * KiB, 0), ("free", "t"),
         ("free", "s"), ("empty_cache",), ("empty_cache",)],
        every_kind,
        [tuple([_fresh(e[0]), *e[1:]]) for e in every_kind],
    ]


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
    withheld_from_students = ("diagnose",)  # it replays the trace through the reference model, with known mistakes
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

    boundary_classes = {
        "an empty trace": lambda c, e: c.args[0] == [],
        "one event": lambda c, e: len(c.args[0]) == 1,
        "a 0-byte tensor, and its free": lambda c, e: any(ev[0] == "alloc" and ev[2] == 0 for ev in c.args[0]),
        "an id used again after its free": lambda c, e: any(
            ev[0] == "alloc" and any(f == ("free", ev[1]) for f in c.args[0][:k]) for k, ev in enumerate(c.args[0])),
        "a block of exactly 1 MiB, then 1 MiB + 1 B (the pool boundary)": lambda c, e: (
            ("alloc", 1 * MiB) in {(ev[0], ev[2]) for ev in c.args[0] if len(ev) == 4}
            and ("alloc", 1 * MiB + 1) in {(ev[0], ev[2]) for ev in c.args[0] if len(ev) == 4}),
        "a block of exactly 10 MiB (its own segment)": lambda c, e: f"block {kMinLargeAlloc}" in _timeline_facts(c.args[0]),
        "a block of 10 MiB - 512 B (a shared segment)": lambda c, e: (
            f"block {kMinLargeAlloc - kMinBlockSize}" in _timeline_facts(c.args[0])),
        "a large block whose tail is 1 MiB - 512 B (kept)": lambda c, e: (
            f"large tail {kSmallSize - kMinBlockSize}" in _timeline_facts(c.args[0])),
        "a large block whose tail is exactly 1 MiB (kept)": lambda c, e: (
            f"large tail {kSmallSize}" in _timeline_facts(c.args[0])),
        "a large block whose tail is 1 MiB + 512 B (split off)": lambda c, e: (
            f"large tail {kSmallSize + kMinBlockSize}" in _timeline_facts(c.args[0])),
        "a small block whose tail is exactly 512 B (split off)": lambda c, e: "small tail 512" in _timeline_facts(c.args[0]),
        "an exact fit from the cache": lambda c, e: "exact fit" in _timeline_facts(c.args[0]),
        "a tie between free blocks of one size (the lower address wins)": lambda c, e: "tie" in _timeline_facts(c.args[0]),
        "a free that merges with both neighbours": lambda c, e: "merge both" in _timeline_facts(c.args[0]),
        "a pending block returned at a malloc after its stream synced": lambda c, e: (
            "pending returned at a malloc" in _timeline_facts(c.args[0])),
        "empty_cache waiting for a pending block": lambda c, e: "pending freed by empty_cache" in _timeline_facts(c.args[0]),
        "empty_cache keeping a segment with a live block": lambda c, e: (
            "empty_cache keeps a split segment" in _timeline_facts(c.args[0])),
        "record_stream on the block's own stream (no effect)": lambda c, e: _own_stream_record(c.args[0]),
        "stream handles past 256 (real cudaStream_t values)": lambda c, e: any(
            ev[0] == "alloc" and _large(ev[3]) for ev in c.args[0]),
        "event kinds that are equal strings, not the same objects": lambda c, e: any(
            _is_fresh(ev[0]) for ev in c.args[0]),
    }

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
        return [Case((t,)) for t in _deliberate_traces() + randoms + flushed + trainings]

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
            return "a 0-byte tensor never reaches the allocator: no block, and no pending frees are processed."
        # One known mistake each, replayed by the reference model with that mistake: a hint when exactly one
        # of them gives the student's timeline up to the first difference.
        matching = {hint for model, hint in _mistaken_models()
                    if _replay_timeline(trace, model(1 << 50))[:i + 1] == got[:i + 1]}
        if matching:
            return matching.pop() if len(matching) == 1 else None
        if kind == "alloc":
            rounded, grown, want = ref_round_size(ev[2]), g[0] - before[0], e[0] - before[0]
            if grown == ev[2] != rounded:
                return "the block handed out has the rounded size (round_size: 512 B steps), not the size asked for."
            if not is_small(rounded) and grown == rounded < want:
                return ("should_split keeps a large block's tail of 1 MiB or less inside the block: the whole "
                        "block counts as allocated.")
            if (g[0], g[2]) == (e[0], e[2]) and g[1] != e[1]:
                return ("pending-free blocks return to the pool (active drops) at the start of the next malloc "
                        "after their streams synced (process_events), not earlier and not later.")
        if kind in ("sync", "record_stream", "step") and g != before:
            return f"a {kind!r} event changes no statistic by itself."
        if kind == "empty_cache" and g[2] < e[2]:
            return ("empty_cache cudaFrees only the segments that are one inactive block: a segment with a live "
                    "block stays reserved, however much of it is free.")
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
CHAPTER = Chapter("allocator", EXERCISES, sandbox_files=("allocator/scaffold.py", "allocator/device.py"),
                  student_files=("allocator/config.py",))  # PYTORCH_CUDA_ALLOC_CONF parsing, sizes as text

__all__ = ["CHAPTER", "EXERCISES"]
