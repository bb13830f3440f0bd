"""After grading: what the instructor reads first.

Per-exercise pass rates, a score histogram (saved as a PNG), the slowest submissions, failures by
category (wrong / error / timeout / crashed / forbidden / not-implemented ...), and every event the
trusted grader flagged (restored test cells, answer cells that hung or crashed the sandbox).
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path


def load_reports(reports_dir: Path, assignment: str) -> list[dict]:
    out = []
    for path in sorted(reports_dir.glob(f"*/{assignment}.json")):
        try:
            out.append(json.loads(path.read_text()))
        except ValueError:
            continue
    return out


def load_failures(reports_dir: Path, assignment: str) -> list[dict]:
    """The submissions that could not be graded (``<student>/<assignment>.failed.json``), with why."""
    out = []
    for path in sorted(reports_dir.glob(f"*/{assignment}.failed.json")):
        try:
            out.append(json.loads(path.read_text()))
        except ValueError:
            out.append({"student": path.parent.name, "reason": "unreadable failure record"})
    return out


def summarize(reports: list[dict], assignment: str, png: Path | None = None, failures: list[dict] = ()) -> str:
    not_graded = [f"  NOT GRADED ({len(failures)}; no score recorded, `ptgrade export` says why):"] + \
        [f"    {f.get('student', '?')}: {' '.join(str(f.get('reason', '')).split())[-240:]}" for f in failures] \
        if failures else []
    if not reports:
        return "\n".join([f"No graded submissions of {assignment} yet."] + not_graded)
    lines = [f"{assignment}: {len(reports)} graded submissions"] + not_graded
    scores = [r["score"] for r in reports]
    max_score = max(r["max_score"] for r in reports)
    mean = sum(scores) / len(scores)
    lines.append(f"  score: mean {mean:.2f} / {max_score:g}, min {min(scores):g}, max {max(scores):g}")
    per_ex: dict[str, list[bool]] = defaultdict(list)
    categories: Counter = Counter()
    for r in reports:
        for e in r["exercises"]:
            per_ex[e["id"]].append(e["passed"])
            if not e["passed"]:
                categories[(e["id"], e["category"])] += 1
    lines.append("  pass rate per exercise:")
    for ex_id, passed in per_ex.items():
        rate = sum(passed) / len(passed)
        lines.append(f"    {ex_id:32s} {100 * rate:5.1f}%  {'#' * round(20 * rate)}")
    quiz = [r["quiz"] for r in reports if r.get("quiz")]
    if quiz:
        lines.append(f"  quiz: mean {sum(q['score'] for q in quiz) / len(quiz):.2f} / {quiz[0]['max_score']:g}, "
                     f"{sum(q['answered'] == 0 for q in quiz)} submissions without answers")
    if categories:
        lines.append("  failures by category:")
        by_cat: Counter = Counter()
        for (_ex, cat), n in categories.items():
            by_cat[cat] += n
        for cat, n in by_cat.most_common():
            lines.append(f"    {cat:16s} {n}")
    slow = sorted(reports, key=lambda r: -r.get("wall_s", 0))[:5]
    lines.append("  slowest submissions: " + ", ".join(f"{r['student']} {r.get('wall_s', 0):.1f}s" for r in slow))
    flagged = [(r["student"], e) for r in reports for e in r.get("events", [])]
    if flagged:
        lines.append(f"  flagged events ({len(flagged)}):")
        for student, event in flagged[:50]:
            lines.append(f"    {student}: {event}")
    if png is not None:
        _histogram(scores, max_score, assignment, png)
        lines.append(f"  histogram: {png}")
    return "\n".join(lines)


def _histogram(scores, max_score, assignment, png: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.2))
    ax = fig.add_subplot(1, 1, 1)
    ax.hist(scores, bins=min(20, max(5, int(max_score) + 1)), range=(0, max_score), color="#4c72b0", edgecolor="white")
    ax.set_xlabel("score")
    ax.set_ylabel("submissions")
    ax.set_title(f"{assignment}: {len(scores)} submissions")
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
