"""flops.py against torch.utils.flop_counter.FlopCounterMode, incl. the CPU attention gap."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ptinternals.dispatch.flops import (
    FlopCounter,
    bmm_flops,
    conv_flops,
    count_flops,
    mm_flops,
    sdpa_backward_flops,
    sdpa_flops,
)

aten = torch.ops.aten
# FlopCounterMode has no formula for the CPU fused attention kernels; teach it ours to compare.
CPU_SDPA = {
    aten._scaled_dot_product_flash_attention_for_cpu:
        lambda q, k, v, *a, out_shape=None, **kw: sdpa_flop_count(q, k, v),
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda g, q, k, v, *a, out_shape=None, **kw: sdpa_backward_flop_count(g, q, k, v),
}
dims = st.sampled_from([1, 2, 3, 5, 8, 17])


def torch_flops(fn, custom=None) -> int:
    with FlopCounterMode(display=False, custom_mapping=custom or {}) as m:
        fn()
    return m.get_total_flops()


def our_flops(fn) -> int:
    return count_flops(fn)[1]


@given(b=dims, m=dims, k=dims, n=dims,
       kind=st.sampled_from(["mm", "addmm", "bmm", "baddbmm", "matmul", "linear"]),
       backward=st.booleans(), transposed=st.booleans())
def test_matmul_family_matches_flop_counter_mode(b, m, k, n, kind, backward, transposed):
    x = torch.randn(b, m, k, requires_grad=True)
    w = (torch.randn(n, k).t() if transposed else torch.randn(k, n)).requires_grad_()  # non-contiguous too

    def fn():
        if kind == "mm":
            out = x[0] @ w
        elif kind == "addmm":
            out = torch.addmm(torch.randn(n), x[0], w)
        elif kind == "bmm":
            out = torch.bmm(x, w.expand(b, k, n))
        elif kind == "baddbmm":
            out = torch.baddbmm(torch.randn(b, m, n), x, w.expand(b, k, n))
        elif kind == "matmul":
            out = torch.matmul(x, w)
        else:
            out = F.linear(x, w.t(), torch.randn(n))
        if backward:
            out.sum().backward()

    assert our_flops(fn) == torch_flops(fn)


@given(batch=st.sampled_from([1, 2]), c_in=st.sampled_from([2, 4]), c_out=st.sampled_from([2, 6]),
       size=st.sampled_from([5, 8, 9]), kernel=st.sampled_from([1, 3]), stride=st.sampled_from([1, 2]),
       groups=st.sampled_from([1, 2]), transposed=st.booleans(), backward=st.booleans())
def test_convolution_forward_and_backward(batch, c_in, c_out, size, kernel, stride, groups, transposed,
                                          backward):
    cls = nn.ConvTranspose2d if transposed else nn.Conv2d
    conv = cls(c_in, c_out, kernel, stride=stride, padding=kernel // 2, groups=groups)
    x = torch.randn(batch, c_in, size, size, requires_grad=True)

    def fn():
        out = conv(x)
        if backward:
            out.sum().backward()

    assert our_flops(fn) == torch_flops(fn)


@given(b=st.sampled_from([1, 2]), h=st.sampled_from([1, 4]), s_q=st.sampled_from([1, 5, 16]),
       s_k=st.sampled_from([1, 7, 16]), d=st.sampled_from([8, 12]), causal=st.booleans(),
       backward=st.booleans())
def test_cpu_attention_is_counted(b, h, s_q, s_k, d, causal, backward):
    if causal:
        s_k = s_q
    q = torch.randn(b, h, s_q, d, requires_grad=True)
    k = torch.randn(b, h, s_k, d, requires_grad=True)
    v = torch.randn(b, h, s_k, d, requires_grad=True)

    def fn():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if backward:
            out.sum().backward()

    with FlopCounter() as fc:
        fn()
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in fc.by_op
    assert fc.total == torch_flops(fn, CPU_SDPA)
    expected = 4 * b * h * s_q * s_k * d * (1 + (2.5 if backward else 0))  # fwd: 2 bmms; bwd: 5 more
    assert fc.total == expected


def test_flop_counter_mode_gap_on_cpu_attention():
    """The documented gap: FlopCounterMode counts CPU SDPA as 0 FLOPs; our counter does not."""
    q = torch.randn(2, 4, 16, 8)
    fn = lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True)  # noqa: E731
    assert torch_flops(fn) == 0
    assert our_flops(fn) == sdpa_flops((2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 16, 8)) == 4 * 2 * 4 * 16 * 16 * 8


def test_attention_model_matches_with_cpu_formulas():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True, dropout=0.0)
    x = torch.randn(2, 5, 16, requires_grad=True)
    fn = lambda: layer(x).sum().backward()  # noqa: E731
    ours = our_flops(fn)
    assert ours == torch_flops(fn, CPU_SDPA) > torch_flops(fn)


def test_inference_mode_decomposes_composite_ops():
    x, w = torch.randn(3, 5, 7), torch.randn(7, 11)
    with torch.inference_mode():
        fn = lambda: x @ w  # noqa: E731  # matmul reaches the mode undecomposed under inference_mode
        assert our_flops(fn) == torch_flops(fn) == 2 * 3 * 5 * 7 * 11


def test_formulas_and_errors():
    from torch.utils import flop_counter as fcm

    assert mm_flops((3, 4), (4, 5)) == fcm.mm_flop((3, 4), (4, 5))
    assert bmm_flops((2, 3, 4), (2, 4, 5)) == fcm.bmm_flop((2, 3, 4), (2, 4, 5))
    assert conv_flops((2, 3, 8, 8), (4, 3, 3, 3), (2, 4, 6, 6)) == fcm.conv_flop_count(
        [2, 3, 8, 8], [4, 3, 3, 3], [2, 4, 6, 6])
    assert sdpa_backward_flops((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)) == \
        sdpa_backward_flop_count((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4))
    with pytest.raises(ValueError, match="inner dimensions"):
        mm_flops((3, 4), (5, 6))
    with pytest.raises(ValueError, match="bmm"):
        bmm_flops((2, 3, 4), (3, 4, 5))
    with pytest.raises(ValueError, match="sdpa"):
        sdpa_flops((1, 3, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8))
    with pytest.raises(TypeError, match="callable"):
        count_flops("not a function")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cuda_attention_matches_flop_counter_mode(dtype):
    """On CUDA, SDPA picks flash (fp16) or efficient/math (fp32) kernels that FlopCounterMode knows."""
    q = torch.randn(2, 4, 128, 64, device="cuda", dtype=dtype, requires_grad=True)
    fn = lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()  # noqa: E731
    ours = our_flops(fn)
    assert ours == torch_flops(fn) > 0
