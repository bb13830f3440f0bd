"""fp32 -> bf16 / fp16 by integer ops: bit for bit against tensor.to(dtype), NaNs compared by NaN-ness."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.amp.rounding import (
    bf16_bits_to_fp32,
    fp16_bits_to_fp32,
    fp32_to_bf16_bits,
    fp32_to_fp16_bits,
    round_fp32,
)

CASES = [(torch.bfloat16, fp32_to_bf16_bits), (torch.float16, fp32_to_fp16_bits)]


def _x_from_bits(bits) -> torch.Tensor:
    return torch.as_tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)


def assert_same_as_torch(x: torch.Tensor, dtype, fn):
    got = fn(x)
    assert got.dtype == torch.int16 and got.shape == x.shape, (
        f"want int16 {tuple(x.shape)}, got {got.dtype} {tuple(got.shape)}"
    )
    ref = x.to(dtype).view(torch.int16)
    nan = torch.isnan(x)
    bad = (got != ref) & ~nan
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        xb = x.reshape(-1)[bad.reshape(-1).nonzero()[0]].view(torch.int32).item() & 0xFFFFFFFF
        raise AssertionError(
            f"{dtype}: first mismatch at index {i}: fp32 bits {xb:#010x} ({x[i].item()!r}): "
            f"torch {ref[i].item() & 0xFFFF:#06x}, got {got[i].item() & 0xFFFF:#06x}. "
            "Check the tie (exactly half) case and the carry into the exponent."
        )
    # NaNs: torch's payload depends on the code path (see rounding.py); NaN-ness must agree
    assert torch.isnan(got.view(dtype)[nan]).all(), f"{dtype}: a NaN input did not give a NaN"


@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=0, max_size=200))
def test_random_bit_patterns(bits):
    x = _x_from_bits(bits)
    for dtype, fn in CASES:
        assert_same_as_torch(x, dtype, fn)


# bit patterns aimed at the interesting places: exponents around fp16's range, ties, NaN/inf
interesting = st.builds(
    lambda s, e, m, tie: (s << 31) | (e << 23) | (m if tie is None else (m & ~0x1FFF & ~0xFFFF) | tie),
    st.integers(0, 1),
    st.one_of(st.integers(95, 145), st.sampled_from([0, 1, 126, 127, 254, 255])),
    st.integers(0, (1 << 23) - 1),
    st.sampled_from([None, 0x1000, 0x8000, 0x9000, 0x0FFF, 0x7FFF]),
)


@given(st.lists(interesting, min_size=1, max_size=200))
def test_interesting_bit_patterns(bits):
    x = _x_from_bits(bits)
    for dtype, fn in CASES:
        assert_same_as_torch(x, dtype, fn)


def test_two_million_random_patterns():
    g = torch.Generator().manual_seed(0)
    x = (
        torch.randint(-(2**31), 2**31, (1 << 21,), generator=g, dtype=torch.int64)
        .to(torch.int32)
        .view(torch.float32)
    )
    for dtype, fn in CASES:
        assert_same_as_torch(x, dtype, fn)


def test_every_halfway_case():
    # fp16: for every exponent that lands in fp16's normal/subnormal range or just outside, every
    # 10-bit mantissa, the dropped 13 bits exactly 0x1000 (a tie) and tie +- 1
    e = torch.arange(96, 146).repeat_interleave(1024)
    m = torch.arange(1024).repeat(50) << 13
    for low in (0x1000, 0x0FFF, 0x1001):
        assert_same_as_torch(_x_from_bits((e << 23) | m | low), torch.float16, fp32_to_fp16_bits)
    # subnormal fp16 ties: x = (k + 1/2) * 2**-24 for every k
    k = torch.arange(0, 2048, dtype=torch.float64)
    for sign in (1.0, -1.0):
        assert_same_as_torch((sign * (k + 0.5) * 2.0**-24).float(), torch.float16, fp32_to_fp16_bits)
    # bf16: every exponent (incl. subnormal 0), every 7-bit mantissa, the dropped 16 bits = 0x8000
    e = torch.arange(0, 255).repeat_interleave(128)
    m = torch.arange(128).repeat(255) << 16
    for low in (0x8000, 0x7FFF, 0x8001):
        assert_same_as_torch(_x_from_bits((e << 23) | m | low), torch.bfloat16, fp32_to_bf16_bits)


def test_edge_values():
    vals = [
        0.0,
        -0.0,
        float("inf"),
        float("-inf"),
        float("nan"),
        65504.0,
        65519.996,
        65520.0,
        -65520.0,
        2.0**-14,
        2.0**-24,
        2.0**-25,
        2.0**-25 * 1.0000001,
        1.5 * 2.0**-24,
        2.0**-149,
        3.4028235e38,
        -3.4028235e38,
        1.0,
        1 + 2.0**-8,
        1 + 3 * 2.0**-8,
        1 + 2.0**-11,
        1 + 3 * 2.0**-11,
    ]
    x = torch.tensor(vals, dtype=torch.float32)
    for dtype, fn in CASES:
        assert_same_as_torch(x, dtype, fn)
    fp16 = fp32_to_fp16_bits(x).view(torch.float16)
    assert fp16[1].item() == 0 and torch.signbit(fp16[1])  # -0 stays -0
    assert torch.isinf(fp16[7]) and fp16[8].item() == float("-inf")  # 65520 overflows
    assert fp32_to_bf16_bits(torch.tensor([3.4028235e38])).view(torch.bfloat16).isinf().all()


def test_our_nan_convention_is_quiet_with_sign_and_payload():
    x = _x_from_bits([0x7F800001, 0xFF800001, 0x7FC00000, 0x7F802000, 0x7FFFFFFF])
    h = fp32_to_fp16_bits(x).to(torch.int64) & 0xFFFF
    b = fp32_to_bf16_bits(x).to(torch.int64) & 0xFFFF
    assert h.tolist() == [0x7E00, 0xFE00, 0x7E00, 0x7E01, 0x7FFF]  # = x86 F16C (and torch on this CPU)
    assert b.tolist() == [0x7FC0, 0xFFC0, 0x7FC0, 0x7FC0, 0x7FFF]


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.empty(0),
        lambda: torch.tensor(1.5),
        lambda: torch.randn(1),
        lambda: torch.randn(7, 13).t(),  # non-contiguous
        lambda: torch.randn(5, 6, 7)[:, ::2, 1:],  # strided slice
        lambda: torch.randn(3, 1, 1823) * 1e-6,
    ],
)
def test_awkward_shapes(make):
    x = make()
    for dtype, fn in CASES:
        assert_same_as_torch(x, dtype, fn)
        assert torch.equal(round_fp32(x, dtype), x.to(dtype))


def test_decoders_are_exact_for_every_pattern():
    allbits = torch.arange(1 << 16, dtype=torch.int64).to(torch.int16)
    for dtype, decode in ((torch.bfloat16, bf16_bits_to_fp32), (torch.float16, fp16_bits_to_fp32)):
        ref = allbits.view(dtype).float()
        got = decode(allbits)
        nan = torch.isnan(ref)
        assert torch.equal(got.view(torch.int32)[~nan], ref.view(torch.int32)[~nan]), (
            f"{dtype} decode mismatch"
        )
        assert torch.isnan(got[nan]).all()
    # int32/int64 containers holding 0..0xFFFF work too
    assert torch.equal(
        fp16_bits_to_fp32(torch.tensor([0x3C00, 0xBC00], dtype=torch.int32)), torch.tensor([1.0, -1.0])
    )


def test_round_trip_fp32_to_16_to_fp32_is_idempotent():
    x = torch.randn(1000) * 100
    for dtype, fn in CASES:
        back = (bf16_bits_to_fp32 if dtype == torch.bfloat16 else fp16_bits_to_fp32)(fn(x))
        assert torch.equal(fn(back), fn(x))


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (
            lambda: fp32_to_bf16_bits(torch.randn(3, dtype=torch.float64)),
            TypeError,
            "x must be a float32 tensor",
        ),
        (lambda: fp32_to_fp16_bits([1.0, 2.0]), TypeError, "x must be a torch.Tensor"),
        (lambda: fp16_bits_to_fp32(torch.randn(3)), TypeError, "bits must hold 16-bit patterns"),
        (lambda: bf16_bits_to_fp32(3), TypeError, "bits must be a torch.Tensor"),
        (lambda: round_fp32(torch.randn(3), torch.float64), ValueError, "dtype must be"),
    ],
)
def test_invalid_inputs_raise_clear_errors(call, exc, words):
    with pytest.raises(exc, match=words):
        call()
