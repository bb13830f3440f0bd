"""fp32 -> bf16 and fp32 -> fp16 rounding with integer operations only, bit for bit like ``tensor.to``.

A float32 tensor is reinterpreted as its 32-bit patterns with ``x.view(torch.int32)`` (no copy, same
4 bytes per element) and widened to int64 so that shifts and adds never overflow or sign-extend. The
results are int16 tensors holding the 16-bit patterns, so ``out.view(torch.bfloat16)`` is the
rounded tensor and ``out`` can be compared with ``x.to(dtype).view(torch.int16)``.

fp32:  S EEEEEEEE MMMMMMMMMMMMMMMMMMMMMMM   (1 + 8 + 23)
bf16:  S EEEEEEEE MMMMMMM                   (1 + 8 + 7):  drop the low 16 bits, rounding
fp16:  S EEEEE MMMMMMMMMM                   (1 + 5 + 10): re-bias the exponent (127 -> 15), round
                                                          the mantissa to 10 bits, handle range

Rounding is to nearest, ties to even: a dropped part above half the last kept bit rounds up, below
rounds down, exactly half rounds to whichever neighbour has an even (0) last bit. A carry out of the
mantissa ripples into the exponent field by itself, which is why these conversions are done on
the integer bit pattern: ``0x3FFFFFFF`` (1.9999999) rounds up into ``0x4000`` (2.0) in bf16, and
the largest fp32 values round into the exponent field all-ones, that is +-inf.

NaN: the result is a quiet NaN carrying the input's sign and the top bits of its payload (what
x86's F16C ``vcvtps2ph`` and ARM's ``fcvt`` do). torch agrees with this bit for bit for fp16 on the
CPU. For bf16 torch's NaN bits depend on the code path: the scalar c10 path returns 0x7FC0, the
AVX2 vectorised CPU path 0xFFFF, CUDA 0x7FFF. All are NaNs, so the tests compare NaN-ness there.

Mirrors c10/util/BFloat16.h ``round_to_nearest_even`` (the ``+ 0x7FFF + lsb`` trick) and
c10/util/Half.h ``fp16_ieee_from_fp32_value`` / ``fp16_ieee_to_fp32_value`` (which use float
arithmetic tricks instead; this module keeps to integers so every step is visible).
"""

from __future__ import annotations

import torch

_SIGN32 = 0x8000_0000
_EXP32_ALL_ONES = 0x7F80_0000  # exponent field all ones: inf (mantissa 0) or NaN
_MANT32 = 0x007F_FFFF


def _check_fp32(x: torch.Tensor, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"{name} must be a float32 tensor, got dtype {x.dtype}")
    return x


def _check_bits16(bits: torch.Tensor, name: str = "bits") -> torch.Tensor:
    if not isinstance(bits, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(bits).__name__}")
    if bits.dtype not in (torch.int16, torch.int32, torch.int64, torch.uint16):
        raise TypeError(f"{name} must hold 16-bit patterns in an int16/int32/int64 tensor, got {bits.dtype}")
    return bits


def fp32_bits(x: torch.Tensor) -> torch.Tensor:
    """The 32-bit patterns of a float32 tensor as non-negative int64 values (0 .. 2**32 - 1)."""
    x = _check_fp32(x)
    # .view(int32) needs the last dim contiguous-compatible; .contiguous() makes any layout work
    return x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFF_FFFF


def _from_bits32(u: torch.Tensor) -> torch.Tensor:
    """int64 tensor of 32-bit patterns -> float32 tensor (wraps to int32 first: a bit cast)."""
    return u.to(torch.int32).view(torch.float32)


def round_shift_right_even(v: torch.Tensor, shift: torch.Tensor | int) -> torch.Tensor:
    """``v / 2**shift`` rounded to nearest, ties to even, for non-negative int64 ``v`` and shift >= 1."""
    shift = torch.as_tensor(shift, dtype=torch.int64, device=v.device)
    one = torch.ones((), dtype=torch.int64, device=v.device)
    q = v >> shift  # the kept bits
    rem = v & ((one << shift) - 1)  # the dropped bits
    half = one << (shift - 1)  # half of the last kept bit
    round_up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    return q + round_up.to(torch.int64)


def fp32_to_bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """Round float32 ``x`` to bfloat16, returning the bf16 bit patterns as an int16 tensor.

    ``fp32_to_bf16_bits(x).view(torch.bfloat16)`` equals ``x.to(torch.bfloat16)`` bit for bit
    (NaNs: see the module docstring). Same shape as ``x``; works for any layout and size 0.
    """
    u = fp32_bits(x)  # int64, (...,), 0 .. 2**32-1
    sign = (u & _SIGN32) >> 16  # 0x8000 or 0
    magnitude = u & 0x7FFF_FFFF
    # Round the low 16 bits away. bf16 keeps fp32's exponent, so the same rounding covers normals,
    # subnormals (exponent field 0 stays 0 or carries into 1) and overflow (0x7F7FFFFF.. -> 0x7F80 = inf).
    rounded = round_shift_right_even(magnitude, 16)
    is_nan = magnitude > _EXP32_ALL_ONES
    quiet_nan = 0x7FC0 | ((magnitude & _MANT32) >> 16)  # set the quiet bit, keep the top payload bits
    out = sign | torch.where(is_nan, quiet_nan, rounded)
    return out.to(torch.int16)  # 0 .. 0xFFFF wraps into int16's two's complement: a bit cast


def bf16_bits_to_fp32(bits: torch.Tensor) -> torch.Tensor:
    """bf16 bit patterns (int16/int32/int64) -> float32: the bf16 bits are the top half of fp32's."""
    bits = _check_bits16(bits)
    u = (bits.to(torch.int64) & 0xFFFF) << 16
    return _from_bits32(u)


def fp32_to_fp16_bits(x: torch.Tensor) -> torch.Tensor:
    """Round float32 ``x`` to float16, returning the fp16 bit patterns as an int16 tensor.

    ``fp32_to_fp16_bits(x).view(torch.float16)`` equals ``x.to(torch.float16)`` bit for bit: normals,
    gradual underflow into fp16 subnormals (2**-24 .. 2**-14), ties to even, overflow to +-inf at
    65520 (the halfway point above 65504), signed zeros, quiet NaNs.
    """
    u = fp32_bits(x)
    sign = (u & _SIGN32) >> 16
    magnitude = u & 0x7FFF_FFFF
    exp32 = magnitude >> 23  # biased by 127; 0 = fp32 zero/subnormal, 255 = inf/NaN
    mant32 = magnitude & _MANT32

    # Normal fp16 range (exponent 2**-14 .. 2**15): drop 13 mantissa bits with rounding, then
    # re-bias the exponent: 127 - 15 = 112, shifted into place (112 << 10). A rounding carry lands
    # in the exponent; anything at or past 0x7C00 is inf.
    normal = round_shift_right_even(magnitude, 13) - (112 << 10)
    normal = torch.clamp(normal, max=0x7C00)

    # Subnormal fp16 (|x| < 2**-14): the result counts units of 2**-24.
    # |x| = (2**23 + mant32) * 2**(exp32 - 150), so |x| / 2**-24 = full * 2**(exp32 - 126).
    full = mant32 | (1 << 23)  # restore the implicit leading 1 (exp32 >= 1 here)
    shift = torch.clamp(126 - exp32, min=1, max=31)  # >= 14 here; 24 gives 0 or 1 unit, >= 25 gives 0
    subnormal = round_shift_right_even(full, shift)

    is_nan = magnitude > _EXP32_ALL_ONES
    is_inf = magnitude == _EXP32_ALL_ONES
    quiet_nan = 0x7E00 | (mant32 >> 13)
    out = torch.where(exp32 >= 113, normal, torch.where(exp32 >= 1, subnormal, torch.zeros_like(u)))
    out = torch.where(is_inf, torch.full_like(u, 0x7C00), out)
    out = torch.where(is_nan, quiet_nan, out)
    return (sign | out).to(torch.int16)


def fp16_bits_to_fp32(bits: torch.Tensor) -> torch.Tensor:
    """fp16 bit patterns (int16/int32/int64) -> float32, exactly (every fp16 value is an fp32 value)."""
    bits = _check_bits16(bits)
    h = bits.to(torch.int64) & 0xFFFF
    sign = (h & 0x8000) << 16
    exp16 = (h >> 10) & 0x1F
    mant16 = h & 0x3FF

    normal = ((exp16 + 112) << 23) | (mant16 << 13)  # re-bias 15 -> 127
    inf_nan = _EXP32_ALL_ONES | (mant16 << 13) | ((mant16 != 0).to(torch.int64) << 22)  # NaN made quiet

    # Subnormal: value = mant16 * 2**-24. Normalise: shift the mantissa left until its leading 1
    # reaches bit 10 (the implicit bit); each shift lowers the exponent by one. At most 10 shifts.
    m, e = mant16.clone(), torch.full_like(h, 113)  # 113 = exponent of 2**-14, the fp16 subnormal scale
    for _ in range(10):
        needs_shift = (m & 0x400) == 0
        m = torch.where(needs_shift, m << 1, m)
        e = torch.where(needs_shift, e - 1, e)
    subnormal = (e << 23) | ((m & 0x3FF) << 13)

    out = torch.where(exp16 == 0x1F, inf_nan, torch.where(exp16 != 0, normal, subnormal))
    out = torch.where((exp16 == 0) & (mant16 == 0), torch.zeros_like(h), out)  # +-0
    return _from_bits32(sign | out)


def round_fp32(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` (float32) rounded to ``dtype`` (bfloat16 or float16) by the integer paths above."""
    if dtype == torch.bfloat16:
        return fp32_to_bf16_bits(x).view(torch.bfloat16)
    if dtype == torch.float16:
        return fp32_to_fp16_bits(x).view(torch.float16)
    raise ValueError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
