"""Quizzes: banks hold no plain answers (and no key at all for graded questions), widgets record answers,
grading scores the last answer to each graded question against the instructor's key, defensively."""
import json
import os
from pathlib import Path

import pytest
import yaml

from ptinternals.quiz.answers import answers_path, grade_answers, read_answers, record_answer
from ptinternals.quiz.bank import compile_bank, load_answer_key, load_bank, normalize, source_path

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted(p.stem for p in (ROOT / "solutions" / "quizzes").glob("*.yaml"))
KEY = load_answer_key("strides", source_path("strides", ROOT))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_bank_has_no_plain_answers_and_at_least_8_questions(chapter):
    source = yaml.safe_load(source_path(chapter, ROOT).read_text())
    bank_text = (ROOT / "src" / "ptinternals" / "quiz" / "banks" / f"{chapter}.json").read_text()
    bank = load_bank(chapter)
    assert len(bank.questions) >= 8
    assert bank.graded_questions and len(bank.graded_questions) < len(bank.questions)  # both modes in use
    for q in source["questions"]:
        assert q["explanation"] not in bank_text  # explanations are sealed with the right answer
        right = q["answer"]
        shipped = bank.question(q["id"])
        if shipped.graded:  # no key at all: no hash, no sealed explanation, no hint, nothing to test against
            assert shipped.answers == [] and shipped.hint == "" and shipped.points > 0
            assert not shipped.is_correct(bank.salt, right)
        else:
            assert shipped.is_correct(bank.salt, right) and shipped.points == 0
        if q["kind"] == "text":
            assert f'"{right}"' not in bank_text
    # the notebooks never carry the key either
    nb = (ROOT / "notebooks" / chapter / f"{chapter}.ipynb").read_text()
    for q in source["questions"]:
        assert q["explanation"][:60] not in nb


def test_normalize_accepts_natural_spellings():
    assert normalize("text", " (12, 4, 1) ") == normalize("text", "12,4,1") == "12,4,1"
    assert normalize("many", [1, 0, 1]) == "0,1"
    with pytest.raises(TypeError):
        normalize("mc", "2")
    with pytest.raises(ValueError):
        normalize("essay", "x")


def test_compile_rejects_bad_sources():
    with pytest.raises(ValueError, match="no 'answer'"):
        compile_bank({"chapter": "x", "questions": [{"id": "q1", "kind": "mc", "text": "t", "explanation": "e"}]}, "s")
    with pytest.raises(ValueError, match="not an index"):
        compile_bank({"chapter": "x", "questions": [{"id": "q1", "kind": "mc", "text": "t", "explanation": "e",
                                                     "options": ["a"], "answer": 3}]}, "s")
    with pytest.raises(ValueError, match="duplicate"):
        q = {"id": "q1", "kind": "text", "text": "t", "explanation": "e", "answer": "1"}
        compile_bank({"chapter": "x", "questions": [q, q]}, "s")
    with pytest.raises(ValueError, match="mode must be one of"):
        compile_bank({"chapter": "x", "questions": [dict(q, mode="secret")]}, "s")
    with pytest.raises(ValueError, match="practice question carries no points"):
        compile_bank({"chapter": "x", "questions": [dict(q, mode="practice", points=2)]}, "s")


def test_graded_is_the_default_mode_and_ships_no_key():
    q = {"id": "q1", "kind": "text", "text": "t", "explanation": "because", "answer": "42", "hint": "think"}
    compiled = compile_bank({"chapter": "x", "questions": [q]}, "s")["questions"][0]
    assert compiled["mode"] == "graded" and compiled["answers"] == [] and compiled["hint"] == ""
    assert "42" not in json.dumps(compiled) and "because" not in json.dumps(compiled)


def test_practice_widget_checks_at_once_and_counts_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import ipywidgets as w

    from ptinternals.quiz.widget import _widget_question

    bank = load_bank("strides")
    q2 = bank.question("q2")  # practice mc, right answer is option 1
    assert not q2.graded
    box = _widget_question(bank, q2, w)
    radio, button, feedback = box.children[1], box.children[2].children[0], box.children[3]
    radio.value = 0
    button.click()
    assert "Not quite" in feedback.value
    radio.value = 1
    button.click()
    assert "Correct" in feedback.value and "no points" in feedback.value
    recorded = read_answers(answers_path("strides"))
    assert [a["answer"] for a in recorded["q2"]] == ["0", "1"]
    grade = grade_answers(bank, answers_path("strides"), KEY)
    assert grade.score == 0 and grade.answered == 0  # practice is not graded


def test_practice_text_question_widget(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import ipywidgets as w

    from ptinternals.quiz.widget import _widget_question

    bank = load_bank("strides")
    box = _widget_question(bank, bank.question("q1"), w)
    box.children[1].value = "(1, 12, 4)"
    box.children[2].children[0].click()
    assert "Correct" in box.children[3].value


def _graded_click(bank, qid, value):
    import ipywidgets as w

    from ptinternals.quiz.widget import _widget_question

    box = _widget_question(bank, bank.question(qid), w)
    box.children[1].value = value
    box.children[2].children[0].click()
    return box.children[3].value


def test_graded_widget_records_without_a_verdict_where_there_is_no_key(tmp_path, monkeypatch):
    """The student edition: no key anywhere, so the widget records and says nothing about right or wrong."""
    from ptinternals.quiz import widget

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(widget, "_KEYS", {"strides": None})
    bank = load_bank("strides")
    assert bank.question("q3").graded
    wrong, right = _graded_click(bank, "q3", "5, 1, 1"), _graded_click(bank, "q3", "5, 0, 1")
    for text in (wrong, right):
        assert "Recorded" in text and "Correct" not in text and "Not quite" not in text and "right" not in text.lower()
    grade = grade_answers(bank, answers_path("strides"), KEY)
    assert grade.answered == 1 and grade.score == 1  # the last answer counts
    assert "scored when your notebook is graded" in _progress(bank, monkeypatch)


def _progress(bank, monkeypatch):
    from ptinternals.quiz import answers

    def no_key(chapter, source=None):
        raise FileNotFoundError("no key here")

    monkeypatch.setattr(answers, "load_answer_key", no_key)
    return answers.progress(bank, answers_path("strides"))


def test_graded_widget_says_right_or_wrong_in_the_full_repository(tmp_path, monkeypatch):
    """Self-study: the repository holds the instructor's key, so the widget may use it (labelled)."""
    from ptinternals.quiz import widget

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PTINTERNALS_REPO", str(ROOT))
    monkeypatch.setattr(widget, "_KEYS", {})
    bank = load_bank("strides")
    assert "Self-study" in _graded_click(bank, "q3", "5, 1, 1") and "not right" in _graded_click(bank, "q3", "5,1,1")
    assert "Self-study" in _graded_click(bank, "q3", "(5, 0, 1)")


def test_graded_questions_score_the_last_answer_against_the_key(tmp_path):
    bank = load_bank("strides")
    for answer in ["5,1,1", "5,0,1"]:  # wrong first, then right: the last counts
        record_answer("strides", "q3", "text", answer, folder=tmp_path)
    for answer in [2, 0]:  # right first (q4's answer is 2), then wrong
        record_answer("strides", "q4", "mc", answer, folder=tmp_path)
    record_answer("strides", "q1", "text", "1, 12, 4", folder=tmp_path)  # practice: right, worth nothing
    grade = grade_answers(bank, answers_path("strides", tmp_path), KEY)
    assert grade.score == 1 and grade.answered == 2 and grade.max_score == len(bank.graded_questions)
    text = grade.summary()
    assert "q3: right" in text and "q4: wrong" in text and "q7: not answered" in text
    assert KEY["q4"].explanation in text  # the feedback explains, after grading


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": 99}), json.dumps([1, 2]),
                                     json.dumps({"format": 1, "answers": {"q1": "oops"}}), "x" * (2 << 20)])
def test_damaged_answers_files_read_as_no_answers(tmp_path, content):
    path = tmp_path / "strides.answers.json"
    path.write_text(content)
    grade = grade_answers(load_bank("strides"), path, KEY)
    assert grade.score == 0


def test_record_is_atomic_and_keeps_earlier_answers(tmp_path):
    for a in ["0", "1", "2"]:
        record_answer("strides", "q4", "mc", int(a), folder=tmp_path)
    files = os.listdir(tmp_path)
    assert files == ["strides.answers.json"]  # no temporary file left behind
    assert [a["answer"] for a in read_answers(tmp_path / files[0])["q4"]] == ["0", "1", "2"]


def test_static_quiz_is_self_contained(monkeypatch):
    monkeypatch.setenv("PTINTERNALS_STATIC_BOOK", "1")
    monkeypatch.setenv("PTINTERNALS_REPO", str(ROOT))
    from ptinternals.quiz.widget import show_quiz

    html = show_quiz("strides", "q1", "q2")._repr_html_()
    assert "<script" in html and "cdn.jsdelivr" not in html and "http" not in html.split("<style>")[0]
    assert "content_root" in html  # MathJax is loaded from the book itself if a question needs it


def test_static_book_shows_graded_questions_without_their_answer(monkeypatch):
    import base64

    monkeypatch.setenv("PTINTERNALS_STATIC_BOOK", "1")
    monkeypatch.setenv("PTINTERNALS_REPO", str(ROOT))
    from ptinternals.quiz.widget import show_quiz

    html = show_quiz("strides", "q2", "q3", "q4")._repr_html_()  # practice, graded, graded
    assert html.index('display:none">') < html.index("graded-quiz") and "expand(8, 3, 5)" in html  # order kept
    source = yaml.safe_load(source_path("strides", ROOT).read_text())
    page = html + "".join(base64.b64decode(chunk).decode(errors="ignore")
                          for chunk in __import__("re").findall(r'display:none">([A-Za-z0-9+/=]+)<', html))
    for q in source["questions"]:
        if q["id"] in ("q3", "q4"):
            assert q["explanation"][:40] not in page and q["hint"][:40] not in page
    assert "5, 0, 1" not in page and "Graded question" in html
