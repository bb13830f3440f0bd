"""The student edition's notebooks: every cell runs live, except demonstrations that need the reference.

A chapter's student notebook (``notebooks/<slug>/<slug>.ipynb``) imports, here and there, course
modules the edition does not ship (the reference implementation, or a figure helper that draws with
it). :func:`analyse` follows those names through the notebook, statement by statement and cell by
cell: a name imported from a module that is not shipped is *withheld*; a statement that reads a
withheld name (anywhere, including inside the functions it defines) makes the names it binds
withheld too, and one that binds a name from shipped code only makes it available again. A plain
code cell that reads a withheld name is **recorded**: :func:`record` runs the repository's notebook
once, at build time, with the reference, and keeps that cell's outputs; in the edition the cell keeps
its code (to read) under ``%%recorded`` (``ptinternals.recorded``), which shows those outputs.

Locked cells cannot be recorded (the grader and ``ptgrade validate`` compare them with the original):
a locked setup cell's import of a figure helper that cannot ship gets a stand-in instead (importing
works, calling says why), and answer, test and quiz cells that would need a withheld name stop the
build with a message naming the cell.
"""
from __future__ import annotations

import ast
import copy
import hashlib
import json
import os
import symtable
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat


@dataclass
class Plan:
    slug: str
    recorded: dict[str, list[str]] = field(default_factory=dict)  # cell id -> withheld names it reads
    standins: dict[str, set[str]] = field(default_factory=dict)  # module -> names a locked cell imports
    live: int = 0  # code cells that run in the edition


def _python(source: str) -> str:
    """A cell's source as Python: IPython magics and shell escapes commented out."""
    return "\n".join(("# " + line) if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _reads(stmt: ast.stmt) -> set[str]:
    """Module-level names ``stmt`` reads, in any nested scope (a function body reads them when called)."""
    from .checks import names_read

    return names_read(ast.unparse(stmt))


def _binds(stmt: ast.stmt) -> set[str]:
    table = symtable.symtable(ast.unparse(stmt), "<cell>", "exec")
    return {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}


def _course_imports(stmt: ast.stmt) -> list[tuple[str, str | None, str]]:
    """(module, imported name or None, bound name) for each course import in ``stmt`` (nested ones too)."""
    out = []
    for node in ast.walk(stmt):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "ptinternals":
            out += [(node.module, a.name, a.asname or a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, None, (a.asname or a.name).split(".")[0]) for a in node.names
                    if a.name.split(".")[0] == "ptinternals"]
    return out


def _kind(cell) -> str:
    meta = cell.metadata.get("nbgrader", {})
    if meta.get("solution"):
        return "answer"
    if meta.get("grade_id") == "setup":
        return "setup"
    if meta.get("grade") or meta.get("locked"):
        return "locked"
    return "plain"


FAILS_LIVE = "(fails without the reference)"


def analyse(nb, slug: str, available, fails_live: dict[str, str] | None = None) -> Plan:
    """Which cells of ``nb`` run live in the edition and which are recorded.

    ``available(module, name)`` says whether ``from module import name`` (``name`` None: ``import
    module``, then attribute access) works in the edition. ``fails_live`` names cells that failed when
    the edition's notebook ran (:func:`verify`): they depend on the reference in a way no name shows
    (importing the reference package installs defaults into the scaffold), and are recorded too.
    """
    fails_live = fails_live or {}
    plan = Plan(slug)
    withheld: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kind = _kind(cell)
        try:
            tree = ast.parse(_python(cell.source))
        except SyntaxError as e:
            raise ValueError(f"{slug}: cell {cell.get('id')} is not Python: {e}") from None
        reads_withheld: set[str] = set()
        live = set(withheld)  # withheld names as the cell's statements run live, in order
        replayed = set(withheld)  # ... as they stand if the cell is recorded: only its imports run
        for stmt in tree.body:
            missing = {b for module, name, b in _course_imports(stmt) if not available(module, name)}
            uses = _reads(stmt) & live
            if missing and kind == "setup" and not uses:
                for module, name, b in _course_imports(stmt):
                    if b in missing and name is not None:
                        plan.standins.setdefault(module, set()).add(name)
                    elif b in missing:
                        raise ValueError(f"{slug}: the locked setup cell imports module {module}, which the student "
                                         f"edition does not ship; import the names it needs instead")
                live |= missing
                replayed |= missing
                continue
            reads_withheld |= missing | uses
            bound = _binds(stmt)
            live = (live | bound) if (missing or uses) else (live - bound)
            # %%recorded runs a recorded cell's top-level imports, name by name (ptinternals.recorded), and
            # nothing else of it: the names it imports from shipped modules exist after it
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                replayed = (replayed - (bound - missing)) | missing
            else:
                replayed |= bound
        if cell.get("id") in fails_live:
            reads_withheld.add(FAILS_LIVE)
        withheld = replayed if reads_withheld else live
        if not reads_withheld:
            plan.live += 1
            continue
        if kind != "plain":
            raise ValueError(f"{slug}: the {kind} cell {cell.metadata.get('nbgrader', {}).get('grade_id', cell.get('id'))} "
                             f"needs {sorted(reads_withheld)}, which the student edition does not ship; a cell the "
                             f"grader knows cannot be recorded (ship the module as a teaching helper, or change the cell)")
        plan.recorded[cell["id"]] = sorted(reads_withheld)
    return plan


# ---- recording, in the repository's environment ---------------------------------------------------------
RECORDINGS = Path("src") / "ptinternals" / "edition" / "recordings"  # committed, under the repository's root


def committed(slug: str, root: Path) -> dict | None:
    """The committed recording of ``slug`` (``scripts/record_demonstrations.py`` writes it): ``{"key": the
    :func:`key` it was recorded at, "cells": {cell id: outputs}, "fails_live": {cell id: error}}``, or None."""
    path = root / RECORDINGS / f"{slug}.json"
    return json.loads(path.read_text()) if path.is_file() else None


class StaleRecording(RuntimeError):
    """A chapter's committed recording does not match its notebook and course code."""


def record(nb, plan: Plan, root: Path, timeout: int | None = None, log=print, *, committed_only: bool = False,
           fresh: bool = False) -> dict[str, list]:
    """The outputs of the recorded cells, from the repository's student notebook run with the reference.

    Running a chapter costs what the book's run of it costs (the capstone trains a model for minutes),
    so the outputs come from, in order: the committed recording (``src/ptinternals/edition/recordings/``,
    when its key matches the notebook and the chapter's course code; ``scripts/record_demonstrations.py``
    refreshes it), the book's execution cache (``_build/.jupyter_cache``, written by ``make book``, which
    runs these very notebooks), this builder's own cache (``_build/.edition-recordings``), or a run.
    ``committed_only``: no run, a stale or missing committed recording raises :class:`StaleRecording`;
    ``fresh``: ignore the committed recording (to refresh it).
    """
    if not plan.recorded:
        return {}
    k = key(nb, plan.slug, root)
    saved = None if fresh else committed(plan.slug, root)
    cells, how = None, ""
    if saved is not None and saved.get("key") == k and set(plan.recorded) <= set(saved["cells"]):
        cells, how = saved["cells"], "the committed recording"
    elif committed_only:
        raise StaleRecording(f"{plan.slug}: the committed recording of its demonstrations is "
                             f"{'missing' if saved is None else 'out of date'}: run "
                             f"`python scripts/record_demonstrations.py {plan.slug}` and commit "
                             f"{RECORDINGS / (plan.slug + '.json')}")
    if cells is None:
        cells = _from_book_cache(nb, root)
        how = "the book's execution cache"
    cached = root / "_build" / ".edition-recordings" / f"{plan.slug}-{k}.json"
    if cells is None and cached.is_file():
        cells, how = json.loads(cached.read_text()), "this builder's cache"
        if not set(plan.recorded) <= set(cells):
            cells = None
    if cells is None:
        t0 = time.perf_counter()
        cells = _run(nb, plan, root, timeout or int(os.environ.get("PTINTERNALS_RECORD_TIMEOUT", "3600")))
        how = f"a run ({time.perf_counter() - t0:.0f} s)"
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(cells))
    outputs = _check(plan, nb, cells)
    log(f"  {plan.slug}: {len(outputs)} recorded cells from {how}")
    return {cid: [nbformat.from_dict(_plain_output(o)) for o in outs] for cid, outs in outputs.items()}


def key(nb, slug: str, root: Path) -> str:
    """What the recorded outputs depend on: the notebook and the course code it runs."""
    h = hashlib.sha256(nbformat.writes(nb).encode())
    package = root / "src" / "ptinternals"
    for path in sorted((package / slug).rglob("*.py")) + [package / "viz" / f"{slug}.py"]:
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _check(plan: Plan, nb, cells: dict[str, list]) -> dict[str, list]:
    """The recorded cells' outputs out of ``cells`` (``{cell id: outputs}``); a demonstration that raised
    (unless tagged ``raises-exception``) or one without outputs stops the build."""
    out = {}
    tags = {c.get("id"): c.metadata.get("tags", []) for c in nb.cells}
    for cid in plan.recorded:
        if cid not in cells:
            raise RuntimeError(f"{plan.slug}: no outputs recorded for cell {cid}")
        errors = [o for o in cells[cid] if o.get("output_type") == "error"]
        if errors and "raises-exception" not in tags.get(cid, []):
            raise RuntimeError(f"{plan.slug}: demonstration cell {cid} raised while recording: "
                               f"{errors[0].get('ename')}: {str(errors[0].get('evalue'))[:300]}")
        out[cid] = cells[cid]
    return out


def _from_book_cache(nb, root: Path) -> dict[str, list] | None:
    """``{cell id: outputs}`` of this very notebook as ``make book`` executed it, if its cache has it."""
    path = root / "_build" / ".jupyter_cache"
    if not path.is_dir():
        return None
    try:
        from jupyter_cache import get_cache

        _, merged = get_cache(path).merge_match_into_notebook(copy.deepcopy(nb))
    except Exception:  # no match (KeyError), or a cache from another jupyter-cache version
        return None
    return {c.get("id"): [_plain_output(o) for o in c.outputs] for c in merged.cells if c.cell_type == "code"}


def _run(nb, plan: Plan, root: Path, timeout: int) -> dict[str, list]:
    """Run the notebook up to its last recorded cell, checks skipped, with the repository's package."""
    from nbclient import NotebookClient

    work = copy.deepcopy(nb)
    ids = [c.get("id") for c in work.cells]
    last = max(ids.index(i) for i in plan.recorded)
    work.cells = work.cells[: last + 1]
    for cell in work.cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
            cell.source = "pass  # (a check: skipped while recording)"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PTINTERNALS_REPO"] = str(root)
    env.pop("PTINTERNALS_STATIC_BOOK", None)
    with tempfile.TemporaryDirectory(prefix=f"ptrecord-{plan.slug}-") as tmp:
        NotebookClient(work, timeout=timeout, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": tmp}}).execute(env=env)
    return {c.get("id"): [_plain_output(o) for o in c.outputs] for c in work.cells
            if c.cell_type == "code" and not c.metadata.get("nbgrader", {}).get("grade")}


def _plain_output(output) -> dict:
    """An output as plain data, without execution counts and widget models (they need a live kernel)."""
    out = {k: v for k, v in dict(output).items() if k != "execution_count"}
    if out.get("output_type") == "execute_result":  # replayed, it is displayed: no execution count
        out["output_type"] = "display_data"
    if "data" in out:
        out["data"] = {k: v for k, v in out["data"].items() if not k.startswith("application/vnd.jupyter.widget")}
    return json.loads(json.dumps(out))


# ---- the edition's notebook ------------------------------------------------------------------------------
LOAD_CELL = ("# Student edition: {n} demonstration(s) below run the course's reference implementation, which\n"
             "# this edition does not include. Their cells start with %%recorded: running one shows what it\n"
             "# printed and drew when the edition was built (its code stays, to read). Every other cell runs\n"
             "# live, and the checks run your own code.\n"
             "%load_ext ptinternals.recorded")


def edition_notebook(nb, plan: Plan, outputs: dict[str, list]):
    """The student notebook with recorded cells marked, pre-filled with their outputs, and the magic loaded."""
    out = copy.deepcopy(nb)
    if not plan.recorded:
        return out
    for cell in out.cells:
        if cell.get("id") in plan.recorded:
            cell.source = f"%%recorded {plan.slug} {cell['id']}\n" + cell.source
            cell.outputs = [nbformat.from_dict(o) for o in outputs[cell["id"]]]
            cell.execution_count = None
            cell.metadata.setdefault("tags", [])
            if "recorded" not in cell.metadata["tags"]:
                cell.metadata["tags"].append("recorded")
    setup = next((i for i, c in enumerate(out.cells) if _kind(c) == "setup"), None)
    at = (setup + 1) if setup is not None else next(i for i, c in enumerate(out.cells) if c.cell_type == "code")
    load = nbformat.v4.new_code_cell(LOAD_CELL.format(n=len(plan.recorded)))
    load["id"] = "student-edition"
    out.cells.insert(at, load)
    return out


# ---- running the edition's notebook, with nothing but the edition ---------------------------------------------
def verify(nb, slug: str, src: Path, site_dirs: list[str], timeout: int = 900) -> dict[str, str]:
    """Run the edition's notebook in a kernel that sees only ``src`` (the edition's package) and the
    third-party ``site_dirs``; return ``{cell id: error}`` of the demonstration cells that failed.

    A check cell must fail only with "not implemented yet" (the stubs), and setup, answer and quiz
    cells must not fail at all: anything else stops the build.
    """
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    work = copy.deepcopy(nb)
    with tempfile.TemporaryDirectory(prefix=f"ptverify-{slug}-") as tmp:
        spec = Path(tmp) / "kernelspecs" / "edition"
        spec.mkdir(parents=True)
        boot = (f"import sys; sys.path[:0] = {[str(src)] + list(site_dirs)!r}; "
                "from ipykernel import kernelapp; kernelapp.launch_new_instance()")
        spec.joinpath("kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-I", "-S", "-B", "-c", boot, "-f", "{connection_file}"],
            "display_name": "student edition", "language": "python"}))
        ksm = KernelSpecManager()
        ksm.kernel_dirs = [str(spec.parent)]
        km = AsyncKernelManager(kernel_name="edition", kernel_spec_manager=ksm)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PTINTERNALS_REPO", "PTINTERNALS_STATIC_BOOK")}
        folder = Path(tmp) / slug
        folder.mkdir()
        NotebookClient(work, km=km, timeout=timeout, allow_errors=True,
                       resources={"metadata": {"path": str(folder)}}).execute(env=env)
    failed = {}
    for cell in work.cells:
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        if not errors or cell.cell_type != "code":
            continue
        text = f"{errors[0].ename}: {errors[0].evalue}"[:300]
        kind = _kind(cell)
        gid = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if gid.endswith("_tests") and "not implemented yet" in text:
            continue
        if kind != "plain" or cell.source.startswith("%%recorded"):
            raise RuntimeError(f"{slug}: cell {gid or cell.get('id')} fails in the student edition: {text}")
        if "raises-exception" not in cell.metadata.get("tags", []):
            failed[cell["id"]] = text
    return failed
