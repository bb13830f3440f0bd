"""Tests of the tests, for every chapter: each checker accepts the solution, calls the student's stubs
"not implemented yet", and rejects every known-buggy implementation in the chapter's bank
(``tests/<slug>/buggy.py``) with a message that shows the failing call and the likely cause exactly
when the bank says it has one. The solution's reference twin passes the hidden cases, and the hidden
cases cover the exercise's boundary classes. Chapter-specific checks stay in ``tests/<slug>/test_exercises.py``.

A bank may also define ``SLOW_HIDDEN`` (exercises whose hidden run is a long training run: only their
visible cases run here, the hidden run is a slow test of the chapter) and ``GPU_BUGGY`` (bugs only a GPU
can catch, tested in the chapter's GPU tests).

``TESTS_OF_TESTS`` in a bank lists the checks of issue 16 the chapter has taken on: ``"hints"`` (a bug's
hint words must be in its likely cause, and a bug whose hint is None gets no likely cause at all),
``"twins"`` and ``"boundaries"``. Until a chapter lists one, that check is skipped for it (and "hints"
keeps the old rule: the words anywhere in the message, None unchecked). When every chapter lists all
three, the set goes and the checks hold everywhere.
"""
import importlib
from pathlib import Path

import pytest

from ptinternals.grading import CheckFailure, check
from ptinternals.grading.exercise import graded_chapters
from ptinternals.grading.testing import (
    answer_sources,
    likely_cause,
    load_twin,
    missing_boundary_classes,
    namespace_with,
    rejects,
    twin_of,
)

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = {ch.slug: ch for ch in graded_chapters() if (ROOT / "solutions" / f"{ch.slug}.py").exists()}
BANKS = {slug: importlib.import_module(f"tests.{slug}.buggy") for slug in CHAPTERS}
EXERCISES = [(key, ex) for key, ch in CHAPTERS.items() for ex in ch.exercises]
BUGS = [(ex_id, name, src, expect) for key, bank in BANKS.items() for ex_id, bugs in bank.BUGGY.items()
        for name, (src, expect) in bugs.items()]
_NAMESPACES: dict = {}


def adopted(key: str, check_name: str) -> bool:
    return check_name in getattr(BANKS[key], "TESTS_OF_TESTS", ())


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
    if not adopted(ex_id.split(".", 1)[0], "hints"):
        if expect:
            assert expect in text, f"expected the message to mention {expect!r}:\n{text}"
        return
    hint = likely_cause(failure)
    if expect is None:
        assert hint is None, f"{ex_id} {name!r}: a likely cause was given for a bug it does not describe:\n{text}"
    else:
        assert hint is not None and expect in hint, f"expected the likely cause to say {expect!r}:\n{text}"


@pytest.mark.parametrize("key, ex", EXERCISES, ids=[ex.id for _, ex in EXERCISES])
def test_reference_twin_passes_the_hidden_cases(key, ex, capsys):
    """The solution names its twin in the reference package; the twin passes the exercise's hidden cases, so
    the notebook's solution and the reference cannot drift apart."""
    if not adopted(key, "twins"):
        pytest.skip(f"{key}: the bank's TESTS_OF_TESTS does not list 'twins' yet")
    cell = getattr(BANKS[key], "ANSWER_CELL", {}).get(ex.id, ex.answer_cell)
    target = twin_of(ex.id, cell)
    assert target is not None, (
        f"{ex.id}: the answer cell {cell} names no reference twin. Add one line inside its solution region: "
        f"`# twin: ptinternals.{key}.<module>.<name>` (a function or class with the entry point's signature), "
        f"or `# twin: none (<why>)`.")
    assert "# twin" not in answer_sources(key, student=True).get(cell, ""), f"{cell}: the twin line reaches students"
    if target.startswith("none"):
        assert target[4:].strip().startswith("(") and len(target) > 8, f"{ex.id}: say why it has no twin: {target!r}"
        return
    hidden = ex.id not in getattr(BANKS[key], "SLOW_HIDDEN", ())
    check(ex.id, load_twin(target), hidden=hidden)
    assert "passed" in capsys.readouterr().out


@pytest.mark.parametrize("key", sorted(CHAPTERS))
def test_hidden_cases_cover_the_boundary_classes(key):
    if not adopted(key, "boundaries"):
        pytest.skip(f"{key}: the bank's TESTS_OF_TESTS does not list 'boundaries' yet")
    undeclared = [ex.id for ex in CHAPTERS[key].exercises if not ex.boundary_classes]
    assert not undeclared, f"these exercises declare no boundary_classes: {undeclared}"
    missing = {ex.id: m for ex in CHAPTERS[key].exercises if (m := missing_boundary_classes(ex))}
    assert not missing, f"no hidden case falls in these boundary classes: {missing}"
