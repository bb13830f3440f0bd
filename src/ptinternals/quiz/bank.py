"""Quiz banks: questions with their answers stored only as salted hashes.

Authoring happens in ``solutions/quizzes/<chapter>.yaml`` (plain text, instructor side). ``compile_bank``
turns it into ``ptinternals/quiz/banks/<chapter>.json``, which ships with the package and holds, for
each question, the text, the options, a salted SHA-256 of the right answer, a hint for wrong answers,
and the explanation *encrypted with the right answer* (readable only once you have answered right).

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

FORMAT = 1
KINDS = ("mc", "many", "text")


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
        return sum(q.points for q in self.questions)

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
        options = list(q.get("options", []))
        if kind in ("mc", "many"):
            indices = [answer] if kind == "mc" else answer
            if not options or any(not 0 <= a < len(options) for a in indices):
                raise ValueError(f"{chapter}/{q['id']}: answer {answer!r} is not an index into its {len(options)} options")
        accepted = [normalize(kind, answer)]
        if kind == "text":  # other accepted spellings ("96 bytes" for "96"), each hashed on its own
            accepted += [normalize(kind, str(a)) for a in q.get("accept", []) if normalize(kind, str(a)) not in accepted]
        out.append({
            "id": q["id"], "kind": kind, "text": q["text"], "options": options,
            "answers": [{"hash": answer_hash(salt, q["id"], c), "explanation": seal(q["explanation"], salt, q["id"], c)}
                        for c in accepted],
            "hint": q.get("hint", ""), "points": float(q.get("points", 1)),
        })
    return {"format": FORMAT, "chapter": chapter, "salt": salt, "questions": out}


def source_path(chapter: str, root: Path | None = None) -> Path:
    root = root or Path(__file__).resolve().parents[3]
    return root / "solutions" / "quizzes" / f"{chapter}.yaml"
