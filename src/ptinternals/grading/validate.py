"""Student-side validation: make a deleted or edited test cell visible before submitting.

``nbgrader validate`` says "Success!" when a test cell has been deleted (the exercise then silently
scores 0). ``ptgrade validate notebook.ipynb`` checks the notebook against what the chapter expects:
every answer cell and test cell present, and no locked cell edited (nbgrader's checksums).
"""
from __future__ import annotations

from pathlib import Path

import nbformat


def validate_notebook(path: Path) -> list[str]:
    if not path.exists():
        return [f"{path} does not exist"]
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:
        return [f"{path} is not a readable notebook: {e}"]
    from .exercise import load_chapter

    try:
        chapter = load_chapter(path.stem)
    except KeyError:
        return [f"{path.name}: not a course notebook (the file name must stay e.g. strides.ipynb)"]
    cells = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader") or {}
        if meta.get("grade_id"):
            cells[meta["grade_id"]] = (cell, meta)
    problems = []
    # Exercises that grade the same entry point share one answer cell (amp_speed times amp_train's).
    answered = {ex.entry for ex in chapter.exercises if ex.grade_id.replace("_tests", "_code") in cells}
    for ex in chapter.exercises:
        answer = ex.grade_id.replace("_tests", "_code")
        if ex.grade_id not in cells:
            problems.append(f"the test cell of {ex.name} ({ex.grade_id}) has been deleted")
        if answer not in cells and ex.entry not in answered:
            problems.append(f"the answer cell of {ex.name} ({answer}) has been deleted: your code for it is lost")
    if chapter.quiz_grade_id and chapter.quiz_grade_id not in cells:
        problems.append(f"the quiz score cell ({chapter.quiz_grade_id}) has been deleted")
    sources = {gid: cell.get("source", "") for gid, (cell, meta) in cells.items() if cell.get("cell_type") == "code"
               and (gid in chapter.setup_cells or (meta.get("solution") and not meta.get("grade")))}
    for ex in chapter.exercises:
        problem = ex.source_problem(sources, own_cell=ex.answer_cell)
        if problem:
            first = (problem.splitlines()[1:2] or [problem])[0].strip().removeprefix("- ")
            problems.append(f"{ex.name} would score 0: {first}")
    try:
        from nbgrader.utils import compute_checksum
    except ImportError:  # nbgrader not installed: presence checks only
        return problems
    for gid, (cell, meta) in cells.items():
        if meta.get("locked") and meta.get("checksum") and compute_checksum(cell) != meta["checksum"]:
            problems.append(f"locked cell {gid} was edited (the grader uses the original)")
    return problems
