"""Floating-point formats bit by bit: fp32, tf32, bf16, fp16 and the two fp8 formats.

Every binary float is ``(-1)**sign * 1.mantissa * 2**(exponent - bias)`` for a normal number and
``(-1)**sign * 0.mantissa * 2**(1 - bias)`` for a subnormal one (exponent field 0). A format is fully
described by its exponent width, its mantissa width and what it does with the all-ones exponent:

| format      | bits | exp | mant | bias | eps      | smallest normal | max finite     | torch dtype     |
|-------------|------|-----|------|------|----------|-----------------|----------------|-----------------|
| fp32        | 32   | 8   | 23   | 127  | 2**-23   | 2**-126         | 3.40e38        | float32         |
| tf32        | 19   | 8   | 10   | 127  | 2**-10   | 2**-126         | 3.40e38        | (tensor cores)  |
| bf16        | 16   | 8   | 7    | 127  | 2**-7    | 2**-126         | 3.39e38        | bfloat16        |
| fp16        | 16   | 5   | 10   | 15   | 2**-10   | 2**-14          | 65504          | float16         |
| fp8 e4m3fn  | 8    | 4   | 3    | 7    | 2**-3    | 2**-6           | 448            | float8_e4m3fn   |
| fp8 e5m2    | 8    | 5   | 2    | 15   | 2**-2    | 2**-14          | 57344          | float8_e5m2     |

bf16 keeps fp32's 8 exponent bits (same range, 3 significant decimal digits); fp16 spends bits on the
mantissa and loses range: gradients below 2**-24 ~ 6e-8 flush to zero. That is why fp16 training
needs loss scaling (see ``grad_scaler``) and bf16 training does not.

``e4m3fn`` ("fn" = finite, no infinities) gives the all-ones exponent back to finite numbers: only
``S.1111.111`` is NaN, so its max is 1.75 * 2**8 = 448 instead of 240. tf32 is not a storage format:
tensor cores read fp32 operands and use only their top 10 mantissa bits (NVIDIA rounds with
``cvt.rna.tf32.f32``, ties *away* from zero; ``encode`` below uses IEEE ties-to-even for every
format). Its subnormal behaviour is not documented; the table treats it like an IEEE format.

Mirrors c10/util/Half.h, c10/util/BFloat16.h, c10/util/Float8_e4m3fn.h, c10/util/Float8_e5m2.h (the
formats) and torch.finfo (the constants, checked in tests/amp/test_formats.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

KINDS = ("zero", "subnormal", "normal", "inf", "nan")


@dataclass(frozen=True)
class FloatFormat:
    """One binary floating-point format: ``1 + exponent_bits + mantissa_bits`` bits wide."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    has_inf: bool = True  # IEEE: all-ones exponent = inf (mantissa 0) or NaN (mantissa != 0)
    torch_dtype: str | None = None  # attribute of torch holding the dtype, None if torch has none

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return (1 << (self.exponent_bits - 1)) - 1

    @property
    def max_exponent_field(self) -> int:
        """Largest exponent field a finite number may use (all-ones is reserved in IEEE formats)."""
        all_ones = (1 << self.exponent_bits) - 1
        return all_ones - 1 if self.has_inf else all_ones

    @property
    def eps(self) -> float:
        """Gap between 1.0 and the next representable number: 2**-mantissa_bits."""
        return 2.0**-self.mantissa_bits

    @property
    def smallest_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def max_finite_bits(self) -> int:
        """Bit pattern (sign 0) of the largest finite value."""
        mantissa = (1 << self.mantissa_bits) - 1
        if not self.has_inf:  # e4m3fn: S.1111.111 is NaN, so the top mantissa is all-ones minus one
            mantissa -= 1
        return (self.max_exponent_field << self.mantissa_bits) | mantissa

    @property
    def max_finite(self) -> float:
        return decode(self.max_finite_bits, self)

    @property
    def nan_bits(self) -> int:
        """The canonical quiet NaN (sign 0): all-ones exponent and the top mantissa bit set."""
        if not self.has_inf:
            return (1 << (self.bits - 1)) - 1  # e4m3fn: 0x7F
        return (((1 << self.exponent_bits) - 1) << self.mantissa_bits) | (1 << (self.mantissa_bits - 1))

    @property
    def inf_bits(self) -> int | None:
        if not self.has_inf:
            return None
        return ((1 << self.exponent_bits) - 1) << self.mantissa_bits


FP32 = FloatFormat("fp32", 8, 23, torch_dtype="float32")
TF32 = FloatFormat("tf32", 8, 10)
BF16 = FloatFormat("bf16", 8, 7, torch_dtype="bfloat16")
FP16 = FloatFormat("fp16", 5, 10, torch_dtype="float16")
FP8_E4M3FN = FloatFormat("fp8_e4m3fn", 4, 3, has_inf=False, torch_dtype="float8_e4m3fn")
FP8_E5M2 = FloatFormat("fp8_e5m2", 5, 2, torch_dtype="float8_e5m2")

FORMATS: dict[str, FloatFormat] = {f.name: f for f in (FP32, TF32, BF16, FP16, FP8_E4M3FN, FP8_E5M2)}
_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8_e4m3fn": "fp8_e4m3fn",
    "e4m3fn": "fp8_e4m3fn",
    "e4m3": "fp8_e4m3fn",
    "float8_e5m2": "fp8_e5m2",
    "e5m2": "fp8_e5m2",
    "tensorfloat32": "tf32",
}


def get_format(fmt: "str | FloatFormat") -> FloatFormat:
    """Look a format up by name ("fp16", "bfloat16", "e4m3fn", ...) or pass a FloatFormat through."""
    if isinstance(fmt, FloatFormat):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a format name or a FloatFormat, got {type(fmt).__name__}")
    key = fmt.strip().lower().replace("torch.", "")
    key = _ALIASES.get(key, key)
    if key not in FORMATS:
        raise ValueError(f"fmt must be one of {sorted(FORMATS)} (or a torch dtype name), got {fmt!r}")
    return FORMATS[key]


def _check_bits(bits: int, f: FloatFormat) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits must be an int bit pattern, got {type(bits).__name__}")
    if not 0 <= bits < (1 << f.bits):
        raise ValueError(f"bits must be in [0, 2**{f.bits}) for {f.name}, got {bits:#x}")
    return bits


class Decomposed(NamedTuple):
    """The three fields of a bit pattern (raw integers, exponent still biased) and its kind."""

    sign: int  # 0 or 1
    exponent: int  # the raw exponent field, 0 .. 2**exponent_bits - 1
    mantissa: int  # the raw mantissa field (fraction bits, no implicit leading 1)
    kind: str  # "zero" | "subnormal" | "normal" | "inf" | "nan"


def fields(bits: int, fmt: "str | FloatFormat") -> Decomposed:
    """Split a bit pattern of ``fmt`` into sign, exponent field, mantissa field and kind."""
    f = get_format(fmt)
    bits = _check_bits(bits, f)
    sign = bits >> (f.bits - 1)
    exponent = (bits >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1)
    mantissa = bits & ((1 << f.mantissa_bits) - 1)
    all_ones = (1 << f.exponent_bits) - 1
    if f.has_inf and exponent == all_ones:
        kind = "inf" if mantissa == 0 else "nan"
    elif not f.has_inf and exponent == all_ones and mantissa == (1 << f.mantissa_bits) - 1:
        kind = "nan"
    elif exponent == 0:
        kind = "zero" if mantissa == 0 else "subnormal"
    else:
        kind = "normal"
    return Decomposed(sign, exponent, mantissa, kind)


def decode(bits: int, fmt: "str | FloatFormat") -> float:
    """The value a bit pattern stands for, as a Python float (exact: every format here fits a double)."""
    f = get_format(fmt)
    sign, exponent, mantissa, kind = fields(bits, f)
    s = -1.0 if sign else 1.0
    if kind == "nan":
        return math.nan
    if kind == "inf":
        return s * math.inf
    if kind in ("zero", "subnormal"):  # 0.mantissa * 2**(1 - bias)
        return s * math.ldexp(mantissa, 1 - f.bias - f.mantissa_bits)
    # normal: 1.mantissa * 2**(exponent - bias)
    return s * math.ldexp((1 << f.mantissa_bits) | mantissa, exponent - f.bias - f.mantissa_bits)


def _round_shift_right_even(v: int, shift: int) -> int:
    """``v / 2**shift`` rounded to the nearest integer, ties to even (the IEEE default rounding)."""
    if shift <= 0:
        return v << -shift
    q, rem = v >> shift, v & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rem > half or (rem == half and q & 1):
        q += 1
    return q


def encode(value: float, fmt: "str | FloatFormat", *, saturate: bool | None = None) -> int:
    """Round ``value`` to the nearest ``fmt`` number (ties to even) and return its bit pattern.

    Overflow (a value that rounds past the largest finite number) becomes inf in IEEE formats. In
    e4m3fn, which has no inf, it saturates to +-448 when ``saturate`` (the default: torch 2.13's
    c10 conversion does this, also for +-inf) or becomes NaN otherwise (the OCP spec's non-saturating
    mode). NaN encodes as the canonical quiet NaN with the input's sign.
    """
    f = get_format(fmt)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"value must be a Python float or int, got {type(value).__name__}")
    if saturate is None:
        saturate = not f.has_inf
    value = float(value)
    sign_bit = 1 << (f.bits - 1)
    sign = sign_bit if math.copysign(1.0, value) < 0 else 0
    if math.isnan(value):
        return sign | f.nan_bits
    if saturate:
        overflow = sign | f.max_finite_bits
    elif f.has_inf:
        overflow = sign | f.inf_bits
    else:
        overflow = sign | f.nan_bits
    if math.isinf(value):
        return overflow
    a = abs(value)
    if a == 0.0:
        return sign
    # a = M * 2**E exactly, with M a 53-bit integer (a double's significand)
    m, e = math.frexp(a)  # a = m * 2**e, 0.5 <= m < 1
    M, E = int(m * (1 << 53)), e - 53
    unbiased = e - 1  # a lies in [2**unbiased, 2**(unbiased + 1))
    emin = 1 - f.bias
    # the spacing ("quantum") of fmt's numbers around a: 2**(exp - mantissa_bits), fixed below 2**emin
    q_exp = max(unbiased, emin) - f.mantissa_bits
    q = _round_shift_right_even(M, q_exp - E)  # a / quantum, rounded to an integer
    if q == 0:
        return sign  # underflow to a signed zero
    if q < (1 << f.mantissa_bits):  # still subnormal after rounding: exponent field 0
        magnitude = q
    else:
        # q in [2**m, 2**(m+1)]; a carry out of the mantissa lands in the exponent field by itself
        biased = max(unbiased, emin) + f.bias
        magnitude = (biased << f.mantissa_bits) + (q - (1 << f.mantissa_bits))
    if magnitude > f.max_finite_bits:
        return overflow
    return sign | magnitude


def decompose(value: float, fmt: "str | FloatFormat") -> Decomposed:
    """Round ``value`` into ``fmt`` (ties to even) and return (sign, exponent bits, mantissa bits, kind).

    >>> decompose(1.0, "fp16")
    Decomposed(sign=0, exponent=15, mantissa=0, kind='normal')
    >>> decompose(-2.0 ** -24, "fp16")   # the smallest fp16 subnormal
    Decomposed(sign=1, exponent=0, mantissa=1, kind='subnormal')
    """
    f = get_format(fmt)
    return fields(encode(value, f), f)


def decompose_fields(value: float, fmt: "str | FloatFormat") -> tuple[int, int, int]:
    """``(sign, exponent field, mantissa field)`` of ``value`` rounded to nearest-even in ``fmt``: the
    answer of the chapter's exercise amp.decompose (``decompose`` without the kind)."""
    sign, exponent, mantissa, _ = decompose(value, fmt)
    return sign, exponent, mantissa


def round_to_format(value: float, fmt: "str | FloatFormat") -> float:
    """``value`` rounded to the nearest number of ``fmt``, as a Python float."""
    f = get_format(fmt)
    return decode(encode(value, f), f)


def describe(fmt: "str | FloatFormat") -> dict:
    """The table row of a format, as plain data (what the chapter's first exercise asks for)."""
    f = get_format(fmt)
    return {
        "name": f.name,
        "bits": f.bits,
        "exponent_bits": f.exponent_bits,
        "mantissa_bits": f.mantissa_bits,
        "bias": f.bias,
        "eps": f.eps,
        "smallest_normal": f.smallest_normal,
        "smallest_subnormal": f.smallest_subnormal,
        "max_finite": f.max_finite,
        "has_inf": f.has_inf,
    }


def bit_string(bits: int, fmt: "str | FloatFormat") -> str:
    """``"0 01111 0000000000"``: sign, exponent and mantissa fields separated by spaces."""
    f = get_format(fmt)
    bits = _check_bits(bits, f)
    s = format(bits, f"0{f.bits}b")
    return f"{s[0]} {s[1 : 1 + f.exponent_bits]} {s[1 + f.exponent_bits :]}"
