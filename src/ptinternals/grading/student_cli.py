"""``ptgrade`` in the student edition: ``ptgrade validate NOTEBOOK`` before submitting.

The instructor's commands (release, collect, autograde, feedback, export, student-edition) live in
the course repository's ``ptgrade`` (``ptinternals.grading.cli``); the student edition ships only
this one, which needs nothing but the notebook and the chapter's checks.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="ptgrade", description="Check a chapter notebook before you submit it.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    sp = sub.add_parser("validate", help="check that no answer or test cell was deleted and no test cell edited")
    sp.add_argument("notebook", nargs="+")
    args = parser.parse_args(argv)
    from .validate import validate_notebook

    failed = 0
    for notebook in args.notebook:
        problems = validate_notebook(Path(notebook))
        if problems:
            failed += 1
            print(f"{notebook}: problems found (the grader restores deleted or edited test cells, but check your work):")
            for p in problems:
                print(f"  - {p}")
        else:
            print(f"{notebook}: OK: every answer cell and test cell is present, and no test cell was edited.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
