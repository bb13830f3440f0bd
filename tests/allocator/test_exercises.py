"""Tests of the tests: the allocator chapter's checkers accept the solution and reject every known bug; their
expected values agree with the model (CPU) and with the real allocator (GPU, ``@pytest.mark.gpu``)."""

import json
import subprocess
import sys

import pytest

from ptinternals.allocator import MiB, should_split
from ptinternals.allocator.scaffold import FRAGMENTATION_CAPACITY
from ptinternals.allocator.trace import replay
from ptinternals.allocator.workloads import random_trace
from ptinternals.checks.allocator import _fragmenting_variants, _snapshot_segments
from ptinternals.grading import CheckFailure, check, load_chapter
from ptinternals.grading.testing import namespace_with

from .buggy import BUGGY

CHAPTER = load_chapter("allocator")
BUGS = [(ex_id, name, src, expect) for ex_id, bugs in BUGGY.items() for name, (src, expect) in bugs.items()]


def test_the_issues_bugs_are_in_the_bank():
    """No coalescing, wrong rounding, splitting large blocks with a small remainder, ignoring streams."""
    names = {(ex, name) for ex, name, _, _ in BUGS}
    for pair in [
        ("allocator.merge_free_neighbours", "no_coalescing"),
        ("allocator.round_size", "rounds_down"),
        ("allocator.should_split", "large_split_small_remainder"),
        ("allocator.find_best_fit", "ignores_stream"),
        ("allocator.memory_timeline", "no_coalescing"),
        ("allocator.memory_timeline", "wrong_rounding"),
        ("allocator.memory_timeline", "splits_large_blocks_with_a_small_remainder"),
        ("allocator.memory_timeline", "ignores_streams"),
    ]:
        assert pair in names


def test_using_torch_is_caught():
    ns = {"__name__": "__main__"}
    exec("import torch\ndef round_size(nbytes, divisions=0):\n    return int(torch.tensor(nbytes))\n", ns)
    with pytest.raises(CheckFailure) as info:
        check("allocator.round_size", ns["round_size"])
    assert info.value.category == "forbidden"


def test_timeline_failure_names_the_first_differing_event():
    ns = namespace_with(CHAPTER.assignment)
    exec(
        "_right = memory_timeline\n"
        "def memory_timeline(trace):\n"
        "    return [(a, b, r + (512 if i == 2 else 0)) for i, (a, b, r) in enumerate(_right(trace))]\n",
        ns,
    )
    with pytest.raises(CheckFailure) as info:
        check("allocator.memory_timeline", ns["memory_timeline"])
    text = str(info.value)
    assert "first difference after event 2" in text and "reserved" in text and "<- differs" in text, text


# ---- the expected values against the model itself ------------------------------------------------
def test_release_expectations_agree_with_the_models_empty_cache():
    from ptinternals.allocator.segment_ops import release_cached_segments

    for seed in range(6):
        trace = random_trace(120, seed=seed, max_size=24 * MiB)
        segments = _snapshot_segments(trace)
        kept, released = release_cached_segments(segments)
        r = replay(trace, 1 << 40)
        before = r.allocator.memory_reserved()
        r.allocator.empty_cache()
        after = r.allocator.snapshot()["segments"]
        assert before - r.allocator.memory_reserved() == released
        assert kept == [[(b["address"], b["size"], b["state"]) for b in s["blocks"]] for s in after]


def test_fragmentation_variants_all_run_out_of_memory_unfixed():
    variants = _fragmenting_variants()
    assert len(variants) >= 6
    for trace in variants:
        assert replay(trace, FRAGMENTATION_CAPACITY).oom is not None


def test_memory_timeline_visible_cases_exercise_every_event_kind():
    kinds = {e[0] for case in CHAPTER.exercise("allocator.memory_timeline").visible_cases() for e in case.args[0]}
    assert kinds == {"alloc", "free", "record_stream", "sync", "empty_cache", "step"}


# ---- GPU: the expected values are the real allocator's -------------------------------------------
_GPU_PROBE = r"""
import json, sys, torch
from ptinternals.allocator.recorder import replay_on_gpu
cases = json.loads(sys.stdin.read())
out = []
for kind, arg in cases:
    torch.cuda.synchronize(); torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    if kind == "size":
        n = arg
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        s = torch.cuda.memory_stats()
        out.append([s["allocated_bytes.all.current"], s["reserved_bytes.all.current"],
                    s["allocated_bytes.small_pool.current"] > 0])
        del x
    else:
        trace = [tuple(e) for e in arg]
        out.append(replay_on_gpu(trace)["reserved_bytes"])
print(json.dumps(out))
"""


def _on_a_fresh_gpu_process(cases):
    """Run the probe above in a new process: nothing else holds GPU memory there."""
    proc = subprocess.run(
        [sys.executable, "-c", _GPU_PROBE],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_round_size_and_size_plan_match_the_real_allocator():
    plan = CHAPTER.exercise("allocator.size_plan")
    cases = [c for c in plan.all_cases(hidden=True) if c.args[0] > 0][:60]
    real = _on_a_fresh_gpu_process([["size", c.args[0]] for c in cases])
    for case, (allocated, reserved, small) in zip(cases, real, strict=False):
        block, pool, segment = plan.expected(case)
        if not should_split(segment, block, pool):  # the tail stays in the block: allocated counts it
            block = segment
        assert (allocated, reserved, small) == (block, segment, pool == "small"), case.args


@pytest.mark.gpu
def test_memory_timeline_cases_match_the_real_allocator():
    """Reserved bytes after every event, model (the expected value) against the real allocator.

    Cases with record_stream are left out: without kernels, a real event completes at once, while the
    trace says when the other stream finishes ("sync")."""
    ex = CHAPTER.exercise("allocator.memory_timeline")
    cases = [c for c in ex.all_cases(hidden=True) if not any(e[0] == "record_stream" for e in c.args[0])]
    assert len(cases) >= 10
    real = _on_a_fresh_gpu_process([["trace", [list(e) for e in c.args[0]]] for c in cases])
    for case, reserved in zip(cases, real, strict=False):
        assert [r for _, _, r in ex.expected(case)] == reserved, case.label or case.args[0][:5]


# ---- through the trusted boundary ------------------------------------------------------------------
def _grade(nb, tmp_path, only=None):
    from ptinternals.grading.sandbox import SandboxConfig, bwrap_works
    from ptinternals.grading.trusted import grade_notebook

    isolation = "bwrap" if bwrap_works("cpu")[0] else "process"
    return grade_notebook(nb, CHAPTER, tmp_path, SandboxConfig(isolation=isolation), only=only)


def test_solution_notebook_gets_full_marks_through_the_sandbox(tmp_path):
    """The scaffold and the probe are importable in the sandbox; the reference is not needed."""
    from ptinternals.grading.testing import solution_notebook

    report = _grade(solution_notebook(CHAPTER.assignment), tmp_path)
    assert all(e.passed for e in report.exercises), [e.message for e in report.exercises if not e.passed]
    assert not report.events and not report.cell_errors, (report.events, report.cell_errors)


def test_calling_the_reference_in_an_answer_scores_zero(tmp_path):
    import copy

    from ptinternals.grading.testing import solution_notebook

    nb = copy.deepcopy(solution_notebook(CHAPTER.assignment))
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "memory_timeline_code":
            cell.source = (
                "from ptinternals.allocator.trace import replay\n\n"
                "def memory_timeline(trace):\n"
                "    r = replay(trace, 1 << 50)\n"
                "    return list(zip(r.allocated_bytes, r.active_bytes, r.reserved_bytes))\n"
            )
    report = _grade(nb, tmp_path, only={"allocator.memory_timeline"})
    (result,) = report.exercises
    assert not result.passed and "not available while grading" in result.message, result.message
