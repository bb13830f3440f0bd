"""Recording quiz answers beside the notebook, and grading them.

When a student checks an answer in JupyterLab, the widget appends it at once (atomic write) to
``<chapter>.answers.json`` in the notebook's folder. nbgrader's submit/collect carry that file with
the notebook, and the trusted grader reads it: **the first answer to each question counts**, since
the widget tells the student whether an answer is right and lets them keep trying (to learn).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .bank import Bank, normalize

ANSWERS_FORMAT = 1
MAX_ANSWERS_BYTES = 1 << 20  # a real answers file is a few KiB: anything bigger is not ours


def answers_path(chapter: str, folder: str | os.PathLike | None = None) -> Path:
    return Path(folder or os.getcwd()) / f"{chapter}.answers.json"


def read_answers(path: str | os.PathLike) -> dict:
    """The recorded attempts ``{qid: [{"answer": canonical, "at": epoch}, ...]}`` (empty if absent).

    Reads defensively: the file comes from a student's folder, so size, JSON and shape are checked,
    and a damaged file reads as "no answers" plus a problem description, never as an exception.
    """
    return _read(Path(path))[0]


def _read(path: Path) -> tuple[dict, str]:
    if not path.exists():
        return {}, "no answers file"
    if path.stat().st_size > MAX_ANSWERS_BYTES:
        return {}, f"answers file is {path.stat().st_size} bytes (limit {MAX_ANSWERS_BYTES}): ignored"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {}, f"answers file is not valid JSON ({e}): ignored"
    if not isinstance(raw, dict) or raw.get("format") != ANSWERS_FORMAT or not isinstance(raw.get("answers"), dict):
        return {}, "answers file has an unknown layout: ignored"
    clean = {}
    for qid, attempts in raw["answers"].items():
        if isinstance(qid, str) and isinstance(attempts, list):
            clean[qid] = [a for a in attempts if isinstance(a, dict) and isinstance(a.get("answer"), str)]
    return clean, ""


def record_answer(chapter: str, question_id: str, kind: str, answer, folder: str | os.PathLike | None = None) -> str:
    """Append one attempt (canonical form) and return it. The write is atomic: never a half file."""
    canonical = normalize(kind, answer)
    path = answers_path(chapter, folder)
    answers, _ = _read(path)
    answers.setdefault(question_id, []).append({"answer": canonical, "at": round(time.time(), 3)})
    payload = {"format": ANSWERS_FORMAT, "chapter": chapter, "answers": answers}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return canonical


@dataclass
class QuizGrade:
    score: float
    max_score: float
    answered: int
    n_questions: int
    details: list[tuple[str, str, bool]]  # (qid, first answer or "", counted as right)
    problem: str = ""

    def summary(self) -> str:
        line = (f"Quiz: {self.score:g} of {self.max_score:g} points "
                f"({self.answered} of {self.n_questions} questions answered; first answers count)")
        return line + (f"\n  note: {self.problem}" if self.problem and self.problem != "no answers file" else "")


def grade_answers(bank: Bank, path: str | os.PathLike) -> QuizGrade:
    """Score the first recorded answer to each question of ``bank``."""
    answers, problem = _read(Path(path))
    score, answered, details = 0.0, 0, []
    for q in bank.questions:
        attempts = answers.get(q.id, [])
        if not attempts:
            details.append((q.id, "", False))
            continue
        answered += 1
        first = attempts[0]["answer"]
        ok = _canonical_correct(bank, q, first)
        score += q.points if ok else 0.0
        details.append((q.id, first, ok))
    return QuizGrade(score, bank.total_points, answered, len(bank.questions), details, problem)


def _canonical_correct(bank: Bank, q, canonical: str) -> bool:
    return q.is_correct_canonical(bank.salt, canonical)
