"""Demonstrations recorded when the student edition was built, replayed in the student's notebook.

Some demonstrations run the course's reference implementation (the allocator model replaying a
trace, the reference GPT, the distributed demos), which the student edition leaves out. Its
notebooks keep those cells' code for reading and start them with ``%%recorded <chapter> <cell>``:
running one shows the outputs recorded at build time (text, tables, figures) instead of running the
code. ``%load_ext ptinternals.recorded``, in a cell near the top of such a notebook, registers the
magic. The recordings are data in ``ptinternals/recordings/<chapter>.json`` (notebook outputs).

A figure helper that cannot ship because it draws with the reference is replaced in the edition by
:func:`withheld` stand-ins: importing it works (a locked setup cell imports it), calling it says why
it is not there.
"""
from __future__ import annotations

import json
import sys
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=None)
def recordings(chapter: str) -> dict:
    """``{cell id: [notebook outputs]}`` recorded for ``chapter`` (empty when nothing was recorded)."""
    path = resources.files("ptinternals").joinpath("recordings", f"{chapter}.json")
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data.get("cells", {})


def replay(chapter: str, cell_id: str) -> None:
    """Show the outputs recorded for one cell: streams printed, rich outputs displayed."""
    outputs = recordings(chapter).get(cell_id)
    if outputs is None:
        raise KeyError(f"no recorded output for cell {cell_id!r} of {chapter!r} (was the notebook edited?)")
    from IPython.display import publish_display_data

    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            (sys.stderr if out.get("name") == "stderr" else sys.stdout).write(_text(out.get("text", "")))
        elif kind in ("display_data", "execute_result"):
            data = {k: _text(v) if k.startswith("text/") else v for k, v in out.get("data", {}).items()
                    if not k.startswith("application/vnd.jupyter.widget")}
            if data:
                publish_display_data(data, out.get("metadata", {}))
        elif kind == "error":
            sys.stderr.write(f"{out.get('ename')}: {out.get('evalue')}\n")


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def recorded(line: str, cell: str) -> None:
    """``%%recorded <chapter> <cell id>``: show the recorded outputs. Of the cell's code only its top-level
    imports run (those the edition has), so the names they bind exist for the cells below."""
    parts = line.split()
    if len(parts) != 2:
        raise ValueError(f"usage: %%recorded <chapter> <cell id>, got {line!r}")
    _run_imports(cell)
    print("[recorded when this edition was built: this demonstration runs the course's reference "
          "implementation, which the student edition does not include]")
    replay(*parts)


def _run_imports(cell: str) -> None:
    import ast

    from IPython import get_ipython

    ipython = get_ipython()
    if ipython is None:
        return
    try:
        body = ast.parse(cell).body
    except SyntaxError:
        return
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:  # one name at a time: the reference's names fail, the others import
                one = ast.Import([alias]) if isinstance(stmt, ast.Import) else ast.ImportFrom(stmt.module, [alias], stmt.level)
                try:
                    exec(compile(ast.fix_missing_locations(ast.Module([one], [])), "<recorded imports>", "exec"),
                         ipython.user_ns)
                except ImportError:
                    pass  # a name of the reference: its users are recorded cells too


def load_ipython_extension(ipython) -> None:
    ipython.register_magic_function(recorded, "cell", "recorded")


class withheld:  # noqa: N801  (a stand-in that reads like the name it replaces)
    """Stands in for a name the student edition cannot ship (it needs the reference implementation)."""

    def __init__(self, qualified_name: str, needs: str = "the course's reference implementation"):
        self._name, self._needs = qualified_name, needs

    def __call__(self, *args, **kwargs):
        raise ImportError(f"{self._name} is not part of the student edition: it needs {self._needs}. The notebook "
                          f"cells that use it show what it produced when the edition was built (%%recorded).")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self()

    def __repr__(self) -> str:
        return f"<{self._name}: not in the student edition>"
