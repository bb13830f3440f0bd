"""Record the student edition's demonstrations: the outputs of the notebook cells that need the reference.

    PYTHONPATH=$PWD/src .venv/bin/python scripts/record_demonstrations.py [CHAPTER ...]   # default: every chapter
    PYTHONPATH=$PWD/src .venv/bin/python scripts/record_demonstrations.py --check         # are they current?

A student notebook's demonstration that runs the course's reference (a training run, a replay through
the allocator model, Dynamo's recording backend...) cannot run in the student edition, which does not
ship the reference: the edition shows what it printed and drew when recorded. Recording runs the
chapter's notebook with the reference (minutes for the capstone), so the recordings are committed under
src/ptinternals/edition/recordings/<chapter>.json, each with the key of what it depends on (the student
notebook and the chapter's course code), and the edition's build and its test use them without running
anything. When a chapter's notebook or course code changes, its recording is out of date:
tests/edition/test_edition_parts.py::test_committed_recordings_are_current says so, and this script
refreshes it (from the book's execution cache when `make book` has run since the change, else by running
the notebook).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stale(chapters: list[str] | None = None) -> list[str]:
    """Chapters whose committed recording is missing, out of date, or no longer needed."""
    from ptinternals.edition.build import plans_for
    from ptinternals.edition.notebooks import RECORDINGS, committed, key

    out = []
    for slug, (nb, plan) in plans_for(ROOT, chapters).items():
        saved = committed(slug, ROOT)
        if not plan.recorded:
            if saved is not None:
                out.append(f"{slug}: {RECORDINGS / (slug + '.json')} is committed but no cell is recorded any more")
            continue
        if saved is None:
            out.append(f"{slug}: no committed recording")
        elif saved["key"] != key(nb, slug, ROOT):
            out.append(f"{slug}: the recording is out of date (the notebook or the chapter's course code changed)")
        elif not set(plan.recorded) <= set(saved["cells"]):
            out.append(f"{slug}: the recording lacks cells {sorted(set(plan.recorded) - set(saved['cells']))}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("chapters", nargs="*", help="chapters to record (default: every chapter)")
    p.add_argument("--check", action="store_true", help="only say which recordings are out of date (exit 1 if any)")
    p.add_argument("-j", "--jobs", type=int, default=2)
    args = p.parse_args(argv)
    if args.check:
        problems = stale(args.chapters or None)
        for line in problems:
            print(line)
        if problems:
            print(f"refresh: PYTHONPATH=$PWD/src .venv/bin/python scripts/record_demonstrations.py "
                  f"{' '.join(sorted({line.split(':')[0] for line in problems}))}")
        else:
            print("recordings up to date")
        return 1 if problems else 0

    from ptinternals.edition.build import build
    from ptinternals.edition.notebooks import RECORDINGS

    with tempfile.TemporaryDirectory(prefix="ptrecord-") as tmp:
        report = build(Path(tmp) / "edition", ROOT, wheel=False, jobs=args.jobs, chapters=args.chapters or None,
                       fresh=True)
    folder = ROOT / RECORDINGS
    folder.mkdir(parents=True, exist_ok=True)
    for slug in args.chapters or [p.stem for p in folder.glob("*.json")] + list(report.recordings):
        path = folder / f"{slug}.json"
        if slug in report.recordings:
            path.write_text(json.dumps(report.recordings[slug], indent=None, sort_keys=True) + "\n")
            print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")
        elif path.exists():
            path.unlink()
            print(f"removed {path.relative_to(ROOT)} (no cell of {slug} is recorded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
