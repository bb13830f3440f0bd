"""The quiz attack of issue 15, replayed: brute-force every answer offline from what ships to students.

The student package holds the compiled banks (``ptinternals/quiz/banks/<slug>.json``). Before
questions had modes, every answer sat there as a salted hash, and a sealed explanation that only the
right answer decrypts: trying each option (and a dictionary of short answers) recovered 81 of 83
quiz points. Now graded questions ship no hash and no sealed text, so the same attack must find no
graded answer at all and score 0 on them, while it still cracks the practice questions (which count
no points): proof that the attack is real and that only the mode protects the grade.
"""
import itertools
import json
import string
from pathlib import Path

import pytest
import yaml

from ptinternals.quiz.answers import answers_path, grade_answers, record_answer
from ptinternals.quiz.bank import answer_hash, compile_bank, load_answer_key, load_bank, normalize, source_path, unseal

ROOT = Path(__file__).resolve().parents[2]
BANKS = ROOT / "src" / "ptinternals" / "quiz" / "banks"
CHAPTERS = sorted(p.stem for p in BANKS.glob("*.json"))


def _strings(tree):
    if isinstance(tree, str):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _strings(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from _strings(v)


def _text_candidates(q: dict) -> list[str]:
    """A dictionary attack for short answers: numbers, small tuples, and the words of the question."""
    words = {w.strip(string.punctuation + "`").lower() for w in (q["text"] + " " + " ".join(q["options"])).split()}
    numbers = [str(n) for n in range(-64, 4097)]
    tuples = [",".join(map(str, t)) for r in (2, 3) for t in itertools.product(range(0, 17), repeat=r)]
    return sorted(words | {"true", "false", "none"}) + numbers + tuples


def _candidates(q: dict):
    if q["kind"] == "mc":
        return [str(i) for i in range(len(q["options"]))]
    if q["kind"] == "many":
        n = len(q["options"])
        return [",".join(map(str, c)) for r in range(1, n + 1) for c in itertools.combinations(range(n), r)]
    return [normalize("text", c) for c in _text_candidates(q)]


def brute_force(bank_json: dict) -> dict[str, str]:
    """Every answer the shipped bank confirms: a candidate whose salted hash appears anywhere in the file,
    or that decrypts a sealed explanation into readable text."""
    salt = bank_json["salt"]
    hashes = {s for s in _strings(bank_json) if len(s) == 64 and all(c in string.hexdigits for c in s)}
    found = {}
    for q in bank_json["questions"]:
        sealed = [a["explanation"] for a in q.get("answers", []) if a.get("explanation")][:1]
        for cand in _candidates(q):
            if answer_hash(salt, q["id"], cand) in hashes or any(_readable(unseal(s, salt, q["id"], cand)) for s in sealed):
                found[q["id"]] = cand
                break
    return found


def _readable(text: str) -> bool:
    return "\ufffd" not in text and text.isprintable() and text.count(" ") >= 3


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_brute_force_of_the_shipped_bank_scores_zero_on_graded_questions(chapter, tmp_path):
    bank_json = json.loads((BANKS / f"{chapter}.json").read_text())
    bank = load_bank(chapter)
    found = brute_force(bank_json)
    graded = {q.id for q in bank.graded_questions}
    practice = {q.id for q in bank.questions} - graded
    assert not (set(found) & graded), f"{chapter}: graded answers recovered offline: {sorted(set(found) & graded)}"
    cracked_mc = {q.id for q in bank.questions if q.id in practice and q.kind != "text"}
    assert cracked_mc <= set(found), f"{chapter}: the attack should still crack practice choices {cracked_mc - set(found)}"
    # The attacker submits everything it found (and nothing for what it did not find) ...
    for qid, canonical in found.items():
        q = bank.question(qid)
        answer = canonical if q.kind == "text" else ([int(i) for i in canonical.split(",")] if q.kind == "many"
                                                      else int(canonical))
        record_answer(chapter, qid, q.kind, answer, folder=tmp_path)
    # ... and the grader, scoring with the instructor's key, gives it nothing.
    grade = grade_answers(bank, answers_path(chapter, tmp_path), load_answer_key(chapter, source_path(chapter, ROOT)))
    assert grade.score == 0 and grade.max_score > 0 and grade.answered == 0


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_same_attack_cracks_a_bank_that_ships_every_key(chapter):
    """Control: compiled as before modes existed (every question hashed), the bank gives its answers away."""
    source = yaml.safe_load(source_path(chapter, ROOT).read_text())
    for q in source["questions"]:
        q["mode"], q["points"] = "practice", 0
    old = compile_bank(source, "any-salt")
    found = brute_force(old)
    key = load_answer_key(chapter, source_path(chapter, ROOT))
    assert all(found[qid] in key[qid].accepted for qid in found)
    assert len(found) >= 0.7 * len(old["questions"]), f"{chapter}: cracked only {sorted(found)}"
