"""The kernels chapter through the trusted grading boundary: the sandbox runs the Triton kernels (the interpreter on
the CPU), a kernel that kills its process costs only its own exercise, and bank bugs pasted into a
notebook are graded with the same teaching messages as in the student's kernel."""

import time

import nbformat
import pytest

from ptinternals.grading.sandbox import SandboxConfig, bwrap_works
from ptinternals.grading.testing import ROOT, notebook_with, solution_notebook
from ptinternals.grading.trusted import grade_notebook

from .buggy import BUGGY
from .exercises_testing import CHAPTER, answer_cell_of

pytestmark = pytest.mark.slow
ISOLATION = "bwrap" if bwrap_works("cpu")[0] else "process"
# A worker index of this chapter's own: sandboxes of one worker share a uid, and each run kills every
# process of its uid when it ends, so tests of two chapters running at once must not share one.
WORKER = 7


def grade(nb, tmp_path, only=None):
    return grade_notebook(
        nb,
        CHAPTER,
        tmp_path,
        SandboxConfig(isolation=ISOLATION, worker=WORKER),
        source_nb=solution_notebook(CHAPTER.assignment),
        only=only,
    )


def with_answer(replace: dict) -> nbformat.NotebookNode:
    return notebook_with(CHAPTER.assignment, replace)


def test_the_solution_scores_full_marks_in_the_sandbox(tmp_path):
    t0 = time.perf_counter()
    report = grade(solution_notebook(CHAPTER.assignment), tmp_path)
    failed = {e.id: e.message for e in report.exercises if not e.passed}
    assert not failed, failed
    assert report.sandbox_runs == 1 and not report.cell_errors, (report.events, report.cell_errors)
    print(f"trusted grading of the solution: {time.perf_counter() - t0:.1f} s ({report.isolation})")


def test_the_student_notebook_is_not_implemented_everywhere(tmp_path):
    nb = nbformat.read(ROOT / "notebooks" / CHAPTER.assignment / f"{CHAPTER.assignment}.ipynb", as_version=4)
    report = grade(nb, tmp_path)
    assert {e.category for e in report.exercises} == {"not-implemented"}, {
        e.id: e.message for e in report.exercises
    }


def test_a_kernel_that_kills_the_process_costs_only_its_exercise(tmp_path):
    """The interpreter does not bounds-check: a store far outside any tensor (here 2**30 elements per
    lane) is a segfault of the whole process. The guard bytes catch a missing mask on the last block
    (see the bank), not this; the sandbox must contain it."""
    wild = """
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, stride_x, stride_y, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(out_ptr + offsets * (1 << 30), tl.load(x_ptr + offsets, mask=offsets < n_elements))


def add(x, y):
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), 1, 1, BLOCK_SIZE=1024)
    return out
"""
    report = grade(
        with_answer({"add_code": wild}),
        tmp_path,
        only={"kernels.add", "kernels.softmax", "kernels.grouped_tile_order"},
    )
    by_id = {e.id: e for e in report.exercises}
    assert by_id["kernels.add"].category == "crashed", by_id[
        "kernels.add"
    ].message  # "exited with status 139" in bwrap
    assert by_id["kernels.softmax"].passed and by_id["kernels.grouped_tile_order"].passed
    assert report.sandbox_runs == 2 and any("kernels.add" in e for e in report.events)


@pytest.mark.parametrize(
    "ex_id, bug",
    [
        ("kernels.add", "no_mask_on_last_block"),
        ("kernels.softmax", "no_max_subtraction"),
        ("kernels.layer_norm_forward", "unbiased_variance"),
        ("kernels.flash_attention", "running_sum_not_rescaled"),
    ],
)
def test_bank_bugs_pasted_into_the_notebook_are_graded_with_the_same_message(ex_id, bug, tmp_path):
    source, expect = BUGGY[ex_id][bug]
    report = grade(
        with_answer({answer_cell_of(ex_id): source}), tmp_path, only={ex_id, "kernels.grouped_tile_order"}
    )
    by_id = {e.id: e for e in report.exercises}
    assert not by_id[ex_id].passed and by_id[ex_id].category == "wrong" and expect in by_id[ex_id].message
    assert by_id["kernels.grouped_tile_order"].passed
