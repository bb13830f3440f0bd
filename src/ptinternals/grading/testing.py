"""Helpers for testing the tests: solution cells, banks of known-buggy implementations, reference twins
and boundary classes.

Every exercise's checker must accept the solution and reject each plausible wrong implementation in
its chapter's bank (``tests/<slug>/buggy.py``). The bank holds *source code*, so the same bugs
also drive the end-to-end autograde tests (a bug is pasted into a student notebook's answer cell).
"""
from __future__ import annotations

import copy
import functools
import importlib
import linecache
import re
from pathlib import Path

import nbformat

from .exercise import CheckFailure, Exercise, check, load_chapter

ROOT = Path(__file__).resolve().parents[3]


def solution_notebook(assignment: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)


def notebook_with(assignment: str, replace: dict | None = None, delete: tuple = (),
                  student: bool = False) -> nbformat.NotebookNode:
    """A fresh copy of the chapter's solution (or student) notebook with some cells' sources replaced
    (``{grade_id: source}``) and some deleted (by grade_id): a submission for the end-to-end tests."""
    path = ROOT / "notebooks" / assignment / f"{assignment}.ipynb"
    nb = nbformat.read(path, as_version=4) if student else copy.deepcopy(solution_notebook(assignment))
    cells = []
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in delete:
            continue
        if gid in (replace or {}):
            cell.source = replace[gid]
        cells.append(cell)
    nb.cells = cells
    return nb


def answer_sources(assignment: str, student: bool = False) -> dict[str, str]:
    """``{grade_id: source}`` of the setup and answer cells of the solution (or the student) notebook."""
    return dict(_answer_sources(assignment, student))


@functools.lru_cache(maxsize=None)
def _answer_sources(assignment: str, student: bool) -> tuple[tuple[str, str], ...]:
    nb = (nbformat.read(ROOT / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4) if student
          else solution_notebook(assignment))
    out = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and (meta.get("solution") or meta.get("grade_id") == "setup"):
            out.append((meta["grade_id"], cell.source))
    return tuple(out)


def edited(exercise_id: str, *edits: tuple[str, str], cell: str | None = None) -> str:
    """A known bug written as the solution plus an edit: the solution's answer cell for ``exercise_id``
    (or the answer cell ``cell``) with each ``(old, new)`` replaced. ``old`` must occur exactly once, so
    a bank fails loudly when the solution changes under it.

    Banks write their bugs this way (``tests/<slug>/buggy.py``): the bug is the one edit a reader sees,
    and it stays a complete replacement for the answer cell, which is what the end-to-end tests paste
    into a notebook.
    """
    chapter = load_chapter(exercise_id)
    gid = cell or chapter.exercise(exercise_id).answer_cell
    sources = answer_sources(chapter.assignment)
    if gid not in sources:
        raise KeyError(f"{chapter.assignment} has no answer cell {gid!r}; known: {sorted(sources)}")
    source = sources[gid]
    for old, new in edits:
        count = source.count(old)
        if count != 1:
            raise AssertionError(f"{gid}: the edit target occurs {count} times in the solution (expected once): {old!r}")
        source = source.replace(old, new)
    return source


def namespace_with(assignment: str, replace: dict[str, str] | None = None, student: bool = False) -> dict:
    """Execute the setup cell, then the solution's (or the student stubs') answer cells, optionally
    replacing some, and return the namespace: what the grading sandbox would see."""
    import ast

    ns: dict = {"__name__": "__main__"}
    for gid, src in answer_sources(assignment, student).items():
        if gid == "setup":  # as in the sandbox: the course's own cell, statement by statement, errors ignored
            for stmt in ast.parse(src).body:
                try:
                    exec(compile(ast.Module([stmt], []), "<setup>", "exec"), ns)
                except Exception:
                    pass
            continue
        code = (replace or {}).get(gid, src)
        filename = f"<cell {gid}>"  # registered like IPython does, so triton.jit can read the source
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        exec(compile(code, filename, "exec"), ns)
    return ns


def rejects(exercise_id: str, source: str, entry: str | None = None) -> CheckFailure | None:
    """Run ``source`` (defining the entry point, on top of the solution's cells) against the exercise's
    visible cases, then its hidden ones.

    Returns the CheckFailure when the checker rejects it, or None when it (wrongly) passes. Visible
    cases go first: when one fails, the report is the one the hidden run would give too (the simplest
    failing case is a visible one), at a fraction of the time.
    """
    chapter = load_chapter(exercise_id)
    ex = chapter.exercise(exercise_id)
    ns = namespace_with(chapter.assignment)
    filename = f"<buggy {exercise_id}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), ns)
    for hidden in (False, True):
        try:
            check(exercise_id, ns[entry or ex.entry], hidden=hidden)
        except CheckFailure as failure:
            return failure
    return None


# ------------------------------------------------------------------------------------------------
# Reference twins: "# twin: ptinternals.<slug>.<module>.<name>" inside the solution region
# ------------------------------------------------------------------------------------------------
TWIN = re.compile(r"^\s*# twin(?: (?P<entry>\w+))?:\s*(?P<target>\S.*?)\s*$")


def twin_of(exercise_id: str, cell: str | None = None) -> str | None:
    """What the exercise's solution names as its reference twin: a dotted path, ``"none (<why>)"``, or None
    when its answer cell has no ``# twin:`` line. A cell that answers several exercises names each one's
    twin with its entry point: ``# twin amp_speed: ptinternals.amp....``."""
    chapter = load_chapter(exercise_id)
    ex = chapter.exercise(exercise_id)
    source = answer_sources(chapter.assignment)[cell or ex.answer_cell]
    found = {m.group("entry"): m.group("target") for m in map(TWIN.match, source.splitlines()) if m}
    return found.get(ex.entry, found.get(None))


def load_twin(target: str):
    """The object a twin line names (``ptinternals.strides.meta.view_strides``)."""
    module, _, name = target.rpartition(".")
    if not module.startswith("ptinternals."):
        raise ValueError(f"a twin must live in the reference package ptinternals.<slug>, got {target!r}")
    return getattr(importlib.import_module(module), name)


# ------------------------------------------------------------------------------------------------
# Boundary classes: Exercise.boundary_classes, checked against the hidden cases
# ------------------------------------------------------------------------------------------------
def missing_boundary_classes(ex: Exercise) -> list[str]:
    """The names of ``ex.boundary_classes`` that no hidden case falls in (a predicate that raises on a
    case counts as False for it)."""
    cases, expected = ex.cases_and_expected(hidden=True)
    hidden = [(c, e) for c, e in zip(cases, expected) if c.hidden]

    def holds(predicate, case, exp) -> bool:
        try:
            return bool(predicate(case, exp))
        except Exception:
            return False

    return [name for name, predicate in ex.boundary_classes.items()
            if not any(holds(predicate, c, e) for c, e in hidden)]


# ------------------------------------------------------------------------------------------------
# Hints: the "likely cause" line of a failure
# ------------------------------------------------------------------------------------------------
def likely_cause(failure: CheckFailure) -> str | None:
    """The failure's likely cause (the text after "likely cause:", its last part), or None when it has none."""
    head, marker, hint = str(failure).partition("\n  likely cause: ")
    return hint.strip() if marker else None
