"""Collecting from nbgrader's exchange without losing anything a student handed in.

nbgrader's own collect (``nbgrader/exchange/default/collect.py``, ``ExchangeCollect.copy_files``) deletes
a student's collected submission (``shutil.rmtree``) before copying a newer one in. The course keeps
every submission: :class:`SupersedingCollect` moves the older one to
``autograder/submitted/_superseded/<student>/<assignment>-<its timestamp>/`` first, the same place
``ptgrade collect --from`` keeps them (:func:`supersede`). ``configure`` installs it as nbgrader's collect
plugin, so ``ptgrade collect --exchange``, ``nbgrader collect`` and formgrader's button all behave so.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from nbgrader.exchange.default.collect import ExchangeCollect

SUPERSEDED = "_superseded"  # not a valid student id (SAFE_ID starts with a letter or digit)


def supersede(dest: Path, student: str, assignment: str) -> Path:
    """Move the collected submission ``dest`` (= submitted/<student>/<assignment>) aside; return where it went.

    The folder is named after the submission's own timestamp (timestamp.txt, else the folder's mtime), with
    a counter when two collide, so a later submission never lands on an earlier one.
    """
    stamp_file = dest / "timestamp.txt"
    stamp = stamp_file.read_text().strip() if stamp_file.is_file() else f"{dest.stat().st_mtime:.6f}"
    stamp = re.sub(r"[^0-9A-Za-z.]+", "-", stamp).strip("-")[:64] or "unknown"
    kept_dir = dest.parent.parent / SUPERSEDED / student
    kept_dir.mkdir(parents=True, exist_ok=True)
    kept, n = kept_dir / f"{assignment}-{stamp}", 1
    while kept.exists():
        n += 1
        kept = kept_dir / f"{assignment}-{stamp}-{n}"
    shutil.move(str(dest), str(kept))
    return kept


class SupersedingCollect(ExchangeCollect):
    """nbgrader's collect, except that a submission about to be replaced is kept (see the module docstring)."""

    def init_dest(self):
        super().init_dest()
        assignment = self.coursedir.assignment_id
        for rec in self.src_records:
            dest = Path(self.coursedir.format_path(self.coursedir.submitted_directory, rec["username"], assignment))
            if not dest.is_dir():
                continue
            existing = self.coursedir.get_existing_timestamp(str(dest))
            # the two conditions under which ExchangeCollect.copy_files replaces dest
            replaced = (self.update and (existing is None or rec["timestamp"] > existing)) or (
                self.before_duedate and existing != rec["timestamp"])
            if replaced:
                kept = supersede(dest, rec["username"], assignment)
                self.log.info("Kept the earlier submission of %s %s in %s", rec["username"], assignment, kept)
