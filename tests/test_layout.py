"""The layout's rules (CONTRIBUTING.md), checked on the source: who may import what, and one name per chapter.

- A reference package (``ptinternals/<slug>/``) never imports grading or checks: it is the textbook, and
  it must be usable (and shippable) without the grader.
- What the grading sandbox ships (sandbox-side probes, chapter scaffolds, the runtime) imports only the
  standard library, torch, numpy, triton and other sandbox-visible modules: never a reference.
- Every chapter in ``ptinternals.course`` is one slug naming all its parts.
"""
from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

from ptinternals import course
from ptinternals.grading.exercise import graded_chapters, load_chapter
from ptinternals.grading.sandbox import ALLOWED_FILES, build_site

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "ptinternals"
SHARED = {"grading", "checks", "quiz", "viz", "edition"}  # not chapters


def _imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(PKG.parent).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                names.add(".".join(base + ([node.module] if node.module else [])))
            else:
                names.add(node.module or "")
    return names


def reference_packages() -> list[Path]:
    return sorted(p for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists() and p.name not in SHARED)


@pytest.mark.parametrize("package", reference_packages(), ids=lambda p: p.name)
def test_reference_packages_never_import_grading_or_checks(package):
    offenders = {f"{py.relative_to(PKG)} imports {name}"
                 for py in package.rglob("*.py") for name in _imports(py)
                 if name.startswith(("ptinternals.grading", "ptinternals.checks"))}
    assert not offenders, sorted(offenders)


def test_every_package_is_a_chapter_or_shared():
    names = {p.name for p in reference_packages()}
    assert names <= set(course.SLUGS), f"packages that are no chapter in ptinternals.course: {names - set(course.SLUGS)}"


@pytest.mark.parametrize("slug", course.SLUGS)
def test_a_chapter_is_one_slug(slug):
    """The slug names the reference package, its checks, notebook source, quiz, tests and figures."""
    assert (PKG / slug / "__init__.py").exists()
    if not (ROOT / "solutions" / f"{slug}.py").exists():
        pytest.skip(f"{slug} has no notebook yet")
    chapter = load_chapter(slug)
    assert chapter.slug == chapter.assignment == slug
    assert all(ex.id.startswith(f"{slug}.") for ex in chapter.exercises)
    for path in (f"src/ptinternals/checks/{slug}.py", f"solutions/quizzes/{slug}.yaml", f"tests/{slug}/buggy.py",
                 f"solutions/{slug}/{slug}.ipynb", f"notebooks/{slug}/{slug}.ipynb",
                 f"src/ptinternals/quiz/banks/{slug}.json", f"src/ptinternals/viz/{slug}.py"):
        assert (ROOT / path).exists(), path


def test_no_chapter_number_in_ids_or_file_names():
    for chapter in graded_chapters():
        for ex in chapter.exercises:
            assert not any(part[:2] == "ch" and part[2:4].isdigit() for part in ex.id.split(".")), ex.id
    numbered = [p for p in (ROOT / "solutions").rglob("*") if p.name[:2] == "ch" and p.name[2:4].isdigit()]
    assert not numbered, numbered


def test_old_names_say_what_they_are_called_now():
    with pytest.raises(KeyError, match="now 'allocator'"):
        load_chapter("ch04_allocator")
    with pytest.raises(KeyError, match="the chapters are: strides, autograd"):
        load_chapter("nonsense")


def test_exercise_numbers_follow_the_book_order():
    for chapter in graded_chapters():
        n = course.number(chapter.slug)
        assert [ex.number for ex in chapter.exercises] == [f"{n}.{i}" for i in range(1, len(chapter.exercises) + 1)]


def test_toc_lists_the_chapters_in_course_order():
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    part = next(p for p in toc["parts"] if p["caption"] == "Chapters")
    listed = [c["file"].split("/")[1] for c in part["chapters"]]
    assert listed == [s for s in course.SLUGS if (ROOT / "solutions" / f"{s}.py").exists()]


# ---- what the sandbox ships imports nothing it does not ship -------------------------------------------
SANDBOX_ROOTS = {"__future__", "torch", "numpy", "triton", "typing", "dataclasses"} | set(sys.stdlib_module_names)


def _sandbox_files() -> list[tuple[str, str, frozenset]]:
    """(chapter, file relative to the package, module names the chapter's sandbox has) for every file a
    chapter's grading may run: the shared sandbox files, that chapter's probes and its scaffolds."""
    import tempfile

    out = []
    for chapter in graded_chapters():
        with tempfile.TemporaryDirectory() as tmp:
            names = frozenset(build_site(Path(tmp), chapter.sandbox_files))
            files = sorted(str(p.relative_to(Path(tmp) / "ptinternals")) for p in (Path(tmp) / "ptinternals").rglob("*.py"))
        other_probes = {f"checks/probes/{s}.py" for s in course.SLUGS if s != chapter.slug}
        out += [(chapter.slug, f, names) for f in files if f not in other_probes]
    return out


@pytest.mark.parametrize("slug, rel, shipped", _sandbox_files(), ids=lambda x: x if isinstance(x, str) else "")
def test_sandbox_code_imports_only_what_the_sandbox_has(slug, rel, shipped):
    missing = {name for name in _imports(PKG / rel)
               if name.split(".")[0] not in SANDBOX_ROOTS and name not in shipped}
    assert not missing, f"{rel} imports {sorted(missing)}, which the {slug} chapter's grading sandbox does not have"


def test_sandbox_allows_no_reference_file():
    for pattern in ALLOWED_FILES:
        assert not any(pattern.startswith(f"{slug}/") for slug in course.SLUGS), pattern


def test_checks_modules_import_cleanly_in_book_order():
    for slug in course.SLUGS:
        if (PKG / "checks" / f"{slug}.py").exists():
            assert importlib.import_module(f"ptinternals.checks.{slug}").CHAPTER.slug == slug


def test_the_introduction_lists_every_chapter_in_book_order():
    """book/intro.md's table names each chapter of ptinternals.course, in order (without numbers)."""
    text = (ROOT / "book" / "intro.md").read_text()
    rows = [line.split("|")[1].strip() for line in text.splitlines()
            if line.startswith("| ") and not line.startswith(("| chapter", "|---"))]
    with_notebook = [s for s in course.SLUGS if (ROOT / "solutions" / f"{s}.py").exists()]
    assert len(rows) == len(with_notebook), (rows, with_notebook)
    for row, slug in zip(rows, with_notebook):
        words = {w.strip("`,:()").lower() for w in course.title(slug).split()}
        assert words & {w.strip("`,:()").lower() for w in row.split()} - {"the", "and", "a", "of"}, (row, slug)
