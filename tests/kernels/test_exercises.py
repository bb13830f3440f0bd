"""Tests of the tests: the kernels chapter's checkers accept the solution, call the stubs "not implemented", and
reject every known bug with a message that names the cause."""

import pytest
import torch

from ptinternals.checks.kernels import PerfTarget, compare_perf, grouped_order
from ptinternals.checks.probes import kernels as probe
from ptinternals.grading import check

from .buggy import GPU_BUGGY
from .exercises_testing import CHAPTER, namespace, rejects

GPU_BUGS = [
    (ex_id, name, src, expect) for ex_id, bugs in GPU_BUGGY.items() for name, (src, expect) in bugs.items()
]


@pytest.fixture(scope="module")
def solution():
    return namespace()


@pytest.mark.gpu
@pytest.mark.parametrize("ex_id, name, source, expect", GPU_BUGS, ids=[f"{b[0]}-{b[1]}" for b in GPU_BUGS])
def test_gpu_only_bug_is_rejected_on_a_gpu(ex_id, name, source, expect):
    failure = rejects(ex_id, source)
    assert failure is not None and expect in str(failure), str(failure)


def test_gpu_only_bugs_pass_in_the_interpreter():
    """Why GPU_BUGGY exists: the interpreter accepts tl.dot on blocks under 16."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU these bugs are rejected (test_gpu_only_bug_is_rejected_on_a_gpu)")
    for ex_id, _name, source, _ in GPU_BUGS:
        ex = CHAPTER.exercise(ex_id)
        ns = namespace({ex.grade_id.replace("_tests", "_code"): source})
        check(ex_id, ns[ex.entry])


# ---- the probe: guards, op records, launches ------------------------------------------------------
def test_guard_turns_an_out_of_bounds_store_into_a_report(solution):
    import triton
    import triton.language as tl

    @triton.jit
    def unmasked_copy(x_ptr, out_ptr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs))  # no mask: 1024 - 1000 lanes past the end

    def copy(x):
        out = torch.empty_like(x)
        unmasked_copy[(1,)](x, out, BLOCK=1024)
        return out

    result = probe.kernel_case(copy, torch.randn(1000))
    assert result["launches"] == 1 and result["oob"] and "empty_like" in result["oob"][0]
    assert not probe.kernel_case(torch.add, torch.randn(3), torch.randn(3))["launches"]


def test_probe_reports_where_a_stray_store_landed_and_inputs_written(solution):
    import triton
    import triton.language as tl

    @triton.jit
    def scatter(x_ptr, out_ptr, STRIDE: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr + offs * STRIDE, tl.load(x_ptr + offs) + 1.0)   # every STRIDE-th element, past the end

    def strided_store(x):
        out = torch.empty_like(x)
        scatter[(1,)](x, out, STRIDE=3, BLOCK=16)
        return out

    def in_place(x):
        out = torch.empty_like(x)
        scatter[(1,)](x, x, STRIDE=1, BLOCK=16)                    # writes its own input
        return out

    tail = probe.kernel_case(torch.empty_like, torch.randn(3))
    assert not tail["oob"] and not tail["modified"]
    stray = probe.kernel_case(strided_store, torch.randn(20))["stray"]
    assert stray[0]["before"] == 0 and stray[0]["after_first"] == 1 and stray[0]["after_count"] == 9  # 21..45 by 3
    assert stray[0]["shape"] == [20] and stray[0]["label"].startswith("a tensor your code allocated")
    result = probe.kernel_case(in_place, torch.randn(16))
    assert result["modified"] == ["input 0 (shape (16,), float32)"] and not result["oob"]


def test_how_failures_say_what_happened_and_name_no_cause():
    """No kernel, torch doing the math, an input written: the message says so, the hint stays silent."""
    ex = CHAPTER.exercise("kernels.softmax")
    case, expected = ex.visible_cases()[0], ex.expected(ex.visible_cases()[0])
    base = {"out": None, "ops": ["empty"], "launches": 1, "oob": [], "stray": [], "modified": [], "device": "cpu"}
    for got, words in ((dict(base, launches=0), "launched no Triton kernel"),
                       (dict(base, ops=["empty", "_softmax"]), "computed with torch (_softmax)"),
                       (dict(base, modified=["input 0 (shape (5, 7), float32)"]), "wrote into its input")):
        assert words in ex.compare(case, got, expected)
        assert ex.diagnose(case, got, expected) is None


def test_unwritten_outputs_and_reads_past_the_end_are_nan(solution):
    result = probe.run_guarded(lambda x: torch.empty(5), torch.randn(2))
    assert torch.isnan(result["out"]).all()


def test_bf16_is_skipped_on_the_cpu_and_performance_without_a_gpu(solution):
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    result = probe.kernel_case(solution["softmax"], x)
    if torch.cuda.is_available():
        pytest.skip("on a GPU bf16 runs")
    assert result["skipped"].startswith("bf16")
    perf = probe.kernel_case(
        solution["softmax"], {"benchmark": "softmax", "shape": [64, 64], "dtype": "float16"}
    )
    assert "GPU only" in perf["skipped"]


def test_performance_is_judged_as_a_ratio_to_torch_with_the_roofline_in_the_message():
    target = PerfTarget("softmax", 1.0, (4096, 4096), "bfloat16", "torch.softmax")
    fast = {
        "device": "cuda",
        "gpu": "NVIDIA H200",
        "ms": 0.030,
        "torch_ms": 0.031,
        "max_abs_err": 1e-3,
        "ref_max_abs": 0.5,
    }
    assert compare_perf(fast, target, 1.6e-2) is None
    slow = dict(fast, ms=0.050)
    message = compare_perf(slow, target, 1.6e-2)
    assert "0.62x torch" in message and "GB/s" in message and "memory-bound" in message
    wrong = dict(fast, max_abs_err=5.0)
    assert "differs from torch" in compare_perf(wrong, target, 1.6e-2)
    assert compare_perf({"skipped": "no GPU", "device": "cpu"}, target, 1.6e-2) is None
    mm = PerfTarget("matmul", 0.9, (4096, 4096, 4096), "float16", "cuBLAS")
    assert "compute-bound" in compare_perf(dict(fast, ms=1.0, torch_ms=0.2, ref_max_abs=100.0), mm, 2e-3)


def test_grouped_order_expected_agrees_with_the_reference_index_math():
    from ptinternals.kernels.blocked_matmul import grouped_tile_order

    for m, n, g in [(4, 4, 1), (4, 4, 2), (5, 3, 2), (7, 5, 3), (9, 1, 10), (1, 9, 4)]:
        assert grouped_order(m, n, g) == grouped_tile_order(m, n, g)
