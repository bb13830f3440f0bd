"""Recording quiz answers beside the notebook, and grading them.

When a student checks an answer in JupyterLab, the widget appends it at once (atomic write) to
``<chapter>.answers.json`` in the notebook's folder. nbgrader's submit/collect carry that file with
the notebook, and the trusted grader reads it. Only **graded** questions score (``bank.py`` says why
practice questions cannot), and for them **the last answer counts**: the widget does not say
whether it is right, so a student may change their mind until they submit. The grader scores them
against the instructor's answer key (``solutions/quizzes/<chapter>.yaml``), never against anything
that shipped to the student.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .bank import Bank, KeyEntry, load_answer_key, normalize

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
    answered: int  # graded questions with an answer
    n_questions: int  # graded questions
    details: list[tuple[str, str, bool]]  # (qid, the answer that counts or "", right) per graded question
    problem: str = ""
    explanations: dict[str, str] = field(default_factory=dict)  # qid -> explanation, for the feedback

    def summary(self) -> str:
        line = (f"Quiz: {self.score:g} of {self.max_score:g} points "
                f"({self.answered} of {self.n_questions} graded questions answered; the last answer counts)")
        for qid, answer, ok in self.details:
            if answer:
                line += f"\n  {qid}: {'right' if ok else 'wrong'} (you answered {answer!r})"
                if qid in self.explanations:
                    line += f". {self.explanations[qid]}"
            else:
                line += f"\n  {qid}: not answered"
        return line + (f"\n  note: {self.problem}" if self.problem and self.problem != "no answers file" else "")


def grade_answers(bank: Bank, path: str | os.PathLike, key: dict[str, KeyEntry] | None = None) -> QuizGrade:
    """Score the last recorded answer to each graded question of ``bank`` against the answer key.

    ``key`` defaults to the instructor's (:func:`~.bank.load_answer_key`, from
    ``solutions/quizzes/<chapter>.yaml``); without one this raises FileNotFoundError, as the student
    edition cannot score graded questions. Practice questions count nothing, whatever was answered.
    """
    key = load_answer_key(bank.chapter) if key is None else key
    answers, problem = _read(Path(path))
    score, answered, details, explanations = 0.0, 0, [], {}
    for q in bank.graded_questions:
        if q.id not in key:
            raise KeyError(f"the answer key of {bank.chapter} has no question {q.id!r}: rebuild the bank "
                           f"(make notebooks) from the same solutions/quizzes/{bank.chapter}.yaml")
        attempts = answers.get(q.id, [])
        if not attempts:
            details.append((q.id, "", False))
            continue
        answered += 1
        last = attempts[-1]["answer"]
        ok = last in key[q.id].accepted
        score += q.points if ok else 0.0
        details.append((q.id, last, ok))
        if key[q.id].explanation:
            explanations[q.id] = key[q.id].explanation
    return QuizGrade(score, bank.total_points, answered, len(bank.graded_questions), details, problem, explanations)


def progress(bank: Bank, path: str | os.PathLike) -> str:
    """What a student sees in their notebook: practice results, and which graded answers are recorded.

    Scores graded questions only where this copy of the course has the answer key (the full
    repository, for self-study); in the student edition it says they are scored at grading time.
    """
    answers, problem = _read(Path(path))
    practice = [q for q in bank.questions if not q.graded]
    lines = []
    if practice:
        tried = [q for q in practice if answers.get(q.id)]
        right = [q for q in tried if any(_canonical_correct(bank, q, a["answer"]) for a in answers[q.id])]
        lines.append(f"Practice questions (no points): {len(tried)} of {len(practice)} tried, {len(right)} answered right.")
    graded = bank.graded_questions
    if graded:
        recorded = [q.id for q in graded if answers.get(q.id)]
        try:
            grade = grade_answers(bank, path)
            lines.append(f"Graded questions (self-study, scored with the course's answer key): {grade.score:g} of "
                         f"{grade.max_score:g} points, {grade.answered} of {grade.n_questions} answered.")
        except FileNotFoundError:
            lines.append(f"Graded questions: {len(recorded)} of {len(graded)} answered and recorded in {Path(path).name} "
                         f"(the last answer to each counts). They are scored when your notebook is graded: "
                         f"the result comes with your feedback. Submit {Path(path).name} with the notebook.")
    if problem and problem != "no answers file":
        lines.append(f"note: {problem}")
    return "\n".join(lines)


def _canonical_correct(bank: Bank, q, canonical: str) -> bool:
    return q.is_correct_canonical(bank.salt, canonical)
