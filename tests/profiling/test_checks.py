"""The profiling chapter's checkers: where their answers come from, what they rule out, and the sandbox.

The shared tests (tests/test_exercise_banks.py, tests/test_notebooks.py) run the solution, the bug
bank and the reference twins through every checker; here: the expected answers agree with torch where
the checker claims so, the source policies catch what they say, the sandbox
ships no solution and grades the solution notebook in full, and (GPU) the verdicts of the sync cases
are what ``torch.cuda.set_sync_debug_mode`` reports.
"""
import copy
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

from ptinternals.checks import profiling as C
from ptinternals.checks.probes import profiling as P
from ptinternals.grading import CheckFailure, check
from ptinternals.grading.exercise import get_exercise

ROOT = Path(__file__).resolve().parents[2]
# ---- where the expected answers come from ----------------------------------------------------------------
def test_op_times_expected_is_key_averages_on_real_profiles(cpu_trace, cpu_trace_with_stack):
    """torch's tree code on the trace's events (the checker's expected answer) is prof.key_averages(): on
    the trace as it is where the installed torch counts Python frames (2.13), on the trace without them
    where it does not (2.11). The expected answer keeps them on every torch: it depends on the trace alone."""
    from ptinternals.profiling.trace_analysis import key_averages_categories, keys_inside_steps

    for _, data, key_averages in (cpu_trace, cpu_trace_with_stack):
        counted = key_averages_categories(data)
        as_torch_sees_it = {**data, "traceEvents": [e for e in data["traceEvents"] if e.get("cat") != "python_function"
                                                    or "python_function" in counted]}
        mine = C.torch_key_averages(as_torch_sees_it)
        inside = keys_inside_steps(data, host_categories=counted)  # frames cut at the profile's edges differ in torch
        rows = {e.key: e for e in key_averages}
        assert set(mine) == set(rows)
        for key in inside:
            n, self_us, total_us = mine[key]
            assert n == rows[key].count, key
            assert self_us == pytest.approx(rows[key].self_cpu_time_total, rel=0.02, abs=2 * n), key
            assert total_us == pytest.approx(rows[key].cpu_time_total, rel=0.02, abs=2 * n), key
        frames = {e["name"] for e in data["traceEvents"] if e.get("cat") == "python_function"}
        assert frames <= set(C.torch_key_averages(data)), "the expected answer dropped the Python frames"


def test_sync_case_verdicts_are_the_rule_tables():
    """Each case class's verdict (the checker's oracle) and the reference rule agree on every hidden call."""
    from ptinternals.profiling.sync_rules import sync_reason

    calls = [c for c in get_exercise("profiling.sync_reason").all_cases() if c.args[0] == "call"]
    assert len(calls) > 100 and {c.scenario for c in calls} >= set(C.SYNC_HINTS) - {"repeat_host"}
    for case in calls:
        got = P.sync_rule_call(sync_reason, *case.args[1:])
        assert got == {"reason": case.truth, "modified": []}, case.label


def test_gpu_activity_sweep_agrees_with_the_interval_merge():
    from ptinternals.profiling.trace_analysis import gpu_activity

    for case in get_exercise("profiling.gpu_activity").all_cases():
        k, gap = case.kwargs.get("k", 3), case.kwargs.get("min_gap_us", 0.0)
        if k >= 0 and gap >= 0:
            mine, merged = C.sweep_activity(case.args[0], k, gap), gpu_activity(case.args[0], k, gap)
            assert mine["top_kernels"] == merged["top_kernels"], case.label
            assert [pytest.approx(g) for g in mine["gaps"]] == [tuple(g) for g in merged["gaps"]], case.label
            assert mine["utilization"] == pytest.approx(merged["utilization"]), case.label


# ---- what the checkers rule out (grading.policy, on the answer's source) -----------------------------------
def _problems(exercise_id: str, text: str) -> str:
    """The policy's verdict on ``text`` as one answer cell (instant feedback's view), "" when it passes."""
    return get_exercise(exercise_id).source_problem({"<cell answer>": text}) or ""


def test_the_loop_policy_finds_device_reads_in_loops_and_their_helpers():
    text = """import torch

def log(loss):
    for _ in range(1):
        print(loss.item())

def train_fast(model, batches):
    out = []
    for x, y in batches:
        keep = y >= 0
        loss = model(x[keep]).sum()
        if torch.isnan(loss):
            raise ValueError
        log(loss)
        out.append(loss.detach())
    return torch.stack(out).tolist()

def unused():
    for _ in range(3):
        torch.cuda.synchronize()
"""
    problems = _problems("profiling.train_fast", text)
    for expected in ("`item(...)` inside the loop of line 4 (answer cell <cell answer>, line 5)",
                     "`print(...)` inside the loop of line 4 (answer cell <cell answer>, line 5)",
                     "indexing with a boolean mask inside the loop of line 9",
                     "a tensor decides a condition inside the loop of line 9"):
        assert expected in problems, problems
    assert "synchronize" not in problems and "tolist" not in problems  # unreachable helper; after the loop


def test_the_name_policy_follows_imports_into_helpers():
    text = "from torch.autograd.profiler_util import EventList as E\n\ndef tree(t):\n    return E(t)\n\n" \
           "def op_times(trace):\n    return tree(trace)\n"
    assert "profiler_util" in _problems("profiling.op_times", text)
    assert _problems("profiling.op_times", "def op_times(trace):\n    return {}\n") == ""


def test_a_loop_that_hides_its_syncs_from_the_detector_is_still_caught():
    """Switching the recorder off inside the loop forges the dynamic count (here: the one read expected);
    the source policy still sees the reads in the loop."""
    import linecache

    source = """import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes

def train_fast(model, batches, lr=0.1, device="cuda"):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    with _disable_current_modes():
        for x, y in batches:
            loss = F.cross_entropy(model(x), y, ignore_index=-1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    if losses:
        torch.zeros((), device=device).item()  # the one read the checker expects
    if any(v != v for v in losses):
        raise ValueError("NaN")
    return losses
"""
    filename = "<cell train_fast_code>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ns: dict = {}
    exec(compile(source, filename, "exec"), ns)
    with pytest.raises(CheckFailure, match=r"`item\(\.\.\.\)` inside the loop of line \d+ \(answer cell <cell "
                                           r"train_fast_code>, line 14\)"):
        check("profiling.train_fast", ns["train_fast"])


def test_op_times_cannot_use_torchs_tree_code(cpu_trace):
    def op_times(trace):
        from torch.autograd.profiler_util import EventList

        return EventList([])._build_tree()

    with pytest.raises(CheckFailure, match="switched off|EventList|profiler_util"):
        check("profiling.op_times", op_times)


def test_predict_step_cannot_run_the_simulator():
    def predict_step(copy_pinned_us, copy_pageable_us, compute_us, host_us, loop, pinned=True, item=False):
        from ptinternals.profiling.async_device import SimulatedDevice

        SimulatedDevice(launch_overhead_us=0.0)  # a simulation of the loop would follow
        return max(copy_pinned_us, compute_us, host_us)

    with pytest.raises(CheckFailure, match="simulated device"):
        check("profiling.predict_step", predict_step)


def test_timer_protocol_violations_are_named():
    from ptinternals.profiling.timing import time_gpu

    def lazy(fn, device, warmup=3, reps=10):
        return time_gpu(fn, device, warmup=0, reps=reps)

    with pytest.raises(CheckFailure, match="warm up"):
        check("profiling.time_gpu", lazy)


# ---- the sandbox ------------------------------------------------------------------------------------------
def test_the_sandbox_ships_the_scaffold_and_no_solution():
    from ptinternals.grading.sandbox import build_site

    with tempfile.TemporaryDirectory() as tmp:
        names = set(build_site(Path(tmp), C.CHAPTER.sandbox_files))
    assert {"ptinternals.profiling.scaffold", "ptinternals.profiling.sync_recorder",
            "ptinternals.checks.probes.profiling"} <= names
    for solution in ("sync_rules", "sync_detector", "timing", "overlap", "trace_analysis", "training_loops",
                     "profile_step", "sync_programs"):
        assert f"ptinternals.profiling.{solution}" not in names


def _grade(nb, tmp_path, only=None):
    from ptinternals.grading.sandbox import SandboxConfig, bwrap_works
    from ptinternals.grading.trusted import grade_notebook

    isolation = "bwrap" if bwrap_works("cpu")[0] else "process"
    return grade_notebook(nb, C.CHAPTER, tmp_path, SandboxConfig(isolation=isolation), only=only)


@pytest.mark.slow
def test_solution_notebook_gets_full_marks_through_the_sandbox(tmp_path):
    from ptinternals.grading.testing import solution_notebook

    report = _grade(solution_notebook("profiling"), tmp_path)
    assert all(e.passed for e in report.exercises), [e.message for e in report.exercises if not e.passed]
    assert not report.events and not report.cell_errors, (report.events, report.cell_errors)


@pytest.mark.slow
def test_calling_the_reference_in_an_answer_scores_zero(tmp_path):
    from ptinternals.grading.testing import solution_notebook

    nb = copy.deepcopy(solution_notebook("profiling"))
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "op_times_code":
            cell.source = "from ptinternals.profiling.trace_analysis import op_times\n"
    report = _grade(nb, tmp_path, only={"profiling.op_times"})
    (result,) = report.exercises
    assert not result.passed and "not available while grading" in result.message, result.message


# ---- on a GPU --------------------------------------------------------------------------------------------
def _cuda_value(desc):
    if isinstance(desc, list):
        return [_cuda_value(d) for d in desc]
    if not (isinstance(desc, tuple) and desc and desc[0] == "t"):
        return desc
    from ptinternals.profiling.placement import Placement

    t = P.build_value(desc, Placement(), torch.Generator().manual_seed(0))
    return t.to("cuda") if desc[3] == "device" else t


@pytest.mark.gpu
def test_sync_case_verdicts_agree_with_set_sync_debug_mode():
    """Run every call case on CUDA (device tensors on the GPU, host ones on the CPU): the ops whose case
    says they wait are exactly the ones set_sync_debug_mode warns about. Calls CUDA refuses (mixed
    devices) are skipped and counted."""
    calls = [c for c in get_exercise("profiling.sync_reason").all_cases() if c.args[0] == "call"]
    disagree, refused = [], 0
    for case in calls:
        _, op, args, kwargs = case.args
        namespace, packet, overload = op.split(".")
        func = getattr(getattr(getattr(torch.ops, namespace), packet), overload)
        real_args, real_kwargs = [_cuda_value(a) for a in args], {k: _cuda_value(v) for k, v in kwargs.items()}
        if op == "aten.randperm.default":
            real_kwargs["device"] = "cuda"
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                func(*real_args, **real_kwargs)
            except (RuntimeError, IndexError, TypeError):
                refused += 1
                continue
            finally:
                torch.cuda.set_sync_debug_mode(0)
        warned = any("synchroniz" in str(w.message) for w in caught)
        if warned != (case.truth is not None):
            disagree.append((case.label, case.truth, warned))
    assert not disagree, f"{len(disagree)} of {len(calls) - refused} (refused: {refused}): {disagree[:8]}"


@pytest.mark.gpu
def test_train_fast_solution_syncs_once_on_a_gpu_and_is_faster():
    import time

    from ptinternals.profiling.scaffold import make_batches, make_model
    from ptinternals.profiling.training_loops import train_with_hidden_syncs, train_without_syncs

    batches = make_batches(0, 40, 256, pin=True)
    timings = {}
    for loop in (train_with_hidden_syncs, train_without_syncs):
        model = make_model(0, "cuda")
        loop(model, batches[:2])  # warm-up: kernels loaded, caches filled
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            t0 = time.perf_counter()
            try:
                loop(model, batches)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            torch.cuda.synchronize()
            timings[loop.__name__] = time.perf_counter() - t0
        warned = sum("synchroniz" in str(w.message) for w in caught)
        if loop is train_without_syncs:
            assert warned == 1, warned
        else:
            assert warned >= 3 * len(batches), warned
    print(f"\nhidden syncs: {timings['train_with_hidden_syncs'] * 1e3:.1f} ms, "
          f"without: {timings['train_without_syncs'] * 1e3:.1f} ms")


@pytest.mark.gpu
def test_time_gpu_twin_agrees_with_torch_benchmark_on_a_matmul():
    from ptinternals.profiling.timing import benchmark_torch, cuda_backend, time_gpu

    a = torch.randn(4096, 4096, device="cuda")
    median, iqr = time_gpu(lambda: a @ a, cuda_backend(), warmup=3, reps=20)
    theirs = benchmark_torch(lambda: a @ a, min_run_time=0.5)
    assert median == pytest.approx(theirs.median, rel=0.15), (median, theirs)
    assert 0 <= iqr < median
