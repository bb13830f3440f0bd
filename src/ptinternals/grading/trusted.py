"""Grading one notebook through the boundary: the grade of record, computed in this (trusted) process.

1. Pick the code the grade may depend on: the chapter's locked setup cells (their source from the
   instructor's copy when given) and the student's answer cells (nbgrader ``solution`` cells).
2. Choose every exercise's cases and compute the expected answers *here*, from real torch.
3. Run the student's code in the sandbox (``sandbox.run_job``); it returns only data.
4. If the sandbox dies, find where (``progress.jsonl``): a cell that hangs or kills the process is
   skipped, an exercise that does is failed with the reason, and the rest are run again. One bad
   answer never costs another exercise its points.
5. Judge the data with ``exercise.evaluate`` and read the quiz answers file.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import _runtime
from .exercise import Chapter, Exercise, Outcome, evaluate
from .sandbox import SandboxConfig, SandboxResult, cleanup, run_job

MAX_RESULT_BYTES = 64 << 20  # per exercise, JSON and arrays together


@dataclass
class ExerciseResult:
    id: str
    grade_id: str
    points: float
    score: float
    passed: bool
    category: str
    message: str
    seconds: float
    device: str


@dataclass
class NotebookReport:
    assignment: str
    student: str
    exercises: list[ExerciseResult]
    quiz: dict | None = None
    cell_errors: list[dict] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # what the instructor should know (tampering, crashes)
    isolation: str = ""
    device: str = "cpu"
    wall_s: float = 0.0
    sandbox_runs: int = 0

    @property
    def score(self) -> float:
        return sum(e.score for e in self.exercises) + (self.quiz or {}).get("score", 0.0)

    @property
    def max_score(self) -> float:
        return sum(e.points for e in self.exercises) + (self.quiz or {}).get("max_score", 0.0)

    def to_json(self) -> str:
        d = asdict(self)
        d.update(score=self.score, max_score=self.max_score)
        return json.dumps(d, indent=1)


def _meta(cell) -> dict:
    return (cell.get("metadata") or {}).get("nbgrader") or {}


def graded_cells(nb, chapter: Chapter, source_nb=None) -> list[dict]:
    """The cells run in the sandbox, in notebook order: setup cells and answer (solution) cells."""
    setup_source = {}
    if source_nb is not None:
        setup_source = {_meta(c).get("grade_id"): c["source"] for c in source_nb["cells"]
                        if _meta(c).get("grade_id") in chapter.setup_cells}
    out = []
    for cell in nb["cells"]:
        meta = _meta(cell)
        gid = meta.get("grade_id")
        if cell.get("cell_type") != "code" or not gid:
            continue
        if gid in chapter.setup_cells:
            out.append({"id": gid, "source": setup_source.get(gid, cell["source"]), "tolerant": True})
        elif meta.get("solution") and not meta.get("grade"):
            out.append({"id": gid, "source": cell["source"]})
    return out


def _read_result(out_dir: Path, ex: Exercise):
    name = ex.id.replace("/", "_")
    path = out_dir / f"{name}.result.json"
    if not path.exists():
        return None
    total = path.stat().st_size + sum(p.stat().st_size for p in out_dir.glob(f"{name}.*.npy"))
    if total > MAX_RESULT_BYTES:
        return {"status": "too-large", "results": [], "s": 0.0}
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or raw.get("id") != ex.id or not isinstance(raw.get("results"), list):
        return {"status": "harness-error", "results": [], "s": 0.0}
    arrays = {}
    for arr_name in raw.get("arrays", []):
        if not isinstance(arr_name, str) or not arr_name.isalnum():
            continue
        arrays[arr_name] = np.load(out_dir / f"{name}.{arr_name}.npy", allow_pickle=False)
    try:
        raw["decoded"] = [_runtime.decode(r, arrays, to_torch=False) for r in raw["results"]]
    except Exception as e:  # malformed data from the sandbox reads as a wrong answer, never a grader crash
        raw["status"], raw["decoded"] = "harness-error", []
        raw["error"] = f"{type(e).__name__}: {e}"
    return raw


def _progress(out_dir: Path) -> list[dict]:
    path = out_dir / "progress.jsonl"
    events = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines()[-1000:]:
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def run_exercises(cells: list[dict], exercises: list[Exercise], config: SandboxConfig, report: NotebookReport,
                  cell_timeout_s: float = 30.0, extra_files: tuple[str, ...] = ()) -> dict[str, Outcome]:
    """Run ``exercises`` (one forbid-group) through the sandbox, retrying around crashes."""
    forbid = sorted({m for ex in exercises for m in ex.forbid})
    cases = {ex.id: ex.cases_and_expected()[0] for ex in exercises}
    expected = {ex.id: ex.cases_and_expected()[1] for ex in exercises}  # trusted, before any run
    arrays: dict = {}
    job_exercises = []
    for ex in exercises:
        encoded = [{"args": _runtime.encode(c.args, arrays), "kwargs": _runtime.encode(c.kwargs, arrays)}
                   for c in cases[ex.id]]
        job_exercises.append({"id": ex.id, "entry": ex.entry, "probe": ex.probe, "timeout_s": ex.timeout_s,
                              "cases": encoded, "device": config.device if ex.gpu else "cpu"})
    outcomes: dict[str, Outcome] = {}
    skip_cells: list[str] = []
    reported_cells: set[str] = set()
    for _attempt in range(len(cells) + len(exercises) + 2):
        todo = [ex for ex in exercises if ex.id not in outcomes]
        if not todo:
            break
        budget = sum(ex.timeout_s for ex in todo) + cell_timeout_s * max(1, len(cells)) + 60
        config.limits.wall_s = budget
        job = {"cells": cells, "exercises": [j for j in job_exercises if j["id"] in {e.id for e in todo}],
               "skip_cells": skip_cells, "forbid": forbid, "cell_timeout_s": cell_timeout_s,
               "forbid_context": "this exercise"}
        result = run_job(job, arrays, config, extra_files)
        report.sandbox_runs += 1
        report.isolation = result.isolation
        try:
            _collect(result, cells, todo, cases, expected, outcomes, report, reported_cells, config.device)
            if len(outcomes) == len(exercises):
                break
            blame = _blame(result)
            if blame is None:  # nothing started and nothing to blame: do not loop forever
                for ex in todo:
                    if ex.id not in outcomes:
                        outcomes[ex.id] = Outcome(ex.id, False, len(cases[ex.id]), len(cases[ex.id]),
                                                  f"{ex.name}: the grader could not run your code: "
                                                  f"the sandbox {result.describe()} before starting.\n"
                                                  f"{result.stderr_tail[-800:]}", "crashed", 0.0, _device(ex, config))
                report.events.append(f"sandbox failed before any cell ran: {result.describe()}; "
                                     f"stderr: {result.stderr_tail[-300:]}")
                break
            kind, ident = blame
            if kind == "cell":
                skip_cells.append(ident)
                report.events.append(f"answer cell {ident} {result.describe()}; it was skipped and grading went on")
            else:
                ex = next(e for e in todo if e.id == ident)
                category = "timeout" if result.timed_out else ("memory" if result.memory_exceeded else "crashed")
                outcomes[ex.id] = Outcome(ex.id, False, len(cases[ex.id]), len(cases[ex.id]),
                                          f"{ex.name}: your code {result.describe()} while this exercise was being "
                                          f"checked (its other cases could not run).", category, result.wall_s,
                                          _device(ex, config))
                report.events.append(f"{ex.id}: sandbox {result.describe()}")
        finally:
            cleanup(result)
    return outcomes


def _device(ex: Exercise, config: SandboxConfig) -> str:
    return config.device if ex.gpu else "cpu"


def _blame(result: SandboxResult):
    events = _progress(result.out_dir)
    for event in reversed(events):
        if "done" in event:
            return None
        if "exercise" in event:
            return ("exercise", event["exercise"])
        if "cell" in event:
            return ("cell", event["cell"])
    return None


def _collect(result, cells, todo, cases, expected, outcomes, report, reported_cells, device):
    cells_file = result.out_dir / "cells.json"
    if cells_file.exists():
        try:
            forbidden = {m for ex in todo for m in ex.forbid}
            for c in json.loads(cells_file.read_text())[: len(cells)]:
                if isinstance(c, dict) and c.get("error") in ("ModuleNotFoundError", "ImportError", "ForbiddenModuleError") \
                        and any(m in str(c.get("message", "")) for m in forbidden):
                    continue  # a run in which that module is deliberately missing: not the student's error
                if isinstance(c, dict) and c.get("status") == "error" and c.get("id") not in reported_cells:
                    reported_cells.add(c.get("id"))
                    report.cell_errors.append({k: str(c.get(k, ""))[:500] for k in ("id", "error", "message", "where")})
        except ValueError:
            pass
    for ex in todo:
        raw = _read_result(result.out_dir, ex)
        if raw is None:
            continue
        status = raw.get("status", "harness-error")
        if status not in ("ok", "missing", "timeout", "memory"):
            status = "crashed"
        outcomes[ex.id] = evaluate(ex, cases[ex.id], raw.get("decoded", []), expected[ex.id],
                                   device=device if ex.gpu else "cpu", status=status, seconds=float(raw.get("s", 0.0)))


def grade_notebook(nb, chapter: Chapter, folder: str | Path, config: SandboxConfig, *, student: str = "",
                   source_nb=None, cell_timeout_s: float = 30.0, only: set[str] | None = None) -> NotebookReport:
    """Grade a student's notebook (``nb``, an nbformat dict) for ``chapter``; ``folder`` holds its files."""
    t0 = time.perf_counter()
    report = NotebookReport(chapter.assignment, student, [], device=config.device)
    cells = graded_cells(nb, chapter, source_nb)
    present = {_meta(c).get("grade_id") for c in nb["cells"]}
    for ex in chapter.exercises:
        if ex.grade_id not in present:
            report.events.append(f"test cell {ex.grade_id} ({ex.id}) was missing from the submission")
    exercises = [ex for ex in chapter.exercises if only is None or ex.id in only]
    groups: dict[tuple, list[Exercise]] = {}
    for ex in exercises:
        groups.setdefault(tuple(sorted(ex.forbid)), []).append(ex)
    outcomes: dict[str, Outcome] = {}
    for group in groups.values():
        outcomes.update(run_exercises(cells, group, config, report, cell_timeout_s, chapter.sandbox_files))
    sources = {c["id"]: c["source"] for c in cells}
    for ex in exercises:
        problem = ex.source_problem(sources, own_cell=ex.answer_cell)  # how it is written: judged here, on source
        if problem:
            o = outcomes[ex.id]
            outcomes[ex.id] = Outcome(ex.id, False, o.n_cases, o.n_cases, problem, "forbidden", o.seconds, o.device)
    for ex in exercises:
        o = outcomes[ex.id]
        message = o.message
        if not o.passed and o.category in ("error", "missing", "not-implemented"):
            own_cell = ex.grade_id.replace("_tests", "_code")
            related = [c for c in report.cell_errors if c["id"] == own_cell] or \
                      ([c for c in report.cell_errors] if o.category == "missing" else [])
            if related:
                c = related[0]
                message += (f"\n  note: answer cell {c['id']} raised {c['error']}: {c['message']}"
                            f"{' (' + c['where'] + ')' if c['where'] else ''}")
        report.exercises.append(ExerciseResult(ex.id, ex.grade_id, ex.points, ex.points if o.passed else 0.0,
                                               o.passed, o.category, message, round(o.seconds, 3), o.device))
    if chapter.quiz_grade_id:
        from ..quiz.answers import answers_path, grade_answers
        from ..quiz.bank import load_bank

        q = grade_answers(load_bank(chapter.assignment), answers_path(chapter.assignment, folder))
        report.quiz = {"grade_id": chapter.quiz_grade_id, "score": q.score, "max_score": q.max_score,
                       "answered": q.answered, "n_questions": q.n_questions, "summary": q.summary(),
                       "problem": q.problem}
    report.wall_s = round(time.perf_counter() - t0, 3)
    return report
