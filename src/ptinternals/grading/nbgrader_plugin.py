"""nbgrader stays the orchestrator (gradebook, feedback, formgrader); these preprocessors change *how*
grades are computed.

Stock ``nbgrader autograde`` runs the student's notebook, hidden tests included, in one kernel, so
the student's code can rewrite the checker. Here nbgrader's ``Execute`` step is replaced by
:class:`TrustedGrade`: no student code runs in nbgrader's process or kernel at all. Each graded
test cell gets the outcome computed by ``trusted.grade_notebook`` (sandboxed student code, checks
in this process), written as the cell's output so nbgrader's own ``SaveAutoGrades`` records it.

* :class:`RestoreDeletedCells` (sanitize step): a test cell the student deleted is put back from
  the instructor's notebook, so the exercise is still graded, and the deletion is reported.
* :class:`TrustedGrade` (autograde step): the grade of record.
* :class:`StripHiddenTests` (feedback step): hidden tests never reach the student.

``configure(c, root)`` wires all of this into an nbgrader config; ``autograder/nbgrader_config.py``
calls it, so nbgrader's own commands and ``ptgrade`` behave identically.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import nbformat
from nbgrader.plugins import CsvExportPlugin
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool, Float, Int, Unicode

EVENTS_KEY = "ptgrade_events"
HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS[ \t]*\n?", re.S | re.M)


def _gid(cell) -> str | None:
    return (cell.get("metadata", {}).get("nbgrader") or {}).get("grade_id")


def _is_grade(cell) -> bool:
    return bool((cell.get("metadata", {}).get("nbgrader") or {}).get("grade"))


class _CoursePreprocessor(NbGraderPreprocessor):
    course_root = Unicode("", help="the course repository (holds solutions/ and autograder/)").tag(config=True)

    def _source_notebook(self, assignment: str, notebook: str):
        """The instructor's copy of a notebook (solutions/<assignment>/<notebook>.ipynb), or None."""
        path = Path(self.course_root or ".") / "solutions" / assignment / f"{notebook}.ipynb"
        return nbformat.read(path, as_version=4) if path.exists() else None


class RestoreDeletedCells(_CoursePreprocessor):
    """Put back grade cells that are missing from a submission (and say so)."""

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        source = self._source_notebook(info["assignment"], info["notebook"])
        if source is None:
            return nb, resources
        present = {_gid(c) for c in nb.cells}
        # Kept in the notebook's metadata: the autograde pass (a separate nbconvert run) reads it back.
        events = nb.metadata.setdefault(EVENTS_KEY, [])
        last_index = -1  # position in nb after which the next restored cell goes
        for src in source.cells:
            gid = _gid(src)
            if gid in present:
                last_index = next(i for i, c in enumerate(nb.cells) if _gid(c) == gid)
                continue
            if gid and _is_grade(src):
                restored = nbformat.from_dict(json.loads(json.dumps(src)))
                restored.outputs = [] if restored.cell_type == "code" else restored.get("outputs", [])
                nb.cells.insert(last_index + 1, restored)
                last_index += 1
                events.append(f"test cell {gid} had been deleted; it was restored from the instructor's copy")
                self.log.warning("Restored deleted test cell %s", gid)
        return nb, resources


class TrustedGrade(_CoursePreprocessor):
    """Grade through the sandbox and write each test cell's trusted outcome as its output."""

    isolation = Unicode(os.environ.get("PTGRADE_ISOLATION", "auto"),
                        help="auto | bwrap | process: how student code is isolated").tag(config=True)
    device = Unicode(os.environ.get("PTGRADE_DEVICE", "auto"), help="auto | cpu | cuda").tag(config=True)
    worker = Int(int(os.environ.get("PTGRADE_WORKER", "0")), help="worker index (picks the sandbox uid)").tag(config=True)
    report_dir = Unicode(os.environ.get("PTGRADE_REPORT_DIR", ""), help="where per-submission reports go").tag(config=True)
    allow_weak_isolation = Bool(os.environ.get("PTGRADE_ALLOW_WEAK_ISOLATION", "") == "1",
                                help="record grades under process isolation (no bubblewrap)").tag(config=True)
    submission_s = Float(float(os.environ.get("PTGRADE_SUBMISSION_S", "0")),
                         help="total time one submission may take (0: derived from its exercises' limits)").tag(config=True)

    def preprocess(self, nb, resources):
        from ..device import pick_device
        from .exercise import load_chapter
        from .isolation import require_strong_isolation, resolve_isolation
        from .sandbox import SandboxConfig
        from .trusted import grade_notebook

        info = resources["nbgrader"]
        folder = resources.get("metadata", {}).get("path") or "."
        events = list(nb.metadata.pop(EVENTS_KEY, []))
        try:
            chapter = load_chapter(info["assignment"])
        except (KeyError, ImportError) as e:
            return self._unknown(nb, resources, f"assignment {info['assignment']!r} has no trusted grader: {e}")
        device = pick_device(None if self.device == "auto" else self.device)
        mode, why = resolve_isolation(self.isolation, device)
        require_strong_isolation(mode, why, self.allow_weak_isolation)  # raises: this submission is not graded
        config = SandboxConfig(isolation=self.isolation, device=device, worker=self.worker)
        config.limits.total_s = self.submission_s or None
        source = self._source_notebook(info["assignment"], info["notebook"])
        report = grade_notebook(nb, chapter, folder, config, student=info["student"], source_nb=source)
        report.events[:0] = events
        by_gid = {r.grade_id: r for r in report.exercises}
        for cell in nb.cells:
            gid = _gid(cell)
            if cell.cell_type != "code" or not _is_grade(cell):
                continue
            if gid in by_gid:
                r = by_gid[gid]
                where = f"graded in a sandbox on {r.device} ({report.isolation} isolation)"
                if r.passed:
                    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"\u2713 {r.message} [{where}]\n")]
                else:
                    cell.outputs = [nbformat.v4.new_output("error", ename="CheckFailure", evalue=r.message,
                                                           traceback=[*r.message.splitlines(), f"[{where}]"])]
            elif report.quiz and gid == report.quiz["grade_id"]:
                cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=report.quiz["summary"] + "\n"),
                                nbformat.v4.new_output("execute_result", data={"text/plain": repr(float(report.quiz["score"]))},
                                                       execution_count=None)]
            else:
                message = f"test cell {gid} is not registered with the trusted grader: scored 0"
                report.events.append(message)
                cell.outputs = [nbformat.v4.new_output("error", ename="NotGraded", evalue=message, traceback=[message])]
        resources["ptgrade_report"] = report
        self._write_report(report, info)
        return nb, resources

    def _unknown(self, nb, resources, message):
        self.log.error(message)
        for cell in nb.cells:
            if cell.cell_type == "code" and _is_grade(cell):
                cell.outputs = [nbformat.v4.new_output("error", ename="NotGraded", evalue=message, traceback=[message])]
        return nb, resources

    def _write_report(self, report, info):
        root = Path(self.report_dir or Path(self.course_root or ".") / "autograder" / "reports")
        path = root / info["student"] / f"{info['assignment']}.pending.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        record = json.loads(report.to_json())
        record["graded_by"] = _graded_by()
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, path)


def _graded_by() -> dict:
    """Which machine and scheduler task graded a submission (for tracing a class graded by a job array)."""
    import socket

    from .scheduler import placement

    try:
        task = placement().task
    except ValueError as e:
        task = f"unknown ({e})"
    return {"host": socket.gethostname(), "pid": os.getpid(), "task": task}


class StripHiddenTests(NbGraderPreprocessor):
    """Remove ``### BEGIN/END HIDDEN TESTS`` regions from every cell before feedback is rendered."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and "BEGIN HIDDEN TESTS" in cell.source:
            cell.source = HIDDEN.sub("", cell.source).rstrip() + "\n# (hidden tests run by the grader are not shown)"
        return cell, resources


class TrustedCsvExport(CsvExportPlugin):
    """nbgrader's CSV export, plus ``status`` and ``reason`` columns: a submission that could not be graded
    is "not graded" with an empty score (not nbgrader's 0.0), and says why."""

    course_root = Unicode("", help="the course repository (holds autograder/reports)").tag(config=True)

    def export(self, gradebook) -> None:
        import csv

        from .classroom import Course

        super().export(gradebook)
        dest = self.to or "grades.csv"
        with open(dest, newline="") as f:
            rows = list(csv.DictReader(f))
        course = Course(Path(self.course_root or "."))
        seen = {(row["student_id"], row["assignment"]) for row in rows}
        max_score = {row["assignment"]: row.get("max_score", "") for row in rows}
        for failed in sorted(course.reports.glob("*/*.failed.json")):  # never reached nbgrader's gradebook
            student, assignment = failed.parent.name, failed.name.removesuffix(".failed.json")
            if (student, assignment) not in seen and (not self.assignment or assignment in self.assignment):
                rows.append({"assignment": assignment, "student_id": student, "max_score": max_score.get(assignment, "")})
        for row in rows:
            row["status"], row["reason"] = course.status(row["student_id"], row["assignment"])
            if row["status"] == "not graded":
                row["raw_score"] = row["score"] = row["late_submission_penalty"] = ""
        fields = ["assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email", "raw_score",
                  "late_submission_penalty", "score", "max_score", "status", "reason"]
        with open(dest, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, restval="")
            writer.writeheader()
            writer.writerows(rows)


def normalize_db_url(url: str) -> str:
    """``postgresql://...`` -> the driver that is installed (SQLAlchemy 2.1 defaults to psycopg 3; the course
    ships psycopg2-binary). Other URLs are returned unchanged."""
    if url.startswith(("postgresql://", "postgres://")):
        import importlib.util

        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
            return "postgresql+psycopg2://" + url.split("://", 1)[1]
    return url


def configure(c, root: str | os.PathLike) -> None:
    """Apply the course's nbgrader settings to config ``c`` for the course at ``root``."""
    from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import (
        AssignLatePenalties,
        CheckCellMetadata,
        ClearOutput,
        DeduplicateIds,
        GetGrades,
        IgnorePattern,
        LimitOutput,
        OverwriteCells,
        OverwriteKernelspec,
        SaveAutoGrades,
    )

    from .exercise import ANSWER_STUB

    root = str(Path(root).resolve())
    c.CourseDirectory.root = root
    c.RestoreDeletedCells.course_root = root
    c.TrustedGrade.course_root = root
    c.CourseDirectory.course_id = os.environ.get("PTGRADE_COURSE", "ptinternals")
    c.CourseDirectory.source_directory = "solutions"
    c.CourseDirectory.release_directory = "notebooks"
    c.CourseDirectory.submitted_directory = "autograder/submitted"
    c.CourseDirectory.autograded_directory = "autograder/autograded"
    c.CourseDirectory.feedback_directory = "autograder/feedback"
    c.CourseDirectory.db_url = normalize_db_url(os.environ.get("PTGRADE_DB_URL") or f"sqlite:///{root}/autograder/gradebook.db")
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".*.tmp"]
    c.ClearSolutions.code_stub = {"python": ANSWER_STUB}
    c.Autograde.sanitize_preprocessors = [ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells,
                                          RestoreDeletedCells, CheckCellMetadata]
    c.Autograde.autograde_preprocessors = [TrustedGrade, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                           SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
    c.GenerateFeedback.preprocessors = [GetGrades, StripHiddenTests, CSSHTMLHeaderPreprocessor]
    # A quiz answers file must never be overwritten by one from the instructor's folder.
    c.Autograde.exclude_overwriting = {name: ["*.answers.json"] for name in _assignments(root)}
    c.ExportApp.plugin_class = TrustedCsvExport
    c.TrustedCsvExport.course_root = root
    c.ZipCollectApp.collector_plugin = "nbgrader.plugins.FileNameCollectorPlugin"
    # Collecting a newer submission from the exchange keeps the older one (ptinternals.grading.exchange).
    c.ExchangeFactory.collect = "ptinternals.grading.exchange.SupersedingCollect"
    c.FileNameCollectorPlugin.valid_ext = [".ipynb", ".json"]


def _assignments(root: str) -> list[str]:
    src = Path(root) / "solutions"
    return sorted(p.name for p in src.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))) if src.exists() else []
