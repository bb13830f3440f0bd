"""Grading a class: many submissions, several workers (and GPUs), a gradebook that never loses a write.

Each worker is a long-lived process that calls nbgrader's API (``NbGraderAPI.autograde``) for one
submission at a time, so nbgrader's start-up is paid once per worker, not per submission. Worker
``k`` runs student code as its own uid (``sandbox.UID_BASE + k`` when grading as root) and, when
GPUs are given, sees only GPU ``gpus[k % len(gpus)]``.

Restartability: a submission counts as graded only when its report is renamed from
``<assignment>.pending.json`` to ``<assignment>.json`` *after* nbgrader has saved its grades. A grader
killed midway leaves at most a pending report; the next run grades exactly the submissions without a
final report (or whose submission is newer), with ``force`` so partial outputs are overwritten.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}$")


@dataclass
class Course:
    root: Path
    db_url: str | None = None

    @property
    def submitted(self) -> Path:
        return self.root / "autograder" / "submitted"

    @property
    def reports(self) -> Path:
        return self.root / "autograder" / "reports"

    def students_with(self, assignment: str) -> list[str]:
        if not self.submitted.exists():
            return []
        return sorted(p.name for p in self.submitted.iterdir()
                      if p.is_dir() and SAFE_ID.match(p.name) and (p / assignment).is_dir())

    def report_path(self, student: str, assignment: str, pending: bool = False) -> Path:
        return self.reports / student / f"{assignment}{'.pending' if pending else ''}.json"

    def failed_path(self, student: str, assignment: str) -> Path:
        """Why the last attempt to grade this submission failed (absent once it is graded)."""
        return self.reports / student / f"{assignment}.failed.json"

    def status(self, student: str, assignment: str) -> tuple[str, str]:
        """("graded" | "not graded" | "not submitted", reason) of one submission, from the reports."""
        failed = self.failed_path(student, assignment)
        if failed.exists():
            try:
                return "not graded", str(json.loads(failed.read_text()).get("reason", ""))[-500:]
            except ValueError:
                return "not graded", "unreadable failure record"
        if self.report_path(student, assignment).exists():
            return "graded", ""
        if (self.submitted / student / assignment).is_dir():
            return "not graded", "no trusted report yet (run ptgrade autograde)"
        return "not submitted", ""

    def needs_grading(self, student: str, assignment: str) -> bool:
        final = self.report_path(student, assignment)
        if not final.exists():
            return True
        # A (re)collected submission is newer than its report. Collecting copies files with their mtimes
        # (shutil.copytree), which may predate the report, so the change time (ctime, set when the copy is
        # made) counts too, as does the folder itself.
        sub = self.submitted / student / assignment
        newest = max(max(st.st_mtime, st.st_ctime) for st in map(os.stat, [sub, *sub.rglob("*")]))
        return newest > final.stat().st_mtime


def unsafe_entries(folder: Path, limit: int = 20) -> list[str]:
    """What in a submission folder is neither a regular file nor a folder (links, FIFOs, devices): such a
    submission is not graded (nbgrader would follow a link while copying it)."""
    import stat

    bad = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            path = Path(root) / name
            mode = path.lstat().st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                bad.append(f"{path.relative_to(folder)} ({'a link' if stat.S_ISLNK(mode) else 'not a regular file'})")
                if len(bad) >= limit:
                    return bad
    return bad


def nbgrader_config(course: Course, *, isolation: str = "auto", device: str = "auto", worker: int = 0,
                    allow_weak: bool = False, submission_s: float = 0.0):
    from traitlets.config import Config

    from .nbgrader_plugin import configure

    c = Config()
    if course.db_url:
        os.environ["PTGRADE_DB_URL"] = course.db_url
    configure(c, course.root)
    c.TrustedGrade.isolation = isolation
    c.TrustedGrade.device = device
    c.TrustedGrade.worker = worker
    c.TrustedGrade.allow_weak_isolation = allow_weak
    c.TrustedGrade.submission_s = submission_s
    c.TrustedGrade.report_dir = str(course.reports)
    c.Application.log_level = "WARN"
    return c


# ---- one worker process ----------------------------------------------------------------------------
_WORKER: dict = {}


def _init_worker(index_queue, course: Course, isolation: str, device: str, gpus: list[str], allow_weak: bool,
                 submission_s: float) -> None:
    index = index_queue.get()
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index % len(gpus)]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from ..device import use_triton_interpreter_without_gpu

    use_triton_interpreter_without_gpu()
    import warnings

    warnings.filterwarnings("ignore", module="nbgrader")  # SQLAlchemy "not in session" noise from nbgrader
    from nbgrader.apps import NbGraderAPI

    (course.root / "autograder").mkdir(parents=True, exist_ok=True)
    _WORKER.update(index=index, course=course,
                   api=NbGraderAPI(config=nbgrader_config(course, isolation=isolation, device=device, worker=index,
                                                          allow_weak=allow_weak, submission_s=submission_s)))


def _grade_one(assignment: str, student: str) -> dict:
    course: Course = _WORKER["course"]
    api = _WORKER["api"]
    t0 = time.perf_counter()
    out = {"student": student, "worker": _WORKER["index"], "success": False, "error": ""}
    unsafe = unsafe_entries(course.submitted / student / assignment)
    if unsafe:
        out["error"] = "the submission holds what the grader will not open: " + ", ".join(unsafe)
        return _record_failure(course, assignment, out, t0)
    last_error = ""
    for attempt in range(4):
        result = api.autograde(assignment, student, force=True, create=True)
        if result.get("success"):
            break
        last_error = (result.get("error") or "") + (result.get("log") or "")
        if not _transient_db_error(last_error):
            break
        time.sleep(0.5 * (attempt + 1))  # a busy gradebook: retry (autograde with force=True is idempotent)
    pending = course.report_path(student, assignment, pending=True)
    if not result.get("success"):
        out["error"] = last_error[-2000:] or "nbgrader could not autograde this submission"
        return _record_failure(course, assignment, out, t0)
    if not pending.exists():
        out["error"] = "nbgrader finished but the trusted grader wrote no report"
        return _record_failure(course, assignment, out, t0)
    report = json.loads(pending.read_text())
    if report.get("not_graded"):  # the sandbox itself could not run: not the student's zero
        out["error"] = report["not_graded"]
        pending.unlink()
        return _record_failure(course, assignment, out, t0)
    os.replace(pending, course.report_path(student, assignment))
    course.failed_path(student, assignment).unlink(missing_ok=True)
    out.update(success=True, score=report.get("score"), max_score=report.get("max_score"),
               seconds=round(time.perf_counter() - t0, 2))
    return out


# What a gradebook shared by concurrent graders answers now and then: SQLite's lock, PostgreSQL's
# serialization failures and deadlocks, and the OperationalError nbgrader reports as "an error accessing the
# nbgrader database" (seen from a Slurm array task under load). None of them is about the submission.
_TRANSIENT_DB = ("database is locked", "could not serialize", "deadlock detected",
                 "error accessing the nbgrader database", "sqlalchemy.exc.operationalerror")


def _transient_db_error(log: str) -> bool:
    text = log.lower()
    return any(marker in text for marker in _TRANSIENT_DB)


def _record_failure(course: Course, assignment: str, out: dict, t0: float) -> dict:
    """Remember why a submission could not be graded: ``export`` shows it as "not graded" (no score) and
    ``summary`` lists it; the next ``autograde`` tries it again (it has no final report)."""
    out["seconds"] = round(time.perf_counter() - t0, 2)
    path = course.failed_path(out["student"], assignment)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"student": out["student"], "assignment": assignment, "reason": out["error"][-2000:],
                               "at": time.strftime("%Y-%m-%d %H:%M:%S")}))
    os.replace(tmp, path)
    final = course.report_path(out["student"], assignment)
    final.unlink(missing_ok=True)  # an older grade of an earlier submission must not stand in for this one
    return out


# ---- the pool ------------------------------------------------------------------------------------------
def grade_class(course: Course, assignment: str, students: list[str], *, workers: int = 1, isolation: str = "auto",
                device: str = "auto", gpus: list[str] | None = None, progress: bool = True,
                allow_weak: bool = False, submission_s: float = 0.0) -> list[dict]:
    """Autograde ``students``' submissions of ``assignment`` with ``workers`` processes."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    results: list[dict] = []
    if not students:
        return results
    ctx = mp.get_context("spawn")
    index_queue = ctx.Queue()
    for i in range(workers):
        index_queue.put(i)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(students), unit="sub", desc=f"grading {assignment}", dynamic_ncols=True)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(index_queue, course, isolation, device, gpus or [], allow_weak,
                                       submission_s)) as pool:
        futures = {pool.submit(_grade_one, assignment, s): s for s in students}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                try:
                    r = f.result()
                except Exception as e:  # a worker died: the submission is reported, the class goes on
                    r = {"student": futures[f], "success": False, "error": f"worker failed: {e!r}", "seconds": 0.0}
                    _record_failure(course, assignment, r, time.perf_counter())
                results.append(r)
                if bar is not None:
                    bar.update(1)
                    if not r["success"]:
                        bar.write(f"  ! {r['student']}: not graded ({r['error'].strip().splitlines()[-1][:120] if r['error'].strip() else 'unknown error'})")
    if bar is not None:
        bar.close()
    return sorted(results, key=lambda r: r["student"])


def shard(students: list[str], spec: str | None) -> list[str]:
    """``spec`` "i/N" keeps every N-th student starting at i; "auto" takes i/N from the Slurm array task or the
    Kubernetes Indexed Job this runs in (``scheduler.placement``), or keeps everyone outside one."""
    from .scheduler import resolve_shard

    spec = resolve_shard(spec)
    if not spec:
        return students
    m = re.fullmatch(r"(\d+)/(\d+)", spec)
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
        raise ValueError(f"--shard must look like i/N with 0 <= i < N, got {spec!r}")
    i, n = int(m.group(1)), int(m.group(2))
    return [s for k, s in enumerate(sorted(students)) if k % n == i]
