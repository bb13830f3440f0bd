"""Mutation testing of every exercise's checker (``ptinternals.grading.mutation``), one chapter or all.

    make mutation CHAPTER=strides                      # one chapter (all chapters when CHAPTER is unset)
    python bench/mutation.py strides                   # the same
    python bench/mutation.py strides.view_strides      # one exercise (prints, writes nothing)
    python bench/mutation.py strides --jobs 1 --no-write
    python bench/mutation.py --survivors-from bench/results/mutation-2026-12-01-kernels.json   # incremental

For each chapter it writes ``bench/results/mutation-<date>-<slug>.json`` and ``.md``: per exercise the
mutants, killed (by visible cases, hidden cases, or the cell raising), survived, equivalent (from
``tests/<slug>/equivalent_mutants.yaml``) and timeouts, and every survivor with the line it changed.
``--survivors-from REPORT`` judges again only the mutants that survived (or were equivalent) in
REPORT, carries its other verdicts over and says so on the page (``grading.mutation_survivors``); it is
refused when a solution region changed since REPORT was made. A benchmark, not a test: it takes minutes. ``tests/grading/test_mutation.py`` runs it on one small exercise.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from ptinternals.grading import mutation  # noqa: E402


def progress_bar(label: str):
    def make(total: int):
        try:
            from tqdm import tqdm
        except ImportError:  # a bare counter on stderr
            return _Counter(label, total)
        return tqdm(total=total, desc=label, unit="mutant", dynamic_ncols=True)

    return make


class _Counter:
    def __init__(self, label, total):
        self.label, self.total, self.n, self.note = label, total, 0, ""

    def update(self, k):
        self.n += k
        print(f"\r{self.label}: {self.n}/{self.total} {self.note}", end="", file=sys.stderr, flush=True)

    def set_postfix_str(self, note):
        self.note = note

    def close(self):
        print(file=sys.stderr)


def main(argv=None) -> int:
    from ptinternals.course import SLUGS
    from ptinternals.grading.exercise import graded_chapters

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("targets", nargs="*", help="chapter slugs or exercise ids (default: every graded chapter)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--timeout-factor", type=float, default=10.0,
                   help="a mutant's time limit, in multiples of the solution's own check time (default 10)")
    p.add_argument("--min-timeout", type=float, default=5.0, help="the least time limit per mutant, s (default 5)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--no-write", action="store_true", help="print the report only")
    p.add_argument("--survivors-from", type=Path, metavar="REPORT",
                   help="an earlier report's .json: judge again only its survivors (its chapter only)")
    args = p.parse_args(argv)
    if args.survivors_from:
        return survivors_from(p, args)

    targets = [t for t in args.targets if t] or [ch.slug for ch in graded_chapters()
                                                 if (ROOT / "solutions" / f"{ch.slug}.py").exists()]
    plan: dict[str, list[str] | None] = {}
    for t in targets:
        slug = t.split(".", 1)[0]
        if slug not in SLUGS:
            p.error(f"unknown chapter or exercise {t!r}; chapters: {', '.join(SLUGS)}")
        if "." in t:
            plan.setdefault(slug, [])
            if plan[slug] is not None:
                plan[slug].append(t)
        else:
            plan[slug] = None
    for slug, exercises in plan.items():
        rep = mutation.run_chapter(slug, exercises=exercises, jobs=args.jobs, timeout_factor=args.timeout_factor,
                                   min_timeout_s=args.min_timeout, progress=progress_bar(slug))
        write(rep, args, exercises is None)
    return 0


def write(rep: dict, args, whole: bool) -> None:
    page = mutation.markdown(rep)
    print(page)
    if whole and not args.no_write:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.out / f"mutation-{rep['date']}-{rep['chapter']}"
        stem.with_suffix(".json").write_text(mutation.to_json(rep))
        stem.with_suffix(".md").write_text(page)
        print(f"wrote {stem}.json and .md")


def survivors_from(p: argparse.ArgumentParser, args) -> int:
    """The incremental run: the report's chapter, its survivors only."""
    import json
    import subprocess

    from ptinternals.grading.mutation_survivors import run_survivors

    try:
        previous = json.loads(args.survivors_from.read_text())
    except (OSError, ValueError) as e:
        p.error(f"--survivors-from {args.survivors_from}: cannot read a report ({e})")
    slug = previous.get("chapter")
    if args.targets not in ([], [slug]):
        p.error(f"--survivors-from re-tests the report's chapter ({slug}) only, not {' '.join(args.targets)}")
    path = args.survivors_from.resolve()
    origin = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    commit = subprocess.run(["git", "log", "-1", "--format=%h", "--", str(path)], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(path)], cwd=ROOT).returncode
    origin += f" (commit {commit})" if commit and not dirty else " (not committed)"
    try:
        rep = run_survivors(slug, previous, origin, jobs=args.jobs, timeout_factor=args.timeout_factor,
                            min_timeout_s=args.min_timeout, progress=progress_bar(f"{slug} survivors"))
    except ValueError as e:
        p.error(str(e))
    write(rep, args, True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
