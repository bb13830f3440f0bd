"""What the student edition ships from the course package, and why.

The rule is one line: **the edition ships what a student needs to do the course, and nothing a
student is graded on.** In files:

* the checking client (``CLIENT_FILES``): ``check`` and the comparisons that judge an answer, the
  sandbox's encoding (so a visible check calls student code exactly as the grader does), quizzes,
  ``ptgrade validate``, the device choice, benchmark helpers, the chapter order, the replay of
  recorded demonstrations;
* every chapter's sandbox files (``Chapter.sandbox_files``: the scaffolds the exercises build on,
  which the grading sandbox ships to student code already) and probes (sandbox side, no solution);
* the checks' shared judging helpers (``checks/*.py`` that are no chapter's checks) when they
  import only what ships;
* every chapter's figures (``viz/<slug>.py``) when they import only what ships;
* a chapter's ``Chapter.student_files``: reference modules that implement nothing graded, shipped as
  teaching helpers because the notebook demonstrates with them;
* generated, per chapter: the checks cut down to judging code (:mod:`.checks`), the visible cases
  as data (:mod:`ptinternals.grading.visible`), the chapter package's ``__init__`` (re-exporting only
  what ships), stand-ins for the figures a locked cell imports but that cannot ship, and the
  recorded outputs of demonstrations that need the reference (:mod:`.notebooks`).

Everything else under ``ptinternals/<slug>/`` (the reference implementation), the trusted grader
(``grading/{trusted,sandbox,classroom,cli,nbgrader_plugin,...}``), the test-bank helpers and this
builder stay in the repository.
"""
from __future__ import annotations

import ast
from pathlib import Path

from .. import course

PACKAGE = Path(__file__).resolve().parents[1]  # .../ptinternals

# The checking client: shipped as is (paths relative to the package).
CLIENT_FILES = (
    "course.py",
    "device.py",
    "benchmark.py",
    "recorded.py",
    "grading/__init__.py",
    "grading/_runtime.py",
    "grading/compare.py",
    "grading/exercise.py",
    "grading/policy.py",  # the static rules check() applies to an answer cell's source (stdlib only)
    "grading/visible.py",
    "grading/validate.py",
    "grading/student_cli.py",
    "checks/probes/*.py",
    "quiz/__init__.py",
    "quiz/answers.py",
    "quiz/bank.py",
    "quiz/widget.py",
    "quiz/banks/*.json",
    "viz/__init__.py",
)


def module_name(rel: str) -> str:
    parts = ["ptinternals", *Path(rel).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _expand(patterns) -> list[str]:
    out = []
    for pattern in patterns:
        found = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.glob(pattern) if p.is_file())
        if not found:
            raise FileNotFoundError(f"the student edition ships {pattern!r}, which matches no file in {PACKAGE}")
        out += found
    return out


def chapter_files(chapter) -> list[str]:
    """The repository files of ``chapter`` that ship as they are: its sandbox and student files."""
    return _expand((*chapter.sandbox_files, *getattr(chapter, "student_files", ())))


def imports_of(rel: str) -> set[str]:
    """Absolute names of the course modules file ``rel`` imports (relative imports resolved)."""
    path = PACKAGE / rel
    package = module_name(rel) if rel.endswith("__init__.py") else module_name(rel).rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("ptinternals")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                names |= {target} if node.module else {f"{target}.{a.name}" for a in node.names}
            elif (node.module or "").startswith("ptinternals"):
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def importable(name: str, shipped: set[str]) -> bool:
    """Is course module ``name`` (or ``module.attribute``) available among ``shipped`` modules?"""
    return name == "ptinternals" or any(name == m or name.startswith(m + ".") or m.startswith(name + ".")
                                        for m in shipped if m != "ptinternals")


def _is_chapter_checks(path: Path) -> bool:
    """Does this checks module define a chapter (``CHAPTER``/``EXERCISES`` at module level)?"""
    tree = ast.parse(path.read_text())
    names = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
             for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    return bool(names & {"CHAPTER", "EXERCISES"})


def judging_helpers(shipped: set[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``checks/*.py`` modules shared by the checks that are no chapter's checks (a chapter's judging code
    may import them), each shipped when everything it imports ships; the others with what they lack.
    A chapter's own checks never ship as they are: the edition cuts them down (:mod:`.checks`)."""
    ok, left_out = [], {}
    for path in sorted((PACKAGE / "checks").glob("*.py")):
        if path.name == "__init__.py" or path.stem in course.SLUGS or _is_chapter_checks(path):
            continue
        rel = str(path.relative_to(PACKAGE))
        missing = sorted(n for n in imports_of(rel) if not importable(n, shipped))
        if missing:
            left_out[rel] = missing
        else:
            ok.append(rel)
    return ok, left_out


def figures_that_ship(chapters, shipped: set[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``viz/<slug>.py`` of each chapter whose course imports all ship; the others with what they lack."""
    ok, withheld = [], {}
    for chapter in chapters:
        rel = f"viz/{chapter.slug}.py"
        if not (PACKAGE / rel).is_file():
            continue
        missing = sorted(n for n in imports_of(rel) if not importable(n, shipped))
        if missing:
            withheld[rel] = missing
        else:
            ok.append(rel)
    return ok, withheld


def course_chapters():
    """Every chapter with checks, in book order."""
    from ..grading.exercise import graded_chapters

    return [ch for ch in graded_chapters() if ch.slug in course.SLUGS]
