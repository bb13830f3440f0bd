"""Shared pieces of the red-team suite: hostile notebooks of any chapter, graded through the trusted boundary
under the isolation the docs recommend, and the victim graded right after a harmful one."""
import os
import textwrap
import time

import pytest

from ptinternals.grading.exercise import load_chapter
from ptinternals.grading.sandbox import Limits, SandboxConfig, bwrap_works
from ptinternals.grading.testing import ROOT, notebook_with
from ptinternals.grading.trusted import grade_notebook

ISOLATION = "bwrap" if bwrap_works("cpu")[0] else "process"
needs_bwrap = pytest.mark.skipif(ISOLATION != "bwrap", reason="needs bubblewrap (installed by .ci/run)")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs a root grader (dedicated uids, cgroups)")
CANARY = ROOT / "autograder" / "PWNED-by-redteam"


def body(code: str) -> str:
    return textwrap.dedent(code).strip() + "\n"


def grade(chapter: str, replace: dict, only, tmp=".", memory_mb: int = 1536, **config):
    """Grade a hostile notebook: ({exercise id: ExerciseResult}, report, seconds)."""
    t0 = time.perf_counter()
    limits = config.pop("limits", None) or Limits(memory_mb=memory_mb)
    report = grade_notebook(notebook_with(chapter, replace), load_chapter(chapter), tmp,
                            SandboxConfig(isolation=config.pop("isolation", ISOLATION), limits=limits, **config),
                            only=set(only), cell_timeout_s=config.pop("cell_timeout_s", 8))
    return {e.id: e for e in report.exercises}, report, time.perf_counter() - t0


def assert_victim_graded(chapter: str, only, tmp=".", max_s: float = 60.0, **config) -> float:
    """The next student (the correct solution), graded right after a harmful submission by the same grader:
    full marks, in normal time."""
    results, report, seconds = grade(chapter, {}, only, tmp, **config)
    bad = {k: r.message for k, r in results.items() if not r.passed}
    assert not bad, f"the victim lost points after a hostile submission: {bad}"
    assert seconds < max_s, f"the victim took {seconds:.0f} s"
    return seconds


def scored_zero(result, *categories) -> None:
    assert not result.passed and result.score == 0, f"{result.id} was not caught:\n{result.message}"
    if categories:
        assert result.category in categories, f"{result.id}: category {result.category}\n{result.message}"
