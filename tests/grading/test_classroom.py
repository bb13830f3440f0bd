"""Class scale: parallel workers, a PostgreSQL gradebook, and a grader killed midway then rerun.

Every run must end with the same, exact gradebook: the scores below are what each simulated
submission deserves, whatever the number of workers, the database, or interruptions.
"""
import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ptinternals.grading.cli import main as ptgrade

from ..strides.buggy import BUGGY
from .conftest import _Root, add_submission, make_course, submission
from .test_autograde import QUIZ, RIGHT

pytestmark = pytest.mark.slow

LOOP = "def contiguous_strides(shape):\n    while True:\n        pass\n"
CLASS = {  # student -> (notebook, quiz answers, expected score)
    "s0": (lambda: submission(), None, 14.0),
    "s1": (lambda: submission(student_version=True), None, 0.0),
    "s2": (lambda: submission({"view_strides_code": BUGGY["strides.view_strides"]["ignores_size_one_dims"][0]}), None, 11.0),
    "s3": (lambda: submission(), RIGHT, 14.0 + QUIZ.total_points),  # every graded quiz answer right
    # an infinite loop in contiguous_strides also sinks view_strides, whose solution calls contiguous_strides (empty tensors)
    "s4": (lambda: submission({"contiguous_strides_code": LOOP}), None, 10.0),
    "s5": (lambda: submission(delete=("slice_view_tests",)), None, 14.0),
    "s6": (lambda: submission({"im2col_code": BUGGY["strides.im2col"]["assumes_contiguous"][0]}), None, 12.0),
    "s7": (lambda: submission(), None, 14.0),
}
EXPECTED = {s: v[2] for s, v in CLASS.items()}


def new_course(tmp_path_factory) -> Path:
    root = make_course(tmp_path_factory.mktemp("class") / "course")
    for student, (nb, answers, _) in CLASS.items():
        add_submission(root, student, nb(), answers=answers)
    return root


def exported(root: Path, db: str | None = None) -> dict:
    with _Root(root):
        args = ["export", "--to", str(root / "grades.csv")] + (["--db", db] if db else [])
        assert ptgrade(args) == 0
    with open(root / "grades.csv") as f:
        return {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}


def grade_in_subprocess(root: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PTGRADE_ROOT=str(root))
    return subprocess.Popen([sys.executable, "-m", "ptinternals.grading.cli", "autograde", "strides", "--quiet", *args],
                            env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def kill_after_some(proc: subprocess.Popen, root: Path, n_done: int, timeout_s: float = 300) -> int:
    """SIGKILL the grader (its whole process group) once ``n_done`` submissions are final."""
    reports = root / "autograder" / "reports"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list(reports.glob("*/strides.json"))) >= n_done:
            break
        time.sleep(0.2)
    if proc.poll() is not None:
        raise AssertionError(f"the grader exited by itself (status {proc.returncode}):\n{proc.stdout.read()[-3000:]}")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return len(list(reports.glob("*/strides.json")))


def test_two_workers_exact_scores_then_rerun_is_a_no_op(tmp_path_factory, capsys):
    root = new_course(tmp_path_factory)
    with _Root(root):
        t0 = time.perf_counter()
        assert ptgrade(["autograde", "strides", "-j", "2", "--quiet"]) == 0
        print(f"\n8 submissions, 2 workers, sqlite: {time.perf_counter() - t0:.1f} s")
        assert exported(root) == EXPECTED
        capsys.readouterr()
        assert ptgrade(["autograde", "strides", "-j", "2", "--quiet"]) == 0
        assert "nothing to grade" in capsys.readouterr().out
    assert exported(root) == EXPECTED


def test_killed_midway_then_rerun_gives_the_same_gradebook(tmp_path_factory):
    root = new_course(tmp_path_factory)
    proc = grade_in_subprocess(root, "-j", "2")
    done = kill_after_some(proc, root, 3)
    assert done < len(CLASS), "the grader finished before it could be killed: the test proves nothing"
    rerun = grade_in_subprocess(root, "-j", "2")
    out, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, out
    assert f"{done} submissions already graded" in out
    assert exported(root) == EXPECTED


# ---- PostgreSQL (the `postgres` fixture is in conftest.py) -------------------------------------------
@pytest.mark.postgres
def test_concurrent_grading_against_postgres_killed_and_rerun(tmp_path_factory, postgres):
    root = new_course(tmp_path_factory)
    proc = grade_in_subprocess(root, "-j", "2", "--db", postgres)
    done = kill_after_some(proc, root, 2)
    assert done < len(CLASS)
    rerun = grade_in_subprocess(root, "-j", "2", "--db", postgres)
    out, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, out
    assert exported(root, postgres) == EXPECTED
    assert not (root / "autograder" / "gradebook.db").exists()  # everything went to PostgreSQL


def test_only_gradebook_hiccups_are_retried():
    from ptinternals.grading.classroom import _transient_db_error

    for log in ("sqlite3.OperationalError: database is locked",
                "psycopg2.errors.DeadlockDetected: deadlock detected",
                "could not serialize access due to concurrent update",
                "There was an error accessing the nbgrader database. This may occur if you recently upgraded"):
        assert _transient_db_error(log), log
    for log in ("", "NameError: name 'x' is not defined", "the cell is_contiguous_tests is locked and was edited"):
        assert not _transient_db_error(log), log
