"""Float formats: constants vs torch.finfo, decode over every bit pattern, encode vs torch's casts."""

import math
import struct

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.amp.formats import (
    FORMATS,
    bit_string,
    decode,
    decompose,
    describe,
    encode,
    fields,
    get_format,
)

TORCH_FORMATS = [f for f in FORMATS.values() if f.torch_dtype is not None]
_INT_VIEW = {8: torch.uint8, 16: torch.int16, 32: torch.int32}


def _torch_value_of_bits(bits: int, f) -> float:
    """What torch says a bit pattern of format f is worth."""
    signed = bits - (1 << f.bits) if f.bits > 8 and bits >= (1 << (f.bits - 1)) else bits
    t = torch.tensor([signed], dtype=torch.int64).to(_INT_VIEW[f.bits])
    return t.view(getattr(torch, f.torch_dtype)).float().item()


def _torch_bits_of(x32: torch.Tensor, f) -> list[int]:
    """x32 (float32) cast by torch to format f, as unsigned bit patterns."""
    out = x32.to(getattr(torch, f.torch_dtype)).view(_INT_VIEW[f.bits]).to(torch.int64)
    return (out & ((1 << f.bits) - 1)).tolist()


@pytest.mark.parametrize("f", TORCH_FORMATS, ids=lambda f: f.name)
def test_constants_match_torch_finfo(f):
    fi = torch.finfo(getattr(torch, f.torch_dtype))
    assert f.eps == fi.eps, f"{f.name}: eps {f.eps} != torch.finfo eps {fi.eps}"
    assert f.smallest_normal == fi.smallest_normal == fi.tiny
    assert f.max_finite == fi.max
    assert -f.max_finite == fi.min
    assert f.bits == fi.bits
    # smallest subnormal = the bit pattern 0...01, as torch reads it
    assert f.smallest_subnormal == _torch_value_of_bits(1, f)


def test_tf32_and_table_rows():
    tf32 = get_format("tf32")
    assert (tf32.bits, tf32.bias, tf32.eps) == (19, 127, 2.0**-10)
    assert tf32.smallest_normal == torch.finfo(torch.float32).smallest_normal  # same range as fp32
    assert describe("fp16")["max_finite"] == 65504.0
    assert describe("e4m3fn")["max_finite"] == 448.0 and describe("e5m2")["max_finite"] == 57344.0
    assert describe("bfloat16")["mantissa_bits"] == 7


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e4m3fn", "fp8_e5m2"])
def test_decode_every_bit_pattern_matches_torch(name):
    f = FORMATS[name]
    n = 1 << f.bits
    raw = torch.arange(n, dtype=torch.int64)
    if f.bits == 16:
        raw = raw.to(torch.int16)  # wraps: a bit cast
    else:
        raw = raw.to(torch.uint8)
    ref = raw.view(getattr(torch, f.torch_dtype)).double().tolist()
    for bits in range(n):
        got = decode(bits, f)
        if math.isnan(ref[bits]):
            assert math.isnan(got) and fields(bits, f).kind == "nan", f"{name} {bits:#x}: expected NaN"
        else:
            assert got == ref[bits] and math.copysign(1, got) == math.copysign(1, ref[bits]), (
                f"{name} bits {bits:#x}: decode gave {got}, torch says {ref[bits]}"
            )
            kind = fields(bits, f).kind
            assert kind == (
                "inf"
                if math.isinf(got)
                else "zero"
                if got == 0
                else "subnormal"
                if abs(got) < f.smallest_normal
                else "normal"
            )


fp32_values = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)


@given(st.lists(fp32_values, min_size=1, max_size=64))
def test_encode_matches_torch_casts(values):
    x = torch.tensor(values, dtype=torch.float32)
    for f in (FORMATS["fp16"], FORMATS["bf16"], FORMATS["fp8_e5m2"], FORMATS["fp8_e4m3fn"]):
        ref = _torch_bits_of(x, f)
        for v, r in zip(x.tolist(), ref, strict=True):
            got = encode(v, f)
            if f.name == "fp8_e4m3fn" and abs(v) >= 464:
                continue  # overflow: torch 2.13 saturates to 448 (so does encode), older torch gave NaN
            if math.isnan(v):
                assert fields(got, f).kind == "nan" and fields(r, f).kind == "nan"
            else:
                assert got == r, f"{f.name}: encode({v!r}) = {got:#x}, torch gives {r:#x}"


@given(st.floats(allow_nan=False, allow_infinity=True, allow_subnormal=True))
def test_encode_fp32_from_double_matches_torch(v):
    ref = torch.tensor([v], dtype=torch.float64).to(torch.float32).view(torch.int32).item() & 0xFFFFFFFF
    assert encode(v, "fp32") == ref, f"encode({v!r}, fp32) = {encode(v, 'fp32'):#x}, torch {ref:#x}"


def test_decompose_examples_and_ties_to_even():
    assert decompose(1.0, "fp16") == (0, 15, 0, "normal")
    assert decompose(-2.0, "bf16") == (1, 128, 0, "normal")
    assert decompose(65504.0, "fp16") == (0, 30, 1023, "normal")
    assert decompose(65519.99, "fp16") == (0, 30, 1023, "normal")  # below the halfway point to 2**16
    assert decompose(65520.0, "fp16").kind == "inf"  # halfway, ties to even -> overflow
    assert decompose(2.0**-24, "fp16") == (0, 0, 1, "subnormal")
    assert decompose(2.0**-25, "fp16") == (0, 0, 0, "zero")  # tie between 0 and 2**-24: even is 0
    assert decompose(3 * 2.0**-25, "fp16") == (0, 0, 2, "subnormal")  # tie between 1 and 2 units: even is 2
    assert decompose(-0.0, "fp16") == (1, 0, 0, "zero")
    assert decompose(1 + 2.0**-8, "bf16") == (0, 127, 0, "normal")  # tie, 1.0 has even mantissa
    assert decompose(1 + 3 * 2.0**-8, "bf16") == (0, 127, 2, "normal")  # tie, rounds up to even
    assert decompose(float("nan"), "fp16").kind == "nan"
    assert decompose(float("inf"), "bf16") == (0, 255, 0, "inf")
    assert bit_string(encode(-1.5, "fp16"), "fp16") == "1 01111 1000000000"


def test_e4m3fn_has_no_inf_and_saturates():
    assert fields(0x7F, "fp8_e4m3fn").kind == "nan" and fields(0xFF, "fp8_e4m3fn").kind == "nan"
    assert fields(0x7E, "fp8_e4m3fn") == (0, 15, 6, "normal") and decode(0x7E, "fp8_e4m3fn") == 448.0
    assert fields(0x78, "fp8_e4m3fn").kind == "normal"  # all-ones exponent is a finite number here
    assert encode(1e6, "fp8_e4m3fn") == 0x7E and encode(-math.inf, "fp8_e4m3fn") == 0xFE  # like torch 2.13
    assert encode(1e6, "fp8_e4m3fn", saturate=False) == 0x7F  # OCP non-saturating mode: NaN
    assert encode(1e6, "fp8_e5m2") == 0x7C and encode(1e6, "fp8_e5m2", saturate=True) == 0x7B


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: get_format("fp12"), ValueError, "fmt must be one of"),
        (lambda: get_format(16), TypeError, "fmt must be"),
        (lambda: encode("1.0", "fp16"), TypeError, "value must be"),
        (lambda: encode(True, "fp16"), TypeError, "value must be"),
        (lambda: decode(-1, "fp16"), ValueError, "bits must be in"),
        (lambda: decode(1 << 16, "fp16"), ValueError, "bits must be in"),
        (lambda: decode(1.0, "fp16"), TypeError, "bits must be an int"),
        (lambda: decompose(1.0, "fp4"), ValueError, "fmt must be one of"),
    ],
)
def test_invalid_inputs_raise_clear_errors(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_struct_agrees_for_fp32_decode():
    for v in (1.0, -0.1, 3.4e38, 1e-45, 0.0):
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        assert decode(bits, "fp32") == struct.unpack("<f", struct.pack("<f", v))[0]
