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
    right = _encode_variant(value, fmt)
    if got_bits == right ^ (1 << (_width(fmt) - 1)):
        return "only the sign bit is wrong: the result keeps the input's sign (the top bit), zeros and NaNs too."
    for kwargs, why in ROUNDING_BUGS:
        if _encode_variant(value, fmt, **kwargs) == got_bits != right:
            return why
    return None


def _max_finite_bits(fmt: str) -> int:
    """The bit pattern of fmt's largest finite value (sign 0)."""
    e, m, has_inf, _ = FORMATS[fmt]
    all_ones = (1 << e) - 1
    return ((all_ones - 1) << m | ((1 << m) - 1)) if has_inf else (all_ones << m | ((1 << m) - 2))


def _magnitude_bits(bits: int, fmt: str) -> int:
    """``bits`` without its sign bit."""
    return bits & ((1 << (_width(fmt) - 1)) - 1)


def _boundary_patterns(fmt: str) -> list[int]:
    """Every edge of fmt's encoding, with both signs: zero, the smallest and largest subnormal, the smallest
    normal, 1.0, the largest finite value and the pattern one above it, inf and the NaNs next to it."""
    e, m, has_inf, _ = FORMATS[fmt]
    top = _max_finite_bits(fmt)
    edges = [0, 1, (1 << m) - 1, 1 << m, ((1 << (e - 1)) - 1) << m, top, top + 1]
    if has_inf:
        edges += [top + 2, (1 << (e + m)) - 1]  # inf + 1: the smallest NaN payload; all ones: the largest
    return sorted({s | b for b in edges for s in (0, 1 << (e + m))})


def _bits_label(bits: int, fmt: str) -> str:
    return f"0x{bits:0{_width(fmt) // 4}X} = {torch_value_of_bits(bits, fmt)!r}"


def _bias(fmt: str) -> int:
    return (1 << (FORMATS[fmt][0] - 1)) - 1


def _smallest_normal(fmt: str) -> float:
    return 2.0 ** (1 - _bias(fmt))


def is_inf_fields(sign_exp_mant, fmt: str) -> bool:
    e, _, has_inf, _ = FORMATS[fmt]
    return has_inf and sign_exp_mant[1] == (1 << e) - 1 and sign_exp_mant[2] == 0


def _next(value: float, fmt: str, direction: int) -> float:
    """The next input after ``value`` towards +inf (``direction`` +1) or -inf: the next float32 for the
    narrow formats (their cases hold float32 values), the next double for fp32."""
    if not math.isfinite(value):
        return value
    if fmt == "fp32":
        return math.nextafter(value, math.inf * direction)
    t = torch.tensor(value, dtype=torch.float32)
    return float(torch.nextafter(t, torch.tensor(math.inf * direction, dtype=torch.float32)))


def _tie(value: float, fmt: str) -> str | None:
    """"down"/"up" when ``value`` lies exactly halfway between two neighbours of ``fmt`` (or between the
    largest finite value and the next power of two) and ties-to-even rounds it that way; else None."""
    if not math.isfinite(value) or value == 0:
        return None
    from fractions import Fraction

    _, m, _, _ = FORMATS[fmt]
    a = abs(value)
    spacing = Fraction(2) ** (max(math.frexp(a)[1] - 1, 1 - _bias(fmt)) - m)
    units = Fraction(a) / spacing
    if units.denominator != 2:
        return None
    return "up" if int(units) & 1 else "down"


def _decompose_edges(fmt: str) -> list[float]:
    """The rounding edges of ``fmt``, drawn deliberately: ties to both even neighbours and one input step
    either side, a tie that carries into the exponent, ties among subnormals and at half the smallest one,
    the largest subnormal rounding up into the smallest normal, the largest finite value, the tie at the
    overflow threshold and one step below it, a value whose exponent field would be all ones, inf, NaN.
    Float32 values for the narrow formats (what their cases hold), doubles for fp32."""
    e, m, has_inf, _ = FORMATS[fmt]
    tiny = _smallest_normal(fmt) / 2**m  # the smallest subnormal
    top = torch_value_of_bits(_max_finite_bits(fmt), fmt)
    top_spacing = 2.0 ** ((1 << e) - 2 - _bias(fmt) - m) if has_inf else 0.0
    ties = [1 + 2.0 ** -(m + 1), 1 + 3 * 2.0 ** -(m + 1), 2 - 2.0 ** -(m + 1), 0.5 * tiny, 1.5 * tiny,
            (2**m - 0.5) * tiny]
    values = ties + [_next(t, fmt, d) for t in ties for d in (-1, 1)]
    values += [top, -top, 0.25 * tiny, tiny, -tiny, 2.0 ** -(m + 2) * 3 + 1, math.nan]
    if has_inf:  # (e4m3fn is asked nothing past 464: torch versions differ there)
        over = top + top_spacing / 2  # halfway from the largest finite value to 2**(emax + 1): inf
        values += [over, -over, _next(over, fmt, -1), 1.5 * 2.0 ** ((1 << e) - 1 - _bias(fmt)), math.inf, -math.inf]
    if fmt == "fp8_e4m3fn":
        values += [447.0, 463.0, -460.0]  # below 464 (torch versions differ past it), rounding to 448
    out = []
    for v in values:
        narrow_ok = fmt == "fp32" or math.isnan(v) or float(torch.tensor(v, dtype=torch.float32)) == v
        if narrow_ok and v == v and v != 0 or math.isnan(v):
            out.append(v)
    return out


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

    boundary_classes = {
        "+0": lambda c, e: c.args[0] == 0,
        "-0 (the sign bit alone)": lambda c, e: c.args[0] == 1 << (_width(c.args[1]) - 1),
        "the smallest subnormal (exponent 0, mantissa 1)": lambda c, e: _magnitude_bits(*c.args) == 1,
        "the largest subnormal (exponent 0, mantissa all ones)":
            lambda c, e: _magnitude_bits(*c.args) == (1 << FORMATS[c.args[1]][1]) - 1,
        "the smallest normal (exponent 1, mantissa 0)": lambda c, e: _magnitude_bits(*c.args) == 1 << FORMATS[c.args[1]][1],
        "the largest finite value": lambda c, e: _magnitude_bits(*c.args) == _max_finite_bits(c.args[1]),
        "one step past the largest finite value (inf, or NaN in e4m3fn)":
            lambda c, e: _magnitude_bits(*c.args) == _max_finite_bits(c.args[1]) + 1,
        "-inf": lambda c, e: e == -math.inf,
        "a NaN with the smallest payload (mantissa 1)": lambda c, e: math.isnan(e) and fields_of(*c.args)[2] == 1,
        "a negative NaN": lambda c, e: math.isnan(e) and c.args[0] >> (_width(c.args[1]) - 1) == 1,
        "e4m3fn: an all-ones exponent that is a number": lambda c, e: c.args[1] == "fp8_e4m3fn" and math.isfinite(e)
            and fields_of(c.args[0], "fp8_e4m3fn")[1] == 15,
        **{f"{fmt}: inf": (lambda f: lambda c, e: c.args[1] == f and math.isinf(e))(fmt)
           for fmt in FORMATS if FORMATS[fmt][2]},
        **{f"{fmt}: NaN": (lambda f: lambda c, e: c.args[1] == f and math.isnan(e))(fmt) for fmt in FORMATS},
    }

    def hidden_cases(self):
        def case(fmt, r):
            w = _width(fmt)
            return Case((r % (1 << w), fmt))

        return [Case((b, f)) for f in FORMATS for b in _boundary_patterns(f)] + draw(
            st.builds(case, st.sampled_from(list(FORMATS)), st.integers(0, 2**32 - 1)), 60)

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
        if got == -expected and expected != 0:  # (also -inf for inf)
            return f"the top bit (bit {1 + e + m - 1}) is the sign: 1 means negative."
        if not has_inf and exp == (1 << e) - 1 and not math.isnan(expected) and not math.isfinite(got):
            return ("fp8_e4m3fn has no infinities: an all-ones exponent is an ordinary normal number; only "
                    "S.1111.111 is NaN.")
        if has_inf and (math.isnan(expected) or math.isinf(expected)):
            return "an all-ones exponent means inf (mantissa 0) or NaN (mantissa != 0) in IEEE formats."
        bias = (1 << (e - 1)) - 1
        if exp == 0 and mant and got == math.copysign(math.ldexp((1 << m) | mant, 1 - bias - m), expected):
            return ("exponent field 0 is subnormal: the value is 0.mantissa * 2**(1 - bias), with no implicit "
                    "leading 1.")
        if exp == 0 and mant and got == expected / 2:  # a subnormal's exponent of -bias, or a bias one too big
            return (f"this subnormal came out at half its value: a subnormal is 0.mantissa * 2**(1 - bias) (the "
                    f"smallest normal's exponent, not -bias), with bias = 2**(E-1) - 1 = {bias} for {fmt}.")
        if exp != 0 and expected and got in (2 * expected, expected / 2):
            return (f"the value is off by a factor of 2, an exponent off by one: 1.mantissa * 2**(exponent - bias) "
                    f"with bias = 2**(E-1) - 1 = {bias} for {fmt}.")
        return None


# =================================================================================================
# amp.decompose decompose (encode with round-to-nearest-even)
# =================================================================================================
class Decompose(Exercise):
    id, entry, points = "amp.decompose", "decompose", 2
    title = "round a float into a format, ties to even"
    policy = Policy(banned=STRUCT_LIKE, why="work on the bits with integer arithmetic")
    forbid = NO_SOLUTION_MODULES
    withheld_from_students = ("diagnose",)  # its diagnosis rounds with a plain-Python IEEE encoder: this solution

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

        cases = [Case((v, f)) for f in FORMATS for v in _decompose_edges(f) + [0.0]]
        cases += draw(st.builds(narrow_case, st.sampled_from(narrow), _float32_values()), 50)
        cases += draw(st.sampled_from(list(FORMATS)).flatmap(lambda f: _ties(f).map(lambda v: narrow_case(f, v))), 40)
        cases += [Case((v if v != 0 else 0.0, "fp32")) for v in draw(st.floats(allow_nan=False, allow_subnormal=True), 20)]
        return cases

    boundary_classes = {
        "a tie that rounds down to the even neighbour": lambda c, e: _tie(*c.args) == "down",
        "a tie that rounds up to the even neighbour": lambda c, e: _tie(*c.args) == "up",
        "a tie whose rounding carries into the next exponent": lambda c, e: _tie(*c.args) == "up" and e[2] == 0,
        "one input step above a tie": lambda c, e: _tie(_next(c.args[0], c.args[1], -1), c.args[1]) is not None,
        "one input step below a tie": lambda c, e: _tie(_next(c.args[0], c.args[1], +1), c.args[1]) is not None,
        "a tie between two subnormals": lambda c, e: _tie(*c.args) is not None and abs(c.args[0]) < _smallest_normal(c.args[1]),
        "half the smallest subnormal (a tie with zero)": lambda c, e: abs(c.args[0]) == _smallest_normal(c.args[1]) / 2 ** (
            FORMATS[c.args[1]][1] + 1),
        "a subnormal result": lambda c, e: e[1] == 0 and e[2] != 0,
        "rounds up from below the smallest normal to it": lambda c, e: abs(c.args[0]) < _smallest_normal(c.args[1])
            and e[1:] == (1, 0),
        "the largest finite value": lambda c, e: c.args[0] == torch_value_of_bits(_max_finite_bits(c.args[1]), c.args[1]),
        "the tie between the largest finite value and the next binade (overflows to inf)":
            lambda c, e: FORMATS[c.args[1]][2] and _tie(*c.args) is not None and is_inf_fields(e, c.args[1]),
        "one input step below that tie (the largest finite value)":
            lambda c, e: FORMATS[c.args[1]][2] and e[1:] == fields_of(_max_finite_bits(c.args[1]), c.args[1])[1:]
            and _tie(_next(c.args[0], c.args[1], +1), c.args[1]) is not None,
        "a value in the binade past the largest finite (its exponent field would be all ones)":
            lambda c, e: math.isfinite(c.args[0]) and is_inf_fields(e, c.args[1])
            and math.frexp(c.args[0])[1] - 1 == (1 << FORMATS[c.args[1]][0]) - 1 - _bias(c.args[1]),
        "inf": lambda c, e: c.args[0] == math.inf,
        "-inf": lambda c, e: c.args[0] == -math.inf,
        **{f"{fmt}: zero (no -0: the grading boundary carries it as 0.0)":
           (lambda f: lambda c, e: c.args[1] == f and c.args[0] == 0)(fmt) for fmt in FORMATS},
        "NaN": lambda c, e: math.isnan(c.args[0]),
        "a negative value": lambda c, e: c.args[0] < 0,
        "fp32 from a double that float32 cannot hold": lambda c, e: c.args[1] == "fp32" and math.isfinite(c.args[0])
            and float(torch.tensor(c.args[0], dtype=torch.float32)) != c.args[0],
        **{f"{fmt}: NaN": (lambda f: lambda c, e: c.args[1] == f and math.isnan(c.args[0]))(fmt) for fmt in FORMATS},
    }

    def expected(self, case):
        value, fmt = case.args
        return fields_of(torch_bits_of_value(value, fmt), fmt)

    def compare(self, case, got, expected):
        value, fmt = case.args
        if not isinstance(got, (tuple, list)) or len(got) != 3 or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in got):
            return f"expected a tuple of three ints (sign, exponent, mantissa) {expected}\n     got {describe(got)}"
        e, m, _, _ = FORMATS[fmt]
        if got[0] not in (0, 1) or not 0 <= got[1] < 1 << e or not 0 <= got[2] < 1 << m:
            return (f"a field does not fit {fmt}: sign 0 or 1, exponent 0..{(1 << e) - 1} ({e} bits), mantissa "
                    f"0..{(1 << m) - 1} ({m} bits)\n  expected {expected}\n       got {tuple(got)}")
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
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in got):
            return None
        sign, exponent, mantissa = got
        if mantissa == 1 << m and exponent == expected[1] - 1 and expected[2] == 0:
            return ("rounding carried out of the mantissa (all ones + 1): the carry moves into the exponent, "
                    "so the mantissa becomes 0 and the exponent goes up by one.")
        if exponent >= 1 << e and is_inf_fields(expected, fmt):
            return (f"the exponent field has only {e} bits in {fmt}: a value that needs a bigger one overflowed, and "
                    f"becomes inf (all-ones exponent, mantissa 0).")
        if sign not in (0, 1) or not 0 <= exponent < 1 << e or not 0 <= mantissa < 1 << m:
            return None
        return rounding_hint(value, fmt, (sign << (e + m)) | (exponent << m) | mantissa)


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
                                  6e-8, 1e-9, 6.1e-5, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 1e-40], dtype=torch.float32)


# fp32 bit patterns at every rounding edge of each target, drawn deliberately (what each one tests):
BOUNDARY_PATTERNS = {
    "bf16": (
        0x3F808000, 0x3F818000, 0xBF808000,  # ties (16 dropped bits = 0x8000): to even down, up, negative
        0x3F807FFF, 0x3F808001, 0x3F817FFF, 0x3F818001,  # one fp32 step either side of those ties
        0x3FFF8000, 0x3FFFFFFF,  # a tie and 1.9999999: the carry runs into the exponent (2.0)
        0x00008000, 0x00018000, 0x00008001, 0x00007FFF, 0x80008000,  # ties and steps among bf16 subnormals
        0x007F8000, 0x007FFFFF, 0x00800000, 0x00000001,  # into the smallest normal; fp32's smallest subnormal
        0x7F7F0000, 0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001, 0x7F7FFFFF,  # largest finite, below/at/above the inf tie
        0x7F800000, 0xFF800000, 0x00000000, 0x80000000,  # +-inf, +-0
        0x7F800001, 0x7F808000, 0x7F80FFFF, 0x7FBFFFFF, 0x7FC00000, 0x7FFFFFFF, 0xFFC00000, 0xFF800001,  # NaNs
    ),
    "fp16": (
        0x3F801000, 0x3F803000, 0xBF801000,  # ties (13 dropped bits = 0x1000): to even down, up, negative
        0x3F800FFF, 0x3F801001, 0x3F802FFF, 0x3F803001,  # one fp32 step either side of those ties
        0x3FFFF000,  # a tie whose rounding carries into the exponent (2.0)
        0x477FE000, 0x477FE001, 0x477FEFFF, 0x477FF000, 0x477FF001, 0xC77FF000,  # 65504; the tie at 65520 -> inf
        0x47800000, 0x47C35000, 0x7F7FFFFF,  # 65536, 1e5, float32's largest: past fp16's range
        0x38800000, 0x387FFFFF, 0x387FF000, 0x387FEFFF,  # 2**-14, below it, the subnormal/normal tie
        0x38002000, 0x38002001, 0x38006000, 0x38001FFF,  # ties and steps at a 14-bit shift (fp16 subnormals)
        0x33000000, 0x33000001, 0x32FFFFFF, 0x33400000, 0x333FFFFF, 0x33400001, 0xB3000000,  # 2**-25, 3 * 2**-25
        0x32800000, 0x00000001, 0x007FFFFF, 0x00800000,  # shifts of 25 and more; fp32 subnormals: all 0
        0x7F800000, 0xFF800000, 0x00000000, 0x80000000,  # +-inf, +-0
        0x7F800001, 0x7F801000, 0x7F802000, 0x7FBFFFFF, 0x7FC00000, 0x7FFFFFFF, 0xFFC00000, 0xFF800001,  # NaNs
    ),
}


def _from_patterns(patterns) -> torch.Tensor:
    """float32 tensor holding exactly these bit patterns (unsigned 32-bit ints)."""
    signed = [u - (1 << 32) if u >= 1 << 31 else u for u in patterns]
    return torch.tensor(signed, dtype=torch.int32).view(torch.float32)


def _boundary_cases(fmt: str) -> list[Case]:
    x = _from_patterns(BOUNDARY_PATTERNS[fmt])
    n = x.numel()
    spread = torch.full((2 * n + 3,), 7.0)  # the same values every other element, 3 elements into a bigger buffer
    spread[3::2] = x
    return [Case((x,), label="every rounding edge: ties, steps either side, subnormals, overflow, inf, NaN payloads"),
            Case((spread[3::2],), label="the same edges, strided, at a storage offset"),
            Case((x[:n - n % 4].view(4, -1).t(),), label="the same edges, transposed"),
            Case((x[:1].view(()),), label="a 0-dim tensor"), Case((x[3:4],), label="size 1"),
            Case((x[:0],), label="an empty tensor")]


_FEATURES: dict = {}


def _round_features(x: torch.Tensor, fmt: str) -> dict[str, bool]:
    """Which rounding situations the elements of ``x`` hit when rounded to ``fmt`` (for boundary_classes)."""
    key = (id(x), fmt)
    if key in _FEATURES and _FEATURES[key][0] is x:
        return _FEATURES[key][1]
    u = x.contiguous().view(torch.int32).to(torch.int64).flatten() & 0xFFFF_FFFF
    mag, negative = u & 0x7FFF_FFFF, (u >> 31) == 1
    exp32, mant32 = mag >> 23, mag & 0x7F_FFFF
    finite = mag < 0x7F80_0000
    if fmt == "bf16":
        v, shift, m_bits = mag, torch.full_like(mag, 16), 7
        subnormal = (mag >> 16) < 0x80
    else:
        normal = exp32 >= 113
        v = torch.where(normal, mag, mant32 | (1 << 23))
        shift, m_bits = torch.where(normal, 13, (126 - exp32).clamp(1, 40)), 10
        subnormal = ~normal & (exp32 > 0)
    one = torch.ones_like(v)
    q, rem, half = v >> shift, v & ((one << shift) - 1), one << (shift - 1)
    tie = finite & (rem == half) & (exp32 > 0 if fmt == "fp16" else True)
    top = 0x7F7F0000 if fmt == "bf16" else 0x477FE000
    over_tie = 0x7F7F8000 if fmt == "bf16" else 0x477FF000
    feats = {
        "a tie that rounds down to the even neighbour": tie & ((q & 1) == 0) & ~subnormal,
        "a tie that rounds up to the even neighbour": tie & ((q & 1) == 1) & ~subnormal,
        "a tie among the target's subnormals": tie & subnormal & (q > 0),
        "a tie at half the smallest subnormal (rounds to zero)": tie & subnormal & (q == 0),
        "a tie whose carry runs into the exponent": tie & ((q & 1) == 1) & (((q + 1) & ((1 << m_bits) - 1)) == 0),
        "one fp32 step above a tie": finite & (rem == half + 1) & (shift > 1),
        "one fp32 step below a tie": finite & (rem == half - 1) & (shift > 1),
        "the largest finite value": mag == top,
        "the tie at the overflow threshold (rounds to inf)": mag == over_tie,
        "one fp32 step below that tie (rounds to the largest finite value)": mag == over_tie - 1,
        "fp32 subnormal inputs": (exp32 == 0) & (mant32 != 0),
        "+inf and -inf": (mag == 0x7F80_0000) & negative,
        "-0": u == 0x8000_0000,
        "a NaN whose payload lies only in the dropped bits": (mag > 0x7F80_0000) & ((mant32 >> (16 if fmt == "bf16" else 13)) == 0),
        "a signalling NaN (quiet bit clear)": (mag > 0x7F80_0000) & ((mant32 >> 22) == 0),
        "a negative NaN": (mag > 0x7F80_0000) & negative,
    }
    if fmt == "fp16":
        feats["just below 2**-14, rounding up into the smallest normal"] = mag == 0x387FFFFF
        feats["a shift of 25 or more (rounds to zero)"] = finite & (exp32 > 0) & (exp32 <= 101)
    out = {name: bool(hit.any()) for name, hit in feats.items()}
    _FEATURES[key] = (x, out)
    return out


class _RoundBits(Exercise):
    policy = Policy(banned=LOW_PRECISION_CASTS,
                    why="round with integer operations on the bit pattern (view as int32, shift, mask, add)")
    fmt = "bf16"
    probe = "ptinternals.checks.probes.amp:record_bit_ops"
    timeout_s = 30.0
    withheld_from_students = ("diagnose",)  # its diagnosis rounds with a plain-Python IEEE encoder (the answer)

    def visible_cases(self):
        edges = _edge_values(self.fmt)
        return [Case((edges,), label="edge values: ties, subnormals, overflow, inf, NaN, signed zeros"),
                Case((torch.arange(12.0).view(3, 4).t() / 7,), label="a transposed (non-contiguous) 4x3 tensor"),
                Case((torch.empty(0),), label="an empty tensor"),
                Case((torch.tensor(-1.0 / 3),), label="a 0-dim tensor")]

    def hidden_cases(self):
        return _boundary_cases(self.fmt) + _rounding_cases(self.fmt, 30)

    @property
    def boundary_classes(self):
        names = _round_features(torch.empty(0), self.fmt)  # every situation of the format (none hit here)
        feature_classes = {name: (lambda n: lambda c, e: _round_features(c.args[0], self.fmt)[n])(name)
                           for name in names}
        return {
            **feature_classes,
            "an empty tensor": lambda c, e: c.args[0].numel() == 0,
            "a 0-dim tensor": lambda c, e: c.args[0].dim() == 0,
            "a size-1 tensor": lambda c, e: c.args[0].dim() == 1 and c.args[0].numel() == 1,
            "a transposed (non-contiguous) input": lambda c, e: c.args[0].dim() == 2 and c.args[0].stride(0) == 1
                                                                and c.args[0].shape[0] > 1,
            "a strided input at a storage offset": lambda c, e: c.args[0].storage_offset() > 0
                                                                and not c.args[0].is_contiguous(),
        }

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
            if got.get("input_modified"):
                return ("the values are right, but x was changed in place: leave the input as it was (work on a "
                        "copy: x.contiguous().view(torch.int32).to(torch.int64) is one)")
            return None
        n_bad, idx, value, e, g = bad
        u = int(torch.tensor([value], dtype=torch.float32).view(torch.int32).item()) & 0xFFFF_FFFF
        return (f"{n_bad} of {expected.numel()} elements differ; first at index {idx}: input {value!r} "
                f"(fp32 bits 0x{u:08X})\n  expected {_bits_label(e, self.fmt)}\n       got {_bits_label(g, self.fmt)}")

    def _mismatches(self, case, got_values, expected):
        """(how many elements differ, the first one's index, input value, expected bits, got bits), or None.
        NaN payloads differ between torch's code paths: any NaN answers a NaN."""
        (x,) = case.args
        bad = self._bad_positions(got_values, expected)
        if not bad:
            return None
        flat = bad[0]
        ge = int(got_values.to(torch.int64).flatten()[flat]) & 0xFFFF
        ee = int(expected.to(torch.int64).flatten()[flat]) & 0xFFFF
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(expected.shape))) if x.dim() else ()
        return len(bad), idx, x.flatten()[flat].item(), ee, ge

    def diagnose(self, case, got, expected):
        out = got.get("out") if isinstance(got, dict) else None
        if not isinstance(out, TensorInfo) or tuple(out.shape) != tuple(expected.shape) or out.dtype != "int16":
            return None
        # A cause is named only when it explains every wrong element (the first 256): one element alone can
        # look like several mistakes (a subnormal that came out 0 is flushing, or a lost implicit bit).
        (x,) = case.args
        got_bits = out.values.to(torch.int64).flatten() & 0xFFFF
        hints = set()
        for flat in self._bad_positions(out.values, expected)[:256]:
            hints.add(rounding_hint(x.flatten()[flat].item(), self.fmt, int(got_bits[flat])))
            if None in hints or len(hints) > 1:
                return None
        return hints.pop() if hints else None

    def _bad_positions(self, got_values, expected) -> list[int]:
        e_bits, m_bits, _, _ = FORMATS[self.fmt]
        ge = got_values.to(torch.int64).flatten() & 0xFFFF
        ee = expected.to(torch.int64).flatten() & 0xFFFF
        exp_mask, mant_mask = ((1 << e_bits) - 1) << m_bits, (1 << m_bits) - 1
        e_nan = ((ee & exp_mask) == exp_mask) & ((ee & mant_mask) != 0)
        g_nan = ((ge & exp_mask) == exp_mask) & ((ge & mant_mask) != 0)
        return torch.where(e_nan, ~g_nan, ge != ee).nonzero().flatten().tolist()


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


def _layer_input(case, expected, i) -> str:
    """The dtype of layer ``i``'s input: the previous layer's output, or the case's input dtype."""
    return expected[i - 1] if i else case.args[3]


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
        deliberate = [([], "cpu", "bfloat16", "float32"), (["relu"], "cuda", "float16", "float16")]
        for dev in ("cpu", "cuda"):
            deliberate += [(list(BODY_OPS) + ["sum"], dev, "bfloat16", "float16"),  # the other 16-bit dtype as input
                           (list(BODY_OPS) + ["mse_loss"], dev, "float16", "float32")]
            deliberate += [(["matmul", op], dev, "float16", "float32") for op in sorted(_CUDA_FP32_OPS)]
            deliberate += [(["linear", "cross_entropy"], dev, "bfloat16", "float32")]
        return [Case(args) for args in deliberate] + draw(build, 36)

    boundary_classes = {
        "no layers": lambda c, e: c.args[0] == [],
        "one layer": lambda c, e: len(c.args[0]) == 1,
        "an input in the other 16-bit dtype than autocast's": lambda c, e: c.args[3] in ("bfloat16", "float16")
                                                                              and c.args[3] != c.args[2],
        "a low-precision activation plus an fp32 tensor (add_fp32)": lambda c, e: any(
            op == "add_fp32" and _layer_input(c, e, i) != "float32" for i, op in enumerate(c.args[0])),
        **{f"{op} on {dev}": (lambda o, d: lambda c, e: o in c.args[0] and c.args[1] == d)(op, dev)
           for op in BODY_OPS + TERMINAL_OPS for dev in ("cpu", "cuda")},
        **{f"{op} on {dev}, given a low-precision activation": (lambda o, d: lambda c, e: c.args[1] == d and any(
            x == o and _layer_input(c, e, i) != "float32" for i, x in enumerate(c.args[0])))(op, dev)
           for op in sorted(_CUDA_FP32_OPS) for dev in ("cpu", "cuda")},
    }

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

        below_half_max = float(torch.nextafter(torch.tensor(FLT_MAX / 2), torch.tensor(0.0)))
        deliberate = [
            (FLT_MAX / 2, 0, False, 2.0, 0.5, 1),  # grows to exactly float32's largest value
            (below_half_max, 0, False, 2.0, 0.5, 1),  # one float32 step below: grows
            (2.0**127, 0, False, 2.0, 0.5, 1),  # one step above: 2**128 is past float32's range, keep
            (FLT_MAX, 0, False, 2.0, 0.5, 1), (FLT_MAX, 3, True, 2.0, 0.5, 4),
            (1024.0, 3, False, 2.0, 0.5, 5), (1024.0, 4, False, 2.0, 0.5, 5), (1024.0, 4, True, 2.0, 0.5, 5),
            (1024.0, 5, False, 2.0, 0.5, 5), (1024.0, 6, False, 2.0, 0.5, 5),  # at/past the interval: keep counting
            (65536.0, 1998, False, 2.0, 0.5, 2000), (65536.0, 1999, False, 2.0, 0.5, 2000),
            (2.0**-126, 0, True, 2.0, 0.5, 2000),  # backs off to a float32 subnormal
            (65536.0, 0, False, 1.0001, 0.5, 1), (1.0, 0, True, 2.0, 0.9, 3),  # products float32 must round
        ]
        return [Case(args) for args in deliberate] + draw(case(), 60)

    boundary_classes = {
        "an inf/NaN was found": lambda c, e: c.args[2],
        "an inf/NaN found on the step that would have grown": lambda c, e: c.args[2] and c.args[1] + 1 == c.args[5],
        "growth_interval 1": lambda c, e: c.args[5] == 1,
        "growth_tracker + 1 == growth_interval: grow": lambda c, e: not c.args[2] and c.args[1] + 1 == c.args[5] > 1,
        "growth_tracker + 2 == growth_interval: not yet": lambda c, e: not c.args[2] and c.args[1] + 2 == c.args[5],
        "growth_tracker == growth_interval: torch keeps counting": lambda c, e: not c.args[2] and c.args[1] == c.args[5],
        "growth_tracker > growth_interval": lambda c, e: not c.args[2] and c.args[1] > c.args[5],
        "a growth_tracker > 256 (past CPython's small-int cache)": lambda c, e: not c.args[2] and c.args[1] > 256,
        "scale * growth_factor == float32's largest value: grows": lambda c, e: e[0] == FLT_MAX != c.args[0],
        "one float32 step below that: grows": lambda c, e: not c.args[2] and c.args[0] * c.args[3] < FLT_MAX
                                                                and e[0] == c.args[0] * c.args[3] > FLT_MAX / 2,
        "scale * growth_factor past float32's range: keeps the scale": lambda c, e: not c.args[2]
            and c.args[1] + 1 == c.args[5] and c.args[0] * c.args[3] > FLT_MAX,
        "a back-off to a float32 subnormal": lambda c, e: c.args[2] and 0 < e[0] < 2.0**-126,
        "a product float32 must round": lambda c, e: e[0] != c.args[0] * (c.args[4] if c.args[2] else c.args[3])
                                                     and e[0] != c.args[0],
    }

    def expected(self, case):
        return torch_update_scale(*case.args)

    def compare(self, case, got, expected):
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return f"expected a pair (new_scale, new_growth_tracker) {expected}\n     got {describe(got)}"
        scale, tracker = got
        if isinstance(tracker, bool) or not isinstance(tracker, int) or tracker != expected[1]:
            return f"new_growth_tracker: expected {expected[1]}, got {describe(tracker)}\n  expected {expected}\n       got {describe(tuple(got))}"
        if not _same_float(scale, expected[0]):  # relative: a tiny scale must be right too, not merely near 0
            return f"new_scale: expected {expected[0]!r}, got {describe(scale)}\n  expected {expected}\n       got {describe(tuple(got))}"
        return None

    def diagnose(self, case, got, expected):
        scale, tracker, found, growth, backoff, interval = case.args
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return None
        g_scale, g_tracker = got
        if not isinstance(g_scale, (int, float)) or isinstance(g_tracker, bool) or not isinstance(g_tracker, int):
            return None
        right_scale = _same_float(g_scale, expected[0])
        if found and right_scale and g_tracker != 0:
            return "a skipped step (inf/NaN found) resets growth_tracker to 0: growth needs consecutive good steps."
        if not abs(g_scale) <= FLT_MAX:
            return ("never grow the scale to inf: the scale lives in a float32 tensor, so if scale * growth_factor "
                    "is past float32's largest value (3.4028235e38), keep the old scale.")
        if found:
            return None
        grew = _same_float(g_scale, scale * growth) and not _same_float(scale * growth, scale)
        if tracker + 1 == interval:
            if right_scale and g_tracker == interval:
                return "after growing, growth_tracker starts again from 0."
            if _same_float(g_scale, scale) and not right_scale and g_tracker == interval:
                return ("this good step completes growth_interval good steps in a row (growth_tracker + 1 == "
                        "growth_interval): grow the scale now and reset growth_tracker to 0.")
        elif tracker + 2 == interval and grew and g_tracker == 0:
            return "off by one: you grew one good step too early; grow when growth_tracker + 1 == growth_interval."
        elif tracker >= interval and grew:
            return ("torch grows only when the count reaches growth_interval exactly (==): a growth_tracker already "
                    "at or past it (a checkpoint restored with a smaller interval) just keeps counting.")
        if right_scale and g_tracker == tracker and expected[1] == tracker + 1:
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


def _step(shapes, seed, micro=1, mag=-3.0, inject=None, unscale=False, twice=False, no_grad=()):
    """One script step: ``micro`` micro-batches of gradients; ``inject`` = (micro, param, kind) or None;
    the parameters ``no_grad`` (indices) take no part in the loss, so their ``.grad`` stays None."""
    grads = []
    for k in range(micro):
        row = []
        for i, s in enumerate(shapes):
            kind = inject[2] if inject and inject[:2] == (k, i) else "none"
            row.append(None if i in no_grad else _grad(s, seed * 97 + k * 13 + i, mag, kind))
        grads.append(row)
    return {"micro": grads, "unscale": unscale, "twice": twice}


def _script_grads(script):
    """Every gradient tensor of a script (None entries left out)."""
    return [g for step in script for row in step["micro"] for g in row if g is not None]


def _no_grad_before_another(script) -> bool:
    """A step where a parameter gets no gradient and a later parameter does (unscale_ must skip, not stop)."""
    for step in script:
        n = len(step["micro"][0])
        missing = [all(row[i] is None for row in step["micro"]) for i in range(n)]
        if any(missing[i] and not all(missing[i + 1:]) for i in range(n - 1)):
            return True
    return False


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

        sh = [(3,), (2, 2), (4,)]
        no_grad_first = [_step(sh, s, unscale=s % 2 == 1, inject=(0, 1, "inf") if s == 2 else None, no_grad=(0,))
                         for s in range(4)]
        near_max = [_step([(3,)], s, mag=-36.0) for s in range(3)]  # S * g ~ 100 at S ~ 2**127: no fp16 overflow
        long_run = [_step([(2,)], s % 7) for s in range(259)]
        deliberate = [
            Case((_config(init_scale=1024.0), _params(sh, 5), no_grad_first),
                 label="parameter 0 never gets a gradient (its .grad stays None): unscale_ must skip it, then go on"),
            Case((_config(init_scale=FLT_MAX / 2, growth_interval=1), _params([(3,)], 6), near_max),
                 label="the scale grows to exactly float32's largest value, then may not grow past it"),
            Case((_config(init_scale=1.0, growth_interval=257), _params([(2,)], 7), long_run),
                 label="growth_interval 257: 259 good steps (a count past CPython's small-int cache)"),
        ]
        return deliberate + draw(case(), 22)

    boundary_classes = {
        "an inf in a gradient": lambda c, e: any(bool((g == math.inf).any()) for g in _script_grads(c.args[2])),
        "a -inf in a gradient": lambda c, e: any(bool((g == -math.inf).any()) for g in _script_grads(c.args[2])),
        "a NaN in a gradient": lambda c, e: any(bool(g.isnan().any()) for g in _script_grads(c.args[2])),
        "S * g overflows fp16 without an injected inf": lambda c, e: any(
            not stepped and all(bool(g.isfinite().all()) for row in step["micro"] for g in row if g is not None)
            for stepped, step in zip(e["stepped"], c.args[2])),
        "a parameter whose .grad is None, before one that has a gradient": lambda c, e: _no_grad_before_another(c.args[2]),
        "a 0-dim parameter": lambda c, e: any(p.dim() == 0 for p in c.args[1]),
        "a size-0 parameter": lambda c, e: any(p.numel() == 0 for p in c.args[1]),
        "several micro-batches (accumulation)": lambda c, e: any(len(step["micro"]) > 1 for step in c.args[2]),
        "unscale_ before step": lambda c, e: any(step["unscale"] for step in c.args[2]),
        "unscale_ twice in one iteration (must raise)": lambda c, e: any(step["twice"] for step in c.args[2]),
        "growth_interval 1": lambda c, e: c.args[0]["growth_interval"] == 1,
        "the scale grows": lambda c, e: any(b > a for a, b in zip(e["scales"], e["scales"][1:])),
        "a skipped step right after a growth": lambda c, e: any(
            e["scales"][k] > e["scales"][k - 1] and not e["stepped"][k] for k in range(1, len(e["stepped"]))),
        "a growth to exactly float32's largest value": lambda c, e: FLT_MAX in e["scales"][1:] and c.args[0]["init_scale"] != FLT_MAX,
        "a growth past float32's range, refused": lambda c, e: any(
            a == b == FLT_MAX and stepped for a, b, stepped in zip(e["scales"], e["scales"][1:], e["stepped"])),
        "growth_interval > 256 (past CPython's small-int cache)": lambda c, e: c.args[0]["growth_interval"] > 256
                                                                           and max(e["scales"]) > e["scales"][0],
    }

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
                theirs, yours = ("called optimizer.step()" if s else "skipped it" for s in
                                 (expected["stepped"][k], got["stepped"][k]))
                return (f"step {k}: torch's GradScaler {theirs}, yours {yours}\n"
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
        if not isinstance(got, dict) or "stepped" not in got or got.get("used"):
            return None
        for k in range(len(script)):  # the first step compare() finds wrong; the scale before it was right
            scale = expected["scales"][k]
            if not _same_float(got["scales"][k], scale):
                return None
            if got["stepped"][k] and not expected["stepped"][k]:
                return ("the gradients of this step held an inf or NaN: step() must skip optimizer.step() (check "
                        "every gradient with torch.isfinite while unscaling, and remember what you found).")
            if expected["stepped"][k] and not got["stepped"][k]:
                if not all(expected["stepped"][:k]):  # an earlier step found an inf
                    return ("this step's gradients were finite: found_inf must be reset for every iteration (a new "
                            "flag per unscale_), or an old inf keeps skipping steps.")
                return None
            if got["twice"][k] != expected["twice"][k]:
                return ("unscale_() twice in one iteration must raise RuntimeError: track a per-optimizer stage "
                        "(READY -> UNSCALED -> STEPPED) and reset it in update().")
            ratios = {i: _ratio(gg.values, eg) for i, (gg, eg) in enumerate(zip(got["grads"][k], expected["grads"][k]))
                      if isinstance(gg, TensorInfo) and eg is not None and eg.numel() and torch.isfinite(eg).all()}
            no_grad = [i for i, eg in enumerate(expected["grads"][k]) if eg is None]
            after = [r for i, r in ratios.items() if no_grad and i > no_grad[0]]
            if scale != 1 and after and all(r is not None and math.isclose(r, scale, rel_tol=1e-3) for r in after):
                return ("the gradients after a parameter without one (.grad None) were never unscaled: unscale_ must "
                        "skip it and go on with the next parameter (continue, not break).")
            for ratio in (r for r in ratios.values() if r is not None and scale != 1):
                if math.isclose(ratio, 1 / scale, rel_tol=1e-3):
                    return ("the gradients were divided by the scale twice: step() must not unscale again "
                            "when unscale_() was already called in this iteration (unscaling twice).")
                if math.isclose(ratio, scale, rel_tol=1e-3):
                    return "the gradients were never unscaled: step() divides them by the scale first."
                if math.isclose(ratio, scale * scale, rel_tol=1e-3):
                    return "unscale_ multiplies the gradients by 1/scale, not by scale."
            after, want = got["scales"][k + 1], expected["scales"][k + 1]
            if not _same_float(after, want):
                if not expected["stepped"][k] and _same_float(after, scale):
                    return "a skipped step must back off: scale *= backoff_factor (and growth_tracker = 0)."
                if isinstance(after, (int, float)) and not abs(after) <= FLT_MAX:
                    return ("never grow the scale to inf: if scale * growth_factor is past float32's largest value, "
                            "keep the scale.")
                return None
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
                  opt=("adam", 1e-2), scaler=None, clip=None, accum=1, loss_weight=1.0, frozen=(), label=""):
    """``frozen``: names of master weights the probe sets to ``requires_grad=False`` (the optimizer still owns
    them); a keyword of the case, as a tensor's requires_grad does not cross the sandbox boundary."""
    from ..amp.scaffold import MLPConfig, init_mlp_params, make_regression_data

    cfg = MLPConfig(d_in, d_hidden, d_out, seed=seed, loss_weight=loss_weight)
    data = make_regression_data(cfg, n_batches=n_batches, batch_size=batch, seed=seed + 1)
    return Case((init_mlp_params(cfg), opt, data, steps, dtype, scaler, clip, accum, loss_weight),
                {"frozen": tuple(frozen)} if frozen else {}, label=label)


def _frozen(case) -> tuple[str, ...]:
    return tuple(case.kwargs.get("frozen", ()))


def reference_run(params, opt, data, steps, dtype, scaler, clip, accum, loss_weight, frozen=()) -> dict:
    """The expected run: torch.autocast + torch.amp.GradScaler (ptinternals.amp.trainer's reference)."""
    from ..amp.scaffold import MLPConfig
    from ..amp.trainer import reference_autocast_train_steps

    cfg = MLPConfig(params["w1"].shape[1], params["w1"].shape[0], params["w2"].shape[0], loss_weight=loss_weight)
    torch_scaler = probes.make_scaler(scaler)
    ref = reference_autocast_train_steps(cfg, data, steps, dtype, scaler=torch_scaler, clip=clip, accum=accum,
                                         lr=opt[1], optimizer=opt[0], init=params, frozen=frozen)
    final_scale = torch_scaler.get_scale() if torch_scaler is not None else 1.0
    return {"losses": ref["losses"], "skipped": ref["skipped_steps"], "params": ref["final_params"],
            "init": {n: p.detach().clone() for n, p in params.items()}, "scales": ref["scales"] + [final_scale],
            "grad_norms": ref["grad_norms"]}


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
            _trainer_case(steps=3, frozen=("b1",), clip=0.5, label="b1 frozen (requires_grad=False): it must not move"),
        ]

    boundary_classes = {
        "float32 (no low precision)": lambda c, e: c.args[4] == torch.float32,
        "bfloat16": lambda c, e: c.args[4] == torch.bfloat16,
        "fp16 without a scaler: every gradient underflows": lambda c, e: c.args[4] == torch.float16
            and c.args[5] is None and c.args[8] < 2.0**-10,
        "skipped steps (fp16 overflow at the first scales)": lambda c, e: bool(e["skipped"]),
        "a scale that grows during the run (a growth is not a skip)": lambda c, e: any(
            b > a for a, b in zip(e["scales"], e["scales"][1:])),
        "accumulation (accum > 1)": lambda c, e: c.args[7] > 1,
        "more micro-batches than batches (the data wraps around)": lambda c, e: c.args[3] * c.args[7] > len(c.args[2]),
        "clipping that cuts the gradient": lambda c, e: c.args[6] is not None and any(
            c.args[6] < n < math.inf for n in e["grad_norms"]),
        "clipping that changes nothing (clip above the norm)": lambda c, e: c.args[6] is not None and all(
            n <= c.args[6] or not math.isfinite(n) for n in e["grad_norms"]),
        "a frozen bias (requires_grad=False)": lambda c, e: _frozen(c) == ("b1",),
        "a frozen first layer (w1 and b1)": lambda c, e: set(_frozen(c)) == {"w1", "b1"},
        "batch size 1": lambda c, e: c.args[2][0][0].shape[0] == 1,
        "a size-1 output (d_out 1)": lambda c, e: c.args[0]["w2"].shape[0] == 1,
        "SGD": lambda c, e: c.args[1][0] == "sgd",
        "Adam": lambda c, e: c.args[1][0] == "adam",
    }

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

        return [
            _trainer_case(d_in=5, d_hidden=7, d_out=1, batch=1, n_batches=1, steps=3, dtype=torch.float16,
                          opt=("sgd", 0.05), scaler={"init_scale": 2.0**16, "growth_interval": 1}, clip=5.0,
                          frozen=("w1", "b1"), label="a frozen first layer, fp16 + a growing scale, batch 1, d_out 1"),
            _trainer_case(d_in=5, d_hidden=7, d_out=3, n_batches=2, steps=3, accum=2, clip=0.05, opt=("sgd", 0.05),
                          label="clipping that cuts every step, accumulation that wraps around the data"),
            _trainer_case(d_in=5, d_hidden=7, d_out=3, steps=2, dtype=torch.float32, frozen=("b1",),
                          label="float32, b1 frozen"),
            _trainer_case(d_in=5, d_hidden=7, d_out=3, steps=2, n_batches=1, dtype=torch.float16, loss_weight=2.0**-20,
                          label="fp16 without a scaler, loss weight 2**-20: nothing moves"),
        ] + draw(case(), 6)

    def expected(self, case):
        return reference_run(*case.args, **case.kwargs)

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
        for n in _frozen(case):
            g = got["params"].get(n) if isinstance(got["params"], dict) else None
            if isinstance(g, TensorInfo) and not torch.equal(g.values, expected["init"][n]):
                return (f"params[{n!r}] is frozen (requires_grad=False): it must not move, but changed by up to "
                        f"{float((g.values.double() - expected['init'][n].double()).abs().max()):.3g}")
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
        if not isinstance(got, dict) or got.get("autocast") or not isinstance(got.get("out"), (tuple, list)) \
                or len(got["out"]) != 2:
            return None
        losses, skipped = list(got["out"][0]), list(got["out"][1])
        low = str(dtype).replace("torch.", "")
        if dtype != torch.float32 and got.get("matmul_dtypes") != [low]:
            return ("mlp_forward computes in the dtype of what you give it: pass {name: p.detach().to(dtype)} copies "
                    "of the master weights (requiring grad) and x.to(dtype).")
        if "float32" not in (got.get("loss_input_dtypes") or ["float32"]) and dtype != torch.float32:
            return "compute the loss in float32 (F.mse_loss(pred.float(), y)): autocast puts losses on its fp32 list."
        g_params = got.get("params") if isinstance(got.get("params"), dict) else {}
        moved = [n for n in _frozen(case) if isinstance(g_params.get(n), TensorInfo)
                 and not torch.equal(g_params[n].values, expected["init"][n])]
        if moved:
            return (f"{', '.join(moved)} got a gradient although frozen: give a frozen master a low-precision copy "
                    f"that does not require grad (requires_grad_(p.requires_grad)), so the optimizer skips it.")
        if skipped != expected["skipped"] and _same_float(got.get("final_scale"), expected["scales"][-1]):
            # the scaler itself did the same: only the report of skipped steps differs
            grew = [k for k in range(steps) if expected["scales"][k + 1] > expected["scales"][k]]
            if set(skipped) == set(expected["skipped"]) | set(grew) and grew:
                return ("report step k as skipped exactly when scaler.update() lowered the scale: a growth also "
                        "changes the scale, and must not count.")
            if not skipped:
                return ("a step whose gradients hold inf/NaN is skipped by scaler.step(optimizer): report it as "
                        "skipped when scaler.update() lowered the scale.")
            return None
        if losses and expected["losses"] and not math.isclose(losses[0], expected["losses"][0], rel_tol=1e-3):
            if accum > 1 and math.isclose(losses[0], expected["losses"][0] * accum, rel_tol=1e-3):
                return "report each step's loss as the MEAN of its micro-batch losses (before dividing by accum for backward)."
            if scaler and math.isclose(losses[0], expected["losses"][0] * expected["scales"][0], rel_tol=1e-3):
                return "report the unscaled loss: scaler.scale(loss) is only for backward."
            return None
        first_norms = got.get("step_grad_norms") or []  # the gradient the first optimizer.step() saw
        if accum > 1 and clip is None and first_norms and 0 not in expected["skipped"] and math.isclose(
                first_norms[0], accum * expected["grad_norms"][0], rel_tol=1e-2):
            return "divide each micro-batch loss by accum before backward, so the accumulated gradient is a mean."
        init, ref = expected["init"], expected["params"]
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
        return None


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
        return [Case((torch.float16, {"init_scale": 2.0**16}), label="fp16 + GradScaler vs fp32"),
                Case((torch.bfloat16, None), label="bf16 vs fp32")]

    boundary_classes = {
        "bf16, no scaler": lambda c, e: c.args == (torch.bfloat16, None),
        "fp16 with a GradScaler": lambda c, e: c.args[0] == torch.float16 and c.args[1] is not None,
    }

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
        if got["saved_ratio"] > expected["saved_ratio"] and got["saved_fp32_bytes_in_low"] >= 0.3 * got["saved_bytes_low"]:
            return (f"your step saves float32 tensors for backward ({got['saved_fp32_bytes_in_low']:,} bytes; only "
                    f"the loss's inputs need to be fp32): do not cast activations back up to fp32 between layers.")
        return None


EXERCISES = [Decode(), Decompose(), Fp32ToBf16Bits(), Fp32ToFp16Bits(), PredictDtypes(), UpdateScale(),
             GradScalerExercise(), AmpTrain(), AmpSpeed()]
CHAPTER = Chapter("amp", exercises=EXERCISES, sandbox_files=("amp/scaffold.py",))
