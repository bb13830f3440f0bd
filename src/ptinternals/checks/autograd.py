"""The autograd chapter's graded exercises: cases, expected answers from real torch autograd, and likely causes.

Every expected answer comes from torch itself: ``Tensor.sum_to_size`` for unbroadcast,
``torch.autograd.grad`` (and aten's own ``tanh_backward``) for the formulas, a ``loss.backward()``
through the same program in real torch for the engine, ``torch.logsumexp``/
``torch.fake_quantize_per_tensor_affine``/``F.silu`` for the Functions (values, gradients, second
derivatives and the bytes torch itself saves), the plain block for checkpointing and the full batch
for gradient accumulation. Never from this package's reference.

The student's code runs sandbox-side through the probes in ``ptinternals.checks.probes.autograd``;
the mini-engine exercises build on the scaffold (``Chapter.sandbox_files``).
"""
from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from ..grading._runtime import Raised, TensorInfo
from ..grading.cases import draw
from ..grading.compare import close_tensors, describe
from ..grading.exercise import Case, Chapter, Exercise, Raises
from ..grading.policy import AUTOGRAD, Policy
from .probes import autograd as P

PROBES = "ptinternals.checks.probes.autograd"
F64 = torch.float64


# ---- helpers ------------------------------------------------------------------------------------
def rand(shape, seed: int, dtype=F64, layout: str = "contiguous", scale: float = 1.0) -> torch.Tensor:
    """Random values of ``shape``; ``layout`` "transposed" or "strided" gives a non-contiguous tensor.

    (No stride-0 "expanded" inputs: the sandbox boundary cannot rebuild overlapping layouts yet.)
    """
    g = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        return (torch.randn(shape[::-1], generator=g, dtype=dtype) * scale).permute(*range(len(shape) - 1, -1, -1))
    if layout == "strided" and len(shape) >= 1:
        return (torch.randn(*shape[:-1], 2 * shape[-1], generator=g, dtype=dtype) * scale)[..., ::2]
    return torch.randn(shape, generator=g, dtype=dtype) * scale


def _values(x):
    """A result's tensor values, from a TensorInfo (sandbox) or a tensor; else None."""
    if isinstance(x, TensorInfo):
        return x.values
    if isinstance(x, torch.Tensor):
        return x
    return None


def _numel(shape) -> int:
    return math.prod(shape)


def _broadcast_ok(shape, target) -> bool:
    try:
        return tuple(torch.broadcast_shapes(tuple(shape), tuple(target))) == tuple(target)
    except RuntimeError:
        return False


@st.composite
def broadcast_pair(draw_, max_dims: int = 4):
    """``(grad_shape, shape)``: ``shape`` broadcasts to ``grad_shape`` (leading dims dropped, dims set to 1)."""
    sizes = st.sampled_from([0, 1, 1, 2, 3, 5])
    full = tuple(draw_(st.lists(sizes, min_size=0, max_size=max_dims)))
    drop = draw_(st.integers(0, len(full)))
    shape = tuple(1 if draw_(st.integers(0, 2)) == 0 else s for s in full[drop:])
    return full, shape


def _grads_problem(got, expected, names) -> str | None:
    """Compare a sequence of gradients with the expected one; the message names the input."""
    if isinstance(got, Raised):
        return f"raised {got.type}: {got.message}"
    if not isinstance(got, (tuple, list)):
        return f"expected a tuple of {len(expected)} gradients (one per input), got {describe(got)}"
    if len(got) != len(expected):
        return f"expected {len(expected)} gradients (one per input: {', '.join(names)}), got {len(got)}"
    for name, g, e in zip(names, got, expected, strict=False):
        if e is None:
            if g is not None:
                return f"gradient for {name}: expected None (no gradient flows there), got {describe(g)}"
            continue
        problem = close_tensors(g, e)
        if problem:
            return f"gradient for {name}: {problem}"
    return None



def _atol(t: torch.Tensor) -> float:
    """float64's absolute tolerance (1e-7), shrunk for data smaller than 1 so that subnormal values still count."""
    top = float(t.abs().max()) if t.numel() else 0.0
    return 1e-7 * min(1.0, top) if top > 0 else 1e-7


def _finite_max(t: torch.Tensor) -> float:
    finite = t[torch.isfinite(t)]
    return float(finite.abs().max()) if finite.numel() else 0.0


def _offset_ratio(t: torch.Tensor) -> float:
    """|mean| / std of the finite values: large for data far from 0 with a small spread."""
    finite = t[torch.isfinite(t)]
    if finite.numel() < 2:
        return 0.0
    return float(finite.mean().abs() / finite.std().clamp_min(1e-300))


# unbroadcast cases: (grad, shape)
def _lead(case) -> int:
    """How many more dims grad has than shape (negative: shape has more)."""
    return case.args[0].dim() - len(case.args[1])


def _aligned(case) -> list:
    """(size in shape, size in grad) pairs, aligned from the right as broadcasting aligns them."""
    return list(zip(tuple(case.args[1])[::-1], tuple(case.args[0].shape)[::-1]))


# formulas cases: (op, grad, *saved)
def _shape_of(saved) -> tuple:
    return tuple(saved.shape) if isinstance(saved, torch.Tensor) else tuple(saved)


def _mm(case, predicate) -> bool:
    return case.args[0] == "matmul" and predicate(case.args[2], case.args[3])


# fake_quantize cases: ([x], (scale, zero_point, quant_min, quant_max), grad_out, [grad_grad])
def _fq_scaled(case) -> torch.Tensor:
    return case.args[0][0] * (1.0 / case.args[1][0])


def _fq_q(case) -> torch.Tensor:
    return torch.round(_fq_scaled(case)) + case.args[1][1]

# ================================================================================================
# autograd.unbroadcast unbroadcast
# ================================================================================================
class Unbroadcast(Exercise):
    id, entry, points = "autograd.unbroadcast", "unbroadcast", 1
    title = "unbroadcast: sum a gradient back to an input's shape"
    policy = Policy(banned=("sum_to_size", *AUTOGRAD), why="sum over the broadcast dims yourself")
    probe = f"{PROBES}:unbroadcast_probe"

    def visible_cases(self):
        return [Case((rand((5, 4, 3), 1), (4, 1)), label="a new leading dim, and a size-1 dim that grew to 3"),
                Case((rand((3, 4), 2), (4,)), label="the bias of a linear layer: (batch, out) -> (out,)"),
                Case((rand((2, 3), 3), (2, 3)), label="no broadcasting: return grad as it is"),
                Case((rand((2, 3), 4), ()), label="a 0-d input broadcast to everything"),
                Case((rand((0, 3), 5), (1, 3)), label="an empty batch: the sum of nothing is 0"),
                Case((rand((2, 3), 6), (4,)), label="(4,) does not broadcast to (2, 3)")]

    boundary_classes = {
        "0-d grad and shape": lambda c, e: c.args[0].dim() == 0 and tuple(c.args[1]) == (),
        "shape (): sum everything": lambda c, e: tuple(c.args[1]) == () and c.args[0].dim() > 0,
        "no broadcasting (shape == grad.shape)": lambda c, e: tuple(c.args[1]) == tuple(c.args[0].shape),
        "new leading dims and a grown size-1 dim together": lambda c, e: _lead(c) > 0 and any(
            s == 1 < g for s, g in _aligned(c)),
        "a size-1 dim that is size 1 in grad too": lambda c, e: any(s == g == 1 for s, g in _aligned(c)),
        "a leading dim of size 1": lambda c, e: 1 in tuple(c.args[0].shape)[:max(_lead(c), 0)],
        "several leading dims": lambda c, e: _lead(c) >= 2 and not isinstance(e, Raises),
        "size 1 in shape, 0 in grad (the sum of nothing is 0)": lambda c, e: any(s == 1 and g == 0 for s, g in _aligned(c)),
        "a size-0 dim in both": lambda c, e: any(s == g == 0 for s, g in _aligned(c)),
        "a non-contiguous grad": lambda c, e: not c.args[0].is_contiguous(),
        "a size > 256 (past CPython's small-int cache)": lambda c, e: any(s > 256 for s in c.args[1]),
        "shape has one more dim than grad (error)": lambda c, e: _lead(c) == -1,
        "shape has two more dims than grad (error)": lambda c, e: _lead(c) <= -2,
        "a size that does not broadcast (error)": lambda c, e: _lead(c) >= 0 and isinstance(e, Raises),
        "size 0 in shape where grad has more (error)": lambda c, e: any(s == 0 < g for s, g in _aligned(c)),
        "values near float64's max": lambda c, e: c.args[0].numel() > 0 and c.args[0].abs().max() > 1e306,
        "subnormal values": lambda c, e: bool(((c.args[0] != 0) & (c.args[0].abs() < 2.2e-308)).any()),
    }

    def hidden_cases(self):
        def case(pair, seed, layout, bad):
            grad_shape, shape = pair
            if bad and shape:
                shape = shape[:-1] + (shape[-1] + 2,)  # a size that cannot broadcast
            return Case((rand(grad_shape, seed, layout=layout), shape))

        top = torch.finfo(F64).max / 8  # four of them still sum to a finite value
        deliberate = [
            Case((rand((), 1), ())), Case((rand((2, 1, 3), 2), (1, 1))), Case((rand((3, 2, 1, 4), 3), (1, 1, 4))),
            Case((rand((1, 4), 4), (4,))), Case((rand((2, 300), 5), (300,))), Case((rand((0, 2), 6), (0, 1))),
            Case((rand((4, 3), 7, layout="transposed"), (4, 3))), Case((rand((3, 5), 8, layout="strided"), (1, 5))),
            Case((rand((3,), 9), (1, 3))), Case((rand((), 10), (1,))), Case((rand((2, 3), 11), (1, 1, 2, 3))),
            Case((rand((2,), 12), (0,))), Case((rand((2, 3), 13), (2, 1))), Case((rand((1, 2, 3), 16), (2, 1))),
            Case(((torch.rand(4, 5, dtype=F64, generator=torch.Generator().manual_seed(14)) * 2 - 1) * top, (1, 5))),
            Case((rand((4, 5), 15) * 1e-310, (5,))),
        ]
        return deliberate + draw(st.builds(case, broadcast_pair(), st.integers(0, 2**16),
                                           st.sampled_from(["contiguous", "contiguous", "transposed", "strided"]),
                                           st.integers(0, 9).map(lambda k: k == 0)), 60)

    def expected(self, case):
        grad, shape = case.args
        if not _broadcast_ok(shape, grad.shape):
            return Raises(("ValueError",), f"{tuple(shape)} does not broadcast to {tuple(grad.shape)}")
        return grad.sum_to_size(shape)

    def compare(self, case, got, expected):
        if not isinstance(got, dict) or "out" not in got:
            return f"the grader could not read your result: {describe(got)}"
        if "sum_to_size" in got.get("calls", []):
            return "used Tensor.sum_to_size: that is the function this exercise asks you to write"
        atol = _atol(case.args[0])
        problem = close_tensors(got["out"], expected, atol=atol)
        if problem:
            return problem
        if isinstance(got.get("variable"), Raised):
            r = got["variable"]
            return (f"works on a torch.Tensor but not on a mini-engine Variable: {r.type}: {r.message}\n"
                    f"  use only what both have: .shape, .sum(dim=..., keepdim=...), .reshape(...)")
        return close_tensors(got.get("variable"), expected, atol=atol)

    def diagnose(self, case, got, expected):
        grad, shape = case.args
        if isinstance(expected, Raises):
            return "unbroadcast only undoes broadcasting: raise ValueError when shape does not broadcast to grad.shape."
        if isinstance(got, Raised):  # unbroadcast itself raised on the tensor
            size = re.search(r"invalid for input of size (\d+)", got.message)
            if size and (int(size.group(1)) > _numel(shape) or (int(size.group(1)) == 0 and any(
                    s == 1 and g == 0 for s, g in _aligned(case)))):
                return ("reshape found more elements than shape holds: every dim that broadcasting added or grew "
                        "must be summed away first (the leading dims, and the dims where shape has 1).")
            return None
        out = _values(got.get("out")) if isinstance(got, dict) else None
        if out is None or close_tensors(out, expected, atol=_atol(grad)) is None:
            return None  # right values: what failed is how (a call, or Variables), which the message says
        if tuple(out.shape) == tuple(grad.shape) != tuple(shape) and close_tensors(out, grad) is None:
            return "nothing was summed: every dim that broadcasting added or grew must be summed away."
        if out.numel() == expected.numel() and tuple(out.shape) != tuple(expected.shape) and close_tensors(
                out.reshape(expected.shape), expected) is None:
            return "right values, wrong shape: reshape the sum to exactly `shape` (keepdim=True keeps size-1 dims)."
        if tuple(out.shape) == tuple(expected.shape) and expected.numel() and close_tensors(
                out.to(F64) * (grad.numel() / expected.numel()), expected.to(F64)) is None:
            return "that is a mean, not a sum: each broadcast copy contributed its full gradient."
        return None

# ================================================================================================
# autograd.formulas backward formulas
# ================================================================================================
FORMULA_OPS = ("add", "mul", "div", "matmul", "exp", "tanh", "sum")
INPUT_NAMES = {"add": ("a", "b"), "mul": ("a", "b"), "div": ("a", "b"), "matmul": ("a", "b"), "exp": ("x",),
               "tanh": ("x",), "sum": ("x",)}


def _positive(t):
    return t.abs() + 0.5


class Formulas(Exercise):
    id, entry, points = "autograd.formulas", "backward_formula", 3
    title = "backward formulas for add, mul, div, matmul, exp, tanh and sum"
    policy = Policy(banned=AUTOGRAD, why="write each backward formula with tensor operations")
    probe = f"{PROBES}:formula_probe"

    def visible_cases(self):
        a41, b3, g43 = rand((4, 1), 1), rand((3,), 2), rand((4, 3), 3)
        x = rand((2, 3), 7)
        return [Case(("add", g43, (4, 1), (3,)), label="add: a (4, 1) + b (3,) broadcast to (4, 3)"),
                Case(("mul", g43, a41, b3), label="mul: a (4, 1) * b (3,) broadcast to (4, 3)"),
                Case(("div", rand((2, 3), 4), rand((2, 3), 5), _positive(rand((3,), 6))), label="div: a (2, 3) / b (3,)"),
                Case(("matmul", rand((2, 4), 8), rand((2, 3), 9), rand((3, 4), 10)), label="matmul: (2, 3) @ (3, 4)"),
                Case(("matmul", rand((4,), 11), rand((3,), 12), rand((3, 4), 13)), label="matmul: a 1-d vector (3,) @ (3, 4)"),
                Case(("exp", rand((2, 3), 14), x.exp()), label="exp saves its result, not its input"),
                Case(("tanh", rand((2, 3), 15), x.tanh()), label="tanh saves its result, not its input"),
                Case(("sum", rand((2, 4), 16), (2, 3, 4), (1,), False), label="sum over dim 1 of a (2, 3, 4), keepdim=False"),
                Case(("sum", rand((), 17), (2, 3), None, False), label="sum of everything")]

    boundary_classes = {
        "add: both operands broadcast": lambda c, e: c.args[0] == "add" and tuple(c.args[2]) != tuple(
            c.args[1].shape) and tuple(c.args[3]) != tuple(c.args[1].shape),
        "a 0-d operand": lambda c, e: c.args[0] in ("add", "mul", "div") and any(
            _shape_of(s) == () for s in c.args[2:]),
        "a size-0 gradient": lambda c, e: c.args[1].numel() == 0,
        "a non-contiguous operand": lambda c, e: any(isinstance(s, torch.Tensor) and not s.is_contiguous()
                                                     for s in c.args[2:]),
        "matmul: 1-d @ 1-d (a 0-d result)": lambda c, e: _mm(c, lambda a, b: a.dim() == b.dim() == 1),
        "matmul: 1-d @ 2-d": lambda c, e: _mm(c, lambda a, b: a.dim() == 1 and b.dim() == 2),
        "matmul: 2-d @ 1-d": lambda c, e: _mm(c, lambda a, b: a.dim() == 2 and b.dim() == 1),
        "matmul: batch dims on one side only": lambda c, e: _mm(c, lambda a, b: (a.dim() > 2) != (b.dim() > 2)),
        "matmul: a size-1 batch dim against a larger one": lambda c, e: _mm(c, lambda a, b: a.dim() > 2 and b.dim() > 2
                                                                            and any(1 in (x, y) and x != y for x, y in zip(
                                                                                a.shape[-3::-1], b.shape[-3::-1]))),
        "matmul: k == 0 (an empty contraction)": lambda c, e: _mm(c, lambda a, b: a.shape[-1] == 0),
        "mul: values near float64's max": lambda c, e: c.args[0] == "mul" and max(
            float(s.abs().max()) for s in c.args[2:] if s.numel()) > 1e300,
        "exp: a result near float64's max": lambda c, e: c.args[0] == "exp" and bool(
            (torch.isfinite(c.args[2]) & (c.args[2] > 1e299)).any()),
        "exp: an infinite result": lambda c, e: c.args[0] == "exp" and bool(torch.isinf(c.args[2]).any()),
        "exp: a result of 0 (exp of -inf)": lambda c, e: c.args[0] == "exp" and bool((c.args[2] == 0).any()),
        "tanh: saturated results (y = +-1)": lambda c, e: c.args[0] == "tanh" and bool((c.args[2].abs() == 1).any()),
        "sum: of everything (dim None)": lambda c, e: c.args[0] == "sum" and c.args[3] is None and len(c.args[2]) > 0,
        "sum: keepdim=True": lambda c, e: c.args[0] == "sum" and c.args[4] and c.args[3] is not None,
        "sum: keepdim=False over a middle dim": lambda c, e: c.args[0] == "sum" and not c.args[4] and any(
            0 < d < len(c.args[2]) - 1 for d in c.args[3] or ()),
        "sum: several dims": lambda c, e: c.args[0] == "sum" and len(c.args[3] or ()) >= 2,
        "sum: a 0-d input": lambda c, e: c.args[0] == "sum" and tuple(c.args[2]) == (),
        "sum: over a size-0 dim": lambda c, e: c.args[0] == "sum" and any(
            c.args[2][d] == 0 for d in (c.args[3] if c.args[3] is not None else range(len(c.args[2])))),
    }

    @staticmethod
    def deliberate():
        top = torch.finfo(F64).max
        return [Case(("add", rand((2, 3), 101), (2, 1), (1, 3))), Case(("add", rand((2, 3), 102), (), (2, 3))),
                Case(("mul", rand((3,), 103), rand((), 104), rand((3,), 105))),
                Case(("mul", rand((0, 3), 106), rand((0, 1), 107), rand((3,), 108))),
                Case(("mul", rand((2, 3), 109), rand((2, 3), 110), rand((2, 3), 111) * (top / 8))),
                Case(("div", rand((2, 3), 112), rand((2, 3), 113), _positive(rand((2, 3), 114, layout="transposed")))),
                Case(("matmul", rand((), 115), rand((3,), 116), rand((3,), 117))),
                Case(("matmul", rand((4,), 118), rand((3,), 119), rand((3, 4), 120))),
                Case(("matmul", rand((2,), 121), rand((2, 3), 122), rand((3,), 123))),
                Case(("matmul", rand((2, 2, 4), 124), rand((2, 2, 3), 125), rand((3, 4), 126))),
                Case(("matmul", rand((5, 2, 4), 127), rand((1, 2, 3), 128), rand((5, 3, 4), 129))),
                Case(("matmul", rand((2, 3), 130), rand((2, 0), 131), rand((0, 3), 132))),
                Case(("exp", rand((5,), 133), torch.tensor([1e300, 1e-300, 1.0, math.inf, 0.0], dtype=F64))),
                Case(("tanh", rand((4,), 134), torch.tensor([1.0, -1.0, 0.0, 0.5], dtype=F64))),
                Case(("sum", rand((1, 1), 135), (2, 3), None, True)), Case(("sum", rand((2, 4), 136), (2, 3, 4), (1,), False)),
                Case(("sum", rand((), 137), (), None, False)), Case(("sum", rand((2,), 138), (2, 0), (1,), False)),
                Case(("sum", rand((3,), 139), (2, 3, 4), (0, 2), False)),
                Case(("sum", rand((2, 1, 4), 140), (2, 3, 4), (1,), True))]

    def hidden_cases(self):
        layouts = st.sampled_from(["contiguous", "contiguous", "transposed", "strided"])

        def binary(op, pair, swap, seed, layout):
            out_shape, shape = pair
            sa, sb = (shape, out_shape) if swap else (out_shape, shape)
            grad = rand(torch.broadcast_shapes(sa, sb), seed)
            if op == "add":
                return Case(("add", grad, sa, sb))
            a, b = rand(sa, seed + 1, layout=layout), rand(sb, seed + 2)
            return Case((op, grad, a, _positive(b) if op == "div" else b))

        def matmul(kind, m, k, n, batch_a, batch_b, seed, layout):
            sa = {"1d": (k,), "2d": (m, k)}.get(kind[0], batch_a + (m, k))
            sb = {"1d": (k,), "2d": (k, n)}.get(kind[1], batch_b + (k, n))
            a, b = rand(sa, seed, layout=layout), rand(sb, seed + 1)
            out = torch.matmul(a, b)
            return Case(("matmul", rand(out.shape, seed + 2), a, b))

        def unary(op, shape, seed, layout):
            x = rand(shape, seed, layout=layout)
            return Case((op, rand(shape, seed + 1), x.exp() if op == "exp" else x.tanh()))

        def reduction(shape, mask, seed, keepdim):
            # dim: None (everything) or a sorted tuple of dims, as the mini engine's sum saves it
            dims = None if not shape or mask == 0 else tuple(d for d in range(len(shape)) if mask >> d & 1) or (0,)
            out = torch.zeros(shape).sum(dim=dims, keepdim=keepdim)
            return Case(("sum", rand(out.shape, seed), tuple(shape), dims, keepdim))

        sizes = st.sampled_from([0, 1, 1, 2, 3, 5])
        shapes = st.lists(sizes, max_size=4).map(tuple)
        batch = st.lists(st.sampled_from([1, 2, 3]), max_size=2).map(tuple)
        cases = []
        for op in ("add", "mul", "div"):
            cases += draw(st.builds(binary, st.just(op), broadcast_pair(), st.booleans(), st.integers(0, 2**16),
                                    layouts), 14)
        cases += draw(st.builds(matmul, st.tuples(st.sampled_from(["1d", "2d", "nd"]), st.sampled_from(["1d", "2d", "nd"])),
                                st.sampled_from([1, 2, 3, 5]), st.sampled_from([0, 1, 3, 4]), st.sampled_from([1, 2, 5]),
                                batch, batch, st.integers(0, 2**16), layouts), 18)
        for op in ("exp", "tanh"):
            cases += draw(st.builds(unary, st.just(op), shapes, st.integers(0, 2**16), layouts), 8)
        cases += draw(st.builds(reduction, shapes, st.integers(0, 15), st.integers(0, 2**16), st.booleans()), 16)
        return self.deliberate() + cases

    def expected(self, case):
        op, grad, *saved = case.args
        if op == "add":
            leaves = [torch.zeros(s, dtype=grad.dtype, requires_grad=True) for s in saved]
            return torch.autograd.grad(leaves[0] + leaves[1], leaves, grad)
        if op in ("mul", "div", "matmul"):
            leaves = [t.detach().clone().requires_grad_(True) for t in saved]
            fn = {"mul": torch.mul, "div": torch.div, "matmul": torch.matmul}[op]
            return torch.autograd.grad(fn(*leaves), leaves, grad)
        if op == "exp":  # ExpBackward0 is grad * result; differentiate exp at log(result)
            x = saved[0].log().requires_grad_(True)
            return torch.autograd.grad(x.exp(), x, grad)
        if op == "tanh":  # aten's own kernel for TanhBackward0: grad * (1 - result^2)
            return (torch.ops.aten.tanh_backward(grad, saved[0]),)
        shape, dims, keepdim = saved
        x = torch.zeros(shape, dtype=grad.dtype, requires_grad=True)
        return torch.autograd.grad(x.sum(dim=dims, keepdim=keepdim), x, grad)

    def compare(self, case, got, expected):
        op = case.args[0]
        if not isinstance(got, dict) or "out" not in got:
            return f"the grader could not read your result: {describe(got)}"
        names = INPUT_NAMES[op]
        problem = _grads_problem(got["out"], expected, names)
        if problem:
            return problem
        var = got.get("variable")
        if isinstance(var, Raised):
            return (f"works on torch.Tensors but not on mini-engine Variables: {var.type}: {var.message}\n"
                    f"  write formulas with operators (+ - * / @ **) and methods both have (.exp() .tanh() "
                    f".sum(dim, keepdim) .reshape() .transpose() .expand()), not torch.xxx(...) functions")
        problem = _grads_problem(var, expected, names)
        return None if problem is None else "on Variables: " + problem

    def diagnose(self, case, got, expected):
        op, grad, *saved = case.args
        if isinstance(got, Raised):  # the formula raised on tensors
            if op == "sum" and not saved[2] and "expand" in got.message:
                return ("with keepdim=False the summed dims are gone from grad: put them back as size 1 (reshape) "
                        "before expand.")
            return None
        out = got.get("out") if isinstance(got, dict) else None
        if isinstance(out, (TensorInfo, torch.Tensor)) and len(expected) == 1:
            return "return a tuple even for one input: (grad_x,) with the trailing comma."
        if not isinstance(out, (tuple, list)) or len(out) != len(expected):
            return None
        if _grads_problem(out, expected, INPUT_NAMES[op]) is None:
            return None  # right on tensors: what failed (Variables) the message says
        vals = [_values(g) for g in out]
        for v, e, name in zip(vals, expected, INPUT_NAMES[op], strict=False):
            if v is None or tuple(v.shape) == tuple(e.shape):
                continue
            if op == "sum":
                return ("the gradient of a sum is grad copied back over the summed dims: re-insert them as size 1 "
                        "(reshape) when keepdim=False, then expand to the input shape.")
            if op == "matmul":
                if v.dim() > e.dim() and tuple(v.shape[v.dim() - e.dim():]) == tuple(e.shape[-2:] if e.dim() >= 2 else ()):
                    return (f"grad_{name} keeps batch dims that {name} does not have: sum the gradient over the batch "
                            f"dims broadcasting added (unbroadcast) back to {name}'s shape.")
                if e.dim() == 1 and v.numel() == e.numel():
                    return (f"{name} is 1-d: it acted as a (1, k) or (k, 1) matrix, so reshape its gradient back to "
                            f"{name}'s shape (k,).")
                return None
            if tuple(v.shape) == tuple(grad.shape):
                return f"the gradient for {name} must have {name}'s shape: sum it back with unbroadcast."
            return None
        if any(v is None for v in vals):
            return None
        if op == "tanh" and close_tensors(vals[0], grad * (1 - torch.tanh(saved[0]) ** 2)) is None:
            return "the node saved tanh's RESULT y, not its input: d tanh = 1 - y * y, no second tanh."
        if op == "exp" and close_tensors(vals[0], grad * torch.exp(saved[0])) is None:
            return "the node saved exp's RESULT e^x, not its input: the derivative is the result itself, grad * result."
        if op == "mul":
            a, b = saved
            try:
                if close_tensors(vals[0], (grad * a).sum_to_size(a.shape)) is None:
                    return "d(a*b)/da is b, not a: each input's gradient is grad times the OTHER input."
            except RuntimeError:
                pass
        if op == "div" and close_tensors(vals[0], expected[0]) is None and close_tensors(vals[1], -expected[1]) is None:
            return "d(a/b)/db = -a/b^2: the sign is wrong (mind the minus)."
        return None
# ================================================================================================
# autograd.backward the engine's backward pass
# ================================================================================================
def _program_case(leaves, requires, program, root_shape, seed, label="", **options):
    return Case((list(leaves), list(requires), list(program), rand(root_shape, seed), dict(options)), label=label)


def random_program(base, n_leaves: int, n_ops: int, seed: int) -> Case:
    """A random graph over leaves of shapes that broadcast to ``base``: ops that reuse values (fan-out),
    a * b.detach(), sums over a dim, leaves without requires_grad, hooks, retain_grad, twice/retain_graph."""
    import random

    rng = random.Random(seed)
    shapes = [tuple(1 if rng.random() < 0.25 else s for s in base[rng.randint(0, len(base)):])
              for _ in range(n_leaves)]
    requires = [rng.random() < 0.8 for _ in range(n_leaves)]
    if not any(requires):
        requires[rng.randrange(n_leaves)] = True
    meta = [(s, r) for s, r in zip(shapes, requires, strict=False)]  # (shape, requires grad in torch)
    program, consumed = [], set()

    def pick():  # half the time one of the 3 newest values: chains; otherwise any value: fan-out
        n = len(meta)
        return rng.randint(max(0, n - 3), n - 1) if rng.random() < 0.5 else rng.randrange(n)

    for _ in range(n_ops):
        op = rng.choice(["add", "mul", "mul", "tanh", "sigmoid", "sum", "mulsg"])
        i = pick()
        if op in ("tanh", "sigmoid"):
            program.append((op, i))
            meta.append(meta[i])
        elif op == "sum":
            if not meta[i][0]:
                continue
            d = rng.randrange(len(meta[i][0]))
            program.append(("sum", i, d))
            meta.append((tuple(1 if k == d else s for k, s in enumerate(meta[i][0])), meta[i][1]))
        else:
            j = pick()
            if op == "mulsg" and not meta[i][1]:
                op = "mul"
            program.append((op, i, j))
            req = meta[i][1] if op == "mulsg" else meta[i][1] or meta[j][1]
            meta.append((tuple(torch.broadcast_shapes(meta[i][0], meta[j][0])), req))
            consumed.add(j)
        consumed.add(i)
    # the root: the sum of every value nothing consumed yet (leaves left out stay unused: grad None)
    sinks = [k for k in range(n_leaves, len(meta)) if k not in consumed] or [len(meta) - 1]
    root = sinks[0]
    for k in sinks[1:]:
        program.append(("add", root, k))
        meta.append((tuple(torch.broadcast_shapes(meta[root][0], meta[k][0])), meta[root][1] or meta[k][1]))
        root = len(meta) - 1
    if not meta[root][1]:  # the root must require grad (torch refuses otherwise)
        first = requires.index(True)
        program.append(("add", root, first))
        meta.append((tuple(torch.broadcast_shapes(meta[root][0], meta[first][0])), True))
        root = len(meta) - 1
    hooked = [k for k, (_, r) in enumerate(meta) if r]
    for _ in range(rng.choice([0, 1, 1, 2])):
        program.append(("hook", rng.choice(hooked), rng.choice([None, 2.0, -0.5])))
    non_leaf = [k for k in hooked if k >= n_leaves]
    if non_leaf and rng.random() < 0.4:
        program.append(("retain", rng.choice(non_leaf)))
    leaves = [rand(s, seed + k) for k, s in enumerate(shapes)]
    options = {"retain_graph": rng.random() < 0.4, "twice": rng.random() < 0.35}
    return _program_case(leaves, requires, program, meta[root][0], seed + 99, **options)


def graph_programs():
    """Hypothesis picks the awkward part (the shape everything broadcasts to, sizes 0 and 1 included)
    and the size; the structure is drawn from a seeded RNG so every graph is a real, varied one."""
    bases = st.sampled_from([(), (3,), (2, 3), (1, 4), (3, 1), (2, 1, 3), (0, 2), (5, 1, 1)])
    return st.builds(random_program, bases, st.integers(1, 4), st.integers(2, 8), st.integers(0, 2**20))


def _structure_problem(got, expected, where="") -> str | None:
    for i, (g, e) in enumerate(zip(got["grads"], expected["grads"], strict=False)):
        if e is None and g is not None:
            return f"{where}leaf {i}: expected .grad None (no gradient reaches it), got {describe(g)}"
        if e is not None and g is None:
            return f"{where}leaf {i}: expected a .grad of shape {tuple(e.shape)}, got None"
        if e is not None:
            problem = close_tensors(g, e)
            if problem:
                return f"{where}.grad of leaf {i}: {problem}"
    for i, (g, e) in enumerate(zip(got["retained"], expected["retained"], strict=False)):
        if (g is None) != (e is None):
            return f"{where}retain_grad value {i}: expected {describe(e)}, got {describe(g)}"
        if e is not None:
            problem = close_tensors(g, e)
            if problem:
                return f"{where}.grad kept by retain_grad(): {problem}"
    for i, (g, e) in enumerate(zip(got["seen"], expected["seen"], strict=False)):
        if len(g) != len(e):
            return f"{where}hook {i} was called {len(g)} time(s); torch calls it {len(e)} time(s)"
        for k, (gg, ee) in enumerate(zip(g, e, strict=False)):
            problem = close_tensors(gg, ee)
            if problem:
                return f"{where}the gradient hook {i} saw (call {k + 1}): {problem}"
    return None


def _ops(program) -> list:
    """The steps of a program that compute a value (not hooks or retain_grad)."""
    return [s for s in program if s[0] not in ("hook", "retain")]


def _operands(step) -> tuple:
    return (step[1],) if step[0] in ("tanh", "sigmoid", "sum") else (step[1], step[2])


def _uses(program) -> dict:
    """``{value index: number of edges that read it}`` (``x * x`` reads x twice)."""
    uses: dict = {}
    for step in _ops(program):
        for i in _operands(step):
            uses[i] = uses.get(i, 0) + 1
    return uses


def _grads_equal(got, expected) -> bool:
    return all((g is None) == (e is None) and (e is None or close_tensors(g, e) is None)
               for g, e in zip(got, expected, strict=True))


def _one_use_only(leaves, requires, program, root_grad, got, expected) -> bool:
    """True when some leaf read by several edges got exactly the gradient ONE of those edges sends it: what an
    engine gives whose buffer keeps the last gradient instead of the sum. Computed with torch, each read of the
    leaf made through a clone of its own (leaves with hooks are left out: a hook sees the sum)."""
    uses = _uses(program)
    hooked = {s[1] for s in program if s[0] == "hook"}
    suspects = [i for i in range(len(leaves)) if uses.get(i, 0) >= 2 and i not in hooked and expected[i] is not None
                and got[i] is not None and close_tensors(got[i], expected[i]) is not None]
    if not suspects or not _ops(program):
        return False
    fns = P._torch_fns()
    reads: dict = {i: [] for i in range(len(leaves))}
    values: list = [None] * len(leaves)

    def read(i):
        if i >= len(leaves):
            return values[i]
        t = leaves[i].detach().clone().requires_grad_(bool(requires[i]))
        reads[i].append(t)
        return t

    for step in program:
        if step[0] == "hook" and step[1] >= len(leaves):
            values[step[1]].register_hook(lambda g, f=step[2]: None if f is None else g * f)
        elif step[0] == "sum":
            values.append(read(step[1]).sum(step[2], keepdim=True))
        elif step[0] not in ("hook", "retain"):
            values.append(fns[step[0]][0](*(read(i) for i in _operands(step))))
    values[-1].backward(root_grad.clone())
    return any(t.grad is not None and close_tensors(got[i], t.grad) is None for i in suspects for t in reads[i])


class Backward(Exercise):
    id, entry, points = "autograd.backward", "backward", 3
    title = "the engine: a dependency-counted backward pass with accumulation and hooks"
    probe = f"{PROBES}:engine_probe"

    def visible_cases(self):
        a, b = rand((3,), 1), rand((3,), 2)
        x, m, c = rand((2, 3), 3), rand((2, 1), 4), rand((3,), 5)
        return [
            _program_case([a, b], [True, True], [("mul", 0, 1), ("tanh", 2), ("sum", 3, 0)], (1,), 10,
                          label="a chain: tanh(a * b).sum(0, keepdim=True)"),
            _program_case([x], [True], [("mul", 0, 0), ("add", 1, 0)], (2, 3), 11,
                          label="x used three times, x * x + x: its gradients must be summed"),
            _program_case([x, c], [True, True], [("tanh", 0), ("sigmoid", 2), ("mul", 2, 3), ("mul", 4, 1)], (2, 3), 12,
                          label="a diamond: y = tanh(x) feeds sigmoid(y) and y * sigmoid(y); y's node must wait for both"),
            _program_case([m, c], [True, True], [("add", 0, 1), ("tanh", 2)], (2, 3), 13,
                          label="broadcasting: (2, 1) + (3,)"),
            _program_case([x, c], [True, True], [("mul", 0, 1), ("tanh", 2), ("hook", 2, 2.0), ("hook", 0, None)],
                          (2, 3), 14, label="a hook that doubles an intermediate gradient, one that only looks at a leaf's"),
            _program_case([x, c], [True, True], [("mul", 0, 1), ("sigmoid", 2), ("retain", 2)], (2, 3), 15,
                          label="retain_grad() on an intermediate value"),
            _program_case([a, b], [True, True], [("mul", 0, 1), ("tanh", 2)], (3,), 16, twice=True,
                          label="backward twice without retain_graph: the second must raise"),
            _program_case([a, b], [True, True], [("mul", 0, 1), ("tanh", 2)], (3,), 17, twice=True, retain_graph=True,
                          label="backward twice with retain_graph=True: leaf gradients accumulate"),
            _program_case([a, b, c], [True, True, False], [("mulsg", 0, 1), ("tanh", 1), ("mul", 3, 4), ("mul", 5, 2)],
                          (3,), 18, label="a leaf without requires_grad, and a * b.detach(): b's edge sends None"),
            _program_case([x], [True], [], (2, 3), 19, label="the root is a leaf itself"),
        ]

    boundary_classes = {
        "the root is a leaf": lambda c, e: not _ops(c.args[2]),
        "a leaf used by several ops (fan-out into AccumulateGrad)": lambda c, e: any(
            n >= 2 for i, n in _uses(c.args[2]).items() if i < len(c.args[0])),
        "one value used twice by the same op (x * x)": lambda c, e: any(
            s[0] in ("add", "mul", "mulsg") and s[1] == s[2] for s in c.args[2]),
        "an intermediate value used by several ops (a diamond)": lambda c, e: any(
            n >= 2 for i, n in _uses(c.args[2]).items() if i >= len(c.args[0])),
        "a frozen leaf (requires_grad=False)": lambda c, e: not all(c.args[1]),
        "a detached edge (a * b.detach()): its gradient is None": lambda c, e: any(s[0] == "mulsg" for s in c.args[2]),
        "a leaf that gets no gradient (its .grad stays None)": lambda c, e: any(
            r and g is None for r, g in zip(c.args[1], e["grads"], strict=False)),
        "a hook that returns a new gradient": lambda c, e: any(s[0] == "hook" and s[2] is not None for s in c.args[2]),
        "a hook that returns None": lambda c, e: any(s[0] == "hook" and s[2] is None for s in c.args[2]),
        "a hook on a leaf": lambda c, e: any(s[0] == "hook" and s[1] < len(c.args[0]) for s in c.args[2]),
        "retain_grad on an intermediate value": lambda c, e: any(s[0] == "retain" for s in c.args[2]),
        "backward twice without retain_graph (error)": lambda c, e: isinstance(e["second"], Raised),
        "backward twice with retain_graph (gradients add up)": lambda c, e: isinstance(e["second"], dict),
        "a size-0 value": lambda c, e: c.args[3].numel() == 0 or any(t.numel() == 0 for t in c.args[0]),
        "a 0-d root": lambda c, e: c.args[3].dim() == 0,
        "broadcasting (a size-1 or missing dim)": lambda c, e: any(
            tuple(t.shape) != tuple(c.args[3].shape) for t in c.args[0]),
        "a non-contiguous leaf": lambda c, e: any(not t.is_contiguous() for t in c.args[0]),
    }

    @staticmethod
    def deliberate():
        a, b, c3 = rand((3,), 201), rand((3,), 202), rand((3,), 203)
        x, m, xt = rand((2, 3), 204), rand((2, 1), 205), rand((2, 3), 206, layout="transposed")
        e0, e1, s0 = rand((0, 2), 207), rand((2,), 208), rand((), 209)
        return [
            _program_case([x], [True], [("mul", 0, 0), ("add", 1, 0)], (2, 3), 210),
            _program_case([x, c3], [True, True], [("tanh", 0), ("sigmoid", 2), ("mul", 2, 3), ("mul", 4, 1)], (2, 3), 211),
            _program_case([a, b, c3], [True, True, False], [("mulsg", 0, 1), ("tanh", 1), ("mul", 3, 4), ("mul", 5, 2)],
                          (3,), 212),
            _program_case([x, c3], [True, True], [("tanh", 0)], (2, 3), 213),  # c3 is never used
            _program_case([xt, m], [True, True], [("mul", 0, 1), ("tanh", 2), ("hook", 2, 2.0), ("hook", 0, -0.5),
                                                  ("hook", 1, None), ("retain", 3)], (2, 3), 214),
            _program_case([a, b], [True, True], [("mul", 0, 1), ("tanh", 2)], (3,), 215, twice=True),
            _program_case([a, b], [True, True], [("mul", 0, 1), ("sigmoid", 2)], (3,), 216, twice=True, retain_graph=True),
            _program_case([x], [True], [], (2, 3), 217),
            _program_case([e0, e1], [True, True], [("mul", 0, 1), ("tanh", 2), ("sum", 3, 0)], (1, 2), 218),
            _program_case([s0, c3], [True, False], [("mul", 0, 1), ("sum", 2, 0)], (1,), 219),
            _program_case([s0], [True], [("tanh", 0), ("mul", 1, 0)], (), 220),
        ]

    def hidden_cases(self):
        return self.deliberate() + draw(graph_programs(), 50)

    def expected(self, case):
        leaves, requires, program, root_grad, options = case.args
        result = P.run_program(leaves, requires, program, root_grad, options)
        if isinstance(result["second"], BaseException):  # torch refused the second backward
            e = result["second"]
            result["second"] = Raised(type(e).__name__, str(e))
        return result

    def compare(self, case, got, expected):
        if isinstance(got, dict) and isinstance(got.get("error"), Raised):
            e = got["error"]
            return f"your backward raised {e.type}: {e.message}"
        if not isinstance(got, dict) or "grads" not in got:
            return f"the grader could not read your result: {describe(got)}"
        problem = _structure_problem(got, expected)
        if problem:
            return problem
        g2, e2 = got.get("second"), expected["second"]
        if e2 is None:
            return None
        if isinstance(e2, Raised):
            if not isinstance(g2, Raised):
                return ("the second backward through the same graph ran; torch raises RuntimeError (its saved "
                        "tensors were freed by the first backward, which had retain_graph=False)")
            return None
        if isinstance(g2, Raised):
            return f"the second backward (retain_graph=True on the first) raised {g2.type}: {g2.message}"
        return _structure_problem(g2, e2, "after the second backward: ")

    def diagnose(self, case, got, expected):
        leaves, requires, program, root_grad, options = case.args
        if not isinstance(got, dict):
            return None
        err = got.get("error")
        if isinstance(err, Raised):
            if "second time" in err.message or "freed" in err.message:
                return ("a node ran more than once: a node must wait until ALL its consumers have sent their "
                        "gradient (count each node's incoming edges first, run it when the count reaches 0).")
            if "'NoneType' object has no attribute" in err.message:
                if not _ops(program):
                    return "the root may be a leaf: start from gradient_edge(root), which is its AccumulateGrad node."
                return "next_functions holds (None, 0) for inputs that need no gradient: skip those edges."
            return None
        if "grads" not in got:
            return None
        if isinstance(expected["second"], Raised) and not isinstance(got.get("second"), Raised):
            return "after a node ran, free its saved tensors with fn.release_variables() unless retain_graph=True."
        if isinstance(got.get("second"), Raised) and not isinstance(expected["second"], Raised):
            return "with retain_graph=True the saved tensors must stay: do not release them."
        if _structure_problem(got, expected) is None:
            return None  # the first backward was right; the second one's message says what differs
        hooks = [s for s in program if s[0] == "hook"]
        if any(len(g) > len(e) for g, e in zip(got["seen"], expected["seen"], strict=False)):
            return ("a hook ran more often than in torch, so its node ran more than once: a node must wait until ALL "
                    "its consumers have sent their gradient (count each node's incoming edges first, run it when the "
                    "count reaches 0).")
        if (hooks and any(len(g) == 0 and len(e) for g, e in zip(got["seen"], expected["seen"], strict=False))) or any(
                g is None and e is not None for g, e in zip(got["retained"], expected["retained"], strict=False)):
            return ("run the node's tensor hooks (fn.tensor_pre_hooks(0), which include retain_grad's) on its "
                    "gradient before calling fn.apply.")
        if not _ops(program) and got["grads"][0] is None:
            return "the root may be a leaf: start from gradient_edge(root), which is its AccumulateGrad node."
        if any(s[0] == "mulsg" for s in program) and any(
                g is None and e is not None for g, e in zip(got["grads"], expected["grads"], strict=False)):
            return ("a node never ran: decrement a node's dependency count for every edge that reaches it, even "
                    "when the gradient sent along it is None.")
        if any(h[2] is not None for h in hooks) and _grads_equal(got["grads"], P.run_program(
                leaves, requires, [s[:2] + (None,) if s[0] == "hook" else s for s in program], root_grad,
                {"retain_graph": True})["grads"]):
            return "a hook may return a new gradient: when it does not return None, use what it returns."
        if _one_use_only(leaves, requires, program, root_grad, got["grads"], expected["grads"]):
            return ("a value used by several ops gets one gradient from each: add them up in the node's buffer "
                    "(buffer = g if empty else buffer + g), do not overwrite.")
        return None
# ================================================================================================
# autograd.logsumexp - autograd.swiglu custom Functions
# ================================================================================================
def _function_compare(got, expected, budget: int, budget_text: str, names) -> str | None:
    if not isinstance(got, dict) or "out" not in got:
        return f"the grader could not read your result: {describe(got)}"
    if got.get("banned_calls"):
        return (f"forward called torch's {', '.join(got['banned_calls'])}: that is the computation this exercise "
                f"asks you to write")
    problem = close_tensors(got["out"], expected["out"])
    if problem:
        return "forward: " + problem
    if isinstance(got.get("grads"), Raised):
        return f"backward: {got['grads'].type}: {got['grads'].message}"
    problem = _grads_problem(got.get("grads"), expected["grads"], names)
    if problem:
        return "backward: " + problem
    if "gradgrads" in expected:
        gg = got.get("gradgrads")
        if isinstance(gg, Raised):
            return f"second derivatives (what gradgradcheck tests): {gg.message}"
        problem = _grads_problem(gg, expected["gradgrads"], [*names, "grad_out"])
        if problem:
            return "second derivatives (what gradgradcheck tests), " + problem
    saved = got.get("saved_bytes")
    if not isinstance(saved, int) or saved > budget:
        return (f"saved {saved} bytes for backward ({got.get('saved')}); the budget is {budget} bytes "
                f"({budget_text})")
    return None


class LogSumExp(Exercise):
    id, entry, points = "autograd.logsumexp", "LogSumExp", 2
    title = "a stable LogSumExp Function that saves only what backward needs"
    policy = Policy(banned=("logsumexp", "softmax", "log_softmax", "logcumsumexp", "cross_entropy", "nll_loss",
                            "Softmax", "LogSoftmax", "CrossEntropyLoss", "special"),
                    why="compute the stable log-sum-exp yourself")
    probe = f"{PROBES}:logsumexp_probe"

    @staticmethod
    def make(x, dim, seed):
        out = torch.logsumexp(x, dim)
        return Case(([x], (dim,), rand(out.shape, seed), [rand(x.shape, seed + 1)]))

    def visible_cases(self):
        c = [self.make(rand((3, 5), 1), 1, 2), self.make(rand((4, 2, 3), 3), 0, 4),
             self.make(rand((2, 6), 5) + 800.0, -1, 6), self.make(rand((7,), 7), 0, 8)]
        labels = ["rows of a (3, 5) matrix", "over dim 0 of a (4, 2, 3)",
                  "values near 800: exp(800) overflows float64, the answer does not", "a vector: a 0-d result"]
        for case, label in zip(c, labels, strict=False):
            case.label = label
        return c

    boundary_classes = {
        "values near float64's max (exp overflows)": lambda c, e: _finite_max(c.args[0][0]) > 1e300,
        "a large offset next to a small spread (mean >> std)": lambda c, e: _offset_ratio(c.args[0][0]) > 1e6,
        "an offset of +-750 (exp over- or underflows)": lambda c, e: _finite_max(c.args[0][0]) > 700,
        "subnormal values": lambda c, e: bool(((c.args[0][0] != 0) & (c.args[0][0].abs() < 2.2e-308)).any()),
        "-inf entries (a mask), never a whole row": lambda c, e: bool(torch.isneginf(c.args[0][0]).any()),
        "a +inf entry (inf out, NaN gradient, as torch)": lambda c, e: bool(torch.isposinf(c.args[0][0]).any()),
        "a NaN entry": lambda c, e: bool(torch.isnan(c.args[0][0]).any()),
        "exact ties for the max": lambda c, e: c.args[0][0].numel() > 1 and bool((c.args[0][0] == c.args[0][0].max()).sum() > 1),
        "a reduced dim of size 1": lambda c, e: c.args[0][0].shape[c.args[1][0]] == 1,
        "a size-0 dim (not reduced)": lambda c, e: c.args[0][0].numel() == 0,
        "a negative dim": lambda c, e: c.args[1][0] < 0,
        "a non-contiguous x": lambda c, e: not c.args[0][0].is_contiguous(),
        "a 1-d x (a 0-d result)": lambda c, e: c.args[0][0].dim() == 1,
    }

    def deliberate(self):
        inf, nan = math.inf, math.nan
        rows = [[1e308, 1e308, -1e308], [1.7e308, 0.0, 1.0]]
        return [self.make(torch.tensor(rows, dtype=F64), 1, 301),
                self.make(1e6 + 1e-3 * rand((3, 4), 302), -1, 303),
                self.make(rand((2, 3), 304) * 1e-310, 0, 305),
                self.make(torch.full((2, 4), 3.5, dtype=F64), 1, 306),
                self.make(torch.tensor([[inf, 1.0, 2.0], [0.0, 1.0, 2.0]], dtype=F64), 1, 307),
                self.make(torch.tensor([[nan, 1.0, 2.0], [0.0, 1.0, 2.0]], dtype=F64), 1, 308),
                self.make(torch.tensor([[-inf, 1.0, -inf], [0.0, -inf, 2.0]], dtype=F64), 1, 309),
                self.make(rand((3, 1), 310), 1, 311), self.make(rand((0, 3), 312), 1, 313),
                self.make(rand((3, 4), 314, layout="transposed"), -2, 315), self.make(rand((5,), 316), 0, 317)]

    def hidden_cases(self):
        def case(shape, dim_seed, seed, layout, offset, masked):
            x = rand(shape, seed, layout=layout, scale=3.0) + offset
            dim = dim_seed % len(shape)
            if shape[dim] == 0:  # reduce over a non-empty dim (logsumexp of nothing is -inf)
                dim = (dim + 1) % len(shape)
            dim -= len(shape) if dim_seed % 2 else 0  # negative dims too
            if masked and x.numel() and shape[dim] > 1:  # a few -inf entries (masked attention), never a whole row
                x = x.clone()
                x.select(dim, 0).fill_(-math.inf)
            return self.make(x, dim, seed + 7)

        shapes = st.lists(st.sampled_from([1, 1, 2, 3, 5, 7]), min_size=1, max_size=3).map(tuple) | st.tuples(
            st.just(0), st.sampled_from([1, 3]))
        return self.deliberate() + draw(st.builds(case, shapes, st.integers(0, 5), st.integers(0, 2**16),
                              st.sampled_from(["contiguous", "transposed", "strided"]),
                              st.sampled_from([0.0, 0.0, 750.0, -750.0]), st.integers(0, 4).map(lambda k: k == 0)), 30)

    def expected(self, case):
        (x,), (dim,), grad_out, grad_grad = case.args
        return P.torch_function_reference(lambda t: torch.logsumexp(t, dim), [x], grad_out, grad_grad)

    def compare(self, case, got, expected):
        (x,), (dim,), _, _ = case.args
        budget = expected["saved_bytes"]
        return _function_compare(got, expected, budget,
                                 f"x and the output, {x.numel()} + {expected['out'].numel()} float64 values, what "
                                 f"torch.logsumexp saves", ["x"])

    def diagnose(self, case, got, expected):
        (x,), (dim,), _, _ = case.args
        out = _values(got.get("out")) if isinstance(got, dict) else None
        if out is None:
            return None
        if tuple(out.shape) != tuple(expected["out"].shape):
            if tuple(out.shape) == tuple(expected["out"].unsqueeze(dim % x.dim()).shape):
                return "the reduced dim is removed from the output (keepdim=False), as torch.logsumexp(x, dim) does."
            return None
        if close_tensors(out, expected["out"]):  # the forward is wrong
            if bool((~torch.isfinite(out) & torch.isfinite(expected["out"])).any()):
                return "subtract the max before exp: logsumexp(x) = m + log(sum(exp(x - m))) never overflows."
            return None
        saved = got.get("saved_bytes")
        if isinstance(saved, int) and saved > expected["saved_bytes"]:
            return ("save x and the output only (ctx.save_for_backward(x, out)); exp(x - out) is the softmax, "
                    "recompute it in backward instead of keeping an N-element temporary.")
        grads = got.get("grads")
        if isinstance(grads, Raised) or _grads_problem(grads, expected["grads"], ["x"]):
            return None
        gg = got.get("gradgrads")
        if isinstance(gg, Raised) or (isinstance(gg, (list, tuple)) and _grads_problem(
                gg, expected["gradgrads"], ["x", "grad_out"])):
            return ("backward must be differentiable: compute it from SAVED INPUTS/OUTPUTS with torch ops "
                    "(grad * exp(x - out)); a softmax computed in forward is a constant to autograd.")
        return None
def _away_from_ties(x, scale):
    """Move values off the rounding boundaries of x / scale, so any correct rounding agrees with torch's."""
    q = x / scale
    frac = q - torch.floor(q)
    return torch.where((frac - 0.5).abs() < 0.05, x + 0.1 * scale, x)


class FakeQuantize(Exercise):
    id, entry, points = "autograd.fake_quantize", "FakeQuantize", 2
    title = "a straight-through estimator: fake quantization with a clipped identity gradient"
    policy = Policy(banned=("fake_quantize_per_tensor_affine", "fake_quantize_per_tensor_affine_cachemask",
                            "fake_quantize_per_channel_affine", "quantize_per_tensor", "quantize_per_channel", "dequantize",
                            "FakeQuantize", "ao", "quantization"),
                    why="quantize and dequantize with tensor arithmetic")
    probe = f"{PROBES}:fake_quantize_probe"

    @staticmethod
    def make(shape, seed, qparams, layout="contiguous", spread=6.0):
        scale, zp, qmin, qmax = qparams
        x = _away_from_ties(rand(shape, seed, dtype=torch.float32, layout=layout, scale=spread) * scale, scale)
        return Case(([x], tuple(qparams), rand(shape, seed + 1, dtype=torch.float32),
                     [rand(shape, seed + 2, dtype=torch.float32)]))

    def visible_cases(self):
        c = [self.make((8,), 1, (0.5, 0, -4, 3)), self.make((3, 4), 2, (0.1, 3, 0, 15)),
             self.make((2, 5), 3, (0.25, -2, -8, 7), layout="transposed")]
        for case, label in zip(c, ["int3-like: scale 0.5, levels -4..3", "uint4-like with zero_point 3",
                                   "a transposed input, zero_point -2"], strict=False):
            case.label = label
        return c

    boundary_classes = {
        "an exact tie x / scale = k + 0.5 (round half to even)": lambda c, e: bool(
            (_fq_scaled(c) - torch.floor(_fq_scaled(c)) == 0.5).any()),
        "q == quant_min": lambda c, e: bool((_fq_q(c) == c.args[1][2]).any()),
        "q == quant_max": lambda c, e: bool((_fq_q(c) == c.args[1][3]).any()),
        "q == quant_min - 1 (clamped)": lambda c, e: bool((_fq_q(c) == c.args[1][2] - 1).any()),
        "q == quant_max + 1 (clamped)": lambda c, e: bool((_fq_q(c) == c.args[1][3] + 1).any()),
        "a tie that rounds out of range": lambda c, e: bool(((_fq_scaled(c) - torch.floor(_fq_scaled(c)) == 0.5)
                                                             & ((_fq_q(c) < c.args[1][2]) | (_fq_q(c) > c.args[1][3]))).any()),
        "a nonzero zero_point": lambda c, e: c.args[1][1] != 0,
        "subnormal x": lambda c, e: bool(((c.args[0][0] != 0) & (c.args[0][0].abs() < 1.2e-38)).any()),
        "x = -0.0": lambda c, e: bool(((c.args[0][0] == 0) & torch.signbit(c.args[0][0])).any()),
        "a size-0 x": lambda c, e: c.args[0][0].numel() == 0,
        "a single element": lambda c, e: c.args[0][0].numel() == 1,
        "a non-contiguous x": lambda c, e: not c.args[0][0].is_contiguous(),
    }

    def deliberate(self):
        def exact(values, seed, qparams):  # values of x / scale, made exactly (power-of-two scales)
            scale = qparams[0]
            x = torch.tensor(values, dtype=torch.float32) * scale
            return Case(([x], tuple(qparams), rand(x.shape, seed, dtype=torch.float32),
                         [rand(x.shape, seed + 1, dtype=torch.float32)]))

        ties = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, -3.5, 3.5]
        edges = [-4.0, 3.0, -5.0, 4.0, -4.4, 3.4, 0.0]
        return [exact(ties + edges, 401, (0.5, 0, -4, 3)),
                exact([-6.5, -5.5, 8.5, 9.5, 0.5, 1.5, -6.0, 9.0, -7.0, 10.0, 2.3], 402, (0.25, -2, -8, 7)),
                exact([-0.5, 0.5, 1.5, 2.5, 3.5, -1.0, 4.0], 403, (2.0, 1, 0, 3)),
                exact([-128.5, 126.5, 127.5, -127.5, -129.0, 128.0], 404, (1.0, 0, -128, 127)),
                Case(([torch.tensor([1e-40, -1e-45, -0.0, 0.0])], (0.5, 0, -4, 3), rand((4,), 405, dtype=torch.float32),
                      [rand((4,), 406, dtype=torch.float32)])),
                self.make((1,), 407, (0.1, 3, 0, 15)), self.make((0, 3), 408, (0.25, -2, -8, 7)),
                self.make((3, 4), 409, (0.05, 0, -1, 1), layout="transposed")]

    def hidden_cases(self):
        qp = st.sampled_from([(0.5, 0, -4, 3), (0.1, 3, 0, 15), (0.25, -2, -8, 7), (1.0, 0, -128, 127),
                              (0.05, 0, -1, 1), (2.0, 1, 0, 3)])
        shapes = st.lists(st.sampled_from([0, 1, 2, 3, 7]), max_size=3).map(tuple)
        return self.deliberate() + draw(st.builds(self.make, shapes, st.integers(0, 2**16), qp,
                                                  st.sampled_from(["contiguous", "transposed", "strided"]),
                                                  st.sampled_from([2.0, 6.0, 40.0])), 24)

    def expected(self, case):
        (x,), (scale, zp, qmin, qmax), grad_out, grad_grad = case.args
        return P.torch_function_reference(
            lambda t: torch.fake_quantize_per_tensor_affine(t, scale, zp, qmin, qmax), [x], grad_out, grad_grad)

    def compare(self, case, got, expected):
        (x,), *_ = case.args
        return _function_compare(got, expected, expected["saved_bytes"],
                                 f"a bool mask, 1 byte per element of x ({x.numel()} elements), what torch's "
                                 f"fake_quantize saves", ["x"])

    def diagnose(self, case, got, expected):
        (x,), (scale, zp, qmin, qmax), grad_out, _ = case.args
        out = _values(got.get("out")) if isinstance(got, dict) else None
        if out is None or tuple(out.shape) != tuple(expected["out"].shape):
            return None
        if close_tensors(out, expected["out"]):  # the forward is wrong: which rounding gives what was returned?
            v = x * (1.0 / scale)
            for q, why in ((torch.floor(v), "round to the nearest level (torch.round), not down (floor)"),
                           (torch.trunc(v), "round to the nearest level (torch.round), not toward zero (trunc)"),
                           (torch.floor(v + 0.5), "ties round half to even, as torch.round does: 2.5 -> 2, not 3")):
                if close_tensors(out, ((q + zp).clamp(qmin, qmax) - zp) * scale) is None:
                    return why
            return None
        saved = got.get("saved_bytes")
        if isinstance(saved, int) and saved > expected["saved_bytes"]:
            return "save only the in-range mask, as a bool tensor: 1 byte per element (x or a float mask costs 4)."
        grads = got.get("grads")
        if not isinstance(grads, (list, tuple)) or not grads or _values(grads[0]) is None:
            return None
        g = _values(grads[0])
        if close_tensors(g, expected["grads"][0]) is None or not expected["grads"][0].abs().sum():
            return None
        if close_tensors(g, grad_out) is None:
            return "the estimator is clipped: pass the gradient through only where q was inside [quant_min, quant_max]."
        if not g.abs().sum():
            return "round's true derivative (0) would stop training: a straight-through estimator passes grad_out through."
        for mask in ((x >= qmin * scale) & (x <= qmax * scale), (x / scale >= qmin) & (x / scale <= qmax)):
            if close_tensors(g, grad_out * mask) is None:
                return "build the mask from q = round(x / scale) + zero_point (the value that was clamped), not from x."
        return None
class SwiGLU(Exercise):
    id, entry, points = "autograd.swiglu", "FusedSwiGLU", 2
    title = "a fused SwiGLU that recomputes sigmoid instead of saving it"
    probe = f"{PROBES}:function_probe"

    @staticmethod
    def make(shape, seed, layout="contiguous"):
        a, b = rand(shape, seed, layout=layout, scale=2.0), rand(shape, seed + 1)
        return Case(([a, b], (), rand(shape, seed + 2), [rand(shape, seed + 3), rand(shape, seed + 4)]))

    def visible_cases(self):
        c = [self.make((4, 6), 1), self.make((7,), 2), self.make((2, 3, 4), 3, "transposed")]
        for case, label in zip(c, ["a (4, 6) activation", "a vector", "a transposed (2, 3, 4) input"], strict=False):
            case.label = label
        return c

    boundary_classes = {
        "a saturated a (|a| >= 40: sigmoid is 0 or 1)": lambda c, e: bool((c.args[0][0].abs() >= 40).any()),
        "a == 0": lambda c, e: bool((c.args[0][0] == 0).any()),
        "values near float64's max": lambda c, e: c.args[0][0].numel() > 0 and float(c.args[0][0].abs().max()) > 1e299,
        "subnormal values": lambda c, e: bool(((c.args[0][0] != 0) & (c.args[0][0].abs() < 2.2e-308)).any()),
        "b == 0": lambda c, e: bool((c.args[0][1] == 0).any()),
        "a size-0 input": lambda c, e: c.args[0][0].numel() == 0,
        "a single element": lambda c, e: c.args[0][0].numel() == 1,
        "a non-contiguous input": lambda c, e: not c.args[0][0].is_contiguous(),
    }

    def deliberate(self):
        a = torch.tensor([40.0, -40.0, 800.0, -800.0, 0.0, 1e300, -1e300, 1e-310, -5e-324], dtype=F64)
        b = rand(a.shape, 501)
        b[4] = 0.0
        saturated = Case(([a, b], (), rand(a.shape, 502), [rand(a.shape, 503), rand(a.shape, 504)]))
        return [saturated, self.make((1,), 505), self.make((0, 3), 506), self.make((3, 4), 507, "strided")]

    def hidden_cases(self):
        shapes = st.lists(st.sampled_from([0, 1, 2, 3, 5]), max_size=3).map(tuple)
        return self.deliberate() + draw(st.builds(self.make, shapes, st.integers(0, 2**16),
                                                  st.sampled_from(["contiguous", "transposed", "strided"])), 26)

    def expected(self, case):
        (a, b), _, grad_out, grad_grad = case.args
        return P.torch_function_reference(lambda x, y: F.silu(x) * y, [a, b], grad_out, grad_grad)

    def compare(self, case, got, expected):
        (a, b), *_ = case.args
        budget = (a.numel() + b.numel()) * a.element_size()
        return _function_compare(got, expected, budget,
                                 "a and b only; F.silu(a) * b saves 3 tensors, a fused op 2", ["a", "b"])

    def diagnose(self, case, got, expected):
        (a, b), _, grad_out, _ = case.args
        if not isinstance(got, dict):
            return None
        saved = got.get("saved_bytes")
        if isinstance(saved, int) and saved > (a.numel() + b.numel()) * a.element_size():
            return "save a and b only: recompute s = sigmoid(a) in backward (one exp per element is cheaper than memory)."
        grads = got.get("grads")
        if not isinstance(grads, (list, tuple)) or len(grads) != 2 or _values(grads[0]) is None:
            return None
        gg = got.get("gradgrads")
        if not _grads_problem(grads, expected["grads"], ["a", "b"]):
            if isinstance(gg, Raised) or _grads_problem(gg, expected["gradgrads"], ["a", "b", "grad_out"]):
                return ("backward must itself be differentiable: compute it with torch ops on the saved tensors, "
                        "without .detach(), .data or torch.no_grad().")
            return None
        s = torch.sigmoid(a)
        if close_tensors(_values(grads[0]), grad_out * b * s) is None and close_tensors(
                _values(grads[0]), expected["grads"][0]) is not None:
            return "d silu(a)/da = s + a * s * (1 - s) with s = sigmoid(a): the a * s * (1 - s) term is missing."
        return None
# ================================================================================================
# autograd.checkpoint activation checkpointing
# ================================================================================================
def _cpu(result: dict) -> dict:
    """A run_block result with its tensors on the CPU."""
    move = lambda t: t.cpu() if isinstance(t, torch.Tensor) else t  # noqa: E731
    out = dict(result)
    out["out"] = move(out["out"])
    if isinstance(out.get("grads"), list):
        out["grads"] = [move(g) for g in out["grads"]]
    return out


def _on(device: str, case: Case) -> tuple[tuple, dict]:
    """The case's arguments with every tensor on ``device``."""
    move = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
    return tuple([move(t) for t in a] if isinstance(a, list) else move(a) for a in case.args), dict(case.kwargs)


def _unrestored_grads(case: Case, device: str) -> list:
    """The gradients a checkpoint gives whose recomputation does NOT replay the forward's random numbers on
    ``device``: forward draws the dropout masks, the recomputation draws the next ones from the same stream."""
    (x, weights, biases, p, seed, grad_out), kwargs = _on(device, case)
    xl, ws, bs = P.block_leaves(x, weights, biases, **kwargs)
    block = P.make_block(ws, bs, p)
    torch.manual_seed(seed)
    with torch.no_grad():
        block(xl)
    block(xl).backward(grad_out)
    return [None if t.grad is None else t.grad.cpu() for t in [xl, *ws, *bs]]


def _ran_on(got) -> str:
    out = got.get("out") if isinstance(got, dict) else None
    return "cuda" if isinstance(out, TensorInfo) and str(out.device).startswith("cuda") else "cpu"


class Checkpoint(Exercise):
    id, entry, points = "autograd.checkpoint", "checkpoint", 2
    title = "activation checkpointing: keep the input, recompute the block in backward"
    policy = Policy(banned=("checkpoint", "checkpoint_sequential", "utils"),
                    why="build checkpointing yourself (a torch.autograd.Function or saved_tensors_hooks)")
    probe = f"{PROBES}:checkpoint_probe"
    timeout_s = 30.0
    gpu = True  # on a GPU, dropout draws from the CUDA generator: a checkpoint must replay that one too

    @staticmethod
    def make(batch, widths, dropout_p, seed, layout="contiguous", frozen=(), shared=()):
        x = rand((batch, widths[0]), seed, layout=layout)
        weights = [rand((i, o), seed + 10 + k, scale=1 / math.sqrt(i)) for k, (i, o) in enumerate(zip(widths, widths[1:], strict=False))]
        biases = [rand((o,), seed + 20 + k, scale=0.1) for k, o in enumerate(widths[1:])]
        kwargs = {k: v for k, v in (("frozen", tuple(frozen)), ("shared", tuple(shared))) if v}
        return Case((x, weights, biases, dropout_p, seed, rand((batch, widths[-1]), seed + 1)), kwargs)

    def visible_cases(self):
        c = [self.make(8, (16, 16, 16, 16), 0.0, 1), self.make(5, (6, 12, 4), 0.0, 2),
             self.make(8, (16, 16, 16), 0.3, 3)]
        for case, label in zip(c, ["3 tanh layers of width 16", "layers of different widths",
                                   "with dropout: the recomputation must draw the same mask"], strict=False):
            case.label = label
        return c

    boundary_classes = {
        "dropout (the recomputation must draw the same masks)": lambda c, e: c.args[3] > 0,
        "no dropout": lambda c, e: c.args[3] == 0,
        "a batch of 1": lambda c, e: c.args[0].shape[0] == 1,
        "a layer of width 1": lambda c, e: any(1 in w.shape for w in c.args[1]),
        "one layer": lambda c, e: len(c.args[1]) == 1,
        "four or more layers": lambda c, e: len(c.args[1]) >= 4,
        "a frozen weight (requires_grad=False: its .grad stays None)": lambda c, e: bool(c.kwargs.get("frozen")),
        "a weight shared by two layers (its gradients add up)": lambda c, e: bool(c.kwargs.get("shared")),
        "a frozen or shared weight with dropout": lambda c, e: c.args[3] > 0 and bool(c.kwargs),
        "a non-contiguous input": lambda c, e: not c.args[0].is_contiguous(),
    }

    def hidden_cases(self):
        deliberate = [self.make(1, (3, 1), 0.5, 601), self.make(4, (8, 8, 8, 8, 8), 0.5, 602, frozen=(1,)),
                      self.make(3, (5, 5, 5, 5), 0.0, 603, shared=((2, 1),)),
                      self.make(2, (5, 5, 5), 0.5, 604, frozen=(0,), shared=((1, 0),)),
                      self.make(6, (4, 7, 3), 0.0, 605, layout="transposed")]
        widths = st.lists(st.sampled_from([1, 3, 8, 13]), min_size=2, max_size=5).map(tuple)
        return deliberate + draw(st.builds(self.make, st.sampled_from([1, 2, 7, 16]), widths,
                                           st.sampled_from([0.0, 0.0, 0.5]), st.integers(0, 2**16)), 16)

    def expected(self, case):
        result = P.run_block(lambda block, xl: block(xl), *case.args, **case.kwargs)
        if case.args[3] and torch.cuda.is_available():  # graded on the GPU there: its dropout masks are others
            args, kwargs = _on("cuda", case)
            result["cuda"] = _cpu(P.run_block(lambda block, xl: block(xl), *args, **kwargs))
        return result

    def compare(self, case, got, expected):
        x, weights, *_ = case.args
        if not isinstance(got, dict) or "out" not in got:
            return f"the grader could not read your result: {describe(got)}"
        expected = expected.get(_ran_on(got), expected)
        problem = close_tensors(got["out"], expected["out"])
        if problem:
            return "the block's output: " + problem
        grads = got.get("grads")
        if isinstance(grads, Raised):
            return f"backward: {grads.message}"
        names = ["x"] + [f"W{k}" for k in range(len(weights))] + [f"b{k}" for k in range(len(weights))]
        problem = _grads_problem(grads, expected["grads"], names)
        if problem:
            return problem
        budget = x.numel() * x.element_size()
        kept = got.get("kept_bytes")
        if not isinstance(kept, int) or kept > budget:
            return (f"{kept} bytes of activations stayed alive between forward and backward; without checkpointing "
                    f"the block keeps {expected['kept_bytes']}; a checkpoint may keep at most one copy of its input "
                    f"({budget} bytes)")
        return None

    def diagnose(self, case, got, expected):
        x, weights, biases, p, seed, grad_out = case.args
        if not isinstance(got, dict):
            return None
        device = _ran_on(got)
        expected = expected.get(device, expected)
        kept = got.get("kept_bytes")
        grads = got.get("grads")
        names = ["?"] * (1 + 2 * len(weights))
        if not isinstance(grads, (list, tuple)) or not _grads_problem(grads, expected["grads"], names):
            if isinstance(kept, int) and kept > x.numel() * x.element_size():
                return ("run the block under torch.no_grad() in forward (no graph, so nothing is saved) and save only "
                        "its input; in backward, re-run it with grad enabled and backpropagate through the recomputed "
                        "graph.")
            return None
        if len(grads) > 1 and grads[0] is not None and all(g is None for g in grads[1:]):
            return ("the parameters inside the block got no gradient: in backward call torch.autograd.backward on the "
                    "recomputed output (it fills the parameters' .grad), not torch.autograd.grad(out, x).")
        if p and not _grads_problem(grads, _unrestored_grads(case, device), names):
            return ("the recomputation drew a different dropout mask: save the RNG state of every device the block "
                    "draws from in forward (torch.get_rng_state(), and torch.cuda.get_rng_state(x.device) for a GPU "
                    "input: dropout on a GPU draws from the CUDA generator) and restore them around the recomputation "
                    "(torch.random.fork_rng(devices=...)).")
        return None

# ================================================================================================
# autograd.accumulate gradient accumulation
# ================================================================================================
def _micro_batch_grads(case: Case, weight) -> list:
    """The gradients of ``sum_i weight(n_i, N, k) * loss_i`` over the micro-batches, by torch: what an
    accumulation with that weighting leaves in ``.grad`` (from zero)."""
    weights, x, y, k, loss_kind = case.args
    model = P.make_model(weights, case.kwargs.get("frozen", ()))
    loss_fn = P.loss_function(loss_kind)
    for xs, ys in zip(torch.tensor_split(x, k), torch.tensor_split(y, k), strict=True):
        (loss_fn(model(xs), ys) * weight(xs.shape[0], x.shape[0], k)).backward()
    return [p.grad for p in model.parameters()]


class Accumulate(Exercise):
    id, entry, points = "autograd.accumulate", "accumulate_grads", 2
    title = "gradient accumulation that equals the large-batch gradient"
    probe = f"{PROBES}:accumulation_probe"
    names = ["W1", "b1", "W2", "b2"]

    @staticmethod
    def make(n, k, d, h, c, loss_kind, seed, frozen=()):
        weights = [rand((h, d), seed, scale=0.5), rand((h,), seed + 1, scale=0.1), rand((c, h), seed + 2, scale=0.5),
                   rand((c,), seed + 3, scale=0.1)]
        x = rand((n, d), seed + 4)
        g = torch.Generator().manual_seed(seed + 5)
        y = torch.randint(0, c, (n,), generator=g) if loss_kind == "cross_entropy" else rand((n, c), seed + 6)
        return Case((weights, x, y, k, loss_kind), {"frozen": tuple(frozen)} if frozen else {})

    def visible_cases(self):
        c = [self.make(8, 4, 3, 5, 4, "cross_entropy", 1), self.make(10, 3, 3, 5, 4, "cross_entropy", 2),
             self.make(6, 1, 2, 3, 2, "mse", 3), self.make(7, 7, 2, 3, 2, "mse", 4)]
        for case, label in zip(c, ["8 samples in 4 micro-batches of 2 (cross-entropy)",
                                   "10 samples in 3 micro-batches of 4, 3, 3: unequal sizes",
                                   "1 micro-batch: plain backward (MSE)", "one sample per micro-batch"], strict=False):
            case.label = label
        return c

    boundary_classes = {
        "one micro-batch (k == 1)": lambda c, e: c.args[3] == 1,
        "two micro-batches (k == 2)": lambda c, e: c.args[3] == 2,
        "one sample per micro-batch (k == n)": lambda c, e: c.args[3] == c.args[1].shape[0] > 1,
        "k == n - 1 (one micro-batch of 2, the rest of 1)": lambda c, e: c.args[3] == c.args[1].shape[0] - 1 > 1,
        "unequal micro-batches (n % k != 0)": lambda c, e: c.args[1].shape[0] % c.args[3] != 0,
        "a batch of one sample": lambda c, e: c.args[1].shape[0] == 1,
        "a frozen layer (requires_grad=False: its .grad stays None)": lambda c, e: bool(c.kwargs.get("frozen")),
        "cross-entropy": lambda c, e: c.args[4] == "cross_entropy",
        "MSE": lambda c, e: c.args[4] == "mse",
    }

    def hidden_cases(self):
        def case(n, k_seed, dims, loss_kind, seed):
            return self.make(n, 1 + k_seed % n, *dims, loss_kind, seed)

        deliberate = [self.make(1, 1, 3, 2, 2, "mse", 701), self.make(9, 2, 3, 5, 3, "cross_entropy", 702),
                      self.make(6, 5, 2, 3, 2, "mse", 703), self.make(5, 5, 4, 2, 3, "cross_entropy", 704),
                      self.make(10, 4, 3, 5, 4, "cross_entropy", 705, frozen=(0, 1)),
                      self.make(7, 3, 2, 3, 2, "mse", 706, frozen=(2,))]
        return deliberate + draw(st.builds(case, st.integers(1, 13), st.integers(0, 12),
                                           st.tuples(st.sampled_from([1, 3, 4]), st.sampled_from([2, 5]),
                                                     st.sampled_from([2, 3])),
                                           st.sampled_from(["cross_entropy", "mse"]), st.integers(0, 2**16)), 20)

    def expected(self, case):
        weights, x, y, k, loss_kind = case.args
        model = P.make_model(weights, case.kwargs.get("frozen", ()))
        loss = P.loss_function(loss_kind)(model(x), y)
        loss.backward()
        return {"grads": [p.grad for p in model.parameters()], "loss": loss.item(), "n": x.shape[0], "k": k}

    def compare(self, case, got, expected):
        if not isinstance(got, dict) or "grads" not in got:
            return f"the grader could not read your result: {describe(got)}"
        n, k = expected["n"], expected["k"]
        sizes = got.get("batch_sizes", [])
        if len(sizes) != k or sum(sizes) != n or max(sizes, default=0) > -(-n // k):
            return (f"the model saw batches of sizes {sizes} through model(...); expected {k} micro-batches covering "
                    f"the {n} samples, each at most {-(-n // k)}")
        problem = _grads_problem(got["grads"], expected["grads"], self.names)
        if problem:
            return problem
        loss = got.get("loss")
        if not isinstance(loss, float) or not math.isclose(loss, expected["loss"], rel_tol=1e-7, abs_tol=1e-9):
            return f"returned loss: expected the full-batch loss {expected['loss']!r}, got {describe(loss)}"
        return None

    def diagnose(self, case, got, expected):
        weights, x, y, k, loss_kind = case.args
        if not isinstance(got, dict):
            return None
        sizes = got.get("batch_sizes", [])
        if not sizes:
            return ("call the model as model(x), not model.forward(x): only __call__ runs the hooks that tools "
                    "(and this check) attach to it.")
        if len(sizes) == 1 and k > 1:
            return "split the batch into micro_batches pieces (torch.tensor_split) and run forward/backward on each."
        grads = got.get("grads")
        if not isinstance(grads, (list, tuple)) or not _grads_problem(grads, expected["grads"], self.names):
            return None
        stale = [None if e is None else e + 1 for e in expected["grads"]]
        if not _grads_problem(grads, stale, self.names):
            return "the stale .grad from the previous step leaked in: zero the gradients first (model.zero_grad())."
        if not _grads_problem(grads, _micro_batch_grads(case, lambda n_i, n, k: 1.0), self.names):
            return "each micro-batch's mean loss must be scaled down before backward, or the gradients add up k times."
        if not _grads_problem(grads, _micro_batch_grads(case, lambda n_i, n, k: 1.0 / k), self.names):
            return ("with unequal micro-batches a 1/k weight is wrong: weight each micro-batch's mean loss by its share "
                    "of the samples, n_i / N.")
        return None


EXERCISES = [Unbroadcast(), Formulas(), Backward(), LogSumExp(), FakeQuantize(), SwiGLU(), Checkpoint(), Accumulate()]
CHAPTER = Chapter("autograd", exercises=EXERCISES,
                  sandbox_files=("autograd/scaffold.py", "autograd/variable.py", "autograd/node.py", "autograd/ops.py"))
