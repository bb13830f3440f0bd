"""The JupyterHub path end to end, through nbgrader's own filesystem exchange, exactly as book/instructors.md
tells it: the instructor releases, the student fetches, answers (the quiz answers file beside the notebook)
and submits, the instructor collects; the student resubmits, the instructor collects again (the earlier
submission is kept), grades and releases feedback, and the student fetches it. Regrading a submission
collected after an earlier one was graded is test_collect_from_exchange_keeps_every_version's part.

As root the instructor and the student are two Unix users with their own homes, as on a multi-user hub
(nbgrader's exchange then checks real owners and modes); otherwise both roles are the current user.
"""
import json
import os

import nbformat
import pytest

from ptinternals.grading.classroom import Course

from ..strides.buggy import BUGGY
from .conftest import make_course, submission
from .local_hub import BIN, COURSE, LocalHub
from .test_autograde import QUIZ, RIGHT

pytestmark = [pytest.mark.slow, pytest.mark.exchange]

FULL = 14.0 + QUIZ.total_points
VIEW_BUG = BUGGY["strides.view_strides"]["ignores_size_one_dims"][0]  # costs view_strides' 3 points


@pytest.fixture(scope="module")
def hub():
    hub = LocalHub()
    try:
        hub.check()
        yield hub
    finally:
        hub.close()


def answer(notebook, replace: dict | None = None) -> None:
    """The student's work: every answer cell as in the solution, except those in ``replace`` (by grade_id)."""
    nb = nbformat.read(notebook, as_version=4)
    solved = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in submission(replace).cells}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and meta.get("grade_id") in solved:
            cell.source = solved[meta["grade_id"]]
    nbformat.write(nb, notebook)


def record_quiz(hub, folder, answers: dict) -> None:
    """Click through the quiz as the widget does: ``record_answer`` writes strides.answers.json beside the notebook."""
    script = ("import json, sys\nfrom ptinternals.quiz.answers import record_answer\n"
              "for q, (kind, a) in json.loads(sys.argv[1]).items():\n    record_answer('strides', q, kind, a)\n")
    clicks = {"mc": int, "many": lambda a: [int(i) for i in a.split(",")], "text": str}  # what each widget hands over
    given = {q: (QUIZ.question(q).kind, clicks[QUIZ.question(q).kind](a)) for q, a in answers.items()}
    hub.student.run(BIN / "python", "-c", script, json.dumps(given), cwd=folder)


def scores(course) -> dict:
    """The gradebook's totals (read in-process: `ptgrade export` is tested elsewhere and costs nbgrader's start-up)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course}/autograder/gradebook.db", COURSE) as gb:
        return {s.student_id: s.score for s in gb.assignment_submissions("strides")}


def test_release_fetch_submit_resubmit_collect_grade_feedback(hub):
    teacher, student = hub.instructor, hub.student
    course = make_course(teacher.home / "course")
    teacher.give(course)
    env = {"PTGRADE_COURSE": COURSE}  # the course id both sides name (students: in their nbgrader config)
    ptgrade = lambda *args: teacher.run(BIN / "ptgrade", *args, cwd=course, env=env)  # noqa: E731
    nbgrader = lambda *args: student.run(BIN / "nbgrader", *args)  # noqa: E731
    name = student.name
    submitted = course / "autograder" / "submitted" / name / "strides"

    # ---- release; the student fetches, works, answers the quiz (beside the notebook), submits
    ptgrade("release", "strides", "--exchange")
    assert (hub.exchange / COURSE / "outbound" / "strides" / "strides.ipynb").is_file()
    nbgrader("fetch_assignment", "strides")
    work = student.home / "strides"
    answer(work / "strides.ipynb", {"view_strides_code": VIEW_BUG})
    record_quiz(hub, work, RIGHT)
    assert (work / "strides.answers.json").is_file()
    nbgrader("submit", "strides")
    out = ptgrade("collect", "strides", "--exchange")
    assert (submitted / "strides.ipynb").is_file() and (submitted / "strides.answers.json").is_file(), out
    if hub.distinct_users:
        assert os.stat(submitted / "strides.ipynb").st_uid == teacher.uid  # the instructor's own copy

    # ---- the student fixes view_strides and submits again: collected, while the first one is kept
    answer(work / "strides.ipynb")
    nbgrader("submit", "strides")
    assert len(list((hub.exchange / COURSE / "inbound").iterdir())) == 2  # the exchange keeps both
    out = ptgrade("collect", "strides", "--exchange")
    assert "Kept the earlier submission" in out, out
    (kept,) = (course / "autograder" / "submitted" / "_superseded" / name).iterdir()
    sources = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source
               for c in nbformat.read(kept / "strides.ipynb", as_version=4).cells}
    assert sources["view_strides_code"] == VIEW_BUG  # the first, buggy version, with its answers file
    assert (kept / "strides.answers.json").is_file() and (submitted / "strides.answers.json").is_file()

    # ---- the newer submission is graded (quiz included: the answers file travelled) and fed back
    ptgrade("autograde", "strides", "--quiet")
    assert scores(course) == {name: FULL}
    ptgrade("feedback", "strides", "--exchange")
    nbgrader("fetch_feedback", "strides")
    (stamp,) = os.listdir(work / "feedback")  # feedback for the submission that was graded, not the first
    assert stamp == (submitted / "timestamp.txt").read_text().strip()
    html = (work / "feedback" / stamp / "strides.html").read_text()
    assert f"(Score: {FULL} / {FULL})" in html and "BEGIN HIDDEN TESTS" not in html
    print("\n" + "\n".join(f"{s:6.1f} s  {cmd}" for cmd, s in hub.timings))


def test_collect_from_exchange_keeps_every_version(tmp_path, monkeypatch):
    """nbgrader's collect deletes the older submission; the course's plugin moves it aside, under its timestamp,
    and a recollected submission counts as new even when copying kept its files' old mtimes."""
    from nbgrader.apps import NbGraderAPI
    from traitlets.config import Config

    from ptinternals.grading.nbgrader_plugin import configure

    course = make_course(tmp_path / "course")
    exchange = tmp_path / "exchange"
    inbound = exchange / COURSE / "inbound"
    inbound.mkdir(parents=True)
    monkeypatch.setenv("PTGRADE_COURSE", COURSE)
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")  # nbgrader runs alembic from PATH
    c = Config()
    configure(c, course)
    c.Exchange.root = str(exchange)
    api = NbGraderAPI(config=c)
    stamps = ["2026-12-01 10:00:00.000000 UTC", "2026-12-01 11:00:00.000000 UTC", "2026-12-01 12:00:00.000000 UTC"]
    for i, stamp in enumerate(stamps):
        sub = inbound / f"ada+strides+{stamp}+r{i}"
        sub.mkdir()
        nbformat.write(submission(), sub / "strides.ipynb")
        (sub / "strides.answers.json").write_text(json.dumps({"version": i}))
        (sub / "timestamp.txt").write_text(stamp)
        for f in sub.iterdir():  # handed in before the earlier version's grading ended: old mtimes
            os.utime(f, (1e9, 1e9))
        result = api.collect("strides", update=True)
        assert result["success"], result
        dest = course / "autograder" / "submitted" / "ada" / "strides"
        assert json.loads((dest / "strides.answers.json").read_text()) == {"version": i}
        if i == 0:  # pretend this version was graded: a final report newer than every file's mtime
            report = course / "autograder" / "reports" / "ada" / "strides.json"
            report.parent.mkdir(parents=True)
            report.write_text("{}")
            assert not Course(course).needs_grading("ada", "strides")
        else:
            assert Course(course).needs_grading("ada", "strides")
    kept = sorted((course / "autograder" / "submitted" / "_superseded" / "ada").iterdir())
    assert [p.name for p in kept] == ["strides-2026-12-01-10-00-00.000000-UTC", "strides-2026-12-01-11-00-00.000000-UTC"]
    assert [json.loads((p / "strides.answers.json").read_text()) for p in kept] == [{"version": 0}, {"version": 1}]
    assert Course(course).students_with("strides") == ["ada"]  # the kept versions are not students
