"""Build the student edition: ``ptgrade student-edition --out DIR`` (``make student-edition``).

From the repository (a clean clone is enough: everything it reads is committed), into ``DIR``:

* ``DIR/`` is a folder a student can clone (or an instructor can push as a repository of its own):
  ``notebooks/<slug>/<slug>.ipynb``, ``src/ptinternals/`` (the student package), ``pyproject.toml``,
  ``README.md`` (how to install and work), ``EDITION.md`` (what is in it, what is not, and why);
* ``DIR/dist/ptinternals-<version>+student-py3-none-any.whl``: the same package as a wheel a hub
  administrator can ``pip install`` (``dist/`` is git-ignored in ``DIR``).

The steps (each module of :mod:`ptinternals.edition` explains its part): copy what ships
(:mod:`.manifest`); cut each chapter's checks down to judging code (:mod:`.checks`) and record its
visible cases as data (``grading.visible``); write each chapter package's ``__init__`` and the
stand-ins a locked cell needs; record the demonstrations that need the reference and write the
notebooks (:mod:`.notebooks`); import every shipped module with nothing but the edition on the
path; scan every file for solution code (:mod:`.scan`); build the wheel. Any failure stops the build.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from .. import __version__, course
from . import manifest
from .checks import EditionError, slice_checks
from .notebooks import StaleRecording, analyse, committed, edition_notebook, key, record, verify
from .scan import (
    MIN_REFERENCE_FRAGMENT_NODES,
    MIN_REFERENCE_NODES,
    ScanReport,
    bodies_of,
    public_texts,
    scan,
    scan_texts,
    solution_corpus,
)

ROOT = Path(__file__).resolve().parents[3]
VERSION = f"{__version__}+student"


@dataclasses.dataclass
class Report:
    out: Path
    files: list[str] = dataclasses.field(default_factory=list)
    lines: list[str] = dataclasses.field(default_factory=list)  # EDITION.md
    scan: ScanReport | None = None
    wheel: Path | None = None
    failed_live: dict = dataclasses.field(default_factory=dict)  # slug -> {cell id: error}: recorded for it
    recordings: dict = dataclasses.field(default_factory=dict)  # slug -> what scripts/record_demonstrations.py commits
    seconds: dict = dataclasses.field(default_factory=dict)

    def say(self, text: str = "") -> None:
        self.lines.append(text)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _data_dataclasses(tree) -> set[str]:
    """Qualified names of the dataclasses the recorded data refers to."""
    out = set()
    if isinstance(tree, dict):
        if "__dataclass__" in tree:
            out.add(tree["__dataclass__"])
        for v in tree.values():
            out |= _data_dataclasses(v)
    elif isinstance(tree, list):
        for v in tree:
            out |= _data_dataclasses(v)
    return out


def _package_init(slug: str, shipped: set[str], standins: set[str]) -> str:
    """``ptinternals/<slug>/__init__.py`` for the edition: the repository's re-exports of shipped modules,
    stand-ins for what a locked cell imports, and a clear error for any other name of the reference."""
    init = manifest.PACKAGE / slug / "__init__.py"
    tree = ast.parse(init.read_text()) if init.exists() else ast.Module([], [])
    doc = (ast.get_docstring(tree) or f"The {slug} chapter's package.").split("\n\n")[0]
    keep, withheld = [], {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            module = f"ptinternals.{slug}.{node.module}"
            if module in shipped:
                keep.append(ast.unparse(node))
            else:
                withheld.update({a.asname or a.name: module for a in node.names})
    files = sorted(m.rsplit(".", 1)[1] for m in shipped if m.startswith(f"ptinternals.{slug}."))
    lines = [f'"""{doc}', "",
             f"Student edition: this package holds only {', '.join(files) or 'stand-ins'} (what the exercises build on",
             "and teaching helpers). The reference implementation is part of the full course repository;",
             'importing one of its names raises ImportError saying so."""', ""]
    lines += keep
    if standins:
        lines += ["from ..recorded import withheld as _withheld", ""]
        lines += [f"{name} = _withheld({f'ptinternals.{slug}.{name}'!r})" for name in sorted(standins)]
    lines += ["", f"_REFERENCE = {dict(sorted(withheld.items()))!r}", "", "",
              "def __getattr__(name):",
              "    if name in _REFERENCE:",
              "        raise ImportError(f\"{name} ({_REFERENCE[name]}) is part of the course's reference implementation, \"",
              "                          f\"which the student edition does not include\")",
              "    raise AttributeError(f\"module {__name__!r} has no attribute {name!r}\")", ""]
    return "\n".join(lines)


def _standin_module(module: str, names: set[str], needs: list[str]) -> str:
    what = ", ".join(sorted({n.rsplit(".", 1)[0] if n.count(".") > 2 else n for n in needs}))
    lines = [f'"""Stand-in for {module}, which the student edition cannot ship: it draws with {what},',
             "part of the course's reference implementation. The notebook cells that use these names show what",
             'they produced when the edition was built (%%recorded)."""', "",
             "from ..recorded import withheld", ""]
    lines += [f"{name} = withheld({f'{module}.{name}'!r}, {what!r})" for name in sorted(names)]
    return "\n".join(lines) + "\n"


def build(out: Path, root: Path = ROOT, *, wheel: bool = True, jobs: int = 2, chapters: list[str] | None = None,
          verify_notebooks: bool = True, committed_only: bool = False, fresh: bool = False, log=print) -> Report:
    """Build the student edition into ``out`` (emptied first, if it holds a previous edition), with every
    chapter, or only ``chapters`` (slugs: a class that covers part of the course).

    The demonstrations that need the reference come from the committed recordings when they are current
    (:func:`.notebooks.record`); ``committed_only``: from nothing else (a stale one stops the build: no
    notebook runs with the reference); ``fresh``: not from them (``scripts/record_demonstrations.py``).
    ``verify_notebooks``: run the edition's notebooks with nothing but the edition (a demonstration that
    fails there is recorded too); a current committed recording already knows those cells."""
    t_start = time.perf_counter()
    out = Path(out).resolve()
    marker = out / ".student-edition"  # written first: a half-built edition is recognised and replaced too
    if out.exists():
        if any(out.iterdir()) and not marker.exists():
            raise EditionError(f"{out} is not empty and holds no student edition: refusing to overwrite it")
        shutil.rmtree(out)
    _write(marker, f"built by ptgrade student-edition from {root}\n")
    src = out / "src" / "ptinternals"
    report = Report(out)
    chapters = _select(root, chapters)

    # 1. What ships as it is.
    files, shipped, withheld_helpers, figures, withheld_figures = _what_ships(chapters)
    for f in sorted(set(files)):
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(manifest.PACKAGE / f, src / f)
    # An edition module imports only what ships, anywhere in it (a function's import of the reference runs
    # in a student's kernel too): a lazy import of a module left out stops the build.
    unmet = {f: sorted(manifest.describe(t) for t in manifest.imports_of(f) if not manifest.importable(t, shipped))
             for f in files if f.endswith(".py")}
    unmet = {f: names for f, names in unmet.items() if names}
    if unmet:
        raise EditionError("modules the student edition ships import course code it does not ship:\n  " + "\n  ".join(
            f"{f}: {', '.join(names)}" for f, names in sorted(unmet.items())))
    third = {f: sorted({n.split(".")[0] for n in manifest.other_imports_of(f) if not manifest.third_party_ok(n)})
             for f in files if f.endswith(".py")}
    third = {f: names for f, names in third.items() if names}
    if third:
        raise EditionError("modules the student edition ships import packages students do not install with it:\n  "
                           + "\n  ".join(f"{f}: {', '.join(names)}" for f, names in sorted(third.items())))
    _write(src / "__init__.py", f'"""PyTorch Internals, hands-on: the student edition (checks, scaffolds, figures, quizzes).\n\n'
           f"The reference implementations, the hidden cases and the grader are part of the full course\n"
           f'repository; see EDITION.md beside this package\'s source."""\n\n__version__ = {VERSION!r}\nEDITION = "student"\n')
    _write(src / "checks" / "__init__.py", '"""Each chapter\'s checks, cut down to judging code, with its visible cases as data."""\n')
    _write(src / "recordings" / "__init__.py", '"""Outputs of demonstrations recorded when the edition was built."""\n')

    # 2. Checks: judging code and visible cases as data.
    from ..grading.visible import write_chapter

    t0 = time.perf_counter()
    sliced = {}
    for ch in chapters:
        write_chapter(ch, src / "checks")
        data = json.loads((src / "checks" / f"{ch.slug}.visible.json").read_text())
        roots = {q.split(":", 1)[1].split(".")[0] for q in _data_dataclasses(data)
                 if q.startswith(f"ptinternals.checks.{ch.slug}:")}
        sliced[ch.slug] = slice_checks(ch.slug, shipped=shipped, extra_roots=roots)
        _write(src / "checks" / f"{ch.slug}.py", sliced[ch.slug].source)
    report.seconds["checks"] = time.perf_counter() - t0

    # 3. Notebooks: which cells run live, which are recorded; stand-ins for locked cells.
    chapter_packages, available = _availability(chapters, shipped)
    notebooks, plans, fails = _plans(root, chapters, available, fresh)
    standins: dict[str, set[str]] = {}
    for plan in plans.values():
        for module, names in plan.standins.items():
            standins.setdefault(module, set()).update(names)
    for pkg in sorted(chapter_packages | {m for m in standins if m.count(".") == 1 and m != "ptinternals"}):
        slug = pkg.split(".")[1]
        _write(src / slug / "__init__.py", _package_init(slug, shipped, standins.pop(pkg, set())))
    for module, names in sorted(standins.items()):
        rel = Path(*module.split(".")[1:]).with_suffix(".py")
        needs = withheld_figures.get(str(rel), ["the course's reference implementation"])
        _write(src / rel, _standin_module(module, names, needs))

    # Record, write the notebooks, run them with nothing but the edition; a demonstration that fails there
    # needs the reference in a way no name shows (importing it installs defaults): record it too, again.
    t0 = time.perf_counter()
    outputs: dict[str, dict] = {}
    pending = list(plans)
    for _attempt in range(4):
        log(f"recording {sum(len(plans[s].recorded) for s in pending)} demonstration cells "
            f"({', '.join(s for s in pending if plans[s].recorded) or 'none'})")
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = {slug: pool.submit(record, notebooks[slug], plans[slug], root, log=log,
                                         committed_only=committed_only, fresh=fresh) for slug in pending}
            try:
                outputs.update({slug: f.result() for slug, f in futures.items()})
            except StaleRecording as e:
                raise EditionError(str(e)) from None
        for slug in pending:
            (out / "notebooks" / slug).mkdir(parents=True, exist_ok=True)
            nbformat.write(edition_notebook(notebooks[slug], plans[slug], outputs[slug]),
                           out / "notebooks" / slug / f"{slug}.ipynb")
            if outputs[slug]:
                _write(src / "recordings" / f"{slug}.json",
                       json.dumps({"format": 1, "chapter": slug, "cells": outputs[slug]}, indent=None) + "\n")
        if not verify_notebooks:
            break
        log(f"running the edition's notebooks: {', '.join(pending)}")
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = {slug: pool.submit(_verify, out, slug) for slug in pending}
            try:
                failed = {slug: f.result() for slug, f in futures.items()}
            except RuntimeError as e:
                raise EditionError(str(e)) from None
        pending = [slug for slug in pending if failed[slug]]
        if not pending:
            break
        for slug in pending:
            fails[slug].update(failed[slug])
            log(f"  {slug}: {len(failed[slug])} demonstration(s) fail without the reference: recorded too")
            plans[slug] = analyse(notebooks[slug], slug, available, fails[slug])
    else:
        raise EditionError(f"notebooks still failing in the edition after recording: {pending}")
    report.seconds["notebooks"] = time.perf_counter() - t0
    report.failed_live = fails
    report.recordings = {slug: {"format": 1, "chapter": slug, "key": key(notebooks[slug], slug, root),
                                "fails_live": fails[slug],
                                "cells": {cid: [dict(o) for o in outs] for cid, outs in outputs[slug].items()}}
                         for slug in plans if outputs.get(slug)}

    # 4. The folder's own files.
    _write(out / "pyproject.toml", PYPROJECT.format(version=VERSION))
    _write(out / "README.md", README)
    _write(out / ".gitignore", "dist/\nbuild/\n*.egg-info/\n.venv/\n__pycache__/\n*.answers.json\n.ipynb_checkpoints/\n")

    # 5. Everything imports with nothing but the edition.
    t0 = time.perf_counter()
    _import_all(out)
    report.seconds["imports"] = time.perf_counter() - t0

    for cache in sorted(out.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache)

    # 6. The manifest, then the scan.
    report.files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    _manifest(report, chapters, files, figures, {**withheld_helpers, **withheld_figures}, sliced, plans,
              standins_all(plans))
    t0 = time.perf_counter()
    withheld_files = sorted(p for slug in course.SLUGS if (manifest.PACKAGE / slug).is_dir()
                            for p in (manifest.PACKAGE / slug).rglob("*.py")
                            if str(p.relative_to(manifest.PACKAGE)) not in files)
    scan_report = ScanReport()
    from ..grading.sandbox import ALLOWED_FILES

    sandbox = [manifest.PACKAGE / f for f in manifest._expand(ALLOWED_FILES)
               + [f for ch in chapters for f in manifest._expand(ch.sandbox_files)] if f.endswith(".py")]
    public = public_texts(root, [ch.slug for ch in chapters], sandbox)
    bodies, fragments = solution_corpus(root, [ch.slug for ch in chapters], withheld_files, scan_report, public)
    dropped_bodies, dropped_fragments = [], []
    for slug, s in sliced.items():  # the checks code the edition dropped: case drawing, expected answers
        b, f = _dropped_checks_bodies(slug, s.dropped)
        dropped_bodies += b
        dropped_fragments += f
    # a left-out body that the kept judging code repeats (a nested helper of `expected` written again in a
    # `compare` helper) ships by design: not searched
    kept = [(f"checks/{slug}.py (judging code kept)", s.source) for slug, s in sliced.items()]
    public_hits = {f.origin for f in scan_texts(public + kept, dropped_bodies, dropped_fragments, ScanReport())}
    scan_report.public += sorted(public_hits)
    bodies += [b for b in dropped_bodies if b.origin not in public_hits]
    fragments += [f for f in dropped_fragments if f.origin not in public_hits]
    if wheel:
        report.wheel = _wheel(out)
    report.scan = scan(out, bodies, fragments, scan_report)
    report.seconds["scan"] = time.perf_counter() - t0
    report.say("")
    report.say("## The clean scan")
    report.say("")
    report.say(f"{scan_report.bodies} function bodies ({len(scan_report.too_small)} more too short to search) and "
               f"{scan_report.fragments} large blocks of the solutions, of the reference modules left out and of the "
               f"checks code left out, normalised (names renamed, strings blanked), searched in {scan_report.texts} "
               f"Python texts of {scan_report.files} files (wheel included): {len(scan_report.findings)} found. Not "
               f"searched because students have them by design (the repository's student notebooks give them, or the "
               f"grading sandbox ships them): {len(scan_report.public)}.")
    _write(out / "EDITION.md", "\n".join(report.lines) + "\n")
    report.files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    if scan_report.findings:
        found = "\n  ".join(f"{f.origin} ({f.kind}) in {f.where}" for f in scan_report.findings[:20])
        raise EditionError(f"solution code found in the student edition ({len(scan_report.findings)}):\n  {found}")
    report.seconds["total"] = time.perf_counter() - t_start
    return report


def _select(root: Path, chapters: list[str] | None) -> list:
    known = [ch for ch in manifest.course_chapters() if (root / "notebooks" / ch.slug / f"{ch.slug}.ipynb").exists()]
    unknown = sorted(set(chapters or ()) - {ch.slug for ch in known})
    if unknown:
        raise EditionError(f"unknown chapters {unknown}; the chapters are: {', '.join(ch.slug for ch in known)}")
    return [ch for ch in known if not chapters or ch.slug in chapters]


def _what_ships(chapters):
    """(files, module names, judging helpers left out, figures, figures left out) for an edition of ``chapters``."""
    left_out = {f"checks/probes/{slug}.py" for slug in course.SLUGS} - {f"checks/probes/{ch.slug}.py" for ch in chapters}
    files = [f for f in manifest._expand(manifest.CLIENT_FILES) if f not in left_out]  # probes of chapters built
    for ch in chapters:
        files += manifest.chapter_files(ch)
    shipped = {manifest.module_name(f) for f in files if f.endswith(".py")} | {"ptinternals"}
    helpers, withheld_helpers = manifest.judging_helpers(shipped)
    files += helpers
    shipped |= {manifest.module_name(f) for f in helpers}
    figures, withheld_figures = manifest.figures_that_ship(chapters, shipped)
    files += figures
    shipped |= {manifest.module_name(f) for f in figures}
    return files, shipped, withheld_helpers, figures, withheld_figures


def _availability(chapters, shipped: set[str]):
    """The chapter packages the edition generates, and ``available(module, name)`` for :func:`.notebooks.analyse`."""
    chapter_packages = {f"ptinternals.{ch.slug}" for ch in chapters
                        if any(m.startswith(f"ptinternals.{ch.slug}.") for m in shipped)}
    reexports = {pkg: manifest._reexports(pkg, shipped) for pkg in chapter_packages}
    file_modules = shipped - chapter_packages

    def available(module: str, name: str | None) -> bool:
        if module == "ptinternals":
            return name is None or (f"ptinternals.{name}" in file_modules)
        if module in chapter_packages:
            return name is not None and (name in reexports[module] or f"{module}.{name}" in file_modules)
        return module in file_modules

    return chapter_packages, available


def _plans(root: Path, chapters, available, fresh: bool):
    """Each chapter's notebook, its plan, and the cells known to fail without the reference (from its
    committed recording, when current)."""
    plans, notebooks = {}, {}
    fails: dict[str, dict[str, str]] = {}
    for ch in chapters:
        nb = nbformat.read(root / "notebooks" / ch.slug / f"{ch.slug}.ipynb", as_version=4)
        notebooks[ch.slug] = nb
        saved = None if fresh else committed(ch.slug, root)
        fails[ch.slug] = dict(saved["fails_live"]) if saved and saved.get("key") == key(nb, ch.slug, root) else {}
        try:
            plans[ch.slug] = analyse(nb, ch.slug, available, fails[ch.slug])
        except ValueError as e:
            raise EditionError(str(e)) from None
    return notebooks, plans, fails


def plans_for(root: Path = ROOT, chapters: list[str] | None = None) -> dict:
    """``{slug: (notebook, plan)}`` as a build of ``chapters`` would make them (no file written)."""
    chapters = _select(root, chapters)
    _, shipped, *_ = _what_ships(chapters)
    _, available = _availability(chapters, shipped)
    notebooks, plans, _ = _plans(root, chapters, available, fresh=False)
    return {slug: (notebooks[slug], plans[slug]) for slug in plans}


def standins_all(plans) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for plan in plans.values():
        for module, names in plan.standins.items():
            out.setdefault(module, set()).update(names)
    return out


def _dropped_checks_bodies(slug: str, dropped: list[str]):
    path = manifest.PACKAGE / "checks" / f"{slug}.py"
    tree = ast.parse(path.read_text())
    wanted = set(dropped)
    bodies, fragments = [], []
    for node in tree.body:
        items = [(node.name, node)] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
        if isinstance(node, ast.ClassDef):
            items += [(f"{node.name}.{m.name}", m) for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for name, fn in items:
            if name in wanted:
                b, f = bodies_of(ast.unparse(fn), f"checks/{slug}.py (left out): {name}",
                                 min_nodes=MIN_REFERENCE_NODES, min_fragment_nodes=MIN_REFERENCE_FRAGMENT_NODES)
                bodies += b
                fragments += f
    return bodies, fragments


def _verify(out: Path, slug: str) -> dict[str, str]:
    nb = nbformat.read(out / "notebooks" / slug / f"{slug}.ipynb", as_version=4)
    return verify(nb, slug, out / "src", _site_dirs())


def _site_dirs() -> list[str]:
    import site

    return [p for p in site.getsitepackages() if os.path.isdir(p)]


def _import_all(out: Path) -> None:
    """Import every module of the edition in a fresh interpreter that sees only the edition and the
    third-party packages (``-I -S``: no .pth files, so no editable install of the repository)."""
    src = out / "src"
    modules = sorted(manifest.module_name(str(p.relative_to(src / "ptinternals"))) for p in (src / "ptinternals").rglob("*.py"))
    code = textwrap.dedent(f"""
        import importlib, sys
        sys.path[:0] = [{str(src)!r}] + {_site_dirs()!r}
        failed = []
        for name in {modules!r}:
            try:
                importlib.import_module(name)
            except Exception as e:
                failed.append(f"{{name}}: {{type(e).__name__}}: {{e}}")
        import ptinternals
        assert ptinternals.__file__.startswith({str(src)!r}), ptinternals.__file__
        print("\\n".join(failed))
        sys.exit(1 if failed else 0)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PTINTERNALS_REPO")}
    env.setdefault("TRITON_INTERPRET", "1")
    proc = subprocess.run([sys.executable, "-I", "-S", "-B", "-c", code], capture_output=True, text=True, env=env,
                          cwd=out, timeout=600)
    if proc.returncode:
        raise EditionError(f"modules of the student edition do not import on their own:\n{proc.stdout}{proc.stderr[-3000:]}")


def _wheel(out: Path) -> Path:
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("setuptools")
    except PackageNotFoundError:
        found = "none"
    if not found[0].isdigit() or int(found.split(".")[0]) < 77:
        raise EditionError(f"building the wheel needs setuptools >= 77 in this environment (found {found}): "
                           f"{sys.executable} -m pip install -U 'setuptools>=77'")
    dist = out / "dist"
    dist.mkdir(exist_ok=True)
    with tempfile_dir() as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                               "-q", "-w", str(dist), str(out)], capture_output=True, text=True, cwd=tmp, timeout=600)
    for leftover in ("build", "src/ptinternals.egg-info"):
        shutil.rmtree(out / leftover, ignore_errors=True)
    if proc.returncode:
        raise EditionError(f"building the wheel failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return next(dist.glob("ptinternals-*.whl"))


def tempfile_dir():
    import tempfile

    return tempfile.TemporaryDirectory(prefix="ptedition-")


def _manifest(report: Report, chapters, files, figures, withheld_figures, sliced, plans, standins) -> None:
    say = report.say
    say(f"# The student edition of PyTorch Internals, hands-on ({VERSION})")
    say("")
    say("Built by `ptgrade student-edition` from the course repository. It holds what a student needs to do the")
    say("course and nothing a student is graded on: the notebooks, the checking client, the scaffolds the")
    say("exercises build on, figures and quizzes. The reference implementations, the hidden cases, the code")
    say("that draws cases and computes expected answers, and the graded quiz answers stay in the repository.")
    say("")
    say("## Shipped as they are")
    say("")
    for f in sorted(files):
        say(f"- `src/ptinternals/{f}`")
    say("")
    say("Figures (`viz/<slug>.py`) and the checks' shared judging helpers (`checks/*.py` that are no chapter's")
    say("checks) ship when everything they import ships. Left out, with a stand-in where a locked cell imports")
    say("a figure (calling one says why; the cells that draw them are recorded):")
    say("")
    for rel, missing in sorted(withheld_figures.items()):
        say(f"- `{rel}`: needs {', '.join(sorted({m.rsplit('.', 1)[0] if m.count('.') > 2 else m for m in missing}))}")
    say("")
    say("## Generated")
    say("")
    say("- `checks/<slug>.py`: the chapter's checks cut down to judging code (compare, diagnose, summary and")
    say("  the helpers they use); `checks/<slug>.visible.{json,npz}`: the visible cases and expected answers,")
    say("  recorded from the repository's checks (values, not code).")
    say("- `<slug>/__init__.py`: re-exports of the shipped modules only; any other name says it is withheld.")
    say("- `recordings/<slug>.json`: outputs of the demonstrations that need the reference (below).")
    say("")
    say("Judging code withheld (it re-implements something graded; the check then gives no likely cause, or,")
    say("for a compare, says the answer is checked at grading):")
    say("")
    for slug, s in sliced.items():
        for w in s.withheld:
            say(f"- `checks/{slug}.py`: `{w}`")
    say("")
    say("## Notebooks")
    say("")
    say("| chapter | code cells live | recorded | why recorded (names from code the edition does not ship) |")
    say("|---|---|---|---|")
    for ch in chapters:
        plan = plans[ch.slug]
        why = sorted({n for names in plan.recorded.values() for n in names})
        say(f"| {ch.slug} | {plan.live} | {len(plan.recorded)} | {', '.join(why[:12])}{' ...' if len(why) > 12 else ''} |")
    failed = [(slug, cid, err) for slug, cells in report.failed_live.items() for cid, err in cells.items()]
    if failed:
        say("")
        say("Recorded because they failed when the edition's notebook ran (they need the reference in a way no")
        say("name shows, such as defaults its import installs into the scaffold), and the cells after them that")
        say("use what they define:")
        say("")
        for slug, cid, err in failed:
            say(f"- {slug}, cell `{cid}`: {err}")
    if standins:
        say("")
        say("Stand-ins for names a locked setup cell imports: " +
            "; ".join(f"`{m}`: {', '.join(sorted(n))}" for m, n in sorted(standins.items())))


PYPROJECT = """\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "ptinternals"
version = "{version}"
description = "PyTorch Internals, hands-on: the student edition (notebooks' checks, scaffolds, figures, quizzes)"
readme = "README.md"
requires-python = ">=3.10"
license = "MIT"
dependencies = [
    "torch>=2.11",
    "numpy>=1.26",
    "matplotlib>=3.8",
    "ipywidgets>=8",
    "jupyterquiz>=2.9",
    "nbformat>=5",
    "pyyaml>=6",
]

[project.optional-dependencies]
triton = ["triton>=3.6"]
lab = ["jupyterlab>=4", "ipykernel>=6"]

[project.scripts]
ptgrade = "ptinternals.grading.student_cli:main"

[tool.setuptools.packages.find]
where = ["src"]

[tool.setuptools.package-data]
"*" = ["*.json", "*.npz", "*.txt.gz"]
"""

README = """\
# PyTorch Internals, hands-on: student edition

The chapter notebooks of the course, with everything they need to run and to check your work, and
none of the solutions. Your instructor grades your notebooks with the full course.

## Install

```bash
python3 -m venv .venv
.venv/bin/pip install -e ".[lab,triton]"    # on Linux without a GPU, first: export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
.venv/bin/jupyter lab notebooks/
```

On a JupyterHub the course package is already installed: open the notebooks your instructor released.

## Work

In each chapter notebook: run the cells from the top; replace `raise NotImplementedError()` in each
answer cell with your code and run the check cell below it (it runs the visible cases; the grader runs
many more). Answer the quizzes: *practice* questions tell you at once whether you are right (no
points); *graded* ones only record your answer (the last one counts) in `<chapter>.answers.json`.
A few demonstrations run the course's reference implementation, which is not part of this edition:
their cells start with `%%recorded` and show what they printed and drew when this edition was built.

Before submitting: `.venv/bin/ptgrade validate notebooks/<chapter>/<chapter>.ipynb`, then submit the
notebook **and** its `<chapter>.answers.json`.
"""
