"""Tests of the tests: chapter 8's checkers accept the solution and reject every known bug."""
import pytest

from ptinternals.grading import CheckFailure, check, load_chapter
from ptinternals.grading.testing import namespace_with

from .buggy import BUGGY

CHAPTER = load_chapter("ch08")
BUGS = [(ex_id, name, src, expect) for ex_id, bugs in BUGGY.items() for name, (src, expect) in bugs.items()]
SLOW_HIDDEN = {"ch08.train_gpt"}  # its hidden case is the graded 800-step training run (~30 CPU-seconds)


@pytest.fixture(scope="module")
def solution():
    return namespace_with(CHAPTER.assignment)


def rejects(exercise_id: str, source: str) -> CheckFailure | None:
    """Like ``grading.testing.rejects``, visible cases first: a bug the visible cases catch fails the
    hidden run too, with the same simplest (visible) failing case in its message."""
    ex = CHAPTER.exercise(exercise_id)
    ns = namespace_with(CHAPTER.assignment)
    exec(compile(source, f"<buggy {exercise_id}>", "exec"), ns)
    for hidden in (False, True):
        try:
            check(exercise_id, ns[ex.entry], hidden=hidden)
        except CheckFailure as failure:
            return failure
    return None


def test_every_exercise_has_a_bank_of_at_least_three_bugs():
    assert {ex.id for ex in CHAPTER.exercises} == set(BUGGY)
    assert all(len(bugs) >= 3 for bugs in BUGGY.values())


@pytest.mark.parametrize("ex", [e for e in CHAPTER.exercises if e.id not in SLOW_HIDDEN], ids=lambda e: e.id)
def test_solution_passes_visible_and_hidden(ex, solution, capsys):
    assert check(ex.id, solution[ex.entry], hidden=True) is None  # None: nbgrader must not read partial credit
    assert "passed" in capsys.readouterr().out


def test_training_run_solution_passes_visible(solution, capsys):
    assert check("ch08.train_gpt", solution["train_gpt"]) is None
    assert "passed" in capsys.readouterr().out


@pytest.mark.slow
def test_training_run_solution_passes_the_graded_run(solution):
    assert check("ch08.train_gpt", solution["train_gpt"], hidden=True) is None


@pytest.mark.parametrize("ex", CHAPTER.exercises, ids=lambda e: e.id)
def test_stub_fails_with_not_implemented_message(ex):
    def stub(*args, **kwargs):
        raise NotImplementedError()

    with pytest.raises(CheckFailure, match="is not implemented yet") as info:
        check(ex.id, stub)
    assert info.value.category == "not-implemented"


@pytest.mark.parametrize("ex_id, name, source, expect", BUGS, ids=[f"{b[0]}-{b[1]}" for b in BUGS])
def test_known_bug_is_rejected_with_a_teaching_message(ex_id, name, source, expect):
    failure = rejects(ex_id, source)
    assert failure is not None, f"{ex_id}: the checker accepted the known bug {name!r}"
    text = str(failure)
    assert "call:" in text, text
    if expect:
        assert expect in text, f"expected the message to mention {expect!r}:\n{text}"


def test_gpu_exercise_says_it_skipped_on_the_cpu(solution, capsys):
    ex = CHAPTER.exercise("ch08.train_gpu")
    assert ex.gpu and "SKIPPED" in ex.visible_cases()[0].label
    check("ch08.train_gpu", solution["train_gpu"])
    assert "SKIPPED on the CPU: loss and tokens/s are graded on a GPU" in capsys.readouterr().out


def test_a_run_of_a_model_that_sees_the_future_is_refused():
    ns = namespace_with(CHAPTER.assignment, {"ex8_1_code": BUGGY["ch08.gpt"]["no_causal_mask"][0]})
    with pytest.raises(CheckFailure, match="not causal"):
        check("ch08.train_gpt", ns["train_gpt"])
