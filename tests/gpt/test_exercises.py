"""Tests of the tests: the gpt chapter's checkers accept the solution and reject every known bug."""
import pytest

from ptinternals.grading import CheckFailure, check, load_chapter
from ptinternals.grading.testing import namespace_with

from .buggy import BUGGY

CHAPTER = load_chapter("gpt")
SLOW_HIDDEN = {"gpt.train_gpt"}  # its hidden case is the graded 800-step training run (~30 CPU-seconds)


@pytest.fixture(scope="module")
def solution():
    return namespace_with(CHAPTER.assignment)


def test_training_run_solution_passes_visible(solution, capsys):
    assert check("gpt.train_gpt", solution["train_gpt"]) is None
    assert "passed" in capsys.readouterr().out


@pytest.mark.slow
def test_training_run_solution_passes_the_graded_run(solution):
    assert check("gpt.train_gpt", solution["train_gpt"], hidden=True) is None


def test_gpu_exercise_says_it_skipped_on_the_cpu(solution, capsys):
    ex = CHAPTER.exercise("gpt.train_gpu")
    assert ex.gpu and "SKIPPED" in ex.visible_cases()[0].label
    check("gpt.train_gpu", solution["train_gpu"])
    assert "SKIPPED on the CPU: loss and tokens/s are graded on a GPU" in capsys.readouterr().out


def test_a_run_of_a_model_that_sees_the_future_is_refused():
    ns = namespace_with(CHAPTER.assignment, {"gpt_code": BUGGY["gpt.gpt"]["no_causal_mask"][0]})
    with pytest.raises(CheckFailure, match="not causal"):
        check("gpt.train_gpt", ns["train_gpt"])
