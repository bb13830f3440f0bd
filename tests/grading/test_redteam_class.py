"""Red team, a hostile class through ``ptgrade``: one worker, harmful submissions between honest ones.

Every honest student (a victim graded right after a harmful one) gets exact marks, every hostile one what a sound
grader gives it, the class finishes within a bounded time, a submission that could not be graded is exported as
"not graded" (no score, a reason) and listed by ``summary``, and feedback for several students works.
"""
import csv
import os
import time

import pytest

from ptinternals.grading.cli import main as ptgrade

from .conftest import add_submission, submission
from .redteam import body, needs_bwrap
from .test_redteam_output import STORAGE_INDEX_TAIL, TAMPER

pytestmark = [pytest.mark.slow, needs_bwrap]

FULL = 14.0
SUBMISSION_S = 90  # --submission-time-limit: the bound on any one submission
HANG = body("""
    import signal, time
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    while True:
        try:
            time.sleep(1)
        except BaseException:
            pass
    """)


def tamper(kind: str) -> str:
    return body(f"""
        import os
        R = "/sandbox/out/strides.contiguous_strides.result.json"
        def tamper():
            if os.path.lexists(R) and not os.path.exists(R + '.done'):
                open(R + '.done', 'w').close()
                {TAMPER[kind]}
        """) + STORAGE_INDEX_TAIL


CLASS = {  # student -> (notebook, expected score or None for "not graded")
    "a_victim": (lambda: submission(), FULL),
    "b_fifo_in_the_output": (lambda: submission({"storage_index_code": tamper("fifo")}), FULL - 1),
    "c_victim": (lambda: submission(), FULL),
    "d_every_cell_hangs": (lambda: submission({gid: HANG for gid in (
        "contiguous_strides_code", "storage_index_code", "is_contiguous_code", "view_strides_code",
        "expand_strides_code", "slice_view_code", "sliding_windows_code", "im2col_code")}), 0.0),
    "e_victim": (lambda: submission(), FULL),
    "f_link_to_dev_zero": (lambda: submission({"storage_index_code": tamper("link_to_dev_zero")}), FULL - 1),
    "g_calls_unfold": (lambda: submission({"sliding_windows_code": "def sliding_windows(x, size, step):\n"
                                                                   "    return x.unfold(-1, size, step)\n"}), FULL - 2),
    "h_fills_tmp": (lambda: submission({"contiguous_strides_code": body("""
        def contiguous_strides(shape):
            with open("/tmp/fill", "wb") as f:
                for _ in range(3000):
                    f.write(b"x" * (1 << 20))
        """)}), FULL - 1 - 3),  # view_strides builds on contiguous_strides (tests/grading/test_classroom.py)
    "i_victim": (lambda: submission(), FULL),
    "j_link_in_the_submission": (lambda: submission(), None),
}


@pytest.fixture(scope="module")
def hostile_class(module_course):
    root = module_course
    for student, (nb, _) in CLASS.items():
        dest = add_submission(root, student, nb())
        if student == "j_link_in_the_submission":
            os.symlink("/etc/passwd", dest / "strides.answers.json")
    t0 = time.perf_counter()
    status = ptgrade(["autograde", "strides", "-j", "1", "--quiet", "--submission-time-limit", str(SUBMISSION_S)])
    wall = time.perf_counter() - t0
    print(f"\nhostile class: {len(CLASS)} submissions, 1 worker, {wall:.0f} s")
    return root, status, wall


def exported(root):
    assert ptgrade(["export", "--to", str(root / "grades.csv")]) == 0
    with open(root / "grades.csv") as f:
        return {row["student_id"]: row for row in csv.DictReader(f)}


def test_scores_are_what_a_sound_grader_gives(hostile_class):
    root, status, _ = hostile_class
    assert status == 1  # one submission could not be graded: said by the exit status
    rows = exported(root)
    for student, (_, expected) in CLASS.items():
        row = rows[student]
        if expected is None:
            assert row["status"] == "not graded" and row["score"] == "" and "link" in row["reason"], row
        else:
            assert row["status"] == "graded" and float(row["score"]) == expected, (student, row)


def test_the_class_finishes_in_bounded_time(hostile_class):
    _, _, wall = hostile_class
    honest = 5 * 30  # about 20 s each on a 2-core machine
    bound = honest + 5 * 40 + SUBMISSION_S + 60  # each other hostile one at most a normal grading, the hang one capped
    assert wall < bound, f"the class took {wall:.0f} s (bound {bound} s)"


def test_summary_lists_what_was_not_graded(hostile_class, capsys):
    root, _, _ = hostile_class
    assert ptgrade(["summary", "strides"]) == 0
    out = capsys.readouterr().out
    assert "NOT GRADED (1" in out and "j_link_in_the_submission" in out
    assert "flagged events" in out and "d_every_cell_hangs" in out


def test_feedback_for_several_students(hostile_class):
    root, _, _ = hostile_class
    assert ptgrade(["feedback", "strides", "--student", "a_victim", "--student", "b_fifo_in_the_output"]) == 0
    for student in ("a_victim", "b_fifo_in_the_output"):
        html = (root / "autograder" / "feedback" / student / "strides" / "strides.html").read_text()
        assert "BEGIN HIDDEN TESTS" not in html
    assert "refused" in (root / "autograder" / "feedback" / "b_fifo_in_the_output" / "strides" / "strides.html").read_text()
