"""The instructor's path end to end, through nbgrader and `ptgrade`: exact scores, feedback, export."""
import csv
import json
import time

import nbformat
import pytest

from ptinternals.grading.cli import main as ptgrade
from ptinternals.quiz.bank import load_answer_key, load_bank, source_path

from ..strides.buggy import BUGGY
from .conftest import add_submission, submission

pytestmark = pytest.mark.slow

EXERCISE_POINTS = 14.0
QUIZ = load_bank("strides")
RIGHT = {"q1": "1,12,4", "q2": "1", "q3": "5,0,1", "q4": "2", "q5": "0,1", "q6": "10", "q7": "2", "q8": "1",
         "q9": "96", "q10": "0"}


def test_right_answers_key_matches_the_bank():
    from ptinternals.grading.testing import ROOT

    key = load_answer_key("strides", source_path("strides", ROOT))
    assert all(a in key[q].accepted for q, a in RIGHT.items())
    assert {q.id for q in QUIZ.graded_questions} == {"q3", "q4", "q5", "q7", "q8", "q9", "q10"}


def _scores(root) -> dict:
    assert ptgrade(["export", "--to", str(root / "grades.csv")]) == 0
    with open(root / "grades.csv") as f:
        return {row["student_id"]: float(row["score"]) for row in csv.DictReader(f)}


@pytest.fixture(scope="module")
def graded_course(module_course):
    course = module_course
    view_bug = BUGGY["strides.view_strides"]["ignores_size_one_dims"][0]
    # 3 wrong graded answers (q1 and q2 are practice: wrong there costs nothing)
    half_quiz = dict(RIGHT, q1="12,4,1", q2="0", q3="5,1,1", q4="0", q5="0")
    add_submission(course, "ada", submission(), answers=RIGHT)
    add_submission(course, "bob", submission(student_version=True))
    add_submission(course, "cyd", submission({"view_strides_code": view_bug}), answers=RIGHT)
    add_submission(course, "dee", submission(), answers=half_quiz)
    deleted = submission(delete=("storage_index_tests",))
    add_submission(course, "eve", deleted, answers={})
    edited = submission()
    for cell in edited.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "is_contiguous_tests":
            cell.source = "pass  # the student replaced the check"
    faked = submission({"contiguous_strides_code": "def contiguous_strides(shape):\n    return (0,) * len(shape)\n"})
    for cell in faked.cells:  # a fake "passed" output saved in the test cell must not count
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "contiguous_strides_tests":
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="\u2713 all cases passed\n")]
    add_submission(course, "fay", edited)
    add_submission(course, "gus", faked)
    t0 = time.perf_counter()
    assert ptgrade(["autograde", "strides", "-j", "2", "--quiet"]) == 0
    elapsed = time.perf_counter() - t0
    print(f"\nautograded 7 submissions with 2 workers in {elapsed:.1f} s")
    return course


def test_scores_are_exact(graded_course):
    scores = _scores(graded_course)
    full = EXERCISE_POINTS + QUIZ.total_points
    assert scores["ada"] == full  # everything right
    assert scores["bob"] == 0  # the unmodified student notebook
    assert scores["cyd"] == full - 3  # view ignoring size-1 dims loses exactly Exercise strides.view_strides's 3 points
    assert scores["dee"] == full - 3  # three wrong graded quiz answers (two wrong practice ones cost nothing)
    assert scores["eve"] == EXERCISE_POINTS  # deleted test cell: restored and still graded; no quiz answers
    assert scores["fay"] == EXERCISE_POINTS  # edited test cell: restored by nbgrader, graded for real
    assert scores["gus"] == EXERCISE_POINTS - 1  # a fake "passed" output does not count


def test_reports_say_what_happened(graded_course):
    report = json.loads((graded_course / "autograder" / "reports" / "eve" / "strides.json").read_text())
    assert any("storage_index_tests" in e and "restored" in e for e in report["events"])
    cyd = json.loads((graded_course / "autograder" / "reports" / "cyd" / "strides.json").read_text())
    failed = [e for e in cyd["exercises"] if not e["passed"]]
    assert [e["id"] for e in failed] == ["strides.view_strides"]
    assert "size-1 dims never end a contiguous chunk" in failed[0]["message"]
    assert cyd["isolation"] in ("bwrap", "process")


def test_feedback_hides_hidden_tests_and_solutions(graded_course):
    assert ptgrade(["feedback", "strides"]) == 0
    html = (graded_course / "autograder" / "feedback" / "bob" / "strides" / "strides.html").read_text()
    assert "hidden=True" not in html and "BEGIN HIDDEN TESTS" not in html
    assert "BEGIN SOLUTION" not in html and "running *= max(size, 1)" not in html
    assert "is not implemented yet" in html  # the trusted result is what the student reads
    cyd = (graded_course / "autograder" / "feedback" / "cyd" / "strides" / "strides.html").read_text()
    assert "likely cause" in cyd


def test_rerun_grades_nothing_and_changes_nothing(graded_course, capsys):
    before = _scores(graded_course)
    assert ptgrade(["autograde", "strides", "--quiet"]) == 0
    assert "nothing to grade" in capsys.readouterr().out
    assert _scores(graded_course) == before


def test_summary_lists_categories_and_histogram(graded_course, capsys):
    assert ptgrade(["summary", "strides"]) == 0
    out = capsys.readouterr().out
    assert "pass rate per exercise" in out and "not-implemented" in out and "histogram" in out
    assert (graded_course / "autograder" / "reports" / "strides-scores.png").stat().st_size > 1000
