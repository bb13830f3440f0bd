"""An incremental mutation run: judge again only the mutants that survived in an earlier report.

A full run of a chapter judges every mutant (``mutation.run_chapter``: 45 minutes for kernels on 2 cores).
After a survivor is killed by a new case or recorded as equivalent, only the survivors need judging again:
``run_survivors`` re-judges the mutants a report lists as survived or equivalent and carries every other
verdict (killed, timeout) over, and the page it makes says so. Sound when

- the mutants are the same: every exercise's solution region is the one the report was made from (its
  ``regions`` hashes; a report without them is compared mutant by mutant: operator, line, occurrence and the
  changed line), else ``ValueError`` and a full run is needed;
- the checks have only gained cases since, so a mutant a checker failed then still fails it now.

Used by ``bench/mutation.py --survivors-from bench/results/mutation-<date>-<slug>.json``.
"""
from __future__ import annotations

import time
from collections import Counter

from . import mutation as mu

RETESTED = (mu.SURVIVED, mu.EQUIVALENT)
WHY = ("That is sound because the mutants are the same (every exercise's solution region is the one that report "
       "was made from: {how}) and the checks have only gained cases since, so a mutant killed then is killed now.")


def changed_regions(slug: str, previous: dict) -> list[str]:
    """One line per exercise whose mutants may differ from ``previous``'s (a report of ``slug``); [] when none."""
    from .testing import answer_sources

    ids = [e["exercise"] for e in previous["exercises"]]
    plan, sources = mu.cell_plan(slug, ids), answer_sources(slug)
    if "regions" in previous:
        now = {i: mu.region_hash(sources[cell]) for i, (cell, _) in plan.items()}
        return [f"{i}: its solution region is not the one the report was made from"
                for i in sorted(set(now) | set(previous["regions"])) if now.get(i) != previous["regions"].get(i)]
    then: dict[str, Counter] = {}
    for row in previous["mutants"]:
        then.setdefault(row["exercise"], Counter())[(row["operator"], row["line"], row["occurrence"], row.get("mutant", ""))] += 1
    out = []
    for i in sorted(set(plan) | set(then)):
        now = Counter((m.operator, m.line, m.occurrence, m.mutated) for m in mu.exercise_mutants(i)) if i in plan else Counter()
        gone, new = then.get(i, Counter()) - now, now - then.get(i, Counter())
        if gone or new:
            example = next(iter(gone or new))
            out.append(f"{i}: {sum(gone.values())} of the report's mutants are not made today and {sum(new.values())} "
                       f"new ones are (e.g. {example[0]} of {example[1]!r})")
    return out


def run_survivors(slug: str, previous: dict, origin: str, *, jobs: int = 2, timeout_factor: float = 10.0,
                  min_timeout_s: float = 5.0, progress=None) -> dict:
    """Judge again the mutants ``previous`` (a report of ``slug``, read from ``origin``) lists as survived or
    equivalent; carry its other verdicts over. Returns a report like ``run_chapter``'s, with ``incremental``
    saying from which run. Raises ``ValueError`` when a solution region changed since (the mutants differ)."""
    from .testing import answer_sources

    if previous.get("chapter") != slug:
        raise ValueError(f"{origin} is a report of chapter {previous.get('chapter')!r}, not {slug!r}")
    changed = changed_regions(slug, previous)
    if changed:
        raise ValueError(f"cannot judge only the survivors of {origin}: the mutants changed since it was made "
                         f"({'; '.join(changed)}). Run the whole chapter.")
    ids = [e["exercise"] for e in previous["exercises"]]
    plan = mu.cell_plan(slug, ids)
    rows = previous["mutants"]
    again = {(r["exercise"], r["operator"], r["line"], r["occurrence"]) for r in rows if r["status"] in RETESTED}
    by_exercise = {i: ms for i in plan if (ms := mu.exercise_mutants(i, keys=again))}
    if sum(map(len, by_exercise.values())) != len(again):
        raise ValueError(f"{origin}: {len(again)} survivors listed, {sum(map(len, by_exercise.values()))} made today")
    counts = Counter(r["exercise"] for r in rows)
    results = mu.new_results(ids, plan, counts)
    equivalents = mu.load_equivalents(slug)
    carried = []
    for r in rows:
        if r["status"] in RETESTED:
            continue
        m = mu.Mutant(r["exercise"], plan[r["exercise"]][0], r["operator"], r["line"], r["occurrence"], r["lineno"],
                      r.get("mutant", ""), "")  # a deleted line has no "mutant"
        v = mu.Verdict(r["status"], r.get("phase", ""), r.get("category", ""), r.get("seconds", 0.0),
                       r.get("message", ""), r.get("killed_by", "") or r["exercise"])
        carried.append(mu.tally(results[r["exercise"]], m, v, equivalents))
    t0 = time.perf_counter()
    records = carried + mu.judge_all(slug, plan, by_exercise, results, jobs=jobs, timeout_factor=timeout_factor,
                                     min_timeout_s=min_timeout_s, progress=progress)
    listed = [m for ms in by_exercise.values() for m in ms]  # the equivalents file's entries, checked against today's
    listed += [m for i in plan for m in mu.exercise_mutants(i, keys=set(equivalents) - again)]
    stale = [s for s in mu.stale_equivalents(slug, listed) if s.split(":", 1)[0] in plan]
    full = previous.get("incremental", {}).get("full_run") or {
        "report": origin, "date": previous["date"], "seconds": previous["seconds"], "jobs": previous["jobs"]}
    how = "hashes compared" if "regions" in previous else "that report has no hashes, so every mutant was compared"
    incremental = {"from": origin, "full_run": full, "retested": len(again), "carried": len(carried),
                   "why": WHY.format(how=how)}
    sources = answer_sources(slug)
    return mu.report(slug, ids, results, records, stale, jobs=jobs, seconds=time.perf_counter() - t0,
                     operator_names=list(mu.operators()), incremental=incremental,
                     regions={i: mu.region_hash(sources[cell]) for i, (cell, _) in plan.items()})
