"""The strides chapter's graded exercises: cases, expected answers from real torch, and likely causes.

Each exercise's expected answer comes from torch itself (``torch.empty(...).stride()``,
``t.view(...)``, ``t[...]``), never from this package's reference, so the checker is right even if
the reference were wrong. Layouts compare as *equivalent* when they address the same elements: the
stride of a size-1 dim is never used, and an empty tensor addresses nothing.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from ..grading import strategies as S
from ..grading._runtime import TensorInfo
from ..grading.cases import cases_from, draw
from ..grading.compare import close_tensors, describe, same_value
from ..grading.exercise import Case, Chapter, Exercise, Raises
from ..grading.policy import COPIES, Policy

# ---- helpers ------------------------------------------------------------------------------------


def torch_view(shape, strides, offset=0, dtype=torch.float64):
    """A real tensor with exactly this layout, over storage 0, 1, 2, ... (so values are positions)."""
    n = 1 + offset + sum((s - 1) * st for s, st in zip(shape, strides)) if all(shape) else 1
    return torch.arange(max(n, 1), dtype=dtype).as_strided(shape, strides, offset)


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def equivalent_layout(got, expected_shape, expected_strides) -> str | None:
    """``got`` = (shape, strides) must address the same elements as the expected layout."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"expected a pair (shape, strides), got {describe(got)}"
    problem = same_value(tuple(got[0]) if isinstance(got[0], (list, tuple)) else got[0], tuple(expected_shape))
    if problem:
        return "wrong shape: " + problem
    return equivalent_strides(got[1], expected_shape, expected_strides)


def equivalent_strides(got, shape, expected) -> str | None:
    if not isinstance(got, (tuple, list)) or any(isinstance(s, bool) or not isinstance(s, int) for s in got):
        return f"expected strides as a tuple of ints {tuple(expected)}\n     got {describe(got)}"
    if len(got) != len(expected):
        return f"expected {len(expected)} strides {tuple(expected)}\n     got {len(got)}: {tuple(got)}"
    if _numel(shape) == 0:
        return None  # an empty tensor reads no element: any strides describe it
    for d, (g, e, size) in enumerate(zip(got, expected, shape)):
        if size != 1 and g != e:
            return (f"stride of dim {d} (size {size}): expected {e}, got {g}\n"
                    f"  expected strides {tuple(expected)}\n       got strides {tuple(got)}")
    return None


def _junk_size_one_stride(shape, strides) -> bool:
    """A size-1 dim whose stride differs from the one a contiguous layout would give it (any value is
    legal: the stride is never used)."""
    contiguous = torch.empty(shape).stride()
    return any(s == 1 and st != c for s, st, c in zip(shape, strides, contiguous))


def _large(values) -> bool:
    """A value past CPython's small-int cache (-5..256), where ``a is b`` stops meaning ``a == b``."""
    return any(abs(v) > 256 for v in values)


class StridesExercise(Exercise):
    """The strides chapter's exercises run in milliseconds: a short limit keeps hostile code cheap to grade."""

    timeout_s = 10.0


# ---- strides.contiguous_strides ---------------------------------------------------------------------------------------
class ContiguousStrides(StridesExercise):
    id, entry, points = "strides.contiguous_strides", "contiguous_strides", 1
    title = "the strides of a fresh tensor"
    forbid = ("torch", "numpy")

    def visible_cases(self):
        return [Case(((2, 3, 4),), label="a 3-d shape"), Case(((5,),), label="1-d"), Case(((),), label="0-d: no dims"),
                Case(((3, 1, 2),), label="a size-1 dim")]

    boundary_classes = {
        "0-d: no dims": lambda c, e: c.args[0] == (),
        "a size-0 dim with a dim before it (the product counts it as 1)": lambda c, e: 0 in c.args[0][1:],
        "a size-1 dim": lambda c, e: 1 in c.args[0],
        "three or more dims of size > 1": lambda c, e: sum(s > 1 for s in c.args[0]) >= 3,
        "a size > 256": lambda c, e: _large(c.args[0]),
    }

    def hidden_cases(self):
        deliberate = [(3, 0, 2), (0,), (1, 1, 1), (), (4, 0), (0, 5), (2, 300, 3), (257,)]
        return [Case((s,)) for s in deliberate + draw(S.shapes(0, 6), 60)]

    def expected(self, case):
        return tuple(torch.empty(case.args[0]).stride())

    def compare(self, case, got, expected):
        return same_value(tuple(got) if isinstance(got, list) else got, expected)

    def diagnose(self, case, got, expected):
        shape = case.args[0]
        if isinstance(got, (tuple, list)) and len(got) == len(expected):
            if tuple(got) == tuple(reversed(expected)) and len(set(expected)) > 1:
                return "the strides come out reversed: the LAST dim moves fastest and has stride 1."
            if 0 in shape and 0 in got:
                return "a size-0 dim counts as size 1 in the running product: torch.empty(3, 0, 2).stride() == (2, 2, 1)."
            if all(g == e * max(size, 1) for g, e, size in zip(got, expected, shape)):
                return "off by one dim: stride[k] is the product of the sizes AFTER dim k, not from dim k."
        return None


# ---- strides.storage_index ---------------------------------------------------------------------------------------
class StorageIndex(StridesExercise):
    id, entry, points = "strides.storage_index", "storage_index", 1
    title = "where an element lives in storage"
    forbid = ("torch", "numpy")

    def visible_cases(self):
        return [Case(((1, 2), (2, 3), (3, 1), 0), label="row 1, column 2 of a contiguous 2x3"),
                Case(((1, 2), (2, 3), (1, 2), 0), label="the same index in a transposed layout"),
                Case(((0, 0), (2, 3), (3, 1), 5), label="a view that starts at storage offset 5"),
                Case(((-1, -1), (2, 3), (3, 1), 0), label="negative indices count from the end"),
                Case(((2, 0), (2, 3), (3, 1), 0), label="index 2 is out of range for a dim of size 2")]

    boundary_classes = {
        "0-d: the empty index": lambda c, e: c.args[1] == (),
        "a negative index": lambda c, e: any(i < 0 for i in c.args[0]),
        "index == size - 1 (the last element)": lambda c, e: any(0 < s == i + 1 for i, s in zip(*c.args[:2])),
        "index == size (one past the end)": lambda c, e: any(i == s for i, s in zip(*c.args[:2])),
        "index == -size (the first element, from the end)": lambda c, e: any(0 < s == -i for i, s in zip(*c.args[:2])),
        "index == -size - 1 (one before the start)": lambda c, e: any(i == -s - 1 for i, s in zip(*c.args[:2])),
        "a size-0 dim (no index is valid)": lambda c, e: 0 in c.args[1],
        "a storage offset > 0": lambda c, e: c.args[3] > 0,
        "stride 0 (an expanded dim)": lambda c, e: any(st == 0 and s > 1 for s, st in zip(*c.args[1:3])),
        "more index entries than dims": lambda c, e: len(c.args[0]) > len(c.args[1]),
        "fewer index entries than dims": lambda c, e: len(c.args[0]) < len(c.args[1]),
        "a stride > 256": lambda c, e: _large(c.args[2]),
    }

    def hidden_cases(self):
        def case(data, layout):
            shape, strides, offset = layout
            index = tuple(data(st.integers(-s - 1, s)) if s else data(st.integers(-1, 1)) for s in shape)
            return Case((index, shape, strides, offset))

        deliberate = [((2, 3), (3, 4), (4, 1), 2), ((-3, -4), (3, 4), (4, 1), 2), ((3, 0), (3, 4), (4, 1), 2),
                      ((0, -5), (3, 4), (4, 1), 2), ((), (), (), 7), ((0,), (0,), (1,), 0), ((1, 2), (3, 4), (0, 1), 0),
                      ((1, 299), (400, 300), (300, 1), 1000), ((1, 2, 0), (2, 3), (3, 1), 0), ((1,), (2, 3), (3, 1), 0)]
        return [Case(args) for args in deliberate] + draw(cases_from(case, S.layouts(0, 4)), 80)

    def expected(self, case):
        index, shape, strides, offset = case.args
        if len(index) != len(shape):
            return Raises(("IndexError",), "an index needs one entry per dim")
        if any(not -s <= i < s for i, s in zip(index, shape)):
            return Raises(("IndexError",), "an index outside its dim")
        return int(torch_view(shape, strides, offset)[tuple(index)].item())

    def diagnose(self, case, got, expected):
        index, shape, strides, offset = case.args
        if isinstance(got, int) and isinstance(expected, int):
            if offset and got == expected - offset:
                return "the storage offset is missing: a view may start part-way into its storage."
            if any(i < 0 for i in index) and got == offset + sum(i * st for i, st in zip(index, strides)):
                return "negative indices count from the end of their dim: wrap them with i % size first."
        if isinstance(expected, Raises) and isinstance(got, int):
            if len(index) != len(shape):
                return (f"an index needs exactly one entry per dim: this one has {len(index)} for {len(shape)} dims, "
                        "which must raise IndexError (zip() would quietly drop or ignore entries).")
            return "an out-of-range index must raise IndexError, not read someone else's element."
        return None


# ---- strides.is_contiguous ---------------------------------------------------------------------------------------
class IsContiguous(StridesExercise):
    id, entry, points = "strides.is_contiguous", "is_contiguous", 1
    title = "PyTorch's contiguity rule"
    forbid = ("torch", "numpy")

    def visible_cases(self):
        return [Case(((2, 3), (3, 1)), label="contiguous"), Case(((2, 3), (1, 2)), label="transposed"),
                Case(((2, 1, 3), (3, 100, 1)), label="a size-1 dim with a junk stride"),
                Case(((2, 0, 3), (7, 7, 7)), label="no elements at all"),
                Case(((4,), (2,)), label="every other element")]

    boundary_classes = {
        "0-d": lambda c, e: c.args[0] == (),
        "no elements": lambda c, e: 0 in c.args[0],
        "contiguous but for a size-1 dim's junk stride": lambda c, e: e and _junk_size_one_stride(*c.args),
        "contiguous, three or more dims of size > 1": lambda c, e: e and sum(s > 1 for s in c.args[0]) >= 3,
        "contiguous, a stride > 256": lambda c, e: e and _large(c.args[1]),
        "one stride off from contiguous": lambda c, e: not e and sum(
            s > 1 and st != want for s, st, want in zip(*c.args, torch.empty(c.args[0]).stride())) == 1,
        "stride 0 on a dim of size > 1": lambda c, e: any(st == 0 and s > 1 for s, st in zip(*c.args)),
    }

    def hidden_cases(self):
        def near_contiguous(data, shape):  # contiguous, or one dim's stride nudged by one
            strides = list(S.contiguous_strides(shape))
            big = [d for d, s in enumerate(shape) if s > 1]
            if big and data(st.booleans()):
                strides[data(st.sampled_from(big))] += data(st.sampled_from([-1, 1]))
            return Case((shape, tuple(strides)))

        deliberate = [((2, 300), (300, 1)), ((3, 300, 2), (600, 2, 1)), ((2, 1, 300), (300, 7, 1)),
                      ((2, 300), (1, 2)), ((4, 3, 2), (6, 2, 1)), ((4, 3, 2), (7, 2, 1))]
        return ([Case(args) for args in deliberate] + draw(cases_from(near_contiguous, S.shapes(0, 5)), 40)
                + [Case(layout[:2]) for layout in draw(S.layouts(0, 5), 120)])

    def expected(self, case):
        shape, strides = case.args
        return torch_view(shape, strides).is_contiguous()

    def diagnose(self, case, got, expected):
        shape, strides = case.args
        if expected is True and got is False:
            if 0 in shape:
                return "a tensor with no elements is always contiguous."
            if _junk_size_one_stride(shape, strides):
                return "size-1 dims must be skipped: their stride is never used, so any value is contiguous."
        if expected is False and got is True and any(st == 0 and s > 1 for s, st in zip(shape, strides)):
            return "stride 0 (an expanded dim) repeats one element: that is not contiguous unless the size is 1."
        return None


# ---- strides.view_strides ---------------------------------------------------------------------------------------
class ViewStrides(StridesExercise):
    id, entry, points = "strides.view_strides", "view_strides", 3
    title = "view: strides for a new shape, or None"
    forbid = ("torch", "numpy")

    def visible_cases(self):
        return [Case(((2, 3, 4), (12, 4, 1), (6, 4)), label="contiguous: merge the first two dims"),
                Case(((4, 2, 3), (1, 12, 4), (4, 6)), label="permuted, but dims 1 and 2 are still contiguous together"),
                Case(((2, 3), (1, 2), (6,)), label="transposed: no view flattens it"),
                Case(((2, 1, 3), (3, 99, 1), (6,)), label="a size-1 dim never breaks contiguity"),
                Case(((6,), (1,), (2, 1, 3)), label="insert a size-1 dim"),
                Case(((3, 0), (1, 1), (0, 5)), label="an empty tensor views as any empty shape")]

    boundary_classes = {
        "0-d input": lambda c, e: c.args[0] == (),
        "no elements": lambda c, e: 0 in c.args[0],
        "no view exists": lambda c, e: e is None,
        "a view of a non-contiguous tensor": lambda c, e: e is not None and not torch_view(*c.args[:2]).is_contiguous(),
        "a size-1 dim with a junk stride": lambda c, e: 0 not in c.args[0] and _junk_size_one_stride(*c.args[:2]),
        "new size-1 dims": lambda c, e: c.args[2].count(1) > c.args[0].count(1),
        "four dims, the inner ones merged": lambda c, e: len(c.args[0]) == 4 and len(c.args[2]) < 4,
        "a chunk of > 256 elements, then another chunk": lambda c, e: any(  # dim d-1 does not continue dim d
            s > 256 and d > 0 and c.args[1][d - 1] != s * st for d, (s, st) in enumerate(zip(*c.args[:2]))),
        "a stride > 256": lambda c, e: _large(c.args[1]),
    }

    def hidden_cases(self):
        def case(data, layout):
            shape, strides, _ = layout
            new = data(S.factorizations(_numel(shape)).filter(lambda s: -1 not in s))
            return Case((shape, strides, new))

        deliberate = [((), (), ()), ((), (), (1, 1)), ((2, 3, 4, 5), (60, 20, 5, 1), (2, 3, 20)),
                      ((2, 3, 4, 5), (60, 1, 15, 3), (2, 12, 5)), ((2, 3, 4, 5), (60, 20, 5, 1), (6, 20)),
                      ((2, 300), (300, 1), (600,)), ((300, 2), (1, 300), (600,)), ((2, 1, 300), (300, 5, 1), (600,)),
                      ((2, 3, 300), (900, 300, 1), (6, 300)), ((3, 300), (300, 1), (3, 1, 300)),
                      ((3, 300), (1, 3), (3, 300))]  # a chunk of 300 elements, then another chunk
        return ([Case(args) for args in deliberate] + draw(cases_from(case, S.layouts(1, 4)), 150)
                + draw(cases_from(case, S.layouts(4, 4)), 30))

    def expected(self, case):
        shape, strides, new_shape = case.args
        try:
            return tuple(torch_view(shape, strides).view(new_shape).stride())
        except RuntimeError:
            return None

    def compare(self, case, got, expected):
        if expected is None or got is None:
            return same_value(got, expected)
        return equivalent_strides(got, case.args[2], expected)

    def diagnose(self, case, got, expected):
        shape, strides, _ = case.args
        if expected is not None and got is None and _junk_size_one_stride(shape, strides):
            return ("you said no view exists, but one does: size-1 dims never end a contiguous chunk, "
                    "whatever their stride (computeStride skips them).")
        if expected is None and got is not None:
            return ("you returned strides where torch refuses: a new dim must not straddle two chunks of old dims "
                    "that are not contiguous with each other.")
        return None


# ---- strides.expand_strides ---------------------------------------------------------------------------------------
class ExpandStrides(StridesExercise):
    id, entry, points = "strides.expand_strides", "expand_strides", 2
    title = "broadcasting with stride 0"
    forbid = ("torch", "numpy")

    def visible_cases(self):
        return [Case(((3, 1), (1, 1), (3, 4)), label="a column broadcast across 4 columns"),
                Case(((4,), (1,), (2, 3, 4)), label="new leading dims"),
                Case(((2, 3), (3, 1), (2, 3)), label="already the right shape"),
                Case(((3,), (1,), (4,)), label="3 cannot broadcast to 4")]

    boundary_classes = {
        "0-d input": lambda c, e: c.args[0] == (),
        "new leading dims": lambda c, e: len(c.args[2]) > len(c.args[0]),
        "a size-1 dim grown": lambda c, e: any(s == 1 and t > 1 for s, t in zip(c.args[0][::-1], c.args[2][::-1])),
        "a size-1 dim expanded to 0": lambda c, e: any(s == 1 and t == 0 for s, t in zip(c.args[0][::-1], c.args[2][::-1])),
        "a size > 1 asked to grow (error)": lambda c, e: any(1 < s < t for s, t in zip(c.args[0][::-1], c.args[2][::-1])),
        "a size > 1 asked to shrink (error)": lambda c, e: any(t < s and s > 1 for s, t in zip(c.args[0][::-1], c.args[2][::-1])),
        "fewer target dims than dims (error)": lambda c, e: len(c.args[2]) < len(c.args[0]),
        "a size > 256 kept": lambda c, e: any(s == t > 256 for s, t in zip(c.args[0][::-1], c.args[2][::-1])),
    }

    def hidden_cases(self):
        def case(data, layout):
            shape, strides, _ = layout
            lead = data(st.lists(S.SIZES, max_size=2))
            tail = [data(st.sampled_from([s] + ([0, 2, 3, 5] if s == 1 else [s + 1] + [s - 1] * (s > 1)))) for s in shape]
            return Case((shape, strides, tuple(lead) + tuple(tail)))

        deliberate = [((3, 300), (300, 1), (2, 3, 300)), ((1, 300), (300, 1), (300, 300)), ((3,), (1,), (2,)),
                      ((2, 3), (3, 1), (3,)), ((), (), (4, 1)), ((1,), (1,), (0,))]
        return [Case(args) for args in deliberate] + draw(cases_from(case, S.layouts(0, 3, allow_overlap=False)), 120)

    def expected(self, case):
        shape, strides, target = case.args
        try:
            t = torch_view(shape, strides).expand(target)
        except RuntimeError:
            return Raises(("ValueError",), "the shapes do not broadcast")
        return tuple(t.shape), tuple(t.stride())

    def compare(self, case, got, expected):
        return equivalent_layout(got, *expected)

    def diagnose(self, case, got, expected):
        shape, strides, target = case.args
        if isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(expected, tuple):
            g_strides = got[1]
            if isinstance(g_strides, (tuple, list)) and len(g_strides) == len(expected[1]):
                lead = len(target) - len(shape)
                if any(gs != 0 and es == 0 for gs, es in zip(g_strides[:lead], expected[1][:lead])):
                    return "new leading dims repeat the whole tensor: their stride is 0."
                if any(gs != 0 and es == 0 for gs, es in zip(g_strides[lead:], expected[1][lead:])):
                    return "a size-1 dim that grows must get stride 0, so every index reads the same element."
        return None


# ---- strides.slice_view ---------------------------------------------------------------------------------------
class SliceView(StridesExercise):
    id, entry, points = "strides.slice_view", "slice_view", 2
    title = "slicing with steps, like x[:, a:b:c]"
    forbid = ("torch", "numpy")

    def visible_cases(self):
        return [Case(((4, 6), (6, 1), 0, 1, 1, 5, 2), label="x[:, 1:5:2] of a contiguous 4x6"),
                Case(((4, 6), (6, 1), 0, 0, -2, None, 1), label="x[-2:] (negative start)"),
                Case(((10,), (1,), 3, 0, 2, 100, 3), label="a stop past the end is clamped; offset 3 to start with"),
                Case(((5,), (2,), 0, 0, 4, 2, 1), label="an empty slice (start after stop)")]

    def hidden_cases(self):
        def case(data, layout):
            shape, strides, offset = layout
            d = data(st.integers(0, len(shape) - 1))
            start = data(st.none() | st.integers(-9, 9))
            stop = data(st.none() | st.integers(-9, 9))
            return Case((shape, strides, offset, d, start, stop, data(st.integers(1, 4))))

        deliberate = [((5, 3), (3, 1), 4, 0, 5, None, 1), ((5, 3), (3, 1), 4, 0, -5, None, 2),
                      ((5, 3), (3, 1), 4, 0, -6, 4, 1), ((5, 3), (3, 1), 4, 0, None, -5, 1),
                      ((5, 3), (3, 1), 4, 0, 1, 5, 2), ((5, 3), (3, 1), 4, 1, 2, 3, 3), ((0, 3), (3, 1), 0, 0, 1, 2, 1)]
        return [Case(args) for args in deliberate] + draw(cases_from(case, S.layouts(1, 4)), 150)

    boundary_classes = {
        "start None": lambda c, e: c.args[4] is None,
        "stop None": lambda c, e: c.args[5] is None,
        "a negative start": lambda c, e: c.args[4] is not None and c.args[4] < 0,
        "a negative stop": lambda c, e: c.args[5] is not None and c.args[5] < 0,
        "start == size (empty)": lambda c, e: c.args[4] == c.args[0][c.args[3]],
        "start == -size (the first element)": lambda c, e: c.args[4] is not None and c.args[4] == -c.args[0][c.args[3]],
        "start < -size (clamped to 0)": lambda c, e: c.args[4] is not None and c.args[4] < -c.args[0][c.args[3]],
        "stop == size": lambda c, e: c.args[5] == c.args[0][c.args[3]],
        "stop > size (clamped)": lambda c, e: c.args[5] is not None and c.args[5] > c.args[0][c.args[3]],
        "stop == -size (empty)": lambda c, e: c.args[5] is not None and c.args[5] == -c.args[0][c.args[3]] != 0,
        "an empty result": lambda c, e: e[0][c.args[3]] == 0,
        "a step > 1": lambda c, e: c.args[6] > 1,
        "a storage offset > 0": lambda c, e: c.args[2] > 0,
        "slicing a size-0 dim": lambda c, e: c.args[0][c.args[3]] == 0,
    }

    def expected(self, case):
        shape, strides, offset, dim, start, stop, step = case.args
        index = [slice(None)] * len(shape)
        index[dim] = slice(start, stop, step)
        v = torch_view(shape, strides, offset)[tuple(index)]
        return tuple(v.shape), tuple(v.stride()), v.storage_offset()

    def compare(self, case, got, expected):
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            return f"expected a triple (shape, strides, offset), got {describe(got)}"
        problem = equivalent_layout((got[0], got[1]), expected[0], expected[1])
        if problem:
            return problem
        if _numel(expected[0]) and got[2] != expected[2]:
            return f"wrong storage offset: expected {expected[2]}, got {describe(got[2])}"
        return None

    def diagnose(self, case, got, expected):
        shape, strides, offset, dim, start, stop, step = case.args
        if isinstance(got, (tuple, list)) and len(got) == 3 and isinstance(got[1], (tuple, list)):
            if len(got[1]) > dim and got[1][dim] == strides[dim] and step > 1:
                return "a step of k multiplies the dim's stride by k."
            if offset and got[2] == expected[2] - offset:
                return "the new offset adds start * stride to the view's existing storage offset."
            if isinstance(got[0], (tuple, list)) and len(got[0]) > dim and got[0][dim] > expected[0][dim]:
                return "clamp start and stop to the dim's size, like Python slices (slice.indices does it)."
        return None


# ---- strides.sliding_windows ---------------------------------------------------------------------------------------
class SlidingWindows(StridesExercise):
    id, entry, points = "strides.sliding_windows", "sliding_windows", 2
    title = "sliding windows as a zero-copy view"
    policy = Policy(banned=("unfold", "Unfold", "sliding_window_view", *COPIES),
                    why="build the windows with as_strided from x's strides (unfold is what this exercise builds)")
    probe = "ptinternals.checks.probes.calls:record_torch_calls"
    banned_calls = ("unfold", "clone", "contiguous", "copy_", "stack", "cat")

    def visible_cases(self):
        return [Case((torch.arange(8.0), 3, 1), label="windows of 3 over 0..7"),
                Case((torch.arange(10.0), 4, 3), label="step 3: windows do not overlap fully"),
                Case((torch.arange(12.0).view(3, 4), 2, 2), label="a 2-d tensor: windows along the last dim")]

    boundary_classes = {
        "a window of size 0": lambda c, e: c.args[1] == 0,
        "one window: size == the dim's length": lambda c, e: c.args[1] == c.args[0].shape[-1] > 0,
        "a step larger than the window (gaps)": lambda c, e: c.args[2] > c.args[1] > 0,
        "a non-contiguous input": lambda c, e: not c.args[0].is_contiguous(),
        "an input with a storage offset": lambda c, e: c.args[0].storage_offset() > 0,
        "a size-0 last dim": lambda c, e: c.args[0].shape[-1] == 0,
        "a 3-d input": lambda c, e: c.args[0].dim() == 3,
    }

    def hidden_cases(self):
        def case(data, layout):
            shape, strides, offset = layout
            size = data(st.integers(0, shape[-1]))
            step = data(st.integers(1, 3))
            return Case((torch_view(shape, strides, offset, torch.float32), size, step))

        return draw(cases_from(case, S.layouts(1, 3, allow_zero=True, allow_overlap=False)), 60)

    def expected(self, case):
        x, size, step = case.args
        return x.unfold(-1, size, step)

    def compare(self, case, got, expected):
        if not isinstance(got, dict) or "out" not in got:
            return f"the grader could not read your result: {describe(got)}"
        out = got["out"]
        problem = close_tensors(out, expected)
        if problem:
            return problem
        used = [c for c in got.get("calls", []) if c in self.banned_calls]
        if used:
            return f"used {', '.join(used)}: build the windows with torch.as_strided (or Tensor.as_strided) only"
        if expected.numel() and isinstance(out, TensorInfo) and 0 not in out.shares_storage_with:
            return "the result does not share storage with the input: it is a copy, not a view"
        return None

    def diagnose(self, case, got, expected):
        x, size, step = case.args
        out = got.get("out") if isinstance(got, dict) else None
        if isinstance(out, TensorInfo) and tuple(out.shape) == tuple(expected.shape) and close_tensors(out, expected):
            if x.storage_offset() and out.storage_offset != x.storage_offset():
                return ("the windows start at the wrong element: keep x's storage_offset() (as_strided keeps it "
                        "when you leave the offset out; passing 0 moves the view to the start of the storage).")
            if len(out.stride) and out.stride[-2] != x.stride(-1) * step:
                return "the window-count dim advances by step * x.stride(-1) elements, the window dim by x.stride(-1)."
        return None


# ---- strides.im2col ---------------------------------------------------------------------------------------
class Im2Col(StridesExercise):
    id, entry, points = "strides.im2col", "im2col", 2
    title = "im2col patches as a view, for convolution as a matmul"
    policy = Policy(banned=("unfold", "Unfold", "sliding_window_view", "conv2d", "conv1d", "Conv2d", *COPIES),
                    why="build the patches with as_strided from x's strides (F.unfold is what this exercise builds)")
    probe = "ptinternals.checks.probes.calls:record_torch_calls"
    banned_calls = ("unfold", "clone", "contiguous", "copy_", "stack", "cat", "conv2d")

    def visible_cases(self):
        return [Case((torch.arange(16.0).view(1, 4, 4), (2, 2), 1), label="one 4x4 channel, 2x2 kernel"),
                Case((torch.arange(2 * 5 * 6.0).view(2, 5, 6), (3, 2), 2), label="two channels, 3x2 kernel, stride 2")]

    boundary_classes = {
        "a channels-last image": lambda c, e: c.args[0].stride(0) == 1 < c.args[0].shape[0],
        "an image that is a view with a storage offset": lambda c, e: c.args[0].storage_offset() > 0,
        "one patch: the kernel as large as the image": lambda c, e: tuple(c.args[1]) == tuple(c.args[0].shape[1:]),
        "a stride larger than the kernel (gaps)": lambda c, e: c.args[2] > max(c.args[1]),
        "a 1x1 kernel": lambda c, e: tuple(c.args[1]) == (1, 1),
        "a non-square kernel": lambda c, e: c.args[1][0] != c.args[1][1],
        "one channel": lambda c, e: c.args[0].shape[0] == 1,
    }

    def hidden_cases(self):
        def case(c, h, w, kh, kw, stride, layout):
            x = torch.randn(c, h, w, generator=torch.Generator().manual_seed(c * 100 + h * 10 + w))
            if layout == "channels-last":  # same values, different strides
                x = x.permute(1, 2, 0).contiguous().permute(2, 0, 1)
            elif layout == "cropped":  # a window of a bigger image: a storage offset, rows longer than w
                big = torch.randn(c, h + 1, w + 2, generator=torch.Generator().manual_seed(h * 10 + w))
                x = big[:, 1:, 2:]
            return Case((x, (min(kh, h), min(kw, w)), stride))

        return draw(st.builds(case, st.integers(1, 3), st.integers(1, 7), st.integers(1, 7), st.integers(1, 3),
                              st.integers(1, 3), st.integers(1, 3),
                              st.sampled_from(["contiguous", "channels-last", "cropped"])), 50)

    def expected(self, case):
        x, (kh, kw), stride = case.args
        c, h, w = x.shape
        cols = F.unfold(x[None].contiguous(), (kh, kw), stride=stride)[0]  # (C*kh*kw, Ho*Wo): the copying im2col
        ho, wo = (h - kh) // stride + 1, (w - kw) // stride + 1
        return cols.view(c, kh, kw, ho, wo)

    compare = SlidingWindows.compare

    def diagnose(self, case, got, expected):
        x, (kh, kw), stride = case.args
        out = got.get("out") if isinstance(got, dict) else None
        if isinstance(out, TensorInfo) and tuple(out.shape) == tuple(expected.shape) and close_tensors(out, expected):
            _, h, w = x.shape
            _, sh, sw = x.stride()
            got_strides = tuple(out.stride)
            if not x.is_contiguous() and got_strides == (h * w, w, 1, w * stride, stride):
                return ("read the strides from x.stride(): the image may not be contiguous (channels-last, or cropped "
                        "from a bigger image).")
            if stride > 1 and got_strides[3:] == (sh, sw):
                return ("output position (y, x) starts at row y*stride: its strides are stride * x.stride(1) and "
                        "stride * x.stride(2).")
        return None


EXERCISES = [ContiguousStrides(), StorageIndex(), IsContiguous(), ViewStrides(), ExpandStrides(), SliceView(),
             SlidingWindows(), Im2Col()]
CHAPTER = Chapter("strides", exercises=EXERCISES)
