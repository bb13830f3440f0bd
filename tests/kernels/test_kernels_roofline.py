"""Costs, the roofline figure, the benchmark's small run, and reading Inductor's kernels."""
import importlib.util
import pathlib
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.figure import Figure

from ptinternals.benchmark import Measurement, Peaks
from ptinternals.kernels import costs
from ptinternals.kernels.inductor import triton_kernel_names, triton_kernel_source
from ptinternals.viz.kernels import roofline_figure

from .kernels_testing import DEVICE

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_costs_of_the_reference_sizes():
    mm = costs.matmul_cost(4096, 4096, 4096, torch.float16)
    assert mm.flops == 2 * 4096**3 and mm.bytes_moved == 3 * 4096 * 4096 * 2
    assert mm.intensity == pytest.approx(1365.33, rel=1e-4)
    assert costs.add_cost(1000, torch.float32) == costs.KernelCost(12000, 1000)
    assert costs.softmax_cost(4096, 4096, torch.float32).intensity == pytest.approx(5 / 8)
    assert costs.ridge_point(costs.H200_PEAKS) == pytest.approx(206, rel=0.01)
    assert costs.attention_cost(1, 1, 8, 8, 4, torch.float16, causal=True).flops == 4 * 36 * 4


def test_flop_counts_agree_with_torch_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        torch.randn(30, 20) @ torch.randn(20, 10)
    assert fc.get_total_flops() == costs.matmul_cost(30, 10, 20, torch.float32).flops


@settings(max_examples=20)
@given(sq=st.integers(0, 40), sk=st.integers(0, 40), causal=st.booleans())
def test_visible_pairs_counts_the_mask(sq, sk, causal):
    mask = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        mask = mask.tril()              # top-left aligned, as is_causal=True
    assert costs.visible_pairs(sq, sk, causal) == int(mask.sum())


def test_attainable_is_the_roof():
    p = Peaks(bytes_per_s=1e12, flops=100e12, how="test")
    assert costs.attainable_flops(10, p) == 10e12 and costs.attainable_flops(1000, p) == 100e12
    m = Measurement("k", "x", "cuda", "()", "float16", ms=1.0, bytes_moved=10**9, flops=10**10)
    f = costs.roofline_fractions(m, p)
    assert f["bound"] == "memory" and f["frac_bw"] == pytest.approx(1.0)


@pytest.mark.parametrize("call, exc", [
    (lambda: costs.matmul_cost(-1, 2, 3, torch.float16), ValueError),
    (lambda: costs.add_cost(3.5, torch.float16), TypeError),
    (lambda: costs.add_cost(3, "fp16"), TypeError),
    (lambda: costs.attainable_flops(-1, costs.H200_PEAKS), ValueError),
    (lambda: costs.roofline_fractions(Measurement("k", "x", "cpu", "()", "f", ms=1.0), costs.H200_PEAKS),
     ValueError),
])
def test_cost_functions_reject_bad_input(call, exc):
    with pytest.raises(exc):
        call()


def _fake_measurements():
    mk = lambda name, cost, ms, tms: Measurement("kernels", name, "cuda", "()", "float16", ms=ms,
                                                 bytes_moved=cost.bytes_moved, flops=cost.flops, torch_ms=tms)
    return [mk("softmax", costs.softmax_cost(4096, 4096, torch.float16), 0.02, 0.025),
            mk("matmul", costs.matmul_cost(4096, 4096, 4096, torch.float16), 0.2, 0.18)]


def test_roofline_figure():
    fig = roofline_figure(_fake_measurements(), Peaks(4.0e12, 800e12, "measured"))
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert len(ax.collections) == 4            # two kernels, each with torch's hollow twin
    assert len(ax.lines) == 2                  # datasheet roof and measured roof


def test_roofline_figure_rejects_bad_input():
    with pytest.raises(ValueError, match="bytes_moved"):
        roofline_figure([Measurement("k", "x", "cpu", "()", "f", ms=1.0)])
    with pytest.raises(TypeError, match="Measurement"):
        roofline_figure([{"ms": 1}])
    with pytest.raises(ValueError, match="nothing to draw"):
        roofline_figure(_fake_measurements(), None, show_h200=False)


def test_format_report_says_what_numbers_mean():
    text = costs.format_report(_fake_measurements())
    assert "softmax" in text and "vs torch" in text and "H200 roof" in text


def test_bench_small_run_on_this_device():
    spec = importlib.util.spec_from_file_location("bench_kernels", ROOT / "bench" / "bench_kernels.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    ctx = SimpleNamespace(device=DEVICE, small=True, peaks=Peaks(1e10, 1e11, "test"))
    ms = bench.run(ctx)
    names = {m.name for m in ms}
    assert {"add", "softmax", "softmax_online", "layer_norm_fwd", "layer_norm_bwd", "matmul",
            "attention_fwd", "attention_bwd"} <= names
    for m in ms:
        assert m.bytes_moved and m.flops and m.torch_ms and m.ms > 0
        limit = 1e-3 if DEVICE == "cpu" else 2e-2          # fp32 attention and matmul use TF32 on a GPU
        assert m.extra["max_abs_err"] < limit, f"{m.name} disagrees with torch by {m.extra['max_abs_err']}"
        assert "h200_frac_roof" in m.extra and "meas_frac_roof" in m.extra
    assert isinstance(roofline_figure(ms, ctx.peaks), Figure)


INDUCTOR_OUTPUT = '''
triton_per_fused__softmax_0 = async_compile.triton('triton_per_fused__softmax_0', \'\'\'
import triton
import triton.language as tl

@triton_heuristics.persistent_reduction(
    size_hints={'x': 4096, 'r0_': 1024},
    filename=__file__,
)
@triton.jit
def triton_per_fused__softmax_0(in_out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr):
    xnumel = 4096
    r0_numel = 781
    tmp0 = tl.load(in_out_ptr0 + (r0_1 + 781*x0), r0_mask & xmask, other=0.0)

    tl.store(in_out_ptr0 + (r0_1 + 781*x0), tmp11, r0_mask & xmask)
\'\'\', device_str='cuda')
'''


def test_reading_inductor_output_code():
    assert triton_kernel_names(INDUCTOR_OUTPUT) == ["triton_per_fused__softmax_0"]
    src = triton_kernel_source(INDUCTOR_OUTPUT, "triton_per_fused__softmax_0")
    assert src.startswith("@triton.jit") and src.rstrip().endswith("r0_mask & xmask)")
    with pytest.raises(ValueError, match="no kernel named"):
        triton_kernel_source(INDUCTOR_OUTPUT, "triton_poi_fused_add_0")
    with pytest.raises(TypeError):
        triton_kernel_names(None)


@pytest.mark.gpu
def test_inductor_writes_a_persistent_reduction_for_softmax():
    from ptinternals.kernels.inductor import generated_code

    x = torch.randn(1823, 781, device="cuda")
    code = "\n".join(generated_code(lambda t: torch.softmax(t * 2, -1), x))
    names = triton_kernel_names(code)
    assert names and any(n.startswith(("triton_per_", "triton_red_")) for n in names), names
