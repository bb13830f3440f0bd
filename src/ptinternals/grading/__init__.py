"""Checking and grading, shared by every chapter.

- :mod:`.exercise`: ``Exercise``/``Chapter`` specs, ``check`` (instant feedback in the notebook)
  and ``evaluate`` (judging results, shared with the trusted grader);
- :mod:`.compare`: comparisons whose messages teach (first mismatching index, expected vs got);
- :mod:`._runtime`: the sandbox side of the grading boundary (runs student code, returns data);
- :mod:`.sandbox`: starting that process with limits and isolation;
- :mod:`.trusted`: grading a notebook through the boundary;
- :mod:`.nbgrader_plugin`: nbgrader preprocessors that record the trusted grades;
- :mod:`.cli`: ``ptgrade``, the instructor's command line.

This ``__init__`` imports lazily: the sandbox imports ``ptinternals.grading._runtime`` and the
probes without pulling in torch or the chapters.
"""

_LAZY = {
    "check": "exercise", "Case": "exercise", "Chapter": "exercise", "CheckFailure": "exercise",
    "Exercise": "exercise", "NotImplementedYet": "exercise", "Raises": "exercise", "evaluate": "exercise",
    "get_exercise": "exercise", "load_chapter": "exercise",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_LAZY)
