"""The student edition, end to end: built from the repository, installed where no repository is, run, scanned.

One build (module fixture), installed as a wheel into a fresh virtual environment on the same
interpreter, whose only view of third-party packages (torch, Jupyter...) is a ``.pth`` line naming the
shared site-packages: ``.pth`` files inside that folder are not processed, so the repository's
editable install is not on the path. Everything then runs from a folder outside the repository, with
``PYTHONPATH`` and ``PTINTERNALS_REPO`` unset.

The demonstrations that need the reference come from the committed recordings only (nothing runs with
the reference: ``scripts/record_demonstrations.py`` refreshes a stale one, and the fast test
``test_committed_recordings_are_current`` says which), and the build does not run the notebooks itself:
the test runs each of them once, in the fresh environment. Set
``PTINTERNALS_EDITION_CHAPTERS=strides,autograd`` to build and run only some chapters (debugging).
"""
import json
import os
import site
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from ptinternals.edition.build import build
from ptinternals.edition.scan import ScanReport, bodies_of, scan
from ptinternals.grading.exercise import graded_chapters, load_chapter

# One build for the module: under `make test` (-n 2 --dist loadgroup) its tests stay on one worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("student-edition")]
ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = [ch.slug for ch in graded_chapters()
            if ch.slug in os.environ.get("PTINTERNALS_EDITION_CHAPTERS", ch.slug).split(",")]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PTINTERNALS_REPO", "PTINTERNALS_STATIC_BOOK", "VIRTUAL_ENV")}
    env["MPLBACKEND"] = "Agg"
    return env


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    out = tmp_path_factory.mktemp("edition") / "student-edition"
    t0 = time.perf_counter()
    if os.environ.get("PTINTERNALS_EDITION_PREBUILT"):  # debugging: an edition built just before, unchanged
        return _prebuilt(Path(os.environ["PTINTERNALS_EDITION_PREBUILT"]))
    report = build(out, ROOT, wheel=True, jobs=2, chapters=CHAPTERS, committed_only=True, verify_notebooks=False)
    print(f"\nstudent edition built in {time.perf_counter() - t0:.0f} s: "
          + ", ".join(f"{k} {v:.0f} s" for k, v in report.seconds.items()))
    return report


def _prebuilt(out: Path):
    from ptinternals.edition.build import Report

    report = Report(out, files=sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()))
    report.wheel = next((out / "dist").glob("*.whl"))
    report.scan = ScanReport(bodies=999, files=999, texts=999)
    return report


@pytest.fixture(scope="module")
def fresh(edition, tmp_path_factory):
    """A virtual environment with the edition's wheel and no repository: (python, working folder)."""
    base = tmp_path_factory.mktemp("fresh")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    own = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip())
    shared = [p for p in site.getsitepackages() if (Path(p) / "torch").is_dir()]
    (own / "_shared_site.pth").write_text("\n".join(shared) + "\n")  # a plain path line: its .pth files are not run
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    str(edition.wheel)], check=True, env=_env(), cwd=base)
    kernels = venv / "share" / "jupyter" / "kernels" / "edition"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "student edition", "language": "python"}))
    work = base / "work"
    work.mkdir()
    return python, work


def _run(python: Path, work: Path, code: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=work,
                          env=_env(), timeout=timeout)


def test_the_edition_has_no_solution_code_in_any_file(edition):
    scan_report = edition.scan
    assert scan_report.findings == []
    assert scan_report.bodies > 300 and scan_report.files > 10 * len(CHAPTERS) and scan_report.texts > 10 * len(CHAPTERS)
    files = set(edition.files)
    assert not [f for f in files if f.startswith(("solutions", "tests"))]
    assert "EDITION.md" in files and any(f.startswith("dist/ptinternals-") and f.endswith(".whl") for f in files)
    for slug in CHAPTERS:
        assert f"notebooks/{slug}/{slug}.ipynb" in files
        assert f"src/ptinternals/checks/{slug}.visible.json" in files


def test_the_scan_would_find_a_solution_pasted_into_the_edition(edition, tmp_path):
    """The scan's corpus is this repository's answer cells: paste one (renamed) into a copy and it is found."""
    nb = nbformat.read(ROOT / "solutions" / "allocator" / "allocator.ipynb", as_version=4)
    answer = next(c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "find_best_fit_code")
    (tmp_path / "helpers.py").write_text(answer.replace("find_best_fit", "pick_block").replace("pool", "blocks"))
    report = ScanReport()
    bodies, fragments = bodies_of(answer, "solutions/allocator: find_best_fit", report)
    assert scan(tmp_path, bodies, fragments, report).findings


def test_no_graded_quiz_key_ships(edition):
    text = "\n".join((edition.out / f).read_text(errors="ignore") for f in edition.files
                     if not f.endswith((".whl", ".npz", ".gz")))
    for slug in CHAPTERS:
        source = yaml.safe_load((ROOT / "solutions" / "quizzes" / f"{slug}.yaml").read_text())
        bank = json.loads((edition.out / "src" / "ptinternals" / "quiz" / "banks" / f"{slug}.json").read_text())
        modes = {q["id"]: q["mode"] for q in bank["questions"]}
        for q in source["questions"]:
            if modes[q["id"]] == "graded":
                # 120 characters: a 50-character prefix of distributed q13's ("FSDP2 keeps every parameter registered
                # under its o...") is also the start of a hint the FSDP exercise's check gives, which ships by design
                assert q["explanation"][:120] not in text, (slug, q["id"])
                assert not next(b for b in bank["questions"] if b["id"] == q["id"])["answers"]


def test_the_installed_edition_has_no_reference_and_no_answer_key(fresh):
    if not {"strides", "allocator"} <= set(CHAPTERS):
        pytest.skip("names the strides and allocator chapters, which this partial edition leaves out")
    python, work = fresh
    proc = _run(python, work, """
        import importlib, ptinternals
        print(ptinternals.__file__, ptinternals.EDITION)
        for name in ["ptinternals.allocator.allocator", "ptinternals.strides.meta", "ptinternals.gpt.model",
                     "ptinternals.grading.trusted", "ptinternals.edition.build"]:
            try:
                importlib.import_module(name)
                print("IMPORTED", name)
            except ImportError:
                pass
        try:
            from ptinternals.allocator import CachingAllocator
            print("IMPORTED CachingAllocator")
        except ImportError as e:
            print("refused:", e)
        from ptinternals.quiz.bank import find_source
        print("key:", find_source("strides"))
        from ptinternals.grading import check
        check("strides.contiguous_strides", lambda shape: None)
    """)
    out = proc.stdout + proc.stderr
    assert "site-packages/ptinternals/__init__.py student" in out, out
    assert "IMPORTED" not in out, out
    assert "part of the course's reference implementation" in out and "key: None" in out, out
    assert "failed 4 of 4 cases" in out, out  # a visible check ran (and judged) with nothing but the edition


def test_every_student_notebook_runs_top_to_bottom(edition, fresh):
    python, work = fresh
    for slug in CHAPTERS:
        (work / slug).mkdir(exist_ok=True)
        (work / slug / f"{slug}.ipynb").write_bytes((edition.out / "notebooks" / slug / f"{slug}.ipynb").read_bytes())
    proc = _run(python, work, f"""
        import json, sys, time, nbformat
        from nbclient import NotebookClient
        report = {{}}
        for slug in {CHAPTERS!r}:
            nb = nbformat.read(f"{{slug}}/{{slug}}.ipynb", as_version=4)
            t0 = time.perf_counter()
            NotebookClient(nb, timeout=900, kernel_name="edition", allow_errors=False,
                           resources={{"metadata": {{"path": slug}}}}).execute()
            cells = []
            for c in nb.cells:
                if c.cell_type != "code":
                    continue
                outs = c.outputs
                cells.append({{"gid": c.metadata.get("nbgrader", {{}}).get("grade_id", ""),
                               "recorded": c.source.startswith("%%recorded"),
                               "errors": [o.ename + ": " + o.evalue for o in outs if o.output_type == "error"],
                               "text": "".join(o.get("text", "") for o in outs if o.output_type == "stream"),
                               "mimes": sorted({{m for o in outs for m in o.get("data", {{}})}})}})
            report[slug] = {{"seconds": round(time.perf_counter() - t0, 1), "cells": cells}}
            print(slug, report[slug]["seconds"], "s", file=sys.stderr, flush=True)
        print(json.dumps(report))
    """)
    assert proc.returncode == 0, proc.stderr[-5000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print("\n" + ", ".join(f"{slug} {r['seconds']} s" for slug, r in report.items()))
    for slug, r in report.items():
        cells = r["cells"]
        checks = [c for c in cells if c["gid"].endswith("_tests")]
        assert len(checks) == len(load_chapter(slug).exercises), slug  # one visible check per exercise
        for c in cells:
            if c["gid"].endswith("_tests"):  # every visible check ran on the stub and said so
                assert len(c["errors"]) == 1 and "is not implemented yet" in c["errors"][0], (slug, c)
            else:
                assert not c["errors"], (slug, c["gid"], c["errors"])
        for c in cells:
            if c["recorded"]:
                assert c["text"].startswith("[recorded when this edition was built"), (slug, c)
        assert any("image/png" in c["mimes"] for c in cells), f"{slug}: no figure"
        quizzes = [c for c in cells if c["gid"].startswith("quiz_show")]
        assert quizzes and all("application/vnd.jupyter.widget-view+json" in c["mimes"] for c in quizzes), slug
        progress = next(c for c in cells if c["gid"] == "quiz")["text"]
        assert "Graded questions: 0 of" in progress and "scored when your notebook is graded" in progress, progress


def test_each_solution_passes_the_editions_visible_checks(fresh):
    """The judging code and the recorded cases agree with the repository: every chapter's solution, run
    against the installed edition's visible checks, passes (the withheld compare says it cannot judge)."""
    python, work = fresh
    sources = {}
    for slug in CHAPTERS:
        nb = nbformat.read(ROOT / "solutions" / slug / f"{slug}.ipynb", as_version=4)
        sources[slug] = [(c.metadata["nbgrader"]["grade_id"], c.source) for c in nb.cells if c.cell_type == "code"
                         and (c.metadata.get("nbgrader", {}).get("solution")
                              or c.metadata.get("nbgrader", {}).get("grade_id") == "setup")]
    (work / "solutions.json").write_text(json.dumps(sources))
    proc = _run(python, work, """
        import ast, json, linecache, os, sys, time
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from ptinternals.grading import CheckFailure, check
        from ptinternals.grading.exercise import load_chapter
        results = {}
        for slug, cells in json.load(open("solutions.json")).items():
            ns = {"__name__": "__main__"}
            for gid, src in cells:
                src = "\\n".join(("# " + l) if l.lstrip().startswith(("%", "!")) else l for l in src.splitlines())
                linecache.cache[f"<cell {gid}>"] = (len(src), None, src.splitlines(True), f"<cell {gid}>")
                for stmt in ast.parse(src).body if gid == "setup" else [ast.parse(src)]:
                    try:
                        exec(compile(stmt if isinstance(stmt, ast.Module) else ast.Module([stmt], []), f"<cell {gid}>", "exec"), ns)
                    except Exception as e:
                        if gid != "setup":
                            raise
            for ex in load_chapter(slug).exercises:
                t0 = time.perf_counter()
                try:
                    check(ex.id, ns[ex.entry])
                    verdict = "ok"
                except CheckFailure as e:
                    verdict = f"{e.category}: {str(e)[:300]}"
                results[ex.id] = (verdict, round(time.perf_counter() - t0, 1))
                print(ex.id, results[ex.id], file=sys.stderr, flush=True)
        print(json.dumps(results))
    """)
    assert proc.returncode == 0, proc.stderr[-5000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    slow = sorted(results.items(), key=lambda kv: -kv[1][1])[:5]
    print("\nslowest visible checks:", slow)
    bad = {k: v for k, (v, _) in results.items() if v != "ok" and not v.startswith("unsupported: ")}
    assert not bad, bad
    unchecked = {k for k, (v, _) in results.items() if v.startswith("unsupported: ")}
    withheld = {ex.id for slug in CHAPTERS for ex in load_chapter(slug).exercises
                if "compare" in getattr(type(ex), "withheld_from_students", ())}
    assert unchecked == withheld, unchecked  # only the checks that need the reference to judge at all


def test_ptgrade_validate_accepts_the_editions_notebooks(edition, fresh):
    python, work = fresh
    notebooks = [str(edition.out / "notebooks" / slug / f"{slug}.ipynb") for slug in CHAPTERS]
    proc = subprocess.run([str(python.parent / "ptgrade"), "validate", *notebooks], capture_output=True, text=True,
                          cwd=work, env=_env(), timeout=600)
    assert proc.returncode == 0 and proc.stdout.count("OK:") == len(CHAPTERS), (proc.stdout, proc.stderr[-2000:])
