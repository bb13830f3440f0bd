"""The shipped Slurm job array, run on a real Slurm (slurmctld + slurmd + munge on localhost) into a real
PostgreSQL gradebook.

`autograder/slurm/grade-array.sbatch` is submitted unchanged from the repository, with only the overrides
book/instructors.md documents (workers, memory per CPU). Three array tasks grade one assignment's four
submissions at once; one task is cancelled midway; the same sbatch line submitted again completes the
class. Every submission is graded exactly once over the two runs, by the task whose shard holds it, and
the scores are those a single machine gives (test_classroom.py's EXPECTED, which
test_two_workers_exact_scores_then_rerun_is_a_no_op checks on one machine).
"""
import json
import re
import sys
import time
from pathlib import Path

import pytest

from ptinternals.grading.classroom import shard
from ptinternals.grading.cli import main as ptgrade

from . import local_slurm
from .conftest import _Root, add_submission, make_course
from .test_classroom import CLASS, EXPECTED, exported

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "autograder" / "slurm" / "grade-array.sbatch"
STUDENTS = ["s0", "s1", "s2", "s6"]  # fast to grade (s4's endless loop waits out a time limit)
TASKS = 3  # shards: 0/3 = s0, s6 (the task cancelled midway); 1/3 = s1; 2/3 = s2
# The documented overrides: one worker per task (2 cores for 3 tasks here) and memory this node has.
OVERRIDES = {"PTGRADE_WORKERS": "1", "SBATCH_MEM_PER_CPU": "1G"}


@pytest.fixture(scope="module")
def slurm():
    why = local_slurm.missing()
    if why:
        pytest.skip(why)
    cluster = local_slurm.LocalSlurm(cpus=2 * TASKS, memory_mb=2048 * TASKS).start()
    yield cluster
    cluster.stop()


def new_course(tmp_path: Path) -> Path:
    root = make_course(tmp_path / "course")
    for student in STUDENTS:
        nb, answers, _ = CLASS[student]
        add_submission(root, student, nb(), answers=answers)
    (root / ".venv").symlink_to(Path(sys.prefix))  # the course repository's venv, as on a shared filesystem
    return root


def job_env(db: str, **extra: str) -> dict:
    return {"ASSIGNMENT": "strides", "PTGRADE_DB_URL": db, **OVERRIDES, **extra}


def task_log(root: Path, job: str, task: int) -> str:
    path = root / "autograder" / f"slurm-{job}_{task}.log"
    return path.read_text(errors="replace") if path.exists() else f"(no log at {path})"


def to_grade(log: str) -> list[str]:
    """The submissions `ptgrade doctor` said this task would grade."""
    m = re.search(r"submissions\s+\d+ of strides; this shard \d+, to grade (\d+)(?:: (.*))?", log)
    assert m, f"no doctor report in the task's log:\n{log[-3000:]}"
    return [s.strip() for s in (m.group(2) or "").split(",") if s.strip()][: int(m.group(1))]


def graded_count(log: str) -> int:
    m = re.search(r"graded (\d+) of \d+ submissions", log)
    return int(m.group(1)) if m else 0


def final_reports(root: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in (root / "autograder" / "reports").glob("*/strides.json")}


def test_job_array_grades_the_class_once_survives_a_cancelled_task(slurm, postgres, tmp_path):
    root = new_course(tmp_path)
    shards = {k: shard(STUDENTS, f"{k}/{TASKS}") for k in range(TASKS)}
    with _Root(root):
        assert ptgrade(["release", "strides", "--db", postgres]) == 0  # once, before the array

    # ---- run 1: three tasks at once; task 1 is cancelled once it has graded one of its two submissions
    t0 = time.perf_counter()
    job = slurm.sbatch(f"--array=0-{TASKS - 1}", str(TEMPLATE), env=job_env(postgres), cwd=root)
    victim = 0
    first, second = shards[victim]
    reports = root / "autograder" / "reports"
    deadline = time.monotonic() + 600
    while not (reports / first / "strides.json").exists():
        assert time.monotonic() < deadline, f"task {victim} never finished {first}:\n{task_log(root, job, victim)}"
        time.sleep(0.2)
    slurm.slurm("scancel", f"{job}_{victim}")
    tasks = slurm.wait(job)
    run1 = time.perf_counter() - t0
    logs = {k: task_log(root, job, k) for k in range(TASKS)}
    assert tasks[victim]["JobState"] == "CANCELLED", (tasks[victim], logs[victim])
    assert not (reports / second / "strides.json").exists(), "the task finished before it was cancelled: proves nothing"
    for k in set(shards) - {victim}:
        assert tasks[k]["JobState"] == "COMPLETED" and tasks[k]["ExitCode"] == "0:0", (tasks[k], logs[k])
        assert graded_count(logs[k]) == len(shards[k]), logs[k]
    for k in shards:  # each task set out to grade exactly its own shard, and the shards cover the class
        assert to_grade(logs[k]) == shards[k], logs[k]
        assert f"shard (--shard auto)  {k}/{TASKS}" in logs[k] and "reachable" in logs[k]
    before = {s: (reports / s / "strides.json").stat() for s in final_reports(root)}
    assert sorted(before) == sorted(set(STUDENTS) - {second})

    # ---- run 2: the same sbatch line completes the class, grading only what the cancelled task left
    t0 = time.perf_counter()
    again = slurm.sbatch(f"--array=0-{TASKS - 1}", str(TEMPLATE), env=job_env(postgres), cwd=root)
    tasks = slurm.wait(again)
    run2 = time.perf_counter() - t0
    logs = {k: task_log(root, again, k) for k in range(TASKS)}
    for k in shards:
        assert tasks[k]["JobState"] == "COMPLETED" and tasks[k]["ExitCode"] == "0:0", (tasks[k], logs[k])
        assert to_grade(logs[k]) == ([second] if k == victim else []), logs[k]
    assert graded_count(logs[victim]) == 1
    print(f"\n{len(STUDENTS)} submissions, {TASKS} array tasks: run 1 {run1:.0f} s (task {victim} cancelled), "
          f"run 2 {run2:.0f} s")

    # ---- every submission graded once, by the task whose shard holds it, with single-machine scores
    reports_now = final_reports(root)
    assert sorted(reports_now) == sorted(STUDENTS)
    for s, stat in before.items():  # nothing graded in run 1 was graded again
        now = (reports / s / "strides.json").stat()
        assert (now.st_ino, now.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns), s
    for k, students in shards.items():
        for s in students:
            by = reports_now[s]["graded_by"]["task"]
            assert by.startswith(f"array job {again if s == second else job}, task {k} "), (s, by)
    assert exported(root, postgres) == {s: EXPECTED[s] for s in STUDENTS}
    assert not (root / "autograder" / "gradebook.db").exists()  # every task wrote to PostgreSQL


def test_template_fails_clearly_without_venv_or_database(slurm, tmp_path):
    """A task that cannot reach the venv or the gradebook stops at once, with exit status 3 and the reason."""
    no_venv = make_course(tmp_path / "no-venv")
    no_db = new_course(tmp_path / "no-db")
    unreachable = "postgresql://grader@/course?host=/nonexistent&port=5"
    jobs = {"venv": (no_venv, slurm.sbatch("--array=0", str(TEMPLATE), env=job_env(unreachable), cwd=no_venv)),
            "db": (no_db, slurm.sbatch("--array=0", str(TEMPLATE), env=job_env(unreachable), cwd=no_db))}
    for what, (root, job) in jobs.items():
        task = slurm.wait(job, timeout_s=300)[0]
        log = task_log(root, job, 0)
        assert task["JobState"] == "FAILED" and task["ExitCode"] == "3:0", (what, task, log)
        if what == "venv":
            assert "no .venv/bin/ptgrade in" in log and "filesystem this node mounts" in log, log
        else:
            assert "gradebook" in log and "UNREACHABLE" in log and "/nonexistent" in log, log
            assert "cannot grade" in log and not (root / "autograder" / "reports").exists()
