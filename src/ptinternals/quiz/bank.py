"""Quiz banks: practice questions with their answers stored only as salted hashes; graded ones with no key.

Authoring happens in ``solutions/quizzes/<chapter>.yaml`` (plain text, instructor side). ``compile_bank``
turns it into ``ptinternals/quiz/banks/<chapter>.json``, the *student form* that ships with the
package. Each question has a **mode**:

* ``practice``: instant feedback in the notebook and in the static book, and no points. The bank
  holds a salted SHA-256 of the right answer, a hint for wrong answers, and the explanation
  *encrypted with the right answer* (readable only once you have answered right). A handful of
  options is brute-forced in seconds, which is why a practice question is never graded.
* ``graded``: points, and no key at all in the bank (no hash, no sealed explanation): the student's
  answer is recorded beside the notebook and scored at autograde time against the instructor's
  YAML (:func:`load_answer_key`); the result and the explanation come back in the feedback.

The default is ``graded`` (:data:`DEFAULT_MODE`): a question an author forgets to mark then loses
its instant feedback, which shows at once in the notebook, instead of carrying points a student can
brute-force, which shows nowhere. book/instructors.md ("Quizzes") explains the trade-off.

Answer kinds:

* ``mc``: one option is right (the answer is its index);
* ``many``: a set of options is right (the answer is the sorted indices);
* ``text``: a short answer, normalised before hashing (case, spaces, brackets: ``(12, 4, 1)`` ==
  ``12,4,1``), so strides and shapes can be typed naturally; ``accept`` lists other spellings, each
  hashed (and its explanation sealed) on its own.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

FORMAT = 2  # 2: questions have a mode; graded ones carry no key
KINDS = ("mc", "many", "text")
MODES = ("practice", "graded")
DEFAULT_MODE = "graded"


def normalize(kind: str, answer) -> str:
    """The canonical string of an answer: what gets hashed, recorded and compared."""
    if kind == "mc":
        if isinstance(answer, bool) or not isinstance(answer, int):
            raise TypeError(f"a multiple-choice answer is an option index (int), got {answer!r}")
        return str(answer)
    if kind == "many":
        if isinstance(answer, (str, bytes)) or not hasattr(answer, "__iter__"):
            raise TypeError(f"a many-choice answer is a collection of option indices, got {answer!r}")
        idx = sorted({int(a) for a in answer})
        return ",".join(map(str, idx))
    if kind == "text":
        if not isinstance(answer, str):
            raise TypeError(f"a short answer is a string, got {answer!r}")
        text = answer.strip().lower()
        text = re.sub(r"[()\[\]{}\s]", "", text)  # "(12, 4, 1)" -> "12,4,1"
        text = text.rstrip(",")
        return text
    raise ValueError(f"unknown question kind {kind!r}; expected one of {KINDS}")


def answer_hash(salt: str, qid: str, canonical: str) -> str:
    return hashlib.sha256(f"{salt}|{qid}|{canonical}".encode()).hexdigest()


def _keystream(key: bytes, n: int) -> bytes:
    out = b""
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(key + counter.to_bytes(8, "big")).digest()
        counter += 1
    return out[:n]


def seal(text: str, salt: str, qid: str, canonical: str) -> str:
    """Encrypt ``text`` so only someone who knows the right answer can read it."""
    data = text.encode()
    key = hashlib.sha256(f"{salt}|{qid}|{canonical}|explain".encode()).digest()
    return base64.b64encode(bytes(a ^ b for a, b in zip(data, _keystream(key, len(data))))).decode()


def unseal(sealed: str, salt: str, qid: str, canonical: str) -> str:
    data = base64.b64decode(sealed)
    key = hashlib.sha256(f"{salt}|{qid}|{canonical}|explain".encode()).digest()
    return bytes(a ^ b for a, b in zip(data, _keystream(key, len(data)))).decode(errors="replace")


@dataclass
class Question:
    id: str
    kind: str
    text: str
    options: list[str] = field(default_factory=list)
    answers: list[dict] = field(default_factory=list)  # [{"hash": ..., "explanation": sealed}] per accepted spelling
    hint: str = ""
    points: float = 1.0
    mode: str = DEFAULT_MODE

    @property
    def graded(self) -> bool:
        return self.mode == "graded"

    def _match(self, salt: str, canonical: str) -> dict | None:
        h = answer_hash(salt, self.id, canonical)
        return next((a for a in self.answers if a["hash"] == h), None)

    def is_correct(self, salt: str, answer) -> bool:
        try:
            return self._match(salt, normalize(self.kind, answer)) is not None
        except (TypeError, ValueError):
            return False

    def is_correct_canonical(self, salt: str, canonical: str) -> bool:
        return self._match(salt, canonical) is not None

    def explanation(self, salt: str, answer) -> str:
        canonical = normalize(self.kind, answer)
        entry = self._match(salt, canonical)
        return unseal(entry["explanation"], salt, self.id, canonical) if entry else ""


@dataclass
class Bank:
    chapter: str
    salt: str
    questions: list[Question]

    @property
    def total_points(self) -> float:
        """The quiz's points: the graded questions' (practice questions count nothing)."""
        return sum(q.points for q in self.questions if q.graded)

    @property
    def graded_questions(self) -> list[Question]:
        return [q for q in self.questions if q.graded]

    def question(self, qid: str) -> Question:
        for q in self.questions:
            if q.id == qid:
                return q
        raise KeyError(f"quiz {self.chapter} has no question {qid!r}; it has {[q.id for q in self.questions]}")


def load_bank(chapter: str) -> Bank:
    """The compiled bank shipped in the package (``ptinternals/quiz/banks/<chapter>.json``)."""
    if not re.fullmatch(r"[a-z0-9_]+", chapter or ""):
        raise ValueError(f"chapter must look like 'strides', got {chapter!r}")
    path = resources.files("ptinternals.quiz").joinpath("banks", f"{chapter}.json")
    if not path.is_file():
        raise FileNotFoundError(f"no quiz bank for {chapter!r} (expected {path})")
    raw = json.loads(path.read_text())
    if raw.get("format") != FORMAT:
        raise ValueError(f"quiz bank {chapter} has format {raw.get('format')}, expected {FORMAT}")
    return Bank(raw["chapter"], raw["salt"], [Question(**q) for q in raw["questions"]])


# ---- the instructor's answer key ------------------------------------------------------------------
@dataclass
class KeyEntry:
    """The right answer(s) of one question, as canonical strings, and what to say about it."""

    accepted: tuple[str, ...]
    explanation: str
    hint: str = ""


def answer_key(source: dict) -> dict[str, KeyEntry]:
    """``{question id: KeyEntry}`` from an authoring source (the YAML, loaded): the grading key."""
    key = {}
    for q in source.get("questions", []):
        kind, answer = q["kind"], _author_answer(q)
        accepted = [normalize(kind, answer)]
        if kind == "text":
            accepted += [normalize(kind, str(a)) for a in q.get("accept", []) if normalize(kind, str(a)) not in accepted]
        key[q["id"]] = KeyEntry(tuple(accepted), str(q.get("explanation", "")), str(q.get("hint", "")))
    return key


def find_source(chapter: str) -> Path | None:
    """The instructor's ``solutions/quizzes/<chapter>.yaml`` if this copy of the course has it, else None.

    Looked for under ``$PTINTERNALS_REPO``, then above this package (an editable install of the
    repository: the course the grader runs from), then above the working folder. The student edition
    has no ``solutions/``: None there.
    """
    import os

    if not re.fullmatch(r"[a-z0-9_]+", chapter or ""):
        raise ValueError(f"chapter must look like 'strides', got {chapter!r}")
    roots = [Path(os.environ["PTINTERNALS_REPO"])] if os.environ.get("PTINTERNALS_REPO") else []
    here = Path.cwd()
    roots += [Path(__file__).resolve().parents[3], here, *here.parents]
    for root in roots:
        path = source_path(chapter, root)
        if path.is_file():
            return path
    return None


def load_answer_key(chapter: str, source: Path | None = None) -> dict[str, KeyEntry]:
    """The grading key of ``chapter``, read from the instructor's YAML (``source`` or :func:`find_source`).

    Raises FileNotFoundError where there is none (the student edition): graded questions are scored
    only where the instructor's sources are.
    """
    import yaml

    path = source or find_source(chapter)
    if path is None or not Path(path).is_file():
        raise FileNotFoundError(f"no answer key for quiz {chapter!r}: graded questions are scored with the "
                                f"instructor's solutions/quizzes/{chapter}.yaml, which this copy of the course "
                                f"does not have (set PTINTERNALS_REPO to the course repository)")
    from_yaml = yaml.safe_load(Path(path).read_text())
    if from_yaml.get("chapter") != chapter:
        raise ValueError(f"{path} is the quiz of {from_yaml.get('chapter')!r}, not {chapter!r}")
    return answer_key(from_yaml)


# ---- authoring -------------------------------------------------------------------------------------
def _author_answer(q: dict):
    kind = q["kind"]
    if kind == "mc":
        return q["answer"]
    if kind == "many":
        return list(q["answer"])
    return str(q["answer"])


def compile_bank(source: dict, salt: str) -> dict:
    """Authoring dict (from YAML) -> the shipped JSON dict with hashed answers and sealed explanations."""
    chapter = source.get("chapter")
    if not chapter:
        raise ValueError("quiz source needs a 'chapter'")
    out, seen = [], set()
    for i, q in enumerate(source.get("questions", [])):
        for key in ("id", "kind", "text", "answer", "explanation"):
            if key not in q:
                raise ValueError(f"{chapter} question #{i + 1} has no {key!r}")
        if q["id"] in seen:
            raise ValueError(f"{chapter}: duplicate question id {q['id']!r}")
        seen.add(q["id"])
        kind, answer = q["kind"], _author_answer(q)
        mode = q.get("mode", DEFAULT_MODE)
        if mode not in MODES:
            raise ValueError(f"{chapter}/{q['id']}: mode must be one of {MODES}, got {mode!r}")
        if mode == "practice" and float(q.get("points", 0)) != 0:
            raise ValueError(f"{chapter}/{q['id']}: a practice question carries no points (its key ships to "
                             f"students); make it graded or drop points: {q['points']!r}")
        options = list(q.get("options", []))
        if kind in ("mc", "many"):
            indices = [answer] if kind == "mc" else answer
            if not options or any(not 0 <= a < len(options) for a in indices):
                raise ValueError(f"{chapter}/{q['id']}: answer {answer!r} is not an index into its {len(options)} options")
        accepted = [normalize(kind, answer)]
        if kind == "text":  # other accepted spellings ("96 bytes" for "96"), each hashed on its own
            accepted += [normalize(kind, str(a)) for a in q.get("accept", []) if normalize(kind, str(a)) not in accepted]
        # A graded question ships without any trace of its key (no hash, no sealed explanation, no hint:
        # a hint is written for wrong answers, so it would tell a wrong answer apart).
        graded = mode == "graded"
        out.append({
            "id": q["id"], "kind": kind, "text": q["text"], "options": options,
            "answers": [] if graded else [{"hash": answer_hash(salt, q["id"], c),
                                           "explanation": seal(q["explanation"], salt, q["id"], c)} for c in accepted],
            "hint": "" if graded else q.get("hint", ""), "points": float(q.get("points", 1)) if graded else 0.0,
            "mode": mode,
        })
    return {"format": FORMAT, "chapter": chapter, "salt": salt, "questions": out}


def source_path(chapter: str, root: Path | None = None) -> Path:
    root = root or Path(__file__).resolve().parents[3]
    return root / "solutions" / "quizzes" / f"{chapter}.yaml"
