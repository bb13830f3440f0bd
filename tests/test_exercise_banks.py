"""Tests of the tests, for every chapter: each checker accepts the solution, calls the student's stubs
"not implemented yet", and rejects every known-buggy implementation in the chapter's bank
(``tests/<slug>/buggy.py``) with a message that shows the failing call and, where the checker
knows it, the likely cause. Chapter-specific checks stay in ``tests/<package>/test_exercises.py``.

A bank may also define ``SLOW_HIDDEN`` (exercises whose hidden run is a long training run: only their
visible cases run here, the hidden run is a slow test of the chapter) and ``GPU_BUGGY`` (bugs only a GPU
can catch, tested in the chapter's GPU tests).
"""
import importlib
from pathlib import Path

import pytest

from ptinternals.grading import CheckFailure, check
from ptinternals.grading.exercise import graded_chapters
from ptinternals.grading.testing import namespace_with, rejects

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = {ch.slug: ch for ch in graded_chapters() if (ROOT / "solutions" / f"{ch.slug}.py").exists()}
BANKS = {slug: importlib.import_module(f"tests.{slug}.buggy") for slug in CHAPTERS}
EXERCISES = [(key, ex) for key, ch in CHAPTERS.items() for ex in ch.exercises]
BUGS = [(ex_id, name, src, expect) for key, bank in BANKS.items() for ex_id, bugs in bank.BUGGY.items()
        for name, (src, expect) in bugs.items()]
_NAMESPACES: dict = {}


def namespace(key: str, student: bool = False) -> dict:
    if (key, student) not in _NAMESPACES:
        _NAMESPACES[key, student] = namespace_with(CHAPTERS[key].assignment, student=student)
    return _NAMESPACES[key, student]


@pytest.mark.parametrize("key", sorted(CHAPTERS))
def test_every_exercise_has_a_bank_of_at_least_three_bugs(key):
    chapter, bank = CHAPTERS[key], BANKS[key]
    assert len(chapter.exercises) >= 6
    assert {ex.id for ex in chapter.exercises} == set(bank.BUGGY)
    assert all(len(bugs) >= 3 for bugs in bank.BUGGY.values())


@pytest.mark.parametrize("key, ex", EXERCISES, ids=[ex.id for _, ex in EXERCISES])
def test_solution_passes_visible_and_hidden(key, ex, capsys):
    hidden = ex.id not in getattr(BANKS[key], "SLOW_HIDDEN", ())
    assert check(ex.id, namespace(key)[ex.entry], hidden=hidden) is None  # None: no partial credit read
    out, err = capsys.readouterr()
    assert "passed" in out or "SKIPPED" in out
    assert err == ""  # any stderr output in a test cell scores 0 under nbgrader


@pytest.mark.parametrize("key, ex", EXERCISES, ids=[ex.id for _, ex in EXERCISES])
def test_student_stub_fails_with_not_implemented_message(key, ex):
    with pytest.raises(CheckFailure, match="is not implemented yet") as info:
        check(ex.id, namespace(key, student=True)[ex.entry])
    assert info.value.category == "not-implemented"


@pytest.mark.parametrize("ex_id, name, source, expect", BUGS, ids=[f"{b[0]}-{b[1]}" for b in BUGS])
def test_known_bug_is_rejected_with_a_teaching_message(ex_id, name, source, expect):
    failure = rejects(ex_id, source)
    assert failure is not None, f"{ex_id}: the checker accepted the known bug {name!r}"
    text = str(failure)
    assert "call:" in text, text
    if expect:
        assert expect in text, f"expected the message to mention {expect!r}:\n{text}"
