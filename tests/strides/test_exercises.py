"""Tests of the tests: chapter 1's checkers accept the solution and reject every known bug."""
import pytest

from ptinternals.grading import CheckFailure, check, load_chapter
from ptinternals.grading.testing import namespace_with, rejects

from .buggy import BUGGY

CHAPTER = load_chapter("ch01")
BUGS = [(ex_id, name, src, expect) for ex_id, bugs in BUGGY.items() for name, (src, expect) in bugs.items()]


def test_every_exercise_has_a_bank_of_at_least_three_bugs():
    assert {ex.id for ex in CHAPTER.exercises} == set(BUGGY)
    assert all(len(bugs) >= 3 for bugs in BUGGY.values())


@pytest.mark.parametrize("ex", CHAPTER.exercises, ids=lambda e: e.id)
def test_solution_passes_visible_and_hidden(ex, capsys):
    ns = namespace_with(CHAPTER.assignment)
    assert check(ex.id, ns[ex.entry], hidden=True) is None  # None: nbgrader must not read partial credit
    assert "passed" in capsys.readouterr().out


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
    assert "call:" in text and ("expected" in text or "used" in text or "copy" in text), text
    if expect:
        assert expect in text, f"expected the hint to mention {expect!r}:\n{text}"


def test_using_torch_where_forbidden_is_caught():
    src = "def contiguous_strides(shape):\n    return tuple(torch.empty(shape).stride())\n"
    ns = {"__name__": "__main__"}
    exec("import torch\n" + src, ns)
    with pytest.raises(CheckFailure) as info:
        check("ch01.contiguous_strides", ns["contiguous_strides"])
    assert info.value.category == "forbidden"
    assert "implement the algorithm yourself" in str(info.value)


def test_failure_message_shows_first_difference():
    ns = namespace_with(CHAPTER.assignment)
    exec("def contiguous_strides(shape):\n    return (1,) * len(shape)\n", ns)
    with pytest.raises(CheckFailure) as info:
        check("ch01.contiguous_strides", ns["contiguous_strides"])
    text = str(info.value)
    assert "first difference at position 0" in text and "expected" in text and "got" in text
