"""Helpers for testing the tests: solution cells, and banks of known-buggy implementations.

Every exercise's checker must accept the solution and reject each plausible wrong implementation in
its chapter's bank (``tests/<package>/buggy.py``). The bank holds *source code*, so the same bugs
also drive the end-to-end autograde tests (a bug is pasted into a student notebook's answer cell).
"""
from __future__ import annotations

import functools
import linecache
from pathlib import Path

import nbformat

from .exercise import CheckFailure, check, load_chapter

ROOT = Path(__file__).resolve().parents[3]


def solution_notebook(assignment: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)


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
