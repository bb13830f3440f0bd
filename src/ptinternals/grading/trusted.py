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
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import _runtime, outfiles
from .exercise import Chapter, Exercise, Outcome, evaluate
from .isolation import ABSENTABLE
from .sandbox import GRACE_S, STARTUP_S, SandboxConfig, SandboxResult, cleanup, run_budget, run_job

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
    not_graded: str = ""  # set when the sandbox itself could not run: the submission is not graded (not a 0)
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


# ================================================================================================
# Reading a run's files (outfiles: no links, no FIFOs, capped sizes; the token proves the harness wrote it)
# ================================================================================================
RESULT_STATUSES = ("ok", "missing", "timeout", "memory", "harness-error")


def _refused(reason: str) -> dict:
    return {"status": "crashed", "results": [], "decoded": [], "s": 0.0, "error": reason}


def _read_result(dir_fd: int, ex: Exercise, result: SandboxResult):
    """The decoded results of ``ex`` (None: no file), or a "crashed" record saying why they are refused."""
    name = ex.id.replace("/", "_")
    try:
        sealed = outfiles.read_bytes(dir_fd, f"{name}.result.json", outfiles.MAX_JSON_BYTES)
    except FileNotFoundError:
        return None
    except outfiles.Untrusted as e:
        return _refused(str(e))
    payload = _runtime.unseal(result.key, sealed)
    if payload is None:
        return _refused("its result file was not written by the grader's harness (its seal does not match)")
    try:
        raw = json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError):
        return _refused("its result file is malformed")
    if not isinstance(raw, dict) or raw.get("id") != ex.id or not isinstance(raw.get("results"), list) \
            or not isinstance(raw.get("arrays"), dict):
        return _refused("its result file is malformed")
    arrays, budget = {}, MAX_RESULT_BYTES
    try:
        for arr_name, digest in raw["arrays"].items():
            if not arr_name.isalnum() or not isinstance(digest, str) or result.plain:
                return _refused(f"its result file names an array it cannot have: {str(arr_name)[:40]!r}")
            arrays[arr_name] = outfiles.read_array(dir_fd, f"{name}.{arr_name}.npy", cap=budget, sha256=digest)
            budget -= arrays[arr_name].nbytes
    except FileNotFoundError:
        return _refused("an array of its result is missing")
    except outfiles.Untrusted as e:
        return _refused(str(e))
    status = raw.get("status")
    seconds = raw.get("s")
    out = {"status": status if status in RESULT_STATUSES else "crashed",
           "s": float(seconds) if type(seconds) in (int, float) and math.isfinite(seconds) else 0.0}
    try:
        out["decoded"] = [_runtime.decode(r, arrays, to_torch=False, plain=result.plain) for r in raw["results"]]
    except Exception as e:  # noqa: BLE001 (malformed data reads as a harness failure, never a grader crash)
        return _refused(f"its results cannot be decoded ({type(e).__name__}: {str(e)[:200]})")
    return out


def _progress(dir_fd: int) -> list[dict]:
    events = []
    for line in outfiles.tail_lines(dir_fd, "progress.jsonl"):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def _cell_reports(dir_fd: int, n_cells: int) -> list[dict]:
    try:
        reports = outfiles.read_json(dir_fd, "cells.json", cap=1 << 20)
    except (FileNotFoundError, outfiles.Untrusted):
        return []
    return [c for c in reports[:n_cells] if isinstance(c, dict)] if isinstance(reports, list) else []


# ================================================================================================
# Running a group of exercises (one forbid-set) through the sandbox, around crashes
# ================================================================================================
@dataclass
class _Group:
    """What the runs of one group share: the job's parts and what has been decided so far."""

    cells: list[dict]
    exercises: list[Exercise]
    cases: dict
    expected: dict
    absent: tuple[str, ...]
    outcomes: dict = field(default_factory=dict)
    skip_cells: list = field(default_factory=list)
    reported_cells: set = field(default_factory=set)
    forbidden_cells: dict = field(default_factory=dict)  # answer cell -> the absent module it imported

    def todo(self) -> list[Exercise]:
        return [ex for ex in self.exercises if ex.id not in self.outcomes]


def run_exercises(cells: list[dict], exercises: list[Exercise], config: SandboxConfig, report: NotebookReport,
                  cell_timeout_s: float = 30.0, extra_files: tuple[str, ...] = (),
                  deadline: float | None = None) -> dict[str, Outcome]:
    """Run ``exercises`` (one forbid-group) through the sandbox, retrying around crashes, until
    ``deadline`` (``time.monotonic()``) at the latest."""
    forbid = sorted({m for ex in exercises for m in ex.forbid})
    absent = tuple(m for m in forbid if m in ABSENTABLE)
    plain = bool(absent)
    g = _Group(cells, exercises, {ex.id: ex.cases_and_expected()[0] for ex in exercises},
               {ex.id: ex.cases_and_expected()[1] for ex in exercises}, absent)  # trusted, before any run
    arrays: dict = {}
    job_exercises = []
    for ex in exercises:
        encoded = [{"args": _runtime.encode(c.args, arrays, plain=plain),
                    "kwargs": _runtime.encode(c.kwargs, arrays, plain=plain)} for c in g.cases[ex.id]]
        job_exercises.append({"id": ex.id, "entry": ex.entry, "probe": ex.probe, "timeout_s": ex.timeout_s,
                              "cases": encoded, "device": config.device if ex.gpu else "cpu"})
    if plain and arrays:
        raise ValueError(f"{[e.id for e in exercises]} forbid {absent} but their cases hold tensors or arrays")
    for _attempt in range(len(cells) + len(exercises) + 2):
        todo = g.todo()
        if not todo:
            break
        job = {"cells": cells, "exercises": [j for j in job_exercises if j["id"] in {e.id for e in todo}],
               "skip_cells": list(g.skip_cells), "cell_timeout_s": cell_timeout_s}
        budget = run_budget(job)
        if deadline is not None:
            left = deadline - time.monotonic()
            if left < min(budget, MIN_RUN_S):
                _fail_all(g, config, "timeout", "the grader stopped grading this submission: it had used its whole "
                          "time budget (hanging or slow code in earlier runs)", report)
                break
            budget = min(budget, left)
        config.limits.wall_s = budget
        result = run_job(job, arrays, config, extra_files, absent=absent)
        report.sandbox_runs += 1
        report.isolation = result.isolation
        try:
            if not _after_run(g, result, todo, config, report):
                break
        finally:
            cleanup(result)
    return g.outcomes


MIN_RUN_S = 20.0  # a run is not started with less time than this left


def _fail_all(g: _Group, config: SandboxConfig, category: str, why: str, report: NotebookReport) -> None:
    for ex in g.todo():
        n = len(g.cases[ex.id])
        g.outcomes[ex.id] = Outcome(ex.id, False, n, n, f"{ex.name}: {why}.", category, 0.0, _device(ex, config))
    report.events.append(f"{', '.join(e.id for e in g.exercises)}: {why}")


def _after_run(g: _Group, result: SandboxResult, todo: list[Exercise], config: SandboxConfig,
               report: NotebookReport) -> bool:
    """Judge what one run returned; decide what the next run skips. False: no next run."""
    try:
        dir_fd = outfiles.open_dir(result.out_dir)
    except outfiles.Untrusted as e:
        _fail_all(g, config, "crashed", f"the grader could not read your run's output ({e})", report)
        return False
    try:
        _collect(g, dir_fd, result, todo, config, report)
        if not g.todo():
            return False
        blame = None if result.overstayed == "done" else _blame(g, dir_fd, result)
        started = bool(_progress(dir_fd)) or outfiles.exists(dir_fd, "cells.json")
    finally:
        os.close(dir_fd)
    if blame is None:
        why = (f"the grader could not run your code: the sandbox {result.describe()} without a usable record "
               f"of where it stopped")
        if report.sandbox_runs == 1 and not started:  # before the first cell: the machine, not the submission
            report.not_graded = (f"the sandbox could not start ({result.describe()}): "
                                 f"{result.stderr_tail.strip()[-300:] or 'no error output'}")
        _fail_all(g, config, "crashed", why, report)
        if result.stderr_tail.strip():
            report.events[-1] += f"; stderr: {result.stderr_tail[-300:]}"
        return False
    kind, ident = blame
    if kind == "cell":
        g.skip_cells.append(ident)
        report.events.append(f"answer cell {ident} {result.describe()}; it was skipped and grading went on")
        return True
    ex = next(e for e in todo if e.id == ident)
    category = "timeout" if result.timed_out else ("memory" if result.memory_exceeded else "crashed")
    n = len(g.cases[ex.id])
    g.outcomes[ex.id] = Outcome(ex.id, False, n, n, f"{ex.name}: your code {result.describe()} while this exercise "
                                f"was being checked (its other cases could not run).", category, result.wall_s,
                                _device(ex, config))
    report.events.append(f"{ex.id}: sandbox {result.describe()}")
    return True


def _device(ex: Exercise, config: SandboxConfig) -> str:
    return config.device if ex.gpu else "cpu"


def _blame(g: _Group, dir_fd: int, result: SandboxResult):
    """Where the run stopped: the step the watchdog stopped, or else the last step the progress file says
    was started, if that step is still undecided. A run that stopped between steps (the last line is a
    step's end, or names a step already decided or unknown) blames nothing: the rest fails as "crashed"."""
    pending_cells = {c["id"] for c in g.cells} - set(g.skip_cells)
    pending_exercises = {e.id for e in g.todo()}
    candidates = [result.overstayed] if result.overstayed else []
    for event in reversed(_progress(dir_fd)):
        if any(k in event for k in ("done", "cell_done", "cell", "exercise")):
            candidates.append(event.get("exercise", event.get("cell")))
            break
    for step in candidates:
        if isinstance(step, str) and step in pending_exercises:
            return ("exercise", step)
        if isinstance(step, str) and step in pending_cells:
            return ("cell", step)
    return None


def _collect(g: _Group, dir_fd: int, result: SandboxResult, todo: list[Exercise], config: SandboxConfig,
             report: NotebookReport) -> None:
    for c in _cell_reports(dir_fd, len(g.cells)):
        cid, error, message = str(c.get("id", ""))[:100], str(c.get("error", ""))[:100], str(c.get("message", ""))[:500]
        if error in ("ModuleNotFoundError", "ImportError") and g.absent:
            module = next((m for m in g.absent if re.search(rf"\b{m}\b", message)), None)
            if module:  # a run in which that module is deliberately absent: not an error to report here
                g.forbidden_cells.setdefault(cid, module)
                continue
        if c.get("status") == "error" and cid not in g.reported_cells:
            g.reported_cells.add(cid)
            report.cell_errors.append({"id": cid, "error": error, "message": message,
                                       "where": str(c.get("where", ""))[:100]})
    for ex in todo:
        raw = _read_result(dir_fd, ex, result)
        if raw is None:
            continue
        if raw["status"] == "crashed" and raw.get("error"):
            n = len(g.cases[ex.id])
            g.outcomes[ex.id] = Outcome(ex.id, False, n, n, f"{ex.name}: the grader refused this exercise's result: "
                                        f"{raw['error']}.", "crashed", 0.0, _device(ex, config))
            report.events.append(f"{ex.id}: result refused: {raw['error']}")
            continue
        status = raw["status"] if raw["status"] != "harness-error" else "crashed"
        outcome = evaluate(ex, g.cases[ex.id], raw["decoded"], g.expected[ex.id],
                           device=_device(ex, config), status=status, seconds=raw["s"])
        module = g.forbidden_cells.get(ex.answer_cell)
        if outcome.category == "missing" and module:
            outcome = Outcome(ex.id, False, outcome.n_cases, outcome.n_cases,
                              f"{ex.name}: your answer cell imports {module}, which does not exist while this exercise "
                              f"is graded (it asks for the algorithm in plain Python): remove the import and write it "
                              f"without {module}.", "forbidden", outcome.seconds, outcome.device)
        g.outcomes[ex.id] = outcome


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
    outcomes: dict[str, Outcome] = static_outcomes(chapter, exercises, cells, report)
    groups: dict[tuple, list[Exercise]] = {}
    for ex in exercises:
        if ex.id not in outcomes:  # an exercise its policy already failed is not run at all
            groups.setdefault(tuple(sorted(ex.forbid)), []).append(ex)
    total_s = config.limits.total_s or submission_budget(cells, list(groups.values()), cell_timeout_s)
    deadline = time.monotonic() + total_s
    for group in groups.values():
        outcomes.update(run_exercises(cells, group, config, report, cell_timeout_s, chapter.sandbox_files, deadline))
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
        q = _grade_quiz(chapter, folder, report)
        report.quiz = {"grade_id": chapter.quiz_grade_id, "score": q.score, "max_score": q.max_score,
                       "answered": q.answered, "n_questions": q.n_questions, "summary": q.summary(),
                       "problem": q.problem}
    report.wall_s = round(time.perf_counter() - t0, 3)
    return report


def submission_budget(cells: list[dict], groups: list[list[Exercise]], cell_timeout_s: float) -> float:
    """The most one submission may take, all its sandbox runs together: each group's start-up and every
    exercise at its limit, plus two cells' worth of hanging (answer cells normally take milliseconds). A
    submission that hangs or swallows its alarms in every step is stopped here, whatever it writes."""
    cells_allowance = min(len(cells), 2) * (cell_timeout_s + GRACE_S)
    return 60.0 + cells_allowance + sum(STARTUP_S + sum(ex.timeout_s + GRACE_S for ex in g) for g in groups)


def _grade_quiz(chapter: Chapter, folder, report: NotebookReport):
    """The quiz score from the submission's answers file, read like anything a student wrote: no link,
    no FIFO, a regular file under the size cap (a copy of it is what the quiz grader reads)."""
    import tempfile

    from ..quiz.answers import MAX_ANSWERS_BYTES, answers_path, grade_answers
    from ..quiz.bank import load_bank

    path = answers_path(chapter.assignment, folder)
    with tempfile.TemporaryDirectory(prefix="ptgrade-answers-") as tmp:
        copy = Path(tmp) / path.name
        try:
            dir_fd = outfiles.open_dir(path.parent)
            try:
                copy.write_bytes(outfiles.read_bytes(dir_fd, path.name, MAX_ANSWERS_BYTES))
            finally:
                os.close(dir_fd)
        except FileNotFoundError:
            pass
        except outfiles.Untrusted as e:
            report.events.append(f"quiz answers file refused: {e}")
        return grade_answers(load_bank(chapter.assignment), copy)


def static_outcomes(chapter: Chapter, exercises: list[Exercise], cells: list[dict], report: NotebookReport) -> dict:
    """The exercises whose source the submission writes in a way their rules forbid
    (``Exercise.source_problem``, the exercise's ``policy.Policy``): failed here, in the
    grader's process, on the notebook's source, before any of the submission's code runs."""
    sources = {c["id"]: c["source"] for c in cells}
    out = {}
    for ex in exercises:
        problem = ex.source_problem(sources, own_cell=ex.answer_cell)
        if problem:
            out[ex.id] = Outcome(ex.id, False, 1, 1, problem, "forbidden", 0.0, "cpu")
            first = (problem.splitlines()[1:2] or [problem])[0].strip().removeprefix("- ")
            report.events.append(f"{ex.id}: how it is written is not allowed: {first[:200]}")
    return out
