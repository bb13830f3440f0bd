"""The amp chapter's graded exercises: cases, expected answers from real torch, and likely causes.

Every expected answer comes from torch itself: bit patterns from ``tensor.to(dtype).view(int)``,
scale updates from ``torch._amp_update_scale_``, scaler trajectories from ``torch.amp.GradScaler``,
layer dtypes from running the layers under real autocast (on a CPU-only grader, CUDA's autocast runs
on fake CUDA tensors: the real dispatcher and the real AutocastCUDA kernels, no GPU needed), and the
training reference from ``torch.autocast`` + ``torch.amp.GradScaler``. The probes that drive a
student's class or trainer live in ``ptinternals.checks.probes.amp`` (sandbox side).

The ``_encode_variant`` helper reproduces the common rounding mistakes (ties away from zero,
truncation, flushing subnormals, saturating instead of overflowing to inf) so that a wrong bit
pattern can be named.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from ..amp.scaffold import scaler_trajectory
from ..grading._runtime import Raised, TensorInfo, Unsupported
from ..grading.cases import draw
from ..grading.compare import describe, same_value
from ..grading.exercise import Case, Chapter, Exercise
from ..grading.policy import LOW_PRECISION_CASTS, STRUCT_LIKE, Policy
from .probes import amp as probes

# name -> (exponent bits, mantissa bits, has inf, torch dtype)
FORMATS = {
    "fp32": (8, 23, True, torch.float32),
    "bf16": (8, 7, True, torch.bfloat16),
    "fp16": (5, 10, True, torch.float16),
    "fp8_e5m2": (5, 2, True, torch.float8_e5m2),
    "fp8_e4m3fn": (4, 3, False, torch.float8_e4m3fn),
}
_INT_OF_WIDTH = {8: torch.uint8, 16: torch.int16, 32: torch.int32}
NO_SOLUTION_MODULES = ("torch", "numpy", "struct")


def _width(fmt: str) -> int:
    e, m, _, _ = FORMATS[fmt]
    return 1 + e + m


def torch_value_of_bits(bits: int, fmt: str) -> float:
    """What torch says the bit pattern ``bits`` of ``fmt`` is worth, as a Python float."""
    w = _width(fmt)
    signed = bits - (1 << w) if w > 8 and bits >= (1 << (w - 1)) else bits
    t = torch.tensor([signed], dtype=torch.int64).to(_INT_OF_WIDTH[w])
    return t.view(FORMATS[fmt][3]).double().item()


def torch_bits_of_value(value: float, fmt: str) -> int:
    """``value`` rounded by torch into ``fmt``, as an unsigned bit pattern (via float32 for narrow formats)."""
    w = _width(fmt)
    src = torch.tensor([value], dtype=torch.float64)
    if fmt != "fp32":
        src = src.to(torch.float32)  # the cases hold float32 values for the narrow formats: exact
    out = src.to(FORMATS[fmt][3]).view(_INT_OF_WIDTH[w]).to(torch.int64).item()
    return out & ((1 << w) - 1)


def fields_of(bits: int, fmt: str) -> tuple[int, int, int]:
    e, m, _, _ = FORMATS[fmt]
    return bits >> (e + m), (bits >> m) & ((1 << e) - 1), bits & ((1 << m) - 1)


def is_nan_fields(sign_exp_mant, fmt: str) -> bool:
    e, m, has_inf, _ = FORMATS[fmt]
    _, exp, mant = sign_exp_mant
    if has_inf:
        return exp == (1 << e) - 1 and mant != 0
    return exp == (1 << e) - 1 and mant == (1 << m) - 1


def _round_shift(v: int, shift: int, ties: str) -> int:
    if shift <= 0:
        return v << -shift
    q, rem, half = v >> shift, v & ((1 << shift) - 1), 1 << (shift - 1)
    if ties == "trunc":
        return q
    if rem > half or (rem == half and (ties == "away" or q & 1)):
        q += 1
    return q


def _encode_variant(value: float, fmt: str, *, ties: str = "even", subnormals: bool = True,
                    overflow: str = "inf") -> int:
    """``value`` rounded into ``fmt``: IEEE by default; the keyword arguments reproduce common bugs."""
    e_bits, m_bits, has_inf, _ = FORMATS[fmt]
    width, bias = 1 + e_bits + m_bits, (1 << (e_bits - 1)) - 1
    all_ones = (1 << e_bits) - 1
    max_finite = ((all_ones - 1) << m_bits | ((1 << m_bits) - 1)) if has_inf else (all_ones << m_bits | ((1 << m_bits) - 2))
    nan = (all_ones << m_bits | (1 << (m_bits - 1))) if has_inf else (1 << (width - 1)) - 1
    sign = (1 << (width - 1)) if math.copysign(1.0, value) < 0 else 0
    if math.isnan(value):
        return nan
    over = sign | ((all_ones << m_bits) if has_inf and overflow == "inf" else max_finite)
    if math.isinf(value):
        return over
    a = abs(value)
    if a == 0.0:
        return sign
    emin = 1 - bias
    m, e = math.frexp(a)
    big_m, big_e, unbiased = int(m * (1 << 53)), e - 53, e - 1
    if not subnormals and unbiased < emin:
        return sign  # flush to zero
    q = _round_shift(big_m, max(unbiased, emin) - m_bits - big_e, ties)
    if q == 0:
        return sign
    if q < (1 << m_bits):
        magnitude = q
    else:
        magnitude = ((max(unbiased, emin) + bias) << m_bits) + (q - (1 << m_bits))
    return over if magnitude > max_finite else sign | magnitude


ROUNDING_BUGS = (  # (variant keywords, what it means), the most specific first
    (dict(overflow="saturate"), "a value that rounds past the largest finite number becomes inf (all-ones "
                                "exponent, zero mantissa), not the largest finite number."),
    (dict(ties="away"), "ties must go to the EVEN neighbour (last kept bit 0), not away from zero: exactly half "
                        "an ulp rounds 1 + 2**-8 down to 1.0 in bf16 (round-half-up gives 1 + 2**-7)."),
    (dict(ties="trunc"), "the dropped bits are truncated: round to nearest instead (add half an ulp, then fix "
                         "exact ties to even)."),
    (dict(subnormals=False), "values below the smallest normal must become subnormals (exponent field 0, no "
                             "implicit 1), not zero: that gradual underflow is what fp16 gradients live on."),
)


def rounding_hint(value: float, fmt: str, got_bits: int) -> str | None:
    """Name the rounding mistake that turns ``value`` into ``got_bits`` in ``fmt``, if a known one does."""
    if math.isnan(value):
        e, m, _, _ = FORMATS[fmt]
        if not is_nan_fields(fields_of(got_bits, fmt), fmt):
            return ("a NaN input must give a NaN (all-ones exponent, nonzero mantissa): rounding the bits of a "
                    "NaN can carry into the exponent or the sign, so handle NaN before rounding.")
        return None
    for kwargs, why in ROUNDING_BUGS:
        if _encode_variant(value, fmt, **kwargs) == got_bits != _encode_variant(value, fmt):
            return why
    return None


def _bits_label(bits: int, fmt: str) -> str:
    return f"0x{bits:0{_width(fmt) // 4}X} = {torch_value_of_bits(bits, fmt)!r}"


def _float32_values():
    """Any float32 value, including subnormals, infinities and NaN (as a Python float)."""
    return st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)


def _ties(fmt: str):
    """Values exactly halfway between two neighbours of ``fmt``: normal, subnormal, and at the top binade
    (where rounding up carries into the next exponent, or overflows). float32 values unless fmt is fp32."""
    e_bits, m_bits, _, _ = FORMATS[fmt]
    bias = (1 << (e_bits - 1)) - 1
    emin = 1 - bias

    def build(j, e, subnormal, neg):
        if subnormal:  # between j and j + 1 units of the smallest subnormal
            v = (j + 0.5) * 2.0 ** (emin - m_bits)
        else:  # between mantissas j and j + 1 at exponent e (j = all ones: carries into e + 1)
            v = ((1 << m_bits) + j + 0.5) * 2.0 ** (e - m_bits)
        return -v if neg else v

    j = st.integers(0, (1 << m_bits) - 1) | st.sampled_from([0, 1, (1 << m_bits) - 2, (1 << m_bits) - 1])
    return st.builds(build, j, st.integers(emin, bias), st.integers(0, 4).map(lambda k: k == 0), st.booleans())


# =================================================================================================
# amp.decode decode
# =================================================================================================
class Decode(Exercise):
    id, entry, points = "amp.decode", "decode", 1
    title = "what a bit pattern is worth"
    policy = Policy(banned=STRUCT_LIKE, why="work on the bits with integer arithmetic")
    forbid = NO_SOLUTION_MODULES

    def visible_cases(self):
        return [Case((0x3C00, "fp16"), label="fp16 1.0: exponent 15 = bias, mantissa 0"),
                Case((0xC000, "fp16"), label="fp16 -2.0"),
                Case((0x0001, "fp16"), label="the smallest fp16 subnormal, 2**-24"),
                Case((0x8000, "fp16"), label="negative zero"),
                Case((0x7C00, "fp16"), label="fp16 +inf"),
                Case((0x7E00, "fp16"), label="an fp16 NaN"),
                Case((0x3F80, "bf16"), label="bf16 1.0"),
                Case((0x3DCCCCCD, "fp32"), label="fp32 0.1"),
                Case((0x7E, "fp8_e4m3fn"), label="e4m3fn 448: the all-ones exponent is a number here"),
                Case((0x7F, "fp8_e4m3fn"), label="e4m3fn NaN: S.1111.111")]

    def hidden_cases(self):
        def case(fmt, r):
            w = _width(fmt)
            return Case((r % (1 << w), fmt))

        edges = [Case((b, f)) for f in FORMATS for b in (0, 1, (1 << (_width(f) - 1)), (1 << _width(f)) - 1)]
        return edges + draw(st.builds(case, st.sampled_from(list(FORMATS)), st.integers(0, 2**32 - 1)), 100)

    def expected(self, case):
        return torch_value_of_bits(*case.args)

    def compare(self, case, got, expected):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return f"expected a Python float {expected!r}\n     got {describe(got)}"
        got = float(got)
        if math.isnan(expected):
            return None if math.isnan(got) else f"expected nan\n     got {got!r}"
        # The sign of a zero is not compared: the grading boundary carries -0.0 back as 0.0.
        if got != expected:
            return f"expected {expected!r}\n     got {got!r}"
        return None

    def diagnose(self, case, got, expected):
        bits, fmt = case.args
        e, m, has_inf, _ = FORMATS[fmt]
        sign, exp, mant = fields_of(bits, fmt)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return None
        got = float(got)
        if not has_inf and exp == (1 << e) - 1 and not math.isfinite(got):
            return ("fp8_e4m3fn has no infinities: an all-ones exponent is an ordinary normal number; only "
                    "S.1111.111 is NaN.")
        if math.isnan(expected) or math.isinf(expected):
            return "an all-ones exponent means inf (mantissa 0) or NaN (mantissa != 0) in IEEE formats."
        if got == -expected and expected != 0:
            return f"the top bit (bit {1 + e + m - 1}) is the sign: 1 means negative."
        bias = (1 << (e - 1)) - 1
        if exp == 0 and mant and got == math.copysign(math.ldexp((1 << m) | mant, 1 - bias - m), expected):
            return ("exponent field 0 is subnormal: the value is 0.mantissa * 2**(1 - bias), with no implicit "
                    "leading 1.")
        if exp == 0 and mant and got == math.copysign(math.ldexp(mant, -bias - m), expected):
            return "a subnormal's exponent is 1 - bias (the same as the smallest normal), not 0 - bias."
        if expected and got in (2 * expected, expected / 2):
            return f"the bias is 2**(exponent_bits - 1) - 1 = {bias} for {fmt}: off by one doubles or halves."
        return None


# =================================================================================================
# amp.decompose decompose (encode with round-to-nearest-even)
# =================================================================================================
class Decompose(Exercise):
    id, entry, points = "amp.decompose", "decompose", 2
    title = "round a float into a format, ties to even"
    policy = Policy(banned=STRUCT_LIKE, why="work on the bits with integer arithmetic")
    forbid = NO_SOLUTION_MODULES

    def visible_cases(self):
        return [Case((1.0, "fp16"), label="1.0"),
                Case((-2.0, "bf16"), label="-2.0 in bf16"),
                Case((0.1, "fp32"), label="0.1 rounded to fp32"),
                Case((65504.0, "fp16"), label="the largest fp16"),
                Case((65520.0, "fp16"), label="halfway from 65504 to 2**16: ties to even overflow to inf"),
                Case((2.0**-24, "fp16"), label="the smallest fp16 subnormal"),
                Case((2.0**-25, "fp16"), label="halfway between 0 and 2**-24: the even neighbour is 0"),
                Case((3 * 2.0**-25, "fp16"), label="halfway between 1 and 2 units of 2**-24: even is 2"),
                Case((1 + 2.0**-8, "bf16"), label="halfway between 1.0 and the next bf16: the even one is 1.0"),
                Case((1 + 3 * 2.0**-8, "bf16"), label="halfway, and this time the even neighbour is above"),
                Case((-1e-9, "fp16"), label="too small for fp16: a zero that keeps the sign"),
                Case((float("inf"), "bf16"), label="inf"),
                Case((float("nan"), "fp16"), label="NaN: any NaN pattern is accepted"),
                Case((300.0, "fp8_e4m3fn"), label="e4m3fn: 300 lies between 288 and 320")]

    def hidden_cases(self):
        narrow = [f for f in FORMATS if f != "fp32"]

        def narrow_case(fmt, v):
            v = v if v != 0 else 0.0  # the grading boundary carries -0.0 as 0.0: no negative zero inputs
            if fmt == "fp8_e4m3fn" and not (math.isnan(v) or abs(v) < 464):  # torch versions differ past 448
                v = math.fmod(v, 464.0) if math.isfinite(v) else 440.0
            return Case((v, fmt))

        cases = draw(st.builds(narrow_case, st.sampled_from(narrow), _float32_values()), 70)
        cases += draw(st.sampled_from(list(FORMATS)).flatmap(lambda f: _ties(f).map(lambda v: narrow_case(f, v))), 50)
        cases += [Case((v if v != 0 else 0.0, "fp32")) for v in draw(st.floats(allow_nan=False, allow_subnormal=True), 20)]
        return cases

    def expected(self, case):
        value, fmt = case.args
        return fields_of(torch_bits_of_value(value, fmt), fmt)

    def compare(self, case, got, expected):
        value, fmt = case.args
        if not isinstance(got, (tuple, list)) or len(got) != 3 or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in got):
            return f"expected a tuple of three ints (sign, exponent, mantissa) {expected}\n     got {describe(got)}"
        if is_nan_fields(expected, fmt):
            return None if is_nan_fields(tuple(got), fmt) else (
                f"expected a NaN (all-ones exponent, nonzero mantissa), e.g. {expected}\n     got {tuple(got)}")
        problem = same_value(tuple(got), expected)
        if problem:
            e, m, _, _ = FORMATS[fmt]
            s, x, mt = expected
            problem += f"\n  expected bits {_bits_label((s << (e + m)) | (x << m) | mt, fmt)}"
        return problem

    def diagnose(self, case, got, expected):
        value, fmt = case.args
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            return None
        e, m, _, _ = FORMATS[fmt]
        try:
            bits = (int(got[0]) << (e + m)) | (int(got[1]) << m) | int(got[2])
        except (TypeError, ValueError):
            return None
        hint = rounding_hint(value, fmt, bits)
        if hint is None and int(got[1]) >= (1 << e):
            hint = f"the exponent field has only {e} bits in {fmt}: a bigger value means the number overflowed."
        return hint


# =================================================================================================
# amp.fp32_to_bf16_bits / amp.fp32_to_fp16_bits: fp32 -> bf16 / fp16 bits with integer operations
# =================================================================================================
def _bits_tensor(seed: int, shape: tuple, mix: str, fmt: str, layout: str) -> torch.Tensor:
    """A float32 tensor of ``shape`` (``layout``: contiguous, transposed or strided) with awkward values."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    big = n * (2 if layout == "strided" else 1)
    if mix == "any bits":  # every fp32 pattern: normals, subnormals, inf, NaN with any payload
        u = torch.randint(-(2**31), 2**31, (big,), generator=g, dtype=torch.int64)
        x = u.to(torch.int32).view(torch.float32)
    elif mix == "ties":  # the dropped bits are exactly half an ulp of the target
        drop = 16 if fmt == "bf16" else 13
        u = torch.randint(0, 2**31, (big,), generator=g, dtype=torch.int64)
        if fmt == "fp16":  # keep the exponent in fp16's normal range, where the cut is at bit 13
            u = (u & 0x807F_FFFF) | (torch.randint(113, 142, (big,), generator=g) << 23)
        u = (u & ~((1 << drop) - 1)) | (1 << (drop - 1))
        x = u.to(torch.int32).view(torch.float32)
    elif mix == "tiny":  # around the target's subnormals and smallest normal, with ties among them
        k = torch.randint(0, 4096, (big,), generator=g).to(torch.float64)
        scale = 2.0**-25 if fmt == "fp16" else 2.0**-134
        sign = torch.randint(0, 2, (big,), generator=g) * 2 - 1
        x = (sign * k * scale * torch.tensor([1.0, 0.5, 1.5, 0.75])[torch.randint(0, 4, (big,), generator=g)]).float()
    else:  # "range": magnitudes from tiny to overflow
        e = torch.randint(-30, 40, (big,), generator=g).to(torch.float64) if fmt == "fp16" else \
            torch.randint(-140, 129, (big,), generator=g).to(torch.float64)
        x = (torch.randn(big, generator=g, dtype=torch.float64) * torch.exp2(e)).float()
    if layout == "strided":
        return x[::2].reshape(shape) if n else x[:0].reshape(shape)
    x = x.reshape(shape)
    if layout == "transposed" and x.dim() >= 2:
        return x.transpose(0, 1).contiguous().transpose(0, 1)  # same values, column-major strides
    return x


def _rounding_cases(fmt: str, n: int):
    shapes = st.sampled_from([(0,), (1,), (7,), (3, 5), (4, 1, 3), (2, 33), (64,), (5, 13)])
    build = st.builds(lambda seed, shape, mix, layout: Case((_bits_tensor(seed, shape, mix, fmt, layout),),
                                                            label=f"{mix} values, shape {shape}, {layout}"),
                      st.integers(0, 10**6), shapes, st.sampled_from(["any bits", "ties", "tiny", "range"]),
                      st.sampled_from(["contiguous", "transposed", "strided"]))
    return draw(build, n) + [Case((_bits_tensor(7, (4096,), "any bits", fmt, "contiguous"),),
                                  label="4096 random bit patterns")]


NAN_PATTERNS = (0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F801000, 0xFF800001)  # NaNs with awkward payloads


def _edge_values(fmt: str) -> torch.Tensor:
    """Ties, subnormals, overflow, infinities, signed zeros, and NaNs whose payload must not be rounded."""
    nans = torch.tensor([p - (1 << 32) if p >= 1 << 31 else p for p in NAN_PATTERNS], dtype=torch.int32)
    return torch.cat([_edge_numbers(fmt), nans.view(torch.float32)])


def _edge_numbers(fmt: str) -> torch.Tensor:
    common = [1.0, -2.5, 0.0, -0.0, float("inf"), float("-inf"), float("nan"), 3.0e38, -3.4028234663852886e38, 0.1]
    if fmt == "bf16":
        return torch.tensor(common + [1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-8 + 2.0**-20, 1e-40, 9.2e-41,
                                      1.9999999], dtype=torch.float32)
    return torch.tensor(common + [65504.0, 65519.0, 65520.0, 1e5, 2.0**-14, 2.0**-24, 2.0**-25, 3 * 2.0**-25,
                                  6e-8, 1e-9, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 1e-40], dtype=torch.float32)


class _RoundBits(Exercise):
    policy = Policy(banned=LOW_PRECISION_CASTS,
                    why="round with integer operations on the bit pattern (view as int32, shift, mask, add)")
    fmt = "bf16"
    probe = "ptinternals.checks.probes.amp:record_bit_ops"
    timeout_s = 30.0

    def visible_cases(self):
        edges = _edge_values(self.fmt)
        return [Case((edges,), label="edge values: ties, subnormals, overflow, inf, NaN, signed zeros"),
                Case((torch.arange(12.0).view(3, 4).t() / 7,), label="a transposed (non-contiguous) 4x3 tensor"),
                Case((torch.empty(0),), label="an empty tensor"),
                Case((torch.tensor(-1.0 / 3),), label="a 0-dim tensor")]

    def hidden_cases(self):
        return _rounding_cases(self.fmt, 40)

    def expected(self, case):
        (x,) = case.args
        return x.to(FORMATS[self.fmt][3]).view(torch.int16)

    def compare(self, case, got, expected):
        if not isinstance(got, dict) or "out" not in got:
            return f"the grader could not read your result: {describe(got)}"
        if got["low_precision_made"]:
            return (f"made a {self.fmt} or fp16 tensor ({', '.join(got['low_precision_made'])}): this exercise asks "
                    f"for integer operations on the bit pattern, not a cast")
        if got["used"]:
            return f"used {', '.join(got['used'])}: stay on torch integer tensors (view as int32, shift, mask, add)"
        out = got["out"]
        if not isinstance(out, TensorInfo):
            return f"expected an int16 tensor of shape {tuple(expected.shape)}\n     got {describe(out)}"
        if tuple(out.shape) != tuple(expected.shape):
            return f"wrong shape: expected {tuple(expected.shape)}, got {tuple(out.shape)}"
        if out.dtype != "int16":
            return (f"wrong dtype: expected int16 (so that out.view(torch.{FORMATS[self.fmt][3]}) is the rounded "
                    f"tensor), got {out.dtype}")
        bad = self._mismatches(case, out.values, expected)
        if bad is None:
            return None
        n_bad, idx, value, e, g = bad
        u = int(torch.tensor([value], dtype=torch.float32).view(torch.int32).item()) & 0xFFFF_FFFF
        return (f"{n_bad} of {expected.numel()} elements differ; first at index {idx}: input {value!r} "
                f"(fp32 bits 0x{u:08X})\n  expected {_bits_label(e, self.fmt)}\n       got {_bits_label(g, self.fmt)}")

    def _mismatches(self, case, got_values, expected):
        (x,) = case.args
        e_bits, m_bits, _, _ = FORMATS[self.fmt]
        ge = got_values.to(torch.int64).flatten() & 0xFFFF
        ee = expected.to(torch.int64).flatten() & 0xFFFF
        exp_mask, mant_mask = ((1 << e_bits) - 1) << m_bits, (1 << m_bits) - 1
        e_nan = ((ee & exp_mask) == exp_mask) & ((ee & mant_mask) != 0)
        g_nan = ((ge & exp_mask) == exp_mask) & ((ge & mant_mask) != 0)
        bad = torch.where(e_nan, ~g_nan, ge != ee)  # NaN payloads differ between torch's code paths
        n_bad = int(bad.sum())
        if n_bad == 0:
            return None
        flat = int(bad.nonzero()[0])
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(expected.shape))) if x.dim() else ()
        return n_bad, idx, x.flatten()[flat].item(), int(ee[flat]), int(ge[flat])

    def diagnose(self, case, got, expected):
        out = got.get("out") if isinstance(got, dict) else None
        if not isinstance(out, TensorInfo) or tuple(out.shape) != tuple(expected.shape) or out.dtype != "int16":
            return None
        bad = self._mismatches(case, out.values, expected)
        if bad is None:
            return None
        _, _, value, _, g = bad
        return rounding_hint(value, self.fmt, g)


class Fp32ToBf16Bits(_RoundBits):
    id, entry, points = "amp.fp32_to_bf16_bits", "fp32_to_bf16_bits", 2
    title = "fp32 -> bf16 with integer operations"
    fmt = "bf16"


class Fp32ToFp16Bits(_RoundBits):
    id, entry, points = "amp.fp32_to_fp16_bits", "fp32_to_fp16_bits", 3
    title = "fp32 -> fp16 with integer operations"
    fmt = "fp16"


# =================================================================================================
# amp.predict_dtypes predict autocast's dtypes
# =================================================================================================
BODY_OPS = ("linear", "matmul", "relu", "gelu", "layer_norm", "softmax", "log_softmax", "exp", "pow", "add_fp32",
            "mul_scalar")
TERMINAL_OPS = ("sum", "mse_loss", "cross_entropy")
PROBE_NET = ["linear", "gelu", "layer_norm", "linear", "softmax"]  # ProbeNet's layers (+ its loss)


@contextlib.contextmanager
def _autocast_on(device_type: str, dtype: torch.dtype):
    """``torch.autocast`` without its "CUDA is not available" check, so fake CUDA tensors can use it."""
    prev_enabled, prev_dtype = torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    torch.set_autocast_enabled(device_type, True)
    torch.set_autocast_dtype(device_type, dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled(device_type, prev_enabled)
        torch.set_autocast_dtype(device_type, prev_dtype)


def autocast_layer_dtypes(layers, device_type: str, autocast_dtype: str, input_dtype: str = "float32") -> list[str]:
    """Run ``layers`` on a (4, 8) input under real autocast and return each layer's output dtype.

    On a machine without CUDA, device_type "cuda" runs on fake CUDA tensors (FakeTensorMode): torch's
    dispatcher and AutocastCUDA kernels decide the dtypes, and no kernel computes anything.
    """
    d = 8
    fake = device_type == "cuda" and not torch.cuda.is_available()
    outer = contextlib.ExitStack()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        outer.enter_context(FakeTensorMode())
        outer.enter_context(torch.no_grad())  # autograd metadata on fake CUDA would need a CUDA build
    out = []
    with outer:
        g = torch.Generator().manual_seed(0)
        if fake:
            def make(*shape):
                return torch.randn(*shape, device=device_type)
        else:
            def make(*shape):
                return torch.randn(*shape, generator=g).to(device_type)
        x = make(4, d).to(getattr(torch, input_dtype))
        w, b, ln_w = make(d, d), make(d), make(d)
        if not fake:
            w.requires_grad_(True)  # like a weight: autocast caches its cast
        r, y = make(4, d), make(4, d)
        target = torch.zeros(4, dtype=torch.int64, device=device_type)
        with _autocast_on(device_type, getattr(torch, autocast_dtype)):
            h = x
            for op in layers:
                h = {
                    "linear": lambda h: F.linear(h, w, b),
                    "matmul": lambda h: h @ w,
                    "relu": F.relu,
                    "gelu": F.gelu,
                    "layer_norm": lambda h: F.layer_norm(h, (d,), ln_w, b),
                    "softmax": lambda h: F.softmax(h, dim=-1),
                    "log_softmax": lambda h: F.log_softmax(h, dim=-1),
                    "exp": torch.exp,
                    "pow": lambda h: h.pow(2),
                    "add_fp32": lambda h: h + r,
                    "mul_scalar": lambda h: h * 0.5,
                    "sum": lambda h: h.sum(dim=-1),
                    "mse_loss": lambda h: F.mse_loss(h, y),
                    "cross_entropy": lambda h: F.cross_entropy(h, target),
                }[op](h)
                out.append(str(h.dtype).replace("torch.", ""))
    return out


_CUDA_FP32_OPS = {"layer_norm", "softmax", "log_softmax", "exp", "pow", "sum"}


class PredictDtypes(Exercise):
    id, entry, points = "amp.predict_dtypes", "predict_dtypes", 2
    title = "predict the dtype autocast gives each layer"
    policy = Policy(banned=STRUCT_LIKE)
    forbid = NO_SOLUTION_MODULES

    def visible_cases(self):
        return [Case((PROBE_NET + ["cross_entropy"], "cpu", "bfloat16", "float32"), label="ProbeNet on the CPU, bf16"),
                Case((PROBE_NET + ["cross_entropy"], "cuda", "float16", "float32"), label="ProbeNet on CUDA, fp16"),
                Case((["linear", "relu", "add_fp32", "linear", "mse_loss"], "cuda", "bfloat16", "float32"),
                     label="a residual kept in fp32"),
                Case((["exp", "linear", "sum"], "cpu", "float16", "bfloat16"), label="a bf16 input under fp16 autocast")]

    def hidden_cases(self):
        build = st.builds(
            lambda body, term, dev, low, inp: Case((list(body) + ([term] if term else []), dev, low, inp)),
            st.lists(st.sampled_from(BODY_OPS), min_size=1, max_size=6),
            st.sampled_from([None, None, *TERMINAL_OPS]), st.sampled_from(["cpu", "cuda"]),
            st.sampled_from(["bfloat16", "float16"]), st.sampled_from(["float32", "float32", "bfloat16", "float16"]))
        return draw(build, 60)

    def expected(self, case):
        return autocast_layer_dtypes(*case.args)

    def compare(self, case, got, expected):
        if isinstance(got, tuple):
            got = list(got)
        if isinstance(got, list) and len(got) == len(expected):
            for i, (g, e) in enumerate(zip(got, expected)):
                if g != e:
                    return (f"layer {i} ({case.args[0][i]}): expected {e!r}, got {describe(g)}\n"
                            f"  expected {expected}\n       got {got}")
            return None
        return same_value(got, expected)

    def diagnose(self, case, got, expected):
        layers, dev, low, inp = case.args
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return None
        i = next((i for i, (g, e) in enumerate(zip(got, expected)) if g != e), None)
        if i is None:
            return None
        op, want, g = layers[i], expected[i], got[i]
        if op in ("linear", "matmul"):
            return f"{op} is on autocast's lower-precision list on both devices: it runs in the autocast dtype ({low})."
        if op in ("mse_loss", "cross_entropy"):
            return f"{op} is on the fp32 list (losses need fp32's accuracy) on both CPU and CUDA."
        if op in _CUDA_FP32_OPS and dev == "cuda":
            return (f"on CUDA, {op} is on an fp32 list (fp32, or fp32_set_opt_dtype for softmax/log_softmax/sum): "
                    f"its output is float32 whatever its input.")
        if op in _CUDA_FP32_OPS and dev == "cpu":
            return (f"CPU autocast does not list {op} (only CUDA puts it in fp32): an unlisted op runs in its "
                    f"input's dtype, {expected[i - 1] if i else inp}.")
        if op == "add_fp32":
            return ("an add is not listed, so ordinary type promotion applies: a low-precision tensor plus an fp32 "
                    "tensor (with dims) gives float32.")
        if want != g:
            return f"{op} is not on any autocast list: it runs in the dtype of its input ({expected[i - 1] if i else inp})."
        return None


# =================================================================================================
# amp.update_scale update_scale
# =================================================================================================
FLT_MAX = 3.4028234663852886e38


def torch_update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    s = torch.tensor(float(scale), dtype=torch.float32)
    gt = torch.tensor(growth_tracker, dtype=torch.int32)
    torch._amp_update_scale_(s, gt, torch.tensor(1.0 if found_inf else 0.0), float(growth_factor),
                             float(backoff_factor), int(growth_interval))
    return s.item(), int(gt.item())


class UpdateScale(Exercise):
    id, entry, points = "amp.update_scale", "update_scale", 1
    title = "GradScaler's scale update rule"
    policy = Policy(banned=STRUCT_LIKE)
    forbid = NO_SOLUTION_MODULES

    def visible_cases(self):
        return [Case((65536.0, 0, True, 2.0, 0.5, 2000), label="an inf was found: back off, restart the count"),
                Case((65536.0, 5, False, 2.0, 0.5, 2000), label="a good step: count it"),
                Case((65536.0, 1999, False, 2.0, 0.5, 2000), label="the 2000th good step in a row: grow"),
                Case((1.0, 0, False, 2.0, 0.5, 1), label="growth_interval 1: grow after every good step"),
                Case((3.0e38, 0, False, 2.0, 0.5, 1), label="growing would overflow float32: keep the scale"),
                Case((1024.0, 3, True, 4.0, 0.25, 4), label="other factors")]

    def hidden_cases(self):
        @st.composite
        def case(d):
            interval = d(st.sampled_from([1, 2, 3, 5, 2000]))
            scale = d(st.sampled_from([1.0, 2.0**-10, 65536.0, 2.0**24, 1000.0, 2.0**126, 3.0e38, FLT_MAX, 1e-30]))
            growth = d(st.sampled_from([2.0, 1.5, 4.0, 1.0001]))
            if abs(scale * growth / FLT_MAX - 1) < 1e-6:
                growth = 2.0
            return Case((scale, d(st.integers(0, interval - 1)), d(st.booleans()), growth,
                         d(st.sampled_from([0.5, 0.25, 0.9])), interval))

        return draw(case(), 80)

    def expected(self, case):
        return torch_update_scale(*case.args)

    def compare(self, case, got, expected):
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return f"expected a pair (new_scale, new_growth_tracker) {expected}\n     got {describe(got)}"
        return same_value(tuple(got), expected)

    def diagnose(self, case, got, expected):
        scale, tracker, found, growth, backoff, interval = case.args
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return None
        g_scale, g_tracker = got
        if found and g_tracker != 0:
            return "a skipped step (inf/NaN found) resets growth_tracker to 0: growth needs consecutive good steps."
        if isinstance(g_scale, (int, float)) and not abs(g_scale) <= FLT_MAX:
            return ("never grow the scale to inf: the scale lives in a float32 tensor, so if scale * growth_factor "
                    "is past float32's largest value (3.4028235e38), keep the old scale.")
        if not found and tracker + 1 == interval:
            if _same_float(g_scale, scale) and not _same_float(expected[0], scale):
                return ("off by one: count this good step first (growth_tracker + 1), and grow when that count "
                        "reaches growth_interval.")
            if g_tracker == interval:
                return "after growing, growth_tracker starts again from 0."
        if not found and tracker + 2 == interval and not _same_float(g_scale, expected[0]):
            return "off by one: you grew one good step too early; grow when growth_tracker + 1 == growth_interval."
        if not found and g_tracker == tracker and expected[1] == tracker + 1:
            return "a good step adds one to growth_tracker."
        return None


# =================================================================================================
# amp.grad_scaler GradScaler
# =================================================================================================
def _grad(shape, seed, log10_mag, inject):
    g = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 10.0**log10_mag
    if inject != "none" and g.numel():
        g.view(-1)[seed % g.numel()] = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}[inject]
    return g


def _params(shapes, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen) for s in shapes]


def _step(shapes, seed, micro=1, mag=-3.0, inject=None, unscale=False, twice=False):
    """One script step: ``micro`` micro-batches of gradients; ``inject`` = (micro, param, kind) or None."""
    grads = []
    for k in range(micro):
        row = []
        for i, s in enumerate(shapes):
            kind = inject[2] if inject and inject[:2] == (k, i) else "none"
            row.append(_grad(s, seed * 97 + k * 13 + i, mag, kind))
        grads.append(row)
    return {"micro": grads, "unscale": unscale, "twice": twice}


def _config(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2):
    return {"init_scale": init_scale, "growth_factor": growth_factor, "backoff_factor": backoff_factor,
            "growth_interval": growth_interval}


class GradScalerExercise(Exercise):
    id, entry, points = "amp.grad_scaler", "GradScaler", 3
    title = "GradScaler from scratch"
    policy = Policy(banned=("GradScaler", "ShardedGradScaler", "grad_scaler", "amp"),
                    why="write the scaler yourself: torch's GradScaler is what it is compared with")
    probe = "ptinternals.checks.probes.amp:scaler_probe"
    timeout_s = 60.0

    def visible_cases(self):
        sh = [(3, 4), (5,)]
        good = [_step(sh, s) for s in range(5)]
        with_inf = [_step(sh, 0), _step(sh, 1, inject=(0, 1, "inf")), _step(sh, 2), _step(sh, 3, inject=(0, 0, "nan")),
                    _step(sh, 4), _step(sh, 5), _step(sh, 6)]
        manual = [_step(sh, 0, micro=2, unscale=True), _step(sh, 1, micro=2, unscale=True, twice=True),
                  _step(sh, 2, unscale=True, inject=(0, 0, "-inf")), _step(sh, 3, micro=3)]
        overflow = [_step(sh, s, mag=0.0) for s in range(6)]  # S * g past 65504 in fp16 at first
        return [Case((_config(), _params(sh, 0), good), label="5 good steps, growth_interval 2: the scale grows"),
                Case((_config(), _params(sh, 1), with_inf), label="an inf at step 1 and a NaN at step 3: skip, back off"),
                Case((_config(init_scale=1024.0), _params(sh, 2), manual),
                     label="unscale_ before step (as before clipping), accumulation, and unscale_ called twice"),
                Case((_config(init_scale=2.0**20, growth_interval=3), _params(sh, 3), overflow),
                     label="init_scale 2**20 overflows fp16 gradients: several skipped steps, then training")]

    def hidden_cases(self):
        @st.composite
        def case(d):
            shapes = d(st.lists(st.sampled_from([(), (0,), (1,), (3,), (2, 5), (7,), (4, 3)]), min_size=1, max_size=3))
            cfg = _config(d(st.sampled_from([1.0, 2.0**8, 2.0**16, 2.0**24, 1000.0])),
                          d(st.sampled_from([2.0, 1.5, 4.0])), d(st.sampled_from([0.5, 0.25])),
                          d(st.integers(1, 4)))
            steps = []
            for _ in range(d(st.integers(1, 7))):
                unscale = d(st.booleans())
                inject = None
                if d(st.integers(0, 4)) == 0:
                    inject = (0, d(st.integers(0, len(shapes) - 1)), d(st.sampled_from(["inf", "-inf", "nan"])))
                steps.append(_step(shapes, d(st.integers(0, 10**5)), micro=d(st.integers(1, 2)),
                                   mag=d(st.sampled_from([-6.0, -3.0, -1.0, 0.0, 1.0])), inject=inject,
                                   unscale=unscale, twice=unscale and d(st.integers(0, 3)) == 0))
            return Case((cfg, _params(shapes, d(st.integers(0, 100))), steps))

        return draw(case(), 25)

    def expected(self, case):
        config, params, script = case.args
        return scaler_trajectory(lambda: torch.amp.GradScaler("cpu", **config), params, script)

    def compare(self, case, got, expected):
        if not isinstance(got, dict) or "scales" not in got:
            return f"the grader could not read your result: {describe(got)}"
        if got.get("used"):
            return f"used {', '.join(got['used'])}: write the scaler yourself (torch's kernels and class are what it is checked against)"
        n = len(expected["stepped"])
        for k in range(n):
            if got["stepped"][k] != expected["stepped"][k]:
                what = "skipped" if expected["stepped"][k] else "called optimizer.step()"
                return (f"step {k}: torch's GradScaler {what}, yours "
                        f"{'called optimizer.step()' if got['stepped'][k] else 'skipped it'}\n"
                        f"  steps taken: expected {expected['stepped']}\n                    got {got['stepped']}")
            if got["twice"][k] != expected["twice"][k]:
                return (f"step {k}: calling unscale_() a second time before update(): expected {expected['twice'][k]}, "
                        f"got {got['twice'][k]}")
            for i, (gg, eg) in enumerate(zip(got["grads"][k], expected["grads"][k])):
                problem = _close(gg, eg)
                if problem:
                    return f"step {k}, gradient of parameter {i} after scaler.step(): {problem}"
            if not _same_float(got["scales"][k + 1], expected["scales"][k + 1]):
                return (f"the scale after step {k}'s update(): expected {expected['scales'][k + 1]!r}, got "
                        f"{got['scales'][k + 1]!r}\n  scales: expected {expected['scales']}\n          got {got['scales']}")
            for i, (gp, ep) in enumerate(zip(got["params"][k], expected["params"][k])):
                problem = _close(gp, ep)
                if problem:
                    return f"step {k}, parameter {i} after the step: {problem}"
        if not _same_float(got["scales"][0], expected["scales"][0]):
            return f"get_scale() before the first step: expected {expected['scales'][0]!r}, got {got['scales'][0]!r}"
        return None

    def diagnose(self, case, got, expected):
        config, params, script = case.args
        if not isinstance(got, dict) or "stepped" not in got:
            return None
        for k in range(len(script)):
            if got["stepped"][k] and not expected["stepped"][k]:
                return ("the gradients of this step held an inf or NaN: step() must skip optimizer.step() (check "
                        "every gradient with torch.isfinite while unscaling, and remember what you found).")
            if expected["stepped"][k] and not got["stepped"][k]:
                return ("this step's gradients were finite: found_inf must be reset for every iteration (a new "
                        "flag per unscale_), or an old inf keeps skipping steps.")
            if got["twice"][k] != expected["twice"][k]:
                return ("unscale_() twice in one iteration must raise RuntimeError: track a per-optimizer stage "
                        "(READY -> UNSCALED -> STEPPED) and reset it in update().")
            scale = expected["scales"][k]
            for gg, eg in zip(got["grads"][k], expected["grads"][k]):
                if isinstance(gg, TensorInfo) and eg is not None and eg.numel() and torch.isfinite(eg).all():
                    ratio = _ratio(gg.values, eg)
                    if ratio is not None and math.isclose(ratio, 1 / scale, rel_tol=1e-3) and scale != 1:
                        return ("the gradients were divided by the scale twice: step() must not unscale again "
                                "when unscale_() was already called in this iteration (unscaling twice).")
                    if ratio is not None and math.isclose(ratio, scale, rel_tol=1e-3) and scale != 1:
                        return "the gradients were never unscaled: step() divides them by the scale first."
                    if ratio is not None and math.isclose(ratio, scale * scale, rel_tol=1e-3) and scale != 1:
                        return "unscale_ multiplies the gradients by 1/scale, not by scale."
            if not _same_float(got["scales"][k + 1], expected["scales"][k + 1]):
                return ("update(): back off (scale *= backoff_factor, tracker = 0) after a skipped step; after "
                        "growth_interval good steps in a row, scale *= growth_factor and tracker = 0.")
        return None


def _same_float(a, b) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool) and math.isclose(a, b, rel_tol=1e-6)


def _close(got, expected) -> str | None:
    if expected is None:
        return None if got is None else f"expected no gradient, got {describe(got)}"
    if not isinstance(got, TensorInfo):
        return f"expected a tensor of shape {tuple(expected.shape)}, got {describe(got)}"
    from ..grading.compare import close_tensors

    return close_tensors(got, expected)


def _ratio(got: torch.Tensor, expected: torch.Tensor) -> float | None:
    g, e = got.double().flatten(), expected.double().flatten()
    k = int(e.abs().argmax())
    return None if e[k] == 0 else float(g[k] / e[k])


# =================================================================================================
# amp.amp_train the mixed-precision trainer
# =================================================================================================
def _trainer_case(d_in=16, d_hidden=32, d_out=8, seed=0, n_batches=3, batch=16, steps=4, dtype=torch.bfloat16,
                  opt=("adam", 1e-2), scaler=None, clip=None, accum=1, loss_weight=1.0, label=""):
    from ..amp.scaffold import MLPConfig, init_mlp_params, make_regression_data

    cfg = MLPConfig(d_in, d_hidden, d_out, seed=seed, loss_weight=loss_weight)
    data = make_regression_data(cfg, n_batches=n_batches, batch_size=batch, seed=seed + 1)
    return Case((init_mlp_params(cfg), opt, data, steps, dtype, scaler, clip, accum, loss_weight), label=label)


def reference_run(params, opt, data, steps, dtype, scaler, clip, accum, loss_weight) -> dict:
    """The expected run: torch.autocast + torch.amp.GradScaler (ptinternals.amp.trainer's reference)."""
    from ..amp.scaffold import MLPConfig
    from ..amp.trainer import reference_autocast_train_steps

    cfg = MLPConfig(params["w1"].shape[1], params["w1"].shape[0], params["w2"].shape[0], loss_weight=loss_weight)
    ref = reference_autocast_train_steps(cfg, data, steps, dtype, scaler=probes.make_scaler(scaler), clip=clip,
                                         accum=accum, lr=opt[1], optimizer=opt[0], init=params)
    return {"losses": ref["losses"], "skipped": ref["skipped_steps"], "params": ref["final_params"],
            "init": {n: p.clone() for n, p in params.items()}}


class AmpTrain(Exercise):
    id, entry, points = "amp.amp_train", "amp_train", 3
    title = "mixed precision by hand: master weights, loss scaling, clipping, accumulation"
    policy = Policy(banned=("autocast", "autocast_mode"),
                    why="cast the weights and the input yourself: autocast is what this exercise does by hand")
    probe = "ptinternals.checks.probes.amp:train_probe"
    timeout_s = 90.0
    loss_rtol, delta_rtol = 1e-3, 1e-2

    def visible_cases(self):
        return [
            _trainer_case(label="bf16, Adam, no scaler"),
            _trainer_case(dtype=torch.float16, opt=("sgd", 0.05), scaler={"init_scale": 2.0**16, "growth_interval": 2},
                          clip=0.5, label="fp16 + GradScaler, SGD, clipping at 0.5"),
            _trainer_case(opt=("sgd", 0.05), accum=3, label="bf16, SGD, 3 micro-batches per step"),
            _trainer_case(dtype=torch.float16, scaler={"init_scale": 2.0**24, "growth_interval": 1}, steps=8, clip=1.0,
                          label="init_scale 2**24 overflows fp16 at first: the same steps must be skipped"),
            _trainer_case(dtype=torch.float16, loss_weight=2.0**-20, steps=6, n_batches=2,
                          label="fp16 WITHOUT a scaler, loss weight 2**-20: every gradient underflows, nothing moves"),
            _trainer_case(dtype=torch.float16, loss_weight=2.0**-20, steps=6, n_batches=2, scaler={"init_scale": 2.0**16},
                          label="the same with a GradScaler: it trains"),
        ]

    def hidden_cases(self):
        @st.composite
        def case(d):
            dtype = d(st.sampled_from([torch.bfloat16, torch.float16, torch.float16, torch.float32]))
            scaler = d(st.sampled_from([None, {"init_scale": 2.0**16, "growth_interval": 2},
                                        {"init_scale": 2.0**24, "growth_interval": 1}]))
            return _trainer_case(d_in=d(st.sampled_from([1, 5, 16])), d_hidden=d(st.sampled_from([7, 32])),
                                 d_out=d(st.sampled_from([1, 3, 8])), seed=d(st.integers(0, 50)),
                                 n_batches=d(st.integers(1, 3)), batch=d(st.sampled_from([1, 3, 16])),
                                 steps=d(st.integers(2, 5)), dtype=dtype,
                                 opt=d(st.sampled_from([("adam", 1e-2), ("sgd", 0.05)])), scaler=scaler,
                                 clip=d(st.sampled_from([None, 0.3, 5.0])), accum=d(st.integers(1, 3)))

        return draw(case(), 8)

    def expected(self, case):
        return reference_run(*case.args)

    def compare(self, case, got, expected):
        params, opt, data, steps, dtype, scaler, clip, accum, loss_weight = case.args
        if not isinstance(got, dict) or "out" not in got:
            return f"the grader could not read your result: {describe(got)}"
        if got["autocast"]:
            return ("used torch.autocast: this exercise does by hand what autocast does (cast the weights and the "
                    "input to dtype, compute, take the loss in float32); the reference you are compared with is autocast")
        low = str(dtype).replace("torch.", "")
        if dtype != torch.float32 and got["matmul_dtypes"] != [low]:
            return (f"your matmuls ran in {' and '.join(got['matmul_dtypes']) or 'no dtype (none seen)'}, expected "
                    f"only {low}: cast the fp32 master weights and the input to {low} for the forward")
        out = got["out"]
        if isinstance(out, (Raised, Unsupported)):
            return f"expected (losses, skipped_steps)\n     got {describe(out)}"
        if not isinstance(out, (tuple, list)) or len(out) != 2 or not all(isinstance(o, (list, tuple)) for o in out):
            return f"expected a pair (losses, skipped_steps) of lists\n     got {describe(out)}"
        losses, skipped = list(out[0]), list(out[1])
        if len(losses) != steps or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in losses):
            return f"expected {steps} losses (Python floats, one per optimizer step)\n     got {describe(losses)}"
        problem = same_value(skipped, expected["skipped"])
        if problem:
            return "skipped steps differ: " + problem
        for k, (g, e) in enumerate(zip(losses, expected["losses"])):
            if not math.isclose(g, e, rel_tol=self.loss_rtol, abs_tol=1e-12):
                return (f"the loss of step {k}: expected {e!r}, got {g!r} (tolerance {self.loss_rtol:g} relative)\n"
                        f"  expected {[f'{v:.6g}' for v in expected['losses']]}\n"
                        f"       got {[f'{v:.6g}' for v in losses]}")
        return self._compare_params(got["params"], expected)

    def _compare_params(self, got_params, expected):
        moved = max(float((expected["params"][n] - expected["init"][n]).abs().max()) for n in expected["params"])
        tol = self.delta_rtol * moved + 1e-7
        for n, e in expected["params"].items():
            g = got_params.get(n) if isinstance(got_params, dict) else None
            if not isinstance(g, TensorInfo) or tuple(g.shape) != tuple(e.shape):
                return f"params[{n!r}] after training: expected a tensor of shape {tuple(e.shape)}, got {describe(g)}"
            if g.dtype != "float32":
                return f"params[{n!r}] must stay float32 master weights, got {g.dtype}"
            err = (g.values.double() - e.double()).abs()
            if float(err.max()) > tol:
                k = int(err.flatten().argmax())
                init = expected["init"][n].flatten()[k].item()
                return (f"params[{n!r}] after training differ from the autocast reference by up to {float(err.max()):.3g} "
                        f"(allowed {tol:.3g}, 1% of the largest update {moved:.3g})\n  at flat index {k}: started at "
                        f"{init!r}, expected {e.flatten()[k].item()!r}, got {g.values.flatten()[k].item()!r}")
        return None

    def diagnose(self, case, got, expected):
        params, opt, data, steps, dtype, scaler, clip, accum, loss_weight = case.args
        if not isinstance(got, dict) or not isinstance(got.get("out"), (tuple, list)) or len(got["out"]) != 2:
            return None
        losses, skipped = list(got["out"][0]), list(got["out"][1])
        low = str(dtype).replace("torch.", "")
        if dtype != torch.float32 and got.get("matmul_dtypes") != [low]:
            return ("mlp_forward computes in the dtype of what you give it: pass {name: p.detach().to(dtype)} copies "
                    "of the master weights (requiring grad) and x.to(dtype).")
        if "float32" not in (got.get("loss_input_dtypes") or ["float32"]) and dtype != torch.float32:
            return "compute the loss in float32 (F.mse_loss(pred.float(), y)): autocast puts losses on its fp32 list."
        if skipped != expected["skipped"]:
            if expected["skipped"] and not skipped:
                return ("a step whose gradients hold inf/NaN is skipped by scaler.step(optimizer); report it as skipped "
                        "when scaler.update() lowered the scale.")
            return ("report step k as skipped exactly when scaler.update() lowered the scale (a growth also changes "
                    "the scale, and must not count).")
        if losses and expected["losses"] and not math.isclose(losses[0], expected["losses"][0], rel_tol=1e-3):
            if accum > 1 and math.isclose(losses[0], expected["losses"][0] * accum, rel_tol=1e-3):
                return "report each step's loss as the MEAN of its micro-batch losses (before dividing by accum for backward)."
            return ("the first loss already differs: use the micro-batches data[(step * accum + k) % len(data)], the "
                    "loss F.mse_loss(pred.float(), y) * loss_weight, unscaled.")
        init, ref = expected["init"], expected["params"]
        g_params = got.get("params", {})
        try:
            num = sum(float((g_params[n].values.double() - init[n].double()).norm() ** 2) for n in init) ** 0.5
            den = sum(float((ref[n].double() - init[n].double()).norm() ** 2) for n in init) ** 0.5
        except (KeyError, AttributeError):
            return None
        if den == 0 and num > 0:
            return ("the reference's fp16 gradients all underflowed to 0, so its weights never moved, but yours did: "
                    "run the backward in fp16 (cast the weights, not only the matmul output), and scale only with a scaler.")
        if den > 0 and opt[0] == "sgd":
            r = num / den
            if scaler and clip is not None and r < 0.05:
                return ("clip AFTER scaler.unscale_(optimizer): clipping the scaled gradients cuts them to `clip`, then "
                        "unscaling divides them by the scale again (your updates are about 1/scale too small).")
            if accum > 1 and math.isclose(r, accum, rel_tol=0.05):
                return "divide each micro-batch loss by accum before backward, so the accumulated gradient is a mean."
        if accum > 1:
            return ("with accumulation: divide each micro-batch loss by accum before backward (the accumulated "
                    "gradient is then a mean), call backward on every micro-batch, and unscale/clip/step/update once "
                    "per optimizer step, after the last micro-batch; zero the gradients only at the start of a step.")
        return ("keep fp32 master weights: make fresh low-precision copies for each forward, and add their gradients "
                "(cast to fp32) into the masters' .grad; the optimizer steps the fp32 masters.")


# =================================================================================================
# amp.amp_speed smaller (everywhere) and faster (on a GPU)
# =================================================================================================
class AmpSpeed(Exercise):
    id, entry, points = "amp.amp_speed", "amp_train", 1
    title = "the win: less memory for activations, and (on a GPU) faster steps"
    policy = AmpTrain.policy  # the same trainer
    probe = "ptinternals.checks.probes.amp:speed_probe"
    gpu = True
    timeout_s = 120.0
    limits = {"saved_ratio": 0.7, "time_ratio": 0.8, "peak_ratio": 0.9}

    def visible_cases(self):
        return [Case((torch.bfloat16, None), label="bf16 vs fp32")]

    def hidden_cases(self):
        return [Case((torch.float16, {"init_scale": 2.0**16}), label="fp16 + GradScaler vs fp32")]

    def expected(self, case):
        return dict(self.limits)

    def compare(self, case, got, expected):
        if not isinstance(got, dict) or "saved_ratio" not in got:
            return f"the grader could not read your result: {describe(got)}"
        low = got["dtype"]
        if not got["saved_ratio"] <= expected["saved_ratio"]:
            return (f"in {low}, your training step saved {got['saved_bytes_low']:,} bytes for backward against "
                    f"{got['saved_bytes_fp32']:,} in float32 (x{got['saved_ratio']:.2f}); expected at most "
                    f"x{expected['saved_ratio']} (activations and weight copies in 2 bytes instead of 4)")
        if got.get("speed") == "measured":
            if not got["time_ratio"] <= expected["time_ratio"]:
                return (f"on {got['device']}, a {low} step took {got['ms_low']:.2f} ms against {got['ms_fp32']:.2f} ms "
                        f"in float32 (x{got['time_ratio']:.2f}); expected at most x{expected['time_ratio']}")
            if not got["peak_ratio"] <= expected["peak_ratio"]:
                return (f"on {got['device']}, peak memory in {low} was {got['peak_low']:,} bytes against "
                        f"{got['peak_fp32']:,} in float32 (x{got['peak_ratio']:.2f}); expected at most "
                        f"x{expected['peak_ratio']}")
        return None

    def summary(self, cases, results):
        """One line per case: bytes saved for backward, and on a GPU time per step and peak memory."""
        lines = []
        for r in results:
            text = (f"{r['dtype']} vs float32 on {r['device']}: bytes saved for backward {r['saved_bytes_low']:,} "
                    f"vs {r['saved_bytes_fp32']:,} (x{r['saved_ratio']:.2f})")
            if r["speed"] == "measured":
                text += (f"; time per step {r['ms_low']:.2f} ms vs {r['ms_fp32']:.2f} ms (x{r['time_ratio']:.2f}); "
                         f"peak memory {r['peak_low'] / 2**20:.0f} MiB vs {r['peak_fp32'] / 2**20:.0f} MiB "
                         f"(x{r['peak_ratio']:.2f})")
            else:
                text += "\n" + r["speed"]
            lines.append(text)
        return "\n".join(lines)

    def diagnose(self, case, got, expected):
        if not isinstance(got, dict) or "saved_ratio" not in got:
            return None
        if got["matmuls_per_step"] > 2:
            return (f"one training step of the 2-layer MLP ran {got['matmuls_per_step']} matmuls, not 2: an extra "
                    f"forward (for logging, say) is recording a graph for backward; run it under torch.no_grad().")
        if got["saved_fp32_bytes_in_low"] >= 0.9 * got["saved_bytes_low"]:
            return ("nothing got smaller: the forward must run on low-precision copies (weights and input), so "
                    "the tensors autograd saves are 2 bytes per element.")
        if got["saved_ratio"] > expected["saved_ratio"]:
            return (f"your step saves float32 tensors for backward ({got['saved_fp32_bytes_in_low']:,} bytes; only "
                    f"the loss's inputs need to be fp32): do not cast activations back up to fp32 between layers.")
        return None


EXERCISES = [Decode(), Decompose(), Fp32ToBf16Bits(), Fp32ToFp16Bits(), PredictDtypes(), UpdateScale(),
             GradScalerExercise(), AmpTrain(), AmpSpeed()]
CHAPTER = Chapter("amp", exercises=EXERCISES, sandbox_files=("amp/scaffold.py",))
