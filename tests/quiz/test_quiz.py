"""Quizzes: banks hold no plain answers, widgets record first answers, grading reads them defensively."""
import json
import os
from pathlib import Path

import pytest
import yaml

from ptinternals.quiz.answers import answers_path, grade_answers, read_answers, record_answer
from ptinternals.quiz.bank import compile_bank, load_bank, normalize, source_path

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted(p.stem for p in (ROOT / "solutions" / "quizzes").glob("*.yaml"))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_bank_has_no_plain_answers_and_at_least_8_questions(chapter):
    source = yaml.safe_load(source_path(chapter, ROOT).read_text())
    bank_text = (ROOT / "src" / "ptinternals" / "quiz" / "banks" / f"{chapter}.json").read_text()
    bank = load_bank(chapter)
    assert len(bank.questions) >= 8
    for q in source["questions"]:
        assert q["explanation"] not in bank_text  # explanations are sealed with the right answer
        right = q["answer"]
        assert bank.question(q["id"]).is_correct(bank.salt, right)
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


def test_widget_click_records_and_first_answer_counts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import ipywidgets as w

    from ptinternals.quiz.widget import _widget_question

    bank = load_bank("strides")
    q2 = bank.question("q2")  # mc, right answer is option 1
    box = _widget_question(bank, q2, w)
    radio, button, feedback = box.children[1], box.children[2].children[0], box.children[3]
    radio.value = 0
    button.click()
    assert "Not quite" in feedback.value
    radio.value = 1
    button.click()
    assert "Correct" in feedback.value and "first answer is the one that counts" in feedback.value
    recorded = read_answers(answers_path("strides"))
    assert [a["answer"] for a in recorded["q2"]] == ["0", "1"]
    grade = grade_answers(bank, answers_path("strides"))
    assert grade.score == 0 and grade.answered == 1  # the first (wrong) answer counts


def test_text_question_widget(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import ipywidgets as w

    from ptinternals.quiz.widget import _widget_question

    bank = load_bank("strides")
    box = _widget_question(bank, bank.question("q1"), w)
    box.children[1].value = "(1, 12, 4)"
    box.children[2].children[0].click()
    assert "Correct" in box.children[3].value
    assert grade_answers(bank, answers_path("strides")).score == 1


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": 99}), json.dumps([1, 2]),
                                     json.dumps({"format": 1, "answers": {"q1": "oops"}}), "x" * (2 << 20)])
def test_damaged_answers_files_read_as_no_answers(tmp_path, content):
    path = tmp_path / "strides.answers.json"
    path.write_text(content)
    grade = grade_answers(load_bank("strides"), path)
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
