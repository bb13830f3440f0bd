"""Tests of the tests: the amp chapter's checkers accept the solution and reject every known bug."""

import math

import pytest
import torch

from ptinternals.amp.autocast_policy import autocast_output_dtype
from ptinternals.amp.formats import encode
from ptinternals.amp.scaffold import scaler_trajectory
from ptinternals.checks.amp import (
    BODY_OPS,
    FORMATS,
    TERMINAL_OPS,
    _encode_variant,
    autocast_layer_dtypes,
    torch_bits_of_value,
)
from ptinternals.checks.probes import amp as probes
from ptinternals.grading import CheckFailure, check, load_chapter
from ptinternals.grading.testing import namespace_with

from .buggy import BUGGY

CHAPTER = load_chapter("amp")
def namespace(replace: dict | None = None) -> dict:
    """The solution notebook's setup and answer cells (some replaced by grade_id), as the grader runs them."""
    return namespace_with(CHAPTER.assignment, replace)


def test_torch_is_unavailable_where_forbidden():
    ns = {"__name__": "__main__"}
    exec("import torch\ndef decode(bits, fmt):\n    return torch.tensor([bits]).item() * 1.0\n", ns)
    with pytest.raises(CheckFailure) as info:
        check("amp.decode", ns["decode"])
    assert info.value.category == "forbidden"


def test_rounding_failure_names_the_input_bits_and_both_patterns():
    ns = namespace({"fp32_to_bf16_bits_code": BUGGY["amp.fp32_to_bf16_bits"]["round_half_up"][0]})
    with pytest.raises(CheckFailure) as info:
        check("amp.fp32_to_bf16_bits", ns["fp32_to_bf16_bits"])
    text = str(info.value)
    assert (
        "first at index" in text and "fp32 bits 0x" in text and "expected 0x" in text and "got 0x" in text
    ), text


def test_encode_variant_is_ieee_by_default():
    """The diagnosis helper's default equals the reference encoder and torch on ties and edges."""
    for fmt in ("bf16", "fp16", "fp8_e5m2"):
        for v in (1 + 2.0**-8, 65520.0, 2.0**-25, 3 * 2.0**-25, 1e-40, 448.0, -0.1, 3.0e38):
            assert _encode_variant(v, fmt) == encode(v, fmt) == torch_bits_of_value(v, fmt), (fmt, v)
    assert _encode_variant(1 + 2.0**-8, "bf16", ties="away") == 0x3F81
    assert _encode_variant(65520.0, "fp16", overflow="saturate") == 0x7BFF


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_autocast_layer_dtypes_agree_with_the_policy_tables(device):
    """Real autocast (fake CUDA tensors on a CPU-only machine) and ptinternals.amp's policy tables agree."""
    names = {
        "linear": "linear",
        "matmul": "matmul",
        "relu": "relu",
        "gelu": "gelu",
        "layer_norm": "layer_norm",
        "softmax": "softmax",
        "log_softmax": "log_softmax",
        "exp": "exp",
        "pow": "pow",
        "mul_scalar": "mul",
        "sum": "sum",
        "mse_loss": "mse_loss",
        "cross_entropy": "cross_entropy",
    }
    for low in ("bfloat16", "float16"):
        for inp in ("float32", "bfloat16", "float16"):
            for op in BODY_OPS + TERMINAL_OPS:
                got = autocast_layer_dtypes([op], device, low, inp)[0]
                if op == "add_fp32":
                    want = "float32"
                else:
                    want = autocast_output_dtype(names[op], [inp], device, low)
                assert got == want, (device, low, inp, op, got, want)


def test_formats_table_matches_torch_finfo():
    for name, (e, m, _, dtype) in FORMATS.items():
        fi = torch.finfo(dtype)
        assert fi.bits == 1 + e + m and fi.eps == 2.0**-m, name


def test_speed_probe_labels_the_skipped_half_on_cpu():
    ns = namespace()
    report = probes.speed_probe(ns["amp_train"], torch.bfloat16)
    if torch.cuda.is_available():
        pytest.skip("on a GPU the speed half runs")
    assert report["speed"].startswith("SKIPPED on CPU") and report["saved_ratio"] < 0.7
    text = CHAPTER.exercise("amp.amp_speed").summary([], [report])
    assert "SKIPPED on CPU" in text and "bytes saved for backward" in text


def test_scaler_driver_records_skips_and_double_unscale():
    params = [torch.randn(3)]
    script = [
        {"micro": [[torch.tensor([1.0, math.inf, 0.0])]], "unscale": True, "twice": True},
        {"micro": [[torch.ones(3)]], "unscale": False},
    ]
    out = scaler_trajectory(
        lambda: torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1), params, script
    )
    assert out["stepped"] == [False, True] and out["twice"] == ["RuntimeError", "not asked"]
    assert out["scales"] == [4.0, 2.0, 4.0]


@pytest.mark.gpu
def test_speed_check_measures_time_and_memory_on_a_gpu():
    ns = namespace()
    report = probes.speed_probe(ns["amp_train"], torch.bfloat16)
    assert report["speed"] == "measured", report
    limits = CHAPTER.exercise("amp.amp_speed").limits
    assert report["time_ratio"] <= limits["time_ratio"] and report["peak_ratio"] <= limits["peak_ratio"], (
        report
    )


@pytest.mark.gpu
def test_predictions_match_real_cuda_autocast():
    ns = namespace()
    for layers in (
        ["linear", "gelu", "layer_norm", "linear", "softmax", "cross_entropy"],
        list(BODY_OPS) + ["sum"],
    ):
        for low in ("bfloat16", "float16"):
            assert ns["predict_dtypes"](layers, "cuda", low) == autocast_layer_dtypes(layers, "cuda", low)


# ---- end to end through the trusted grader (the sandbox; about 30 s per notebook on 2 cores) -------
def _graded(nb, only=None):
    from ptinternals.grading.sandbox import SandboxConfig, bwrap_works
    from ptinternals.grading.trusted import grade_notebook

    isolation = "bwrap" if bwrap_works("cpu")[0] else "process"
    report = grade_notebook(nb, CHAPTER, ".", SandboxConfig(isolation=isolation), only=only)
    return {e.id: e for e in report.exercises}, report


def _submission(replace=None, student=False):
    from ptinternals.grading.testing import notebook_with

    return notebook_with("amp", replace, student=student)


@pytest.mark.slow
def test_one_bug_costs_only_its_exercise_through_the_sandbox():
    bug = BUGGY["amp.amp_train"]["clip_before_unscale"][0]
    results, report = _graded(_submission({"amp_train_code": bug}))
    assert not results["amp.amp_train"].passed and results["amp.amp_train"].score == 0
    assert "clip AFTER scaler.unscale_" in results["amp.amp_train"].message
    others = [e for i, e in results.items() if i != "amp.amp_train"]
    assert all(e.passed and e.score == e.points for e in others), [e.message for e in others if not e.passed]
    assert not report.cell_errors and not report.events


@pytest.mark.slow
def test_student_notebook_scores_zero_everywhere_through_the_sandbox():
    results, report = _graded(_submission(student=True))
    assert {e.category for e in results.values()} == {"not-implemented"}
    assert sum(e.score for e in results.values()) == 0
    assert not report.cell_errors




@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_layer_dtypes_predicts_real_autocast_layer_by_layer(device):
    """ptinternals.amp.layer_dtypes (the twin of amp.predict_dtypes) against real autocast, chains included."""
    from ptinternals.amp.layer_dtypes import predict_dtypes

    chains = [[op] for op in BODY_OPS + TERMINAL_OPS] + [
        ["linear", "layer_norm", "add_fp32", "softmax", "matmul", "sum"], ["exp", "linear", "mse_loss"], []]
    for low in ("bfloat16", "float16"):
        for inp in ("float32", "bfloat16", "float16"):
            for layers in chains:
                want = autocast_layer_dtypes(layers, device, low, inp)
                assert predict_dtypes(layers, device, low, inp) == want, (device, low, inp, layers)


def test_layer_dtypes_rejects_bad_input():
    from ptinternals.amp.layer_dtypes import predict_dtypes

    with pytest.raises(TypeError, match="layers must be a list"):
        predict_dtypes("linear", "cpu", "bfloat16")
    with pytest.raises(ValueError, match=r"layers\[1\] must be one of"):
        predict_dtypes(["linear", "conv"], "cpu", "bfloat16")
    with pytest.raises(ValueError, match="autocast_dtype must be float16 or bfloat16"):
        predict_dtypes(["linear"], "cpu", "float32")


def test_decompose_fields_is_decompose_without_the_kind():
    from ptinternals.amp.formats import decompose, decompose_fields

    for value, fmt in [(1.0, "fp16"), (-65520.0, "fp16"), (2.0**-140, "bf16"), (math.nan, "fp8_e4m3fn")]:
        assert decompose_fields(value, fmt) == tuple(decompose(value, fmt))[:3]
        assert decompose_fields(value, fmt) == tuple(
            (torch_bits_of_value(value, fmt) >> s) & mask for s, mask in (
                (sum(FORMATS[fmt][:2]), 1), (FORMATS[fmt][1], (1 << FORMATS[fmt][0]) - 1),
                (0, (1 << FORMATS[fmt][1]) - 1))) or math.isnan(value)
