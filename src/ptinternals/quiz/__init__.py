"""Quizzes: ipywidgets in JupyterLab, a static jupyterquiz self-check in the book, and graded answers.

- :mod:`.bank`: question banks with hashed answers (``load_bank``), and compiling them from YAML;
- :mod:`.widget`: ``show_quiz`` and ``quiz_progress`` for notebooks;
- :mod:`.answers`: recording attempts beside the notebook, and grading the graded questions (practice
  questions give instant feedback and no points; graded ones are scored against the instructor's key).
"""

_LAZY = {"show_quiz": "widget", "quiz_progress": "widget", "load_bank": "bank", "grade_answers": "answers",
         "record_answer": "answers", "answers_path": "answers", "load_answer_key": "bank"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_LAZY)
