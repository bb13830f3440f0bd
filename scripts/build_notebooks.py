"""Build the course's notebooks from their text sources (one source of truth, STYLE.md 9).

    solutions/<slug>.py  --(this script)-->  solutions/<slug>/<slug>.ipynb   (nbgrader source)
                         --(nbgrader generate_assignment)-->  notebooks/<slug>/<slug>.ipynb
    solutions/quizzes/<slug>.yaml  -->  src/ptinternals/quiz/banks/<slug>.json (hashed answers)
    ptinternals.course.CHAPTERS  -->  the "Chapters" part of _toc.yml (book order)

The source format is "percent" Python (like jupytext's) with course cell markers:

    # %% [markdown]          a markdown cell (each line starts with "# ")
    # %%                     a plain code cell (demonstrations; students may edit and rerun)
    # %% [setup]             a locked code cell the grader runs before the answers (grade_id "setup")
    # %% [answer NAME]       the student's answer cell (nbgrader solution cell "NAME_code"), NAME being
    #                        the local id of the exercise it answers ("view_strides" of "strides.view_strides")
    # %% [tests NAME]        a locked test cell ("NAME_tests"); its points come from the chapter's
    #                        Exercise with that grade_id, so points live in one place
    # %% [quiz]              a locked cell showing quiz questions
    # %% [quiz-grade]        the locked cell that records the quiz score ("quiz"; points = the bank's)

Numbers are never written in a source: markdown cells and quiz texts say

    {{title}}                "Chapter N: <the chapter's title>" (from ptinternals.course)
    {{chapter SLUG}}         "chapter N", a link to that chapter's notebook ({{Chapter SLUG}}: "Chapter N")
    {{number SLUG}}          "N"
    {{exercise NAME}}        "Exercise N.k" of this chapter's exercise NAME (or of SLUG.NAME elsewhere)

so inserting a chapter in ptinternals.course renumbers the book on the next build.

Test and quiz-grade cells are tagged ``raises-exception`` and ``remove-output``: the book runs them (in the
student version they report "not implemented yet") and shows them as tasks, without their output.

Usage: python scripts/build_notebooks.py [--check] [chapter ...]
  --check   build into a temporary folder and fail if any committed file differs (used by the tests)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ptinternals import course  # noqa: E402
from ptinternals.grading.exercise import ANSWER_STUB, load_chapter  # noqa: E402
from ptinternals.quiz.bank import compile_bank  # noqa: E402

MARKER = re.compile(r"^# %%(?:\s*\[(?P<kind>[^\]]+)\])?\s*$")
TOKEN = re.compile(r"\{\{(?P<kind>title|chapter|Chapter|number|exercise)(?: (?P<arg>[\w.]+))?\}\}")


def expand(text: str, chapter) -> str:
    """Replace the number tokens in ``text`` (see the module docstring) for ``chapter``'s notebook."""

    def one(m: re.Match) -> str:
        kind, arg = m.group("kind"), m.group("arg")
        try:
            if kind == "title":
                return f"Chapter {course.number(chapter.slug)}: {course.title(chapter.slug)}"
            if kind in ("chapter", "Chapter"):
                return course.chapter_link(arg, capital=kind == "Chapter", here=chapter.slug)
            if kind == "number":
                return str(course.number(arg))
            ex_id = arg if "." in arg else f"{chapter.slug}.{arg}"
            return f"Exercise {load_chapter(ex_id).exercise(ex_id).number}"
        except (KeyError, TypeError) as e:
            raise SystemExit(f"{chapter.slug}: bad token {m.group(0)}: {e}") from None

    return TOKEN.sub(one, text)


def _nbgrader(grade_id: str, *, grade=False, solution=False, locked=False, points=None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution,
            "task": False}
    if points is not None:
        meta["points"] = points
    return meta


def parse_source(text: str, chapter) -> nbformat.NotebookNode:
    """Turn a percent-format source into an nbgrader source notebook."""
    points = {ex.grade_id: ex.points for ex in chapter.exercises}
    quiz_points = None
    if chapter.quiz_grade_id:
        from ptinternals.quiz.bank import load_bank

        quiz_points = load_bank(chapter.assignment).total_points
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        m = MARKER.match(line)
        if m:
            blocks.append(((m.group("kind") or "code").strip(), []))
        elif blocks:
            blocks[-1][1].append(line)
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    seen_ids: set[str] = set()
    quiz_n = 0
    for kind, lines in blocks:
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
        words = kind.split()
        if words[0] == "markdown":
            body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in lines)
            cell = nbformat.v4.new_markdown_cell(expand(body, chapter))
        else:
            cell = nbformat.v4.new_code_cell("\n".join(lines))
            if words[0] == "setup":
                cell.metadata["nbgrader"] = _nbgrader("setup", locked=True)
            elif words[0] == "answer":
                cell.metadata["nbgrader"] = _nbgrader(f"{words[1]}_code", solution=True)
            elif words[0] == "tests":
                gid = f"{words[1]}_tests"
                if gid not in points:
                    raise SystemExit(f"{chapter.assignment}: test cell {gid} matches no Exercise.grade_id in the chapter")
                cell.metadata["nbgrader"] = _nbgrader(gid, grade=True, locked=True, points=points[gid])
                cell.metadata["tags"] = ["raises-exception", "remove-output"]
            elif words[0] == "quiz":
                quiz_n += 1
                cell.metadata["nbgrader"] = _nbgrader(f"quiz_show_{quiz_n}", locked=True)
                cell.metadata["tags"] = ["remove-input"]  # the book shows the quiz, not the call
            elif words[0] == "quiz-grade":
                cell.metadata["nbgrader"] = _nbgrader(chapter.quiz_grade_id, grade=True, locked=True, points=quiz_points)
                cell.metadata["tags"] = ["raises-exception", "remove-output"]
            elif words[0] != "code":
                raise SystemExit(f"{chapter.assignment}: unknown cell marker [{kind}]")
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        base = gid or hashlib.sha1(cell.source.encode()).hexdigest()[:8]
        cid = base
        while cid in seen_ids:
            cid = base + "-" + str(len(seen_ids))
        seen_ids.add(cid)
        cell["id"] = cid
        nb.cells.append(cell)
    missing = [ex.grade_id for ex in chapter.exercises
               if ex.grade_id not in {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells}]
    if missing:
        raise SystemExit(f"{chapter.assignment}: no test cell for {missing}")
    return nb


def build(chapter_name: str, out_root: Path) -> list[Path]:
    """Build one chapter's bank, source notebook and student notebook under ``out_root``."""
    written = []
    chapter = load_chapter(chapter_name)
    quiz_src = ROOT / "solutions" / "quizzes" / f"{chapter_name}.yaml"
    if quiz_src.exists():
        source = yaml.safe_load(expand(quiz_src.read_text(), chapter))
        salt = hashlib.sha256(f"ptinternals-quiz|{chapter_name}".encode()).hexdigest()[:16]
        bank = compile_bank(source, salt)
        path = out_root / "src" / "ptinternals" / "quiz" / "banks" / f"{chapter_name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(bank, indent=1) + "\n")
        written.append(path)
    nb = parse_source((ROOT / "solutions" / f"{chapter_name}.py").read_text(), chapter)
    src_nb = out_root / "solutions" / chapter_name / f"{chapter_name}.ipynb"
    src_nb.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, src_nb)
    written.append(src_nb)
    # The student version, by nbgrader itself (no database: this is for the repository copy).
    course = Path(tempfile.mkdtemp(prefix="ptbuild-"))
    try:
        (course / "source" / chapter_name).mkdir(parents=True)
        shutil.copyfile(src_nb, course / "source" / chapter_name / src_nb.name)
        cfg = course / "nbgrader_config.py"
        cfg.write_text(f"c = get_config()\nc.ClearSolutions.code_stub = {{'python': {ANSWER_STUB!r}}}\n")
        cmd = [sys.executable, "-m", "nbgrader", "generate_assignment", chapter_name, "--no-db", "--force",
               f"--CourseDirectory.root={course}", "--log-level=WARN"]
        proc = subprocess.run(cmd, cwd=course, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"nbgrader generate_assignment failed:\n{proc.stdout}\n{proc.stderr}")
        released = course / "release" / chapter_name / src_nb.name
        student = nbformat.read(released, as_version=4)
        dest = out_root / "notebooks" / chapter_name / src_nb.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(student, dest)
        written.append(dest)
    finally:
        shutil.rmtree(course, ignore_errors=True)
    return written


def chapters() -> list[str]:
    """The chapters with a notebook source, in book order."""
    return [slug for slug in course.SLUGS if (ROOT / "solutions" / f"{slug}.py").exists()]


TOC_BEGIN, TOC_END = "  # BEGIN CHAPTERS (written by scripts/build_notebooks.py from ptinternals.course)", "  # END CHAPTERS"


def build_toc(out_root: Path) -> Path:
    """Rewrite the chapters part of ``_toc.yml``: one entry per chapter notebook, in book order."""
    text = (ROOT / "_toc.yml").read_text()
    if TOC_BEGIN not in text or TOC_END not in text:
        raise SystemExit(f"_toc.yml must hold the lines {TOC_BEGIN.strip()!r} ... {TOC_END.strip()!r}")
    head, rest = text.split(TOC_BEGIN, 1)
    _, tail = rest.split(TOC_END, 1)
    entries = "".join(f"      - file: notebooks/{slug}/{slug}\n" for slug in chapters())
    path = out_root / "_toc.yml"
    path.write_text(f"{head}{TOC_BEGIN}\n  - caption: Chapters\n    chapters:\n{entries}{TOC_END}{tail}")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*", help="chapter names, e.g. strides (default: all)")
    parser.add_argument("--check", action="store_true", help="fail if committed files are out of date")
    args = parser.parse_args(argv)
    names = args.chapters or chapters()
    unknown = [n for n in names if not (ROOT / "solutions" / f"{n}.py").exists()]
    if unknown:
        parser.error(f"no source solutions/<name>.py for {unknown}; known: {chapters()}")
    if not args.check:
        for name in names:
            for path in build(name, ROOT):
                print(f"wrote {path.relative_to(ROOT)}")
        print(f"wrote {build_toc(ROOT).relative_to(ROOT)}")
        return 0
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in [build_toc(Path(tmp))] + [p for name in names for p in build(name, Path(tmp))]:
            committed = ROOT / path.relative_to(tmp)
            if not committed.exists() or committed.read_bytes() != path.read_bytes():
                stale.append(str(committed.relative_to(ROOT)))
    if stale:
        print("out of date (run `make notebooks`):\n  " + "\n  ".join(stale))
        return 1
    print(f"up to date: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
