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
    "grading/policy_imports.py",  # ... and its closed-import rules (the modules chapter's)
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


# Third-party packages a student has: the edition's dependencies (its pyproject.toml) and what they bring.
# torch requires networkx, sympy, jinja2, fsspec, filelock and typing_extensions; ipykernel brings IPython; yaml
# is pyyaml (quiz/bank.py reads an instructor's YAML with it when one is there).
THIRD_PARTY = frozenset({"torch", "numpy", "matplotlib", "ipywidgets", "jupyterquiz", "nbformat", "triton", "IPython",
                         "ipykernel", "networkx", "sympy", "jinja2", "fsspec", "filelock", "typing_extensions", "yaml"})


def import_targets(node: ast.Import | ast.ImportFrom, module: str) -> list[tuple[str, str | None]]:
    """``(module, name)`` pairs an import statement in course module ``module`` asks for: ``(m, None)`` for
    ``import m``, ``(m, n)`` for ``from m import n`` (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names]
    if node.level:
        package = module.split(".")[: len(module.split(".")) - node.level]
        target = ".".join(package + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [(target, a.name) for a in node.names]


def imports_of(rel: str) -> set[tuple[str, str | None]]:
    """The course imports (``(module, name)``, see :func:`import_targets`) of file ``rel``, anywhere in it."""
    path = PACKAGE / rel
    module = module_name(rel) + (".__init__" if rel.endswith("__init__.py") else "")
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(m, n) for m, n in import_targets(node, module) if m.split(".")[0] == "ptinternals"}
    return out


def other_imports_of(rel: str) -> set[str]:
    """The modules other than the course's that file ``rel`` imports, anywhere in it, except optional ones
    (an import in a ``try`` that catches ImportError: the module works without it)."""
    module = module_name(rel) + (".__init__" if rel.endswith("__init__.py") else "")
    tree = ast.parse((PACKAGE / rel).read_text())
    optional = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try)
                and any(_catches_import_error(h.type) for h in t.handlers)
                for stmt in t.body for n in ast.walk(stmt)}
    return {m for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in optional
            for m, _ in import_targets(node, module) if m.split(".")[0] != "ptinternals"}


def _catches_import_error(kind) -> bool:
    names = {n.id for n in ast.walk(kind) if isinstance(n, ast.Name)} if kind is not None else {"BaseException"}
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def _reexports(package: str, shipped: set[str]) -> set[str]:
    """The names the edition's generated ``__init__`` of a chapter package re-exports: those the
    repository's ``__init__`` imports from modules that ship."""
    init = PACKAGE.joinpath(*package.split(".")[1:], "__init__.py")
    if not init.is_file():
        return set()
    return {a.asname or a.name for n in ast.parse(init.read_text()).body
            if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module and f"{package}.{n.module}" in shipped
            for a in n.names}


def importable(target: tuple[str, str | None], shipped: set[str]) -> bool:
    """Does the edition provide ``import module`` or ``from module import name`` (``target``), given the
    course modules it ships (``shipped``: module names of the files it copies)? Exactly: a submodule that
    ships, a name of a module that ships, or a name a generated package re-exports (the chapter packages
    and ``ptinternals`` itself are generated: being the parent of a shipped module is not enough)."""
    module, name = target
    if name is not None and f"{module}.{name}" in shipped:
        return True
    parts = module.split(".")
    if module == "ptinternals":
        return name in (None, "__version__", "EDITION")
    if len(parts) == 2 and parts[1] in course.SLUGS:  # a chapter package: its __init__ is generated
        if name is None:
            return any(m.startswith(module + ".") for m in shipped)
        return name in _reexports(module, shipped)
    return module in shipped


def third_party_ok(module: str) -> bool:
    """May an edition module import ``module`` (not a course module)? The standard library and the
    packages a student installs with the edition."""
    import sys

    root = module.split(".")[0]
    return root in sys.stdlib_module_names or root in THIRD_PARTY or root == "__future__"


def describe(target: tuple[str, str | None]) -> str:
    module, name = target
    return module if name is None else f"{module}.{name}"


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
        missing = sorted(describe(t) for t in imports_of(rel) if not importable(t, shipped))
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
        missing = sorted(describe(t) for t in imports_of(rel) if not importable(t, shipped))
        if missing:
            withheld[rel] = missing
        else:
            ok.append(rel)
    return ok, withheld


def course_chapters():
    """Every chapter with checks, in book order."""
    from ..grading.exercise import graded_chapters

    return [ch for ch in graded_chapters() if ch.slug in course.SLUGS]
