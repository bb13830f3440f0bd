"""Mutation testing (``ptinternals.grading.mutation``, ``bench/mutation.py``) on one small exercise, so the
benchmark cannot rot: mutants come from cosmic-ray's operators, only inside the solution region, with an
identity that survives edits elsewhere; a worker process judges them; a mutant that loops forever times out.
"""
import os
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import cosmic_ray  # noqa: F401  (CI installs the dev extras: a missing library is a failure there)
else:
    pytest.importorskip("cosmic_ray", reason="cosmic-ray (the dev extras) is not installed in this venv")

from ptinternals.grading import mutation  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CELL = '''def f(xs, k):
    """Docstring."""
    ### BEGIN SOLUTION
    total = 0
    for x in xs:
        total += x * k
    if total < 0:
        raise ValueError(f"negative total {total - 1}")
    return total
    ### END SOLUTION
'''


def test_mutants_lie_in_the_solution_region_with_a_stable_identity():
    ms = mutation.mutants_of("demo.f", CELL, "f_code")
    ops = {m.operator for m in ms}
    assert {"core/ReplaceBinaryOperator_Mul_Add", "core/ReplaceComparisonOperator_Lt_LtE", "core/NumberReplacer",
            "core/ZeroIterationForLoop", "course/ReplaceAugmentedAssignment"} <= ops
    assert all(4 <= m.lineno <= 9 for m in ms), "mutated outside the solution region"
    assert not [m for m in ms if "raise" in m.line], "an error message's text is not graded: it is not mutated"
    assert len({m.source for m in ms}) == len(ms) and all(m.source != CELL for m in ms)
    plus = next(m for m in ms if m.operator == "course/ReplaceAugmentedAssignment" and m.occurrence == 0)
    assert plus.line == "total += x * k" and plus.mutated == "total = x * k"
    # a line added above moves line numbers, not identities
    moved = mutation.mutants_of("demo.f", CELL.replace("    total = 0\n", "    total = 0\n    k = k\n"), "f_code")
    assert {m.key for m in ms} <= {m.key for m in moved}


def test_a_mutant_that_loops_forever_is_stopped_by_its_time_limit():
    loop = "def contiguous_strides(shape):\n    while True:\n        pass\n"
    verdict = mutation.judge("strides.contiguous_strides", "contiguous_strides_code", loop, limit_s=0.5)
    assert verdict.status == mutation.TIMEOUT and verdict.seconds < 5


def test_a_chapter_run_on_one_exercise_kills_every_mutant():
    """The whole path `make mutation` takes (a worker process, warm-up, verdicts, the report), on the
    smallest exercise: every mutant of contiguous_strides is killed."""
    rep = mutation.run_chapter("strides", exercises=["strides.contiguous_strides"], jobs=1)
    (row,) = rep["exercises"]
    assert row["error"] == "" and row["mutants"] >= 5, row
    assert row["survived"] == 0 and row["score"] == 1.0, mutation.markdown(rep)
    assert row["killed_by"].get("visible", 0) > 0 and len(rep["mutants"]) == row["mutants"]
    assert "| strides.contiguous_strides | " in mutation.markdown(rep)


@pytest.mark.parametrize("slug", sorted(p.parent.name for p in (ROOT / "tests").glob("*/equivalent_mutants.yaml")))
def test_every_recorded_equivalent_names_a_mutant_of_todays_solution(slug):
    listed = set(mutation.load_equivalents(slug))
    assert listed, f"tests/{slug}/equivalent_mutants.yaml is empty"
    mutants = [m for exercise_id in sorted({key[0] for key in listed})
               for m in mutation.exercise_mutants(exercise_id, keys=listed)]
    assert mutation.stale_equivalents(slug, mutants) == []


def test_a_shared_answer_cell_is_mutated_once_and_judged_by_every_exercise_that_shares_it():
    """amp.amp_speed grades amp.amp_train's cell (the bank's ANSWER_CELL): that cell's mutants are made once,
    under amp.amp_train, and a mutant only one of the two checkers can see is killed."""
    from ptinternals.grading.testing import edited

    assert mutation.cell_plan("amp", ["amp.amp_speed"]) == {"amp.amp_train": ("amp_train_code", ["amp.amp_speed"])}
    plan = mutation.cell_plan("amp")
    assert plan["amp.amp_train"] == ("amp_train_code", ["amp.amp_speed"]) and "amp.amp_speed" not in plan
    bug = edited("amp.amp_train", ("micro = loss / accum", "micro = loss"))  # only accum > 1 shows it
    alone = mutation.judge("amp.amp_speed", "amp_train_code", bug, visible_only=True)
    assert alone.status == mutation.SURVIVED, alone
    both = mutation.judge("amp.amp_speed", "amp_train_code", bug, visible_only=True, judges=[("amp.amp_train", True)])
    assert both.status == mutation.KILLED and both.exercise == "amp.amp_train" and both.phase == "visible", both


def test_an_incremental_run_judges_only_the_survivors_and_is_refused_when_the_mutants_changed():
    """`bench/mutation.py --survivors-from REPORT`: the mutants REPORT lists as survived are judged again (here two
    that were killed, marked survived as if a case had been added since), the others' verdicts carried over; a
    report whose solution region differs from today's (its hash, or with no hash, its mutants) is refused."""
    import copy

    import bench.mutation

    from ptinternals.grading import mutation_survivors

    full = mutation.run_chapter("strides", exercises=["strides.contiguous_strides"], jobs=1)
    assert set(full["regions"]) == {"strides.contiguous_strides"}
    before = copy.deepcopy(full)
    for row in before["mutants"][:2]:
        row.update(status=mutation.SURVIVED, phase="", category="")
    rep = mutation_survivors.run_survivors("strides", before, "before.json", jobs=1)
    assert rep["incremental"]["retested"] == 2 and rep["incremental"]["carried"] == len(full["mutants"]) - 2
    assert rep["incremental"]["full_run"]["report"] == "before.json"
    assert [m["status"] for m in rep["mutants"]] == [m["status"] for m in full["mutants"]]
    assert rep["total"] == full["total"] and rep["regions"] == full["regions"]
    page = mutation.markdown(rep)
    assert "**An incremental run**" in page and "only the 2 mutants that survived" in page and "before.json" in page

    edited = copy.deepcopy(before)
    edited["regions"]["strides.contiguous_strides"] = "0" * 64
    with pytest.raises(ValueError, match="strides.contiguous_strides: its solution region is not the one"):
        mutation_survivors.run_survivors("strides", edited, "edited.json", jobs=1)
    old = copy.deepcopy(before)  # a report from before the hashes: compared mutant by mutant
    del old["regions"]
    assert mutation_survivors.changed_regions("strides", old) == []
    old["mutants"][0]["mutant"] += "  # another solution"
    assert "1 of the report's mutants are not made today" in mutation_survivors.changed_regions("strides", old)[0]
    with pytest.raises(SystemExit):  # the command line says why, and writes nothing
        json_path = ROOT / "bench" / "results" / "does-not-exist.json"
        bench.mutation.main(["--survivors-from", str(json_path)])
