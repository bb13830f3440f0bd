"""Every chapter's notebooks: generated files in sync, solutions run top to bottom, and grading is exact.

The student notebooks are executed by the book build (tests/book: every check cell must fail with
"not implemented yet" and nothing else may fail); here the solution notebooks run, and the trusted
grader is shown to take points only from the exercises that are wrong.
"""
import importlib
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from ptinternals.course import SLUGS
from ptinternals.grading.exercise import load_chapter
from ptinternals.grading.sandbox import SandboxConfig
from ptinternals.grading.trusted import grade_notebook

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = [slug for slug in SLUGS if (ROOT / "solutions" / f"{slug}.py").exists()]


def test_generated_notebooks_and_banks_are_up_to_date():
    proc = subprocess.run([sys.executable, "scripts/build_notebooks.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_solution_or_hidden_test_in_student_notebooks():
    from tests.book.test_book import solution_lines

    for chapter in CHAPTERS:
        text = (ROOT / "notebooks" / chapter / f"{chapter}.ipynb").read_text()
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "hidden=True"):
            assert marker not in text, f"{chapter}: {marker!r} in the student notebook"
        source = "\n".join(c.source for c in nbformat.read(ROOT / "notebooks" / chapter / f"{chapter}.ipynb", 4).cells)
        leaked = [line for line in solution_lines(chapter) if line in source]
        assert not leaked, f"{chapter}: solution lines in the student notebook: {leaked[:3]}"


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_solution_notebook_runs_top_to_bottom(chapter, tmp_path):
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    seconds = time.perf_counter() - t0
    print(f"\n{chapter}: solution notebook ran in {seconds:.1f} s")
    errors = [(c.metadata.get("nbgrader", {}).get("grade_id"), o.ename, o.evalue[:400])
              for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    checks = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id", "").endswith("_tests")]
    assert len(checks) >= 6
    for cell in checks:
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        assert "\u2713" in text or "SKIPPED" in text, (chapter, cell.metadata["nbgrader"]["grade_id"], text)


def _bank(chapter: str):
    return importlib.import_module(f"tests.{chapter}.buggy")


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_bugs_lose_exactly_their_exercises_points(chapter, tmp_path):
    """Paste one known bug into every other exercise's answer cell: exactly those exercises score 0."""
    bank = _bank(chapter)
    cells = getattr(bank, "ANSWER_CELL", {})
    ch = load_chapter(chapter)
    nb = nbformat.read(ROOT / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    cell_of = {ex.id: cells.get(ex.id, ex.grade_id.replace("_tests", "_code")) for ex in ch.exercises}
    shared = {c for c in cell_of.values() if list(cell_of.values()).count(c) > 1}
    bugged, replaced_cells = set(), set()
    for i, ex in enumerate(ch.exercises):
        cell_id = cell_of[ex.id]
        if i % 2 or ex.id not in bank.BUGGY or cell_id in replaced_cells or cell_id in shared:
            continue  # (a cell that several exercises share would sink them all: not a fair test)
        source = next(iter(bank.BUGGY[ex.id].values()))[0]
        for cell in nb.cells:
            if cell.metadata.get("nbgrader", {}).get("grade_id") == cell_id:
                cell.source = source
                bugged.add(ex.id)
                replaced_cells.add(cell_id)
    t0 = time.perf_counter()
    report = grade_notebook(nb, ch, tmp_path, SandboxConfig())
    print(f"\n{chapter}: graded in {time.perf_counter() - t0:.1f} s ({report.sandbox_runs} sandbox runs, "
          f"{report.isolation})")
    by_id = {e.id: e for e in report.exercises}
    for ex in ch.exercises:
        result = by_id[ex.id]
        if ex.id in bugged:
            assert not result.passed and result.score == 0, f"{ex.id}: a known bug was accepted"
        else:
            dependents = getattr(bank, "DEPENDS_ON", {}).get(ex.id, ())
            if any(d in bugged for d in dependents):
                continue  # this exercise builds on a bugged one (declared in the bank)
            assert result.passed and result.score == ex.points, f"{ex.id} lost points to another exercise's bug:\n{result.message}"
