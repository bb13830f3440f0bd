"""Class-scale grading benchmark: N simulated submissions of one chapter, graded with 1 and with k workers.

    python bench/grading_scale.py                   # 50 submissions of strides, 1 vs 2 workers
    python bench/grading_scale.py -n 20 --workers 1 4

The submissions are a realistic mix: correct ones, unmodified student notebooks, one plausible bug
each, and a few hostile ones (an infinite loop, os._exit). It reports the wall time of each run, the
speed-up, and checks that every run produced the same gradebook (scores are exact or it is a bug).
Results go to bench/results/grading-scale-<date>-<host kind>.md. Not part of `bench/run.py` (minutes).
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))


def build_class(root: Path, n: int) -> None:
    from tests.grading.conftest import add_submission, make_course, submission
    from tests.strides.buggy import BUGGY

    make_course(root)
    bugs = [(ex.replace("ch01.", ""), src) for ex, bank in BUGGY.items() for src, _ in bank.values()]
    cells = {"contiguous_strides": "contiguous_strides_code", "storage_index": "storage_index_code", "is_contiguous": "is_contiguous_code",
             "view_strides": "view_strides_code", "expand_strides": "expand_strides_code", "slice_view": "slice_view_code",
             "sliding_windows": "sliding_windows_code", "im2col": "im2col_code"}
    for i in range(n):
        kind = i % 10
        if kind in (0, 1, 2, 3):
            nb = submission()
        elif kind in (4, 5):
            nb = submission(student_version=True)
        elif kind == 9 and i % 20 == 9:
            nb = submission({"contiguous_strides_code": "def contiguous_strides(shape):\n    while True:\n        pass\n"})
        else:
            name, src = bugs[i % len(bugs)]
            nb = submission({cells[name]: src})
        add_submission(root, f"student{i:03d}", nb)


def grade(root: Path, workers: int) -> tuple[float, dict]:
    from ptinternals.grading.cli import main as ptgrade

    os.environ["PTGRADE_ROOT"] = str(root)
    t0 = time.perf_counter()
    rc = ptgrade(["autograde", "strides", "-j", str(workers), "--quiet", "--force"])
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"grading with {workers} workers failed (exit {rc})")
    ptgrade(["export", "--to", str(root / "grades.csv")])
    with open(root / "grades.csv") as f:
        return wall, {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=50, help="number of submissions (default 50)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to compare (default 1 2)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    if args.n < 1 or any(w < 1 for w in args.workers):
        p.error("-n and --workers must be >= 1")
    base = Path(tempfile.mkdtemp(prefix="ptgrade-scale-"))
    try:
        runs, scores = [], []
        for workers in args.workers:
            root = base / f"w{workers}"
            build_class(root, args.n)
            wall, s = grade(root, workers)
            runs.append((workers, wall))
            scores.append(s)
            print(f"{args.n} submissions, {workers} worker(s): {wall:.1f} s ({wall / args.n:.2f} s per submission)")
        rerun_wall, rerun = grade(base / f"w{args.workers[-1]}", args.workers[-1])
        identical = all(s == scores[0] for s in scores) and rerun == scores[0]
        lines = [f"# Grading at class scale, {dt.date.today()}", "",
                 f"Machine: {platform.machine()}, {os.cpu_count()} CPUs; chapter strides; {args.n} submissions "
                 f"(correct, unmodified, one bug each, an infinite loop); sandbox isolation as `ptgrade doctor` reports.",
                 "", "| workers | wall s | s per submission | speed-up |", "|---|---|---|---|"]
        for workers, wall in runs:
            lines.append(f"| {workers} | {wall:.1f} | {wall / args.n:.2f} | {runs[0][1] / wall:.2f}x |")
        lines += ["", f"Forced regrade with {args.workers[-1]} workers: {rerun_wall:.1f} s.",
                  f"Identical scores in every run: {identical}."]
        text = "\n".join(lines) + "\n"
        print(text)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"grading-scale-{dt.date.today()}-cpu{os.cpu_count()}.md").write_text(text)
        return 0 if identical else 1
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
