"""The kernels chapter's graded exercises: Triton kernels, checked against real torch.

The student writes each ``@triton.jit`` kernel *and* the torch-facing wrapper that launches it. The
checks call the wrapper through the probe ``ptinternals.checks.probes.kernels:kernel_case``, which

* puts guard bytes around every tensor (a store past the end is reported, not a crashed process;
  a load past the end reads NaN; ``torch.empty`` memory starts as NaN, so unwritten outputs show),
* records the aten ops the wrapper ran (computing the answer with torch is rejected) and how many
  Triton kernels it launched (at least one),
* on a GPU, also times the wrapper against torch's own op on the same run (targets below),
* skips bf16 on the CPU: the Triton interpreter computes bf16 wrongly (TOOLCHAIN.md).

Where the checks run: on the CPU, kernels run in the Triton interpreter (``TRITON_INTERPRET=1``,
set by the grading sandbox and the notebook's setup cell), so shapes are small; with
``Exercise.gpu = True`` grading uses CUDA when present, and the same cases run compiled, which
catches what the interpreter lets through (``tl.dot`` on blocks under 16, for one).

Expected values come from torch in fp64 on the same inputs (``torch.softmax``, ``F.layer_norm`` and
its autograd, ``@``, ``F.scaled_dot_product_attention``), compared with a tolerance of about one
rounding of the output dtype, looser for fp32 ``tl.dot`` on a GPU (TF32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from ..benchmark import Measurement
from ..grading._runtime import TensorInfo
from ..grading.cases import draw
from ..grading.compare import close_tensors, describe, same_value
from ..grading.exercise import Case, Chapter, Exercise
from ..grading.policy import AUTOGRAD, HOST_MATH, Policy
from ..kernels.costs import (
    H200_PEAKS,
    attention_cost,
    layer_norm_cost,
    matmul_cost,
    roofline_fractions,
    softmax_cost,
)
from .probes.kernels import small_model_losses

#: a measured ratio counts as meeting its target when within this factor (run-to-run noise)
PERF_NOISE = 0.95

#: aten ops that do the work the kernel should do: a wrapper may allocate, view and copy, not compute
MATH_OPS = frozenset(
    {
        "add",
        "sub",
        "rsub",
        "mul",
        "div",
        "neg",
        "exp",
        "exp2",
        "log",
        "sqrt",
        "rsqrt",
        "pow",
        "reciprocal",
        "sum",
        "mean",
        "var",
        "var_mean",
        "std",
        "amax",
        "max",
        "min",
        "maximum",
        "logsumexp",
        "cumsum",
        "_softmax",
        "softmax",
        "_log_softmax",
        "native_layer_norm",
        "native_layer_norm_backward",
        "layer_norm",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "matmul",
        "dot",
        "mv",
        "einsum",
        "linear",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_cudnn_attention",
        "scaled_dot_product_attention",
        "where",
        "masked_fill",
        "clamp",
        "relu",
    }
)

# (rtol, atol) for one rounding of the output dtype (the expected values are fp64)
ROUNDING = {torch.float32: (2e-5, 1e-6), torch.float16: (2e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}
DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _dt(dtype) -> str:
    return str(dtype).replace("torch.", "")


# ================================================================================================
# Inputs
# ================================================================================================
def rand(shape, dtype=torch.float32, *, seed: int = 0, layout: str = "contiguous", scale: float = 1.0):
    """A seeded randn tensor in one of the layouts the checks use (values made in fp64, then cast).

    ``contiguous``; ``transposed`` (the last two dims swapped in memory); ``sliced`` (columns 2..
    of a wider buffer: row stride > row length, storage offset 2); ``strided`` (1-d: every 3rd
    element); ``bshd`` (4-d (B, H, S, D) over memory laid out (B, S, H, D), as after a qkv split).
    """
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(dtype)  # noqa: E731
    shape = tuple(shape)
    if layout == "contiguous" or (len(shape) < 2 and layout != "strided"):
        return mk(*shape)
    if layout == "strided":
        return mk(shape[0] * 3 + 1)[1::3]
    if layout == "transposed":
        return mk(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
    if layout == "sliced":
        return mk(*shape[:-1], shape[-1] + 5)[..., 2 : 2 + shape[-1]]
    if layout == "bshd":
        b, h, s, d = shape
        return mk(b, s, h, d).transpose(1, 2)
    raise ValueError(f"unknown layout {layout!r}")


def _label(shape, dtype, layout="contiguous", extra="") -> str:
    lay = "" if layout == "contiguous" else f", {layout}"
    return f"{tuple(shape)} {_dt(dtype)}{lay}{extra}"


def _is_bf16(case: Case) -> bool:
    return any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in case.args)


# ================================================================================================
# Performance targets (GPU only)
# ================================================================================================
@dataclass(frozen=True)
class PerfTarget:
    """What a benchmark case expects: at least ``target`` x torch's speed on the same run."""

    kind: str
    target: float
    shape: tuple
    dtype: str
    what: str  # "torch.softmax", "cuBLAS (torch.matmul)"...
    causal: bool = False

    def cost(self):
        dtype = getattr(torch, self.dtype)
        if self.kind == "softmax":
            return softmax_cost(*self.shape, dtype)
        if self.kind == "layer_norm_forward":
            return layer_norm_cost(*self.shape, dtype)
        if self.kind == "layer_norm_backward":
            return layer_norm_cost(*self.shape, dtype, backward=True)
        if self.kind == "matmul":
            return matmul_cost(*self.shape, dtype)
        b, h, s, d = self.shape
        return attention_cost(b, h, s, s, d, dtype, self.causal)


def perf_case(
    kind: str, shape, dtype: str, target: float, what: str, causal: bool = False
) -> Case:
    spec = {"benchmark": kind, "shape": list(shape), "dtype": dtype}
    if causal:
        spec["causal"] = True
    label = (
        f"performance on a GPU: {tuple(shape)} {dtype}{' causal' if causal else ''}, at least {target:g}x "
        f"{what} on the same run (skipped on the CPU)"
    )
    return Case((spec,), label=label)


def perf_message(got: dict, expected: PerfTarget) -> str:
    """The achieved numbers and where they sit on the H200's roofline."""
    cost = expected.cost()
    m = Measurement(
        suite="grading",
        name=expected.kind,
        device="cuda",
        shape=str(expected.shape),
        dtype=expected.dtype,
        ms=got["ms"],
        bytes_moved=cost.bytes_moved,
        flops=cost.flops,
        torch_ms=got["torch_ms"],
    )
    roof = roofline_fractions(m, H200_PEAKS)
    if roof["bound"] == "memory":
        pos = (
            f"{m.gbps:.0f} GB/s = {roof['frac_bw']:.0%} of the H200's 4.8 TB/s (memory-bound at "
            f"{roof['intensity']:.2f} FLOP/byte)"
        )
    else:
        pos = (
            f"{m.tflops:.0f} TFLOP/s = {roof['frac_flops']:.0%} of the H200's 989 dense TFLOP/s "
            f"(compute-bound at {roof['intensity']:.0f} FLOP/byte)"
        )
    return (
        f"yours {got['ms']:.3f} ms vs {expected.what} {got['torch_ms']:.3f} ms on {got.get('gpu', 'the GPU')}: "
        f"{m.vs_torch:.2f}x torch; {pos}"
    )


def compare_perf(got, expected: PerfTarget, rtol: float) -> str | None:
    if not isinstance(got, dict):
        return f"the grader could not read the benchmark result: {describe(got)}"
    if "skipped" in got:
        return None if got.get("device") == "cpu" else f"the benchmark did not run: {got['skipped']}"
    if "error" in got:
        return f"on the benchmark input your wrapper {got['error']}"
    scale = max(1.0, float(got.get("ref_max_abs", 1.0)))
    if not got.get("max_abs_err", float("inf")) <= 4 * rtol * scale:
        return (
            f"on the benchmark input {tuple(expected.shape)} {expected.dtype} your result differs from torch's by "
            f"up to {got.get('max_abs_err')!r} (allowed {4 * rtol * scale:.3g})"
        )
    ratio = got["torch_ms"] / got["ms"]
    if ratio < expected.target * PERF_NOISE:
        return f"too slow: {ratio:.2f}x torch, the target is {expected.target:g}x\n  {perf_message(got, expected)}"
    return None


# ================================================================================================
# The shared shape of a kernel exercise
# ================================================================================================
class KernelExercise(Exercise):
    """A kernel wrapper called through the guarded probe; subclasses compare the output itself."""

    probe = "ptinternals.checks.probes.kernels:kernel_case"
    policy = Policy(banned=HOST_MATH, why="the kernel must do the arithmetic")
    gpu = True
    timeout_s = 60.0
    allowed_math: frozenset = frozenset()  # MATH_OPS this exercise's wrapper may still use
    perf_rtol = 1.6e-2

    def compare(self, case, got, expected):
        if isinstance(expected, PerfTarget):
            return compare_perf(got, expected, self.perf_rtol)
        if not isinstance(got, dict):
            return f"the grader could not read your result: {describe(got)}"
        if "skipped" in got:
            if got.get("device") == "cpu" and _is_bf16(case):
                return None
            return f"this case was skipped: {got['skipped']}"
        if not got.get("launches") and _has_elements(expected):
            return (
                "your wrapper launched no Triton kernel: compute the result in a @triton.jit kernel, "
                "launched as kernel[grid](...)"
            )
        oob = got.get("oob") or []
        if oob:
            return (
                "your kernel wrote outside the memory it was given: the checker's guard bytes after "
                + "; ".join(oob)
                + " were overwritten"
            )
        used = sorted(set(got.get("ops", [])) & (MATH_OPS - self.allowed_math))
        if used:
            return (
                f"your wrapper computed with torch ({', '.join(used)}): the kernel must do the arithmetic; "
                f"the wrapper may only allocate outputs, read shapes and strides, and launch"
            )
        return self.compare_out(case, got.get("out"), expected, got.get("device", "cpu"))

    def compare_out(self, case, out, expected, device: str) -> str | None:
        raise NotImplementedError

    def diagnose(self, case, got, expected):
        if isinstance(expected, PerfTarget):
            return self.perf_hint
        if not isinstance(got, dict):
            return None
        if got.get("oob"):
            return (
                "a missing mask: the last block runs past the end of the tensor. Pass mask=... to every "
                "tl.load and tl.store whose offsets can reach past the end."
            )
        if got.get("launches") and set(got.get("ops", [])) & (MATH_OPS - self.allowed_math):
            return None
        out = got.get("out")
        try:
            return self.diagnose_out(case, out, expected, got.get("device", "cpu"))
        except Exception:
            return None

    def diagnose_out(self, case, out, expected, device: str) -> str | None:
        return None

    perf_hint = ""


def _has_elements(expected) -> bool:
    """Whether the answer has any element at all (an empty result needs no kernel launch)."""
    if isinstance(expected, torch.Tensor):
        return expected.numel() > 0
    if isinstance(expected, (tuple, list)):
        return any(_has_elements(e) for e in expected)
    return True


def _values(x):
    if isinstance(x, TensorInfo):
        return x.values
    return x if isinstance(x, torch.Tensor) else None


def check_tensor(got, expected64, dtype, rtol, atol, what: str = "") -> str | None:
    """dtype first, then values against the fp64 expectation."""
    prefix = f"{what}: " if what else ""
    if isinstance(got, TensorInfo) and got.dtype != _dt(dtype):
        return f"{prefix}wrong dtype: expected {_dt(dtype)}, got {got.dtype}"
    problem = close_tensors(got, expected64, rtol=rtol, atol=atol, check_dtype=False)
    return None if problem is None else prefix + problem


def _close(a, b, rtol=1e-3, atol=1e-4) -> bool:
    a, b = _values(a), _values(b)
    if a is None or b is None or a.shape != b.shape:
        return False
    return bool(torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True))


def _nan_where_finite(out, expected) -> torch.Tensor | None:
    v = _values(out)
    if v is None or tuple(v.shape) != tuple(expected.shape):
        return None
    return (~torch.isfinite(v.double())) & torch.isfinite(expected.double())


# ---- kernels.add ---------------------------------------------------------------------------------------
class VectorAdd(KernelExercise):
    id, entry, points = "kernels.add", "add", 1
    title = "vector add: programs, blocks and masks"
    timeout_s = 30.0

    def visible_cases(self):
        return [
            Case(
                (rand((1823,), seed=1), rand((1823,), seed=2)), label="1823 fp32: the last block is partial"
            ),
            Case(
                (rand((1,), torch.float16, seed=3), rand((1,), torch.float16, seed=4)),
                label="one fp16 element",
            ),
            Case(
                (rand((100,), seed=5, layout="strided"), rand((100,), seed=6)),
                label="x = buffer[1::3]: stride 3, storage offset 1",
            ),
        ]

    def hidden_cases(self):
        def build(n, dtype, sx, sy, seed):
            lx = "strided" if sx else "contiguous"
            ly = "strided" if sy else "contiguous"
            return Case(
                (
                    rand((n,), DT[dtype], seed=seed, layout=lx),
                    rand((n,), DT[dtype], seed=seed + 1, layout=ly),
                ),
                label=f"n={n} {dtype}, x {lx}, y {ly}",
            )

        sizes = st.sampled_from([0, 1, 2, 3, 31, 127, 128, 129, 1000, 1025, 1823, 3001])
        return draw(
            st.builds(
                build,
                sizes,
                st.sampled_from(["fp32", "fp32", "fp16", "bf16"]),
                st.booleans(),
                st.booleans(),
                st.integers(0, 10_000),
            ),
            14,
        )

    def expected(self, case):
        x, y = case.args
        return x + y  # torch computes fp16/bf16 sums in fp32 and rounds once, like the kernel

    def compare_out(self, case, out, expected, device):
        return close_tensors(out, expected)

    def diagnose_out(self, case, out, expected, device):
        x, y = case.args
        for t, name in ((x, "x"), (y, "y")):
            if t.numel() > 1 and t.stride(0) != 1:
                return (
                    f"{name} is not contiguous ({name}.stride(0) = {t.stride(0)}): element i lives at "
                    f"{name}_ptr + i * stride, so pass the stride to the kernel and multiply the offsets."
                )
        bad = _nan_where_finite(out, expected)
        if bad is not None and bad.any():
            first = int(bad.nonzero()[0])
            if bool(bad[first:].all()):
                return (
                    "the last elements were never written (they are still the NaN of torch.empty): the grid "
                    "must have triton.cdiv(n, BLOCK_SIZE) programs, not n // BLOCK_SIZE."
                )
            return (
                "NaN where the answer is finite: a load past the end reads the checker's guard bytes "
                "(NaN). Mask the loads of the last block."
            )
        return None


# ---- kernels.softmax ---------------------------------------------------------------------------------------
class Softmax(KernelExercise):
    id, entry, points = "kernels.softmax", "softmax", 2
    title = "fused row softmax"
    policy = Policy(banned=(*HOST_MATH, "softmax", "log_softmax", "Softmax", "special"),
                    why="the kernel must compute the softmax")
    perf_hint = (
        "a softmax reads and writes each element once: check that one program handles a whole row "
        "with enough warps (num_warps 8-16 for 4096 columns) and that loads are coalesced."
    )

    def visible_cases(self):
        return [
            Case((rand((5, 7), seed=1),), label="5 x 7 fp32: rows narrower than the block"),
            Case(
                (rand((3, 300), seed=2, scale=100.0),), label="3 x 300 fp32, values up to ~300: exp overflows"
            ),
            Case(
                (rand((4, 33), torch.float16, seed=3, layout="sliced"),),
                label="4 x 33 fp16 sliced out of a wider buffer: row stride 38",
            ),
            perf_case("softmax", (4096, 4096), "bfloat16", 1.0, "torch.softmax"),
        ]

    def hidden_cases(self):
        def build(m, n, dtype, layout, scale, seed):
            return Case(
                (rand((m, n), DT[dtype], seed=seed, layout=layout, scale=scale),),
                label=_label((m, n), DT[dtype], layout, f", values x{scale:g}"),
            )

        return draw(
            st.builds(
                build,
                st.sampled_from([0, 1, 2, 3, 5, 8]),
                st.sampled_from([1, 2, 7, 33, 100, 129, 300, 781]),
                st.sampled_from(["fp32", "fp32", "fp16", "bf16"]),
                st.sampled_from(["contiguous", "contiguous", "sliced", "transposed"]),
                st.sampled_from([1.0, 1.0, 50.0]),
                st.integers(0, 10_000),
            ),
            12,
        )

    def expected(self, case):
        (x,) = case.args
        if isinstance(x, dict):
            return PerfTarget("softmax", 1.0, tuple(x["shape"]), x["dtype"], "torch.softmax")
        return torch.softmax(x.double(), -1)

    def compare_out(self, case, out, expected, device):
        dtype = case.args[0].dtype
        return check_tensor(out, expected, dtype, *ROUNDING[dtype])

    def diagnose_out(self, case, out, expected, device):
        (x,) = case.args
        v = _values(out)
        bad = _nan_where_finite(out, expected)
        n = x.shape[1]
        if bad is not None and bad.any():
            cols = bad.any(0).nonzero().flatten()
            if len(cols) and int(cols[0]) > 0 and bool(bad[:, int(cols[0]) :].all()):
                return (
                    "the end of each row was never written: BLOCK_SIZE must cover the whole row, "
                    "triton.next_power_of_2(n_cols)."
                )
            if x.abs().max().item() > 80:
                return (
                    "exp overflowed (exp(x) is inf in fp32 past x = 88.7): subtract the row max first, "
                    "softmax(x) = exp(x - max) / sum(exp(x - max)), which changes nothing mathematically."
                )
            return (
                "NaN where the answer is finite: masked lanes must load -inf (other=-float('inf')), and a "
                "load past the end reads the checker's guard bytes (NaN)."
            )
        if v is not None and v.numel() and n > 1:
            sums = v.double().sum(-1)
            if bool((sums < 1 - 1e-2).any()) and (n & (n - 1)):
                return (
                    "the rows sum to less than 1: the masked lanes were counted in the sum. Load them as -inf "
                    "(other=-float('inf')) so that exp(-inf) = 0."
                )
        if not x.is_contiguous():
            return (
                f"x is not contiguous (strides {tuple(x.stride())}): row i starts at x_ptr + i * x.stride(0) and "
                f"column j is j * x.stride(1) further; pass both strides to the kernel."
            )
        return None


# ---- kernels.layer_norm_forward ---------------------------------------------------------------------------------------
def _ln_stats64(x, eps):
    x64 = x.double()
    mean = x64.mean(-1)
    var = ((x64 - mean[:, None]) ** 2).mean(-1)
    return mean, 1.0 / torch.sqrt(var + eps), var


class LayerNormForward(KernelExercise):
    id, entry, points = "kernels.layer_norm_forward", "layer_norm_forward", 2
    title = "layer norm forward, with the statistics saved for backward"
    policy = Policy(banned=(*HOST_MATH, "layer_norm", "native_layer_norm", "LayerNorm"),
                    why="the kernel must compute the layer norm")
    perf_hint = (
        "layer norm forward is memory-bound: one program per row, the whole row in registers, and "
        "num_warps large enough (8-16) for 8192 columns."
    )

    def visible_cases(self):
        return [
            self._case(4, 7, torch.float32, "contiguous", 1e-5, 1, "4 x 7 fp32"),
            self._case(
                3, 100, torch.float16, "sliced", 1e-5, 2, "3 x 100 fp16, x sliced from a wider buffer"
            ),
            perf_case("layer_norm_forward", (4096, 8192), "bfloat16", 1.0, "F.layer_norm"),
        ]

    @staticmethod
    def _case(m, n, dtype, layout, eps, seed, label=None):
        x = rand((m, n), dtype, seed=seed, layout=layout, scale=2.0)
        w = (1 + 0.5 * rand((n,), torch.float64, seed=seed + 1)).to(dtype)
        b = rand((n,), dtype, seed=seed + 2)
        return Case((x, w, b, eps), label=label or _label((m, n), dtype, layout, f", eps={eps:g}"))

    def hidden_cases(self):
        build = lambda m, n, dt, lay, eps, seed: self._case(m, n, DT[dt], lay, eps, seed)  # noqa: E731
        return draw(
            st.builds(
                build,
                st.sampled_from([0, 1, 2, 3, 5, 9]),
                st.sampled_from([1, 2, 5, 7, 33, 100, 257, 781]),
                st.sampled_from(["fp32", "fp32", "fp16", "bf16"]),
                st.sampled_from(["contiguous", "contiguous", "sliced", "transposed"]),
                st.sampled_from([1e-5, 1e-5, 1e-3]),
                st.integers(0, 10_000),
            ),
            12,
        )

    def expected(self, case):
        if isinstance(case.args[0], dict):
            spec = case.args[0]
            return PerfTarget("layer_norm_forward", 1.0, tuple(spec["shape"]), spec["dtype"], "F.layer_norm")
        x, w, b, eps = case.args
        y = F.layer_norm(x.double(), (x.shape[1],), w.double(), b.double(), eps)
        mean, rstd, _ = _ln_stats64(x, eps)
        return y, mean, rstd

    def compare_out(self, case, out, expected, device):
        x = case.args[0]
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            return f"expected a tuple (y, mean, rstd), got {describe(out)}"
        rtol, atol = ROUNDING[x.dtype]
        return (
            check_tensor(out[1], expected[1], torch.float32, 1e-5, 1e-5, "mean")
            or check_tensor(out[2], expected[2], torch.float32, 1e-5, 1e-6, "rstd")
            or check_tensor(out[0], expected[0], x.dtype, rtol, max(atol, rtol), "y")
        )

    def diagnose_out(self, case, out, expected, device):
        x, w, b, eps = case.args
        n = x.shape[1]
        mean, rstd, var = _ln_stats64(x, eps)
        got_mean, got_rstd = _values(out[1]), _values(out[2])
        if got_mean is not None and got_mean.shape == mean.shape and got_mean.numel():
            if not _close(got_mean, mean, 1e-4, 1e-4) and x.is_contiguous():
                return "the mean is off: divide the row sum by N (n_cols), not by BLOCK_SIZE."
        if got_rstd is not None and got_rstd.shape == rstd.shape and got_rstd.numel():
            gr = got_rstd.double()
            if n > 1 and _close(gr, 1 / torch.sqrt(var * n / (n - 1) + eps), 1e-4, 1e-6):
                return "unbiased variance: layer norm divides the squared deviations by N, not N - 1."
            if n == 1 and not bool(torch.isfinite(gr).all()):
                return "unbiased variance: with N = 1, dividing by N - 1 is 0/0; layer norm divides by N."
            if _close(gr, 1 / (torch.sqrt(var) + eps), 1e-4, 1e-6):
                return "eps goes inside the square root: rstd = 1 / sqrt(var + eps)."
            if n & (n - 1) and bool((gr < rstd * (1 - 1e-4)).all()):
                return (
                    "the variance is too large: the masked lanes (past N) were counted. After subtracting the "
                    "mean, zero them with tl.where(mask, x - mean, 0.0) before squaring."
                )
        if not x.is_contiguous():
            return f"x is not contiguous (strides {tuple(x.stride())}): pass its row and column strides to the kernel."
        return "mean and rstd are right, y is not: y = (x - mean) * rstd * weight + bias."


# ---- kernels.layer_norm_backward ---------------------------------------------------------------------------------------
class LayerNormBackward(KernelExercise):
    id, entry, points = "kernels.layer_norm_backward", "layer_norm_backward", 2
    title = "layer norm backward: dx per row, dweight and dbias across rows"
    policy = Policy(banned=(*HOST_MATH, "layer_norm", "native_layer_norm", "native_layer_norm_backward",
                            "LayerNorm", *AUTOGRAD), why="the kernels must compute the gradients")
    allowed_math = frozenset({"sum"})  # the last stage of the dweight/dbias reduction may be a torch .sum(0)
    perf_hint = (
        "the backward is memory-bound too: dx one row per program, and the partial dweight/dbias rows "
        "summed by a fixed number of programs (about 2 per SM), not by one program per row."
    )

    @staticmethod
    def _case(m, n, dtype, lx, ldy, seed, label=None):
        x = rand((m, n), dtype, seed=seed, layout=lx, scale=2.0)
        w = (1 + 0.5 * rand((n,), torch.float64, seed=seed + 1)).to(dtype)
        dy = rand((m, n), dtype, seed=seed + 2, layout=ldy)
        _, mean, rstd = torch.native_layer_norm(x.float(), [n], None, None, 1e-5)
        return Case(
            (dy, x, w, mean.view(m), rstd.view(m)), label=label or _label((m, n), dtype, lx, f", dy {ldy}")
        )

    def visible_cases(self):
        return [
            self._case(4, 7, torch.float32, "contiguous", "contiguous", 1, "4 x 7 fp32"),
            self._case(6, 33, torch.float16, "contiguous", "sliced", 2, "6 x 33 fp16, dy sliced"),
            perf_case(
                "layer_norm_backward", (4096, 8192), "bfloat16", 1.0, "aten.native_layer_norm_backward"
            ),
        ]

    def hidden_cases(self):
        build = lambda m, n, dt, lx, ldy, seed: self._case(m, n, DT[dt], lx, ldy, seed)  # noqa: E731
        layouts = st.sampled_from(["contiguous", "contiguous", "sliced", "transposed"])
        return draw(
            st.builds(
                build,
                st.sampled_from([1, 2, 3, 5, 9, 17]),
                st.sampled_from([1, 2, 5, 7, 33, 100, 257]),
                st.sampled_from(["fp32", "fp32", "fp16", "bf16"]),
                layouts,
                layouts,
                st.integers(0, 10_000),
            ),
            10,
        )

    def expected(self, case):
        if isinstance(case.args[0], dict):
            spec = case.args[0]
            return PerfTarget(
                "layer_norm_backward",
                1.0,
                tuple(spec["shape"]),
                spec["dtype"],
                "aten.native_layer_norm_backward",
            )
        dy, x, w, _, _ = case.args
        x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
        b64 = torch.zeros_like(w64, requires_grad=True)
        y = F.layer_norm(x64, (x.shape[1],), w64, b64, 1e-5)
        return torch.autograd.grad(y, (x64, w64, b64), dy.double())

    def compare_out(self, case, out, expected, device):
        dy, x, w, _, _ = case.args
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            return f"expected a tuple (dx, dweight, dbias), got {describe(out)}"
        rtol, _ = ROUNDING[x.dtype]
        loose = max(rtol, 1e-4)
        return (
            check_tensor(out[0], expected[0], x.dtype, loose, loose, "dx")
            or check_tensor(out[1], expected[1], w.dtype, loose, loose, "dweight")
            or check_tensor(out[2], expected[2], w.dtype, loose, loose, "dbias")
        )

    def diagnose_out(self, case, out, expected, device):
        dy, x, w, mean, rstd = case.args
        dx, dw, db = (_values(o) for o in out)
        for name, t in (("dweight", dw), ("dbias", db)):
            if t is not None and not bool(torch.isfinite(t.double()).all()):
                return (
                    f"{name} has NaN: a buffer from torch.empty was summed before every element was written. "
                    f"Accumulate into torch.zeros, or make sure each partial row is stored."
                )
        xhat = (x.double() - mean.double()[:, None]) * rstd.double()[:, None]
        if dw is not None and _close(dw, (dy.double() * x.double()).sum(0), 1e-3, 1e-3):
            return "dweight sums dy * xhat, the normalized x, not dy * x."
        if db is not None and not _close(db, expected[2], 1e-2, 1e-2):
            return "dbias is the column sum of dy over all rows."
        if dx is not None and dx.numel():
            wdy = w.double() * dy.double()
            c1 = (xhat * wdy).mean(-1, keepdim=True)
            c2 = wdy.mean(-1, keepdim=True)
            r = rstd.double()[:, None]
            if _close(dx, (wdy - c2) * r, 1e-2, 1e-2):
                return (
                    "dx is missing the term xhat * mean(xhat * w * dy): dx = (wdy - (xhat * c1 + c2)) * rstd."
                )
            if _close(dx, (wdy - xhat * c1) * r, 1e-2, 1e-2):
                return "dx is missing the term mean(w * dy): dx = (wdy - (xhat * c1 + c2)) * rstd."
        if not (x.is_contiguous() and dy.is_contiguous()):
            return "x or dy is not contiguous: pass their row and column strides to the kernel."
        return None


# ---- kernels.grouped_tile_order ---------------------------------------------------------------------------------------
def grouped_order(num_pid_m: int, num_pid_n: int, group_size_m: int) -> list[tuple[int, int]]:
    """The grouped launch order, built group by group (not by the kernel's index arithmetic)."""
    order = []
    for first in range(0, num_pid_m, group_size_m):
        rows = range(first, min(first + group_size_m, num_pid_m))
        for n in range(num_pid_n):
            order.extend((m, n) for m in rows)
    return order


class GroupedTileOrder(Exercise):
    id, entry, points = "kernels.grouped_tile_order", "grouped_tile_order", 1
    title = "grouped program order, in plain Python"

    def visible_cases(self):
        return [
            Case((4, 4, 1), label="group_size_m = 1 is row-major order"),
            Case((4, 4, 2), label="groups of 2 tile-rows"),
            Case((5, 3, 2), label="5 tile-rows in groups of 2: the last group has 1 row"),
        ]

    def hidden_cases(self):
        return [
            Case(args)
            for args in draw(st.tuples(st.integers(1, 9), st.integers(1, 9), st.integers(1, 10)), 40)
        ]

    def expected(self, case):
        return grouped_order(*case.args)

    def compare(self, case, got, expected):
        return same_value(got, expected)

    def diagnose(self, case, got, expected):
        m, n, gsize = case.args
        if not isinstance(got, (list, tuple)):
            return None
        got = [tuple(p) if isinstance(p, (list, tuple)) else p for p in got]
        if got == [(i, j) for i in range(m) for j in range(n)]:
            return "this is row-major order: group_size_m tile-rows are walked together, down first, then across."
        if any(isinstance(p, tuple) and len(p) == 2 and p[1] >= n for p in got):
            return (
                "a pid_n past the last tile-column: a group holds group_size_m * num_pid_n programs "
                "(num_pid_in_group), and pid_n = (pid % num_pid_in_group) // group_size."
            )
        if any(isinstance(p, tuple) and len(p) == 2 and p[0] >= m for p in got):
            return (
                "a pid_m past the last tile-row: the last group may be shorter, "
                "group_size = min(num_pid_m - first_pid_m, group_size_m)."
            )
        if sorted(got, key=str) == sorted(expected, key=str):
            return "every tile appears, in the wrong order: inside a group pid_m changes fastest (down a column of tiles)."
        return None


# ---- kernels.matmul ---------------------------------------------------------------------------------------
class Matmul(KernelExercise):
    id, entry, points = "kernels.matmul", "matmul", 3
    title = "blocked matmul with tl.dot and grouped ordering"
    policy = Policy(banned=(*HOST_MATH, "@", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "tensordot", "linear",
                            "Linear", "__matmul__", "mv", "addmv", "chain_matmul", "multi_dot"),
                    why="the kernel must compute the product (tl.dot on tiles)")
    timeout_s = 180.0  # on a GPU: compiling and autotuning the configs, then the 4096^3 benchmarks
    perf_hint = (
        "at 4096^3 a matmul is compute-bound: autotune BLOCK_M/N/K (128x256x64 or 128x128x64), "
        "num_stages 3-4 and num_warps 4-8, and use the grouped order so tiles are reused from L2."
    )

    @staticmethod
    def _case(m, n, k, dtype, la, lb, seed, label=None):
        a = rand((m, k), dtype, seed=seed, layout=la)
        b = rand((k, n), dtype, seed=seed + 1, layout=lb)
        return Case((a, b), label=label or f"({m}, {k}) @ ({k}, {n}) {_dt(dtype)}, a {la}, b {lb}")

    def visible_cases(self):
        return [
            self._case(37, 29, 50, torch.float32, "contiguous", "contiguous", 1),
            self._case(64, 33, 70, torch.float16, "contiguous", "transposed", 2),
            perf_case("matmul", (4096, 4096, 4096), "float16", 0.9, "cuBLAS (torch.matmul)"),
            perf_case("matmul", (4096, 4096, 4096), "bfloat16", 0.9, "cuBLAS (torch.matmul)"),
        ]

    def hidden_cases(self):
        build = lambda m, n, k, dt, la, lb, seed: self._case(m, n, k, DT[dt], la, lb, seed)  # noqa: E731
        lay = st.sampled_from(["contiguous", "contiguous", "transposed", "sliced"])
        cases = draw(
            st.builds(
                build,
                st.sampled_from([1, 3, 16, 37, 64, 77]),
                st.sampled_from([1, 5, 16, 40, 65]),
                st.sampled_from([1, 7, 16, 33, 70, 100]),
                st.sampled_from(["fp32", "fp16", "fp16", "bf16"]),
                lay,
                lay,
                st.integers(0, 10_000),
            ),
            8,
        )
        return cases + [
            self._case(0, 5, 7, torch.float32, "contiguous", "contiguous", 3),
            self._case(6, 5, 0, torch.float16, "contiguous", "contiguous", 4, "K = 0: C is all zeros"),
        ]

    def expected(self, case):
        if isinstance(case.args[0], dict):
            spec = case.args[0]
            return PerfTarget("matmul", 0.9, tuple(spec["shape"]), spec["dtype"], "cuBLAS (torch.matmul)")
        a, b = case.args
        return a.double() @ b.double()

    @staticmethod
    def tolerance(dtype, k, device):
        """(rtol, atol). fp32 tl.dot uses TF32 on a GPU (10-bit mantissa): looser there."""
        if dtype == torch.float32:
            return (
                (2e-3, 2e-3 * math.sqrt(max(k, 1)))
                if device == "cuda"
                else (1e-5, 1e-5 * math.sqrt(max(k, 1)))
            )
        if dtype == torch.float16:
            return 2e-3, 1e-3 * math.sqrt(max(k, 1))
        return 1.6e-2, 8e-3 * math.sqrt(max(k, 1))

    def compare_out(self, case, out, expected, device):
        a, b = case.args
        return check_tensor(out, expected, a.dtype, *self.tolerance(a.dtype, a.shape[1], device))

    def diagnose_out(self, case, out, expected, device):
        a, b = case.args
        v = _values(out)
        bad = _nan_where_finite(out, expected)
        if bad is not None and bad.any():
            if a.shape[1] and bool(bad.all(1).any() or bad.all(0).any()) and not bool(bad.all()):
                return (
                    "whole tiles of C are NaN (never written): two programs computed the same tile and others "
                    "none. Check the grouped order: each pid must map to a distinct (pid_m, pid_n)."
                )
            return (
                "NaN where the answer is finite: the last K-step reads past the end of a row. Mask it: "
                "offs_k < K - k * BLOCK_K, with other=0.0 so the padding adds nothing."
            )
        k = a.shape[1]
        if v is not None and k:
            for block in (16, 32, 64, 128):
                if k > block:
                    last = (k - 1) // block * block
                    if _close(v, a[:, last:].double() @ b[last:].double(), 1e-2, 1e-2):
                        return "only the last K-step is in C: accumulate, acc += tl.dot(a, b) (or acc = tl.dot(a, b, acc))."
        if not (a.is_contiguous() and b.is_contiguous()):
            return (
                f"a has strides {tuple(a.stride())}, b {tuple(b.stride())}: address A[m, k] as a_ptr + m * stride_am "
                f"+ k * stride_ak (and B likewise); do not assume contiguous inputs."
            )
        return None


# ---- kernels.flash_attention ---------------------------------------------------------------------------------------
class FlashAttention(KernelExercise):
    id, entry, points = "kernels.flash_attention", "flash_attention", 3
    title = "flash attention forward: online softmax over K/V tiles"
    policy = Policy(banned=(*HOST_MATH, "@", "scaled_dot_product_attention", "softmax", "matmul", "bmm", "baddbmm",
                            "einsum", "MultiheadAttention", "multi_head_attention_forward"),
                    why="the kernel must compute attention")
    timeout_s = 180.0  # on a GPU: compiling and autotuning the configs, then the benchmarks
    perf_hint = (
        "attention is compute-bound: 128-row Q tiles, 64-128-row K/V tiles, exp2 with the scale folded "
        "in, num_stages 2-4, and for causal, skip the key blocks right of the diagonal."
    )

    @staticmethod
    def _case(b, h, sq, sk, d, causal, dtype, layout, seed, label=None):
        q = rand((b, h, sq, d), dtype, seed=seed, layout=layout)
        k = rand((b, h, sk, d), dtype, seed=seed + 1, layout=layout)
        v = rand((b, h, sk, d), dtype, seed=seed + 2, layout=layout)
        text = f"q ({b}, {h}, {sq}, {d}), k/v Sk={sk}, {_dt(dtype)}, {'causal' if causal else 'not causal'}"
        return Case(
            (q, k, v, causal), label=label or text + ("" if layout == "contiguous" else f", {layout}")
        )

    def visible_cases(self):
        return [
            self._case(1, 2, 40, 40, 16, False, torch.float32, "contiguous", 1),
            self._case(1, 2, 40, 40, 16, True, torch.float32, "contiguous", 2),
            self._case(1, 1, 70, 70, 32, True, torch.float16, "contiguous", 3),
            perf_case("attention", (4, 16, 4096, 64), "bfloat16", 0.8, "SDPA's FlashAttention-2 backend"),
            perf_case(
                "attention",
                (4, 16, 4096, 64),
                "bfloat16",
                0.8,
                "SDPA's FlashAttention-2 backend",
                causal=True,
            ),
        ]

    def hidden_cases(self):
        build = lambda b, h, sq, sk, d, c, dt, lay, seed: self._case(b, h, sq, sk, d, c, DT[dt], lay, seed)  # noqa: E731
        seqs = st.sampled_from([1, 17, 40, 65, 100])
        return draw(
            st.builds(
                build,
                st.integers(1, 2),
                st.integers(1, 2),
                seqs,
                seqs,
                st.sampled_from([16, 32, 64]),
                st.booleans(),
                st.sampled_from(["fp32", "fp16", "fp16", "bf16"]),
                st.sampled_from(["contiguous", "contiguous", "bshd"]),
                st.integers(0, 10_000),
            ),
            8,
        )

    def expected(self, case):
        if isinstance(case.args[0], dict):
            spec = case.args[0]
            return PerfTarget(
                "attention",
                0.8,
                tuple(spec["shape"]),
                spec["dtype"],
                "SDPA's FlashAttention-2 backend",
                bool(spec.get("causal", False)),
            )
        q, k, v, causal = case.args
        return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)

    @staticmethod
    def tolerance(dtype, device):
        if dtype == torch.float32:
            return (1e-2, 1e-2) if device == "cuda" else (1e-4, 1e-5)  # TF32 tl.dot on a GPU
        return (5e-3, 5e-3) if dtype == torch.float16 else (3e-2, 3e-2)

    def compare_out(self, case, out, expected, device):
        q = case.args[0]
        return check_tensor(out, expected, q.dtype, *self.tolerance(q.dtype, device))

    def diagnose_out(self, case, out, expected, device):
        q, k, v, causal = case.args
        v_out = _values(out)
        if v_out is None or tuple(v_out.shape) != tuple(expected.shape):
            return None
        q64, k64, v64 = q.double(), k.double(), v.double()
        sdpa = F.scaled_dot_product_attention
        bad = _nan_where_finite(out, expected)
        if causal and bad is not None and bool(bad[..., 0, :].all()):
            return (
                "row 0 has no key left: the causal mask must keep the diagonal, key j is visible to query i "
                "when j <= i."
            )
        if causal and _close(v_out, sdpa(q64, k64, v64, is_causal=False), 1e-2, 1e-2):
            return "causal=True, but every query attended every key: mask key j > query i with -inf."
        if not causal and _close(v_out, sdpa(q64, k64, v64, is_causal=True), 1e-2, 1e-2):
            return "causal=False, but the result is causal: apply the mask only when causal is set."
        if _close(v_out, sdpa(q64, k64, v64, is_causal=causal, scale=1.0), 1e-2, 1e-2):
            return "the scores are not scaled: softmax(q k^T / sqrt(D)) v."
        sk = k.shape[2]
        for blk in (16, 32, 64, 128):
            pad = (sk + blk - 1) // blk * blk
            if pad == sk:
                continue
            kp = torch.cat([k64, k64.new_zeros(*k64.shape[:2], pad - sk, k64.shape[3])], 2)
            vp = torch.cat([v64, v64.new_zeros(*v64.shape[:2], pad - sk, v64.shape[3])], 2)
            if _close(v_out, sdpa(q64, kp, vp, is_causal=False), 1e-2, 1e-2) and not causal:
                return (
                    "keys past Sk were counted (a masked load gives them score 0, not -inf): set the scores of "
                    "the ragged last block to -inf."
                )
        if bad is not None and bad.any():
            return "NaN where the answer is finite: mask the loads of the ragged last Q and K/V blocks."
        if not (q.is_contiguous() and k.is_contiguous()):
            return (
                f"q, k and v are strided here (q.stride() = {tuple(q.stride())}): address them with all four "
                f"strides each, never assuming (B, H, S, D) is contiguous."
            )
        return (
            "when the running max grows, both the running sum l and the accumulator must be rescaled by "
            "alpha = exp(m_old - m_new) before the new block is added."
        )


# ---- kernels.custom_op ---------------------------------------------------------------------------------------
def _ln_inputs(m, n, dtype=torch.float32, seed=0, layout="contiguous"):
    x = rand((m, n), dtype, seed=seed, layout=layout, scale=2.0)
    w = (1 + 0.5 * rand((n,), torch.float64, seed=seed + 1)).to(dtype)
    b = rand((n,), dtype, seed=seed + 2)
    return x, w, b


def _train_data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 12, generator=g)
    y = torch.sin(x[:, :3].sum(-1, keepdim=True))
    return x, y


OPCHECK_HINTS = {
    "test_faketensor": (
        "the fake (register_fake) must return what the real op returns, without computing: same "
        "shapes, dtypes and strides (y contiguous like x's shape; mean and rstd of shape (M,), float32)."
    ),
    "test_autograd_registration": (
        "register the gradient with layer_norm_op.register_autograd(backward, setup_context=setup_context)."
    ),
    "test_schema": (
        "the op must not modify or return its inputs (mutates_args=()): return new tensors, "
        "not views of x, weight or bias."
    ),
    "test_aot_dispatch_dynamic": (
        "tracing with fake tensors failed: the backward must call ops torch can trace, e.g. "
        "your backward custom op (a Triton launch on fake tensors cannot run)."
    ),
}


class CustomOp(Exercise):
    id, entry, points = "kernels.custom_op", "layer_norm_op", 2
    title = "a Triton kernel as a PyTorch operator: custom_op, register_fake, register_autograd"
    policy = Policy(banned=("layer_norm", "native_layer_norm", "LayerNorm"),
                    why="register your own Triton layer norm")
    probe = "ptinternals.checks.probes.kernels:custom_op_case"
    gpu = True
    timeout_s = 90.0

    def visible_cases(self):
        x, w, b = _ln_inputs(5, 24, seed=1)
        dy = rand((5, 24), seed=4)
        return [
            Case(("is_custom_op",), label="layer_norm_op is a torch.library custom op"),
            Case(("forward", x, w, b, 1e-5), label="forward: (y, mean, rstd) like 7.3"),
            Case(("grad", x, w, b, dy, 1e-5), label="backward through register_autograd"),
            Case(("opcheck", *_ln_inputs(6, 20, seed=5), 1e-5), label="torch.library.opcheck passes"),
            Case(
                ("compile", *_ln_inputs(4, 16, seed=6), 1e-5), label="torch.compile(fullgraph=True) traces it"
            ),
            Case(("train", *_train_data()), label="a small model trains with it like with F.layer_norm"),
        ]

    def hidden_cases(self):
        xf, wf, bf = _ln_inputs(3, 40, torch.float16, seed=7)
        return [
            Case(
                ("opcheck", *_ln_inputs(7, 9, seed=8, layout="transposed"), 1e-5),
                label="opcheck on a transposed x",
            ),
            Case(("opcheck", xf, wf, bf, 1e-5), label="opcheck in fp16"),
            Case(("forward", xf, wf, bf, 1e-3), label="forward in fp16"),
            Case(
                ("grad", *_ln_inputs(9, 33, seed=9, layout="sliced"), rand((9, 33), seed=10), 1e-5),
                label="backward, x sliced",
            ),
        ]

    def expected(self, case):
        kind, *args = case.args
        if kind == "is_custom_op":
            return {"is_custom_op": True}
        if kind == "forward":
            return LayerNormForward().expected(Case(tuple(args)))
        if kind in ("grad", "compile"):
            x, w, b = args[:3]
            eps = args[-1]
            x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
            y = F.layer_norm(x64, (x.shape[1],), w64, b64, eps)
            if kind == "grad":
                return torch.autograd.grad(y, (x64, w64, b64), args[3].double())
            return torch.autograd.grad((y * y).sum(), (x64, w64, b64))
        if kind == "opcheck":
            return "all opcheck tests pass"
        if kind == "train":
            x, y = args
            return small_model_losses(lambda h, w, b, eps: F.layer_norm(h, (h.shape[1],), w, b, eps), x, y)
        raise ValueError(kind)

    def compare(self, case, got, expected):
        kind, *args = case.args
        if kind == "is_custom_op":
            if not isinstance(got, dict) or not got.get("is_custom_op"):
                kind_of = got.get("type") if isinstance(got, dict) else describe(got)
                return (
                    f"layer_norm_op is a {kind_of}, not a custom op: decorate it with "
                    f'@torch.library.custom_op("kernels::layer_norm", mutates_args=())'
                )
            return None
        if kind == "forward":
            return LayerNormForward().compare_out(Case(tuple(args)), got, expected, "cpu")
        if kind in ("grad", "compile"):
            x, w, b = args[:3]
            if not isinstance(got, (tuple, list)) or len(got) != 3:
                return f"expected gradients for (x, weight, bias), got {describe(got)}"
            loose = max(ROUNDING[x.dtype][0], 1e-4) * (10 if kind == "compile" else 1)
            for name, g, e in zip(("x.grad", "weight.grad", "bias.grad"), got, expected, strict=False):
                problem = check_tensor(g, e, x.dtype, loose, loose, name)
                if problem:
                    return problem
            return None
        if kind == "opcheck":
            if not isinstance(got, dict):
                return f"the grader could not read the opcheck result: {describe(got)}"
            failed = {k: v for k, v in got.items() if v != "SUCCESS"}
            if failed:
                return "torch.library.opcheck failed:\n" + "\n".join(
                    f"    {k}: {str(v)[:300]}" for k, v in failed.items()
                )
            return None
        if kind == "train":
            if not isinstance(got, (list, tuple)) or len(got) != len(expected):
                return f"expected {len(expected)} losses, got {describe(got)}"
            for i, (g, e) in enumerate(zip(got, expected, strict=True)):
                if not isinstance(g, float) or not math.isclose(g, e, rel_tol=2e-3, abs_tol=1e-5):
                    return (
                        f"the loss at step {i} differs from the same model trained with F.layer_norm: "
                        f"expected {e:.6g}, got {describe(g)}\n  expected losses {[round(v, 5) for v in expected]}"
                        f"\n       got losses {[round(v, 5) if isinstance(v, float) else v for v in got]}"
                    )
            return None
        return "unknown check"

    def diagnose(self, case, got, expected):
        kind = case.args[0]
        if kind == "opcheck" and isinstance(got, dict):
            for test, hint in OPCHECK_HINTS.items():
                if got.get(test, "SUCCESS") != "SUCCESS":
                    return hint
        if kind in ("grad", "compile") and isinstance(got, (tuple, list)) and len(got) == 3:
            if _close(got[1], expected[2]) and _close(got[2], expected[1]):
                return "dweight and dbias are swapped: backward returns gradients in the order of the op's inputs."
            return (
                "backward returns (dx, dweight, dbias, None): one gradient per input of the op, None for eps."
            )
        if kind == "forward":
            return "the op's forward should return your layer_norm_forward's (y, mean, rstd) unchanged."
        if kind == "train" and isinstance(got, (list, tuple)) and got and isinstance(got[0], float):
            if math.isclose(got[0], expected[0], rel_tol=2e-3):
                return (
                    "step 0's loss matches, so the forward is right and the gradients are not: backward "
                    "returns (dx, dweight, dbias, None), in the order of the op's inputs."
                )
            return "the very first loss differs: the op's forward does not compute layer norm's y."
        return None


EXERCISES = [
    VectorAdd(),
    Softmax(),
    LayerNormForward(),
    LayerNormBackward(),
    GroupedTileOrder(),
    Matmul(),
    FlashAttention(),
    CustomOp(),
]
CHAPTER = Chapter("kernels", exercises=EXERCISES)
