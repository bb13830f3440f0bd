"""Fixtures for grading tests: submissions built from the strides chapter's solution notebook."""
import copy
import os
import shutil
from pathlib import Path

import nbformat
import pytest

from ptinternals.grading.testing import ROOT, solution_notebook


def submission(replace: dict | None = None, delete: tuple = (), student_version: bool = False):
    """The the strides chapter notebook with some answer cells replaced (by grade_id) or deleted."""
    if student_version:
        nb = nbformat.read(ROOT / "notebooks" / "strides" / "strides.ipynb", as_version=4)
    else:
        nb = copy.deepcopy(solution_notebook("strides"))
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


def make_course(root: Path) -> Path:
    """A throw-away course folder with this repository's solutions and nbgrader config."""
    (root / "autograder").mkdir(parents=True)
    shutil.copytree(ROOT / "solutions", root / "solutions")
    shutil.copy(ROOT / "autograder" / "nbgrader_config.py", root / "autograder")
    return root


class _Root:
    """Point ptgrade at a course folder (PTGRADE_ROOT) for the duration of a fixture."""

    def __init__(self, root):
        self.root, self.old = root, os.environ.get("PTGRADE_ROOT")

    def __enter__(self):
        os.environ["PTGRADE_ROOT"] = str(self.root)
        return self.root

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("PTGRADE_ROOT", None)
        else:
            os.environ["PTGRADE_ROOT"] = self.old


@pytest.fixture
def course(tmp_path):
    with _Root(make_course(tmp_path / "course")) as root:
        yield root


@pytest.fixture(scope="module")
def module_course(tmp_path_factory):
    with _Root(make_course(tmp_path_factory.mktemp("course") / "course")) as root:
        yield root


def add_submission(root: Path, student: str, nb, answers: dict | None = None, assignment: str = "strides"):
    import json

    dest = root / "autograder" / "submitted" / student / assignment
    dest.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest / f"{assignment}.ipynb")
    (dest / "timestamp.txt").write_text("2026-11-30 12:00:00.000000 UTC")
    if answers is not None:
        (dest / f"{assignment}.answers.json").write_text(json.dumps(
            {"format": 1, "chapter": assignment, "answers": {q: [{"answer": a, "at": 0}] for q, a in answers.items()}}))
    return dest
