"""The bit-layout figures and a smoke run of bench/bench_amp.py at CPU size."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from matplotlib.figure import Figure

from ptinternals.viz.amp import draw_bit_layout, draw_dynamic_range


@pytest.mark.parametrize("value", [0.1, -65520.0, 2.0**-24, 0.0, float("nan"), float("inf"), 448.0])
def test_bit_layout_draws_every_format(value):
    fig = draw_bit_layout(value)
    assert isinstance(fig, Figure)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert {"fp32", "tf32", "bf16", "fp16", "fp8_e4m3fn", "fp8_e5m2"} <= set(texts)


def test_dynamic_range_with_gradients():
    grads = torch.randn(1000) * 1e-7
    grads[:10] = 0
    fig = draw_dynamic_range(values=grads, values_label="|grad|")
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert "exact zeros: 10" in fig.axes[0].get_title()
    assert isinstance(draw_dynamic_range(["fp16", "bf16"]), Figure)


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: draw_bit_layout("0.1"), TypeError, "value must be a float"),
        (lambda: draw_bit_layout(1.0, formats=[]), ValueError, "formats must be a non-empty"),
        (lambda: draw_bit_layout(1.0, formats=["fp9"]), ValueError, "fmt must be one of"),
        (lambda: draw_dynamic_range("fp16"), ValueError, "formats must be a non-empty list"),
    ],
)
def test_invalid_inputs_raise_clear_errors(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_bench_runs_small_on_cpu():
    path = Path(__file__).resolve().parents[2] / "bench" / "bench_amp.py"
    spec = importlib.util.spec_from_file_location("bench_amp", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ms = mod.run(SimpleNamespace(device="cpu", small=True, peaks=None))
    assert [m.name for m in ms] == ["fp32", "bf16_autocast", "fp16_autocast_gradscaler"]
    for m in ms:
        assert m.ms > 0 and m.flops > 0 and m.extra["tokens_per_s"] > 0
        assert (
            "not measured on cpu" in m.extra["peak_mem_bytes"]
            and "not expected to be faster" in m.extra["note"]
        )
    assert ms[0].extra["speedup_vs_fp32"] == 1.0 and ms[2].torch_ms > 0
