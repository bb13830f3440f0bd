"""Helpers for testing the kernels chapter's checkers: answer cells that define ``@triton.jit`` kernels.

``triton.jit`` reads its function's source (``inspect.getsource``), which Python finds only for code
whose "file" is in ``linecache``. IPython registers every notebook cell there, and so does the grading
sandbox's runtime; ``ptinternals.grading.testing.namespace_with`` does not (the strides chapter needed nothing of
the kind), so these helpers do, and also run the locked setup cell, which imports torch and triton.
"""

from __future__ import annotations

import linecache

from ptinternals.grading import CheckFailure, check, load_chapter
from ptinternals.grading.testing import answer_sources

CHAPTER = load_chapter("kernels")


def run_cell(source: str, filename: str, ns: dict) -> None:
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), ns)


def namespace(replace: dict[str, str] | None = None, sources: dict[str, str] | None = None) -> dict:
    """Run the setup cell, then every answer cell (some replaced, by grade_id); return the namespace."""
    sources = dict(sources or answer_sources(CHAPTER.assignment))
    ns: dict = {"__name__": "__main__"}
    run_cell(sources.pop("setup"), "<setup>", ns)
    for gid, src in sources.items():
        run_cell((replace or {}).get(gid, src), f"<{gid}>", ns)
    return ns


def answer_cell_of(exercise_id: str) -> str:
    return CHAPTER.exercise(exercise_id).grade_id.replace("_tests", "_code")


def rejects(exercise_id: str, source: str) -> CheckFailure | None:
    """The CheckFailure when the checker rejects ``source`` (replacing the exercise's answer cell), else None.

    Visible cases first: when one of them fails, the report is the same as with the hidden ones
    (the simplest failing case is always a visible one), and it is much faster.
    """
    ex = CHAPTER.exercise(exercise_id)
    ns = namespace({answer_cell_of(exercise_id): source})
    for hidden in (False, True):
        try:
            check(exercise_id, ns[ex.entry], hidden=hidden)
        except CheckFailure as failure:
            return failure
    return None
